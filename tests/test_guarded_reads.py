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
