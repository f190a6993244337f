"""What every emitter of a kernel shares: the kernel and the LLVM function being filled, loops, isl
expressions, statement instances.

:class:`KernelEmitter` holds what is fixed for one kernel (module, Scop, target, options); :class:`Region` one LLVM
function under construction (its tensor pointers, the bound isl iterators, its fail block). On them:
:func:`emit_loop` / :func:`with_id` build an i64 loop and bind an iterator, :func:`loop_bounds` /
:func:`emit_trip_count` read and evaluate a ``for`` node's bounds, :func:`emit_isl_expr` turns an isl AST
expression into a value, and :func:`emit_user` emits one statement instance ``S(e0, e1, ...)``.
:mod:`polyc.codegen.llvm` walks the isl AST with these; :mod:`polyc.codegen.vector` and
:mod:`polyc.codegen.sums` emit the loops they take over with them.
"""
from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Callable

import islpy as isl
from llvmlite import ir

from ..errors import CompileError
from ..lang import ast as L
from ..options import Options
from ..poly.affine import isl_name
from ..poly.scop import PolyStatement, Scop
from ..target import Target
from . import expr as X

I1, I32, I64, PTR = X.I1, X.I32, X.I64, X.PTR
_OP = isl.ast_expr_op_type


# ---- the state of one kernel and of one LLVM function being filled ----

#: The pointer argument every region function takes after the tensors: an array of one shadow buffer per
#: tensor in ``KernelEmitter.shadows`` (compensated sums, :func:`~polyc.codegen.sums.fold_sum`), allocated by the entry
#: function.
SHADOWS = ".shadows"


@dataclass(frozen=True)
class Loop:
    """One enclosing loop of the code being emitted (:attr:`Region.loops`): its iterator, how it is emitted
    (``"sequential"``, ``"unrolled"`` (one copy), ``"vector"``, ``"parallel"``), its step, at most how many
    times it runs (:func:`trip_bound`; None: unknown) and, for an unrolled copy, whether it is the first."""

    name: str
    kind: str
    step: int | None = None
    trip: int | None = None
    first: bool = True


def trip_bound(node: isl.AstNode) -> int | None:
    """At most how many times ``for`` node ``node`` runs, when its init is an integer constant and its bound
    has a constant part (``c7 <= min(127, -c3 + 299)``: 128); else None."""
    bounds = loop_bounds(node)
    if bounds is None or bounds[0].get_type() != isl.ast_expr_type.int:
        return None
    init, parts, step = bounds
    last = [v + off for e, off in parts for v in constant_terms(e)]
    return max(0, (min(last) - init.get_val().to_python()) // step + 1) if last else None


def constant_terms(e: isl.AstExpr) -> list[int]:
    """Integer constants ``c`` with ``e <= c``: ``e`` itself, or constant arguments of a ``min``."""
    if e.get_type() == isl.ast_expr_type.int:
        return [e.get_val().to_python()]
    if e.get_type() == isl.ast_expr_type.op and e.get_op_type() == _OP.min:
        return [v for i in range(e.get_op_n_arg()) for v in constant_terms(e.get_op_arg(i))]
    return []


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
    #: set while the branches of an ``if`` node are emitted (:func:`polyc.codegen.vector.emit_vector_for` keeps
    #: a guarded vector loop in loop form)
    guarded: bool = False
    #: tensor → (alias scopes, noalias scopes) its loads and stores carry here (:func:`disjoint_copies`)
    alias: dict[str, tuple[list, list]] = field(default_factory=dict)
    #: the loops around the code being emitted, outermost first (:func:`in_loop`; read by
    #: :mod:`polyc.codegen.prefetch`)
    loops: list[Loop] = field(default_factory=list)
    _fail: ir.Block | None = None

    @contextlib.contextmanager
    def in_loop(self, loop: Loop):
        """Emit the body of ``loop`` within this context: it is on :attr:`loops` meanwhile."""
        self.loops.append(loop)
        try:
            yield
        finally:
            self.loops.pop()

    def fail(self) -> ir.Block:
        """The block returning 1 (a data-dependent index was out of range), made on first use."""
        if self._fail is None:
            self._fail = self.fn.append_basic_block("fail")
            X.Builder(self._fail).ret(ir.Constant(I32, 1))
        return self._fail

    def alloca(self, ty: ir.Type, name: str = "") -> ir.Value:
        """A stack slot in the function's entry block (so loops do not grow the stack)."""
        b = X.Builder(self.fn.entry_basic_block)
        b.position_at_start(self.fn.entry_basic_block)
        slot = b.alloca(ty, name=name)
        slot.type = PTR  # an opaque pointer, as everywhere else (llvmlite types allocas as T*)
        return slot


@dataclass
class KernelEmitter:
    """What every emitter of one kernel shares: module, Scop, target, options, statements by name."""

    module: ir.Module
    scop: Scop
    target: Target
    options: Options
    statements: dict[str, PolyStatement]
    _counter: itertools.count = field(default_factory=itertools.count)
    #: tensors whose compensated sums (:func:`~polyc.codegen.sums.fold_sum`) keep a shadow buffer, in shadow-array order
    shadows: list[str] = field(default_factory=list)

    def fresh(self, what: str) -> str:
        """A function name unique in the module: ``<kernel>.<what><n>``."""
        return f"{X.ir_name(self.scop.name)}.{what}{next(self._counter)}"

    def env(self, region: Region, indices: dict[str, ir.Value], stmt: PolyStatement) -> X.Env:
        """The environment ``stmt``'s expressions are emitted in (scalar)."""
        return X.Env(self.module, self.scop, region.tensors, indices, region.fail, safe_reads=stmt.safe_reads,
                     **self.env_args(region))

    def env_args(self, region: Region) -> dict:
        """What an :class:`~polyc.codegen.expr.Env` takes from the region: the run-time sizes
        (:meth:`size_values`) and the alias scopes of the unrolled copy being emitted."""
        return {"sizes": self.size_values(region), "alias": dict(region.alias)}

    def size_values(self, region: Region) -> dict[str, ir.Value]:
        """A generic kernel's run-time sizes in ``region`` (:attr:`polyc.codegen.expr.Env.sizes`): the
        parameters and the size-dependent extents, bound as ids (:func:`polyc.codegen.llvm.emit_kernel`), so
        that outlined parallel bodies receive them with the loop iterators. Empty when specialised."""
        return {name: region.ids[isl_id] for name, isl_id in self.size_ids}

    @property
    def size_ids(self) -> list[tuple[str, str]]:
        """``(name, id)`` of :meth:`size_values`: each parameter (``Scop.params``, its id isl's spelling),
        then ``"T.k"`` per extent of a tensor that depends on the sizes."""
        names = [(p, isl_name(p)) for p in self.scop.params]
        for t in self.scop.tensors:
            names += [(f"{t.name}.{k}",) * 2 for k, e in enumerate(t.extents) if type(e) is not int]
        return names

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
        X.Builder(entry).branch(start)
        region = Region(fn, start, dict(zip(pointers, fn.args)), in_parallel=in_parallel)
        return region, list(fn.args[len(pointers):])

    def shadow(self, r: Region, tensor: str, b: ir.IRBuilder) -> ir.Value:
        """The shadow buffer of ``tensor`` in region ``r`` (registered on first use;
        :func:`~polyc.codegen.sums.fold_sum`)."""
        if tensor not in self.shadows:
            self.shadows.append(tensor)
        slot = b.gep(r.tensors[SHADOWS], [ir.Constant(I64, self.shadows.index(tensor))], inbounds=True,
                     source_etype=PTR)
        return b.load(slot, typ=PTR, align=8)


# ---- statement instances ----

def statement_call(k: KernelEmitter, r: Region, node: isl.AstNode, b: ir.IRBuilder):
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


def emit_user(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block) -> ir.Block:
    """A statement instance ``S(e0, e1, ...)``: evaluate the rhs, combine with the lhs element, store."""
    b = X.Builder(block)
    stmt, values = statement_call(k, r, node, b)
    emit_statement(k.env(r, values, stmt), stmt, b)
    return b.block


# ---- loops ----

def emit_loop(r: Region, block: ir.Block, name: str, init: ir.Value,
              cond: Callable[[ir.IRBuilder, ir.Value], ir.Value], step: ir.Value,
              body: Callable[[ir.Block], ir.Block], metadata: ir.Value | None = None) -> ir.Block:
    """A loop ``for (name = init; cond(name); name += step) body`` on i64, with ``name`` bound in ``r.ids``.

    ``cond(builder, iv)`` gives the i1 continuation test; ``body(block)`` fills the body and returns its
    last block. Returns the exit block.
    """
    b = X.Builder(block)
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
        tail = X.Builder(end)
        iv.add_incoming(tail.add(iv, step, name=f"{name}.next", flags=("nsw",)), end)
        latch = tail.branch(header)
        if metadata is not None:
            latch.set_metadata("llvm.loop", metadata)
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
        last = value if last is None else smin(b, last, value)
    span = X.int_div_mod(b, b.sub(last, init), ir.Constant(I64, step), False, "div")
    n = b.add(span, ir.Constant(I64, 1))
    n = b.select(b.icmp_signed("<", n, ir.Constant(I64, 0)), ir.Constant(I64, 0), n)
    return init, last, n


# ---- reading the isl AST ----

def user_nodes(body: isl.AstNode) -> list[isl.AstNode] | None:
    """The statement calls of a body that is one call or a block of calls; None for anything else."""
    t = body.get_type()
    if t == isl.ast_node_type.user:
        return [body]
    if t != isl.ast_node_type.block:
        return None
    children = body.block_get_children()
    nodes = [children.get_at(i) for i in range(children.n_ast_node())]
    return nodes if all(c.get_type() == isl.ast_node_type.user for c in nodes) else None


def call_strides(k: KernelEmitter, user: isl.AstNode, it: str):
    """``(statement, {index: stride})`` of the statement instance a user node calls, each index's stride
    along the loop iterator ``it`` (:func:`coefficient`); None when the call is not a statement of ``k``
    or an index is not affine in ``it``."""
    call = user.user_get_expr()
    stmt = k.statements.get(call.get_op_arg(0).get_id().name)
    if stmt is None or call.get_op_n_arg() - 1 != len(stmt.indices):
        return None
    strides = {}
    for n, index in enumerate(stmt.indices):
        c = coefficient(call.get_op_arg(n + 1), it)
        if c is None:
            return None
        strides[index] = c
    return stmt, strides


def disjoint_copies(k: KernelEmitter, body: isl.AstNode, it: str) -> list[str]:
    """The tensors written in ``body`` that the copies of an unrolled loop over ``it`` touch apart: every
    access of the tensor in the body (its writes and reads) has, in one same dimension, the same plain index
    whose isl expression moves with ``it`` (coefficient not 0) and with no loop inside the body. Copies then
    differ in that dimension, so they never touch one element (the indices are in bounds: proven, or
    checked before the access). The register tile's rows of ``C(m, n) += A(m, k) * B(k, n)`` are such
    copies; in a generic kernel (rows ``m * N`` apart, ``N`` known at run time only) LLVM cannot tell them
    apart without being told (scoped noalias metadata), and keeps the accumulators in memory."""
    users, inner = [], set()

    def visit(node):
        t = node.get_type()
        if t == isl.ast_node_type.user:
            users.append(node)
        elif t == isl.ast_node_type.for_:
            inner.add(node.for_get_iterator().get_id().name)
            visit(node.for_get_body())
        elif t == isl.ast_node_type.if_:
            visit(node.if_get_then_node())
            if node.if_has_else_node():
                visit(node.if_get_else_node())
        elif t == isl.ast_node_type.block:
            children = node.block_get_children()
            for i in range(children.n_ast_node()):
                visit(children.get_at(i))
        elif t == isl.ast_node_type.mark:
            visit(node.mark_get_node())

    visit(body)
    keys: dict[str, set | None] = {}
    written = set()
    for user in users:
        call = user.user_get_expr()
        stmt = k.statements.get(call.get_op_arg(0).get_id().name)
        if stmt is None:
            return []
        written.add(stmt.tensor)
        values = {index: call.get_op_arg(n + 1) for n, index in enumerate(stmt.indices)}
        lhs = [L.Ident(i, dtype="int32", kind="index") for i in stmt.lhs]
        accesses = [(stmt.tensor, lhs)] + [(e.tensor, e.args) for e in walk(stmt.rhs) if isinstance(e, L.Access)]
        for tensor, args in accesses:
            found = set()
            for d, arg in enumerate(args):
                if isinstance(arg, L.Ident) and arg.kind == "index" and arg.name in values:
                    e = values[arg.name]
                    if coefficient(e, it) and not any(uses_id(e, v) for v in inner):
                        found.add((d, e.to_C_str()))
            keys[tensor] = found if tensor not in keys else keys[tensor] & found
    return sorted(t for t in written if keys.get(t))


def coefficient(e: isl.AstExpr, it: str) -> int | None:
    """The coefficient of iterator ``it`` in isl AST expression ``e``, or None if ``e`` is not affine in it."""
    t = e.get_type()
    if t == isl.ast_expr_type.int:
        return 0
    if t == isl.ast_expr_type.id:
        return 1 if e.get_id().name == it else 0
    if not uses_id(e, it):
        return 0
    op = e.get_op_type()
    args = [e.get_op_arg(i) for i in range(e.get_op_n_arg())]
    if op == _OP.minus:
        c = coefficient(args[0], it)
        return None if c is None else -c
    if op in (_OP.add, _OP.sub):
        a, b = coefficient(args[0], it), coefficient(args[1], it)
        if a is None or b is None:
            return None
        return a + b if op == _OP.add else a - b
    if op == _OP.mul:
        for const, other in ((args[0], args[1]), (args[1], args[0])):
            if const.get_type() == isl.ast_expr_type.int:
                c = coefficient(other, it)
                return None if c is None else const.get_val().to_python() * c
    return None


#: ``e`` and every expression inside it, parents first (:func:`polyc.lang.ast.walk`).
walk = L.walk


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
        return _fold(b, smax, args)
    if op == _OP.min:
        return _fold(b, smin, args)
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


def smax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed(">", x, y), x, y)


def smin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.icmp_signed("<", x, y), x, y)
