"""The "vector" mark: an innermost ``for`` as LLVM vector code of the target's width, plus a scalar remainder.

For a loop ``for (c3 = lo; c3 <= hi; c3 += 1) S1(c0, c3);`` with ``S1: C(m,n) = A(m,n) * B(n) + s``, where
the statement's index ``n`` is ``c3``::

    for (c3 = lo; c3 < lo + n/W*W; c3 += W)    ; <W x float>: C[m, c3:c3+W] = A[m, c3:c3+W] * B[c3:c3+W] + splat(s)
    for (; c3 <= hi; c3 += 1)                    ; the scalar loop for the last n%W iterations

``W = target.vector_bits / (widest element bits in the body)`` (16 float32 lanes with AVX-512, 8 with
AVX2). Each statement index's stride in the loop is read off the isl AST call arguments; a read whose
element offset grows by 1 per iteration is one vector load, one that does not change is a scalar load and
a broadcast. Float ``+ - *`` carry ``contract`` so the backend emits FMA.

The loop falls back to :func:`~polyc.codegen.llvm.emit_sequential_for` (LLVM's own vectorizer may still
act on it) when: the step is not 1 or the bounds are not recognised; the body holds anything but
statement calls; a statement index is not affine in the iterator; a read or write has a stride other
than 0 or 1 (or the write is invariant: a reduction along the loop); or a read is data-dependent (a gather).
The mark promises that the loop carries no dependence, so statements of one iteration may run for W
iterations at once.

A loop with constant bounds of at most :data:`MAX_STRAIGHT_STEPS` vector steps (a register tile's NR
columns) is emitted straight-line instead, the same steps without the loop: the accumulators of a register
tile then sit at constant offsets when LLVM's LICM lifts them out of the reduction loop, so its GVN/DSE
forward the initial value into registers. In loop form LoopIdiom turned the init into a ``memset`` that
was stored and loaded back, and with the output's lines not in cache the reload waited for the read for
ownership: ResNet-50's 1x1 256->128 convolution at 56x56 took 0.97 ms in the model instead of 0.81. A
guarded loop (under an ``if``: the init of a register tile whose reduction is split into blocks, ``if (c2 ==
0)``) keeps the loop form: straight-line there, LLVM unswitched the guard and an AVX2 SGEMM of 512^3 ran at
two thirds of its speed (3.2 against 2.1 ms; 384^3, 496x512x512 and AVX-512 were level), and such a tile
reloads its accumulators from memory after the first block anyway.
"""
from __future__ import annotations

import dataclasses

import islpy as isl
from llvmlite import ir

from ..lang import ast as L
from ..poly.scop import identity_value
from . import expr as X
from .region import (KernelEmitter, Loop, Region, call_strides, emit_isl_expr, emit_loop, emit_trip_count, emit_user,
                     loop_bounds, trip_bound, user_nodes, walk, with_id)
from .prefetch import emit_prefetches
from .sums import compensated, fold_sum

I64 = X.I64
_OP = isl.ast_expr_op_type
_BITS = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "float16": 16, "bfloat16": 16,
         "int32": 32, "uint32": 32,
         "int64": 64, "uint64": 64, "float32": 32, "float64": 64}


def emit_vector_for(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block | None:
    """Emit a "vector"-marked ``for`` as a vector main loop and a scalar remainder (see the module doc).

    Returns the block after both loops, or None when the body cannot be vectorized (the caller emits a
    sequential loop instead).
    """
    plan = vector_plan(k, node)
    if plan is None:
        reduction = reduction_plan(k, node)
        if reduction is not None:
            return emit_vector_reduction(k, r, node, block, *reduction)
        return None
    lanes, strides = plan
    it = node.for_get_iterator().get_id().name
    with r.in_loop(Loop(it, "vector", 1, trip_bound(node))):
        return _emit_vector_loop(k, r, node, block, lanes, strides, it)


def _emit_vector_loop(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block, lanes: int,
                      strides: dict[str, dict[str, int]], it: str) -> ir.Block:
    """The vector steps of :func:`emit_vector_for` (straight-line, or loops and the scalar remainder) of the
    loop over iterator ``it``."""
    bounds = loop_bounds(node)
    users = user_nodes(node.for_get_body())

    def vector_body(width: int, offset: int | None = None):
        def fill(blk: ir.Block) -> ir.Block:
            bb = X.Builder(blk)
            for user in users:
                _emit_vector_statement(k, r, user, width, strides, bb)
                emit_prefetches(k, r, user, offset, bb)
            return bb.block
        return fill

    steps = None if r.guarded else _constant_steps(bounds, lanes)
    if steps is not None:  # straight-line: no loop, so no init store and reload of a register tile
        for start, width in steps:
            fill = vector_body(width, start - steps[0][0]) if width > 1 \
                else lambda blk: _emit_scalar(k, r, users, blk)
            block = with_id(r, it, ir.Constant(I64, start), lambda blk=block, fill=fill: fill(blk))
        return block

    b = X.Builder(block)
    init, last, n = emit_trip_count(r, bounds, b)
    vector_end = b.add(init, b.mul(b.sdiv(n, ir.Constant(I64, lanes)), ir.Constant(I64, lanes)))

    after = b.block if _empty(init, vector_end) else emit_loop(
        r, b.block, it, init, lambda bb, iv: bb.icmp_signed("<", iv, vector_end), ir.Constant(I64, lanes),
        vector_body(lanes))
    # the remainder (fewer than `lanes` iterations): at most one step of each narrower power-of-two width,
    # then scalar iterations — 24 float32 with 16 lanes run as 16 + 8, not 16 + 8 scalar steps; with
    # constant bounds (the builder folds them) only the widths that run are emitted
    start = vector_end
    width = lanes // 2
    while width >= 2:
        bb = X.Builder(after)
        left = bb.sub(bb.add(last, ir.Constant(I64, 1)), start)
        stop = bb.add(start, bb.mul(bb.sdiv(left, ir.Constant(I64, width)), ir.Constant(I64, width)))
        if not _empty(start, stop):
            after = emit_loop(r, bb.block, it, start, lambda bx, iv, stop=stop: bx.icmp_signed("<", iv, stop),
                              ir.Constant(I64, width), vector_body(width))
        start, width = stop, width // 2
    if _empty(start, last, inclusive=True):
        return after
    return emit_loop(r, after, it, start, lambda bb, iv: bb.icmp_signed("<=", iv, last),
                     ir.Constant(I64, 1), lambda blk: _emit_scalar(k, r, users, blk))


def _empty(start: ir.Value, stop: ir.Value, inclusive: bool = False) -> bool:
    """Whether a loop from ``start`` to ``stop`` (exclusive, or ``inclusive``) provably runs no iteration:
    both are constants."""
    first, end = X.int_value(start), X.int_value(stop)
    return first is not None and end is not None and first >= end + inclusive


#: A vector loop with constant bounds of at most this many vector steps is emitted straight-line.
MAX_STRAIGHT_STEPS = 4


def _constant_steps(bounds, lanes: int) -> list[tuple[int, int]] | None:
    """``[(first iterator value, width)...]`` covering a loop with constant bounds in at most
    :data:`MAX_STRAIGHT_STEPS` steps of ``lanes`` (then narrower powers of two, then scalars, as the loop
    form's remainder), or None. Straight-line code leaves the register tile's accumulators at constant
    offsets, so LLVM keeps them in registers instead of storing the initial value and loading it back."""
    init_expr, parts, _ = bounds
    if init_expr.get_type() != isl.ast_expr_type.int or any(e.get_type() != isl.ast_expr_type.int for e, _ in parts):
        return None
    first = init_expr.get_val().to_python()
    last = min(e.get_val().to_python() + off for e, off in parts)
    n = last - first + 1
    if n <= 0 or n // lanes > MAX_STRAIGHT_STEPS:
        return None
    steps, at, width = [], first, lanes
    while at <= last:
        while width > 1 and at + width - 1 > last:
            width //= 2
        steps.append((at, width))
        at += width
    return steps if len(steps) <= 2 * MAX_STRAIGHT_STEPS else None


def _emit_scalar(k: KernelEmitter, r: Region, users: list[isl.AstNode], block: ir.Block) -> ir.Block:
    """The statement calls ``users`` of one iteration, scalar (the remainder of a vector loop)."""
    for user in users:
        block = emit_user(k, r, user, block)
    return block


def vector_plan(k: KernelEmitter, node: isl.AstNode) -> tuple[int, dict[str, dict[str, int]]] | None:
    """``(lanes, {statement: {index: stride}})`` if the marked loop can be vectorized, else None."""
    bounds = loop_bounds(node)
    if bounds is None or bounds[2] != 1:
        return None
    it = node.for_get_iterator().get_id().name
    users = user_nodes(node.for_get_body())
    if not users:
        return None
    strides: dict[str, dict[str, int]] = {}
    dtypes: set[str] = set()
    for user in users:
        found = call_strides(k, user, it)
        if found is None or not _statement_ok(k, found[0], found[1], dtypes):
            return None
        strides[found[0].name] = found[1]
    widest = max((_BITS[d] for d in dtypes), default=32)
    lanes = max(1, k.target.vector_bits // widest)
    return (lanes, strides) if lanes > 1 else None


def _statement_ok(k: KernelEmitter, stmt, strides: dict[str, int], dtypes: set[str]) -> bool:
    """Whether ``stmt`` vectorizes with these index strides: a stride-1 write, or for ``=`` a write of a
    larger stride (a scatter: a channels-last convolution's NCHW read-back, whose epilogue, a GELU say,
    then runs on vectors); reads of a constant stride of 0 or more (wider than MAX_READ_STRIDE: gathers), none
    data-dependent."""
    scop = k.scop
    write_stride = X.flat_stride(scop, stmt.tensor, [L.Ident(i, dtype="int32", kind="index") for i in stmt.lhs],
                                strides)
    if write_stride != 1 and not (stmt.op == "=" and write_stride is not None and write_stride > X.MAX_READ_STRIDE):
        return False
    dtypes.add(scop.tensor(stmt.tensor).dtype)
    for e in walk(stmt.rhs):
        if e.dtype is not None:
            dtypes.add(e.dtype)
        if isinstance(e, L.Access):
            stride = X.flat_stride(scop, e.tensor, e.args, strides)
            if X.may_fail(e) or stride is None or stride < 0:
                return False
            dtypes.add(scop.tensor(e.tensor).dtype)
        if isinstance(e, L.Ident) and e.kind == "scalar":
            dtypes.add(scop.tensor(e.name).dtype)
    return True


def _emit_vector_statement(k: KernelEmitter, r: Region, user: isl.AstNode, lanes: int,
                           strides: dict[str, dict[str, int]], b: ir.IRBuilder) -> None:
    """One statement for ``lanes`` consecutive iterations: vector rhs, vector load/combine/store of the lhs."""
    call = user.user_get_expr()
    stmt = k.statements[call.get_op_arg(0).get_id().name]
    indices = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), b) for n, i in enumerate(stmt.indices)}
    env = X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r), lanes=lanes, strides=strides[stmt.name],
                safe_reads=stmt.safe_reads)
    dtype = k.scop.tensor(stmt.tensor).dtype
    scalar_env = dataclasses.replace(env, lanes=1, strides={})
    flat = X.flat_index(scalar_env, stmt.tensor, [indices[i] for i in stmt.lhs], b)
    lhs = [L.Ident(i, dtype="int32", kind="index") for i in stmt.lhs]
    write_stride = X.flat_stride(k.scop, stmt.tensor, lhs, strides[stmt.name])
    if write_stride != 1:  # "=" only (_statement_ok)
        X.scatter(env, stmt.tensor, flat, write_stride, X.emit_update(env, stmt.op, dtype, stmt.rhs, None, b), b)
        return
    old = X.load(env, stmt.tensor, flat, b, lanes=lanes) if stmt.op not in ("init", "=") else None
    X.store(env, stmt.tensor, flat, X.emit_update(env, stmt.op, dtype, stmt.rhs, old, b), b)


# ---- reductions along the vector loop ----

def reduction_plan(k: KernelEmitter, node: isl.AstNode):
    """``(lanes, strides, user)`` when the marked loop is one reduction statement (``+= *= max= min=``)
    whose element stays put along the loop (write stride 0) and whose reads are vectorizable and do not
    read the reduced tensor; else None."""
    bounds = loop_bounds(node)
    users = user_nodes(node.for_get_body())
    if bounds is None or bounds[2] != 1 or not users or len(users) != 1:
        return None
    found = call_strides(k, users[0], node.for_get_iterator().get_id().name)
    if found is None or found[0].op not in ("+=", "*=", "max=", "min="):
        return None
    stmt, strides = found
    scop = k.scop
    dtype = scop.tensor(stmt.tensor).dtype
    lhs = [L.Ident(i, dtype="int32", kind="index") for i in stmt.lhs]
    if dtype == "bool" or X.flat_stride(scop, stmt.tensor, lhs, strides) != 0:
        return None
    dtypes = {dtype}
    for e in walk(stmt.rhs):
        if e.dtype is not None:
            dtypes.add(e.dtype)
        if isinstance(e, L.Access):
            stride = X.flat_stride(scop, e.tensor, e.args, strides)
            if e.tensor == stmt.tensor or X.may_fail(e) or stride is None or not 0 <= stride <= X.MAX_READ_STRIDE:
                return None
    lanes = k.target.vector_bits // max(_BITS[d] for d in dtypes)
    return (lanes, strides, users[0]) if lanes > 1 else None


#: Independent vector accumulators of a reduction along the vector loop: enough to cover the latency of an
#: FMA or add (4 cycles) at two per cycle, so the loop runs at load throughput instead of add latency.
REDUCTION_ACCUMULATORS = 4

#: A compensated sum (:func:`~polyc.codegen.sums.compensated`) along the vector loop folds its accumulators
#: into the element after every chunk of this many vector steps per accumulator (each of the ``U x W``
#: partials then sums at most 32 terms: numpy's pairwise blocks sum 16 per accumulator).
SUM_CHUNK_STEPS = 32


def emit_vector_reduction(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block, lanes: int,
                          strides: dict, user: isl.AstNode) -> ir.Block:
    """A reduction along the loop with ``U x lanes`` partial results in ``U`` vector registers
    (``U`` = :data:`REDUCTION_ACCUMULATORS`, ``W`` = ``lanes``, ``C`` = :data:`SUM_CHUNK_STEPS`)::

        acc_0..acc_{U-1} = splat(identity)
        for (cc = lo; cc < lo + n/(C U W)*(C U W); cc += C U W) {      // compensated sums only
            for (c = cc; c < cc + C U W; c += U W)   acc_u = acc_u op rhs[c + u W : c + (u+1) W]   (each u)
            fold_sum(T[...], tree_reduce(acc_0 op ... op acc_{U-1}));  acc_u = splat(identity)
        }
        for (; c < lo + n/(U W)*(U W); c += U W)     acc_u = acc_u op rhs[c + u W : c + (u+1) W]   (each u)
        for (; c < lo + n/W*W; c += W)               acc_0 = acc_0 op rhs[c : c+W]
        p = tree_reduce(acc_0 op ... op acc_{U-1})   ; log2(W) halving steps, the statement's op
        for (; c <= hi; c += 1)                      p = p op rhs[c]
        T[...] = T[...] op p                         ; fold_sum(T[...], p) for a compensated sum

    The partial sums are combined in a different order than the sequential loop (reassociation: float
    sums differ in the last bits, as numpy's pairwise sums do). A compensated sum (a long float ``+=``)
    adds each chunk's partial to the element with :func:`~polyc.codegen.sums.fold_sum`, so its error does
    not grow with the length of the loop nor with the number of tiles that fold into the element."""
    call = user.user_get_expr()
    stmt = k.statements[call.get_op_arg(0).get_id().name]
    dtype = k.scop.tensor(stmt.tensor).dtype
    exact = compensated(k, stmt)
    it = node.for_get_iterator().get_id().name
    b = X.Builder(block)
    init, last, n = emit_trip_count(r, loop_bounds(node), b)
    wide = lanes * REDUCTION_ACCUMULATORS
    chunk = wide * SUM_CHUNK_STEPS

    def end(size: int) -> ir.Value:
        return b.add(init, b.mul(b.sdiv(n, ir.Constant(I64, size)), ir.Constant(I64, size)))

    chunks_end = end(chunk) if exact else init
    unrolled_end, vector_end = end(wide), end(lanes)
    vty = X.llvm_type(dtype, lanes)
    accs = [r.alloca(vty, f"acc{u}") for u in range(REDUCTION_ACCUMULATORS)]
    identity = X.const(vty, identity_value(stmt.op, dtype))
    for acc in accs:
        b.store(identity, acc)

    def update(bb: ir.IRBuilder, acc) -> None:
        indices = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), bb) for n, i in enumerate(stmt.indices)}
        env = X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r), lanes=lanes, strides=strides,
                    safe_reads=stmt.safe_reads)
        bb.store(X.emit_update(env, stmt.op, dtype, stmt.rhs, bb.load(acc, typ=vty), bb), acc)

    def unrolled(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        base = r.ids[it]
        for u, acc in enumerate(accs):
            with_id(r, it, bb.add(base, ir.Constant(I64, u * lanes)), lambda: update(bb, acc))
        return bb.block

    def single(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        update(bb, accs[0])
        return bb.block

    def partial(bb: ir.IRBuilder) -> ir.Value:
        """The accumulators reduced to one scalar: across accumulators, then log2(lanes) halving steps."""
        value = bb.load(accs[0], typ=vty)
        for acc in accs[1:]:
            value = X.combine(bb, stmt.op, dtype, value, bb.load(acc, typ=vty))
        width = lanes
        while width > 1:
            half = width // 2
            lo = bb.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                   ir.Constant(ir.VectorType(X.I32, half), list(range(half))))
            hi = bb.shuffle_vector(value, ir.Constant(value.type, ir.Undefined),
                                   ir.Constant(ir.VectorType(X.I32, half), list(range(half, width))))
            value = X.combine(bb, stmt.op, dtype, lo, hi)
            width = half
        return bb.extract_element(value, ir.Constant(X.I32, 0))

    def store(bb: ir.IRBuilder, value: ir.Value) -> None:
        """``T[...] = T[...] op value`` (``fold_sum`` for a compensated sum); ``T``'s indices do not move."""
        indices = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), bb) for n, i in enumerate(stmt.indices)}
        env = X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r))
        flat = X.flat_index(env, stmt.tensor, [indices[i] for i in stmt.lhs], bb)
        if exact:
            fold_sum(k, r, stmt.tensor, flat, value, bb)
        else:
            X.store(env, stmt.tensor, flat, X.combine(bb, stmt.op, dtype, X.load(env, stmt.tensor, flat, bb),
                                                      value), bb)

    def chunk_body(blk: ir.Block) -> ir.Block:
        start = r.ids[f"{it}.chunk"]
        stop = X.Builder(blk).add(start, ir.Constant(I64, chunk))
        after = emit_loop(r, blk, it, start, lambda bb, iv: bb.icmp_signed("<", iv, stop),
                          ir.Constant(I64, wide), unrolled)
        bb = X.Builder(after)
        with_id(r, it, start, lambda: store(bb, partial(bb)))
        for acc in accs:
            bb.store(identity, acc)
        return bb.block

    after = b.block
    if exact:
        after = emit_loop(r, after, f"{it}.chunk", init, lambda bb, iv: bb.icmp_signed("<", iv, chunks_end),
                          ir.Constant(I64, chunk), chunk_body)
    after = emit_loop(r, after, it, chunks_end, lambda bb, iv: bb.icmp_signed("<", iv, unrolled_end),
                      ir.Constant(I64, wide), unrolled)
    after = emit_loop(r, after, it, unrolled_end, lambda bb, iv: bb.icmp_signed("<", iv, vector_end),
                      ir.Constant(I64, lanes), single)
    # the scalar remainder into the partial p, then one update of the element
    value = r.alloca(X.llvm_type(dtype), "partial")
    bb = X.Builder(after)
    bb.store(partial(bb), value)

    def remainder(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        indices = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), bb) for n, i in enumerate(stmt.indices)}
        env = X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r), safe_reads=stmt.safe_reads)
        bb.store(X.emit_update(env, stmt.op, dtype, stmt.rhs, bb.load(value, typ=value_type), bb), value)
        return bb.block

    value_type = X.llvm_type(dtype)
    after = emit_loop(r, after, it, vector_end, lambda bb, iv: bb.icmp_signed("<=", iv, last),
                      ir.Constant(I64, 1), remainder)
    bb = X.Builder(after)
    with_id(r, it, init, lambda: store(bb, bb.load(value, typ=value_type)))
    return bb.block
