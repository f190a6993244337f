"""Steps 2-3 of the CPU strategy (:mod:`polyc.poly.strategy`): the sizes, derived from the target.

:func:`register_tile_sizes` gives the register tile ``MR x NR`` from the vector width and register count and the
FMA pipes' latency; :func:`cache_tile_sizes` the cache tile of a reordered band from the L1 and L2 sizes and the
bytes a micro-kernel step reads (:func:`micro_step_bytes`); :func:`split_for_threads` makes one coincident
member's tiles small enough to keep every thread busy (:func:`thread_balance`). Pure functions of numbers and
of a statement's accesses: no schedule tree here.
"""
from __future__ import annotations

import math

from ..lang import ast as L
from ..options import Options
from .affine import accesses_in, element_stride
from .scop import PolyStatement, Scop


#: An x86 core's FMA pipes and their latency in cycles (Haswell to Zen 5).
FMA_PIPES, FMA_LATENCY = 2, 4

#: FMAs an x86 core keeps in flight: latency x throughput, the fewest independent accumulators that keep the FMA
#: pipes busy.
FMA_IN_FLIGHT = FMA_LATENCY * FMA_PIPES


def register_tile_sizes(options: Options, vector_lanes: int, vector_registers: int = 16,
                        width: int | None = None, reductions: int = 2, height: int | None = None) -> tuple[int, int]:
    """``(MR, NR)``: the option, else NR = two vectors (``2 * vector_lanes`` elements) and MR rows such that
    the ``MR x pieces`` accumulators take half the vector registers, the other half holding the vector
    operand's rows and the broadcasts the backend keeps in flight (LLVM unrolls a convolution's window loops
    and hoists their loads). ``pieces`` is the number of registers one row of a tile takes
    (:func:`row_registers`): 2 for a full tile (so MR = ``vector_registers // 4``: 4 rows on AVX2 with 16
    registers, 8 on AVX-512 with 32: at least the 8 independent accumulators that hide an FMA latency of 4
    cycles on 2 pipes), more when a vector member of extent ``width`` is narrower than NR, so its one tile is
    a partial one, which codegen runs as power-of-two pieces (28 float32 with 16 lanes: 16 + 8 + 4, three
    registers, so 5 rows on AVX-512). A wider member keeps the full tiles' MR for its last, partial tile as
    well (on AVX2, 55 columns as 16 + 16 + 16 + 7: 2 rows for the sake of the 7 made a 3x3 convolution 1.7x
    slower). Measured (1 thread, Zen 4, both ISAs): the fuller tiles ``(registers - 3) // 2`` (6, 14) spill
    and lose up to 2x on 3x3 convolutions, GEMM within a few percent; 8 rows of three pieces (64 channels at
    28x28) spill in the inner loop: 0.62 or 1.25 ms by where the stack falls, 5 rows 0.61 in every process.

    Where half the registers hold fewer than a quarter more accumulators than :data:`FMA_IN_FLIGHT` (AVX2's 4
    rows of 2 vectors: exactly 8, no slack for a late load), the rows grow to ``ceil(1.25 x FMA_IN_FLIGHT /
    pieces)`` as long as two rows of the vector operand and two more registers stay free: 5 rows on AVX2
    (10 accumulators, 13 of the 16 registers, no spill in the inner loop), unchanged on AVX-512. Measured (1
    thread, Zen 5, AVX2 code, 3x3 convolutions): 64 channels at 56x56 1.99 -> 1.89 ms, 128 at 28x28 1.94 ->
    1.82, 256 at 14x14 2.12 -> 1.80, 16 -> 64 at 55x55 0.54 -> 0.49, 512 at 7x7 unchanged (7 rows as 4 + 3).

    A statement with a single reduction loop (``reductions``: those of extent above 1; GEMM, a 1x1
    convolution) has no window loops whose unrolled loads hold registers: it takes rows for
    :data:`SINGLE_REDUCTION_IN_FLIGHT` times :data:`FMA_IN_FLIGHT` accumulators where the registers allow, the
    accumulators plus one row of the vector operand and one broadcast (``(registers - pieces - 1) //
    pieces``): 6 rows on AVX2 (12 accumulators, the registers' limit; 4 rows are 8, no slack for a late load),
    12 on AVX-512 (24 accumulators). Each vector of the operand the tile streams (the weights, read from L2
    when their slice outgrows L1) then feeds 12 FMAs instead of 8. Measured (1 thread, Intel Emerald Rapids:
    two full-width 512-bit FMA pipes, 175 GFLOP/s; weights packed and warm): ResNet-50's 1x1 1024 -> 256 at
    14x14 0.79 -> 0.67 ms, 256 -> 64 at 56x56 0.83 -> 0.74, 2048 -> 512 at 7x7 0.85 -> 0.70 (10 rows by
    the spread below); 1.5 x in-flight (8 rows) was the rule before, measured on Zen 4, whose AVX-512 runs
    on 256-bit pipes. Whole models paired in one process: ResNet-50 1.016x, GPT 1.03-1.045x, SqueezeNet,
    BERT, MobileNetV2, ShuffleNet 1.02-1.045x, the rest level.

    The rows are then spread evenly over the tiles of a row member of extent ``height``: ``ceil(height / n)``
    rows for its ``n = ceil(height / MR)`` tiles, so no tile is left with a row or two whose few accumulators
    wait on the FMA latency (a 1x1 convolution channels-last at 7x7: 7 rows as 4 + 3 instead of 6 + 1, whose
    one row of 2 accumulators took 2/3 of the time of a full tile for 1/6 of its work). Fewer rows are taken
    where their tiles fill the FMA pipes at least :data:`ROWS_MIN_GAIN` better (:func:`_fma_efficiency`) and
    still hold a quarter more accumulators than :data:`FMA_IN_FLIGHT`: AVX2's 55 pixels of a 1x1 convolution
    as 11 tiles of 5 rows instead of 9 of 6 and one of 1 (SqueezeNet's 55x55 layers, 16 -> 64 channels 0.062
    -> 0.057 ms, 128 -> 16 level; 1 thread, Zen 4).

    Last, where those tiles of two vectors leave the FMA pipes idle and three vectors of columns fill them at
    least :data:`WIDEN_MIN_GAIN` better (:func:`_fma_efficiency`), NR becomes three vectors: AVX2's 7 rows of
    a 1x1 convolution channels-last at 7x7 as 4 + 3 rows of 12 and 9 accumulators (three weight vectors and
    a broadcast beside them: all 16 registers) instead of 8 and 6 (87.5%: the 3-row tile waits on the FMA
    latency). Not without a reduction (no accumulators), nor for one row (a GEMV streams its weights:
    memory-bound), nor a 3x3 convolution on AVX2 (its 3-vector tile has 2 rows), nor a vector member
    narrower than three vectors; no kernel of the benchmark models changes on AVX-512. Measured (1 thread,
    Zen 4, AVX2 code, ResNet-50's layer-4 kernels alone, weights packed and warm): 512 -> 2048 channels 1.11
    -> 0.96 ms, 2048 -> 512 1.10 -> 1.00; in the model's profile its six such kernels 8.3 -> 7.5 ms of 81."""
    if options.register_tile_sizes:
        sizes = tuple(options.register_tile_sizes) + (2 * vector_lanes,)
        return sizes[0], sizes[1]
    rows = _tile_rows(2, vector_lanes, vector_registers, width, reductions, height)
    if reductions >= 1 and height is not None and 1 < height and (width is None or width >= 3 * vector_lanes):
        wide = _tile_rows(3, vector_lanes, vector_registers, width, reductions, height)
        if _fma_efficiency(wide, 3, height) >= WIDEN_MIN_GAIN * _fma_efficiency(rows, 2, height):
            return wide, 3 * vector_lanes
    return rows, 2 * vector_lanes


#: The accumulators :func:`register_tile_sizes` gives a statement with a single reduction loop (GEMM, a 1x1
#: convolution), in multiples of :data:`FMA_IN_FLIGHT`, where the registers allow.
SINGLE_REDUCTION_IN_FLIGHT = 3

KC_MAX = 512  #: :func:`cache_tile_sizes` grows a single reduction tile up to this depth while it fits in L1.

#: A micro-panel that is one stream (a step brings nothing but the vector operand's NR columns: the broadcast
#: operand is read along its own lines) may take this many times the L1d (:func:`cache_tile_sizes`).
KC_STREAM_L1D = 2

#: :func:`register_tile_sizes` takes three vectors of columns instead of two where that raises the estimated
#: FMA-pipe occupancy (:func:`_fma_efficiency`) by at least this factor.
WIDEN_MIN_GAIN = 1.1

#: :func:`_tile_rows` takes fewer rows than its rules give where that raises the estimated FMA-pipe occupancy
#: (:func:`_fma_efficiency`) by at least this factor: the slack of more accumulators than FMA_IN_FLIGHT, which
#: the estimate does not see, measured 5-15% (AVX2 3x3 convolutions, 4 -> 5 rows).
ROWS_MIN_GAIN = 1.05


def _tile_rows(vectors: int, vector_lanes: int, vector_registers: int, width, reductions: int, height) -> int:
    """The rows of :func:`register_tile_sizes`' tile of ``vectors`` vectors of columns (its rules, before
    the choice of the columns)."""
    nr = vectors * vector_lanes
    pieces = row_registers(nr, vector_lanes)
    if width is not None and width < nr:
        pieces = max(pieces, row_registers(width, vector_lanes))
    rows = max(vector_registers // 2 // pieces,
               min(-(-5 * FMA_IN_FLIGHT // 4 // pieces), (vector_registers - 2 * pieces - 2) // pieces))
    if reductions <= 1:
        wanted = -(-SINGLE_REDUCTION_IN_FLIGHT * FMA_IN_FLIGHT // pieces)
        rows = max(rows, min(wanted, (vector_registers - pieces - 1) // pieces))
    rows = max(1, rows)
    if height is None or height <= 0:
        return rows

    def spread(r):
        return -(-height // -(-height // r))
    # fewer rows where their tiles fill the FMA pipes ROWS_MIN_GAIN better and still hold a quarter more
    # accumulators than FMA_IN_FLIGHT: 55 pixels as 11 tiles of 5 instead of 9 of 6 and one of 1
    # (rows of whole vectors only: the estimate counts ``vectors`` accumulators a row)
    best = spread(rows)
    if pieces != vectors:
        return best
    enough = -(-5 * FMA_IN_FLIGHT // 4)
    for r in range(rows - 1, 0, -1):
        if r * pieces >= enough and _fma_efficiency(spread(r), vectors, height) >= \
                ROWS_MIN_GAIN * _fma_efficiency(best, vectors, height):
            best = spread(r)
    return best


def _fma_efficiency(rows: int, vectors: int, height: int) -> float:
    """The fraction of the FMA pipes' issue slots a row member of ``height`` rows fills in tiles of ``rows``
    x ``vectors`` accumulators: each reduction step of a tile of ``a`` accumulators takes ``max(a / pipes,
    latency)`` cycles (:data:`FMA_PIPES`, :data:`FMA_LATENCY`), the last tile holding the remainder."""
    full, last = divmod(height, rows)
    tiles = [rows] * full + ([last] if last else [])
    cycles = sum(max(r * vectors / FMA_PIPES, FMA_LATENCY) for r in tiles)
    return height * vectors / FMA_PIPES / cycles


def row_registers(width: int, vector_lanes: int) -> int:
    """The registers one row of ``width`` elements takes in codegen's vector loop
    (:func:`polyc.codegen.vector.emit_vector_for`): whole vectors, then one step of each narrower
    power-of-two width, the last element scalar."""
    return width // vector_lanes + bin(width % vector_lanes).count("1")


def cache_tile_sizes(order, u, v, coincident, extents, options: Options, target, mr: int, nr: int,
                     itemsize: int = 4, depth: int = 1, step_bytes: int = 0, n_threads: int = 1,
                     shared_panel: bool = False, dot: bool = False):
    """Tile sizes for the reordered band: the option, else ``u`` 16 x MR rows, ``v`` 256 columns (a multiple
    of NR), reductions 256 deep, other coincident members 8, none above its extent. Then the footprint of the
    operand that every register-tile row reuses (``v`` x the reduction tiles, GEMM's ``B`` block or a
    convolution's filter block) is fitted into half the target's L2 cache, first by narrowing ``v`` (down
    to NR), then by halving the deepest reduction tile: that block then stays in L2 while the point loops
    sweep the other members (GotoBLAS's ``kc x nc`` block). ``depth`` is the product of the extents of the
    reduction loops outside the band (a reduction band isl nested below it: they are not tiled).

    Last, ``u`` grows to the ``v`` tile (within its extent): the ``kc x nc`` block comes from L3 or memory
    once per ``u`` rows (the tile loop over ``u`` is outermost here; GotoBLAS keeps the block for all of M),
    and with at least ``nc`` rows the rows that stream past it bring at least as many bytes as it does, so
    its load is spread over ``u / MR`` register-tile rows instead of 16; but no further than ``1 /
    n_threads`` of the rows (a parallel kernel's threads each keep blocks of rows: 256 x 256 x 256 in one
    block ran 35% slower on two threads with AVX-512). Measured (1 thread, this Zen 5 host,
    B pre-packed, GFLOP/s, 96/128 -> 256 rows): SGEMM 2048 112 -> 125 with AVX2 (OpenBLAS, whose kernel here
    is its Haswell one, 128), 222 -> 238 with AVX-512; 1024 130 -> 126 and 252 -> 257; 256 unchanged; 512
    82 -> 134 with AVX2 (a data-placement effect the README's Tuning section describes).

    ``step_bytes`` (0: no such rule) is what one step of the reduction brings into L1 for one register tile
    (:func:`micro_step_bytes`) when the statement has a single reduction loop (GEMM, a 1x1 convolution): the
    broadcast operand's MR rows, which the next register tile of the same rows reads again, and the vector
    operand's NR columns. The reduction tile is then halved until a whole micro-kernel's worth, ``kc x
    step_bytes``, fits in the target's L1d (GotoBLAS sizes ``kc`` so the micro-panels stay in L1). Not with
    window loops (``depth`` > 1, a 3x3 convolution): 9 x MR x NR FMAs a step pay for re-reading the rows from
    L2, and 256 x 256 channels at 7x7 ran 5-9% slower with the 16 deep tile the rule gives. Measured (1
    thread, this Zen 5 host, AVX-512, L1d 48 KiB): a 1x1 convolution 512 -> 2048 channels at 7x7
    channels-last, whose 7 broadcast pixels per input channel sit 196 bytes apart (two lines per step with
    the weights' 128 bytes: 64 KiB at kc = 256), 0.53 ms at kc = 256, 0.46 at 128, 0.47 at 64 (onnxruntime
    0.43). The rule also grows the tile, before the L2 rule above, by doubling up to :data:`KC_MAX` while
    ``kc x step_bytes`` still fits, then splits the reduction into equal tiles (768 as 2 x 384): AVX2's GEMM
    steps bring 64 bytes (B's 16 columns), so kc = 512 halves the C tile's loads and stores and the restarts
    of the streamed B slivers. Measured (1 thread, Zen 4, L1d 32 KiB, AVX2, paired runs against OpenBLAS's
    Haswell kernel): SGEMM 2048 0.87-0.89 -> 0.91-0.95, 1024 0.93 -> 0.96; AVX-512 (128 bytes a step) keeps
    256 on this L1; whole models (BERT, GPT, ViT, ResNet-50, MobileNetV2) level on both (0.99-1.01).
    A micro-panel that is one stream (a step brings nothing but the vector operand's NR columns, ``step_bytes
    <= NR x itemsize``: GEMM's ``B`` sliver beside ``A`` read along its rows) may take :data:`KC_STREAM_L1D`
    times the L1d: the L2 prefetcher keeps one stream ahead of the FMAs (BLIS's Skylake-X configurations have
    micro-kernels whose B panel streams from L2 likewise), and the deeper tile halves the passes that reload
    and store the C tile. AVX-512's 128-byte step gets kc = 512 on a 48 KiB L1d (256 before); AVX2's 64-byte
    step was at :data:`KC_MAX` already. Measured (Intel Emerald Rapids, two full-width FMA pipes: a step of
    12 x 2 vectors takes 12 cycles; paired in one process against OpenBLAS's SkylakeX kernel): SGEMM 1024
    0.70-0.76 -> 0.95-0.98 of OpenBLAS (1 thread), 0.51 -> 0.68 (2 threads); 512 0.91 -> 0.92-0.95; 2048
    0.77-0.83 -> 0.81-0.86 (2 threads 0.77 -> 0.73, within that host's spread); whole models paired (1
    thread: GPT, BERT, ViT, ResNet-50, SqueezeNet; 2 threads: GPT, ResNet-50) 0.98-1.02, level. A step that
    also brings rows jumping lines (the 196-byte pixel rows above) keeps the L1d bound.

    ``shared_panel`` (:func:`~.strategy.streams_panel`: the vector operand is one matrix, larger than L2, that every row
    reads: a layer's weights) with a single reduction loop: when every row of the band (its coincident
    members but ``v``) times the reduction tile fits in the L2 budget, the rows become one block and ``v``
    one NR-wide sliver (BLIS's order: the ``jr`` loop outside ``ir``): each sliver of the weights comes from
    memory once and every row uses it while it sits in L1, where rows outside columns used each ``kc x nc``
    block from memory first at MR rows' worth of FMAs (2 x MR flops a weight), the rest of the rows from L2
    after. Measured (1x1 convolutions at 7x7 channels-last and a 50-token GEMM, weights packed and cold:
    16 copies cycled, this Zen 5 host): 512 -> 2048 0.59 -> 0.55 ms (1 thread) and 0.32 -> 0.29 (2) with
    AVX-512, 1.24 -> 1.15 and 0.65 -> 0.59 with AVX2; 2048 -> 512 and 768 -> 3072 3-10% on both; warm
    weights and 128-row GEMMs unchanged. A weight matrix within L2 (MobileNetV2's) or a batched GEMM's
    per-batch operand (attention's) keeps the order above: the rule without those two conditions made
    MobileNetV2 8% and the ViT 15% slower (1 thread, AVX-512). When every row times the *whole* reduction
    fits in that budget and a step brings nothing but the sliver's NR columns into L1 (``step_bytes``: the
    rows are read along their own lines, as a flattened channels-last image's pixels), the reduction is not
    tiled: each sliver is then one contiguous stream of the packed weights, and the accumulators stay in
    registers from its first step to its last. ResNet-50's last-stage 1x1 convolutions over 49 flattened
    pixels, weights cold (1 thread, Zen 4, AVX-512 / AVX2): 512 -> 2048 1.11x / 1.09x faster than with kc =
    256, 2048 -> 512 1.02x / 1.02x. Rows that jump lines every step (an NCHW input's 7 pixels, 196 bytes
    apart, read by a convolution the lowering computes channels-last) keep the L1 rule's tile: untiled, the
    same two convolutions ran 0.89x / 0.91x with AVX2 (1.09x / 0.97x with AVX-512). Copied in slivers of the
    register tile's rows (:func:`~.packing.choose_row_packing`), those rows are read along their lines again
    (:func:`micro_step_bytes`' ``slivers``) and the reduction runs whole. Measured (Zen 4, single Conv nodes,
    paired in one process, old -> new against onnxruntime at 1 thread; polyc against itself at 2): ResNet-50's
    512 -> 2048 at 7x7 0.89 -> 0.97 (AVX-512) and 0.90 -> 0.96 (AVX2), 1x1/2 1024 -> 2048 0.97 -> 1.04 and
    0.99 -> 1.03, 2048 -> 512 0.98 -> 0.99 and 0.95 -> 0.97, ShuffleNetV2's 464 -> 1024 at 7x7 0.89 -> 0.95 and
    0.87 -> 0.96; at 2 threads 1.01-1.11x faster on both.

    ``dot`` (the vector loop is a reduction: a dot product per row, GEMV's ``y(n) += W(n, k) x(k)``): each
    reduction whose extent x ``depth`` fits the L2 budget is not tiled, so a row is one stream, summed across
    lanes once (256-deep tiles jumped between 8 rows every KiB). Zen 4, the 2048 -> 1000 head, weights cold:
    0.53 -> 0.31 ms (AVX2), 0.48 -> 0.29 (AVX-512); whole CNNs 1.02-1.10x; nothing else in the models changes."""
    if options.tile_sizes:
        sizes = [options.tile_sizes[j % len(options.tile_sizes)] for j in range(len(order))]
    else:
        sizes = []
        for k in order:
            if k == u:
                sizes.append(16 * mr)
            elif k == v:
                sizes.append(max(nr, 256 // nr * nr))
            elif not coincident[k]:
                sizes.append(256)
            else:
                sizes.append(8)
    multiple = {u: mr, v: nr}
    clipped = []
    for size, k in zip(sizes, order):
        step = multiple.get(k, 1)
        clipped.append(max(1, min(size, -(-extents[k] // step) * step)))
    if options.tile_sizes or u is None or v is None:
        if dot and not options.tile_sizes:  # a row reduction along the vector loop: whole rows (see above)
            clipped = [extents[k] if not coincident[k] and extents[k] * itemsize * depth <= target.l2_bytes // 2
                       else t for t, k in zip(clipped, order)]
        return clipped
    budget = target.l2_bytes // 2
    pos_v = order.index(v)
    reductions = [j for j, k in enumerate(order) if not coincident[k]]
    # micro-panels as deep as L1 holds, twice that for a single stream (see above)
    l1_panel = target.l1d_bytes * (KC_STREAM_L1D if step_bytes <= nr * itemsize else 1)
    if step_bytes and len(reductions) == 1 and depth == 1:
        r = reductions[0]
        extent = extents[order[r]]
        while clipped[r] < extent and 2 * clipped[r] <= KC_MAX and 2 * clipped[r] * step_bytes <= l1_panel:
            clipped[r] *= 2
        clipped[r] = -(-extent // -(-extent // clipped[r]))  # equal tiles: 768 as 2 x 384, not 512 + 256

    def footprint():
        total = clipped[pos_v] * itemsize * depth
        for j in reductions:
            total *= clipped[j]
        return total

    while footprint() > budget and clipped[pos_v] > nr:
        clipped[pos_v] = max(nr, clipped[pos_v] // 2 // nr * nr)
    while footprint() > budget and reductions and max(clipped[j] for j in reductions) > 8:
        deepest = max(reductions, key=lambda j: clipped[j])
        clipped[deepest] //= 2
    pos_u = order.index(u)
    if step_bytes and len(reductions) == 1 and depth == 1:
        while clipped[reductions[0]] * step_bytes > l1_panel and clipped[reductions[0]] > 16:
            clipped[reductions[0]] //= 2
        rows = [j for j, k in enumerate(order) if coincident[k] and k != v]
        block = math.prod(extents[order[j]] for j in rows) * itemsize  # every row's bytes per reduction step
        if shared_panel and step_bytes <= nr * itemsize and block * extents[order[reductions[0]]] <= budget:
            clipped[reductions[0]] = extents[order[reductions[0]]]  # the whole reduction: see above
        if shared_panel and block * clipped[reductions[0]] <= budget:
            for j in rows:  # every row in one block, each NR-wide sliver of the vector operand used by all
                clipped[j] = -(-extents[order[j]] // mr) * mr if j == pos_u else extents[order[j]]
            clipped[pos_v] = nr
            return clipped
    share = -(-extents[u] // (n_threads * mr)) * mr  # every thread keeps a block of rows of its own
    clipped[pos_u] = max(clipped[pos_u], min(clipped[pos_v], share))
    return clipped


def micro_step_bytes(stmt: PolyStatement, scop: Scop, u_index: str, v_index: str, r_index: str, mr: int,
                     nr: int, slivers: L.Access | None = None) -> int:
    """The bytes one step of reduction index ``r_index`` brings into L1 for one ``mr x nr`` register tile
    over ``(u_index, v_index)``: for each read that jumps a line or more per step, the cache lines (64 bytes)
    its ``nr`` columns or else its ``mr`` rows span (7 pixels of an image row, 196 bytes apart: 2 lines, as a
    row not a whole number of lines apart may straddle one). A read along its own lines (GEMM's ``A`` rows, a
    flattened channels-last image's pixels) counts ``count x jump`` bytes (MR x 4 a step) only beside a read
    whose steps are not a whole number of lines (an unpacked image's 196-byte rows, which touch more lines
    than they use): counted everywhere, it halved the reduction tile of every AVX-512 GEMM and channels-last
    1x1 convolution on a 32 KiB L1d (8 rows x 4 + 128 = 160 bytes a step), where kc = 256 ran faster than 128
    on every shape measured (1 thread, Zen 4, weights cold: ResNet-50's 1x1 convolutions over flattened
    pixels 1.00-1.13x; SGEMM 512-2048 1.00-1.02x); not counted beside 196-byte rows, ResNet-50's NCHW 1x1
    convolutions at 7x7 (vectors over the 49 pixels) got kc = 256 instead of 128 with AVX2 and ran 0.91x.
    ``slivers``: the read that is copied in slivers of the MR rows (:func:`~.packing.choose_row_packing`), whose
    step then reads MR elements side by side (along its lines) whatever its jump. 0 when some access is not
    affine. For :func:`cache_tile_sizes`' L1 rule."""
    total, along_lines, straddles = 0, 0, False
    for read in accesses_in(stmt.rhs):
        tensor = scop.tensor(read.tensor)
        item = L.itemsize(tensor.dtype)
        strides = [element_stride(read.args, tensor.shape, i, stmt.indices, scop.sizes)
                   for i in (r_index, u_index, v_index)]
        if None in strides:
            return 0
        jump, along_u, along_v = (abs(x) for x in strides)
        if not jump:
            continue
        if read == slivers:  # copied in slivers of the MR rows: a step reads them side by side, along its lines
            along_lines += mr * item
            continue
        count, spacing = (nr, along_v) if along_v else (mr, along_u)
        span = ((count - 1) * spacing + 1) * item if spacing else item
        if jump * item >= 64:  # a line or more per step; a row not a whole number of lines may straddle one
            total += (-(-span // 64) + bool(jump * item % 64)) * 64
            straddles = straddles or bool(jump * item % 64)
        else:  # each row or column moves along its own lines: count x the jump, amortized
            along_lines += count * jump * item
    return total + along_lines if straddles else total


#: The share of an even split the busiest thread may exceed by at most 1/PARALLEL_BALANCE: a parallel tile loop
#: whose chunks are less balanced gets smaller tiles (:func:`split_for_threads`).
PARALLEL_BALANCE = 0.9


def thread_balance(extent: int, tile: int, n_threads: int) -> float:
    """``extent / n_threads`` over the busiest thread's points when tiles of ``tile`` points run in
    ``n_threads`` chunks of consecutive tiles as codegen splits a parallel loop (chunk ``t``: tiles
    ``[n t / T, n (t+1) / T)``, ``T = min(n, n_threads)``): 1.0 when every thread has an even share."""
    n = -(-extent // tile)
    chunks = min(n, n_threads)
    # chunk t's points: its tiles are whole but the last tile of the loop, which ends at ``extent``
    busiest = max(min(n * (t + 1) // chunks * tile, extent) - n * t // chunks * tile for t in range(chunks))
    return extent / n_threads / busiest


def split_for_threads(order, coincident, extents, tiles, multiple, n_threads: int) -> list:
    """The cache tile sizes ``tiles`` (aligned with ``order``), with one coincident member's tiles made small
    enough that the outermost loop the tiled band generates is coincident and keeps ``n_threads`` threads
    evenly busy (:func:`thread_balance` at least PARALLEL_BALANCE), when it would not: a small GEMM, 50 x 768
    x 192 in a ViT, is one tile of rows and one of columns, so the first loop with more than one iteration
    was the reduction's: one thread; 144 channels in tiles of 128 ran as 128 and 16 on two threads. When
    every member is a single tile, :func:`~.strategy.mark_parallel` parallelizes a point loop (the row blocks).

    The member is one of the coincident members up to that first loop (those before it generate no loop)
    with the most blocks of its ``multiple`` (MR rows for ``u``, NR columns for ``v``, 1 else): the longer
    side, as onnxruntime's MLAS partitions a GEMM along the larger of M and N; on a tie the inner one (``v``:
    each thread then reads half of the vector operand, a layer's weights). Its tile becomes the largest
    multiple of its ``multiple``, no larger than before, that balances the threads (else the best
    balanced). Unchanged when no member has ``n_threads`` blocks."""
    iterations = [-(-extents[k] // t) for k, t in zip(order, tiles)]
    first = next((j for j, n in enumerate(iterations) if n > 1), None)
    if first is None:
        return tiles
    if coincident[order[first]] and iterations[first] >= n_threads \
            and thread_balance(extents[order[first]], tiles[first], n_threads) >= PARALLEL_BALANCE:
        return tiles
    candidates = [j for j in range(first + 1) if coincident[order[j]]
                  and extents[order[j]] // multiple.get(order[j], 1) >= n_threads]
    if not candidates:
        return tiles
    best = max(reversed(candidates), key=lambda j: extents[order[j]] // multiple.get(order[j], 1))
    extent, m = extents[order[best]], multiple.get(order[best], 1)
    sizes = [t for t in range(tiles[best] // m * m, 0, -m) if -(-extent // t) >= n_threads]
    if not sizes:
        return tiles
    split = list(tiles)
    split[best] = next((t for t in sizes if thread_balance(extent, t, n_threads) >= PARALLEL_BALANCE),
                       max(sizes, key=lambda t: thread_balance(extent, t, n_threads)))
    return split
