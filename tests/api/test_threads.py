"""Compiled kernels called from several Python threads at once (issue 16): first-call compilation racing,
different shapes and inputs per thread, parallel (thread-pool) kernels entered concurrently; every result
checked against numpy."""
import threading

import numpy as np
import pytest

import polyc
import polyc.kernel

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
"""


def race(n_threads, work):
    """Run ``work(i)`` in ``n_threads`` threads released together; re-raise the first failure."""
    barrier = threading.Barrier(n_threads)
    errors = []

    def body(i):
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # noqa: BLE001 - reported to the test below
            errors.append((i, exc))

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        i, exc = errors[0]
        raise AssertionError(f"thread {i} failed: {exc!r}") from exc


def test_one_kernel_from_eight_threads_with_racing_first_calls(monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")  # every shape goes through the pipeline
    compiles = []
    real = polyc.kernel.compile_kernel

    def counting(checked, sizes, *rest):
        compiles.append(tuple(sorted(sizes.items())))
        return real(checked, sizes, *rest)

    monkeypatch.setattr(polyc.kernel, "compile_kernel", counting)
    kernel = polyc.define(MATMUL, options=polyc.Options(threads=2))
    shapes = [(5, 3, 7), (5, 3, 7), (64, 48, 40), (64, 48, 40), (1, 1, 1), (13, 17, 11), (13, 17, 11), (96, 64, 80)]

    def work(i):
        m, k, n = shapes[i]
        rng = np.random.default_rng(i)
        for rep in range(5):
            a = rng.standard_normal((m, k)).astype(np.float32)
            b = rng.standard_normal((k, n)).astype(np.float32)
            np.testing.assert_allclose(kernel(a, b), a @ b, rtol=2e-4, atol=2e-4)

    race(8, work)
    # every shape compiled once: the second thread of a racing pair waited for the first one's result
    assert sorted(compiles) == sorted(set(compiles)) and len(compiles) == len(set(shapes))


@pytest.mark.parametrize("threads", [1, 2])
def test_one_compiled_from_six_threads(threads):
    compiled = polyc.define(MATMUL, options=polyc.Options(threads=threads)).specialize((128, 64), (64, 96))

    def work(i):
        rng = np.random.default_rng(100 + i)
        for rep in range(20):
            a = rng.standard_normal((128, 64)).astype(np.float32)
            b = rng.standard_normal((64, 96)).astype(np.float32)
            out = np.empty((128, 96), np.float32)
            assert compiled(a, b, out=out) is out
            np.testing.assert_allclose(out, a @ b, rtol=2e-4, atol=2e-4)

    race(6, work)


def test_different_kernels_compiled_concurrently():
    # isl and LLVM are shared by the process: concurrent compiles of distinct kernels must not interfere
    def work(i):
        k = polyc.define(f"def f{i}(float(N) A, float(N) B) -> (C) {{ C(i) = A(i) * {i + 1}.0 + B(N-1-i) }}")
        rng = np.random.default_rng(i)
        a, b = rng.standard_normal((2, 37 + i)).astype(np.float32)
        np.testing.assert_allclose(k(a, b), a * (i + 1) + b[::-1], rtol=1e-6, atol=1e-5)  # FMA rounding

    race(6, work)
