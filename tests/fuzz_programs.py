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

#: Option sets, by text spec (``polyc.Options.from_spec``); ``naive`` is ``Options.naive()``.
OPTION_SETS = {
    "default": "",
    "naive": "tile=0,register_tile=0,vectorize=0,parallel=0,promote=0",
    "fusion=min": "fusion=min",
    "tiles": "tile_sizes=2x3,register_tile_sizes=2,threads=2,unroll=4",
    "wild": "fusion=max,promote=1,rar=1,tile_sizes=5x4x3,register_tile_sizes=3",
    "identity": "scheduler=identity",
}
#: The option set used for the large-size run that exercises parallel loops.
PARALLEL_OPTIONS = "tile_sizes=8x16,threads=2"


@dataclass
class Program:
    seed: int
    definition: R.Def
    text: str
    dtype: str
    index_inputs: dict          # int input name -> [(tensor, dim)] it indexes (its values must fit)
    max_indices: int            # the most indices of one statement
    sizes: list                 # size assignments to run (dicts)
    plan: list                  # (option-set name, spec, index into sizes)


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
        if rng.random() < 0.15:
            self.params.append(("I", "int32", (rng.choice(self.sizes),)))
            self.ranks["I"] = 1
            self.index_inputs["I"] = []
        if self.is_float and rng.random() < 0.1:
            self.params.append(("Q", "int32", (rng.choice(self.sizes),)))
            self.ranks["Q"] = 1
            self.bounds["Q"] = 4
            self.kinds["Q"] = "int"

    # -- index expressions --
    def index_expr(self, x: str, stmt_indices: list, tensor: str, dim: int):
        """An index expression for dimension ``dim`` of ``tensor`` mentioning ``x``; returns (node, guard)
        where guard is a condition the read needs (or None)."""
        rng = self.rng
        r = rng.random()
        ix = ("id", x)
        size = rng.choice(self.sizes)
        if r < 0.72:
            return ix, None
        if r < 0.77:
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

    # -- reads --
    def read(self, tensor: str, stmt_indices: list, must: list) -> _E:
        """A read of ``tensor``; its plain indices are taken from ``must`` first (indices that still need an
        access to get their range), then from the statement's indices."""
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
        written = [s.tensor for s in self.statements]
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
        n_red = rng.choice((0, 0, 1, 1, 1, 2)) if rank < 4 else 0
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
                rhs = _E(_bin("+", _num(1.0), _bin("*", _num(0.0078125), ("call", "tanh", (rhs.node,)))),
                         1.01, "float")
                bound = 1.01 ** terms * self.bounds.get(target, 1)
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
        if bound > limit:  # too large for the dtype: squash it
            if rhs.dtype == "float":
                rhs = _E(("call", "tanh", (rhs.node,)), 1.0, "float")
                bound = terms * 1.0 if op.startswith("+=") else 1.01 ** terms
            else:
                rhs = _E(("call", "min", (("call", "max", (rhs.node, _num(-3))), _num(3))), 3, "int")
                bound = 3 * terms if op.startswith("+=") else 3
        stmt = R.Statement(target, tuple(lhs), op, rhs.node, ranges)
        self.statements.append(stmt)
        self.ranks[target] = rank
        self.bounds[target] = min(bound, FLOAT_BOUND * MAX_TERMS) if self.is_float else bound
        self.kinds[target] = rhs.dtype if first else self.kinds.get(target, rhs.dtype)
        if target.startswith("O") and target not in self.outputs:
            self.outputs.append(target)


def generate(seed: int, n_sizes: int | None = None, parallel: bool | None = None) -> Program:
    """The random program of ``seed`` with its size assignments and run plan."""
    rng = random.Random(seed)
    g = _Gen(rng)
    g.make_inputs()
    n = rng.choice((1, 2, 2, 3, 3, 4, 5))
    for k in range(n):
        g.statement(k, k == n - 1)
    d = R.Def(f"f{seed % 1000}", g.params, g.outputs, g.statements)
    text = R.def_text(d)
    # sizes: small (1 likely), odd primes, a bit larger
    n_sizes = n_sizes or rng.choice((2, 2, 3))
    pools = [(1, 1, 2, 3), (3, 5, 7), (7, 8, 9, 11, 13)]
    sizes = [{s: rng.choice(pools[k]) for s in g.sizes} for k in range(n_sizes)]
    # the default options at every size; naive, fusion=min and tiles+threads at one size each; one of the
    # more exotic sets (wild, identity) at one size
    plan = [("default", OPTION_SETS["default"], k) for k in range(n_sizes)]
    for name in ("naive", "fusion=min", "tiles", rng.choice(("wild", "identity"))):
        plan.append((name, OPTION_SETS[name], rng.randrange(n_sizes)))
    if parallel is None:
        parallel = rng.random() < 0.05
    if parallel:
        side = {1: 65537, 2: 257, 3: 41, 4: 17}[min(4, g.max_indices)]
        widest = max(len(p[2]) for p in g.params) or 1
        side = min(side, int((1 << 21) ** (1 / widest)) | 1)  # inputs of at most ~2M elements
        sizes.append({s: side for s in g.sizes})
        plan.append(("parallel", PARALLEL_OPTIONS, len(sizes) - 1))
    return Program(seed, d, text, g.dtype, g.index_inputs, g.max_indices, sizes, plan)


def make_inputs(program: Program, sizes: dict, seed: int, bad_index: bool = False) -> list:
    """Input arrays for one size assignment (index inputs hold in-bounds values of what they index)."""
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
                a.flat[rng.integers(a.size)] = hi + 1
        elif dtype == "int32":
            a = rng.integers(-4, 5, shape).astype(np.int32)
        else:
            a = rng.uniform(-1, 1, shape).astype(dtype)
        arrays.append(a)
    return arrays


# ---- running ----------------------------------------------------------------------------------------------

@dataclass
class Outcome:
    """One (options, sizes) run: ``status`` is ``ok``, ``mismatch``, ``rejected`` (polyc raised a PolycError
    on a program the reference evaluates), ``agreed-invalid`` (both reject), ``foreign`` (polyc raised
    another exception) or ``unjudged`` (the reference cannot judge); ``detail`` says what happened."""

    option_set: str
    spec: str
    sizes: dict
    status: str
    detail: str = ""
    seconds: float = 0.0


def run_program(program: Program, on_start=None, kernel_cache: dict | None = None) -> list[Outcome]:
    """Run every entry of the program's plan; ``on_start(option_set, spec, sizes)`` is called before each
    polyc compilation (so a supervising process can attribute a crash or a timeout)."""
    import polyc

    outcomes = []
    references = {}
    kernel, define_error = None, None
    try:
        kernel = polyc.define(program.text)
    except polyc.PolycError as exc:
        define_error = exc
    except Exception as exc:  # noqa: BLE001 - a foreign exception is a finding
        define_error = exc
    for name, spec, k in program.plan:
        sizes = program.sizes[k]
        if k not in references:
            inputs = make_inputs(program, sizes, program.seed * 7 + k)
            try:
                references[k] = (inputs, R.run(program.definition, inputs), None)
            except R.TCError as exc:
                references[k] = (inputs, None, f"invalid: {exc}")
            except R.Unsupported as exc:
                references[k] = (inputs, None, f"unsupported: {exc}")
        inputs, expected, why = references[k]
        if on_start is not None:
            on_start(name, spec, sizes)
        t = time.perf_counter()
        status, detail = _run_polyc(polyc, kernel, define_error, spec, sizes, inputs, expected, why)
        outcomes.append(Outcome(name, spec, sizes, status, detail, time.perf_counter() - t))
    return outcomes


def _run_polyc(polyc, kernel, define_error, spec, sizes, inputs, expected, why):
    if why is not None and why.startswith("unsupported"):
        return "unjudged", why
    invalid = why is not None
    if define_error is not None:
        if not isinstance(define_error, polyc.PolycError):
            return "foreign", f"{type(define_error).__name__}: {define_error}"
        return ("agreed-invalid" if invalid else "rejected"), _first_line(define_error)
    try:
        options = polyc.Options.from_spec(spec)
        compiled = kernel.specialize_sizes(sizes, options=options)
        got = compiled(*inputs)
    except polyc.PolycError as exc:
        return ("agreed-invalid" if invalid else "rejected"), _first_line(exc)
    except Exception as exc:  # noqa: BLE001
        return "foreign", f"{type(exc).__name__}: {_first_line(exc)}"
    if invalid:
        return "mismatch", f"polyc accepted a program the reference rejects ({why})"
    if not isinstance(got, tuple):
        got = (got,)
    if len(got) != len(expected):
        return "mismatch", f"{len(got)} outputs, expected {len(expected)}"
    problems = []
    for (name, (value, err)), g in zip(expected.items(), got):
        dtype = str(value.dtype)
        problem = R.compare(np.asarray(g), value, err, dtype)
        if problem:
            problems.append(f"{name}: {problem}")
    if problems:
        return "mismatch", "; ".join(problems)
    return "ok", ""


def _first_line(exc) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]
