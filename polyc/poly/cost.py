"""What a kernel must do, whatever its schedule: arithmetic operations and compulsory memory traffic.

These are the two axes of the roofline model (Williams, Waterman and Patterson, "Roofline: an insightful
visual performance model for multicore architectures", CACM 2009): a kernel cannot finish sooner than
``max(flops / peak FLOP/s, bytes / memory bandwidth)``. Benchmarks divide that bound by the measured time to
say how far a kernel is from its roofline (``scripts/bench_models.py``, ``scripts/bench_kernels.py``).

Counts come from the Scop through :mod:`polyc.poly.analysis`: each statement's instances are counted
exactly by isl (``isl_set_count_val`` on its iteration domain), its operations from the right-hand side's
value expression (:func:`~polyc.poly.analysis.flops`, whose docstring gives the counting rules), the bytes
from the elements the access relations touch (:func:`~polyc.poly.analysis.footprint`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..lang import ast as L
from . import analysis
from .scop import Scop


@dataclass(frozen=True)
class Cost:
    """A kernel's work: ``flops`` (floating-point operations of its statements' values, an FMA counting 2,
    as GFLOP/s figures do) and ``bytes`` (every element of an input or output the kernel touches moved once:
    the traffic no schedule can avoid; temporaries are not counted)."""

    flops: int
    bytes: int

    def roofline_seconds(self, peak_flops: float, bandwidth: float) -> float:
        """The roofline bound in seconds for a machine of ``peak_flops`` FLOP/s and ``bandwidth`` bytes/s."""
        return max(self.flops / peak_flops, self.bytes / bandwidth)

    def memory_bound(self, peak_flops: float, bandwidth: float) -> bool:
        """Whether the bound is the memory traffic (arithmetic intensity below the machine balance)."""
        return self.bytes / bandwidth >= self.flops / peak_flops


def value_operations(expr: L.Expr) -> int:
    """Operations in the value of ``expr`` (FLOPs and integer operations together), by the rules of
    :func:`polyc.poly.analysis.value_ops`: each arithmetic operator, comparison and builtin call counts one
    (``fma`` two), a repeated subexpression once; index expressions inside accesses (address arithmetic),
    selects and casts count none."""
    return sum(analysis.value_ops(expr))


def cost(scop: Scop) -> Cost:
    """The :class:`Cost` of ``scop`` (a Scop of concrete sizes: its domains have no parameters):
    ``flops`` is :func:`polyc.poly.analysis.flops` (per statement, instances × the FLOPs of its value plus
    one for a reduction's update; an initialisation does none), ``bytes`` the compulsory traffic of
    :func:`polyc.poly.analysis.footprint` (each touched element of an input or output once)."""
    return Cost(analysis.flops(scop), analysis.footprint(scop).traffic)
