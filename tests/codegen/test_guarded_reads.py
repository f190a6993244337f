"""A read under a ?: guard must never touch memory outside its tensor, in scalar and vector code.

The input is placed right after an inaccessible page (mmap + mprotect), so a read of element -1 — what
padding's ``X(i-1)`` at ``i = 0`` would be without the guard honoured — kills the process with SIGSEGV.
The kernel runs in a subprocess so that such a crash fails the test instead of the test run."""
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np, polyc
    from polyc import Options
    n = int(sys.argv[1]); spec = sys.argv[2]
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 2 * page + 4 * n, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base), page, 0) == 0        # the page before X: no access
    x = np.frombuffer(region, np.float32, count=n, offset=page)
    x[:] = np.arange(1, n + 1, dtype=np.float32)
    k = polyc.define('''
    def pad_left(float(N) X) -> (Y) {
        Y(i) = (i >= 1 && i <= N) ? X(i-1) : 0.0 where i in 0:N+1
    }''', options=Options.from_spec(spec))
    y = k(x)
    expected = np.concatenate([[0], np.arange(1, n + 1)]).astype(np.float32)
    assert np.array_equal(y, expected), (y, expected)
    libc.mprotect(ctypes.c_void_p(base), page, 3)
    print("ok")
""")


@pytest.mark.parametrize("spec", ["", "vectorize=0", "tile=0,register_tile=0", "scheduler=identity"])
@pytest.mark.parametrize("n", [5, 40])
def test_guarded_read_stays_inside_the_tensor(n, spec):
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(n), spec], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (result.returncode, result.stderr[-2000:])


STRIDED_SCRIPT = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np, polyc
    from polyc import Options
    n = int(sys.argv[1]); spec = sys.argv[2]
    page = mmap.PAGESIZE
    region = mmap.mmap(-1, 3 * page, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    libc = ctypes.CDLL(None)
    assert libc.mprotect(ctypes.c_void_p(base), page, 0) == 0                # no access before X
    assert libc.mprotect(ctypes.c_void_p(base + 2 * page), page, 0) == 0     # nor after it
    x = np.frombuffer(region, np.float32, count=n, offset=2 * page - 4 * n)  # X ends at the page's end
    x[:] = np.arange(1, n + 1, dtype=np.float32)
    k = polyc.define('''
    def pool_s2(float(N) X) -> (Y) {
        Y(i) = ((2*i-1 >= 0 && 2*i-1 < N) ? X(2*i-1) : 0.0) + ((2*i+1 < N) ? X(2*i+1) : 0.0)
            where i in 0:(N+2)/2
    }''', options=Options.from_spec(spec))
    y = k(x)
    padded = np.concatenate([[0], np.arange(1, n + 1), [0, 0, 0]]).astype(np.float32)
    i = np.arange((n + 2) // 2)
    expected = padded[2 * i] + padded[2 * i + 2]
    assert np.array_equal(y, expected), (y, expected)
    libc.mprotect(ctypes.c_void_p(base), page, 3)
    libc.mprotect(ctypes.c_void_p(base + 2 * page), page, 3)
    print("ok")
""")


@pytest.mark.parametrize("spec", ["", "vectorize=0"])
@pytest.mark.parametrize("n", [7, 64, 101])
def test_strided_guarded_read_stays_inside_the_tensor(n, spec):
    """Stride-2 reads under a guard (a masked load of the span the lanes cover) touch neither the element
    before the tensor nor any after it."""
    result = subprocess.run([sys.executable, "-c", STRIDED_SCRIPT, str(n), spec], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", (result.returncode, result.stderr[-2000:])


@pytest.mark.parametrize("spec", ["", "vectorize=0"])
def test_strided_guarded_convolution_matches_numpy(spec):
    """A stride-2 convolution with its padding as a ?: guard: masked loads of the span in vector code."""
    import numpy as np

    import polyc
    from polyc import Options

    k = polyc.define("""
def conv_s2_pad1(float(C,H,W) X, float(M,C,KH,KW) F) -> (Y) {
    Y(m,h,w) +=! ((2*h+kh-1 >= 0 && 2*h+kh-1 < H && 2*w+kw-1 >= 0 && 2*w+kw-1 < W) ?
                  X(c,2*h+kh-1,2*w+kw-1) : 0.0) * F(m,c,kh,kw)
        where h in 0:(H+1)/2, w in 0:(W+1)/2
}""", options=Options.from_spec(spec))
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1, (3, 37, 41)).astype(np.float32)
    f = rng.uniform(-1, 1, (5, 3, 3, 3)).astype(np.float32)
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(1, 2))[:, ::2, ::2]
    expected = np.einsum("chwij,mcij->mhw", windows, f)
    np.testing.assert_allclose(k(x, f), expected, rtol=1e-4, atol=1e-5)


PADDED_CONV = """
def conv_pad(float(N,C,H,W) X, float(M,C,KH,KW) F) -> (Y) {
    Y(n,m,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ? X(n,c,h+kh-1,w+kw-1) * F(m,c,kh,kw) : 0.0
        where h in 0:H-KH+3, w in 0:W-KW+3, kh in 0:KH, kw in 0:KW
}
"""


def test_only_reads_that_can_leave_their_tensor_are_masked():
    import numpy as np
    import polyc

    rng = np.random.default_rng(0)
    X = rng.standard_normal((1, 5, 9, 28)).astype(np.float32)
    F = rng.standard_normal((16, 5, 3, 3)).astype(np.float32)
    compiled = polyc.define(PADDED_CONV).specialize(X, F)
    stmt = next(s for s in compiled.stages.scop.statements if s.op == "+=")
    assert sorted(a.tensor for a in stmt.safe_reads) == ["F"]  # F stays in bounds for every (m, c, kh, kw)
    llvm = compiled.stage("llvm")
    assert "masked.load" in llvm  # X, the padded read, is still masked
    # the guarded update is one select around the accumulation (so LLVM can fuse the multiply-add)
    assert "select" in llvm
    padded = np.pad(X.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))
    expected = np.einsum("nchwij,mcij->nmhw", windows, F.astype(np.float64))
    np.testing.assert_allclose(compiled(X, F), expected, rtol=1e-4, atol=1e-4)


def test_guarded_update_keeps_nan_and_inf_where_the_guard_is_true_only():
    import numpy as np
    import polyc

    k = polyc.define("""
    def masked_sum(float(R,N) X) -> (S) {
        S(r) +=! (i >= 2) ? X(r,i) * 2.0 : 0.0 where i in 0:N
    }""")
    x = np.tile(np.array([np.nan, np.inf, 1.0, 2.0, 3.0] * 7, dtype=np.float32), (3, 1))
    x[1, 5:] = 1.0
    s = k(x)
    assert np.isnan(s[0])  # NaNs at i >= 2 count
    assert s[1] == np.float32(2.0 * (1 + 2 + 3) + 2.0 * 30)  # the NaN and inf at i < 2 never enter
