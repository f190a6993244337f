"""Converters of the loss family: NegativeLogLikelihoodLoss (12/13/22) and SoftmaxCrossEntropyLoss (12/13).

Both read the input at the class each target names (a data-dependent index, as a dynamic Gather does),
weight it, and reduce: ``none`` keeps the target's shape (a lazy value), ``sum`` and ``mean`` are scalar
reduction statements. SoftmaxCrossEntropyLoss computes the log-probabilities along axis 1 with the two
reductions of :func:`~polyc.onnx.ops.core._softmax` (max, then the sum of exponentials) and reads them lazily,
so only the picked classes are evaluated unless the log_prob output is asked for.
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, lazy, lit
from .common import attr, reduce, reduction_dims, reduce_op_for, zero


def _nll(b: Builder, node, x_shape, dtype, read):
    """The loss output of ``-read(n, class, spatial..)`` picked by the target (input 1), weighted by input 2.

    Per element: ``w = (target == ignore_index) ? 0 : weight[target]`` (1 without weights) and
    ``loss = -read(.., target, ..) * w``. ``mean`` divides the sum by the sum of ``w`` when there are
    weights or an ignore_index, else by the element count (ONNX spec, NegativeLogLikelihoodLoss).
    """
    tgt, weight = b.input(node, 1), b.input(node, 2)
    if np.dtype(tgt.dtype).kind not in "iu":
        raise b.error(f"target of dtype {np.dtype(tgt.dtype).name} must be an integer tensor")
    reduction = attr(node, "reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise b.error(f"unsupported reduction {reduction!r}")
    ignore = attr(node, "ignore_index", None)
    t = dtype
    tshape = tuple(tgt.shape)
    if tshape != (x_shape[0],) + tuple(x_shape[2:]):
        raise b.error(f"target shape {list(tshape)} does not fit input shape {list(x_shape)}")

    def weight_of(idx):
        """Weight text at target index ``idx`` (None: 1 everywhere)."""
        w = None
        if weight is not None:  # an out-of-range class raises KernelRuntimeError when read
            w = weight.at([tgt.at(idx)])
        if ignore is not None:
            w = f"({tgt.at(idx)} == {ignore} ? {zero(t)} : {w if w is not None else lit(1, t)})"
        return w

    def loss_at(idx):
        picked = f"(-{read([idx[0], tgt.at(idx)] + list(idx[1:]))})"
        if ignore is not None:
            picked = f"({tgt.at(idx)} == {ignore} ? {zero(t)} : {picked})"
        w = weight_of(idx)
        if weight is not None:
            return f"({picked} * {w})"
        return picked

    if reduction == "none":
        return lazy(tshape, t, loss_at)
    real, names = reduction_dims(list(tshape))
    total = b.emit((), t, lambda idx, red: loss_at(names(red)), reduce_op_for(real), real)
    if reduction == "sum":
        return total
    if weight is None and ignore is None:
        count = lit(int(np.prod(tshape)), t)
        return lazy((), t, lambda idx: f"({total.at([])} / {count})")
    wsum = b.emit((), t, lambda idx, red: weight_of(names(red)), reduce_op_for(real), real)
    return lazy((), t, lambda idx: f"({total.at([])} / {wsum.at([])})")


def negative_log_likelihood_loss(b: Builder, node):
    """NegativeLogLikelihoodLoss: input ``(N, C, d1..dk)`` of log-probabilities, target ``(N, d1..dk)``
    (int32/int64), optional weight ``(C,)``; reduction none/sum/mean (default mean), ignore_index."""
    x = b.input(node, 0)
    if len(x.shape) < 2:
        raise b.error(f"input of shape {list(x.shape)} needs at least (N, C)")
    return [_nll(b, node, x.shape, x.dtype, x.at)]


def softmax_cross_entropy_loss(b: Builder, node):
    """SoftmaxCrossEntropyLoss: ``NLL(log_softmax(scores, axis=1), labels)`` with the same weight,
    reduction and ignore_index rules; the optional second output is the log-probabilities ``(N, C, d..)``."""
    x = b.simple(b.input(node, 0))
    if len(x.shape) < 2:
        raise b.error(f"scores of shape {list(x.shape)} need at least (N, C)")
    t = x.dtype
    mx, row = reduce(b, x.shape, [1], "max=!", t, lambda idx: x.at(idx))
    s, _ = reduce(b, x.shape, [1], "+=!", t, lambda idx: f"exp({x.at(idx)} - {mx.at(row(idx))})")

    def log_prob(idx):
        return f"({x.at(idx)} - {mx.at(row(idx))} - log({s.at(row(idx))}))"
    if len(node["outputs"]) > 1 and node["outputs"][1]:
        # the whole tensor is an output: one statement, which the loss then reads at the picked classes
        lp = b.emit(x.shape, t, lambda idx, red: log_prob(idx))
        return [_nll(b, node, x.shape, t, lp.at), lp]
    return [_nll(b, node, x.shape, t, log_prob)]


CONVERTERS = {
    "NegativeLogLikelihoodLoss": ((12, negative_log_likelihood_loss),),
    "SoftmaxCrossEntropyLoss": ((12, softmax_cross_entropy_loss),),
}

KNOWN_ATTRS = {
    "NegativeLogLikelihoodLoss": {"ignore_index", "reduction"},
    "SoftmaxCrossEntropyLoss": {"ignore_index", "reduction"},
}

SUPPORTED_VALUES = {
    "NegativeLogLikelihoodLoss": {"reduction": lambda v: (v.decode() if isinstance(v, bytes) else v)
                                  in ("none", "sum", "mean")},
    "SoftmaxCrossEntropyLoss": {"reduction": lambda v: (v.decode() if isinstance(v, bytes) else v)
                                in ("none", "sum", "mean")},
}

CONSTANT_INPUTS = {}
