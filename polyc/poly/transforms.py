"""Schedule-tree transforms, each a pure function on isl schedule nodes, named as in the field.

Every transform takes a node and returns the node at the same position of the new (immutable) tree.
"""
from __future__ import annotations

import islpy as isl

from .affine import isl_name
from .verify import check_subtree

from .marks import MARKS  # noqa: F401  (re-exported: the mark kinds insert_mark writes)


def band_tile(node: isl.ScheduleNode, sizes: list[int]) -> isl.ScheduleNode:
    """Tile a permutable band: ``[{ S[i, j] -> [(i)] }, { S[i, j] -> [(j)] }]`` with sizes ``(32, 32)``
    becomes a tile band ``[{ S[i, j] -> [(32*floor(i/32))] }, ...]`` over a point band
    ``[{ S[i, j] -> [(i)] }, ...]`` (``isl_schedule_node_band_tile``; isl's default ``tile_shift_point_loops``
    keeps point loops starting at the tile origin). Returns the tile band node."""
    space = node.band_get_space()
    mv = isl.MultiVal.zero(space)
    for k, size in enumerate(sizes):
        mv = mv.set_val(k, isl.Val.int_from_si(isl.DEFAULT_CONTEXT, int(size)))
    return node.band_tile(mv)


def band_split(node: isl.ScheduleNode, pos: int) -> isl.ScheduleNode:
    """Split a band after its first ``pos`` members (``isl_schedule_node_band_split``): the outer band keeps
    members ``[0, pos)``, its child band the rest. Returns the outer band."""
    return node.band_split(pos)


def insert_mark(node: isl.ScheduleNode, name: str) -> isl.ScheduleNode:
    """Insert a mark named ``name`` (one of :data:`MARKS`) above ``node`` (``isl_schedule_node_insert_mark``);
    returns the node below the mark (the marked node)."""
    marked = node.insert_mark(isl.Id.read_from_str(isl.DEFAULT_CONTEXT, name))
    return marked.child(0)


def band_coincident(node: isl.ScheduleNode) -> list[bool]:
    """Coincidence of each member of a band (a coincident member carries no dependence)."""
    return [bool(node.band_member_get_coincident(k)) for k in range(node.band_n_member())]


def band_ranges(node: isl.ScheduleNode, hint: isl.Set | None = None) -> list[tuple[int, int]]:
    """The least and greatest value of each band member over the band's domain (``(0, -1)`` when the domain
    is empty). ``hint``: a generic kernel's parameters fixed to their hint values (:attr:`Scop.hint`), the
    sizes the ranges are taken at."""
    ranges = []
    partial = node.band_get_partial_schedule_union_map()
    domain = node.get_domain()
    if hint is not None:
        domain = domain.intersect_params(hint)
    image = partial.intersect_domain(domain).range()
    as_set = isl.Set.from_union_set(image) if not image.is_empty() else None
    for k in range(node.band_n_member()):
        if as_set is None:
            ranges.append((0, -1))
            continue
        projected = as_set.project_out(isl.dim_type.set, k + 1, as_set.dim(isl.dim_type.set) - k - 1)
        projected = projected.project_out(isl.dim_type.set, 0, k)
        lo = projected.lexmin().sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()
        hi = projected.lexmax().sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()
        ranges.append((int(lo), int(hi)))
    return ranges


def band_extents(node: isl.ScheduleNode, hint: isl.Set | None = None) -> list[int]:
    """The number of distinct values of each band member over the band's domain (an upper bound; ``hint``
    as for :func:`band_ranges`)."""
    return [hi - lo + 1 for lo, hi in band_ranges(node, hint)]


def single_tile(node: isl.ScheduleNode, sizes: list[int], hint: isl.Set | None = None) -> bool:
    """Whether :func:`band_tile` with ``sizes`` would give one tile: every member's values lie in one tile
    ``[size * t, size * (t + 1))``. Such a tile band has one iteration, yet its ``floor`` expressions cost isl's
    AST builder and LLVM time (a 10-statement attention kernel: 0.5 s of AST building, a third of its compile)."""
    if hint is not None:  # a generic kernel: whether one tile holds every size it serves is not known
        return False
    return all(lo // size == hi // size for (lo, hi), size in zip(band_ranges(node), sizes))


def bands(schedule: isl.Schedule) -> list[isl.ScheduleNode]:
    """The outermost band nodes of the tree (bands with no band above them), in tree order."""
    found: list[isl.ScheduleNode] = []

    def visit(node: isl.ScheduleNode):
        if node.get_type() == isl.schedule_node_type.band:
            found.append(node)
            return
        for k in range(node.n_children()):
            visit(node.child(k))

    visit(schedule.get_root())
    return found


def band_permute(node: isl.ScheduleNode, order: list[int]) -> isl.ScheduleNode:
    """Reorder the members of a permutable band: member ``order[j]`` becomes member ``j``.

    ``[{ S[m,n,k] -> [(m)] }, { S[m,n,k] -> [(n)] }, { S[m,n,k] -> [(k)] }]`` with ``order = [2, 0, 1]``
    becomes ``[{ ... -> [(k)] }, { ... -> [(m)] }, { ... -> [(n)] }]``. Legal for any order because the band
    is permutable (checked). Coincidence flags move with their members.
    """
    if not node.band_get_permutable() and order != sorted(order):
        raise ValueError("only a permutable band can be permuted")
    if order == list(range(node.band_n_member())):
        return node
    mupa = node.band_get_partial_schedule()
    coincident = band_coincident(node)
    upas = isl.UnionPwAffList.alloc(isl.DEFAULT_CONTEXT, len(order))
    for k in order:
        upas = upas.add(mupa.get_at(k))
    space = mupa.get_space()
    new = isl.MultiUnionPwAff.from_union_pw_aff_list(space, upas)
    node = node.delete().insert_partial_schedule(new)
    node = node.band_set_permutable(1)
    for j, k in enumerate(order):
        node = node.band_member_set_coincident(j, int(coincident[k]))
    return node


def member_index(node: isl.ScheduleNode, member: int, stmt) -> str | None:
    """The index of statement ``stmt`` that band member ``member`` schedules as itself (``{ S[i, j] -> [(j)] }``
    gives ``"j"``), or ``None`` when the member is another function of the indices or does not cover ``stmt``."""
    upa = node.band_get_partial_schedule().get_at(member)
    umap = isl.UnionMap.from_union_pw_aff(upa)
    found = []
    umap.foreach_map(lambda m: found.append(m) if m.get_tuple_name(isl.dim_type.in_) == stmt.name else None)
    if not found:
        return None
    m = found[0].intersect_domain(stmt.domain)
    names = list(stmt.indices)
    dims = ", ".join(isl_name(n) for n in names)
    for n in names:
        candidate = isl.Map(f"{{ {stmt.name}[{dims}] -> [{isl_name(n)}] }}").intersect_domain(stmt.domain)
        if candidate.is_equal(m):
            return n
    return None


#: :func:`isolate_full_tiles` replaces an isolated set of at most this many pieces by its convex hull.
HULL_MAX_PIECES = 4


def isolate_full_tiles(tile: isl.ScheduleNode, points=None, members=None,
                       hint: isl.Set | None = None) -> isl.ScheduleNode:
    """Ask the AST generator to emit full tiles of ``tile`` separately (the ``isolate`` AST build option,
    as PPCG's ``--isolate-full-tiles``): in the isolated part every point loop runs its whole tile size, so
    its bounds are constants (no ``min``/``max``) and unrolled copies need no guard.

    ``points`` are the point bands of the tile (default: ``tile``'s child). A point band may sit deeper, below
    other loops (the register tile's point band sunk below the reduction loops): a tile is then full when the
    point band's whole box ``[0, size)`` is in the domain *for every value* of the loops in between — a
    convolution's window loops, whose bounds near a zero-padded border shorten the vector loop of the border
    tile only. The isolated set is ``{ isolate[[outer] -> [tile]] }``: the values of the enclosing schedule
    dimensions and of ``tile``'s members for which that holds for every point band. ``members`` (default:
    all) are the point band members that must be full; the others count as loops in between (a band of the
    vector tile alone asks for whole vectors for every row of the register tile). Returns the tile band node.

    Over parameters (a generic kernel; ``hint``: :attr:`Scop.hint`) the convex hull of a few pieces can take
    isl minutes; the isolated set is then the piece holding the most tiles at the hint sizes (the interior),
    the other full tiles join the partial ones.
    """
    points = [tile.child(0)] if points is None else list(points)
    n_tile = tile.band_n_member()
    n_keep = tile.get_schedule_depth() + n_tile  # (outer, tile) dimensions of a point band's prefix
    seen, bad = None, None
    for point in points:
        if point.get_type() != isl.schedule_node_type.band:
            return tile
        domain = point.get_domain()
        prefix = point.get_prefix_schedule_union_map().intersect_domain(domain)
        inner = point.band_get_partial_schedule_union_map().intersect_domain(domain)
        image = prefix.range_product(inner).range()
        if image.is_empty():
            continue
        pairs = isl.Set.from_union_set(image).unwrap()  # { [outer, tile, between] -> [point] }
        n_point = point.band_n_member()
        if members is not None:  # point members that need not be full join the loops in between
            keep = sorted(members)
            order = [k for k in range(n_point) if k not in keep] + keep
            moved = isl.Map(f"{{ [{', '.join(f'p{k}' for k in range(n_point))}] -> "
                            f"[{', '.join(f'p{k}' for k in order)}] }}")
            n_in = pairs.dim(isl.dim_type.in_)
            flat = pairs.apply_range(moved).wrap().flatten()
            pairs = isl.Map.from_range(flat).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0,
                                                       n_in + n_point - len(keep))
            n_point = len(keep)
        sizes = []
        for k in range(n_point):
            values = pairs.range().project_out(isl.dim_type.set, k + 1, n_point - k - 1).project_out(
                isl.dim_type.set, 0, k)
            values = values.project_out(isl.dim_type.param, 0, values.dim(isl.dim_type.param))  # any size
            sizes.append(int(values.lexmax().sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()) + 1)
        box_text = ", ".join(f"p{k}" for k in range(n_point))
        box = isl.Set(f"{{ [{box_text}] : " + " and ".join(f"0 <= p{k} < {s}" for k, s in enumerate(sizes)) + " }")
        domain = pairs.domain()
        missing = isl.Map.from_domain_and_range(domain, box).subtract(pairs).domain()
        between = domain.dim(isl.dim_type.set) - n_keep
        domain = domain.project_out(isl.dim_type.set, n_keep, between)
        missing = missing.project_out(isl.dim_type.set, n_keep, between)
        seen = domain if seen is None else seen.union(domain)
        bad = missing if bad is None else bad.union(missing)
    if seen is None:
        return tile
    full = seen.subtract(bad).coalesce()
    if full.is_empty():
        return tile
    if full.n_basic_set() > 1 and full.dim(isl.dim_type.param) and hint is not None:
        pieces = full.get_basic_sets()
        counts = [int(isl.Set.from_basic_set(p).intersect_params(hint).count_val().to_python()) for p in pieces]
        full = isl.Set.from_basic_set(pieces[counts.index(max(counts))])
    elif 1 < full.n_basic_set() <= HULL_MAX_PIECES and not full.dim(isl.dim_type.param):
        # isl's AST generator isolates the (unshifted simple) hull of the isolated set: a union such as
        # "c6 <= 224, or c6 <= 192 in the last tile of c2" (an extent that is not a multiple of the tile) would
        # widen to every tile, and no full tile would be separated. Its convex hull ("c2 + c6 <= 968") is
        # often exact on the tiles' lattice: use it when it holds no tile that is not full. isl's convex hull
        # grows with the pieces and their constraints (a 5-statement fuzz program's union of dozens of
        # pieces did not finish in minutes): past HULL_MAX_PIECES the union stays as it is.
        hull = isl.Set.from_basic_set(full.convex_hull())
        if hull.intersect(bad).is_empty():
            full = hull
    option = isl.Map.from_range(full).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, n_keep - n_tile)
    option = option.wrap().set_tuple_name("isolate")
    return tile.band_set_ast_build_options(isl.UnionSet.from_set(option))


def dependences_at(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.UnionMap:
    """The dependences of ``deps`` (``isl.UnionMap``, instance → instance) between instances that reach
    ``node`` and that the bands above it leave unordered: equal prefix schedules
    (``isl_schedule_node_get_prefix_schedule_multi_union_pw_aff``, then
    ``isl_union_map_eq_at_multi_union_pw_aff``). Only these can the subtree of ``node`` break."""
    domain = node.get_domain()
    pending = deps.intersect_domain(domain).intersect_range(domain)
    prefix = node.get_prefix_schedule_multi_union_pw_aff()
    if prefix.dim(isl.dim_type.set):
        pending = pending.eq_at_multi_union_pw_aff(prefix)
    return pending


def order_sets(node: isl.ScheduleNode, pending: isl.UnionMap) -> isl.ScheduleNode:
    """Turn every ``set`` node in the subtree of ``node`` into a ``sequence`` whose children follow the
    dependences ``pending`` between them (a topological order; children no dependence relates keep their
    order). A ``set`` leaves the order of its children to the AST generator, which is right only while a
    band above orders every dependence between them; a transform that moves such a band below the set
    (``band_sink``) must first fix the order. Sets whose children depend on each other in a cycle stay sets
    (no sequence is right: moving the band below them is illegal). Returns the node at ``node``'s position.
    """
    path = path_of(node)
    todo = [path]
    schedule = node.get_schedule()
    while todo:
        here = node_at(schedule, todo.pop())
        if here.get_type() == isl.schedule_node_type.set:
            order = _dependence_order(here, pending)
            if order is not None:
                filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, len(order))
                for k in order:
                    filters = filters.add(here.child(k).filter_get_filter())
                here = here.insert_sequence(filters)
                schedule = here.get_schedule()
        todo += [path_of(here) + (k,) for k in range(here.n_children())]
    return node_at(schedule, path)


def _dependence_order(node: isl.ScheduleNode, pending: isl.UnionMap) -> list[int] | None:
    """The children of the set ``node`` in an order every dependence of ``pending`` between them follows
    (Kahn's algorithm, earliest child first), or None when they depend on each other in a cycle."""
    filters = [node.child(k).filter_get_filter() for k in range(node.n_children())]
    after = {k: {j for j, g in enumerate(filters) if j != k and
                 not pending.intersect_domain(f).intersect_range(g).is_empty()}
             for k, f in enumerate(filters)}
    order, left = [], set(range(len(filters)))
    while left:
        ready = [k for k in sorted(left) if not any(k in after[j] for j in left)]
        if not ready:
            return None
        order.append(ready[0])
        left.remove(ready[0])
    return order


def band_sink(node: isl.ScheduleNode, deps: isl.UnionMap) -> isl.ScheduleNode:
    """Sink the band ``node`` to the leaves of its subtree (``isl_schedule_node_band_sink``: loop
    distribution over the sequences below, and interchange with the bands below), keeping every dependence
    of ``deps``: sets below are first ordered by the dependences (:func:`order_sets`), and the result is
    checked against the dependences the band ordered (:func:`polyc.poly.verify.check_subtree`). Raises
    CompileError when the sink would break one (a sequence below running a dependence the band carried
    backwards, a cycle between set children, an interchange with a band that runs one backwards).
    Returns the node at ``node``'s position."""
    pending = dependences_at(node, deps)
    node = order_sets(node, pending)
    sunk = node.band_sink()
    check_subtree(sunk, pending, "band_sink")
    return sunk


def distribute_bands(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Loop distribution of the whole subtree of ``node``: every sequence and set moves above every band,
    and below the last of them each leaf keeps the bands of its root-to-leaf path in their original order
    (so a chain ``[r0]`` over a sequence whose first branch holds ``[r1] [r2]`` becomes, for that branch's
    statements, ``[r0] [r1] [r2]``: isl's ``band_sink`` alone would leave ``[r1] [r2] [r0]``). Bottom up:
    each band with a branch below is sunk (``isl_schedule_node_band_sink``) to the bottom of the chains of
    bands under the branches, then rotated to the top of each chain by sinking the chain's bands once
    each. The caller checks the dependences (as for :func:`band_sink`; sets below should be ordered first,
    :func:`order_sets`). Returns the node at ``node``'s position."""
    path = path_of(node)
    schedule = node.get_schedule()
    for here in reversed(_preorder_bands(node)):  # deepest first: the subtree below each is done
        band = node_at(schedule, here)
        if not branches_below(band):
            continue
        at = len(here)  # the band's child takes its place: paths below lose one step
        chains = [(top[:at] + top[at + 1:], length) for top, length in _bottom_chains(band.child(0))]
        schedule = band.band_sink().get_schedule()
        for top, length in chains:  # the sunk copy is last in each chain: the chain's bands go below it
            for _ in range(length):
                schedule = node_at(schedule, top).band_sink().get_schedule()
    return node_at(schedule, path)


def _preorder_bands(node: isl.ScheduleNode) -> list[tuple[int, ...]]:
    """Paths of the bands in the subtree of ``node``, ``node`` included, in pre-order."""
    found = [path_of(node)] if node.get_type() == isl.schedule_node_type.band else []
    for k in range(node.n_children()):
        found += _preorder_bands(node.child(k))
    return found


def branches_below(node: isl.ScheduleNode) -> bool:
    """Whether the subtree below ``node`` holds a sequence or set."""
    kinds = (isl.schedule_node_type.sequence, isl.schedule_node_type.set)
    return any(node.child(k).get_type() in kinds or branches_below(node.child(k))
               for k in range(node.n_children()))


def _bottom_chains(node: isl.ScheduleNode) -> list[tuple[tuple[int, ...], int]]:
    """The chains of bands below the last sequence or set of each path of the subtree of ``node``: the path
    of each chain's first band and its number of bands (chains without a band are left out)."""
    if not branches_below(node) and node.get_type() not in (isl.schedule_node_type.sequence,
                                                              isl.schedule_node_type.set):
        first, count, here = None, 0, node
        while here.n_children():
            if here.get_type() == isl.schedule_node_type.band:
                first, count = first or path_of(here), count + 1
            here = here.child(0)
        return [(first, count)] if count else []
    return [chain for k in range(node.n_children()) for chain in _bottom_chains(node.child(k))]


def path_of(node: isl.ScheduleNode) -> tuple[int, ...]:
    """The child positions leading from the root to ``node``."""
    path = []
    while node.has_parent():
        path.append(node.get_child_position())
        node = node.parent()
    return tuple(reversed(path))


def node_at(schedule: isl.Schedule, path: tuple[int, ...]) -> isl.ScheduleNode:
    """The node of ``schedule`` at ``path`` (see :func:`path_of`)."""
    node = schedule.get_root()
    for k in path:
        node = node.child(k)
    return node


def serialized_member(node: isl.ScheduleNode) -> int | None:
    """The first non-coincident member ``k > 0`` of band ``node`` along which isl only *serializes* loops:
    at least two statements run several values of it (two loops), and no statement's values interleave with
    another's for equal outer members (a value of one strictly between two values of the other; statements
    over the very same values, one fused loop, are distributed too: under the outer members a loop covers
    one row). isl's scheduler fuses, say, a softmax's max, exp and sum over a row into one member by shifting each next
    loop past the previous one (``r0``, ``499 + i3``, ``499 + r0``): one loop whose iterations run one
    statement or another, with guards, where distributing the member gives one plain loop per statement
    under the shared outer members. None when the band has no such member."""
    n = node.band_n_member()
    coincident = band_coincident(node)
    k = next((m for m in range(1, n) if not coincident[m]), None)
    if k is None:
        return None
    domain = node.get_domain()
    partial = node.band_get_partial_schedule_union_map().intersect_domain(domain)
    maps, ranges = [], []  # per statement: { [outer members] -> [member k] }
    partial.foreach_map(maps.append)
    for m in maps:
        image = m.range().project_out(isl.dim_type.set, k + 1, n - k - 1)
        as_map = isl.Map.from_range(image).move_dims(isl.dim_type.in_, 0, isl.dim_type.out, 0, k)
        if not as_map.range().is_singleton() and not as_map.is_single_valued():
            ranges.append(as_map)
    if len(ranges) < 2:
        return None
    between = isl.Set("{ [a, b, c] : a < b < c }")
    for s in ranges:
        for t in ranges:
            if s is t or s.is_equal(t):  # one loop fused over the same values: distributed as well
                continue
            if not s.flat_range_product(t).flat_range_product(s).intersect_range(between).is_empty():
                return None
    return k


def distribute_serialized(node: isl.ScheduleNode) -> isl.ScheduleNode:
    """Band ``node`` with the members from :func:`serialized_member` on split off and sunk to the leaves
    below (``isl_schedule_node_band_split``, ``isl_schedule_node_band_sink``): each statement gets its own
    loops in the order of the sequence below. Returns the (outer) band node; ``node`` itself when there is
    nothing to distribute. The caller checks the result against the dependences."""
    k = serialized_member(node)
    if k is None:
        return node
    path = path_of(node)
    inner = band_split(node, k).child(0)
    return node_at(inner.band_sink().get_schedule(), path)


def fuse_next_sibling(band: isl.ScheduleNode, hint: isl.Set | None = None) -> isl.ScheduleNode:
    """Fuse the outer loops of ``band`` with those of the band of its next sibling in a sequence: when
    ``band`` (``k`` members) sits under a two-child sequence's first filter and the second holds a band
    whose first ``k`` members have the same extents, the ``k`` members of both move into one band above the sequence
    (``isl_schedule_node_insert_partial_schedule`` of their union; the originals deleted or split,
    ``isl_schedule_node_delete``, ``isl_schedule_node_band_split``). A softmax's division then runs on each
    row right after the row's sums, while the row is in cache. Returns the new band node, or ``band`` when
    there is nothing to fuse. The caller checks the result against the dependences. ``hint``: as for
    :func:`band_ranges`."""
    k = band.band_n_member()
    filt = band.parent()
    if filt.get_type() != isl.schedule_node_type.filter or not filt.has_parent() \
            or filt.parent().get_type() != isl.schedule_node_type.sequence:
        return band
    seq, pos = filt.parent(), filt.get_child_position()
    if pos + 1 >= seq.n_children():
        return band
    other = seq.child(pos + 1).child(0)
    if other.get_type() != isl.schedule_node_type.band or other.band_n_member() < k \
            or band_extents(other, hint)[:k] != band_extents(band, hint) \
            or band_coincident(other)[:k] != band_coincident(band):
        return band
    if seq.n_children() != 2:
        return band
    mine = band.band_get_partial_schedule()
    theirs = (band_split(other, k) if other.band_n_member() > k else other).band_get_partial_schedule()
    union = mine.union_add(theirs)
    seq_path = path_of(seq)
    # drop the k members below: the band itself, and the first k members of the sibling's band
    schedule = band.delete().get_schedule()
    node = node_at(schedule, seq_path + (pos + 1, 0))
    if other.band_n_member() > k:
        node = band_split(node, k)
    schedule = node.delete().get_schedule()
    fused = node_at(schedule, seq_path).insert_partial_schedule(union)
    for m, c in enumerate(band_coincident(band)):
        fused = fused.band_member_set_coincident(m, c)
    return fused.band_set_permutable(1)
