"""isl AST → LLVM IR (llvmlite ``ir``): one ``emit_<node kind>`` per isl AST node type.

The shape follows Tensor Comprehensions' ``codegen_llvm.cc``: :func:`emit_node` dispatches ``for``, ``if``,
``block``, ``user`` and ``mark`` nodes to :func:`emit_for`, :func:`emit_if`, :func:`emit_block`,
:func:`emit_user` and :func:`emit_mark`. The insertion point is explicit: every ``emit_*`` takes the basic
block to append to and returns the block where control continues, so no builder state leaks between them.
:func:`emit_isl_expr` turns isl AST expressions into i64/i1 values; lang expressions (statement bodies)
are emitted by :mod:`polyc.codegen.expr`.

What :func:`emit_kernel` adds to the module, for a Scop named ``mm``::

    define i32 @mm(ptr %args)                 ; args[i] = data pointer of scop.tensors[i]; 0 ok, 1 bad index
    define internal i32 @mm.body(ptr noalias %A, ptr noalias %B, ptr noalias %C)
    define internal ptr @mm.par0(ptr %ctx)    ; per "parallel" mark: the chunk the thread pool runs ...
    define internal i32 @mm.par0.body(ptr noalias %A, ..., i64 %lo, i64 %hi, i64 %c0, ...)  ; ... and chunk

Tensor pointers are ``noalias``: the tensors of one kernel call must not overlap in memory.

Marks on a ``for`` (inserted by the scheduling side with ``insert_mark``) select its emitter in
:func:`emit_for`: ``"parallel"`` → :func:`emit_parallel_for` (outlined body run by the thread pool),
``"vector"`` → :func:`polyc.codegen.vector.emit_vector_for` (LLVM vectors, scalar fallback),
``"unroll"`` → :func:`emit_unrolled_for` (full unroll up to a constant bound), anything else and plain
loops → :func:`emit_sequential_for`.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Callable

import islpy as isl
from llvmlite import ir

from ..errors import CompileError
from ..options import Options
from ..poly.scop import PolyStatement, Scop
from . import expr as X
from .pool import declare_parallel_run
from .target import Target

I1, I8, I32, I64, PTR = X.I1, X.I8, X.I32, X.I64, X.PTR

#: Loops with a constant trip count up to this many iterations are fully unrolled under an "unroll" mark.
MAX_FULL_UNROLL = 64

#: The pointer argument every region function takes after the tensors: an array of one shadow buffer per
#: tensor in ``Kernel.shadows`` (compensated sums, :func:`fold_sum`), allocated by the entry function.
SHADOWS = ".shadows"

_OP = isl.ast_expr_op_type
_NODE = isl.ast_node_type


def new_module(target: Target, name: str = "polyc") -> ir.Module:
    """An empty llvmlite module for ``target`` (its triple set); emit kernels into it with :func:`emit_kernel`."""
    module = ir.Module(name=name)
    module.triple = target.triple
    return module


# ---- the state of one kernel and of one LLVM function being filled ----

@dataclass
class Region:
    """One LLVM function under construction: its tensor pointers, the bound isl iterators, its fail block.

    ``ids`` maps isl AST iterator names (``c0``, ``c1``...) to their current i64 values; ``in_parallel``
    is set in an outlined parallel body (nested "parallel" marks then run sequentially).
    """

    fn: ir.Function
    start: ir.Block
    tensors: dict[str, ir.Value]
    ids: dict[str, ir.Value] = field(default_factory=dict)
    in_parallel: bool = False
    _fail: ir.Block | None = None

    def fail(self) -> ir.Block:
        """The block returning 1 (a data-dependent index was out of range), made on first use."""
        if self._fail is None:
            self._fail = self.fn.append_basic_block("fail")
            ir.IRBuilder(self._fail).ret(ir.Constant(I32, 1))
        return self._fail

    def alloca(self, ty: ir.Type, name: str = "") -> ir.Value:
        """A stack slot in the function's entry block (so loops do not grow the stack)."""
        b = ir.IRBuilder(self.fn.entry_basic_block)
        b.position_at_start(self.fn.entry_basic_block)
        slot = b.alloca(ty, name=name)
        slot.type = PTR  # an opaque pointer, as everywhere else (llvmlite types allocas as T*)
        return slot


@dataclass
class Kernel:
    """What every emitter of one kernel shares: module, Scop, target, options, statements by name."""

    module: ir.Module
    scop: Scop
    target: Target
    options: Options
    statements: dict[str, PolyStatement]
    _counter: itertools.count = field(default_factory=itertools.count)
    #: tensors whose compensated sums (:func:`fold_sum`) keep a shadow buffer, in shadow-array order
    shadows: list[str] = field(default_factory=list)

    def fresh(self, what: str) -> str:
        """A function name unique in the module: ``<kernel>.<what><n>``."""
        return f"{X.ir_name(self.scop.name)}.{what}{next(self._counter)}"

    def env(self, region: Region, indices: dict[str, ir.Value], stmt: PolyStatement) -> X.Env:
        """The environment ``stmt``'s expressions are emitted in (scalar)."""
        return X.Env(self.module, self.scop, region.tensors, indices, region.fail, safe_reads=stmt.safe_reads)

    def pointer_names(self) -> list[str]:
        """The pointer arguments of every region function: the tensors in Scop order, then :data:`SHADOWS`."""
        return [t.name for t in self.scop.tensors] + [SHADOWS]

    def new_region(self, name: str, extra: list[str], in_parallel: bool = False) -> tuple[Region, list]:
        """``define internal i32 @name(ptr noalias %<tensor>..., ptr noalias %.shadows, i64 %<extra>...)``
        and its Region.

        Returns the region and the i64 arguments named by ``extra``.
        """
        pointers = self.pointer_names()
        fnty = ir.FunctionType(I32, [PTR] * len(pointers) + [I64] * len(extra))
        fn = ir.Function(self.module, fnty, name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        for arg, n in zip(fn.args, pointers):
            arg.name = X.ir_name(n)
            arg.add_attribute("noalias")
        for arg, n in zip(fn.args[len(pointers):], extra):
            arg.name = n
        entry = fn.append_basic_block("entry")
        start = fn.append_basic_block("start")
        ir.IRBuilder(entry).branch(start)
        region = Region(fn, start, dict(zip(pointers, fn.args)), in_parallel=in_parallel)
        return region, list(fn.args[len(pointers):])

    def shadow(self, r: Region, tensor: str, b: ir.IRBuilder) -> ir.Value:
        """The shadow buffer of ``tensor`` in region ``r`` (registered on first use; :func:`fold_sum`)."""
        if tensor not in self.shadows:
            self.shadows.append(tensor)
        slot = b.gep(r.tensors[SHADOWS], [ir.Constant(I64, self.shadows.index(tensor))], inbounds=True,
                     source_etype=PTR)
        return b.load(slot, typ=PTR, align=8)


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
    kernel = Kernel(module, scop, target, options, {s.name: s for s in scop.statements})
    fn = ir.Function(module, ir.FunctionType(I32, [PTR]), scop.name)
    fn.args[0].name = "args"
    fn.attributes.add("nounwind")
    region, _ = kernel.new_region(f"{scop.name}.body", [])
    end = emit_node(kernel, region, ast, region.start) if ast is not None else region.start
    ir.IRBuilder(end).ret(ir.Constant(I32, 0))

    b = ir.IRBuilder(fn.append_basic_block("entry"))
    pointers, locals_ = [], []
    for i, t in enumerate(scop.tensors):
        if t.role == "local":
            pointers.append(_allocate(module, fn, b, t))
            locals_.append(pointers[-1])
            continue
        slot = b.gep(fn.args[0], [ir.Constant(I64, i)], inbounds=True, source_etype=PTR)
        pointers.append(b.load(slot, name=X.ir_name(t.name), typ=PTR, align=8))
    shadows = _allocate_shadows(kernel, fn, b)
    locals_ += shadows[1]
    status = b.call(region.fn, pointers + [shadows[0]])
    free = X.declare(module, "free", ir.FunctionType(ir.VoidType(), [PTR]))
    for p in locals_:
        b.call(free, [p])
    b.ret(status)
    return fn


def _allocate_shadows(k: Kernel, fn: ir.Function, b: ir.IRBuilder) -> tuple[ir.Value, list[ir.Value]]:
    """``(array, buffers)``: one zeroed shadow buffer (``calloc``: 8 bytes per element of the tensor, two for
    float64, see :func:`fold_sum`) per tensor in ``k.shadows``, and the array of their pointers the region functions
    take as :data:`SHADOWS` (a null pointer when there is none). The kernel returns STATUS_NO_MEMORY when an
    allocation fails. Leaves ``b`` where the buffers are valid."""
    if not k.shadows:
        return ir.Constant(PTR, None), []
    calloc = X.declare(k.module, "calloc", ir.FunctionType(PTR, [I64, I64]))
    free = X.declare(k.module, "free", ir.FunctionType(ir.VoidType(), [PTR]))
    array = b.alloca(ir.ArrayType(PTR, len(k.shadows)), name="shadows")
    array.type = PTR
    buffers, failed = [], ir.Constant(I1, 0)
    for i, name in enumerate(k.shadows):
        t = k.scop.tensor(name)
        p = b.call(calloc, [ir.Constant(I64, max(1, t.size)), ir.Constant(I64, 16)],
                   name=X.ir_name(f"{name}.shadow"))
        b.store(p, b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR))
        failed = b.or_(failed, b.icmp_unsigned("==", p, ir.Constant(PTR, None)))
        buffers.append(p)
    ok = fn.append_basic_block("shadows.allocated")
    no_memory = fn.append_basic_block("shadows.no_memory")
    b.cbranch(failed, no_memory, ok)
    nb = ir.IRBuilder(no_memory)
    for p in buffers:
        nb.call(free, [p])
    nb.ret(ir.Constant(I32, STATUS_NO_MEMORY))
    b.position_at_end(ok)
    return array, buffers


#: Status a kernel returns when a local buffer (a packed operand) cannot be allocated.
STATUS_NO_MEMORY = 2


def _allocate(module: ir.Module, fn: ir.Function, b: ir.IRBuilder, t) -> ir.Value:
    """``aligned_alloc(64, bytes)`` for local tensor ``t`` (a promoted buffer, not an argument); the kernel
    returns STATUS_NO_MEMORY when it fails. Leaves ``b`` in the block where the pointer is valid."""
    nbytes = max(64, -(-t.size * X.element_bytes(t.dtype) // 64) * 64)
    alloc = X.declare(module, "aligned_alloc", ir.FunctionType(PTR, [I64, I64]))
    pointer = b.call(alloc, [ir.Constant(I64, 64), ir.Constant(I64, nbytes)], name=X.ir_name(t.name))
    ok = fn.append_basic_block(X.ir_name(f"{t.name}.allocated"))
    failed = fn.append_basic_block(X.ir_name(f"{t.name}.no_memory"))
    b.cbranch(b.icmp_unsigned("==", pointer, ir.Constant(PTR, None)), failed, ok)
    ir.IRBuilder(failed).ret(ir.Constant(I32, STATUS_NO_MEMORY))
    b.position_at_end(ok)
    return pointer


# ---- isl AST nodes ----

def emit_node(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
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


def emit_block(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A sequence of nodes (``isl_ast_node_block_get_children``), in order."""
    children = node.block_get_children()
    for i in range(children.n_ast_node()):
        block = emit_node(k, r, children.get_at(i), block)
    return block


def emit_mark(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A mark (``isl_ast_node_mark_get_id``): passed to :func:`emit_for` when it marks a ``for``. When the
    marked band was split into pieces (full and partial tiles: isl's ``isolate`` option), the mark's child is
    a block: each piece's loop gets the mark, if it is the loop of the marked schedule dimension
    (``parallel_c<depth>``)."""
    mark, _, depth = node.mark_get_id().name.partition("_c")
    child = node.mark_get_node()
    parts = [child]
    if child.get_type() == _NODE.block:
        children = child.block_get_children()
        parts = [children.get_at(i) for i in range(children.n_ast_node())]
    for part in parts:
        # "parallel_c3" applies to the loops of schedule dimension 3 (isl iterator c3) only
        marked = part.get_type() == _NODE.for_ and (
            not depth or part.for_get_iterator().get_id().name == f"c{depth}")
        block = emit_for(k, r, part, block, mark) if marked else emit_node(k, r, part, block)
    return block


def emit_if(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """``if (cond) then [else other]`` (``isl_ast_node_if_get_cond/get_then_node/get_else_node``)."""
    b = ir.IRBuilder(block)
    cond = emit_isl_expr(r.ids, node.if_get_cond(), b)
    then_block = b.append_basic_block("if.then")
    join = b.append_basic_block("if.end")
    else_block = b.append_basic_block("if.else") if node.if_has_else_node() else join
    b.cbranch(cond, then_block, else_block)
    ir.IRBuilder(emit_node(k, r, node.if_get_then_node(), then_block)).branch(join)
    if node.if_has_else_node():
        ir.IRBuilder(emit_node(k, r, node.if_get_else_node(), else_block)).branch(join)
    return join


def emit_user(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A statement instance ``S(e0, e1, ...)``: evaluate the rhs, combine with the lhs element, store."""
    b = ir.IRBuilder(block)
    stmt, values = statement_call(k, r, node, b)
    emit_statement(k.env(r, values, stmt), stmt, b)
    return b.block


def statement_call(k: Kernel, r: Region, node: isl.AstNode, b: ir.IRBuilder):
    """The statement of user node ``node`` and its index values (lang index name → i64)."""
    call = node.user_get_expr()
    name = call.get_op_arg(0).get_id().name
    stmt = k.statements.get(name)
    if stmt is None:
        raise CompileError(f"codegen: the AST calls {name!r}, which is not a statement of {k.scop.name}")
    if call.get_op_n_arg() - 1 != len(stmt.indices):
        raise CompileError(f"codegen: {name} has indices {stmt.indices} but the AST passes "
                           f"{call.get_op_n_arg() - 1} values")
    values = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), b) for n, i in enumerate(stmt.indices)}
    return stmt, values


def emit_statement(env: X.Env, stmt: PolyStatement, b: ir.IRBuilder) -> None:
    """``tensor[lhs] (op)= rhs`` for one instance whose index values are ``env.indices``."""
    dtype = env.scop.tensor(stmt.tensor).dtype
    flat = X.flat_index(env, stmt.tensor, [env.indices[i] for i in stmt.lhs], b)
    old = X.load(env, stmt.tensor, flat, b) if stmt.op not in ("init", "=") else None
    X.store(env, stmt.tensor, flat, X.emit_update(env, stmt.op, dtype, stmt.rhs, old, b), b)


# ---- compensated sums ----

#: Float ``+=`` reductions of at least this many terms per element accumulate in register partials of at most
#: this many terms (numpy's pairwise block: 128) that are added to the element with :func:`fold_sum`.
SUM_BLOCK = 128


def compensated(k: Kernel, stmt: PolyStatement) -> bool:
    """Whether ``stmt`` is a float ``+=`` reduction long enough (more than :data:`SUM_BLOCK` terms per element,
    from the Scop's index ranges) to be summed in blocks with :func:`fold_sum`."""
    if stmt.op != "+=" or k.scop.tensor(stmt.tensor).dtype not in ("float32", "float64"):
        return False
    terms = 1
    for index in stmt.indices:
        if index not in stmt.lhs:
            lo, hi = k.scop.ranges.get((stmt.name, index), (0, 0))
            terms *= max(0, hi - lo)
    return terms > SUM_BLOCK


def fold_sum(k: Kernel, r: Region, tensor: str, flat: ir.Value, partial: ir.Value, b: ir.IRBuilder) -> None:
    """``tensor[flat] += partial``, where the running sum keeps more precision than the element.

    A long reduction adds many block partials (register sums of at most :data:`SUM_BLOCK` terms, or a vector
    reduction's fold) to one element; added plainly, the error grows with the number of partials. Here the
    element's shadow (8 bytes per element of the tensor, ``Kernel.shadow``) keeps the running sum in more
    precision, and the element holds it rounded. For float32 the shadow is a double ``s``::

        if ((float)s != T) s = T;      // T was written by anything else (init, plain update, NaN): restart
        s += (double)x;  T = (float)s;

    For float64 it is Neumaier's compensated sum (Kahan's variant that also holds when ``|x| > |s|``): the
    running sum ``s`` and the rounding error ``c`` lost so far, with ``T = s + c``::

        if (s + c != T) { s = T; c = 0; }
        t = s + x;  c += |s| >= |x| ? (s - t) + x : (x - t) + s;  s = t;  T = s + c   // c kept if t is inf

    Either way the element's error stays about one rounding whatever the number of partials, and the
    shadow needs no initialisation beyond zero (the check restarts it from the element).
    """
    dtype = k.scop.tensor(tensor).dtype
    ty = X.llvm_type(dtype)
    env = X.Env(k.module, k.scop, r.tensors, {}, r.fail)
    element = X.element_pointer(env, tensor, flat, b)
    old = b.load(element, typ=ty)
    base = k.shadow(r, tensor, b)
    if dtype == "float32":
        wide = ir.DoubleType()
        s_ptr = b.gep(base, [b.mul(flat, ir.Constant(I64, 2))], inbounds=True, source_etype=wide)
        copy_ptr = b.gep(s_ptr, [ir.Constant(I64, 1)], inbounds=True, source_etype=wide)
        s, copy = b.load(s_ptr, typ=wide), b.load(copy_ptr, typ=I32)
        x = b.fpext(partial, wide)
        # both sums, then the choice (bits of T against those last stored): the check stays off the chain
        # of dependent adds through s
        valid = b.icmp_unsigned("==", b.bitcast(old, I32), copy)
        s = b.select(valid, b.fadd(s, x), b.fadd(b.fpext(old, wide), x))
        result = b.fptrunc(s, ty)
        b.store(s, s_ptr)
        b.store(b.bitcast(result, I32), copy_ptr)
        b.store(result, element)
        return
    s_ptr = b.gep(base, [b.mul(flat, ir.Constant(I64, 2))], inbounds=True, source_etype=ty)
    c_ptr = b.gep(s_ptr, [ir.Constant(I64, 1)], inbounds=True, source_etype=ty)
    s, c = b.load(s_ptr, typ=ty), b.load(c_ptr, typ=ty)
    valid = b.fcmp_ordered("==", b.fadd(s, c), old)
    s, c = b.select(valid, s, old), b.select(valid, c, ir.Constant(ty, 0.0))
    t = b.fadd(s, partial)
    fabs = X.intrinsic(k.module, "fabs", ty, 1)
    s_big = b.fcmp_ordered(">=", b.call(fabs, [s]), b.call(fabs, [partial]))
    error = b.select(s_big, b.fadd(b.fsub(s, t), partial), b.fadd(b.fsub(partial, t), s))
    finite = b.fcmp_ordered("!=", b.call(fabs, [t]), ir.Constant(ty, float("inf")))
    c = b.select(finite, b.fadd(c, error), c)
    b.store(t, s_ptr)
    b.store(c, c_ptr)
    b.store(b.fadd(t, c), element)


# ---- for loops ----

def emit_for(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block, mark: str | None = None) -> ir.Block:
    """A ``for`` node, emitted as its mark asks (see the module docstring); unmarked loops are sequential.

    ``options.parallel=False`` / ``options.vectorize=False`` turn "parallel" / "vector" marks into plain
    loops, so ``Options.naive()`` gives scalar sequential code whatever the schedule says.
    """
    if mark == "parallel" and k.options.parallel:
        return emit_parallel_for(k, r, node, block)
    if mark == "vector" and k.options.vectorize:
        from .vector import emit_vector_for  # vector.py builds on this module
        return emit_vector_for(k, r, node, block)
    if mark == "unroll":
        return emit_unrolled_for(k, r, node, block)
    return emit_sequential_for(k, r, node, block)


def emit_sequential_for(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """``for (it = init; cond; it += inc) body`` (``isl_ast_node_for_get_init/cond/inc/body``) as a loop.

    A loop that is one long float sum into an element that stays put is summed in blocks instead
    (:func:`polyc.codegen.vector.emit_blocked_reduction`), whatever its mark.
    """
    from .vector import blocked_reduction_plan, emit_blocked_reduction  # vector.py builds on this module
    if not node.for_is_degenerate() and (user := blocked_reduction_plan(k, node)) is not None:
        return emit_blocked_reduction(k, r, node, block, user)
    it = node.for_get_iterator().get_id().name
    b = ir.IRBuilder(block)
    init = emit_isl_expr(r.ids, node.for_get_init(), b)
    body = node.for_get_body()
    if node.for_is_degenerate():
        return with_id(r, it, init, lambda: emit_node(k, r, body, b.block))
    step = emit_isl_expr(r.ids, node.for_get_inc(), b)
    cond = node.for_get_cond()
    return emit_loop(r, b.block, it, init, lambda bb, iv: emit_isl_expr(r.ids, cond, bb), step,
                     lambda blk: emit_node(k, r, body, blk))


def emit_unrolled_for(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """Full unrolling: the body once per iteration, with the iterator a constant.

    Applies when the init is an integer constant and the bound has a constant part: ``c2 <= 7`` or a tile's
    point loop ``c2 <= min(3, -c0 + 9)`` (at most 4 iterations). When the bound also has a variable part,
    each copy is guarded by the loop condition. Loops of more than ``max(options.unroll,``
    :data:`MAX_FULL_UNROLL` ``)`` iterations, or without such bounds, become a sequential loop.
    """
    bounds = loop_bounds(node)
    limit = max(MAX_FULL_UNROLL, k.options.unroll)
    if bounds is None or bounds[0].get_type() != isl.ast_expr_type.int:
        return emit_sequential_for(k, r, node, block)
    init_expr, parts, step = bounds
    constant_last = [v + off for e, off in parts for v in _constant_terms(e)]
    if not constant_last:
        return emit_sequential_for(k, r, node, block)
    values = range(init_expr.get_val().to_python(), min(constant_last) + 1, step)
    if len(values) > limit:
        return emit_sequential_for(k, r, node, block)
    exact = all(e.get_type() == isl.ast_expr_type.int for e, _ in parts)
    it = node.for_get_iterator().get_id().name
    body, cond = node.for_get_body(), node.for_get_cond()

    def copy(value: int, blk: ir.Block) -> ir.Block:
        if exact:
            return emit_node(k, r, body, blk)
        b = ir.IRBuilder(blk)
        then_block = b.append_basic_block(f"{it}.{value}")
        join = b.append_basic_block(f"{it}.{value}.end")
        b.cbranch(emit_isl_expr(r.ids, cond, b), then_block, join)
        ir.IRBuilder(emit_node(k, r, body, then_block)).branch(join)
        return join

    for value in values:
        block = with_id(r, it, ir.Constant(I64, value), lambda v=value, blk=block: copy(v, blk))
    return block


def _constant_terms(e: isl.AstExpr) -> list[int]:
    """Integer constants ``c`` with ``e <= c``: ``e`` itself, or constant arguments of a ``min``."""
    if e.get_type() == isl.ast_expr_type.int:
        return [e.get_val().to_python()]
    if e.get_type() == isl.ast_expr_type.op and e.get_op_type() == _OP.min:
        return [v for i in range(e.get_op_n_arg()) for v in _constant_terms(e.get_op_arg(i))]
    return []


def emit_loop(r: Region, block: ir.Block, name: str, init: ir.Value,
              cond: Callable[[ir.IRBuilder, ir.Value], ir.Value], step: ir.Value,
              body: Callable[[ir.Block], ir.Block]) -> ir.Block:
    """A loop ``for (name = init; cond(name); name += step) body`` on i64, with ``name`` bound in ``r.ids``.

    ``cond(builder, iv)`` gives the i1 continuation test; ``body(block)`` fills the body and returns its
    last block. Returns the exit block.
    """
    b = ir.IRBuilder(block)
    header = b.append_basic_block(f"{name}.head")
    body_block = b.append_basic_block(f"{name}.body")
    exit_block = b.append_basic_block(f"{name}.exit")
    pre = b.block
    b.branch(header)
    b.position_at_end(header)
    iv = b.phi(I64, name=name)
    iv.add_incoming(init, pre)

    def run() -> ir.Block:
        b.cbranch(cond(b, iv), body_block, exit_block)
        end = body(body_block)
        tail = ir.IRBuilder(end)
        iv.add_incoming(tail.add(iv, step, name=f"{name}.next", flags=("nsw",)), end)
        tail.branch(header)
        return exit_block

    return with_id(r, name, iv, run)


def with_id(r: Region, name: str, value: ir.Value, emit: Callable[[], ir.Block]) -> ir.Block:
    """Run ``emit()`` with isl iterator ``name`` bound to ``value`` (restoring any outer binding)."""
    outer = r.ids.get(name)
    r.ids[name] = value
    try:
        return emit()
    finally:
        if outer is None:
            del r.ids[name]
        else:
            r.ids[name] = outer


def loop_bounds(node: isl.AstNode) -> tuple[isl.AstExpr, list[tuple[isl.AstExpr, int]], int] | None:
    """``(init, [(bound, offset)...], step)`` when the ``for`` runs ``init <= it <= min(bound + offset)``.

    Recognises conditions ``it <= e``, ``it < e``, ``e >= it``, ``e > it`` and conjunctions of them (what
    ``isl_ast_build`` produces) with a constant positive increment. None otherwise (or for a degenerate
    loop, which has a single iteration).
    """
    if node.for_is_degenerate():
        return None
    inc = node.for_get_inc()
    if inc.get_type() != isl.ast_expr_type.int or inc.get_val().to_python() <= 0:
        return None
    it = node.for_get_iterator().get_id().name
    parts = _upper_bounds(node.for_get_cond(), it)
    if parts is None:
        return None
    return node.for_get_init(), parts, inc.get_val().to_python()


def _upper_bounds(cond: isl.AstExpr, it: str) -> list[tuple[isl.AstExpr, int]] | None:
    if cond.get_type() != isl.ast_expr_type.op:
        return None
    op = cond.get_op_type()
    if op in (_OP.and_, _OP.and_then):
        left, right = _upper_bounds(cond.get_op_arg(0), it), _upper_bounds(cond.get_op_arg(1), it)
        return None if left is None or right is None else left + right
    forms = {_OP.le: (0, 0), _OP.lt: (0, -1), _OP.ge: (1, 0), _OP.gt: (1, -1)}
    if op not in forms:
        return None
    side, offset = forms[op]
    var, bound = cond.get_op_arg(side), cond.get_op_arg(1 - side)
    if var.get_type() != isl.ast_expr_type.id or var.get_id().name != it or uses_id(bound, it):
        return None
    return [(bound, offset)]


def uses_id(e: isl.AstExpr, name: str) -> bool:
    """Whether isl AST expression ``e`` refers to identifier ``name``."""
    t = e.get_type()
    if t == isl.ast_expr_type.id:
        return e.get_id().name == name
    if t == isl.ast_expr_type.op:
        return any(uses_id(e.get_op_arg(i), name) for i in range(e.get_op_n_arg()))
    return False


def emit_trip_count(r: Region, bounds, b: ir.IRBuilder) -> tuple[ir.Value, ir.Value, ir.Value]:
    """``(init, last, n)`` as i64 values: first iterator value, inclusive bound, iteration count (≥ 0)."""
    init_expr, parts, step = bounds
    init = emit_isl_expr(r.ids, init_expr, b)
    last = None
    for e, offset in parts:
        value = b.add(emit_isl_expr(r.ids, e, b), ir.Constant(I64, offset))
        last = value if last is None else _smin(b, last, value)
    span = X.int_div_mod(b, b.sub(last, init), ir.Constant(I64, step), False, "div")
    n = b.add(span, ir.Constant(I64, 1))
    n = b.select(b.icmp_signed("<", n, ir.Constant(I64, 0)), ir.Constant(I64, 0), n)
    return init, last, n


# ---- parallel loops on the thread pool (polyc.codegen.pool) ----

def emit_parallel_for(k: Kernel, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A "parallel" ``for``: its iterations split into ``options.threads`` (None: ``target.cores``) chunks.

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
    threads = k.options.threads or k.target.cores
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
    end = emit_loop(sub, sub.start, it, lo, lambda bb, iv: bb.icmp_signed("<=", iv, hi),
                    ir.Constant(I64, step), lambda blk: emit_node(k, sub, body, blk))
    ir.IRBuilder(end).ret(ir.Constant(I32, 0))

    n_tensors = len(k.pointer_names())
    ctx_ty = ir.LiteralStructType([PTR] * n_tensors + [I64, I64] + [I64] * len(live) + [I32])
    result_field = n_tensors + 2 + len(live)
    start = ir.Function(k.module, ir.FunctionType(PTR, [PTR]), name)
    start.linkage = "internal"
    start.attributes.add("nounwind")
    sb = ir.IRBuilder(start.append_basic_block("entry"))
    field_types = [PTR] * n_tensors + [I64] * (2 + len(live))
    fields = [sb.load(_field(sb, ctx_ty, start.args[0], i), typ=ty) for i, ty in enumerate(field_types)]
    rc = sb.call(sub.fn, fields)
    sb.store(rc, _field(sb, ctx_ty, start.args[0], result_field))
    sb.ret(ir.Constant(PTR, None))

    # the caller: split [0, n) into T = clamp(n, 1, threads) chunks of iterations, run by the thread pool
    b = ir.IRBuilder(block)
    init, _, n = emit_trip_count(r, bounds, b)
    T = _smax(b, _smin(b, n, ir.Constant(I64, threads)), ir.Constant(I64, 1))
    ctxs = r.alloca(ir.ArrayType(ctx_ty, threads), name=f"{name}.ctx")

    def context(blk: ir.Block) -> ir.Block:
        """Fill chunk t's context: iterations k in [n*t/T, n*(t+1)/T)."""
        bb = ir.IRBuilder(blk)
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
    b = ir.IRBuilder(after)
    ctx_bytes = b.ptrtoint(b.gep(ir.Constant(PTR, None), [one], source_etype=ctx_ty), I64)
    b.call(declare_parallel_run(k.module), [start, ctxs, ctx_bytes, T])
    # any chunk failed?
    status = r.alloca(I32, name=f"{name}.status")
    b.store(ir.Constant(I32, 0), status)

    def collect(blk: ir.Block) -> ir.Block:
        bb = ir.IRBuilder(blk)
        ctx = bb.gep(ctxs, [ir.Constant(I64, 0), r.ids[".t"]], inbounds=True, source_etype=ctxs.allocated_type)
        bb.store(bb.or_(bb.load(status, typ=I32), bb.load(_field(bb, ctx_ty, ctx, result_field), typ=I32)), status)
        return bb.block

    after = emit_loop(r, b.block, ".t", ir.Constant(I64, 0), below_T, one, collect)
    b = ir.IRBuilder(after)
    done = b.append_basic_block(f"{name}.done")
    b.cbranch(b.icmp_unsigned("!=", b.load(status, typ=I32), ir.Constant(I32, 0)), r.fail(), done)
    return done


def _field(b: ir.IRBuilder, struct: ir.Type, pointer: ir.Value, i: int) -> ir.Value:
    return b.gep(pointer, [ir.Constant(I32, 0), ir.Constant(I32, i)], inbounds=True, source_etype=struct)


# ---- isl AST expressions ----

def emit_isl_expr(ids: dict[str, ir.Value], e: isl.AstExpr, b: ir.IRBuilder) -> ir.Value:
    """An isl AST expression as an i64 value (i1 for conditions); iterators are looked up in ``ids``.

    Covers every operator ``isl_ast_build`` emits: ``and and_then or or_else`` (i1; operands have no side
    effects, so both are evaluated), ``max min minus add sub mul``, ``div`` (exact), ``fdiv_q`` (floor),
    ``pdiv_q pdiv_r zdiv_r`` (non-negative dividend / remainder compared with 0: ``sdiv``/``srem``),
    ``cond select`` and the comparisons ``eq le lt ge gt`` (signed); plus integers and identifiers.
    Raises CompileError on anything else (``call``, ``access``, ``member``, ``address_of``).
    """
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return ir.Constant(I64, e.get_val().to_python())
    if t == isl.ast_expr_type.id:
        name = e.get_id().name
        if name not in ids:
            raise CompileError(f"codegen: isl AST uses {name!r}, which no enclosing loop defines")
        return ids[name]
    op = e.get_op_type()
    args = [emit_isl_expr(ids, e.get_op_arg(i), b) for i in range(e.get_op_n_arg())]
    if op in (_OP.and_, _OP.and_then):
        return b.and_(_truth(b, args[0]), _truth(b, args[1]))
    if op in (_OP.or_, _OP.or_else):
        return b.or_(_truth(b, args[0]), _truth(b, args[1]))
    if op == _OP.max:
        return _fold(b, _smax, args)
    if op == _OP.min:
        return _fold(b, _smin, args)
    if op == _OP.minus:
        return b.sub(ir.Constant(I64, 0), args[0])
    if op == _OP.add:
        return b.add(args[0], args[1], flags=("nsw",))
    if op == _OP.sub:
        return b.sub(args[0], args[1], flags=("nsw",))
    if op == _OP.mul:
        return b.mul(args[0], args[1], flags=("nsw",))
    if op in (_OP.div, _OP.pdiv_q):
        return b.sdiv(args[0], args[1])
    if op == _OP.fdiv_q:
        return X.int_div_mod(b, args[0], args[1], False, "div")
    if op in (_OP.pdiv_r, _OP.zdiv_r):
        return b.srem(args[0], args[1])
    if op in (_OP.cond, _OP.select):
        return b.select(_truth(b, args[0]), args[1], args[2])
    compare = {_OP.eq: "==", _OP.le: "<=", _OP.lt: "<", _OP.ge: ">=", _OP.gt: ">"}
    if op in compare:
        return b.icmp_signed(compare[op], args[0], args[1])
    raise CompileError(f"codegen: unsupported isl AST operator {op}")


def _truth(b: ir.IRBuilder, v: ir.Value) -> ir.Value:
    """An i1 condition: comparisons already are; an i64 is ``!= 0`` (C's truth)."""
    return v if v.type == I1 else b.icmp_signed("!=", v, ir.Constant(v.type, 0))


def _fold(b: ir.IRBuilder, f, args: list[ir.Value]) -> ir.Value:
    result = args[0]
    for a in args[1:]:
        result = f(b, result, a)
    return result


def _smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def _smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)
