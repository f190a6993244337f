"""Parallel marks land only on loops that carry no dependence.

isl emits no loop for a band member with a single value (one tile), and a mark applies to the first loop
below it. A 1x1 convolution at 7x7 with 128 output channels has one tile in every output dimension, so the
first real loop is the reduction's tile loop: marking it parallel made two threads race on the output
(wrong results that depended on the output buffer's old contents)."""
import numpy as np
import pytest

import polyc
from polyc import Options

SOURCE = """
def conv_epilogue(float(1,1024,7,7) X, float(128,1024) W, float(128) B) -> (float(1,128,7,7) Y) {
    Y(n, m, h, w) +=! X(n, c, h, w) * W(m, c) where n in 0:1, m in 0:128, h in 0:7, w in 0:7, c in 0:1024
    Y(n, m, h, w) = max(Y(n, m, h, w) + B(m), 0.0) where n in 0:1, m in 0:128, h in 0:7, w in 0:7
}"""


def test_single_tile_outputs_do_not_parallelize_the_reduction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1024, 7, 7)).astype(np.float32)
    w = rng.standard_normal((128, 1024)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    expected = np.maximum(np.einsum("nchw,mc->nmhw", x, w) + b[None, :, None, None], 0)
    compiled = polyc.define(SOURCE, options=Options(threads=2)).specialize(x.shape, w.shape, b.shape)
    for _ in range(20):
        out = np.full(expected.shape, 1.0, np.float32)
        compiled(x, w, b, out=out)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_the_outermost_coincident_loop_with_several_tiles_is_parallel():
    compiled = polyc.define(SOURCE, options=Options(threads=2, tile_sizes=(8, 32, 256, 256))).specialize(
        (1, 1024, 7, 7), (128, 1024), (128,))
    ast = compiled.stage("ast")
    marked = ast.split("// parallel_c", 1)[1].split("\n", 1)[1].lstrip().splitlines()[0]
    assert marked.startswith("for (int c") and "+= 32" in marked  # the output-channel tile loop


def test_a_gemm_of_single_output_tiles_splits_one_for_the_threads():
    """A ViT's 50 x 768 x 192 GEMM is one tile of rows and one of columns over three reduction tiles: the
    strategy splits the columns (as many blocks as the rows, the weights' side) into one tile per thread,
    so the outermost loop is parallel and outside the reduction's tile loop; the result stays numpy's."""
    src = "def mm(float(50,768) A, float(768,192) B) -> (C) { C(m, n) +=! A(m, k) * B(k, n) }"
    compiled = polyc.define(src, options=Options(threads=2)).specialize((50, 768), (768, 192))
    ast = compiled.stage("ast")
    marked = ast.split("// parallel_c", 1)[1].split("\n", 1)[1].lstrip().splitlines()
    assert marked[0].startswith("for (int c") and "<= 191; " in marked[0] and "+= 96" in marked[0], ast[:300]
    assert "<= 767; " in marked[1]  # the reduction's tile loop, inside
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((50, 768)).astype(np.float32), rng.standard_normal((768, 192)).astype(np.float32)
    for _ in range(5):
        np.testing.assert_allclose(compiled(a, b), a @ b, rtol=1e-4, atol=1e-3)


def test_split_for_threads():
    from polyc.poly.tiling import split_for_threads, thread_balance
    # order [u, v, r]: one tile of 50 rows and of 192 columns, three reduction tiles
    order, coincident, extents = [0, 1, 2], [True, True, False], [50, 192, 768]
    assert split_for_threads(order, coincident, extents, [64, 256, 256], {0: 4, 1: 16}, 2) == [64, 96, 256]
    assert split_for_threads(order, coincident, extents, [64, 256, 256], {0: 4, 1: 16}, 3) == [64, 64, 256]
    # rows are the longer side in blocks of MR
    assert split_for_threads(order, coincident, [400, 32, 768], [512, 32, 256], {0: 4, 1: 16}, 2) == \
        [220, 32, 256]
    # an uneven parallel tile loop: 144 output channels as 128 + 16 become 80 + 64; 784 pixels in tiles of
    # 256 (two threads: 512 and 272 points) in tiles of 192 (384 and 400)
    assert split_for_threads(order, coincident, [144, 196, 48], [128, 256, 256], {0: 8, 1: 32}, 2) == \
        [80, 256, 256]
    assert split_for_threads(order, coincident, [96, 784, 24], [128, 256, 256], {0: 8, 1: 32}, 2) == \
        [128, 192, 256]
    assert thread_balance(784, 256, 2) == 392 / 512 and thread_balance(144, 72, 2) == 1.0
    # enough balanced parallel tiles already, a single tile in all (a point loop gets the mark), too few blocks
    assert split_for_threads(order, coincident, [128, 192, 768], [64, 256, 256], {0: 4, 1: 16}, 2) == \
        [64, 256, 256]
    assert split_for_threads(order, coincident, [50, 192, 200], [64, 256, 256], {0: 4, 1: 16}, 2) == \
        [64, 256, 256]
    assert split_for_threads(order, coincident, [3, 16, 768], [4, 16, 256], {0: 4, 1: 16}, 2) == [4, 16, 256]


# ---- the thread pool every parallel loop runs on (polyc.codegen.pool) ----

SCALE = """
def scale(float(N) X, float(M) W) -> (Y) {
    Y(i) +=! X(i) * W(j)
}"""


def _scale_case(n: int = 4096, m: int = 64, threads: int = 2):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    w = rng.standard_normal(m).astype(np.float32)
    compiled = polyc.define(SCALE, options=Options(threads=threads)).specialize(x.shape, w.shape)
    assert "parallel" in compiled.stage("ast")
    return compiled, x, w, x.astype(np.float64) * w.astype(np.float64).sum()


def _threads_of_this_process() -> int:
    import os

    return len(os.listdir("/proc/self/task"))


def test_parallel_calls_reuse_the_pool_workers():
    compiled, x, w, expected = _scale_case(threads=3)
    compiled(x, w)
    before = _threads_of_this_process()
    for _ in range(300):  # a thread per call would show up here (or exhaust the process)
        np.testing.assert_allclose(compiled(x, w), expected, rtol=1e-4, atol=1e-3)
    assert _threads_of_this_process() == before


def test_workers_that_fell_asleep_wake_for_the_next_call():
    import time

    compiled, x, w, expected = _scale_case()
    compiled(x, w)
    time.sleep(0.2)  # far beyond the spin budget: the workers wait in futex now
    for _ in range(3):
        np.testing.assert_allclose(compiled(x, w), expected, rtol=1e-4, atol=1e-3)
        time.sleep(0.05)


def test_concurrent_callers_from_python_threads_all_get_their_results():
    import concurrent.futures

    cases = [_scale_case(n=4096 + 17 * k) for k in range(4)]

    def work(k):
        compiled, x, w, expected = cases[k % len(cases)]
        out = compiled(x, w)
        return np.allclose(out, expected, rtol=1e-4, atol=1e-3)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:  # ctypes releases the GIL: callers overlap
        assert all(pool.map(work, range(400)))


def test_a_forked_child_runs_parallel_kernels_without_the_parents_workers():
    import multiprocessing

    compiled, x, w, expected = _scale_case()
    compiled(x, w)  # the parent's pool has its workers now; a forked child has none of them
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=lambda: results.put(compiled(x, w)))  # inherited by fork, not pickled
    child.start()
    try:
        out = results.get(timeout=60)  # a child waiting on the parent's workers would hang here
    finally:
        child.join(timeout=10)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)


def test_parallel_calls_finish_and_match_while_other_processes_hold_the_cores():
    # the worker is often descheduled here: the caller steals its chunk back instead of waiting for it
    import subprocess
    import sys
    import time

    compiled, x, w, expected = _scale_case()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        time.sleep(0.2)
        for k in range(200):
            np.testing.assert_allclose(compiled(x, w), expected, rtol=1e-4, atol=1e-3)
            if k % 50 == 0:
                time.sleep(0.01)  # let the worker fall asleep now and then
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _allowed_cpus_of_threads() -> list[set[int]]:
    import os

    found = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                line = next(line for line in f if line.startswith("Cpus_allowed_list:"))
        except (OSError, StopIteration):  # the thread ended meanwhile
            continue
        cpus = set()
        for part in line.split(":", 1)[1].strip().split(","):
            lo, _, hi = part.partition("-")
            cpus.update(range(int(lo), int(hi or lo) + 1))
        found.append(cpus)
    return found


def test_workers_are_kept_off_the_callers_cpu():
    import os

    compiled, x, w, expected = _scale_case()
    np.testing.assert_allclose(compiled(x, w), expected, rtol=1e-4, atol=1e-3)
    allowed = os.sched_getaffinity(0)
    narrowed = [cpus for cpus in _allowed_cpus_of_threads() if cpus < allowed]
    if len(allowed) >= 2:  # the worker may run anywhere but where its caller last ran
        assert any(len(cpus) == len(allowed) - 1 for cpus in narrowed), narrowed
    else:  # one CPU: nothing to move the worker to, so it keeps the process's set
        assert not narrowed


def test_thread_balance_is_the_busiest_chunk_in_closed_form():
    """thread_balance counts each chunk's points without listing the tiles (a loop of 2^31 points in
    tiles of 8 once took a minute to plan): equal to summing every tile of every chunk, on small loops."""
    import random

    from polyc.poly.tiling import thread_balance

    def by_tiles(extent, tile, threads):
        n = -(-extent // tile)
        chunks = min(n, threads)
        sizes = [min(tile, extent - i * tile) for i in range(n)]
        return extent / threads / max(sum(sizes[n * t // chunks:n * (t + 1) // chunks]) for t in range(chunks))

    rng = random.Random(0)
    for _ in range(3000):
        extent = rng.randint(1, 2000)
        tile, threads = rng.randint(1, extent + 3), rng.randint(1, 9)
        assert thread_balance(extent, tile, threads) == pytest.approx(by_tiles(extent, tile, threads), rel=1e-12)
    assert thread_balance(1 << 31, 8, 2) == 1.0
