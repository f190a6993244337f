"""An independent reference interpreter of the Tensor Comprehensions language (the subset polyc accepts).

It shares no code with polyc (it imports nothing from ``polyc``): its own tokenizer and parser, its own
range inference and an evaluator over numpy index grids. The differential fuzzer (``scripts/fuzz.py``,
``tests/api/test_fuzz.py``) runs each random program through polyc and through :func:`run` and compares.

Semantics, from TC's documentation (facebookresearch.github.io/TensorComprehensions: semantics.html,
inference.html) and polyc's README where polyc goes beyond TC:

- ``T(i,j) OP rhs where ...``: the left-hand indices are distinct names; every other index of the rhs is a
  reduction index. ``=`` (no reduction index allowed), ``+=``/``*=``/``max=``/``min=`` update the tensor's
  current value; the ``!`` forms first set every element of the left-hand box to the reduction's identity
  (0, 1, -inf/+inf or the integer type's min/max). Outputs and temporaries start as zeros. A temporary's
  first write must be ``=`` or a ``!`` form.
- Range inference (TC's rounds): ``where i in lo:hi`` fixes a range. Then, in rounds, an index that appears
  in an access argument whose other indices already have ranges gets the largest range that keeps the
  argument in bounds for every value of those other indices; the intersection over all such arguments
  (of reads, and of the left-hand side when the tensor's shape is already known). A read under ``?:`` waits
  for its guard's indices to have ranges (until a round solves nothing); a side (lower/upper) its affine
  guard proves in bounds, over those ranges, does not constrain unless no other access bounds that side
  (padding); a guard that reads data proves nothing. The in-bounds conditions used become part of the
  iteration domain (under their affine guards). An index left without a range, or with an empty or
  unbounded one, is an error. Outputs and temporaries get the box of their first write (TC): extent
  ``hi - lo`` per left index, element ``lo`` stored first; later statements use logical indices.
- A tensor that a statement writing another tensor reads is never written again (TC computes whole
  tensors before they are read; polyc refuses the def rather than run it in statement order).
- Every access that is evaluated (``?:`` is lazy) must be in bounds over the iteration domain, else the
  program is invalid (polyc checks this at compile time for affine indices).
- Integer ``/`` and ``%`` round toward minus infinity, ``x/0 == x%0 == 0`` (polyc's documented choice;
  Halide's). Typing follows polyc's README/sema: literals are weak, int with float gives the float type,
  float builtins compute in float32 unless an argument is float64.

Values are computed in float64 (floats) or int64 (ints, checked to stay in int32 range) together with an
*error scale* per element: a first-order bound (in units of the dtype's rounding error) of how far a correct
float32/float64 evaluation in any order may be from the exact value. :func:`compare` uses it as tolerance.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tc_lang import (TCError, Unsupported, Statement, Def, parse, tokenize, expr_text, def_text, TYPES,  # noqa: F401
                     _is_float, _weak, _Typer, _children, _names, _has_read, _accesses, _affine, _affine_cond,
                     _inferable, _floordiv, _floormod, _wrap, _int_value, _cond_value, INT_BITS)


def _narrow_wrap(v, dtype):
    """Integer arithmetic in a type narrower than int32 wraps around; int32 is followed exactly (index
    arithmetic is 64-bit in polyc; data values are checked to stay in int32 range)."""
    return v if dtype in ("int32", "int64") else _wrap(v, dtype)


class OutOfBounds(TCError):
    """An evaluated read leaves its tensor (a data-dependent or non-affine index, checked at run time)."""


# ---- range inference -------------------------------------------------------------------------------------

#: Index values are enumerated in [-8 L, 8 L] when inferring a range, L the largest extent (at least
#: WINDOW); a good set that reaches either end of that window is unbounded. Arguments are affine with small
#: coefficients and divisors, so a bounded range stays well inside: ``A((N - 1 - k) / -3)`` bounds k to
#: [N - 1, 4 N - 1), which an earlier "beyond 3 L" rule wrongly called unbounded.
WINDOW = 16


def infer_ranges(stmt: Statement, index_names: list, shapes: dict, sizes: dict, origins: dict | None = None):
    """``(ranges, constraints)``: index -> (lo, hi) and the (arg, lo, hi, guards, affine) conditions that are part
    of the iteration domain (``lo <= arg < hi``, under the guards when they are affine). ``origins``: tensor ->
    the logical index of its first element per dimension. Raises TCError when an index has no range or an
    empty/unbounded one."""
    origins = origins or {}
    ranges = {}
    for index, (lo, hi) in stmt.ranges.items():
        lo_v, hi_v = int(_int_value(lo, sizes)), int(_int_value(hi, sizes))
        if hi_v <= lo_v:
            raise TCError(f"empty range {lo_v}:{hi_v} for {index}")
        ranges[index] = (lo_v, hi_v)
    indices = set(index_names)
    accesses = _accesses(stmt.rhs)
    if stmt.tensor in shapes:
        accesses.append((stmt.tensor, tuple(("id", i) for i in stmt.lhs), ()))
    # polyc decides once, over the where-clause ranges, which arguments may bound a range (no wrap-around)
    where_env = dict(sizes)
    for k, (index, (lo, hi)) in enumerate(ranges.items()):
        where_env[index] = np.arange(lo, hi, dtype=np.int64).reshape((-1,) + (1,) * k)
    candidates = []
    for tensor, args, guards in accesses:
        shape = shapes.get(tensor)
        if shape is None or len(shape) != len(args):
            continue
        origin = origins.get(tensor, (0,) * len(shape))
        guard_names = list(dict.fromkeys(n for cond, _ in guards for n in _names(cond) if n in indices))
        affine = all(_affine_cond(cond, indices) for cond, _ in guards)
        for arg, extent, first in zip(args, shape, origin):
            names = [n for n in _names(arg) if n in indices]
            if not names or _has_read(arg) or not _affine(arg, indices) or not _inferable(arg, where_env):
                continue
            candidates.append((names, [n for n in guard_names if n not in names], arg, first, first + extent,
                               guards, affine))
    constraints = []
    # true ranges of the affine arguments polyc's programs use stay within a few times the largest extent
    largest = max([WINDOW] + [int(v) for v in sizes.values()] + [e for shape in shapes.values() for e in shape]
                  + [abs(o) for origin in origins.values() for o in origin])
    window = np.arange(-8 * largest, 8 * largest + 1, dtype=np.int64)
    waiting = True  # guarded reads wait for their guards' indices until a round solves nothing
    while True:
        solved = {}
        for index in index_names:
            if index in ranges:
                continue
            every = strict = None
            for names, guard_only, arg, lo, hi, guards, affine in candidates:
                if index not in names or any(n != index and n not in ranges for n in names):
                    continue
                if waiting and any(n not in ranges for n in guard_only):
                    continue
                others = [n for n in names if n != index]
                grid_names = others + [n for n in guard_only if n in ranges]
                env = dict(sizes)
                env[index] = window.reshape((-1,) + (1,) * len(grid_names))
                for k, n in enumerate(grid_names):
                    shape = [1] * (len(grid_names) + 1)
                    shape[k + 1] = -1
                    env[n] = np.arange(*ranges[n], dtype=np.int64).reshape(shape)
                full = (len(window),) + tuple(ranges[n][1] - ranges[n][0] for n in grid_names)
                value = np.broadcast_to(np.asarray(_int_value(arg, env)), full)
                below, above = value < lo, value >= hi
                # TC: every access keeps its argument in bounds (over the argument's other indices)
                flat = (len(window), -1)
                ok_every = ~(below | above).reshape(flat).any(axis=1)
                keep_lo = keep_hi = True
                if affine and guards and all(n in ranges for n in guard_only):
                    taken = np.ones(full, bool)
                    for cond, t in guards:
                        taken = taken & np.broadcast_to(_cond_value(cond, env, t), full)
                    keep_lo = bool((below & taken).any())   # the guard does not prove the lower side
                    keep_hi = bool((above & taken).any())
                strict_bad = (below if keep_lo else np.zeros(full, bool)) | (above if keep_hi else np.zeros(full, bool))
                every = ok_every if every is None else every & ok_every
                if keep_lo or keep_hi:
                    ok_strict = ~strict_bad.reshape(flat).any(axis=1)
                    strict = ok_strict if strict is None else strict & ok_strict
                constraints.append((arg, lo, hi, guards, affine))
            if every is None:
                continue
            if not every.any() or (strict is not None and not strict.any()):
                raise TCError(f"the inferred range of {index} is empty")
            ends = []
            for side in (0, -1):
                for good in (strict, every):
                    if good is not None and not good[side]:
                        where = np.nonzero(good)[0]
                        ends.append(int(window[where[side]]))
                        break
                else:
                    raise TCError(f"the inferred range of {index} is unbounded")
            solved[index] = (ends[0], ends[1] + 1)
        if not solved and not waiting:
            break
        waiting = bool(solved)
        ranges.update(solved)
    for index in index_names:
        if index not in ranges:
            raise TCError(f"cannot infer the range of {index}")
    return ranges, constraints


# ---- evaluation ------------------------------------------------------------------------------------------

_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal, "==": np.equal,
        "!=": np.not_equal}
INT32 = (-(2 ** 31), 2 ** 31 - 1)
#: The machine epsilon of each float type: error scales are absolute (value units).
EPS = {"float32": float(np.finfo(np.float32).eps), "float64": float(np.finfo(np.float64).eps)}


@dataclass
class Value:
    """Per-element values (float64 or int64 or bool), error scale and 'an evaluated read left its tensor'."""

    v: np.ndarray
    err: np.ndarray
    bad: np.ndarray


class _Evaluator:
    def __init__(self, tensors, dtypes, env, shape, typer):
        self.tensors, self.dtypes, self.env, self.shape, self.typer = tensors, dtypes, env, shape, typer

    def full(self, x, dtype=None):
        return np.broadcast_to(np.asarray(x, dtype), self.shape)

    def const(self, v):
        arr = np.asarray(v)
        rounding = np.abs(arr).astype(np.float64) * EPS["float32"] if arr.dtype.kind == "f" else 0.0
        return Value(self.full(arr), self.full(rounding), self.full(False))

    def eval(self, e) -> Value:
        kind = e[0]
        if kind == "num":
            return self.const(float(e[1]) if isinstance(e[1], float) else np.int64(e[1]))
        if kind == "id":
            name = e[1]
            if name in self.env:
                return self.const(np.asarray(self.env[name], np.int64))
            t = self.tensors[name]  # a 0-d input
            return Value(self.full(t.v[()]), self.full(t.err[()]), self.full(False))
        if kind == "acc":
            return self.read(e)
        if kind == "cast":
            x = self.eval(e[2])
            v = x.v
            if _is_float(e[1]):
                v = v.astype(np.float64)
            elif e[1] == "bool":
                v = v != 0
            else:
                if x.v.dtype.kind == "f":
                    raise Unsupported("float to int cast")
                v = _wrap(v.astype(np.int64), e[1])  # narrower types (int32 too) wrap around
            return Value(v, x.err, x.bad)
        if kind == "un":
            x = self.eval(e[2])
            if e[1] == "!":
                return Value(~(x.v != 0), x.err, x.bad)
            v = x.v.astype(np.int64) if x.v.dtype == bool else x.v
            dtype = self.typer.of(e)
            return Value(-v if _is_float(dtype) else _narrow_wrap(-v, dtype), x.err, x.bad)
        if kind == "sel":
            c = self.eval(e[1])
            cond = c.v != 0
            a, b = self.eval(e[2]), self.eval(e[3])
            dtype = self.typer.of(e)
            av, bv = self._as(a.v, dtype), self._as(b.v, dtype)
            return Value(np.where(cond, av, bv), np.where(cond, a.err, b.err),
                         c.bad | (cond & a.bad) | (~cond & b.bad))
        if kind == "bin":
            return self.binary(e)
        if kind == "call":
            return self.call(e)
        raise TCError(kind)

    @staticmethod
    def _as(v, dtype):
        if _is_float(dtype):
            return v.astype(np.float64)
        if dtype == "bool":
            return v != 0
        return v.astype(np.int64)

    def read(self, e) -> Value:
        name, args = e[1], e[2]
        if name not in self.tensors:
            raise TCError(f"tensor {name} read before it is written")
        t = self.tensors[name]
        if len(args) != t.v.ndim:
            raise TCError(f"{name} has rank {t.v.ndim}, accessed with {len(args)} indices")
        if not args:
            return Value(self.full(t.v[()]), self.full(t.err[()]), self.full(False))
        idx, bad = [], self.full(False)
        for k, (a, extent) in enumerate(zip(args, t.v.shape)):
            x = self.eval(a)
            if x.v.dtype.kind == "f":
                raise TCError(f"non-integral index of {name}")
            i = x.v.astype(np.int64) - t.first(k)
            bad = bad | x.bad | (i < 0) | (i >= extent)
            idx.append(np.clip(i, 0, extent - 1))
        return Value(t.v[tuple(idx)], t.err[tuple(idx)], bad)

    def binary(self, e) -> Value:
        op = e[1]
        a, b = self.eval(e[2]), self.eval(e[3])
        bad = a.bad | b.bad
        if op in ("&&", "||"):  # lazy: the right operand's reads run only when it is evaluated
            f = np.logical_and if op == "&&" else np.logical_or
            left = a.v != 0
            bad = a.bad | ((left if op == "&&" else ~left) & b.bad)
            return Value(f(left, b.v != 0), self.full(0.0), bad)
        dtype = self.typer.unify([e[2], e[3]])
        if op in _CMP:
            av, bv = self._as(a.v, dtype), self._as(b.v, dtype)
            if _is_float(dtype):  # compare the values the program would compare (rounded to the dtype)
                av, bv = av.astype(dtype), bv.astype(dtype)
            return Value(_CMP[op](av, bv), self.full(0.0), bad)
        if dtype == "bool":
            dtype = "int32"
        av, bv = self._as(a.v, dtype), self._as(b.v, dtype)
        if _is_float(dtype):
            eps = EPS[dtype]
            with np.errstate(all="ignore"):
                if op == "+":
                    v = av + bv
                    err = a.err + b.err + eps * np.abs(v)
                elif op == "-":
                    v = av - bv
                    err = a.err + b.err + eps * np.abs(v)
                elif op == "*":
                    v = av * bv
                    err = a.err * np.abs(bv) + b.err * np.abs(av) + a.err * b.err + eps * np.abs(v)
                elif op == "/":
                    v = av / bv
                    err = (a.err + np.abs(v) * b.err) / np.abs(bv) + eps * np.abs(v)
                elif op == "%":
                    v = np.mod(av, bv)
                    err = a.err + b.err + eps * np.abs(v)
                else:
                    raise TCError(op)
            return Value(v, err, bad)
        if op == "+":
            v = av + bv
        elif op == "-":
            v = av - bv
        elif op == "*":
            v = av * bv
        elif op == "/":
            v = _floordiv(av, bv)
        elif op == "%":
            v = _floormod(av, bv)
        else:
            raise TCError(op)
        return Value(_narrow_wrap(v, dtype), self.full(0.0), bad)

    def call(self, e) -> Value:
        func, args = e[1], [self.eval(a) for a in e[2]]
        dtype = self.typer.of(e)
        bad = np.logical_or.reduce([a.bad for a in args]) if args else self.full(False)
        vs = [self._as(a.v, dtype) for a in args]
        errs = [a.err for a in args]
        eps = EPS.get(dtype, 0.0)
        with np.errstate(all="ignore"):
            if func in ("abs", "fabs"):
                v, err = np.abs(vs[0]), errs[0]
            elif func in ("min", "max", "fmin", "fmax"):
                f = {"min": np.minimum, "max": np.maximum, "fmin": np.fmin, "fmax": np.fmax}[func]
                v, err = f(vs[0], vs[1]), np.maximum(errs[0], errs[1])
            elif func == "exp":
                v = np.exp(vs[0])
                err = v * (errs[0] + eps)
            elif func == "log":
                v = np.log(vs[0])
                err = errs[0] / np.abs(vs[0]) + eps * (np.abs(v) + 1)
            elif func == "sqrt":
                v = np.sqrt(vs[0])
                err = errs[0] / (2 * v) + eps * v
            elif func == "rsqrt":
                v = 1 / np.sqrt(vs[0])
                err = errs[0] * v / (2 * np.abs(vs[0])) + eps * v
            elif func == "tanh":
                v, err = np.tanh(vs[0]), errs[0] + eps
            elif func == "sigmoid":
                v, err = 1 / (1 + np.exp(-vs[0])), errs[0] / 4 + eps
            elif func == "erf":
                v, err = np.vectorize(math.erf, otypes=[np.float64])(vs[0]), errs[0] * 1.13 + eps
            elif func == "sin":
                v, err = np.sin(vs[0]), errs[0] + eps
            elif func == "cos":
                v, err = np.cos(vs[0]), errs[0] + eps
            elif func in ("floor", "ceil"):
                raise Unsupported("floor/ceil are discontinuous; the reference cannot bound their error")
            elif func == "fma":
                v = vs[0] * vs[1] + vs[2]
                err = errs[0] * np.abs(vs[1]) + errs[1] * np.abs(vs[0]) + errs[2] + eps * (np.abs(v) + np.abs(vs[0] * vs[1]))
            else:
                raise TCError(f"unknown builtin {func}")
        if not _is_float(dtype):
            err = self.full(0.0)
        return Value(v, err, bad)


@dataclass
class Tensor:
    v: np.ndarray     # float64 / int64 / bool values
    err: np.ndarray   # error scale per element
    dtype: str
    origin: tuple = ()  # the logical index of element 0 per dimension (a first write starting away from 0)

    def first(self, k: int) -> int:
        return self.origin[k] if self.origin else 0


def _identity(op, dtype):
    if op in ("+=", "+=!"):
        return 0
    if op in ("*=", "*=!"):
        return 1
    if _is_float(dtype):
        return -np.inf if op.startswith("max") else np.inf
    if dtype == "bool":
        return op.startswith("min")
    info = np.iinfo(dtype)
    return int(info.min) if op.startswith("max") else int(info.max)


def statement_indices(stmt: Statement, bound: set) -> list:
    """Left-hand indices, then every other index (a name inside an access argument or with a range that is
    not a size/tensor) in order of first occurrence."""
    found = list(stmt.lhs)

    def visit(e, inside):
        if e[0] == "id" and inside and e[1] not in bound and e[1] not in found:
            found.append(e[1])
        for c in _children(e):
            visit(c, inside or e[0] == "acc")

    visit(stmt.rhs, False)
    for index in stmt.ranges:
        if index not in found:
            found.append(index)
    return found


def bind_sizes(d: Def, inputs) -> dict:
    sizes = {}
    for (name, dtype, dims), arr in zip(d.params, inputs):
        if arr.ndim != len(dims):
            raise TCError(f"{name}: rank")
        for dim, extent in zip(dims, arr.shape):
            if isinstance(dim, int):
                if dim != extent:
                    raise TCError(f"{name}: extent")
            elif sizes.setdefault(dim, extent) != extent:
                raise TCError(f"size {dim} disagrees")
    return sizes


def run(d: Def | str, inputs) -> dict:
    """Evaluate ``d`` on ``inputs`` (numpy arrays in parameter order). Returns every output as
    ``name -> (values cast to the dtype, error scale as float64)``. Raises TCError for an invalid program and
    Unsupported when the reference cannot judge it."""
    if isinstance(d, str):
        d = parse(d)
    sizes = bind_sizes(d, inputs)
    tensors, dtypes, shapes = {}, {}, {}
    for (name, dtype, dims), arr in zip(d.params, inputs):
        if name in tensors:
            raise TCError(f"input {name} declared twice")
        v = arr.astype(np.float64) if _is_float(dtype) else arr.astype(np.int64)
        tensors[name] = Tensor(v, np.zeros(arr.shape), dtype)
        dtypes[name] = dtype
        shapes[name] = arr.shape
    params = {p[0] for p in d.params}
    if len(set(d.outputs)) != len(d.outputs) or set(d.outputs) & params:
        raise TCError("bad outputs")
    written = {s.tensor for s in d.statements}
    bound = set(sizes) | params | written
    for k, s in enumerate(d.statements):  # TC computes whole tensors: none is written after another reads it
        read = {t for t, _args, _guards in _accesses(s.rhs)} | (set(_names(s.rhs)) & written)
        for later in d.statements[k + 1:]:
            if later.tensor in read and later.tensor != s.tensor:
                raise TCError(f"{later.tensor} is written again after a statement reads it")
    for s in d.statements:
        _statement(s, d, sizes, tensors, dtypes, shapes, params, bound)
    for o in d.outputs:
        if o not in tensors:
            raise TCError(f"output {o} is never written")
    return {o: (tensors[o].v.astype(tensors[o].dtype) if tensors[o].dtype != "bool" else tensors[o].v,
                tensors[o].err) for o in d.outputs}


def _statement(s, d, sizes, tensors, dtypes, shapes, params, bound):
    if s.tensor in params or s.tensor in sizes:
        raise TCError(f"cannot assign to {s.tensor}")
    if len(set(s.lhs)) != len(s.lhs):
        raise TCError("repeated lhs index")
    for i in s.lhs:
        if i in bound:
            raise TCError(f"{i} is not an index name")
    op = s.op
    indices = statement_indices(s, bound)
    reductions = [i for i in indices if i not in s.lhs]
    if op == "=" and reductions:
        raise TCError(f"reduction index {reductions[0]} with =")
    if s.tensor in tensors and tensors[s.tensor].v.ndim != len(s.lhs):
        raise TCError(f"{s.tensor}: rank")
    first = s.tensor not in tensors
    if first and s.tensor not in d.outputs and op not in ("=",) and not op.endswith("!"):
        raise TCError(f"temporary {s.tensor} first written with {op}")
    typer = _Typer(dtypes, set(indices), sizes)
    rhs_dtype = typer.of(s.rhs)
    if first:
        dtype = rhs_dtype
    else:
        dtype = dtypes[s.tensor]
        if rhs_dtype != dtype and not _weak(s.rhs) and not _widens(rhs_dtype, dtype):
            raise TCError(f"narrowing {rhs_dtype} to {dtype}")
    origins = {name: t.origin for name, t in tensors.items() if t.origin}
    ranges, constraints = infer_ranges(s, indices, shapes, sizes, origins)
    for index in indices:
        if index in sizes or index in params:
            raise TCError(f"{index} used as an index")
    if first:  # TC: the tensor's box is the first write's ranges; element [lo] is stored first
        shapes[s.tensor] = tuple(ranges[i][1] - ranges[i][0] for i in s.lhs)
        zeros = np.zeros(shapes[s.tensor], np.float64 if _is_float(dtype) else np.int64)
        origin = tuple(ranges[i][0] for i in s.lhs)
        tensors[s.tensor] = Tensor(zeros, np.zeros(shapes[s.tensor]), dtype, origin if any(origin) else ())
        dtypes[s.tensor] = dtype
    target = tensors[s.tensor]
    # the grid: one axis per index, lhs indices first
    grid = tuple(ranges[i][1] - ranges[i][0] for i in indices)
    env = dict(sizes)
    for k, i in enumerate(indices):
        shape = [1] * len(indices)
        shape[k] = -1
        env[i] = np.arange(*ranges[i], dtype=np.int64).reshape(shape)
    domain = np.ones(grid, bool)
    for arg, lo, hi, guards, affine in constraints:
        v = np.asarray(_int_value(arg, env))
        inside = (v >= lo) & (v < hi)
        if affine:  # a guard that reads data cannot be part of the domain: the read constrains everywhere
            for cond, taken in guards:
                inside = inside | ~_cond_value(cond, env, taken)
        domain &= np.broadcast_to(inside, grid)
    _check_affine_reads(s.rhs, env, tensors, set(indices), domain, grid)
    ev = _Evaluator(tensors, dtypes, env, grid, typer)
    value = ev.eval(s.rhs)
    if (value.bad & domain).any():
        where = np.argwhere(value.bad & domain)[0]
        at = ", ".join(f"{i}={ranges[i][0] + int(w)}" for i, w in zip(indices, where))
        raise OutOfBounds(f"a read leaves its tensor at {at}")
    lhs_idx = tuple(env[i].reshape(env[i].shape[:len(s.lhs)]) for i in s.lhs)
    lhs_box = tuple(slice(ranges[i][0] - target.first(k), ranges[i][1] - target.first(k))
                    for k, i in enumerate(s.lhs))
    for k, (i, extent) in enumerate(zip(s.lhs, target.v.shape)):
        if ranges[i][0] < target.first(k) or ranges[i][1] > target.first(k) + extent:
            if domain.any():
                raise TCError(f"the write to {s.tensor} leaves its shape")
    v = ev._as(value.v, dtype)
    err = value.err
    eps = EPS.get(dtype, 0.0)
    if _is_float(dtype) and rhs_dtype == "float32" and dtype == "float64":  # computed in float32, widened
        v = v.astype(np.float32).astype(np.float64)
    if not _is_float(dtype) and dtype != "bool":
        if v.size and (v.min() < INT32[0] or v.max() > INT32[1]):
            raise Unsupported("int32 overflow in the reference")
    red_axes = tuple(range(len(s.lhs), len(indices)))
    base = op.rstrip("!")
    if op.endswith("!"):
        target.v[lhs_box] = _identity(op, dtype)
        target.err[lhs_box] = 0
    if base == "=":
        cur_v, cur_e = target.v[lhs_box], target.err[lhs_box]
        target.v[lhs_box] = np.where(domain, v, cur_v)
        target.err[lhs_box] = np.where(domain, err, cur_e)
        return
    ident = _identity(base, dtype)
    vv = np.where(domain, v, ident)
    count = domain.sum(axis=red_axes) if red_axes else domain.astype(np.int64)
    cur_v, cur_e = target.v[lhs_box], target.err[lhs_box]
    with np.errstate(all="ignore"):
        if base == "+=":
            total = vv.sum(axis=red_axes) + cur_v
            new_e = cur_e + np.where(domain, err, 0).sum(axis=red_axes) + eps * \
                (count + 1) * (np.abs(vv).sum(axis=red_axes) + np.abs(cur_v))
        elif base == "*=":
            if _is_float(dtype):
                total = vv.prod(axis=red_axes) * cur_v
                mags = np.where(domain, np.abs(vv) + err, 1.0)
                upper = mags.prod(axis=red_axes) * (np.abs(cur_v) + cur_e)
                new_e = upper - np.abs(total) + eps * (count + 1) * np.abs(total)
            else:
                total = vv.prod(axis=red_axes) * cur_v
                new_e = cur_e
        else:
            f = np.max if base == "max=" else np.min
            g = np.maximum if base == "max=" else np.minimum
            total = g(f(vv, axis=red_axes), cur_v) if vv.size else cur_v
            new_e = np.maximum(np.where(domain, err, 0).max(axis=red_axes, initial=0), cur_e)
    if not _is_float(dtype) and total.size and (total.min() < INT32[0] or total.max() > INT32[1]):
        if base != "max=" and base != "min=":
            raise Unsupported("int32 overflow in a reduction")
    target.v[lhs_box] = total
    target.err[lhs_box] = new_e


def _check_affine_reads(rhs, env, tensors, indices, domain, grid):
    """Every affine index argument of a read (wrapping casts, ``/`` and ``%`` by constants included) must stay
    in bounds wherever the *affine* conditions of its enclosing ``?:`` hold (polyc checks this at compile time
    and does not count data-dependent or non-affine conditions); arguments with data-dependent or non-affine
    indices (``A(I(i))``, ``A(i*j)``) are checked when evaluated (polyc: at run time)."""
    for tensor, args, guards in _accesses(rhs):
        t = tensors.get(tensor)
        if t is None or t.v.ndim != len(args):
            continue
        bad = np.zeros(grid, bool)
        for k, (a, extent) in enumerate(zip(args, t.v.shape)):  # each affine argument (others: at run time)
            if _has_read(a) or not _affine(a, indices):
                continue
            v = np.asarray(_int_value(a, env)) - t.first(k)
            bad = bad | np.broadcast_to((v < 0) | (v >= extent), grid)
        for cond, taken in guards:
            if _affine_cond(cond, indices):
                bad = bad & np.broadcast_to(_cond_value(cond, env, taken), grid)
        if (bad & domain).any():
            raise TCError(f"a read of {tensor} can leave its tensor (affine index, checked at compile time)")


def _widens(src, dst):
    if src == dst or src == "bool":
        return True
    if _is_float(src):
        return _is_float(dst) and np.dtype(dst).itemsize >= np.dtype(src).itemsize
    if _is_float(dst):
        return True
    return np.dtype(dst).itemsize >= np.dtype(src).itemsize


# ---- comparison ------------------------------------------------------------------------------------------

#: Tolerance factor on the (absolute) error scale.
TOLERANCE = 16


def compare(got: np.ndarray, expected: np.ndarray, err: np.ndarray, dtype: str) -> str | None:
    """``None`` when ``got`` matches the reference, else a one-line summary of the difference."""
    if got.shape != expected.shape:
        return f"shape {list(got.shape)}, expected {list(expected.shape)}"
    if str(got.dtype) != dtype:
        return f"dtype {got.dtype}, expected {dtype}"
    if not _is_float(dtype):
        wrong = got != expected
    else:
        eps = float(np.finfo(dtype).eps)
        g, e = got.astype(np.float64), expected.astype(np.float64)
        finite = np.isfinite(e)
        with np.errstate(all="ignore"):
            # below the smallest normal number, differences are flushing or rounding of denormals
            tol = TOLERANCE * np.where(np.isfinite(err), err, np.inf) + float(np.finfo(dtype).tiny)
            close = np.abs(g - e) <= tol
        same_special = (np.isnan(g) & np.isnan(e)) | (g == e)
        wrong = ~np.where(finite, close, same_special)
    if not wrong.any():
        return None
    n = int(wrong.sum())
    at = tuple(int(x) for x in np.argwhere(wrong)[0])
    return (f"{n} of {got.size} elements differ; first at {list(at)}: got {got[at]!r}, expected {expected[at]!r}"
            f"{'' if _is_float(dtype) else ''}")
