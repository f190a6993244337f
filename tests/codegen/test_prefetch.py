"""Software prefetch of the next block of a packed constant (:mod:`polyc.codegen.prefetch`): where it goes, the
rule that keeps it, and results bit for bit those of the kernel without it (and numpy's)."""
from __future__ import annotations

import dataclasses

import islpy as isl
import numpy as np
import pytest
from targets import RUNNABLE_CPUS

import polyc
from polyc import Options
from polyc.codegen.prefetch import MAX_ROWS, next_block, pays
from polyc.codegen.region import Loop
from polyc.lang import ast as L
from polyc.target import host_target

POINTWISE = "def pw(float(C,H,W) X, float(C,M) Wt) -> (T) { T(h, w, m) +=! X(c, h, w) * Wt(c, m) }"


def _id(name: str) -> isl.AstExpr:
    return isl.AstExpr.from_id(isl.Id(name))


def _index(name: str) -> L.Ident:
    return L.Ident(name, dtype="int32", kind="index")


#: A 1x1 convolution's register tiles (the module doc of polyc.codegen.prefetch), outermost first: panels of
#: 32 output channels (c2), blocks of 128 input channels (c3), 7 register tiles of a row (c4), the reduction
#: step (c7), the tile's 7 unrolled rows (c8), its 32 vector columns (c9).
LOOPS = [Loop("c2", "sequential", 32, 64), Loop("c3", "sequential", 128, 8), Loop("c4", "sequential", 1, 7),
         Loop("c7", "sequential", 1, 128), Loop("c8", "unrolled", 1, 7), Loop("c9", "vector", 1, 32)]
ARGS = {"h": _id("c4"), "w": _id("c8"), "m": _id("c2").add(_id("c9")), "c": _id("c3").add(_id("c7"))}
#: the packed filter read W__p(m / 32, c, m % 32)
READ = L.Access("W__p", (L.Binary("/", _index("m"), L.Const(32)), _index("c"),
                         L.Binary("%", _index("m"), L.Const(32))))


def _with(name: str, **changes) -> list[Loop]:
    return [dataclasses.replace(loop, **changes) if loop.name == name else loop for loop in LOOPS]


def test_the_block_loop_is_the_first_loop_along_the_read_outside_the_row_loop():
    """c9 and c7 span the block (32 x 128 elements), c4's 7 register tiles of 7 rows (c8) re-read it, c3's next
    iteration reads the next block; the first copy of the unrolled rows prefetches, the others do not."""
    assert next_block(LOOPS, ARGS, READ) == (LOOPS[1], 7 * 7, 32 * 128, True)
    assert next_block(_with("c8", first=False), ARGS, READ)[3] is False
    assert next_block(_with("c4", trip=None), ARGS, READ)[1] is None  # rows unknown: pays() says no


def test_no_block_loop_where_the_loops_do_not_have_that_shape():
    """Nothing is prefetched without a row loop (a block read once streams), when the span of the block is not
    a constant, or when a vector loop does not move along the read. A parallel block loop is one: each thread
    runs a chunk of its consecutive iterations, so the next iteration is the thread's next block."""
    no_rows = [loop for loop in LOOPS if loop.name != "c4"]
    assert next_block(no_rows, ARGS, READ) is None
    assert next_block(_with("c3", kind="parallel"), ARGS, READ)[0].name == "c3"
    assert next_block(_with("c3", kind="parallel", step=None), ARGS, READ) is None  # no constant step
    assert next_block(_with("c7", trip=None), ARGS, READ) is None
    assert next_block(LOOPS, dict(ARGS, m=_id("c2")), READ) is None  # c9 vectorizes rows, not the read


def test_the_rule_wants_few_rows_and_two_blocks_in_l2():
    target = dataclasses.replace(host_target(), l2_bytes=1 << 20)
    assert pays(target, 7 * 7, 16 << 10) and pays(target, MAX_ROWS, 512 << 10)
    assert pays(target, 10 * 5, 16 << 10)  # 49 flattened pixels in 10 register tiles of 5 rows (AVX2)
    assert not pays(target, 39 * 5, 16 << 10)  # 196 pixels
    assert not pays(target, MAX_ROWS + 1, 16 << 10)
    assert not pays(target, None, 16 << 10)
    assert not pays(target, 7 * 7, (512 << 10) + 4)  # the next block would not fit beside this one


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("c,hw,m,threads", [(512, 7, 256, 1), (300, 5, 200, 1), (512, 7, 256, 2)])
def test_prefetching_kernels_give_the_same_bits(monkeypatch, cpu, c, hw, m, threads):
    """A pointwise convolution with its filter a packed constant (blocks of the reduction re-read by a row
    loop): forced on, the IR prefetches; the result is bit for bit that without prefetch and the default's,
    and numpy's within float32 rounding. 300 input channels end in a partial block (its prefetch points past
    the packed buffer), 200 output channels in a partial panel; on two threads the block loop is the
    parallel one (each chunk prefetches its next block; the last one's points past the chunk)."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((c, m)).astype(np.float32)
    results = {}
    for prefetch in (False, None, True):
        kernel = polyc.define(POINTWISE, options=Options(threads=threads, prefetch=prefetch))
        compiled = kernel.specialize_sizes(kernel.bind_sizes([x.shape, w.shape]), constants=frozenset({"Wt"}))
        assert compiled.tensors[1].packed
        calls = compiled.stage("llvm").count('call void @"llvm.prefetch.p0"')
        assert (calls > 0) == (prefetch is True) or prefetch is None
        results[prefetch] = compiled(x, w)
    np.testing.assert_array_equal(results[True], results[False])
    np.testing.assert_array_equal(results[None], results[False])
    want = np.einsum("chw,cm->hwm", x.astype(np.float64), w.astype(np.float64))
    np.testing.assert_allclose(results[True], want, rtol=1e-4, atol=1e-3)


RESIDUAL = ("def res(float(P,C) X, float(C,M) Wt, float(M) B) -> (Y) {\n"
            "    Y(p, m) += X(p, c) * Wt(c, m)\n"
            "    Y(p, m) = max(Y(p, m) + B(m), 0.0)\n}")


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("threads", [1, 2])
def test_an_accumulation_onto_its_output_prefetches_the_lines_it_starts_from(monkeypatch, cpu, threads):
    """A 1x1 convolution over flattened pixels that accumulates onto its output (a residual folded in: ``+=``
    without ``!``) prefetches for writing, from its epilogue, the output lines two register tiles ahead; the
    same convolution from zero (``+=!``) does not, nor does any kernel with ``prefetch=False``. Results are
    bit for bit those without the prefetch, and numpy's within float32 rounding (the last tiles' prefetches
    point past the output)."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((196, 64)).astype(np.float32)
    w = rng.standard_normal((64, 96)).astype(np.float32)
    bias = rng.standard_normal(96).astype(np.float32)
    shortcut = rng.standard_normal((196, 96)).astype(np.float32)
    results, writes = {}, {}
    for prefetch in (None, False):
        kernel = polyc.define(RESIDUAL, options=Options(threads=threads, prefetch=prefetch))
        compiled = kernel.specialize_sizes({"P": 196, "C": 64, "M": 96}, constants=frozenset({"Wt", "B"}))
        writes[prefetch] = compiled.stage("llvm").count("i32 1, i32 3, i32 1)")  # rw = write, locality = L1
        held = compiled.arguments(x, w, bias)
        held[3][...] = shortcut
        compiled.run_pointers([a.ctypes.data for a in held])
        results[prefetch] = held[3].copy()
    assert writes[None] > 0 and writes[False] == 0
    np.testing.assert_array_equal(results[None], results[False])
    want = np.maximum(shortcut + x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
    np.testing.assert_allclose(results[None], want, rtol=1e-4, atol=1e-3)
    fresh = polyc.define(RESIDUAL.replace("+= X", "+=! X"), options=Options(threads=threads))
    assert fresh.specialize_sizes({"P": 196, "C": 64, "M": 96}).stage("llvm").count("i32 1, i32 3, i32 1)") == 0
