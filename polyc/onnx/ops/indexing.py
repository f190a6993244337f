"""Converters for indexing ops: GatherElements, GatherND, ScatterElements/ScatterND, OneHot, ArgMax/ArgMin,
Hardmax, TopK, CumSum/CumProd, Range, Tile, Trilu, EyeLike, DepthToSpace/SpaceToDepth, ReverseSequence,
Einsum.

A read with a data-dependent index (``X(I(i))``) is checked at run time by the generated code (an index out
of range makes the call fail with :class:`~polyc.errors.KernelRuntimeError`); negative indices are wrapped
first (``I < 0 ? I + n : I``) wherever the ONNX spec says they count from the end. A scatter cannot write
through an index (the left-hand side of a TC statement is a plain index list), so it is lowered as a gather:
each output element looks for the updates aimed at it (``max=!`` over the update positions whose index
equals its own), then reads that update or keeps the data.
"""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..builder import Builder, lazy, lit, tc_type
from .common import attr, norm_axis, reduce, zero


def _wrap(i: str, extent: int) -> str:
    """Index text of a data-dependent index ``i`` that counts from the end when negative."""
    return f"({i} < 0 ? {i} + {extent} : {i})"


def _int64(text: str) -> str:
    return f"int64({text})"


def _shape_error(b: Builder, message: str) -> ShapeError:
    return ShapeError(f"{message} on node {b.node_id} ({b.node_op})")


def _check_fits(b: Builder, node, k: int, shape, data_shape, skip: int | None, what: str) -> None:
    """Input ``k`` (indices or updates) must have the data's rank and no larger extent outside ``skip``."""
    name = node["inputs"][k]
    if len(shape) != len(data_shape) or any(a > n for d, (a, n) in enumerate(zip(shape, data_shape)) if d != skip):
        raise _shape_error(b, f"{what} {name!r} of shape {list(shape)} does not fit the data's shape "
                              f"{list(data_shape)}")


def _const_int(b: Builder, node, k: int, what: str):
    v = b.const_input(node, k, what)
    return None if v is None else int(np.asarray(v).reshape(-1)[0])


# ---- gathers ----------------------------------------------------------------------------------------------------

def gather_elements(b: Builder, node):
    """GatherElements (opset 11+): ``Y[i] = X[i with i[axis] = I[i]]``, output of the indices' shape.

    Constant indices are wrapped at compile time and read from a table; data-dependent ones are wrapped in
    the kernel and range-checked at run time (ONNX spec, GatherElements).
    """
    x = b.input(node, 0)
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", 0), rank)
    ys = b.out_shape(node)
    n = x.shape[axis]
    name = node["inputs"][1]
    _check_fits(b, node, 1, b.tensors[name].shape, x.shape, axis, "indices")
    if name in b.consts:
        iv = b.constant_table(_wrapped_constant(b, name, np.array(n), "axis", axis), "indices")
        return [lazy(ys, x.dtype, lambda idx: x.at(idx[:axis] + [iv.at(idx)] + idx[axis + 1:]))]
    iv = b.input(node, 1)
    return [lazy(ys, x.dtype, lambda idx: x.at(idx[:axis] + [_wrap(iv.at(idx), n)] + idx[axis + 1:]))]


def gather_nd(b: Builder, node):
    """GatherND (opset 11+, ``batch_dims`` from 12): the last dim of the indices addresses data dims
    ``batch_dims ..``; negative indices count from the end; reads are range-checked at run time."""
    x = b.input(node, 0)
    nb = attr(node, "batch_dims", 0)
    name = node["inputs"][1]
    q, m = len(b.tensors[name].shape), b.tensors[name].shape[-1]
    if nb + m > len(x.shape):
        raise _shape_error(b, f"indices {name!r} of shape {list(b.tensors[name].shape)} address more dims than "
                              f"the data's shape {list(x.shape)} has after batch_dims={nb}")
    ys = b.out_shape(node)
    extents = np.array(x.shape[nb:nb + m])
    if name in b.consts:  # checked and wrapped at compile time
        iv = b.constant_table(_wrapped_constant(b, name, extents, "data dims", list(range(nb, nb + m))),
                              "indices")
        wrap = lambda i, n: i  # noqa: E731
    else:
        iv, wrap = b.input(node, 1), _wrap

    def text(idx):
        rows = idx[:q - 1]
        coords = [wrap(iv.at(rows + [str(k)]), int(extents[k])) for k in range(m)]
        return x.at(idx[:nb] + coords + idx[q - 1:])
    return [lazy(ys, x.dtype, text)]


# ---- scatters ---------------------------------------------------------------------------------------------------

_NEUTRAL = {"add": ("+=!", "0"), "mul": ("*=!", "1"), "max": ("max=!", "lowest"), "min": ("min=!", "highest")}


def _neutral(kind: str, dtype) -> str:
    dtype = np.dtype(dtype)
    if kind == "lowest":
        return lit(np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min, dtype)
    if kind == "highest":
        return lit(np.finfo(dtype).max if dtype.kind == "f" else np.iinfo(dtype).max, dtype)
    return lit(int(kind), dtype)


def _update(b: Builder, x, reduction: str, body, reductions):
    """A copy of ``x``, then one update statement combining the matching updates into it (``+=``, ``*=``,
    ``max=``, ``min=``, in update order as the spec's loop); ``body`` gives the neutral element where an
    update does not match."""
    y = b.emit(x.shape, x.dtype, lambda idx, red: x.at(idx))
    b.emit(x.shape, x.dtype, body, _NEUTRAL[reduction][0].rstrip("!"), reductions, name=y.tensor)
    return y


def _wrapped_constant(b: Builder, name: str, extent, what: str, where) -> np.ndarray:
    """Constant indices (last dim against ``extent`` when it is an array of extents) with negative ones
    wrapped; an index outside ``[-extent, extent)`` is a ShapeError."""
    ind = np.asarray(b.consts[name]).astype(np.int64)
    bad = (ind < -extent) | (ind >= extent)
    if bad.any():
        raise _shape_error(b, f"index {int(ind[bad][0])} of {name!r} is out of range for {what} {where} "
                              f"(extent {extent.tolist()})")
    return np.where(ind < 0, ind + extent, ind)


def _check_targets(b: Builder, x, shape, target):
    """A statement reading ``x`` at every scatter target: an index out of range fails the call (the reads
    are range-checked at run time), as the ONNX spec requires of scatter indices. polyc keeps every statement
    of a def, so the unread result still runs."""
    b.emit(shape, x.dtype, lambda idx, red: x.at(target(idx)))


def scatter_elements(b: Builder, node):
    """ScatterElements (and the deprecated Scatter): ``Y = X`` with ``Y[i with i[axis] = I[i]] (op)= U[i]``.

    Lowered as a gather: output element ``o`` reduces over the update positions ``r`` along ``axis`` whose
    wrapped index equals ``o[axis]`` (and whose other coordinates are ``o``'s). With reduction ``none`` the
    last such update wins (a repeated index is undefined in the spec; this picks the last); with add / mul /
    max / min the data is copied and one update statement combines the matching updates into it (ONNX spec,
    ScatterElements, opset 16+). Constant indices with ``none``: the source of each element is a table.
    """
    x, iv, up = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", 0), rank)
    reduction = attr(node, "reduction", "none")
    n, us = x.shape[axis], iv.shape
    ys, dtype = x.shape, x.dtype
    _check_fits(b, node, 1, us, x.shape, axis, "indices")
    if tuple(up.shape) != tuple(us):
        raise _shape_error(b, f"updates of shape {list(up.shape)} should have the indices' shape {list(us)}")
    def within(idx, then, other):
        conds = [f"{idx[d]} < {us[d]}" for d in range(rank) if d != axis and us[d] < ys[d]]
        return f"(({' && '.join(conds)}) ? {then} : {other})" if conds else then
    name = node["inputs"][1]
    if reduction == "none" and name in b.consts:
        # constant indices: which update (its position along the axis) lands on each element, at compile time
        ind = _wrapped_constant(b, name, np.array(n), "axis", axis)
        source = np.full(ys, -1, np.int32)
        coords = list(np.indices(us))
        along = coords[axis].copy()
        coords[axis] = ind
        source[tuple(coords)] = along
        table = b.constant_table(source, "source")

        def from_table(idx):
            t = table.at(idx)
            read = up.at(idx[:axis] + [t] + idx[axis + 1:])
            return within(idx, f"({t} >= 0 ? {read} : {x.at(idx)})", x.at(idx))
        return [lazy(ys, dtype, from_table)]
    _check_targets(b, x, us, lambda idx: idx[:axis] + [_wrap(iv.at(idx), n)] + idx[axis + 1:])

    def cond(idx, r, then, other):
        """``then`` where update ``r`` along the axis aims at output ``idx``, else ``other``; the coordinates
        outside the updates' shape are tested in an outer select, so the index read stays in bounds."""
        at = idx[:axis] + [r] + idx[axis + 1:]
        return within(idx, f"(({_wrap(iv.at(at), n)} == {idx[axis]}) ? {then(at)} : {other})", other)

    if reduction == "none":
        def last(idx, red):
            return cond(idx, red[0], lambda at: _int64(red[0]), lit(-1, np.int64))
        w = b.emit(ys, np.int64, last, "max=!", [us[axis]])

        def pick(idx):
            at = idx[:axis] + [w.at(idx)] + idx[axis + 1:]
            return f"({w.at(idx)} >= 0 ? {up.at(at)} : {x.at(idx)})"
        return [lazy(ys, dtype, pick)]
    neutral = _neutral(_NEUTRAL[reduction][1], dtype)
    return [_update(b, x, reduction, lambda idx, red: cond(idx, red[0], up.at, neutral), [us[axis]])]


def scatter_nd(b: Builder, node):
    """ScatterND (opset 11+, ``reduction`` from 16): ``Y = X``; ``Y[I[u]] (op)= U[u]`` for every update row
    ``u`` (``I[u]`` addresses the first ``m`` dims of the data).

    Lowered as a gather over the update rows aimed at each output element: reduction ``none`` takes the
    last such row in row-major order (repeated indices are undefined in the spec; constant indices: a
    compile-time table), the others copy the data and combine the matching rows into it (ONNX spec, ScatterND).
    """
    x, iv, up = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    reduction = attr(node, "reduction", "none")
    q, m = len(iv.shape), iv.shape[-1]
    rows = list(iv.shape[:-1])
    if m > len(x.shape) or tuple(up.shape) != tuple(rows) + tuple(x.shape[m:]):
        raise _shape_error(b, f"indices of shape {list(iv.shape)} and updates of shape {list(up.shape)} do not "
                              f"fit the data's shape {list(x.shape)}")
    nr = len(rows)  # no rows (indices of shape (m,)): one update, reduced over a dummy index of extent 1
    ys, dtype = x.shape, x.dtype

    strides = [int(np.prod(rows[k + 1:])) for k in range(nr)]

    def unflatten(wi):
        return [f"({wi} / {s}) % {n}" if s != 1 else f"{wi} % {n}" for s, n in zip(strides, rows)]
    name = node["inputs"][1]
    if reduction == "none" and name in b.consts:
        # constant indices: which update row lands on each element of the first m dims, at compile time
        ind = _wrapped_constant(b, name, np.array(x.shape[:m]), "the data's first dims", list(x.shape[:m]))
        ind = ind.reshape(-1, m)
        source = np.full(x.shape[:m], -1, np.int32)
        source[tuple(ind.T)] = np.arange(len(ind), dtype=np.int32)
        table = b.constant_table(source, "source")

        def from_table(idx):
            t = table.at(idx[:m])
            return f"({t} >= 0 ? {up.at(unflatten(t) + idx[m:])} : {x.at(idx)})"
        return [lazy(ys, dtype, from_table)]

    def target(u, k):
        return _wrap(iv.at(list(u) + [str(k)]), x.shape[k])
    _check_targets(b, x, tuple(rows) + (1,) if not rows else tuple(rows),
                           lambda idx: [target(idx[:q - 1], k) for k in range(m)] + ["0"] * (len(ys) - m))

    def cond(idx, red):
        return " && ".join(f"{target(red[:nr], k)} == {idx[k]}" for k in range(m))

    if reduction == "none":
        def last(idx, red):
            lin = " + ".join(f"{s} * {_int64(r)}" if s != 1 else _int64(r) for r, s in zip(red[:nr], strides)) or "0"
            return f"({cond(idx, red)}) ? {lin} : {lit(-1, np.int64)}"
        w = b.emit(x.shape[:m], np.int64, last, "max=!", rows or [1])

        def pick(idx):
            wi = w.at(idx[:m])
            return f"({wi} >= 0 ? {up.at(unflatten(wi) + idx[m:])} : {x.at(idx)})"
        return [lazy(ys, dtype, pick)]
    neutral = _neutral(_NEUTRAL[reduction][1], dtype)

    def acc_body(idx, red):
        return f"({cond(idx, red)}) ? {up.at(list(red[:nr]) + idx[m:])} : {neutral}"
    return [_update(b, x, reduction, acc_body, rows or [1])]


# ---- one-hot, arg-reductions, hardmax, top-k ------------------------------------------------------------------

def one_hot(b: Builder, node):
    """OneHot (opset 9+): ``depth`` a compile-time constant; ``values = [off, on]``; an index in
    ``[-depth, depth)`` (negative from the end) selects ``on``, any other index gives a row of ``off``."""
    iv, vals = b.input(node, 0), b.input(node, 2)
    depth = int(np.asarray(b.const_input(node, 1, "depth")).reshape(-1)[0])
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    axis = norm_axis(attr(node, "axis", -1), len(ys))

    def text(idx):
        i = iv.at(idx[:axis] + idx[axis + 1:])
        if np.dtype(iv.dtype) != np.int64:
            i = _int64(i)
        return f"({_wrap(i, depth)} == {idx[axis]} ? {vals.at(['1'])} : {vals.at(['0'])})"
    return [lazy(ys, dtype, text)]


def _arg_reduce(b: Builder, x, axes, largest: bool, last: bool):
    """(max or min over ``axes``, the first/last row-major flat position in ``axes`` reaching it), each a Val
    over the kept dims, and the mapper full index -> kept index."""
    m, row = reduce(b, x.shape, axes, "max=!" if largest else "min=!", x.dtype, lambda idx: x.at(idx))
    ext = [x.shape[a] for a in axes]
    strides = [int(np.prod(ext[k + 1:])) for k in range(len(ext))]
    total = int(np.prod(ext))

    def flat(full):
        return " + ".join(_int64(full[a]) if s == 1 else f"{s} * {_int64(full[a])}"
                          for a, s in zip(axes, strides)) or "0"
    miss = lit(-1 if last else total, np.int64)

    def hit(idx):
        e, top = x.at(idx), m.at(row(idx))
        if np.dtype(x.dtype).kind != "f":
            return f"{e} == {top}"
        # max=! / min=! propagate NaN, as numpy: a NaN extremum is found at the NaNs (numpy's argmax)
        return f"({e} == {top} || ({top} != {top} && {e} != {e}))"
    pos, _ = reduce(b, x.shape, axes, "max=!" if last else "min=!", np.int64,
                    lambda idx: f"({hit(idx)}) ? {flat(idx)} : {miss}")
    return m, pos, row, flat


def arg_max_min(largest: bool):
    def convert(b: Builder, node):
        """ArgMax / ArgMin: a max (min) reduction, then the first (``select_last_index``: last) index
        reaching it (``min=!`` / ``max=!`` over guarded indices); int64, ``keepdims`` (ONNX spec)."""
        x = b.simple(b.input(node, 0))
        rank = len(x.shape)
        axis = norm_axis(attr(node, "axis", 0), rank)
        keep = attr(node, "keepdims", 1)
        _, pos, _, _ = _arg_reduce(b, x, [axis], largest, bool(attr(node, "select_last_index", 0)))
        ys = b.out_shape(node)
        return [lazy(ys, np.int64, lambda idx: pos.at(idx[:axis] + idx[axis + 1:] if keep else idx), cheap=True)]
    return convert


def _hardmax(b: Builder, node, axes):
    x = b.simple(b.input(node, 0))
    _, pos, row, flat = _arg_reduce(b, x, list(axes), True, False)
    one, nil = lit(1, x.dtype), zero(x.dtype)
    return [lazy(x.shape, x.dtype, lambda idx: f"({flat(idx)} == {pos.at(row(idx))} ? {one} : {nil})")]


def hardmax_v1(b: Builder, node):
    """Hardmax before opset 13: 1 at the first maximum of the 2-D flattening at ``axis`` (default 1)."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _hardmax(b, node, range(norm_axis(attr(node, "axis", 1), rank), rank))


def hardmax_v13(b: Builder, node):
    """Hardmax from opset 13: 1 at the first maximum along ``axis`` (default -1), 0 elsewhere."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _hardmax(b, node, [norm_axis(attr(node, "axis", -1), rank)])


def top_k(b: Builder, node):
    """TopK with a constant ``k``: each element's rank in its row is the number of elements before it in
    the sorted order (larger, or equal at a smaller index — ONNX's tie rule; ``largest=0``: smaller), then
    output position ``p`` takes the element of rank ``p``. Values and int64 indices, always sorted."""
    x = b.simple(b.input(node, 0))
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", -1), rank)
    largest = attr(node, "largest", 1)
    n = x.shape[axis]
    ys = b.out_shape(node)
    if ys[axis] <= TOPK_PASSES_MAX_K and n >= TOPK_PASSES_MIN_N:
        return _top_k_passes(b, x, axis, ys, bool(largest))
    cmp = ">" if largest else "<"
    floating = np.dtype(x.dtype).kind == "f"

    def before(idx, red):
        """Whether element ``red`` comes before element ``idx`` in the sorted row: a strict total order
        (NaN above every number, as numpy sorts it; equal values by index), so every rank is taken once."""
        j = idx[:axis] + [red[0]] + idx[axis + 1:]
        a, c = x.at(j), x.at(idx)
        first = f"{a} {cmp} {c}"
        same = f"{a} == {c}"
        if floating:
            nan_a, nan_c = f"{a} != {a}", f"{c} != {c}"
            first = f"{first} || ({nan_a} && !({nan_c}))" if largest else f"{first} || ({nan_c} && !({nan_a}))"
            same = f"{same} || ({nan_a} && {nan_c})"
        return (f"(({first}) || (({same}) && {red[0]} < {idx[axis]})) ? {lit(1, np.int64)} : "
                f"{lit(0, np.int64)}")
    ranks = b.emit(x.shape, np.int64, before, "+=!", [n])

    def pick(idx, red):
        j = idx[:axis] + [red[0]] + idx[axis + 1:]
        return f"({ranks.at(j)} == {_int64(idx[axis])}) ? {_int64(red[0])} : {lit(-1, np.int64)}"
    pos = b.emit(ys, np.int64, pick, "max=!", [n])
    values = lazy(ys, x.dtype, lambda idx: x.at(idx[:axis] + [pos.at(idx)] + idx[axis + 1:]))
    return [values, pos]


#: TopK picks its elements one pass at a time (O(k n) per row instead of the O(n^2) ranks, but five statements
#: per pass to compile) for k up to this ...
TOPK_PASSES_MAX_K = 8
#: ... on rows at least this long (a vocabulary).
TOPK_PASSES_MIN_N = 2048


def _top_k_passes(b: Builder, x, axis: int, ys, largest: bool):
    """TopK as ``k`` selection passes, each the first remaining element in the sorted order: a NaN first
    (``largest``) or last, by index; else the extremum of the remaining numbers (non-candidates read as a
    bound no candidate passes: the row's smallest (largest) number), then its first index. Pass ``p``
    excludes the indices chosen before it."""
    n, k = x.shape[axis], ys[axis]
    kept = tuple(x.shape[:axis]) + tuple(x.shape[axis + 1:])
    floating = np.dtype(x.dtype).kind == "f"
    none = lit(n, np.int64)

    def at(idx, r):
        return idx[:axis] + [r] + idx[axis:]
    if floating:
        big = lit(np.finfo(x.dtype).max, x.dtype)
        bound = b.emit(kept, x.dtype, lambda idx, red: f"({x.at(at(idx, red[0]))} != {x.at(at(idx, red[0]))}) ? "
                                                     f"{big if largest else lit(-np.finfo(x.dtype).max, x.dtype)} : "
                                                     f"{x.at(at(idx, red[0]))}", "min=!" if largest else "max=!", [n])
    else:
        bound = b.emit(kept, x.dtype, lambda idx, red: x.at(at(idx, red[0])), "min=!" if largest else "max=!", [n])
    chosen = []

    def cand(idx, r):
        return [f"{_int64(r)} != {c.at(idx)}" for c in chosen]

    def first_index(test):
        def body(idx, red):
            conds = cand(idx, red[0]) + [test(idx, x.at(at(idx, red[0])))]
            return f"({' && '.join(conds)}) ? {_int64(red[0])} : {none}"
        return b.emit(kept, np.int64, body, "min=!", [n])
    for _ in range(k):
        def value(idx, red):
            xr = x.at(at(idx, red[0]))
            conds = cand(idx, red[0]) + ([f"{xr} == {xr}"] if floating else [])
            return f"({' && '.join(conds)}) ? {xr} : {bound.at(idx)}" if conds else xr
        v = b.emit(kept, x.dtype, value, "max=!" if largest else "min=!", [n])
        j = first_index(lambda idx, xr, v=v: f"{xr} == {v.at(idx)}")
        if floating:
            nan = first_index(lambda idx, xr: f"{xr} != {xr}")
            one, other = (nan, j) if largest else (j, nan)
            j = b.emit(kept, np.int64, lambda idx, red, one=one, other=other:
                       f"({one.at(idx)} < {none}) ? {one.at(idx)} : {other.at(idx)}")
        chosen.append(j)

    def pos(idx):
        row = idx[:axis] + idx[axis + 1:]
        e = chosen[-1].at(row)
        for p in range(k - 2, -1, -1):
            e = f"({idx[axis]} == {p} ? {chosen[p].at(row)} : {e})"
        return e
    values = lazy(ys, x.dtype, lambda idx: x.at(idx[:axis] + [pos(idx)] + idx[axis + 1:]))
    return [values, lazy(ys, np.int64, pos)]


# ---- scans ------------------------------------------------------------------------------------------------------

def _cumulative(op: str, neutral: int):
    def convert(b: Builder, node):
        """CumSum / CumProd along a constant ``axis`` input, ``exclusive`` and ``reverse`` (ONNX spec), as a
        linear recurrence: ``R = src`` then ``R[.., n, ..] = R[.., n, ..] op R[.., n-1, ..]`` (a statement
        reading its own previous element runs in ascending order, as the spec's loop), with ``src(n) = X[n]``
        (inclusive) or ``X[n-1]`` (exclusive, the neutral element at 0). ``reverse`` runs it over the
        flipped axis and reads the result flipped back."""
        x = b.simple(b.input(node, 0))
        rank = len(x.shape)
        axis = norm_axis(_const_int(b, node, 1, "axis"), rank)
        excl, rev = attr(node, "exclusive", 0), attr(node, "reverse", 0)
        n = x.shape[axis]
        unit = lit(neutral, x.dtype)

        def flip(i):
            return f"{n - 1}-({i})" if rev else i

        def at(idx, i):
            return idx[:axis] + [i] + idx[axis + 1:]
        def src(idx, red):
            i = idx[axis]
            if excl:
                return f"({i} > 0) ? {x.at(at(idx, flip(f'{i}-1')))} : {unit}"
            return x.at(at(idx, flip(i)))
        r = b.emit(x.shape, x.dtype, src)

        def step(idx, red):
            prev = r.at(at(idx, f"{idx[axis]}-1"))
            return f"{r.at(idx)} {op} (({idx[axis]} > 0) ? {prev} : {unit})"
        b.emit(x.shape, x.dtype, step, name=r.tensor)
        if not rev:
            return [r]
        return [lazy(x.shape, x.dtype, lambda idx: r.at(at(idx, flip(idx[axis]))), cheap=True)]
    return convert


cum_sum = _cumulative("+", 0)
cum_prod = _cumulative("*", 1)


# ---- generated and rearranged tensors -------------------------------------------------------------------------

def range_(b: Builder, node):
    """Range whose inputs are not all constant (the passes fold the rest): ``start + i * delta`` over the
    output's static length (ONNX spec pseudocode)."""
    start, delta = b.input(node, 0), b.input(node, 2)
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    conv = tc_type(dtype)
    return [lazy(ys, dtype, lambda idx: f"({start.at([])} + {conv}({idx[0]}) * {delta.at([])})")]


def tile(b: Builder, node):
    """Tile (opset 6+) with constant ``repeats``: ``Y[i] = X[i % shape]``."""
    x = b.input(node, 0)
    ys = b.out_shape(node)

    def text(idx):
        return x.at([("0" if n == 1 else i if n == m else f"{i} % {n}") for i, n, m in zip(idx, x.shape, ys)])
    return [lazy(ys, x.dtype, text, cheap=True)]


def trilu(b: Builder, node):
    """Trilu: keep ``j - i >= k`` (upper) or ``j - i <= k`` (lower) of the last two dims, 0 elsewhere;
    ``k`` an optional scalar input (constant or not)."""
    x = b.input(node, 0)
    kv = b.input(node, 1)
    k = "0" if kv is None else kv.at([])
    cmp = ">=" if attr(node, "upper", 1) else "<="

    def text(idx):
        i, j = idx[-2], idx[-1]
        return f"(int64({j}) - int64({i}) {cmp} {k} ? {x.at(idx)} : {zero(x.dtype)})"
    return [lazy(x.shape, x.dtype, text)]


def eye_like(b: Builder, node):
    """EyeLike: ones on the diagonal ``j - i == k`` of a 2-D tensor of the input's shape, in ``dtype``."""
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    k = attr(node, "k", 0)
    one, nil = lit(1, dtype), zero(dtype)
    return [lazy(ys, dtype, lambda idx: f"({idx[1]} - {idx[0]} == {k} ? {one} : {nil})")]


def depth_to_space(b: Builder, node):
    """DepthToSpace: ``Y[n, c, h*s+i, w*s+j] = X[n, (i*s+j)*C' + c, h, w]`` (DCR) or
    ``X[n, c*s*s + i*s + j, h, w]`` (CRD), ``C' = C / s^2``."""
    x = b.input(node, 0)
    s = attr(node, "blocksize")
    crd = attr(node, "mode", "DCR") == "CRD"
    ys = b.out_shape(node)
    cp = ys[1]

    def text(idx):
        n, c, h, w = idx
        i, j = f"{h} % {s}", f"{w} % {s}"
        ch = f"{c} * {s * s} + ({i}) * {s} + {j}" if crd else f"(({i}) * {s} + {j}) * {cp} + {c}"
        return x.at([n, ch, f"{h} / {s}", f"{w} / {s}"])
    return [lazy(ys, x.dtype, text, cheap=True)]


def space_to_depth(b: Builder, node):
    """SpaceToDepth: ``Y[n, (i*s+j)*C + c, h, w] = X[n, c, h*s+i, w*s+j]`` (DCR) or output channel
    ``c*s*s + i*s + j`` (CRD, opset 28)."""
    x = b.input(node, 0)
    s = attr(node, "blocksize")
    crd = attr(node, "mode", "DCR") == "CRD"
    ys = b.out_shape(node)
    c0 = x.shape[1]

    def text(idx):
        n, ch, h, w = idx
        if crd:
            c, i, j = f"{ch} / {s * s}", f"({ch} / {s}) % {s}", f"{ch} % {s}"
        else:
            c, i, j = f"{ch} % {c0}", f"{ch} / {c0 * s}", f"({ch} / {c0}) % {s}"
        return x.at([n, c, f"{h} * {s} + {i}", f"{w} * {s} + {j}"])
    return [lazy(ys, x.dtype, text, cheap=True)]


def reverse_sequence(b: Builder, node):
    """ReverseSequence (opset 10+): along ``time_axis``, the first ``sequence_lens[i]`` elements of batch
    ``i`` (``batch_axis``) reversed, the rest copied; a length past the time extent fails the call (the
    read is range-checked at run time)."""
    x, lens = b.input(node, 0), b.input(node, 1)
    ta, ba = attr(node, "time_axis", 0), attr(node, "batch_axis", 1)

    def text(idx):
        t, n = idx[ta], lens.at([idx[ba]])
        src = list(idx)
        src[ta] = f"{n} - 1 - {t}"
        return f"({t} < {n} ? {x.at(src)} : {x.at(idx)})"
    return [lazy(x.shape, x.dtype, text)]


# ---- Einsum -----------------------------------------------------------------------------------------------------

def _einsum_terms(b: Builder, node, shapes):
    """(operand subscripts, output subscript) with every ``...`` spelled out in fresh upper-case-free
    letters (``0``..``9`` stand for the ellipsis dims, aligned from the right as numpy broadcasts)."""
    eq = "".join(attr(node, "equation").split())
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(shapes):
        raise b.error(f"equation {eq!r} names {len(terms)} operands but the node has {len(shapes)}")
    ell = max((len(s) - (len(t) - 3) for t, s in zip(terms, shapes) if "..." in t), default=0)
    dots = [f"#{k}" for k in range(ell)]

    def expand(t, rank=None):
        letters = []
        head, sep, tail = t.partition("...")
        letters += list(head)
        if sep:
            n = ell if rank is None else rank - len(head) - len(tail)
            letters += dots[ell - n:]
        letters += list(tail)
        return letters
    subs = [expand(t, len(s)) for t, s in zip(terms, shapes)]
    for t, s, sub in zip(terms, shapes, subs):
        if len(sub) != len(s):
            raise b.error(f"operand subscript {t!r} does not fit its rank {len(s)}")
    if arrow:
        outs = expand(out)
    else:
        singles = sorted(c for c in set(lhs) if c.isalpha() and lhs.count(c) == 1)
        outs = dots + singles
    return subs, outs


def einsum(b: Builder, node):
    """Einsum: the equation is Einstein notation, so it becomes one TC statement — output letters on the
    left, the others summed (``+=!``); a letter repeated in one operand reads its diagonal; ``...`` dims
    broadcast numpy-style (extent 1 read at 0)."""
    vals = [b.input(node, k) for k in range(len(node["inputs"]))]
    subs, outs = _einsum_terms(b, node, [v.shape for v in vals])
    extents = {}
    for sub, v in zip(subs, vals):
        for c, n in zip(sub, v.shape):
            extents[c] = max(extents.get(c, 1), n)
    summed = [c for c in dict.fromkeys(c for sub in subs for c in sub) if c not in outs]
    ys, dtype = b.out_shape(node), b.out_dtype(node)

    def body(idx, red):
        names = dict(zip(outs, idx)) | dict(zip(summed, red))
        reads = [v.at([("0" if n == 1 and extents[c] != 1 else names[c]) for c, n in zip(sub, v.shape)])
                 for sub, v in zip(subs, vals)]
        return " * ".join(reads)
    op = "+=!" if summed else "="
    return [b.emit(ys, dtype, body, op, [extents[c] for c in summed])]


#: op -> ((since_version, converter), ...), oldest first (see :data:`polyc.onnx.ops.CONVERTERS`).
CONVERTERS = {
    "GatherElements": ((11, gather_elements),), "GatherND": ((11, gather_nd),),
    "ScatterElements": ((11, scatter_elements),), "Scatter": ((9, scatter_elements),),
    "ScatterND": ((11, scatter_nd),), "OneHot": ((9, one_hot),),
    "ArgMax": ((1, arg_max_min(True)),), "ArgMin": ((1, arg_max_min(False)),),
    "Hardmax": ((1, hardmax_v1), (13, hardmax_v13)), "TopK": ((1, top_k),),
    "CumSum": ((11, cum_sum),), "CumProd": ((26, cum_prod),), "Range": ((11, range_),), "Tile": ((6, tile),),
    "Trilu": ((14, trilu),), "EyeLike": ((9, eye_like),), "DepthToSpace": ((1, depth_to_space),),
    "SpaceToDepth": ((1, space_to_depth),), "Einsum": ((12, einsum),), "ReverseSequence": ((10, reverse_sequence),),
}

KNOWN_ATTRS = {
    "GatherElements": {"axis"}, "GatherND": {"batch_dims"}, "ScatterElements": {"axis", "reduction"},
    "Scatter": {"axis"}, "ScatterND": {"reduction"}, "OneHot": {"axis"},
    "ArgMax": {"axis", "keepdims", "select_last_index"}, "ArgMin": {"axis", "keepdims", "select_last_index"},
    "Hardmax": {"axis"}, "TopK": {"axis", "k", "largest", "sorted"}, "CumSum": {"exclusive", "reverse"},
    "CumProd": {"exclusive", "reverse"}, "Range": {"stash_type"}, "Trilu": {"upper"}, "EyeLike": {"dtype", "k"},
    "DepthToSpace": {"blocksize", "mode"}, "SpaceToDepth": {"blocksize", "mode"}, "Einsum": {"equation"},
    "ReverseSequence": {"batch_axis", "time_axis"},
}

_REDUCTIONS = lambda v: v in (b"none", b"add", b"mul", b"max", b"min", "none", "add", "mul", "max", "min")  # noqa: E731
_MODES = lambda v: v in (b"DCR", b"CRD", "DCR", "CRD")  # noqa: E731
SUPPORTED_VALUES = {
    "ScatterElements": {"reduction": _REDUCTIONS}, "ScatterND": {"reduction": _REDUCTIONS},
    "DepthToSpace": {"mode": _MODES}, "SpaceToDepth": {"mode": _MODES},
}

CONSTANT_INPUTS = {
    "OneHot": ((1, 9, "depth"),), "CumSum": ((1, 11, "axis"),), "CumProd": ((1, 26, "axis"),),
    "Tile": ((1, 6, "repeats"),), "TopK": ((1, 10, "K"),),
    "Range": ((0, 11, "start"), (1, 11, "limit"), (2, 11, "delta")),
}
