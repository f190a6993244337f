"""Checks between stages: a transformed schedule respects every dependence and runs each instance once.

Run by the pipeline when verification is on (under pytest, or ``POLYC_VERIFY=1``), and by the strategy on
every candidate tree (:func:`respects`).

The check walks the schedule *tree*, as isl's AST generator reads it, instead of flattening it with
``isl_schedule_get_map``: a ``set`` node leaves the order of its children free (the AST generator may put
any child first), which the flat map hides by numbering the children like a sequence; and the flat map of a
tiled, register-tiled tree stacks the floor divisions of every band into one relation, which grew without
bound (minutes at sizes of 8 for five statements with divided indices). Band by band, each band only sees
the dependences its ancestors left unordered, with its own partial schedule (the way isl's scheduler and
PPCG's checks split dependences: ``isl_union_map_lex_gt_at_multi_union_pw_aff`` /
``isl_union_map_eq_at_multi_union_pw_aff``).
"""
from __future__ import annotations

import islpy as isl

from ..errors import CompileError
from .deps import Dependences, compute_dependences
from .marks import parse_mark
from .scop import Scop

_T = isl.schedule_node_type


def check_schedule(schedule: isl.Schedule, scop: Scop, deps: Dependences, stage: str) -> None:
    """Raise CompileError unless ``schedule`` runs every instance of the Scop's domain exactly once and
    orders every dependence's source before its sink in the code isl's AST generator makes of it.

    - the tree's domain is the Scop's domain; the children filters of every ``sequence`` / ``set`` node split
      the instances reaching it into disjoint parts that cover them all;
    - each dependence (RAW, WAR, WAW, so also an initialisation before its reduction's updates) is ordered
      by the outermost node that separates its two instances: a band whose partial schedule is
      lexicographically larger at the sink, or a ``sequence`` whose sink child comes later. A ``set``
      separating them, or a leaf reached by both at the same time, orders nothing: a violation;
    - a loop marked ``parallel`` (``parallel_c<depth>``, see :func:`polyc.poly.strategy.mark_parallel`)
      carries no dependence left by the nodes above it.

    Instances without a dependence between them may share a time. ``stage`` names the pipeline stage in the
    message. Raises CompileError naming the kernel, the node and the violated dependences.
    """
    if not schedule.get_domain().is_equal(scop.domain):
        raise CompileError(f"{stage}: the schedule of '{scop.name}' does not cover the iteration domain "
                           f"exactly: it schedules {schedule.get_domain()}")
    pending = deps.all.intersect_domain(scop.domain).intersect_range(scop.domain)
    check_subtree(schedule.get_root(), pending, f"{stage}: the schedule of '{scop.name}'")


def verify_stage(stage: str, values: dict) -> None:
    """The verifier as a hook between pipeline stages (:class:`polyc.debug.StageLogger`): after
    ``"schedule"`` and ``"transformed"`` the tree is checked (:func:`check_schedule`) against the dependences
    of the Scop; after ``"promoted"`` (a new Scop with copy statements) against that Scop's own dependences.
    ``values``: stage name → value so far (``"transformed"`` is ``(tree, packings)``, ``"promoted"`` is
    ``(scop, tree)``). Raises CompileError naming the stage."""
    if stage == "schedule":
        check_schedule(values["schedule"], values["scop"], values["dependences"], "schedule")
    elif stage == "transformed":
        check_schedule(values["transformed"][0], values["scop"], values["dependences"], "transformed")
    elif stage == "promoted":
        scop, tree = values["promoted"]
        if scop is not values["scop"]:
            check_schedule(tree, scop, compute_dependences(scop), "promoted")


def respects(schedule: isl.Schedule, scop: Scop, deps: Dependences) -> bool:
    """Whether ``schedule`` passes :func:`check_schedule` (used by the strategy to reject a transformation)."""
    try:
        check_schedule(schedule, scop, deps, "candidate")
    except CompileError:
        return False
    return True


def _fail(where: str, what: str, deps: isl.UnionMap):
    shown = isl.UnionMap.read_from_str(deps.get_ctx(), deps.to_str()).coalesce()  # isl coalesces in place
    raise CompileError(f"{where} {what}: {shown}")


def check_subtree(node: isl.ScheduleNode, pending: isl.UnionMap, where: str) -> None:
    """Check the subtree of ``node`` (see :func:`check_schedule`) against ``pending``: the dependences
    between instances that reach ``node`` which no ancestor orders (equal values at every band above, same
    child of every sequence; :func:`polyc.poly.transforms.dependences_at`). Raises CompileError whose
    message starts with ``where``."""
    kind = node.get_type()
    if kind == _T.band:
        if node.band_n_member():
            mupa = node.band_get_partial_schedule()
            backwards = pending.lex_gt_at_multi_union_pw_aff(mupa)
            if not backwards.is_empty():
                _fail(where, f"violates dependences at band {mupa}", backwards)
            pending = pending.eq_at_multi_union_pw_aff(mupa)
    elif kind in (_T.sequence, _T.set):
        _check_children(node, pending, where, ordered=kind == _T.sequence)
        return
    elif kind == _T.filter:
        f = node.filter_get_filter()
        pending = pending.intersect_domain(f).intersect_range(f)
    elif kind == _T.mark:
        _check_parallel(node, pending, where)
    elif kind == _T.leaf:
        if not pending.is_empty():
            _fail(where, "runs dependent instances at the same time (nothing orders them)", pending)
        return
    elif kind in (_T.extension, _T.expansion):
        raise CompileError(f"{where} has an {kind.name} node, which the "
                           "verifier does not model")
    if pending.is_empty():
        return
    for k in range(node.n_children()):
        check_subtree(node.child(k), pending, where)


def _check_children(node: isl.ScheduleNode, pending: isl.UnionMap, where: str, ordered: bool):
    """A sequence (``ordered``) or set: its filters partition the instances reaching it; a dependence from
    a later child to an earlier one (a sequence), or between two children (a set), is violated."""
    domain = node.get_domain()
    filters = [node.child(k).filter_get_filter().intersect(domain) for k in range(node.n_children())]
    covered = isl.UnionSet.empty(domain.get_space())
    for k, f in enumerate(filters):
        if not covered.intersect(f).is_empty():
            raise CompileError(f"{where} runs {covered.intersect(f)} twice "
                               f"(filters of a {'sequence' if ordered else 'set'} node overlap)")
        covered = covered.union(f)
    if not covered.is_equal(domain):
        raise CompileError(f"{where} never runs {domain.subtract(covered)} "
                           f"(filters of a {'sequence' if ordered else 'set'} node miss them)")
    if pending.is_empty():
        return
    earlier = isl.UnionSet.empty(domain.get_space())
    for k, f in enumerate(filters):
        # sinks in this child, sources in another: only earlier children of a sequence may be sources
        crossing = pending.intersect_range(f).subtract_domain(f)
        if not ordered:
            bad = crossing
        else:
            bad = crossing.subtract_domain(earlier)
        if not bad.is_empty():
            what = "sequence runs a dependence's sink child first" if ordered else \
                "set leaves dependent children unordered (isl's AST generator picks any order)"
            _fail(where, what, bad)
        earlier = earlier.union(f)
        check_subtree(node.child(k), pending.intersect_domain(f).intersect_range(f), where)


def _check_parallel(mark: isl.ScheduleNode, pending: isl.UnionMap, where: str) -> None:
    """A ``parallel`` mark over a band: the marked member carries none of ``pending`` once the members
    before it are equal."""
    name = mark.mark_get_id().get_name()
    kind, depth = parse_mark(name)
    band = mark.child(0)
    if kind != "parallel" or band.get_type() != _T.band or pending.is_empty():
        return
    member = depth - band.get_schedule_depth() if depth is not None else 0
    if not 0 <= member < band.band_n_member():
        return
    mupa = band.band_get_partial_schedule()
    for k in range(member + 1):
        upa = isl.MultiUnionPwAff.from_union_pw_aff(mupa.get_at(k))
        if k == member:
            carried = pending.subtract(pending.eq_at_multi_union_pw_aff(upa))
            if not carried.is_empty():
                _fail(where, f"runs a loop in parallel ({name}) that carries dependences", carried)
        pending = pending.eq_at_multi_union_pw_aff(upa)
