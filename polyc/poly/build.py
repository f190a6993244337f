"""CheckedDef + sizes → Scop: range inference, iteration domains, access relations, bounds checks.

Range inference follows Tensor Comprehensions' documented rules, computed exactly with isl on the
specialised sizes:

1. ``where i in lo:hi`` clauses fix ranges first.
2. Rounds: an index that appears *alone* in an access argument (every other index of the argument already
   has a range) gets the largest range keeping every such access in bounds for all values of the solved
   indices: ``{ [i] } - proj_i { [i, s] : s in ranges and (arg < 0 or arg >= extent) }``. Indices solved in a
   round become known for the next one. Accesses are the reads on the right, ``exists`` clauses, and the
   left-hand side of a tensor whose shape is already known (an input-typed output, or a tensor written by an
   earlier statement).
3. An index still without a range is an error naming it and suggesting a where clause; an empty range is an
   error too.

Output and temporary shapes are the inferred extents of their first write. Beyond TC, every affine access
is then checked exactly against its tensor's shape over the iteration domain (guarded by the affine
conditions of enclosing ``?:``): a read that can leave the tensor is an error here, never a wrong answer or
a crash at run time. Data-dependent reads (``A(B(i))``) are over-approximated to the whole dimension and
checked at run time by the generated code.

A reduction update whose right-hand side is ``cond ? e : identity`` (a padded convolution's window) runs only
where the affine conditions of ``cond`` hold: they become part of its iteration domain
(:func:`guard_into_domain`), so the code never visits the taps outside the image.
"""
from __future__ import annotations

import dataclasses

import islpy as isl
import numpy as np

from ..errors import RangeError, SemanticError
from ..lang import ast as L
from ..lang.printer import format_expr
from .affine import (Sym, accesses_in, aff_text, affine_text, children, constant_value, element_stride, guard_text,
                     index_names, isl_name, param_prefix, parameters, simplified, size_context, sym_value,
                     with_children)
from .scop import PolyStatement, Scop, Tensor, identity_value


def reduction_order(cs: L.CheckedStatement, checked: L.CheckedDef, shapes: dict, sizes: dict) -> tuple[str, ...]:
    """The order of the reduction dimensions of ``cs``'s iteration domain: by decreasing distance in bytes
    that one step moves the reads (the largest :func:`~polyc.poly.affine.element_stride` over the affine
    reads, times the element size), ties in order of first occurrence. TC leaves the order of a reduction
    unspecified; this one makes the sequential order, which isl's scheduler keeps, sum the index that moves
    the reads least innermost: ``c`` (an image plane per step) outside ``kh`` (a row) outside ``kw`` (one
    element) for a convolution however its guards name the window indices first."""
    known = [r for r in accesses_in(cs.stmt.rhs) if r.tensor in shapes]

    def jump(index):
        return max((abs(element_stride(r.args, shapes[r.tensor], index, cs.indices, sizes) or 0)
                    * L.itemsize(checked.tensor(r.tensor).dtype) for r in known), default=0)
    return tuple(sorted(cs.reduction_indices, key=jump, reverse=True))


def input_shapes(checked: L.CheckedDef, sizes: dict) -> dict[str, tuple[int, ...]]:
    """Shapes of the inputs and of the outputs declared with dims, from the sizes."""
    shapes = {}
    for t in checked.tensors:
        if t.dims is not None:
            shapes[t.name] = tuple(d.value if isinstance(d.value, int) else sizes[d.value] for d in t.dims)
    return shapes


def build_scop(checked: L.CheckedDef, sizes: dict) -> Scop:
    """The Scop of ``checked`` specialised on ``sizes`` (size name → extent, every size of the def).

    A tensor whose shape comes from its first write takes that write's inferred ranges ``[lo, hi)`` as its
    logical box (TC's semantics): its extent is ``hi - lo`` and element ``lo`` is stored first
    (:attr:`Tensor.origin`). Statements address it with logical indices; the Scop is in storage coordinates
    (see :func:`_to_storage`).

    Raises :class:`~polyc.errors.RangeError` when range inference fails or an access can leave its tensor.
    """
    shapes = input_shapes(checked, sizes)
    dimensions = _dimension_names(checked)
    sizes = dict(sizes)
    _bind_dimensions(sizes, dimensions, shapes)
    prefix = param_prefix(sizes)
    context = size_context(sizes)
    origins: dict[str, tuple[int, ...]] = {}
    statements: list[PolyStatement] = []
    ranges: dict = {}
    try:
        for cs in checked.statements:
            stmt_ranges, constraints = infer_ranges(cs, shapes, sizes, checked.source, origins)
            if cs.stmt.tensor not in shapes:
                if any(isinstance(stmt_ranges[i][0], Sym) for i in cs.lhs_indices):
                    raise RangeError(f"the first write of '{cs.stmt.tensor}' starts at an index that depends on "
                                     "the sizes; a generic kernel needs it constant", cs.stmt.span, checked.source,
                                     hint="give the range with a where clause starting at a constant")
                shapes[cs.stmt.tensor] = tuple(simplified(stmt_ranges[i][1] - stmt_ranges[i][0], sizes)
                                               for i in cs.lhs_indices)
                if any(stmt_ranges[i][0] for i in cs.lhs_indices):
                    origins[cs.stmt.tensor] = tuple(stmt_ranges[i][0] for i in cs.lhs_indices)
                _bind_dimensions(sizes, dimensions, shapes)
            shift = dict(zip(cs.lhs_indices, origins.get(cs.stmt.tensor, (0,) * len(cs.lhs_indices))))
            rhs = _to_storage(cs.stmt.rhs, shift, origins)
            stmt_ranges = {i: (lo - shift.get(i, 0), hi - shift.get(i, 0)) for i, (lo, hi) in stmt_ranges.items()}
            if cs.stmt.initializes:
                name = f"S{len(statements)}"
                init_domain = _box(name, cs.lhs_indices, stmt_ranges, prefix).intersect_params(context)
                dtype = checked.tensor(cs.stmt.tensor).dtype
                init = L.Const(identity_value(cs.stmt.reduction_op, dtype), dtype=dtype)
                statements.append(_statement(name, cs.lhs_indices, init_domain, cs, "init", init, sizes, shapes,
                                             stmt_ranges, checked.source))
            name = f"S{len(statements)}"
            indices = cs.lhs_indices + reduction_order(cs, checked, _at_hint(shapes), _at_hint(sizes))
            for index in indices:
                ranges[(name, index)] = tuple(int(v) for v in stmt_ranges[index])  # at the hint
                lo, hi = stmt_ranges[index]
                if isinstance(lo, Sym) or isinstance(hi, Sym):  # a generic kernel serves sizes where it is not empty
                    context = context.intersect(isl.Set(f"{prefix}{{ : {lo} < {hi} }}"))
            box = [f"{stmt_ranges[i][0] + shift.get(i, 0)} <= {isl_name(i)} < {stmt_ranges[i][1] + shift.get(i, 0)}"
                   for i in indices]
            domain = isl.Set(prefix + _set_text(name, indices, box + constraints)).intersect_params(context)
            if any(shift.values()):  # the constraints are in logical coordinates: translate to storage ones
                dims = ", ".join(isl_name(i) for i in indices)
                moved = ", ".join(f"{isl_name(i)} - ({shift.get(i, 0)})" for i in indices)
                domain = domain.apply(isl.Map(f"{prefix}{{ {name}[{dims}] -> {name}[{moved}] }}"))
                for k, i in enumerate(indices):
                    domain = domain.set_dim_name(isl.dim_type.set, k, isl_name(i))
            if cs.stmt.reduction_op in ("+=", "*=", "max=", "min="):
                rhs, domain = guard_into_domain(rhs, cs.stmt.reduction_op, checked.tensor(cs.stmt.tensor).dtype,
                                                domain, indices, sizes, stmt_ranges,
                                                cs.lhs_indices[-1] if cs.lhs_indices else None)
            statements.append(_statement(name, indices, domain, cs, cs.stmt.reduction_op, rhs,
                                         sizes, shapes, stmt_ranges, checked.source))
    except isl.Error as exc:  # a polyc bug: the text we built is not isl's
        raise SemanticError(f"internal error building the polyhedral model: {exc}") from None
    params = parameters(sizes)
    tensors = tuple(Tensor(t.name, t.dtype, _at_hint(shapes)[t.name], t.role, origin=origins.get(t.name, ()),
                           extents=tuple(shapes[t.name]) if params else ())
                    for t in checked.tensors)
    scop = Scop(checked.name, tensors, tuple(statements), _at_hint(sizes), ranges, (), checked.source, params,
                context.coalesce() if params else None)
    for s in scop.statements:
        check_bounds(s, scop, checked.source)
    return scop


def _at_hint(values: dict) -> dict:
    """``values`` (sizes, or shapes) with every :class:`~polyc.poly.affine.Sym` as its value at the hint."""
    return {k: (tuple(int(x) for x in v) if isinstance(v, tuple) else int(v)) for k, v in values.items()}


def _is_identity(e: L.Expr, op: str, dtype: str) -> bool:
    """Whether ``e`` is a constant equal to the identity of reduction ``op`` on ``dtype`` (``0`` for ``+=``;
    for a float ``max=``, minus infinity, which the language writes ``-1.0 / 0.0``)."""
    value = _constant(e)
    return value is not None and not isinstance(value, bool) and value == identity_value(op, dtype)


def _constant(e: L.Expr):
    """The value of ``e`` when it is made of literals, ``-`` and float ``+ - * /`` only (``-1.0 / 0.0`` is
    minus infinity, as the generated code computes it), else None."""
    if isinstance(e, L.Const):
        return e.value
    if isinstance(e, L.Unary) and e.op == "-":
        value = _constant(e.operand)
        return None if value is None else -value
    if isinstance(e, L.Binary) and e.op in ("+", "-", "*", "/") and e.dtype is not None and e.dtype.startswith("float"):
        lhs, rhs = _constant(e.lhs), _constant(e.rhs)
        if lhs is None or rhs is None:
            return None
        with np.errstate(all="ignore"):
            a, b = np.float64(lhs), np.float64(rhs)
            return float({"+": a + b, "-": a - b, "*": a * b, "/": a / b}[e.op])
    return None


def guard_into_domain(rhs: L.Expr, op: str, dtype: str, domain: isl.Set, indices, sizes: dict, ranges: dict,
                      innermost: str | None):
    """``(rhs, domain)`` of a reduction update ``op`` with affine guards moved into its iteration domain.

    ``Y(i, j) += (i + r - 1 >= 0 && i + r - 1 < N && ...) ? X(i + r - 1, ...) * W(r, ...) : 0`` adds the
    reduction's identity wherever the guard fails, so those instances change nothing: the update runs on the
    domain intersected with the guard's conditions (``isl_set_intersect``) and selects nothing for them. isl's
    AST then bounds the loops at the borders (a padded convolution's taps outside the image are never visited)
    instead of the code selecting per element. Only the conditions that do not involve ``innermost`` (the
    write's stride-1 index, which the strategy vectorizes and register-tiles) move: a bound that couples it with
    a window index would make every register tile a partial one (a 3x3 convolution ran 2x slower); those
    conditions stay a ``?:``, evaluated per lane. ``?:`` levels are peeled while one branch is the identity
    literal and every condition moves; a condition moves when it is affine
    (:func:`~polyc.poly.affine.guard_text`, exact over the statement's box ``ranges``) and does not empty the
    domain. Adding ``+0.0``, multiplying by ``1`` and ``max``/``min`` with the identity return the other operand,
    so results are bit-identical (the accumulator starts at the identity, never at ``-0.0``)."""
    dims = ", ".join(isl_name(i) for i in indices)
    name = domain.get_tuple_name()
    box = {i: ranges[i] for i in indices}
    index_set = set(indices)
    while isinstance(rhs, L.Select):
        if _is_identity(rhs.other, op, dtype):
            kept_branch, parts, negate = rhs.then, L.conjuncts(rhs.cond), False
        elif _is_identity(rhs.then, op, dtype):
            kept_branch, parts, negate = rhs.other, [rhs.cond], True
        else:
            break
        stay = []
        for cond in parts:
            text = None if innermost in index_names(cond) else \
                guard_text(cond, index_set, sizes, negate=negate, ranges=box)
            restricted = domain.intersect(isl.Set(f"{param_prefix(sizes)}{{ {name}[{dims}] : {text} }}")) \
                if text else None
            if restricted is None or restricted.is_empty():
                stay.append(cond)
            else:
                domain = restricted
        if stay:
            if len(stay) < len(parts):
                cond = stay[0]
                for c in stay[1:]:
                    cond = L.Binary("&&", cond, c, dtype=rhs.cond.dtype)
                rhs = dataclasses.replace(rhs, cond=cond)
            break
        rhs = kept_branch
    return rhs, domain


def _dimension_names(checked: L.CheckedDef) -> set[str]:
    """The dimension specifiers ``T.k`` the def uses (sizes named ``"T.k"``, see ``sema.type_dimension``)."""
    found: set[str] = set()

    def visit(e):
        if isinstance(e, L.Ident) and e.kind == "size" and "." in e.name:
            found.add(e.name)
        for c in children(e):
            visit(c)

    for cs in checked.statements:
        visit(cs.stmt.rhs)
        for clause in cs.stmt.where:
            for part in ((clause.lo, clause.hi) if isinstance(clause, L.RangeClause) else (clause.expr,)):
                visit(part)
    return found


def _bind_dimensions(sizes: dict, dimensions: set[str], shapes: dict) -> None:
    """Give each used ``T.k`` whose tensor has a shape by now its extent, as a size."""
    for name in dimensions:
        tensor, _, k = name.partition(".")
        if name not in sizes and tensor in shapes:
            sizes[name] = shapes[tensor][int(k)]


def _to_storage(e: L.Expr, shift: dict, origins: dict) -> L.Expr:
    """``e`` in storage coordinates: each left-hand index ``i`` of the statement, which now counts from the
    written tensor's first element, stands for ``i + shift[i]``; a read of a tensor whose first element is
    ``origin`` reads ``arg - origin``. Unchanged (the same object) when no shift or origin applies."""
    if not any(shift.values()) and not origins:
        return e
    if isinstance(e, L.Ident) and e.kind == "index":
        return _plus(e, shift.get(e.name, 0))
    kids = children(e)
    if not kids:
        return e
    new = tuple(_to_storage(c, shift, origins) for c in kids)
    if isinstance(e, L.Access) and origins.get(e.tensor):
        new = tuple(_plus(a, -o) for a, o in zip(new, origins[e.tensor]))
    return with_children(e, new)


def _plus(e: L.Expr, k: int) -> L.Expr:
    """``e + k`` for an integer index expression, folding ``(x + c) + k`` into ``x + (c + k)``."""
    if k == 0:
        return e
    if isinstance(e, L.Binary) and e.op == "+" and isinstance(e.rhs, L.Const) and isinstance(e.rhs.value, int) \
            and not isinstance(e.rhs.value, bool) and e.rhs.dtype == e.dtype:
        total = e.rhs.value + k
        return e.lhs if total == 0 else dataclasses.replace(e, rhs=dataclasses.replace(e.rhs, value=total))
    if e.dtype not in ("int32", "int64"):
        e = L.Cast("int64", e, e.span, "int64")
    return L.Binary("+", e, L.Const(k, e.span, e.dtype), e.span, e.dtype)


# ---- range inference -------------------------------------------------------------------------------------

def _accesses(expr: L.Expr, out: list, guards: tuple = ()):
    """Every tensor access in ``expr`` (nested ones too) as ``(tensor, args, span, guards)``; ``guards`` are
    the ``(condition, negated)`` of the ``?:`` that must hold for the access to run."""
    if isinstance(expr, L.Select):
        _accesses(expr.cond, out, guards)
        _accesses(expr.then, out, guards + ((expr.cond, False),))
        _accesses(expr.other, out, guards + ((expr.cond, True),))
        return out
    if isinstance(expr, L.Access):
        out.append((expr.tensor, expr.args, expr.span, guards))
    for c in children(expr):
        _accesses(c, out, guards)
    return out


def infer_ranges(cs: L.CheckedStatement, shapes: dict, sizes: dict, source: str, origins: dict | None = None):
    """``(ranges, constraints)``: index → ``(lo, hi)`` and the isl text of the constraints that keep the
    accesses used for inference in bounds (they may cut holes in the box).

    ``origins`` (tensor → the index of its first element per dimension, 0 where absent) gives each known
    tensor its logical box ``[origin, origin + extent)``: an access is in bounds inside that box.

    A read under ``?:`` constrains as every access does in TC, except on a side (lower or upper bound) its
    guard proves: where the guard's conditions, with the argument's other indices and the guard's indices in
    their ranges, exclude leaving the tensor on that side, the read does not shrink the range there (padding:
    ``(h - 1 >= 0 && h - 1 < H) ? X(h - 1) : 0``) — unless nothing else bounds that side, when every access
    constrains it (TC's rule). A guarded read is used once its guard's indices have ranges too; when a round
    solves nothing, the next one uses the reads still waiting, their guards proving nothing (so an index bound
    only under ``(j >= i) ? lens(j) : 0`` gets lens's range). A guard that is not affine (it reads data)
    proves nothing.
    """
    stmt = cs.stmt
    origins = origins or {}
    prefix = param_prefix(sizes)
    ranges: dict[str, tuple[int, int]] = {}
    constraints: list[str] = []
    for clause in stmt.where:
        if isinstance(clause, L.RangeClause):
            lo = constant_value(clause.lo, sizes)
            hi = constant_value(clause.hi, sizes)
            if lo is None or hi is None:
                raise RangeError(f"the range of '{clause.index}' must be an expression of sizes and literals",
                                 clause.span, source)
            if hi <= lo:
                raise RangeError(f"empty range {lo}:{hi} for index '{clause.index}'", clause.span, source,
                                 hint="check the sizes of the arguments")
            ranges[clause.index] = (lo, hi)
    accesses = []
    for clause in stmt.where:
        if isinstance(clause, L.ExistsClause):
            _accesses(clause.expr, accesses)
    _accesses(stmt.rhs, accesses)
    if stmt.tensor in shapes:
        lhs_args = tuple(L.Ident(i.name, i.span, "int32", "index") for i in stmt.indices)
        accesses.append((stmt.tensor, lhs_args, stmt.span, ()))
    candidates = []  # _Candidate per affine argument that may bound an index
    for tensor, args, _span, guards in accesses:
        shape = shapes.get(tensor)
        if shape is None or len(shape) != len(args):
            continue
        origin = origins.get(tensor) or (0,) * len(shape)
        guard_names = [n for cond, _ in guards for n in index_names(cond)]
        for arg, extent, first in zip(args, shape, origin):
            names = index_names(arg)
            # no wrap-around here: an index whose cast may wrap does not bound the range (give a where clause)
            text = affine_text(arg, set(names), sizes, ranges, allow_wrap=False)
            if text is None or not names:
                continue
            involved = list(dict.fromkeys(names + guard_names))
            conds = [guard_text(cond, set(involved), sizes, negate) for cond, negate in guards]
            candidates.append(_Candidate(names, [n for n in dict.fromkeys(guard_names) if n not in names], text, first,
                                         first + extent, None if any(c is None for c in conds) else conds))
    waiting = True  # a read waits for its guard's indices to have ranges, until no round solves anything
    while True:
        solved = {}
        for index in cs.indices:
            if index in ranges:
                continue
            strict = every = None
            for c in candidates:
                if index not in c.names or any(n != index and n not in ranges for n in c.names):
                    continue
                if waiting and any(n != index and n not in ranges for n in c.guard_names):
                    continue
                others = [n for n in c.names if n != index]
                inside = f"{c.lo} <= {c.text} < {c.hi}"
                sides = [f"{c.lo} <= {c.text}", f"{c.text} < {c.hi}"]
                every_set = _in_bounds_set(index, others, ranges, sides, prefix)
                every = every_set if every is None else every.intersect(every_set)
                if c.conds is None:
                    constraints.append(inside)
                    kept = sides
                else:
                    constraints.append(f"(not ({' and '.join(c.conds)}) or ({inside}))" if c.conds else inside)
                    kept = [side for side in sides if not _guard_proves(index, others, c, ranges, side, prefix)]
                strict_set = _in_bounds_set(index, others, ranges, kept, prefix) if kept else None
                if strict_set is not None:
                    strict = strict_set if strict is None else strict.intersect(strict_set)
            if every is None:
                continue
            lo = _side(strict, every, "min", sizes)
            hi = _side(strict, every, "max", sizes)
            if every.is_empty() or (strict is not None and strict.is_empty()) or lo is None or hi is None or lo > hi:
                kind = "unbounded" if (lo is None or hi is None) and not every.is_empty() else "empty"
                raise RangeError(f"the inferred range of index '{index}' is {kind}", stmt.span, source,
                                 hint=f"check the argument shapes, or give the range with 'where {index} in lo:hi'")
            solved[index] = (lo, hi + 1)
        if not solved and not waiting:
            break
        waiting = bool(solved)
        ranges.update(solved)
    for index in cs.indices:
        if index not in ranges:
            raise RangeError(f"cannot infer the range of index '{index}'", stmt.span, source,
                             hint=f"add a where clause such as 'where {index} in 0:N'")
    return ranges, constraints


@dataclasses.dataclass(frozen=True)
class _Candidate:
    """An affine access argument that may bound the ranges of its indices: ``lo <= text < hi`` keeps it in
    the tensor's box; ``conds`` are the isl texts of the enclosing ``?:`` guards (None: a guard that is not
    affine), ``guard_names`` the guards' indices that are not in the argument."""

    names: list
    guard_names: list
    text: str
    lo: int
    hi: int
    conds: list | None


def _guard_proves(index: str, others: list[str], c: _Candidate, ranges: dict, side: str, prefix: str = "") -> bool:
    """Whether ``c``'s guards keep ``side`` (``lo <= text`` or ``text < hi``) for every ``index``, with the
    argument's other indices and the guards' own indices in their ranges (False while one has no range)."""
    if not c.conds or any(n not in ranges for n in c.guard_names):
        return False
    bound = others + c.guard_names
    dims = ", ".join(isl_name(n) for n in [index] + bound)
    box = [f"{ranges[n][0]} <= {isl_name(n)} < {ranges[n][1]}" for n in bound]
    violated = isl.Set(f"{prefix}{{ [{dims}] : {' and '.join(box + [f'({x})' for x in c.conds]) or 'true'} "
                       f"and not ({side}) }}")
    return violated.is_empty()


def _side(strict: isl.Set | None, every: isl.Set, which: str, sizes: dict | None = None) -> int | None:
    """The range's smallest (``which="min"``) or largest value: from the accesses that constrain without a
    proving guard (``strict``) when they bound that side, else from every access (TC's rule); None if
    unbounded. With parameters (a generic kernel), a :class:`~polyc.poly.affine.Sym` when the value depends
    on the sizes (``isl_set_dim_min`` / ``isl_set_dim_max``); RangeError when it is not one affine function
    of them (``A(i) + B(i)`` with extents ``M`` and ``N``: ``min(M, N)``)."""
    for s in (strict, every):
        if s is None or s.is_empty():
            continue
        if s.dim(isl.dim_type.param):
            try:
                found = s.dim_min(0) if which == "min" else s.dim_max(0)
            except isl.Error:  # unbounded
                continue
            pieces = found.get_pieces()
            if len(pieces) != 1:
                raise RangeError(f"the {which} of a range is {found} here, not one affine function of the sizes; "
                                 "a generic kernel needs one", hint="give the range with a where clause")
            aff = pieces[0][1]
            return int(aff.get_constant_val().to_python()) if aff.is_cst() else sym_value(aff_text(aff), sizes)
        val = s.dim_min_val(0) if which == "min" else s.dim_max_val(0)
        if not (val.is_neginfty() or val.is_infty()):
            return int(val.to_python())
    return None


def _in_bounds_set(index: str, others: list[str], ranges: dict, sides: list[str], prefix: str = "") -> isl.Set:
    """``{ [index] : for all others in their ranges, every condition of sides holds }``."""
    dims = ", ".join(isl_name(n) for n in [index] + others)
    bounds = [f"{ranges[n][0]} <= {isl_name(n)} < {ranges[n][1]}" for n in others]
    bad = isl.Set(f"{prefix}{{ [{dims}] : {' and '.join(bounds) or 'true'} and not ({' and '.join(sides)}) }}")
    bad = bad.project_out(isl.dim_type.set, 1, len(others))
    return isl.Set(f"{prefix}{{ [{isl_name(index)}] }}").subtract(bad)


# ---- domains and access relations ------------------------------------------------------------------------

def _set_text(name: str, indices, constraints: list[str]) -> str:
    dims = ", ".join(isl_name(i) for i in indices)
    return f"{{ {name}[{dims}] : {' and '.join(constraints) or 'true'} }}"


def _box(name: str, indices, ranges: dict, prefix: str = "") -> isl.Set:
    parts = [f"{ranges[i][0]} <= {isl_name(i)} < {ranges[i][1]}" for i in indices]
    return isl.Set(prefix + _set_text(name, indices, parts))


def _statement(name, indices, domain, cs, op, rhs, sizes, shapes, ranges, source) -> PolyStatement:
    stmt = cs.stmt
    box = {i: ranges[i] for i in indices}
    rhs = mark_checked(rhs, set(indices), sizes, box)
    dims = ", ".join(isl_name(i) for i in indices)
    lhs = tuple(i.name for i in stmt.indices)
    lhs_text = ", ".join(isl_name(i) for i in lhs)
    prefix = param_prefix(sizes)
    write = isl.Map(f"{prefix}{{ {name}[{dims}] -> {isl_name(stmt.tensor)}[{lhs_text}] }}").intersect_domain(domain)
    reads = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    if op not in ("init", "="):
        reads = reads.union(isl.UnionMap.from_map(write))
    if op != "init":
        for text, node in _read_texts(rhs, name, indices, sizes, shapes, box):
            read = isl.Map(prefix + text).intersect_domain(domain)
            if isinstance(node, L.Access):
                check_read(read, node, indices, shapes[node.tensor], source, prefix)
            reads = reads.union(isl.UnionMap.from_map(read))
    return PolyStatement(name, tuple(indices), domain.coalesce(), stmt.tensor, lhs, op, rhs, write.coalesce(),
                         reads.coalesce(), stmt.span, _safe_reads(rhs, name, indices, domain, sizes, shapes, box))


def mark_checked(e: L.Expr, indices: set, sizes: dict, ranges: dict) -> L.Expr:
    """``e`` with every read that has a non-affine index (``A(i*i)``, ``A(B(i))``, ``A(max(i, 1))``) marked
    ``checked``: the compile-time bounds check cannot see where it goes, so the generated code checks each of
    its indices against the extent at run time (the kernel fails with KernelRuntimeError instead of reading
    outside the tensor). ``ranges`` (index → ``(lo, hi)``) bound the indices, as in :func:`affine_text`."""
    kids = children(e)
    if not kids:
        return e
    new = tuple(mark_checked(c, indices, sizes, ranges) for c in kids)
    if isinstance(e, L.Access):
        checked = e.checked or any(affine_text(a, indices, sizes, ranges) is None for a in e.args)
        return dataclasses.replace(e, args=new, checked=checked)
    return with_children(e, new)


def checked_reads(scop: Scop) -> list[str]:
    """The reads of ``scop`` its code checks at run time (``Access.checked``), as ``"A(i*i) at 1:36"``, in
    statement order without repeats: what a failed call (status 1, an index out of range) can be about."""
    found: list[str] = []

    def visit(e):
        if isinstance(e, L.Access) and e.checked:
            at = f" at {e.span.line}:{e.span.col}" if e.span is not None else ""
            text = f"{format_expr(e)}{at}"
            if text not in found:
                found.append(text)
        for c in children(e):
            visit(c)

    for s in scop.statements:
        visit(s.rhs)
    return found


def _safe_reads(rhs, name, indices, domain: isl.Set, sizes, shapes, ranges) -> frozenset:
    """The affine reads of ``rhs`` that stay inside their tensor for every point of ``domain``, ignoring the
    ``?:`` guards above them (so they need no mask); reads with a data-dependent index are never safe."""
    safe = set()
    dims = ", ".join(isl_name(i) for i in indices)
    index_set = set(indices)

    def visit(e):
        if isinstance(e, L.Access) and e.args:
            texts = [affine_text(arg, index_set, sizes, ranges) for arg in e.args]
            if all(t is not None for t in texts):
                shape = shapes[e.tensor]
                prefix = param_prefix(sizes)
                access = isl.Map(f"{prefix}{{ {name}[{dims}] -> [{', '.join(texts)}] }}").intersect_domain(domain)
                names = ", ".join(f"a{k}" for k in range(len(shape)))
                inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(shape))
                if access.range().is_subset(isl.Set(f"{prefix}{{ [{names}] : {inside} }}")):
                    safe.add(e)
        for c in children(e):
            visit(c)

    visit(rhs)
    return frozenset(safe)


def _read_texts(expr, name, indices, sizes, shapes, ranges, guard=None):
    """``(isl text, node)`` of every read in ``expr``: ``{ S[i..] -> A[f(i..)] : guard }`` and the Access (or
    the 0-d parameter's Ident); a non-affine argument covers
    the whole dimension (the read is checked at run time); reads under ``?:`` carry the affine part of the
    condition. ``ranges`` bound the indices (the statement's box)."""
    out = []
    index_set = set(indices)
    dims = ", ".join(isl_name(i) for i in indices)

    def visit(e, guard):
        if isinstance(e, L.Select):
            visit(e.cond, guard)
            then_g = guard_text(e.cond, index_set, sizes, ranges=ranges)
            else_g = guard_text(e.cond, index_set, sizes, negate=True, ranges=ranges)
            visit(e.then, _and(guard, then_g))
            visit(e.other, _and(guard, else_g))
            return
        if isinstance(e, L.Access):
            shape = shapes[e.tensor]
            outs, conds = [], [guard] if guard else []
            for k, (arg, extent) in enumerate(zip(e.args, shape)):
                text = affine_text(arg, index_set, sizes, ranges)
                if text is None:
                    outs.append(f"o{k}")
                    conds.append(f"0 <= o{k} < {extent}")
                else:
                    outs.append(text)
            out.append((f"{{ {name}[{dims}] -> {isl_name(e.tensor)}[{', '.join(outs)}] : "
                        f"{' and '.join(conds) or 'true'} }}", e))
        elif isinstance(e, L.Ident) and e.kind == "scalar":
            out.append((f"{{ {name}[{dims}] -> {isl_name(e.name)}[] }}", e))
        for c in children(e):
            visit(c, guard)

    visit(expr, guard)
    return out


def _and(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return f"({a}) and ({b})"


def check_read(read: isl.Map, access: L.Access, indices, shape: tuple, source: str, prefix: str = "") -> None:
    """Raise RangeError (at the read, naming the element) if ``read`` (its access relation over the domain)
    can leave ``shape``."""
    if not shape:
        return
    names = ", ".join(f"a{k}" for k in range(len(shape)))
    inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(shape))
    box = isl.Set(f"{prefix}{{ {read.get_tuple_name(isl.dim_type.out)}[{names}] : {inside} }}")
    outside = read.intersect_range(isl.Set.universe(box.get_space()).subtract(box))
    if outside.is_empty():
        return
    pair = isl.Map.from_domain_and_range(outside.domain().sample_point().to_set(), isl.Set.universe(box.get_space()))
    point = outside.intersect(pair).wrap().sample_point()
    values = [int(point.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(len(indices) + len(shape))]
    at = ", ".join(f"{i}={v}" for i, v in zip(indices, values))
    element = ", ".join(str(v) for v in values[len(indices):])
    raise RangeError(f"access to '{access.tensor}' leaves its shape {list(shape)} at {at}: "
                     f"{format_expr(access)} reads element [{element}]", access.span, source,
                     hint="restrict the indices with a where clause or guard the read with ?:")


def check_bounds(stmt: PolyStatement, scop: Scop, source: str) -> None:
    """Raise RangeError if an access of ``stmt`` can leave its tensor for some point of its domain."""
    accesses = isl.UnionMap.from_map(stmt.write).union(stmt.reads)
    maps = []
    accesses.foreach_map(maps.append)
    for m in maps:
        tensor = scop.tensor(_tensor_of(m, scop))
        if not tensor.shape:
            continue
        names = ", ".join(f"a{k}" for k in range(len(tensor.shape)))
        shape = tensor.extents or tensor.shape
        inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(shape))
        box = isl.Set(f"{scop.prefix}{{ {isl_name(tensor.name)}[{names}] : {inside} }}")
        outside = m.intersect_range(isl.Set.universe(box.get_space()).subtract(box))
        if not outside.is_empty():
            point = outside.domain().sample_point()
            coords = [int(point.get_coordinate_val(isl.dim_type.set, k).to_python())
                      for k in range(len(stmt.indices))]
            at = ", ".join(f"{i}={v}" for i, v in zip(stmt.indices, coords))
            raise RangeError(f"access to '{tensor.name}' leaves its shape {list(tensor.shape)} at {at}",
                             stmt.span, source,
                             hint="restrict the indices with a where clause or guard the read with ?:")


def _tensor_of(m: isl.Map, scop: Scop) -> str:
    out_name = m.get_tuple_name(isl.dim_type.out)
    for t in scop.tensors:
        if isl_name(t.name) == out_name:
            return t.name
    raise KeyError(out_name)
