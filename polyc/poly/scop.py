"""The Scop: a checked def specialised on sizes, as iteration domains and access relations (isl).

Built by :func:`build_scop` from a :class:`~polyc.lang.ast.CheckedDef` and concrete sizes. Sizes are
specialised: every set and map below is parameter-free (``{ S1[m, n, k] : 0 <= m < 64 and ... }``).

A statement ``C(m,n) +=! A(m,k) * B(k,n)`` becomes two statements:

- ``S0`` (op ``"init"``): ``{ S0[m, n] : 0 <= m < M and 0 <= n < N }`` writes ``{ S0[m, n] -> C[m, n] }`` with
  the reduction's identity (:func:`identity_value`; ``rhs`` is a typed :class:`~polyc.lang.ast.Const`);
- ``S1`` (op ``"+="``): ``{ S1[m, n, k] : ... }`` writes ``{ S1[m, n, k] -> C[m, n] }`` and reads
  ``{ S1[m, n, k] -> C[m, n]; S1[m, n, k] -> A[m, k]; S1[m, n, k] -> B[k, n] }``.

Codegen contract: ``Scop.tensors`` is the order of the kernel's pointer arguments; a statement's domain
dimensions are ``PolyStatement.indices`` (the lhs indices then the reduction indices) and the isl AST calls
``S1(e_m, e_n, e_k)`` with one expression per index in that order; ``PolyStatement.rhs`` is the typed lang
expression to evaluate with those index values.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl
import numpy as np

from ..lang import ast as L
from .affine import fixed_parameters, isl_name


#: The identity of each reduction operator, by dtype kind (float / signed int / unsigned int / bool).
_IDENTITY = {"+=": 0, "*=": 1}


def identity_value(op: str, dtype: str):
    """The identity element of reduction ``op`` (``+=``, ``*=``, ``max=``, ``min=``) for ``dtype``."""
    if op in _IDENTITY:
        return float(_IDENTITY[op]) if dtype.startswith("float") else _IDENTITY[op]
    if dtype.startswith("float"):
        return float("-inf") if op == "max=" else float("inf")
    if dtype == "bool":
        return op == "min="
    info = np.iinfo(dtype)
    return int(info.min) if op == "max=" else int(info.max)


@dataclass(frozen=True, eq=False)
class Tensor:
    """A tensor of the kernel: ``shape`` in elements (C-contiguous), ``role`` input/output/temp (``local``:
    a buffer the kernel allocates, :mod:`polyc.poly.promote`). ``packed``: for an input the caller hands over
    already in panel-major layout (a constant packed once, :func:`~polyc.poly.promote.promote`), the panel
    width; ``shape`` is then the packed shape. 0 for every other tensor. ``origin``: the logical index of the
    first element per dimension of a tensor whose shape range inference gave from a first write starting away
    from 0 (TC's semantics); ``()`` when it is 0 everywhere. Storage is 0-based: the Scop's statements already
    subtract it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    packed: int = 0
    origin: tuple[int, ...] = ()
    #: in a generic kernel, the shape in the sizes (:class:`~polyc.poly.affine.Sym` or int per dimension;
    #: ``shape`` is then its value at the hint sizes); ``()`` in a specialised one
    extents: tuple = ()
    #: with ``packed``: the order of the packed layout's middle dimensions (:func:`~polyc.poly.promote.packed_array`)
    packed_order: tuple = ()

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True, eq=False)
class PolyStatement:
    """One statement instance set with its accesses.

    ``op`` is ``"init"`` (store ``rhs``, the identity), ``"="``, ``"+="``, ``"*="``, ``"max="`` or ``"min="``
    (combine the current value of ``tensor[lhs]`` with ``rhs``).
    ``safe_reads`` lets codegen read unconditionally what a guard does not need to protect: in
    ``cond ? X(h+kh-1) * F(m,kh) : 0`` only ``X`` can leave its tensor where ``cond`` is false.
    """

    name: str
    indices: tuple[str, ...]
    domain: isl.Set
    tensor: str
    lhs: tuple[str, ...]
    op: str
    rhs: L.Expr
    write: isl.Map
    reads: isl.UnionMap
    span: object = None
    #: reads of ``rhs`` (the Access nodes themselves) that stay inside their tensor over the whole domain,
    #: whatever the ``?:`` guards above them say: codegen loads them without a mask
    safe_reads: frozenset = frozenset()

    @property
    def reduction_indices(self) -> tuple[str, ...]:
        """The indices of ``indices`` that are not on the left-hand side (the reduction's), in order."""
        return tuple(i for i in self.indices if i not in self.lhs)


@dataclass(frozen=True, eq=False)
class Scop:
    """The polyhedral model of one specialised def.

    - ``tensors``: inputs, outputs, temporaries — the kernel's argument order;
    - ``statements``: in source order (the identity schedule is this order);
    - ``sizes``: size name → extent;
    - ``ranges``: ``(statement name, index) → (lo, hi)`` as inferred (hi exclusive);
    - ``preconditions``: constraints range inference could not prove and did not check, as text;
    - ``params``: a generic kernel's sizes that are isl parameters of its sets and maps (``sizes`` holds
      their hint values, what the strategy decides with), ``()`` when specialised; ``context``: the
      parameter values it serves (:func:`~polyc.poly.affine.size_context`).
    """

    name: str
    tensors: tuple[Tensor, ...]
    statements: tuple[PolyStatement, ...]
    sizes: dict
    ranges: dict = field(default_factory=dict)
    preconditions: tuple[str, ...] = ()
    source: str = ""
    params: tuple[str, ...] = ()
    context: isl.Set | None = None

    @property
    def prefix(self) -> str:
        """The parameter declaration isl text over this Scop starts with (``"[M, N] -> "``, or ``""``)."""
        return f"[{', '.join(isl_name(p) for p in self.params)}] -> " if self.params else ""

    def shapes_at(self, sizes: dict) -> dict[str, tuple[int, ...]] | None:
        """A generic kernel's tensor shapes at ``sizes`` (parameter → value): each extent, an int or an affine
        function of the parameters, evaluated by isl. None when ``sizes`` are outside :attr:`context`."""
        point = fixed_parameters(self.params, sizes)
        if self.context is not None and self.context.intersect(point).is_empty():
            return None

        def value(e) -> int:
            if type(e) is int:
                return e
            found = isl.Set(f"{self.prefix}{{ [x] : x = {e.text} }}").intersect_params(point)
            return int(found.sample_point().get_coordinate_val(isl.dim_type.set, 0).to_python())
        return {t.name: tuple(value(e) for e in (t.extents or t.shape)) for t in self.tensors}

    @property
    def hint(self) -> isl.Set | None:
        """The parameters fixed to their hint values (None when specialised)."""
        return fixed_parameters(self.params, self.sizes) if self.params else None

    def tensor(self, name: str) -> Tensor:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(name)

    @property
    def domain(self) -> isl.UnionSet:
        result = isl.UnionSet.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
        for s in self.statements:
            result = result.union(isl.UnionSet.from_set(s.domain))
        return result

    @property
    def writes(self) -> isl.UnionMap:
        result = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
        for s in self.statements:
            result = result.union(isl.UnionMap.from_map(s.write))
        return result

    @property
    def reads(self) -> isl.UnionMap:
        result = isl.UnionMap.empty(isl.Space.params_alloc(isl.DEFAULT_CONTEXT, 0))
        for s in self.statements:
            result = result.union(s.reads)
        return result

    def __str__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        lines = [f"scop {self.name}  " + (f"parameters: {', '.join(self.params)}  hint: {sizes}" if self.params
                                          else f"sizes: {sizes}")]
        for t in self.tensors:
            first = f"  (element 0 is {t.name}({', '.join(map(str, t.origin))}))" if t.origin else ""
            shape = "[" + ", ".join(map(repr, t.extents)) + "]" if t.extents else str(list(t.shape))
            lines.append(f"  {t.role:6} {t.dtype}{shape} {t.name}{first}")
        for s in self.statements:
            lines.append(f"  {s.name}: {s.tensor}({','.join(s.lhs)}) {s.op} ...")
            lines.append(f"    domain: {s.domain}")
            lines.append(f"    write:  {s.write}")
            lines.append(f"    reads:  {s.reads}")
        if self.ranges:
            lines.append("  inferred ranges:")
            by_name = {s.name: s for s in self.statements}
            for (stmt, index), (lo, hi) in self.ranges.items():
                s = by_name.get(stmt)
                origin = self.tensor(s.tensor).origin if s is not None else ()
                shift = origin[s.lhs.index(index)] if origin and index in s.lhs else 0
                stored = f"  (stored at {index} {'-' if shift > 0 else '+'} {abs(shift)})" if shift else ""
                lines.append(f"    {stmt}: {index} in {lo + shift}:{hi + shift}{stored}")
        for p in self.preconditions:
            lines.append(f"  unchecked precondition: {p}")
        return "\n".join(lines)
