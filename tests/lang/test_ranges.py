"""Range inference with TC's semantics: ranges that start anywhere, and reads under ``?:`` guards.

TC's rule (docs: inference.html): an index gets the largest range keeping its accesses in bounds; a tensor
whose shape comes from its first write takes that write's ranges ``[lo, hi)`` as its box: extent ``hi - lo``,
element ``lo`` stored first, later statements use the same logical indices. Each case is checked against a
numpy reference written here, against the independent reference interpreter (tests/tc_reference.py), and
with the unoptimised schedule.
"""
import numpy as np
import pytest

import polyc
import tc_reference as R
from polyc import Options
from polyc.errors import RangeError

rng = np.random.default_rng(11)


def f32(*shape):
    return rng.uniform(-1, 1, shape).astype(np.float32)


def run_all(src, *args):
    """polyc's outputs (default and naive options), after checking both against the reference interpreter."""
    got = polyc.define(src)(*args)
    got = got if isinstance(got, tuple) else (got,)
    naive = polyc.define(src, options=Options.naive())(*args)
    naive = naive if isinstance(naive, tuple) else (naive,)
    reference = R.run(src, list(args))
    for g, n, (name, (value, err)) in zip(got, naive, reference.items()):
        for arr in (g, n):
            problem = R.compare(arr, value, err, str(value.dtype))
            assert problem is None, f"{name}: {problem}"
    return got


I8 = np.arange(8, dtype=np.float32) + 1


@pytest.mark.parametrize("src, expected", [
    # TC's stencil example: A(i) = B(i) + C(i-2) gives i in [2, N): A has N-2 elements, A[0] is i = 2
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i) + C(i-2) }",
     lambda b, c: b[2:] + c[:-2]),
    # inverted indexing: 0 <= 10 - i < 8 gives i in [3, 11), element 0 is B(7)
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(10 - i) }", lambda b, c: b[::-1]),
    # a range below 0: i in [-2, N-2), A is B
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i + 2) }", lambda b, c: b),
    # an explicit range away from 0 is the output's box too
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i) where i in 2:5 }", lambda b, c: b[2:5]),
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i + 3) * C(i + 3) where i in -3:2 }",
     lambda b, c: b[:5] * c[:5]),
    # strided: 0 <= 2i < N
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(2*i) + C(2*i + 1) }", lambda b, c: b[0::2] + c[1::2]),
    # a reduction whose output starts at 2: i - k in [0, N) for k in [0, 3) gives i in [2, N)
    ("def f(float(N) B, float(N) C) -> (A) { A(i) +=! B(i - k) where k in 0:3 }",
     lambda b, c: b[2:] + b[1:-1] + b[:-2]),
    # the index value itself is the logical one
    ("def f(float(N) B, float(N) C) -> (A) { A(i) = B(i + 2) * i }", lambda b, c: b * (np.arange(8) - 2)),
])
def test_ranges_start_where_the_accesses_say(src, expected):
    b, c = I8.copy(), f32(8)
    a, = run_all(src, b, c)
    np.testing.assert_allclose(a, expected(b, c), rtol=1e-6)


def test_later_statements_use_the_logical_indices():
    src = """def f(float(N) I) -> (O, T) {
        T(i) = I(i+2)
        T(i) = T(i) + 1
        O(i) +=! T(i+k) where k in 0:2
        O(i) = O(i) * i
    }"""
    x = f32(8)
    o, t = run_all(src, x)
    np.testing.assert_allclose(t, x + 1, rtol=1e-6)  # T's box is [-2, 6)
    j = np.arange(-2, 5)  # O: i + k in [-2, 6) for k in {0, 1}
    np.testing.assert_allclose(o, ((x + 1)[:-1] + (x + 1)[1:]) * j, rtol=1e-5)


def test_two_dimensional_offsets():
    x = f32(5, 7)
    o, = run_all("def f(float(M,N) X) -> (O) { O(i, j) = X(i - 1, j + 1) * X(i - 1, j + 1) }", x)
    np.testing.assert_allclose(o, x * x, rtol=1e-6)


def test_a_write_outside_the_box_of_the_first_write_is_an_error():
    src = """def f(float(N) I) -> (T) {
        T(i) = I(i+2)
        T(i) = 1.0 where i in 0:N
    }"""
    with pytest.raises(RangeError, match="leaves its shape"):
        polyc.define(src)(I8)
    with pytest.raises(R.TCError, match="leaves"):
        R.run(src, [I8])


def test_convolution_input_gradient_as_tc_writes_it():
    """TC's layer database writes the input gradient of a convolution as ``dI(n,c,h,w) +=! dO(n,m,h-kh,w-kw)
    * W(m,c,kh,kw)``: h - kh in [0, OH) for every kh gives h in [KH-1, OH), so dI holds rows KH-1 .. OH-1."""
    n, m, c, oh, ow, kh, kw = 2, 3, 4, 6, 7, 3, 2
    d_o, w = f32(n, m, oh, ow), f32(m, c, kh, kw)
    src = """def grad(float(N,M,OH,OW) dO, float(M,C,KH,KW) W) -> (dI) {
        dI(n, c, h, w) +=! dO(n, m, h - kh, w - kw) * W(m, c, kh, kw)
    }"""
    di, = run_all(src, d_o, w)
    expected = np.zeros((n, c, oh + kh - 1, ow + kw - 1), np.float64)
    for a in range(kh):
        for b in range(kw):
            expected[:, :, a:a + oh, b:b + ow] += np.einsum("nmhw,mc->nchw", d_o, w[:, :, a, b])
    np.testing.assert_allclose(di, expected[:, :, kh - 1:oh, kw - 1:ow], rtol=1e-4, atol=1e-5)


def test_show_prints_each_range_with_its_lower_bound():
    compiled = polyc.define("def f(float(N) B) -> (A) { A(i) = B(i + 2) }").specialize(I8)
    text = compiled.stage("domain")
    assert "i in -2:6  (stored at i + 2)" in text and "(element 0 is A(-2))" in text


# ---- reads under ?: ---------------------------------------------------------------------------------------

def test_a_read_under_a_guard_that_proves_nothing_constrains_its_index():
    """The suffix sum: j only appears under (j >= i), which proves neither side of 0 <= j < N."""
    lens = I8.copy()
    s, = run_all("def f(float(N) L) -> (S) { S(i) +=! (j >= i) ? L(j) : 0.0 where i in 0:N }", lens)
    np.testing.assert_allclose(s, np.cumsum(lens[::-1])[::-1], rtol=1e-6)
    # the same with i's range from an exists clause (the reference interpreter has no exists clauses)
    s = polyc.define("def f(float(N) L) -> (S) { S(i) +=! (j >= i) ? L(j) : 0.0 where exists L(i) }")(lens)
    np.testing.assert_allclose(s, np.cumsum(lens[::-1])[::-1], rtol=1e-6)


def test_a_read_under_a_data_dependent_guard_constrains():
    x = f32(3, 4)
    keep = np.array([[1, 0, 1, 1], [0, 0, 1, 0]], np.uint8)
    o, = run_all("def f(float(N,C) x, uint8(F,C) keep) -> (O) { O(n,c) +=! keep(f,c) == 0 ? 0.0 : x(n,c) }",
                 x, keep)
    np.testing.assert_allclose(o, x * (keep != 0).sum(0), rtol=1e-6)


def test_a_guard_that_proves_one_side_leaves_the_other_to_the_read():
    """i >= 1 proves i - 1 >= 0 but nothing else bounds i from below: every access constrains (TC), so B has
    A's extent and starts at i = 1; with the output's range given, the guard pads as before."""
    a = f32(6)
    b, = run_all("def f(float(N) A) -> (B) { B(i) = i >= 1 ? A(i-1) : 0.0 }", a)
    np.testing.assert_array_equal(b, a)
    b, = run_all("def f(float(N) A) -> (B) { B(i) = i >= 1 ? A(i-1) : 0.0 where i in 0:N }", a)
    np.testing.assert_array_equal(b, np.concatenate([[0], a[:-1]]))
    # each read constrains only the side its guard does not prove: A(i) (under i < 1) gives i >= 0, A(i-1)
    # (under i >= 1) gives i <= N: a "full" range of N + 1 elements
    b, = run_all("def f(float(N) A) -> (B) { B(i) = i >= 1 ? A(i-1) : A(i) }", a)
    np.testing.assert_array_equal(b, np.concatenate([a[:1], a]))


def test_padding_guards_still_pad():
    x, w = f32(2, 9), f32(3, 2, 3)
    y, = run_all("""def conv(float(C,H) X, float(M,C,K) W) -> (Y) {
        Y(m, h) +=! (h + k - 1 >= 0 && h + k - 1 < H) ? X(c, h + k - 1) * W(m, c, k) : 0.0 where h in 0:H
    }""", x, w)
    xp = np.pad(x, ((0, 0), (1, 1)))
    expected = sum(np.einsum("ch,mc->mh", xp[:, k:k + 9], w[:, :, k]) for k in range(3))
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-6)


# ---- TC's dimension specifier T.k ---------------------------------------------------------------------------

def test_dimension_specifiers_are_sizes():
    """``T.k`` (TC's grammar: the extent of dimension k of T) of a parameter, or of a tensor an earlier
    statement wrote (its inferred extent, whatever its origin)."""
    a = f32(3, 4)
    o = polyc.define("def f(float(M,N) A) -> (O) { O(i) = A(i, 0) * A.1 where i in 0:A.0 }")(a)
    np.testing.assert_allclose(o, a[:, 0] * 4, rtol=1e-6)
    o, p = polyc.define("def f(float(M,N) A) -> (O, P) {\n O(i, j) = A(i, j + 1)\n P(i) +=! O(i, j) + O.1 }")(a)
    np.testing.assert_array_equal(o, a)  # j in -1:N-1, stored from 0
    np.testing.assert_allclose(p, a.sum(1) + 4 * 4, rtol=1e-6)


@pytest.mark.parametrize("src, message", [
    ("def f(float(M,N) A) -> (O) { O(i) = A(i, 0) + O.0 }", "'O' has no extents yet"),
    ("def f(float(M,N) A) -> (O) { O(i) = A(i, 0) + A.2 }", "dimensions are A.0 to A.1"),
    ("def f(float(M,N) A.1) -> (O) { O(i) = A(i, 0) }", "cannot be used as an input name"),
    ("def f(float(M,N) A) -> (O) { O(i) = A.1(i) }", "takes no arguments"),
    ("def f(float(M,N) A) -> (O) { O(i) = B.0 + A(i, 0) }", "'B' is not a tensor"),
])
def test_dimension_specifier_errors(src, message):
    with pytest.raises(polyc.PolycError, match=message) as info:
        polyc.define(src)(f32(3, 4))
    assert "<source>:1:" in str(info.value)
