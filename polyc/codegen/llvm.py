"""isl AST → LLVM IR (llvmlite ``ir``): one ``emit_<node kind>`` per isl AST node type.

The shape follows Tensor Comprehensions' ``codegen_llvm.cc``: :func:`emit_node` dispatches ``for``, ``if``,
``block``, ``user`` and ``mark`` nodes to :func:`emit_for`, :func:`emit_if`, :func:`emit_block`,
:func:`~polyc.codegen.region.emit_user` and :func:`emit_mark`. The insertion point is explicit: every ``emit_*``
takes the basic block to append to and returns the block where control continues, so no builder state leaks
between them. What every emitter shares (the :class:`~polyc.codegen.region.KernelEmitter` and
:class:`~polyc.codegen.region.Region` state, loops, :func:`~polyc.codegen.region.emit_isl_expr` for isl AST
expressions as i64/i1 values) is in :mod:`polyc.codegen.region`; lang expressions (statement bodies) are
emitted by :mod:`polyc.codegen.expr`.

What :func:`emit_kernel` adds to the module, for a Scop named ``mm``::

    define i32 @mm(ptr %args)                 ; args[i] = data pointer of scop.tensors[i]; 0 ok, 1 bad index
    define internal i32 @mm.body(ptr noalias %A, ptr noalias %B, ptr noalias %C)
    define internal ptr @mm.par0(ptr %ctx)    ; per "parallel" mark: the chunk the thread pool runs ...
    define internal i32 @mm.par0.body(ptr noalias %A, ..., i64 %lo, i64 %hi, i64 %c0, ...)  ; ... and chunk

Tensor pointers are ``noalias``: the tensors of one kernel call must not overlap in memory.

Marks on a ``for`` (inserted by the scheduling side with ``insert_mark``) select its emitter in
:func:`emit_for`: ``"parallel"`` → :func:`emit_parallel_for` (outlined body run by the thread pool),
``"vector"`` → :func:`polyc.codegen.vector.emit_vector_for` (LLVM vectors, scalar remainder; a sequential
loop when the body does not vectorize),
``"unroll"`` → :func:`emit_unrolled_for` (full unroll up to a constant bound), anything else and plain
loops → :func:`emit_sequential_for`.
"""
from __future__ import annotations

import islpy as isl
from llvmlite import ir

from ..errors import CompileError
from ..lang import ast as L
from ..options import Options
from ..poly.affine import isl_name
from ..poly.marks import parse_mark
from ..poly.scop import Scop
from ..poly.strategy import threads as thread_count
from . import expr as X
from .pool import declare_parallel_run
from .region import (KernelEmitter, Loop, Region, constant_terms, disjoint_copies, emit_isl_expr, emit_loop,
                     emit_trip_count, emit_user, loop_bounds, smax, smin, trip_bound, with_id)
from .sums import blocked_reduction_plan, emit_blocked_reduction
from .vector import emit_vector_for
from ..target import Target

I1, I8, I32, I64, PTR = X.I1, X.I8, X.I32, X.I64, X.PTR

#: Loops with a constant trip count up to this many iterations are fully unrolled under an "unroll" mark.
MAX_FULL_UNROLL = 64

#: A loop whose body is a register tile (the tile's rows under an ``unroll`` mark: the reduction loop of a GEMM
#: or a 1x1 convolution) is unrolled this many times by LLVM's loop unroller (``llvm.loop.unroll.count``, the
#: remainder iterations LLVM's), which leaves a body that large rolled on its own. With the tile's operands
#: coming from L2 or further (its broadcast rows streaming, its vector panel re-read from L2), the rolled
#: loop ran at 0.76-0.88 of the same loop over data in L1, unrolled 4 times at 0.87-0.98 (a hand-written
#: 12 x 2-vector AVX-512 tile of 256 steps, Emerald Rapids; unrolled twice 0.90-0.94, 8 times as 4), and at
#: 0.87-0.92 against 0.88-0.95 with AVX2's 6 x 2; with every operand in L1 it makes no difference.
#: Whole models, before and after compiled in one process and run alternately (1 thread; AVX-512 / AVX2):
#: ResNet-50 1.051 / 1.012, GPT 1.075 / 1.031, BERT 1.087 / 1.035, MobileNetV2 1.061 / 1.024 (README).
REDUCTION_UNROLL = 4

#: ... when it may run at least this many times: a convolution's window loops around the tile (3-7
#: iterations: unrolled 4 times, fully) are left to LLVM. Unrolled too, they made EfficientNet-B0 1.5-2.4%
#: slower than before with AVX-512 and AVX2 (three runs); with this bound it is 1.037 / 1.032x faster.
REDUCTION_UNROLL_MIN_TRIPS = 16

_OP = isl.ast_expr_op_type
_NODE = isl.ast_node_type


def new_module(target: Target, name: str = "polyc") -> ir.Module:
    """An empty llvmlite module for ``target`` (its triple set); emit kernels into it with :func:`emit_kernel`."""
    module = ir.Module(name=name)
    module.triple = target.triple
    return module


def emit_kernel(module: ir.Module, scop: Scop, ast: isl.AstNode | None, target: Target,
                options: Options) -> ir.Function:
    """Add ``define i32 @<scop.name>(ptr %args)`` running the isl AST ``ast`` to ``module``.

    ``args`` points to ``len(scop.tensors)`` data pointers in ``scop.tensors`` order (C-contiguous numpy
    buffers; bool is one byte). The function returns 0, or 1 when a data-dependent index was out of range
    (nothing is read out of bounds). ``ast`` comes from ``isl.AstBuild.node_from_schedule`` (None: nothing
    to do); its user nodes are ``S(e0, e1, ...)`` with one value per ``PolyStatement.indices``.

    Raises CompileError if the module already has a function of that name or the AST calls an unknown
    statement (both polyc bugs).
    """
    if scop.name in module.globals:
        raise CompileError(f"codegen: the module already defines {scop.name!r}; kernel names must be unique")
    kernel = KernelEmitter(module, scop, target, options, {s.name: s for s in scop.statements})
    fn = ir.Function(module, ir.FunctionType(I32, [PTR]), scop.name)
    fn.args[0].name = "args"
    fn.attributes.add("nounwind")
    params = [isl_name(p) for p in scop.params]
    region, values = kernel.new_region(f"{scop.name}.body", params)
    region.ids.update(zip(params, values))
    start = _bind_extents(kernel, region) if scop.params else region.start
    end = emit_node(kernel, region, ast, start) if ast is not None else start
    X.Builder(end).ret(ir.Constant(I32, 0))

    b = X.Builder(fn.append_basic_block("entry"))
    sizes, extents = [], {}
    if params:  # a generic kernel: after the argument tensors, a pointer to its sizes (int64, Scop.params order)
        n_args = sum(t.role != "local" for t in scop.tensors)
        slot = b.gep(fn.args[0], [ir.Constant(I64, n_args)], inbounds=True, source_etype=PTR)
        array = b.load(slot, name="sizes", typ=PTR, align=8)
        sizes = [b.load(b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=I64), name=p, typ=I64,
                        align=8) for i, p in enumerate(params)]
        extents = extent_values(kernel, dict(zip(params, sizes)), b)
    pointers, locals_ = [], []
    for i, t in enumerate(scop.tensors):
        if t.role == "local":
            pointers.append(_allocate(module, fn, b, t, _element_count(t, extents, b)))
            locals_.append(pointers[-1])
            continue
        slot = b.gep(fn.args[0], [ir.Constant(I64, i)], inbounds=True, source_etype=PTR)
        pointers.append(b.load(slot, name=X.ir_name(t.name), typ=PTR, align=8))
    shadows = _allocate_shadows(kernel, fn, b, extents)
    locals_ += shadows[1]
    status = b.call(region.fn, pointers + [shadows[0]] + sizes)
    free = X.declare(module, "free", ir.FunctionType(ir.VoidType(), [PTR]))
    for p in locals_:
        b.call(free, [p])
    b.ret(status)
    return fn


def _bind_extents(k: KernelEmitter, r: Region) -> ir.Block:
    """Bind each size-dependent extent of a generic kernel's tensors as id ``"T.k"`` in ``r`` (evaluated once
    at the start, from the parameters, through isl's AST expression of it:
    ``isl_ast_build_expr_from_pw_aff``); returns the block to continue in."""
    b = X.Builder(r.start)
    for name, value in extent_values(k, r.ids, b).items():
        r.ids[name] = value
    return b.block


def extent_values(k: KernelEmitter, ids: dict, b: ir.IRBuilder) -> dict[str, ir.Value]:
    """``"T.k"`` → the i64 value of each size-dependent extent of a generic kernel, from the parameters in
    ``ids`` (by isl name)."""
    build = isl.AstBuild.from_context(k.scop.context)
    values = {}
    for t in k.scop.tensors:
        for j, e in enumerate(t.extents):
            if type(e) is not int:
                expr = build.expr_from_pw_aff(isl.PwAff(f"{k.scop.prefix}{{ [({e.text})] }}"))
                values[f"{t.name}.{j}"] = emit_isl_expr(ids, expr, b)
    return values


def _element_count(t, extents: dict, b: ir.IRBuilder) -> ir.Value:
    """The number of elements of tensor ``t`` (at least 1): a constant, or in a generic kernel the product
    of its extents at run time (``extents``: :func:`extent_values`)."""
    if not t.extents:
        return ir.Constant(I64, max(1, t.size))
    count = ir.Constant(I64, 1)
    for j, e in enumerate(t.extents):
        count = b.mul(count, extents[f"{t.name}.{j}"] if type(e) is not int else ir.Constant(I64, e))
    return smax(b, count, ir.Constant(I64, 1))


def _allocate_shadows(k: KernelEmitter, fn: ir.Function, b: ir.IRBuilder,
                      extents: dict | None = None) -> tuple[ir.Value, list[ir.Value]]:
    """``(array, buffers)``: one zeroed shadow buffer (``calloc``: 8 bytes per element of the tensor, two for
    float64, see :func:`~polyc.codegen.sums.fold_sum`) per tensor in ``k.shadows``, and the array of their
    pointers the region functions take as :data:`~polyc.codegen.region.SHADOWS` (a null pointer when there is
    none). The kernel returns STATUS_NO_MEMORY when an allocation fails. Leaves ``b`` where the buffers are
    valid."""
    if not k.shadows:
        return ir.Constant(PTR, None), []
    calloc = X.declare(k.module, "calloc", ir.FunctionType(PTR, [I64, I64]))
    free = X.declare(k.module, "free", ir.FunctionType(ir.VoidType(), [PTR]))
    array = b.alloca(ir.ArrayType(PTR, len(k.shadows)), name="shadows")
    array.type = PTR
    buffers, failed = [], ir.Constant(I1, 0)
    for i, name in enumerate(k.shadows):
        p = b.call(calloc, [_element_count(k.scop.tensor(name), extents or {}, b), ir.Constant(I64, 16)],
                   name=X.ir_name(f"{name}.shadow"))
        b.store(p, b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR))
        failed = b.or_(failed, b.icmp_unsigned("==", p, ir.Constant(PTR, None)))
        buffers.append(p)
    ok = fn.append_basic_block("shadows.allocated")
    no_memory = fn.append_basic_block("shadows.no_memory")
    b.cbranch(failed, no_memory, ok)
    nb = X.Builder(no_memory)
    for p in buffers:
        nb.call(free, [p])
    nb.ret(ir.Constant(I32, STATUS_NO_MEMORY))
    b.position_at_end(ok)
    return array, buffers


#: Status a kernel returns when a local buffer (a packed operand) cannot be allocated.
STATUS_NO_MEMORY = 2


def _allocate(module: ir.Module, fn: ir.Function, b: ir.IRBuilder, t, count: ir.Value) -> ir.Value:
    """``aligned_alloc(64, bytes)`` for local tensor ``t`` of ``count`` elements (a promoted buffer, not an
    argument; the bytes rounded up to a multiple of 64); the kernel returns STATUS_NO_MEMORY when it fails.
    Leaves ``b`` in the block where the pointer is valid."""
    nbytes = b.mul(count, ir.Constant(I64, X.element_bytes(t.dtype)))
    nbytes = b.and_(b.add(nbytes, ir.Constant(I64, 63)), ir.Constant(I64, -64))
    alloc = X.declare(module, "aligned_alloc", ir.FunctionType(PTR, [I64, I64]))
    pointer = b.call(alloc, [ir.Constant(I64, 64), nbytes], name=X.ir_name(t.name))
    ok = fn.append_basic_block(X.ir_name(f"{t.name}.allocated"))
    failed = fn.append_basic_block(X.ir_name(f"{t.name}.no_memory"))
    b.cbranch(b.icmp_unsigned("==", pointer, ir.Constant(PTR, None)), failed, ok)
    X.Builder(failed).ret(ir.Constant(I32, STATUS_NO_MEMORY))
    b.position_at_end(ok)
    return pointer


# ---- isl AST nodes ----

def emit_node(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """Emit any isl AST node at the end of ``block``; returns the block where control continues."""
    t = node.get_type()
    if t == _NODE.for_:
        return emit_for(k, r, node, block)
    if t == _NODE.if_:
        return emit_if(k, r, node, block)
    if t == _NODE.block:
        return emit_block(k, r, node, block)
    if t == _NODE.user:
        return emit_user(k, r, node, block)
    if t == _NODE.mark:
        return emit_mark(k, r, node, block)
    raise CompileError(f"codegen: unexpected isl AST node type {t}")


def emit_block(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A sequence of nodes (``isl_ast_node_block_get_children``), in order. After a reduction loop, the nodes
    that follow it address a tensor it reduced into and they read transposed through a laundered pointer
    (:func:`_launder`)."""
    children = node.block_get_children()
    nodes = [children.get_at(i) for i in range(children.n_ast_node())]
    saved = dict(r.tensors)  # the block's laundered pointers end with it
    try:
        for i, child in enumerate(nodes):
            block = emit_node(k, r, child, block)
            if i + 1 < len(nodes) and child.get_type() == _NODE.for_:
                reduced = {s.tensor for s in _statements(k, [child]) if s.op not in ("=", "init")}
                transposed = {t for s in _statements(k, nodes[i + 1:]) for t in _transposed_reads(s)}
                for tensor in sorted(reduced & transposed):
                    r.tensors[tensor] = _launder(X.Builder(block), r.tensors[tensor])
    finally:
        r.tensors.clear()
        r.tensors.update(saved)
    return block


def _statements(k: KernelEmitter, nodes: list) -> list:
    """The statements the AST subtrees ``nodes`` call."""
    found = []

    def visit(n):
        if n.get_type() == _NODE.user:
            stmt = k.statements.get(n.user_get_expr().get_op_arg(0).get_id().name)
            if stmt is not None and stmt not in found:
                found.append(stmt)
        return True

    for node in nodes:
        node.foreach_descendant_top_down(visit)
    return found


def _transposed_reads(stmt) -> set:
    """The tensors ``stmt`` reads at its own indices in another order (``Y(i, j) = f(T(j, i))``)."""
    lhs = list(stmt.lhs)
    found = set()
    for access in L.walk(stmt.rhs):
        if isinstance(access, L.Access) and all(isinstance(a, L.Ident) for a in access.args):
            names = [a.name for a in access.args]
            if sorted(names) == sorted(lhs) and names != lhs:
                found.add(access.tensor)
    return found


def _launder(b: ir.IRBuilder, pointer: ir.Value) -> ir.Value:
    """``pointer`` through an empty ``asm``: the same address, which LLVM cannot trace to the argument.

    LLVM keeps a register tile's accumulators in registers through their reduction loop and stores them after
    it, and forwards those stores to the loads of the statements after the loop (a fused epilogue). Where
    the epilogue reads the tile transposed (its vector lanes run along another dimension than the
    accumulators'), forwarding extracts lanes from every accumulator, which keeps them all alive through the
    epilogue, and the register allocator then spilled an accumulator inside the reduction loop itself (AVX2's
    5 x 2 tile of a strided 1-D convolution whose GELU writes the output channels-first: 2.99 against 2.02 ms
    laundered, 1 thread, Zen 4). Through the laundered pointer the epilogue reloads the tile (from L1).
    Where the epilogue reads the tile in its own order, laundering measured from 9% slower to 9% faster
    (ResNet-50, MobileNetV2, SqueezeNet and GPT kernels, both instruction sets), so it is not done there."""
    fn = ir.FunctionType(pointer.type, [pointer.type])
    return b.call(ir.InlineAsm(fn, "", "=r,0", side_effect=False), [pointer])


def emit_mark(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A mark (``isl_ast_node_mark_get_id``): passed to :func:`emit_for` when it marks a ``for``. When the
    marked band was split into pieces (full and partial tiles: isl's ``isolate`` option), the mark's child is
    a block: each piece's loop gets the mark, if it is the loop of the marked schedule dimension
    (``parallel_c<depth>``)."""
    mark, depth = parse_mark(node.mark_get_id().name)
    child = node.mark_get_node()
    parts = [child]
    if child.get_type() == _NODE.block:
        children = child.block_get_children()
        parts = [children.get_at(i) for i in range(children.n_ast_node())]
    for part in parts:
        # "parallel_c3" applies to the loops of schedule dimension 3 (isl iterator c3) only
        marked = part.get_type() == _NODE.for_ and (
            depth is None or part.for_get_iterator().get_id().name == f"c{depth}")
        block = emit_for(k, r, part, block, mark) if marked else emit_node(k, r, part, block)
    return block


def emit_if(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """``if (cond) then [else other]`` (``isl_ast_node_if_get_cond/get_then_node/get_else_node``)."""
    b = X.Builder(block)
    cond = emit_isl_expr(r.ids, node.if_get_cond(), b)
    then_block = b.append_basic_block("if.then")
    join = b.append_basic_block("if.end")
    else_block = b.append_basic_block("if.else") if node.if_has_else_node() else join
    b.cbranch(cond, then_block, else_block)
    outer, r.guarded = r.guarded, True
    try:
        X.Builder(emit_node(k, r, node.if_get_then_node(), then_block)).branch(join)
        if node.if_has_else_node():
            X.Builder(emit_node(k, r, node.if_get_else_node(), else_block)).branch(join)
    finally:
        r.guarded = outer
    return join



# ---- for loops ----

def emit_for(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block, mark: str | None = None) -> ir.Block:
    """A ``for`` node, emitted as its mark asks (see the module docstring); unmarked loops are sequential.

    ``options.parallel=False`` / ``options.vectorize=False`` turn "parallel" / "vector" marks into plain
    loops, so ``Options.naive()`` gives scalar sequential code whatever the schedule says.
    """
    if mark == "parallel" and k.options.parallel:
        return emit_parallel_for(k, r, node, block)
    if mark == "vector" and k.options.vectorize:
        vectorized = emit_vector_for(k, r, node, block)
        if vectorized is not None:
            return vectorized
    if mark == "unroll":
        return emit_unrolled_for(k, r, node, block)
    return emit_sequential_for(k, r, node, block)


def emit_sequential_for(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """``for (it = init; cond; it += inc) body`` (``isl_ast_node_for_get_init/cond/inc/body``) as a loop.

    A loop that is one long float sum into an element that stays put is summed in blocks instead
    (:func:`polyc.codegen.sums.emit_blocked_reduction`), whatever its mark.
    """
    if not node.for_is_degenerate() and (user := blocked_reduction_plan(k, node)) is not None:
        return emit_blocked_reduction(k, r, node, block, user)
    it = node.for_get_iterator().get_id().name
    b = X.Builder(block)
    init = emit_isl_expr(r.ids, node.for_get_init(), b)
    body = node.for_get_body()
    if node.for_is_degenerate():
        return with_id(r, it, init, lambda: emit_node(k, r, body, b.block))
    step = emit_isl_expr(r.ids, node.for_get_inc(), b)
    cond = node.for_get_cond()
    bounds = loop_bounds(node)
    count = reduction_unroll(k.options, node, body)
    md = None if count is None else X.loop_unroll_metadata(k.module, count)
    with r.in_loop(Loop(it, "sequential", bounds and bounds[2], trip_bound(node))):
        return emit_loop(r, b.block, it, init, lambda bb, iv: emit_isl_expr(r.ids, cond, bb), step,
                         lambda blk: emit_node(k, r, body, blk), md)


def reduction_unroll(options: Options, node: isl.AstNode, body: isl.AstNode) -> int | None:
    """How many times LLVM is to unroll the ``for`` node ``node`` whose body is ``body`` (1: not at all), when
    ``body`` is a register tile (an ``unroll`` mark) and the loop may run :data:`REDUCTION_UNROLL_MIN_TRIPS`
    times or more: ``options.reduction_unroll``, None there meaning :data:`REDUCTION_UNROLL`. None, LLVM's
    own choice, for any other loop and when ``options.unroll`` is 0 (LLVM's unroller off)."""
    if options.unroll == 0 or body.get_type() != _NODE.mark or parse_mark(body.mark_get_id().name)[0] != "unroll":
        return None
    trips = trip_bound(node)
    if trips is not None and trips < REDUCTION_UNROLL_MIN_TRIPS:
        return None
    return REDUCTION_UNROLL if options.reduction_unroll is None else options.reduction_unroll


def emit_unrolled_for(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """Full unrolling: the body once per iteration, with the iterator a constant.

    Applies when the init is an integer constant and the bound has a constant part: ``c2 <= 7`` or a tile's
    point loop ``c2 <= min(3, -c0 + 9)`` (at most 4 iterations). When the bound also has a variable part,
    each copy is guarded by the loop condition. Loops of more than ``options.unroll`` iterations
    (None: :data:`MAX_FULL_UNROLL`; 0: every loop), or without such bounds, become a sequential loop.
    """
    bounds = loop_bounds(node)
    limit = MAX_FULL_UNROLL if k.options.unroll is None else k.options.unroll
    if bounds is None or bounds[0].get_type() != isl.ast_expr_type.int:
        return emit_sequential_for(k, r, node, block)
    init_expr, parts, step = bounds
    constant_last = [v + off for e, off in parts for v in constant_terms(e)]
    if not constant_last:
        return emit_sequential_for(k, r, node, block)
    values = range(init_expr.get_val().to_python(), min(constant_last) + 1, step)
    if len(values) > limit:
        return emit_sequential_for(k, r, node, block)
    exact = all(e.get_type() == isl.ast_expr_type.int for e, _ in parts)
    it = node.for_get_iterator().get_id().name
    body, cond = node.for_get_body(), node.for_get_cond()
    scopes = {}  # tensor → one alias scope per copy (disjoint_copies)
    if k.scop.params and len(values) > 1:
        name = k.fresh("copies")
        domain = k.module.add_metadata([ir.MetaDataString(k.module, name)])
        for tensor in disjoint_copies(k, body, it):
            scopes[tensor] = [k.module.add_metadata([ir.MetaDataString(k.module, f"{name}.{tensor}.{v}"), domain])
                              for v in values]

    def copy(value: int, blk: ir.Block) -> ir.Block:
        if exact:
            return emit_node(k, r, body, blk)
        b = X.Builder(blk)
        then_block = b.append_basic_block(f"{it}.{value}")
        join = b.append_basic_block(f"{it}.{value}.end")
        b.cbranch(emit_isl_expr(r.ids, cond, b), then_block, join)
        X.Builder(emit_node(k, r, body, then_block)).branch(join)
        return join

    outer = dict(r.alias)
    for j, value in enumerate(values):
        for tensor, own in scopes.items():
            mine, others = outer.get(tensor, ([], []))
            r.alias[tensor] = (mine + [own[j]], others + own[:j] + own[j + 1:])
        with r.in_loop(Loop(it, "unrolled", step, len(values), first=j == 0)):
            block = with_id(r, it, ir.Constant(I64, value), lambda v=value, blk=block: copy(v, blk))
    r.alias = outer
    return block


# ---- parallel loops on the thread pool (polyc.codegen.pool) ----

def emit_parallel_for(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A "parallel" ``for``: its iterations split into ``options.threads`` chunks
    (:func:`polyc.poly.strategy.threads`).

    The loop is outlined into ``i32 @<kernel>.parN.body(tensors..., i64 lo, i64 hi, live iterators...)``
    running ``for (it = lo; it <= hi; it += step)``, wrapped by the chunk function
    ``ptr @<kernel>.parN(ptr ctx)`` which reads a context struct ``{ptr tensors..., i64 lo, i64 hi, i64
    live..., i32 result}`` and stores the chunk's return code in ``result``. The caller fills one context
    per chunk and hands them all to the process's thread pool (``polyc_parallel_run``,
    :mod:`polyc.codegen.pool`: chunk 0 on the calling thread, the others on waiting workers); it returns
    1 if any chunk did.

    Falls back to :func:`emit_sequential_for` for one thread, inside another parallel loop, or when the
    loop bounds are not of the form :func:`loop_bounds` recognises.
    """
    threads = thread_count(k.options, k.target)
    bounds = loop_bounds(node)
    if threads <= 1 or r.in_parallel or bounds is None:
        return emit_sequential_for(k, r, node, block)
    step = bounds[2]
    it = node.for_get_iterator().get_id().name
    live = sorted(r.ids)
    name = k.fresh("par")

    # the chunk: for (it = lo; it <= hi; it += step) body
    sub, (lo, hi, *live_args) = k.new_region(f"{name}.body", ["lo", "hi"] + live, in_parallel=True)
    sub.ids.update(zip(live, live_args))
    body = node.for_get_body()
    with sub.in_loop(Loop(it, "parallel", step)):
        end = emit_loop(sub, sub.start, it, lo, lambda bb, iv: bb.icmp_signed("<=", iv, hi),
                        ir.Constant(I64, step), lambda blk: emit_node(k, sub, body, blk))
    X.Builder(end).ret(ir.Constant(I32, 0))

    n_tensors = len(k.pointer_names())
    ctx_ty = ir.LiteralStructType([PTR] * n_tensors + [I64, I64] + [I64] * len(live) + [I32])
    result_field = n_tensors + 2 + len(live)
    start = ir.Function(k.module, ir.FunctionType(PTR, [PTR]), name)
    start.linkage = "internal"
    start.attributes.add("nounwind")
    sb = X.Builder(start.append_basic_block("entry"))
    field_types = [PTR] * n_tensors + [I64] * (2 + len(live))
    fields = [sb.load(_field(sb, ctx_ty, start.args[0], i), typ=ty) for i, ty in enumerate(field_types)]
    rc = sb.call(sub.fn, fields)
    sb.store(rc, _field(sb, ctx_ty, start.args[0], result_field))
    sb.ret(ir.Constant(PTR, None))

    # the caller: split [0, n) into T = clamp(n, 1, threads) chunks of iterations, run by the thread pool
    b = X.Builder(block)
    init, _, n = emit_trip_count(r, bounds, b)
    T = smax(b, smin(b, n, ir.Constant(I64, threads)), ir.Constant(I64, 1))
    ctxs = r.alloca(ir.ArrayType(ctx_ty, threads), name=f"{name}.ctx")

    def context(blk: ir.Block) -> ir.Block:
        """Fill chunk t's context: iterations k in [n*t/T, n*(t+1)/T)."""
        bb = X.Builder(blk)
        t = r.ids[".t"]
        ctx = bb.gep(ctxs, [ir.Constant(I64, 0), t], inbounds=True, source_etype=ctxs.allocated_type)
        k0 = bb.sdiv(bb.mul(n, t), T)
        k1 = bb.sdiv(bb.mul(n, bb.add(t, ir.Constant(I64, 1))), T)
        first = bb.add(init, bb.mul(k0, ir.Constant(I64, step)))
        last = bb.add(init, bb.mul(bb.sub(k1, ir.Constant(I64, 1)), ir.Constant(I64, step)))
        values = [r.tensors[p] for p in k.pointer_names()] + [first, last] + [r.ids[v] for v in live]
        for i, v in enumerate(values + [ir.Constant(I32, 0)]):
            bb.store(v, _field(bb, ctx_ty, ctx, i))
        return bb.block

    one = ir.Constant(I64, 1)
    below_T = lambda bb, t: bb.icmp_signed("<", t, T)  # noqa: E731
    after = emit_loop(r, b.block, ".t", ir.Constant(I64, 0), below_T, one, context)
    b = X.Builder(after)
    ctx_bytes = b.ptrtoint(b.gep(ir.Constant(PTR, None), [one], source_etype=ctx_ty), I64)
    b.call(declare_parallel_run(k.module), [start, ctxs, ctx_bytes, T])
    # any chunk failed?
    status = r.alloca(I32, name=f"{name}.status")
    b.store(ir.Constant(I32, 0), status)

    def collect(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        ctx = bb.gep(ctxs, [ir.Constant(I64, 0), r.ids[".t"]], inbounds=True, source_etype=ctxs.allocated_type)
        bb.store(bb.or_(bb.load(status, typ=I32), bb.load(_field(bb, ctx_ty, ctx, result_field), typ=I32)), status)
        return bb.block

    after = emit_loop(r, b.block, ".t", ir.Constant(I64, 0), below_T, one, collect)
    b = X.Builder(after)
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(b.icmp_unsigned("!=", b.load(status, typ=I32), ir.Constant(I32, 0)), r.fail(), done)
    return done


def _field(b: ir.IRBuilder, struct: ir.Type, pointer: ir.Value, i: int) -> ir.Value:
    return b.gep(pointer, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True, source_etype=struct)
