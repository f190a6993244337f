"""Whole-model benchmark: polyc against onnxruntime on the onnx package's model-zoo "light" models.

For each model: compile time cold (an empty disk cache) and warm (a second compile from the cache), the
latency of polyc and of onnxruntime with the same thread count (medians of ``--runs``, measured back to back
in one process), and where polyc's time goes (the slowest kernels, timed through the Python-driven
executor). Prints markdown tables.

    python scripts/bench_models.py                       # resnet50
    python scripts/bench_models.py --models all --threads 1 --runs 10

Needs onnxruntime (the ``bench`` extra). Timings on a shared machine are noisy: compare ratios of one run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import onnx

import polyc
import polyc.onnx as ponnx


def median_seconds(run, runs: int) -> float:
    run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_model(name: str, threads: int, runs: int, slowest: int) -> tuple[dict, list]:
    import onnxruntime

    path = ponnx.light_model_path(name)
    options = polyc.Options(threads=threads)
    with tempfile.TemporaryDirectory() as cache:
        os.environ["POLYC_CACHE_DIR"] = cache
        t = time.perf_counter()
        model = ponnx.compile(path, options, progress=False)
        cold = time.perf_counter() - t
        t = time.perf_counter()
        model = ponnx.compile(path, options, progress=False)
        warm = time.perf_counter() - t
    x = np.random.default_rng(0).standard_normal(model.input_shapes[0]).astype(model.input_dtypes[0])
    feeds = {model.input_names[0]: x}
    session_options = onnxruntime.SessionOptions()
    session_options.intra_op_num_threads = threads
    proto = onnx.load(path)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), session_options)
    got = model.run(feeds)[0]
    expected = session.run(None, feeds)[0]
    error = float(np.abs(got - expected).max() / max(np.abs(expected).max(), 1e-30))
    polyc_s = median_seconds(lambda: model.run(feeds), runs)
    ort_s = median_seconds(lambda: session.run(None, feeds), runs)
    row = dict(model=name, cold=cold, warm=warm, polyc=polyc_s, ort=ort_s, error=error,
               arena=model.arena_bytes, kernels=len(model.compile_seconds))
    return row, model.profile(feeds, repeat=2)[:slowest]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50", help="comma-separated light model names, or 'all'")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--slowest", type=int, default=8)
    args = parser.parse_args(argv)
    names = ponnx.LIGHT_MODELS if args.models == "all" else tuple(args.models.split(","))
    rows, profiles = [], {}
    for name in names:
        print(f"benchmarking {name} ...", file=sys.stderr)
        row, profile = bench_model(name, args.threads, args.runs, args.slowest)
        rows.append(row)
        profiles[name] = profile
    print(f"threads: {args.threads}; latency: median of {args.runs} runs after a warm-up\n")
    print("| model | cold compile s | warm load s | distinct kernels | arena MiB | polyc ms | onnxruntime ms | "
          "ratio (ort/polyc) | max rel. error |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['cold']:.1f} | {r['warm']:.2f} | {r['kernels']} | {r['arena'] / 2**20:.2f} | "
              f"{r['polyc'] * 1e3:.1f} | {r['ort'] * 1e3:.1f} | {r['ort'] / r['polyc']:.2f} | {r['error']:.1e} |")
    for name, profile in profiles.items():
        print(f"\n{name}: slowest kernels (Python-driven executor)\n\n| ms | group | kernel |\n| ---: | --- | --- |")
        for seconds, group, kernel in profile:
            print(f"| {seconds * 1e3:.2f} | {group} | {kernel} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
