"""Affine guards of a reduction update become its iteration domain (``polyc.poly.build.guard_into_domain``).

``Y += cond ? e : identity`` changes nothing where ``cond`` fails, so the update runs only where it holds: the
conditions that do not involve the write's stride-1 index move into the domain, the others stay a ``?:``.
Each case checks the domain (against a count made here from the text), what is left of the right-hand side,
and the results against numpy and against the same def compiled with every transform off.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import Options
from polyc.lang import ast as L
from polyc.lang import check_def, parse
from polyc.lang.printer import format_expr
from polyc.poly.build import build_scop


def scop_of(src: str, **sizes):
    return build_scop(check_def(parse(src).defs[0], src), sizes)


def points(statement) -> int:
    return int(statement.domain.count_val().to_python())


def run_both(src: str, *inputs):
    """The def compiled with the default options and with :meth:`Options.naive`, called on ``inputs`` (the two
    may sum in different orders: compared within float32 rounding)."""
    fast = polyc.define(src)(*inputs)
    naive = polyc.define(src, options=Options.naive())(*inputs)
    return np.asarray(fast), np.asarray(naive)


PADDED_CONV = """
def conv(float(N,C,H,W) X, float(M,C,3,3) F) -> (Y) {
    Y(n,m,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ? X(n,c,h+kh-1,w+kw-1) * F(m,c,kh,kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
}
"""


def conv_reference(x, f):
    n, c, h, w = x.shape
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    out = np.zeros((n, f.shape[0], h, w))
    for kh in range(3):
        for kw in range(3):
            out += np.einsum("nchw,mc->nmhw", padded[:, :, kh:kh + h, kw:kw + w], f[:, :, kh, kw])
    return out


def test_row_conditions_of_a_padded_convolution_become_its_domain():
    N, C, H, W, M = 1, 2, 7, 5, 3
    scop = scop_of(PADDED_CONV, N=N, C=C, H=H, W=W, M=M)
    init, update = scop.statements
    assert points(init) == N * M * H * W
    rows = sum(1 for h in range(H) for kh in range(3) if 1 <= h + kh <= H)
    assert points(update) == N * M * C * rows * W * 3
    # the conditions on w (the write's stride-1 index) stay a guard; those on h are gone from it
    assert isinstance(update.rhs, L.Select)
    guard = format_expr(update.rhs.cond)
    assert "w" in guard and "h" not in guard.replace("w", "")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N, C, H, W), dtype=np.float32)
    f = rng.standard_normal((M, C, 3, 3), dtype=np.float32)
    fast, naive = run_both(PADDED_CONV, x, f)
    np.testing.assert_allclose(fast, conv_reference(x, f), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, naive, rtol=1e-6, atol=1e-6)


DEPTHWISE_ROWS = """
def dw(float(C,H,W) X, float(C,5) F) -> (Y) {
    Y(c,w,h) +=! (h+k >= 2 && h+k < H+2) ? X(c,h+k-2,w) * F(c,k) : 0.0
        where h in 0:H, w in 0:W, k in 0:5
}
"""


def test_a_guard_that_moves_entirely_leaves_no_select():
    """The guard is on h alone: with the write ``Y(c,w,h)`` h is the stride-1 index and the guard stays; with
    ``Y(c,h,w)`` the whole guard moves and the right-hand side is the plain product."""
    C, H, W = 3, 11, 4
    scop = scop_of(DEPTHWISE_ROWS, C=C, H=H, W=W)
    assert isinstance(scop.statements[1].rhs, L.Select)  # Y(c,w,h): h is the stride-1 index
    moved = DEPTHWISE_ROWS.replace("Y(c,w,h)", "Y(c,h,w)")
    scop = scop_of(moved, C=C, H=H, W=W)
    update = scop.statements[1]
    assert isinstance(update.rhs, L.Binary) and update.rhs.op == "*"
    assert points(update) == C * W * sum(1 for h in range(H) for k in range(5) if 0 <= h + k - 2 < H)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((C, H, W), dtype=np.float32)
    f = rng.standard_normal((C, 5), dtype=np.float32)
    expected = np.zeros((C, H, W))
    padded = np.pad(x.astype(np.float64), ((0, 0), (2, 2), (0, 0)))
    for k in range(5):
        expected += padded[:, k:k + H, :] * f[:, k, None, None]
    for src in (DEPTHWISE_ROWS, moved):
        fast, naive = run_both(src, x, f)
        got = fast if src is moved else fast.transpose(0, 2, 1)
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast, naive, rtol=1e-6, atol=1e-6)


def strided_window(oh: int) -> str:
    return f"""
def pool(float(C,H,W) X) -> (Y) {{
    Y(c,h,w) +=! (2*h+kh >= 1 && 2*h+kh <= H) ? X(c,2*h+kh-1,w) : 0.0
        where h in 0:{oh}, w in 0:W, kh in 0:3
}}
"""


@pytest.mark.parametrize("H", [1, 2, 7, 8])
def test_strided_window_sum(H):
    """A stride-2 window with padding 1 (a sum pool): the rows outside the image are never visited."""
    C, W, OH = 2, 9, (H + 1) // 2
    src = strided_window(OH)
    scop = scop_of(src, C=C, H=H, W=W)
    update = scop.statements[1]
    assert not isinstance(update.rhs, L.Select)
    rows = sum(1 for h in range(OH) for kh in range(3) if 1 <= 2 * h + kh <= H)
    assert points(update) == C * W * rows
    x = np.random.default_rng(H).standard_normal((C, H, W), dtype=np.float32)
    padded = np.pad(x.astype(np.float64), ((0, 0), (1, 2), (0, 0)))
    expected = np.stack([padded[:, 2 * h:2 * h + 3, :].sum(axis=1) for h in range(OH)], axis=1)
    fast, naive = run_both(src, x)
    np.testing.assert_allclose(fast, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, naive, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("src,why", [
    # the other branch is not the identity of += : the instances outside add 1.0
    ("def f(float(N) A) -> (B) { B(i) +=! (i+k >= 1 && i+k <= N) ? A(i+k-1) : 1.0 where i in 0:N, k in 0:3 }",
     "not identity"),
    # a data-dependent condition is not affine
    ("def f(float(N) A) -> (B) { B(i) +=! (A(i+k) > 0.0) ? A(i+k) : 0.0 where i in 0:N-2, k in 0:3 }", "data"),
    # a plain assignment writes the 0.0: its instances cannot go
    ("def f(float(N) A) -> (B) { B(i) = (i >= 1) ? A(i-1) : 0.0 }", "assignment"),
])
def test_guards_that_must_stay(src, why):
    N = 6
    scop = scop_of(src, N=N)
    last = scop.statements[-1]
    assert isinstance(last.rhs, L.Select), why
    assert points(last) == int(np.prod([hi - lo for (s, _), (lo, hi) in scop.ranges.items() if s == last.name]))


def test_negated_guard_with_the_identity_first():
    src = """def f(float(N) A) -> (B) {
        B(i) +=! (i+k < 1 || i+k > N) ? 0.0 : A(i+k-1) where i in 0:N, k in 0:3
    }"""
    N = 8
    scop = scop_of(src, N=N)
    update = scop.statements[1]
    # a 1-D write: i is its stride-1 index, so the guard (on i+k) stays; with the write 2-D it moves
    assert isinstance(update.rhs, L.Select)
    two_d = src.replace("float(N) A", "float(N) A, float(M) Z").replace("B(i) +=!", "B(i, j) +=!") \
        .replace("A(i+k-1)", "A(i+k-1) * Z(j)").replace("k in 0:3", "k in 0:3, j in 0:M")
    scop = scop_of(two_d, N=N, M=4)
    update = scop.statements[1]
    assert not isinstance(update.rhs, L.Select)
    assert points(update) == 4 * sum(1 for i in range(N) for k in range(3) if 1 <= i + k <= N)
    a = np.random.default_rng(2).standard_normal(N, dtype=np.float32)
    z = np.random.default_rng(3).standard_normal(4, dtype=np.float32)
    padded = np.pad(a.astype(np.float64), 1)
    expected = np.stack([padded[i:i + 3].sum() for i in range(N)])[:, None] * z[None, :]
    fast, naive = run_both(two_d, a, z)
    np.testing.assert_allclose(fast, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fast, naive, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("src,reference", [
    # a product whose guard's other branch is 1.0, the identity of *=
    ("def f(float(N,M) A) -> (P) { P(j, i) *=! (i+k >= 1 && i+k <= N) ? A(i+k-1, j) : 1.0 "
     "where i in 0:N, j in 0:M, k in 0:3 }",
     lambda a: np.stack([np.prod(np.pad(a.astype(np.float64), ((1, 1), (0, 0)), constant_values=1.0)[i:i + 3], axis=0)
                         for i in range(a.shape[0])], axis=1)),
    # an int32 max whose other branch is the int32 minimum, the identity of max=
    ("def f(int32(N,M) A) -> (P) { P(j, i) max=! (i+k >= 1 && i+k <= N) ? A(i+k-1, j) : -2147483648 "
     "where i in 0:N, j in 0:M, k in 0:3 }",
     lambda a: np.stack([np.pad(a, ((1, 1), (0, 0)), constant_values=np.iinfo(np.int32).min)[i:i + 3].max(axis=0)
                         for i in range(a.shape[0])], axis=1)),
])
def test_the_identity_of_each_reduction(src, reference):
    """``1.0`` for ``*=`` and the int32 minimum for ``max=`` are identities too: with the write ``P(i, j)`` (j the
    stride-1 index) the guard on i+k moves and the update visits only the rows inside A; with ``P(j, i)`` it stays
    a guard. Both forms against numpy and against the naive compile."""
    N, M = 9, 4
    moved = src.replace("P(j, i)", "P(i, j)")
    update = scop_of(moved, N=N, M=M).statements[1]
    assert not isinstance(update.rhs, L.Select)
    assert points(update) == M * sum(1 for i in range(N) for k in range(3) if 1 <= i + k <= N)
    rng = np.random.default_rng(5)
    if "int32" in src:
        a = rng.integers(-1000, 1000, (N, M)).astype(np.int32)
    else:
        a = rng.uniform(0.5, 1.5, (N, M)).astype(np.float32)
    expected = reference(a)
    for text, transpose in ((src, False), (moved, True)):
        fast, naive = run_both(text, a)
        got = fast.T if transpose else fast
        np.testing.assert_allclose(got, expected, rtol=1e-5)
        np.testing.assert_allclose(fast, naive, rtol=1e-6)
