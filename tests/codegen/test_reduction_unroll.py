"""The loop around a register tile is unrolled by LLVM (``Options.reduction_unroll``,
:data:`polyc.codegen.llvm.REDUCTION_UNROLL`): the loop carries an ``llvm.loop.unroll.count`` loop ID, the
machine code holds the tile's FMAs that many times, and the results are those of the loop left rolled
(unrolling keeps the order of every sum; LLVM may contract a multiply and an add into an FMA in one copy and
not in another, a rounding apart), whatever the trip count's remainder."""
import re

import numpy as np
import pytest

import polyc
from polyc.codegen.llvm import REDUCTION_UNROLL, REDUCTION_UNROLL_MIN_TRIPS
from polyc.errors import PolycError
from targets import RUNNABLE_CPUS

MM = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n    C(m,n) +=! A(m,k) * B(k,n)\n}"
CONV = ("def conv(float(N,C,H,W) I, float(M,C,KH,KW) F) -> (O) {\n"
        "    O(n,m,h,w) +=! I(n,c,h+kh,w+kw) * F(m,c,kh,kw)\n}")


def _loop_ids(text: str) -> dict:
    """``{metadata number: unroll count}`` of the loop IDs the IR's branches carry; each ID is
    self-referential (its first operand is itself), as LLVM's loop passes require."""
    counts = dict(re.findall(r'^!(\d+) = !\{ !"llvm\.loop\.unroll\.count", i32 (\d+) \}$', text, re.M))
    found = {}
    for number in set(re.findall(r"!llvm\.loop !(\d+)", text)):
        node = re.search(rf"^!{number} = !\{{ !{number}, !(\d+) \}}$", text, re.M)
        assert node is not None, f"loop ID !{number} is not self-referential"
        found[number] = int(counts[node.group(1)])
    return found


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("k", [1, 7, 16, 17, 18, 19, 130])
def test_unrolled_reduction_computes_what_the_rolled_loop_does(cpu, k, monkeypatch):
    monkeypatch.setenv("POLYC_CPU", cpu)
    rng = np.random.default_rng(k)
    a, b = rng.standard_normal((30, k)).astype(np.float32), rng.standard_normal((k, 37)).astype(np.float32)
    unrolled = polyc.define(MM, options=polyc.Options(threads=1)).specialize(a, b)
    rolled = polyc.define(MM, options=polyc.Options(threads=1, reduction_unroll=1)).specialize(a, b)
    long = k >= REDUCTION_UNROLL_MIN_TRIPS  # shorter loops are LLVM's to unroll (K = 1: no loop at all)
    assert set(_loop_ids(unrolled.stage("llvm")).values()) == ({REDUCTION_UNROLL} if long else set())
    assert set(_loop_ids(rolled.stage("llvm")).values()) == ({1} if long else set())
    np.testing.assert_allclose(unrolled(a, b), rolled(a, b), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(unrolled(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
def test_the_machine_code_holds_the_tile_count_times(cpu, monkeypatch):
    """K = 256 is a multiple of every count: the unrolled loop has exactly ``count`` copies of the tile."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((24, 256)).astype(np.float32), rng.standard_normal((256, 64)).astype(np.float32)
    fmas = {}
    for count in (1, 2, 4):
        compiled = polyc.define(MM, options=polyc.Options(threads=1, reduction_unroll=count)).specialize(a, b)
        fmas[count] = len(re.findall(r"\bvfmadd\w*ps", compiled.stage("asm")))
        np.testing.assert_allclose(compiled(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert fmas[1] > 0 and fmas[2] == 2 * fmas[1] and fmas[4] == 4 * fmas[1], fmas


def test_short_window_loops_are_left_to_llvm():
    """A 3x3 convolution's innermost reduction loop (around the register tile) runs 3 times, fewer than
    REDUCTION_UNROLL_MIN_TRIPS: no loop ID; with a 1x20 filter the window loop runs 20 times and gets one.
    Both compute what the kernel with the loop kept rolled does."""
    rng = np.random.default_rng(3)
    for kw, ids in ((3, set()), (20, {REDUCTION_UNROLL})):
        x = rng.standard_normal((1, 5, 11, 40)).astype(np.float32)
        w = rng.standard_normal((6, 5, 3 if kw == 3 else 1, kw)).astype(np.float32)
        unrolled = polyc.define(CONV, options=polyc.Options(threads=1)).specialize(x, w)
        rolled = polyc.define(CONV, options=polyc.Options(threads=1, reduction_unroll=1)).specialize(x, w)
        assert "// unroll" in unrolled.stage("ast")
        assert set(_loop_ids(unrolled.stage("llvm")).values()) == ids
        np.testing.assert_allclose(unrolled(x, w), rolled(x, w), rtol=1e-6, atol=1e-5)


def test_no_unrolling_at_all_leaves_the_loop_rolled():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((24, 40)).astype(np.float32), rng.standard_normal((40, 32)).astype(np.float32)
    for options in (polyc.Options(threads=1, unroll=0), polyc.Options(threads=1, unroll=0, reduction_unroll=4)):
        assert not _loop_ids(polyc.define(MM, options=options).specialize(a, b).stage("llvm"))


def test_the_option_is_checked_and_round_trips():
    with pytest.raises(PolycError, match="reduction_unroll must be 1 or more"):
        polyc.Options(reduction_unroll=0)
    options = polyc.Options.from_spec("reduction_unroll=2,threads=1")
    assert options.reduction_unroll == 2 and polyc.Options.from_spec(options.to_spec()) == options
