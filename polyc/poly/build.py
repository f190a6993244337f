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
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..errors import RangeError, SemanticError
from ..lang import ast as L
from ..lang.printer import format_expr
from .affine import (affine_text, children, constant_value, element_stride, guard_text, index_names, isl_name,
                     accesses_in)
from .scop import PolyStatement, Scop, Tensor

#: The identity of each reduction operator, by dtype kind (float / signed int / unsigned int / bool).
_IDENTITY = {"+=": 0, "*=": 1}


def identity_value(op: str, dtype: str):
    """The identity element of reduction ``op`` (``+=``, ``*=``, ``max=``, ``min=``) for ``dtype``."""
    import numpy as np

    if op in _IDENTITY:
        return float(_IDENTITY[op]) if dtype.startswith("float") else _IDENTITY[op]
    if dtype.startswith("float"):
        return float("-inf") if op == "max=" else float("inf")
    if dtype == "bool":
        return op == "min="
    info = np.iinfo(dtype)
    return int(info.min) if op == "max=" else int(info.max)


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
                    * L.ITEMSIZE[checked.tensor(r.tensor).dtype] for r in known), default=0)
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

    Raises :class:`~polyc.errors.RangeError` when range inference fails or an access can leave its tensor.
    """
    shapes = input_shapes(checked, sizes)
    statements: list[PolyStatement] = []
    ranges: dict = {}
    try:
        for cs in checked.statements:
            stmt_ranges, constraints = infer_ranges(cs, shapes, sizes, checked.source)
            if cs.stmt.tensor not in shapes:
                shapes[cs.stmt.tensor] = tuple(stmt_ranges[i][1] for i in cs.lhs_indices)
            if cs.stmt.initializes:
                name = f"S{len(statements)}"
                init_domain = _box(name, cs.lhs_indices, stmt_ranges)
                dtype = checked.tensor(cs.stmt.tensor).dtype
                rhs = L.Const(identity_value(cs.stmt.reduction_op, dtype), dtype=dtype)
                statements.append(_statement(name, cs.lhs_indices, init_domain, cs, "init", rhs, sizes, shapes,
                                             stmt_ranges, checked.source))
            name = f"S{len(statements)}"
            indices = cs.lhs_indices + reduction_order(cs, checked, shapes, sizes)
            for index in indices:
                ranges[(name, index)] = stmt_ranges[index]
            box = [f"{stmt_ranges[i][0]} <= {isl_name(i)} < {stmt_ranges[i][1]}" for i in indices]
            domain = isl.Set(_set_text(name, indices, box + constraints))
            statements.append(_statement(name, indices, domain, cs, cs.stmt.reduction_op, cs.stmt.rhs,
                                         sizes, shapes, stmt_ranges, checked.source))
    except isl.Error as exc:  # a polyc bug: the text we built is not isl's
        raise SemanticError(f"internal error building the polyhedral model: {exc}") from None
    tensors = tuple(Tensor(t.name, t.dtype, shapes[t.name], t.role) for t in checked.tensors)
    scop = Scop(checked.name, tensors, tuple(statements), dict(sizes), ranges, (), checked.source)
    for s in scop.statements:
        check_bounds(s, scop, checked.source)
    return scop


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


def infer_ranges(cs: L.CheckedStatement, shapes: dict, sizes: dict, source: str):
    """``(ranges, constraints)``: index → ``(lo, hi)`` and the isl text of the constraints that keep the
    accesses used for inference in bounds (they may cut holes in the box)."""
    stmt = cs.stmt
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
    candidates = []  # (indices involved, arg text, extent, guard conditions)
    for tensor, args, _span, guards in accesses:
        shape = shapes.get(tensor)
        if shape is None or len(shape) != len(args):
            continue
        guard_names = [n for cond, _ in guards for n in index_names(cond)]
        for arg, extent in zip(args, shape):
            names = index_names(arg)
            # no wrap-around here: an index whose cast may wrap does not bound the range (give a where clause)
            text = affine_text(arg, set(names), sizes, ranges, allow_wrap=False)
            if text is None or not names:
                continue
            involved = list(dict.fromkeys(names + guard_names))
            conds = [guard_text(cond, set(involved), sizes, negate) for cond, negate in guards]
            if any(c is None for c in conds):
                continue  # a read under a non-affine condition does not constrain the ranges
            candidates.append((names, involved, text, extent, conds))
    while True:
        solved = {}
        for index in cs.indices:
            if index in ranges:
                continue
            good = None
            for names, involved, text, extent, conds in candidates:
                if index not in names or any(n != index and n not in ranges for n in involved):
                    continue
                others = [n for n in involved if n != index]
                keep = _in_bounds_set(index, others, ranges, text, extent, conds)
                good = keep if good is None else good.intersect(keep)
                inside = f"0 <= {text} < {extent}"
                constraints.append(f"(not ({' and '.join(conds)}) or ({inside}))" if conds else inside)
            if good is None:
                continue
            if good.is_empty() or not good.is_bounded():
                kind = "empty" if good.is_empty() else "unbounded"
                raise RangeError(f"the inferred range of index '{index}' is {kind}", stmt.span, source,
                                 hint=f"check the argument shapes, or give the range with 'where {index} in lo:hi'")
            lo = _bound(good, min)
            hi = _bound(good, max) + 1
            solved[index] = (lo, hi)
        if not solved:
            break
        ranges.update(solved)
    for index in cs.indices:
        if index not in ranges:
            raise RangeError(f"cannot infer the range of index '{index}'", stmt.span, source,
                             hint=f"add a where clause such as 'where {index} in 0:N'")
    return ranges, constraints


def _in_bounds_set(index: str, others: list[str], ranges: dict, text: str, extent: int,
                   conds: list[str] = ()) -> isl.Set:
    """``{ [index] : for all others in their ranges where conds hold, 0 <= text < extent }``."""
    dims = ", ".join(isl_name(n) for n in [index] + others)
    bounds = [f"{ranges[n][0]} <= {isl_name(n)} < {ranges[n][1]}" for n in others] + [f"({c})" for c in conds]
    bad = isl.Set(f"{{ [{dims}] : {' and '.join(bounds) or 'true'} and ({text} < 0 or {text} >= {extent}) }}")
    bad = bad.project_out(isl.dim_type.set, 1, len(others))
    return isl.Set(f"{{ [{isl_name(index)}] }}").subtract(bad)


def _bound(s: isl.Set, which) -> int:
    """The smallest (``which=min``) or largest value of the single dimension of ``s``."""
    point = s.lexmin() if which is min else s.lexmax()
    val = point.sample_point().get_coordinate_val(isl.dim_type.set, 0)
    return int(val.to_python())


# ---- domains and access relations ------------------------------------------------------------------------

def _set_text(name: str, indices, constraints: list[str]) -> str:
    dims = ", ".join(isl_name(i) for i in indices)
    return f"{{ {name}[{dims}] : {' and '.join(constraints) or 'true'} }}"


def _box(name: str, indices, ranges: dict) -> isl.Set:
    parts = [f"{ranges[i][0]} <= {isl_name(i)} < {ranges[i][1]}" for i in indices]
    return isl.Set(_set_text(name, indices, parts))


def _statement(name, indices, domain, cs, op, rhs, sizes, shapes, ranges, source) -> PolyStatement:
    stmt = cs.stmt
    box = {i: ranges[i] for i in indices}
    rhs = mark_checked(rhs, set(indices), sizes, box)
    dims = ", ".join(isl_name(i) for i in indices)
    lhs = tuple(i.name for i in stmt.indices)
    lhs_text = ", ".join(isl_name(i) for i in lhs)
    write = isl.Map(f"{{ {name}[{dims}] -> {isl_name(stmt.tensor)}[{lhs_text}] }}").intersect_domain(domain)
    reads = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
    if op not in ("init", "="):
        reads = reads.union(isl.UnionMap.from_map(write))
    if op != "init":
        for text, node in _read_texts(rhs, name, indices, sizes, shapes, box):
            read = isl.Map(text).intersect_domain(domain)
            if isinstance(node, L.Access):
                check_read(read, node, indices, shapes[node.tensor], source)
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
    if all(n is c for n, c in zip(new, kids)):
        return e
    if isinstance(e, L.Unary) or isinstance(e, L.Cast):
        return dataclasses.replace(e, operand=new[0])
    if isinstance(e, L.Binary):
        return dataclasses.replace(e, lhs=new[0], rhs=new[1])
    if isinstance(e, L.Select):
        return dataclasses.replace(e, cond=new[0], then=new[1], other=new[2])
    return dataclasses.replace(e, args=new)  # Call


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
                access = isl.Map(f"{{ {name}[{dims}] -> [{', '.join(texts)}] }}").intersect_domain(domain)
                names = ", ".join(f"a{k}" for k in range(len(shape)))
                inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(shape))
                if access.range().is_subset(isl.Set(f"{{ [{names}] : {inside} }}")):
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


def check_read(read: isl.Map, access: L.Access, indices, shape: tuple, source: str) -> None:
    """Raise RangeError (at the read, naming the element) if ``read`` (its access relation over the domain)
    can leave ``shape``."""
    if not shape:
        return
    names = ", ".join(f"a{k}" for k in range(len(shape)))
    inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(shape))
    box = isl.Set(f"{{ {read.get_tuple_name(isl.dim_type.out)}[{names}] : {inside} }}")
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
        inside = " and ".join(f"0 <= a{k} < {n}" for k, n in enumerate(tensor.shape))
        box = isl.Set(f"{{ {isl_name(tensor.name)}[{names}] : {inside} }}")
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
