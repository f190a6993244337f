"""float16 (``half``) and bfloat16: storage types computed in float32, in the language, the kernel API, the
generated code and ONNX models.

References: numpy's float16 rounding (``astype``: one correct rounding to nearest even), ml_dtypes' bfloat16
from float32 (the same rule), and onnxruntime on float16 models. onnxruntime's CPU provider runs most float16
ops by casting to float32 around them and rounding once at the end, as polyc does, so most results agree bit
for bit; the tolerance is four float16 units in the last place (``rtol=4 * 2**-10``) plus ``atol=1e-3``.
"""
import os
import re

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

import polyc
import polyc.onnx
from polyc.target import host_target
from polyc.errors import SemanticError, ShapeError
from polyc.lang import check_def, format_program, parse
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

BF16 = ml_dtypes.bfloat16
R = np.random.default_rng(10)
SIZES = (1, 7, 37, 131)
#: AVX2 and AVX-512 code: every host runs the first; the AVX-512 cases need a host with AVX-512F (a session's
#: machine may have only AVX2, where polyc refuses POLYC_CPU=znver5; they run wherever the hardware allows)
def _host_has_avx512() -> bool:
    saved = os.environ.pop("POLYC_CPU", None)
    try:
        return host_target().has_feature("avx512f")
    finally:
        if saved is not None:
            os.environ["POLYC_CPU"] = saved


NO_AVX512 = pytest.mark.skipif(not _host_has_avx512(), reason="this machine cannot run AVX-512 code")
CPUS = ("znver3", pytest.param("znver5", marks=NO_AVX512))

#: float16: four units in the last place relative, and a little absolute slack near zero.
RTOL, ATOL = 4 * 2.0 ** -10, 1e-3


def h(*shape, pos=False):
    a = R.standard_normal(shape).astype(np.float32)
    return (np.abs(a) + 0.1 if pos else a).astype(np.float16)


def same_bits(got, want):
    """Equal bit for bit, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan = np.isnan(w)
    assert np.array_equal(np.isnan(g), nan)
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}[got.dtype.itemsize]
    bad = np.nonzero(got.view(uint)[~nan] != want.view(uint)[~nan])[0]
    assert bad.size == 0, f"{bad.size} differ, first {got[~nan][bad[:3]]} != {want[~nan][bad[:3]]}"


def bf16_from_float64(x):
    """float64 → bfloat16 rounded once (ml_dtypes goes through float32 and can round twice): round to float32
    *to odd*, then to nearest even."""
    f = x.astype(np.float32)
    back = f.astype(np.float64)
    inexact = (back != x) & ~np.isnan(x)
    away = np.where(x > 0, back > x, back < x)
    bits = f.view(np.uint32)
    bits = np.where(inexact, (bits - away.astype(np.uint32)) | np.uint32(1), bits).astype(np.uint32)
    return bits.view(np.float32).astype(BF16)


@pytest.fixture(params=CPUS)
def cpu(request, monkeypatch):
    monkeypatch.setenv("POLYC_CPU", request.param)
    return request.param


# ---- the language -----------------------------------------------------------------------------------------

def test_half_and_bfloat16_parse_and_print_back():
    source = ("def f(half(N) A, bfloat16(N) B, float16 s) -> (half(N) C) {\n"
              "    C(i) = half(A(i) * B(i) + s)\n}\n")
    program = parse(source)
    assert program.defs[0].params[0].dtype == "float16" and program.defs[0].params[1].dtype == "bfloat16"
    text = format_program(program)
    assert "float16(N) A" in text and "bfloat16(N) B" in text
    assert parse(text).defs == program.defs


def _checked(source):
    return check_def(parse(source).defs[0], source)


def test_arithmetic_on_storage_types_computes_in_float32():
    c = _checked("def f(half(N) A, half(N) B, bfloat16(N) D) -> (C, E, G, H) {\n"
                 "  C(i) = A(i) + B(i)\n  E(i) = A(i) > 0 ? A(i) : B(i)\n  G(i) = half(A(i) * 2)\n"
                 "  H(i) = A(i) + D(i) }")
    dtypes = {t.name: t.dtype for t in c.tensors}
    assert dtypes == {"A": "float16", "B": "float16", "D": "bfloat16", "C": "float32", "E": "float16",
                      "G": "float16", "H": "float32"}
    rhs = c.statements[0].stmt.rhs
    assert rhs.dtype == "float32" and rhs.lhs.dtype == "float32" and rhs.lhs.operand.dtype == "float16"
    assert c.statements[1].stmt.rhs.cond.lhs.dtype == "float32"  # the comparison too


def test_storing_into_a_half_tensor_needs_an_explicit_conversion():
    with pytest.raises(SemanticError, match="narrowing conversion from float32 to float16"):
        _checked("def f(half(N) A) -> (half(N) C) { C(i) = A(i) + 1 }")
    _checked("def f(half(N) A) -> (half(N) C) { C(i) = half(A(i) + 1) }")
    _checked("def f(half(N) A) -> (half(N) C, bfloat16(N) D) { C(i) = 0.5; D(i) = 3 }")  # literals convert
    with pytest.raises(SemanticError, match="narrowing conversion from float16 to bfloat16"):
        _checked("def f(half(N) A) -> (bfloat16(N) C) { C(i) = A(i) }")


def test_reductions_never_accumulate_in_a_storage_type():
    with pytest.raises(SemanticError, match="round to float16") as info:
        _checked("def f(half(N,K) A) -> (half(N) C) { C(i) +=! A(i,k) }")
    assert "reduce into a float temporary" in info.value.hint
    c = _checked("def f(half(N,K) A) -> (half(N) C) { T(i) +=! A(i,k); U(i) max=! A(i,k); C(i) = half(T(i)) }")
    assert c.tensor("T").dtype == "float32" and c.tensor("U").dtype == "float32"


# ---- kernels against numpy --------------------------------------------------------------------------------

def test_elementwise_half_kernel_rounds_like_numpy(cpu):
    k = polyc.define("def f(half(N) A, half(N) B, half s) -> (half(N) C, D) {\n"
                     "  C(i) = half(A(i) * B(i) + s)\n  D(i) = sqrt(fabs(A(i))) - B(i) }")
    for n in SIZES:
        a, b = h(n), h(n)
        c, d = k(a, b, 0.3)
        a32, b32, s32 = a.astype(np.float32), b.astype(np.float32), np.float32(np.float16(0.3))
        same_bits(c, (a32 * b32 + s32).astype(np.float16))
        assert d.dtype == np.float32
        np.testing.assert_allclose(d, np.sqrt(np.abs(a32)) - b32, rtol=1e-6)


def test_bfloat16_kernel_rounds_like_ml_dtypes(cpu):
    k = polyc.define("def f(bfloat16(M,N) A, float(N) B) -> (bfloat16(M,N) C) { C(i,j) = bfloat16(A(i,j) * B(j)) }")
    for m, n in ((1, 1), (3, 37), (5, 131)):
        a = R.standard_normal((m, n)).astype(BF16)
        b = R.standard_normal(n).astype(np.float32)
        same_bits(k(a, b), (a.astype(np.float32) * b).astype(BF16))


def test_matmul_of_half_accumulates_in_float32(cpu):
    k = polyc.define("def mm(half(M,K) A, half(K,N) B) -> (half(M,N) C) {\n"
                     "  T(m,n) +=! A(m,k) * B(k,n)\n  C(m,n) = half(T(m,n)) }")
    for m, kk, n in ((1, 1, 1), (7, 300, 37), (13, 64, 131)):
        a, b = h(m, kk), h(kk, n)
        exact = a.astype(np.float64) @ b.astype(np.float64)
        got = k(a, b)
        assert got.dtype == np.float16
        # the float32 sum is far below a float16 unit: at most one rounding step off the exact product
        np.testing.assert_allclose(got, exact.astype(np.float16), rtol=2.0 ** -10, atol=1e-4)


def test_einsum_of_storage_operands():
    a, b = h(5, 300), h(300, 7)
    got = polyc.einsum("ij,jk->ik", a, b)
    assert got.dtype == np.float16
    np.testing.assert_allclose(got, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16),
                               rtol=2.0 ** -10, atol=1e-4)
    x, z = a.astype(np.float32).astype(BF16), b.astype(np.float32).astype(BF16)
    y = R.standard_normal(7).astype(BF16)
    got = polyc.einsum("ij,jk,k->i", x, z, y)
    assert got.dtype == BF16
    exact = x.astype(np.float64) @ z.astype(np.float64) @ y.astype(np.float64)
    np.testing.assert_allclose(got.astype(np.float64), exact, rtol=2.0 ** -8, atol=1e-3)
    assert polyc.einsum("i,i->i", a[0, :7], y).dtype == np.float32  # float16 with bfloat16


# ---- conversions, every pair, against numpy / ml_dtypes ----------------------------------------------------

def _float32_bits():
    top = np.arange(65536, dtype=np.uint32) << 16
    bits = np.concatenate([R.integers(0, 2 ** 32, 20000, dtype=np.uint64).astype(np.uint32),
                           top, top + 0x8000, top + 0x7FFF, top + 0x8001,  # bfloat16 ties and neighbours
                           (np.arange(65536, dtype=np.uint32) << 13) + 0x1000,  # float16 ties, all exponents
                           (np.arange(65536, dtype=np.uint32) << 13) + 0x1001])
    return bits.view(np.float32)


def _float64_values():
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float64)
    bfloats = np.arange(65536, dtype=np.uint16).view(BF16).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        near_ties = [halves * (1 + 2.0 ** -11 + s) for s in (2.0 ** -40, 0, -2.0 ** -40)]
        near_ties += [bfloats * (1 + 2.0 ** -8 + s) for s in (2.0 ** -40, 0, -2.0 ** -40)]
    return np.concatenate(near_ties + [R.standard_normal(20000) * 10.0 ** R.integers(-12, 12, 20000)])


def _convert(src, dst, x):
    k = polyc.define(f"def c({src}(N) A) -> ({dst}(N) B) {{ B(i) = {dst}(A(i)) }}")
    return k(x)


@pytest.mark.parametrize("dst", ["float16", "bfloat16"])
def test_float32_to_storage_rounds_to_nearest_even(dst):
    x = _float32_bits()
    same_bits(_convert("float32", dst, x), x.astype(np.float16 if dst == "float16" else BF16))


def test_float64_to_storage_rounds_once():
    x = _float64_values()
    with np.errstate(invalid="ignore", over="ignore"):
        same_bits(_convert("float64", "float16", x), x.astype(np.float16))
        same_bits(_convert("float64", "bfloat16", x), bf16_from_float64(x))


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
def test_storage_to_every_float_and_back(src):
    x = np.arange(65536, dtype=np.uint16).view(np.float16 if src == "float16" else BF16)
    with np.errstate(invalid="ignore", over="ignore"):
        for dst, dt in (("float32", np.float32), ("float64", np.float64)):
            same_bits(_convert(src, dst, x), x.astype(dt))
        other = "bfloat16" if src == "float16" else "float16"
        same_bits(_convert(src, other, x), x.astype(np.float32).astype(BF16 if other == "bfloat16" else np.float16))


@pytest.mark.parametrize("src", ["float16", "bfloat16"])
def test_storage_to_integers_and_bool_truncates(src):
    x = np.arange(65536, dtype=np.uint16).view(np.float16 if src == "float16" else BF16)
    f = x.astype(np.float64)
    for dst in ("int32", "int8", "uint8"):
        info = np.iinfo(dst)
        keep = x[np.isfinite(f) & (f > info.min - 1) & (f < info.max + 1)]
        np.testing.assert_array_equal(_convert(src, dst, keep), keep.astype(np.float64).astype(dst))
    np.testing.assert_array_equal(_convert(src, "bool", x), f != 0)


def test_integers_to_storage():
    ints = np.concatenate([np.arange(-70000, 70000), (np.arange(-3000, 3000) << 16) + 1,
                           R.integers(-2 ** 31, 2 ** 31, 5000)]).astype(np.int32)
    with np.errstate(over="ignore"):
        same_bits(_convert("int32", "float16", ints), ints.astype(np.float16))
    # to bfloat16 once rounded (exact in float64 first; ml_dtypes rounds through float32)
    same_bits(_convert("int32", "bfloat16", ints), bf16_from_float64(ints.astype(np.float64)))
    small = np.arange(-128, 128).astype(np.int8)
    same_bits(_convert("int8", "bfloat16", small), small.astype(BF16))


# ---- the kernel API ----------------------------------------------------------------------------------------

def test_wrong_dtype_names_the_argument_and_the_conversion():
    k = polyc.define("def f(half(N) A, bfloat16(N) B) -> (C) { C(i) = A(i) + B(i) }")
    with pytest.raises(ShapeError, match="expected dtype float16, got float32") as info:
        k(np.ones(3, np.float32), np.ones(3, BF16))
    assert ".astype(np.float16)" in info.value.hint
    with pytest.raises(ShapeError, match="expected dtype bfloat16, got uint16") as info:
        k(np.ones(3, np.float16), np.ones(3, np.uint16))
    assert "ml_dtypes.bfloat16" in info.value.hint
    out = np.empty(3, np.float32)
    k(np.ones(3, np.float16), np.ones(3, np.uint16).view(BF16), out=out)  # uint16 bits viewed as bfloat16
    assert out.dtype == np.float32


def test_half_outputs_are_allocated_as_float16_and_out_is_checked():
    k = polyc.define("def f(float(N) A) -> (half(N) C) { C(i) = half(A(i)) }")
    a = np.array([1.0, 2.0 ** -25, 70000.0], np.float32)
    c = k(a)
    assert c.dtype == np.float16
    same_bits(c, a.astype(np.float16))
    with pytest.raises(ShapeError, match="out= for output 'C'"):
        k(a, out=np.empty(3, np.float32))


# ---- generated code ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("cpu, register", [("znver3", "ymm"), pytest.param("znver5", "zmm", marks=NO_AVX512)])
def test_conversions_stay_vectorized_and_call_nothing(monkeypatch, cpu, register):
    monkeypatch.setenv("POLYC_CPU", cpu)
    half = polyc.define("def f(half(N) A, half(N) B) -> (half(N) C) { C(i) = half(A(i) * B(i) + 1.0) }")
    a = h(1000)
    asm = half.specialize(a, a).stage("asm")
    # F16C's vcvtph2ps / vcvtps2ph $imm, or AVX512-FP16's vcvtph2psx / vcvtps2phx where the host has it
    assert re.search(rf"vcvtph2psx?\s+[^\n]*%{register}", asm)
    assert re.search(rf"vcvtps2phx?\s+(\$\d+, )?%{register}", asm)
    assert re.search(rf"vfmadd\w+\s+[^\n]*%{register}", asm)
    bf = polyc.define("def g(bfloat16(N) A, double(N) B) -> (bfloat16(N) C, half(N) D) {\n"
                      "  C(i) = bfloat16(A(i) * 3.0); D(i) = half(B(i)) }")
    b = np.ones(1000, BF16)
    asm = bf.specialize(b, np.ones(1000)).stage("asm")
    assert not re.search(r"\bcall", asm), "a conversion calls a runtime library"
    assert re.search(rf"vpslld\s+[^\n]*%{register}", asm)


# ---- ONNX models against onnxruntime -----------------------------------------------------------------------

def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def close(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g.astype(np.float64), e.astype(np.float64), rtol=RTOL, atol=ATOL)


# (id, op, opset, attrs, inputs, constants)
ONE_NODE = [
    ("add_broadcast", "Add", 14, {}, {"a": h(2, 3, 5), "b": h(3, 1)}, {}),
    ("div", "Div", 14, {}, {"a": h(5, 7), "b": h(5, 7, pos=True)}, {}),
    ("sigmoid", "Sigmoid", 13, {}, {"x": h(1, 37)}, {}),
    ("gelu", "Gelu", 20, {}, {"x": h(5, 7)}, {}),
    ("clip", "Clip", 13, {}, {"x": h(5, 7)}, {"lo": np.array(-0.5, np.float16), "hi": np.array(0.7, np.float16)}),
    ("max3", "Max", 13, {}, {"a": h(2, 3), "b": h(3), "c": h(2, 1)}, {}),
    ("matmul_batched", "MatMul", 13, {}, {"a": h(2, 5, 67), "b": h(67, 9)}, {}),
    ("gemm", "Gemm", 13, {"transB": 1, "alpha": 0.5}, {"a": h(5, 37)}, {"b": h(11, 37), "c": h(11)}),
    ("conv", "Conv", 11, {"pads": [1, 1, 1, 1]}, {"x": h(1, 3, 9, 8)}, {"w": h(4, 3, 3, 3), "b": h(4)}),
    ("conv_channels_last", "Conv", 11, {"pads": [1, 1, 1, 1]}, {"x": h(1, 7, 7, 7)},
     {"w": h(37, 7, 3, 3), "b": h(37)}),
    ("maxpool", "MaxPool", 12, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     {"x": h(1, 3, 9, 8)}, {}),
    ("avgpool", "AveragePool", 11, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     {"x": h(1, 3, 9, 8)}, {}),
    ("reducesum_long", "ReduceSum", 13, {"keepdims": 0}, {"x": h(3, 500, 5)}, {"axes": np.array([1], np.int64)}),
    ("reducemean", "ReduceMean", 18, {}, {"x": h(3, 7, 5)}, {"axes": np.array([1, 2], np.int64)}),
    ("reducemax", "ReduceMax", 18, {}, {"x": h(3, 7, 5)}, {"axes": np.array([2], np.int64)}),
    ("softmax", "Softmax", 13, {}, {"x": h(3, 7, 5)}, {}),
    ("layernorm", "LayerNormalization", 17, {}, {"x": h(3, 7, 16)}, {"s": h(16), "bb": h(16)}),
    ("transpose", "Transpose", 13, {"perm": [2, 0, 1]}, {"x": h(3, 7, 5)}, {}),
    ("resize_linear", "Resize", 13, {"mode": "linear"}, {"x": h(1, 2, 3, 4)},
     {"roi": np.array([], np.float32), "sc": np.array([1, 1, 2, 2], np.float32)}),
    ("cast_to_float", "Cast", 13, {"to": TensorProto.FLOAT}, {"x": h(3, 4)}, {}),
    ("cast_to_half", "Cast", 13, {"to": TensorProto.FLOAT16}, {"x": R.standard_normal((3, 4)).astype(np.float32)}, {}),
    ("cast_to_int64", "Cast", 13, {"to": TensorProto.INT64}, {"x": h(3, 4) * 10}, {}),
]


@pytest.mark.parametrize("case", ONE_NODE, ids=[c[0] for c in ONE_NODE])
def test_float16_node_matches_onnxruntime(case):
    _, op, opset, attrs, inputs, consts = case
    node = helper.make_node(op, list(inputs) + list(consts), ["y"], **attrs)
    model = testing.one_node_model(node, inputs, consts, opset)
    close(polyc.onnx.compile(model).run(inputs), ort_run(model, inputs))


def test_float16_batchnorm_is_close_to_onnxruntime():
    """Looser: the graph passes fold BatchNormalization's constants into a Mul and an Add whose scale, shift
    and intermediate are float16 (``passes.decompose_batchnorm``), a few units in the last place off."""
    inputs, consts = {"x": h(2, 3, 5, 5)}, {"s": h(3), "bb": h(3), "m": h(3), "v": h(3, pos=True)}
    node = helper.make_node("BatchNormalization", ["x", "s", "bb", "m", "v"], ["y"])
    model = testing.one_node_model(node, inputs, consts, 15)
    got, want = polyc.onnx.compile(model).run(inputs)[0], ort_run(model, inputs)[0]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=16 * 2.0 ** -10, atol=4e-3)


def _half_model():
    """Conv → Relu → MaxPool → 1x1 Conv + residual Add → ReduceMean → Gemm → Softmax, and LayerNormalization
    → MatMul → Gelu → Cast to float, all float16 (fused groups keep their float32 temporaries inside)."""
    f16 = TensorProto.FLOAT16
    w = {"w1": h(8, 3, 3, 3) * 0.4, "b1": h(8) * 0.1, "w2": h(8, 8, 1, 1) * 0.3, "fc": h(5, 8), "fb": h(5) * 0.1,
         "ls": h(12), "lb": h(12) * 0.1, "mw": h(12, 6) * 0.3}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"]),
        helper.make_node("Add", ["c2", "p1"], ["s1"]),
        helper.make_node("ReduceMean", ["s1", "axes"], ["g1"], keepdims=0),
        helper.make_node("Gemm", ["g1", "fc", "fb"], ["z"], transB=1),
        helper.make_node("Softmax", ["z"], ["probs"]),
        helper.make_node("LayerNormalization", ["t", "ls", "lb"], ["ln"], axis=-1),
        helper.make_node("MatMul", ["ln", "mw"], ["mm"]),
        helper.make_node("Gelu", ["mm"], ["gl"]),
        helper.make_node("Cast", ["gl"], ["gl32"], to=TensorProto.FLOAT),
    ]
    inits = [helper.make_tensor(n, f16, a.shape, a.tobytes(), raw=True) for n, a in w.items()]
    inits.append(helper.make_tensor("axes", TensorProto.INT64, [2], [2, 3]))
    graph = helper.make_graph(nodes, "half_net", [helper.make_tensor_value_info("x", f16, [2, 3, 11, 9]),
                                                  helper.make_tensor_value_info("t", f16, [2, 7, 12])],
                              [helper.make_tensor_value_info("probs", f16, [2, 5]),
                               helper.make_tensor_value_info("gl32", TensorProto.FLOAT, [2, 7, 6])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    model.ir_version = 9
    return model


def test_float16_model_matches_onnxruntime_on_both_targets(cpu):
    model = _half_model()
    feeds = {"x": h(2, 3, 11, 9), "t": h(2, 7, 12)}
    got = polyc.onnx.compile(model).run(feeds)
    assert got[0].dtype == np.float16 and got[1].dtype == np.float32
    close(got, ort_run(model, feeds))


def test_bfloat16_cast_model_matches_the_reference():
    bf = TensorProto.BFLOAT16
    nodes = [helper.make_node("Cast", ["x"], ["xb"], to=bf),
             helper.make_node("Mul", ["xb", "xb"], ["sq"]),
             helper.make_node("Cast", ["sq"], ["y"], to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "bf", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 37])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 37]),
                               helper.make_tensor_value_info("sq", bf, [3, 37])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    x = R.standard_normal((3, 37)).astype(np.float32)
    y, sq = polyc.onnx.compile(model).run({"x": x})
    xb = x.astype(BF16).astype(np.float32)
    same_bits(sq, (xb * xb).astype(BF16))
    same_bits(y, (xb * xb).astype(BF16).astype(np.float32))
