"""Lang expressions → isl affine text.

Index expressions and guards of the language become isl's own text so that domains and access relations are
written the way isl prints them. A size is replaced by its value; in a generic kernel, where its value is a
:class:`Sym`, by its isl parameter.

    >>> affine_text(parse_expr("2*h + kh - 1"), {"h", "kh"}, {})
    '((2 * h) + kh) - 1'

A sub-expression that is not affine (a data-dependent read, a product of two indices, a float) makes the
whole expression non-affine: the functions return ``None`` and the caller over-approximates; a read with a
non-affine index is then checked at run time (``Access.checked``, set by ``polyc.poly.build``). The text is
always what the generated code computes (casts wrap around, ``/`` and ``%`` round toward minus infinity for
every divisor), so an access proven in bounds here is in bounds in the kernel.
"""
from __future__ import annotations

import islpy as isl

from ..lang import ast as L

#: Words isl's parser reserves; an index with one of these names gets a trailing underscore in isl text.
ISL_KEYWORDS = frozenset({
    "and", "or", "not", "implies", "mod", "floor", "ceil", "min", "max", "exists", "true", "false", "infty",
    "rat", "domain", "range", "sum", "floord", "cond", "select", "ceild", "if", "else", "NaN", "div",
})


def isl_name(name: str) -> str:
    """The isl spelling of an index or tensor name (keywords get a trailing underscore)."""
    return name + "_" if name in ISL_KEYWORDS or name.startswith("_") else name


#: The range of each integer dtype the model can follow (uint64 and bool are not modelled: not affine).
INT_RANGE = {"int8": (-2**7, 2**7 - 1), "int16": (-2**15, 2**15 - 1), "int32": (-2**31, 2**31 - 1),
             "int64": (-2**63, 2**63 - 1), "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1),
             "uint32": (0, 2**32 - 1)}
#: Dtypes whose arithmetic the generated index code does in 64 bits without wrapping (the others wrap).
WIDE = ("int32", "int64")

#: The largest extent a size of a generic kernel may take (its isl context: ``1 <= N <= SIZE_MAX``); the
#: index arithmetic is analysed for overflow with sizes up to it.
SIZE_MAX = 1 << 24


class Sym(int):
    """An integer that depends on the sizes of a generic kernel (isl parameters): ``int(s)`` is its value at
    the hint sizes (what the strategy's decisions use), ``str(s)`` its isl text in the parameters (``(H -
    KH + 1)``). Sums, differences, negation, and products and floor quotients by an int stay symbolic; every
    other operation is the int's."""

    text: str

    def __new__(cls, value: int, text: str):
        obj = int.__new__(cls, int(value))
        obj.text = text
        return obj

    def __str__(self) -> str:
        return f"({self.text})"

    def __repr__(self) -> str:  # as error messages show a shape
        return self.text

    def __add__(self, other):
        if isinstance(other, int) and not isinstance(other, Sym) and other == 0:
            return self
        return Sym(int(self) + int(other), f"{self} + {_sym_text(other)}") if isinstance(other, int) else NotImplemented

    __radd__ = __add__

    def __sub__(self, other):
        if isinstance(other, int) and not isinstance(other, Sym) and other == 0:
            return self
        return Sym(int(self) - int(other), f"{self} - {_sym_text(other)}") if isinstance(other, int) else NotImplemented

    def __rsub__(self, other):
        return Sym(int(other) - int(self), f"{_sym_text(other)} - {self}") if isinstance(other, int) else NotImplemented

    def __neg__(self):
        return Sym(-int(self), f"-{self}")

    def __mul__(self, other):
        if isinstance(other, Sym):
            raise TypeError("a product of two sizes is not affine")
        return Sym(int(self) * other, f"{other} * {self}") if isinstance(other, int) else NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, other):
        if isinstance(other, Sym) or not isinstance(other, int) or other <= 0:
            raise TypeError("only a floor quotient by a positive integer is affine")
        return Sym(int(self) // other, f"floor({self}/{other})")


def _sym_text(x) -> str:
    return str(x) if isinstance(x, Sym) else f"({int(x)})"


def parameters(sizes: dict) -> tuple[str, ...]:
    """The sizes among ``sizes`` that are isl parameters: those whose value is a :class:`Sym` of their own
    (isl) name."""
    return tuple(k for k, v in sizes.items() if isinstance(v, Sym) and v.text == isl_name(k))


def param_prefix(sizes: dict) -> str:
    """``"[M, N] -> "``: the declaration isl text over the parameters of ``sizes`` starts with (``""``
    without any)."""
    names = parameters(sizes)
    return f"[{', '.join(isl_name(n) for n in names)}] -> " if names else ""


def size_context(sizes: dict) -> isl.Set:
    """The parameter values a generic kernel serves: ``[M, N] -> { : 1 <= M <= SIZE_MAX and ... }``."""
    bounds = [f"1 <= {isl_name(n)} <= {SIZE_MAX}" for n in parameters(sizes)]
    return isl.Set(f"{param_prefix(sizes)}{{ : {' and '.join(bounds) or 'true'} }}")


def fixed_parameters(params, values: dict) -> isl.Set:
    """The parameters ``params`` (size names) fixed to ``values``: ``[M, N] -> { : M = 64 and N = 32 }``."""
    prefix = f"[{', '.join(isl_name(p) for p in params)}] -> " if params else ""
    fixed = [f"{isl_name(p)} = {int(values[p])}" for p in params]
    return isl.Set(f"{prefix}{{ : {' and '.join(fixed) or 'true'} }}")


def hint_values(sizes: dict) -> isl.Set:
    """The parameters of ``sizes`` fixed to their hint values (:func:`fixed_parameters`)."""
    return fixed_parameters(parameters(sizes), sizes)


def sym_value(text: str, sizes: dict) -> "Sym":
    """The :class:`Sym` of isl text ``text`` over the parameters of ``sizes`` (its value at the hint)."""
    point = isl.Set(f"{param_prefix(sizes)}{{ [x] : x = {text} }}").intersect_params(hint_values(sizes))
    return Sym(int(point.sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python()), text)


def simplified(value, sizes: dict):
    """``value`` with a :class:`Sym`'s text in isl's own simplified form (``(-1 + N) + (1)`` becomes ``N``);
    an int, or a Sym isl cannot write as one affine function, unchanged."""
    if not isinstance(value, Sym):
        return value
    pieces = isl.PwAff(f"{param_prefix(sizes)}{{ [({value.text})] }}").get_pieces()
    return Sym(int(value), aff_text(pieces[0][1])) if len(pieces) == 1 else value


def aff_text(aff: isl.Aff) -> str:
    """The expression of a one-output affine function in isl's text: ``[H, KH] -> { [(H - KH)] }`` gives
    ``H - KH``."""
    text = aff.to_str()
    return text[text.index("{ [(") + 4:text.rindex(")] }")]


def affine_text(expr: L.Expr, indices: set[str] | frozenset[str], sizes: dict, ranges: dict | None = None, *,
                allow_wrap: bool = True, exact_int32: bool = False) -> str | None:
    """isl text of an integer affine expression of ``indices`` and ``sizes``, or ``None`` if not affine.

    The text is the value the generated code computes (:func:`polyc.codegen.expr.index_value`), so a bounds
    check on it is a check of what the kernel reads:

    - int32 and int64 arithmetic is exact (the code computes indices in 64 bits); an expression whose value
      may leave int64 is not affine;
    - a cast to a narrower integer type, and arithmetic in int8/int16/uint8/uint16/uint32, wrap around as in
      two's complement: where the value may leave its type (over ``ranges``) the text is the wrap-around
      ``((e + 128) mod 256) - 128`` (or ``None`` if ``allow_wrap`` is false);
    - integer ``/`` and ``%`` by a constant round toward minus infinity (the language's semantics) whatever
      the divisor's sign: ``floor(e/c)`` and ``e mod c`` for ``c > 0``, ``floor(-e/-c)`` and ``-((-e) mod -c)``
      for ``c < 0``; by zero both are 0;
    - bool and uint64 values, products of two indices, data-dependent reads and floats are not affine.

    ``ranges`` maps indices to ``(lo, hi)`` (hi exclusive); an index without a range may take any int32 value.
    ``exact_int32`` (for conditions, which the code evaluates in their own type) also makes an int32
    expression that may leave int32 not affine.
    """
    found = _affine(expr, indices, sizes, ranges or {}, allow_wrap, exact_int32)
    return None if found is None else found[0]


def _affine(e: L.Expr, indices, sizes: dict, ranges: dict, allow_wrap: bool, exact: bool):
    """``(text, lo, hi)``: isl text of ``e`` and bounds of its value, or None (see :func:`affine_text`)."""
    dtype = e.dtype or "int32"
    if dtype not in INT_RANGE and not (isinstance(e, L.Cast) and e.to == "uint64"):
        return None
    if isinstance(e, L.Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        text = str(e.value) if e.value >= 0 else f"({e.value})"
        return text, e.value, e.value
    if isinstance(e, L.Ident):
        if e.name in indices:
            lo, hi = ranges.get(e.name, (INT_RANGE["int32"][0], INT_RANGE["int32"][1] + 1))
            lo, hi = (-SIZE_MAX if isinstance(lo, Sym) else lo), (SIZE_MAX if isinstance(hi, Sym) else hi)
            return isl_name(e.name), lo, hi - 1
        if e.name in sizes:
            value = sizes[e.name]
            if isinstance(value, Sym):  # a parameter: any value a size may take
                return str(value), -SIZE_MAX, SIZE_MAX
            return str(value), value, value
        return None

    def sub(x):
        return _affine(x, indices, sizes, ranges, allow_wrap, exact)

    if isinstance(e, L.Cast):
        inner = sub(e.operand) if e.operand.dtype in INT_RANGE else None
        if inner is None:
            return None
        if e.to == "uint64":  # same 64 bits as int64; only non-negative values mean the same
            return inner if inner[1] >= 0 else None
        return _fit(inner, e.to, allow_wrap, exact, cast=True)
    if isinstance(e, L.Unary) and e.op == "-":
        inner = sub(e.operand)
        return None if inner is None else _fit((f"-({inner[0]})", -inner[2], -inner[1]), dtype, allow_wrap, exact)
    if not (isinstance(e, L.Binary) and e.op in ("+", "-", "*", "/", "%")):
        return None
    lhs = sub(e.lhs)
    rhs = sub(e.rhs) if lhs is not None else None
    if rhs is None:
        return None
    (a, alo, ahi), (b, blo, bhi) = lhs, rhs
    if e.op == "+":
        return _fit((f"({a}) + ({b})", alo + blo, ahi + bhi), dtype, allow_wrap, exact)
    if e.op == "-":
        return _fit((f"({a}) - ({b})", alo - bhi, ahi - blo), dtype, allow_wrap, exact)
    if e.op == "*":
        if alo == ahi and _is_constant(e.lhs, indices):  # isl reads a product only with a bare integer factor
            c, text, lo, hi = alo, b, blo, bhi
        elif blo == bhi and _is_constant(e.rhs, indices):
            c, text, lo, hi = blo, a, alo, ahi
        else:
            return None
        return _fit((f"{c} * ({text})", min(c * lo, c * hi), max(c * lo, c * hi)), dtype, allow_wrap, exact)
    if not (blo == bhi and _is_constant(e.rhs, indices)):
        return None
    c = blo
    if c == 0:  # x/0 == x%0 == 0 in the generated code
        return "0", 0, 0
    if e.op == "/":
        text = f"floor(({a})/{c})" if c > 0 else f"floor((-({a}))/{-c})"
        lo, hi = sorted((alo // c, ahi // c))
        return _fit((text, lo, hi), dtype, allow_wrap, exact)
    if (0 <= alo and ahi < c) or (c < alo and ahi <= 0):
        return a, alo, ahi  # already in the modulo's range: the identity
    if c > 0:
        return f"({a}) mod {c}", 0, c - 1
    return f"-((-({a})) mod {-c})", c + 1, 0


def _is_constant(e: L.Expr, indices) -> bool:
    """Whether ``e`` has no index variable and no read (its value is fixed once sizes are known)."""
    if isinstance(e, L.Ident):
        return e.name not in indices and e.kind != "scalar"
    if isinstance(e, L.Access):
        return False
    return all(_is_constant(c, indices) for c in children(e))


def _fit(found: tuple, dtype: str, allow_wrap: bool, exact: bool, cast: bool = False):
    """``found`` as a value of ``dtype``: wrapped around where it may leave a narrow type (or int32, for a
    ``cast``); None where int32 arithmetic (with ``exact``) or an int64 value may overflow, or a wrap is
    needed and not ``allow_wrap``."""
    text, lo, hi = found
    if dtype == "uint64":
        return found if lo >= 0 and hi <= INT_RANGE["int64"][1] else None
    tlo, thi = INT_RANGE[dtype]
    if tlo <= lo and hi <= thi:
        return found
    if dtype == "int64" or (dtype == "int32" and exact and not cast):
        return None
    if dtype == "int32" and not cast:  # computed in 64 bits (unless a cast narrows it): only int64 overflow matters
        return found if INT_RANGE["int64"][0] <= lo and hi <= INT_RANGE["int64"][1] else None
    if not allow_wrap:
        return None
    span = thi - tlo + 1
    if tlo < 0:
        return f"((({text}) + {-tlo}) mod {span}) - {-tlo}", tlo, thi
    return f"({text}) mod {span}", tlo, thi


def constant_value(expr: L.Expr, sizes: dict) -> int | None:
    """The integer value of an expression of literals and sizes as the generated code computes it (casts wrap
    around, ``/`` and ``%`` round toward minus infinity, by zero they give 0), or ``None`` if it has other
    terms."""
    if isinstance(expr, L.Const) and expr.dtype is None:  # untyped (not yet checked)
        return expr.value if isinstance(expr.value, int) and not isinstance(expr.value, bool) else None
    found = _affine(expr, frozenset(), sizes, {}, True, False)
    if found is None:
        return None
    if found[1] != found[2]:  # with parameters: a Sym, when the value at the hint is fixed
        if not parameters(sizes):
            return None
        hint = _affine(expr, frozenset(), {k: int(v) for k, v in sizes.items()}, {}, True, False)
        return None if hint is None or hint[1] != hint[2] else Sym(hint[1], found[0])
    return found[1]


_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_ISL_CMP = {"<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "=", "!=": "!="}


def guard_text(cond: L.Expr, indices, sizes: dict, negate: bool = False, ranges: dict | None = None) -> str | None:
    """isl constraint text of a boolean condition built from affine comparisons, ``&&``, ``||`` and ``!``.

    Returns ``None`` when the condition is not of that form (the caller then ignores the guard, which
    over-approximates). ``negate`` gives the text of ``!cond`` (pushed down with De Morgan's laws).
    With ``ranges`` (index → ``(lo, hi)``, the statement's box) the text is exactly what the code evaluates:
    a comparison whose int32 operands may overflow int32 over the box is not affine.
    """
    if isinstance(cond, L.Unary) and cond.op == "!":
        return guard_text(cond.operand, indices, sizes, not negate, ranges)
    if isinstance(cond, L.Binary) and cond.op in ("&&", "||"):
        lhs = guard_text(cond.lhs, indices, sizes, negate, ranges)
        rhs = guard_text(cond.rhs, indices, sizes, negate, ranges)
        if lhs is None or rhs is None:
            return None
        joint = "and" if (cond.op == "&&") != negate else "or"
        return f"(({lhs}) {joint} ({rhs}))"
    if isinstance(cond, L.Binary) and cond.op in _NEGATED:
        exact = ranges is not None
        lhs = affine_text(cond.lhs, indices, sizes, ranges, exact_int32=exact)
        rhs = affine_text(cond.rhs, indices, sizes, ranges, exact_int32=exact)
        if lhs is None or rhs is None:
            return None
        op = _NEGATED[cond.op] if negate else cond.op
        if op == "!=":
            return f"(({lhs}) < ({rhs}) or ({lhs}) > ({rhs}))"
        return f"({lhs}) {_ISL_CMP[op]} ({rhs})"
    if isinstance(cond, L.Cast) and cond.operand.dtype == "bool":
        return guard_text(cond.operand, indices, sizes, negate, ranges)
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


#: The sub-expressions of a lang expression node (:func:`polyc.lang.ast.children`).
children = L.children


#: ``e`` with its sub-expressions replaced (:func:`polyc.lang.ast.with_children`).
with_children = L.with_children


def accesses_in(expr: L.Expr) -> list[L.Access]:
    """Every tensor access in ``expr``, nested ones (an index that reads a tensor) included, in tree order."""
    found = [expr] if isinstance(expr, L.Access) else []
    for c in children(expr):
        found.extend(accesses_in(c))
    return found


def has_access(expr: L.Expr) -> bool:
    """Whether ``expr`` reads a tensor (a data-dependent value)."""
    if isinstance(expr, L.Access):
        return True
    return any(has_access(c) for c in children(expr))


def element_stride(args, shape, index: str, indices, sizes) -> int | None:
    """How many elements the access ``T(args)`` moves when ``index`` grows by one (``None``: not affine)."""
    names = list(indices)
    dims = ", ".join(isl_name(n) for n in names)
    stride, total = 1, 0
    for arg, extent in reversed(list(zip(args, shape))):
        text = affine_text(arg, set(names), sizes)
        if text is None:
            return None
        aff = isl.Aff(f"{{ [{dims}] -> [({text})] }}")
        if aff.dim(isl.dim_type.div) and index in index_names(arg):
            return None
        coefficient = int(aff.get_coefficient_val(isl.dim_type.in_, names.index(index)).to_python())
        total += coefficient * stride
        stride *= extent
    return total
