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

import os
import select
import signal
import time
import warnings

import islpy as isl

from .. import debug
from ..options import Options
from .affine import fixed_parameters, isl_name
from .deps import Dependences
from .scop import Scop
from .verify import respects


#: Bound on the constant terms of isl's schedule functions (``schedule_max_constant_term``) in the second
#: attempt, as Polly does (``-polly-opt-max-constant-term=20``). Unbounded (isl's default, the first
#: attempt: the library's schedules were tuned with it), isl's ILP may search shifts up to the specialised
#: sizes, and its big-number pivots grow with them: ``T(i,j) = A(i)*A(j); B(i) +=! T(i,j)`` took 18 s at
#: N=10^4, over 120 s at 10^5; bounded, 0.03 s. Bounding it always would change schedules that use a shift
#: by a size (softmax's, layernorm's), which the strategy then vectorizes less well.
MAX_CONSTANT_TERM = 20

#: The time box of one isl scheduler run, in seconds of wall time. isl runs in a forked child process that
#: is killed past it (isl cannot be interrupted in-process: islpy holds the GIL, and ``isl_ctx_abort`` is
#: only polled at simplex pivots, whose cost grows with the problem: five statements with divided indices
#: at N=8 spent 1.5 s on 30,000 pivots, 24 s on 100,000, while batchnorm_train needs 135,000 in 0.03 s).
TIME_BOX = 3.0

#: The operation budget of the first, in-process run (no fork): every kernel of the library but the largest
#: (batchnorm_train: 135,000) needs fewer pivots; one that runs out is scheduled again in the time box.
#: Forking costs ~5-10 ms in a process of a gigabyte, so most kernels are better off without it.
IN_PROCESS_OPERATIONS = 30_000

#: The operation budget of one run (``isl_ctx_set_max_operations``: isl counts a simplex pivot,
#: ``isl_tab_pivot``, as one operation). The library's kernels need at most ~150,000.
MAX_OPERATIONS = 5_000_000


def compute_schedule(scop: Scop, deps: Dependences, options: Options) -> isl.Schedule:
    """The schedule tree of ``scop``: isl's scheduler, or the source order when
    ``options.scheduler == "identity"``.

    isl runs on its own ``isl_ctx`` (constraints and tree cross over as isl text) set for the fusion
    strategy: first in this process on :data:`IN_PROCESS_OPERATIONS` pivots, which is enough for almost
    every kernel; past that, again with at most :data:`MAX_OPERATIONS` pivots in a child process killed
    after :data:`TIME_BOX` seconds (None: in this process, with the operation budget only; both are read at each call, so a test
    can shrink them). When a run is cut off or isl's scheduler fails (it can report "unable to carry
    dependences" on some inputs), the fallback is documented and always correct: isl again with the constant
    terms bounded by :data:`MAX_CONSTANT_TERM`, then also with ``fusion="min"`` (no fusion of strongly
    connected components: small problems), then the source order (:func:`identity_schedule`, which every
    dependence follows by construction). ``POLYC_DEBUG=1`` says which was taken and why. Compile time is so
    bounded by about three time boxes whatever the sizes.

    A generic kernel's problem has the sizes as parameters, which isl's ILP carries as unknowns (a 3x3
    convolution ran out of every budget). It is first solved with the parameters fixed to the hint
    (``isl_schedule_constraints_set_context`` of :attr:`Scop.hint`, sizes of 1 as 2), the problem of the
    specialised kernel, and again with no constant terms (a shift by a size holds at the hint only);
    that schedule is kept when it respects every dependence for every size (:func:`~polyc.poly.verify.respects`),
    else isl solves the parametric problem as above.
    """
    if options.scheduler == "identity":
        return identity_schedule(scop)
    validity = deps.all
    proximity = deps.raw.union(deps.waw)
    if options.rar:
        proximity = proximity.union(read_after_read(scop, deps))
    sc = isl.ScheduleConstraints.on_domain(scop.domain)
    sc = sc.set_validity(validity).set_proximity(proximity).set_coincidence(validity)
    if scop.params:  # a size of 1 would let isl drop its loop from the schedule: 2 instead
        hint = fixed_parameters(scop.params, {p: max(2, scop.sizes[p]) for p in scop.params})
        hinted = sc.set_context(hint).to_str()
        found = _search(hinted, scop, options)
        if found is not None and respects(found, scop, deps):
            return found
        # a shift by a size (softmax's) holds at the hint only: again without constant terms
        text = isl_schedule_text(hinted, options.fusion, 0, MAX_OPERATIONS)
        found = isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, text) if text and not text.startswith("error:") \
            else None
        if found is not None and respects(found, scop, deps):
            return found
        debug.log(f"schedule: the schedule of '{scop.name}' at its hint sizes does not hold for all sizes")
    found = _search(sc.to_str(), scop, options)
    if found is not None:
        return found
    debug.log(f"schedule: '{scop.name}' keeps the source order")
    return identity_schedule(scop)


def _search(text: str, scop: Scop, options: Options) -> isl.Schedule | None:
    """isl's scheduler on the schedule constraints ``text`` with the fallbacks :func:`compute_schedule`
    describes; None when every attempt failed."""
    time_box, max_operations = TIME_BOX, MAX_OPERATIONS
    failures = []
    if time_box is not None:  # cheap first: in this process, on a small pivot budget
        found = isl_schedule_text(text, options.fusion, None, min(IN_PROCESS_OPERATIONS, max_operations))
        if found.startswith("error:"):
            failures.append(found[6:].strip())
        elif found:
            return isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, found)
    attempts = ((options.fusion, None), (options.fusion, MAX_CONSTANT_TERM), ("min", MAX_CONSTANT_TERM))
    for fusion, constant in dict.fromkeys(attempts):
        found = _boxed(text, fusion, constant, max_operations, time_box)
        if found and not found.startswith("error:"):
            return isl.Schedule.read_from_str(isl.DEFAULT_CONTEXT, found)
        why = (f"failed ({found[6:].strip()})" if found else
               f"ran out of its budget ({time_box} s, {max_operations} operations)")
        failures.append(why)
        debug.log(f"schedule: isl's scheduler on '{scop.name}' with fusion={fusion}, constant terms up to "
                  f"{constant or 'any'} {why}; falling back")
    debug.log(f"schedule: isl's scheduler on '{scop.name}' failed: {'; '.join(failures)}")
    return None


def isl_schedule_text(constraints: str, fusion: str, max_constant_term: int | None, max_operations: int) -> str:
    """isl's scheduler on ``constraints`` (isl text) in a private ``isl_ctx`` set for ``fusion`` as in
    Tensor Comprehensions: ``max`` (``schedule_serialize_sccs=0``, ``schedule_whole_component=0``,
    ``schedule_maximize_band_depth=1``), ``smart`` (isl's defaults), ``min`` (``schedule_serialize_sccs=1``).
    ``max_constant_term`` bounds the constant terms (None: unbounded). Returns the tree as isl text, ``""``
    when ``max_operations`` ran out, or ``"error: ..."``."""
    ctx = isl.Context()
    if max_constant_term is not None:
        ctx.set_schedule_max_constant_term(max_constant_term)
    if fusion == "min":
        ctx.set_schedule_serialize_sccs(1)
    elif fusion == "max":
        ctx.set_schedule_serialize_sccs(0)
        ctx.set_schedule_whole_component(0)
        ctx.set_schedule_maximize_band_depth(1)
    sc = isl.ScheduleConstraints.read_from_str(ctx, constraints)
    ctx.reset_operations()
    ctx.set_max_operations(max_operations)
    try:
        schedule = sc.compute_schedule()
        # past the budget isl may hand back a NULL tree without raising (islpy then gives None)
        found = schedule.to_str() if schedule is not None else None
        return found or ""
    except isl.Error as exc:
        return "" if "maximal number of operations" in str(exc) else f"error: {exc}"
    finally:
        ctx.set_max_operations(0)


def _boxed(constraints: str, fusion: str, constant: int | None, max_operations: int,
           time_box: float | None) -> str:
    """:func:`isl_schedule_text` in a forked child killed after ``time_box`` seconds (``""`` then); in
    this process when ``time_box`` is None or the platform cannot fork."""
    if time_box is None or not hasattr(os, "fork"):
        return isl_schedule_text(constraints, fusion, constant, max_operations)
    read_end, write_end = os.pipe()
    try:
        with warnings.catch_warnings():  # Python 3.12 warns of fork() beside threads: the child runs isl only
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(read_end)
        os.close(write_end)
        return isl_schedule_text(constraints, fusion, constant, max_operations)
    if pid == 0:  # the child: compute, write, leave without running the parent's exit handlers
        status = 1
        try:
            os.close(read_end)
            try:
                text = isl_schedule_text(constraints, fusion, constant, max_operations)
            except Exception as exc:  # noqa: BLE001 - reported to the parent as isl's failure
                text = f"error: {type(exc).__name__}: {exc}"
            data = memoryview(text.encode())
            while data:
                data = data[os.write(write_end, data):]
            status = 0
        finally:
            os._exit(status)
    os.close(write_end)
    chunks, deadline, finished = [], time.monotonic() + time_box, False
    poller = select.poll()  # not select(): file descriptors past 1023 are fine
    poller.register(read_end, select.POLLIN)
    status = 1
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not poller.poll(1000 * left):
                break
            chunk = os.read(read_end, 1 << 16)
            if not chunk:
                finished = True
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        if not finished:
            os.kill(pid, signal.SIGKILL)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # SIGCHLD ignored by the host program: the child was reaped already
            status = 0 if finished else 1
    if not finished or status != 0:
        global cut_off
        cut_off += 1
        return ""
    return b"".join(chunks).decode()


#: How many scheduler runs the time box has cut off in this process. What such a compile gets depends on
#: the machine's load (a fallback schedule), so the kernel and program caches do not store a compile during
#: which this grew: the next compile tries again (a fallback once cached stayed, 1.5x slower, for good).
cut_off = 0


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


def tree_text(schedule: isl.Schedule) -> str:
    """A schedule tree in isl's block YAML (one node field per line, children indented), so two trees
    diff line by line; ``isl.Schedule.read_from_str`` reads it back."""
    printer = isl.Printer.to_str(schedule.get_ctx()).set_yaml_style(isl.yaml_style.BLOCK)
    return printer.print_schedule(schedule).get_str()


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
