"""Index safety (issue 16, items 1, 2 and part of 11): no read outside a tensor, whatever the index.

- A non-affine index (``A(i*i)``, ``A(i*j)``, ``A(max(i, j))``) cannot be bounded at compile time: the read is
  checked at run time and an index out of range fails the call with KernelRuntimeError instead of reading
  outside the tensor (it used to segfault or read garbage). Writes take index variables only (TC's rule):
  anything else is a ParseError at the index.
- Casts and ``/``, ``%`` in indices are modelled as the code computes them (casts wrap around, division rounds
  toward minus infinity for every divisor): an access that leaves its tensor is a RangeError at compile time.
- Builtins on integers have a defined meaning (``fabs`` converts to float as C does) and long identifiers work.

Every kernel runs with the default options (tiling, vectorization, threads) and with every transform off.
"""
import numpy as np
import pytest
from targets import RUNNABLE_CPUS

import polyc
from polyc import Options
from polyc.errors import KernelRuntimeError, ParseError, RangeError, SemanticError

OPTIONS = [Options(), Options.naive(), Options(threads=2, tile_sizes=(4, 4))]
IDS = ["default", "naive", "threads"]


def arange(n, dtype=np.float32):
    return (np.arange(n) * 1.5 + 1).astype(dtype)


# ---- item 1: non-affine indices are checked at run time ------------------------------------------------

SQUARE = "def f(float(N) A) -> (B) { B(i) = A(i*i) where i in 0:N }"


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 2])
def test_square_index_in_bounds(n, options):
    a = arange(n)
    np.testing.assert_array_equal(polyc.define(SQUARE, options=options)(a), a[np.arange(n) ** 2])


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [3, 5, 13, 200_000])
def test_square_index_out_of_bounds_fails_the_call(n, options):
    kernel = polyc.define(SQUARE, options=options)
    with pytest.raises(KernelRuntimeError, match="out of range"):
        kernel(arange(n))


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 7, 31])
def test_non_affine_index_in_bounds_is_computed(n, options):
    src = "def f(float(N) A) -> (B) { B(i) = A((i*i) % N) + A(N - 1 - (i*i*i) % N) where i in 0:N }"
    a, i = arange(n), np.arange(n, dtype=np.int64)
    np.testing.assert_array_equal(polyc.define(src, options=options)(a), a[i * i % n] + a[n - 1 - i ** 3 % n])


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("m", [1, 3, 6])
def test_product_of_two_indices(m, options):
    src = "def f(float(N) A, float(M) D) -> (B) { B(i, j) = A(i*j) + D(i) - D(j) }"
    kernel = polyc.define(src, options=options)
    d = arange(m)
    a = arange((m - 1) ** 2 + 1)
    i, j = np.meshgrid(np.arange(m), np.arange(m), indexing="ij")
    np.testing.assert_array_equal(kernel(a, d), a[i * j] + d[i] - d[j])
    if m > 1:
        with pytest.raises(KernelRuntimeError, match="out of range"):
            kernel(a[:-1].copy(), d)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 5, 11])
def test_guarded_non_affine_read_is_checked_only_where_taken(n, options):
    src = "def f(float(N) A) -> (B) { B(i) = (i*i < N) ? A(i*i) : -1.0 where i in 0:N }"
    a, i = arange(n), np.arange(n)
    expected = np.where(i * i < n, a[np.minimum(i * i, n - 1)], -1).astype(np.float32)
    np.testing.assert_array_equal(polyc.define(src, options=options)(a), expected)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 4, 9])
def test_non_affine_index_in_a_reduction(n, options):
    src = "def f(float(N) A) -> (B) { B(i) +=! A((i*k) % N) * A(k) where i in 0:N, k in 0:N }"
    a, i = arange(n, np.float64).astype(np.float32), np.arange(n)
    expected = np.array([sum(a[(r * k) % n] * a[k] for k in range(n)) for r in i], np.float32)
    np.testing.assert_allclose(polyc.define(src, options=options)(a), expected, rtol=1e-6)


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_call_in_an_index_is_checked(options):
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(max(i - 1, 0)) + A(min(i + 1, N - 1)) where i in 0:N }",
                          options=options)
    a, i = arange(6), np.arange(6)
    np.testing.assert_array_equal(kernel(a), a[np.maximum(i - 1, 0)] + a[np.minimum(i + 1, 5)])
    bad = polyc.define("def f(float(N) A) -> (B) { B(i) = A(max(i + 1, 0)) where i in 0:N }", options=options)
    with pytest.raises(KernelRuntimeError, match="out of range"):
        bad(a)


def test_non_affine_reads_are_marked_checked_and_affine_ones_are_not():
    from polyc.lang import ast as L
    from polyc.lang import check_def, parse
    from polyc.poly.affine import children
    from polyc.poly.build import build_scop

    src = "def f(float(N) A) -> (B) { B(i) = A(i*i) + A(N - 1 - i) + A(int8(i)) where i in 0:N }"
    scop = build_scop(check_def(parse(src).defs[0], src), {"N": 4})
    reads = []

    def visit(e):
        if isinstance(e, L.Access):
            reads.append(e)
        for c in children(e):
            visit(c)

    visit(scop.statements[0].rhs)
    assert [r.checked for r in reads] == [True, False, False]


@pytest.mark.parametrize("src", ["def f(float(N) A) -> (B) { B(i*i) = A(i) }",
                                 "def f(float(N) A) -> (B) { B(i) = A(i)\n  B(i+1) = A(i) }"])
def test_write_with_an_expression_index_is_a_parse_error(src):
    with pytest.raises(ParseError, match="left-hand side takes index variables only") as info:
        polyc.define(src)
    assert info.value.span is not None and "^" in str(info.value)


# ---- item 2: casts, / and % in indices are modelled as computed ----------------------------------------

def test_int8_cast_that_wraps_is_a_range_error():
    src = "def f(float(N) A) -> (B) { B(i) = A(int8(i)) where i in 0:N }"
    kernel = polyc.define(src)
    with pytest.raises(RangeError, match="'A' leaves its shape") as info:
        kernel(arange(300))
    assert "1:" in str(info.value) and "^" in str(info.value)
    for n in (1, 7, 128):
        np.testing.assert_array_equal(kernel(arange(n)), arange(n))


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_int16_cast_reversal(options):
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(N - 1 - int16(i)) where i in 0:N }",
                          options=options)
    with pytest.raises(RangeError, match="'A' leaves its shape"):
        kernel(arange(40_000))
    for n in (1, 13, 32_768):
        a = arange(n)
        np.testing.assert_array_equal(kernel(a), a[::-1])


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 256, 257])
def test_wrapping_casts_that_stay_in_bounds(n, options):
    src = """def f(float(M) A, float(N) X) -> (B, C) {
        B(i) = A(int8(i) + 128) + X(i)
        C(i) = A(uint8(i) + uint8(3)) - X(i)
    }"""
    a, x = arange(256), arange(n)
    b, c = polyc.define(src, options=options)(a, x)
    i = np.arange(n)
    np.testing.assert_array_equal(b, a[i.astype(np.int8).astype(np.int64) + 128] + x)
    np.testing.assert_array_equal(c, a[(i.astype(np.uint8) + np.uint8(3)).astype(np.int64)] - x)


def test_int64_to_int32_cast_wraps_in_the_model():
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(int32(int64(i) + 4294967296)) where i in 0:N }")
    a = arange(5)
    np.testing.assert_array_equal(kernel(a), a)
    bad = polyc.define("def f(float(N) A) -> (B) { B(i) = A(int32(int64(i) + 2147483648)) where i in 0:N }")
    with pytest.raises(RangeError):
        bad(a)


def test_modulo_by_a_negative_constant_is_a_range_error():
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(i % -3) where i in 0:N }")
    with pytest.raises(RangeError, match="'A' leaves its shape"):
        kernel(arange(10))
    np.testing.assert_array_equal(kernel(arange(1)), arange(1))  # 0 % -3 == 0


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("n", [1, 2, 3, 10, 17])
def test_negative_divisors_round_toward_minus_infinity(n, options):
    src = """def f(float(N) A) -> (B, C, D) {
        B(i) = A(-(i % -3) % N) where i in 0:N
        C(i) = A(i / -2 + N / 2) where i in 0:N
        D(i) = A((i + 5) / -1 + N + 4)
    }"""
    a, i = arange(n), np.arange(n)
    b, c, d = polyc.define(src, options=options)(a)
    np.testing.assert_array_equal(b, a[-(i % -3) % n])
    np.testing.assert_array_equal(c, a[i // -2 + n // 2])
    np.testing.assert_array_equal(d, a[(i + 5) // -1 + n + 4])


def test_division_by_zero_in_an_index_is_zero():
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(i / 0) + A(i % 0) where i in 0:N }")
    a = arange(4)
    np.testing.assert_array_equal(kernel(a), np.full(4, 2 * a[0]))


def test_guard_whose_int32_arithmetic_overflows_does_not_hide_a_read():
    # i * 2^30 wraps to a negative int32 at i == 2: the guard is true there and A(i + 5) is read.
    src = "def f(float(N) A) -> (B) { B(i) = (i * 1073741824 < 0) ? A(i + 5) : 0.0 where i in 0:N }"
    with pytest.raises(RangeError, match="'A' leaves its shape"):
        polyc.define(src)(arange(3))


@pytest.mark.parametrize("n", [1, 4, 100])
def test_range_inference_ignores_wrapping_casts(n):
    with pytest.raises(RangeError, match="cannot infer the range of index 'i'"):
        polyc.define("def f(float(N) A) -> (B) { B(i) = A(int8(i)) }")(arange(n))
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = A(int64(i)) }")
    np.testing.assert_array_equal(kernel(arange(n)), arange(n))


# ---- item 11 (part): builtins on integers, long identifiers --------------------------------------------

INT_DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint32"]


def signed_values(dtype, n=17):
    if dtype == "bool":
        return np.arange(n) % 3 == 0
    v = np.arange(n) - (n // 2 if np.dtype(dtype).kind == "i" else 0)
    return (v * 3).astype(dtype)


@pytest.mark.parametrize("options", OPTIONS[:2], ids=IDS[:2])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_fabs_and_abs_of_integers(dtype, options):
    src = f"def f({dtype}(N) A) -> (F, B) {{ F(i) = fabs(A(i))\n  B(i) = abs(A(i)) }}"
    a = signed_values(dtype)
    f, b = polyc.define(src, options=options)(a)
    assert f.dtype == np.float32
    np.testing.assert_array_equal(f, np.abs(a.astype(np.float32)))
    np.testing.assert_array_equal(b, a if dtype == "bool" else np.abs(a))
    assert b.dtype == a.dtype


@pytest.mark.parametrize("options", OPTIONS[:2], ids=IDS[:2])
@pytest.mark.parametrize("dtype", INT_DTYPES)
def test_min_max_of_integers_and_mixed(dtype, options):
    src = f"""def f({dtype}(N) A, {dtype}(N) B, float(N) X) -> (L, H, FL, FH, M) {{
        L(i) = min(A(i), B(i))
        H(i) = max(A(i), B(i))
        FL(i) = fmin(A(i), B(i))
        FH(i) = fmax(A(i), B(i))
        M(i) = max(A(i), X(i)) + min(X(i), B(i))
    }}"""
    a, b = signed_values(dtype), signed_values(dtype)[::-1].copy()
    x = np.linspace(-20, 20, 17).astype(np.float32)
    low, high, flow, fhigh, mixed = polyc.define(src, options=options)(a, b, x)
    np.testing.assert_array_equal(low, np.minimum(a, b))
    np.testing.assert_array_equal(high, np.maximum(a, b))
    np.testing.assert_array_equal(flow, np.minimum(a, b))
    np.testing.assert_array_equal(fhigh, np.maximum(a, b))
    np.testing.assert_allclose(mixed, np.maximum(a.astype(np.float32), x) + np.minimum(x, b.astype(np.float32)))


@pytest.mark.parametrize("options", OPTIONS[:2], ids=IDS[:2])
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64"])
def test_float_builtins_of_integers(dtype, options):
    src = f"""def f({dtype}(N) A) -> (E, S, R, P, Q) {{
        E(i) = exp(A(i) / 8) + floor(A(i)) + ceil(A(i)) + sin(A(i)) + cos(A(i)) + tanh(A(i)) + erf(A(i))
        S(i) = sqrt(fabs(A(i))) + sigmoid(A(i)) + log(fabs(A(i)) + 1)
        R(i) = rsqrt(fabs(A(i)) + 1)
        P(i) = pow(A(i), 2) + fma(A(i), A(i), 1)
        Q(i) = fabs(A(i)) + fabs(-A(i))
    }}"""
    import math

    erf = np.vectorize(math.erf)
    a = signed_values(dtype)
    x = a.astype(np.float64)
    e, s, r, p, q = polyc.define(src, options=options)(a)
    div = np.floor_divide(a.astype(np.int64), 8).astype(np.float64)  # A(i) / 8 divides integers (floor)
    expected_e = np.exp(div) + x + x + np.sin(x) + np.cos(x) + np.tanh(x) + erf(x)
    np.testing.assert_allclose(e, expected_e, rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(s, np.sqrt(np.abs(x)) + 1 / (1 + np.exp(-x)) + np.log(np.abs(x) + 1),
                               rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(r, 1 / np.sqrt(np.abs(x) + 1), rtol=2e-6)
    np.testing.assert_allclose(p, x ** 2 + x * x + 1, rtol=2e-6)
    neg = -a.astype(np.int32) if dtype == "bool" else -a
    np.testing.assert_array_equal(q, np.abs(x).astype(np.float32) + np.abs(neg.astype(np.float32)))
    assert {t.dtype for t in (e, s, r, p, q)} == {np.dtype(np.float32)}


@pytest.mark.parametrize("options", OPTIONS[:2], ids=IDS[:2])
@pytest.mark.parametrize("length", [1_100, 5_000, 70_000])
def test_long_identifiers(length, options):
    long = "x" * length
    names = dict(f=f"f{long}", A=f"A{long}", W=f"A{long}w", T=f"T{long}", U=f"T{long}u", i=f"i{long}",
                 k=f"k{long}", N=f"N{long}")
    src = ("def {f}(float({N}) {A}, float({N}) {W}) -> ({T}, {U}) {{\n"
           "  {T}({i}) = {A}({i}) * 2 + {W}({i})\n"
           "  {U}({i}) +=! {A}({k}) * {W}({i}) + {A}({i}*{i} % {N})\n"
           "}}").format(**names)
    a, w = arange(7), arange(7)[::-1].copy()
    t, u = polyc.define(src, options=options)(a, w)
    np.testing.assert_array_equal(t, a * 2 + w)
    i = np.arange(7)
    np.testing.assert_allclose(u, a.sum() * w + 7 * a[i * i % 7], rtol=1e-6)


@pytest.mark.parametrize("options", [Options(), Options(threads=2), Options(promote=True, threads=2)],
                         ids=["default", "threads", "promote"])
def test_long_identifiers_in_a_tiled_parallel_matmul(options):
    long = "y" * 3000
    src = (f"def mm{long}(float(M{long}, K{long}) A{long}, float(K{long}, N{long}) B{long}) -> (C{long}) {{\n"
           f"  C{long}(m{long}, n{long}) +=! A{long}(m{long}, k{long}) * B{long}(k{long}, n{long})\n}}")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((67, 45)).astype(np.float32)
    b = rng.standard_normal((45, 131)).astype(np.float32)
    np.testing.assert_allclose(polyc.define(src, options=options)(a, b), a @ b, rtol=1e-4, atol=1e-4)


# ---- a small differential fuzz of index expressions against Python integers ----------------------------

_BITS = {"int8": (8, True), "int16": (16, True), "uint8": (8, False), "uint16": (16, False), "int32": (32, True),
         "int64": (64, True), "uint32": (32, False)}


def _wrap(v, dtype):
    bits, signed = _BITS[dtype]
    v &= (1 << bits) - 1
    return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v


def _unify(ta, ka, tb, kb):
    """The dtype of ``a op b`` by the language's rules (None: a weak literal of value k)."""
    def fits(k, t):
        return np.iinfo(t).min <= k <= np.iinfo(t).max
    if ta is None and tb is None:
        return "int32"
    if ta is None:
        return tb if fits(ka, tb) else np.promote_types("int32", tb).name
    if tb is None:
        return ta if fits(kb, ta) else np.promote_types(ta, "int32").name
    return np.promote_types(ta, tb).name


def _random_index(rng, depth):
    """``(source, value(i, j, N), dtype or None for a weak literal, literal value)``, evaluated in Python with
    the language's semantics: casts and narrow arithmetic wrap, / and % round toward minus infinity, by 0 give 0."""
    if depth == 0 or rng.random() < 0.25:
        name = rng.choice(["i", "j", "N", "k"])
        if name == "k":
            k = rng.randint(-5, 9)
            return (f"({k})" if k < 0 else str(k)), (lambda i, j, n: k), None, k
        return name, (lambda i, j, n: {"i": i, "j": j, "N": n}[name]), "int32", None
    op = rng.choice(["+", "-", "*c", "*", "/", "%", "cast", "cast", "neg", "max"])
    a, fa, ta, ka = _random_index(rng, depth - 1)
    if op == "cast":
        t = rng.choice(list(_BITS))
        return f"{t}({a})", (lambda i, j, n: _wrap(fa(i, j, n), t)), t, None
    if op == "neg":
        if ta is None:
            return f"-({a})", (lambda i, j, n: -fa(i, j, n)), None, -ka
        return f"-({a})", (lambda i, j, n: _wrap(-fa(i, j, n), ta)), ta, None
    if op in ("/", "%", "*c"):
        k = rng.choice([-7, -3, -2, -1, 0, 1, 2, 3, 5, 200])
        b, fb, tb, kb = (f"({k})" if k < 0 else str(k)), (lambda i, j, n: k), None, k
    else:
        b, fb, tb, kb = _random_index(rng, depth - 1)
    t = _unify(ta, ka, tb, kb)
    f = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y, "*c": lambda x, y: y * x,
         "/": lambda x, y: x // y if y else 0, "%": lambda x, y: x % y if y else 0, "max": max}[op]
    src = f"max({a}, {b})" if op == "max" else (f"{b} * ({a})" if op == "*c" else f"({a}) {op} ({b})")
    return src, (lambda i, j, n: _wrap(f(fa(i, j, n), fb(i, j, n)), t)), t, None


@pytest.mark.parametrize("seed", range(8))
def test_random_index_expressions_read_what_they_compute_or_fail_clearly(seed):
    import random

    rng = random.Random(seed)
    for _ in range(15):
        src, value, _, _ = _random_index(rng, 3)
        n, m = rng.choice([1, 2, 5, 13, 300]), rng.choice([1, 3])
        text = f"def f(float(N) A, float(M) D) -> (B) {{ B(i, j) = A({src}) + D(j) where i in 0:N, j in 0:M }}"
        a, d = arange(n), np.zeros(m, np.float32)
        index = np.array([[value(i, j, n) for j in range(m)] for i in range(n)])
        inside = bool(((index >= 0) & (index < n)).all())
        options = rng.choice(OPTIONS)
        if inside:
            np.testing.assert_array_equal(polyc.define(text, options=options)(a, d), a[index], err_msg=text)
        else:
            with pytest.raises((RangeError, KernelRuntimeError)):
                polyc.define(text, options=options)(a, d)


def test_long_identifiers_in_a_long_sum():
    long = "z" * 3000
    a = np.ones(2**20, np.float32)
    assert polyc.define(f"def s(float(N) A{long}) -> (T{long}) {{ T{long}() +=! A{long}(i) }}")(a) == 2**20


@pytest.mark.parametrize("dtype", ["int32", "int64", "int16"])
@pytest.mark.parametrize("op, ref", [("%", np.mod), ("/", np.floor_divide)])
def test_floor_div_mod_by_a_tensor_in_unrolled_vector_code(dtype, op, ref):
    """Found by scripts/fuzz.py: the unrolled scalar remainders of an int32 ``%`` (packed by LLVM's SLP
    vectorizer) lost the floor adjustment on AVX-512; every element against numpy, negative divisors too."""
    src = f"def f({dtype}(K) P, {dtype}(N,K) B) -> (O) {{ O(j, l, k) = (P(k) + P(l)) {op} B(j, l) }}"
    kernel = polyc.define(src)
    rng = np.random.default_rng(7)
    for n, k in [(9, 9), (9, 11), (5, 17), (3, 40)]:
        p = rng.integers(-60, 60, k).astype(dtype)
        b = (rng.integers(1, 7, (n, k)) * rng.choice([-1, 1], (n, k))).astype(dtype)
        np.testing.assert_array_equal(kernel(p, b), ref(p[None, :, None] + p[None, None, :], b[:, :, None]))


def _pad_source(h: int, w: int, c: int, inner: str) -> str:
    return f"""def pad(float({h},{w},{c}) X) -> (float({h + 2},{w + 2},{c}) Y) {{
        Y(i, j, k) = (i >= 1 && i <= {h} && j >= 1 && j <= {w}) ? {inner} : 0.0
            where i in 0:{h + 2}, j in 0:{w + 2}, k in 0:{c}
    }}"""


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("c", [64, 19])
def test_a_guard_the_same_for_every_lane_branches_to_plain_vector_loads(monkeypatch, cpu, c):
    """An NHWC Pad, the vector along the channels: its border test is one value for all the lanes, so the code
    branches on it and reads the interior with plain vector loads (no masked load; 19 channels end in a
    partial vector); a lane-varying guard inside it (``k < 5``) keeps its masks. Borders zero, the rest the
    input's, exactly, with the guard true, false, and both within one row."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")
    x = np.random.default_rng(4).standard_normal((9, 7, c)).astype(np.float32)
    want = np.pad(x, ((1, 1), (1, 1), (0, 0)))
    plain = polyc.define(_pad_source(9, 7, c, "X(i-1, j-1, k)")).specialize(x)
    assert "llvm.masked.load" not in plain.stage("llvm") and " x float> " in plain.stage("llvm")
    np.testing.assert_array_equal(plain(x), want)
    nested = polyc.define(_pad_source(9, 7, c, "(k < 5 ? X(i-1, j-1, k) : 2.0 * X(i-1, j-1, k))")).specialize(x)
    assert "llvm.masked.load" in nested.stage("llvm")
    np.testing.assert_array_equal(nested(x), np.where(np.arange(c) < 5, want, 2 * want))
    np.testing.assert_array_equal(polyc.define(_pad_source(9, 7, c, "X(i-1, j-1, k)"),
                                               options=Options.naive()).specialize(x)(x), want)
