"""The comparison, logical, selection, integer and activation/math ops (polyc/onnx/ops/logic.py, unary.py),
each as a one-node model compiled by polyc and compared with onnxruntime (or, where onnxruntime lacks a
kernel or differs from the spec, onnx's ReferenceEvaluator), over dtypes, broadcasting, extents 1 and odd
primes, attributes and opsets; plus the language builtins they lower to, against numpy."""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyc
import polyc.onnx
from polyc.errors import PolycError
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

R = np.random.default_rng(10)


def f32(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


def f64(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape)


def ints(dtype, *shape, lo=-9, hi=10):
    return R.integers(lo, hi, shape).astype(dtype)


def bools(*shape):
    return R.random(shape) < 0.5


def special(*shape):
    """float32 values with NaN, +-inf, +-0 and ordinary numbers."""
    pool = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.5, 3e38, -3e38], np.float32)
    return R.choice(pool, shape)


def halves(*shape):
    """float32 values on and near .5 (Round is half to even)."""
    return (R.integers(-8, 8, shape) / 2 + R.choice([0.0, 0.0, 0.1, -0.1], shape)).astype(np.float32)


ORT, REF = "ort", "ref"

# (id, op, opset, attrs, inputs (graph inputs), constants (initializers, after the inputs), oracle)
CASES = [
    # attention-mask plumbing
    ("where_bcast", "Where", 16, {}, {"c": bools(3, 1), "x": f32(1, 5), "y": f32(3, 5)}, {}, ORT),
    ("where_v9_int64", "Where", 9, {}, {"c": bools(2, 3, 7), "x": ints(np.int64, 7), "y": ints(np.int64, 2, 1, 1)},
     {}, ORT),
    ("where_bool_values", "Where", 16, {}, {"c": bools(1, 7), "x": bools(5, 7), "y": bools(5, 1)}, {}, REF),
    ("where_scalar_fill", "Where", 16, {}, {"c": bools(2, 1, 3, 5)},
     {"x": np.array(-1e9, np.float32), "y": f32(1, 4, 1, 5)}, ORT),
    ("expand_dim_changed", "Expand", 13, {}, {"x": f32(3, 1)}, {"s": np.array([2, 1, 7], np.int64)}, ORT),
    ("expand_keeps_larger", "Expand", 8, {}, {"x": f32(1, 5, 1)}, {"s": np.array([3, 1, 1], np.int64)}, ORT),
    ("expand_bool", "Expand", 13, {}, {"x": bools(1, 1, 3)}, {"s": np.array([2, 1, 5, 1], np.int64)}, ORT),
    ("expand_int64_same", "Expand", 13, {}, {"x": ints(np.int64, 5, 3)}, {"s": np.array([1], np.int64)}, ORT),
    ("and_bcast", "And", 7, {}, {"a": bools(3, 4, 5), "b": bools(5)}, {}, ORT),
    ("or_bcast", "Or", 7, {}, {"a": bools(1, 5), "b": bools(3, 1)}, {}, ORT),
    ("xor", "Xor", 7, {}, {"a": bools(2, 7), "b": bools(2, 7)}, {}, ORT),
    ("not", "Not", 1, {}, {"a": bools(3, 1, 5)}, {}, ORT),
    ("equal_int64_bcast", "Equal", 13, {}, {"a": ints(np.int64, 3, 5, lo=0, hi=3), "b": ints(np.int64, 5, lo=0, hi=3)},
     {}, ORT),
    ("equal_v11_float", "Equal", 11, {}, {"a": f32(7), "b": f32(7)}, {}, ORT),
    ("equal_v19_bool", "Equal", 19, {}, {"a": bools(3, 5), "b": bools(1, 5)}, {}, ORT),
    ("equal_v7_int32", "Equal", 7, {}, {"a": ints(np.int32, 2, 3, lo=0, hi=2), "b": ints(np.int32, 3, lo=0, hi=2)},
     {}, ORT),
    ("less_float", "Less", 13, {}, {"a": f32(3, 5), "b": f32(3, 1)}, {}, ORT),
    ("less_v9_uint8", "Less", 9, {}, {"a": ints(np.uint8, 7, lo=0, hi=255), "b": ints(np.uint8, 1, lo=0, hi=255)},
     {}, ORT),
    ("less_or_equal_int64", "LessOrEqual", 16, {}, {"a": ints(np.int64, 5, 3), "b": ints(np.int64, 3)}, {}, ORT),
    ("less_or_equal_v12", "LessOrEqual", 12, {}, {"a": f32(1, 7), "b": f32(3, 1)}, {}, ORT),
    ("greater_float64", "Greater", 13, {}, {"a": f64(2, 3), "b": f64(2, 3)}, {}, ORT),
    ("greater_v9_int32", "Greater", 9, {}, {"a": ints(np.int32, 5, 1), "b": ints(np.int32, 1, 3)}, {}, ORT),
    ("greater_or_equal", "GreaterOrEqual", 16, {}, {"a": ints(np.int8, 3, 5), "b": ints(np.int8, 5)}, {}, ORT),
    ("greater_or_equal_scalar", "GreaterOrEqual", 12, {}, {"a": f32(7)}, {"b": np.array(0.25, np.float32)}, ORT),
    ("isnan", "IsNaN", 13, {}, {"x": special(3, 7)}, {}, ORT),
    ("isnan_v9_float64", "IsNaN", 9, {}, {"x": special(5).astype(np.float64)}, {}, ORT),
    ("isinf", "IsInf", 10, {}, {"x": special(3, 7)}, {}, ORT),
    ("isinf_positive", "IsInf", 20, {"detect_negative": 0}, {"x": special(1, 11)}, {}, ORT),
    ("isinf_negative", "IsInf", 20, {"detect_positive": 0}, {"x": special(5, 1)}, {}, ORT),
    ("isinf_neither", "IsInf", 10, {"detect_positive": 0, "detect_negative": 0}, {"x": special(7)}, {}, REF),
    ("isinf_float64", "IsInf", 10, {}, {"x": special(2, 5).astype(np.float64)}, {}, ORT),
    # integer ops
    ("mod_int64", "Mod", 13, {}, {"a": ints(np.int64, 3, 5), "b": ints(np.int64, 5, lo=1, hi=7)}, {}, ORT),
    ("mod_int32_neg_divisor", "Mod", 10, {}, {"a": ints(np.int32, 7), "b": ints(np.int32, 7, lo=-6, hi=-1)},
     {}, ORT),
    ("mod_int64_fmod", "Mod", 13, {"fmod": 1}, {"a": ints(np.int64, 3, 5), "b": ints(np.int64, 3, 1, lo=1, hi=5)},
     {}, ORT),
    ("mod_int8_fmod_signs", "Mod", 13, {"fmod": 1}, {"a": ints(np.int8, 11, lo=-50, hi=50),
                                                     "b": np.array([3, -3, 7, -7, 1, -1, 5, -2, 2, 9, -9], np.int8)},
     {}, ORT),
    ("mod_uint16", "Mod", 13, {}, {"a": ints(np.uint16, 5, lo=0, hi=1000), "b": ints(np.uint16, 5, lo=1, hi=30)},
     {}, ORT),
    ("mod_float_fmod", "Mod", 13, {"fmod": 1}, {"a": f32(3, 5, lo=-9, hi=9), "b": f32(5, lo=0.5, hi=3)}, {}, ORT),
    ("mod_float64_fmod_neg", "Mod", 13, {"fmod": 1}, {"a": f64(7, lo=-9, hi=9), "b": f64(7, lo=-3, hi=-0.5)},
     {}, ORT),
    ("mod_float_fmod0", "Mod", 13, {}, {"a": f32(2, 7, lo=-9, hi=9), "b": f32(7, lo=-3, hi=3)}, {}, REF),
    ("bitshift_left_uint8", "BitShift", 11, {"direction": "LEFT"},
     {"a": ints(np.uint8, 3, 5, lo=0, hi=255), "b": ints(np.uint8, 5, lo=0, hi=8)}, {}, ORT),
    ("bitshift_right_uint64", "BitShift", 11, {"direction": "RIGHT"},
     {"a": ints(np.uint64, 7, lo=0, hi=2**40), "b": ints(np.uint64, 7, lo=0, hi=40)}, {}, ORT),
    ("bitshift_left_uint32_overshift", "BitShift", 11, {"direction": "LEFT"},
     {"a": ints(np.uint32, 5, lo=1, hi=9)}, {"b": np.array([0, 31, 32, 33, 100], np.uint32)}, REF),
    ("bitwise_and_int32", "BitwiseAnd", 18, {}, {"a": ints(np.int32, 3, 5, lo=-99, hi=99),
                                                  "b": ints(np.int32, 5, lo=-99, hi=99)}, {}, ORT),
    ("bitwise_or_uint8", "BitwiseOr", 18, {}, {"a": ints(np.uint8, 7, lo=0, hi=255),
                                                "b": ints(np.uint8, 1, 7, lo=0, hi=255)}, {}, ORT),
    ("bitwise_xor_int64", "BitwiseXor", 18, {}, {"a": ints(np.int64, 2, 3), "b": ints(np.int64, 2, 1)}, {}, ORT),
    ("bitwise_not_int16", "BitwiseNot", 18, {}, {"a": ints(np.int16, 3, 7)}, {}, ORT),
    ("bitwise_not_uint8", "BitwiseNot", 18, {}, {"a": ints(np.uint8, 11, lo=0, hi=255)}, {}, ORT),
    # activations and math
    ("hardsigmoid", "HardSigmoid", 6, {"alpha": 0.3, "beta": 0.4}, {"x": f32(3, 7, lo=-5, hi=5)}, {}, ORT),
    ("hardsigmoid_default_f64", "HardSigmoid", 6, {}, {"x": f64(5, lo=-5, hi=5)}, {}, REF),
    ("hardswish", "HardSwish", 14, {}, {"x": f32(2, 11, lo=-5, hi=5)}, {}, ORT),
    ("elu", "Elu", 6, {"alpha": 0.7}, {"x": f32(3, 5)}, {}, ORT),
    ("elu_default", "Elu", 6, {}, {"x": f32(1, 7)}, {}, ORT),
    ("selu", "Selu", 6, {"alpha": 2.0, "gamma": 3.0}, {"x": f32(3, 5)}, {}, ORT),
    ("selu_default", "Selu", 6, {}, {"x": f32(7)}, {}, ORT),
    ("celu", "Celu", 12, {"alpha": 2.0}, {"x": f32(3, 5)}, {}, ORT),
    ("celu_default", "Celu", 12, {}, {"x": f32(1, 7)}, {}, ORT),
    ("softplus", "Softplus", 1, {}, {"x": f32(3, 5, lo=-30, hi=30)}, {}, ORT),
    ("softplus_f64", "Softplus", 1, {}, {"x": f64(7)}, {}, REF),
    ("softsign", "Softsign", 1, {}, {"x": f32(3, 5)}, {}, ORT),
    ("thresholdedrelu", "ThresholdedRelu", 10, {"alpha": 0.5}, {"x": f32(3, 5)}, {}, ORT),
    ("thresholdedrelu_default", "ThresholdedRelu", 10, {}, {"x": f32(7)}, {}, ORT),
    ("prelu_channel", "PRelu", 16, {}, {"x": f32(2, 3, 5)}, {"s": f32(3, 1)}, ORT),
    ("prelu_scalar_v7", "PRelu", 7, {}, {"x": f32(1, 7)}, {"s": np.array([0.1], np.float32)}, ORT),
    ("prelu_int64", "PRelu", 16, {}, {"x": ints(np.int64, 3, 5), "s": ints(np.int64, 5, lo=-3, hi=3)}, {}, REF),
    ("mish", "Mish", 18, {}, {"x": f32(3, 7, lo=-20, hi=20)}, {}, ORT),
    ("shrink_soft", "Shrink", 9, {"lambd": 1.5, "bias": 1.5}, {"x": f32(3, 5)}, {}, ORT),
    ("shrink_hard", "Shrink", 9, {"lambd": 1.5}, {"x": f32(7)}, {}, ORT),
    ("shrink_int64", "Shrink", 9, {"lambd": 2.5, "bias": 1.5}, {"x": ints(np.int64, 11)}, {}, REF),
    ("sign_float", "Sign", 13, {}, {"x": np.array([-2.5, -0.0, 0.0, 3.0, 1e-30, -7.0, np.nan], np.float32)},
     {}, REF),
    ("sign_int32", "Sign", 9, {}, {"x": ints(np.int32, 3, 5)}, {}, ORT),
    ("sign_uint8", "Sign", 13, {}, {"x": ints(np.uint8, 7, lo=0, hi=3)}, {}, ORT),
    ("sign_int8", "Sign", 13, {}, {"x": ints(np.int8, 3, 1, 5)}, {}, ORT),
    ("shrink_uint8", "Shrink", 9, {"lambd": 3.0, "bias": 2.0}, {"x": ints(np.uint8, 11, lo=0, hi=9)}, {}, ORT),
    ("where_int8", "Where", 16, {}, {"c": bools(5, 1), "x": ints(np.int8, 1, 3), "y": ints(np.int8, 5, 3)}, {}, ORT),
    ("mod_int16_bcast", "Mod", 13, {}, {"a": ints(np.int16, 2, 3, 5, lo=-300, hi=300),
                                        "b": ints(np.int16, 3, 1, lo=-9, hi=-1)}, {}, ORT),
    ("round", "Round", 11, {}, {"x": halves(3, 7)}, {}, ORT),
    ("round_f64", "Round", 11, {}, {"x": halves(11).astype(np.float64)}, {}, ORT),
    ("sin", "Sin", 7, {}, {"x": f32(3, 17, lo=-7, hi=7)}, {}, ORT),
    ("cos", "Cos", 7, {}, {"x": f32(3, 17, lo=-7, hi=7)}, {}, ORT),
    ("tan", "Tan", 7, {}, {"x": f32(3, 17, lo=-1.4, hi=1.4)}, {}, ORT),
    ("asin", "Asin", 7, {}, {"x": f32(3, 17, lo=-1, hi=1)}, {}, ORT),
    ("acos", "Acos", 7, {}, {"x": f32(3, 17, lo=-1, hi=1)}, {}, ORT),
    ("atan", "Atan", 7, {}, {"x": f32(3, 17, lo=-9, hi=9)}, {}, ORT),
    ("sinh", "Sinh", 9, {}, {"x": f32(3, 17, lo=-5, hi=5)}, {}, ORT),
    ("cosh", "Cosh", 9, {}, {"x": f32(3, 17, lo=-5, hi=5)}, {}, ORT),
    ("asinh", "Asinh", 9, {}, {"x": f32(3, 17, lo=-9, hi=9)}, {}, ORT),
    ("acosh", "Acosh", 9, {}, {"x": f32(3, 17, lo=1, hi=9)}, {}, ORT),
    ("atanh", "Atanh", 9, {}, {"x": f32(3, 17, lo=-0.99, hi=0.99)}, {}, ORT),
    ("sin_f64", "Sin", 7, {}, {"x": f64(5, lo=-7, hi=7)}, {}, ORT),
    ("castlike_float_to_int64", "CastLike", 15, {}, {"x": f32(3, 5, lo=-9, hi=9)},
     {"like": np.zeros((1,), np.int64)}, ORT),
    ("castlike_int32_to_float64", "CastLike", 19, {"saturate": 1}, {"x": ints(np.int32, 7)},
     {"like": np.zeros((1,), np.float64)}, ORT),
    ("castlike_float_to_bool", "CastLike", 15, {}, {"x": np.array([0.0, -0.0, 1.5, np.nan, -3.0], np.float32)},
     {"like": np.zeros((1,), np.bool_)}, ORT),
    ("castlike_same", "CastLike", 15, {}, {"x": f32(1, 3)}, {"like": np.zeros((1,), np.float32)}, ORT),
    # existing variadic ops over integers
    ("max_int64", "Max", 13, {}, {"a": ints(np.int64, 3, 5), "b": ints(np.int64, 5), "c": ints(np.int64, 3, 1)},
     {}, ORT),
    ("min_uint8", "Min", 12, {}, {"a": ints(np.uint8, 7, lo=0, hi=255), "b": ints(np.uint8, 1, lo=0, hi=255)},
     {}, ORT),
    ("max_int8_v12", "Max", 12, {}, {"a": ints(np.int8, 1, 7), "b": ints(np.int8, 3, 1)}, {}, REF),
]


def _model(op, opset, attrs, inputs, consts):
    node = helper.make_node(op, list(inputs) + list(consts), ["out"], **attrs)
    return testing.one_node_model(node, inputs, consts, opset)


def _expected(model, inputs, oracle):
    if oracle == REF:
        return ReferenceEvaluator(model).run(None, inputs)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, inputs)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_reference(case):
    _, op, opset, attrs, inputs, consts, oracle = case
    model = _model(op, opset, attrs, inputs, consts)
    expected = _expected(model, inputs, oracle)
    got = polyc.onnx.compile(model).run(inputs)
    for g, e in zip(got, expected):
        e = np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, g.dtype, e.shape, e.dtype)
        if g.dtype.kind == "f":
            np.testing.assert_allclose(g, e, rtol=2e-6 if g.dtype == np.float64 else 1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(g, e)


def test_attention_mask_chain_fuses():
    """Equal -> Not -> Expand -> Where (a transformers padding mask) as one model, against onnxruntime."""
    ids = np.array([[5, 3, 0, 0, 0], [7, 1, 2, 9, 0], [1, 1, 1, 1, 1]], np.int64)
    scores = f32(3, 2, 5, 5)
    nodes = [
        helper.make_node("Equal", ["ids", "pad"], ["is_pad"]),
        helper.make_node("Not", ["is_pad"], ["keep"]),
        helper.make_node("Unsqueeze", ["keep", "axes"], ["keep4"]),
        helper.make_node("Expand", ["keep4", "shape"], ["mask"]),
        helper.make_node("Where", ["mask", "scores", "neg"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "mask",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, [3, 5]),
         helper.make_tensor_value_info("scores", TensorProto.FLOAT, [3, 2, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 2, 5, 5])],
        [helper.make_tensor("pad", TensorProto.INT64, [], [0]),
         helper.make_tensor("axes", TensorProto.INT64, [2], [1, 2]),
         helper.make_tensor("shape", TensorProto.INT64, [4], [3, 2, 5, 5]),
         helper.make_tensor("neg", TensorProto.FLOAT, [], [-1e9])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    inputs = {"ids": ids, "scores": scores}
    expected = _expected(model, inputs, ORT)[0]
    compiled = polyc.onnx.compile(model)
    np.testing.assert_array_equal(compiled.run(inputs)[0], expected)
    assert len([k for k in compiled.kernels if k is not None]) == 2  # Equal+Not, Expand+Where


def test_expand_shape_must_be_constant():
    model = _model("Expand", 13, {}, {"x": f32(3, 1), "s": np.array([2, 3, 4], np.int64)}, {})
    with pytest.raises(PolycError, match="Expand"):
        polyc.onnx.compile(model)


# ---- the language builtins the converters use ------------------------------------------------------------

@pytest.mark.parametrize("name,ref,lo,hi", [
    ("tan", np.tan, -1.4, 1.4), ("asin", np.arcsin, -1, 1), ("acos", np.arccos, -1, 1), ("atan", np.arctan, -9, 9),
    ("sinh", np.sinh, -5, 5), ("cosh", np.cosh, -5, 5), ("asinh", np.arcsinh, -9, 9), ("acosh", np.arccosh, 1, 9),
    ("atanh", np.arctanh, -0.99, 0.99), ("rint", np.rint, -9, 9)])
@pytest.mark.parametrize("n", [1, 7, 37])
def test_float_builtin(name, ref, lo, hi, n):
    x = R.uniform(lo, hi, n).astype(np.float32)
    if name == "rint":
        x = np.round(x * 2) / 2
    k = polyc.define(f"def k(float(N) X) -> (float(N) Y) {{ Y(i) = {name}(X(i)) }}")
    np.testing.assert_allclose(k(x), ref(x), rtol=1e-5, atol=1e-6)
    k64 = polyc.define(f"def k(double(N) X) -> (double(N) Y) {{ Y(i) = {name}(X(i)) }}")
    np.testing.assert_allclose(k64(x.astype(np.float64)), ref(x.astype(np.float64)), rtol=1e-12)


def test_fmod_builtin():
    a, c = f32(37, lo=-9, hi=9), f32(37, lo=-3, hi=3)
    k = polyc.define("def k(float(N) A, float(N) B) -> (float(N) Y) { Y(i) = fmod(A(i), B(i)) }")
    np.testing.assert_array_equal(k(a, c), np.fmod(a, c))


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.int64, np.uint8, np.uint16, np.uint64])
def test_bitwise_builtins(dtype):
    t = np.dtype(dtype).name
    bits = np.dtype(dtype).itemsize * 8
    info = np.iinfo(dtype)
    a = R.integers(info.min, info.max, 41, dtype=dtype, endpoint=True)
    c = R.integers(info.min, info.max, 41, dtype=dtype, endpoint=True)
    s = R.integers(0, bits + 3, 41).astype(dtype)
    k = polyc.define(f"""def k({t}(N) A, {t}(N) B, {t}(N) S) -> ({t}(N) Y0, {t}(N) Y1, {t}(N) Y2, {t}(N) Y3,
                                                                 {t}(N) Y4, {t}(N) Y5) {{
        Y0(i) = bitand(A(i), B(i))
        Y1(i) = bitor(A(i), B(i))
        Y2(i) = bitxor(A(i), B(i))
        Y3(i) = bitnot(A(i))
        Y4(i) = shl(A(i), S(i))
        Y5(i) = shr(A(i), S(i))
    }}""")
    got = k(a, c, s)
    wide = s.astype(np.uint64)
    shl = np.where(wide >= bits, 0, np.left_shift(a, np.minimum(s, bits - 1).astype(dtype))).astype(dtype)
    shr = np.right_shift(a, np.minimum(s, bits - 1).astype(dtype))
    shr = np.where(wide >= bits, np.where(a < 0, -1, 0) if info.min < 0 else 0, shr).astype(dtype)
    for g, e in zip(got, [a & c, a | c, a ^ c, ~a, shl, shr]):
        np.testing.assert_array_equal(g, e)


def test_bitwise_builtin_rejects_float():
    with pytest.raises(PolycError, match="integers"):
        polyc.define("def k(float(N) A) -> (float(N) Y) { Y(i) = bitnot(A(i)) }")(np.zeros(3, np.float32))


@pytest.mark.parametrize("op,opset,attrs,inputs", [
    ("BitShift", 11, {"direction": "UP"}, {"a": ints(np.uint8, 3, lo=0, hi=9), "b": ints(np.uint8, 3, lo=0, hi=3)}),
    ("Mod", 13, {"fmod": 2}, {"a": ints(np.int32, 3), "b": ints(np.int32, 3, lo=1, hi=5)}),
])
def test_unsupported_attribute_value(op, opset, attrs, inputs):
    model = _model(op, opset, attrs, inputs, {})
    with pytest.raises(PolycError, match=op):
        polyc.onnx.compile(model)
