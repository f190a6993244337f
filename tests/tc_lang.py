"""The Tensor Comprehensions language as :mod:`tc_reference` reads it: tokenizer, parser, printer, typing
and the integer semantics of index expressions. Shares no code with polyc (imports nothing from ``polyc``).

Integer semantics (polyc's documented choices, ``polyc/lang/ast.py``, ``polyc/codegen/expr.py``,
``polyc/poly/affine.py``; TC itself leaves them open):

- ``/`` and ``%`` round toward minus infinity for every divisor sign (Halide's), ``x/0 == x%0 == 0``;
- int32 and int64 index arithmetic is exact (polyc computes indices in 64 bits); arithmetic in a narrower
  type (int8, int16, uint8, uint16) and every cast to a narrower integer type (int32 included) wrap around
  as two's complement (numpy's ``astype``);
- typing (``polyc/lang/sema.py``): literals are weak (an int literal takes the integer type next to it if
  its value fits, else both promote as numpy does; a float literal next to an integer makes both float32),
  otherwise ``np.promote_types``, except that an int with a float gives the float type and two bools give
  int32.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

# ---- errors ----------------------------------------------------------------------------------------------


class TCError(Exception):
    """The program is not valid TC (syntax, typing, range inference or an out-of-bounds access)."""


class Unsupported(Exception):
    """The reference cannot judge this program/size (e.g. an int32 overflow or a float32 overflow)."""


# ---- tokens and parser -----------------------------------------------------------------------------------

_TOKEN = re.compile(r"\s*(?:(#[^\n]*)|(\d+\.\d*(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)"
                    r"|(max=!|min=!|max=(?!=)|min=(?!=)|\+=!|\*=!|->|<=|>=|==|!=|&&|\|\||\+=|\*="
                    r"|[-+*/%()<>,{}=?:!;])|([A-Za-z_][A-Za-z_0-9]*))")

TYPES = {"float": "float32", "float32": "float32", "double": "float64", "float64": "float64",
         "int32": "int32", "int": "int32", "int64": "int64", "bool": "bool", "int8": "int8", "int16": "int16",
         "uint8": "uint8", "uint16": "uint16"}
#: Bits and signedness of the integer types whose values the reference follows.
INT_BITS = {"int8": (8, True), "int16": (16, True), "int32": (32, True), "int64": (64, True),
            "uint8": (8, False), "uint16": (16, False)}
FLOAT_BUILTINS = {"exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "sin": 1, "fabs": 1,
                  "cos": 1, "floor": 1, "ceil": 1, "fma": 3}
PROMOTING_BUILTINS = {"abs": 1, "min": 2, "max": 2, "fmin": 2, "fmax": 2}


def tokenize(text: str) -> list[str]:
    tokens, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m or m.end() == pos:
            raise TCError(f"bad character at {pos}: {text[pos:pos + 10]!r}")
        pos = m.end()
        if m.group(1):
            continue
        tok = m.group(2) or m.group(3) or m.group(4)
        if tok:
            tokens.append(tok)
    return tokens


# Expression nodes are tuples:
#   ("num", value)           int or float literal
#   ("id", name)             index, size or 0-d input
#   ("acc", tensor, args)    tensor read
#   ("un", op, x)            op in "-", "!"
#   ("bin", op, a, b)        arithmetic, comparison, && ||
#   ("sel", cond, a, b)      cond ? a : b
#   ("call", func, args)     builtin
#   ("cast", dtype, x)       explicit conversion

@dataclass
class Statement:
    tensor: str
    lhs: tuple
    op: str            # "=", "+=", "*=", "max=", "min=" (+ "!" for the initialising forms)
    rhs: tuple
    ranges: dict = field(default_factory=dict)   # index -> (lo expr, hi expr)


@dataclass
class Def:
    name: str
    params: list       # (name, dtype, dims) with dims a tuple of size names or ints
    outputs: list      # names
    statements: list


class _Parser:
    def __init__(self, text):
        self.toks = tokenize(text)
        self.pos = 0

    def peek(self, k=0):
        return self.toks[self.pos + k] if self.pos + k < len(self.toks) else None

    def next(self):
        tok = self.peek()
        if tok is None:
            raise TCError("unexpected end of input")
        self.pos += 1
        return tok

    def expect(self, tok):
        got = self.next()
        if got != tok:
            raise TCError(f"expected {tok!r}, got {got!r}")

    def accept(self, tok):
        if self.peek() == tok:
            self.pos += 1
            return True
        return False

    def name(self):
        tok = self.next()
        if not re.match(r"[A-Za-z_]", tok):
            raise TCError(f"expected a name, got {tok!r}")
        return tok

    def parse_def(self) -> Def:
        self.expect("def")
        name = self.name()
        self.expect("(")
        params = []
        while not self.accept(")"):
            dtype = TYPES.get(self.next())
            if dtype is None:
                raise TCError("unknown type")
            dims = ()
            if self.accept("("):
                dims = []
                while not self.accept(")"):
                    tok = self.next()
                    dims.append(int(tok) if tok.isdigit() else tok)
                    self.accept(",")
                dims = tuple(dims)
            params.append((self.name(), dtype, dims))
            self.accept(",")
        self.expect("->")
        self.expect("(")
        outputs = []
        while not self.accept(")"):
            outputs.append(self.name())
            self.accept(",")
        self.expect("{")
        statements = []
        while not self.accept("}"):
            statements.append(self.statement())
            self.accept(";")
        return Def(name, params, outputs, statements)

    def statement(self) -> Statement:
        tensor = self.name()
        lhs = []
        if self.accept("("):
            while not self.accept(")"):
                lhs.append(self.name())
                self.accept(",")
        op = self.next()
        if op not in ("=", "+=", "*=", "max=", "min=", "+=!", "*=!", "max=!", "min=!"):
            if op in ("max", "min") and self.peek() in ("=",):  # "max =" written apart
                op += self.next()
            else:
                raise TCError(f"bad statement operator {op!r}")
        rhs = self.expr()
        ranges = {}
        if self.accept("where"):
            while True:
                index = self.name()
                self.expect("in")
                lo = self.additive()
                self.expect(":")
                hi = self.additive()
                if index in ranges:
                    raise TCError(f"index {index} has two ranges")
                ranges[index] = (lo, hi)
                if not self.accept(","):
                    break
        return Statement(tensor, tuple(lhs), op, rhs, ranges)

    # precedence climbing, C's levels
    def expr(self):
        cond = self.binary(0)
        if self.accept("?"):
            a = self.expr()
            self.expect(":")
            b = self.expr()
            return ("sel", cond, a, b)
        return cond

    LEVELS = [("||",), ("&&",), ("==", "!="), ("<", "<=", ">", ">="), ("+", "-"), ("*", "/", "%")]

    def binary(self, level):
        if level == len(self.LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.peek() in self.LEVELS[level]:
            op = self.next()
            left = ("bin", op, left, self.binary(level + 1))
        return left

    def additive(self):
        return self.binary(4)

    def unary(self):
        if self.peek() in ("-", "!"):
            op = self.next()
            return ("un", op, self.unary())
        if self.accept("+"):
            return self.unary()
        return self.primary()

    def primary(self):
        tok = self.next()
        if tok == "(":
            e = self.expr()
            self.expect(")")
            return e
        if tok[0].isdigit():
            return ("num", float(tok) if any(c in tok for c in ".eE") else int(tok))
        if not re.match(r"[A-Za-z_]", tok):
            raise TCError(f"unexpected {tok!r}")
        if self.peek() == "(":
            self.next()
            args = []
            while not self.accept(")"):
                args.append(self.expr())
                self.accept(",")
            if tok in TYPES:
                if len(args) != 1:
                    raise TCError("a cast takes one argument")
                return ("cast", TYPES[tok], args[0])
            if tok in FLOAT_BUILTINS or tok in PROMOTING_BUILTINS:
                return ("call", tok, tuple(args))
            return ("acc", tok, tuple(args))
        return ("id", tok)


def parse(text: str) -> Def:
    """The first ``def`` of ``text``."""
    return _Parser(text).parse_def()


# ---- printing (for the generator) ------------------------------------------------------------------------

def expr_text(e) -> str:
    """Fully parenthesised TC text of an expression tree."""
    kind = e[0]
    if kind == "num":
        v = e[1]
        if isinstance(v, float):
            text = repr(float(v))
            if "e" in text or "n" in text:
                raise ValueError(f"literal {v} cannot be printed")
            return text if v >= 0 else f"({text})"
        return str(v) if v >= 0 else f"({v})"
    if kind == "id":
        return e[1]
    if kind == "acc":
        return f"{e[1]}({', '.join(expr_text(a) for a in e[2])})" if e[2] else e[1]
    if kind == "un":
        return f"({e[1]}{expr_text(e[2])})"
    if kind == "bin":
        return f"({expr_text(e[2])} {e[1]} {expr_text(e[3])})"
    if kind == "sel":
        return f"({expr_text(e[1])} ? {expr_text(e[2])} : {expr_text(e[3])})"
    if kind == "call":
        return f"{e[1]}({', '.join(expr_text(a) for a in e[2])})"
    if kind == "cast":
        return f"{e[1]}({expr_text(e[2])})"
    raise ValueError(kind)


def def_text(d: Def) -> str:
    params = []
    for name, dtype, dims in d.params:
        shape = f"({','.join(str(x) for x in dims)})" if dims else ""
        params.append(f"{dtype}{shape} {name}")
    lines = [f"def {d.name}({', '.join(params)}) -> ({', '.join(d.outputs)}) {{"]
    for s in d.statements:
        lhs = f"{s.tensor}({', '.join(s.lhs)})" if s.lhs else s.tensor
        line = f"    {lhs} {s.op} {expr_text(s.rhs)}"
        if s.ranges:
            line += " where " + ", ".join(f"{i} in {expr_text(lo)}:{expr_text(hi)}" for i, (lo, hi) in s.ranges.items())
        lines.append(line)
    lines.append("}")
    return "\n".join(lines)


# ---- typing ----------------------------------------------------------------------------------------------

def _is_float(dtype):
    return dtype in ("float32", "float64")


def _promote(a, b):
    """numpy's promotion, except that an integer with a float gives the float type."""
    if a == b:
        return a
    if _is_float(a) and not _is_float(b):
        return a
    if _is_float(b) and not _is_float(a):
        return b
    return np.promote_types(a, b).name


def _weak(e):
    while e[0] == "un" and e[1] == "-":
        e = e[2]
    return e[0] == "num"


def _literal(e):
    sign = 1
    while e[0] == "un":
        sign, e = -sign, e[2]
    return sign * e[1]


def _adopts(e, dtype) -> bool:
    """Whether the weak literal ``e`` simply takes ``dtype`` (an int literal: any int type its value fits, or a
    float type; a float literal: a float type)."""
    value = _literal(e)
    if isinstance(value, float) or _is_float(dtype):
        return _is_float(dtype)
    if dtype in INT_BITS:
        bits, signed = INT_BITS[dtype]
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        return lo <= value <= hi
    return False


class _Typer:
    def __init__(self, dtypes, indices, sizes):
        self.dtypes, self.indices, self.sizes = dtypes, indices, sizes

    def unify(self, exprs):
        typed = [self.of(x) for x in exprs]
        strong = [t for x, t in zip(exprs, typed) if not _weak(x)]
        if not strong:
            out = typed[0]
            for t in typed[1:]:
                out = _promote(out, t)
            return out
        target = strong[0]
        for t in strong[1:]:
            target = _promote(target, t)
        for x, t in zip(exprs, typed):
            if _weak(x) and not _adopts(x, target):
                target = _promote(t, target)
        return target

    def of(self, e) -> str:
        kind = e[0]
        if kind == "num":
            if isinstance(e[1], float):
                return "float32"
            return "int32" if -(1 << 31) <= e[1] < (1 << 31) else "int64"
        if kind == "id":
            if e[1] in self.indices or e[1] in self.sizes:
                return "int32"
            if e[1] in self.dtypes:
                return self.dtypes[e[1]]
            raise TCError(f"undefined variable {e[1]}")
        if kind == "acc":
            if e[1] not in self.dtypes:
                raise TCError(f"tensor {e[1]} read before it is written")
            return self.dtypes[e[1]]
        if kind == "un":
            if e[1] == "!":
                return "bool"
            t = self.of(e[2])
            return "int32" if t == "bool" else t
        if kind == "bin":
            if e[1] in ("&&", "||", "<", "<=", ">", ">=", "==", "!="):
                self.unify([e[2], e[3]])
                return "bool"
            t = self.unify([e[2], e[3]])
            return "int32" if t == "bool" else t
        if kind == "sel":
            return self.unify([e[2], e[3]])
        if kind == "call":
            if e[1] in FLOAT_BUILTINS:
                if len(e[2]) != FLOAT_BUILTINS[e[1]]:
                    raise TCError(f"{e[1]}: wrong arity")
                return "float64" if any(self.of(a) == "float64" for a in e[2]) else "float32"
            if len(e[2]) != PROMOTING_BUILTINS[e[1]]:
                raise TCError(f"{e[1]}: wrong arity")
            return self.unify(list(e[2]))
        if kind == "cast":
            return e[1]
        raise TCError(kind)


# ---- walking ---------------------------------------------------------------------------------------------

def _children(e):
    kind = e[0]
    if kind == "acc":
        return e[2]
    if kind == "un":
        return (e[2],)
    if kind == "bin":
        return (e[2], e[3])
    if kind == "sel":
        return (e[1], e[2], e[3])
    if kind == "call":
        return e[2]
    if kind == "cast":
        return (e[2],)
    return ()


def _names(e, out=None):
    out = [] if out is None else out
    if e[0] == "id" and e[1] not in out:
        out.append(e[1])
    for c in _children(e):
        _names(c, out)
    return out


def _has_read(e):
    return e[0] == "acc" or any(_has_read(c) for c in _children(e))


def _accesses(e, guards=(), out=None):
    """Every read in ``e`` as (tensor, args, guards); guards are (cond, taken) of the enclosing ``?:``."""
    out = [] if out is None else out
    if e[0] == "sel":
        _accesses(e[1], guards, out)
        _accesses(e[2], guards + ((e[1], True),), out)
        _accesses(e[3], guards + ((e[1], False),), out)
        return out
    if e[0] == "acc":
        out.append((e[1], e[2], guards))
    for c in _children(e):
        _accesses(c, guards, out)
    return out


def _affine(e, indices) -> bool:
    """Whether ``e`` is an integer affine expression of indices, sizes and literals (products and
    divisions by constants only, integer casts that may wrap around included) — what polyc checks at compile
    time. Range inference uses only those that cannot wrap (:func:`_inferable`)."""
    kind = e[0]
    if kind == "num":
        return isinstance(e[1], int)
    if kind == "id":
        return True
    if kind == "un":
        return e[1] == "-" and _affine(e[2], indices)
    if kind == "cast":
        return e[1] in INT_BITS and _affine(e[2], indices)
    if kind == "bin" and e[1] in ("+", "-"):
        return _affine(e[2], indices) and _affine(e[3], indices)
    if kind == "bin" and e[1] == "*":
        return (_affine(e[2], indices) and _affine(e[3], indices)
                and (not set(_names(e[2])) & indices or not set(_names(e[3])) & indices))
    if kind == "bin" and e[1] in ("/", "%"):
        return _affine(e[2], indices) and _affine(e[3], indices) and not set(_names(e[3])) & indices
    return False


def _affine_cond(e, indices) -> bool:
    if e[0] == "un" and e[1] == "!":
        return _affine_cond(e[2], indices)
    if e[0] == "bin" and e[1] in ("&&", "||"):
        return _affine_cond(e[2], indices) and _affine_cond(e[3], indices)
    if e[0] == "bin" and e[1] in ("<", "<=", ">", ">=", "==", "!="):
        return _affine(e[2], indices) and _affine(e[3], indices)
    return False


def _inferable(e, known_env: dict) -> bool:
    """Whether range inference may use the affine argument ``e``. polyc uses an argument only where no value
    of a narrow type in it can wrap around ("an index whose cast may wrap does not bound the range"): a cast
    (or narrow arithmetic) over an index still without a range (which may be any int32 value) may wrap; one
    over sizes and indices with known ranges (``known_env``) is evaluated exactly. Casts to int64 never wrap."""
    def visit(x):
        if x[0] == "cast" and x[1] == "int64":
            return visit(x[2])
        if x[0] == "cast" or (x[0] in ("un", "bin") and _narrow(x)):
            if any(n not in known_env for n in _names(x)):
                return False
            try:
                _ival(x, known_env, check=True)
            except _Wraps:
                return False
        return all(visit(c) for c in _children(x))
    return visit(e)


def _narrow(e) -> bool:
    """Whether the index expression ``e`` has a type narrower than int32 (int8(i) + 1 does, i + 1 does not)."""
    try:
        return _ival(e, _Zeros())[1] not in ("int32", "int64", "bool")
    except TCError:
        return False


class _Zeros(dict):
    def __missing__(self, key):
        return 0

    def __contains__(self, key):
        return True


# ---- integer evaluation of index expressions over grids --------------------------------------------------

class _Wraps(Exception):
    """A narrow value wrapped around (raised by :func:`_ival` with ``check``)."""


def _floordiv(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.floor_divide(a, safe))


def _floormod(a, b):
    a, b = np.broadcast_arrays(np.asarray(a, np.int64), np.asarray(b, np.int64))
    safe = np.where(b == 0, 1, b)
    return np.where(b == 0, 0, np.remainder(a, safe))


def _wrap(v, dtype, check=False):
    """Integer values ``v`` (int64) as ``dtype`` values: two's-complement wrap-around for types narrower than
    64 bits. With ``check``, raise _Wraps when a value changes."""
    if dtype not in INT_BITS or dtype == "int64":
        return v
    bits, signed = INT_BITS[dtype]
    v = np.asarray(v, np.int64)
    span = np.int64(1) << bits
    w = (v + (span >> 1)) % span - (span >> 1) if signed else v % span
    if check and np.any(w != v):
        raise _Wraps(dtype)
    return w


_INT_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b, "/": _floordiv,
            "%": _floormod}
_INT_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
            "!=": np.not_equal}


def _ival(e, env, check=False):
    """``(value, dtype, literal)`` of an index expression (ints only, no reads) with ``env`` (name -> int or
    int array): int32/int64 arithmetic exact in 64 bits, narrower arithmetic and casts wrapped (with ``check``,
    a wrap raises _Wraps); ``literal`` is the value of a (weak) literal, else None."""
    kind = e[0]
    if kind == "num":
        if not isinstance(e[1], int):
            raise TCError(f"not an index expression: {expr_text(e)}")
        return e[1], ("int32" if -(1 << 31) <= e[1] < (1 << 31) else "int64"), e[1]
    if kind == "id":
        if e[1] not in env:
            raise TCError(f"'{e[1]}' is not an index or a size here")
        return env[e[1]], "int32", None
    if kind == "cast":
        if e[1] not in INT_BITS:
            raise TCError(f"not an index expression: {expr_text(e)}")
        v, _, _ = _ival(e[2], env, check)
        return _wrap(v, e[1], check), e[1], None
    if kind == "un" and e[1] == "-":
        v, dtype, lit = _ival(e[2], env, check)
        if lit is not None:
            return -v, dtype, -lit
        return _wrap(-np.asarray(v, np.int64), dtype, check), dtype, None
    if kind == "un" and e[1] == "!":
        return np.logical_not(_ival(e[2], env, check)[0]), "bool", None
    if kind == "bin":
        op = e[1]
        (a, ta, la), (b, tb, lb) = _ival(e[2], env, check), _ival(e[3], env, check)
        if op in _INT_CMP:
            return _INT_CMP[op](a, b), "bool", None
        if op in ("&&", "||"):
            return (np.logical_and if op == "&&" else np.logical_or)(a, b), "bool", None
        strong = [t for t, lit in ((ta, la), (tb, lb)) if lit is None]
        dtype = _promote(*strong) if len(strong) == 2 else strong[0] if strong else _promote(ta, tb)
        for t, lit in ((ta, la), (tb, lb)):
            if lit is not None and strong and not _adopts(("num", lit), dtype):
                dtype = _promote(t, dtype)
        if dtype == "bool":
            dtype = "int32"
        value = _INT_OPS[op](np.asarray(a, np.int64), np.asarray(b, np.int64))
        lit = value if la is not None and lb is not None else None
        return _wrap(value, dtype, check), dtype, (int(lit) if lit is not None else None)
    raise TCError(f"not an index expression: {expr_text(e)}")


def _int_value(e, env):
    """An index expression (ints only, no reads) evaluated with ``env`` (name -> int or int array)."""
    return _ival(e, env)[0]


def _cond_value(e, env, taken):
    v = np.asarray(_int_value(e, env), bool)
    return v if taken else ~v
