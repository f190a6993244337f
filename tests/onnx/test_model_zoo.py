"""The whole-model benchmark set (``scripts/model_zoo.py``): every model's tiny variant compiles with polyc and
matches onnxruntime; every bench-size model is a valid ONNX graph (checker and shape inference, no compile)."""
import os
import sys

import numpy as np
import onnx
import pytest

import polyc
import polyc.onnx

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "scripts"))
import model_zoo  # noqa: E402


def _onnxruntime(model, inputs):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, inputs)


#: mobilenetv2 stays in the default run: the only tiny model that reaches a line of polyc no other default test
#: reaches (a scalar Clip bound next to a flattened 1x1 convolution). The others (5-9 s each) run with -m slow; these
#: default tests reach every line of polyc each reaches:
SLOW = {
    "resnet50": "test_onnx_lower.py::test_resnet_groups_fuse_conv_bias_residual_relu, test_onnx_ops.py (conv cases)",
    "resnet18_half": "test_onnx_lower.py::test_resnet_groups_fuse_conv_bias_residual_relu, test_half.py",
    "mobilenetv3_small": "[mobilenetv2]",
    "efficientnet_b0": "[mobilenetv2], test_half.py::test_einsum_of_storage_operands",
    "shufflenetv2": "[mobilenetv2]",
    "squeezenet": "[mobilenetv2], test_onnx_models.py (shufflenet); test_scripts.py's bench_models runs it too",
    "densenet": "test_onnx_lower.py::test_resnet_groups_fuse_conv_bias_residual_relu, test_onnx_passes.py",
    "vit": "test_onnx_ops.py::test_op_matches_onnxruntime[conv_channels_last_3x3_bias], test_onnx_passes.py",
    "bert_encoder": "test_onnx_exports.py::test_export_matches_onnxruntime[bert_buffers]",
    "gpt_decoder": "test_onnx_exports.py's [bert_buffers]; test_scripts.py's bench_models runs it too",
    "conv1d_audio": "test_onnx_ops.py (conv_channels_last_3x3_bias, conv_valid_1d), test_onnx_lower.py",
}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n
                                  for n in model_zoo.NAMES])
def test_tiny_model_matches_onnxruntime(name):
    model = model_zoo.build(name, tiny=True)
    onnx.checker.check_model(model, full_check=True)
    inputs = model_zoo.feeds(model)
    want = _onnxruntime(model, inputs)
    got = polyc.onnx.compile(model, polyc.Options(), progress=False).run(inputs)
    assert len(got) == len(want) == 1
    g, w = got[0], want[0]
    assert g.shape == w.shape and g.dtype == w.dtype
    assert np.all(np.isfinite(w)) and np.abs(w).max() > 0
    error = float(np.abs(g - w).max() / np.abs(w).max())
    assert error <= 1e-4, f"{name}: relative error {error:.2e}"


def test_outputs_depend_on_inputs():
    """Another seed gives other outputs (the weights are not so small or large that inputs stop mattering)."""
    for name in model_zoo.NAMES:
        model = model_zoo.build(name, tiny=True)
        a, b = (_onnxruntime(model, model_zoo.feeds(model, seed))[0] for seed in (0, 1))
        assert np.abs(a - b).max() > 1e-2 * np.abs(a).max(), name


def test_bench_models_are_valid():
    for name in model_zoo.NAMES:
        model = model_zoo.build(name)
        onnx.checker.check_model(model, full_check=True)
        inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        assert [o.name for o in inferred.graph.output] == ["output"]
        assert model_zoo.describe(name)
        inputs = model_zoo.feeds(model)
        assert set(inputs) == {i.name for i in model.graph.input}
        assert all(i.dtype in (np.float32, np.int64) for i in inputs.values())
    assert model.graph.input[0].name == "input_ids"
    ids = inputs["input_ids"]
    assert ids.shape == (1, 128) and 0 <= ids.min() and ids.max() < 2048


def test_feeds_attention_mask():
    inputs = model_zoo.feeds(model_zoo.build("bert_encoder"))
    mask = inputs["attention_mask"]
    assert mask.dtype == np.int64 and mask.shape == (1, 128)
    assert mask[0, :96].all() and not mask[0, 96:].any()


def test_unknown_name():
    with pytest.raises(ValueError, match="resnet50"):
        model_zoo.build("nope")
    with pytest.raises(ValueError):
        model_zoo.describe("nope")
    assert len(model_zoo.NAMES) == len(set(model_zoo.NAMES)) == 12
    assert set(SLOW) < set(model_zoo.NAMES)  # the slow marks name real models, and one stays in the default run
