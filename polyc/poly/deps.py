"""Dependences of a Scop with isl's dataflow analysis (``isl_union_access_info_compute_flow``).

The reference order is the source order: statement ``k`` before statement ``k+1``, the instances of one
statement in the lexicographic order of its indices. Three kinds, each an ``isl.UnionMap`` from source
instances to sink instances:

- RAW (flow): a read depends on the write it reads from (exact, last writer: must-sources are the writes);
- WAR (anti): a write depends on earlier reads of the same element (memory-based);
- WAW (output): a write depends on earlier writes of the same element (memory-based).

A data-dependent read is a may-read over the whole dimension, so its dependences over-approximate.
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from .affine import isl_name
from .scop import Scop


@dataclass(frozen=True, eq=False)
class Dependences:
    """RAW, WAR and WAW dependences (``isl.UnionMap``, statement instance → statement instance)."""

    raw: isl.UnionMap
    war: isl.UnionMap
    waw: isl.UnionMap

    @property
    def all(self) -> isl.UnionMap:
        """Every dependence: the validity constraints of scheduling."""
        return self.raw.union(self.war).union(self.waw).coalesce()

    def __str__(self) -> str:
        # coalesced copies: isl coalesces a union map's pieces in place, and a shared map's new form would
        # change what the scheduler is handed later (a debug print must not change the compiled code)
        def shown(deps: isl.UnionMap) -> isl.UnionMap:
            return isl.UnionMap.read_from_str(deps.get_ctx(), deps.to_str()).coalesce()
        return f"RAW: {shown(self.raw)}\nWAR: {shown(self.war)}\nWAW: {shown(self.waw)}"


def source_order(scop: Scop) -> isl.UnionMap:
    """The source-order schedule as a map ``{ Sk[i, j, ...] -> [k, i, j, ..., 0, ...] }`` (equal lengths)."""
    depth = max((len(s.indices) for s in scop.statements), default=0)
    parts = []
    for k, s in enumerate(scop.statements):
        dims = [isl_name(i) for i in s.indices]
        out = [str(k)] + dims + ["0"] * (depth - len(dims))
        parts.append(f"{s.name}[{', '.join(dims)}] -> [{', '.join(out)}]")
    text = "{ " + "; ".join(parts) + " }"
    return isl.UnionMap(text).intersect_domain(scop.domain)


def compute_dependences(scop: Scop) -> Dependences:
    """RAW, WAR and WAW dependences of ``scop`` in source order (isl ``compute_flow``)."""
    order = source_order(scop)
    reads, writes = scop.reads, scop.writes

    def flow(sink, must, may):
        info = isl.UnionAccessInfo.from_sink(sink)
        info = info.set_must_source(must).set_may_source(may).set_schedule_map(order)
        result = info.compute_flow()
        return result.get_may_dependence()

    empty = isl.UnionMap.empty(writes.get_space())
    raw = flow(reads, writes, empty)
    war = flow(writes, empty, reads)
    waw = flow(writes, empty, writes)
    return Dependences(raw, war, waw)
