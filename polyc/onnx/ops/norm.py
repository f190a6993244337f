"""Converters of the normalization family: InstanceNormalization, GroupNormalization, RMSNormalization,
MeanVarianceNormalization, LpNormalization, LpPool and GlobalLpPool.

Every statistic is a reduction statement; the normalised output is a lazy expression over the input and the
statistics, so a following elementwise op fuses into it. Mean and variance take two reductions, as
:func:`~polyc.onnx.ops.core.layer_normalization` does: the mean first, then the sum of squares of the
centred values (``E[(x - mu)^2]``, not ``E[x^2] - mu^2``, which cancels catastrophically when the mean is large
against the spread).
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, broadcast_index, lazy, lit, tc_type
from .common import attr, guard, norm_axis, pads_begin, reduction_dims, reduce_op_for, window, zero

#: ONNX ``stash_type`` (a TensorProto element type) -> numpy dtype the statistics are computed in.
STASH = {1: np.dtype(np.float32), 11: np.dtype(np.float64)}


def _in(text: str, src, dst) -> str:
    """``text`` of dtype ``src`` converted to ``dst`` (unchanged when they agree)."""
    return text if np.dtype(src) == np.dtype(dst) else f"{tc_type(dst)}({text})"


def moments(b: Builder, kept_shape, extents, read, dtype, centred: bool = True):
    """Mean and sum of squared deviations of ``read(kept_idx, red_idx)`` over reduction ``extents``.

    Returns ``(mu, ss, count)``: Vals of shape ``kept_shape`` (``mu`` the mean, ``ss`` the sum of
    ``(x - mu)^2``; with ``centred=False`` ``mu`` is None and ``ss`` the sum of ``x^2``) and the element count.
    Extents of 1 get the index ``0`` (:func:`~polyc.onnx.ops.common.reduction_dims`).
    """
    real, names = reduction_dims(extents)
    count = int(np.prod(extents)) if extents else 1
    op = reduce_op_for(real)
    mu = None
    if centred:
        s1 = b.emit(kept_shape, dtype, lambda idx, red: read(idx, names(red)), op, real)
        mu = b.emit(kept_shape, dtype, lambda idx, red: f"({s1.at(idx)} / {lit(count, dtype)})")

        def sq(idx, red):
            d = f"({read(idx, names(red))} - {mu.at(idx)})"
            return f"{d} * {d}"
    else:
        def sq(idx, red):
            e = read(idx, names(red))
            return f"{e} * {e}"
    ss = b.emit(kept_shape, dtype, sq, op, real)
    return mu, ss, count


def _stash(b: Builder, node, x_dtype):
    """The dtype statistics are computed in: ``stash_type`` where the op has it (opset >= 21), else X's."""
    st = attr(node, "stash_type", None)
    if st is None:
        return np.dtype(x_dtype)
    if st not in STASH:
        raise b.error(f"unsupported stash_type {st}")
    return STASH[st]


def instance_normalization(b: Builder, node):
    """InstanceNormalization: per (n, c) mean and variance over the spatial dims.

    X ``(N, C, D1..Dk)``, scale and B ``(C,)``; ``y = scale * (x - mu) / sqrt(var + epsilon) + B``
    (ONNX operator spec, InstanceNormalization-6/22).
    """
    x = b.simple(b.input(node, 0))
    scale, bias = b.input(node, 1), b.input(node, 2)
    t = x.dtype
    eps = lit(attr(node, "epsilon", 1e-5), t)
    kept = x.shape[:2]
    mu, ss, count = moments(b, kept, list(x.shape[2:]), lambda idx, red: x.at(idx + red), t)
    r = b.emit(kept, t, lambda idx, red: f"({lit(1.0, t)} / sqrt({ss.at(idx)} / {lit(count, t)} + {eps}))")

    def text(idx):
        c = idx[:2]
        return f"(({x.at(idx)} - {mu.at(c)}) * {r.at(c)} * {scale.at([idx[1]])} + {bias.at([idx[1]])})"
    return [lazy(x.shape, t, text)]


def group_normalization(b: Builder, node):
    """GroupNormalization-21: mean and variance per (n, group) over the group's ``C / num_groups`` channels and
    the spatial dims, in ``stash_type`` precision; scale and bias per channel ``(C,)``.

    X ``(N, C, D1..Dk)``. num_groups must divide C (UnsupportedError naming the node otherwise).
    GroupNormalization-18 (scale and bias per group) is deprecated in onnx >= 1.18, whose checker rejects it,
    so it never reaches a converter.
    """
    x = b.simple(b.input(node, 0))
    scale, bias = b.input(node, 1), b.input(node, 2)
    t = x.dtype
    st = _stash(b, node, t)
    groups = attr(node, "num_groups")
    n, c = x.shape[0], x.shape[1]
    if groups is None or groups <= 0 or c % groups:
        raise b.error(f"num_groups={groups} does not divide the {c} channels")
    cg = c // groups
    eps = lit(attr(node, "epsilon", 1e-5), st)
    spatial = list(x.shape[2:])

    def read(idx, red):
        ch = red[0] if groups == 1 else (idx[1] if cg == 1 else f"{cg}*{idx[1]}+{red[0]}")
        return _in(x.at([idx[0], ch] + red[1:]), t, st)
    mu, ss, count = moments(b, (n, groups), [cg] + spatial, read, st)
    r = b.emit((n, groups), st, lambda idx, red: f"({lit(1.0, st)} / sqrt({ss.at(idx)} / {lit(count, st)} + {eps}))")

    def text(idx):
        g = [idx[0], idx[1] if cg == 1 else f"{idx[1]}/{cg}"]
        norm = _in(f"(({_in(x.at(idx), t, st)} - {mu.at(g)}) * {r.at(g)})", st, t)
        return f"({norm} * {scale.at([idx[1]])} + {bias.at([idx[1]])})"
    return [lazy(x.shape, t, text)]


def rms_normalization(b: Builder, node):
    """RMSNormalization-23: ``x / sqrt(mean(x^2 over axes axis..) + epsilon) * scale``, scale broadcast to X;
    the statistic in ``stash_type`` precision."""
    x = b.simple(b.input(node, 0))
    scale = b.input(node, 1)
    t = x.dtype
    st = _stash(b, node, t)
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", -1), rank)
    eps = lit(attr(node, "epsilon", 1e-5), st)
    kept = x.shape[:axis]
    _, ss, count = moments(b, kept, list(x.shape[axis:]), lambda idx, red: _in(x.at(idx + red), t, st), st,
                           centred=False)
    r = b.emit(kept, st, lambda idx, red: f"({lit(1.0, st)} / sqrt({ss.at(idx)} / {lit(count, st)} + {eps}))")

    def text(idx):
        norm = _in(f"({_in(x.at(idx), t, st)} * {r.at(idx[:axis])})", st, t)
        return f"({norm} * {scale.at(broadcast_index(scale, x.shape, idx))})"
    return [lazy(x.shape, t, text)]


def _split(shape, axes):
    kept = [d for d in range(len(shape)) if d not in axes]
    return kept, [shape[d] for d in kept], [shape[d] for d in axes]


def _full(rank, axes, kept, kidx, ridx):
    out, ki, ri = [], iter(kidx), iter(ridx)
    for d in range(rank):
        out.append(next(ri) if d in axes else next(ki))
    return out


def mean_variance_normalization(b: Builder, node):
    """MeanVarianceNormalization-9/13: ``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (default [0, 2, 3]),
    the variance the population one (the spec's function body)."""
    x = b.simple(b.input(node, 0))
    t = x.dtype
    rank = len(x.shape)
    axes = sorted({norm_axis(a, rank) for a in attr(node, "axes", [0, 2, 3])})
    if any(not 0 <= a < rank for a in axes):
        raise b.error(f"axes {attr(node, 'axes', [0, 2, 3])} out of range for rank {rank}")
    kept, kept_shape, extents = _split(x.shape, axes)
    mu, ss, count = moments(b, tuple(kept_shape), extents,
                            lambda idx, red: x.at(_full(rank, axes, kept, idx, red)), t)
    d = b.emit(tuple(kept_shape), t,
               lambda idx, red: f"(sqrt({ss.at(idx)} / {lit(count, t)}) + {lit(1e-9, t)})")

    def text(idx):
        k = [idx[i] for i in kept]
        return f"(({x.at(idx)} - {mu.at(k)}) / {d.at(k)})"
    return [lazy(x.shape, t, text)]


def lp_normalization(b: Builder, node):
    """LpNormalization: ``x / ||x||_p`` along ``axis`` (default -1), ``p`` 1 or 2."""
    x = b.simple(b.input(node, 0))
    t = x.dtype
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", -1), rank)
    p = attr(node, "p", 2)
    if p not in (1, 2):
        raise b.error(f"unsupported p={p} (ONNX allows 1 or 2)")
    kept, kept_shape, extents = _split(x.shape, [axis])
    real, names = reduction_dims(extents)

    def term(idx, red):
        e = x.at(_full(rank, [axis], kept, idx, names(red)))
        return f"fabs({e})" if p == 1 else f"{e} * {e}"
    s = b.emit(tuple(kept_shape), t, term, reduce_op_for(real), real)

    def text(idx):  # a zero norm gives 0, as onnx's test data and onnxruntime have it (the spec is silent)
        k = [idx[i] for i in kept]
        norm = s.at(k) if p == 1 else f"sqrt({s.at(k)})"
        return f"({s.at(k)} == {lit(0, t)} ? {lit(0, t)} : {x.at(idx)} / {norm})"
    return [lazy(x.shape, t, text)]


def _pow_abs(e: str, p, t) -> str:
    if p == 1:
        return f"fabs({e})"
    if p == 2:
        return f"{e} * {e}"
    return f"pow(fabs({e}), {lit(p, t)})"


def _root(e: str, p, t) -> str:
    if p == 1:
        return e
    if p == 2:
        return f"sqrt({e})"
    return f"pow({e}, {lit(1.0 / p, t)})"


def lp_pool(b: Builder, node):
    """LpPool: ``(sum over the window of |x|^p)^(1/p)``; pads contribute 0; strides, dilations (18),
    ceil_mode (18), auto_pad. ``p`` (default 2) may be any positive number."""
    x = b.input(node, 0)
    t = x.dtype
    ys = b.out_shape(node)
    nsp = len(x.shape) - 2
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1] * nsp))
    dil = list(attr(node, "dilations", [1] * nsp))
    pb = pads_begin(node, x.shape[2:], ys[2:], kernel, strides, dil)
    p = attr(node, "p", 2)
    real, names = reduction_dims(kernel)

    def body(idx, red):
        red = names(red)
        coords, conds = [], []
        for i in range(nsp):
            text, cs = window(idx[2 + i], red[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(text)
            conds += cs
        term = _pow_abs(x.at(idx[:2] + coords), p, t)
        return f"({guard(conds)}) ? {term} : {zero(t)}" if conds else term
    s = b.emit(ys, t, body, reduce_op_for(real), real)
    return [lazy(ys, t, lambda idx: _root(s.at(idx), p, t))]


def global_lp_pool(b: Builder, node):
    """GlobalLpPool: ``(sum over the spatial dims of |x|^p)^(1/p)``, output ``(N, C, 1, ..)``."""
    x = b.input(node, 0)
    t = x.dtype
    ys = b.out_shape(node)
    p = attr(node, "p", 2)
    real, names = reduction_dims(list(x.shape[2:]))
    s = b.emit(ys, t, lambda idx, red: _pow_abs(x.at(idx[:2] + names(red)), p, t), reduce_op_for(real), real)
    return [lazy(ys, t, lambda idx: _root(s.at(idx), p, t))]


CONVERTERS = {
    "InstanceNormalization": ((6, instance_normalization),),
    "GroupNormalization": ((21, group_normalization),),
    "RMSNormalization": ((23, rms_normalization),),
    "MeanVarianceNormalization": ((9, mean_variance_normalization),),
    "LpNormalization": ((1, lp_normalization),),
    "LpPool": ((2, lp_pool),),
    "GlobalLpPool": ((2, global_lp_pool),),
}

_SPATIAL = {"auto_pad", "dilations", "kernel_shape", "pads", "strides"}

KNOWN_ATTRS = {
    "InstanceNormalization": {"epsilon"},
    "GroupNormalization": {"epsilon", "num_groups", "stash_type"},
    "RMSNormalization": {"axis", "epsilon", "stash_type"},
    "MeanVarianceNormalization": {"axes"},
    "LpNormalization": {"axis", "p"},
    "LpPool": _SPATIAL | {"ceil_mode", "p"},
    "GlobalLpPool": {"p"},
}

SUPPORTED_VALUES = {
    "GroupNormalization": {"stash_type": lambda v: v in STASH},
    "RMSNormalization": {"stash_type": lambda v: v in STASH},
    "LpNormalization": {"p": lambda v: v in (1, 2)},
    "LpPool": {"p": lambda v: v > 0},
    "GlobalLpPool": {"p": lambda v: v > 0},
}

CONSTANT_INPUTS = {}
