"""Promotion (packing): copy a reused operand into a contiguous, panel-major local buffer before the kernel.

The CPU strategy decides what to pack (:class:`~polyc.poly.packing.Packing`, its step 6); :func:`promote`
carries it out on the Scop and the schedule tree, as PPCG and AKG do promotion, with a copy statement:

- a local tensor ``B__p0`` (role ``"local"``: codegen allocates it, it is not a kernel argument) and a copy
  statement ``P0`` that fills it: for GEMM's ``B(k, n)`` with panels of ``NR = 32`` columns,
  ``{ P0[nb, k, nl] : 0 <= k < K and 0 <= nl < 32 and 32 nb + nl < N }`` writes ``B__p0[nb, k, nl]`` and
  reads ``B[k, 32 nb + nl]`` (a convolution's filter ``W(c, kh, kw, m)`` becomes ``W__p0[mb, c, kh, kw, ml]``);
- the packed read rewritten: ``B(k, n)`` becomes ``B__p0(n / 32, k, n % 32)`` in the statement's expression
  and its access relation (``{ S1[m, n, k] -> B__p0[floor(n/32), k, n mod 32] }``); a transposed packing
  (``Packing.position``, the vector index in another dimension) moves that dimension: ``B(k, n)`` packed along
  ``k`` is ``B__p0(k / 32, n, k % 32)``, so the vector loop along ``k`` reads consecutive elements;
- the schedule: ``sequence(P0's band [nb, k, nl], the transformed tree)`` (``isl_schedule_sequence``), the
  copy's ``nl`` loop marked ``vector`` and its ``nb`` loop ``parallel`` like the kernel's.

The copy runs once per call, before everything else; the RAW dependence copy → compute is satisfied by the
sequence (the verifier checks it with the promoted Scop's own dependences).

An input whose values do not change between calls (a model's weights: ``constants``) is not copied at all
when the packed read is its only read: the kernel reads the argument itself in the packed layout (its
:class:`~polyc.poly.scop.Tensor` gets the packed shape and ``packed = block``), and the caller packs the
values once with :func:`packed_array` (what the native executor does with a model's constants).
"""
from __future__ import annotations

import dataclasses

import islpy as isl

from ..lang import ast as L
from ..options import Options
from .affine import affine_text, isl_name
from .scop import PolyStatement, Scop, Tensor
from .packing import Packing, sole_read
from .strategy import mark_parallel, runs_parallel
from .transforms import band_split, insert_mark


def promote(scop: Scop, schedule: isl.Schedule, packings: tuple[Packing, ...], target,
            options: Options, constants: frozenset = frozenset()) -> tuple[Scop, isl.Schedule]:
    """Carry out ``packings`` (from :func:`~polyc.poly.strategy.apply_strategy`): returns the promoted Scop (local
    tensors appended after the kernel's arguments, copy statements, rewritten reads) and the schedule with the
    copies in sequence before ``schedule``. A packed input named in ``constants`` that has no other read
    arrives packed instead (see the module docstring). Without packings both come back unchanged."""
    if not packings:
        return scop, schedule
    parallel = runs_parallel(scop, options, target)
    tensors, statements = list(scop.tensors), list(scop.statements)
    copies = []
    for k, packing in enumerate(packings):
        source = scop.tensor(packing.read.tensor)
        if source.name in constants and source.role == "input" \
                and sole_read(scop, packing.statement, packing.read) and not scop.params:
            position = packing.position % len(source.shape)
            order = packing.order
            if position != len(source.shape) - 1:  # packed along another dimension: packed_array's full order
                others = [d for d in range(len(source.shape)) if d != position]
                order = tuple(others[d] for d in order or range(len(others))) + (position,)
            packed = Tensor(source.name, source.dtype,
                            _packed_shape(source.shape, packing.block, position, packing.order), "input",
                            packing.block, packed_order=order)
            tensors = [packed if t.name == source.name else t for t in tensors]
            statements = [_rewrite(s, packing, packed, scop.sizes) if s.name == packing.statement else s
                          for s in statements]
            continue
        local, copy = _copy_statement(scop, packing, source, f"{source.name}__p{k}", f"P{k}")
        tensors.append(local)
        copies.append(copy)
        statements = [_rewrite(s, packing, local, scop.sizes) if s.name == packing.statement else s
                      for s in statements]
    promoted = dataclasses.replace(scop, tensors=tuple(tensors), statements=tuple(copies + statements))
    for copy in reversed(copies):
        schedule = _copy_schedule(copy, parallel, options).sequence(schedule)
    return promoted, schedule


def _packed_shape(shape: tuple, block: int, position: int = -1, order: tuple = ()) -> tuple:
    """The panel-major shape of a tensor of ``shape`` packed in panels of ``block`` along its dim ``position``
    (-1: the last): ``(ceil(shape[position] / block), the other extents, block)``, the other extents in
    their order or in ``order`` (:attr:`~polyc.poly.packing.Packing.order`)."""
    position %= len(shape)
    rest = tuple(e for d, e in enumerate(shape) if d != position)
    rest = tuple(rest[d] for d in order) if order else rest
    return (-(-shape[position] // block),) + rest + (block,)


def packed_array(array, block: int, order: tuple = ()):
    """``array`` (numpy, shape ``(a_1, ..., a_{p-1}, n)``) in the panel-major layout of a packed read:
    shape ``(ceil(n / block), a_1, ..., a_{p-1}, block)``, element ``[v // block, a..., v % block] =
    array[a..., v]``, the tail of the last panel zero; with ``order`` (a permutation of ``0 .. p-2``) the
    ``a`` dimensions come in that order: ``(ceil(n / block), a_order[0], ..., block)``. An ``order`` of all
    ``p`` dimensions packs along its last one instead (a read packed along a dimension other than the last:
    ``A(m, c)`` with ``order = (1, 0)`` becomes ``(ceil(m / block), c, block)``). C-contiguous, same dtype."""
    import numpy as np

    if len(order) == array.ndim:
        array = np.transpose(array, order)
    elif order:
        array = np.transpose(array, tuple(order) + (array.ndim - 1,))
    n = array.shape[-1]
    panels = -(-n // block)
    padded = np.zeros(array.shape[:-1] + (panels * block,), dtype=array.dtype)
    padded[..., :n] = array
    return np.ascontiguousarray(np.moveaxis(padded.reshape(array.shape[:-1] + (panels, block)), -2, 0))


def _copy_statement(scop: Scop, packing: Packing, source: Tensor, name: str, stmt_name: str):
    """The local tensor and the copy statement of ``packing`` (see the module docstring); a packing along a
    dimension other than the last (``packing.position``) copies the read transposed."""
    nr = packing.block
    position = packing.position % len(source.shape)
    extents = source.extents or source.shape  # a generic kernel's: in the sizes (Sym)
    shape = _packed_shape(extents, nr, position, packing.order)
    n = extents[position]
    local = Tensor(name, source.dtype, tuple(int(e) for e in shape), "local",
                   extents=shape if source.extents else ())
    indices = tuple(f"p{d}" for d in range(len(shape)))  # [vb, the other dims in order, vl]
    vb, *lead, vl = indices
    dims = ", ".join(indices)
    bounds = [f"0 <= {i} < {e}" for i, e in zip(indices, shape)] + [f"{nr}*{vb} + {vl} < {n}"]
    domain = isl.Set(f"{scop.prefix}{{ {stmt_name}[{dims}] : {' and '.join(bounds)} }}")
    if scop.context is not None:
        domain = domain.intersect_params(scop.context)
    unpermuted = list(lead)  # the packed buffer's middle dims are the source's other dims in packing.order
    for j, d in enumerate(packing.order):
        unpermuted[d] = lead[j]
    source_texts = list(unpermuted)
    source_texts.insert(position, f"{nr}*{vb} + {vl}")
    write = isl.Map(f"{scop.prefix}{{ {stmt_name}[{dims}] -> {isl_name(name)}[{dims}] }}").intersect_domain(domain)
    target = f"{isl_name(source.name)}[{', '.join(source_texts)}]"
    reads = isl.UnionMap(f"{scop.prefix}{{ {stmt_name}[{dims}] -> {target} }}")
    reads = reads.intersect_domain(isl.UnionSet.from_set(domain))

    def ident(i):
        return L.Ident(i, None, "int32", "index")

    args = [ident(i) for i in unpermuted]
    args.insert(position, L.Binary("+", L.Binary("*", L.Const(nr, None, "int32"), ident(vb), None, "int32"),
                                   ident(vl), None, "int32"))
    rhs = L.Access(source.name, tuple(args), None, source.dtype)
    copy = PolyStatement(stmt_name, indices, domain, name, indices, "=", rhs, write, reads, None, frozenset([rhs]))
    return local, copy


def _rewrite(stmt: PolyStatement, packing: Packing, local: Tensor, sizes: dict) -> PolyStatement:
    """``stmt`` reading ``local`` where it read ``packing.read``."""
    nr = packing.block
    args = packing.read.args
    position = packing.position % len(args)
    v = args[position]
    others = tuple(a for d, a in enumerate(args) if d != position)
    others = tuple(others[d] for d in packing.order) if packing.order else others
    new_args = ((L.Binary("/", v, L.Const(nr, None, "int32"), None, "int32"),) + others
                + (L.Binary("%", v, L.Const(nr, None, "int32"), None, "int32"),))
    new_read = L.Access(local.name, new_args, packing.read.span, packing.read.dtype)
    rhs = _replace(stmt.rhs, packing.read, new_read)
    index_set = set(stmt.indices)
    dims = ", ".join(isl_name(i) for i in stmt.indices)
    texts = ", ".join(affine_text(a, index_set, sizes) for a in new_args)
    old_texts = ", ".join(affine_text(a, index_set, sizes) for a in args)
    domain = isl.UnionSet.from_set(stmt.domain)
    old_map = isl.UnionMap(f"{{ {stmt.name}[{dims}] -> {isl_name(packing.read.tensor)}[{old_texts}] }}")
    new_map = isl.UnionMap(f"{{ {stmt.name}[{dims}] -> {isl_name(local.name)}[{texts}] }}")
    reads = stmt.reads.subtract(old_map.intersect_domain(domain)).union(new_map.intersect_domain(domain))
    return dataclasses.replace(stmt, rhs=rhs, reads=reads.coalesce(), safe_reads=stmt.safe_reads | {new_read})


def _replace(e: L.Expr, old: L.Access, new: L.Access) -> L.Expr:
    """``e`` with every occurrence of the read ``old`` replaced by ``new``."""
    if e is old or e == old:
        return new
    if isinstance(e, L.Access):
        return dataclasses.replace(e, args=tuple(_replace(a, old, new) for a in e.args))
    if isinstance(e, (L.Unary, L.Cast)):
        return dataclasses.replace(e, operand=_replace(e.operand, old, new))
    if isinstance(e, L.Binary):
        return dataclasses.replace(e, lhs=_replace(e.lhs, old, new), rhs=_replace(e.rhs, old, new))
    if isinstance(e, L.Select):
        return dataclasses.replace(e, cond=_replace(e.cond, old, new), then=_replace(e.then, old, new),
                                   other=_replace(e.other, old, new))
    if isinstance(e, L.Call):
        return dataclasses.replace(e, args=tuple(_replace(a, old, new) for a in e.args))
    return e


def _copy_schedule(copy: PolyStatement, parallel: bool, options: Options) -> isl.Schedule:
    """The copy's own schedule: a band over its indices in order, the last (``vl``) marked ``vector``, the
    outermost loop with more than one value marked ``parallel``."""
    dims = ", ".join(copy.indices)
    members = ", ".join(f"{{ {copy.name}[{dims}] -> [({i})] }}" for i in copy.indices)
    schedule = isl.Schedule.from_domain(isl.UnionSet.from_set(copy.domain))
    node = schedule.get_root().child(0).insert_partial_schedule(isl.MultiUnionPwAff(f"[{members}]"))
    node = node.band_set_permutable(1)
    for k in range(node.band_n_member()):
        node = node.band_member_set_coincident(k, 1)
    if options.vectorize:
        node = insert_mark(band_split(node, node.band_n_member() - 1).child(0), "vector").parent().parent()
    return (mark_parallel(node) if parallel else node).get_schedule()
