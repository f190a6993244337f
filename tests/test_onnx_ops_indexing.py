"""Indexing and reduction ops as one-node models, compiled by polyc and compared with onnxruntime (or onnx's
ReferenceEvaluator where onnxruntime lacks the op or opset), on shapes with extents 1 and odd primes and
across attribute and opset variants."""
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import polyc.onnx
from polyc.errors import KernelRuntimeError, PolycError
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

R = np.random.default_rng(7)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def ints(lo, hi, *shape, dtype=np.int64):
    return R.integers(lo, hi, shape).astype(dtype)


def i64(values):
    return np.array(values, dtype=np.int64)


def expected(model, inputs, oracle):
    if oracle == "ref":
        return ReferenceEvaluator(model).run(None, inputs)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_case(op, opset, attrs, node_inputs, inputs, consts, n_out=1, oracle="ort", rtol=1e-5, atol=1e-5):
    """Compile the one-node model and compare every output with the oracle (shapes, dtypes, values)."""
    outputs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, node_inputs, outputs, **attrs)
    model = testing.one_node_model(node, inputs, consts, opset)
    want = expected(model, inputs, oracle)
    got = polyc.onnx.compile(model).run(inputs)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        e = np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# (id, op, opset, attrs, node input names, graph inputs, initializers[, oracle])
CASES = [
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op(case):
    _, op, opset, attrs, names, inputs, consts, *rest = case
    kw = rest[0] if rest else {}
    run_case(op, opset, attrs, names, inputs, consts, **kw)
