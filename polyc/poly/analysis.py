"""Analysis as data: statement instances, FLOPs and memory footprint of a Scop, counted by isl.

Every function here is a pure function of a :class:`~polyc.poly.scop.Scop` of concrete sizes (its domains
and access relations have no parameters), so every count is an exact integer:

- :func:`instances`: per statement, the points of its iteration domain (``isl_set_count_val``);
- :func:`flops` and :func:`int_ops`: the operations of one run, per statement its instances times the
  operations of one instance (:func:`statement_ops`, the counting rules below);
- :func:`footprint`: per tensor, the distinct elements its access relations touch over the domains (the
  union of ``isl_set_apply`` images, counted with ``isl_set_count_val``) times the element size.

Counting rules (:func:`value_ops`, one evaluation of a statement's right-hand side):

- ``+ - * / %`` and unary ``-``: one operation each; a FLOP when the operation's result is floating point
  (float16, bfloat16, float32, float64), else an integer operation (``int_ops``). So a multiply-add
  ``a * b + c`` is 2 FLOPs, the usual convention of GFLOP/s figures;
- a builtin call (``exp``, ``tanh``, ``sqrt``, ``fmax``, ...): one operation, ``fma`` two; FLOP or integer
  operation by its result type as above;
- comparisons (``< <= > >= == !=``) and logic (``&& || !``): one integer operation each, never a FLOP (their
  result is ``bool``);
- a select ``c ? a : b`` itself and a cast: none. Both branches count (the generated code computes both and
  selects; a branch that only reads, like the ``0.0`` of a padding guard, adds nothing);
- accesses, constants, indices and sizes: none; the index arithmetic inside an access's arguments (address
  computation) counts none, even when the index is data-dependent (``A(B(i) + 1)``); an operation whose
  operands are all literals and sizes (the ``-`` of ``-1.0``, ``2 * N``) is folded at compile time: none;
- a subexpression that occurs more than once in one right-hand side (structurally equal: the same operators
  on the same reads) counts once: a ``where x = e`` binding, which sema substitutes into every use, is
  computed once, as the generated code does after LLVM's common-subexpression elimination.

A statement instance adds to its right-hand side's operations one for the update of a reduction (``+=``,
``*=``, ``max=``, ``min=``: a FLOP when the written tensor is floating point); an ``"init"`` statement (the
identity a ``+=!`` starts from) and a copy (``=`` of a read, e.g. promotion's packing) do none.
"""
from __future__ import annotations

from dataclasses import dataclass

import islpy as isl

from ..lang import ast as L
from .affine import children, isl_name
from .scop import PolyStatement, Scop

#: The floating-point dtypes: an operation whose result has one of them is a FLOP.
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64"})

#: Reduction operators: the update counts one operation per instance.
REDUCTION_OPS = frozenset({"+=", "*=", "max=", "min="})

_ARITHMETIC = frozenset({"+", "-", "*", "/", "%"})
_COMPARISON = frozenset({"<", "<=", ">", ">=", "==", "!=", "&&", "||"})


def instances(scop: Scop) -> dict[str, int]:
    """Statement name → the number of points of its iteration domain (``isl_set_count_val``), in statement
    order. The domains are parameter-free, so each count is an exact integer; an empty domain counts 0."""
    return {s.name: _count(s.domain) for s in scop.statements}


def value_ops(expr: L.Expr) -> tuple[int, int]:
    """``(flops, int_ops)`` of one evaluation of the typed expression ``expr``, by the rules of this module's
    docstring (each distinct subexpression once; select, casts and index arithmetic free)."""
    seen: dict = {}  # subexpression → whether it is a compile-time constant
    flops = ints = 0

    def visit(e) -> bool:
        """Count ``e``'s operations unless seen; whether ``e`` is a constant (literals and sizes only)."""
        nonlocal flops, ints
        if isinstance(e, L.Const):
            return True
        if isinstance(e, L.Ident):
            return e.kind == "size"
        if isinstance(e, L.Access):  # address arithmetic inside an access is not counted
            return False
        if e in seen:
            return seen[e]
        constant = all([visit(c) for c in children(e)])
        n = 0 if constant else _own_ops(e)  # an operation on constants is folded: -1.0, 2 * N
        if e.dtype in FLOAT_DTYPES:  # a comparison's result is bool: never a FLOP
            flops += n
        else:
            ints += n
        seen[e] = constant
        return constant

    visit(expr)
    return flops, ints


def statement_ops(stmt: PolyStatement, scop: Scop) -> tuple[int, int]:
    """``(flops, int_ops)`` of one instance of ``stmt``: its right-hand side's :func:`value_ops` plus one for
    a reduction's update (a FLOP when ``stmt``'s tensor is floating point); ``(0, 0)`` for an ``"init"``."""
    if stmt.op == "init":
        return 0, 0
    flops, ints = value_ops(stmt.rhs)
    if stmt.op in REDUCTION_OPS:
        if scop.tensor(stmt.tensor).dtype in FLOAT_DTYPES:
            flops += 1
        else:
            ints += 1
    return flops, ints


def flops(scop: Scop) -> int:
    """Floating-point operations (FLOP) of one run of ``scop``: the sum over statements of
    :func:`instances` × the FLOPs of one instance (:func:`statement_ops`). A statement computing only
    integers or booleans contributes 0 (its operations are in :func:`int_ops`)."""
    counts = instances(scop)
    return sum(counts[s.name] * statement_ops(s, scop)[0] for s in scop.statements)


def int_ops(scop: Scop) -> int:
    """Integer and boolean operations of one run of ``scop`` (arithmetic on integers, comparisons, logic,
    integer reductions; not the address arithmetic of accesses): instances × :func:`statement_ops`'s second
    count, summed over statements."""
    counts = instances(scop)
    return sum(counts[s.name] * statement_ops(s, scop)[1] for s in scop.statements)


@dataclass(frozen=True)
class Footprint:
    """The memory a run of a Scop touches, in bytes.

    - ``elements``: tensor name → distinct elements accessed (read or written) over the whole run; a tensor
      no statement touches is absent;
    - ``tensors``: tensor name → those elements × the element size (bytes, ``polyc.lang.ast.itemsize``);
    - ``total_bytes``: the sum of ``tensors`` (inputs, outputs, temporaries and local buffers);
    - ``traffic``: the compulsory memory traffic (bytes) of the roofline model: every touched element of an
      input or output moves once; temporaries and promotion's local buffers are assumed to stay in cache.

    (A record rather than a dict with extra keys: a tensor may be called ``total_bytes``.)
    """

    elements: dict
    tensors: dict
    total_bytes: int
    traffic: int


def accessed(scop: Scop) -> dict[str, isl.Set]:
    """Tensor name → the set of its elements some statement reads or writes: the union over statements of
    ``isl_set_apply(domain, access)`` for the write and every read (``{ A[i0, i1] : ... }``). Reads under a
    ``?:`` guard carry the guard's affine condition (padding is not counted as read); a data-dependent read
    (``A(B(i))``) covers its whole dimension, so the set is then an upper bound."""
    by_isl_name = {isl_name(t.name): t.name for t in scop.tensors}
    out: dict[str, isl.Set] = {}
    for s in scop.statements:
        maps: list = []
        isl.UnionMap.from_map(s.write).union(s.reads).foreach_map(maps.append)
        for m in maps:
            name = by_isl_name[m.get_tuple_name(isl.dim_type.out)]
            image = s.domain.apply(m)
            out[name] = image if name not in out else out[name].union(image)
    return {t.name: out[t.name].coalesce() for t in scop.tensors if t.name in out}


def footprint(scop: Scop) -> Footprint:
    """The :class:`Footprint` of ``scop``: per tensor the number of distinct elements in :func:`accessed`
    (``isl_set_count_val``) × its element size in bytes, their total, and the compulsory traffic (bytes of
    the inputs' and outputs' touched elements)."""
    elements = {name: _count(touched) for name, touched in accessed(scop).items()}
    nbytes = {name: n * L.itemsize(scop.tensor(name).dtype) for name, n in elements.items()}
    traffic = sum(b for name, b in nbytes.items() if scop.tensor(name).role in ("input", "output"))
    return Footprint(elements, nbytes, sum(nbytes.values()), traffic)


def _own_ops(e: L.Expr) -> int:
    """Operations of node ``e`` itself (not its children)."""
    if isinstance(e, L.Unary):
        return 1
    if isinstance(e, L.Binary):
        return 1 if e.op in _ARITHMETIC or e.op in _COMPARISON else 0
    if isinstance(e, L.Call):
        return 2 if e.func == "fma" else 1
    return 0  # Select, Cast


def _count(s: isl.Set) -> int:
    """The number of points of the parameter-free set ``s`` (``isl_set_count_val``)."""
    return int(s.count_val().to_python())
