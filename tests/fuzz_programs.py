"""Random TC programs for differential fuzzing of polyc against :mod:`tc_reference`.

:func:`generate` builds a program (a :class:`tc_reference.Def` tree, printed as TC text for polyc) from a seed:
1-5 statements over 1-3 sizes, inputs of 0-3 dims sharing size names, temporaries read by later statements,
affine index expressions (``i``, ``i+1``, ``i-1`` under guards or where-clauses, ``j/2``, ``2*i``, ``i%3``,
``N-1-i``, ``i+j``, transposed and repeated indices such as ``T(j,j,l)``), data-dependent indices
(``A(I(i))``), reductions (``+=! *=! max=! min=!``, ``+=`` onto outputs), ``?:`` guards on indices and
data, and elementwise builtins, in float32, float64 or int32. Value magnitudes are tracked so float32
results stay far from overflow and int32 ones from wrapping.

:func:`run_program` compiles the program with polyc under option sets at several sizes and compares every
output with :func:`tc_reference.run`; it returns one :class:`Outcome` per (options, sizes). polyc is used
through its public API only (``polyc.define``, ``Kernel.specialize_sizes``, ``polyc.Options``,
``polyc.PolycError``).
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

import numpy as np

import tc_reference as R

SIZE_NAMES = ("N", "M", "K")
INDEX_NAMES = ("i", "j", "k", "l")
#: The largest extent the magnitude bounds assume (the parallel configuration uses larger sizes only for
#: programs with at most this many reduction terms per element).
MAX_TERMS = 4096
FLOAT_BOUND = 1e4
INT_BOUND = 1 << 20

#: Option sets, by text spec (``polyc.Options.from_spec``); ``naive`` is ``Options.naive()``. Only the
#: first run of the default options compiles at LLVM's -O3: the others exercise polyc's own transformations
#: (schedule, tiling, vectorization, threads), the same at any LLVM level, and LLVM's -O0 compiles them in
#: about half the time (the median run then costs a third less CPU).
OPTION_SETS = {
    "default": "",
    "default-O0": "opt_level=0",
    "naive": "tile=0,register_tile=0,vectorize=0,parallel=0,promote=0,opt_level=0",
    "tiles": "tile_sizes=2x3,register_tile_sizes=2,threads=2,unroll=4,opt_level=0",
    "fusion=min": "fusion=min,opt_level=0",
    "wild": "fusion=max,promote=1,rar=1,tile_sizes=5x4x3,register_tile_sizes=3,threads=2,opt_level=0",
    "identity": "scheduler=identity,threads=2,opt_level=0",
}
#: The rotating extra option set of each program.
EXTRA_SETS = ("naive", "naive", "fusion=min", "wild", "identity")
#: The option set used for the large-size run that exercises parallel loops.
PARALLEL_OPTIONS = "tile_sizes=8x16,threads=2,opt_level=1"
#: Fraction of programs whose "tiles" run has polyc's between-stage verifier on (POLYC_VERIFY=1); the
#: other runs have it off: the comparison with the reference is the oracle.
VERIFY_FRACTION = 0.1
#: A candidate program the reference finds invalid at every size is replaced by another (up to
#: ATTEMPTS candidates) unless a draw below KEEP_INVALID keeps it, to check that polyc rejects it too.
ATTEMPTS = 6
KEEP_INVALID = 0.1


@dataclass
class Program:
    seed: int
    definition: R.Def
    text: str
    dtype: str
    index_inputs: dict          # int input name -> [(tensor, dim)] it indexes (its values must fit)
    max_indices: int            # the most indices of one statement
    sizes: list                 # size assignments to run (dicts)
    plan: list                  # (option-set name, spec, index into sizes, verify)
    bad_index: list = field(default_factory=list)   # per size: index inputs get an out-of-range value
    references: dict = field(default_factory=dict, repr=False)  # size index -> Reference
    attempt: int = 0


@dataclass
class Reference:
    """The reference's verdict on one size: ``kind`` is ``ok``, ``oob`` (a read evaluated at run time leaves
    its tensor: polyc must fail the call or reject), ``invalid`` or ``unsupported`` (cannot judge)."""

    inputs: list
    expected: dict | None
    kind: str
    why: str = ""


# ---- expression builders with magnitude bounds --------------------------------------------------------------

@dataclass
class _E:
    node: tuple
    bound: float        # |value| <= bound
    dtype: str          # "float" or "int" (the program's data kind); "bool" for conditions


def _num(v):
    return ("num", v)


def _bin(op, a, b):
    return ("bin", op, a, b)


class _Gen:
    def __init__(self, rng: random.Random):
        self.rng = rng
        r = rng.random()
        self.dtype = "float32" if r < 0.5 else "float64" if r < 0.7 else "int32"
        self.is_float = self.dtype != "int32"
        self.sizes = list(SIZE_NAMES[:rng.choice((1, 2, 2, 3, 3))])
        self.params = []            # (name, dtype, dims)
        self.ranks = {}             # tensor -> rank (inputs and written tensors)
        self.bounds = {}            # tensor -> magnitude bound
        self.kinds = {}             # tensor -> "float"/"int"
        self.index_inputs = {}
        self.statements = []
        self.outputs = []
        self.consumed = set()       # tensors a statement writing another tensor has read (never written again)
        self.reading = set()        # tensors the statement being generated reads
        self.max_indices = 1

    # -- inputs --
    def make_inputs(self):
        rng = self.rng
        n = rng.choice((1, 2, 2, 3, 3))
        for k in range(n):
            rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3)) if k else rng.choice((1, 2, 2, 3))
            dims = tuple(rng.choice(self.sizes) for _ in range(rank))
            name = "ABCD"[k]
            dtype = self.dtype
            if self.is_float and rng.random() < 0.1:
                dtype = "float64" if self.dtype == "float32" else "float32"
            self.params.append((name, dtype, dims))
            self.ranks[name] = rank
            self.bounds[name] = 1.0 if self.is_float else 4
            self.kinds[name] = "float" if dtype != "int32" else "int"
        used = {d for p in self.params for d in p[2]}
        self.sizes = [s for s in self.sizes if s in used] or self.sizes
        if rng.random() < 0.25:
            self.params.append(("I", "int32", (rng.choice(self.sizes),)))
            self.ranks["I"] = 1
            self.index_inputs["I"] = []
        if self.is_float and rng.random() < 0.1:
            self.params.append(("Q", "int32", (rng.choice(self.sizes),)))
            self.ranks["Q"] = 1
            self.bounds["Q"] = 4
            self.kinds["Q"] = "int"

    # -- index expressions --
    def extent_name(self, tensor: str, dim: int):
        """The size name of dimension ``dim`` of an input (a random size for a temporary)."""
        for name, _dtype, dims in self.params:
            if name == tensor and dim < len(dims) and isinstance(dims[dim], str):
                return dims[dim]
        return self.rng.choice(self.sizes)

    def index_expr(self, x: str, stmt_indices: list, tensor: str, dim: int):
        """An index expression for dimension ``dim`` of ``tensor`` mentioning ``x``; returns (node, guard)
        where guard is a condition the read needs (or None)."""
        rng = self.rng
        r = rng.random()
        ix = ("id", x)
        size = rng.choice(self.sizes)
        if r < 0.66:
            return ix, None
        if r < 0.72 and "I" in self.index_inputs and tensor != "I" and tensor in dict(
                (p[0], p) for p in self.params):
            self.index_inputs["I"].append((tensor, dim))
            return ("acc", "I", (ix,)), None
        if r < 0.74:
            return self.checked_index(x, stmt_indices, tensor, dim)
        if r < 0.78:
            return _bin("+", ix, _num(1)), _bin("<", _bin("+", ix, _num(1)), ("id", size))
        if r < 0.82:
            return _bin("-", ix, _num(1)), _bin(">=", ix, _num(1))
        if r < 0.85:
            return _bin("/", ix, _num(2)), None
        if r < 0.87:
            return _bin("*", _num(2), ix), None
        if r < 0.885:
            return _bin("%", ix, _num(3)), None
        if r < 0.92:
            return _bin("-", _bin("-", ("id", size), _num(1)), ix), None
        if r < 0.95 and len(stmt_indices) > 1:
            y = rng.choice([i for i in stmt_indices if i != x])
            return _bin("+", ix, ("id", y)), _bin("<", _bin("+", ix, ("id", y)), ("id", size))
        if r < 0.97:
            return _bin("/", _bin("-", ix, _num(1)), _num(2)), None
        if r < 0.99 and "I" in self.index_inputs and tensor != "I" and tensor in dict(
                (p[0], p) for p in self.params):
            self.index_inputs["I"].append((tensor, dim))
            return ("acc", "I", (ix,)), None
        return _bin("+", ix, _num(1)), None

    def checked_index(self, x: str, stmt_indices: list, tensor: str, dim: int):
        """Indices polyc must bound exactly or check at run time: products of indices (non-affine: checked
        at run time), narrow casts that may wrap around, ``/`` and ``%`` by negative constants (affine:
        checked at compile time); some in bounds by construction, some not, some guarded."""
        rng = self.rng
        ix = ("id", x)
        n = ("id", self.extent_name(tensor, dim))
        y = ("id", rng.choice([i for i in stmt_indices if i != x] or [x]))
        r = rng.random()
        if r < 0.3:  # i*j, i*i: raw (fails at run time for most sizes), modulo the extent, or guarded
            prod = _bin("*", ix, y)
            k = rng.random()
            if k < 0.35:
                return prod, None
            if k < 0.7:
                return _bin("%", prod, n), None
            return prod, _bin("<", prod, n)
        if r < 0.55:  # narrow casts: wrap around beyond 127 / 255 / 32767
            k = rng.random()
            if k < 0.3:
                return ("cast", "int8", ix), None
            if k < 0.45:
                return _bin("-", _bin("-", n, _num(1)), ("cast", "int16", ix)), None
            if k < 0.75:
                cast = rng.choice(("int8", "uint8", "int16"))
                return _bin("%", ("cast", cast, _bin("*", ix, _num(rng.choice((37, 91, 1000))))), n), None
            return ("cast", "int8", _bin("*", ix, _num(37))), _bin("<", ix, _num(4))
        if r < 0.8:  # % by a negative constant: values in (c, 0]
            c = rng.choice((-2, -3, -5))
            k = rng.random()
            if k < 0.4:
                return ("un", "-", _bin("%", ix, _num(c))), None
            if k < 0.8:
                return _bin("+", _bin("-", n, _num(1)), _bin("%", ix, _num(c))), None
            return _bin("%", ix, _num(c)), None
        # / by a negative constant: floor(-i/c)
        c = rng.choice((-1, -2, -3))
        if rng.random() < 0.7:
            return _bin("+", _bin("/", ix, _num(c)), _bin("-", n, _num(1))), None
        return _bin("/", _bin("-", _bin("-", n, _num(1)), ix), _num(c)), None

    # -- reads --
    def read(self, tensor: str, stmt_indices: list, must: list) -> _E:
        """A read of ``tensor``; its plain indices are taken from ``must`` first (indices that still need an
        access to get their range), then from the statement's indices."""
        self.reading.add(tensor)
        rng = self.rng
        rank = self.ranks[tensor]
        args, guards = [], []
        for dim in range(rank):
            if must and rng.random() < 0.85:
                x = must.pop(0)
                node, guard = ("id", x), None
                if rng.random() < 0.15:
                    node, guard = self.index_expr(x, stmt_indices, tensor, dim)
            else:
                x = rng.choice(stmt_indices)
                node, guard = self.index_expr(x, stmt_indices, tensor, dim)
            args.append(node)
            if guard is not None:
                guards.append(guard)
        node = ("acc", tensor, tuple(args))
        e = _E(node, self.bounds[tensor], self.kinds[tensor])
        if guards and rng.random() < 0.9:
            cond = guards[0] if len(guards) == 1 else _bin("&&", guards[0], guards[1])
            e = _E(("sel", cond, node, self.const(e.dtype).node), e.bound, e.dtype)
        return e

    def const(self, kind):
        rng = self.rng
        if kind == "int":
            return _E(_num(rng.choice((0, 1, 2, 3, -1, -2))), 3, "int")
        v = rng.choice((0.0, 0.5, 1.0, 1.5, 2.0, -0.5, -1.0, 0.25, 0.125, 3.0))
        return _E(_num(v), abs(v), "float")

    # -- combining --
    def combine(self, parts: list, stmt_indices: list) -> _E:
        rng = self.rng
        while len(parts) > 1:
            a = parts.pop(rng.randrange(len(parts)))
            b = parts.pop(rng.randrange(len(parts)))
            parts.append(self.binary(a, b))
        e = parts[0]
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            e = self.unary(e, stmt_indices)
        return e

    def binary(self, a: _E, b: _E) -> _E:
        rng = self.rng
        kind = "float" if "float" in (a.dtype, b.dtype) else "int"
        bound_limit = FLOAT_BOUND if kind == "float" else INT_BOUND
        choices = ["+", "-", "*", "max", "min"]
        if kind == "float":
            choices += ["fdiv", "fmax", "fmin"]
        else:
            choices += ["/", "%"]
        for _ in range(4):
            op = rng.choice(choices)
            if op in ("+", "-"):
                return _E(_bin(op, a.node, b.node), a.bound + b.bound, kind)
            if op == "*":
                if a.bound * b.bound <= bound_limit:
                    return _E(_bin("*", a.node, b.node), a.bound * b.bound, kind)
                continue
            if op in ("max", "min", "fmax", "fmin"):
                return _E(("call", op, (a.node, b.node)), max(a.bound, b.bound), kind)
            if op == "fdiv":
                den = _bin("+", ("call", "fabs", (b.node,)), _num(1.0))
                return _E(_bin("/", a.node, den), a.bound, kind)
            if op in ("/", "%"):  # integer division by data, zero included (x/0 == x%0 == 0)
                return _E(_bin(op, a.node, b.node), a.bound if op == "/" else b.bound, kind)
        return _E(_bin("+", a.node, b.node), a.bound + b.bound, kind)

    def unary(self, e: _E, stmt_indices: list) -> _E:
        rng = self.rng
        r = rng.random()
        if e.dtype == "int":
            if r < 0.3:
                return _E(("call", "abs", (e.node,)), e.bound, "int")
            if r < 0.5:
                return _E(("un", "-", e.node), e.bound, "int")
            if r < 0.75:
                c = self.const("int")
                return _E(_bin("*", e.node, c.node), e.bound * 3, "int") if e.bound * 3 < INT_BOUND else e
            return self.guard(e, stmt_indices)
        if r < 0.15:
            return _E(("call", "tanh", (e.node,)), 1.0, "float")
        if r < 0.25 and e.bound <= 8:
            return _E(("call", "exp", (e.node,)), math.exp(e.bound), "float")
        if r < 0.32:
            return _E(("call", "sigmoid", (e.node,)), 1.0, "float")
        if r < 0.40:
            arg = _bin("+", ("call", "fabs", (e.node,)), _num(1.0))
            return _E(("call", "sqrt", (arg,)), math.sqrt(e.bound + 1), "float")
        if r < 0.46:
            arg = _bin("+", ("call", "fabs", (e.node,)), _num(1.0))
            return _E(("call", "log", (arg,)), math.log(e.bound + 1), "float")
        if r < 0.52:
            return _E(("call", rng.choice(("sin", "cos")), (e.node,)), 1.0, "float")
        if r < 0.56:
            return _E(("call", "erf", (e.node,)), 1.0, "float")
        if r < 0.62:
            return _E(("un", "-", e.node), e.bound, "float")
        if r < 0.70:
            c = self.const("float")
            return _E(_bin("*", e.node, c.node), e.bound * 3, "float")
        if r < 0.76:
            c = self.const("float")
            return _E(_bin("+", e.node, c.node), e.bound + 3, "float")
        return self.guard(e, stmt_indices)

    def guard(self, e: _E, stmt_indices: list) -> _E:
        """``cond ? e : other`` with a condition on indices, or on an input value."""
        rng = self.rng
        x = rng.choice(stmt_indices)
        size = ("id", rng.choice(self.sizes))
        r = rng.random()
        if r < 0.2:
            cond = _bin(">=", ("id", x), _num(1))
        elif r < 0.35:
            cond = _bin("<", ("id", x), _bin("-", size, _num(1)))
        elif r < 0.5 and len(stmt_indices) > 1:
            y = rng.choice([i for i in stmt_indices if i != x])
            cond = _bin(rng.choice(("==", "<", "!=")), ("id", x), ("id", y))
        elif r < 0.6:
            cond = _bin("==", _bin("%", ("id", x), _num(2)), _num(0))
        elif r < 0.7:
            cond = ("un", "!", _bin(">", ("id", x), _num(2)))
        elif r < 0.8 and len(stmt_indices) > 1:
            y = rng.choice([i for i in stmt_indices if i != x])
            cond = _bin("||", _bin("<", ("id", x), _num(2)), _bin(">=", ("id", y), _num(1)))
        else:  # a data condition on an input read with in-bounds plain indices
            inputs = [p for p in self.params if p[0] != "I" and 1 <= len(p[2])]
            if not inputs:
                cond = _bin(">=", ("id", x), _num(1))
            else:
                name, dtype, dims = rng.choice(inputs)
                read = self.read(name, stmt_indices, [])
                zero = _num(0.0) if dtype != "int32" else _num(0)
                cond = _bin(rng.choice((">", "<=")), read.node, zero)
        other = self.const(e.dtype) if rng.random() < 0.7 else _E(("un", "-", e.node), e.bound, e.dtype)
        return _E(("sel", cond, e.node, other.node), max(e.bound, other.bound), e.dtype)

    # -- statements --
    def statement(self, k: int, last: bool):
        rng = self.rng
        self.reading = set()
        # a tensor another statement has read is final (polyc and the reference refuse writing it again)
        written = [s.tensor for s in self.statements if s.tensor not in self.consumed]
        if last:  # the last statement writes an output
            written = [t for t in written if t.startswith("O")]
        reuse = written and rng.random() < 0.2
        if reuse:
            target = rng.choice(written)
            rank = self.ranks[target]
        else:
            rank = rng.choice((0, 1, 1, 2, 2, 2, 3, 3))
            is_output = last or rng.random() < 0.4
            target = f"O{k}" if is_output else f"T{k}"
        names = list(INDEX_NAMES)
        rng.shuffle(names)
        lhs = sorted(names[:rank]) if rng.random() < 0.7 else names[:rank]
        # four-index statements cost polyc most to compile (isl's scheduler and AST builder): about a third of
        # the programs have one
        n_red = rng.choice((0, 0, 1, 1, 1, 2) if rank < 3 else (0, 0, 1))
        if rank + n_red == 0:
            n_red = 1
        reds = names[rank:rank + n_red]
        indices = lhs + reds
        self.max_indices = max(self.max_indices, len(indices))
        # reads: enough to give every index a plain occurrence
        sources = [t for t in self.ranks if self.ranks[t] >= 1 and t != target and t not in ("I",)]
        readable = [t for t in self.ranks if t != target and t != "I"]
        must = list(indices)
        rng.shuffle(must)
        parts = []
        tries = 0
        while (must or not parts) and tries < 8:
            tries += 1
            pool = sources if must else readable
            if not pool:
                break
            parts.append(self.read(rng.choice(pool), indices, must))
        for _ in range(rng.choice((0, 0, 1, 1, 2))):
            if readable and rng.random() < 0.7:
                parts.append(self.read(rng.choice(readable), indices, []))
            else:
                parts.append(self.const("float" if self.is_float else "int"))
        ranges = {}
        if rng.random() < 0.2:
            x = rng.choice(indices)
            size = ("id", rng.choice(self.sizes))
            lo, hi = rng.choice(((0, size), (1, size), (0, _bin("-", size, _num(1)))
                                 , (0, _num(2)), (1, _bin("+", size, _num(1)))))
            ranges[x] = (_num(lo), hi)
        rhs = self.combine(parts, indices)
        # the operator
        first = not reuse
        terms = MAX_TERMS if reds else 1
        if reds:
            op = rng.choice(("+=!",) * 5 + ("max=!",) * 2 + ("min=!", "*=!"))
            if not first and rng.random() < 0.4:
                op = op.rstrip("!")
            if target.startswith("O") and first and rng.random() < 0.15:
                op = "+="
        else:
            op = rng.choice(("=",) * 6 + ("+=!", "max=!", "min=!") if first else ("=", "=", "+=", "max=", "*="))
        if op.startswith("*="):
            if rhs.dtype == "float":
                # factors within 1 +- 2^-10: a product of 4096 stays within [0.018, 55] (no underflow)
                rhs = _E(_bin("+", _num(1.0), _bin("*", _num(0.0009765625), ("call", "tanh", (rhs.node,)))),
                         1.01, "float")
                bound = 1.001 ** terms * self.bounds.get(target, 1)
            else:
                rhs = _E(("call", "min", (("call", "max", (rhs.node, _num(-1))), _num(1))), 1, "int")
                bound = max(1, self.bounds.get(target, 1))
        elif op.startswith("+="):
            bound = rhs.bound * terms + (self.bounds.get(target, 0) if not op.endswith("!") else 0)
        elif op == "=":
            bound = rhs.bound
        else:
            bound = max(rhs.bound, self.bounds.get(target, 0))
        limit = FLOAT_BOUND * MAX_TERMS if self.is_float else (1 << 30)
        if bound > limit and not (op.startswith("*=") and rhs.dtype == "float"):  # too large: squash it
            if rhs.dtype == "float":
                rhs = _E(("call", "tanh", (rhs.node,)), 1.0, "float")
                bound = terms * 1.0 if op.startswith("+=") else 1.0
            else:
                rhs = _E(("call", "min", (("call", "max", (rhs.node, _num(-3))), _num(3))), 3, "int")
                bound = 3 * terms if op.startswith("+=") else 3
        stmt = R.Statement(target, tuple(lhs), op, rhs.node, ranges)
        self.statements.append(stmt)
        self.consumed |= self.reading - {target}
        self.ranks[target] = rank
        self.bounds[target] = min(bound, FLOAT_BOUND * MAX_TERMS) if self.is_float else bound
        self.kinds[target] = rhs.dtype if first else self.kinds.get(target, rhs.dtype)
        if target.startswith("O") and target not in self.outputs:
            self.outputs.append(target)


def generate(seed: int, parallel: bool | None = None) -> Program:
    """The random program of ``seed``, its size assignments, the reference's verdict at each and the run
    plan. Candidates invalid at every size are mostly replaced (no polyc time is spent on them)."""
    for attempt in range(ATTEMPTS):
        rng = random.Random(seed if attempt == 0 else f"{seed}/{attempt}")
        program = _candidate(rng, seed)
        program.attempt = attempt
        kinds = [reference(program, k).kind for k in range(len(program.sizes))]
        if "ok" in kinds or rng.random() < KEEP_INVALID:
            break
    program.plan = _plan(program, rng, kinds, parallel)
    if any(p[2] == len(kinds) for p in program.plan):
        reference(program, len(kinds))
    return program


def _candidate(rng: random.Random, seed: int) -> Program:
    g = _Gen(rng)
    g.make_inputs()
    n = rng.choice((1, 2, 2, 3, 3, 4, 5))
    for k in range(n):
        g.statement(k, k == n - 1)
    d = R.Def(f"f{seed % 1000}", g.params, g.outputs, g.statements)
    # sizes: small (1 likely), odd primes, a bit larger
    n_sizes = rng.choice((2, 2, 3))
    pools = [(1, 1, 2, 3), (3, 5, 7), (7, 8, 9, 11, 13)]
    sizes = [{s: rng.choice(pools[k]) for s in g.sizes} for k in range(n_sizes)]
    # programs with an index input get out-of-range index data at one size (half of them)
    bad = [False] * n_sizes
    if g.index_inputs.get("I") and rng.random() < 0.5:
        bad[rng.randrange(n_sizes)] = True
    program = Program(seed, d, R.def_text(d), g.dtype, g.index_inputs, g.max_indices, sizes, [], bad)
    return program


def _plan(program: Program, rng: random.Random, kinds: list, parallel: bool | None) -> list:
    """The default options at a valid size (-O3), and at another size (-O0) where the reference finds a
    read out of bounds or the program invalid, else for half of the programs; tiles with 2 threads and a
    rotating extra set (naive, fusion=min, wild, identity) at a valid size each (the extra for half of the
    programs polyc takes longest to compile: four-index statements and three statements or more); where the
    reference finds an out-of-bounds read at run time, a tiled parallel run there too. That is 3-5 runs, 3.6
    on average: about 0.24 CPU-s per program."""
    n = len(kinds)
    valid = [k for k in range(n) if kinds[k] == "ok"]
    oob = [k for k in range(n) if kinds[k] == "oob"]
    if not valid:  # kept to check that polyc rejects it (at one size, the default options)
        return [("default", OPTION_SETS["default"], rng.choice(oob or list(range(n))), False)]
    first = rng.choice(valid)
    others = [k for k in range(n) if k != first]
    invalid = [k for k in others if kinds[k] == "invalid"]
    plan = [("default", OPTION_SETS["default"], first, False)]
    second = rng.random() < 0.5
    if others and (oob or invalid or second):
        plan.append(("default-O0", OPTION_SETS["default-O0"], rng.choice(oob or invalid or others), False))
    verify = rng.random() < VERIFY_FRACTION
    plan.append(("tiles", OPTION_SETS["tiles"], rng.choice(valid), verify))
    extra = rng.choice(EXTRA_SETS)
    heavy = program.max_indices >= 4 and len(program.definition.statements) >= 3
    if not heavy or not second:  # the programs that cost polyc most get three runs, half of them
        plan.append((extra, OPTION_SETS[extra], rng.choice(valid), False))
    if oob:
        plan.append(("tiles", OPTION_SETS["tiles"], rng.choice(oob), False))
    if parallel is None:
        parallel = rng.random() < 0.05
    if parallel:
        side = {1: 65537, 2: 257, 3: 41, 4: 17}[min(4, program.max_indices)]
        widest = max(len(p[2]) for p in program.definition.params) or 1
        side = min(side, int((1 << 21) ** (1 / widest)) | 1)  # inputs of at most ~2M elements
        program.sizes.append({s: side for s in program.sizes[0]})
        program.bad_index.append(False)
        plan.append(("parallel", PARALLEL_OPTIONS, n, False))
    return plan


def reference(program: Program, k: int) -> Reference:
    """The reference's verdict on size ``k`` of ``program`` (computed once)."""
    if k not in program.references:
        inputs = make_inputs(program, program.sizes[k], program.seed * 7 + k, program.bad_index[k])
        try:
            ref = Reference(inputs, R.run(program.definition, inputs), "ok")
        except R.OutOfBounds as exc:
            ref = Reference(inputs, None, "oob", f"out of bounds: {exc}")
        except R.TCError as exc:
            ref = Reference(inputs, None, "invalid", f"invalid: {exc}")
        except R.Unsupported as exc:
            ref = Reference(inputs, None, "unsupported", f"unsupported: {exc}")
        program.references[k] = ref
    return program.references[k]


def make_inputs(program: Program, sizes: dict, seed: int, bad_index: bool = False) -> list:
    """Input arrays for one size assignment: index inputs hold in-bounds values of what they index, except
    one out-of-range value (-1, the extent or beyond) with ``bad_index``."""
    rng = np.random.default_rng(seed)
    arrays = []
    for name, dtype, dims in program.definition.params:
        shape = tuple(d if isinstance(d, int) else sizes[d] for d in dims)
        if name in program.index_inputs:
            extents = [program.definition.params[[p[0] for p in program.definition.params].index(t)][2][dim]
                       for t, dim in program.index_inputs[name]]
            hi = min([sizes[e] if not isinstance(e, int) else e for e in extents], default=1)
            a = rng.integers(0, hi, shape).astype(np.int32)
            if bad_index and a.size:
                a.flat[rng.integers(a.size)] = rng.choice((-1, hi, hi + 2))
        elif dtype == "int32":
            a = rng.integers(-4, 5, shape).astype(np.int32)
        else:
            a = rng.uniform(-1, 1, shape).astype(dtype)
        arrays.append(a)
    return arrays


# ---- running ----------------------------------------------------------------------------------------------

#: Run statuses: ``ok`` and ``mismatch`` (a wrong result, polyc accepting what the reference rejects, or polyc
#: failing at run time where the reference reads in bounds); ``rejected`` (polyc rejects at compile time a
#: program the reference evaluates: a documented conservatism, sampled in the report); ``agreed-invalid``
#: (both reject); ``agreed-oob`` (the reference finds a read out of bounds at run time and polyc raises a
#: PolycError: at run time, ``runtime-check``, or at compile time); ``foreign`` (polyc raised another
#: exception); ``unjudged`` (the reference cannot judge).
STATUSES = ("ok", "mismatch", "rejected", "agreed-invalid", "agreed-oob", "runtime-check", "foreign", "unjudged")


@dataclass
class Outcome:
    """One (options, sizes) run of polyc and its status (see :data:`STATUSES`)."""

    option_set: str
    spec: str
    sizes: dict
    status: str
    detail: str = ""
    seconds: float = 0.0
    case: int = 0
    bad_index: bool = False


def run_program(program: Program, on_start=None) -> list[Outcome]:
    """Run every entry of the program's plan; ``on_start(option_set, spec, sizes)`` is called before each
    polyc compilation (so a supervising process can attribute a crash or a timeout). Each run has polyc's
    verifier on only if its plan entry says so (``POLYC_VERIFY`` is set for the run)."""
    import os

    import polyc

    outcomes = []
    kernel, define_error = None, None
    try:
        kernel = polyc.define(program.text)
    except Exception as exc:  # noqa: BLE001 - a PolycError is a rejection, anything else a finding
        define_error = exc
    saved = os.environ.get("POLYC_VERIFY")
    try:
        for name, spec, k, verify in program.plan:
            sizes = program.sizes[k]
            ref = reference(program, k)
            if on_start is not None:
                on_start(name, spec + (" (POLYC_VERIFY=1)" if verify else ""), sizes)
            os.environ["POLYC_VERIFY"] = "1" if verify else "0"
            t = time.perf_counter()
            status, detail = _run_polyc(polyc, kernel, define_error, spec, sizes, ref)
            outcomes.append(Outcome(name, spec, sizes, status, detail, time.perf_counter() - t, k,
                                    program.bad_index[k]))
    finally:
        if saved is None:
            os.environ.pop("POLYC_VERIFY", None)
        else:
            os.environ["POLYC_VERIFY"] = saved
    return outcomes


def _run_polyc(polyc, kernel, define_error, spec, sizes, ref: Reference):
    from polyc.errors import KernelRuntimeError

    if ref.kind == "unsupported":
        return "unjudged", ref.why
    invalid = "agreed-oob" if ref.kind == "oob" else "agreed-invalid" if ref.kind == "invalid" else None
    if define_error is not None:
        if not isinstance(define_error, polyc.PolycError):
            return "foreign", f"{type(define_error).__name__}: {define_error}"
        return (invalid or "rejected"), _first_line(define_error)
    compiled = None
    try:
        options = polyc.Options.from_spec(spec)
        compiled = kernel.specialize_sizes(sizes, options=options)
        got = compiled(*ref.inputs)
    except KernelRuntimeError as exc:
        if invalid is None:
            return "mismatch", (f"polyc failed at run time but the reference reads in bounds: "
                                f"{_first_line(exc)}")
        return ("runtime-check" if invalid == "agreed-oob" else invalid), _first_line(exc)
    except polyc.PolycError as exc:
        if invalid is None and compiled is not None:
            return "mismatch", f"the compiled kernel raised {_first_line(exc)}; the reference evaluates it"
        return (invalid or "rejected"), _first_line(exc)
    except Exception as exc:  # noqa: BLE001
        return "foreign", f"{type(exc).__name__}: {_first_line(exc)}"
    if invalid is not None:
        return "mismatch", f"polyc returned a result; the reference: {ref.why}"
    if not isinstance(got, tuple):
        got = (got,)
    if len(got) != len(ref.expected):
        return "mismatch", f"{len(got)} outputs, expected {len(ref.expected)}"
    problems = []
    for (name, (value, err)), g in zip(ref.expected.items(), got):
        problem = R.compare(np.asarray(g), value, err, str(value.dtype))
        if problem:
            problems.append(f"{name}: {problem}")
    if problems:
        return "mismatch", "; ".join(problems)
    return "ok", ""


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


def reproduce(seed: int, option_set: str, case: int) -> None:
    """Print a failing run again: ``python -c 'import sys; sys.path.insert(0, "tests"); import fuzz_programs
    as F; F.reproduce(SEED, "default", 0)'`` (the program, sizes, options, expected and got)."""
    import polyc

    program = generate(seed)
    spec = PARALLEL_OPTIONS if option_set == "parallel" else OPTION_SETS[option_set]
    ref = reference(program, case)
    print(program.text, "\nsizes", program.sizes[case], "bad index data" if program.bad_index[case] else "",
          "\noptions", spec, "\nreference:", ref.kind, ref.why)
    kernel = polyc.define(program.text)
    got = kernel.specialize_sizes(program.sizes[case], options=polyc.Options.from_spec(spec))(*ref.inputs)
    for (name, (value, _err)), g in zip((ref.expected or {}).items(), got if isinstance(got, tuple) else (got,)):
        print(name, "expected", value, "got", g, sep="\n")
    print(_run_polyc(polyc, kernel, None, spec, program.sizes[case], ref))
