"""What a kernel must do, whatever its schedule: arithmetic operations and compulsory memory traffic.

These are the two axes of the roofline model (Williams, Waterman and Patterson, "Roofline: an insightful
visual performance model for multicore architectures", CACM 2009): a kernel cannot finish sooner than
``max(flops / peak FLOP/s, bytes / memory bandwidth)``. Benchmarks divide that bound by the measured time to
say how far a kernel is from its roofline (``scripts/bench_models.py``, ``scripts/bench_kernels.py``).

Counts come from the Scop: each statement's instances are counted exactly by isl (``isl_set_count_val``
on its iteration domain), its operations from the right-hand side's value expression.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..lang import ast as L
from .scop import Scop


@dataclass(frozen=True)
class Cost:
    """A kernel's work: ``flops`` (arithmetic operations of its statements' values, an FMA counting 2, as
    GFLOP/s figures do) and ``bytes`` (every input read once and every output written once: the traffic no
    schedule can avoid; temporaries are not counted)."""

    flops: int
    bytes: int

    def roofline_seconds(self, peak_flops: float, bandwidth: float) -> float:
        """The roofline bound in seconds for a machine of ``peak_flops`` FLOP/s and ``bandwidth`` bytes/s."""
        return max(self.flops / peak_flops, self.bytes / bandwidth)

    def memory_bound(self, peak_flops: float, bandwidth: float) -> bool:
        """Whether the bound is the memory traffic (arithmetic intensity below the machine balance)."""
        return self.bytes / bandwidth >= self.flops / peak_flops


def value_operations(expr: L.Expr) -> int:
    """Arithmetic operations in the value of ``expr``: each unary/binary operator and builtin call counts
    one; index expressions inside accesses (address arithmetic) and casts count none."""
    if isinstance(expr, L.Access):
        return 0
    if isinstance(expr, L.Unary):
        return 1 + value_operations(expr.operand)
    if isinstance(expr, L.Binary):
        return 1 + value_operations(expr.lhs) + value_operations(expr.rhs)
    if isinstance(expr, L.Select):
        return value_operations(expr.cond) + max(value_operations(expr.then), value_operations(expr.other))
    if isinstance(expr, L.Call):
        return 1 + sum(value_operations(a) for a in expr.args)
    if isinstance(expr, L.Cast):
        return value_operations(expr.operand)
    return 0


def cost(scop: Scop) -> Cost:
    """The :class:`Cost` of ``scop`` (a Scop of concrete sizes: its domains have no parameters).

    A statement ``T(...) op= rhs`` with ``n`` instances does ``n * (value_operations(rhs) + 1)`` operations
    for a reduction (``+=``, ``*=``, ``max=``, ``min=``: the combination counts one) and
    ``n * value_operations(rhs)`` otherwise (an initialisation does none).
    """
    flops = 0
    for s in scop.statements:
        if s.op == "init":
            continue
        instances = int(s.domain.count_val().to_python())
        flops += instances * (value_operations(s.rhs) + (s.op != "="))
    traffic = 0
    for t in scop.tensors:
        if t.role in ("input", "output"):
            n = 1
            for extent in t.shape:
                n *= extent
            traffic += n * L.ITEMSIZE[t.dtype]
    return Cost(flops, traffic)
