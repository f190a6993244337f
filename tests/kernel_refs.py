"""Numpy oracles for the operator library (``kernels/*.tc``).

``CASES`` has one :class:`KernelCase` per def: how to make its inputs for a shape, an independent numpy
formulation of its result, the shapes to test (sizes named as in the def's signature; each list has
extents of 1 and odd primes, and some shapes larger than a cache tile) and the length of its longest
chain of accumulated terms, which scales the absolute tolerance of floating-point results.

References compute in float64 and return arrays in the dtype polyc must produce, so a test can compare
dtypes and shapes as well as values.
"""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

F32, F64 = np.float32, np.float64
I32, I64 = np.int32, np.int64

# Relative tolerance, and absolute tolerance per accumulated term, by output dtype.
TOLERANCES = {
    np.dtype(F32): (1e-4, 2e-6),
    np.dtype(F64): (1e-10, 1e-13),
}


def tolerance(dtype, reduction: int = 1) -> tuple[float, float]:
    """``(rtol, atol)`` for a result of ``dtype`` made of ``reduction`` accumulated terms (exact for
    integers and bools)."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return 0.0, 0.0
    rtol, atol = TOLERANCES[dtype]
    return rtol, atol * max(1, reduction)


def _one(shape: dict) -> int:
    return 1


@dataclass(frozen=True)
class KernelCase:
    """One def of the library with its oracle.

    ``make_inputs(rng, shape)`` returns the positional arguments of the def for the sizes in ``shape``
    (a dict size name -> extent); ``reference(*inputs)`` returns the expected output (a tuple when the
    def returns several, in ``-> (...)`` order); ``reduction(shape)`` is the number of terms accumulated
    into one output element (for the tolerance).
    """

    family: str
    name: str
    make_inputs: Callable[[np.random.Generator, dict], tuple]
    reference: Callable[..., object]
    shapes: tuple[dict, ...]
    reduction: Callable[[dict], int] = _one

    @property
    def id(self) -> str:
        return f"{self.family}.{self.name}"


def shape_id(shape: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in shape.items())


def _as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, tuple) else (value,)


def run_and_compare(case: KernelCase, shape: dict, call: Callable, label: str = ""):
    """Run ``call(*inputs)`` (a compiled kernel of ``case``) on the case's seeded inputs at ``shape`` and compare
    with its numpy reference: the number of outputs, each output's shape, dtype and values (exact for integers,
    else within :func:`tolerance` of the dtype and the reduction length), and the inputs left untouched.
    ``label`` is added to the messages (e.g. the options). Returns the outputs as a tuple."""
    rng = np.random.default_rng(zlib.crc32(f"{case.id}[{shape_id(shape)}]".encode()))
    inputs = case.make_inputs(rng, shape)
    originals = [np.copy(a) for a in inputs]
    expected = _as_tuple(case.reference(*inputs))
    got = _as_tuple(call(*inputs))
    where = f"{case.id}{label}"
    assert len(got) == len(expected), f"{where}: {len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        what = f"{case.id} output {k} at {shape_id(shape)}{label}"
        assert g.shape == e.shape, f"{what}: shape {g.shape}, expected {e.shape}"
        assert g.dtype == e.dtype, f"{what}: dtype {g.dtype}, expected {e.dtype}"
        rtol, atol = tolerance(e.dtype, case.reduction(shape))
        if rtol == 0 and atol == 0:
            np.testing.assert_array_equal(g, e, err_msg=what)
        else:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=what)
    for k, (a, orig) in enumerate(zip(inputs, originals)):
        np.testing.assert_array_equal(a, orig, err_msg=f"{where}: input {k} was modified")
    return got


# ---- input generators --------------------------------------------------------------------------------

def normal(rng, *shape, dtype=F32):
    return rng.standard_normal(shape).astype(dtype)


def uniform(rng, lo, hi, *shape, dtype=F32):
    return rng.uniform(lo, hi, shape).astype(dtype)


def ints(rng, lo, hi, *shape, dtype=I32):
    """Integers in [lo, hi)."""
    return rng.integers(lo, hi, size=shape).astype(dtype)


def _f64(*arrays):
    return [np.asarray(a, dtype=F64) for a in arrays]


def _f32(a):
    return np.asarray(a, dtype=F64).astype(F32)


# ---- matmul.tc -----------------------------------------------------------------------------------------

MM_SHAPES = (dict(M=1, K=1, N=1), dict(M=3, K=5, N=7), dict(M=13, K=1, N=3), dict(M=37, K=67, N=41))


def _mm(a, b):
    a, b = _f64(a, b)
    return a @ b


def _tensordot_ref(x0, x1):
    # move (n, h, w) to the front, batch matmul over them, move back
    p = np.matmul(np.transpose(x0, (0, 3, 4, 1, 2)).astype(F64), np.transpose(x1, (0, 3, 4, 1, 2)).astype(F64))
    return _f32(np.transpose(p, (0, 3, 4, 1, 2)))


MATMUL_CASES = [
    KernelCase("matmul", "matmul",
               lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"], s["N"])),
               lambda a, b: _f32(_mm(a, b)), MM_SHAPES, lambda s: s["K"]),
    KernelCase("matmul", "matmul_tn",
               lambda r, s: (normal(r, s["K"], s["M"]), normal(r, s["K"], s["N"])),
               lambda a, b: _f32(_mm(a.T, b)), MM_SHAPES, lambda s: s["K"]),
    KernelCase("matmul", "matmul_nt",
               lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["N"], s["K"])),
               lambda a, b: _f32(_mm(a, b.T)), MM_SHAPES, lambda s: s["K"]),
    KernelCase("matmul", "matmul_f64",
               lambda r, s: (normal(r, s["M"], s["K"], dtype=F64), normal(r, s["K"], s["N"], dtype=F64)),
               lambda a, b: _mm(a, b), MM_SHAPES, lambda s: s["K"]),
    KernelCase("matmul", "matmul_i32",
               lambda r, s: (ints(r, -9, 10, s["M"], s["K"]), ints(r, -9, 10, s["K"], s["N"])),
               lambda a, b: (a.astype(I64) @ b.astype(I64)).astype(I32), MM_SHAPES),
    KernelCase("matmul", "matvec",
               lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"])),
               lambda a, x: _f32(_mm(a, x)),
               (dict(M=1, K=1), dict(M=5, K=3), dict(M=7, K=13), dict(M=97, K=131)), lambda s: s["K"]),
    KernelCase("matmul", "batch_matmul",
               lambda r, s: (normal(r, s["NB"], s["M"], s["K"]), normal(r, s["NB"], s["K"], s["N"])),
               lambda a, b: _f32(np.matmul(*_f64(a, b))),
               (dict(NB=1, M=1, K=1, N=1), dict(NB=3, M=5, K=7, N=2), dict(NB=2, M=13, K=3, N=1),
                dict(NB=5, M=33, K=17, N=35)), lambda s: s["K"]),
    KernelCase("matmul", "gemm",
               lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"], s["N"]), normal(r, s["M"], s["N"]),
                             1.5, np.array(-0.5, dtype=F32)),
               lambda a, b, c, alpha, beta: _f32(float(alpha) * _mm(a, b) + float(beta) * c.astype(F64)),
               MM_SHAPES, lambda s: s["K"] + 1),
    KernelCase("matmul", "gemm_bias",
               lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"], s["N"]), normal(r, s["N"])),
               lambda a, b, bias: _f32(_mm(a, b) + bias.astype(F64)[None, :]),
               MM_SHAPES, lambda s: s["K"] + 1),
    KernelCase("matmul", "tensordot",
               lambda r, s: (normal(r, s["N"], s["C1"], s["C2"], s["H"], s["W"]),
                             normal(r, s["N"], s["C2"], s["C3"], s["H"], s["W"])),
               _tensordot_ref,
               (dict(N=1, C1=1, C2=1, C3=1, H=1, W=1), dict(N=2, C1=3, C2=5, C3=7, H=3, W=2),
                dict(N=1, C1=4, C2=13, C3=3, H=5, W=7)), lambda s: s["C2"]),
]


# ---- conv2d.tc -----------------------------------------------------------------------------------------

def conv_nchw(x, f, stride=1, dilation=1):
    """Valid correlation of x(N,C,H,W) with f(M,C,KH,KW): one channel contraction per window tap."""
    x, f = _f64(x, f)
    n, c, h, w = x.shape
    m, _, kh_n, kw_n = f.shape
    oh = (h - dilation * (kh_n - 1) - 1) // stride + 1
    ow = (w - dilation * (kw_n - 1) - 1) // stride + 1
    y = np.zeros((n, m, oh, ow))
    for kh in range(kh_n):
        for kw in range(kw_n):
            h0, w0 = kh * dilation, kw * dilation
            patch = x[:, :, h0:h0 + stride * (oh - 1) + 1:stride, w0:w0 + stride * (ow - 1) + 1:stride]
            y += np.tensordot(patch, f[:, :, kh, kw], axes=([1], [1])).transpose(0, 3, 1, 2)
    return y


def _conv_inputs(r, s):
    return normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["M"], s["C"], s["KH"], s["KW"])


def _conv_terms(s):
    return s.get("C", 1) * s["KH"] * s["KW"]


CONV_SHAPES = (dict(N=1, C=1, H=3, W=3, M=1, KH=3, KW=3), dict(N=2, C=3, H=7, W=5, M=5, KH=3, KW=1),
               dict(N=1, C=5, H=13, W=11, M=7, KH=3, KW=3), dict(N=1, C=2, H=19, W=37, M=3, KH=1, KW=5))


def _grouped_ref(x, f):
    # x(N,G,C,H,W), f(G,M,C,KH,KW): an ordinary conv per group
    return _f32(np.stack([conv_nchw(x[:, g], f[g]) for g in range(x.shape[1])], axis=1))


def _depthwise_ref(x, f):
    x, f = _f64(x, f)
    kh_n, kw_n = f.shape[1:]
    oh, ow = x.shape[2] - kh_n + 1, x.shape[3] - kw_n + 1
    y = np.zeros(x.shape[:2] + (oh, ow))
    for kh in range(kh_n):
        for kw in range(kw_n):
            y += x[:, :, kh:kh + oh, kw:kw + ow] * f[None, :, kh, kw, None, None]
    return _f32(y)


def _nhwc_pad1(ref):
    """``ref`` (an NCHW reference) of a channels-last input padded by 1 on each side, the result channels-last."""
    def run(x, f):
        xp = np.pad(np.moveaxis(x, 3, 1), ((0, 0), (0, 0), (1, 1), (1, 1)))
        return np.ascontiguousarray(np.moveaxis(ref(xp, f), 1, 3))
    return run


CONV_CASES = [
    KernelCase("conv2d", "conv2d", _conv_inputs, lambda x, f: _f32(conv_nchw(x, f)), CONV_SHAPES, _conv_terms),
    KernelCase("conv2d", "conv2d_3x3",
               lambda r, s: (normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["M"], s["C"], 3, 3)),
               lambda x, f: _f32(conv_nchw(x, f)),
               (dict(N=1, C=1, H=3, W=3, M=1), dict(N=2, C=3, H=7, W=5, M=5), dict(N=1, C=13, H=4, W=11, M=2),
                dict(N=1, C=3, H=35, W=37, M=4)),
               lambda s: 9 * s["C"]),
    KernelCase("conv2d", "conv2d_bias",
               lambda r, s: _conv_inputs(r, s) + (normal(r, s["M"]),),
               lambda x, f, b: _f32(conv_nchw(x, f) + b.astype(F64)[None, :, None, None]),
               CONV_SHAPES, lambda s: _conv_terms(s) + 1),
    KernelCase("conv2d", "conv2d_pad1", _conv_inputs,
               lambda x, f: _f32(conv_nchw(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1))), f)),
               (dict(N=1, C=1, H=1, W=1, M=1, KH=3, KW=3), dict(N=2, C=3, H=7, W=5, M=5, KH=3, KW=3),
                dict(N=1, C=5, H=13, W=11, M=7, KH=1, KW=3), dict(N=1, C=3, H=35, W=33, M=4, KH=3, KW=3)),
               _conv_terms),
    KernelCase("conv2d", "conv2d_s2", _conv_inputs, lambda x, f: _f32(conv_nchw(x, f, stride=2)),
               (dict(N=1, C=1, H=3, W=3, M=1, KH=3, KW=3), dict(N=2, C=3, H=7, W=8, M=5, KH=3, KW=3),
                dict(N=1, C=4, H=13, W=11, M=3, KH=1, KW=1), dict(N=1, C=3, H=5, W=4, M=2, KH=2, KW=3)),
               _conv_terms),
    KernelCase("conv2d", "conv2d_dilated2", _conv_inputs, lambda x, f: _f32(conv_nchw(x, f, dilation=2)),
               (dict(N=1, C=1, H=5, W=5, M=1, KH=3, KW=3), dict(N=2, C=3, H=9, W=7, M=5, KH=2, KW=3),
                dict(N=1, C=2, H=13, W=13, M=3, KH=1, KW=1), dict(N=1, C=1, H=3, W=11, M=2, KH=2, KW=5)),
               _conv_terms),
    KernelCase("conv2d", "conv2d_grouped",
               lambda r, s: (normal(r, s["N"], s["G"], s["C"], s["H"], s["W"]),
                             normal(r, s["G"], s["M"], s["C"], s["KH"], s["KW"])),
               _grouped_ref,
               (dict(N=1, G=1, C=1, H=3, W=3, M=1, KH=3, KW=3), dict(N=2, G=3, C=2, H=7, W=5, M=5, KH=3, KW=1),
                dict(N=1, G=2, C=3, H=6, W=7, M=3, KH=2, KW=3)), _conv_terms),
    KernelCase("conv2d", "conv2d_depthwise",
               lambda r, s: (normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["C"], s["KH"], s["KW"])),
               _depthwise_ref,
               (dict(N=1, C=1, H=3, W=3, KH=3, KW=3), dict(N=2, C=5, H=7, W=9, KH=3, KW=3),
                dict(N=1, C=13, H=5, W=4, KH=2, KW=1), dict(N=1, C=3, H=37, W=41, KH=3, KW=3)),
               lambda s: s["KH"] * s["KW"]),
    KernelCase("conv2d", "conv2d_depthwise_nhwc_pad1",
               lambda r, s: (normal(r, s["N"], s["H"], s["W"], s["C"]), normal(r, s["KH"], s["KW"], s["C"])),
               _nhwc_pad1(lambda x, f: _depthwise_ref(x, np.moveaxis(f, 2, 0))),
               (dict(N=1, C=1, H=1, W=1, KH=3, KW=3), dict(N=2, C=5, H=7, W=9, KH=3, KW=3),
                dict(N=1, C=33, H=7, W=7, KH=3, KW=3), dict(N=1, C=48, H=11, W=13, KH=5, KW=5)),
               lambda s: s["KH"] * s["KW"]),
    KernelCase("conv2d", "conv2d_nhwc_pad1",
               lambda r, s: (normal(r, s["N"], s["H"], s["W"], s["C"]), normal(r, s["C"], s["KH"], s["KW"], s["M"])),
               _nhwc_pad1(lambda x, f: _f32(conv_nchw(x, np.moveaxis(f, 3, 0)))),
               (dict(N=1, C=1, H=1, W=1, M=1, KH=3, KW=3), dict(N=2, C=3, H=7, W=5, M=5, KH=3, KW=3),
                dict(N=1, C=17, H=7, W=7, M=37, KH=1, KW=1), dict(N=1, C=8, H=14, W=14, M=64, KH=3, KW=3)),
               lambda s: s["C"] * s["KH"] * s["KW"]),
]


# ---- pad.tc --------------------------------------------------------------------------------------------

PAD_SHAPES = (dict(N=1, C=1, H=1, W=1), dict(N=2, C=3, H=5, W=7), dict(N=1, C=2, H=13, W=3),
              dict(N=1, C=3, H=35, W=37))


def _nchw(r, s):
    return normal(r, s["N"], s["C"], s["H"], s["W"])


def _pad_hw(x, top, bottom, left, right, value=0.0):
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value).astype(x.dtype)


PAD_CASES = [
    KernelCase("pad", "pad1", lambda r, s: (_nchw(r, s),), lambda x: _pad_hw(x, 1, 1, 1, 1), PAD_SHAPES),
    KernelCase("pad", "pad2", lambda r, s: (_nchw(r, s),), lambda x: _pad_hw(x, 2, 2, 2, 2), PAD_SHAPES),
    KernelCase("pad", "pad1_value", lambda r, s: (_nchw(r, s), -2.5),
               lambda x, v: _pad_hw(x, 1, 1, 1, 1, value=v), PAD_SHAPES),
    KernelCase("pad", "pad_top_left", lambda r, s: (_nchw(r, s),), lambda x: _pad_hw(x, 1, 2, 2, 1), PAD_SHAPES),
]


# ---- pool.tc -------------------------------------------------------------------------------------------

def _blocks2x2(x):
    n, c, h, w = x.shape
    oh, ow = h // 2, w // 2
    return x[:, :, :2 * oh, :2 * ow].astype(F64).reshape(n, c, oh, 2, ow, 2)


POOL2_SHAPES = (dict(N=1, C=1, H=2, W=2), dict(N=2, C=3, H=7, W=5), dict(N=1, C=5, H=13, W=14),
                dict(N=1, C=2, H=67, W=71))
POOL3_SHAPES = (dict(N=1, C=1, H=3, W=3), dict(N=2, C=3, H=7, W=8), dict(N=1, C=2, H=13, W=11),
                dict(N=1, C=2, H=71, W=67))
GLOBAL_SHAPES = (dict(N=1, C=1, H=1, W=1), dict(N=2, C=3, H=5, W=7), dict(N=1, C=13, H=4, W=3),
                 dict(N=1, C=3, H=37, W=41))

POOL_CASES = [
    KernelCase("pool", "maxpool2x2", lambda r, s: (_nchw(r, s),),
               lambda x: _f32(_blocks2x2(x).max(axis=(3, 5))), POOL2_SHAPES),
    KernelCase("pool", "maxpool3x3_s2", lambda r, s: (_nchw(r, s),),
               lambda x: sliding_window_view(x, (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-2, -1)),
               POOL3_SHAPES),
    KernelCase("pool", "maxpool3x3_s2_pad1", lambda r, s: (_nchw(r, s),),
               lambda x: sliding_window_view(np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)), constant_values=-np.inf),
                                             (3, 3), axis=(2, 3))[:, :, ::2, ::2].max(axis=(-2, -1)),
               (dict(N=1, C=1, H=1, W=1), dict(N=2, C=3, H=7, W=8), dict(N=1, C=2, H=13, W=2),
                dict(N=1, C=2, H=56, W=57))),
    KernelCase("pool", "avgpool2x2", lambda r, s: (_nchw(r, s),),
               lambda x: _f32(_blocks2x2(x).mean(axis=(3, 5))), POOL2_SHAPES, lambda s: 4),
    KernelCase("pool", "global_avgpool", lambda r, s: (_nchw(r, s),),
               lambda x: _f32(x.astype(F64).mean(axis=(2, 3))), GLOBAL_SHAPES, lambda s: s["H"] * s["W"]),
    KernelCase("pool", "global_maxpool", lambda r, s: (_nchw(r, s),),
               lambda x: x.max(axis=(2, 3)), GLOBAL_SHAPES),
]


# ---- elementwise.tc ------------------------------------------------------------------------------------

EW_SHAPES = (dict(M=1, N=1), dict(M=3, N=5), dict(M=13, N=7), dict(M=41, N=67))

_erf = np.vectorize(math.erf, otypes=[F64])


def _unary(name, fn, make=None):
    make = make or (lambda r, s: (normal(r, s["M"], s["N"]) * F32(3.0),))
    return KernelCase("elementwise", name, make, lambda x, *rest: _f32(fn(x.astype(F64), *rest)), EW_SHAPES)


def _sinusoids(t_n, d_n):
    # column pairs (2k, 2k+1) share the frequency 10000^(-2k/D); even columns take sin, odd ones cos
    pos = np.arange(t_n, dtype=F64)[:, None]
    freq = 10000.0 ** (-(2 * (np.arange(d_n) // 2)) / d_n)
    table = np.empty((t_n, d_n))
    table[:, 0::2] = np.sin(pos * freq[None, 0::2])
    table[:, 1::2] = np.cos(pos * freq[None, 1::2])
    return table


def _two(r, s, dtype=F32):
    return normal(r, s["M"], s["N"], dtype=dtype), normal(r, s["M"], s["N"], dtype=dtype)


def _i32_pair(r, s):
    return ints(r, -1000, 1000, s["M"], s["N"]), ints(r, -1000, 1000, s["M"], s["N"])


def _i32_one(r, s):
    return (ints(r, -50, 50, s["M"], s["N"]),)


ELEMENTWISE_CASES = [
    _unary("relu", lambda x: np.maximum(x, 0.0)),
    _unary("relu6", lambda x: np.minimum(np.maximum(x, 0.0), 6.0)),
    _unary("leaky_relu", lambda x, a: np.where(x > 0, x, float(a) * x),
           lambda r, s: (normal(r, s["M"], s["N"]), 0.125)),
    _unary("sigmoid_act", lambda x: 0.5 * (1.0 + np.tanh(0.5 * x))),
    _unary("tanh_act", lambda x: (np.exp(2 * x) - 1.0) / (np.exp(2 * x) + 1.0)),
    _unary("gelu", lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))),
    _unary("gelu_tanh", lambda x: 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))),
    _unary("silu", lambda x: x / (1.0 + np.exp(-x))),
    _unary("softplus", lambda x: np.logaddexp(0.0, x)),
    _unary("clip", lambda x, lo, hi: np.clip(x, float(lo), float(hi)),
           lambda r, s: (normal(r, s["M"], s["N"]), np.array(-0.5, dtype=F32), 0.75)),
    _unary("frac", lambda x: x - np.floor(x)),
    KernelCase("elementwise", "positional_encoding", lambda r, s: (normal(r, s["T"], s["D"]),),
               lambda x: _f32(x.astype(F64) + _sinusoids(*x.shape)),
               (dict(T=1, D=1), dict(T=3, D=5), dict(T=13, D=8), dict(T=50, D=64)), lambda s: 1 + s["T"]),
    KernelCase("elementwise", "greater", _two, lambda a, b: np.greater(a, b), EW_SHAPES),
    KernelCase("elementwise", "add", _two, lambda a, b: a + b, EW_SHAPES),
    KernelCase("elementwise", "mul", _two, lambda a, b: _f32(a.astype(F64) * b), EW_SHAPES),
    KernelCase("elementwise", "add_row", lambda r, s: (normal(r, s["M"], s["N"]), normal(r, s["N"])),
               lambda x, b: x + b[None, :], EW_SHAPES),
    KernelCase("elementwise", "add_bias_nchw", lambda r, s: (_nchw(r, s), normal(r, s["C"])),
               lambda x, b: x + b[None, :, None, None],
               (dict(N=1, C=1, H=1, W=1), dict(N=2, C=3, H=5, W=7), dict(N=3, C=13, H=1, W=2),
                dict(N=1, C=5, H=33, W=35))),
    KernelCase("elementwise", "add_scalar", lambda r, s: (normal(r, s["M"], s["N"]), np.array(0.375, dtype=F32)),
               lambda x, c: x + F32(c), EW_SHAPES),
    KernelCase("elementwise", "axpby", lambda r, s: _two(r, s) + (2.0, -0.75),
               lambda x, z, a, b: _f32(a * x.astype(F64) + b * z.astype(F64)), EW_SHAPES, lambda s: 2),
    KernelCase("elementwise", "masked_fill",
               lambda r, s: (normal(r, s["M"], s["N"]), r.random((s["M"], s["N"])) < 0.5, 9.0),
               lambda x, mask, v: np.where(mask, F32(v), x), EW_SHAPES),
    KernelCase("elementwise", "fill_like", lambda r, s: (normal(r, s["M"], s["N"]), np.array(-1.25, dtype=F32)),
               lambda x, v: np.full(x.shape, v, dtype=F32), EW_SHAPES),
    KernelCase("elementwise", "add_i32", _i32_pair, lambda a, b: a + b, EW_SHAPES),
    KernelCase("elementwise", "relu_i32", _i32_one, lambda x: np.maximum(x, 0).astype(I32), EW_SHAPES),
    KernelCase("elementwise", "divmod_i32", _i32_one,
               lambda x: (np.floor_divide(x, 3).astype(I32), np.mod(x, 3).astype(I32)), EW_SHAPES),
    KernelCase("elementwise", "abs_i32", _i32_one, lambda x: np.abs(x), EW_SHAPES),
    KernelCase("elementwise", "dequantize_u8",
               lambda r, s: (ints(r, 0, 256, s["M"], s["N"], dtype=np.uint8), np.array(0.05, dtype=F32), 128),
               lambda q, scale, zp: ((q.astype(I32) - zp).astype(F32) * F32(scale)), EW_SHAPES),
    KernelCase("elementwise", "int_to_float", _i32_one, lambda x: x.astype(F32) * F32(0.5), EW_SHAPES),
]


# ---- softmax.tc ----------------------------------------------------------------------------------------

ROW_SHAPES = (dict(N=1, D=1), dict(N=3, D=5), dict(N=13, D=7), dict(N=7, D=129))


def _softmax_ref(x):
    x = x.astype(F64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return _f32(e / e.sum(axis=-1, keepdims=True))


def _log_softmax_ref(x):
    x = x.astype(F64)
    m = x.max(axis=-1, keepdims=True)
    return _f32(x - (m + np.log(np.exp(x - m).sum(axis=-1, keepdims=True))))


def _rows(r, s, scale=3.0):
    return (normal(r, s["N"], s["D"]) * F32(scale),)


SOFTMAX_CASES = [
    KernelCase("softmax", "softmax", _rows, _softmax_ref, ROW_SHAPES, lambda s: s["D"]),
    KernelCase("softmax", "log_softmax", _rows, _log_softmax_ref, ROW_SHAPES, lambda s: s["D"]),
    KernelCase("softmax", "softmax3d", lambda r, s: (normal(r, s["B"], s["T"], s["D"]) * F32(3.0),),
               _softmax_ref,
               (dict(B=1, T=1, D=1), dict(B=2, T=3, D=5), dict(B=3, T=7, D=13), dict(B=2, T=5, D=67)),
               lambda s: s["D"]),
]


# ---- layernorm.tc --------------------------------------------------------------------------------------

def _ln_inputs(r, s):
    n, d = s["N"], s["D"]
    return normal(r, n, d) * F32(2.0) + F32(1.0), normal(r, d), normal(r, d), 1e-5


def _ln_stats(x, eps):
    x = x.astype(F64)
    mu = x.mean(axis=1)
    rstd = 1.0 / np.sqrt(x.var(axis=1) + float(eps))
    return x, mu, rstd


def _layernorm_ref(x, gamma, beta, eps):
    x, mu, rstd = _ln_stats(x, eps)
    return _f32((x - mu[:, None]) * rstd[:, None] * gamma[None, :] + beta[None, :])


def _layernorm_stats_ref(x, gamma, beta, eps):
    _, mu, rstd = _ln_stats(x, eps)
    return _layernorm_ref(x, gamma, beta, eps), _f32(mu), _f32(rstd)


def _rmsnorm_ref(x, gamma, eps):
    x = x.astype(F64)
    return _f32(x / np.sqrt((x ** 2).mean(axis=1, keepdims=True) + float(eps)) * gamma[None, :])


# D=1 makes the variance 0 and the output beta (rsqrt(eps) times 0): still well defined.
LN_SHAPES = (dict(N=1, D=1), dict(N=3, D=5), dict(N=13, D=7), dict(N=5, D=131))

LAYERNORM_CASES = [
    KernelCase("layernorm", "layernorm", _ln_inputs, _layernorm_ref, LN_SHAPES, lambda s: s["D"]),
    KernelCase("layernorm", "layernorm_stats", _ln_inputs, _layernorm_stats_ref, LN_SHAPES, lambda s: s["D"]),
    KernelCase("layernorm", "rmsnorm", lambda r, s: (normal(r, s["N"], s["D"]), normal(r, s["D"]), 1e-6),
               _rmsnorm_ref, LN_SHAPES, lambda s: s["D"]),
]


# ---- batchnorm.tc --------------------------------------------------------------------------------------

BN_SHAPES = (dict(N=1, C=1, H=1, W=1), dict(N=2, C=3, H=5, W=7), dict(N=3, C=13, H=2, W=1),
             dict(N=2, C=5, H=17, W=19))


def _bn_inference_inputs(r, s):
    c = s["C"]
    return (_nchw(r, s), normal(r, c), uniform(r, 0.5, 2.0, c), normal(r, c), normal(r, c),
            np.array(1e-5, dtype=F32))


def _bn_inference_ref(x, mean, var, scale, bias, eps):
    x, mean, var, scale, bias = _f64(x, mean, var, scale, bias)
    shape = (1, -1, 1, 1)
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + float(eps))
    return _f32(y * scale.reshape(shape) + bias.reshape(shape))


def _bn_train_ref(x, scale, bias, eps):
    x = x.astype(F64)
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    y = _bn_inference_ref(x, mu, var, scale, bias, eps)
    return y, _f32(mu), _f32(var)


BATCHNORM_CASES = [
    KernelCase("batchnorm", "batchnorm", _bn_inference_inputs, _bn_inference_ref, BN_SHAPES),
    KernelCase("batchnorm", "batchnorm_folded", _bn_inference_inputs, _bn_inference_ref, BN_SHAPES),
    KernelCase("batchnorm", "batchnorm_train",
               lambda r, s: (_nchw(r, s) + F32(0.5), normal(r, s["C"]), normal(r, s["C"]), 1e-3),
               _bn_train_ref, BN_SHAPES, lambda s: s["N"] * s["H"] * s["W"]),
]


# ---- transpose.tc --------------------------------------------------------------------------------------

TRANSPOSE_CASES = [
    KernelCase("transpose", "transpose2d", lambda r, s: (normal(r, s["M"], s["N"]),), lambda x: x.T.copy(),
               EW_SHAPES),
    KernelCase("transpose", "batch_transpose", lambda r, s: (normal(r, s["B"], s["M"], s["N"]),),
               lambda x: np.swapaxes(x, 1, 2).copy(),
               (dict(B=1, M=1, N=1), dict(B=3, M=5, N=7), dict(B=2, M=13, N=1), dict(B=2, M=37, N=65))),
    KernelCase("transpose", "nchw_to_nhwc", lambda r, s: (_nchw(r, s),), lambda x: np.moveaxis(x, 1, 3).copy(),
               BN_SHAPES),
    KernelCase("transpose", "nhwc_to_nchw", lambda r, s: (normal(r, s["N"], s["H"], s["W"], s["C"]),),
               lambda x: np.moveaxis(x, 3, 1).copy(), BN_SHAPES),
]


# ---- concat.tc -----------------------------------------------------------------------------------------

CONCAT_CASES = [
    KernelCase("concat", "concat_c",
               lambda r, s: (normal(r, s["N"], s["C1"], s["H"], s["W"]), normal(r, s["N"], s["C2"], s["H"], s["W"])),
               lambda a, b: np.concatenate([a, b], axis=1),
               (dict(N=1, C1=1, C2=1, H=1, W=1), dict(N=2, C1=3, C2=5, H=7, W=2),
                dict(N=1, C1=13, C2=1, H=3, W=5), dict(N=1, C1=2, C2=3, H=33, W=37))),
    KernelCase("concat", "concat3_c",
               lambda r, s: tuple(normal(r, s["N"], s[c], s["H"], s["W"]) for c in ("C1", "C2", "C3")),
               lambda a, b, d: np.concatenate([a, b, d], axis=1),
               (dict(N=1, C1=1, C2=1, C3=1, H=1, W=1), dict(N=2, C1=3, C2=5, C3=2, H=3, W=7),
                dict(N=1, C1=1, C2=13, C3=3, H=5, W=1))),
    KernelCase("concat", "concat_cols",
               lambda r, s: (normal(r, s["M"], s["N1"]), normal(r, s["M"], s["N2"])),
               lambda a, b: np.concatenate([a, b], axis=1),
               (dict(M=1, N1=1, N2=1), dict(M=3, N1=5, N2=7), dict(M=13, N1=1, N2=3), dict(M=5, N1=67, N2=33))),
]


# ---- polybench.tc --------------------------------------------------------------------------------------

def _d(r, *shape):
    return normal(r, *shape, dtype=F64)


def _gemver_inputs(r, s):
    n = s["N"]
    return (_d(r, n, n),) + tuple(_d(r, n) for _ in range(8)) + (1.5, 1.2)


def _gemver_ref(a, u1, v1, u2, v2, w, x, y, z, alpha, beta):
    ah = a + np.outer(u1, v1) + np.outer(u2, v2)
    xo = x + beta * (ah.T @ y) + z
    wo = w + alpha * (ah @ xo)
    return ah, xo, wo


POLY_SHAPES = (dict(NI=1, NJ=1, NK=1, NL=1, NM=1), dict(NI=3, NJ=5, NK=7, NL=2, NM=11),
               dict(NI=13, NJ=1, NK=3, NL=5, NM=2), dict(NI=37, NJ=41, NK=43, NL=35, NM=39))
VEC_SHAPES = (dict(M=1, N=1), dict(M=3, N=5), dict(M=13, N=7), dict(M=67, N=71))
SQUARE_SHAPES = (dict(N=1), dict(N=3), dict(N=13), dict(N=67))

POLYBENCH_CASES = [
    KernelCase("polybench", "two_mm",
               lambda r, s: (_d(r, s["NI"], s["NK"]), _d(r, s["NK"], s["NJ"]), _d(r, s["NJ"], s["NL"]),
                             _d(r, s["NI"], s["NL"]), 1.5, 1.2),
               lambda a, b, c, d, alpha, beta: alpha * (a @ b) @ c + beta * d,
               POLY_SHAPES, lambda s: s["NK"] * s["NJ"] + 1),
    KernelCase("polybench", "three_mm",
               lambda r, s: (_d(r, s["NI"], s["NK"]), _d(r, s["NK"], s["NJ"]), _d(r, s["NJ"], s["NM"]),
                             _d(r, s["NM"], s["NL"])),
               lambda a, b, c, d: (a @ b) @ (c @ d),
               POLY_SHAPES, lambda s: s["NK"] * s["NJ"] * s["NM"]),
    KernelCase("polybench", "atax", lambda r, s: (_d(r, s["M"], s["N"]), _d(r, s["N"])),
               lambda a, x: a.T @ (a @ x), VEC_SHAPES, lambda s: s["M"] * s["N"]),
    KernelCase("polybench", "bicg", lambda r, s: (_d(r, s["N"], s["M"]), _d(r, s["N"]), _d(r, s["M"])),
               lambda a, rr, p: (a.T @ rr, a @ p), VEC_SHAPES, lambda s: max(s["M"], s["N"])),
    KernelCase("polybench", "mvt", lambda r, s: (_d(r, s["N"], s["N"]),) + tuple(_d(r, s["N"]) for _ in range(4)),
               lambda a, x1, x2, y1, y2: (x1 + a @ y1, x2 + a.T @ y2), SQUARE_SHAPES, lambda s: s["N"] + 1),
    KernelCase("polybench", "gemver", _gemver_inputs, _gemver_ref, SQUARE_SHAPES, lambda s: 3 * s["N"] * s["N"]),
    KernelCase("polybench", "doitgen", lambda r, s: (_d(r, s["NR"], s["NQ"], s["NP"]), _d(r, s["NP"], s["NP"])),
               lambda a, c4: (a.reshape(-1, a.shape[2]) @ c4).reshape(a.shape),
               (dict(NR=1, NQ=1, NP=1), dict(NR=3, NQ=5, NP=7), dict(NR=13, NQ=2, NP=3), dict(NR=5, NQ=7, NP=37)),
               lambda s: s["NP"]),
]


# ---- reduce.tc -----------------------------------------------------------------------------------------

RED_SHAPES = (dict(M=1, N=1), dict(M=3, N=5), dict(M=13, N=7), dict(M=37, N=131))


def _mat(r, s):
    return (normal(r, s["M"], s["N"]),)


REDUCE_CASES = [
    KernelCase("reduce", "sum_rows", _mat, lambda x: _f32(x.astype(F64).sum(axis=1)), RED_SHAPES, lambda s: s["N"]),
    KernelCase("reduce", "mean_rows", _mat, lambda x: _f32(x.astype(F64).mean(axis=1)), RED_SHAPES,
               lambda s: s["N"]),
    KernelCase("reduce", "max_rows", _mat, lambda x: x.max(axis=1), RED_SHAPES),
    KernelCase("reduce", "min_rows", _mat, lambda x: x.min(axis=1), RED_SHAPES),
    KernelCase("reduce", "prod_rows", lambda r, s: (uniform(r, 0.8, 1.25, s["M"], s["N"]),),
               lambda x: _f32(np.exp(np.log(x.astype(F64)).sum(axis=1))), RED_SHAPES),
    KernelCase("reduce", "sum_cols", _mat, lambda x: _f32(x.astype(F64).sum(axis=0)), RED_SHAPES, lambda s: s["M"]),
    KernelCase("reduce", "sum_i64", lambda r, s: (ints(r, -10 ** 12, 10 ** 12, s["M"], s["N"], dtype=I64),),
               lambda x: x.sum(axis=1, dtype=I64), RED_SHAPES),
    KernelCase("reduce", "l2norm_rows", _mat, lambda x: _f32(np.sqrt((x.astype(F64) ** 2).sum(axis=1))),
               RED_SHAPES, lambda s: s["N"]),
]


# ---- gather.tc -----------------------------------------------------------------------------------------

GATHER_CASES = [
    KernelCase("gather", "embedding",
               lambda r, s: (normal(r, s["V"], s["D"]), ints(r, 0, s["V"], s["N"])),
               lambda e, idx: e[idx],
               (dict(V=1, D=1, N=1), dict(V=5, D=3, N=7), dict(V=13, D=7, N=2), dict(V=101, D=33, N=37))),
    KernelCase("gather", "take_i64",
               lambda r, s: (normal(r, s["V"]), ints(r, 0, s["V"], s["N"], dtype=I64)),
               lambda t, idx: t[idx],
               (dict(V=1, N=1), dict(V=5, N=3), dict(V=13, N=7))),
    KernelCase("gather", "take_clamped",
               lambda r, s: (normal(r, s["V"]), ints(r, -3, s["V"] + 3, s["N"])),
               lambda t, idx: t[np.clip(idx, 0, t.shape[0] - 1)],
               (dict(V=1, N=1), dict(V=5, N=13), dict(V=13, N=7))),
    KernelCase("gather", "embedding_bag_sum",
               lambda r, s: (normal(r, s["V"], s["D"]), ints(r, 0, s["V"], s["B"], s["L"])),
               lambda e, idx: _f32(e.astype(F64)[idx].sum(axis=1)),
               (dict(V=1, D=1, B=1, L=1), dict(V=5, D=3, B=2, L=7), dict(V=13, D=5, B=3, L=2)),
               lambda s: s["L"]),
]


CASES: list[KernelCase] = (MATMUL_CASES + CONV_CASES + PAD_CASES + POOL_CASES + ELEMENTWISE_CASES
                           + SOFTMAX_CASES + LAYERNORM_CASES + BATCHNORM_CASES + TRANSPOSE_CASES
                           + CONCAT_CASES + POLYBENCH_CASES + REDUCE_CASES + GATHER_CASES)
