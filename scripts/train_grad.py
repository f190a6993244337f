#!/usr/bin/env python
"""Train a small MLP and a small CNN on synthetic data with polyc's forward and gradient kernels only, beside
the same models trained in numpy with hand-written backward passes, and print the two loss curves.

Each model is one def of the language computing the mean softmax cross-entropy ``loss`` of a batch (the
network, the log-sum-exp and the loss in one comprehension); ``polyc.grad(model, wrt=parameters)`` gives
the kernel of its gradients, called with the seed ``dloss = 1``. Plain SGD, both trainings from the same
initial parameters on the same batches; the data are a fixed random teacher's labels on Gaussian inputs
(MLP) and images whose class is which quadrant holds a bright blob (CNN).

    python scripts/train_grad.py            # 300 steps of each; exit status 1 unless both losses fall
    python scripts/train_grad.py --steps 50

The loss of each step is printed every ``--every`` steps for polyc and numpy side by side; the run fails
(exit 1) when a polyc loss curve does not fall below half its start or parts from numpy's by more than 1%.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import polyc

MLP = """
def mlp_loss(float(B,D) X, float(D,H) W1, float(H) b1, float(H,K) W2, float(K) b2, float(B,K) T) -> (loss) {
    Z(b,h) +=! X(b,d) * W1(d,h)
    A(b,h) = fmax(Z(b,h) + b1(h), 0.0)
    L(b,k) +=! A(b,h) * W2(h,k)
    O(b,k) = L(b,k) + b2(k)
    Mx(b) max=! O(b,k)
    S(b) +=! exp(O(b,k) - Mx(b))
    loss() +=! T(b,k) * (Mx(b) + log(S(b)) - O(b,k)) / float(B)
}
"""

CNN = """
def cnn_loss(float(B,CI,H,W) X, float(CO,CI,3,3) F, float(CO) bf, float(CO,HP,WP,K) V, float(K) bv,
             float(B,K) T) -> (loss) {
    Y(b,co,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ? X(b,ci,h+kh-1,w+kw-1) * F(co,ci,kh,kw) : 0.0
        where h in 0:H, w in 0:W, kh in 0:3, kw in 0:3
    R(b,co,h,w) = fmax(Y(b,co,h,w) + bf(co), 0.0)
    P(b,co,i,j) max=! R(b,co,2*i+di,2*j+dj) where i in 0:HP, j in 0:WP, di in 0:2, dj in 0:2
    L(b,k) +=! P(b,co,i,j) * V(co,i,j,k)
    O(b,k) = L(b,k) + bv(k)
    Mx(b) max=! O(b,k)
    S(b) +=! exp(O(b,k) - Mx(b))
    loss() +=! T(b,k) * (Mx(b) + log(S(b)) - O(b,k)) / float(B)
}
"""


def softmax_xent(logits, targets):
    """The mean cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(1, keepdims=True)
    p = np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)
    loss = float(np.sum(targets * (np.log(np.exp(shifted).sum(1, keepdims=True)) - shifted)) / len(logits))
    return loss, (p - targets) / len(logits)


def mlp_numpy(params, x, t):
    w1, b1, w2, b2 = params
    z = x @ w1 + b1
    a = np.maximum(z, 0)
    loss, dout = softmax_xent(a @ w2 + b2, t)
    da = dout @ w2.T * (z > 0)
    return loss, [x.T @ da, da.sum(0), a.T @ dout, dout.sum(0)]


def cnn_numpy(params, x, t):
    f, bf, v, bv = params
    b, ci, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (3, 3), axis=(2, 3))  # b, ci, h, w, 3, 3
    y = np.einsum("bihwxy,oixy->bohw", windows, f) + bf[None, :, None, None]
    r = np.maximum(y, 0)
    blocks = r.reshape(b, -1, h // 2, 2, w // 2, 2)
    p = blocks.max(axis=(3, 5))
    loss, dout = softmax_xent(np.einsum("bcij,cijk->bk", p, v) + bv, t)
    dp = np.einsum("bk,cijk->bcij", dout, v)
    hit = blocks == p[:, :, :, None, :, None]
    dr = (hit * (dp / hit.sum(axis=(3, 5)))[:, :, :, None, :, None]).reshape(r.shape)
    dy = dr * (y > 0)
    df = np.einsum("bihwxy,bohw->oixy", windows, dy)
    return loss, [df, dy.sum((0, 2, 3)), np.einsum("bcij,bk->cijk", p, dout), dout.sum(0)]


def train(name, source, wrt, params, batches, numpy_step, steps, lr, every):
    """SGD with polyc's kernels beside numpy's; returns (polyc losses, numpy losses)."""
    model = polyc.define(source)
    gradient = polyc.grad(model, wrt=wrt)
    ours = [p.copy() for p in params]
    theirs = [p.astype(np.float64) for p in params]
    curves = ([], [])
    print(f"\n{name}: {steps} steps of SGD (lr {lr}); loss, polyc | numpy")
    for step in range(steps):
        x, t = batches(step)
        inputs = dict(zip(wrt, ours))
        args = [inputs.get(p.name, x if p.name == "X" else t) for p in model.checked.inputs]
        loss = float(model(*args))
        grads = gradient(*args, np.float32(1.0))
        ours = [p - lr * g for p, g in zip(ours, grads)]
        ref_loss, ref_grads = numpy_step(theirs, x.astype(np.float64), t.astype(np.float64))
        theirs = [p - lr * g for p, g in zip(theirs, ref_grads)]
        curves[0].append(loss)
        curves[1].append(ref_loss)
        if step % every == 0 or step == steps - 1:
            print(f"  step {step:4d}: {loss:.4f} | {ref_loss:.4f}")
    return curves


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=25)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    ok = True

    d, hidden, k, batch = 32, 64, 8, 64
    teacher = rng.standard_normal((d, k))

    def mlp_batches(step):
        x = np.random.default_rng(step).standard_normal((batch, d)).astype(np.float32)
        return x, np.eye(k, dtype=np.float32)[np.argmax(x @ teacher, 1)]

    params = [(rng.standard_normal((d, hidden)) / np.sqrt(d)).astype(np.float32), np.zeros(hidden, np.float32),
              (rng.standard_normal((hidden, k)) / np.sqrt(hidden)).astype(np.float32), np.zeros(k, np.float32)]
    curves = [train("MLP 32-64-8", MLP, ("W1", "b1", "W2", "b2"), params, mlp_batches, mlp_numpy,
                    args.steps, 0.5, args.every)]

    size, channels, classes = 12, 8, 4

    def cnn_batches(step):
        r = np.random.default_rng(10_000 + step)
        labels = r.integers(0, classes, batch)
        x = r.standard_normal((batch, 1, size, size)).astype(np.float32) * 0.5
        for n, label in enumerate(labels):
            top, left = (label // 2) * size // 2, (label % 2) * size // 2
            x[n, 0, top + 1:top + 5, left + 1:left + 5] += 0.5
        return x, np.eye(classes, dtype=np.float32)[labels]

    params = [(rng.standard_normal((channels, 1, 3, 3)) / 3).astype(np.float32), np.zeros(channels, np.float32),
              (rng.standard_normal((channels, size // 2, size // 2, classes)) * 0.05).astype(np.float32),
              np.zeros(classes, np.float32)]
    curves.append(train("CNN conv3x3(8)-relu-maxpool-linear(4)", CNN, ("F", "bf", "V", "bv"), params, cnn_batches,
                        cnn_numpy, args.steps, 0.2, args.every))

    for name, (ours, theirs) in zip(("MLP", "CNN"), curves):
        start, end = np.mean(ours[:5]), np.mean(ours[-5:])
        apart = max(abs(a - b) / max(abs(b), 1e-3) for a, b in zip(ours, theirs))
        falls = end < 0.5 * start
        agrees = apart < 0.01
        print(f"{name}: loss {start:.4f} -> {end:.4f} ({'falls' if falls else 'DOES NOT FALL'}); "
              f"largest difference from numpy {apart:.1e} ({'agrees' if agrees else 'DIFFERS'})")
        ok = ok and falls and agrees
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
