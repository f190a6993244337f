"""Step 6 of the CPU strategy (:mod:`polyc.poly.strategy`): which read to pack into panels, and in which layout.

:func:`choose_packing` picks the read of a register-tiled statement worth copying into a panel-major buffer
(GotoBLAS's packed ``B``; a convolution's filter block), :func:`choose_row_packing` a broadcast
operand worth packing in slivers of the register tile's rows (GotoBLAS's packed ``A``), :func:`band_packings`
both for one band; :func:`packed_order` lays the packed panel's other dimensions out in the order the
kernel's loops run them (:func:`loop_order`). :mod:`polyc.poly.promote` carries the decisions out.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import islpy as isl

from ..lang import ast as L
from .affine import accesses_in, element_stride
from .scop import PolyStatement, Scop
from .transforms import member_index


#: Pack a read when a step of one of its reduction indices jumps at least this many bytes in it (a page: each
#: step of the micro-kernel's loop would touch a new page and, for power-of-two rows, the same cache sets).
PACK_MIN_ROW_BYTES = 4096

#: ... or a multiple of this many: such a step folds the read onto two of the 64 sets of an x86 L1D (its ways
#: are 4 KiB: virtually indexed, physically tagged), whose 2 x ways lines hold a few steps of a register tile's
#: reduction loop, so its panel misses L1 at every step. An AVX2 SGEMM of 512^3 (B's rows 2 KiB apart) ran 3.2-3.6
#: ms unpacked and 2.5 packed (OpenBLAS's 2.5-2.6; 1 thread, Zen 4); AVX-512 level either way. A step of 1.5 KiB
#: (8 sets, 384^3) ran as fast unpacked.
PACK_ALIASING_BYTES = 2048

#: ... and when each packed panel is reused by at least this many register-tile rows.
PACK_MIN_REUSE = 4

#: A statement with a single reduction loop (a GEMM, a 1x1 convolution) whose register tile reads at most
#: :data:`PACK_MAX_STEP_READ` bytes of the operand a step also packs a read whose reduction step jumps at least
#: this many bytes (a new page every 8 steps or sooner: a panel of ``kc`` steps, unpacked, walks ``kc / 8``
#: pages or more and splits its vectors across lines where the rows are not whole lines apart) ...
PACK_MIN_STEP_BYTES = 512

#: ... a step of NR elements no wider than one cache line (AVX2's two 8-float vectors; AVX-512's two 16-float
#: vectors read two lines a step, and packing such reads measured 0.96-1.06x: SGEMM 128-320 1-4% slower,
#: 640-1000 2-6% faster, single 1x1 Conv nodes 0.97-1.01x) ...
PACK_MAX_STEP_READ = 64

#: ... when each panel is reused by at least this many register-tile rows: the copy is one more pass over the
#: operand, paid for by the rows' FMAs (DenseNet's 1x1 convolutions to 48 channels, 8 rows of tiles, lost 1-6%
#: packed). Measured (1 thread, Zen 4, packed against not, paired in one process): AVX2 SGEMM 384 / 640 / 768
#: 0.86 / 0.88 / 0.71 -> 1.02 / 1.09 / 0.99 of OpenBLAS's Haswell kernel, 256 0.94 -> 1.06, 320 0.86 -> 0.95,
#: 1000 0.76 -> 0.82; single NCHW 1x1 Conv nodes over 28x28 and 14x14 images (medians of three processes)
#: 1.04-1.20x faster (128 -> 512 at 28x28 1.20x, 1024 -> 512 at 14x14 level).
PACK_NEAR_MIN_REUSE = 16

#: A broadcast operand computed per call (not a constant) is packed in slivers of the register tile's rows
#: when those rows are adjacent elements (the read's last index) and a step of its single reduction index
#: jumps at least this many bytes (a cache line: each step reads MR elements from a new line, and a line of
#: an x86 L1D holds nothing the next step reads), with :data:`PACK_NEAR_MIN_REUSE` column tiles reading each
#: sliver: the flattened channels-last NCHW 1x1 convolution's ``X(c, p)`` (a step of ``c`` jumps the image,
#: 196 bytes at 7x7). Measured (Zen 4, packed against not, paired in one process; ResNet-50's three such
#: Conv nodes): 1 thread, AVX2 512 -> 2048 at 7x7 0.81 -> 0.85 of onnxruntime, 1x1/2 1024 -> 2048 0.88 -> 0.97,
#: 2048 -> 512 0.92 -> 0.95; AVX-512 0.89 -> 0.90, 0.97 -> 0.99, 0.97 -> 0.98; 2 threads level on average.
PACK_ROW_MIN_STEP_BYTES = 64


@dataclass(frozen=True)
class Packing:
    """Step 6's decision: copy read ``read`` of statement ``statement`` into a panel-major buffer.

    The read is ``T(a_1, ..., a_{p-1}, v)`` with plain indices, ``v`` the register tile's vector index
    (``index``). The buffer is ``T__p(v / block, a_1, ..., a_{p-1}, v % block)``: each panel of ``block``
    columns is contiguous, so the micro-kernel's reduction loops read ``block`` consecutive elements per step
    (GotoBLAS's packed B panel; a convolution's filter block). ``block`` is the register tile's width NR, and
    the vector loop's lanes never leave one block: its tiles start at multiples of NR.

    ``order`` puts the read's other dimensions (numbered without ``position``) in the order the kernel's loops
    run them (:func:`loop_order`), ``()`` when that is their own order: the 3x3 convolution channels-last
    ``W(c, kh, kw, m)`` whose loops run ``kh, c, kw`` (isl's order) is packed ``W__p(m / NR, kh, c, kw, m %
    NR)``, so each step of the reduction reads the next NR weights in memory, not three interleaved
    streams. Measured (1 thread, this Zen 5 host, weights packed and cold): 512 channels at 7x7 1.17 -> 1.08
    ms with AVX-512, 2.53 -> 2.31 with AVX2; 256 at 14x14 1.01 -> 0.95. ``position`` is the dimension of the
    read that ``index`` addresses, -1 for the last. Another one packs
    the read *transposed*: ``B(k, n)`` with ``index = k`` (position 0) becomes ``B__p(k / block, n, k %
    block)``, so a vector loop along ``k`` reads consecutive elements (:func:`choose_members`).
    """

    statement: str
    read: L.Access
    index: str
    block: int
    position: int = -1
    order: tuple = ()


def choose_packing(stmt: PolyStatement, scop: Scop, u_index: str | None, v_index: str | None, nr: int,
                   tile_v: int | None, reuse: int, force: bool = False,
                   constants: frozenset = frozenset()) -> Packing | None:
    """The read of ``stmt`` worth packing for a register tile over ``(u_index, v_index)`` of width ``nr``,
    or None. ``tile_v`` is the cache tile size of the vector member (None: not tiled), ``reuse`` how many
    register-tile rows read each panel. Chosen: an input tensor read with distinct plain indices (and
    integer literals: a 1x1 convolution's ``W(c, 0, 0, m)``), last ``v_index``, none ``u_index`` (every row
    of the register tile reads it), some reduction index, and in which a step of some reduction index jumps
    at least PACK_MIN_ROW_BYTES or a multiple of PACK_ALIASING_BYTES, or, in a statement with a single
    reduction loop and a step of at most PACK_MAX_STEP_READ bytes, at least PACK_MIN_STEP_BYTES with
    PACK_NEAR_MIN_REUSE rows. ``force`` drops the two thresholds (jump, reuse), not the conditions that make
    the layout correct; so does a read of a tensor in ``constants``, which the caller packs once (measured,
    1 thread: the BERT, GPT and ViT models of ``scripts/model_zoo.py`` 8-18% faster on AVX2 and AVX-512 with
    all their weights packed, ResNet-50 unchanged)."""
    if u_index is None or v_index is None or (tile_v is not None and tile_v % nr):
        return None
    if stmt.op not in ("+=", "*=", "max=", "min="):
        return None
    for read in accesses_in(stmt.rhs):
        tensor = scop.tensor(read.tensor)
        names = packable_names(read, stmt, scop)
        if names is None or not plain_index(read.args[-1]) or names[-1] != v_index or u_index in names:
            continue
        jump = jump_bytes(read, [i for i in names if i not in stmt.lhs], stmt, scop)
        far = jump >= PACK_MIN_ROW_BYTES or (jump > 0 and jump % PACK_ALIASING_BYTES == 0)
        single = len(stmt.reduction_indices) == 1
        near = (single and jump >= PACK_MIN_STEP_BYTES and reuse >= PACK_NEAR_MIN_REUSE
                and nr * L.itemsize(tensor.dtype) <= PACK_MAX_STEP_READ)
        if not (force or near or (tensor.name in constants and sole_read(scop, stmt.name, read))) and (
                reuse < PACK_MIN_REUSE or not far):
            continue
        return Packing(stmt.name, read, v_index, nr)
    return None


def band_packings(stmt: PolyStatement, scop: Scop, u_index: str, v_index: str, mr: int, nr: int, tile_v: int | None,
                  reuse: int, loops: list, force: bool, constants: frozenset, vector_operand: bool = True,
                  slivers: Packing | None = None) -> list:
    """Step 6 for a register tile ``mr x nr`` over ``(u_index, v_index)`` under loops running ``loops``
    (outermost first): the vector operand's packing (:func:`choose_packing`, unless ``vector_operand`` is
    False: the caller packs it transposed) and ``slivers``, the broadcast operand's (the caller's
    :func:`choose_row_packing`: the cache tiles depend on it), each laid out in loop order
    (:func:`packed_order`)."""
    found = []
    if vector_operand and stmt.reduction_indices:
        found.append(choose_packing(stmt, scop, u_index, v_index, nr, tile_v, reuse, force, constants))
    found.append(slivers)
    return [dataclasses.replace(p, order=packed_order(p.read, loops, p.position)) for p in found if p is not None]


def choose_row_packing(stmt: PolyStatement, scop: Scop, u_index: str | None, v_index: str | None, mr: int,
                       constants: frozenset, columns: int = 0) -> Packing | None:
    """The register tile's *broadcast* operand packed in slivers of its ``mr`` rows (GotoBLAS's packed ``A``),
    or None: a read of a tensor in ``constants`` (packed once, when the kernel is linked: no copy per call)
    with distinct plain indices and integer literals, ``u_index`` among them and ``v_index`` not, some
    reduction index, the only read of its tensor, whose rows (the steps of ``u_index``) are a whole number
    of pages (:data:`PACK_MIN_ROW_BYTES`, the way of an x86 L1D) apart; or any such read (copied per call
    unless constant) whose rows are adjacent and whose single reduction index steps a line or more
    (:data:`PACK_ROW_MIN_STEP_BYTES`), with ``columns`` (the register tiles along ``v_index``) at least
    :data:`PACK_NEAR_MIN_REUSE`. ``A(m, c)`` becomes ``A__p(m / MR, c, m % MR)``: each step of the reduction
    reads the tile's MR values side by side, one stream, where unpacked the MR rows fall into one L1 set. An
    NCHW 1x1 convolution's weights ``W(m, c, 0, 0)`` with 1024 or 2048 input channels (AVX2, 1 thread, Zen 4,
    ResNet-50's shapes, packed against not, 31 paired runs):
    1.04-1.10x at 1024 -> 256 and 1024 -> 512 at 14x14, 0.98-1.11x at 2048 -> 512 at 7x7; with AVX-512
    0.99-1.02x. Rows 2 KiB apart (two sets) measured both ways (512 -> 256 1.02-1.04x, 512 -> 2048
    0.92-1.06x), 1 KiB (256 -> 1024) 0.91-1.07x: not packed."""
    if u_index is None or v_index is None or mr < 2 or stmt.op not in ("+=", "*=", "max=", "min="):
        return None
    for read in accesses_in(stmt.rhs):
        names = packable_names(read, stmt, scop)
        if names is None or u_index not in names or v_index in names:
            continue
        position = next(d for d, a in enumerate(read.args) if plain_index(a) and a.name == u_index)
        jump = jump_bytes(read, [u_index], stmt, scop)
        pages = read.tensor in constants and sole_read(scop, stmt.name, read) and jump and not jump % PACK_MIN_ROW_BYTES
        reductions = stmt.reduction_indices
        lines = (position == len(read.args) - 1 and len(reductions) == 1 and columns >= PACK_NEAR_MIN_REUSE
                 and jump_bytes(read, reductions, stmt, scop) >= PACK_ROW_MIN_STEP_BYTES)
        if not (pages or lines):
            continue
        return Packing(stmt.name, read, u_index, mr, position)
    return None


def loop_order(node: isl.ScheduleNode, stmt: PolyStatement) -> list:
    """The indices of ``stmt`` that the bands at and below ``node`` schedule as themselves, outermost first,
    along the branch of the tree that holds ``stmt`` (a reduction band isl nested below the tiled one)."""
    found = []
    while node.get_type() != isl.schedule_node_type.leaf:
        if node.get_type() == isl.schedule_node_type.band:
            found += [member_index(node, k, stmt) for k in range(node.band_n_member())]
        if node.n_children() > 1:  # a sequence or set: the filter that holds the statement
            node = next((node.child(k) for k in range(node.n_children())
                         if not node.child(k).filter_get_filter().intersect(
                             isl.UnionSet.from_set(stmt.domain)).is_empty()), None)
            if node is None:
                break
        node = node.child(0)
    return [i for i in found if i is not None]


def packed_order(read: L.Access, loops: list, position: int = -1) -> tuple:
    """:attr:`Packing.order` for ``read`` packed along its dimension ``position`` (-1: the last, the vector
    one) under loops running the indices ``loops`` outermost first: the other dimensions sorted by their
    index's loop (an index no loop runs as itself among the outermost; an integer literal, a dimension of
    extent 1, stays after the dimension before it: a 1x1 convolution's ``W(c, 0, 0, m)`` keeps its layout),
    ``()`` when that changes nothing."""
    rank = {i: k for k, i in enumerate(loops)}
    others = [a for d, a in enumerate(read.args) if d != position % len(read.args)]
    keys, previous = [], -1
    for d, a in enumerate(others):
        previous = (rank.get(a.name, -1) if plain_index(a) else previous)
        keys.append((previous, d))
    order = tuple(d for _, d in sorted(keys))
    return () if order == tuple(range(len(others))) else order


def packable_names(read: L.Access, stmt: PolyStatement, scop: Scop) -> list | None:
    """The index names of ``read`` (of ``stmt``) when it can be copied into a packed layout that the register
    tile's rows reuse: a read of a tensor no statement writes, of two or more dimensions, each a plain index
    or an integer literal, the indices distinct and one of them a reduction index; else None."""
    if read.tensor in {s.tensor for s in scop.statements} or len(read.args) < 2 \
            or not all(plain_index(a) or constant_index(a) for a in read.args):
        return None
    names = [a.name for a in read.args if plain_index(a)]
    if len(set(names)) != len(names) or all(n in stmt.lhs for n in names):
        return None
    return names


def plain_index(arg: L.Expr) -> bool:
    """Whether ``arg`` is an index name on its own."""
    return isinstance(arg, L.Ident) and arg.kind == "index"


def constant_index(arg: L.Expr) -> bool:
    """Whether ``arg`` is an integer literal (a 1x1 convolution's window coordinate ``W(c, 0, 0, m)``)."""
    return isinstance(arg, L.Const) and isinstance(arg.value, int) and not isinstance(arg.value, bool)


def sole_read(scop: Scop, statement: str, read: L.Access) -> bool:
    """Whether ``read`` (of statement ``statement``) is the only read of its tensor in the whole Scop (no
    other statement reads it, and it is not read twice or inside an index): a constant input can then
    arrive packed instead of being copied (:func:`polyc.poly.promote.promote`)."""
    count = 0
    for stmt in scop.statements:
        for access in accesses_in(stmt.rhs):
            if access.tensor == read.tensor:
                count += 1
                if stmt.name != statement or access != read:
                    return False
    return count == 1


def jump_bytes(read: L.Access, indices, stmt: PolyStatement, scop: Scop) -> int:
    """The largest distance in bytes that one step of any of ``indices`` moves ``read`` (0: none affine)."""
    tensor = scop.tensor(read.tensor)
    return max((abs(element_stride(read.args, tensor.shape, i, stmt.indices, scop.sizes) or 0) for i in indices),
               default=0) * L.itemsize(tensor.dtype)
