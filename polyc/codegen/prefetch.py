"""Software prefetch of the next block of a constant packed once, while the current block's register tiles run.

A convolution's filter (or a GEMM's constant ``B``) packed at compile time (:func:`polyc.poly.promote.promote`)
is read block by block: for the 1x1 convolution 1024->2048 at 7x7 (ResNet-50's last stage), isl's AST is ::

    for (c2 = 0; c2 <= 2047; c2 += 32)              // panel of 32 output channels
      for (c3 = 0; c3 <= 1023; c3 += 128)           // block of 128 input channels: 16 KiB of packed weights
        for (c4 = 0; c4 <= 6; c4 += 1)              // the row loop: 7 register tiles re-read the block
          for (c7 = 0; c7 <= 127; c7 += 1)
            // unroll c8 (7 rows), vector c9 (32 columns)
            S1(0, c4, c8, c2 + c9, c3 + c7);        // ... += X(c3 + c7, ...) * W__p(c2 / 32, c3 + c7, c9)

The first of the 7 register tiles finds the block in memory, not in cache: the weights (8 MiB) are streamed once
per inference, and that tile waits for every line of them. Here each vector read of the packed constant in the
first copy of the unrolled rows also prefetches (``llvm.prefetch``, read, locality 2: ``prefetcht1``, to L2)
the element the same statement instance reads in the next iteration of the *block loop*, so the next block
arrives while the row loop runs; lines the hardware already brought in cost a prefetch that hits.

Where, from the loops around the statement (:attr:`polyc.codegen.region.Region.loops`, innermost first):
the loops that index the packed read (``c9``, ``c7``) span the block; the sequential loops that do not (``c4``:
the *row loop*; unrolled ones must be at their first copy) re-read it; the first loop out from there that
indexes the read (``c3``) is the block loop, whose next iteration reads the next block. Nothing is prefetched
when a loop spanning the block has no constant bound on its trip count (:func:`~polyc.codegen.region.trip_bound`),
the block loop is neither a sequential loop nor a parallel one, or there is no row loop (a block read once
streams, and the hardware prefetcher follows a stream). A parallel block loop qualifies because each thread runs
a chunk of its consecutive iterations (:func:`polyc.codegen.llvm.emit_parallel_for`): the next iteration is the
thread's next block, but for the chunk's last. Measured (2 threads, Zen 4, weights cold, prefetch forced on
against off): AVX2 ResNet-50's 1x1 convolutions over 49 flattened pixels, whose parallel loop runs 16-column
slivers of the weights, 1.21x (512 -> 2048) and 1.13x (2048 -> 512), MobileNetV2's 1.08-1.17x; AVX-512 level
(0.97-1.03x); whole ResNet-50 1.00-1.02x with AVX2 (three runs), 1.01x with AVX-512.

:func:`pays` (``Options.prefetch=None``) keeps it where it was measured to help (see there).

The same goes for an accumulation onto the output's own values (a residual folded into its convolution,
``Y += X * W`` without ``!``: :func:`polyc.onnx.memory.dying_inputs`): each register tile starts from the
output's lines, and channels-last those are one line per pixel row, a KiB or more apart, that the tile needs
before its first FMA. The tile's epilogue (the statement that reads the accumulated value back, the bias and
activation's) prefetches, for writing, the lines the same statement instance reads
:data:`ACCUMULATOR_AHEAD` iterations ahead of the innermost loop that moves along them (:func:`emit_prefetches`).
Whole models, before and after compiled in one process and run alternately (Zen 4; AVX2 / AVX-512): ResNet-50
(16 such kernels) 1.017 / 1.010x at 1 thread, 1.012 / 1.008x at 2; MobileNetV2 1.013 / 1.007x; ResNet-18/2
0.984-0.994 / 1.002-1.004x (two runs). Its first such 1x1 convolution alone, inputs cycled cold, 1.05-1.08x.
"""
from __future__ import annotations

import islpy as isl
from llvmlite import ir

from ..lang import ast as L
from ..poly.affine import accesses_in, has_access, index_names
from ..target import Target
from . import expr as X
from .irbase import declare
from .region import KernelEmitter, Loop, Region, emit_isl_expr, uses_id

I32, I64, PTR = X.I32, X.I64, X.PTR

#: x86's cache line, in bytes: one prefetch per line of a vector read wider than that.
CACHE_LINE_BYTES = 64

#: An accumulation's epilogue prefetches its output lines this many iterations of their loop ahead (1: 0.96-1.18x
#: on the kernel of the module doc, cold; 2: 1.05-1.08x; 4: 1.05x; 8: 0.89x).
ACCUMULATOR_AHEAD = 2

#: A block is re-read by at most this many rows of register tiles (the row loop's trip count times the unrolled
#: rows of each tile: the pixels that share the block) where :func:`pays` prefetches.
MAX_ROWS = 64


def pays(target: Target, rows: int | None, block_bytes: int) -> bool:
    """Whether prefetching the next block pays by default: a block re-read by at most :data:`MAX_ROWS` rows of
    register tiles (``rows``: the first, cold pass is then a large part of the block's time: fetching the
    block costs its bytes over the memory bandwidth, computing with it a time proportional to the rows that
    share it, whatever the vector width, as AVX2 and AVX-512 code run the same FMAs a cycle on these cores)
    whose next block fits beside it in a quarter of the L2 (``target.l2_bytes``).

    Measured on ResNet-50's convolutions, each alone with prefetch forced on against off (1 thread, AMD Zen 4,
    L2 1 MiB; weights cold / warm): with AVX-512 the 1x1 ones of the last stage, 16 KiB blocks re-read by 7
    register tiles of 7 rows, ran 1.17 / 1.16x (1024->2048 /2), 1.00 / 1.14x (512->2048) and 1.13 / 1.10x
    (2048->512) faster; the 3x3 512 at 7x7 (288 KiB blocks, 7 x 7 rows) 0.99 / 1.01x with AVX-512 and 1.06 /
    1.05x with AVX2. Over flattened pixels (:func:`polyc.onnx.passes.flatten_pointwise_conv`) the 49-pixel
    ones have 10 tiles of 5 rows with AVX2: 1.19-1.27x (2048->512, cold), 1.08x warm, 1.17x (512->2048,
    cold); 196 pixels (39 tiles of 5, or 28 of 7 with AVX-512) level: 1.00 / 0.97 (AVX2, cold), 1.03 / 1.00
    (AVX-512). The bound was once 8 *tiles*: that gave the 49 AVX2 pixels no prefetch, and 16 tiles (up to
    128 rows) measured 0.99-1.00x on whole models with AVX-512 against 0.99-1.02x with AVX2. On Zen 5 the
    3x3 512 at 7x7, then with 590 KiB blocks (the next one does not fit beside it in a 1 MiB L2), ran 1.16x
    *slower* prefetching them: the prefetched block evicts the one being re-read.
    """
    return rows is not None and rows <= MAX_ROWS and 2 * block_bytes <= target.l2_bytes


def next_block(loops: list[Loop], args: dict[str, isl.AstExpr], read: L.Access):
    """``(block loop, rows, block elements, first copy)`` for a read of a packed constant by a statement
    whose indices are the isl AST expressions ``args``, inside ``loops`` (outermost first); None when
    the loops do not have the shape the module doc describes. ``rows``: the row loop's trip count times the
    unrolled rows inside it (the rows of register tiles that re-read the block), None when one of those
    trip counts is not a constant."""
    used = set(index_names(read))
    indexes = lambda loop: any(uses_id(args[i], loop.name) for i in used if i in args)  # noqa: E731
    rows, elements, first, row_loop = 1, 1, True, False
    for loop in reversed(loops):
        if indexes(loop):
            if row_loop:
                return (loop, rows, elements, first) if loop.kind in ("sequential", "parallel") and loop.step \
                    else None
            if loop.trip is None:
                return None
            elements *= loop.trip
        elif loop.kind == "unrolled":  # the register tile's rows
            first = first and loop.first
            rows = None if rows is None or loop.trip is None else rows * loop.trip
        elif loop.kind == "sequential":
            row_loop = True
            rows = None if rows is None or loop.trip is None else rows * loop.trip
        else:  # a vector or parallel loop that does not move along the packed read
            return None
    return None


def emit_prefetches(k: KernelEmitter, r: Region, user: isl.AstNode, offset: int | None, b: ir.IRBuilder) -> None:
    """After a vector statement ``user``: prefetch its reads of packed constants at the next block (see the
    module doc). ``offset`` is the vector step's first lane from the start of the vector loop when that is a
    constant (straight-line steps: only steps starting a cache line prefetch), None in loop form."""
    if k.options.prefetch is False:
        return
    call = user.user_get_expr()
    stmt = k.statements[call.get_op_arg(0).get_id().name]
    args = {i: call.get_op_arg(n + 1) for n, i in enumerate(stmt.indices)}
    if _accumulated(k, stmt):
        _prefetch_accumulator(k, r, stmt, args, offset, b)
        return
    for read in accesses_in(stmt.rhs):
        tensor = k.scop.tensor(read.tensor)
        if not tensor.packed or read.checked or any(has_access(a) for a in read.args):
            continue  # (a packed read has affine indices; a checked or gathered one must not be evaluated ahead)
        found = next_block(r.loops, args, read)
        if found is None:
            continue
        loop, rows, elements, first = found
        size = L.itemsize(tensor.dtype)
        if not first or (offset is not None and offset * size % CACHE_LINE_BYTES):
            continue
        if k.options.prefetch is None and not pays(k.target, rows, elements * size):
            continue
        _prefetch_ahead(k, r, read, args, loop, 1, False, b)  # read, to L2



def _accumulated(k: KernelEmitter, stmt) -> bool:
    """Whether ``stmt`` is the epilogue of an accumulation onto its tensor's own values: no reduction of its
    own, and a reduction statement of the kernel accumulates into the same tensor with no init statement
    before it (``Y += ...`` without ``!``)."""
    if stmt.reduction_indices:
        return False
    others = [s for s in k.statements.values() if s.tensor == stmt.tensor]
    return any(s.reduction_indices for s in others) and not any(s.op == "init" for s in others)


def _prefetch_accumulator(k: KernelEmitter, r: Region, stmt, args: dict, offset: int | None,
                          b: ir.IRBuilder) -> None:
    """Prefetch (for writing, to L1) the line of ``stmt``'s read of its own tensor at
    :data:`ACCUMULATOR_AHEAD` iterations ahead of the innermost sequential or parallel loop that moves it (see
    the module doc); one prefetch per line of a straight-line vector read."""
    for read in accesses_in(stmt.rhs):
        if read.tensor != stmt.tensor or read.checked or any(has_access(a) for a in read.args):
            continue
        tensor = k.scop.tensor(read.tensor)
        if offset is not None and offset * L.itemsize(tensor.dtype) % CACHE_LINE_BYTES:
            return
        used = set(index_names(read))
        loop = next((lp for lp in reversed(r.loops) if lp.kind in ("sequential", "parallel") and lp.step
                     and any(uses_id(args[i], lp.name) for i in used if i in args)), None)
        if loop is None:
            return
        _prefetch_ahead(k, r, read, args, loop, ACCUMULATOR_AHEAD, True, b)  # write, to L1
        return


def _prefetch_ahead(k: KernelEmitter, r: Region, read: L.Access, args: dict, loop, ahead: int, write: bool,
                    b: ir.IRBuilder) -> None:
    """``llvm.prefetch`` of the element ``read`` reads (the statement's indices the isl AST expressions
    ``args``) ``ahead`` iterations of ``loop`` later: for writing into L1 (``prefetchw``) with ``write``, else
    for reading into L2 (``prefetcht1``)."""
    tensor = k.scop.tensor(read.tensor)
    ids = dict(r.ids)
    ids[loop.name] = b.add(ids[loop.name], ir.Constant(I64, ahead * loop.step))
    indices = {i: emit_isl_expr(ids, e, b) for i, e in args.items()}
    env = X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r))
    flat = X.access_offset(env, read, b)
    # not inbounds: past the last iteration the address is past the tile or the buffer (a prefetch does not fault)
    pointer = b.gep(r.tensors[read.tensor], [flat], source_etype=X.memory_type(tensor.dtype))
    prefetch = declare(k.module, "llvm.prefetch.p0", ir.FunctionType(ir.VoidType(), [PTR, I32, I32, I32]))
    b.call(prefetch, [pointer, ir.Constant(I32, int(write)), ir.Constant(I32, 3 if write else 2), ir.Constant(I32, 1)])
