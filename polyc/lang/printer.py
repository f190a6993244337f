"""The printer: AST → TC source text that parses back to the same AST.

``parse(format_program(p)) == p`` for every parsed program (spans aside). Parentheses are written only where
precedence needs them, so the parser's tree comes back exactly::

    >>> from polyc.lang import parse
    >>> s = parse("def f(float(N) a, float(N) b) -> (c) { c(i) = (a(i) + b(i)) * -a(i) }").defs[0].statements[0]
    >>> format_statement(s)
    'c(i) = (a(i) + b(i)) * -a(i)'

Typed ASTs print too: the casts sema inserted show as ``float32(...)``, which is handy when debugging.
"""
from __future__ import annotations

from . import ast as A
from .parser import BINARY_PRECEDENCE

_SELECT, _UNARY, _PRIMARY = 0, 7, 8

INDENT = "    "


def format_program(p: A.Program) -> str:
    """The source text of every def of ``p``, separated by blank lines."""
    return "\n\n".join(format_def(d) for d in p.defs) + ("\n" if p.defs else "")


def format_def(d: A.Def) -> str:
    """``def name(params) -> (outputs) {`` one statement per line ``}``."""
    params = ", ".join(_format_param(p) for p in d.params)
    outputs = ", ".join(_format_output(o) for o in d.outputs)
    body = "".join(f"{INDENT}{format_statement(s)}\n" for s in d.statements)
    return f"def {d.name}({params}) -> ({outputs}) {{\n{body}}}"


def format_statement(s: A.Statement) -> str:
    """``T(i, j) op rhs [<=> name(args)] [where clause, ...]`` (the annotation where TC's grammar puts it)."""
    lhs = f"{s.tensor}({', '.join(i.name for i in s.indices)})"
    text = f"{lhs} {s.op} {format_expr(s.rhs)}"
    if s.equivalent is not None:
        text += f" <=> {s.equivalent.name}({', '.join(format_expr(a) for a in s.equivalent.args)})"
    if s.where:
        text += " where " + ", ".join(format_clause(c) for c in s.where)
    return text


def format_clause(c: A.WhereClause) -> str:
    """One where clause: ``i in lo:hi``, ``exists e`` or ``x = e``."""
    if isinstance(c, A.RangeClause):
        return f"{c.index} in {_fmt(c.lo, 1)}:{_fmt(c.hi, 1)}"
    if isinstance(c, A.ExistsClause):
        return f"exists {format_expr(c.expr)}"
    return f"{c.name} = {format_expr(c.expr)}"


def format_expr(e: A.Expr) -> str:
    """An expression in source syntax with the fewest parentheses that keep its tree."""
    return _fmt(e, _SELECT)


def _format_dims(dims) -> str:
    return "(" + ", ".join(str(d.value) for d in dims) + ")" if dims else ""


def _format_param(p: A.Param) -> str:
    return f"{p.dtype}{_format_dims(p.dims)} {p.name}"


def _format_output(o: A.Output) -> str:
    if o.dtype is None:
        return o.name
    return f"{o.dtype}{_format_dims(o.dims or ())} {o.name}"


def _precedence(e: A.Expr) -> int:
    if isinstance(e, A.Select):
        return _SELECT
    if isinstance(e, A.Binary):
        return BINARY_PRECEDENCE[e.op]
    if isinstance(e, A.Unary):
        return _UNARY
    return _PRIMARY


def _fmt(e: A.Expr, min_prec: int) -> str:
    text = _text(e)
    return f"({text})" if _precedence(e) < min_prec else text


def _text(e: A.Expr) -> str:
    if isinstance(e, A.Const):
        return _format_const(e.value)
    if isinstance(e, A.Ident):
        return e.name
    if isinstance(e, A.Access):
        return f"{e.tensor}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, A.Call):
        return f"{e.func}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, A.Cast):
        return f"{e.to}({format_expr(e.operand)})"
    if isinstance(e, A.Unary):
        return f"{e.op}{_fmt(e.operand, _UNARY)}"
    if isinstance(e, A.Binary):
        p = BINARY_PRECEDENCE[e.op]
        return f"{_fmt(e.lhs, p)} {e.op} {_fmt(e.rhs, p + 1)}"
    if isinstance(e, A.Select):
        return f"{_fmt(e.cond, 1)} ? {format_expr(e.then)} : {format_expr(e.other)}"
    raise TypeError(f"not an expression node: {e!r}")


def _format_const(value) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    text = repr(float(value))
    return text if any(c in text for c in ".eE") or not text[-1].isdigit() else text + ".0"
