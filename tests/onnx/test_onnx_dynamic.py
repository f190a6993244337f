"""Models with symbolic dimensions (polyc/onnx/dynamic.py): one compile of each kernel serves every batch size,
against onnxruntime."""
import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc.onnx as ponnx
from polyc.errors import ShapeError


def _init(rng, name, shape):
    return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)


def _cnn(rng):
    """Conv + ReLU + MaxPool, a strided padded Conv, GlobalAveragePool, Flatten, Gemm; batch symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 16, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 10])
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Relu", ["c2"], ["r2"]), helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    inits = [_init(rng, "w1", (8, 3, 3, 3)), _init(rng, "b1", (8,)), _init(rng, "w2", (16, 8, 3, 3)),
             _init(rng, "b2", (16,)), _init(rng, "wf", (10, 16)), _init(rng, "bf", (10,))]
    graph = helper.make_graph(nodes, "cnn", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mlp(rng):
    """MatMul + Add + ReLU, MatMul, Softmax; batch symbolic (no dim_param: unnamed)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["u"]),
             helper.make_node("Relu", ["u"], ["v"]), helper.make_node("MatMul", ["v", "w2"], ["z"]),
             helper.make_node("Softmax", ["z"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "mlp", [x], [y],
                              [_init(rng, "w", (16, 32)), _init(rng, "b", (32,)), _init(rng, "w2", (32, 8))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("make", [_cnn, _mlp], ids=["cnn", "mlp"])
def test_one_compile_serves_every_batch(make):
    """Batch 1, 3 and 8 (and the hint, 4) from one compile: every kernel generic, none compiled per batch;
    results equal onnxruntime's."""
    rng = np.random.default_rng(0)
    model = make(rng)
    compiled = ponnx.compile_dynamic(model)
    assert compiled.generic and all(g is not None for g in compiled.generic.values())
    session = onnxruntime.InferenceSession(model.SerializeToString())
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    for batch in (1, 3, 8, 4):
        x = rng.standard_normal([batch] + shape[1:]).astype(np.float32)
        got, = compiled.run({"x": x})
        want, = session.run(None, {"x": x})
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert compiled.specialised == 0
    kernels = {id(g) for g in compiled.generic.values()}
    assert len(kernels) == len(compiled.generic)


def test_a_model_without_symbolic_dims_or_a_bad_hint_is_refused():
    rng = np.random.default_rng(1)
    model = _cnn(rng)
    with pytest.raises(ShapeError, match="not symbolic dims"):
        ponnx.compile_dynamic(model, hint={"seq": 4})
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2
    with pytest.raises(ShapeError, match="no symbolic input dimension"):
        ponnx.compile_dynamic(model)


def test_mobilenetv3_with_a_symbolic_batch():
    """The committed MobileNetV3-small export (torch, opset 17) with its batch made symbolic: every kernel
    generic (34), batch 1, 3 and 5 against onnxruntime, nothing compiled per batch."""
    import onnx
    from pathlib import Path
    model = onnx.load(Path(__file__).parent / "models" / "mobilenetv3.onnx")
    for vi in list(model.graph.input) + list(model.graph.output):
        dim = vi.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_value")
        dim.dim_param = "batch"
    compiled = ponnx.compile_dynamic(model, hint={"batch": 2})
    assert all(g is not None for g in compiled.generic.values()) and None not in compiled.templates
    session = onnxruntime.InferenceSession(model.SerializeToString())
    rng = np.random.default_rng(2)
    for batch in (1, 3, 5):
        x = rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)
        got, = compiled.run({"pixel_values": x})
        want, = session.run(None, {"pixel_values": x})
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert compiled.specialised == 0
