"""Semantic analysis: a parsed :class:`~polyc.lang.ast.Def` → a typed :class:`~polyc.lang.ast.CheckedDef`.

:func:`check_def` runs a list of small ``check_*`` functions, in the manner of TC's ``sema.h`` and loopy's
``check.py``. Each raises :class:`SemanticError` with the span of the node at fault, a message that names the
tensor or index, and a hint that says what to do. The typed AST it returns follows the contract in the
docstring of :mod:`polyc.lang.ast` (every expression typed, implicit conversions as explicit casts, lets
substituted). Range inference is not done here (see ``polyc.poly``).

    >>> from polyc.lang import parse
    >>> d = parse("def mv(float(M,K) A, float(K) x) -> (y) { y(m) +=! A(m,k) * x(k) }").defs[0]
    >>> c = check_def(d)
    >>> c.statements[0].lhs_indices, c.statements[0].reduction_indices, c.tensor("y").dtype
    (('m',), ('k',), 'float32')

Typing rules (numpy's, with two departures):

- a literal is *weak*: ``1`` is int32 (int64 if it does not fit), ``1.0`` is float32, but next to a typed
  operand a literal takes that operand's type when the kinds allow (an int literal next to any int or float,
  a float literal next to a float; an int literal that does not fit the integer type is not adopted);
  a float literal next to an integer or bool operand makes both float32;
- otherwise ``np.promote_types``, except that an int with a float gives the float type (``int64 + float32``
  is float32) and arithmetic on two bools gives int32;
- the storage types float16 and bfloat16 (:data:`~polyc.lang.ast.STORAGE_DTYPES`) compute as float32: an
  arithmetic operation, comparison, negation or builtin with such an operand converts it to float32 (or
  float64 next to a float64), a literal never takes a storage type, and ``?:`` keeps one only when both
  branches have it. A value is stored into a float16/bfloat16 tensor by an explicit conversion
  (``C(i) = half(A(i) + B(i))``; a literal or an integer converts implicitly); ``+=``, ``*=``, ``max=`` and
  ``min=`` may not update such a tensor (the sum would round at every step: reduce into a float temporary
  and convert it), and a temporary first written by a reduction of storage values is float32.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import reduce

import numpy as np

from ..errors import PolycError, SemanticError, Span, UnsupportedError
from . import ast as A
from .parser import MAX_DEPTH, expr_children, expr_depth

#: Builtins computed in float32 (float64 when an argument is float64), with their arity: integer and bool
#: arguments are converted first, as C's ``fabs(int)`` does (so ``fabs(i)`` is float32; ``abs(i)`` stays int).
#: ``ldexp(x, n)`` is typed by ``x`` alone: its exponent ``n`` must be an integer and keeps its type (a
#: bool becomes int32), as C's ``int`` parameter; the code saturates it to int32, which changes no result.
FLOAT_BUILTINS = {"exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "floor": 1,
                  "ceil": 1, "sin": 1, "cos": 1, "pow": 2, "fma": 3, "fabs": 1, "tan": 1, "asin": 1, "acos": 1,
                  "atan": 1, "sinh": 1, "cosh": 1, "asinh": 1, "acosh": 1, "atanh": 1, "rint": 1, "fmod": 2,
                  "nearbyint": 1, "round": 1, "trunc": 1, "cbrt": 1, "rcbrt": 1, "exp2": 1, "exp10": 1,
                  "expm1": 1, "log2": 1, "log10": 1, "log1p": 1, "logb": 1, "sinpi": 1, "cospi": 1, "erfc": 1,
                  "erfcx": 1, "erfinv": 1, "erfcinv": 1, "normcdf": 1, "normcdfinv": 1, "lgamma": 1, "tgamma": 1,
                  "j0": 1, "j1": 1, "y0": 1, "y1": 1, "cyl_bessel_i0": 1, "cyl_bessel_i1": 1, "atan2": 2,
                  "copysign": 2, "fdim": 2, "fdivide": 2, "hypot": 2, "rhypot": 2, "nextafter": 2,
                  "remainder": 2, "ldexp": 2, "norm3d": 3, "rnorm3d": 3, "norm4d": 4, "rnorm4d": 4}
#: Builtins computed in the promoted type of their arguments, with their arity (integer ``abs`` wraps around
#: at the type's minimum as numpy's does; ``min``/``max``/``fmin``/``fmax`` compare integers exactly).
PROMOTING_BUILTINS = {"abs": 1, "min": 2, "max": 2, "fmin": 2, "fmax": 2, "bitand": 2, "bitor": 2, "bitxor": 2,
                      "bitnot": 1, "shl": 2, "shr": 2}
#: Builtins on integers only (bitwise, C's; ``shl``/``shr`` by at least the type's width give 0, or -1 for a
#: negative signed ``shr``, as numpy's shifts do).
INTEGER_BUILTINS = ("bitand", "bitor", "bitxor", "bitnot", "shl", "shr")

_ARITHMETIC = ("+", "-", "*", "/", "%")
_COMPARISON = ("<", "<=", ">", ">=", "==", "!=")
_LOGICAL = ("&&", "||")


def check_def(defn: A.Def, source: str = "") -> A.CheckedDef:
    """Check ``defn`` and return its typed form; raise :class:`SemanticError` on the first broken rule.

    ``source`` is the text the def was parsed from; it is attached to errors so they show the caret line.
    """
    try:
        return _check(defn, source)
    except PolycError as e:
        if e.source is None and source:
            e.with_source(source)
        raise
    except RecursionError:
        raise SemanticError("the definition is nested too deeply", defn.span, source or None,
                            hint="split long expressions with temporaries") from None


# ---- the def-level environment ----

@dataclass
class _Tensor:
    """What is known about a tensor while checking: its dtype and rank may be unknown until first written."""

    name: str
    role: str
    dtype: str | None
    rank: int | None
    dims: tuple | None
    span: Span | None
    written: bool = False


@dataclass
class _Env:
    sizes: dict = field(default_factory=dict)       # size name -> span of first occurrence
    scalars: dict = field(default_factory=dict)     # 0-d parameter -> dtype
    tensors: dict = field(default_factory=dict)     # name -> _Tensor (inputs, outputs, temps once written)
    all_written: set = field(default_factory=set)   # every tensor some statement writes


@dataclass
class _Scope:
    """One statement being checked: its index variables and the tensor it writes."""

    env: _Env
    indices: set
    lhs_tensor: str


def _error(message: str, span: Span | None, hint: str) -> SemanticError:
    return SemanticError(message, span, hint=hint)


def _check(defn: A.Def, source: str) -> A.CheckedDef:
    env = _Env()
    check_params(defn, env)
    check_outputs(defn, env)
    env.all_written = {s.tensor for s in defn.statements}
    temps: list[str] = []
    checked = []
    for stmt in defn.statements:
        checked.append(check_statement(stmt, env))
        t = env.tensors[stmt.tensor]
        if t.role == "temp" and stmt.tensor not in temps:
            temps.append(stmt.tensor)
    check_outputs_written(defn, env)
    check_no_rewrite_after_read(checked)
    order = [p.name for p in defn.params] + [o.name for o in defn.outputs] + temps
    decls = tuple(A.TensorDecl(n, env.tensors[n].dtype, env.tensors[n].rank, env.tensors[n].role,
                               env.tensors[n].dims, env.tensors[n].span) for n in order)
    return A.CheckedDef(defn.name, decls, tuple(env.sizes), tuple(checked), source)


def check_no_rewrite_after_read(statements: list) -> None:
    """Raise SemanticError when a statement reads a tensor that a later statement writes again.

    TC computes every tensor completely (all its statements) before another statement reads it, so such a
    read sees the tensor's final value in TC, and a later statement that also reads the reader is a cycle TC
    rejects; polyc runs statements in order. Rather than give either answer silently, the def is refused at
    the later write (a statement reading the tensor it writes, ``O(i) = O(i) + 1``, is an update, not this).
    """
    last_write: dict[str, int] = {}
    for k, cs in enumerate(statements):
        last_write[cs.stmt.tensor] = k
    for k, cs in enumerate(statements):
        exprs = [cs.stmt.rhs] + [w.expr for w in cs.stmt.where if isinstance(w, A.ExistsClause)]
        for name, span in _reads(exprs):
            if name == cs.stmt.tensor or last_write.get(name, -1) <= k:
                continue
            later = next(c.stmt for c in statements[k + 1:] if c.stmt.tensor == name)
            where = f" (line {span.line}:{span.col})" if span is not None else ""
            raise _error(f"'{name}' is written again after a statement reads it{where}: TC computes a tensor "
                         f"completely before another statement reads it, polyc runs statements in order, "
                         f"so the read's meaning would differ", later.span,
                         f"finish writing '{name}' before reading it, or write these values to a new tensor")


def _reads(exprs: list) -> list:
    """``(tensor, span)`` of every access in ``exprs``."""
    return [(node.tensor, node.span) for e in exprs for node, _ in _walk(e) if isinstance(node, A.Access)]


# ---- parameters and outputs ----

def check_params(defn: A.Def, env: _Env) -> None:
    """Inputs: distinct names that are not builtins; their size names; 0-d parameters are scalars."""
    for p in defn.params:
        if p.name in env.tensors:
            raise _error(f"input '{p.name}' is declared twice", p.span, "give each input its own name")
        check_not_builtin(p.name, p.span, "input")
        for d in p.dims:
            if isinstance(d.value, str) and d.value not in env.sizes:
                env.sizes[d.value] = d.span
        env.tensors[p.name] = _Tensor(p.name, "input", p.dtype, len(p.dims), p.dims, p.span, written=True)
        if not p.dims:
            env.scalars[p.name] = p.dtype
    for p in defn.params:
        for d in p.dims:
            if d.value in env.tensors:
                raise _error(f"'{d.value}' names both a size and an input", d.span,
                             "rename the size or the input")


def check_not_builtin(name: str, span: Span | None, what: str) -> None:
    """A tensor may not take a builtin's name: ``exp(i)`` would call the builtin."""
    if name in A.BUILTINS:
        raise _error(f"{what} '{name}' has the name of a builtin function", span,
                     f"rename it; {', '.join(A.BUILTINS)} are builtins")


def check_outputs(defn: A.Def, env: _Env) -> None:
    """Outputs: distinct, not inputs, not sizes; a typed output's sizes must be sizes of the inputs."""
    seen = set()
    for o in defn.outputs:
        if o.name in seen:
            raise _error(f"output '{o.name}' is listed twice", o.span, "list each output once")
        seen.add(o.name)
        if o.name in env.tensors:
            raise _error(f"'{o.name}' is both an input and an output", o.span,
                         "give the output its own name (polyc does not update inputs in place)")
        if o.name in env.sizes:
            raise _error(f"output '{o.name}' has the name of a size", o.span, "rename the output or the size")
        check_not_builtin(o.name, o.span, "output")
        for d in o.dims or ():
            if isinstance(d.value, str) and d.value not in env.sizes:
                raise _error(f"size '{d.value}' of output '{o.name}' is not a size of any input", d.span,
                             "use sizes that appear in the input types, or leave the output's type out")
        rank = None if o.dims is None else len(o.dims)
        env.tensors[o.name] = _Tensor(o.name, "output", o.dtype, rank, o.dims, o.span)


def check_outputs_written(defn: A.Def, env: _Env) -> None:
    """Every output is written by some statement."""
    for o in defn.outputs:
        if not env.tensors[o.name].written:
            raise _error(f"output '{o.name}' is never written", o.span,
                         f"add a statement such as {o.name}(...) = ... or remove it from the outputs")


# ---- statements ----

def check_statement(stmt: A.Statement, env: _Env) -> A.CheckedStatement:
    """Check one statement and return it typed, with its lhs and reduction indices."""
    check_depth(stmt)
    target = check_lhs(stmt, env)
    lets = check_lets(stmt, env)
    rhs = substitute(stmt.rhs, lets)
    where = [substitute_clause(c, lets) for c in stmt.where if not isinstance(c, A.LetClause)]
    lhs_names = tuple(i.name for i in stmt.indices)
    found = collect_indices(rhs, where, lhs_names, env)
    check_range_clauses(where, env)
    reductions = tuple(n for n in found if n not in lhs_names)
    check_reduction_op(stmt, reductions, found)
    scope = _Scope(env, set(lhs_names) | set(found), stmt.tensor)
    typed_rhs = type_expr(rhs, scope)
    typed_where = tuple(type_clause(c, scope) for c in where)
    typed_rhs = check_assignment(stmt, typed_rhs, target)
    check_first_write(stmt, target)
    target.written = True
    typed = A.Statement(stmt.tensor, stmt.indices, stmt.op, typed_rhs, typed_where, stmt.span, stmt.equivalent)
    return A.CheckedStatement(typed, lhs_names, reductions)


def check_depth(stmt: A.Statement) -> None:
    """Expressions built by hand (not parsed) may be too deep for the recursive checks below."""
    exprs = [stmt.rhs] + [x for c in stmt.where
                          for x in ((c.lo, c.hi) if isinstance(c, A.RangeClause) else (c.expr,))]
    for e in exprs:
        if expr_depth(e) > MAX_DEPTH:
            raise _error(f"expression nested too deeply (more than {MAX_DEPTH} levels)", e.span,
                         "split it with where-clause bindings or temporaries")


def check_lhs(stmt: A.Statement, env: _Env) -> _Tensor:
    """The written tensor is not an input or size; its indices are distinct plain index names; ranks agree."""
    name = stmt.tensor
    if name in env.sizes:
        raise _error(f"cannot assign to size '{name}'", stmt.span, "write to an output or a temporary")
    t = env.tensors.get(name)
    if t is not None and t.role == "input":
        raise _error(f"cannot assign to input '{name}'", stmt.span,
                     "inputs are read-only; write the result to an output or a temporary")
    if t is None:
        check_not_builtin(name, stmt.span, "temporary")
        t = env.tensors[name] = _Tensor(name, "temp", None, None, None, stmt.span)
    seen = set()
    for i in stmt.indices:
        if i.name in seen:
            raise _error(f"index '{i.name}' is repeated on the left-hand side of '{name}'", i.span,
                         "each left-hand side index must be distinct; to read a diagonal write T(i) = A(i, i)")
        seen.add(i.name)
        check_index_name(i.name, i.span, env)
    rank = len(stmt.indices)
    if t.rank is not None and t.rank != rank:
        how = "declared" if not t.written else "first written"
        raise _error(f"'{name}' is {how} with rank {t.rank} but written here with rank {rank}", stmt.span,
                     f"write '{name}' with {t.rank} indices everywhere")
    t.rank = rank
    return t


def check_index_name(name: str, span: Span | None, env: _Env) -> None:
    """An index variable must not be a size, a scalar parameter or a tensor."""
    if name in env.sizes:
        raise _error(f"size '{name}' is used as an index variable", span,
                     f"use a lower-case index such as '{name.lower()}_' and bound it with 'where i in 0:{name}'")
    if name in env.scalars:
        raise _error(f"scalar parameter '{name}' is used as an index variable", span,
                     "choose an index name that is not a parameter")
    if name in env.tensors or name in env.all_written:
        raise _error(f"tensor '{name}' is used as an index variable", span,
                     "choose an index name that is not a tensor")


def check_lets(stmt: A.Statement, env: _Env) -> dict:
    """``where x = e`` bindings: fresh names; each may use the ones before it. Returns name → expression.

    The expanded statement must stay small: a chain such as ``b = a * a, c = b * b, ...`` doubles at each step.
    """
    lets: dict = {}
    shapes: dict = {}
    lhs = {i.name for i in stmt.indices}
    ranges = {c.index for c in stmt.where if isinstance(c, A.RangeClause)}
    for c in stmt.where:
        if not isinstance(c, A.LetClause):
            continue
        taken = (c.name in lets or c.name in lhs or c.name in ranges or c.name in env.sizes
                 or c.name in env.tensors or c.name in env.all_written)
        if taken:
            raise _error(f"where binding '{c.name}' reuses a name already in use", c.span,
                         "choose a fresh name for the binding")
        shapes[c.name] = check_expansion(c.expr, shapes)
        lets[c.name] = substitute(c.expr, lets)
    for c in stmt.where:
        for e in ((c.lo, c.hi) if isinstance(c, A.RangeClause) else (c.expr,)):
            check_expansion(e, shapes)
    check_expansion(stmt.rhs, shapes)
    return lets


#: The most nodes an expression may have once its where bindings are substituted.
MAX_EXPANDED_SIZE = 20000


def check_expansion(e: A.Expr, shapes: dict) -> tuple[int, int]:
    """``(nodes, depth)`` of ``e`` with the bindings in ``shapes`` substituted; both must stay bounded."""
    def shape(node):
        if isinstance(node, A.Ident) and node.name in shapes:
            return shapes[node.name]
        kids = [shape(c) for c in expr_children(node)]
        return 1 + sum(k[0] for k in kids), 1 + max((k[1] for k in kids), default=0)

    size, depth = shape(e)
    if size > MAX_EXPANDED_SIZE or depth > MAX_DEPTH:
        raise _error("the where bindings expand this expression too much "
                     f"({size} nodes, {depth} levels once substituted)", e.span,
                     "compute shared parts in a temporary tensor instead of a where binding")
    return size, depth


def substitute(e: A.Expr, lets: dict) -> A.Expr:
    """``e`` with every identifier bound by a where clause replaced by its expression."""
    if not lets:
        return e
    if isinstance(e, A.Ident):
        return lets.get(e.name, e)
    if isinstance(e, A.Access):
        return replace(e, args=tuple(substitute(a, lets) for a in e.args))
    if isinstance(e, A.Call):
        return replace(e, args=tuple(substitute(a, lets) for a in e.args))
    if isinstance(e, (A.Unary, A.Cast)):
        return replace(e, operand=substitute(e.operand, lets))
    if isinstance(e, A.Binary):
        return replace(e, lhs=substitute(e.lhs, lets), rhs=substitute(e.rhs, lets))
    if isinstance(e, A.Select):
        return replace(e, cond=substitute(e.cond, lets), then=substitute(e.then, lets),
                       other=substitute(e.other, lets))
    return e


def substitute_clause(c: A.WhereClause, lets: dict) -> A.WhereClause:
    if isinstance(c, A.RangeClause):
        return replace(c, lo=substitute(c.lo, lets), hi=substitute(c.hi, lets))
    return replace(c, expr=substitute(c.expr, lets))


def collect_indices(rhs: A.Expr, where: list, lhs: tuple, env: _Env) -> dict:
    """Index variables in order of first occurrence (lhs first), as name → span of that occurrence.

    A name is an index variable if it is on the left-hand side, inside an access argument, or the subject
    of a range clause, and it is not a size, a scalar parameter or a tensor.
    """
    names = set(lhs)
    for e in [rhs] + [c.expr for c in where if isinstance(c, A.ExistsClause)]:
        for node, inside in _walk(e):
            if isinstance(node, A.Ident) and inside and not _is_bound(node.name, env):
                names.add(node.name)
    for c in where:
        if isinstance(c, A.RangeClause):
            check_index_name(c.index, c.span, env)
            names.add(c.index)
    found: dict = {n: None for n in lhs}
    for c in [None] + list(where):
        if isinstance(c, A.RangeClause):
            found.setdefault(c.index, c.span)
            continue
        for node, _ in _walk(rhs if c is None else c.expr):
            if isinstance(node, A.Ident) and node.name in names:
                found.setdefault(node.name, node.span)
    return found


def _is_bound(name: str, env: _Env) -> bool:
    return "." in name or name in env.sizes or name in env.scalars or name in env.tensors or name in env.all_written


def _walk(e: A.Expr):
    """Pre-order, left to right: (node, whether it is inside an access argument)."""
    stack = [(e, False)]
    while stack:
        node, inside = stack.pop()
        yield node, inside
        inner = inside or isinstance(node, A.Access)
        stack.extend((c, inner) for c in reversed(expr_children(node)))


def check_range_clauses(where: list, env: _Env) -> None:
    """Each index has at most one range; bounds are integer expressions of sizes and literals."""
    seen = set()
    for c in where:
        if not isinstance(c, A.RangeClause):
            continue
        if c.index in seen:
            raise _error(f"index '{c.index}' has two ranges", c.span, "give each index one 'in lo:hi' clause")
        seen.add(c.index)
        for bound in (c.lo, c.hi):
            check_bound(bound, c.index, env)


def check_bound(e: A.Expr, index: str, env: _Env) -> None:
    """A range bound uses only sizes (and dimensions ``T.k``), integer literals and integer arithmetic."""
    stack = [e]
    while stack:
        node = stack.pop()
        bad = None
        if isinstance(node, A.Ident) and node.name not in env.sizes and "." not in node.name:  # T.k: typed later
            bad = f"'{node.name}'"
        elif isinstance(node, (A.Access, A.Call, A.Select)):
            bad = "a tensor read" if isinstance(node, A.Access) else "a call or conditional"
        elif isinstance(node, A.Const) and not isinstance(node.value, int):
            bad = "a float literal"
        elif isinstance(node, A.Cast) and not node.to.startswith(("int", "uint")):
            bad = f"a cast to {node.to}"
        elif isinstance(node, A.Binary) and node.op not in _ARITHMETIC:
            bad = f"the operator '{node.op}'"
        elif isinstance(node, A.Unary) and node.op != "-":
            bad = f"the operator '{node.op}'"
        if bad:
            raise _error(f"the range of '{index}' uses {bad}", node.span,
                         "range bounds are integer expressions of sizes and literals, e.g. 'k in 0:K-1'")
        stack.extend(expr_children(node))


def check_reduction_op(stmt: A.Statement, reductions: tuple, found: dict) -> None:
    """Indices that are not on the left need a reduction operator (``+=!`` ...), not ``=``."""
    if stmt.op == "=" and reductions:
        k = reductions[0]
        raise _error(f"reduction index '{k}' used without a reduction operator", found[k] or stmt.span,
                     f"use +=! (or *=!, max=!, min=!) to reduce over '{k}', or put '{k}' on the left-hand side")


def check_assignment(stmt: A.Statement, rhs: A.Expr, t: _Tensor) -> A.Expr:
    """The rhs converts to the tensor's dtype by widening only; an undeclared tensor takes the rhs dtype
    (float32 for a reduction of float16/bfloat16 values); no reduction updates a float16/bfloat16 tensor."""
    if t.dtype is None:
        t.dtype = rhs.dtype
        if stmt.op != "=" and rhs.dtype in A.STORAGE_DTYPES:
            t.dtype = "float32"
            return coerce(rhs, "float32")
        return rhs
    if stmt.op != "=" and t.dtype in A.STORAGE_DTYPES:
        raise _error(f"'{stmt.op}' updates {t.dtype} tensor '{t.name}', so every step of the reduction would "
                     f"round to {t.dtype}", stmt.span,
                     f"reduce into a float temporary and convert it: T(...) {stmt.op} ...; "
                     f"{t.name}(...) = {t.dtype}(T(...))")
    if rhs.dtype == t.dtype:
        return rhs
    if is_weak(rhs) and can_adopt(rhs, t.dtype):
        return retype(rhs, t.dtype)
    if is_weak(rhs) and t.dtype in A.STORAGE_DTYPES:
        return A.Cast(t.dtype, coerce(rhs, "float32"), rhs.span, t.dtype)
    if not widens(rhs.dtype, t.dtype):
        raise _error(f"narrowing conversion from {rhs.dtype} to {t.dtype} in assignment to '{t.name}'; "
                     f"use an explicit cast such as {t.dtype}(...)", rhs.span,
                     f"or declare '{t.name}' with type {rhs.dtype}")
    return A.Cast(t.dtype, rhs, rhs.span, t.dtype)


def check_first_write(stmt: A.Statement, t: _Tensor) -> None:
    """A temporary's first write must set it (``=`` or an initializing ``+=!``...), not update garbage."""
    if t.role == "temp" and not t.written and stmt.op != "=" and not stmt.initializes:
        raise _error(f"temporary '{t.name}' is first written with '{stmt.op}', which reads its uninitialized "
                     "value", stmt.span, f"use '{stmt.op}!' to start from the reduction's identity")


# ---- dtypes ----

def kind(dtype: str) -> str:
    """``"b"`` (bool), ``"i"`` (signed), ``"u"`` (unsigned) or ``"f"`` (float, the storage types too)."""
    return "f" if dtype in A.STORAGE_DTYPES else np.dtype(dtype).kind


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype of arrays of ``dtype``: ``ml_dtypes.bfloat16`` for bfloat16 (numpy has none).

    Raises :class:`~polyc.errors.UnsupportedError` for bfloat16 when ml_dtypes is not installed."""
    if dtype == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise UnsupportedError("bfloat16 arrays need the ml_dtypes package",
                                   hint="pip install ml_dtypes (onnx installs it too)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


def computes_in(dtype: str) -> str:
    """The dtype arithmetic on a ``dtype`` value computes in: float32 for the storage types, else itself."""
    return "float32" if dtype in A.STORAGE_DTYPES else dtype


def promote_types(a: str, b: str) -> str:
    """numpy's promotion, except that an integer with a float gives the float type (a storage type with
    anything else promotes as float32)."""
    if a == b:
        return a
    a, b = computes_in(a), computes_in(b)
    if a == b:
        return a
    ka, kb = kind(a), kind(b)
    if ka == "f" and kb != "f":
        return a
    if kb == "f" and ka != "f":
        return b
    return np.promote_types(a, b).name


def widens(src: str, dst: str) -> bool:
    """Whether assigning a ``src`` value to a ``dst`` tensor loses no range (bool → any, int → wider or float)."""
    if src == dst or src == "bool":
        return True
    if src in A.STORAGE_DTYPES and dst in A.STORAGE_DTYPES:
        return False  # float16 has the precision, bfloat16 the range
    ks, kd = kind(src), kind(dst)
    size_s, size_d = A.itemsize(src), A.itemsize(dst)
    if ks == "f":
        return kd == "f" and size_d >= size_s
    if kd == "f":
        return True
    if ks == "i":
        return kd == "i" and size_d >= size_s
    return (kd == "u" and size_d >= size_s) or (kd == "i" and size_d > size_s)


def literal_dtype(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int32" if -2**31 <= value < 2**31 else "int64"
    return "float32"


def is_weak(e: A.Expr) -> bool:
    """A literal, possibly negated: it takes the type of the typed operand next to it."""
    while isinstance(e, A.Unary) and e.op == "-":
        e = e.operand
    return isinstance(e, A.Const) and not isinstance(e.value, bool)


def _literal_value(e: A.Expr):
    sign = 1
    while isinstance(e, A.Unary):
        sign, e = -sign, e.operand
    return sign * e.value


def can_adopt(e: A.Expr, dtype: str) -> bool:
    """Whether the weak literal ``e`` can simply take ``dtype`` (kinds compatible, value in range; never a
    storage type: a literal computes as float32 next to one)."""
    if dtype in A.STORAGE_DTYPES:
        return False
    value = _literal_value(e)
    k = kind(dtype)
    if isinstance(value, float):
        return k == "f"
    if k in "iu":
        info = np.iinfo(dtype)
        return info.min <= value <= info.max
    return k == "f"


def retype(e: A.Expr, dtype: str) -> A.Expr:
    """The weak literal ``e`` as a literal of ``dtype``."""
    if isinstance(e, A.Unary):
        return replace(e, operand=retype(e.operand, dtype), dtype=dtype)
    value = float(e.value) if kind(dtype) == "f" else int(e.value)
    return replace(e, value=value, dtype=dtype)


def unify(exprs: list) -> str:
    """The common dtype of typed operands, with the weak-literal rule."""
    strong = [e.dtype for e in exprs if not is_weak(e)]
    if not strong:
        return reduce(promote_types, [e.dtype for e in exprs])
    target = reduce(promote_types, strong)
    for e in exprs:
        if is_weak(e) and not can_adopt(e, target):
            target = promote_types(e.dtype, target)
    return target


def coerce(e: A.Expr, dtype: str) -> A.Expr:
    """``e`` converted to ``dtype``: unchanged, a retyped literal, or wrapped in a :class:`Cast`."""
    if e.dtype == dtype:
        return e
    if is_weak(e) and can_adopt(e, dtype):
        return retype(e, dtype)
    return A.Cast(dtype, e, e.span, dtype)


def to_bool(e: A.Expr) -> A.Expr:
    """A condition: bool as is, a number ``x`` as ``x != 0``."""
    if e.dtype == "bool":
        return e
    e = coerce(e, computes_in(e.dtype))
    zero = A.Const(0.0 if kind(e.dtype) == "f" else 0, e.span, e.dtype)
    return A.Binary("!=", e, zero, e.span, "bool")


# ---- expressions ----

def type_clause(c: A.WhereClause, scope: _Scope) -> A.WhereClause:
    """A typed range or exists clause (lets are already substituted away)."""
    if isinstance(c, A.RangeClause):
        return replace(c, lo=type_expr(c.lo, scope), hi=type_expr(c.hi, scope))
    return replace(c, expr=type_expr(c.expr, scope))


def type_expr(e: A.Expr, scope: _Scope) -> A.Expr:
    """The typed copy of ``e`` (see the module docstring for the rules)."""
    if isinstance(e, A.Const):
        return replace(e, dtype=literal_dtype(e.value))
    if isinstance(e, A.Ident):
        return type_ident(e, scope)
    if isinstance(e, A.Access):
        return type_access(e, scope)
    if isinstance(e, A.Unary):
        return type_unary(e, scope)
    if isinstance(e, A.Binary):
        return type_binary(e, scope)
    if isinstance(e, A.Select):
        return type_select(e, scope)
    if isinstance(e, A.Call):
        return type_call(e, scope)
    if isinstance(e, A.Cast):
        return replace(e, operand=type_expr(e.operand, scope), dtype=e.to)
    raise _error(f"not an expression: {type(e).__name__}", None, "build expressions from polyc.lang.ast nodes")


def type_ident(e: A.Ident, scope: _Scope) -> A.Expr:
    env = scope.env
    if "." in e.name:
        return type_dimension(e, scope)
    if e.name in scope.indices:
        return replace(e, dtype="int32", kind="index")
    if e.name in env.sizes:
        return replace(e, dtype="int32", kind="size")
    if e.name in env.scalars:
        return replace(e, dtype=env.scalars[e.name], kind="scalar")
    if e.name in env.tensors or e.name in env.all_written:
        return type_access(A.Access(e.name, (), e.span), scope)
    raise _error(f"undefined variable '{e.name}'", e.span,
                 f"declare '{e.name}' as a parameter, use it as an index of a tensor, "
                 f"or bind it with a where clause")


def type_dimension(e: A.Ident, scope: _Scope) -> A.Expr:
    """TC's dimension specifier ``T.k``, the extent of dimension ``k`` of ``T``: a size (int32) when ``T`` is a
    parameter or a declared output, or is written by an earlier statement (its extent is then inferred;
    :func:`polyc.poly.build.build_scop` binds it)."""
    name, _, digits = e.name.partition(".")
    k = int(digits)
    t = scope.env.tensors.get(name)
    if t is None or (t.dims is None and not t.written):
        what = "is not a tensor" if t is None and name not in scope.env.all_written else \
            "has no extents yet (its first statement is not done)"
        raise _error(f"'{e.name}': '{name}' {what}", e.span,
                     f"'T.k' is the extent of dimension k of a parameter or of a tensor written earlier")
    rank = t.rank if t.rank is not None else 0
    if k >= rank:
        raise _error(f"'{e.name}': '{name}' has rank {rank}, so its dimensions are {name}.0 to {name}.{rank - 1}"
                     if rank else f"'{e.name}': '{name}' is 0-d and has no dimensions", e.span,
                     "dimensions count from 0")
    return replace(e, dtype="int32", kind="size")


def type_access(e: A.Access, scope: _Scope) -> A.Expr:
    """A tensor read: the tensor exists and is written already; rank matches; indices are integers."""
    env = scope.env
    name = e.tensor
    if name in env.scalars:
        if e.args:
            raise _error(f"scalar parameter '{name}' takes no indices", e.span, f"write '{name}' alone")
        return A.Ident(name, e.span, env.scalars[name], "scalar")
    if name in env.sizes or name in scope.indices:
        what = "size" if name in env.sizes else "index variable"
        raise _error(f"{what} '{name}' is used like a tensor", e.span, f"'{name}' is a number; drop the '(...)'")
    t = env.tensors.get(name)
    if t is None or (not t.written and name != scope.lhs_tensor):
        if t is None and name not in env.all_written:
            raise _error(f"undefined tensor or function '{name}'", e.span,
                         f"declare '{name}' as an input, or use a builtin: {', '.join(A.BUILTINS)}")
        raise _error(f"tensor '{name}' is read before it is written", e.span,
                     f"write '{name}' in an earlier statement")
    if t.dtype is None:
        raise _error(f"'{name}' is read in the statement that first writes it, so its type is unknown", e.span,
                     f"declare the type of '{name}' in the outputs, e.g. -> (float(N) {name})")
    rank = t.rank if t.rank is not None else len(e.args)
    if rank != len(e.args):
        raise _error(f"tensor '{name}' has rank {rank} but is accessed with {len(e.args)} indices", e.span,
                     f"access '{name}' with {rank} indices")
    args = tuple(type_index(a, name, n, scope) for n, a in enumerate(e.args))
    return replace(e, args=args, dtype=t.dtype)


def type_index(a: A.Expr, tensor: str, position: int, scope: _Scope) -> A.Expr:
    typed = type_expr(a, scope)
    if kind(typed.dtype) not in "iu":
        raise _error(f"non-integral index: argument {position + 1} of '{tensor}' has type {typed.dtype}", a.span,
                     f"index with integers; convert with int32(...) if the value is integral")
    return typed


def type_unary(e: A.Unary, scope: _Scope) -> A.Expr:
    operand = type_expr(e.operand, scope)
    if e.op == "!":
        return replace(e, operand=to_bool(operand), dtype="bool")
    if operand.dtype == "bool":
        operand = coerce(operand, "int32")
    operand = coerce(operand, computes_in(operand.dtype))
    return replace(e, operand=operand, dtype=operand.dtype)


def type_binary(e: A.Binary, scope: _Scope) -> A.Expr:
    lhs, rhs = type_expr(e.lhs, scope), type_expr(e.rhs, scope)
    if e.op in _LOGICAL:
        return replace(e, lhs=to_bool(lhs), rhs=to_bool(rhs), dtype="bool")
    common = computes_in(unify([lhs, rhs]))
    if e.op in _COMPARISON:
        return replace(e, lhs=coerce(lhs, common), rhs=coerce(rhs, common), dtype="bool")
    if common == "bool":
        common = "int32"
    return replace(e, lhs=coerce(lhs, common), rhs=coerce(rhs, common), dtype=common)


def type_select(e: A.Select, scope: _Scope) -> A.Expr:
    cond = to_bool(type_expr(e.cond, scope))
    then, other = type_expr(e.then, scope), type_expr(e.other, scope)
    common = unify([then, other])
    return replace(e, cond=cond, then=coerce(then, common), other=coerce(other, common), dtype=common)


def type_call(e: A.Call, scope: _Scope) -> A.Expr:
    """A builtin: known name, right arity; float builtins compute in float32/float64, others promote."""
    arity = FLOAT_BUILTINS.get(e.func, PROMOTING_BUILTINS.get(e.func))
    if arity is None:
        raise _error(f"unknown function '{e.func}'", e.span, f"the builtins are {', '.join(A.BUILTINS)}")
    if len(e.args) != arity:
        s = "" if arity == 1 else "s"
        names = "x, n" if e.func == "ldexp" else ", ".join("xyzw"[:arity])
        raise _error(f"'{e.func}' takes {arity} argument{s}, got {len(e.args)}", e.span,
                     f"call it as {e.func}({names})")
    args = [type_expr(a, scope) for a in e.args]
    if e.func == "ldexp":
        return type_ldexp(e, args)
    if e.func in FLOAT_BUILTINS:
        common = "float64" if any(a.dtype == "float64" for a in args) else "float32"
    else:
        common = computes_in(unify(args))
        if e.func in INTEGER_BUILTINS and not (common.startswith("int") or common.startswith("uint")):
            raise _error(f"'{e.func}' takes integers, got {common}", e.span, "convert the arguments to an integer type")
    return replace(e, args=tuple(coerce(a, common) for a in args), dtype=common)


def type_ldexp(e: A.Call, args: list) -> A.Expr:
    """``ldexp(x, n)``: float32 (float64 for a float64 ``x``); ``n`` an integer of any type (bool: int32)."""
    x, n = args
    if kind(n.dtype) not in "biu":
        raise _error(f"the exponent of 'ldexp' must be an integer, got {n.dtype}", n.span or e.span,
                     "convert it with int32(...)")
    common = "float64" if x.dtype == "float64" else "float32"
    return replace(e, args=(coerce(x, common), coerce(n, "int32") if n.dtype == "bool" else n), dtype=common)
