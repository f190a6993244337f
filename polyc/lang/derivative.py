"""Symbolic derivatives of the language's expressions and the integer algebra of index expressions, for
:mod:`polyc.lang.grad`.

Expressions are built untyped (``dtype=None``): the gradient def they end up in is printed and checked again
by :func:`polyc.lang.sema.check_def`, which types them. ``None`` stands for an expression that is 0, so
``mul(None, x)`` is None and ``add(None, x)`` is ``x``; :func:`mul` also keeps a ``?:`` with a zero branch
outermost (``c ? a*b : 0``), where the polyhedral model moves its affine conditions into the iteration domain.

:func:`derivative` applies the chain rule to one right-hand side with respect to one read (:func:`read_key`);
:data:`PARTIALS` holds each builtin's partial derivatives. :func:`linear` reads an integer index expression as
an affine form ``{name: coefficient, 1: constant}`` and :func:`from_linear` writes one back; :func:`substitute`
replaces indices by expressions and keeps access arguments in that simplest form.
"""
from __future__ import annotations

import math

from ..errors import UnsupportedError
from . import ast as A

FLOATS = ("float32", "float64")


# ---- expressions with a zero: None stands for 0 -------------------------------------------------------------

def lit(value: float) -> A.Const:
    return A.Const(float(value))


ZERO = lit(0.0)


def is_lit(e, value) -> bool:
    return isinstance(e, A.Const) and not isinstance(e.value, bool) and e.value == value


def _call(func, *args) -> A.Call:
    return A.Call(func, tuple(args))


def add(a, b):
    if a is None:
        return b
    if b is None:
        return a
    if isinstance(b, A.Unary) and b.op == "-":
        return A.Binary("-", a, b.operand)
    return A.Binary("+", a, b)


def neg(a):
    if a is None:
        return None
    if isinstance(a, A.Unary) and a.op == "-":
        return a.operand
    return A.Unary("-", a)


def sub(a, b):
    return add(a, neg(b))


def mul(a, b):
    """``a * b``; a ``?:`` with a zero branch takes the product into its other branch (so a guard stays at the
    top of a gradient's right-hand side, where the polyhedral model moves it into the iteration domain)."""
    if a is None or b is None or is_lit(a, 0.0) or is_lit(b, 0.0):
        return None
    if is_lit(a, 1.0):
        return b
    if is_lit(b, 1.0):
        return a
    if isinstance(a, A.Select) and is_lit(a.other, 0.0):
        return select(a.cond, mul(a.then, b), None)
    if isinstance(b, A.Select) and is_lit(b.other, 0.0):
        return select(b.cond, mul(a, b.then), None)
    if isinstance(a, A.Unary) and a.op == "-":
        return neg(mul(a.operand, b))
    if isinstance(b, A.Unary) and b.op == "-":
        return neg(mul(a, b.operand))
    return A.Binary("*", a, b)


def div(a, b):
    if a is None:
        return None
    return A.Binary("/", a, b)


def select(cond, a, b):
    if a is None and b is None:
        return None
    return A.Select(cond, ZERO if a is None else a, ZERO if b is None else b)


def and_(a, b):
    if a is None:
        return b
    if b is None:
        return a
    return A.Binary("&&", a, b)


def cmp(op, a, b):
    return A.Binary(op, a, b)


# ---- derivatives of the builtins -------------------------------------------------------------------------

_SQRT_PI_2 = 2 / math.sqrt(math.pi)      # d erf
_LN10, _LN2 = math.log(10), math.log(2)


def _split(a, b, first):
    """The even split of ``max``/``min`` at a tie: 1 for the argument chosen, 0.5 each when equal."""
    win, lose = (">", "<") if first else ("<", ">")
    return A.Select(cmp(win, a, b), lit(1.0), A.Select(cmp(lose, a, b), lit(0.0), lit(0.5)))


def _sq(x):
    return A.Binary("*", x, x)


def _partials_bessel(x, f0, f1):
    """d f1(x) = f0(x) - f1(x)/x, with its limit 0.5 at 0 (for J1 and I1)."""
    return A.Select(cmp("==", x, lit(0.0)), lit(0.5), sub(_call(f0, x), div(_call(f1, x), x)))


#: builtin → function of its argument expressions giving one partial derivative per argument (None: 0).
PARTIALS = {
    "exp": lambda x: [_call("exp", x)],
    "expm1": lambda x: [_call("exp", x)],
    "exp2": lambda x: [mul(lit(_LN2), _call("exp2", x))],
    "exp10": lambda x: [mul(lit(_LN10), _call("exp10", x))],
    "log": lambda x: [div(lit(1.0), x)],
    "log1p": lambda x: [div(lit(1.0), add(lit(1.0), x))],
    "log2": lambda x: [div(lit(1.0), mul(x, lit(_LN2)))],
    "log10": lambda x: [div(lit(1.0), mul(x, lit(_LN10)))],
    "sqrt": lambda x: [div(lit(0.5), _call("sqrt", x))],
    "rsqrt": lambda x: [div(mul(lit(-0.5), _call("rsqrt", x)), x)],
    "cbrt": lambda x: [div(_call("cbrt", x), mul(lit(3.0), x))],
    "rcbrt": lambda x: [div(mul(lit(-1.0), _call("rcbrt", x)), mul(lit(3.0), x))],
    "tanh": lambda x: [sub(lit(1.0), _sq(_call("tanh", x)))],
    "sigmoid": lambda x: [mul(_call("sigmoid", x), sub(lit(1.0), _call("sigmoid", x)))],
    "fabs": lambda x: [A.Select(cmp(">", x, ZERO), lit(1.0), A.Select(cmp("<", x, ZERO), lit(-1.0), ZERO))],
    "abs": lambda x: [A.Select(cmp(">", x, ZERO), lit(1.0), A.Select(cmp("<", x, ZERO), lit(-1.0), ZERO))],
    "fmax": lambda a, b: [_split(a, b, True), _split(b, a, True)],
    "max": lambda a, b: [_split(a, b, True), _split(b, a, True)],
    "fmin": lambda a, b: [_split(a, b, False), _split(b, a, False)],
    "min": lambda a, b: [_split(a, b, False), _split(b, a, False)],
    "fma": lambda a, b, c: [b, a, lit(1.0)],
    "pow": lambda a, b: [mul(b, _call("pow", a, sub(b, lit(1.0)))), mul(_call("pow", a, b), _call("log", a))],
    "erf": lambda x: [mul(lit(_SQRT_PI_2), _call("exp", neg(_sq(x))))],
    "erfc": lambda x: [mul(lit(-_SQRT_PI_2), _call("exp", neg(_sq(x))))],
    "erfcx": lambda x: [sub(mul(mul(lit(2.0), x), _call("erfcx", x)), lit(_SQRT_PI_2))],
    "erfinv": lambda x: [mul(lit(1 / _SQRT_PI_2), _call("exp", _sq(_call("erfinv", x))))],
    "erfcinv": lambda x: [mul(lit(-1 / _SQRT_PI_2), _call("exp", _sq(_call("erfcinv", x))))],
    "normcdf": lambda x: [mul(lit(1 / math.sqrt(2 * math.pi)), _call("exp", mul(lit(-0.5), _sq(x))))],
    "normcdfinv": lambda x: [mul(lit(math.sqrt(2 * math.pi)),
                                 _call("exp", mul(lit(0.5), _sq(_call("normcdfinv", x)))))],
    "sin": lambda x: [_call("cos", x)],
    "cos": lambda x: [neg(_call("sin", x))],
    "tan": lambda x: [add(lit(1.0), _sq(_call("tan", x)))],
    "sinpi": lambda x: [mul(lit(math.pi), _call("cospi", x))],
    "cospi": lambda x: [mul(lit(-math.pi), _call("sinpi", x))],
    "asin": lambda x: [_call("rsqrt", sub(lit(1.0), _sq(x)))],
    "acos": lambda x: [neg(_call("rsqrt", sub(lit(1.0), _sq(x))))],
    "atan": lambda x: [div(lit(1.0), add(lit(1.0), _sq(x)))],
    "sinh": lambda x: [_call("cosh", x)],
    "cosh": lambda x: [_call("sinh", x)],
    "asinh": lambda x: [_call("rsqrt", add(_sq(x), lit(1.0)))],
    "acosh": lambda x: [_call("rsqrt", sub(_sq(x), lit(1.0)))],
    "atanh": lambda x: [div(lit(1.0), sub(lit(1.0), _sq(x)))],
    "atan2": lambda y, x: [div(x, add(_sq(x), _sq(y))), neg(div(y, add(_sq(x), _sq(y))))],
    "hypot": lambda a, b: [div(a, _call("hypot", a, b)), div(b, _call("hypot", a, b))],
    "rhypot": lambda a, b: [neg(mul(a, _cube(_call("rhypot", a, b)))), neg(mul(b, _cube(_call("rhypot", a, b))))],
    "norm3d": lambda a, b, c: [div(x, _call("norm3d", a, b, c)) for x in (a, b, c)],
    "norm4d": lambda a, b, c, d: [div(x, _call("norm4d", a, b, c, d)) for x in (a, b, c, d)],
    "rnorm3d": lambda a, b, c: [neg(mul(x, _cube(_call("rnorm3d", a, b, c)))) for x in (a, b, c)],
    "rnorm4d": lambda a, b, c, d: [neg(mul(x, _cube(_call("rnorm4d", a, b, c, d)))) for x in (a, b, c, d)],
    "fmod": lambda a, b: [lit(1.0), neg(_call("trunc", div(a, b)))],
    "remainder": lambda a, b: [lit(1.0), neg(_call("rint", div(a, b)))],
    "fdim": lambda a, b: [A.Select(cmp(">", a, b), lit(1.0), ZERO), A.Select(cmp(">", a, b), lit(-1.0), ZERO)],
    "fdivide": lambda a, b: [div(lit(1.0), b), neg(div(a, _sq(b)))],
    "copysign": lambda a, b: [mul(_call("copysign", lit(1.0), a), _call("copysign", lit(1.0), b)), None],
    "nextafter": lambda a, b: [lit(1.0), None],
    "ldexp": lambda x, e: [_call("ldexp", lit(1.0), e), None],
    "j0": lambda x: [neg(_call("j1", x))],
    "j1": lambda x: [_partials_bessel(x, "j0", "j1")],
    "y0": lambda x: [neg(_call("y1", x))],
    "y1": lambda x: [sub(_call("y0", x), div(_call("y1", x), x))],
    "cyl_bessel_i0": lambda x: [_call("cyl_bessel_i1", x)],
    "cyl_bessel_i1": lambda x: [_partials_bessel(x, "cyl_bessel_i0", "cyl_bessel_i1")],
    **{f: (lambda *args: [None] * len(args)) for f in
       ("floor", "ceil", "rint", "round", "trunc", "nearbyint", "logb", "bitand", "bitor", "bitxor", "bitnot",
        "shl", "shr")},
}


def _cube(x):
    return A.Binary("*", A.Binary("*", x, x), x)


# ---- symbolic differentiation of one right-hand side ------------------------------------------------------

def read_key(e) -> tuple | None:
    """The key of a float read: ``(tensor, args)`` of an access, ``(name, ())`` of a 0-d parameter; None for
    anything else. Reads with equal keys read the same element, so they are one variable of the derivative."""
    if isinstance(e, A.Access) and e.dtype in FLOATS:
        return (e.tensor, e.args)
    if isinstance(e, A.Ident) and e.kind == "scalar" and e.dtype in FLOATS:
        return (e.name, ())
    return None


def float_reads(e) -> list:
    """The distinct keys (:func:`read_key`) of the float reads in ``e`` that a derivative can flow through:
    not those inside an index argument or a ``?:`` condition."""
    found: list = []

    def visit(x):
        key = read_key(x)
        if key is not None:
            if key not in found:
                found.append(key)
            return
        if isinstance(x, A.Access):
            return
        if isinstance(x, A.Select):
            visit(x.then)
            visit(x.other)
            return
        for c in A.children(x):
            visit(c)

    visit(e)
    return found


def derivative(e, key, where: str = ""):
    """``d e / d read`` for the read with ``key`` (:func:`read_key`), as an expression, or None when it is 0.

    Raises UnsupportedError for a builtin without a derivative here (``lgamma``, ``tgamma``), naming it."""
    if read_key(e) == key:
        return lit(1.0)
    if e.dtype not in FLOATS and e.dtype not in A.STORAGE_DTYPES:
        return None
    if isinstance(e, (A.Const, A.Ident, A.Access)):
        return None
    if isinstance(e, A.Cast):
        inner = derivative(e.operand, key, where)
        if inner is None or isinstance(inner, A.Const):
            return inner
        return A.Cast(e.to, inner)
    if isinstance(e, A.Unary):
        return neg(derivative(e.operand, key, where)) if e.op == "-" else None
    if isinstance(e, A.Select):
        return select(e.cond, derivative(e.then, key, where), derivative(e.other, key, where))
    if isinstance(e, A.Binary):
        da, db = derivative(e.lhs, key, where), derivative(e.rhs, key, where)
        if e.op == "+":
            return add(da, db)
        if e.op == "-":
            return sub(da, db)
        if e.op == "*":
            return add(mul(da, e.rhs), mul(e.lhs, db))
        if e.op == "/":
            return sub(div(da, e.rhs), mul(db, div(e.lhs, _sq(e.rhs))) if db is not None else None)
        if e.op == "%":
            return sub(da, mul(db, _call("floor", div(e.lhs, e.rhs))) if db is not None else None)
        return None
    if isinstance(e, A.Call):
        partials = PARTIALS.get(e.func)
        if partials is None:
            raise UnsupportedError(f"{where}no derivative for the builtin '{e.func}' here",
                                   e.span, hint="rewrite it with builtins that have one, or leave this input "
                                                "out of wrt")
        total = None
        for arg, partial in zip(e.args, partials(*e.args)):
            d = derivative(arg, key, where)
            if d is not None and partial is not None:
                total = add(total, mul(d, partial))
        return total
    return None


# ---- integer index expressions ---------------------------------------------------------------------------

def linear(e) -> dict | None:
    """``e`` as ``{name: coefficient, 1: constant}`` when it is an integer affine combination of index names
    and sizes (Idents), else None."""
    if isinstance(e, A.Const):
        if isinstance(e.value, bool) or not isinstance(e.value, int):
            return None
        return {1: e.value}
    if isinstance(e, A.Ident):
        return {e.name: 1} if e.kind in ("index", "size") else None
    if isinstance(e, A.Cast):
        return linear(e.operand) if e.to in ("int32", "int64") and e.operand.dtype in ("int32", "int64", None) \
            else None
    if isinstance(e, A.Unary) and e.op == "-":
        inner = linear(e.operand)
        return None if inner is None else {k: -v for k, v in inner.items()}
    if isinstance(e, A.Binary) and e.op in ("+", "-", "*"):
        a, b = linear(e.lhs), linear(e.rhs)
        if a is None or b is None:
            return None
        if e.op == "*":
            if set(a) <= {1}:
                return {k: a.get(1, 0) * v for k, v in b.items()}
            if set(b) <= {1}:
                return {k: b.get(1, 0) * v for k, v in a.items()}
            return None
        sign = 1 if e.op == "+" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    return None


def from_linear(terms: dict, kinds: dict):
    """The expression of ``{name: coefficient, 1: constant}``: indices first, then sizes, then the constant.
    ``kinds`` gives each name's Ident kind (``"index"`` or ``"size"``)."""
    out = None
    order = list(kinds)
    names = sorted((k for k, v in terms.items() if k != 1 and v),
                   key=lambda k: (kinds.get(k) != "index", terms[k] < 0, order.index(k) if k in order else 0))
    for name in names:
        c = terms[name]
        term = A.Ident(name, kind=kinds.get(name, "index"), dtype="int32")
        if abs(c) != 1:
            term = A.Binary("*", A.Const(abs(c)), term)
        out = term if out is None and c > 0 else (A.Unary("-", term) if out is None else
                                                   A.Binary("+" if c > 0 else "-", out, term))
    k = terms.get(1, 0)
    if out is None:
        return A.Const(k)
    if k:
        out = A.Binary("+" if k > 0 else "-", out, A.Const(abs(k)))
    return out


def substitute(e, sigma: dict):
    """``e`` with each index Ident named in ``sigma`` replaced by its expression (one simultaneous pass), and
    every integer affine access argument and comparison operand written in its simplest form."""
    if isinstance(e, A.Ident) and e.kind == "index" and e.name in sigma:
        return sigma[e.name]
    kids = A.children(e)
    if not kids:
        return e
    new = tuple(substitute(c, sigma) for c in kids)
    if isinstance(e, A.Access):
        new = tuple(_simplest(a) for a in new)
    if isinstance(e, A.Binary) and e.op in ("<", "<=", ">", ">=", "==", "!=") and \
            e.lhs.dtype in ("int32", "int64", None) and e.rhs.dtype in ("int32", "int64", None):
        new = tuple(_simplest(a) for a in new)
    return A.with_children(e, new)


def _simplest(e):
    terms = linear(e)
    if terms is None:
        return e
    kinds = {}
    for x in A.walk(e):
        if isinstance(x, A.Ident):
            kinds.setdefault(x.name, x.kind)
    return from_linear(terms, kinds)


def index_var(name):
    """An index variable named ``name``."""
    return A.Ident(name, kind="index", dtype="int32")


def without_implied(cond, ranges: dict):
    """``cond`` without the conjuncts that the ranges of the indices imply: a comparison of one index with an
    expression of sizes, ``h + 1 >= 1`` for ``h in 0:H`` (the bound differs from the range's by a constant of
    the right sign). None when nothing is left."""
    kept = None
    for c in A.conjuncts(cond):
        if not _implied(c, ranges):
            kept = and_(kept, c)
    return kept


def _implied(c, ranges: dict) -> bool:
    if not (isinstance(c, A.Binary) and c.op in ("<", "<=", ">", ">=")):
        return False
    lhs, rhs = linear(c.lhs), linear(c.rhs)
    if lhs is None or rhs is None:
        return False
    diff = dict(lhs)
    for k, v in rhs.items():
        diff[k] = diff.get(k, 0) - v
    op = c.op
    if op in (">", ">="):  # as  -diff <= 0 / < 0
        diff, op = {k: -v for k, v in diff.items()}, "<=" if op == ">=" else "<"
    if op == "<":  # diff < 0  <=>  diff + 1 <= 0
        diff[1] = diff.get(1, 0) + 1
    indices = [k for k, v in diff.items() if k in ranges and v]
    if len(indices) != 1 or abs(diff[indices[0]]) != 1:
        return False
    i = indices[0]
    lo, hi = (linear(e) for e in ranges[i])
    if lo is None or hi is None:
        return False
    # diff = s*i + rest <= 0 must hold for every i in [lo, hi - 1]: at i = hi - 1 (s = 1) or i = lo (s = -1)
    if diff[i] < 0:
        bound = {k: -v for k, v in lo.items()}
    else:
        bound = dict(hi)
        bound[1] = bound.get(1, 0) - 1
    total = dict(bound)
    for k, v in diff.items():
        if k != i:
            total[k] = total.get(k, 0) + v
    return all(v == 0 for k, v in total.items() if k != 1) and total.get(1, 0) <= 0


def trivial(g) -> bool:
    """Whether a comparison of two equal integer expressions (``i == i``, ``i >= i``) is always true."""
    return isinstance(g, A.Binary) and g.op in ("==", ">=", "<=") and linear(g.lhs) is not None and \
        linear(g.lhs) == linear(g.rhs)
