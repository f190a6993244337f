"""Helpers shared by the converter modules: affine index text, attributes, windows, the n-ary and
reduction patterns. Everything here builds TC text through :class:`~polyc.onnx.builder.Builder`."""
from __future__ import annotations

import numpy as np

from ..builder import Builder, broadcast_index, lazy, lit, times


def aff(terms, const: int = 0) -> str:
    """Affine index text from ``[(var, coef), ...]`` and a constant: ``2*i2+r1-3``."""
    parts = []
    for var, coef in terms:
        if coef == 0 or var == "0":
            continue
        t = var if coef == 1 else (times(coef, var) if coef > 0 else f"{coef}*{var}")
        parts.append(("-" + var if coef == -1 else t) if not parts else ("-" + var if coef == -1 else "+" + t))
    text = "".join(parts) or "0"
    if const > 0:
        text += f"+{const}" if parts else ""
    elif const < 0:
        text += f"{const}"
    return str(const) if not parts else text


def attr(node, name, default=None):
    v = node["attrs"].get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def zero(dtype) -> str:
    return lit(0, dtype)


def lowest(dtype) -> str:
    dtype = np.dtype(dtype)
    return lit(np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min, dtype)


def guard(conds) -> str:
    return " && ".join(conds)


def window(out_idx, k_idx, stride, dil, pad_begin, extent, out_n, k_n):
    """(index text, bound conditions) of a sliding-window read ``o*stride + k*dil - pad``."""
    text = aff([(out_idx, stride), (k_idx, dil)], -pad_begin)
    lo = -pad_begin
    hi = (out_n - 1) * stride + (k_n - 1) * dil - pad_begin
    conds = []
    if lo < 0:
        conds.append(f"{text} >= 0")
    if hi >= extent:
        conds.append(f"{text} < {extent}")
    return text, conds


def reduction_dims(extents):
    """(extents of the real reduction indices, mapper red -> one index text per extent).

    Extents of 1 get the literal ``0`` instead of an index, so a 1x1 convolution reduces over channels only.
    """
    real = [e for e in extents if e > 1]

    def names(red):
        it = iter(red)
        return [next(it) if e > 1 else "0" for e in extents]
    return real, names


def reduce_op_for(real, op="+=!"):
    return op if real else "="


def pads_begin(node, in_sp, out_sp, kernel, strides, dil) -> list:
    """Leading pads per spatial dim, including auto_pad SAME_UPPER/SAME_LOWER/VALID."""
    auto = attr(node, "auto_pad", "NOTSET")
    n = len(in_sp)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(n):
            total = max((out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i], 0)
            out.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        return out
    if auto == "VALID":
        return [0] * n
    pads = attr(node, "pads", [0] * 2 * n)
    return list(pads[:n])


def spatial_params(b, node, x, w_shape=None):
    nsp = len(x.shape) - 2
    kernel = list(attr(node, "kernel_shape", w_shape[2:] if w_shape is not None else None))
    strides = list(attr(node, "strides", [1] * nsp))
    dil = list(attr(node, "dilations", [1] * nsp))
    return nsp, kernel, strides, dil


# ---- elementwise ----------------------------------------------------------------------------------------------

def unary(text_fn, simple=False):
    def convert(b: Builder, node):
        x = b.input(node, 0)
        if simple:
            x = b.simple(x)
        dtype = b.out_dtype(node)
        return [lazy(x.shape, dtype, lambda idx: text_fn(x.at(idx), node, dtype))]
    return convert


def nary(op_fn):
    def convert(b: Builder, node):
        shape, dtype = b.out_shape(node), b.out_dtype(node)
        vals = [b.input(node, k) for k in range(len(node["inputs"]))]
        vals = [v for v in vals if v is not None]

        def text(idx):
            terms = [v.at(broadcast_index(v, shape, idx)) for v in vals]
            return op_fn(terms, dtype, node)
        return [lazy(shape, dtype, text)]
    return convert


def fold(fn):
    def text(terms, dtype, node):
        out = terms[0]
        for t in terms[1:]:
            out = fn(out, t)
        return out
    return text


def reduce(b: Builder, shape, axes, op, dtype, term):
    """``T(kept) op term(full_idx)`` over ``axes`` of ``shape``; returns (Val over kept dims, index mapper)."""
    axes = sorted(axes)
    kept = [d for d in range(len(shape)) if d not in axes]

    def body(idx, red):
        full, ki, ri = [], iter(idx), iter(red)
        for d in range(len(shape)):
            full.append(next(ri) if d in axes else next(ki))
        return term(full)
    v = b.emit(tuple(shape[d] for d in kept), dtype, body, op, [shape[d] for d in axes])

    def row(full_idx):
        return [full_idx[d] for d in kept]
    return v, row
