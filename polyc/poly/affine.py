"""Lang expressions → isl affine text.

Index expressions and guards of the language become isl's own text so that domains and access relations are
written the way isl prints them. Sizes are specialised: a size is replaced by its value.

    >>> affine_text(parse_expr("2*h + kh - 1"), {"h", "kh"}, {})
    '((2 * h) + kh) - 1'

A sub-expression that is not affine (a data-dependent read, a product of two indices, a float) makes the
whole expression non-affine: the functions return ``None`` and the caller over-approximates.
"""
from __future__ import annotations

from ..lang import ast as L

#: Words isl's parser reserves; an index with one of these names gets a trailing underscore in isl text.
ISL_KEYWORDS = frozenset({
    "and", "or", "not", "implies", "mod", "floor", "ceil", "min", "max", "exists", "true", "false", "infty",
    "rat", "domain", "range", "sum", "floord", "cond", "select", "ceild", "if", "else", "NaN", "div",
})


def isl_name(name: str) -> str:
    """The isl spelling of an index or tensor name (keywords get a trailing underscore)."""
    return name + "_" if name in ISL_KEYWORDS or name.startswith("_") else name


def affine_text(expr: L.Expr, indices: set[str] | frozenset[str], sizes: dict) -> str | None:
    """isl text of an integer affine expression of ``indices`` and ``sizes``, or ``None`` if not affine.

    Integer division and modulo by a positive constant become isl's ``floor(e/c)`` and ``e mod c`` (both round
    toward minus infinity, as the language does).
    """
    if isinstance(expr, L.Const):
        if isinstance(expr.value, bool) or not isinstance(expr.value, int):
            return None
        return str(expr.value) if expr.value >= 0 else f"({expr.value})"
    if isinstance(expr, L.Ident):
        if expr.name in indices:
            return isl_name(expr.name)
        if expr.name in sizes:
            return str(sizes[expr.name])
        return None
    if isinstance(expr, L.Cast):
        if expr.to.startswith(("int", "uint")) and (expr.operand.dtype or "int").startswith(("int", "uint")):
            return affine_text(expr.operand, indices, sizes)
        return None
    if isinstance(expr, L.Unary) and expr.op == "-":
        inner = affine_text(expr.operand, indices, sizes)
        return None if inner is None else f"-({inner})"
    if isinstance(expr, L.Binary) and expr.op in ("+", "-", "*", "/", "%"):
        lhs = affine_text(expr.lhs, indices, sizes)
        rhs = affine_text(expr.rhs, indices, sizes)
        if lhs is None or rhs is None:
            return None
        if expr.op in ("+", "-"):
            return f"({lhs}) {expr.op} ({rhs})"
        if expr.op == "*":
            left, right = constant_value(expr.lhs, sizes), constant_value(expr.rhs, sizes)
            if left is not None:  # isl reads a product only with a bare integer factor
                return f"{left} * ({rhs})"
            if right is not None:
                return f"{right} * ({lhs})"
            return None
        divisor = constant_value(expr.rhs, sizes)
        if divisor is None or divisor <= 0:
            return None
        if expr.op == "/":
            return f"floor(({lhs})/{divisor})"
        return f"({lhs}) mod {divisor}"
    return None


def constant_value(expr: L.Expr, sizes: dict) -> int | None:
    """The integer value of an expression of literals and sizes, or ``None`` if it has other terms."""
    if isinstance(expr, L.Const):
        return expr.value if isinstance(expr.value, int) and not isinstance(expr.value, bool) else None
    if isinstance(expr, L.Ident):
        return sizes.get(expr.name)
    if isinstance(expr, L.Cast):
        return constant_value(expr.operand, sizes)
    if isinstance(expr, L.Unary) and expr.op == "-":
        v = constant_value(expr.operand, sizes)
        return None if v is None else -v
    if isinstance(expr, L.Binary):
        a = constant_value(expr.lhs, sizes)
        b = constant_value(expr.rhs, sizes)
        if a is None or b is None:
            return None
        if expr.op == "+":
            return a + b
        if expr.op == "-":
            return a - b
        if expr.op == "*":
            return a * b
        if expr.op == "/":
            return a // b if b else 0
        if expr.op == "%":
            return a % b if b else 0
    return None


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_ISL_CMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "=", "!=": "!="}


def guard_text(cond: L.Expr, indices, sizes: dict, negate: bool = False) -> str | None:
    """isl constraint text of a boolean condition built from affine comparisons, ``&&``, ``||`` and ``!``.

    Returns ``None`` when the condition is not of that form (the caller then ignores the guard, which
    over-approximates). ``negate`` gives the text of ``!cond`` (pushed down with De Morgan's laws).
    """
    if isinstance(cond, L.Unary) and cond.op == "!":
        return guard_text(cond.operand, indices, sizes, not negate)
    if isinstance(cond, L.Binary) and cond.op in ("&&", "||"):
        lhs = guard_text(cond.lhs, indices, sizes, negate)
        rhs = guard_text(cond.rhs, indices, sizes, negate)
        if lhs is None or rhs is None:
            return None
        joint = "and" if (cond.op == "&&") != negate else "or"
        return f"(({lhs}) {joint} ({rhs}))"
    if isinstance(cond, L.Binary) and cond.op in _NEGATED:
        lhs = affine_text(cond.lhs, indices, sizes)
        rhs = affine_text(cond.rhs, indices, sizes)
        if lhs is None or rhs is None:
            return None
        op = _NEGATED[cond.op] if negate else cond.op
        if op == "!=":
            return f"(({lhs}) < ({rhs}) or ({lhs}) > ({rhs}))"
        return f"({lhs}) {_ISL_CMP[op]} ({rhs})"
    if isinstance(cond, L.Cast):
        return guard_text(cond.operand, indices, sizes, negate)
    return None


def index_names(expr: L.Expr) -> list[str]:
    """Index variables (``Ident`` of kind ``"index"``) occurring in ``expr``, in order, without repeats."""
    found: list[str] = []

    def visit(e):
        if isinstance(e, L.Ident):
            if e.kind == "index" and e.name not in found:
                found.append(e.name)
        for child in children(e):
            visit(child)

    visit(expr)
    return found


def children(e: L.Expr) -> tuple:
    """The sub-expressions of a lang expression node."""
    if isinstance(e, L.Access):
        return e.args
    if isinstance(e, L.Unary):
        return (e.operand,)
    if isinstance(e, L.Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, L.Select):
        return (e.cond, e.then, e.other)
    if isinstance(e, L.Call):
        return e.args
    if isinstance(e, L.Cast):
        return (e.operand,)
    return ()


def has_access(expr: L.Expr) -> bool:
    """Whether ``expr`` reads a tensor (a data-dependent value)."""
    if isinstance(expr, L.Access):
        return True
    return any(has_access(c) for c in children(expr))
