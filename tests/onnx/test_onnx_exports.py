"""Models exported from PyTorch compile with polyc and match onnxruntime.

``tests/onnx/models/NAME.onnx`` are small BERT (three exports: TorchScript, torch.export, and without token type
ids), GPT-2, RoBERTa, T5-encoder and wav2vec2 models (transformers, tiny configs, random weights, exported with
their attention mask; wav2vec2 also in its GroupNorm form without one), a MobileNetV3-small-style net and an
LSTM + GRU model, made by ``scripts/export_models.py`` (which needs PyTorch; these tests do not). ``NAME.npz`` holds the
seeded inputs under the graph's input names and onnxruntime's outputs under its output names.
"""
import os

import numpy as np
import onnx
import pytest

import polyc.onnx

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

MODELS_DIR = os.path.join(os.path.dirname(__file__), "models")
MODELS = ("bert", "bert_dynamo", "bert_buffers", "gpt2", "roberta", "t5_encoder", "wav2vec2", "wav2vec2_base",
          "mobilenetv3", "lstm_gru")
MASKED = ("bert", "bert_dynamo", "bert_buffers", "gpt2", "roberta", "t5_encoder", "wav2vec2")
#: bert_buffers stays in the default run: the fastest (5 s) of the three exports that reach a line of polyc no other
#: default test reaches (an infinite mask constant written as a literal). The rest (5-16 s each) run with -m slow:
#: ``[bert_buffers]`` (test_export_matches_onnxruntime's) and the tests named on its line reach every line it reaches.
SLOW = {
    "bert": "[bert_buffers]",
    "bert_dynamo": "[bert_buffers], test_onnx_ops_indexing.py::test_op[gather_nd_const]",
    "gpt2": "[bert_buffers], test_onnx_ops.py::test_op_matches_onnxruntime[pow_square]",
    "roberta": "[bert_buffers]",
    "t5_encoder": "[bert_buffers], test_onnx_ops.py::test_op_matches_onnxruntime[pow_square]",
    "wav2vec2": "[bert_buffers], test_onnx_ops.py::test_op_matches_onnxruntime[conv_channels_last_3x3_bias]",
    "wav2vec2_base": "test_onnx_ops.py::test_op_matches_onnxruntime[conv_channels_last_3x3_bias], test_model_zoo.py",
    "mobilenetv3": "test_model_zoo.py::test_tiny_model_matches_onnxruntime[mobilenetv2], test_half.py",
    "lstm_gru": "test_onnx_ops_rnn.py::test_recurrent_matches_onnxruntime (the GRU and LSTM cases)",
}


def _load(name):
    model = onnx.load(os.path.join(MODELS_DIR, f"{name}.onnx"))
    with np.load(os.path.join(MODELS_DIR, f"{name}.npz")) as data:
        stored = {k: data[k] for k in data.files}
    inputs = {i.name: stored[i.name] for i in model.graph.input}
    outputs = {o.name: stored[o.name] for o in model.graph.output}
    return model, inputs, outputs


def test_every_export_is_listed():
    """Each committed .onnx has its .npz and a test; each file stays small."""
    files = sorted(os.listdir(MODELS_DIR))
    assert sorted(f[:-5] for f in files if f.endswith(".onnx")) == sorted(MODELS)
    assert sorted(f[:-4] for f in files if f.endswith(".npz")) == sorted(MODELS)
    assert set(SLOW) < set(MODELS)  # the slow marks name real exports, and one stays in the default run
    for f in files:
        assert os.path.getsize(os.path.join(MODELS_DIR, f)) < 1 << 20, f


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in MODELS])
def test_export_matches_onnxruntime(name):
    model, inputs, outputs = _load(name)
    compiled = polyc.onnx.compile(model)
    assert compiled.output_names == tuple(outputs)
    got = compiled.run(inputs)
    for (out, want), g in zip(outputs.items(), got):
        assert g.shape == want.shape and g.dtype == want.dtype, out
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(g, want, rtol=1e-3, atol=1e-4 * scale, err_msg=f"{name}: output {out}")


@pytest.mark.parametrize("name", MASKED)
def test_attention_mask_matters(name):
    """The stored masks have padding, and onnxruntime gives other outputs for the same inputs with an
    all-ones mask: a lowering that ignored the mask would fail :func:`test_export_matches_onnxruntime`."""
    model, inputs, outputs = _load(name)
    mask = inputs["attention_mask"]
    assert 0 < mask.sum() < mask.size
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    # the stored outputs are onnxruntime's, up to its kernels' rounding on another instruction set
    np.testing.assert_allclose(session.run(None, inputs)[0], next(iter(outputs.values())), rtol=1e-4, atol=1e-5)
    unmasked = session.run(None, {**inputs, "attention_mask": np.ones_like(mask)})[0]
    assert not np.allclose(unmasked, next(iter(outputs.values())), rtol=1e-3, atol=1e-5)
