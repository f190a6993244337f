"""Converters of the ReduceX ops: Sum, Mean, Max, Min, Prod, L1, L2, LogSum, LogSumExp, SumSquare.

Every one is a single reduction statement (``+=!``, ``*=!``, ``max=!``, ``min=!``) over the reduced axes of
a term, followed by a lazy finishing expression (``/ n``, ``sqrt``, ``log``) read through ``keepdims``;
LogSumExp subtracts the maximum first (a second reduction) so ``exp`` cannot overflow. The axes come from
the ``axes`` attribute before the opset where they became an input (13 for ReduceSum, 18 for the others),
from a constant ``axes`` input after it; ``noop_with_empty_axes`` (with the input form) makes empty axes
the identity, otherwise empty axes reduce over every dim (ONNX spec, ReduceSum / ReduceMean ...).
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, lazy, lit, tc_type
from .common import attr, norm_axis, reduce


def reduce_axes(b: Builder, node, since: int):
    """The sorted reduced axes of a ReduceX node; ``[]`` means the identity (``noop_with_empty_axes``)."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    if b.opset >= since:
        axes = b.const_input(node, 1, "axes")
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        axes = attr(node, "axes", None)
    if not axes:
        if b.opset >= since and attr(node, "noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(norm_axis(a, rank) for a in axes)


def _float_fn(fn: str, text: str, dtype) -> str:
    """``fn(text)`` in ``dtype`` (integer results are converted back, as onnx's reference does)."""
    out = f"{fn}({text})"
    return out if np.dtype(dtype).kind == "f" else f"{tc_type(dtype)}({out})"


def _mean(s: str, dtype, n: int) -> str:
    """``s / n``; for integers truncated toward zero as onnxruntime's integer division (through double)."""
    if np.dtype(dtype).kind == "f":
        return f"({s} / {lit(n, dtype)})"
    return f"{tc_type(dtype)}(double({s}) / {lit(n, np.float64)})"


#: kind -> (reduction operator, term(x text, dtype), finish(reduced text, dtype, count))
_KINDS = {
    "sum": ("+=!", lambda e, t: e, None),
    "mean": ("+=!", lambda e, t: e, lambda s, t, n: _mean(s, t, n)),
    "max": ("max=!", lambda e, t: e, None),
    "min": ("min=!", lambda e, t: e, None),
    "prod": ("*=!", lambda e, t: e, None),
    "l1": ("+=!", lambda e, t: f"fabs({e})" if np.dtype(t).kind == "f" else f"abs({e})", None),
    "l2": ("+=!", lambda e, t: f"{e} * {e}", lambda s, t, n: _float_fn("sqrt", s, t)),
    "sumsquare": ("+=!", lambda e, t: f"{e} * {e}", None),
    "logsum": ("+=!", lambda e, t: e, lambda s, t, n: _float_fn("log", s, t)),
}


def _reduce_op(kind: str, since: int):
    def convert(b: Builder, node):
        x = b.input(node, 0)
        axes = reduce_axes(b, node, since)
        ys = b.out_shape(node)
        if not axes:  # a reduction over no axes: each element's own term, finished (onnx's reference)
            if kind in ("sum", "mean", "max", "min", "prod", "logsumexp"):
                return [x]
            x = b.simple(x)
            _, term, finish = _KINDS[kind]
            finish = finish or (lambda e, t, n: e)
            return [lazy(ys, x.dtype, lambda idx: finish(term(x.at(idx), x.dtype), x.dtype, 1))]
        keep = attr(node, "keepdims", 1)
        kept = [d for d in range(len(x.shape)) if d not in axes]
        count = int(np.prod([x.shape[d] for d in axes]))

        def kept_idx(idx):
            return [idx[d] for d in kept] if keep else list(idx)
        if kind == "logsumexp":
            x = b.simple(x)
            m, row = reduce(b, x.shape, axes, "max=!", x.dtype, lambda idx: x.at(idx))
            s, _ = reduce(b, x.shape, axes, "+=!", x.dtype, lambda idx: f"exp({x.at(idx)} - {m.at(row(idx))})")
            # an infinite (or NaN) maximum is the result itself: exp(x - m) would be inf - inf
            return [lazy(ys, x.dtype, lambda idx: f"(({m.at(kept_idx(idx))} - {m.at(kept_idx(idx))} == "
                                                  f"{lit(0, x.dtype)}) ? log({s.at(kept_idx(idx))}) + "
                                                  f"{m.at(kept_idx(idx))} : {m.at(kept_idx(idx))})")]
        op, term, finish = _KINDS[kind]
        if kind in ("l2", "sumsquare", "l1"):
            x = b.simple(x)
        v, _ = reduce(b, x.shape, axes, op, x.dtype, lambda idx: term(x.at(idx), x.dtype))
        if finish is None:
            return [lazy(ys, x.dtype, lambda idx: v.at(kept_idx(idx)), cheap=True)]
        return [lazy(ys, x.dtype, lambda idx: finish(v.at(kept_idx(idx)), x.dtype, count))]
    convert.__doc__ = (f"Reduce{kind}: a ``{_KINDS.get(kind, ('max=! then +=!',))[0]}`` reduction over the axes "
                       f"(attribute before opset {since}, constant input from it), ``keepdims``, "
                       "``noop_with_empty_axes``.")
    return convert


_OPS = {"ReduceSum": ("sum", 13), "ReduceMean": ("mean", 18), "ReduceMax": ("max", 18), "ReduceMin": ("min", 18),
        "ReduceProd": ("prod", 18), "ReduceL1": ("l1", 18), "ReduceL2": ("l2", 18),
        "ReduceLogSum": ("logsum", 18), "ReduceLogSumExp": ("logsumexp", 18), "ReduceSumSquare": ("sumsquare", 18)}

#: op -> ((since_version, converter), ...), oldest first (see :data:`polyc.onnx.ops.CONVERTERS`).
CONVERTERS = {op: ((1, _reduce_op(kind, since)),) for op, (kind, since) in _OPS.items()}

KNOWN_ATTRS = {op: {"axes", "keepdims", "noop_with_empty_axes"} for op in _OPS}

SUPPORTED_VALUES: dict = {}

CONSTANT_INPUTS = {op: ((1, since, "axes"),) for op, (kind, since) in _OPS.items()}
