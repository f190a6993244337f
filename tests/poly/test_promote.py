"""Promotion (packing): the strategy's decision, the promoted Scop and schedule, and results against numpy.

The transformation sweep (``tests/poly/test_transform_sweep.py``, option set ``promote=1``) runs every library
kernel with packing forced wherever the access allows it; this file checks what is packed, when, and how.
"""
from __future__ import annotations

import numpy as np
import pytest

import polyc
from polyc import Options
from polyc.errors import KernelRuntimeError
from polyc.kernel import status_error
from targets import RUNNABLE_CPUS

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
BMM = "def bmm(float(NB,M,K) A, float(NB,K,N) B) -> (C) { C(b,m,n) +=! A(b,m,k) * B(b,k,n) }"


def _inputs(rng, *shapes, dtype=np.float32):
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def test_forced_packing_copies_b_into_panels_and_matches_numpy():
    rng = np.random.default_rng(1)
    A, B = _inputs(rng, (37, 67), (67, 41))
    compiled = polyc.define(MATMUL, options=Options(promote=True)).specialize(A, B)
    ast = compiled.stage("ast")
    assert "P0(" in ast  # the copy statement runs before the GEMM
    assert ast.index("P0(") < ast.index("S1(")
    scop = compiled.stages.scop
    local = scop.tensor("B__p0")
    nr = local.shape[-1]
    assert local.role == "local" and local.shape == (-(-41 // nr), 67, nr)
    # the packed buffer is not a kernel argument
    assert [t.name for t in compiled.tensors] == ["A", "B", "C"]
    # the GEMM statement now reads the panel, not B
    reads = str(next(s for s in scop.statements if s.name == "S1").reads)
    assert "B__p0[" in reads and "B[" not in reads
    np.testing.assert_allclose(compiled(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
def test_strategy_packs_long_rows_only(cpu, monkeypatch):
    """B is packed where a step of the reduction jumps a page or a multiple of 2 KiB; with AVX2, whose
    register tile reads one cache line of B a step (NR = 16 float32), also from 512 bytes on when at least 16
    register-tile rows reuse each panel (``packing.PACK_MIN_STEP_BYTES``); 256-byte rows never."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    one_line = cpu == "znver3"
    rng = np.random.default_rng(2)
    small = polyc.define(MATMUL).specialize(*_inputs(rng, (64, 64), (64, 64)))
    assert "P0(" not in small.stage("ast")  # 256-byte rows: nothing to gain
    A, B = _inputs(rng, (256, 96), (96, 1024))  # 4 KiB rows of B
    big = polyc.define(MATMUL).specialize(A, B)
    assert "P0(" in big.stage("ast")
    np.testing.assert_allclose(big(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
    off = polyc.define(MATMUL, options=Options(promote=False)).specialize(A, B)
    assert "P0(" not in off.stage("ast")
    # rows of 2 KiB fold B's panel onto two L1 sets: packed; 1.5 and 2.03 KiB only where a step reads one
    # line of B and 96 rows (16 tiles of 6 with AVX2) reuse each panel; 48 rows (8 tiles) do not pay a copy
    for m, n, packed in ((96, 512, True), (96, 384, one_line), (96, 520, one_line), (48, 384, False)):
        A, B = _inputs(rng, (m, 64), (64, n))
        k = polyc.define(MATMUL).specialize(A, B)
        assert ("P0(" in k.stage("ast")) == packed, (m, n)
        np.testing.assert_allclose(k(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-3)
        if packed:  # the same result as the kernel without the copy
            np.testing.assert_allclose(k(A, B), polyc.define(MATMUL, options=Options(promote=False))(A, B),
                                       rtol=1e-6, atol=1e-5)
    assert "P0(" not in polyc.define(MATMUL, options=Options.naive()).specialize(A, B).stage("ast")


def test_batched_packing_puts_the_panel_index_first():
    rng = np.random.default_rng(3)
    A, B = _inputs(rng, (3, 19, 23), (3, 23, 45))
    compiled = polyc.define(BMM, options=Options(promote=True)).specialize(A, B)
    local = compiled.stages.scop.tensor("B__p0")
    nr = local.shape[-1]
    assert local.shape == (-(-45 // nr), 3, 23, nr)
    np.testing.assert_allclose(compiled(A, B), np.matmul(A.astype(np.float64), B), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_packing_other_dtypes(dtype):
    rng = np.random.default_rng(4)
    src = MATMUL.replace("float", "double" if dtype == np.float64 else "int32")
    if dtype == np.int32:
        A, B = rng.integers(-9, 9, (29, 31)).astype(dtype), rng.integers(-9, 9, (31, 53)).astype(dtype)
    else:
        A, B = _inputs(rng, (29, 31), (31, 53), dtype=dtype)
    compiled = polyc.define(src, options=Options(promote=True)).specialize(A, B)
    assert "P0(" in compiled.stage("ast")
    expected = A @ B
    np.testing.assert_allclose(compiled(A, B), expected, rtol=1e-10 if dtype == np.float64 else 0)


def test_parallel_packing_marks_the_copy_parallel_and_matches_one_thread():
    rng = np.random.default_rng(5)
    A, B = _inputs(rng, (131, 67), (67, 197))
    two = polyc.define(MATMUL, options=Options(promote=True, threads=2)).specialize(A, B)
    one = polyc.define(MATMUL, options=Options(promote=True, threads=1)).specialize(A, B)
    ast = two.stage("ast")
    first_loop = ast[:ast.index("P0(")]
    assert "parallel" in first_loop  # the copy's panel loop runs on both threads
    np.testing.assert_array_equal(two(A, B), one(A, B))


def test_tile_size_that_splits_panels_disables_packing():
    rng = np.random.default_rng(6)
    A, B = _inputs(rng, (37, 67), (67, 41))
    # the vector member's cache tile (8) is not a multiple of the panel width: packing would straddle panels
    compiled = polyc.define(MATMUL, options=Options(promote=True, tile_sizes=(8, 8, 8))).specialize(A, B)
    assert "P0(" not in compiled.stage("ast")
    np.testing.assert_allclose(compiled(A, B), A.astype(np.float64) @ B, rtol=1e-4, atol=1e-4)


def test_promote_option_round_trips_through_its_spec():
    for value in (None, True, False):
        o = Options(promote=value)
        assert Options.from_spec(o.to_spec()) == o
    assert Options.from_spec("promote=0").promote is False
    assert Options.from_spec("promote=auto").promote is None


def test_status_two_is_reported_as_out_of_memory():
    err = status_error("kernel 'mm'", 2)
    assert isinstance(err, KernelRuntimeError) and "out of memory" in str(err) and "promote=False" in str(err)
    assert "out of range" in str(status_error("kernel 'mm'", 1))


def test_a_constant_input_read_once_arrives_packed_else_it_is_copied():
    """The pipeline's lower with ``constants``: the packed read of B indexes B itself in panel-major layout (no copy
    statement, no local buffer); a second read of B keeps the per-call copy."""
    from polyc.pipeline import lower
    from polyc.poly.promote import packed_array

    once = polyc.define(MATMUL, options=Options(promote=True))
    sizes = {"M": 9, "K": 11, "N": 45}
    scop = lower(once.checked, sizes, once.options, once.target, frozenset({"B"})).scop
    b = scop.tensor("B")
    assert b.role == "input" and b.packed and b.shape == (-(-45 // b.packed), 11, b.packed)
    assert all(t.role != "local" for t in scop.tensors) and len(scop.statements) == 2  # init + update
    twice = polyc.define("def mm2(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) + B(0,n) }",
                         options=Options(promote=True))
    scop2 = lower(twice.checked, sizes, twice.options, twice.target, frozenset({"B"})).scop
    assert not scop2.tensor("B").packed and scop2.tensor("B__p0").role == "local"
    # the layout the caller builds: [v // nr, k, v % nr], the last panel's tail zero
    B = np.arange(11 * 45, dtype=np.float32).reshape(11, 45)
    P = packed_array(B, 8)
    assert P.shape == (6, 11, 8) and P.flags.c_contiguous
    k, v = np.meshgrid(np.arange(11), np.arange(45), indexing="ij")
    np.testing.assert_array_equal(P[v // 8, k, v % 8], B)
    assert not P[5, :, 5:].any()


def test_a_kernel_compiled_for_constant_inputs_packs_them_when_called():
    """specialize_sizes(constants=...): the argument spec says which input arrives packed; calling the
    Compiled with plain arrays packs it, so the result is the plain kernel's."""
    rng = np.random.default_rng(6)
    A, B = _inputs(rng, (33, 70), (70, 1030))
    kernel = polyc.define(MATMUL)
    plain = kernel.specialize(A, B)
    packed = kernel.specialize_sizes(kernel.bind_sizes([A.shape, B.shape]), constants=frozenset({"B"}))
    assert [t.packed for t in plain.tensors] == [0, 0, 0]
    assert packed.tensors[1].packed and packed.tensors[1].shape == (70, 1030)  # the shape the caller has
    assert packed.constants == {"B"} and "P0(" not in packed.stage("ast")
    np.testing.assert_array_equal(packed(A, B), plain(A, B))


def test_a_read_with_literal_indices_is_packed():
    """A 1x1 convolution channels-last reads its weights as ``W(c, 0, 0, m)``: the literal window coordinates
    do not keep the read from being packed (constant: it arrives packed; otherwise forced: copied), and the
    result is numpy's."""
    src = ("def pw(float(C,H,W) X, float(C,1,1,M) Wt) -> (T) { T(h, w, m) +=! X(c, h, w) * Wt(c, 0, 0, m) }")
    rng = np.random.default_rng(7)
    X, Wt = _inputs(rng, (96, 7, 7), (96, 1, 1, 200))
    want = np.einsum("chw,cm->hwm", X.astype(np.float64), Wt[:, 0, 0].astype(np.float64))
    kernel = polyc.define(src)
    packed = kernel.specialize_sizes(kernel.bind_sizes([X.shape, Wt.shape]), constants=frozenset({"Wt"}))
    assert packed.tensors[1].packed and "P0(" not in packed.stage("ast")
    np.testing.assert_allclose(packed(X, Wt), want, rtol=1e-4, atol=1e-4)
    copied = polyc.define(src, options=Options(promote=True)).specialize(X, Wt)
    assert "P0(" in copied.stage("ast") and "Wt__p0[" in str(copied.stages.scop.statements[-1].reads)
    np.testing.assert_allclose(copied(X, Wt), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
def test_a_computed_broadcast_operand_is_copied_in_row_slivers_when_its_steps_jump_lines(cpu, monkeypatch):
    """The flattened channels-last 1x1 convolution ``Y(p, m) +=! X(c, p) * W(c, m)`` broadcasts MR adjacent
    pixels of ``X`` a step, each step a row of ``X`` further: with 49 pixels (196 bytes) and 512 output
    channels (16 or more register tiles of columns) the kernel copies ``X`` per call into slivers
    ``X__p(p / MR, c, p % MR)`` (``packing.PACK_ROW_MIN_STEP_BYTES``); with 12 pixels (48 bytes, inside a line)
    or 64 output channels (too few columns to pay the copy) it reads ``X`` in place. Results: numpy's, and the
    unpacked kernel's bit for bit (the same summation order), on 1 and 2 threads."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    src = "def pw(float(C,P) X, float(C,M) W) -> (Y) { Y(p, m) +=! X(c, p) * W(c, m) }"
    rng = np.random.default_rng(12)
    for c, p, m, copied in ((256, 49, 512, True), (256, 12, 512, False), (256, 49, 64, False)):
        x, w = _inputs(rng, (c, p), (c, m))
        want = x.T.astype(np.float64) @ w.astype(np.float64)
        for threads in (1, 2):
            kernel = polyc.define(src, options=Options(threads=threads)).specialize(x, w)
            scop = kernel.stages.scop
            slivers = [t for t in scop.tensors if t.name.startswith("X__p")]
            assert bool(slivers) == copied, (c, p, m)
            if copied:
                mr = slivers[0].shape[-1]
                assert slivers[0].role == "local" and slivers[0].shape == (-(-p // mr), c, mr) and mr > 1
                reads = " ".join(str(s.reads) for s in scop.statements if not s.name.startswith("P"))
                assert "X__p" in reads and "X[" not in reads
            got = kernel(x, w)
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
            plain = polyc.define(src, options=Options(threads=threads, promote=False)).specialize(x, w)
            np.testing.assert_array_equal(got, plain(x, w))


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
def test_a_constant_broadcast_operand_arrives_packed_in_row_slivers(cpu, monkeypatch, tmp_path):
    """The register tile's broadcast operand, when constant (an NCHW 1x1 convolution's weights ``W(m, c)``)
    and its rows a whole number of pages apart (1024 float32), arrives packed in slivers of the tile's MR
    rows, ``W__p(m / MR, c, m % MR)``: no copy in the kernel, the caller's layout is packed_array's full
    order (the last slivers' tail zero), and the result is the unpacked kernel's, bit for bit (same
    summation order), and numpy's; on 1 and 2 threads, compiled and loaded from the disk cache. Rows 70
    elements apart stay as they are."""
    from polyc.poly.promote import packed_array

    monkeypatch.setenv("POLYC_CPU", cpu)
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    src = "def pw(float(M,C) Wt, float(C,P) X) -> (Y) { Y(m, p) +=! Wt(m, c) * X(c, p) }"
    rng = np.random.default_rng(11)
    w, x = _inputs(rng, (37, 1024), (1024, 50))
    want = w.astype(np.float64) @ x.astype(np.float64)
    sizes = {"M": 37, "C": 1024, "P": 50}
    short = polyc.define(src).specialize_sizes({"M": 37, "C": 70, "P": 50}, constants=frozenset({"Wt"}))
    assert not short.inputs[0].packed
    for threads in (1, 2):
        for attempt in range(2):  # compiled, then loaded from the disk cache by a new Kernel
            kernel = polyc.define(src, options=Options(threads=threads))
            plain = kernel.specialize_sizes(sizes)
            packed = kernel.specialize_sizes(sizes, constants=frozenset({"Wt"}))
            spec = packed.inputs[0]
            assert not plain.inputs[0].packed and spec.packed > 1 and spec.packed_order == (1, 0)
            assert "P0(" not in packed.stage("ast") and not packed.inputs[1].packed
            w_packed = packed_array(w, spec.packed, spec.packed_order)
            assert w_packed.shape == (-(-37 // spec.packed), 1024, spec.packed) and w_packed.flags.c_contiguous
            m, c = np.meshgrid(np.arange(37), np.arange(1024), indexing="ij")
            np.testing.assert_array_equal(w_packed[m // spec.packed, c, m % spec.packed], w)
            assert not w_packed[-1, :, 37 % spec.packed or spec.packed:].any()
            outs = []
            for compiled, weights in ((plain, w), (packed, w_packed)):
                out = np.zeros((37, 50), np.float32)
                compiled.run_pointers([weights.ctypes.data, x.ctypes.data, out.ctypes.data])
                outs.append(out)
            np.testing.assert_array_equal(outs[1], outs[0])
            np.testing.assert_allclose(outs[1], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
            np.testing.assert_array_equal(packed(w, x), outs[0])  # called with plain arrays: packs them
