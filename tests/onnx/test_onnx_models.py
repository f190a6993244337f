"""Whole models: the model-zoo light models compile with polyc and match.

1. As shipped (every weight ConstantOfShape 0.02): against ``light_NAME_output_0.pb`` on onnx's dummy input,
   with the tolerances onnx's backend tests use. Most of these outputs are a uniform softmax, so this alone
   proves little;
2. re-weighted with seeded random weights (outputs depend on the input): against onnxruntime on random
   inputs, comparing the softmax's input (the logits) as well as the output.

shufflenet runs by default (both ways); all nine run with ``-m slow``.
"""
import numpy as np
import onnx
import pytest

import polyc.onnx
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def ort_session(model):
    """An onnxruntime session with warnings silenced."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

#: shufflenet stays in the default run: the fastest light model (15 s cold; the re-weighted one reuses its kernels).
FAST = ("shufflenet",)
#: The rest run with -m slow; the default run reaches every line of polyc that resnet50 and squeezenet reach:
#: resnet50 (25 s): the shufflenet tests here, test_promote.py and test_codegen.py (packing of big operands);
#: squeezenet (20 s): the shufflenet tests here, test_promote.py and test_half.py::test_einsum_of_storage_operands.
SLOW = tuple(n for n in testing.LIGHT_MODELS if n not in FAST)
FAST_EXPECTED = ("shufflenet",)


def _check_expected(name):
    model = polyc.onnx.compile(testing.light_model_path(name))
    x = testing.dummy_input(model.input_shapes[0])
    (y,) = model.run({model.input_names[0]: x})
    rtol, atol = testing.LIGHT_TOLERANCES[name]
    np.testing.assert_allclose(y, testing.light_expected_output(name), rtol=rtol, atol=atol)
    assert model.arena_bytes < model.plan.total_bytes


def _check_reweighted(name, seed=0):
    m = testing.reweight(onnx.load(testing.light_model_path(name)), seed)
    m = testing.expose(m, testing.softmax_inputs(m))
    model = polyc.onnx.compile(m)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(model.input_shapes[0]).astype(np.float32)
    got = model.run({model.input_names[0]: x})
    want = ort_session(m).run(None, {model.input_names[0]: x})
    for g, w in zip(got, want):
        scale = float(np.abs(w).max())
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * scale)
    # the check means something only if the outputs depend on the input
    other = model.run({model.input_names[0]: rng.standard_normal(model.input_shapes[0]).astype(np.float32)})
    assert not np.allclose(other[-1], got[-1], rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("name", FAST_EXPECTED)
def test_light_model_matches_expected_output(name):
    _check_expected(name)


@pytest.mark.parametrize("name", FAST)
def test_reweighted_light_model_matches_onnxruntime(name):
    _check_reweighted(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW + tuple(n for n in FAST if n not in FAST_EXPECTED))
def test_light_model_matches_expected_output_slow(name):
    _check_expected(name)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_reweighted_light_model_matches_onnxruntime_slow(name):
    _check_reweighted(name)
