"""Reverse-mode automatic differentiation of a checked def: its gradient, written as another def.

In Einstein notation the derivative of a comprehension is again a comprehension. For a statement
``T(L) op= rhs`` over the iteration domain of its indices ``I = L + R`` (left-hand and reduction indices) and a
read ``A(f(I))`` in ``rhs``, the chain rule gives, for every point of the domain,
``dA(f(I)) += dT(L) * d rhs / d A(f(I))``. :func:`grad_def` writes that as a statement of the language:

- an argument of the read that is a plain index ``i`` stays the index ``i`` of ``dA``
  (``C(m,n) +=! A(m,k) * B(k,n)`` gives ``dA(m,k) +=! dC(m,n) * B(k,n)``; ``n`` becomes a reduction index);
- an affine argument is solved for one of its indices, the *pivot*, which disappears from the statement: its
  range becomes a guard and the other indices keep theirs (``X(n,c,h+kh,w+kw)`` gives
  ``dX(n,c,h,w) +=! (h-kh >= 0 && h-kh < OH && ...) ? dY(n,m,h-kh,w-kw) * F(m,c,kh,kw) : 0.0``). The pivot is
  preferably an index of the written tensor (the large spatial loop, not the small window), and may have a
  coefficient: ``2*h+kh = y`` gives ``h = (y-kh)/2`` under ``(y-kh) % 2 == 0``;
- any other argument (a data-dependent ``A(B(i))``, ``A(i*i)``, a constant, an index used twice) becomes a
  fresh index of ``dA`` over the whole dimension with the guard ``a == arg``: the scatter-add of a gather,
  written as a comprehension (its cost is the dimension's extent times the read's domain).

Every index of a gradient statement gets an explicit range: the forward statement's where clause, or TC's
range inference done on symbolic sizes (:meth:`_Builder.solve_ranges`: ``h + kh`` in a read of extent ``H``
gives ``h in 0:H - KH + 1``). :class:`Gradient` lists
these ranges per forward statement, so that a caller with concrete sizes can check them against the forward
kernel's range inference (``polyc.grad`` does; where they differ the def needs a where clause).

Statements are differentiated in reverse order. The adjoint of a temporary sums the contributions of the
statements that read it (the first ``+=!``, the rest ``+=``); an output's adjoint is its seed ``dY`` (an extra
input of the gradient def, the output's shape), plus the contributions of later reads. Forward temporaries
and outputs the gradient reads (a softmax's row sums) are computed again at the start of the gradient def.

Reductions: ``+=``/``+=!`` pass ``dT`` to every term; ``*=!`` passes ``dT`` times the product of the other
terms, computed without dividing by zero (a product of the non-zero terms and a count of the zero ones);
``max=!``/``min=!`` pass ``dT`` to the terms equal to the result, split evenly among ties (the subgradient
PyTorch's ``amax`` takes); a term that is computed rather than read counts as equal within
:data:`TIE_TOLERANCE` (8 units in the last place), since the gradient def computes it again in a statement
the strategy may vectorize differently from the forward's. Elementwise builtins have their derivative
(:data:`~polyc.lang.derivative.PARTIALS`); ``fmax``/``max`` and ``fmin``/``min`` split the gradient evenly
where their arguments are equal (so ``relu``'s gradient at 0 is 0.5); ``floor``-like functions have
derivative 0; ``?:`` passes the gradient through the branch taken.
Integer and bool values carry no gradient. float16/bfloat16 tensors and ``lgamma``/``tgamma`` are refused
with UnsupportedError.

Source: reverse-mode AD of array programs as in Griewank & Walther, *Evaluating Derivatives* (2008), ch. 3
and 6, applied per statement of a comprehension; the index solving is Gaussian elimination on one affine
argument at a time.
"""
from __future__ import annotations

import dataclasses

from ..errors import PolycError, UnsupportedError
from . import ast as A
from .derivative import (FLOATS, ZERO, and_, cmp, derivative, div, float_reads, from_linear, index_var, is_lit,
                         linear, lit, mul, substitute, trivial, without_implied)
from .printer import format_def

# ---- the gradient def -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Gradient:
    """The gradient of a def: ``definition`` (an untyped :class:`~polyc.lang.ast.Def`) and its ``source``;
    ``seeds`` names one seed input per output of the forward def (``(output, seed)``), ``wrt`` one gradient
    output per differentiated input (``(input, gradient)``); ``ranges`` lists, per forward statement (by
    position), the range the gradient assumes for each of its indices as ``(statement, index, lows, highs)``:
    expressions of sizes whose largest low and smallest high bound it."""

    definition: A.Def
    source: str
    seeds: tuple[tuple[str, str], ...]
    wrt: tuple[tuple[str, str], ...]
    ranges: tuple[tuple[int, str, tuple, tuple], ...]


def grad_def(checked: A.CheckedDef, wrt, name: str | None = None) -> Gradient:
    """The gradient of ``checked`` with respect to the inputs named in ``wrt`` (see the module docstring).

    The gradient def takes the forward inputs, then one seed ``d<Y>`` per forward output (the output's shape
    and dtype), and returns ``d<A>`` for each ``A`` of ``wrt``, in that order. Raises PolycError for a name in
    ``wrt`` that is not a float input, UnsupportedError (naming the statement or read) for what it cannot
    differentiate."""
    return _Builder(checked, tuple(wrt), name or f"{checked.name}_grad").build()


class _Builder:
    def __init__(self, checked: A.CheckedDef, wrt: tuple, name: str):
        self.checked = checked
        self.wrt = wrt
        self.name = name
        self.used = self._names()
        self.statements: list[A.Statement] = []  # the backward statements, in order
        self.started: set = set()                # adjoints written so far
        self.assumed: list = []                  # (statement position, index, lo, hi)
        self.shapes: dict = {}                   # tensor → extents (expressions of sizes)
        self.ranges: list[dict] = []             # per forward statement: index → (lo, hi)
        self.extra: list[dict] = []              # per forward statement: index → more (lo, hi) it must meet
        self.adjoint: dict = {}                  # tensor → its adjoint's name
        self.seed_sizes: dict = {}

    # -- names --
    def _names(self) -> set:
        used = set(A.BUILTINS) | {t.name for t in self.checked.tensors} | set(self.checked.sizes)
        for cs in self.checked.statements:
            used.update(cs.indices)
        return used

    def fresh(self, base: str) -> str:
        name, k = base, 1
        while name in self.used:
            name, k = f"{base}_{k}", k + 1
        self.used.add(name)
        return name

    def where(self, k: int) -> str:
        span = self.checked.statements[k].stmt.span
        return f"statement at {span.line}:{span.col}: " if span is not None else f"statement {k + 1}: "

    # -- the steps --
    def build(self) -> Gradient:
        self.check_wrt()
        self.infer_shapes()
        edges = self.flows()
        active = self.active(edges)
        params = [A.Param(t.name, t.dtype, t.dims) for t in self.checked.inputs]
        seeds = []
        for out in self.checked.outputs:
            seed = self.fresh(f"d{out.name}")
            seeds.append((out.name, seed))
            params.append(A.Param(seed, out.dtype, self.seed_dims(out.name, seed)))
            self.adjoint[out.name] = seed
            self.shapes[seed] = self.shapes[out.name]
        readers = {t: [k for k, (reads, _) in enumerate(edges) if t in reads] for t in active}
        for out, seed in seeds:
            if out in active and readers.get(out):
                total = self.fresh(f"{seed}_total")
                self.copy_seed(total, seed, out)
                self.adjoint[out] = total
                self.shapes[total] = self.shapes[out]
        for t in self.checked.inputs:
            if t.name in self.wrt:
                self.adjoint[t.name] = self.fresh(f"d{t.name}")
                self.shapes[self.adjoint[t.name]] = self.shapes[t.name]
        for k in reversed(range(len(self.checked.statements))):
            cs = self.checked.statements[k]
            if cs.stmt.tensor in active:
                self.backward(k, [key for key in edges[k][1] if key[0] in active])
        outputs = []
        for t in self.checked.inputs:
            if t.name in self.wrt:
                g = self.adjoint[t.name]
                if g not in self.started:
                    self.zero(g, t.name)
                outputs.append(A.Output(g, t.dtype, t.dims))
        body = self.recompute() + self.statements
        definition = A.Def(self.name, tuple(params), tuple(outputs), tuple(body))
        return Gradient(definition, format_def(definition) + "\n", tuple(seeds),
                        tuple((t, self.adjoint[t]) for t in self.wrt), tuple(self.assumed))

    def check_wrt(self):
        inputs = {t.name: t for t in self.checked.inputs}
        if not self.wrt:
            raise PolycError("grad needs at least one input to differentiate with respect to (wrt=...)")
        for name in self.wrt:
            t = inputs.get(name)
            if t is None:
                raise PolycError(f"'{name}' is not an input of {self.checked.name}; its inputs are "
                                 f"{', '.join(inputs)}", hint="wrt names inputs of the def")
            if t.dtype in A.STORAGE_DTYPES:
                raise UnsupportedError(f"input '{name}' is {t.dtype}: gradients are computed in float32 and "
                                       "float64 only", hint="differentiate a float32 version of the def")
            if t.dtype not in FLOATS:
                raise PolycError(f"input '{name}' is {t.dtype}: only float inputs have a gradient",
                                 hint="leave integer and bool inputs (indices, masks) out of wrt")
        if len(set(self.wrt)) != len(self.wrt):
            raise PolycError(f"wrt names an input twice: {', '.join(self.wrt)}")
        for t in self.checked.tensors:
            if t.role != "input" and t.dtype in A.STORAGE_DTYPES:
                raise UnsupportedError(f"'{t.name}' is {t.dtype}: gradients are computed in float32 and "
                                       "float64 only", hint="differentiate a float32 version of the def")

    def infer_shapes(self):
        """The extents of every tensor and the range of every index of every statement, as expressions of
        sizes (TC's range inference where the def has no where clause)."""
        for t in self.checked.tensors:
            if t.dims is not None:
                self.shapes[t.name] = tuple(A.Const(d.value) if isinstance(d.value, int) else
                                            A.Ident(d.value, kind="size", dtype="int32") for d in t.dims)
        for k, cs in enumerate(self.checked.statements):
            stmt = cs.stmt
            ranges = {}
            for c in stmt.where:
                if isinstance(c, A.RangeClause):
                    ranges[c.index] = (self.sizes_only(c.lo), self.sizes_only(c.hi))
            reads = [x for x in A.walk(stmt.rhs) if isinstance(x, A.Access)]
            for c in stmt.where:
                if isinstance(c, A.ExistsClause):
                    reads += [x for x in A.walk(c.expr) if isinstance(x, A.Access)]
            if stmt.tensor in self.shapes:
                reads.append(A.Access(stmt.tensor, tuple(index_var(i) for i in cs.lhs_indices)))
            extra = self.solve_ranges(k, cs, ranges, reads)
            self.ranges.append(ranges)
            self.extra.append(extra)
            shaping = stmt.tensor not in self.shapes  # its left-hand ranges give the tensor its shape
            if shaping:  # the call checks these ranges alone: the tensor's extents are them
                extra = {i: b for i, b in extra.items() if i not in cs.lhs_indices}
                self.extra[-1] = extra
            for index, (lo, hi) in ranges.items():
                more = extra.get(index, [])
                self.assumed.append((k, index, (lo,) + tuple(b[0] for b in more), (hi,) + tuple(b[1] for b in more)))
            if shaping:
                lows = [ranges[i][0] for i in cs.lhs_indices]
                if any(linear(lo) != {1: 0} and linear(lo) != {} for lo in lows):
                    raise UnsupportedError(f"{self.where(k)}'{stmt.tensor}' starts at a non-zero index; its "
                                           "gradient is not supported", stmt.span,
                                           hint="write it with indices counting from 0")
                self.shapes[stmt.tensor] = tuple(ranges[i][1] for i in cs.lhs_indices)

    def solve_ranges(self, k: int, cs, ranges: dict, reads: list) -> dict:
        """TC's range inference on symbolic sizes, in rounds: an index that is alone in an affine argument
        ``c*i + g`` (every other index of ``g`` has a range) of a tensor of known extent ``E`` gets the values
        keeping ``0 <= c*i + g < E`` for every value of ``g`` (``h + kh`` in ``X(n, c, h + kh, w + kw)``: ``h
        in 0:H - KH + 1``); of several such bounds on one side the tightest where they differ by a constant
        (``A(i)`` and ``A(i + 1)``: ``i in 0:N - 1``); bounds that cannot be compared (``A(i)`` and
        ``B(i)`` of extents ``N`` and ``M``) are all kept: the first is the range, the others are returned
        (index → ``[(lo, hi)]``) and become guards of the gradient's statements. The call checks the result
        against range inference on the concrete sizes. Guards are not looked at (a padded read under ``?:`` narrows here
        where TC's rule would not: the check refuses such a def, which a where clause settles)."""
        indices = set(cs.indices)
        extra: dict = {}
        while True:
            solved = {}
            for index in cs.indices:
                if index in ranges:
                    continue
                lows, highs = [], []
                for r in reads:
                    extents = self.shapes.get(r.tensor)
                    if extents is None or len(extents) != len(r.args):
                        continue
                    for arg, extent in zip(r.args, extents):
                        terms = linear(arg)
                        if terms is None or not terms.get(index) or linear(extent) is None or any(
                                n in indices and n != index and n not in ranges for n in terms if n != 1):
                            continue
                        lo, hi = _bounds(terms, index, linear(extent), ranges, indices)
                        if lo is not None and hi is not None:
                            lows.append(lo)
                            highs.append(hi)
                if highs:
                    lo, hi = _tightest(lows, max), _tightest(highs, min)
                    solved[index] = (lo, hi)
                    more = [(a, b) for a, b in zip(lows, highs) if not (_looser(a, lo, max) and _looser(b, hi, min))]
                    if more:
                        extra[index] = more
            if not solved:
                break
            ranges.update(solved)
        for index in cs.indices:
            if index not in ranges:
                raise UnsupportedError(f"{self.where(k)}cannot tell the range of index '{index}' on symbolic "
                                       "sizes", cs.stmt.span,
                                       hint=f"give it a where clause, e.g. 'where {index} in 0:N'")
        return extra

    def sizes_only(self, e):
        """``e`` with each dimension specifier ``T.k`` replaced by the extent it names."""
        if isinstance(e, A.Ident) and e.kind == "size" and "." in e.name:
            tensor, _, k = e.name.partition(".")
            return self.shapes[tensor][int(k)]
        kids = A.children(e)
        return A.with_children(e, tuple(self.sizes_only(c) for c in kids)) if kids else e

    def flows(self):
        """Per statement: the keys of the reads its written value depends on (a nonzero derivative) and the
        statement's writers check (only one writer, or '=' / '+=!' first then '+=')."""
        writers: dict = {}
        for k, cs in enumerate(self.checked.statements):
            writers.setdefault(cs.stmt.tensor, []).append(k)
        for tensor, ks in writers.items():
            ops = [self.checked.statements[k].stmt.op for k in ks]
            if len(ks) > 1 and not (ops[0] in ("=", "+=!", "+=") and all(op == "+=" for op in ops[1:])):
                raise UnsupportedError(f"{self.where(ks[1])}'{tensor}' is written by several statements "
                                       f"({', '.join(ops)}); its gradient is supported for one statement, or "
                                       "for '=' (or '+=!') followed by '+=' updates",
                                       self.checked.statements[ks[1]].stmt.span,
                                       hint="write the parts to separate temporaries and combine them")
            if len(ks) == 1 and ops[0] == "*=":
                raise UnsupportedError(f"{self.where(ks[0])}'*=' multiplies onto zeros; its gradient is 0",
                                       self.checked.statements[ks[0]].stmt.span, hint="write '*=!'")
        edges = []
        for k, cs in enumerate(self.checked.statements):
            where = self.where(k)
            keys = [key for key in float_reads(cs.stmt.rhs) if derivative(cs.stmt.rhs, key, where) is not None]
            edges.append(({key[0] for key in keys}, keys))
        return [(reads, keys) for reads, keys in edges]

    def active(self, edges) -> set:
        """The tensors (and 0-d inputs) that depend on a wrt input and influence an output."""
        varied = set(self.wrt)
        for k, cs in enumerate(self.checked.statements):
            if edges[k][0] & varied:
                varied.add(cs.stmt.tensor)
        useful = {t.name for t in self.checked.outputs}
        for k in reversed(range(len(self.checked.statements))):
            if self.checked.statements[k].stmt.tensor in useful:
                useful |= edges[k][0]
        return varied & useful

    def seed_dims(self, out: str, seed: str):
        dims = []
        for k, e in enumerate(self.shapes[out]):
            if isinstance(e, A.Const) and isinstance(e.value, int):
                dims.append(A.Dim(e.value))
            elif isinstance(e, A.Ident) and e.kind == "size" and "." not in e.name:
                dims.append(A.Dim(e.name))
            else:
                size = self.fresh(f"{seed}_{k}")
                self.seed_sizes[size] = (out, k)
                dims.append(A.Dim(size))
        return tuple(dims)

    # -- emitting statements --
    def copy_seed(self, total: str, seed: str, out: str):
        """``total(i..) = seed(i..)`` over the output's shape: the start of an output's adjoint that later
        statements read too."""
        names = [self.fresh(f"i{p}") for p in range(len(self.shapes[out]))]
        rhs = A.Access(seed, tuple(index_var(n) for n in names))
        clauses = tuple(A.RangeClause(n, A.Const(0), e) for n, e in zip(names, self.shapes[out]))
        self.statements.append(A.Statement(total, tuple(A.IndexVar(n) for n in names), "=", rhs, clauses))
        self.started.add(total)

    def emit(self, tensor: str, indices, ranges: dict, rhs, guard=None, first: str = "+=!"):
        """Append ``tensor(indices) op guard ? rhs : 0 where ranges``; ``op`` is ``first`` ('+=!', or '=' for
        a write with no reduction indices over the whole tensor) for the first write of an adjoint, '+='
        after."""
        op = "+=" if tensor in self.started else first
        self.started.add(tensor)
        if guard is not None:
            if isinstance(rhs, A.Select) and is_lit(rhs.other, 0.0) and \
                    not any(isinstance(x, A.Access) for x in A.walk(rhs.cond)):
                guard, rhs = and_(guard, rhs.cond), rhs.then  # (reads in a condition are not guarded by it)
            guard = without_implied(guard, ranges)
            rhs = rhs if guard is None else A.Select(guard, rhs, ZERO)
        clauses = tuple(A.RangeClause(i, lo, hi) for i, (lo, hi) in ranges.items())
        self.statements.append(A.Statement(tensor, tuple(A.IndexVar(i) for i in indices), op, rhs, clauses))

    def zero(self, g: str, tensor: str):
        names = [self.fresh(f"i{p}") for p in range(len(self.shapes[tensor]))]
        clauses = tuple(A.RangeClause(n, A.Const(0), e) for n, e in zip(names, self.shapes[tensor]))
        self.statements.append(A.Statement(g, tuple(A.IndexVar(n) for n in names), "=", ZERO, clauses))
        self.started.add(g)

    def backward(self, k: int, keys):
        """The contributions of statement ``k`` to the adjoints of the reads ``keys``."""
        cs = self.checked.statements[k]
        stmt = cs.stmt
        where = self.where(k)
        seed = A.Access(self.adjoint[stmt.tensor], tuple(index_var(i) for i in cs.lhs_indices))
        lhs_value = A.Access(stmt.tensor, tuple(index_var(i) for i in cs.lhs_indices))
        op = stmt.reduction_op
        factor = seed
        if op in ("max=", "min="):
            ties = self.fresh(f"{stmt.tensor}_ties")
            hit = _equal(stmt.rhs, lhs_value, self.checked.tensor(stmt.tensor).dtype)
            self.statements.append(A.Statement(ties, tuple(A.IndexVar(i) for i in cs.lhs_indices), "+=!",
                                               self.guarded(k, A.Select(hit, lit(1.0), ZERO)), self.clauses(k)))
            factor = A.Select(hit, div(seed, A.Access(ties, lhs_value.args)), ZERO)
        elif op == "*=":
            nonzero = self.fresh(f"{stmt.tensor}_nonzero")
            zeros = self.fresh(f"{stmt.tensor}_zeros")
            is_zero = cmp("==", stmt.rhs, ZERO)
            lhs = tuple(A.IndexVar(i) for i in cs.lhs_indices)
            self.statements.append(A.Statement(nonzero, lhs, "*=!", self.guarded(
                k, A.Select(is_zero, lit(1.0), stmt.rhs), lit(1.0)), self.clauses(k)))
            self.statements.append(A.Statement(zeros, lhs, "+=!", self.guarded(
                k, A.Select(is_zero, lit(1.0), ZERO)), self.clauses(k)))
            p = A.Access(nonzero, lhs_value.args)
            z = A.Access(zeros, lhs_value.args)
            others = A.Select(cmp("==", z, ZERO), div(p, stmt.rhs),
                              A.Select(and_(is_zero, cmp("==", z, lit(1.0))), p, ZERO))
            factor = mul(seed, others)
        for key in keys:
            partial = derivative(stmt.rhs, key, where)
            self.contribute(k, key, mul(factor, partial))

    def extra_guards(self, k) -> list:
        """``lo <= i < hi`` for each bound of statement ``k``'s indices beyond their ranges."""
        return [cmp(op, index_var(i), b) for i, more in self.extra[k].items() for lo, hi in more
                for op, b in ((">=", lo), ("<", hi))]

    def guarded(self, k, rhs, identity=ZERO):
        """``rhs`` under statement ``k``'s extra bounds (:meth:`extra_guards`), ``identity`` outside them."""
        guard = None
        for g in self.extra_guards(k):
            guard = and_(guard, g)
        return rhs if guard is None else A.Select(guard, rhs, identity)

    def clauses(self, k):
        return tuple(A.RangeClause(i, lo, hi) for i, (lo, hi) in self.ranges[k].items())

    def contribute(self, k: int, key, value):
        """``dA(f(I)) += value(I)`` for the read ``A(f(I))`` (``key``) of statement ``k``, with its arguments
        solved for pivot indices (module docstring)."""
        cs = self.checked.statements[k]
        tensor, args = key
        if tensor not in self.adjoint:
            self.adjoint[tensor] = self.fresh(f"d{tensor}")
            self.shapes[self.adjoint[tensor]] = self.shapes[tensor]
        target = self.adjoint[tensor]
        extents = self.shapes.get(tensor, ())
        ranges = self.ranges[k]
        lhs_of_stmt = set(cs.lhs_indices)
        sigma: dict = {}       # eliminated forward index → expression of the remaining ones
        new_names: list = []   # the gradient's left-hand indices (placeholders until renamed)
        guards: list = []      # conditions on forward indices (sigma applies at the end)
        keep_range: dict = {}  # index → (lo, hi) of the gradient statement
        pivot_of: dict = {}    # placeholder → the pivot index solved for it
        placeholder = 0
        guards += self.extra_guards(k)
        for p, arg in enumerate(args):
            e = substitute(arg, sigma) if sigma else arg
            terms = linear(e)
            if isinstance(e, A.Ident) and e.kind == "index" and e.name in ranges and e.name not in new_names:
                new_names.append(e.name)
                lo, hi = ranges[e.name]
                if linear(lo) not in ({1: 0}, {}) or linear(hi) != linear(extents[p]):
                    guards += [cmp(">=", index_var(e.name), lo), cmp("<", index_var(e.name), hi)]
                keep_range[e.name] = (A.Const(0), extents[p])
                continue
            slot = f"@{placeholder}"
            placeholder += 1
            new_names.append(slot)
            keep_range[slot] = (A.Const(0), extents[p])
            candidates = [] if terms is None else \
                [v for v, c in terms.items() if v != 1 and c and v in ranges and v not in new_names
                 and v not in sigma]
            if not candidates:
                guards.append(cmp("==", index_var(slot), e))
                continue
            v = min(candidates, key=lambda x: (x not in lhs_of_stmt, abs(terms[x]) != 1, cs.indices.index(x)))
            c = terms[v]
            rest = {x: -y for x, y in terms.items() if x != v}
            rest[slot] = 1
            kinds = {x.name: x.kind for x in A.walk(e) if isinstance(x, A.Ident)}
            kinds[slot] = "index"
            numerator = from_linear(rest if c > 0 else {x: -y for x, y in rest.items()}, kinds)
            if abs(c) == 1:
                value_of_v = numerator
            else:
                value_of_v = A.Binary("/", numerator, A.Const(abs(c)))
                guards.append(cmp("==", A.Binary("%", numerator, A.Const(abs(c))), A.Const(0)))
            lo, hi = ranges[v]
            guards += [cmp(">=", index_var(v), lo), cmp("<", index_var(v), hi)]
            sigma = {x: substitute(y, {v: value_of_v}) for x, y in sigma.items()}
            sigma[v] = value_of_v
            pivot_of[slot] = v
        for i in cs.indices:
            if i not in sigma and i not in keep_range:
                keep_range[i] = ranges[i]
        # final names: a pivot's gradient index takes the pivot's name, others a fresh one
        rename = {slot: pivot_of.get(slot) or self.fresh("i") for slot in new_names if slot.startswith("@")}
        sigma = {v: substitute(e, {s: index_var(n) for s, n in rename.items()}) for v, e in sigma.items()}
        for s, n in rename.items():
            sigma.setdefault(s, index_var(n))
        guard = None
        for g in guards:
            g = substitute(g, sigma)
            if not trivial(g):
                guard = and_(guard, g)
        value = substitute(value, sigma)
        indices = [rename.get(n, n) for n in new_names]
        ranges_out = {rename.get(i, i): r for i, r in keep_range.items()}
        ordered = {i: ranges_out[i] for i in indices}
        ordered.update({i: r for i, r in ranges_out.items() if i not in ordered})
        if value is not None:
            self.emit_contraction(k, target, indices, ordered, value, guard)

    # -- the layout of a contraction --
    def windows(self, k: int) -> set:
        """The window indices of forward statement ``k``: reduction indices that an argument adds to one of its
        left-hand indices (``kw`` in ``X(n, c, h + kh, w + kw)``): few values, poor vector loops."""
        cs = self.checked.statements[k]
        found = set()
        for x in A.walk(cs.stmt.rhs):
            if isinstance(x, A.Access):
                for arg in x.args:
                    terms = linear(arg) or {}
                    if any(i in terms for i in cs.lhs_indices):
                        found |= {i for i in cs.reduction_indices if i in terms}
        return found

    def emit_contraction(self, k: int, target: str, indices: list, ranges: dict, value, guard):
        """Emit a gradient statement in a layout its vector loop suits. The CPU strategy register-tiles a
        contraction (a statement with reduction indices) like a GEMM along its vector index ``v``, the write's
        innermost index, when every read has ``v`` as its last, stride-1 argument or lacks it -- or, for one
        read of a tensor with plain indices, after packing that read transposed
        (:func:`polyc.poly.strategy.choose_members`). When the written tensor's last index is a poor ``v`` (a
        window index of a convolution's weight gradient, ``kw``: 3 values; or one that some read has in a
        compound argument that cannot be packed), the sum goes to a copy of the adjoint whose last index is
        the best left-hand index -- windows last, fewest reads in the way, then the write's own last index --
        and is transposed back into it afterwards (one pass over the adjoint, against the contraction's pass
        per reused element)."""
        reductions = [i for i in ranges if i not in indices]
        if not reductions or not indices:
            return self.emit(target, indices, ranges, value, guard)
        reads = [x for x in A.walk(value) if isinstance(x, A.Access) and x.tensor in self.shapes]
        windows = self.windows(k)

        def cost(v):
            bad = moves = 0
            for read in reads:
                terms = [linear(a) for a in read.args]
                dims = [p for p, t in enumerate(terms) if t is None or v in t]
                if not dims:
                    continue
                last = len(read.args) - 1
                if dims == [last] and terms[last] is not None and abs(terms[last][v]) == 1:
                    continue
                plain = all(isinstance(a, A.Ident) or (isinstance(a, A.Const) and type(a.value) is int)
                            for a in read.args)
                if plain and len(dims) == 1:
                    moves += 1
                else:
                    bad += 1
            return bad + max(0, moves - 1), moves

        candidates = [v for v in indices if v not in windows] or list(indices)
        best = min(candidates, key=lambda v: (cost(v), v != indices[-1], -indices.index(v)))
        if best == indices[-1] or cost(best) >= cost(indices[-1]) and indices[-1] not in windows:
            return self.emit(target, indices, ranges, value, guard)
        order = [i for i in indices if i != best] + [best]
        partial = self.fresh(f"{target}_t")
        self.shapes[partial] = tuple(ranges[i][1] for i in order)
        self.emit(partial, order, {i: ranges[i] for i in order} | ranges, value, guard)
        self.emit(target, indices, {i: ranges[i] for i in indices},
                  A.Access(partial, tuple(index_var(i) for i in order)), first="=")

    def recompute(self) -> list:
        """The forward statements whose tensors the backward statements read (and what those read), in order;
        an output's first '+=' becomes '+=!' (it is a temporary here, and temporaries start with a set)."""
        needed = set()
        for s in self.statements:
            for x in A.walk(s.rhs):
                if isinstance(x, A.Access):
                    needed.add(x.tensor)
        forward = {cs.stmt.tensor for cs in self.checked.statements}
        keep = [False] * len(self.checked.statements)
        for k in reversed(range(len(self.checked.statements))):
            cs = self.checked.statements[k]
            if cs.stmt.tensor in needed:
                keep[k] = True
                for x in A.walk(cs.stmt.rhs):
                    if isinstance(x, A.Access) and x.tensor in forward:
                        needed.add(x.tensor)
        out, seen = [], set()
        for k, cs in enumerate(self.checked.statements):
            if not keep[k]:
                continue
            stmt = cs.stmt
            op = stmt.op
            if stmt.tensor not in seen and op in ("+=", "max=", "min="):
                if op != "+=":
                    raise UnsupportedError(f"{self.where(k)}'{op}' starts from zeros; the gradient needs "
                                           f"'{op}!'", stmt.span, hint=f"write '{op}!'")
                op = "+=!"
            seen.add(stmt.tensor)
            where = tuple(c for c in stmt.where if not isinstance(c, A.LetClause))
            out.append(A.Statement(stmt.tensor, stmt.indices, op, stmt.rhs, where))
        return out


def _bounds(terms: dict, index: str, extent: dict, ranges: dict, indices: set):
    """``(lo, hi)`` expressions of the values of ``index`` keeping the affine argument ``terms`` (a
    :func:`linear` form) in ``[0, extent)`` for every value of its other indices (in ``ranges``); None for a
    side this cannot write (a coefficient above 1 with a bound that is not a constant)."""
    c = terms[index]
    low, high = {1: terms.get(1, 0)}, {1: terms.get(1, 0)}  # min and max of g = terms - c*index
    for name, a in terms.items():
        if name == 1 or name == index:
            continue
        if name not in indices:  # a size
            low[name] = low.get(name, 0) + a
            high[name] = high.get(name, 0) + a
            continue
        first, last = linear(ranges[name][0]), linear(ranges[name][1])
        if first is None or last is None:
            return None, None
        last = _plus(last, {1: -1})
        for side, pick in ((low, first if a > 0 else last), (high, last if a > 0 else first)):
            for key, v in pick.items():
                side[key] = side.get(key, 0) + a * v
    if c > 0:  # c*i >= -min(g), c*i <= E - 1 - max(g)
        lo_num, hi_num = _scale(low, -1), _plus(extent, _scale(high, -1), {1: -1})
    else:      # |c|*i <= min(g), |c|*i >= max(g) - E + 1
        lo_num, hi_num = _plus(high, _scale(extent, -1), {1: 1}), low
    m = abs(c)
    sizes = {k: "size" for k in _plus(lo_num, hi_num) if k != 1}
    if m == 1:
        return from_linear(lo_num, sizes), from_linear(_plus(hi_num, {1: 1}), sizes)
    lo = from_linear({1: -(-lo_num.get(1, 0) // m)}, {}) if set(k for k, v in lo_num.items() if v) <= {1} else None
    hi = A.Binary("+", A.Binary("/", from_linear(hi_num, sizes), A.Const(m)), A.Const(1))
    return lo, hi


def _plus(*forms) -> dict:
    out: dict = {}
    for f in forms:
        for k, v in f.items():
            out[k] = out.get(k, 0) + v
    return out


def _scale(form: dict, a: int) -> dict:
    return {k: a * v for k, v in form.items()}


def _looser(bound, chosen, pick) -> bool:
    """Whether ``bound`` is the same as ``chosen`` or looser than it by a constant (``pick`` max for a lower
    bound, min for an upper one): a constraint ``chosen`` already implies."""
    x, y = linear(chosen), linear(bound)
    if x is None or y is None:
        return bound == chosen
    diff = _plus(y, _scale(x, -1))
    return all(v == 0 for k, v in diff.items() if k != 1) and pick(0, diff.get(1, 0)) == 0


def _tightest(bounds: list, pick):
    """The bound of ``bounds`` that ``pick`` (min or max) chooses among those differing from the first by a
    constant; the first when they cannot be compared."""
    best = bounds[0]
    for b in bounds[1:]:
        x, y = linear(best), linear(b)
        if x is not None and y is not None:
            diff = _plus(y, _scale(x, -1))
            if all(v == 0 for k, v in diff.items() if k != 1) and pick(0, diff.get(1, 0)) != 0:
                best = b
    return best


#: Relative tolerance of "a term equals the max/min" when the term is computed (not just read): the
#: gradient def computes the term again, in another statement that the strategy may vectorize differently
#: (libmvec against libm, FMA contraction), so it may differ from the forward's in the last bits.
TIE_TOLERANCE = {"float32": 8 * 2.0 ** -23, "float64": 8 * 2.0 ** -52}


def _exact(e) -> bool:
    """Whether ``e`` evaluates to the same bits wherever it is computed: reads, literals, ``?:``, negation
    and casts of those (no rounding arithmetic, no builtin)."""
    if isinstance(e, A.Select):
        return _exact(e.then) and _exact(e.other)
    if isinstance(e, (A.Unary, A.Cast)):
        return (e.op == "-" if isinstance(e, A.Unary) else True) and _exact(e.operand)
    return isinstance(e, (A.Access, A.Const, A.Ident))


def _equal(term, result, dtype: str):
    """``term == result``, or within :data:`TIE_TOLERANCE` of ``result`` when ``term`` is computed."""
    if _exact(term):
        return cmp("==", term, result)
    return cmp("<=", A.Call("fabs", (A.Binary("-", term, result),)),
               A.Binary("*", lit(TIE_TOLERANCE.get(dtype, TIE_TOLERANCE["float32"])), A.Call("fabs", (result,))))
