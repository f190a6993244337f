"""The user-facing API: define / call / specialize / out= / einsum / caches / argument errors."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import polyc
from polyc.errors import KernelRuntimeError, PolycError, ShapeError
from polyc.runtime import cache

MATMUL = """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
"""
TWO = MATMUL + """
def scale(float(N) X, float alpha) -> (Y) {
    Y(i) = alpha * X(i)
}
"""


def rand(*shape, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def test_matmul_matches_numpy_and_is_cached_in_memory():
    k = polyc.define(MATMUL)
    a, b = rand(7, 5), rand(5, 3, seed=1)
    np.testing.assert_allclose(k(a, b), a @ b, rtol=1e-5, atol=1e-6)
    assert k.specialize(a, b) is k.specialize((7, 5), (5, 3))


def test_name_picks_a_def_and_errors_list_the_names():
    with pytest.raises(PolycError, match="matmul, scale"):
        polyc.define(TWO)
    with pytest.raises(PolycError, match="no def named 'nope'.*matmul, scale"):
        polyc.define(TWO, "nope")
    scale = polyc.define(TWO, "scale")
    x = rand(11)
    np.testing.assert_allclose(scale(x, 2.5), 2.5 * x, rtol=1e-6)
    np.testing.assert_allclose(scale(x, np.float32(-1)), -x, rtol=1e-6)


def test_inconsistent_sizes_name_both_tensors_and_the_size():
    k = polyc.define(MATMUL)
    with pytest.raises(ShapeError, match=r"size 'K' is 4 in 'A' \(dimension 1\) but 5 in 'B' \(dimension 0\)"):
        k(rand(3, 4), rand(5, 6))


def test_argument_count_rank_and_dtype_errors():
    k = polyc.define(MATMUL)
    with pytest.raises(ShapeError, match="takes 2 arguments"):
        k(rand(3, 4))
    with pytest.raises(ShapeError, match="'B': expected 2 dimensions"):
        k(rand(3, 4), rand(4))
    with pytest.raises(ShapeError, match="'A': expected dtype float32, got float64"):
        k(rand(3, 4, dtype=np.float64), rand(4, 2))


def test_out_is_filled_in_place_and_checked():
    k = polyc.define(MATMUL)
    a, b = rand(4, 3), rand(3, 2)
    out = np.full((4, 2), 7, np.float32)
    result = k(a, b, out=out)
    assert result is out
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    with pytest.raises(ShapeError, match="out= for output 'C': expected float32\\[4, 2\\]"):
        k(a, b, out=np.zeros((2, 4), np.float32))


def test_non_contiguous_inputs_are_copied():
    k = polyc.define(MATMUL)
    a, b, c = rand(4, 6), rand(3, 4), rand(8, 4)
    assert not a.T.flags.c_contiguous
    np.testing.assert_allclose(k(a.T, b.T), a.T @ b.T, rtol=1e-5)
    np.testing.assert_allclose(k(c[::2], b.T), c[::2] @ b.T, rtol=1e-5)


def test_several_outputs_come_back_as_a_tuple_in_order():
    k = polyc.define("""
def two(float(N) X) -> (S, P) {
    P(i) = X(i) * 2.0
    S(i) = X(i) + 1.0
}""")
    x = rand(5)
    s, p = k(x)
    np.testing.assert_allclose(s, x + 1, rtol=1e-6)
    np.testing.assert_allclose(p, 2 * x, rtol=1e-6)


def test_gather_out_of_range_raises_instead_of_crashing():
    k = polyc.define("""
def gather(float(N) A, int32(M) I) -> (B) {
    B(i) = A(I(i))
}""")
    a = rand(5)
    np.testing.assert_allclose(k(a, np.array([4, 0, 2], np.int32)), a[[4, 0, 2]])
    with pytest.raises(KernelRuntimeError, match="out of range"):
        k(a, np.array([1, 5], np.int32))
    with pytest.raises(KernelRuntimeError):
        k(a, np.array([-1], np.int32))


def test_every_stage_prints():
    compiled = polyc.define(MATMUL).specialize((8, 4), (4, 6))
    assert "S1[m, n, k]" in compiled.stage("domain")
    assert "RAW" in compiled.stage("deps")
    assert "schedule" in compiled.stage("schedule")
    assert "for (" in compiled.stage("ast")
    assert "define" in compiled.stage("llvm")
    with pytest.raises(PolycError, match="unknown stage"):
        compiled.stage("nope")


def test_disk_cache_skips_compilation_in_a_second_process_and_survives_corruption(tmp_path):
    script = textwrap.dedent(f"""
        import numpy as np, polyc
        from polyc import debug
        k = polyc.define({MATMUL!r})
        a = np.ones((3, 2), np.float32); b = np.ones((2, 4), np.float32)
        c = k.specialize(a, b)
        print("FROM_DISK" if c._stages is None else "COMPILED", float(k(a, b).sum()))
    """)
    env = {"POLYC_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = lambda: subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                                 check=True).stdout.split()
    assert run() == ["COMPILED", "24.0"]
    assert run() == ["FROM_DISK", "24.0"]
    for entry in tmp_path.glob("*.polyc"):
        data = entry.read_bytes()
        entry.write_bytes(data[:-10] + b"0123456789")  # corrupt the payload: the checksum no longer matches
    assert run() == ["COMPILED", "24.0"]
    assert run() == ["FROM_DISK", "24.0"]


def test_cache_rejects_garbage(tmp_path, monkeypatch):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    key = cache.make_key("x")
    (tmp_path / f"{key}.polyc").write_bytes(b"not a cache entry")
    assert cache.load(key) is None
    assert not (tmp_path / f"{key}.polyc").exists()
    cache.store(key, {"a": 1})
    assert cache.load(key) == {"a": 1}


@pytest.mark.parametrize("spec,shapes", [
    ("ik,kj->ij", [(3, 4), (4, 5)]),
    ("ij->ji", [(3, 7)]),
    ("ij->", [(3, 7)]),
    ("i,i->", [(13,), (13,)]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("ii->i", [(5, 5)]),
    ("ij,j->i", [(6, 5), (5,)]),
    ("ik,kj", [(3, 4), (4, 5)]),
])
def test_einsum_matches_numpy(spec, shapes):
    ops = [rand(*s, seed=k) for k, s in enumerate(shapes)]
    np.testing.assert_allclose(polyc.einsum(spec, *ops), np.einsum(spec, *ops), rtol=1e-5, atol=1e-5)


def test_a_def_named_like_a_libm_function_does_not_call_itself():
    k = polyc.define("def pow(double(3) A, double(3) B) -> (C) { C(i) = pow(A(i), B(i)) }")
    a, b = np.array([2.0, 3.0, 4.0]), np.array([3.0, 2.0, 0.5])
    np.testing.assert_allclose(k(a, b), a ** b)


def test_thread_count_comes_from_the_environment_when_the_options_leave_it_open(monkeypatch):
    monkeypatch.setenv("POLYC_NUM_THREADS", "3")
    assert polyc.define(MATMUL).options.threads == 3
    assert polyc.define(MATMUL, options=polyc.Options(threads=1)).options.threads == 1
    monkeypatch.delenv("POLYC_NUM_THREADS")
    assert polyc.define(MATMUL).options.threads is None
