"""Schedules: isl's scheduler (``isl_schedule_constraints_compute_schedule``) or the source order.

isl's scheduler (Pluto-style, Bondhugula et al. PLDI'08, as implemented by Verdoolaege and Janssens in isl)
takes validity = every dependence, proximity = RAW and WAW (reuse), coincidence = every dependence (so a
coincident band member carries no dependence: it can run in parallel). The fusion strategy maps to isl's
options as in Tensor Comprehensions: ``max`` (``schedule_serialize_sccs=0``, ``schedule_whole_component=0``),
``smart`` (isl's defaults), ``min`` (``schedule_serialize_sccs=1``: no fusion of strongly connected components).

With ``options.rar``, proximity also holds *input reuse*: read-after-read pairs (Pluto's ``--rar``,
Bondhugula et al.) between statements that no dependence relates, so isl's clustering may fuse independent
statements that stream the same input (``Q(i,j) = X(i,j) / 3`` and ``R(i,j) = X(i,j) % 3``: one pass over
``X``). RAR pairs never enter validity or coincidence: they order nothing. It is off by default because it
does not pay on the kernels measured: isl picks coincident (parallel) rows before proximity, so the two
matrix passes of bicg or mvt, whose fused loop would carry a reduction of one statement or the other, stay
apart; RAR pairs between statements that dependences already connect (softmax, layernorm) change isl's
clustering order and break fusions it made from the flow dependences alone, which is why they are left out.
"""
from __future__ import annotations

import contextlib

import islpy as isl

from ..errors import CompileError
from ..options import Options
from .affine import isl_name
from .deps import Dependences
from .scop import Scop


@contextlib.contextmanager
def _fusion_options(fusion: str):
    ctx = isl.DEFAULT_CONTEXT
    saved = (ctx.get_schedule_serialize_sccs(), ctx.get_schedule_whole_component(),
             ctx.get_schedule_maximize_band_depth())
    if fusion == "min":
        ctx.set_schedule_serialize_sccs(1)
    elif fusion == "max":
        ctx.set_schedule_serialize_sccs(0)
        ctx.set_schedule_whole_component(0)
        ctx.set_schedule_maximize_band_depth(1)
    try:
        yield
    finally:
        ctx.set_schedule_serialize_sccs(saved[0])
        ctx.set_schedule_whole_component(saved[1])
        ctx.set_schedule_maximize_band_depth(saved[2])


def compute_schedule(scop: Scop, deps: Dependences, options: Options) -> isl.Schedule:
    """The schedule tree of ``scop``: isl's scheduler, or the source order when
    ``options.scheduler == "identity"``."""
    if options.scheduler == "identity":
        return identity_schedule(scop)
    validity = deps.all
    proximity = deps.raw.union(deps.waw)
    if options.rar:
        proximity = proximity.union(read_after_read(scop, deps))
    sc = isl.ScheduleConstraints.on_domain(scop.domain)
    sc = sc.set_validity(validity).set_proximity(proximity).set_coincidence(validity)
    try:
        with _fusion_options(options.fusion):
            return sc.compute_schedule()
    except isl.Error as exc:
        raise CompileError(f"isl's scheduler failed on kernel '{scop.name}': {exc}") from None


def read_after_read(scop: Scop, deps: Dependences) -> isl.UnionMap:
    """Input reuse between independent statements: ``{ S[i] -> T[j] }`` where ``S`` and ``T`` read the same
    element, ``S`` comes before ``T`` in the source and no chain of dependences joins the two statements.

    Pluto's ``--rar`` read-after-read relations, used as proximity only. Per pair of statements it is
    ``reads_S . reads_T^-1`` (``isl_union_map_apply_range`` of one access relation with the other's
    ``isl_union_map_reverse``); bicg's ``s(j) +=! r(i) * A(i,j)`` and ``q(i) +=! A(i,j) * p(j)`` give
    ``{ S1[j, i] -> S3[i' = i, j' = j] }``. Statements that dependences connect (the weakly connected
    components of the dependence graph) are skipped: their flow dependences already ask for fusion.
    """
    component = {s.name: s.name for s in scop.statements}

    def root(name: str) -> str:
        while component[name] != name:
            name = component[name]
        return name

    pairs = []
    deps.all.foreach_map(pairs.append)
    for m in pairs:
        component[root(m.get_tuple_name(isl.dim_type.in_))] = root(m.get_tuple_name(isl.dim_type.out))
    result = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    for k, s in enumerate(scop.statements):
        for t in scop.statements[k + 1:]:
            if root(s.name) != root(t.name):
                result = result.union(s.reads.apply_range(t.reads.reverse()))
    return result.coalesce()


def identity_schedule(scop: Scop) -> isl.Schedule:
    """The source order as a schedule tree: a sequence of the statements, each with a band over its indices.

    ``{ S0[m, n]; S1[m, n, k] }`` becomes ``sequence(filter(S0) band[m, n], filter(S1) band[m, n, k])``.
    Statements of zero dimensions get no band.
    """
    schedule = isl.Schedule.from_domain(scop.domain)
    if len(scop.statements) > 1:
        filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(scop.statements))
        for s in scop.statements:
            filters = filters.add(isl.UnionSet.from_set(s.domain))
        node = schedule.get_root().child(0).insert_sequence(filters)
        for k, s in enumerate(scop.statements):
            node = node.child(k).child(0)
            node = _insert_band(node, s)
            node = node.parent().parent()
        return node.get_schedule()
    if not scop.statements:
        return schedule
    node = _insert_band(schedule.get_root().child(0), scop.statements[0])
    return node.get_schedule()


def _insert_band(node: isl.ScheduleNode, s) -> isl.ScheduleNode:
    """Insert a band ``[{ S[i..] -> [i] }, ...]`` at ``node`` and return the node at the same position."""
    if not s.indices:
        return node
    mupa = isl.MultiUnionPwAff(_band_text(s))
    return node.insert_partial_schedule(mupa)


def _band_text(s) -> str:
    dims = ", ".join(isl_name(i) for i in s.indices)
    members = ", ".join(f"{{ {s.name}[{dims}] -> [({isl_name(i)})] }}" for i in s.indices)
    return f"[{members}]"
