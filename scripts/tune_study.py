#!/usr/bin/env python
"""How much a tuning search strategy beats random sampling, with the statistical power live runs lack.

A live comparison (``tune_kernels.py --compare``) costs a search's budget per seed, and one search's gain moves
by 0.1-0.3 between seeds, so a few seeds cannot separate strategies that differ by a few percent. This script
measures a kernel's space once and replays searches on it many times (a surrogate benchmark):

1. ``--measure N``: N candidates drawn at random from the space (``polyc.tune.search.space``; the default
   first), each compiled in worker processes, checked against the default and timed as a search times it
   (``polyc.tune.measure.time_candidate``), and fingerprinted by its LLVM IR before optimization (the
   pipeline's ``lower`` + ``emit``: candidates with equal IR compile to equal code). Written as JSON lines to
   ``--data DIR``, one file per kernel and target.
2. Replay: a candidate's true time is the median over every measured candidate with its IR; a search picks
   candidates from the measured pool in rounds of :data:`polyc.tune.ROUND` as it proposes live (random
   sampling: uniformly; the model-based searches: the default and 3 random draws first, then per round the
   best of :meth:`polyc.tune.search.ModelSearch.rank` over the pool not yet picked and one random pick),
   sees each as its true time times log-normal noise (``--noise``, 3% by default), and ends with the
   candidate whose noisy time was lowest; the result is the default's true time over that candidate's.
   ``--trials`` picks a search (the live 30 s searches measure 25-100; ``--handicap`` takes picks off the
   model-based searches for the time their model takes), ``--seeds`` searches per strategy. ``model`` learns
   from the kernel's own picks (after a first sample of :data:`ModelSearch.SAMPLE`); ``transfer`` also from
   the other kernels' pools of the same target, as records (single measurements, not the IR medians) are
   history live (leave-one-kernel-out).

    python scripts/tune_study.py --measure 200 --only "mlp 64x768x3072,gemver" --data study/
    python scripts/tune_study.py --data study/ --trials 28 --seeds 30 --handicap 2
    POLYC_CPU=znver3 python scripts/tune_study.py --measure 200 --data study/    # the AVX2 target's space

Prints, per kernel: candidates, distinct IRs, the best gain in the pool, how many candidates are within 5% of
the best, each strategy's mean gain and its ratio to random sampling (the mean over the seeds of log(gain /
random gain), as a factor, with its standard error: a seed replays every strategy on the same shuffled pool,
so they are paired); then the geometric means over the kernels and the ratio's mean over the kernels with its
standard error (the spread of the replays on these pools; how the pools were drawn adds its own).
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import json
import math
import os
import random
import statistics
import sys

from tune_kernels import kernel_set  # scripts/tune_kernels.py, beside this script

from polyc.codegen import new_module
from polyc.kernel import Kernel
from polyc.options import Options
from polyc.pipeline import emit, lower, resolve_options
from polyc.runtime.workers import run_jobs
from polyc.target import host_target
from polyc.tune.measure import MeasureJob, compile_or_error, outputs, time_candidate
from polyc.tune import ROUND
from polyc.tune.search import ModelSearch, RandomSearch, history_rows, space, spec_of


def ir_fingerprint(source: str, name: str, sizes: dict, spec: str, target) -> str:
    """A hash of the LLVM IR (before LLVM's optimization) that ``spec`` compiles the def to."""
    options = resolve_options(Options.from_spec(spec).replace(threads=1), target)
    kernel = Kernel(source, name, options, records=False)
    module = new_module(target)
    emit(module, lower(kernel.checked, sizes, options, target), name, target, options)
    return hashlib.sha1(str(module).encode()).hexdigest()[:16]


def measure(label: str, source: str, name: str, sizes: dict, count: int, path: str, threads: int = 1) -> None:
    """``count`` random candidates and the default of one kernel, measured, as JSON lines at ``path``."""
    target = host_target()
    search = RandomSearch(space(Kernel(source, name, Options(threads=threads), records=False), target), seed=123)
    proposals = search.propose(count + 1, [])
    base = MeasureJob(source, name, tuple(sorted(sizes.items())), threads, "")
    reference = outputs(base)
    with open(path, "w") as f:
        for start in range(0, len(proposals), 8):
            jobs = [MeasureJob(source, name, base.sizes, threads, spec_of(p)) for p in proposals[start:start + 8]]
            errors = list(run_jobs(compile_or_error, jobs, target.cores))  # every compile done before any timing
            for job, error in zip(jobs, errors):
                outcome = time_candidate(job, reference) if not error else dict(median=None)
                ir = ir_fingerprint(source, name, sizes, job.spec, target) if not error else ""
                f.write(json.dumps(dict(kernel=label, genes=search.seen[job.spec], spec=job.spec,
                                        median=outcome["median"], ir=ir)) + "\n")
        print(f"measured {label}: {len(proposals)} candidates -> {path}", file=sys.stderr)


def load(path: str) -> list[dict]:
    """The rows of one kernel, each candidate's time replaced by the median over its IR's candidates (its single
    measurement kept as ``measured``)."""
    rows = [json.loads(line) for line in open(path)]
    by_ir: dict = {}
    for r in rows:
        r["measured"] = r["median"]
        if r["median"]:
            by_ir.setdefault(r["ir"], []).append(r["median"])
    for r in rows:
        if r["median"]:
            r["median"] = statistics.median(by_ir[r["ir"]])
    return rows


def history_of(rows: list[dict], checked, lanes: int) -> list:
    """One kernel's pool as the model's history rows, from the single measurements (as records hold them)."""
    return history_rows([(Options.from_spec(r["spec"]), r["measured"]) for r in rows], lanes, checked)


def replay(rows: list[dict], choices: dict, strategy: str, trials: int, seed: int, noise: float,
           history: list = (), checked=None) -> float:
    """One search of ``trials`` picks from the measured pool (see the module docstring); its gain. ``choices``:
    the kernel's space (:func:`polyc.tune.search.space`); ``history``: the other kernels' rows, for
    ``transfer``; ``checked``: the kernel's def (the model's kernel features)."""
    rng = random.Random(seed)
    model = None if strategy == "random" else ModelSearch(
        choices, seed=seed, history=history if strategy == "transfer" else (), kernel=checked)
    default, pool = rows[0], list(rows[1:])
    rng.shuffle(pool)
    seen = {id(default): default["median"] * math.exp(rng.gauss(0, noise))}
    picked = [default]
    first = 1 if model is not None and model.history else ModelSearch.SAMPLE
    while len(picked) < trials and pool:
        wanted = min(ROUND - (len(picked) == 1), trials - len(picked), len(pool))  # round 1: the default + 3
        batch = []
        if model is not None and len(picked) >= first:  # as ModelSearch.propose: the best ranked and one random
            ranked = model.rank([r["genes"] for r in pool], [(r["genes"], seen.get(id(r))) for r in picked])
            best = {id(g) for g in ranked[:wanted - 1]}
            batch = [r for r in pool if id(r["genes"]) in best]
            pool = [r for r in pool if id(r["genes"]) not in best]
        while len(batch) < wanted:
            batch.append(pool.pop())
        for candidate in batch:
            seen[id(candidate)] = candidate["median"] * math.exp(rng.gauss(0, noise)) if candidate["median"] else None
            picked.append(candidate)
    chosen = min((r for r in picked if r["median"]), key=lambda r: seen[id(r)])
    return default["median"] / chosen["median"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="directory of the measured pools")
    parser.add_argument("--measure", type=int, default=0, help="measure this many random candidates per kernel")
    parser.add_argument("--only", default="mlp 64x768x3072,depthwise 3x3 256ch 56,gemver,two_mm",
                        help="kernels of tune_kernels.py's set, comma-separated")
    parser.add_argument("--trials", type=int, default=28)
    parser.add_argument("--seeds", type=int, default=30)
    parser.add_argument("--noise", type=float, default=0.03)
    parser.add_argument("--handicap", type=int, default=0,
                        help="picks the model-based searches give up for the time their model takes (live: "
                             "fitting and scoring a round take about a third of a candidate's compile)")
    parser.add_argument("--strategies", default="model,transfer",
                        help="compared with random sampling: model (this kernel's measurements only), transfer "
                             "(and the other kernels' pools of this target as history)")
    args = parser.parse_args(argv)
    os.makedirs(args.data, exist_ok=True)
    cpu = host_target().cpu
    chosen = [w.strip() for w in args.only.split(",") if w.strip()]
    if args.measure:
        for _, label, source, name, sizes in kernel_set():
            if label in chosen:
                measure(label, source, name, sizes, args.measure,
                        os.path.join(args.data, f"{cpu}_{label.replace(' ', '_').replace('/', '_')}.jsonl"))
    paths = sorted(glob.glob(os.path.join(args.data, f"{cpu}_*.jsonl")))
    if not paths:
        print(f"no measured pools for {cpu} in {args.data}: run with --measure N first", file=sys.stderr)
        return 2
    strategies = [w.strip() for w in args.strategies.split(",") if w.strip() and w.strip() != "random"]
    print(f"# {cpu}: searches of {args.trials} candidates replayed on measured pools ({args.trials - args.handicap} "
          f"for the model-based), {args.seeds} seeds, noise {args.noise:.0%}\n")
    print("| kernel | candidates | distinct IR | best gain | within 5% of best | random | "
          + " | ".join(f"{s} | {s} / random" for s in strategies) + " |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |" + " ---: | ---: |" * len(strategies))
    defs = {label: (source, name) for _, label, source, name, _ in kernel_set()}
    pools = {}
    for path in paths:
        rows = load(path)
        source, name = defs[rows[0]["kernel"]]
        kernel = Kernel(source, name, Options(threads=1), records=False)
        choices = space(kernel, host_target())
        pools[rows[0]["kernel"]] = (rows, choices, kernel.checked)
    lanes = max(1, host_target().vector_bits // 32)
    histories = {label: history_of(rows, checked, lanes) for label, (rows, _, checked) in pools.items()}
    means: dict = {s: [] for s in ["random", *strategies]}
    paired: dict = {s: [] for s in strategies}  # per kernel: (mean, standard error) of log(gain / random gain)
    for label, (rows, choices, checked) in pools.items():
        history = [h for other, rows_of in histories.items() if other != label for h in rows_of]  # the others'
        runs = {s: [replay(rows, choices, s, args.trials - (args.handicap if s != "random" else 0), seed,
                           args.noise, history, checked) for seed in range(args.seeds)] for s in means}
        for s, v in runs.items():
            means[s].append(statistics.mean(v))
        cells = []
        for s in strategies:  # a seed replays every strategy on the same shuffled pool and first draws: paired
            logs = [math.log(m / r) for m, r in zip(runs[s], runs["random"])]
            paired[s].append((statistics.mean(logs), statistics.stdev(logs) / math.sqrt(len(logs))
                              if len(logs) > 1 else 0.0))
            cells.append(f"{means[s][-1]:.3f} | {math.exp(paired[s][-1][0]):.3f} +- {paired[s][-1][1]:.3f}")
        times = [r["median"] for r in rows if r["median"]]
        print(f"| {label} | {len(rows)} | {len({r['ir'] for r in rows})} | {rows[0]['median'] / min(times):.3f} | "
              f"{sum(t <= 1.05 * min(times) for t in times)} | {means['random'][-1]:.3f} | "
              + " | ".join(cells) + " |", flush=True)
    geo = {s: math.exp(statistics.mean(math.log(g) for g in v)) for s, v in means.items()}
    print("\ngeometric mean gain: " + ", ".join(f"{s} {g:.3f}" for s, g in geo.items()))
    for s, pairs in paired.items():
        mean = statistics.mean(m for m, _ in pairs)
        error = math.sqrt(sum(e * e for _, e in pairs)) / len(pairs)
        print(f"{s} / random over the kernels {math.exp(mean):.4f}, standard error {error:.4f} "
              f"({mean / error if error else 0:.1f} standard errors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
