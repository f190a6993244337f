"""Converters of the quantized ops: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear, MatMulInteger,
ConvInteger, QLinearMatMul and QLinearConv (onnx/docs/Operators.md, sections of the same names).

Formulas of the specification:

- QuantizeLinear: ``y = saturate(round(x / y_scale) + y_zero_point)``, round half to even, saturated to the
  output type's range (int8, uint8, int16, uint16);
- DequantizeLinear: ``y = (x - x_zero_point) * x_scale`` (x int8, uint8, int16, uint16, int32);
- scales and zero points per tensor (a scalar or a 1-element tensor), per axis (1-D along ``axis``) or blocked
  (``block_size`` elements of ``axis`` share one, opset 21);
- the integer ops accumulate ``(a - a_zero_point) * (b - b_zero_point)`` in int32; the QLinear ops requantize
  the accumulator in float32 with ``a_scale * b_scale / y_scale`` as onnxruntime does, round half to even,
  add ``y_zero_point`` and saturate.

Quantize/Dequantize are lazy expressions (they fuse into their producer and consumer); the integer products
are emitted reductions. float8, 4-bit and 2-bit types are refused with an UnsupportedError naming the node.
"""
from __future__ import annotations

import numpy as np

from ...errors import ShapeError
from ..builder import Builder, lazy, lit, tc_type
from .common import attr, guard, norm_axis, pads_begin, reduce, reduction_dims, spatial_params, window
from .core import _batch_index

#: Integer types a quantized tensor may have here, with their ranges.
_RANGES = {"int8": (-128, 127), "uint8": (0, 255), "int16": (-32768, 32767), "uint16": (0, 65535),
           "int32": (-2**31, 2**31 - 1)}
#: Beyond this magnitude a rounded float32 quotient saturates every output type but int32, and is exact.
_BIG = 2**24


def _qtype(b: Builder, dtype, what: str, allowed=("int8", "uint8", "int16", "uint16")) -> str:
    name = np.dtype(dtype).name
    if name not in allowed:
        raise b.error(f"{what} of type {name} is not supported (polyc quantizes to {', '.join(allowed)})")
    return name


def _shape_error(b: Builder, message: str) -> ShapeError:
    return ShapeError(f"{message} on node {b.node_id} ({b.node_op}, opset {b.opset})")


def _param(b: Builder, v, x_shape, axis: int, block: int, what: str):
    """``idx -> text`` reading scale or zero point ``v`` (per tensor, per axis or blocked) at element ``idx``
    of a tensor of shape ``x_shape``; None when ``v`` is absent. Raises ShapeError on a shape that fits neither."""
    if v is None:
        return None
    size = int(np.prod(v.shape)) if v.shape else 1
    if size == 1 and not block:
        zeros = ["0"] * len(v.shape)
        return lambda idx: v.at(zeros)
    if not 0 <= axis < len(x_shape):
        raise _shape_error(b, f"axis {axis} is out of range for an input of rank {len(x_shape)}")
    if block:
        if len(v.shape) != len(x_shape) or any(s != n for d, (s, n) in enumerate(zip(v.shape, x_shape))
                                                  if d != axis) \
                or v.shape[axis] != -(-x_shape[axis] // block):
            raise _shape_error(b, f"{what} of shape {list(v.shape)} does not block input shape "
                                  f"{list(x_shape)} with block_size {block} along axis {axis}")
        return lambda idx: v.at([f"{i}/{block}" if d == axis else i for d, i in enumerate(idx)])
    if len(v.shape) != 1 or v.shape[0] != x_shape[axis]:
        raise _shape_error(b, f"{what} of shape {list(v.shape)} is neither per-tensor nor per-axis for input "
                              f"shape {list(x_shape)} along axis {axis}")
    return lambda idx: v.at([idx[axis]])


def _axis_block(b: Builder, node, rank: int):
    """(axis, block_size) of ``node``; an axis out of range is kept as is (only per-axis parameters read it)."""
    axis = attr(node, "axis", 1)
    return (norm_axis(axis, rank) if -rank <= axis < rank else axis), int(attr(node, "block_size", 0) or 0)


def saturated(value: str, dtype: str, zp: str | None = None) -> str:
    """Text of ``saturate(rint(value) + zp)`` converted to ``dtype``: ``value`` a float expression, ``zp`` an
    integer one. The rounded value is clamped to +-2**24 before the int32 conversion (a NaN clamps to the low
    end, as numpy's conversion of NaN to int32 then saturation gives), so nothing overflows."""
    lo, hi = _RANGES[dtype]
    r = f"int32(fmin(fmax(rint({value}), {lit(-_BIG)}), {lit(_BIG)}))"
    if zp is not None:
        r = f"{r} + int32({zp})"
    if dtype == "int32":
        return r
    return f"{tc_type(dtype)}(min(max({r}, {lo}), {hi}))"


# ---- QuantizeLinear / DequantizeLinear ---------------------------------------------------------------------

def quantize_linear(b: Builder, node):
    """QuantizeLinear (opsets 10-25): ``saturate(rint(x / y_scale) + y_zero_point)``.

    x float32/float16/bfloat16 of any shape; y_scale and y_zero_point per tensor, per ``axis`` or blocked by
    ``block_size``; the output type is the zero point's, else ``output_dtype``, else uint8. The quotient is
    computed in float32 (rounded to float16/bfloat16 first for such an input, as the spec computes in x's type,
    unless ``precision`` is float32).
    Raises UnsupportedError (naming the node) for float8/4-bit outputs and scale shapes that do not fit x.
    """
    x, scale, zp = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    out = _qtype(b, b.tensors[node["outputs"][0]].dtype, "output")
    axis, block = _axis_block(b, node, len(x.shape))
    s = _param(b, scale, x.shape, axis, block, "y_scale")
    z = _param(b, zp, x.shape, axis, block, "y_zero_point")
    storage = np.dtype(b.tensors[node["inputs"][0]].dtype).name
    storage = storage if storage in ("float16", "bfloat16") and attr(node, "precision", 0) != 1 else None

    def text(idx):
        q = f"{x.at(idx)} / {s(idx)}"
        if storage:
            q = f"float({tc_type(storage)}({q}))"
        return saturated(q, out, z(idx) if z else None)
    return [lazy(x.shape, np.dtype(out), text)]


def dequantize_linear(b: Builder, node):
    """DequantizeLinear (opsets 10-25): ``(x - x_zero_point) * x_scale`` in float32, the result of x_scale's
    type (``output_dtype`` from opset 23 must agree). x int8/uint8/int16/uint16/int32; parameters per
    tensor, per ``axis`` or blocked. Raises UnsupportedError for float8/4-bit inputs."""
    x, scale, zp = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    _qtype(b, x.dtype, "input x", tuple(_RANGES))
    axis, block = _axis_block(b, node, len(x.shape))
    s = _param(b, scale, x.shape, axis, block, "x_scale")
    z = _param(b, zp, x.shape, axis, block, "x_zero_point")
    dtype = b.out_dtype(node)

    def text(idx):
        d = f"float({x.at(idx)})" if z is None else f"(float({x.at(idx)}) - float({z(idx)}))"
        return f"({d} * {s(idx)})"
    return [lazy(x.shape, dtype, text)]


def dynamic_quantize_linear(b: Builder, node):
    """DynamicQuantizeLinear (opset 11): uint8 ``y`` with ``y_scale = (max(0, max x) - min(0, min x)) / 255``
    and ``y_zero_point = rint(clamp(-min(0, min x) / y_scale, 0, 255))``; x float32 of any shape, the scale a
    float32 scalar, the zero point a uint8 scalar (an all-zero x gives scale 1 and y 0, as onnxruntime; onnx's
    reference gives 1/255 and the spec's formula divides by 0)."""
    x = b.simple(b.input(node, 0))
    t = x.dtype
    axes = range(len(x.shape))
    mx, _ = reduce(b, x.shape, axes, "max=!", t, lambda idx: x.at(idx))
    mn, _ = reduce(b, x.shape, axes, "min=!", t, lambda idx: x.at(idx))
    hi, lo = f"fmax({mx.at([])}, 0.0)", f"fmin({mn.at([])}, 0.0)"
    scale = b.emit((), t, lambda idx, red: f"({hi} == {lo}) ? 1.0 : ({hi} - {lo}) / 255.0")
    zp = b.emit((), np.dtype(np.uint8), lambda idx, red: saturated(
        f"fmin(fmax(0.0 - {lo} / {scale.at([])}, 0.0), 255.0)", "uint8"))
    y = lazy(x.shape, np.dtype(np.uint8), lambda idx: saturated(f"{x.at(idx)} / {scale.at([])}", "uint8",
                                                               zp.at([])))
    return [y, scale, zp]


# ---- integer matrix products ---------------------------------------------------------------------------------

def _zp_reader(b: Builder, v, extent: int, what: str):
    """Reader of a zero point or scale that is per tensor or a 1-D tensor of ``extent`` elements
    (``at(i)`` with i the row/column/channel index text)."""
    if v is None:
        return None
    size = int(np.prod(v.shape)) if v.shape else 1
    if size == 1:
        zeros = ["0"] * len(v.shape)
        return lambda i: v.at(zeros)
    if v.shape[-1] == extent and size == extent:
        return lambda i: v.at(["0"] * (len(v.shape) - 1) + [i])
    raise _shape_error(b, f"{what} of shape {list(v.shape)} is neither per-tensor nor of {extent} elements")


def _int_matmul(b: Builder, node, a, m, za, zm):
    """int32 ``sum_k (a - za) * (m - zm)`` with numpy's MatMul batching; za per row of a, zm per column of m."""
    ys = b.out_shape(node)
    for v, what in ((a, "A"), (m, "B")):
        _qtype(b, v.dtype, f"input {what}", ("int8", "uint8"))
    ar, mr = len(a.shape), len(m.shape)
    k = a.shape[-1]
    nb = len(ys) - (ar > 1) - (mr > 1)
    out_batch = ys[:nb]
    rza = _zp_reader(b, za, a.shape[-2] if ar > 1 else 1, "a_zero_point")
    rzm = _zp_reader(b, zm, m.shape[-1] if mr > 1 else 1, "b_zero_point")

    def body(idx, red):
        r = red[0]
        batch = idx[:nb]
        ai = [r] if ar == 1 else _batch_index(a.shape[:-2], out_batch, batch) + [idx[nb], r]
        mi = [r] if mr == 1 else _batch_index(m.shape[:-2], out_batch, batch) + [r, idx[-1]]
        ea, em = f"int32({a.at(ai)})", f"int32({m.at(mi)})"
        if rza is not None:
            ea = f"({ea} - int32({rza(idx[nb] if ar > 1 else '0')}))"
        if rzm is not None:
            em = f"({em} - int32({rzm(idx[-1] if mr > 1 else '0')}))"
        return f"{ea} * {em}"
    return b.emit(ys, np.dtype(np.int32), body, "+=!", [k]), nb


def matmul_integer(b: Builder, node):
    """MatMulInteger (opset 10): int32 ``(A - a_zero_point) @ (B - b_zero_point)``, numpy MatMul batching; A, B
    int8/uint8; a_zero_point per tensor or per row of A, b_zero_point per tensor or per column of B."""
    a, m = b.input(node, 0), b.input(node, 1)
    t, _ = _int_matmul(b, node, a, m, b.input(node, 2), b.input(node, 3))
    return [t]


def qlinear_matmul(b: Builder, node):
    """QLinearMatMul (opsets 10, 21): the int32 product of the centered operands requantized in float32,
    ``saturate(rint(acc * (a_scale * b_scale / y_scale)) + y_zero_point)``; a's scale and zero point per
    tensor or per row, b's per tensor or per column, y's per tensor or per row (output type y_zero_point's)."""
    a, sa, za, m, sm, zm, sy, zy = (b.input(node, k) for k in range(8))
    acc, nb = _int_matmul(b, node, a, m, za, zm)
    ys = b.out_shape(node)
    out = _qtype(b, b.tensors[node["outputs"][0]].dtype, "output", ("int8", "uint8"))
    rows, cols = (a.shape[-2] if len(a.shape) > 1 else 1), (m.shape[-1] if len(m.shape) > 1 else 1)
    rsa, rsm = _zp_reader(b, sa, rows, "a_scale"), _zp_reader(b, sm, cols, "b_scale")
    rsy, rzy = _zp_reader(b, sy, rows, "y_scale"), _zp_reader(b, zy, rows, "y_zero_point")

    def text(idx):
        row = idx[nb] if len(a.shape) > 1 else "0"
        col = idx[-1] if len(m.shape) > 1 else "0"
        mult = f"({rsa(row)} * {rsm(col)} / {rsy(row)})"
        return saturated(f"float({acc.at(idx)}) * {mult}", out, rzy(row) if rzy else None)
    return [lazy(ys, np.dtype(out), text)]


# ---- integer convolutions -------------------------------------------------------------------------------------

def _int_conv(b: Builder, node, x, w, zx, zw, bias=None):
    """int32 ``sum (x - zx) * (w - zw)`` over a Conv window (pads read as zx, so they add 0); zx per tensor,
    zw per tensor or per output channel; ``bias`` (int32, per output channel) added."""
    for v, what in ((x, "x"), (w, "w")):
        _qtype(b, v.dtype, f"input {what}", ("int8", "uint8"))
    ys = b.out_shape(node)
    nsp, kernel, strides, dil = spatial_params(b, node, x, w.shape)
    pb = pads_begin(node, x.shape[2:], ys[2:], kernel, strides, dil)
    group = attr(node, "group", 1)
    cg, og = w.shape[1], w.shape[0] // group
    rzx = _zp_reader(b, zx, 1, "x_zero_point")
    rzw = _zp_reader(b, zw, w.shape[0], "w_zero_point")
    real, names = reduction_dims([cg] + kernel)

    def body(idx, red):
        n, o, sp = idx[0], idx[1], idx[2:]
        c, *ks = names(red)
        ch = c if group == 1 else (f"{cg}*({o}/{og})+{c}" if cg > 1 else f"{o}/{og}")
        coords, conds = [], []
        for i in range(nsp):
            t, cs = window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        ex, ew = f"int32({x.at([n, ch] + coords)})", f"int32({w.at([o, c] + ks)})"
        if rzx is not None:
            ex = f"({ex} - int32({rzx('0')}))"
        if rzw is not None:
            ew = f"({ew} - int32({rzw(o)}))"
        prod = f"{ex} * {ew}"
        return f"({guard(conds)}) ? {prod} : 0" if conds else prod
    t = b.emit(ys, np.dtype(np.int32), body, "+=!" if real else "=", real)
    if bias is not None:
        return lazy(ys, np.dtype(np.int32), lambda idx: f"({t.at(idx)} + int32({bias.at([idx[1]])}))"), ys
    return t, ys


def conv_integer(b: Builder, node):
    """ConvInteger (opset 10): int32 Conv of ``x - x_zero_point`` (per tensor) and ``w - w_zero_point`` (per
    tensor or per output channel); x, w int8/uint8; Conv's pads, strides, dilations, group, auto_pad."""
    t, _ = _int_conv(b, node, b.input(node, 0), b.input(node, 1), b.input(node, 2), b.input(node, 3))
    return [t]


def qlinear_conv(b: Builder, node):
    """QLinearConv (opset 10): inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale,
    y_zero_point, optional int32 bias B; the int32 accumulation (+ B) requantized in float32 with
    ``x_scale * w_scale[m] / y_scale``, round half to even, + y_zero_point, saturated to its type."""
    x, sx, zx, w, sw, zw, sy, zy, bias = (b.input(node, k) for k in range(9))
    acc, ys = _int_conv(b, node, x, w, zx, zw, bias)
    out = _qtype(b, b.tensors[node["outputs"][0]].dtype, "output", ("int8", "uint8"))
    rsx, rsw = _zp_reader(b, sx, 1, "x_scale"), _zp_reader(b, sw, w.shape[0], "w_scale")
    rsy, rzy = _zp_reader(b, sy, 1, "y_scale"), _zp_reader(b, zy, 1, "y_zero_point")

    def text(idx):
        mult = f"({rsx('0')} * {rsw(idx[1])} / {rsy('0')})"
        return saturated(f"float({acc.at(idx)}) * {mult}", out, rzy("0") if rzy else None)
    return [lazy(ys, np.dtype(out), text)]


#: op -> ((since_version, converter), ...)
CONVERTERS = {
    "QuantizeLinear": ((10, quantize_linear),), "DequantizeLinear": ((10, dequantize_linear),),
    "DynamicQuantizeLinear": ((11, dynamic_quantize_linear),), "MatMulInteger": ((10, matmul_integer),),
    "QLinearMatMul": ((10, qlinear_matmul),), "ConvInteger": ((10, conv_integer),),
    "QLinearConv": ((10, qlinear_conv),),
}

_SPATIAL = {"auto_pad", "dilations", "kernel_shape", "pads", "strides", "group"}

#: Every attribute ONNX defines for the op (opsets 10..25).
KNOWN_ATTRS = {
    "QuantizeLinear": {"axis", "saturate", "block_size", "output_dtype", "precision"},
    "DequantizeLinear": {"axis", "block_size", "output_dtype"},
    "ConvInteger": _SPATIAL, "QLinearConv": _SPATIAL,
}

#: ``precision`` (opset 25) other than the default (x's type) or float32 is not supported.
SUPPORTED_VALUES = {
    "QuantizeLinear": {"precision": lambda v: v in (0, 1)},
}

CONSTANT_INPUTS = {}
