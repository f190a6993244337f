#!/usr/bin/env python
"""Tune the kernel benchmark set (``polyc.tune``) and print what tuning gains, per kernel and overall.

The set is the kernels of ``scripts/bench_kernels.py``: SGEMM at 256-2048, a batch matmul, the MLP layer with
GELU, the convolutions (3x3 64ch at 56x56, 1x1 256->64 at 56x56, 3x3 128ch at 28x28, 7x7/2 3->64 at 224x224,
depthwise 3x3 256ch at 56x56) and PolyBench's 2mm, 3mm, atax, bicg, mvt, gemver, doitgen (fp64, MEDIUM). Each
is tuned for ``--budget`` seconds (the search proposes, compiles in worker processes, times one candidate at a
time, then confirms the best against the default, alternately, :data:`polyc.tune.CONFIRM` times). Columns:
kernel, sizes, default ms, tuned ms (both from the confirmation), gain (default / tuned; 1.00 when the default
stayed the best), the winning options, candidates measured. Then the geometric mean of the gains, over all
kernels and over the slowest third (by default ms). The records go to the records file
(``POLYC_TUNING_RECORDS``), so ``polyc.define`` uses them afterwards.

``--compare SECONDS`` instead runs the searches of ``--strategies`` (default the model-based search and random
sampling; ``evolution`` is the genetic one) with the same budget, ``--seeds`` times each, on the kernels of
``--only`` (or SGEMM 512, the 3x3 conv and gemver), and prints each search's confirmed gain (default over
best, from the alternating confirmation that ends it: a single measurement during the search is too noisy
to rank strategies by) and their geometric means; ``--plot FILE.png`` draws the
searches' best-so-far curves (matplotlib, the ``bench`` extra).

    python scripts/tune_kernels.py --budget 60 --threads 1
    python scripts/tune_kernels.py --compare 40 --plot search.png
    POLYC_CPU=znver3 python scripts/tune_kernels.py --budget 60      # for the AVX2 target
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import polyc
import polyc.kernels
import polyc.tune as tune
from bench_kernels import BENCH_SOURCE  # scripts/bench_kernels.py, beside this script
from polyc.target import host_target


def kernel_set() -> list[tuple[str, str, str, dict]]:
    """``(section, label, source, def name, sizes)`` of every kernel of the set."""
    matmul = polyc.kernels.load("matmul", "matmul").source
    conv = polyc.kernels.load("conv2d", "conv2d_pad1").source
    conv1 = polyc.kernels.load("conv2d", "conv2d").source
    poly = polyc.kernels.load("polybench", "atax").source
    rows = [("gemm", f"sgemm {n}", matmul, "matmul", dict(M=n, K=n, N=n)) for n in (256, 512, 1024, 2048)]
    rows.append(("bmm", "bmm 16x256", polyc.kernels.load("matmul", "batch_matmul").source, "batch_matmul",
                 dict(NB=16, M=256, K=256, N=256)))
    rows.append(("mlp", "mlp 64x768x3072", BENCH_SOURCE, "mlp_gelu", dict(M=64, K=768, N=3072)))
    rows += [("conv", "conv 3x3 64ch 56", conv, "conv2d_pad1", dict(N=1, C=64, H=56, W=56, M=64, KH=3, KW=3)),
             ("conv", "conv 1x1 256->64 56", conv1, "conv2d", dict(N=1, C=256, H=56, W=56, M=64, KH=1, KW=1)),
             ("conv", "conv 3x3 128ch 28", conv, "conv2d_pad1", dict(N=1, C=128, H=28, W=28, M=128, KH=3, KW=3)),
             ("conv", "conv 7x7/2 3->64 224", BENCH_SOURCE, "conv2d_s2_pad3",
              dict(N=1, C=3, H=224, W=224, M=64, KH=7, KW=7)),
             ("conv", "depthwise 3x3 256ch 56", BENCH_SOURCE, "conv2d_depthwise_pad1",
              dict(N=1, C=256, H=56, W=56, KH=3, KW=3))]
    medium = {"two_mm": dict(NI=180, NJ=190, NK=210, NL=220), "three_mm": dict(NI=180, NJ=190, NK=200, NL=210, NM=220),
              "atax": dict(M=390, N=410), "bicg": dict(M=390, N=410), "mvt": dict(N=400), "gemver": dict(N=400),
              "doitgen": dict(NQ=40, NR=50, NP=60)}
    rows += [("polybench", name, poly, name, sizes) for name, sizes in medium.items()]
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--budget", type=float, default=60.0, help="seconds of search per kernel")
    parser.add_argument("--threads", type=int, default=None, help="threads the kernels run with")
    parser.add_argument("--only", default="", help="sections or labels, comma-separated (gemm,conv,'sgemm 512')")
    parser.add_argument("--compare", type=float, default=None, help="evolution vs random, SECONDS each")
    parser.add_argument("--plot", default=None, help="with --compare: write the best-so-far curves here")
    parser.add_argument("--seeds", type=int, default=2, help="with --compare: searches per strategy and kernel")
    parser.add_argument("--strategies", default="model,random", help="with --compare: the searches, comma-separated")
    args = parser.parse_args(argv)
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    rows = [r for r in kernel_set() if not chosen or r[0] in chosen or r[1] in chosen]
    target = host_target()
    budget = args.budget if args.compare is None else args.compare
    print(f"# {target}, threads {args.threads or target.cores}, budget {budget:g} s a search\n")
    if args.compare is not None:
        return compare(rows if chosen else [r for r in kernel_set() if r[1] in ("sgemm 512", "conv 3x3 64ch 56",
                                                                                  "gemver")],
                       args.compare, args.threads, args.plot, args.seeds,
                       tuple(w.strip() for w in args.strategies.split(",") if w.strip()))
    print("| kernel | sizes | default ms | tuned ms | gain | winning options | candidates |")
    print("| --- | --- | ---: | ---: | ---: | --- | ---: |")
    results = []
    for _, label, source, name, sizes in rows:
        started = time.monotonic()
        result = tune.tune(source, sizes, name, budget=args.budget, threads=args.threads)
        results.append(result)
        print(f"| {label} | {','.join(f'{k}={v}' for k, v in sizes.items())} | {result.default_seconds * 1e3:.3f} | "
              f"{result.best_seconds * 1e3:.3f} | {result.gain:.2f} | {result.best_spec or '(default)'} | "
              f"{len(result.records)} |", flush=True)
        print(f"<!-- {label}: {time.monotonic() - started:.0f} s -->", file=sys.stderr)
    slowest = sorted(results, key=lambda r: -r.default_seconds)[:max(1, len(results) // 3)]
    print(f"\ngeometric mean gain: {_geomean(r.gain for r in results):.3f} over {len(results)} kernels, "
          f"{_geomean(r.gain for r in slowest):.3f} over the slowest third ({', '.join(r.name for r in slowest)}); "
          f"slower than the default: {sum(r.gain < 1 for r in results)}")
    return 0


def compare(rows, seconds: float, threads, plot, seeds: int = 2, strategies=("model", "random")) -> int:
    """The searches of ``strategies``, ``seconds`` each and ``seeds`` seeds each, on each of ``rows`` (records
    not written), run interleaved (seed 0 of every strategy, then seed 1, ...) so a drift of the machine's
    speed hits them alike. A search's result is its *confirmed* gain (default over best, both from the
    alternating confirmation that ends it): single measurements during a search are too noisy to rank by."""
    names = ", ".join(map(str, range(seeds)))
    print("| kernel | " + " | ".join(f"{s} gain (seeds {names}) | mean" for s in strategies) + " |")
    print("| --- |" + " --- | ---: |" * len(strategies))
    curves, means = {}, {s: [] for s in strategies}
    for _, label, source, name, sizes in rows:
        gains = {s: [] for s in strategies}
        for seed in range(seeds):
            for strategy in strategies:
                result = tune.tune(source, sizes, name, budget=seconds, threads=threads, strategy=strategy,
                                   seed=seed, write=False)
                gains[strategy].append(result.gain)
                curves[(label, strategy, seed)] = [(t, result.history[0][1] / b) for t, b in result.history]
        for strategy in strategies:
            means[strategy].append(_geomean(gains[strategy]))
        print(f"| {label} | " + " | ".join(f"{', '.join(f'{g:.2f}' for g in gains[s])} | {means[s][-1]:.3f}"
                                           for s in strategies) + " |", flush=True)
    print("\ngeometric mean of the confirmed gains: "
          + ", ".join(f"{s} {_geomean(means[s]):.3f}" for s in strategies))
    if plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        styles = dict(zip(strategies, ("-", "--", ":", "-.")))
        for (label, strategy, seed), history in curves.items():
            ax.step([t for t, _ in history], [g for _, g in history], where="post", alpha=0.8,
                    label=f"{label} ({strategy}, seed {seed})", linestyle=styles[strategy])
        ax.set_xlabel("seconds of search")
        ax.set_ylabel("first measurement / best so far")
        ax.legend(fontsize=6)
        fig.tight_layout()
        fig.savefig(plot, dpi=120)
        print(f"\nwrote {plot}")
    return 0


def _geomean(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


if __name__ == "__main__":
    sys.exit(main())
