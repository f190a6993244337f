"""Per-op converters: ONNX node -> TC statements / lazy values, chosen by opset.

Each converter is a plain function ``convert(b, node) -> list[Val]`` (one Val per output) using the
:class:`~polyc.onnx.lower.Builder` ``b``. :data:`CONVERTERS` maps an op to ``(since_version, function)``
pairs; :func:`converter` picks the newest one not newer than the model's opset (TVM's ``_impl_vN`` idea).
Where an attribute became an input (Squeeze/Unsqueeze/Split/Slice/Pad/Clip/ReduceX axes) one function
reads either form by looking at ``b.opset``; where the meaning changed (Softmax's flatten-at-axis rule before
13) there are two functions. :func:`check_node` lists what a node uses that polyc does not support.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .lower import Builder, broadcast_index, lazy, lit, times

# ---- helpers ------------------------------------------------------------------------------------------------

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


def _attr(node, name, default=None):
    v = node["attrs"].get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _zero(dtype) -> str:
    return lit(0, dtype)


def _lowest(dtype) -> str:
    dtype = np.dtype(dtype)
    return lit(np.finfo(dtype).min if dtype.kind == "f" else np.iinfo(dtype).min, dtype)


def _guard(conds) -> str:
    return " && ".join(conds)


def _window(out_idx, k_idx, stride, dil, pad_begin, extent, out_n, k_n):
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


def _reduction_dims(extents):
    """(extents of the real reduction indices, mapper red -> one index text per extent).

    Extents of 1 get the literal ``0`` instead of an index, so a 1x1 convolution reduces over channels only.
    """
    real = [e for e in extents if e > 1]

    def names(red):
        it = iter(red)
        return [next(it) if e > 1 else "0" for e in extents]
    return real, names


def _reduce_op_for(real, op="+=!"):
    return op if real else "="


def _pads_begin(node, in_sp, out_sp, kernel, strides, dil) -> list:
    """Leading pads per spatial dim, including auto_pad SAME_UPPER/SAME_LOWER/VALID."""
    auto = _attr(node, "auto_pad", "NOTSET")
    n = len(in_sp)
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for i in range(n):
            total = max((out_sp[i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - in_sp[i], 0)
            out.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
        return out
    if auto == "VALID":
        return [0] * n
    pads = _attr(node, "pads", [0] * 2 * n)
    return list(pads[:n])


def _spatial(b, node, x, w_shape=None):
    nsp = len(x.shape) - 2
    kernel = list(_attr(node, "kernel_shape", w_shape[2:] if w_shape is not None else None))
    strides = list(_attr(node, "strides", [1] * nsp))
    dil = list(_attr(node, "dilations", [1] * nsp))
    return nsp, kernel, strides, dil


# ---- elementwise ----------------------------------------------------------------------------------------------

def _unary(text_fn, simple=False):
    def convert(b: Builder, node):
        x = b.input(node, 0)
        if simple:
            x = b.simple(x)
        dtype = b.out_dtype(node)
        return [lazy(x.shape, dtype, lambda idx: text_fn(x.at(idx), node, dtype))]
    return convert


relu = _unary(lambda e, n, t: f"max({e}, {_zero(t)})")
sigmoid = _unary(lambda e, n, t: f"sigmoid({e})")
tanh = _unary(lambda e, n, t: f"tanh({e})")
erf = _unary(lambda e, n, t: f"erf({e})")
exp = _unary(lambda e, n, t: f"exp({e})")
log = _unary(lambda e, n, t: f"log({e})")
sqrt = _unary(lambda e, n, t: f"sqrt({e})")
floor = _unary(lambda e, n, t: f"floor({e})")
ceil = _unary(lambda e, n, t: f"ceil({e})")
neg = _unary(lambda e, n, t: f"(-{e})")
reciprocal = _unary(lambda e, n, t: f"({lit(1.0, t)} / {e})")
abs_ = _unary(lambda e, n, t: f"fabs({e})" if np.dtype(t).kind == "f" else f"abs({e})")
leaky_relu = _unary(lambda e, n, t: f"({e} > {_zero(t)} ? {e} : {lit(_attr(n, 'alpha', 0.01), t)} * {e})", True)


def _gelu_text(e, node, t):
    if _attr(node, "approximate", "none") == "tanh":
        return (f"{lit(0.5, t)} * {e} * ({lit(1.0, t)} + tanh({lit(np.sqrt(2 / np.pi), t)} * "
                f"({e} + {lit(0.044715, t)} * {e} * {e} * {e})))")
    return f"{lit(0.5, t)} * {e} * ({lit(1.0, t)} + erf({e} * {lit(1 / np.sqrt(2), t)}))"


gelu = _unary(_gelu_text, True)


def cast(b: Builder, node):
    """Cast: ``to`` as a TC conversion (``float(e)``, ``int64(e)``; to bool: ``e != 0``)."""
    x = b.input(node, 0)
    to = np.dtype(helper.tensor_dtype_to_np_dtype(_attr(node, "to")))
    from .lower import tc_type
    if to.kind == "b":
        return [lazy(x.shape, to, lambda idx: f"({x.at(idx)} != {_zero(x.dtype)})")]
    return [lazy(x.shape, to, lambda idx: f"{tc_type(to)}({x.at(idx)})")]


def _nary(op_fn):
    def convert(b: Builder, node):
        shape, dtype = b.out_shape(node), b.out_dtype(node)
        vals = [b.input(node, k) for k in range(len(node["inputs"]))]
        vals = [v for v in vals if v is not None]

        def text(idx):
            terms = [v.at(broadcast_index(v, shape, idx)) for v in vals]
            return op_fn(terms, dtype, node)
        return [lazy(shape, dtype, text)]
    return convert


def _pow_text(terms, dtype, node):
    if np.dtype(dtype).kind == "f":
        return f"pow({terms[0]}, {terms[1]})"
    from .lower import tc_type
    return f"{tc_type(dtype)}(pow(double({terms[0]}), double({terms[1]})))"


def _fold(fn):
    def text(terms, dtype, node):
        out = terms[0]
        for t in terms[1:]:
            out = fn(out, t)
        return out
    return text


add = _nary(lambda ts, t, n: "(" + " + ".join(ts) + ")")
sub = _nary(lambda ts, t, n: f"({ts[0]} - {ts[1]})")
mul = _nary(lambda ts, t, n: f"({ts[0]} * {ts[1]})")
def _div_text(ts, t, n):
    if np.dtype(t).kind == "f":
        return f"({ts[0]} / {ts[1]})"
    # ONNX integer division truncates toward zero; the language's rounds toward minus infinity
    a, c = ts
    if np.dtype(t).kind == "u":
        return f"({a} / {c})"
    return f"((({a} % {c}) != 0 && (({a} < 0 && {c} > 0) || ({a} > 0 && {c} < 0))) ? {a} / {c} + 1 : {a} / {c})"


div = _nary(_div_text)
sum_ = add
max_ = _nary(_fold(lambda a, c: f"max({a}, {c})"))
min_ = _nary(_fold(lambda a, c: f"min({a}, {c})"))
mean = _nary(lambda ts, t, n: f"(({' + '.join(ts)}) / {lit(len(ts), t)})")


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
    return _nary(_pow_text)(b, node)


def clip(b: Builder, node):
    """Clip: bounds from attributes ``min``/``max`` before opset 11, from optional inputs after."""
    x = b.input(node, 0)
    dtype = b.out_dtype(node)
    if b.opset < 11:
        lo = _attr(node, "min", None)
        hi = _attr(node, "max", None)
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
    eps = lit(_attr(node, "epsilon", 1e-5), x.dtype)

    def text(idx):
        c = [idx[1]]
        return (f"(({x.at(idx)} - {mean_.at(c)}) * {scale.at(c)} / sqrt({var.at(c)} + {eps}) + {bias.at(c)})")
    return [lazy(x.shape, x.dtype, text)]


# ---- anchors: Conv, ConvTranspose, Gemm, MatMul ---------------------------------------------------------------

#: Below this output width a convolution with at least CHANNELS_LAST_MIN_CHANNELS output channels computes
#: channels-last (see :func:`conv`): two 8-lane (AVX2) or one 16-lane (AVX-512) vector of columns.
CHANNELS_LAST_MAX_WIDTH = 16
CHANNELS_LAST_MIN_CHANNELS = 32


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
    x = b.input(node, 0)
    weights = node["inputs"][1]
    ys = b.out_shape(node)
    nsp, kernel, strides, dil = _spatial(b, node, x, tuple(b.tensors[weights].shape))
    pb = _pads_begin(node, x.shape[2:], ys[2:], kernel, strides, dil)
    group = _attr(node, "group", 1)
    if (group == 1 and nsp >= 1 and ys[-1] < CHANNELS_LAST_MAX_WIDTH and ys[1] >= CHANNELS_LAST_MIN_CHANNELS
            and weights in b.consts):
        wt = b.constant_table(np.ascontiguousarray(np.moveaxis(np.asarray(b.consts[weights]), 0, -1)), "wT")
        return [_conv_channels_last(b, x, wt, b.input(node, 2), ys, kernel, strides, dil, pb)]
    w, bias = b.input(node, 1), b.input(node, 2)
    cg, og = w.shape[1], w.shape[0] // group

    real, names = _reduction_dims([cg] + kernel)

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
            t, cs = _window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        prod = f"{x.at([n, ch] + coords)} * {w.at([o, c] + ks)}"
        return f"({_guard(conds)}) ? {prod} : {_zero(x.dtype)}" if conds else prod
    t = b.emit(ys, x.dtype, body, _reduce_op_for(real), real)
    if bias is None:
        return [t]
    return [lazy(ys, x.dtype, lambda idx: f"({t.at(idx)} + {bias.at([idx[1]])})")]


def _conv_channels_last(b: Builder, x, wt, bias, ys, kernel, strides, dil, pb):
    """``T(n, sp.., m) += X(n, c, window..) * WT(c, k.., m)`` and the NCHW view of ``T`` (+ bias)."""
    nsp = len(kernel)
    cl_shape = (ys[0],) + tuple(ys[2:]) + (ys[1],)
    real, names = _reduction_dims([x.shape[1]] + kernel)

    def body(idx, red):
        n, sp, m = idx[0], idx[1:1 + nsp], idx[-1]
        c, *ks = names(red)
        coords, conds = [], []
        for i in range(nsp):
            t, cs = _window(sp[i], ks[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        prod = f"{x.at([n, c] + coords)} * {wt.at([c] + ks + [m])}"
        return f"({_guard(conds)}) ? {prod} : {_zero(x.dtype)}" if conds else prod
    t = b.emit(cl_shape, x.dtype, body, _reduce_op_for(real), real)

    def nchw(idx):
        value = t.at([idx[0]] + list(idx[2:]) + [idx[1]])
        return f"({value} + {bias.at([idx[1]])})" if bias is not None else value
    return lazy(ys, x.dtype, nchw)


def conv_transpose(b: Builder, node):
    """ConvTranspose as a gather: ``x = (y + pad - k*dil) / stride`` where it divides exactly."""
    x, w, bias = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    ys = b.out_shape(node)
    nsp, kernel, strides, dil = _spatial(b, node, x, w.shape)
    group = _attr(node, "group", 1)
    cg, og = x.shape[1] // group, w.shape[1]
    auto = _attr(node, "auto_pad", "NOTSET")
    out_pad = list(_attr(node, "output_padding", [0] * nsp))
    if _attr(node, "output_shape", None) is not None or auto in ("SAME_UPPER", "SAME_LOWER"):
        pb = []
        for i in range(nsp):
            total = strides[i] * (x.shape[2 + i] - 1) + out_pad[i] + (kernel[i] - 1) * dil[i] + 1 - ys[2 + i]
            pb.append(total // 2 if auto == "SAME_UPPER" else total - total // 2)
    elif auto == "VALID":
        pb = [0] * nsp
    else:
        pb = list(_attr(node, "pads", [0] * 2 * nsp))[:nsp]

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
        return f"({_guard(conds)}) ? {prod} : {_zero(x.dtype)}"
    t = b.emit(ys, x.dtype, body, "+=!", [cg] + kernel)
    if bias is None:
        return [t]
    return [lazy(ys, x.dtype, lambda idx: f"({t.at(idx)} + {bias.at([idx[1]])})")]


def gemm(b: Builder, node):
    """Gemm: ``alpha * A' B' + beta * C`` with transA/transB and a broadcast C."""
    a, m, c = b.input(node, 0), b.input(node, 1), b.input(node, 2)
    ta, tb = _attr(node, "transA", 0), _attr(node, "transB", 0)
    alpha, beta = _attr(node, "alpha", 1.0), _attr(node, "beta", 1.0)
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

def _pool_geometry(b, node, x, ys):
    nsp = len(x.shape) - 2
    kernel = list(_attr(node, "kernel_shape"))
    strides = list(_attr(node, "strides", [1] * nsp))
    dil = list(_attr(node, "dilations", [1] * nsp))
    pb = _pads_begin(node, x.shape[2:], ys[2:], kernel, strides, dil)
    return nsp, kernel, strides, dil, pb


def max_pool(b: Builder, node):
    """MaxPool: pads (padding never wins), strides, dilations, ceil_mode, auto_pad."""
    x = b.input(node, 0)
    ys = b.out_shape(node)
    nsp, kernel, strides, dil, pb = _pool_geometry(b, node, x, ys)

    def body(idx, red):
        coords, conds = [], []
        for i in range(nsp):
            t, cs = _window(idx[2 + i], red[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        read = x.at(idx[:2] + coords)
        return f"({_guard(conds)}) ? {read} : {_lowest(x.dtype)}" if conds else read
    real, names = _reduction_dims(kernel)
    return [b.emit(ys, x.dtype, lambda idx, red: body(idx, names(red)), _reduce_op_for(real, "max=!"), real)]


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
        coords, conds = [], []
        for i in range(nsp):
            t, cs = _window(idx[2 + i], red[i], strides[i], dil[i], pb[i], x.shape[2 + i], ys[2 + i], kernel[i])
            coords.append(t)
            conds += cs
        read = x.at(idx[:2] + coords)
        return f"({_guard(conds)}) ? {read} : {_zero(x.dtype)}" if conds else read
    real, names = _reduction_dims(kernel)
    s = b.emit(ys, x.dtype, lambda idx, red: body(idx, names(red)), _reduce_op_for(real), real)
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
    size = _attr(node, "size")
    alpha, beta, bias = _attr(node, "alpha", 1e-4), _attr(node, "beta", 0.75), _attr(node, "bias", 1.0)
    before = (size - 1) // 2
    cdim, t = x.shape[1], x.dtype

    def body(idx, red):
        ch = aff([(idx[1], 1), (red[0], 1)], -before)
        read = x.at([idx[0], ch] + idx[2:])
        return f"({ch} >= 0 && {ch} < {cdim}) ? {read} * {read} : {_zero(t)}"
    s = b.emit(x.shape, t, body, "+=!", [size])
    return [lazy(x.shape, t, lambda idx: f"({x.at(idx)} / pow({lit(bias, t)} + {lit(alpha / size, t)} * "
                                         f"{s.at(idx)}, {lit(beta, t)}))")]


def _reduce(b: Builder, shape, axes, op, dtype, term):
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


def _softmax(b: Builder, node, axes, log_=False):
    x = b.simple(b.input(node, 0))
    t = x.dtype
    mx, row = _reduce(b, x.shape, axes, "max=!", t, lambda idx: x.at(idx))
    if log_:
        s, _ = _reduce(b, x.shape, axes, "+=!", t, lambda idx: f"exp({x.at(idx)} - {mx.at(row(idx))})")
        return [lazy(x.shape, t, lambda idx: f"({x.at(idx)} - {mx.at(row(idx))} - log({s.at(row(idx))}))")]
    e = b.emit(x.shape, t, lambda idx, red: f"exp({x.at(idx)} - {mx.at(row(idx))})")
    s, _ = _reduce(b, x.shape, axes, "+=!", t, lambda idx: e.at(idx))
    return [lazy(x.shape, t, lambda idx: f"({e.at(idx)} / {s.at(row(idx))})")]


def softmax_v1(b: Builder, node):
    """Softmax before opset 13: flatten to 2-D at ``axis`` (default 1); a row is every dim from ``axis`` on."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, range(_axis(_attr(node, "axis", 1), rank), rank))


def softmax_v13(b: Builder, node):
    """Softmax from opset 13: along the single ``axis`` (default -1)."""
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, [_axis(_attr(node, "axis", -1), rank)])


def log_softmax_v1(b: Builder, node):
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, range(_axis(_attr(node, "axis", 1), rank), rank), log_=True)


def log_softmax_v13(b: Builder, node):
    rank = len(b.tensors[node["inputs"][0]].shape)
    return _softmax(b, node, [_axis(_attr(node, "axis", -1), rank)], log_=True)


def layer_normalization(b: Builder, node):
    """LayerNormalization over the dims from ``axis`` on; optional Mean and InvStdDev outputs."""
    x = b.simple(b.input(node, 0))
    scale, bias = b.input(node, 1), b.input(node, 2)
    rank, t = len(x.shape), x.dtype
    axis = _axis(_attr(node, "axis", -1), rank)
    axes = list(range(axis, rank))
    count = lit(int(np.prod(x.shape[axis:])), t)
    eps = lit(_attr(node, "epsilon", 1e-5), t)
    s1, row = _reduce(b, x.shape, axes, "+=!", t, lambda idx: x.at(idx))
    mu = b.emit(s1.shape, t, lambda idx, red: f"({s1.at(idx)} / {count})")
    s2, _ = _reduce(b, x.shape, axes, "+=!", t,
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


# ---- reductions ------------------------------------------------------------------------------------------------

def _reduce_axes(b: Builder, node, since: int):
    rank = len(b.tensors[node["inputs"][0]].shape)
    if b.opset >= since:
        axes = b.const_input(node, 1, "axes")
        axes = None if axes is None else [int(a) for a in axes.reshape(-1)]
    else:
        axes = _attr(node, "axes", None)
    if not axes:
        if b.opset >= since and _attr(node, "noop_with_empty_axes", 0):
            return []
        return list(range(rank))
    return sorted(_axis(a, rank) for a in axes)


def _reduce_op(op, since):
    def convert(b: Builder, node):
        x = b.input(node, 0)
        axes = _reduce_axes(b, node, since)
        ys = b.out_shape(node)
        if not axes:
            return [x]
        keep = _attr(node, "keepdims", 1)
        v, _ = _reduce(b, x.shape, axes, "max=!" if op == "max" else "+=!", x.dtype, lambda idx: x.at(idx))
        kept = [d for d in range(len(x.shape)) if d not in axes]

        def kept_idx(idx):
            return [idx[d] for d in kept] if keep else list(idx)
        if op == "mean":
            n = lit(int(np.prod([x.shape[d] for d in axes])), x.dtype)
            return [lazy(ys, x.dtype, lambda idx: f"({v.at(kept_idx(idx))} / {n})")]
        return [lazy(ys, x.dtype, lambda idx: v.at(kept_idx(idx)), cheap=True)]
    return convert


reduce_sum = _reduce_op("sum", 13)
reduce_mean = _reduce_op("mean", 18)
reduce_max = _reduce_op("max", 18)


# ---- the converter table and the supported-feature check -------------------------------------------------------

from . import movement  # noqa: E402  (data-movement converters)


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
    "ReduceSum": ((1, reduce_sum),), "ReduceMean": ((1, reduce_mean),), "ReduceMax": ((1, reduce_max),),
    "Concat": ((1, movement.concat),), "Split": ((1, movement.split),), "Slice": ((1, movement.slice_),),
    "Transpose": ((1, movement.transpose),), "Pad": ((1, movement.pad),), "Gather": ((1, movement.gather),),
    "Resize": ((10, movement.resize),), "Upsample": ((7, movement.resize),),
    "Constant": ((1, _folded),), "ConstantOfShape": ((9, _folded),), "Shape": ((1, _folded),),
    "Size": ((1, _folded),),
}


def converter(op: str, opset: int):
    """The converter of ``op`` for ``opset`` (the newest with ``since <= opset``), or None if unsupported."""
    best = None
    for since, fn in CONVERTERS.get(op, ()):
        if since <= opset:
            best = fn
    if best is None:
        return None
    # an op removed from the standard at some opset (Upsample at 10) is unsupported after it
    try:
        schema = onnx.defs.get_schema(op, opset)
        if schema.deprecated:
            return None
    except Exception:
        return None
    return best


_SPATIAL = {"auto_pad", "dilations", "kernel_shape", "pads", "strides"}

#: Every attribute ONNX defines for the op (opsets 7..newest); anything else is reported.
KNOWN_ATTRS = {
    "Conv": _SPATIAL | {"group"}, "ConvTranspose": _SPATIAL | {"group", "output_padding", "output_shape"},
    "Gemm": {"alpha", "beta", "transA", "transB"}, "LeakyRelu": {"alpha"}, "Gelu": {"approximate"},
    "Clip": {"min", "max"}, "Cast": {"to", "saturate"},
    "BatchNormalization": {"epsilon", "momentum", "spatial", "training_mode"}, "LRN": {"alpha", "beta", "bias", "size"},
    "MaxPool": _SPATIAL | {"ceil_mode", "storage_order"}, "AveragePool": _SPATIAL | {"ceil_mode", "count_include_pad"},
    "Softmax": {"axis"}, "LogSoftmax": {"axis"}, "LayerNormalization": {"axis", "epsilon", "stash_type"},
    "Concat": {"axis"}, "Split": {"axis", "split", "num_outputs"}, "Slice": {"starts", "ends", "axes"},
    "Transpose": {"perm"}, "Reshape": {"allowzero"}, "Flatten": {"axis"}, "Squeeze": {"axes"},
    "Unsqueeze": {"axes"}, "Gather": {"axis"}, "Pad": {"mode", "pads", "value"},
    "ReduceSum": {"axes", "keepdims", "noop_with_empty_axes"}, "ReduceMean": {"axes", "keepdims", "noop_with_empty_axes"},
    "ReduceMax": {"axes", "keepdims", "noop_with_empty_axes"},
    "Resize": {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
               "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"},
    "Upsample": {"mode", "scales"}, "Dropout": {"ratio", "seed"}, "Shape": {"start", "end"},
    "Constant": {"value", "value_float", "value_floats", "value_int", "value_ints"}, "ConstantOfShape": {"value"},
}

#: Attribute values polyc does not handle: op -> {attr: predicate(value) -> True when supported}.
SUPPORTED_VALUES = {
    "Pad": {"mode": lambda v: v in (b"constant", "constant")},
    "Resize": {"mode": lambda v: v in (b"nearest", b"linear", "nearest", "linear"),
               "antialias": lambda v: v == 0,
               "coordinate_transformation_mode": lambda v: v not in (b"tf_crop_and_resize", "tf_crop_and_resize")},
    "Upsample": {"mode": lambda v: v in (b"nearest", b"linear", "nearest", "linear")},
    "BatchNormalization": {"training_mode": lambda v: v == 0, "spatial": lambda v: v == 1},
}

#: Inputs that must be compile-time constants: op -> ((index, since_opset, name), ...).
CONSTANT_INPUTS = {
    "Reshape": ((1, 5, "shape"),), "Squeeze": ((1, 13, "axes"),), "Unsqueeze": ((1, 13, "axes"),),
    "Split": ((1, 13, "split"),), "Slice": ((1, 10, "starts"), (2, 10, "ends"), (3, 10, "axes"), (4, 10, "steps")),
    "Pad": ((1, 11, "pads"), (3, 18, "axes")), "ReduceSum": ((1, 13, "axes"),), "ReduceMean": ((1, 18, "axes"),),
    "ReduceMax": ((1, 18, "axes"),), "Resize": ((1, 10, "scales/roi"), (2, 11, "scales"), (3, 11, "sizes")),
    "Upsample": ((1, 9, "scales"),), "ConstantOfShape": ((0, 9, "input"),),
}


def _show(v) -> str:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return f"tensor{list(v.shape)}"
    return str(v)


def check_node(g, nid: str, d: dict) -> list:
    """Every reason node ``nid`` cannot be compiled (empty list when it can)."""
    op, opset = d["op"], g.graph["opset"]
    problems = []
    known = KNOWN_ATTRS.get(op, set())
    for name, value in d["attrs"].items():
        if name not in known:
            problems.append(f"unsupported attribute {name}={_show(value)} on node {nid} ({op})")
        elif name in SUPPORTED_VALUES.get(op, {}) and not SUPPORTED_VALUES[op][name](value):
            problems.append(f"unsupported attribute {name}={_show(value)} on node {nid} ({op})")
    for index, since, name in CONSTANT_INPUTS.get(op, ()):
        if opset >= since and index < len(d["inputs"]) and d["inputs"][index] \
                and d["inputs"][index] not in g.graph["constants"]:
            problems.append(f"input {name} ({d['inputs'][index]!r}) of node {nid} ({op}) must be a compile-time "
                            "constant")
    if op == "MaxPool" and len(d["outputs"]) > 1 and d["outputs"][1]:
        problems.append(f"unsupported output Indices of node {nid} (MaxPool)")
    if op == "LayerNormalization" and d["attrs"].get("stash_type", 1) != 1:
        problems.append(f"unsupported attribute stash_type={d['attrs']['stash_type']} on node {nid} ({op})")
    return problems
