"""Checks between stages: a transformed schedule respects every dependence and runs each instance once.

Run by the pipeline when verification is on (under pytest, or ``POLYC_VERIFY=1``).
"""
from __future__ import annotations

import islpy as isl

from ..errors import CompileError
from .deps import Dependences
from .scop import Scop


def check_schedule(schedule: isl.Schedule, scop: Scop, deps: Dependences, stage: str) -> None:
    """Raise CompileError unless ``schedule`` covers the Scop's domain exactly and orders every dependence's
    source before its sink (lexicographically positive dependence distances in time). Instances without a
    dependence between them may share a time: isl's AST generator still runs each instance exactly once."""
    smap = schedule.get_map().intersect_domain(scop.domain)
    if not smap.domain().is_equal(scop.domain):
        raise CompileError(f"{stage}: the schedule of '{scop.name}' does not cover the iteration domain")
    if smap.is_empty():
        return
    deps_in_time = deps.all.apply_domain(smap).apply_range(smap)
    if deps_in_time.is_empty():
        return
    time = isl.Map.from_union_map(deps_in_time)
    backwards = time.intersect(isl.Map.lex_ge(time.get_space().domain()))
    if not backwards.is_empty():
        raise CompileError(f"{stage}: the schedule of '{scop.name}' violates dependences {backwards}")


def respects(schedule: isl.Schedule, scop: Scop, deps: Dependences) -> bool:
    """Whether ``schedule`` passes :func:`check_schedule` (used by the strategy to reject a transformation)."""
    try:
        check_schedule(schedule, scop, deps, "candidate")
    except CompileError:
        return False
    return True
