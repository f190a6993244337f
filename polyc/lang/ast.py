"""The language's abstract syntax tree: frozen nodes, each with the :class:`~polyc.errors.Span` it came from.

The parser (``polyc.lang.parser``) builds these nodes with ``dtype=None`` on every expression. Semantic
analysis (``polyc.lang.sema.check_def``) returns a *typed* copy in which

- every :class:`Expr` has ``dtype`` set to one of :data:`DTYPES`;
- implicit conversions are explicit :class:`Cast` nodes, so the operands of an arithmetic :class:`Binary`
  have the dtype of its result; comparison operands share one dtype and the result is ``bool``; ``&&``,
  ``||`` and ``!`` take and give ``bool``; a :class:`Select` has a ``bool`` condition and branches of its dtype;
- :class:`Call` arguments already have the dtype the builtin computes in (float32 or float64 for the
  float builtins), except ``ldexp``'s exponent, which keeps its integer type (bool becomes int32);
- ``where`` let bindings are substituted into the right-hand side (no :class:`Ident` refers to a let);
- an :class:`Ident` is an index variable (``kind="index"``, dtype int32), a size (``kind="size"``, dtype int32)
  or a 0-d parameter (``kind="scalar"``, dtype of the parameter).

Names of the dtypes follow numpy: bool, int8..int64, uint8..uint64, float16, bfloat16, float32, float64.
The source spellings ``float`` (= float32), ``double`` (= float64) and ``half`` (= float16) are canonicalised
by the parser.

float16 and bfloat16 are *storage types* (:data:`STORAGE_DTYPES`): a tensor of one holds 2-byte elements,
and reading it gives a value of that type, but everything that computes with it (arithmetic, comparisons,
builtins) converts it to float32 first, so an arithmetic expression is never of a storage type. Only
reads, ``?:`` between two values of the same storage type, and the conversions ``half(e)``/``bfloat16(e)``
(round to nearest even) have one. Writing a tensor of a storage type takes a value of that type (an explicit
``half(...)`` where the value is float32); a reduction never accumulates in one (see ``polyc.lang.sema``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Union

import numpy as np

from ..errors import Span

#: The dtypes of the language, numpy spelling.
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "bfloat16",
          "float32", "float64")

#: The storage types: 2-byte floats whose values compute as float32 (IEEE binary16; bfloat16 is the top half
#: of a float32). numpy has float16; bfloat16 arrays are ``ml_dtypes.bfloat16``.
STORAGE_DTYPES = ("float16", "bfloat16")


def itemsize(dtype: str) -> int:
    """Bytes of one element of ``dtype`` in memory — the one dtype-size table of polyc is numpy's
    (``np.dtype(dtype).itemsize``: ``bool`` takes one byte); the storage types take 2."""
    return 2 if dtype in STORAGE_DTYPES else np.dtype(dtype).itemsize

#: Source spellings of types → canonical dtype.
TYPE_NAMES = {**{d: d for d in DTYPES}, "float": "float32", "double": "float64", "half": "float16"}

#: Reduction operators: the operator in ``T(i) OP expr`` (``!`` forms keep the ``!``).
ASSIGN_OPS = ("=", "+=", "*=", "max=", "min=", "+=!", "*=!", "max=!", "min=!")

#: Builtin functions callable in expressions.
#: Every function of TC's ``tc/lang/builtins.h`` (CUDA's single-precision math library) is one, plus ``sigmoid``,
#: ``abs``, ``min``, ``max``, ``rint``, ``nearbyint``, ``ldexp`` and the integer ``bit*``/``shl``/``shr``; their
#: names are reserved (no tensor may take one).
BUILTINS = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "fabs", "abs", "fmax", "fmin", "fma", "pow",
            "erf", "floor", "ceil", "sin", "cos", "min", "max", "tan", "asin", "acos", "atan", "sinh", "cosh",
            "asinh", "acosh", "atanh", "rint", "fmod", "bitand", "bitor", "bitxor", "bitnot", "shl", "shr",
            "atan2", "cbrt", "rcbrt", "copysign", "cospi", "sinpi", "cyl_bessel_i0", "cyl_bessel_i1", "erfc",
            "erfcinv", "erfcx", "erfinv", "exp10", "exp2", "expm1", "fdim", "fdivide", "hypot", "rhypot", "j0",
            "j1", "y0", "y1", "lgamma", "tgamma", "log10", "log1p", "log2", "logb", "nextafter", "norm3d",
            "norm4d", "rnorm3d", "rnorm4d", "normcdf", "normcdfinv", "remainder", "round", "trunc", "nearbyint",
            "ldexp")


def _span_field():
    return field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Const:
    """A numeric literal. ``value`` is an int (int32 literal unless out of range) or a float."""

    value: Union[int, float, bool]
    span: Span | None = _span_field()
    dtype: str | None = None


@dataclass(frozen=True)
class Ident:
    """A name used as a value: index variable, size, 0-d parameter or (before sema) a let binding.

    ``kind`` is set by sema: ``"index"``, ``"size"`` or ``"scalar"``.
    """

    name: str
    span: Span | None = _span_field()
    dtype: str | None = None
    kind: str | None = None


@dataclass(frozen=True)
class Access:
    """A read of tensor ``tensor`` at ``args`` (one expression per dimension), e.g. ``A(h+kh, B(i))``.

    ``checked`` is set by the polyhedral model (``polyc.poly.build.mark_checked``) on a read with an index it
    cannot bound (``A(i*i)``, ``A(B(i))``): the generated code checks every index of it against the extent at
    run time and fails the call (KernelRuntimeError) instead of reading outside the tensor.
    """

    tensor: str
    args: tuple["Expr", ...]
    span: Span | None = _span_field()
    dtype: str | None = None
    checked: bool = False


@dataclass(frozen=True)
class Unary:
    """``-x`` or ``!x``."""

    op: str
    operand: "Expr"
    span: Span | None = _span_field()
    dtype: str | None = None


@dataclass(frozen=True)
class Binary:
    """``lhs op rhs`` with op in ``+ - * / % < <= > >= == != && ||``.

    Integer ``/`` and ``%`` round toward minus infinity (Halide semantics); float ``%`` is ``fmod``-like with
    the sign of the divisor (numpy's ``np.mod``).
    """

    op: str
    lhs: "Expr"
    rhs: "Expr"
    span: Span | None = _span_field()
    dtype: str | None = None


@dataclass(frozen=True)
class Select:
    """``cond ? then : other``."""

    cond: "Expr"
    then: "Expr"
    other: "Expr"
    span: Span | None = _span_field()
    dtype: str | None = None


@dataclass(frozen=True)
class Call:
    """A builtin call ``func(args...)``; ``func`` is one of :data:`BUILTINS`."""

    func: str
    args: tuple["Expr", ...]
    span: Span | None = _span_field()
    dtype: str | None = None


@dataclass(frozen=True)
class Cast:
    """A conversion ``float(e)``, ``int32(e)``, ``half(e)`` ...; ``to`` is the canonical dtype. Sema inserts
    implicit ones. Conversions to float16/bfloat16 round to nearest even (float64 rounds once, not through
    float32); conversions from them are exact (to float) or through float32 (to integers and bool)."""

    to: str
    operand: "Expr"
    span: Span | None = _span_field()
    dtype: str | None = None


Expr = Union[Const, Ident, Access, Unary, Binary, Select, Call, Cast]


def children(e: Expr) -> tuple:
    """The direct sub-expressions of an expression node, left to right (the one definition every walker
    over expressions uses)."""
    if isinstance(e, (Access, Call)):
        return e.args
    if isinstance(e, (Unary, Cast)):
        return (e.operand,)
    if isinstance(e, Binary):
        return (e.lhs, e.rhs)
    if isinstance(e, Select):
        return (e.cond, e.then, e.other)
    return ()


def with_children(e: Expr, new: tuple) -> Expr:
    """``e`` with its sub-expressions (in :func:`children`'s order) replaced by ``new``; ``e`` itself when
    nothing changed."""
    if all(n is c for n, c in zip(new, children(e))):
        return e
    if isinstance(e, (Unary, Cast)):
        return replace(e, operand=new[0])
    if isinstance(e, Binary):
        return replace(e, lhs=new[0], rhs=new[1])
    if isinstance(e, Select):
        return replace(e, cond=new[0], then=new[1], other=new[2])
    return replace(e, args=tuple(new))  # Access, Call


def conjuncts(cond: Expr) -> list:
    """The operands of a chain of ``&&`` (``cond`` itself when it is not one)."""
    if isinstance(cond, Binary) and cond.op == "&&":
        return conjuncts(cond.lhs) + conjuncts(cond.rhs)
    return [cond]


def walk(e: Expr):
    """``e`` and every expression inside it, pre-order, left to right; iterative, so a deep tree (the parser
    allows thousands of levels) cannot exhaust Python's stack."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(children(node)))


@dataclass(frozen=True)
class RangeClause:
    """``where i in lo:hi`` — ``lo`` inclusive, ``hi`` exclusive; expressions of sizes and constants."""

    index: str
    lo: Expr
    hi: Expr
    span: Span | None = _span_field()


@dataclass(frozen=True)
class ExistsClause:
    """``where exists expr`` — ``expr`` (usually an access) constrains range inference only."""

    expr: Expr
    span: Span | None = _span_field()


@dataclass(frozen=True)
class LetClause:
    """``where x = expr`` — a name for an expression, substituted by sema."""

    name: str
    expr: Expr
    span: Span | None = _span_field()


WhereClause = Union[RangeClause, ExistsClause, LetClause]


@dataclass(frozen=True)
class IndexVar:
    """An index variable on the left-hand side of a statement."""

    name: str
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Equivalent:
    """``<=> name(args)``: TC's equivalent-library-call annotation on a statement, e.g. ``<=> matmul(A, B)``.

    Metadata only: it names a library function computing the same thing and is never checked or compiled.
    """

    name: str
    args: tuple[Expr, ...] = ()
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Statement:
    """``tensor(indices) op rhs [<=> name(args)] [where clauses]``; ``op`` is one of :data:`ASSIGN_OPS`.

    ``equivalent`` is the optional :class:`Equivalent` annotation. Like the span it is left out of equality
    and hashing: it does not change what the statement computes, so two statements that differ only in
    it are the same statement. Checking drops it (the typed statement has none).
    """

    tensor: str
    indices: tuple[IndexVar, ...]
    op: str
    rhs: Expr
    where: tuple[WhereClause, ...] = ()
    span: Span | None = _span_field()
    equivalent: Equivalent | None = field(default=None, compare=False)

    @property
    def reduction_op(self) -> str:
        """The operator without ``!``: ``=``, ``+=``, ``*=``, ``max=`` or ``min=``."""
        return self.op.rstrip("!")

    @property
    def initializes(self) -> bool:
        """Whether the tensor is first set to the reduction's identity (the ``!`` forms)."""
        return self.op.endswith("!")


@dataclass(frozen=True)
class Dim:
    """One dimension in a type: a size name (``M``) or an integer literal (``256``)."""

    value: Union[str, int]
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Param:
    """An input ``float(M,K) A``; ``dims == ()`` is a 0-d scalar."""

    name: str
    dtype: str
    dims: tuple[Dim, ...]
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Output:
    """An output in ``-> (C, float(M,N) D)``; ``dtype``/``dims`` are ``None`` when inferred."""

    name: str
    dtype: str | None = None
    dims: tuple[Dim, ...] | None = None
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Def:
    """``def name(params) -> (outputs) { statements }``."""

    name: str
    params: tuple[Param, ...]
    outputs: tuple[Output, ...]
    statements: tuple[Statement, ...]
    span: Span | None = _span_field()


@dataclass(frozen=True)
class Program:
    """A parsed source: its defs in order and the text they came from (for error carets)."""

    defs: tuple[Def, ...]
    source: str = field(default="", compare=False, repr=False)


# ---- the result of semantic analysis (built by polyc.lang.sema.check_def) ----

@dataclass(frozen=True)
class TensorDecl:
    """A tensor of a checked def.

    ``role`` is ``"input"``, ``"output"`` or ``"temp"`` (written but not returned: allocated by polyc).
    ``dims`` are the declared dimensions (inputs, typed outputs) or ``None`` when range inference gives them.
    """

    name: str
    dtype: str
    rank: int
    role: str
    dims: tuple[Dim, ...] | None
    span: Span | None = _span_field()


@dataclass(frozen=True)
class CheckedStatement:
    """A typed statement with its index variables split into the left-hand ones and the reduction ones.

    ``reduction_indices`` are the index variables that occur on the right (or in where clauses) but not on
    the left, in order of first occurrence. The iteration domain's dimensions are
    ``lhs_indices + reduction_indices``.
    """

    stmt: Statement
    lhs_indices: tuple[str, ...]
    reduction_indices: tuple[str, ...]

    @property
    def indices(self) -> tuple[str, ...]:
        return self.lhs_indices + self.reduction_indices


@dataclass(frozen=True)
class CheckedDef:
    """A def that passed every check: typed statements and every tensor's declaration.

    ``tensors`` lists inputs in parameter order, then outputs in return order, then temporaries in order of
    first write. ``sizes`` lists the size names of the parameters in order of first occurrence.
    """

    name: str
    tensors: tuple[TensorDecl, ...]
    sizes: tuple[str, ...]
    statements: tuple[CheckedStatement, ...]
    source: str = field(default="", compare=False, repr=False)

    def tensor(self, name: str) -> TensorDecl:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def inputs(self) -> tuple[TensorDecl, ...]:
        return tuple(t for t in self.tensors if t.role == "input")

    @property
    def outputs(self) -> tuple[TensorDecl, ...]:
        return tuple(t for t in self.tensors if t.role == "output")

    @property
    def temps(self) -> tuple[TensorDecl, ...]:
        return tuple(t for t in self.tensors if t.role == "temp")
