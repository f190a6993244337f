"""Initializers that are also graph inputs (issue 16, item 6): per the ONNX IR spec (IR >= 4) they are default
values a feed overrides, as onnxruntime does; in IR < 4 models they are constants."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
import polyc.onnx as ponnx
import polyc.onnx.backend as pbackend

import onnxruntime  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def fed_model(ir_version: int = 8):
    """``y = Reshape(Relu(x @ w) + b, s)`` with ``w``, ``b`` and ``s`` initializers listed as graph inputs."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Reshape", ["r", "s"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3]),
              helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4]),
              helper.make_tensor_value_info("b", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("s", TensorProto.INT64, [2])]
    inits = [numpy_helper.from_array(rng.standard_normal((3, 4)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b"),
             numpy_helper.from_array(np.array([2, 6], np.int64), "s")]
    graph = helper.make_graph(nodes, "fed", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ir_version
    return model


def feed_sets():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 3)).astype(np.float32)
    w2 = rng.standard_normal((3, 4)).astype(np.float32)
    b2 = rng.standard_normal(4).astype(np.float32)
    return [{"x": x},
            {"x": x, "w": w2},
            {"x": x, "b": b2},
            {"x": x, "w": w2, "b": b2},
            {"x": x, "w": w2, "s": np.array([4, 3], np.int64)},   # a Reshape target: compiled per value
            {"x": x, "s": np.array([12, 1], np.int64)},
            {"x": x, "w": -w2}]


@pytest.mark.parametrize("via", ["compile", "backend"])
def test_a_feed_overrides_an_initializer_like_onnxruntime(via):
    model = fed_model()
    session = onnxruntime.InferenceSession(model.SerializeToString())
    runner = ponnx.compile(model) if via == "compile" else pbackend.prepare(model)
    for feeds in feed_sets():
        expected = session.run(None, feeds)[0]
        got = runner.run(feeds)[0]
        assert got.shape == expected.shape, (list(feeds), got.shape, expected.shape)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6, err_msg=str(list(feeds)))


def test_feeding_the_default_value_uses_the_fast_model_and_bad_overrides_are_clear():
    model = fed_model()
    compiled = ponnx.compile(model)
    assert set(compiled.defaults) == {"w", "b", "s"} and compiled.input_names == ("x",)
    x = np.ones((3, 3), np.float32)
    same = compiled.run({"x": x, "w": compiled.defaults["w"]})
    assert not compiled._variants  # the default value needs no other compile
    np.testing.assert_array_equal(same[0], compiled.run({"x": x})[0])
    with pytest.raises(polyc.PolycError, match="'w'.*shape"):
        compiled.run({"x": x, "w": np.ones((4, 3), np.float32)})
    with pytest.raises(polyc.PolycError, match="'w'.*dtype"):
        compiled.run({"x": x, "w": np.ones((3, 4), np.float64)})


def test_ir3_initializers_listed_as_inputs_stay_constants():
    model = fed_model(ir_version=3)
    compiled = ponnx.compile(model)
    assert compiled.defaults == {}
    with pytest.raises(polyc.PolycError, match="unknown input 'w'"):
        compiled.run({"x": np.ones((3, 3), np.float32), "w": np.ones((3, 4), np.float32)})
