"""Converters of the elementwise activations and math functions: HardSigmoid, HardSwish, Elu, Selu, Celu,
Softplus, Softsign, ThresholdedRelu, PRelu, Mish, Shrink, Sign, Round, the trigonometric and hyperbolic
functions and CastLike.

Each is a lazy value (an expression of the language over its input), so it fuses into its producer. The
formulas and attribute defaults are those of the ONNX operator specification (onnx/docs/Operators.md);
Softplus and Mish use the overflow-free ``max(x, 0) + log(1 + exp(-|x|))`` for ``log(exp(x) + 1)``.
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, lazy, lit, tc_type
from .common import attr, unary, zero
from .logic import _nary_simple


def _one(t) -> str:
    return lit(1.0, t)


def _softplus(e, t) -> str:
    return f"(max({e}, {zero(t)}) + log({_one(t)} + exp(-fabs({e}))))"


def _hard_sigmoid_text(e, alpha, beta, t) -> str:
    return f"max({zero(t)}, min({_one(t)}, {lit(alpha, t)} * {e} + {lit(beta, t)}))"


hard_sigmoid = unary(lambda e, n, t: _hard_sigmoid_text(e, attr(n, "alpha", 0.2), attr(n, "beta", 0.5), t))
hard_swish = unary(lambda e, n, t: f"({e} * {_hard_sigmoid_text(e, 1 / 6, 0.5, t)})", True)
elu = unary(lambda e, n, t: f"({e} < {zero(t)} ? {lit(attr(n, 'alpha', 1.0), t)} * (exp({e}) - {_one(t)}) : {e})",
            True)
_SELU_ALPHA, _SELU_GAMMA = 1.67326319217681884765625, 1.05070102214813232421875
selu = unary(lambda e, n, t: (f"({e} > {zero(t)} ? {lit(attr(n, 'gamma', _SELU_GAMMA), t)} * {e} : "
                              f"{lit(attr(n, 'gamma', _SELU_GAMMA), t)} * ({lit(attr(n, 'alpha', _SELU_ALPHA), t)}"
                              f" * exp({e}) - {lit(attr(n, 'alpha', _SELU_ALPHA), t)}))"), True)
celu = unary(lambda e, n, t: (f"(max({zero(t)}, {e}) + min({zero(t)}, {lit(attr(n, 'alpha', 1.0), t)} * "
                              f"(exp({e} / {lit(attr(n, 'alpha', 1.0), t)}) - {_one(t)})))"), True)
softplus = unary(lambda e, n, t: _softplus(e, t), True)
softsign = unary(lambda e, n, t: f"({e} / ({_one(t)} + fabs({e})))", True)
thresholded_relu = unary(lambda e, n, t: f"({e} > {lit(attr(n, 'alpha', 1.0), t)} ? {e} : {zero(t)})", True)
mish = unary(lambda e, n, t: f"({e} * tanh({_softplus(e, t)}))", True)
round_ = unary(lambda e, n, t: f"rint({e})")
prelu = _nary_simple(lambda ts, t, n: f"({ts[0]} < {zero(t)} ? {ts[1]} * {ts[0]} : {ts[0]})")
prelu.__doc__ = """PRelu(X, slope): ``x < 0 ? slope * x : x``, ``slope`` broadcast to X (opset 7 on)."""


def _sign_text(e, node, t):
    """Sign: 1, -1 or 0 (a float NaN or signed zero is passed through, as numpy's ``sign``)."""
    kind = np.dtype(t).kind
    one, zero_ = lit(1, t), zero(t)
    if kind == "f":
        return f"({e} > {zero_} ? {one} : ({e} < {zero_} ? {lit(-1, t)} : {e}))"
    if kind == "u":
        return f"{tc_type(t)}({e} > {zero_} ? {one} : {zero_})"
    return f"{tc_type(t)}({e} > {zero_} ? {one} : ({e} < {zero_} ? {lit(-1, t)} : {zero_}))"


sign = unary(_sign_text, True)


def _shrink_text(e, node, t):
    """Shrink: ``x < -lambd ? x + bias : (x > lambd ? x - bias : 0)``; integers compute in double and convert
    back (truncating), as the spec's reference does."""
    lambd, bias = float(attr(node, "lambd", 0.5)), float(attr(node, "bias", 0.0))
    if np.dtype(t).kind == "f":
        lo, hi, bs = lit(-lambd, t), lit(lambd, t), lit(bias, t)
        return f"({e} < {lo} ? {e} + {bs} : ({e} > {hi} ? {e} - {bs} : {zero(t)}))"
    d = np.float64
    x = f"double({e})"
    return (f"{tc_type(t)}({x} < {lit(-lambd, d)} ? {x} + {lit(bias, d)} : "
            f"({x} > {lit(lambd, d)} ? {x} - {lit(bias, d)} : {lit(0.0, d)}))")


shrink = unary(_shrink_text, True)


def _math(fn: str):
    return unary(lambda e, n, t: f"{fn}({e})")


def cast_like(b: Builder, node):
    """CastLike(input, target_type): ``input`` converted to ``target_type``'s dtype as Cast does."""
    x = b.input(node, 0)
    # the stored dtypes: a converter sees bfloat16 as float32, but float32 -> bfloat16 still rounds
    to = np.dtype(b.tensors[node["outputs"][0]].dtype)
    if to == np.dtype(b.tensors[node["inputs"][0]].dtype):
        return [x]
    if to.kind == "b":
        return [lazy(x.shape, to, lambda idx: f"({x.at(idx)} != {zero(x.dtype)})")]
    return [lazy(x.shape, to, lambda idx: f"{tc_type(to)}({x.at(idx)})")]


_TRIG = {"Sin": 7, "Cos": 7, "Tan": 7, "Asin": 7, "Acos": 7, "Atan": 7,
         "Sinh": 9, "Cosh": 9, "Asinh": 9, "Acosh": 9, "Atanh": 9}

#: op -> ((since_version, converter), ...), oldest first.
CONVERTERS = {
    "HardSigmoid": ((6, hard_sigmoid),), "HardSwish": ((14, hard_swish),), "Elu": ((6, elu),),
    "Selu": ((6, selu),), "Celu": ((12, celu),), "Softplus": ((1, softplus),), "Softsign": ((1, softsign),),
    "ThresholdedRelu": ((10, thresholded_relu),), "PRelu": ((7, prelu),), "Mish": ((18, mish),),
    "Shrink": ((9, shrink),), "Sign": ((9, sign),), "Round": ((11, round_),), "CastLike": ((15, cast_like),),
    **{op: ((since, _math(op.lower())),) for op, since in _TRIG.items()},
}

#: Every attribute ONNX defines for the op (opsets 7..newest).
KNOWN_ATTRS = {
    "HardSigmoid": {"alpha", "beta"}, "Elu": {"alpha"}, "Selu": {"alpha", "gamma"}, "Celu": {"alpha"},
    "ThresholdedRelu": {"alpha"}, "Shrink": {"bias", "lambd"}, "CastLike": {"saturate", "round_mode"},
}

#: Attribute values polyc does not handle (none: saturate and round_mode only matter for float8 types).
SUPPORTED_VALUES = {}

#: Inputs that must be compile-time constants (none).
CONSTANT_INPUTS = {}
