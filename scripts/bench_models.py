"""Whole-model benchmark: polyc against onnxruntime and OpenVINO on the model set of ``model_zoo.py``.

For each model (built at benchmark time with seeded random weights, ``scripts/model_zoo.py``) and each
thread count: compile time cold (an empty disk cache) and warm (a second compile from that cache), the
latency of polyc, onnxruntime and OpenVINO at the same thread count (each engine in a process of its own, so no
engine's spinning thread pool slows another; ``--runs`` rounds give the three a turn each of a few calls back
to back, so noise hits them alike; the median of the calls), the ratio peer ms / polyc ms (above 1: polyc is faster),
the geometric mean of the ratios, and where polyc's time goes: the slowest kernels with their GFLOP/s, GB/s
and % of their roofline (``polyc.poly.cost``: the kernel's FLOPs over the measured FMA peak of the target,
its compulsory bytes over the measured memory bandwidth, whichever bound is larger).

    python scripts/bench_models.py                                   # every model, 1 and 2 threads, host CPU
    python scripts/bench_models.py --cpu znver3 --models resnet50    # polyc generates AVX2 code
    python scripts/bench_models.py --threads 1 --runs 5 --models vit,bert_encoder --json out.json

``--cpu`` sets ``POLYC_CPU`` (polyc's target; see ``polyc.target``). The peers pick their own
kernels from the CPU: onnxruntime has no switch, so on an AVX-512 machine an AVX2 row compares polyc's AVX2
code with onnxruntime's AVX-512 code (a harder bar than on an AVX2 machine; the report says so). OpenVINO's
CPU plugin honours ``ONEDNN_MAX_CPU_ISA``, which this script sets to ``AVX2`` for an AVX2 ``--cpu`` -- in its
oneDNN kernels only: its FullyConnected nodes that run MLAS (``gemm_mlas_f32``) and some of its own JIT kernels
(MVN, ReduceMean, ShuffleChannels: ``jit_avx512_f32``) still choose AVX-512 from the CPU. So the report gives,
per model, the share of OpenVINO's node time in such kernels (its per-node profile, ``PERF_COUNT``, taken after
the timing in a compile of its own): an AVX2 OpenVINO ratio is like-for-like only where that share is small.

Needs the ``bench`` extra (onnxruntime, openvino). Timings on a shared machine are noisy: compare ratios of
one run, and re-run when the load average (printed) is above a few tenths. The ``FMA free`` column says how
much of the machine the row had: the FMA loop's rate at the row's thread count just before and just after its
timing rounds (the lower), over the rate measured at the start. A row well below 100% ran while other work
held a core (on a small VM, another guest): its latencies, and at 2 threads its ratios, are not the code's.
The ``memory free`` column does the same for the memory system (a 64 MiB copy's rate before and after the
row's timing, the lower, over the rate at the start): a guest streaming memory leaves the FMA loop at full
speed but slows every engine's cold weights, by different amounts (seen on an Intel host: ResNet-50 at
62 ms in one minute and 84 ms in another with the FMA loop at 100%).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def _set_target(cpu: str | None) -> None:
    """Point polyc (and OpenVINO's oneDNN) at ``cpu`` before anything reads the target."""
    if cpu:
        os.environ["POLYC_CPU"] = cpu
        from polyc.target import AVX2_CPUS
        if cpu in AVX2_CPUS:
            os.environ["ONEDNN_MAX_CPU_ISA"] = "AVX2"


def timed_in_turn(engines: dict, runs: int, block: int = 3, settle: float = 0.05) -> dict:
    """``{name: median seconds}`` of ``runs`` rounds: each round gives every engine a turn of one warm-up call
    and ``block`` timed calls back to back, then ``settle`` seconds of quiet, so a burst of load hits all of
    them alike and no engine's spinning worker threads eat into the next one's turn."""
    times = {name: [] for name in engines}
    for _ in range(runs):
        for name, engine in engines.items():
            times[name] += engine.time(block)
            time.sleep(settle)
    return {name: statistics.median(ts) for name, ts in times.items()}


def _runner(kind: str, path: str, threads: int):
    """A callable ``feeds -> list of arrays`` running the model at ``path`` on engine ``kind``."""
    if kind == "polyc":
        import polyc
        import polyc.onnx as ponnx

        model = ponnx.compile(path, polyc.Options(threads=threads), progress=False)
        return model.run
    if kind == "onnxruntime":
        import onnxruntime

        so = onnxruntime.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        with open(path, "rb") as f:
            session = onnxruntime.InferenceSession(f.read(), so, providers=["CPUExecutionProvider"])
        return lambda feeds: session.run(None, feeds)
    # OpenVINO's CPU plugin at ``threads`` threads, fp32 (no bf16 down-conversion), latency mode.
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                       "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1})
    request = compiled.create_infer_request()
    return lambda feeds: [np.asarray(v) for v in request.infer(feeds).values()]


def wide_share(path: str, threads: int, feeds: dict, calls: int = 5) -> float:
    """The share of OpenVINO's node time (its per-node profile over ``calls`` calls) spent in kernels built for
    more than AVX2 (``avx512`` or ``amx`` in the node's exec type, or MLAS's ``gemm_mlas``, which picks its ISA
    from the CPU whatever ``ONEDNN_MAX_CPU_ISA`` says)."""
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY",
                                                       "INFERENCE_PRECISION_HINT": "f32", "NUM_STREAMS": 1,
                                                       "PERF_COUNT": True})
    request = compiled.create_infer_request()
    total = wide = 0.0
    for _ in range(calls):
        request.infer(feeds)
        for node in request.get_profiling_info():
            seconds = node.real_time.total_seconds()
            total += seconds
            if any(word in node.exec_type for word in ("avx512", "amx", "mlas")):
                wide += seconds
    return wide / total if total else 0.0


def _serve(conn, kind: str, path: str, threads: int, feeds: dict) -> None:
    """An engine's process: build the runner, then answer ``("time", n)`` with n call times in seconds,
    ``("output",)`` with the first output and ``("wide",)`` with :func:`wide_share` (OpenVINO), until
    ``None``."""
    try:
        run = _runner(kind, path, threads)
        conn.send("ready")
    except Exception as e:  # reported to the parent, which leaves the engine out
        conn.send(f"{type(e).__name__}: {e}")
        return
    while (msg := conn.recv()) is not None:
        if msg[0] == "output":
            conn.send(np.asarray(run(feeds)[0]))
            continue
        if msg[0] == "wide":
            conn.send(wide_share(path, threads, feeds))
            continue
        run(feeds)
        ts = []
        for _ in range(msg[1]):
            t = time.perf_counter()
            run(feeds)
            ts.append(time.perf_counter() - t)
        conn.send(ts)


class Engine:
    """One inference engine in a process of its own: the engines of a comparison never share a process, so
    no engine's thread pool (onnxruntime's and polyc's workers spin for a while after a call) competes with
    another's for the cores, as it would for a user who deploys one of them."""

    def __init__(self, kind: str, path: str, threads: int, feeds: dict):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, kind, path, threads, feeds), daemon=True)
        self.process.start()
        status = self.conn.recv()
        self.error = None if status == "ready" else status

    def time(self, n: int) -> list[float]:
        self.conn.send(("time", n))
        return self.conn.recv()

    def output(self) -> np.ndarray:
        self.conn.send(("output",))
        return self.conn.recv()

    def wide_share(self) -> float:
        """OpenVINO's share of node time in kernels beyond AVX2 (:func:`wide_share`)."""
        self.conn.send(("wide",))
        return self.conn.recv()

    def close(self) -> None:
        if self.process.is_alive():
            self.conn.send(None)
        self.process.join(10)


def relative_error(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


class Machine:
    """The measured roofs of the target: FMA peak (fp32, GFLOP/s) per thread count and memory bandwidth
    (bytes/s, a numpy copy of 64 MiB: read + write)."""

    def __init__(self, thread_counts):
        from fma_peak import FmaPeak

        self.fma = fma = FmaPeak()
        self.isa = fma.isa
        self.peak = {t: g * 1e9 for t, g in fma.measure("float32", thread_counts, 5, 0.1).items()}
        self._copy = (np.ones(16 << 20, np.float32), np.empty(16 << 20, np.float32))
        self.bandwidth = self._copy_rate(7)

    def _copy_rate(self, repeat: int) -> float:
        """Bytes/s of the best of ``repeat`` numpy copies of 64 MiB (read + write)."""
        a, b = self._copy
        return 2 * a.nbytes / min(_seconds(lambda: np.copyto(b, a)) for _ in range(repeat))

    def memory_available(self) -> float:
        """The copy's rate now over the rate measured at the start: below 1.0 while other work (on a VM,
        another guest) holds the memory system -- which the FMA loop of :meth:`available` does not see,
        and which slows a model's cold weights and activations."""
        return self._copy_rate(3) / self.bandwidth

    def available(self, threads: int) -> float:
        """The FMA loop's rate at ``threads`` threads now over the peak measured at the start (about 1.0 on
        an idle machine; below it while other work holds a core)."""
        return self.fma.measure("float32", [threads], 1, 0.1)[threads] * 1e9 / self.peak[threads]

    def describe(self) -> str:
        peaks = ", ".join(f"{p / 1e9:.0f} GFLOP/s at {t} thread{'s' if t > 1 else ''}"
                          for t, p in sorted(self.peak.items()))
        return f"{self.isa}; fp32 FMA peak {peaks}; memory bandwidth {self.bandwidth / 1e9:.1f} GB/s (copy)"


def _seconds(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def where_time_goes(model, feeds, machine: Machine, threads: int, slowest: int) -> list[dict]:
    """The ``slowest`` kernels of one inference (the Python-driven executor's per-kernel times) with their
    roofline figures."""
    from polyc.poly.cost import cost
    from polyc.poly.build import build_scop

    steps = {s.group: s for s in model.steps}
    rows = []
    for seconds, group, name in model.profile(feeds, repeat=3)[:slowest]:
        step = steps[group]
        c = cost(build_scop(step.kernel.checked, dict(step.sizes)))
        bound = c.roofline_seconds(machine.peak[threads], machine.bandwidth)
        rows.append(dict(group=group, kernel=name, ms=seconds * 1e3, gflops=c.flops / seconds / 1e9,
                         gbs=c.bytes / seconds / 1e9, roofline=bound / seconds,
                         bound="memory" if c.memory_bound(machine.peak[threads], machine.bandwidth) else "FMA"))
    return rows


def bench_model(name: str, thread_counts, runs: int, slowest: int, machine: Machine, tiny: bool = False) -> list[dict]:
    import onnx

    import model_zoo
    import polyc
    import polyc.onnx as ponnx

    proto = model_zoo.build(name, tiny=tiny)
    feeds = model_zoo.feeds(proto)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, f"{name}.onnx")
        onnx.save(proto, path)
        data = proto.SerializeToString()
        cache = os.path.join(tmp, "cache")
        previous = os.environ.get("POLYC_CACHE_DIR")
        os.environ["POLYC_CACHE_DIR"] = cache
        try:
            for threads in thread_counts:
                options = polyc.Options(threads=threads)
                cold = _seconds(lambda: ponnx.compile(path, options, progress=False))
                model = None

                def load():
                    nonlocal model
                    model = ponnx.compile(path, options, progress=False)

                warm = _seconds(load)
                engines = {kind: Engine(kind, path, threads, feeds) for kind in ("polyc", "onnxruntime", "openvino")}
                try:
                    for kind in [k for k, e in engines.items() if e.error]:
                        print(f"  {kind} left out: {engines.pop(kind).error}", file=sys.stderr)
                    error = relative_error(engines["polyc"].output(), engines["onnxruntime"].output())
                    free, memory = machine.available(threads), machine.memory_available()
                    medians = timed_in_turn(engines, runs)
                    free, memory = min(free, machine.available(threads)), min(memory, machine.memory_available())
                    wide = engines["openvino"].wide_share() if "openvino" in engines else None
                finally:
                    for e in engines.values():
                        e.close()
                rows.append(dict(model=name, threads=threads, cold=cold, warm=warm, kernels=len(model.compile_seconds),
                                 arena=model.arena_bytes, error=error, free=free, memory=memory,
                                 ms={k: v * 1e3 for k, v in medians.items()}, openvino_wide=wide,
                                 slowest=where_time_goes(model, feeds, machine, threads, slowest)))
        finally:
            if previous is None:
                os.environ.pop("POLYC_CACHE_DIR", None)
            else:
                os.environ["POLYC_CACHE_DIR"] = previous
    return rows


def geomean(values) -> float:
    values = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def report(rows: list[dict], machine: Machine, cpu: str, runs: int) -> str:
    peers = [p for p in ("onnxruntime", "openvino") if any(p in r["ms"] for r in rows)]
    out = [f"target: {cpu or 'host'} ({machine.describe()}); latency: median of {runs} rounds x 3 calls, "
           f"each engine in its own process, in turn; load average {os.getloadavg()[0]:.2f}", ""]
    head = "| model | threads | cold s | warm s | kernels | arena MiB | polyc ms | " + \
        " | ".join(f"{p} ms | ratio {p}/polyc" for p in peers) + " | max rel. error |" + \
        (" OpenVINO time beyond AVX2 |" if "openvino" in peers else "") + " FMA free | memory free |"
    out += [head, "| --- | ---: " + "| ---: " * (5 + 2 * len(peers)) + "| ---: |"
            + (" ---: |" if "openvino" in peers else "") + " ---: | ---: |"]
    for r in rows:
        cells = [r["model"], str(r["threads"]), f"{r['cold']:.1f}", f"{r['warm']:.2f}", str(r["kernels"]),
                 f"{r['arena'] / 2**20:.1f}", f"{r['ms']['polyc']:.2f}"]
        for p in peers:
            ms = r["ms"].get(p)
            cells += [f"{ms:.2f}", f"{ms / r['ms']['polyc']:.2f}"] if ms else ["—", "—"]
        cells.append(f"{r['error']:.1e}")
        if "openvino" in peers:
            wide = r.get("openvino_wide")
            cells.append("—" if wide is None else f"{100 * wide:.0f}%")
        cells += [f"{100 * r['free']:.0f}%", f"{100 * r['memory']:.0f}%"]
        out.append("| " + " | ".join(cells) + " |")
    out.append("")
    for t in sorted({r["threads"] for r in rows}):
        sel = [r for r in rows if r["threads"] == t]
        parts = []
        for p in peers:
            ratios = [r["ms"][p] / r["ms"]["polyc"] for r in sel if p in r["ms"]]
            worst = min(sel, key=lambda r: r["ms"].get(p, 1e9) / r["ms"]["polyc"])
            parts.append(f"geometric mean of {p}/polyc {geomean(ratios):.2f} (lowest {min(ratios):.2f}, "
                         f"{worst['model']})")
        out.append(f"{t} thread{'s' if t > 1 else ''}: " + "; ".join(parts))
    for r in rows:
        out += ["", f"{r['model']}, {r['threads']} thread(s): slowest kernels", "",
                "| ms | GFLOP/s | GB/s | % of roofline (bound) | group | kernel |",
                "| ---: | ---: | ---: | ---: | --- | --- |"]
        for k in r["slowest"]:
            out.append(f"| {k['ms']:.3f} | {k['gflops']:.1f} | {k['gbs']:.1f} | {100 * k['roofline']:.0f}% "
                       f"({k['bound']}) | {k['group']} | {k['kernel']} |")
    return "\n".join(out)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="all", help="comma-separated model_zoo names, or 'all'")
    parser.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    parser.add_argument("--cpu", default=None, help="POLYC_CPU for polyc's code: znver3 (AVX2), znver5 (AVX-512)")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--slowest", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--tiny", action="store_true", help="the models' tiny variants (a smoke test)")
    args = parser.parse_args(argv)
    _set_target(args.cpu)
    import model_zoo

    names = model_zoo.NAMES if args.models == "all" else tuple(args.models.split(","))
    thread_counts = [int(t) for t in args.threads.split(",")]
    machine = Machine(thread_counts)
    rows = []
    for name in names:
        print(f"benchmarking {name} ...", file=sys.stderr, flush=True)
        rows += bench_model(name, thread_counts, args.runs, args.slowest, machine, args.tiny)
    print(report(rows, machine, args.cpu, args.runs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(cpu=args.cpu, machine=machine.describe(), rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
