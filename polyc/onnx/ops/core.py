"""Converters of the core ops: elementwise, Conv/Gemm/MatMul, pooling, normalization, Softmax (the ReduceX
ops are in :mod:`.reduction`).

Each converter is a plain function ``convert(b, node) -> list[Val]`` (one Val per output) using the
:class:`~polyc.onnx.builder.Builder` ``b``. :data:`CONVERTERS` maps an op to ``(since_version, function)``
pairs; :func:`converter` picks the newest one not newer than the model's opset (TVM's ``_impl_vN`` idea).
Where an attribute became an input (Squeeze/Unsqueeze/Split/Slice/Pad/Clip) one function
reads either form by looking at ``b.opset``; where the meaning changed (Softmax's flatten-at-axis rule before
13) there are two functions. :func:`check_node` lists what a node uses that polyc does not support.
"""
from __future__ import annotations

import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ...target import host_target
from ..builder import Builder, broadcast_index, lazy, lit, rounded, tc_type, times
from ..graph import LAYOUT_ATTR, NCHW_IN, NHWC, ZERO_TAPS_ATTR
from .common import (aff, attr, fold, guard, lowest, nary, norm_axis, pads_begin, reduce, reduce_op_for,
                     reduction_dims, spatial_params, unary, window, zero)

# ---- helpers ------------------------------------------------------------------------------------------------

relu = unary(lambda e, n, t: f"max({e}, {zero(t)})")
sigmoid = unary(lambda e, n, t: f"sigmoid({e})")
tanh = unary(lambda e, n, t: f"tanh({e})")
erf = unary(lambda e, n, t: f"erf({e})")
exp = unary(lambda e, n, t: f"exp({e})")
log = unary(lambda e, n, t: f"log({e})")
sqrt = unary(lambda e, n, t: f"sqrt({e})")
floor = unary(lambda e, n, t: f"floor({e})")
ceil = unary(lambda e, n, t: f"ceil({e})")
neg = unary(lambda e, n, t: f"(-{e})")
reciprocal = unary(lambda e, n, t: f"({lit(1.0, t)} / {e})")
abs_ = unary(lambda e, n, t: f"fabs({e})" if np.dtype(t).kind == "f" else f"abs({e})")
leaky_relu = unary(lambda e, n, t: f"({e} > {zero(t)} ? {e} : {lit(attr(n, 'alpha', 0.01), t)} * {e})", True)


def _gelu_text(e, node, t):
    if attr(node, "approximate", "none") == "tanh":
        return (f"{lit(0.5, t)} * {e} * ({lit(1.0, t)} + tanh({lit(np.sqrt(2 / np.pi), t)} * "
                f"({e} + {lit(0.044715, t)} * {e} * {e} * {e})))")
    return f"{lit(0.5, t)} * {e} * ({lit(1.0, t)} + erf({e} * {lit(1 / np.sqrt(2), t)}))"


gelu = unary(_gelu_text, True)


def cast(b: Builder, node):
    """Cast: ``to`` as a TC conversion (``float(e)``, ``int64(e)``; to bool: ``e != 0``)."""
    x = b.input(node, 0)
    to = np.dtype(helper.tensor_dtype_to_np_dtype(attr(node, "to")))
    if to.kind == "b":
        return [lazy(x.shape, to, lambda idx: f"({x.at(idx)} != {zero(x.dtype)})")]
    return [lazy(x.shape, to, lambda idx: f"{tc_type(to)}({x.at(idx)})")]


def _pow_text(terms, dtype, node):
    if np.dtype(dtype).kind == "f":
        return f"pow({terms[0]}, {terms[1]})"
    return f"{tc_type(dtype)}(pow(double({terms[0]}), double({terms[1]})))"


add = nary(lambda ts, t, n: "(" + " + ".join(ts) + ")")
sub = nary(lambda ts, t, n: f"({ts[0]} - {ts[1]})")
mul = nary(lambda ts, t, n: f"({ts[0]} * {ts[1]})")
def _div_text(ts, t, n):
    if np.dtype(t).kind == "f":
        return f"({ts[0]} / {ts[1]})"
    # ONNX integer division truncates toward zero; the language's rounds toward minus infinity
    a, c = ts
    if np.dtype(t).kind == "u":
        return f"({a} / {c})"
    return f"((({a} % {c}) != 0 && (({a} < 0 && {c} > 0) || ({a} > 0 && {c} < 0))) ? {a} / {c} + 1 : {a} / {c})"


div = nary(_div_text)
sum_ = add
max_ = nary(fold(lambda a, c: f"max({a}, {c})"))
min_ = nary(fold(lambda a, c: f"min({a}, {c})"))
mean = nary(lambda ts, t, n: f"(({' + '.join(ts)}) / {lit(len(ts), t)})")


def pow_(b: Builder, node):
    """Pow with numpy broadcasting; a constant exponent 1, 2, 3 becomes products, 0.5 ``sqrt``."""
    exponent = node["inputs"][1]
    if exponent in b.consts and np.asarray(b.consts[exponent]).size == 1:
        e = float(np.asarray(b.consts[exponent]).reshape(-1)[0])
        x = b.input(node, 0)
        shape, dtype = b.out_shape(node), b.out_dtype(node)
        if e in (1.0, 2.0, 3.0) and x.shape == shape:
            x = b.simple(x)
            return [lazy(shape, dtype, lambda idx: "(" + " * ".join([x.at(idx)] * int(e)) + ")")]
        if e == 0.5 and x.shape == shape:
            return [lazy(shape, dtype, lambda idx: f"sqrt({x.at(idx)})")]
    return nary(_pow_text)(b, node)


def clip(b: Builder, node):
    """Clip: bounds from attributes ``min``/``max`` before opset 11, from optional inputs after."""
    x = b.input(node, 0)
    dtype = b.out_dtype(node)
    if b.opset < 11:
        lo = attr(node, "min", None)
        hi = attr(node, "max", None)
        lo = None if lo is None else (lambda t=lit(lo, dtype): t)
        hi = None if hi is None else (lambda t=lit(hi, dtype): t)
    else:
        vlo, vhi = b.input(node, 1), b.input(node, 2)
        lo = None if vlo is None else (lambda v=vlo: v.at([]))
        hi = None if vhi is None else (lambda v=vhi: v.at([]))

    def text(idx):
        e = x.at(idx)
        if lo is not None:
            e = f"max({e}, {lo()})"
        if hi is not None:
            e = f"min({e}, {hi()})"
        return e
    return [lazy(x.shape, dtype, text)]


def batchnorm(b: Builder, node):
    """Inference BatchNormalization with tensor parameters (constant ones are folded by the passes)."""
    x = b.input(node, 0)
    scale, bias, mean_, var = (b.input(node, k) for k in range(1, 5))
    eps = lit(attr(node, "epsilon", 1e-5), x.dtype)

    def text(idx):
        c = [idx[1]]
        return (f"(({x.at(idx)} - {mean_.at(c)}) * {scale.at(c)} / sqrt({var.at(c)} + {eps}) + {bias.at(c)})")
    return [lazy(x.shape, x.dtype, text)]


# ---- anchors: Conv, ConvTranspose, Gemm, MatMul ---------------------------------------------------------------

#: Below this output width a convolution with at least CHANNELS_LAST_MIN_CHANNELS output channels computes
#: channels-last (see :func:`conv`): two 8-lane (AVX2) or one 16-lane (AVX-512) vector of columns.
CHANNELS_LAST_MAX_WIDTH = 16
CHANNELS_LAST_MIN_CHANNELS = 32

#: ... and, for a wider one with a window, at least this many input channels: a network's stem (3 channels, 12
#: after space-to-depth) reads back a large channels-last result for few terms per output (7x7/2 at 224:
#: 1.38 -> 1.59 ms, 3x3/2 1.0x slower on AVX-512, AVX2 1.4x faster), while 16 channels pay for it: 3x3
#: convolutions channels-last, 1 thread, this Zen 5 host (NCHW -> channels-last, AVX-512 / AVX2): 16 -> 64
#: channels at 55x55 0.395 -> 0.295 / 0.708 -> 0.559 ms (SqueezeNet's fire expand), 16 -> 64 at 28x28 0.103
#: -> 0.082 / 0.153 -> 0.150, 16 -> 32 at 56x56 0.160 -> 0.155 / 0.295 -> 0.288.
CHANNELS_LAST_MIN_IN_CHANNELS = 16

#: A wider convolution with a window (not 1x1) computes channels-last when its output channels fill the
#: register tile's vectors exactly and its width leaves at least this share of the lanes of its row tiles
#: empty (28 columns in tiles of 16: 4 of 32 lanes). Measured (1 thread, Zen 4, medians of 3 processes),
#: 3x3 convolutions, NCHW -> channels-last: AVX2 64 channels at 28x28 0.66 -> 0.59 ms, 128 at 28x28
#: 2.58 -> 2.30, 64 at 56x56 2.59 -> 2.37; AVX-512 64 at 28x28 0.59 -> 0.55, 128 at 28x28 2.34 -> 2.14,
#: 64 at 56x56 (8 of 64 lanes empty) 2.19 -> 2.20; while 40 channels at 28x28 on AVX2 (tiles of 16, 16
#: and 8 channels) lose 12% channels-last.
CHANNELS_LAST_MIN_EMPTY_LANES = 0.1

#: A wider 1x1 convolution (a GEMM over its pixels: :func:`polyc.onnx.passes.flatten_pointwise_conv` gives
#: it one row of ``H*W``) computes channels-last when its pixels leave at least this share of the lanes of
#: their register tiles empty (49 pixels in tiles of 16: 15 of 64, a one-pixel tail on its own) ...
CHANNELS_LAST_MIN_EMPTY_LANES_1X1 = 0.2

#: ... and it reduces over at least this many input channels: the read-back to NCHW is one more pass over
#: the output, paid for by a deeper reduction. Measured (single Conv nodes at 7x7 flattened, 1 thread, Zen 4,
#: onnxruntime / polyc before -> after; AVX2): 2048 -> 512 0.73-0.77 -> 0.93-0.94, 512 -> 2048 0.79 -> 0.86,
#: ResNet's 1x1/2 1024 -> 2048 at 14x14 0.74 -> 0.89, 1152 -> 192 0.88 -> 1.03, 576 -> 160 0.80 -> 0.99, 384 ->
#: 1536 0.67 -> 0.88, 256 -> 1024 0.80 -> 0.82, 320 -> 1280 0.78 either way, and below the threshold 160 ->
#: 960 0.85 -> 0.76, 128 -> 512 0.86 -> 0.80; AVX-512 (the image flattened first) 512 -> 2048 0.89 -> 0.92,
#: 2048 -> 512 0.97 -> 0.98, 1024 -> 2048/2 0.99 -> 1.03. At 14x14 (196 pixels: 12 of 208 lanes empty with
#: AVX2, 28 of 224 with AVX-512) channels-last lost: AVX-512 256 -> 1024 0.97 -> 0.89, 1024 -> 512 0.97
#: -> 0.94; AVX2 256 -> 1024 0.93 -> 0.89, 1024 -> 512 0.91 -> 0.88.
CHANNELS_LAST_MIN_DEPTH = 256


def vector_lanes(dtype: str) -> int:
    """The vector lanes of ``dtype`` on the target the kernels are compiled for (``POLYC_CPU`` or the host)."""
    return host_target().lanes(np.dtype(dtype).name)


def l2_bytes() -> int:
    """The L2 cache size of the target the kernels are compiled for, in bytes."""
    return host_target().l2_bytes


def channels_last(out_shape, group: int, constant_weights: bool, kernel=(), dtype="float32",
                  in_channels: int = 0, strided: bool = False) -> bool:
    """Whether :func:`conv` computes a convolution of output shape ``out_shape`` (N, M, spatial..) with
    window ``kernel`` channels-last: group 1, constant weights and at least CHANNELS_LAST_MIN_CHANNELS
    output channels, and either an output narrower than CHANNELS_LAST_MAX_WIDTH or, for a window larger
    than 1x1, at least CHANNELS_LAST_MIN_IN_CHANNELS input channels (``in_channels``: with fewer, the
    read-back of the channels-last result costs more than it saves: the stem of a network, 3 channels as 12
    after space-to-depth, 1.38 -> 1.59 ms on AVX-512), output channels a multiple of the register tile's
    width NR (two vectors) and either a width whose tiles of NR leave at least CHANNELS_LAST_MIN_EMPTY_LANES of
    their lanes empty or a stride above 1 along the width (``strided``: NCHW would load every vector of its
    input with that stride; channels-last broadcasts one input element per row). Measured (1 thread, this
    Zen 5 host, NCHW -> channels-last, AVX-512 / AVX2): a 1-D convolution 256 -> 256 channels, k3 stride 2,
    1000 -> 500 columns (the Whisper-style encoder's second) 1.35 -> 0.97 / 3.77 -> 1.99 ms (onnxruntime
    0.96); at stride 1 (80 -> 256, k3) channels-last is slower, 0.54 -> 0.66. A wider 1x1 convolution
    (``kernel`` all ones) computes channels-last when it reduces over at least CHANNELS_LAST_MIN_DEPTH input
    channels, its output channels are a multiple of NR and its width leaves at least
    CHANNELS_LAST_MIN_EMPTY_LANES_1X1 of the lanes empty; without ``kernel``, never."""
    if not (group == 1 and len(out_shape) >= 3 and out_shape[1] >= CHANNELS_LAST_MIN_CHANNELS
            and constant_weights):
        return False
    width, channels = out_shape[-1], out_shape[1]
    if width < CHANNELS_LAST_MAX_WIDTH:
        return True
    nr = 2 * vector_lanes(dtype)
    lanes = -(-width // nr) * nr
    empty = (lanes - width) / lanes
    if kernel and all(k == 1 for k in kernel):
        return (in_channels >= CHANNELS_LAST_MIN_DEPTH and channels % nr == 0
                and empty >= CHANNELS_LAST_MIN_EMPTY_LANES_1X1)
    if not kernel or in_channels < CHANNELS_LAST_MIN_IN_CHANNELS:
        return False
    return channels % nr == 0 and (strided or empty >= CHANNELS_LAST_MIN_EMPTY_LANES)


#: At most this many boxes in :func:`tap_boxes`: each is a piece of the reduction's domain, and isl's AST
#: gives every piece loops of its own.
MAX_TAP_BOXES = 8


def tap_boxes(weights: np.ndarray):
    """The taps of a Conv's constant ``weights`` (M, C/group, k..) that some output channel uses, as boxes
    ``[(c0, c1, ((lo, hi) per window dim)), ...]``: input channels ``c0 <= c < c1`` use the window taps
    ``lo <= k < hi`` of every dim. None when every tap is used or the used taps are not such a union of at
    most :data:`MAX_TAP_BOXES` boxes over runs of channels with the same taps.

    A space-to-depth convolution (:func:`polyc.onnx.passes.strided_conv_to_space_to_depth`, phase-major
    channels) has one box per phase: a 7x7 stride-2 stem's 12 channels x 4x4 taps are 3 x (4x4 + 4x3 + 3x4 +
    3x3) = 147 used taps of 192, and the reduction over the boxes' union (:func:`tap_condition`) does the 49
    multiply-adds per input channel of the strided convolution instead of 64. NaN weights count as used."""
    used = np.any(weights != 0, axis=0)
    if used.all():
        return None
    boxes, c = [], 0
    while c < used.shape[0]:
        end = c + 1
        while end < used.shape[0] and np.array_equal(used[end], used[c]):
            end += 1
        if used[c].any():
            where = np.nonzero(used[c])
            ranges = tuple((int(i.min()), int(i.max()) + 1) for i in where)
            if not used[c][tuple(slice(lo, hi) for lo, hi in ranges)].all():
                return None
            boxes.append((c, end, ranges))
        c = end
    return boxes if 0 < len(boxes) <= MAX_TAP_BOXES else None


def tap_condition(boxes, channel: str, taps, channels: int, kernel) -> str:
    """The condition, in the reduction's index texts ``channel`` and ``taps`` (``"0"`` for an extent of 1),
    that holds on the union of ``boxes`` (:func:`tap_boxes`) within ``channels`` x ``kernel``. It guards the
    product with a zero, which :func:`polyc.poly.build.guard_into_domain` moves into the iteration domain."""
    terms = []
    for c0, c1, ranges in boxes:
        conds = [f"{channel} >= {c0}"] if c0 > 0 else []
        conds += [f"{channel} < {c1}"] if c1 < channels else []
        for name, (lo, hi), n in zip(taps, ranges, kernel):
            conds += [f"{name} >= {lo}"] if lo > 0 else []
            conds += [f"{name} < {hi}"] if hi < n else []
        terms.append("(" + " && ".join(conds) + ")")
    return "(" + " || ".join(terms) + ")"


def _skipped_taps(b: Builder, node):
    """:func:`tap_boxes` of ``node``'s weights when it carries :data:`~polyc.onnx.graph.ZERO_TAPS_ATTR`."""
    weights = node["inputs"][1]
    if attr(node, ZERO_TAPS_ATTR, 0) != 1 or weights not in b.consts:
        return None
    return tap_boxes(np.asarray(b.consts[weights]))


def conv(b: Builder, node):
    """Conv (1-D/2-D/3-D): pads, strides, dilations, group, auto_pad; padding reads guarded by ``?:``.

    A layout decision, as onnxruntime's NCHWc: in NCHW the only stride-1 dimension of the output is its
    width, and a width of 7 or 14 (ResNet's last stages) fills vectors badly. When the output is narrower
    than CHANNELS_LAST_MAX_WIDTH, the weights are a compile-time constant, ``group`` is 1 and there are at
    least CHANNELS_LAST_MIN_CHANNELS output channels, the convolution accumulates into a channels-last
    temporary ``T(n, spatial.., m)`` from weights transposed at compile time to ``(c, k.., m)``, so the
    output channel is the stride-1 (vector) dimension; the NCHW result is read back from ``T`` by the
    statement that applies the bias and whatever the group fuses after the convolution.
    """
    if attr(node, LAYOUT_ATTR) in (NHWC, NCHW_IN):
        return [_conv_nhwc(b, node, nchw_input=attr(node, LAYOUT_ATTR) == NCHW_IN)]
    x = b.input(node, 0)
    weights = node["inputs"][1]
    ys = b.out_shape(node)
    nsp, kernel, strides, dil = spatial_params(b, node, x, tuple(b.tensors[weights].shape))
    pb = pads_begin(node, x.shape[2:], ys[2:], kernel, strides, dil)
    group = attr(node, "group", 1)
    boxes = _skipped_taps(b, node)
    if channels_last(ys, group, weights in b.consts, kernel, x.dtype, x.shape[1], strides[-1] > 1):
        wt = b.constant_table(np.ascontiguousarray(np.moveaxis(np.asarray(b.consts[weights]), 0, -1)), "wT")
        return [_conv_channels_last(b, x, wt, b.input(node, 2), ys, kernel, strides, dil, pb, boxes)]
    w, bias = b.input(node, 1), b.input(node, 2)
    cg, og = w.shape[1], w.shape[0] // group

    real, names = reduction_dims([cg] + kernel)

    def body(idx, red):
        n, o, sp = idx[0], idx[1], idx[2:]
        c, *ks = names(red)
        if group == 1:
            ch = c
        elif cg == 1 and og == 1:
            ch = o
        else:
            ch = f"{times(cg, f'({o}/{og})')}+{c}" if cg > 1 else f"{o}/{og}"
        coords, conds = [], []
        for i in range(nsp):
            t, cs = window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        prod = f"{x.at([n, ch] + coords)} * {w.at([o, c] + ks)}"
        conds = ([tap_condition(boxes, c, ks, cg, kernel)] if boxes else []) + conds
        return f"({guard(conds)}) ? {prod} : {zero(x.dtype)}" if conds else prod
    t = b.emit(ys, x.dtype, body, reduce_op_for(real), real)
    if bias is None:
        return [t]
    return [lazy(ys, x.dtype, lambda idx: f"({t.at(idx)} + {bias.at([idx[1]])})")]


def _conv_channels_last(b: Builder, x, wt, bias, ys, kernel, strides, dil, pb, boxes=None):
    """``T(n, sp.., m) += X(n, c, window..) * WT(c, k.., m)`` and the NCHW view of ``T`` (+ bias)."""
    t = _channels_last_sum(b, x, wt, (ys[0],) + tuple(ys[2:]) + (ys[1],), kernel, strides, dil, pb, boxes)

    def nchw(idx):
        value = t.at([idx[0]] + list(idx[2:]) + [idx[1]])
        return f"({value} + {bias.at([idx[1]])})" if bias is not None else value
    return lazy(ys, x.dtype, nchw)


def _channels_last_sum(b: Builder, x, wt, cl_shape, kernel, strides, dil, pb, boxes=None):
    """``T(n, sp.., m) += X(n, c, window..) * WT(c, k.., m)`` of output shape ``cl_shape`` from an NCHW input,
    over the used taps ``boxes`` (:func:`tap_boxes`) only when given."""
    nsp = len(kernel)
    real, names = reduction_dims([x.shape[1]] + kernel)

    def body(idx, red):
        n, sp, m = idx[0], idx[1:1 + nsp], idx[-1]
        c, *ks = names(red)
        coords, conds = [], []
        for i in range(nsp):
            t, cs = window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[2 + i], cl_shape[1 + i], kernel[i])
            coords.append(t)
            conds += cs
        prod = f"{x.at([n, c] + coords)} * {wt.at([c] + ks + [m])}"
        conds = ([tap_condition(boxes, c, ks, x.shape[1], kernel)] if boxes else []) + conds
        return f"({guard(conds)}) ? {prod} : {zero(x.dtype)}" if conds else prod
    return b.emit(cl_shape, x.dtype, body, reduce_op_for(real), real)


def _conv_nhwc(b: Builder, node, nchw_input: bool = False):
    """A 2-D Conv of a channels-last region (:mod:`polyc.onnx.layout`): input ``X(n, h, w, c)`` and output
    ``(n, oh, ow, m)``; group 1 as ``Y(n, oh, ow, m) += X(n, h, w, c) * WT(c, kh, kw, m)``, depthwise as
    ``Y(n, oh, ow, c) += X(n, h, w, c) * WD(kh, kw, c)``, the weights re-laid from ONNX's ``(M, C/group, kh,
    kw)`` at compile time, so the channel is the stride-1 (vector) dimension of every access. ``nchw_input``
    (a region's head, group 1): the input is read as it is, ``X(n, c, h, w)``, one broadcast per tap (the sum
    of :func:`_conv_channels_last`, without its read-back)."""
    x, bias = b.input(node, 0), b.input(node, 2)
    w = np.asarray(b.consts[node["inputs"][1]])
    ys = b.out_shape(node)
    kernel = list(attr(node, "kernel_shape", w.shape[2:]))
    strides = list(attr(node, "strides", [1, 1]))
    dil = list(attr(node, "dilations", [1, 1]))
    pb = pads_begin(node, x.shape[2:4] if nchw_input else x.shape[1:3], ys[1:3], kernel, strides, dil)
    depthwise = attr(node, "group", 1) != 1
    if depthwise:
        wt = b.constant_table(np.ascontiguousarray(np.transpose(w[:, 0], (1, 2, 0))), "wD")
    else:
        wt = b.constant_table(np.ascontiguousarray(np.transpose(w, (1, 2, 3, 0))), "wT")
    if nchw_input:
        t = _channels_last_sum(b, x, wt, ys, kernel, strides, dil, pb)
    else:
        real, names = reduction_dims(kernel if depthwise else [x.shape[3]] + kernel)

        def body(idx, red):
            n, sp, m = idx[0], idx[1:3], idx[3]
            if depthwise:
                ks, c = names(red), m
            else:
                c, *ks = names(red)
            coords, conds = [], []
            for i in range(2):
                t, cs = window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[1 + i], ys[1 + i], kernel[i])
                coords.append(t)
                conds += cs
            weight = wt.at(list(ks) + [m]) if depthwise else wt.at([c] + list(ks) + [m])
            prod = f"{x.at([n] + coords + [c])} * {weight}"
            return f"({guard(conds)}) ? {prod} : {zero(x.dtype)}" if conds else prod
        t = b.emit(ys, x.dtype, body, reduce_op_for(real), real)
    if bias is None:
        return t
    return lazy(ys, x.dtype, lambda idx: f"({t.at(idx)} + {bias.at([idx[3]])})")


def conv_transpose(b: Builder, node):
    """ConvTranspose as a gather: ``x = (y + pad - k*dil) / stride`` where it divides exactly."""
    x, w, bias = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    ys = b.out_shape(node)
    nsp, kernel, strides, dil = spatial_params(b, node, x, w.shape)
    group = attr(node, "group", 1)
    cg, og = x.shape[1] // group, w.shape[1]
    auto = attr(node, "auto_pad", "NOTSET")
    out_pad = list(attr(node, "output_padding", [0] * nsp))
    if attr(node, "output_shape", None) is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        pb = []
        for i in range(nsp):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - ys[2 + i]
            pb.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
    elif auto == "VALID":
        pb = [0] * nsp
    else:
        pb = list(attr(node, "pads", [0] * 2 * nsp))[:nsp]

    def body(idx, red):
        n, o, sp = idx[0], idx[1], idx[2:]
        c, ks = red[0], red[1:]
        ch = c if group == 1 else f"{times(cg, f'({o}/{og})')}+{c}"
        oc = o if group == 1 else f"{o}%{og}"
        coords, conds = [], []
        for i in range(nsp):
            num = aff([(sp[i], 1), (ks[i], -dil[i])], pb[i])  # = x*stride
            s = strides[i]
            xi = num if s == 1 else f"({num})/{s}"
            coords.append(xi)
            if s > 1:
                conds.append(f"({num}) % {s} == 0")
            conds += [f"{num} >= 0", f"{num} < {x.shape[2 + i] * s - (s - 1)}"]
        prod = f"{x.at([n, ch] + coords)} * {w.at([ch, oc] + ks)}"
        return f"({guard(conds)}) ? {prod} : {zero(x.dtype)}"
    t = b.emit(ys, x.dtype, body, "+=!", [cg] + kernel)
    if bias is None:
        return [t]
    return [lazy(ys, x.dtype, lambda idx: f"({t.at(idx)} + {bias.at([idx[1]])})")]


def gemm(b: Builder, node):
    """Gemm: ``alpha * A' B' + beta * C`` with transA/transB and a broadcast C."""
    a, m, c = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    k = a.shape[0] if ta else a.shape[1]

    def body(idx, red):
        i, j, r = idx[0], idx[1], red[0]
        return f"{a.at([r, i] if ta else [i, r])} * {m.at([j, r] if tb else [r, j])}"
    t = b.emit(ys, dtype, body, "+=!", [k])
    if alpha == 1.0 and (c is None or beta == 0.0):
        return [t]

    def text(idx):
        e = t.at(idx) if alpha == 1.0 else f"{lit(alpha, dtype)} * {t.at(idx)}"
        if c is not None and beta != 0.0:
            cv = c.at(broadcast_index(c, ys, idx))
            e = f"({e} + {cv})" if beta == 1.0 else f"({e} + {lit(beta, dtype)} * {cv})"
        return e
    return [lazy(ys, dtype, text)]


def _batch_index(shape, out_batch, idx):
    """Index texts into the batch dims ``shape`` broadcast against ``out_batch`` at ``idx``."""
    r = len(shape)
    tail = idx[len(idx) - r:] if r else []
    return ["0" if d == 1 and n != 1 else i for i, d, n in zip(tail, shape, out_batch[len(out_batch) - r:])]


def matmul(b: Builder, node):
    """MatMul with numpy semantics: batched, broadcast batch dims, 1-D operands promoted."""
    a, m = b.input(node, 0), b.input(node, 1)
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    ar, mr = len(a.shape), len(m.shape)
    k = a.shape[-1]
    nb = len(ys) - (ar > 1) - (mr > 1)
    out_batch = ys[:nb]

    def body(idx, red):
        r = red[0]
        batch = idx[:nb]
        ai = [r] if ar == 1 else _batch_index(a.shape[:-2], out_batch, batch) + [idx[nb], r]
        mi = [r] if mr == 1 else _batch_index(m.shape[:-2], out_batch, batch) + [r, idx[-1]]
        return f"{a.at(ai)} * {m.at(mi)}"
    return [b.emit(ys, dtype, body, "+=!", [k])]


# ---- pooling and normalisation --------------------------------------------------------------------------------

def _pool_geometry(b, node, x, ys, first: int = 2):
    """``(nsp, kernel, strides, dilations, leading pads)`` of a pooling whose spatial dims start at axis
    ``first`` of ``x`` and ``ys`` (2 in NCHW, 1 in NHWC)."""
    nsp = len(x.shape) - 2
    kernel = list(attr(node, "kernel_shape"))
    strides = list(attr(node, "strides", [1] * nsp))
    dil = list(attr(node, "dilations", [1] * nsp))
    pb = pads_begin(node, x.shape[first:first + nsp], ys[first:first + nsp], kernel, strides, dil)
    return nsp, kernel, strides, dil, pb


def _window_read(x, ys, idx, red, nsp, kernel, strides, dil, pb, fill: str, first: int = 2) -> str:
    """The read of a pooling window's element ``red`` for output ``idx`` (spatial dims from axis ``first``:
    N, C, spatial... or N, spatial..., C), ``fill`` where the window lies in the padding."""
    coords, conds = [], []
    for i in range(nsp):
        a = first + i
        t, cs = window(idx[a], red[i], strides[i], dil[i], pb[i], x.shape[a], ys[a], kernel[i])
        coords.append(t)
        conds += cs
    read = x.at(list(idx[:first]) + coords + list(idx[first + nsp:]))
    return f"({guard(conds)}) ? {read} : {fill}" if conds else read


def max_pool(b: Builder, node):
    """MaxPool: pads (padding never wins), strides, dilations, ceil_mode, auto_pad. With ``polyc_layout`` =
    ``NHWC`` (a channels-last region, :mod:`polyc.onnx.layout`), a 2-D MaxPool of an ``(N, H, W, C)`` image
    into ``(N, OH, OW, C)``: the channel is the stride-1 (vector) dimension of every tap, no strided reads."""
    x = b.input(node, 0)
    ys = b.out_shape(node)
    first = 1 if attr(node, LAYOUT_ATTR) == NHWC else 2
    nsp, kernel, strides, dil, pb = _pool_geometry(b, node, x, ys, first)

    # the padding is max=!'s identity (minus infinity for floats): it never wins, even over -inf inputs (as the
    # ONNX reference; a finite fill such as -FLT_MAX would), and the build moves its guards into the domain
    fill = f"({lit(-1.0, x.dtype)} / {zero(x.dtype)})" if x.dtype.kind == "f" else lowest(x.dtype)

    def body(idx, red):
        return _window_read(x, ys, idx, red, nsp, kernel, strides, dil, pb, fill, first)
    real, names = reduction_dims(kernel)
    return [b.emit(ys, x.dtype, lambda idx, red: body(idx, names(red)), reduce_op_for(real, "max=!"), real)]


def _window_counts(in_n, out_n, k, s, d, pb, lo, hi):
    return np.array([sum(1 for j in range(k) if lo <= o * s + j * d - pb < hi) for o in range(out_n)])


def _average_divisors(b: Builder, node, x, ys, kernel, strides, dil, pb) -> np.ndarray:
    """The divisor of each output window (over the spatial dims), as onnx's reference AveragePool uses it.

    The number of real (non-pad) elements in each window is counted here; onnx's reference AveragePool on a
    tensor of ones gives (that number / divisor), which settles count_include_pad with ceil_mode exactly.
    """
    nsp = len(x.shape) - 2
    valid = np.ones((), np.int64)
    for i in range(nsp):
        n = x.shape[2 + i]
        valid = np.multiply.outer(valid, _window_counts(n, ys[2 + i], kernel[i], strides[i], dil[i], pb[i], 0, n))
    attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in node["attrs"].items()}
    spatial = [1, 1] + list(x.shape[2:])
    ref = helper.make_node("AveragePool", ["x"], ["y"], **attrs)
    graph = helper.make_graph([ref], "avg", [helper.make_tensor_value_info("x", 11, spatial)],
                              [helper.make_tensor_value_info("y", 11, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", b.opset)])
    ratio = ReferenceEvaluator(model).run(None, {"x": np.ones(spatial, np.float64)})[0].reshape(valid.shape)
    return np.where(ratio > 0, np.rint(valid / np.where(ratio > 0, ratio, 1.0)), 1.0)


def average_pool(b: Builder, node):
    """AveragePool: the window sum divided by a compile-time count (count_include_pad, ceil_mode)."""
    x = b.input(node, 0)
    ys = b.out_shape(node)
    nsp, kernel, strides, dil, pb = _pool_geometry(b, node, x, ys)
    counts = _average_divisors(b, node, x, ys, kernel, strides, dil, pb)
    counts = counts.astype(x.dtype)

    def body(idx, red):
        return _window_read(x, ys, idx, red, nsp, kernel, strides, dil, pb, zero(x.dtype))
    real, names = reduction_dims(kernel)
    s = b.emit(ys, x.dtype, lambda idx, red: body(idx, names(red)), reduce_op_for(real), real)
    if np.all(counts == counts.reshape(-1)[0]):
        div = lit(counts.reshape(-1)[0], x.dtype)
        return [lazy(ys, x.dtype, lambda idx: f"({s.at(idx)} / {div})")]
    table = b.constant_table(counts, "count")
    return [lazy(ys, x.dtype, lambda idx: f"({s.at(idx)} / {table.at(idx[2:])})")]


def _global_pool(op):
    def convert(b: Builder, node):
        x = b.input(node, 0)
        ys = b.out_shape(node)
        nsp = len(x.shape) - 2
        s = b.emit(ys, x.dtype, lambda idx, red: x.at(idx[:2] + red), op, list(x.shape[2:]))
        if op == "max=!":
            return [s]
        div = lit(int(np.prod(x.shape[2:])), x.dtype) if nsp else lit(1, x.dtype)
        return [lazy(ys, x.dtype, lambda idx: f"({s.at(idx)} / {div})")]
    return convert


global_average_pool = _global_pool("+=!")
global_max_pool = _global_pool("max=!")


def lrn(b: Builder, node):
    """LRN across channels: ``x / (bias + alpha/size * sum x^2) ^ beta``."""
    x = b.simple(b.input(node, 0))
    size = attr(node, "size")
    alpha, beta, bias = attr(node, "alpha", 1e-4), attr(node, "beta", 0.75), attr(node, "bias", 1.0)
    before = (size - 1) // 2
    cdim, t = x.shape[1], x.dtype

    def body(idx, red):
        ch = aff([(idx[1], 1), (red[0], 1)], -before)
        read = x.at([idx[0], ch] + idx[2:])
        return f"({ch} >= 0 && {ch} < {cdim}) ? {read} * {read} : {zero(t)}"
    s = b.emit(x.shape, t, body, "+=!", [size])
    return [lazy(x.shape, t, lambda idx: f"({x.at(idx)} / pow({lit(bias, t)} + {lit(alpha / size, t)} * "
                                         f"{s.at(idx)}, {lit(beta, t)}))")]


def _softmax(b: Builder, node, axes, log_=False):
    """Softmax/LogSoftmax along ``axes`` as the spec's function body computes it: ``x - max``, ``exp``, the
    row sum (and its ``log``) are each a node of the input's type, so for float16/bfloat16 every one of
    them is rounded to it (numpy's float16 arithmetic does the same; the float32 result rounded once can
    differ by two float16 ulps, more than the backend tests' tolerance). In float32/float64 Softmax
    multiplies by the row sum's reciprocal (one division a row, as onnxruntime's MLAS; within an ulp of the
    quotient): ``onnx_softmax`` of 4 x 500 x 500 (the 1-D conv encoder's attention), 1 thread, Zen 4, 0.575
    -> 0.535 ms with AVX2 and 0.456 -> 0.420 with AVX-512."""
    x = b.simple(b.input(node, 0))
    t, store = x.dtype, b.tensors[node["inputs"][0]].dtype
    mx, row = reduce(b, x.shape, axes, "max=!", t, lambda idx: x.at(idx))
    d = rounded(lazy(x.shape, t, lambda idx: f"({x.at(idx)} - {mx.at(row(idx))})"), store)
    e = rounded(b.emit(x.shape, t, lambda idx, red: f"exp({d.at(idx)})"), store)
    s, _ = reduce(b, x.shape, axes, "+=!", t, lambda idx: e.at(idx))
    s = rounded(s, store)
    if log_:
        ls = rounded(lazy(s.shape, t, lambda idx: f"log({s.at(idx)})"), store)
        return [lazy(x.shape, t, lambda idx: f"({d.at(idx)} - {ls.at(row(idx))})")]
    if np.dtype(t) != np.dtype(store):  # rounded to float16/bfloat16 at every node: the spec's Div
        return [lazy(x.shape, t, lambda idx: f"({e.at(idx)} / {s.at(row(idx))})")]
    inverse = b.emit(s.shape, t, lambda idx, red: f"({lit(1, t)} / {s.at(idx)})")
    return [lazy(x.shape, t, lambda idx: f"({e.at(idx)} * {inverse.at(row(idx))})")]


def softmax_v1(b: Builder, node):
    """Softmax before opset 13: flatten to 2-D at ``axis`` (default 1); a row is every dim from ``axis`` on."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, range(norm_axis(attr(node, "axis", 1), rank), rank))


def softmax_v13(b: Builder, node):
    """Softmax from opset 13: along the single ``axis`` (default -1)."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, [norm_axis(attr(node, "axis", -1), rank)])


def log_softmax_v1(b: Builder, node):
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, range(norm_axis(attr(node, "axis", 1), rank), rank), log_=True)


def log_softmax_v13(b: Builder, node):
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, [norm_axis(attr(node, "axis", -1), rank)], log_=True)


def layer_normalization(b: Builder, node):
    """LayerNormalization over the dims from ``axis`` on; optional Mean and InvStdDev outputs."""
    x = b.simple(b.input(node, 0))
    scale, bias = b.input(node, 1), b.input(node, 2)
    rank, t = len(x.shape), x.dtype
    axis = norm_axis(attr(node, "axis", -1), rank)
    axes = list(range(axis, rank))
    count = lit(int(np.prod(x.shape[axis:])), t)
    eps = lit(attr(node, "epsilon", 1e-5), t)
    s1, row = reduce(b, x.shape, axes, "+=!", t, lambda idx: x.at(idx))
    mu = b.emit(s1.shape, t, lambda idx, red: f"({s1.at(idx)} / {count})")
    s2, _ = reduce(b, x.shape, axes, "+=!", t,
                    lambda idx: f"({x.at(idx)} - {mu.at(row(idx))}) * ({x.at(idx)} - {mu.at(row(idx))})")
    r = b.emit(s1.shape, t, lambda idx, red: f"(1.0 / sqrt({s2.at(idx)} / {count} + {eps}))")
    norm_shape = x.shape[axis:]

    def text(idx):
        e = f"({x.at(idx)} - {mu.at(row(idx))}) * {r.at(row(idx))} * " \
            f"{scale.at(broadcast_index(scale, norm_shape, idx[axis:]))}"
        if bias is not None:
            e = f"({e} + {bias.at(broadcast_index(bias, norm_shape, idx[axis:]))})"
        return e
    outs = [lazy(x.shape, t, text)]
    for k, stat in ((1, mu), (2, r)):
        if len(node["outputs"]) > k and node["outputs"][k]:
            shape = b.out_shape(node, k)
            outs.append(lazy(shape, t, lambda idx, v=stat: v.at(idx[:axis]), cheap=True))
    return outs


def _folded(b: Builder, node):
    raise b.error("this op must be folded to a constant at compile time (its inputs are not constant)")


#: op -> ((since_version, converter), ...), oldest first.
CONVERTERS = {
    "Add": ((7, add),), "Sub": ((7, sub),), "Mul": ((7, mul),), "Div": ((7, div),), "Pow": ((7, pow_),),
    "Sum": ((7, sum_),), "Max": ((7, max_),), "Min": ((7, min_),), "Mean": ((7, mean),),
    "Relu": ((1, relu),), "LeakyRelu": ((1, leaky_relu),), "Sigmoid": ((1, sigmoid),), "Tanh": ((1, tanh),),
    "Clip": ((1, clip),), "Erf": ((9, erf),), "Gelu": ((20, gelu),), "Exp": ((1, exp),), "Log": ((1, log),),
    "Sqrt": ((1, sqrt),), "Neg": ((1, neg),), "Abs": ((1, abs_),), "Reciprocal": ((1, reciprocal),),
    "Floor": ((1, floor),), "Ceil": ((1, ceil),), "Cast": ((1, cast),),
    "Conv": ((1, conv),), "ConvTranspose": ((1, conv_transpose),), "Gemm": ((7, gemm),),
    "MatMul": ((1, matmul),), "BatchNormalization": ((7, batchnorm),), "LRN": ((1, lrn),),
    "MaxPool": ((1, max_pool),), "AveragePool": ((1, average_pool),),
    "GlobalAveragePool": ((1, global_average_pool),), "GlobalMaxPool": ((1, global_max_pool),),
    "Softmax": ((1, softmax_v1), (13, softmax_v13)), "LogSoftmax": ((1, log_softmax_v1), (13, log_softmax_v13)),
    "LayerNormalization": ((17, layer_normalization),),
    "Constant": ((1, _folded),), "ConstantOfShape": ((9, _folded),), "Shape": ((1, _folded),),
    "Size": ((1, _folded),),
}

_SPATIAL = {"auto_pad", "dilations", "kernel_shape", "pads", "strides"}

#: Every attribute ONNX defines for the op (opsets 7..newest), and polyc's own ``polyc_layout`` that
#: :mod:`polyc.onnx.layout` sets on a Conv or MaxPool (onnx's checker rejects it in a model); anything else is
#: reported.
KNOWN_ATTRS = {
    "Conv": _SPATIAL | {"group", LAYOUT_ATTR, ZERO_TAPS_ATTR}, "ConvTranspose": _SPATIAL | {"group", "output_padding", "output_shape"},
    "Gemm": {"alpha", "beta", "transA", "transB"}, "LeakyRelu": {"alpha"}, "Gelu": {"approximate"},
    "Clip": {"min", "max"}, "Cast": {"to", "saturate"},
    "BatchNormalization": {"epsilon", "momentum", "spatial", "training_mode"}, "LRN": {"alpha", "beta", "bias", "size"},
    "MaxPool": _SPATIAL | {"ceil_mode", "storage_order", LAYOUT_ATTR},
    "AveragePool": _SPATIAL | {"ceil_mode", "count_include_pad"},
    "Softmax": {"axis"}, "LogSoftmax": {"axis"}, "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "Shape": {"start", "end"},
    "Constant": {"value", "value_float", "value_floats", "value_int", "value_ints"}, "ConstantOfShape": {"value"},
}

#: Attribute values polyc does not handle: op -> {attr: predicate(value) -> True when supported}.
SUPPORTED_VALUES = {
    "Conv": {LAYOUT_ATTR: lambda v: v in (NHWC, NCHW_IN), ZERO_TAPS_ATTR: lambda v: v == 1}, "MaxPool": {LAYOUT_ATTR: lambda v: v == NHWC},
    "BatchNormalization": {"training_mode": lambda v: v == 0, "spatial": lambda v: v == 1},
    "LayerNormalization": {"stash_type": lambda v: v == 1},
}

#: Inputs that must be compile-time constants: op -> ((index, since_opset, name), ...).
CONSTANT_INPUTS = {
    "ConstantOfShape": ((0, 9, "input"),),
}
