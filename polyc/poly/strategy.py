"""The CPU strategy: from isl's schedule tree to a tiled, register-tiled, marked tree, every decision derived.

For each outermost band of isl's tree (in the manner of TC's numbered ``MappedScop`` steps), looking at its
*main statement* (the statement of the band with the most indices, preferring updates to initialisations):

0. **distribute serialized members**: where isl fused several loops into one member by shifting each past
   the previous one (a softmax's max, exp and sum over a row: ``r0``, ``499 + i3``, ``499 + r0``), split the
   band there and sink the rest, one loop per statement under the shared outer members, each marked
   ``vector`` when it carries no dependence or is a reduction's own; then fuse the next sibling band's
   outer members of equal extents into it (the division by the sum, on the row while it is in cache)
   (:func:`~polyc.poly.transforms.distribute_serialized`, :func:`~polyc.poly.transforms.fuse_next_sibling`);

1. **classify members**: coincident members (``P``, no dependence carried: parallel, vectorisable) and the
   others (``R``, reductions). The *vector member* ``v`` is the coincident member that is the innermost,
   stride-1 index of the main statement's write, with every read stride-0 or stride-1 in it. The *unroll
   member* ``u`` is the coincident member in which the most vector-loaded reads are invariant (so one loaded
   vector feeds every unrolled copy: ``m`` for matmul, the output channel for a convolution).
2. **reorder** the permutable band to ``[P - {u, v}, u, v, R]`` (``band_permute``);
3. **cache tile** it (``band_tile``) with ``options.tile_sizes`` or sizes derived from the target's L2 cache
   and the band's extents; mark the outermost tile loop ``parallel`` when it is coincident and the kernel has
   enough work, after splitting one coincident member's tiles for the threads when that loop would be a
   reduction's or would leave a thread idle (:func:`~.tiling.split_for_threads`);
4. **register tile**: split the point band into ``[P - {u, v}]``, ``[u, v]`` and ``[R]``; tile ``[u, v]`` by
   ``(MR, NR)`` (``NR`` = two vectors); sink ``[R]`` and then the ``[ur, vr]`` point band below the statement
   sequence (``band_sink``: loop distribution, so an initialisation runs before the reduction that uses it),
   so each statement's innermost loops are ``R, ur, vr``: the reduction loop updates an ``MR x NR`` block of
   accumulators that LLVM keeps in registers;
5. **marks**: ``unroll`` on ``ur``, ``vector`` on ``vr`` (codegen emits them as unrolled copies and LLVM vector
   code of the target's width); the tile band ``[u, v]`` splits into ``[u]`` over ``[v]``, each isolating the
   full tiles of its own member (isl's ``isolate`` option), so a partial row tile still gets whole vectors;
6. **packing** (promotion): when the register tile's vector operand walks long rows along the reduction
   (GEMM's ``B(k, n)``), decide to copy it into a panel-major buffer (:class:`Packing`, carried out by
   :func:`polyc.poly.promote.promote` after the bands are done). An operand among ``constants`` (a model's
   weights, packed once by the caller instead of on every call) is packed wherever its access allows: the
   thresholds weigh a per-call copy that it does not pay. A constant *broadcast* operand whose rows are a
   whole number of pages apart, or any broadcast operand whose rows are adjacent and whose reduction steps
   jump cache lines (copied per call unless constant), is packed in slivers of MR rows
   (:func:`~.packing.choose_row_packing`).

Every band's result is checked against the dependences it had to order (the verifier's tree walk): when
it would break one, the band falls back to :func:`simple_band` (checked too), else stays as isl built it.
Loop distribution (``band_sink``) first turns the ``set`` nodes below into dependence-ordered sequences:
isl's AST generator runs a set's children in any order, which is only right while the band above orders
their dependences (a tiled reduction and its initialisation, both in one tile, once lost that order).
``target`` is a :class:`polyc.target.Target` (cores, vector width and registers, cache sizes).
"""
from __future__ import annotations

import math

import islpy as isl

from ..errors import CompileError
from ..lang import ast as L
from ..options import Options
from ..target import Target
from .affine import accesses_in, element_stride
from .deps import Dependences
from .marks import mark_name
from .scop import PolyStatement, Scop
from .packing import (PACK_MIN_ROW_BYTES, Packing, band_packings, choose_row_packing, jump_bytes, loop_order,
                      packable_names, plain_index)
from .tiling import cache_tile_sizes, micro_step_bytes, register_tile_sizes, row_registers, split_for_threads
from .transforms import (band_coincident, band_extents, band_permute, band_ranges, band_sink, band_split, band_tile,
                         bands, branches_below, dependences_at, distribute_bands, distribute_serialized,
                         fuse_next_sibling, insert_mark, isolate_full_tiles, member_index, node_at, order_sets,
                         path_of, single_tile)
from .verify import check_subtree

#: The largest element stride of a read along the vector loop that codegen vectorizes (strided loads).
MAX_READ_STRIDE = 4

#: Below this many statement instances a kernel stays single-threaded (thread start-up would dominate).
PARALLEL_MIN_INSTANCES = 1 << 16


def instance_bound(scop: Scop) -> int:
    """The number of statement instances of ``scop`` (from the inferred ranges; an upper bound)."""
    total = 0
    for s in scop.statements:
        n = 1
        for index in s.indices:
            lo, hi = scop.ranges.get((s.name, index), (0, 1))
            n *= max(0, hi - lo)
        total += n
    return total


def threads(options: Options, target: Target) -> int:
    """The thread count: ``options.threads`` (the pipeline resolves it before compiling,
    :func:`polyc.pipeline.resolve_options`), else — for a direct caller — the target's cores."""
    return options.threads or target.cores


def runs_parallel(scop: Scop, options: Options, target: Target) -> bool:
    """Whether the kernel's loops may be split across threads — the one place this is decided (the strategy
    marks a loop parallel only then, promotion parallelizes its copies only then): parallel loops are on,
    there is more than one thread, and the kernel has at least :data:`PARALLEL_MIN_INSTANCES` statement
    instances (:func:`instance_bound`)."""
    return options.parallel and threads(options, target) > 1 and instance_bound(scop) >= PARALLEL_MIN_INSTANCES


def lanes(scop: Scop, target) -> int:
    """Vector lanes for the widest element type of ``scop`` on ``target``."""
    widest = max((8 * L.itemsize(t.dtype) for t in scop.tensors), default=32)
    return max(1, target.vector_bits // widest)


def apply_strategy(schedule: isl.Schedule, scop: Scop, deps: Dependences, target: Target, options: Options,
             constants: frozenset = frozenset()):
    """Apply the CPU strategy to every outermost band of ``schedule``, keeping every dependence of ``deps``.
    ``constants``: input tensors whose values do not change between calls (step 6).

    Returns ``(schedule, packings)``: the new schedule and the :class:`Packing` decisions of the bands whose
    register tile was kept (step 6, carried out by :func:`polyc.poly.promote.promote`).
    Each band's new subtree is checked against the dependences the band had to order
    (:func:`polyc.poly.verify.check_subtree` with :func:`~polyc.poly.transforms.dependences_at`); a subtree
    that breaks one (or a step that refuses, such as a ``band_sink`` that would break one) gives way to
    :func:`simple_band`, and that too is checked (else the band stays as isl built it).
    """
    parallel = runs_parallel(scop, options, target)
    everything = deps.all
    packings = []
    i = -1
    while (i := i + 1) < len(bands(schedule)):
        node = bands(schedule)[i]
        path, pending = path_of(node), dependences_at(node, everything)
        try:  # loops isl serialized inside one member become loops of their own
            distributed = distribute_serialized(node)
            if distributed is not node:
                check_subtree(distributed, pending, f"distribution on '{scop.name}'")
                node = distributed
                try:  # and the loops of the next group of statements over the same rows join them
                    fused = fuse_next_sibling(node, scop.hint)
                    if fused is not node:
                        check_subtree(fused, dependences_at(fused, everything), f"fusion on '{scop.name}'")
                        node, path = fused, path_of(fused)
                        pending = dependences_at(node, everything)
                except (isl.Error, CompileError):
                    pass
                node = _mark_distributed(node, scop, everything) if options.vectorize else node
        except (isl.Error, CompileError):
            pass
        for attempt in (optimize_band, None):
            try:
                if attempt is None:
                    done, packs = simple_band(node, options, parallel, scop.hint), ()
                else:
                    done, packs = optimize_band(node, scop, everything, target, options, parallel, constants)
                candidate = done.get_schedule()
                check_subtree(node_at(candidate, path), pending, f"strategy on '{scop.name}'")
            except (isl.Error, CompileError):
                continue
            schedule = candidate
            packings += packs
            break
    return schedule, tuple(packings)


def _mark_distributed(outer: isl.ScheduleNode, scop: Scop, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Mark ``vector`` the innermost loop of each statement's own loops below ``outer`` (the band
    :func:`~polyc.poly.transforms.distribute_serialized` left) when it carries no dependence, or is a reduction
    index of a reduction statement (the codegen's vector reduction; it checks the accesses itself)."""
    path = path_of(outer)
    schedule = outer.get_schedule()
    by_name = {s.name: s for s in scop.statements}
    for leaf in reversed(_leaf_bands(outer.child(0), None)):
        band = node_at(schedule, leaf)
        if band.band_n_member() > 1:
            band = band_split(band, band.band_n_member() - 1).child(0)
        sets = []
        band.get_domain().foreach_set(sets.append)
        if len(sets) != 1:
            continue
        stmt = by_name[sets[0].get_tuple_name()]
        # a reduction that does not read its own tensor carries dependences only through its accumulator,
        # along its reduction indices: the codegen's vector reduction (which checks the strides)
        if not dependences_at(band, deps).is_empty() and (
                stmt.op not in ("+=", "*=", "max=", "min=")
                or any(a.tensor == stmt.tensor for a in accesses_in(stmt.rhs))):
            continue
        schedule = insert_mark(band, "vector").get_schedule()
    return node_at(schedule, path)


def simple_band(node: isl.ScheduleNode, options: Options, parallel: bool,
                hint: isl.Set | None = None) -> isl.ScheduleNode:
    """The fallback: tile the band as isl gave it and mark its outermost coincident loop parallel (``hint``:
    :attr:`Scop.hint`)."""
    tiles = [32] * node.band_n_member()
    if options.tile and node.band_get_permutable() and node.band_n_member() >= 2 \
            and not single_tile(node, tiles, hint):
        node = band_tile(node, tiles)
    return mark_parallel(node, hint) if parallel else node


# ---- step 1: classify the band's members -------------------------------------------------------------

def main_statement(node: isl.ScheduleNode, scop: Scop) -> PolyStatement | None:
    """The statement of the band with the most indices (updates before initialisations)."""
    domain = node.get_domain()
    names = set()
    domain.foreach_set(lambda s: names.add(s.get_tuple_name()))
    candidates = [s for s in scop.statements if s.name in names]
    if not candidates:
        return None
    return max(candidates, key=lambda s: (len(s.indices), s.op != "init"))


def access_strides(stmt: PolyStatement, scop: Scop, index: str):
    """``(write stride, [read strides])`` of ``stmt`` along ``index``; a gather read gives ``None``."""
    lhs_args = [L.Ident(n, None, "int32", "index") for n in stmt.lhs]
    write = fixed_stride(lhs_args, stmt.tensor, index, stmt, scop)
    reads = [fixed_stride(a.args, a.tensor, index, stmt, scop) for a in accesses_in(stmt.rhs)]
    return write, reads


def fixed_stride(args, tensor: str, index: str, stmt: PolyStatement, scop: Scop) -> int | None:
    """:func:`~polyc.poly.affine.element_stride` of ``tensor(args)`` along ``index``; in a generic kernel
    None as well where it depends on the sizes (it changes when every size-dependent extent and every size
    grows, by 1 and by 7: a polynomial in them with integer coefficients that stays put at both is constant
    unless its terms cancel at exactly those values)."""
    t = scop.tensor(tensor)
    found = element_stride(args, t.shape, index, stmt.indices, scop.sizes)
    if found is None or not scop.params:
        return found
    for grow in (1, 7):
        shape = tuple(n + grow if type(e) is not int else n
                      for n, e in zip(t.shape, t.extents))
        sizes = {k: v + grow if k in scop.params else v for k, v in scop.sizes.items()}
        if element_stride(args, shape, index, stmt.indices, sizes) != found:
            return None
    return found


def choose_members(node: isl.ScheduleNode, stmt: PolyStatement, scop: Scop, transpose: bool = True):
    """``(u, v, read)``: the unroll and vector members of the band (positions, or ``None``), and the read that
    must be packed transposed for ``v`` to vectorize (None when every read already has a stride of 0 to
    :data:`MAX_READ_STRIDE` along it). With ``transpose``, a write-stride-1 member whose only obstacle is one
    read of an input that runs along another index (``B(k, n)`` for ``v = k`` in ``C(m, k) += A(m, n) *
    B(k, n)``: a GEMM with a transposed operand; a convolution's weight gradient) qualifies when that read
    can be packed with ``v`` innermost (:func:`transposable`); step 6 then packs it. Ties for ``u`` go to the
    member of largest extent (the most rows to reuse a loaded vector on), then to the later member."""
    coincident = band_coincident(node)
    extents = band_extents(node, scop.hint)
    index_of = [member_index(node, k, stmt) for k in range(node.band_n_member())]
    v = transposed = None
    for k in range(node.band_n_member()):
        if not coincident[k] or index_of[k] is None or index_of[k] not in stmt.lhs:
            continue
        write, reads = access_strides(stmt, scop, index_of[k])
        if write != 1:
            continue
        far = [a for a, r in zip(accesses_in(stmt.rhs), reads) if not (r is not None and 0 <= r <= MAX_READ_STRIDE)]
        if not far:
            v, transposed = k, None
        elif transpose and len(far) == 1 and transposable(far[0], index_of[k], stmt, scop) and v is None:
            v, transposed = k, far[0]
    if v is None:
        return None, None, None
    vector_reads = [a for a, s in zip(accesses_in(stmt.rhs), access_strides(stmt, scop, index_of[v])[1]) if s]
    best, u = 0, None
    for k in range(node.band_n_member()):
        if k == v or not coincident[k] or index_of[k] is None:
            continue
        invariant = sum(
            element_stride(a.args, scop.tensor(a.tensor).shape, index_of[k], stmt.indices, scop.sizes) == 0
            for a in vector_reads)
        if invariant > best or (invariant == best and u is not None and invariant > 0
                                and extents[k] >= extents[u]):
            best, u = invariant, k
    return u, v, transposed


def transposable(read: L.Access, v_index: str, stmt: PolyStatement, scop: Scop) -> bool:
    """Whether ``read`` can be packed with ``v_index`` innermost (:class:`Packing` with a ``position``): a read
    of a tensor no statement writes, with distinct plain indices and integer literals, ``v_index`` one of
    them, and some reduction index among them (the packed copy is then reused across the register tile's
    rows instead of being a copy of what the kernel reads once)."""
    names = packable_names(read, stmt, scop)
    return names is not None and v_index in names


def streams_rows(node: isl.ScheduleNode, stmt: PolyStatement, scop: Scop, v: int, R: list[int]) -> bool:
    """Whether the band should stream rows instead of register-tiling: some read loaded along the vector
    member ``v`` jumps at least PACK_MIN_ROW_BYTES per step of a reduction member in ``R`` (``y(j) +=
    A(i,j) * t(i)`` with long rows of ``A``). Without an unroll member no loaded vector is reused in
    registers, and the register tile's point loops ``[R, v-block]`` would walk such a read down a column
    of short blocks, a new page each step; with ``v`` innermost and the reductions outside it, each step
    reads a contiguous row segment of the tile instead (the accumulated output segment stays in L1)."""
    strides = access_strides(stmt, scop, member_index(node, v, stmt))[1]
    loaded = [a for a, st in zip(accesses_in(stmt.rhs), strides) if st]
    reductions = [i for i in (member_index(node, k, stmt) for k in R) if i is not None]
    return any(jump_bytes(read, reductions, stmt, scop) >= PACK_MIN_ROW_BYTES for read in loaded)


def streams_panel(stmt: PolyStatement, scop: Scop, p_indices, u_index: str, v_index: str, l2_bytes: int) -> bool:
    """Whether the register tile's vector operand is one matrix that every row reads (a read that moves
    along ``v_index`` but along neither ``u_index`` nor any other row index ``p_indices``: GEMM's ``B``, a
    1x1 convolution's weights, not a batched GEMM's per-batch ``B``) and larger than the L2 cache (a
    layer's weights, which every call brings from L3 or memory)."""
    for read in accesses_in(stmt.rhs):
        tensor = scop.tensor(read.tensor)
        strides = [element_stride(read.args, tensor.shape, i, stmt.indices, scop.sizes)
                   for i in [v_index, u_index] + [i for i in p_indices if i is not None]]
        if None in strides or not strides[0] or any(strides[1:]):
            continue
        if math.prod(tensor.shape) * L.itemsize(tensor.dtype) > l2_bytes:
            return True
    return False


# ---- steps 2-5 (the sizes: :mod:`polyc.poly.tiling`) -----------------------------------------------

def optimize_band(node: isl.ScheduleNode, scop: Scop, deps: isl.UnionMap, target, options: Options,
                  parallel: bool, constants: frozenset = frozenset(), split: bool = True, transpose: bool = True):
    """Steps 1-6 on one outermost band; returns ``(node of the new tree, tuple of Packing)``. ``deps``
    (every dependence) keeps the loop distributions of steps 4-5 legal (:func:`~polyc.poly.transforms.band_sink`
    raises CompileError when one cannot be). ``split``: a band whose vector member ends in a partial tile of
    more pieces than a full one is first split in two (:func:`split_partial_tile`), each part optimized on
    its own. ``transpose``: a vector member may need a read packed transposed (:func:`choose_members`); when
    the band cannot take that packing it is optimized again without."""
    stmt = main_statement(node, scop)
    if stmt is None or not node.band_get_permutable():
        return simple_band(node, options, parallel, scop.hint), ()
    coincident = band_coincident(node)
    n = node.band_n_member()
    u, v, transposed = choose_members(node, stmt, scop, transpose) \
        if (options.vectorize or options.register_tile) else (None, None, None)
    if not options.register_tile:
        u = None
    if transposed is not None and (u is None or options.promote is False or not options.vectorize
                                   or all(i in stmt.lhs for i in stmt.indices)):
        return optimize_band(node, scop, deps, target, options, parallel, constants, split, transpose=False)
    reduction_member = choose_reduction_member(node, stmt, scop) if v is None and options.vectorize else None
    # members of one value first: they generate no loop, so the next member's loop is the outermost one
    P = sorted((k for k in range(n) if coincident[k] and k not in (u, v)),
               key=lambda k: band_extents(node, scop.hint)[k] > 1)
    R = [k for k in range(n) if not coincident[k] and k != reduction_member] \
        + ([reduction_member] if reduction_member is not None else [])
    stream = v is not None and u is None and bool(R) and streams_rows(node, stmt, scop, v, R)
    order = P + [k for k in (u, v) if k is not None] + R
    extents = band_extents(node, scop.hint)
    loops = [scop.ranges.get((stmt.name, i), (0, 1)) for i in stmt.reduction_indices]
    mr, nr = register_tile_sizes(options, lanes(scop, target), target.vector_registers,
                                 extents[v] if v is not None else None, sum(hi - lo > 1 for lo, hi in loops),
                                 extents[u] if u is not None else None)
    if split and u is not None and v is not None and coincident[v] and not options.register_tile_sizes \
            and not scop.params:  # where the partial tile starts depends on the sizes
        parts = split_partial_tile(node, v, nr, lanes(scop, target))
        if parts is not None:
            path = path_of(parts)
            done, packs = optimize_band(parts.child(0).child(0), scop, deps, target, options, parallel,
                                        constants, split=False, transpose=transpose)
            rest = node_at(done.get_schedule(), path).child(1).child(0)
            done, _ = optimize_band(rest, scop, deps, target, options, parallel, constants, split=False,
                                    transpose=transpose)
            return node_at(done.get_schedule(), path), packs
    itemsize = L.itemsize(scop.tensor(stmt.tensor).dtype)
    in_band = {member_index(node, k, stmt) for k in range(n)}
    depth = 1
    for index in stmt.indices:  # reductions of the main statement in a band nested below this one
        if index not in stmt.lhs and index not in in_band:
            lo, hi = scop.ranges.get((stmt.name, index), (0, 1))
            depth *= max(1, hi - lo)
    reduction_indices = [member_index(node, k, stmt) for k in R]
    slivers = choose_row_packing(stmt, scop, member_index(node, u, stmt), member_index(node, v, stmt), mr,
                                 constants, -(-extents[v] // nr)) \
        if u is not None and v is not None and options.promote is not False else None
    step_bytes = micro_step_bytes(stmt, scop, member_index(node, u, stmt), member_index(node, v, stmt),
                                  reduction_indices[0], mr, nr, slivers.read if slivers else None) \
        if u is not None and v is not None and len(R) == 1 and depth == 1 and None not in reduction_indices \
        else 0
    shared = step_bytes > 0 and streams_panel(stmt, scop, [member_index(node, k, stmt) for k in P],
                                              member_index(node, u, stmt), member_index(node, v, stmt),
                                              target.l2_bytes)
    tiles = cache_tile_sizes(order, u, v, coincident, extents, options, target, mr, nr, itemsize, depth,
                             step_bytes, threads(options, target) if parallel else 1, shared,
                             v is None and reduction_member is not None)
    if parallel and options.tile and not options.tile_sizes:
        tiles = split_for_threads(order, coincident, extents, tiles, {u: mr, v: nr}, threads(options, target))
    rows = 1  # the rows (points of the coincident members but v) that read each panel of the vector operand
    for k in P + ([u] if u is not None else []):
        rows *= extents[k]
    packs = []
    if transposed is not None:
        if options.tile and tiles[order.index(v)] % nr:
            return optimize_band(node, scop, deps, target, options, parallel, constants, split, transpose=False)
        v_index = member_index(node, v, stmt)
        position = [a.name if plain_index(a) else None for a in transposed.args].index(v_index)
        packs.append(Packing(stmt.name, transposed, v_index, nr, position))
    if u is not None and v is not None and options.promote is not False:
        loops = [member_index(node, k, stmt) for k in order] + loop_order(node.child(0), stmt)
        packs += band_packings(stmt, scop, member_index(node, u, stmt), member_index(node, v, stmt), mr, nr,
                               tiles[order.index(v)] if options.tile else None, -(-rows // mr), loops,
                               options.promote is True, constants, vector_operand=transposed is None,
                               slivers=slivers)
    node = band_permute(node, order)
    band_path = path_of(node)
    if options.tile and not single_tile(node, tiles, scop.hint):
        node = band_tile(node, tiles).child(0)
    if stream:  # point loops [P, R, v]: the tile loops keep v outside the reductions (a parallel loop)
        point = len(P)
        node = _vector_innermost(band_permute(node, list(range(point)) + list(range(point + 1, n)) + [point]),
                                 deps)
    elif v is None and reduction_member is not None:
        node = _vector_innermost(node, deps)
    elif v is not None:
        node = _point_loops(node, len(P), u is not None, len(R), mr, nr, deps, scop.hint)
    node = node_at(node.get_schedule(), band_path)
    return (mark_parallel(node, scop.hint) if parallel else node), tuple(packs)


def split_partial_tile(node: isl.ScheduleNode, v: int, nr: int, vector_lanes: int) -> isl.ScheduleNode | None:
    """The band ``node`` under a sequence of two filters, the points whose vector member ``v`` lies in its
    whole tiles of ``nr`` and those in its last, partial tile (index set splitting), when that tile's row takes
    more registers than a full tile's (:func:`~.tiling.row_registers`: 55 columns as 32 + 23, the 23 as 16 + 4 + 2 +
    1 with AVX-512), so each part gets the rows its own register tile fits (:func:`~.tiling.register_tile_sizes` with
    its own width). None when there is nothing to split. Legal for a coincident ``v``: no dependence between
    the parts. Measured (1 thread, this Zen 5 host, AVX-512): a 3x3 convolution 16 -> 64 channels at 55x55
    kept 8 rows for the 23 columns, 32 accumulators, and spilled: 0.415 ms, onnxruntime 0.24."""
    lo, hi = band_ranges(node)[v]
    cut = (hi + 1) // nr * nr
    if cut <= lo or cut > hi or row_registers(hi + 1 - cut, vector_lanes) <= row_registers(nr, vector_lanes):
        return None
    member = isl.UnionMap.from_union_pw_aff(node.band_get_partial_schedule().get_union_pw_aff(v))
    domain = node.get_domain()
    whole = member.intersect_range(isl.UnionSet(f"{{ [x] : x < {cut} }}")).domain().intersect(domain)
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, 2).add(whole).add(domain.subtract(whole))
    return node.insert_sequence(filters)


# ---- step 6: packing (promotion) ----------------------------------------------------------------------

def mark_parallel(node: isl.ScheduleNode, hint: isl.Set | None = None) -> isl.ScheduleNode:
    """Mark the outermost loop the band really generates ``parallel`` — if it is coincident.

    isl's AST generator emits no loop for a member with a single value (one tile, or extent 1), and a mark
    applies to the first loop below it, so the mark goes right above the first member with more than one
    value; when that member carries a dependence (a reduction tile), nothing is marked. ``hint``: a generic
    kernel's :attr:`Scop.hint`, the sizes the extents are taken at.
    """
    top = node
    while node.get_type() == isl.schedule_node_type.band:
        extents = band_extents(node, hint)
        first = next((k for k, e in enumerate(extents) if e > 1), None)
        if first is None:  # a band of single tiles: its loops are the point loops below
            node = node.child(0)
            continue
        if not band_coincident(node)[first]:
            break
        depth = node.get_schedule_depth() + first
        if node.band_n_member() > first + 1:
            node = band_split(node, first + 1)
        if hint is not None and first > 0:  # a generic kernel: the members before still run loops over sizes
            node = band_split(node, first).child(0)  # (N = 1 at the hint), so the mark goes right above its own
        # the mark names the schedule dimension it parallelizes (isl calls its loop c<depth>): where isl
        # splits the band into pieces and one piece has a single value there, the loop below in that piece
        # is another dimension, which codegen then keeps sequential
        return insert_mark(node, mark_name("parallel", depth)).parent()
    return top


def choose_reduction_member(node: isl.ScheduleNode, stmt: PolyStatement, scop: Scop) -> int | None:
    """The innermost non-coincident member along which ``stmt`` is a vectorizable reduction: a reduction
    operator, an index absent from the left-hand side, reads of stride 0..MAX_READ_STRIDE (one at least
    moving), and no read of the reduced tensor. Codegen keeps one partial result per vector lane."""
    if stmt.op not in ("+=", "*=", "max=", "min=") or scop.tensor(stmt.tensor).dtype == "bool":
        return None
    if any(a.tensor == stmt.tensor for a in accesses_in(stmt.rhs)):
        return None
    coincident = band_coincident(node)
    found = None
    for k in range(node.band_n_member()):
        index = member_index(node, k, stmt)
        if coincident[k] or index is None or index in stmt.lhs:
            continue
        _, reads = access_strides(stmt, scop, index)
        if reads and all(r is not None and 0 <= r <= MAX_READ_STRIDE for r in reads) and any(reads):
            found = k
    return found


def _vector_innermost(point: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Mark the last member of the point band ``vector`` (a reduction along it, or a streamed row). When
    statements branch below (an initialisation beside the reduction), the member is first sunk into each
    statement (``band_sink``) so the marked loop holds the reduction alone."""
    if point.band_n_member() > 1:
        point = band_split(point, point.band_n_member() - 1).child(0)
    path = path_of(point)
    if not branches_below(point):
        return insert_mark(point, "vector")
    schedule = band_sink(point, deps).get_schedule()
    for leaf in reversed(_leaf_bands(node_at(schedule, path), 1)):
        schedule = insert_mark(node_at(schedule, leaf), "vector").get_schedule()
    return node_at(schedule, path)


def _point_loops(point: isl.ScheduleNode, n_p: int, has_u: bool, n_r: int, mr: int, nr: int, deps: isl.UnionMap,
                 hint: isl.Set | None = None):
    """Register-tile and mark the point band ``[P, u, v, R]`` (steps 4 and 5); returns a node of the tree."""
    node = point
    if n_p:
        node = band_split(node, n_p).child(0)  # [u, v, R]
    width = 1 + int(has_u)
    if n_r:
        node = band_split(node, width)  # [u, v] over [R]
    node = isolate_full_tiles(band_tile(node, [mr, nr] if has_u else [nr]), hint=hint)
    inner = node.child(0)  # [ur, vr]
    inner_path = path_of(inner)
    # distribute the loops below [ur, vr] (the reduction band and any band isl nested under the outer one,
    # also under a sequence) over the statements, then sink [ur, vr] itself: every statement ends with its
    # own copy of the loops in the original order, then ur, vr (the whole is checked; sets below are
    # ordered first, see band_sink)
    pending = dependences_at(inner, deps)
    below = distribute_bands(order_sets(inner, pending).child(0))
    inner = node_at(below.get_schedule(), inner_path).band_sink()
    check_subtree(inner, pending, "register tile (band_sink)")
    schedule = inner.get_schedule()
    leaves = _leaf_bands(node_at(schedule, inner_path), width)
    # full tiles again, now that the point bands sit below the reduction loops: a tile is full only when it
    # is for every value of those loops (a window loop near a padded border shortens the vector loop)
    # ([u] over [v], each isolating its own member: see step 5 of the module doc)
    tile_path = inner_path[:-1]
    if width == 2:
        schedule = band_split(node_at(schedule, tile_path), 1).get_schedule()
        at = len(tile_path)
        leaves = [leaf[:at] + (0,) + leaf[at:] for leaf in leaves]
        for path, member in ((tile_path, 0), (tile_path + (0,), 1)):
            schedule = isolate_full_tiles(node_at(schedule, path), [node_at(schedule, leaf) for leaf in leaves],
                                          members=[member], hint=hint).get_schedule()
    else:
        schedule = isolate_full_tiles(node_at(schedule, tile_path), [node_at(schedule, leaf) for leaf in leaves],
                                      hint=hint).get_schedule()
    for leaf in reversed(leaves):
        band = node_at(schedule, leaf)
        if width == 2:
            band = insert_mark(band_split(band, 1), "unroll").child(0)
        schedule = insert_mark(band, "vector").get_schedule()
    return node_at(schedule, tile_path)


def _leaf_bands(top: isl.ScheduleNode, width: int | None) -> list[tuple[int, ...]]:
    """Paths of the bands of ``width`` members (None: any) below ``top`` that have no band below them (the
    sunk register-tile bands)."""
    found = []

    def has_band_below(node):
        return any(node.child(k).get_type() == isl.schedule_node_type.band or has_band_below(node.child(k))
                   for k in range(node.n_children()))

    def visit(node):
        if node.get_type() == isl.schedule_node_type.band and width in (None, node.band_n_member()) \
                and not has_band_below(node):
            found.append(path_of(node))
            return
        for k in range(node.n_children()):
            visit(node.child(k))

    visit(top)
    return found
