#!/usr/bin/env python
"""Generic kernels against specialised ones (issue 13): what one compile for every size costs in speed.

Each row runs one def at one size three ways, on the same inputs, alternating, medians of ``--runs`` timed
batches:

- *specialised*: the kernel compiled for the row's sizes (``polyc.Options()``, the default);
- *generic, own hint*: ``Options(generic=True)`` compiled with the row's sizes as the hint, so the tiles and
  the register tile are the specialised ones' and the only differences are sizes read at run time and no
  packing;
- *generic, shared*: one generic kernel per def, compiled once at the def's first row (its hint), serving
  every row of the def — the use case (a model whose shapes vary, one compile).

Columns: the two ratios *specialised ms / generic ms* (above 1: the generic kernel is faster). Rows: SGEMM
512, 1024 and 2048, and every distinct convolution of ResNet-50 (batch 1, channels-last, the shapes of
``scripts/bench_kernels.py``), one def per (window, stride, padding). The bar (issue 13): within 15% (ratio
at least 0.85) on GEMM 1024 and the ResNet-50 convolutions.

Run it for both instruction sets, whatever the machine::

    python scripts/bench_generic.py --threads 1
    POLYC_CPU=znver3 python scripts/bench_generic.py --threads 1        # AVX2 code on any x86-64 host

``--only gemm`` or ``--only conv`` narrows the rows; ``--quick`` takes one row of each def.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import polyc  # noqa: E402

#: One def per (window, stride, padding) of ResNet-50's convolutions, channels-last: X(N,H,W,C),
#: F(KH,KW,C,M) -> Y(N,OH,OW,M).
SOURCE = """
def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }

def conv_1x1(float(N,H,W,C) X, float(C,M) F) -> (Y) { Y(n,h,w,m) +=! X(n,h,w,c) * F(c,m) }

def conv_1x1_s2(float(N,H,W,C) X, float(C,M) F) -> (Y) {
    Y(n,h,w,m) +=! X(n,2*h,2*w,c) * F(c,m) where h in 0:(H+1)/2, w in 0:(W+1)/2
}

def conv_3x3_p1(float(N,H,W,C) X, float(KH,KW,C,M) F) -> (Y) {
    Y(n,h,w,m) +=! (h+kh-1 >= 0 && h+kh-1 < H && w+kw-1 >= 0 && w+kw-1 < W) ? X(n,h+kh-1,w+kw-1,c) * F(kh,kw,c,m) : 0.0
        where h in 0:H+3-KH, w in 0:W+3-KW, kh in 0:KH, kw in 0:KW
}

def conv_3x3_s2_p1(float(N,H,W,C) X, float(KH,KW,C,M) F) -> (Y) {
    Y(n,h,w,m) +=! (2*h+kh-1 >= 0 && 2*h+kh-1 < H && 2*w+kw-1 >= 0 && 2*w+kw-1 < W) ? X(n,2*h+kh-1,2*w+kw-1,c) * F(kh,kw,c,m) : 0.0
        where h in 0:(H+2-KH)/2+1, w in 0:(W+2-KW)/2+1, kh in 0:KH, kw in 0:KW
}

def conv_7x7_s2_p3(float(N,H,W,C) X, float(KH,KW,C,M) F) -> (Y) {
    Y(n,h,w,m) +=! (2*h+kh-3 >= 0 && 2*h+kh-3 < H && 2*w+kw-3 >= 0 && 2*w+kw-3 < W) ? X(n,2*h+kh-3,2*w+kw-3,c) * F(kh,kw,c,m) : 0.0
        where h in 0:(H+6-KH)/2+1, w in 0:(W+6-KW)/2+1, kh in 0:KH, kw in 0:KW
}
"""

from bench_kernels import RESNET50_CONVS  # noqa: E402  (scripts/bench_kernels.py, beside this script)


def rows(only: str, quick: bool) -> list[tuple[str, str, dict]]:
    """(label, def, sizes) per row."""
    found = []
    if only in ("", "gemm"):
        found += [(f"sgemm {n}", "matmul", dict(M=n, N=n, K=n)) for n in ((1024,) if quick else (512, 1024, 2048))]
    if only in ("", "conv"):
        seen = set()
        for c, h, m, k, stride, pad in RESNET50_CONVS:
            name = {(1, 1): "conv_1x1", (1, 2): "conv_1x1_s2", (3, 1): "conv_3x3_p1", (3, 2): "conv_3x3_s2_p1",
                    (7, 2): "conv_7x7_s2_p3"}[(k, stride)]
            if quick and name in seen:
                continue
            seen.add(name)
            sizes = dict(N=1, H=h, W=h, C=c, M=m) | ({} if k == 1 else dict(KH=k, KW=k))
            found.append((f"conv {k}x{k}" + (f"/{stride}" if stride > 1 else "") + f" {c}->{m} @{h}", name, sizes))
    return found


def median_ms(fn, args, runs: int) -> float:
    """The median over ``runs`` batches of the time of one call, in ms (each batch at least 0.1 s)."""
    fn(*args)
    t = time.perf_counter()
    fn(*args)
    once = time.perf_counter() - t
    reps = max(1, int(0.1 / max(once, 1e-6)))
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        for _ in range(reps):
            fn(*args)
        samples.append((time.perf_counter() - t) / reps)
    return statistics.median(samples) * 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--only", choices=("gemm", "conv"), default="")
    parser.add_argument("--quick", action="store_true", help="one row per def")
    args = parser.parse_args(argv)
    os.environ.setdefault("POLYC_CACHE_DIR", "off")
    special = polyc.Options(threads=args.threads)
    generic = polyc.Options(threads=args.threads, generic=True)
    target = polyc.kernel.host_target()
    print(f"# generic vs specialised kernels: {target.cpu}, {target.vector_bits}-bit vectors, "
          f"{args.threads} thread(s), medians of {args.runs}\n")
    print("| kernel | specialised ms | generic (own hint) ms | ratio | generic (shared) ms | ratio | compile s "
          "(specialised / generic) | check |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    shared: dict = {}
    rng = np.random.default_rng(0)
    ratios, bad = [], 0
    for label, name, sizes in rows(args.only, args.quick):
        spec_kernel = polyc.define(SOURCE, name, options=special)
        t = time.perf_counter()
        spec = spec_kernel.specialize_sizes(sizes)
        spec_s = time.perf_counter() - t
        t = time.perf_counter()
        fixed = ("KH", "KW")  # a convolution's window stays specialised, every other size is a parameter
        own = polyc.define(SOURCE, name, options=generic).generic(sizes, fixed=fixed).at(sizes)
        own_s = time.perf_counter() - t
        if name not in shared:
            shared[name] = polyc.define(SOURCE, name, options=generic).generic(sizes, fixed=fixed)
        one = shared[name].at(sizes)
        inputs = [rng.standard_normal(t.shape).astype(t.dtype) * 0.1 for t in spec.inputs]
        want = spec(*inputs)
        ok = all(np.allclose(k(*inputs), want, rtol=1e-3, atol=1e-3) for k in (own, one))
        bad += not ok
        times = {"spec": [], "own": [], "one": []}
        for _ in range(2):  # alternate, so drift hits all three alike
            for key, k in (("spec", spec), ("own", own), ("one", one)):
                times[key].append(median_ms(k, inputs, max(1, args.runs // 2)))
        s, o, g = (min(times[key]) for key in ("spec", "own", "one"))
        ratios.append(s / o)
        print(f"| {label} | {s:.3f} | {o:.3f} | {s / o:.2f} | {g:.3f} | {s / g:.2f} | {spec_s:.1f} / {own_s:.1f} | "
              f"{'ok' if ok else 'MISMATCH'} |", flush=True)
    if ratios:
        print(f"\ngeometric mean of specialised / generic (own hint): "
              f"{float(np.exp(np.mean(np.log(ratios)))):.2f}; lowest {min(ratios):.2f}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
