"""The layers of TC's "ML Layers database", written as polyc's own definitions, against numpy.

TC's documentation lists about thirty layers (pooling, convolutions and their gradient, linear layers,
activations, math and tensor operations, fused layers, normalisations, a distance). Each :class:`Layer` here
is polyc's definition of one of them (its own source and names, parameters such as strides fixed to
concrete values), the inputs for a shape, and a numpy reference written independently (in float64). Every
layer runs through ``polyc.define`` on two small shapes, one with odd extents and one with batch 1, and once
compiled with every transformation off (``Options.naive()``). Where ``kernels/*.tc`` has the same operator,
the library's def is checked against the same reference (``test_library_twin``).

Ranges whose lower bound is not 0 are never left to inference here: an index that only occurs in a sum
such as ``2*h + r`` gets an explicit ``where h in 0:...``.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

import polyc
from polyc.options import Options

F32, F64, I32 = np.float32, np.float64, np.int32
KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"


@dataclass(frozen=True)
class Layer:
    """One layer: ``source`` (one def), ``make(rng, shape)`` -> the arguments, ``reference(*args)`` -> the
    outputs in ``-> (...)`` order (float64 or exact), ``shapes`` (odd extents; batch 1), ``terms(shape)`` the
    longest sum of products in one output element (scales the absolute tolerance)."""

    name: str
    source: str
    make: Callable
    reference: Callable
    shapes: tuple
    terms: Callable = lambda s: 1


# ---- numpy references (float64) ----------------------------------------------------------------------

def f64(*arrays):
    return [np.asarray(a, dtype=F64) for a in arrays]


def windows(x, kh, kw, sh, sw):
    """x(..., H, W) -> (..., OH, OW, kh, kw): the valid windows at stride (sh, sw)."""
    return sliding_window_view(x, (kh, kw), axis=(-2, -1))[..., ::sh, ::sw, :, :]


def correlate(x, w, sh=1, sw=1):
    """Valid cross-correlation of x(N,C,H,W) with w(M,C,KH,KW) at stride (sh, sw) -> (N,M,OH,OW)."""
    x, w = f64(x, w)
    return np.einsum("nchwij,mcij->nmhw", windows(x, w.shape[2], w.shape[3], sh, sw), w)


def correlate_grads(x, w, dy, sh, sw):
    """The gradients (dx, dw) of sum(correlate(x, w, sh, sw) * dy), scattered tap by tap."""
    x, w, dy = f64(x, w, dy)
    oh, ow = dy.shape[2:]
    dx, dw = np.zeros_like(x), np.zeros_like(w)
    for p in range(w.shape[2]):
        for q in range(w.shape[3]):
            rows, cols = slice(p, p + sh * (oh - 1) + 1, sh), slice(q, q + sw * (ow - 1) + 1, sw)
            dx[:, :, rows, cols] += np.einsum("nmhw,mc->nchw", dy, w[:, :, p, q])
            dw[:, :, p, q] = np.einsum("nmhw,nchw->mc", dy, x[:, :, rows, cols])
    return dx, dw


def grouped(x, w, b, sh=1, sw=1):
    """x(N,G,C,H,W), w(G,F,C,KH,KW), b(G,F) -> (N,G,F,OH,OW): one correlation per group, plus the bias."""
    y = np.stack([correlate(x[:, g], w[g], sh, sw) for g in range(x.shape[1])], axis=1)
    return y + np.asarray(b, F64)[None, :, :, None, None]


def batchnorm_ref(x, run_mean, run_var, momentum=0.1, eps=1e-5):
    x, run_mean, run_var = f64(x, run_mean, run_var)
    count = x.size // x.shape[1]
    mu = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3))
    y = (x - mu[None, :, None, None]) / np.sqrt(var[None, :, None, None] + eps)
    mean_out = (1 - momentum) * run_mean + momentum * mu
    var_out = (1 - momentum) * run_var + momentum * var * count / (count - 1)
    return y, mean_out, var_out, mu, var


def layernorm_ref(x, eps=1e-5):
    x = np.asarray(x, F64)
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(x.var(axis=-1, keepdims=True) + eps)


def softmax_ref(x):
    e = np.exp(np.asarray(x, F64) - np.max(x, axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


# ---- inputs -------------------------------------------------------------------------------------------

def normal(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


def positive(rng, *shape):
    return rng.uniform(0.5, 2.0, shape).astype(F32)


# ---- the layers ---------------------------------------------------------------------------------------

CONV_SHAPES = (dict(N=2, C=3, H=9, W=7, M=5, KH=3, KW=2), dict(N=1, C=1, H=5, W=3, M=1, KH=1, KW=3))
GROUP_SHAPES = (dict(N=2, G=3, C=2, H=7, W=9, F=3, KH=3, KW=3), dict(N=1, G=1, C=1, H=5, W=5, F=1, KH=2, KW=1))
FC_SHAPES = (dict(B=3, K=7, N=5), dict(B=1, K=1, N=13))


def _conv_inputs(r, s):
    return (normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["M"], s["C"], s["KH"], s["KW"]),
            normal(r, s["M"]))


def _group_inputs(r, s):
    return (normal(r, s["N"], s["G"], s["C"], s["H"], s["W"]),
            normal(r, s["G"], s["F"], s["C"], s["KH"], s["KW"]), normal(r, s["G"], s["F"]))


def _conv_grad_inputs(r, s):
    oh, ow = (s["H"] - s["KH"]) // 2 + 1, s["W"] - s["KW"] + 1
    return (normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["M"], s["C"], s["KH"], s["KW"]),
            normal(r, s["N"], s["M"], oh, ow))


def _fc_inputs(r, s):
    return normal(r, s["B"], s["K"]), normal(r, s["N"], s["K"]), normal(r, s["N"])


def _fc_ref(x, w, b):
    x, w, b = f64(x, w, b)
    return x @ w.T + b


LAYERS = [
    # -- pooling --
    Layer("avgpool", """
def avgpool(float(B,C,H,W) X) -> (Y) {
    Y(b,c,h,w) +=! X(b,c,2*h+r,w+s) / 6.0
        where r in 0:3, s in 0:2, h in 0:(H-3)/2+1, w in 0:W-1
}""", lambda r, s: (normal(r, s["B"], s["C"], s["H"], s["W"]),),
          lambda x: windows(np.asarray(x, F64), 3, 2, 2, 1).mean(axis=(-2, -1)),
          (dict(B=2, C=3, H=9, W=7), dict(B=1, C=1, H=3, W=2)), lambda s: 6),
    Layer("maxpool", """
def maxpool(float(B,C,H,W) X) -> (Y) {
    Y(b,c,h,w) max=! X(b,c,2*h+r,2*w+s)
        where r in 0:2, s in 0:3, h in 0:(H-2)/2+1, w in 0:(W-3)/2+1
}""", lambda r, s: (normal(r, s["B"], s["C"], s["H"], s["W"]),),
          lambda x: windows(np.asarray(x, F64), 2, 3, 2, 2).max(axis=(-2, -1)),
          (dict(B=2, C=3, H=7, W=11), dict(B=1, C=1, H=2, W=3))),
    # -- convolutions --
    Layer("convolution", """
def convolution(float(N,C,H,W) X, float(M,C,KH,KW) Wt, float(M) bias) -> (Y) {
    Y(n,m,h,w) +=! X(n,c,h+p,w+q) * Wt(m,c,p,q)
        where h in 0:H-KH+1, w in 0:W-KW+1
    Y(n,m,h,w) = Y(n,m,h,w) + bias(m)
}""", _conv_inputs, lambda x, w, b: correlate(x, w) + np.asarray(b, F64)[None, :, None, None],
          CONV_SHAPES, lambda s: s["C"] * s["KH"] * s["KW"] + 1),
    Layer("convolution_strided", """
def convolution_strided(float(N,C,H,W) X, float(M,C,KH,KW) Wt, float(M) bias) -> (Y) {
    Y(n,m,h,w) +=! X(n,c,2*h+p,3*w+q) * Wt(m,c,p,q)
        where h in 0:(H-KH)/2+1, w in 0:(W-KW)/3+1
    Y(n,m,h,w) = Y(n,m,h,w) + bias(m)
}""", _conv_inputs, lambda x, w, b: correlate(x, w, 2, 3) + np.asarray(b, F64)[None, :, None, None],
          (dict(N=2, C=3, H=9, W=11, M=5, KH=3, KW=2), dict(N=1, C=1, H=5, W=3, M=1, KH=1, KW=3)),
          lambda s: s["C"] * s["KH"] * s["KW"] + 1),
    # The gradients of Y(n,m,h,w) = sum over c, p, q of X(n,c,2h+p,w+q) * Wt(m,c,p,q) (stride 2 along H, 1
    # along W) for an incoming gradient dY. The input gradient is a "full" correlation: a row y of X gets
    # dY's row (y-p)/2 for every tap p with y-p even and inside dY; the guard keeps the others out (rows of
    # X no output reads, such as the last one when (H-KH) is odd, get 0).
    Layer("convolution_grad", """
def convolution_grad(float(N,C,H,W) X, float(M,C,KH,KW) Wt, float(N,M,OH,OW) dY) -> (dX, dWt) {
    dX(n,c,y,x) +=! (y-p >= 0 && (y-p) % 2 == 0 && (y-p)/2 < OH && x-q >= 0 && x-q < OW)
                    ? dY(n,m,(y-p)/2,x-q) * Wt(m,c,p,q) : 0.0
        where y in 0:H, x in 0:W, p in 0:KH, q in 0:KW
    dWt(m,c,p,q) +=! dY(n,m,h,w) * X(n,c,2*h+p,w+q)
        where p in 0:KH, q in 0:KW
}""", _conv_grad_inputs, lambda x, w, dy: correlate_grads(x, w, dy, 2, 1),
          (dict(N=2, C=3, H=9, W=7, M=5, KH=2, KW=3), dict(N=1, C=1, H=4, W=3, M=1, KH=1, KW=3)),
          lambda s: s["N"] * s["M"] * s["H"] * s["W"]),
    Layer("group_convolution", """
def group_convolution(float(N,G,C,H,W) X, float(G,F,C,KH,KW) Wt, float(G,F) bias) -> (Y) {
    Y(n,g,f,h,w) +=! X(n,g,c,h+p,w+q) * Wt(g,f,c,p,q)
        where h in 0:H-KH+1, w in 0:W-KW+1
    Y(n,g,f,h,w) = Y(n,g,f,h,w) + bias(g,f)
}""", _group_inputs, lambda x, w, b: grouped(x, w, b), GROUP_SHAPES, lambda s: s["C"] * s["KH"] * s["KW"] + 1),
    Layer("group_convolution_strided", """
def group_convolution_strided(float(N,G,C,H,W) X, float(G,F,C,KH,KW) Wt, float(G,F) bias) -> (Y) {
    Y(n,g,f,h,w) +=! X(n,g,c,2*h+p,2*w+q) * Wt(g,f,c,p,q)
        where h in 0:(H-KH)/2+1, w in 0:(W-KW)/2+1
    Y(n,g,f,h,w) = Y(n,g,f,h,w) + bias(g,f)
}""", _group_inputs, lambda x, w, b: grouped(x, w, b, 2, 2), GROUP_SHAPES,
          lambda s: s["C"] * s["KH"] * s["KW"] + 1),
    # -- linear --
    Layer("fully_connected", """
def fully_connected(float(B,K) X, float(N,K) Wt, float(N) bias) -> (Y) {
    Y(b,n) +=! X(b,k) * Wt(n,k)
    Y(b,n) = Y(b,n) + bias(n)
}""", _fc_inputs, _fc_ref, FC_SHAPES, lambda s: s["K"] + 1),
    # -- non-linear --
    Layer("relu", """
def relu(float(B,M) X) -> (Y) {
    Y(b,m) = fmax(X(b,m), 0.0)
}""", lambda r, s: (normal(r, s["B"], s["M"]),), lambda x: np.maximum(np.asarray(x, F64), 0),
          (dict(B=3, M=7), dict(B=1, M=1))),
    Layer("sigmoid", """
def sigmoid(float(N,C,H,W) X) -> (Y) {
    Y(n,c,h,w) = 1.0 / (1.0 + exp(-X(n,c,h,w)))
}""", lambda r, s: (4 * normal(r, s["N"], s["C"], s["H"], s["W"]),),
          lambda x: 1 / (1 + np.exp(-np.asarray(x, F64))), (dict(N=2, C=3, H=5, W=7), dict(N=1, C=1, H=1, W=3))),
    Layer("softmax", """
def softmax(float(N,D) X) -> (Y) {
    Peak(n) max=! X(n,d)
    Ex(n,d) = exp(X(n,d) - Peak(n))
    Total(n) +=! Ex(n,d)
    Y(n,d) = Ex(n,d) / Total(n)
}""", lambda r, s: (3 * normal(r, s["N"], s["D"]),), softmax_ref, (dict(N=5, D=11), dict(N=1, D=1)),
          lambda s: s["D"]),
    Layer("tanh", """
def tanh_layer(float(M) X) -> (Y) {
    Y(m) = tanh(X(m))
}""", lambda r, s: (3 * normal(r, s["M"]),), lambda x: np.tanh(np.asarray(x, F64)), (dict(M=13), dict(M=1))),
    Layer("cosine", """
def cosine(float(M) X) -> (Y) {
    Y(m) = cos(X(m))
}""", lambda r, s: (5 * normal(r, s["M"]),), lambda x: np.cos(np.asarray(x, F64)), (dict(M=13), dict(M=1))),
    # -- math --
    Layer("tensordot", """
def tensordot(float(N,C1,C2,H,W) P, float(N,C2,C3,H,W) Q) -> (Y) {
    Y(n,a,c,h,w) +=! P(n,a,b,h,w) * Q(n,b,c,h,w)
}""", lambda r, s: (normal(r, s["N"], s["C1"], s["C2"], s["H"], s["W"]),
                    normal(r, s["N"], s["C2"], s["C3"], s["H"], s["W"])),
          lambda p, q: np.einsum("nabhw,nbchw->nachw", *f64(p, q)),
          (dict(N=2, C1=3, C2=5, C3=7, H=3, W=1), dict(N=1, C1=1, C2=3, C3=1, H=1, W=5)), lambda s: s["C2"]),
    Layer("matmul", """
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(i,j) +=! A(i,r) * B(r,j)
}""", lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"], s["N"])), lambda a, b: np.matmul(*f64(a, b)),
          (dict(M=5, K=7, N=3), dict(M=1, K=1, N=11)), lambda s: s["K"]),
    # The gradients of C = A . B for an incoming dC: dA = dC . B^T, dB = A^T . dC.
    Layer("matmul_grad", """
def matmul_grad(float(M,K) A, float(K,N) B, float(M,N) dC) -> (dA, dB) {
    dA(m,k) +=! dC(m,n) * B(k,n)
    dB(k,n) +=! A(m,k) * dC(m,n)
}""", lambda r, s: (normal(r, s["M"], s["K"]), normal(r, s["K"], s["N"]), normal(r, s["M"], s["N"])),
          lambda a, b, dc: (np.asarray(dc, F64) @ np.asarray(b, F64).T, np.asarray(a, F64).T @ np.asarray(dc, F64)),
          (dict(M=5, K=7, N=3), dict(M=1, K=3, N=1)), lambda s: max(s["M"], s["N"])),
    Layer("batch_matmul", """
def batch_matmul(float(B,N,M) X, float(B,M,K) Y) -> (Z) {
    Z(b,i,j) +=! X(b,i,r) * Y(b,r,j)
}""", lambda r, s: (normal(r, s["B"], s["N"], s["M"]), normal(r, s["B"], s["M"], s["K"])),
          lambda x, y: np.matmul(*f64(x, y)), (dict(B=3, N=5, M=7, K=3), dict(B=1, N=1, M=5, K=1)), lambda s: s["M"]),
    Layer("abs", """
def absolute(float(M,N) X) -> (Y) {
    Y(i,j) = fabs(X(i,j))
}""", lambda r, s: (normal(r, s["M"], s["N"]),), lambda x: np.abs(np.asarray(x, F64)),
          (dict(M=3, N=7), dict(M=1, N=1))),
    Layer("add", """
def add(float(N) A, float(N) B) -> (Y) {
    Y(i) = A(i) + B(i)
}""", lambda r, s: (normal(r, s["N"]), normal(r, s["N"])), lambda a, b: np.add(*f64(a, b)),
          (dict(N=13), dict(N=1))),
    # -- tensor operations --
    Layer("indexing", """
def indexing(float(H,W) X, int32(L) rows) -> (Y) {
    Y(l,w) = X(rows(l), w)
}""", lambda r, s: (normal(r, s["H"], s["W"]), r.integers(0, s["H"], s["L"]).astype(I32)),
          lambda x, rows: np.asarray(x, F64)[rows], (dict(H=7, W=5, L=11), dict(H=1, W=3, L=1))),
    # lookup table: Y(b,n) = sum over r of T(idx(b,n), r), a row of the table picked per element, summed.
    Layer("lut", """
def lut(float(V,R) T, int32(B,N) idx) -> (Y) {
    Y(b,n) +=! T(idx(b,n), r)
}""", lambda r, s: (normal(r, s["V"], s["R"]), r.integers(0, s["V"], (s["B"], s["N"])).astype(I32)),
          lambda t, idx: np.asarray(t, F64).sum(axis=1)[idx], (dict(V=7, R=5, B=3, N=11), dict(V=1, R=3, B=1, N=1)),
          lambda s: s["R"]),
    Layer("transpose", """
def transpose(float(N,C,H,W) X) -> (Y) {
    Y(c,n,w,h) = X(n,c,h,w)
}""", lambda r, s: (normal(r, s["N"], s["C"], s["H"], s["W"]),),
          lambda x: np.transpose(np.asarray(x, F64), (1, 0, 3, 2)),
          (dict(N=2, C=3, H=5, W=7), dict(N=1, C=1, H=3, W=1))),
    # concat: A(M,N) and B(M,N) stacked along a new middle axis of the transposed result, Y(N,2,M).
    Layer("concat", """
def concat(float(M,N) A, float(M,N) B) -> (Y) {
    Y(n,i,m) = i == 0 ? A(m,n) : B(m,n)
        where i in 0:2
}""", lambda r, s: (normal(r, s["M"], s["N"]), normal(r, s["M"], s["N"])),
          lambda a, b: np.stack([np.asarray(a, F64).T, np.asarray(b, F64).T], axis=1),
          (dict(M=5, N=3), dict(M=1, N=1))),
    # cast: int32(X + 0.5), truncating toward zero as a C cast (and numpy's astype) does.
    Layer("cast", """
def cast(float(M,N) X) -> (int32(M,N) Y) {
    Y(m,n) = int32(X(m,n) + 0.5)
}""", lambda r, s: (r.uniform(-20, 20, (s["M"], s["N"])).astype(F32),),
          lambda x: (x + F32(0.5)).astype(I32), (dict(M=7, N=5), dict(M=1, N=1))),
    Layer("copy", """
def copy(float(M,N) X) -> (Y) {
    Y(i,j) = X(i,j)
}""", lambda r, s: (normal(r, s["M"], s["N"]),), lambda x: np.asarray(x, F64), (dict(M=3, N=13), dict(M=1, N=1))),
    Layer("scale", """
def scale(float(M,N) X) -> (Y) {
    Y(m,n) = X(m,n) * -1.75
}""", lambda r, s: (normal(r, s["M"], s["N"]),), lambda x: np.asarray(x, F64) * -1.75,
          (dict(M=5, N=7), dict(M=1, N=1))),
    # -- fused --
    Layer("fcrelu", """
def fcrelu(float(B,K) X, float(N,K) Wt, float(N) bias) -> (Y) {
    Y(b,n) +=! X(b,k) * Wt(n,k)
    Y(b,n) = Y(b,n) + bias(n)
    Y(b,n) = fmax(Y(b,n), 0.0)
}""", _fc_inputs, lambda x, w, b: np.maximum(_fc_ref(x, w, b), 0), FC_SHAPES, lambda s: s["K"] + 1),
    # a depthwise 2-D correlation + bias + relu, then a pointwise (1x1) one + bias + relu; one image (C,H,W).
    Layer("small_mobilenet", """
def small_mobilenet(float(C1,H,W) X, float(C1,KH,KW) Wd, float(C1) bd, float(C2,C1) Wp, float(C2) bp) -> (Y1, Y2) {
    Y1(c,h,w) +=! X(c,h+p,w+q) * Wd(c,p,q)
        where h in 0:H-KH+1, w in 0:W-KW+1
    Y1(c,h,w) = fmax(Y1(c,h,w) + bd(c), 0.0)
    Y2(o,h,w) +=! Y1(c,h,w) * Wp(o,c)
    Y2(o,h,w) = fmax(Y2(o,h,w) + bp(o), 0.0)
}""", lambda r, s: (normal(r, s["C1"], s["H"], s["W"]), normal(r, s["C1"], s["KH"], s["KW"]), normal(r, s["C1"]),
                    normal(r, s["C2"], s["C1"]), normal(r, s["C2"])),
          lambda x, wd, bd, wp, bp: _mobilenet_ref(x, wd, bd, wp, bp),
          (dict(C1=3, H=7, W=9, KH=3, KW=3, C2=5), dict(C1=1, H=3, W=1, KH=3, KW=1, C2=1)),
          lambda s: s["KH"] * s["KW"] * s["C1"] + 2),
    # -- normalisation --
    # batchnorm in training: normalise with the batch statistics over N, H, W (eps 1e-5), and update the
    # running statistics with momentum 0.1 (the running variance takes the unbiased batch variance).
    Layer("batchnorm", """
def batchnorm(float(N,C,H,W) X, float(C) run_mean, float(C) run_var) -> (Y, mean_out, var_out, mu, var) {
    S(c) +=! X(n,c,h,w)
    mu(c) = S(c) / float(N*H*W)
    Q(c) +=! (X(n,c,h,w) - mu(c)) * (X(n,c,h,w) - mu(c))
    var(c) = Q(c) / float(N*H*W)
    mean_out(c) = 0.9 * run_mean(c) + 0.1 * mu(c)
    var_out(c) = 0.9 * run_var(c) + 0.1 * Q(c) / float(N*H*W - 1)
    Y(n,c,h,w) = (X(n,c,h,w) - mu(c)) * rsqrt(var(c) + 1e-5)
}""", lambda r, s: (1 + 2 * normal(r, s["N"], s["C"], s["H"], s["W"]), normal(r, s["C"]), positive(r, s["C"])),
          batchnorm_ref, (dict(N=2, C=3, H=5, W=7), dict(N=1, C=1, H=3, W=1)), lambda s: s["N"] * s["H"] * s["W"]),
    Layer("layernorm", """
def layernorm(float(T,B,C) X) -> (Y) {
    S(t,b) +=! X(t,b,c)
    mu(t,b) = S(t,b) / float(C)
    Q(t,b) +=! (X(t,b,c) - mu(t,b)) * (X(t,b,c) - mu(t,b))
    Y(t,b,c) = (X(t,b,c) - mu(t,b)) * rsqrt(Q(t,b) / float(C) + 1e-5)
}""", lambda r, s: (1 + 2 * normal(r, s["T"], s["B"], s["C"]),), layernorm_ref,
          (dict(T=3, B=5, C=7), dict(T=1, B=1, C=3)), lambda s: s["C"]),
    # -- distance --
    Layer("cosine_similarity", """
def cosine_similarity(float(M,N) A, float(M,N) B) -> (Y) {
    AA(m) +=! A(m,n) * A(m,n)
    BB(m) +=! B(m,n) * B(m,n)
    AB(m) +=! A(m,n) * B(m,n)
    Y(m) = AB(m) / fmax(sqrt(AA(m)) * sqrt(BB(m)), 1e-8)
}""", lambda r, s: (normal(r, s["M"], s["N"]), normal(r, s["M"], s["N"])),
          lambda a, b: _cosine_ref(a, b), (dict(M=5, N=11), dict(M=1, N=1)), lambda s: s["N"]),
]


def _mobilenet_ref(x, wd, bd, wp, bp):
    x, wd, bd, wp, bp = f64(x, wd, bd, wp, bp)
    y1 = np.einsum("chwij,cij->chw", windows(x, wd.shape[1], wd.shape[2], 1, 1), wd) + bd[:, None, None]
    y1 = np.maximum(y1, 0)
    y2 = np.maximum(np.einsum("chw,oc->ohw", y1, wp) + bp[:, None, None], 0)
    return y1, y2


def _cosine_ref(a, b):
    a, b = f64(a, b)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return (a * b).sum(axis=1) / np.maximum(norms, 1e-8)


LAYER_KINDS = ("avgpool", "maxpool", "convolution", "convolution_strided", "convolution_grad", "group_convolution",
               "group_convolution_strided", "fully_connected", "relu", "sigmoid", "softmax", "tanh", "cosine",
               "tensordot", "matmul", "matmul_grad", "batch_matmul", "abs", "add", "indexing", "lut", "transpose",
               "concat", "cast", "copy", "scale", "fcrelu", "small_mobilenet", "batchnorm", "layernorm",
               "cosine_similarity")
BY_NAME = {layer.name: layer for layer in LAYERS}


# ---- running and comparing ------------------------------------------------------------------------------

def as_tuple(value) -> tuple:
    return tuple(value) if isinstance(value, tuple) else (value,)


def inputs_for(name: str, shape: dict) -> tuple:
    rng = np.random.default_rng(zlib.crc32(f"{name}{sorted(shape.items())}".encode()))
    return BY_NAME[name].make(rng, shape)


def assert_matches(got, expected, terms: int, what: str) -> None:
    got, expected = as_tuple(got), as_tuple(expected)
    assert len(got) == len(expected), f"{what}: {len(got)} outputs, expected {len(expected)}"
    for k, (g, e) in enumerate(zip(got, expected)):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape, f"{what} output {k}: shape {g.shape}, expected {e.shape}"
        if e.dtype.kind in "iub":
            assert g.dtype == e.dtype, f"{what} output {k}: dtype {g.dtype}, expected {e.dtype}"
            np.testing.assert_array_equal(g, e, err_msg=f"{what} output {k}")
        else:
            assert g.dtype == F32, f"{what} output {k}: dtype {g.dtype}, expected float32"
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5 * terms, err_msg=f"{what} output {k}")


def check_layer(layer: Layer, shape: dict, options: Options | None = None) -> None:
    args = inputs_for(layer.name, shape)
    originals = [np.copy(a) for a in args]
    got = polyc.define(layer.source, options=options)(*args)
    assert_matches(got, layer.reference(*args), layer.terms(shape), f"{layer.name} at {shape}")
    for a, orig in zip(args, originals):
        np.testing.assert_array_equal(a, orig, err_msg=f"{layer.name}: an input was modified")


def test_every_layer_kind_has_a_definition():
    assert sorted(BY_NAME) == sorted(LAYER_KINDS) and len(LAYERS) == len(LAYER_KINDS)
    for layer in LAYERS:
        assert len(layer.shapes) == 2
        assert 1 in layer.shapes[1].values(), f"{layer.name}: the second shape has no extent of 1"


@pytest.mark.parametrize("layer,shape", [pytest.param(layer, shape, id=f"{layer.name}-{k}")
                                         for layer in LAYERS for k, shape in enumerate(layer.shapes)])
def test_layer_matches_numpy(layer, shape):
    check_layer(layer, shape)


@pytest.mark.parametrize("layer", [pytest.param(layer, id=layer.name) for layer in LAYERS])
def test_layer_without_transforms_matches_numpy(layer):
    check_layer(layer, layer.shapes[0], Options.naive())


def test_gradient_references_are_adjoints():
    """The numpy gradients are the adjoints of their forward maps: <f(x), dy> = <x, df(dy)> (checks the
    references themselves, independently of polyc)."""
    rng = np.random.default_rng(7)
    x, w, dy = _conv_grad_inputs(rng, dict(N=2, C=3, H=9, W=7, M=5, KH=2, KW=3))
    dx, dw = correlate_grads(x, w, dy, 2, 1)
    forward = np.vdot(correlate(x, w, 2, 1), np.asarray(dy, F64))
    assert np.isclose(forward, np.vdot(np.asarray(x, F64), dx)) and np.isclose(forward, np.vdot(np.asarray(w, F64), dw))
    assert np.all(dx[:, :, -1, :] == 0)  # (H-KH) is odd: the last row of X is read by no output
    a, b, dc = f64(rng.standard_normal((5, 7)), rng.standard_normal((7, 3)), rng.standard_normal((5, 3)))
    da, db = BY_NAME["matmul_grad"].reference(a, b, dc)
    assert np.isclose(np.vdot(a @ b, dc), np.vdot(a, da)) and np.isclose(np.vdot(a @ b, dc), np.vdot(b, db))


# ---- the same operators in kernels/*.tc ---------------------------------------------------------------------

def library(family: str, name: str):
    return polyc.define((KERNEL_DIR / f"{family}.tc").read_text(), name)


def _twin_conv2d_bias():
    x, w, b = inputs_for("convolution", CONV_SHAPES[0])
    return library("conv2d", "conv2d_bias")(x, w, b), BY_NAME["convolution"].reference(x, w, b)


def _twin_conv2d_s2():
    x, w, _ = inputs_for("convolution_strided", CONV_SHAPES[0])
    return library("conv2d", "conv2d_s2")(x, w), correlate(x, w, 2, 2)


def _twin_conv2d_grouped():
    x, w, _ = inputs_for("group_convolution", GROUP_SHAPES[0])
    return library("conv2d", "conv2d_grouped")(x, w), grouped(x, w, np.zeros(w.shape[:2]))


def _twin_conv2d_depthwise():
    shape = BY_NAME["small_mobilenet"].shapes[0]
    x, wd = inputs_for("small_mobilenet", shape)[:2]
    expected = np.einsum("chwij,cij->chw", windows(np.asarray(x, F64), shape["KH"], shape["KW"], 1, 1), wd)
    return library("conv2d", "conv2d_depthwise")(x[None], wd)[0], expected


def _twin_avgpool2x2():
    (x,) = inputs_for("avgpool", BY_NAME["avgpool"].shapes[0])
    return library("pool", "avgpool2x2")(x), windows(np.asarray(x, F64), 2, 2, 2, 2).mean(axis=(-2, -1))


def _twin_maxpool3x3_s2():
    (x,) = inputs_for("maxpool", BY_NAME["maxpool"].shapes[0])
    return library("pool", "maxpool3x3_s2")(x), windows(np.asarray(x, F64), 3, 3, 2, 2).max(axis=(-2, -1))


def _twin_gemm_bias():
    x, w, b = inputs_for("fully_connected", FC_SHAPES[0])
    return library("matmul", "gemm_bias")(x, np.ascontiguousarray(w.T), b), _fc_ref(x, w, b)


def _twin_relu():
    (x,) = inputs_for("relu", BY_NAME["relu"].shapes[0])
    return library("elementwise", "relu")(x), BY_NAME["relu"].reference(x)


def _twin_sigmoid():
    (x,) = inputs_for("sigmoid", BY_NAME["sigmoid"].shapes[0])
    x2 = x.reshape(x.shape[0], -1)
    return library("elementwise", "sigmoid_act")(x2), BY_NAME["sigmoid"].reference(x2)


def _twin_tanh():
    (x,) = inputs_for("tanh", BY_NAME["tanh"].shapes[0])
    return library("elementwise", "tanh_act")(x[None]), np.tanh(np.asarray(x, F64))[None]


def _twin_add():
    a, b = inputs_for("add", BY_NAME["add"].shapes[0])
    return library("elementwise", "add")(a[None], b[None]), np.add(*f64(a, b))[None]


def _twin_softmax():
    (x,) = inputs_for("softmax", BY_NAME["softmax"].shapes[0])
    return library("softmax", "softmax")(x), softmax_ref(x)


def _twin_tensordot():
    args = inputs_for("tensordot", BY_NAME["tensordot"].shapes[0])
    return library("matmul", "tensordot")(*args), BY_NAME["tensordot"].reference(*args)


def _twin_matmul():
    args = inputs_for("matmul", BY_NAME["matmul"].shapes[0])
    return library("matmul", "matmul")(*args), BY_NAME["matmul"].reference(*args)


def _twin_matmul_grad():
    a, b, dc = inputs_for("matmul_grad", BY_NAME["matmul_grad"].shapes[0])
    got = (library("matmul", "matmul_nt")(dc, b), library("matmul", "matmul_tn")(a, dc))
    return got, BY_NAME["matmul_grad"].reference(a, b, dc)


def _twin_batch_matmul():
    args = inputs_for("batch_matmul", BY_NAME["batch_matmul"].shapes[0])
    return library("matmul", "batch_matmul")(*args), BY_NAME["batch_matmul"].reference(*args)


def _twin_embedding():
    x, rows = inputs_for("indexing", BY_NAME["indexing"].shapes[0])
    return library("gather", "embedding")(x, rows), np.asarray(x, F64)[rows]


def _twin_transpose():
    (x,) = inputs_for("transpose", BY_NAME["transpose"].shapes[0])
    return library("transpose", "nchw_to_nhwc")(x), np.transpose(np.asarray(x, F64), (0, 2, 3, 1))


def _twin_concat():
    a, b = inputs_for("concat", BY_NAME["concat"].shapes[0])
    return library("concat", "concat_cols")(a, b), np.concatenate(f64(a, b), axis=1)


def _twin_batchnorm_train():
    x, run_mean, run_var = inputs_for("batchnorm", BY_NAME["batchnorm"].shapes[0])
    c = x.shape[1]
    got = library("batchnorm", "batchnorm_train")(x, np.ones(c, F32), np.zeros(c, F32), F32(1e-5))
    y, _, _, mu, var = batchnorm_ref(x, run_mean, run_var)
    return got, (y, mu, var)


def _twin_layernorm():
    (x,) = inputs_for("layernorm", BY_NAME["layernorm"].shapes[0])
    x2 = x.reshape(-1, x.shape[-1])
    d = x2.shape[1]
    return library("layernorm", "layernorm")(x2, np.ones(d, F32), np.zeros(d, F32), F32(1e-5)), layernorm_ref(x2)


TWINS = {
    "convolution": _twin_conv2d_bias, "convolution_strided": _twin_conv2d_s2,
    "group_convolution": _twin_conv2d_grouped, "small_mobilenet": _twin_conv2d_depthwise,
    "avgpool": _twin_avgpool2x2, "maxpool": _twin_maxpool3x3_s2, "fully_connected": _twin_gemm_bias,
    "relu": _twin_relu, "sigmoid": _twin_sigmoid, "tanh": _twin_tanh, "add": _twin_add, "softmax": _twin_softmax,
    "tensordot": _twin_tensordot, "matmul": _twin_matmul, "matmul_grad": _twin_matmul_grad,
    "batch_matmul": _twin_batch_matmul, "indexing": _twin_embedding, "transpose": _twin_transpose,
    "concat": _twin_concat, "batchnorm": _twin_batchnorm_train, "layernorm": _twin_layernorm,
}


@pytest.mark.parametrize("layer", sorted(TWINS))
def test_library_twin(layer):
    """The def of kernels/*.tc for the same operator gives the layer's reference (adapted to its layout)."""
    got, expected = TWINS[layer]()
    assert_matches(got, expected, 64, f"kernels twin of {layer}")
