#!/usr/bin/env python
"""Benchmark polyc's compiled kernels against their peers (issue 4) and print markdown tables.

What it measures, each polyc kernel and its peer side by side in one run, on the same inputs:

- ``gemm``: fp32 GEMM at 256, 512, 1024, 2048 vs numpy (OpenBLAS), at 1 thread and at ``--threads``;
- ``bmm``: batch matmul 16x256x256x256 vs ``numpy.matmul``;
- ``mlp``: a 64x768x3072 fully connected layer with bias and GELU (tanh form) fused in one def, vs numpy
  (GEMM flops only are counted);
- ``conv``: conv2d at ResNet-50 layer shapes, batch 1 (3x3 pad 1 64ch at 56x56; 1x1 256->64 at 56x56;
  3x3 pad 1 128ch at 28x28; 7x7 stride 2 pad 3 3->64 at 224x224; depthwise 3x3 pad 1 256ch at 56x56) vs
  onnxruntime running the same single Conv node (``intra_op_num_threads`` = threads);
- ``polybench``: 2mm, 3mm, atax, bicg, mvt, gemver, doitgen (fp64) at PolyBench's LARGE sizes vs numpy, and
  vs the same def compiled in source order with every transform off (``Options(scheduler="identity")`` +
  ``Options.naive()``, single-threaded by construction) to show what scheduling buys; when that version
  would take over ~20 s a run at LARGE (extrapolated from MEDIUM) its row uses MEDIUM and says so;
- ``overhead``: the fixed cost of calling a compiled kernel from Python on a 1-element add, in microseconds.

``--options SPEC`` (an :class:`polyc.Options` spec such as ``prefetch=0``) goes on top of every polyc row's own
options: a run with it beside one without is the A/B of that decision on the same kernels.

Columns: kernel, size, threads, peer, polyc ms, peer ms, ratio (= peer time / polyc time: above 1 polyc is
faster), polyc GFLOP/s, % of peak, compile ms, check (polyc's outputs against the peer's).

GFLOP/s divides the FLOPs of one call by polyc's time. The FLOPs are counted on the compiled kernel's Scop
(``polyc.poly.analysis.flops``: per statement, its instances counted by isl times the floating-point
operations of its right-hand side, plus one per reduction update), except for ``mlp`` (the GEMM's
``2*M*K*N`` only) and ``resnet50`` (compiled through ``polyc.onnx``: ``2*M*C*KH*KW*OH*OW`` per Conv).

The *peak* is the machine's FMA throughput, measured at the start of the run (``scripts/fma_peak.py``, which
also runs on its own): a loop of independent vector FMA chains (16 accumulators of ``<16 x float>`` with
AVX-512, 12 of ``<8 x float>`` with AVX2; ``llvm.fma.*``), built with llvmlite for the host CPU and its
features and JIT-compiled with MCJIT, called through ctypes; GFLOP/s = 2 x lanes x chains x iterations / seconds, best of several runs. It is measured
for fp32 and fp64 (half the lanes), at 1 thread and at ``--threads`` threads (that many Python threads each
calling the loop at once, ctypes releasing the GIL; the figure is all their flops over the wall time from
the first start to the last finish). A row's % is of the peak of its dtype at its thread count: an upper
bound, since loads, stores and non-FMA operations take issue slots the loop does not use.
numpy's SGEMM and DGEMM at 2048^3 (512^3 with ``--quick``), at 1 thread and at ``--threads``, are printed
as a reference line; they are not used for the %. If the FMA loop cannot be built or run, the script says
so and falls back to those GEMM figures.

Times are medians of ``--runs`` calls after a warm-up (fewer for calls that take seconds); compile times are
real (``POLYC_CACHE_DIR=off`` unless set). Other work on the machine makes timings noisy: compare rows of
one run, not across runs.

OpenBLAS threads are set with threadpoolctl when installed, else through OpenBLAS's own
``openblas_set_num_threads`` found with ctypes; if neither works the script says so and numpy runs with
whatever ``OPENBLAS_NUM_THREADS`` says (run it once with ``OPENBLAS_NUM_THREADS=1`` and once with 2).

Run it as::

    python scripts/bench_kernels.py                      # everything (several minutes)
    python scripts/bench_kernels.py --quick              # small sizes, a smoke run
    python scripts/bench_kernels.py --only gemm,conv --threads 2 --runs 7

Exit status 1 when some polyc result did not match its peer.
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import math
import os
import platform
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("POLYC_CACHE_DIR", "off")


def _same_isa_openblas() -> None:
    """Re-run this script with ``OPENBLAS_CORETYPE`` naming the OpenBLAS kernel of polyc's instruction-set
    level (``SkylakeX`` for AVX-512, ``Haswell`` for AVX2), so numpy's GEMM is the same instruction set as the
    code it is compared with; ``--blas-coretype env`` keeps the environment's. OpenBLAS reads the variable
    when it loads, hence the re-run. (The machines of this project set ``OPENBLAS_CORETYPE=Haswell`` in their
    environment: on the Zen 5 host OpenBLAS's SGEMM runs at 126-132 GFLOP/s on 1 thread with it, 239-246 with
    SkylakeX, so AVX-512 rows measured that way set polyc's AVX-512 code against AVX2 code.)"""
    args = " ".join(sys.argv[1:])
    if os.environ.get("_POLYC_BENCH_BLAS") or "--blas-coretype env" in args or "--blas-coretype=env" in args:
        return
    from polyc.target import host_target
    os.environ["_POLYC_BENCH_BLAS"] = os.environ.get("OPENBLAS_CORETYPE", "unset")
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX" if host_target().vector_bits >= 512 else "Haswell"
    os.execv(sys.executable, [sys.executable] + sys.argv)


if __name__ == "__main__":
    _same_isa_openblas()

import numpy as np  # noqa: E402

import polyc  # noqa: E402
import polyc.kernels  # noqa: E402
from polyc import Options  # noqa: E402
from polyc.errors import PolycError  # noqa: E402
from polyc.poly import analysis  # noqa: E402
from fma_peak import FmaPeak  # noqa: E402  (scripts/fma_peak.py, beside this script)

SECTIONS = ("gemm", "bmm", "mlp", "conv", "resnet50", "polybench", "overhead")

#: Every distinct convolution of ResNet-50 (torchvision v1.5, batch 1, 224x224): (C, H, M, K, stride, pad).
RESNET50_CONVS = ((3, 224, 64, 7, 2, 3), (64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 1), (64, 56, 256, 1, 1, 0),
                  (256, 56, 64, 1, 1, 0), (256, 56, 128, 1, 1, 0), (128, 56, 128, 3, 2, 1), (128, 28, 512, 1, 1, 0),
                  (256, 56, 512, 1, 2, 0), (512, 28, 128, 1, 1, 0), (128, 28, 128, 3, 1, 1), (512, 28, 256, 1, 1, 0),
                  (256, 28, 256, 3, 2, 1), (256, 14, 1024, 1, 1, 0), (512, 28, 1024, 1, 2, 0),
                  (1024, 14, 256, 1, 1, 0), (256, 14, 256, 3, 1, 1), (1024, 14, 512, 1, 1, 0),
                  (512, 14, 512, 3, 2, 1), (512, 7, 2048, 1, 1, 0), (1024, 14, 2048, 1, 2, 0),
                  (2048, 7, 512, 1, 1, 0), (512, 7, 512, 3, 1, 1))

# ---- kernels written for the benchmark ---------------------------------------------------------------------

BENCH_SOURCE = """
# A fully connected layer with bias and GELU (tanh form), fused: Y = gelu(X . W + b).
def mlp_gelu(float(M,K) X, float(K,N) W, float(N) b) -> (Y) {
    P(m,n) +=! X(m,k) * W(k,n)
    Y(m,n) = 0.5 * x * (1.0 + tanh(0.79788456080286536 * (x + 0.044715 * x * x * x))) where x = P(m,n) + b(n)
}

# conv2d, stride 2, zero padding 3 (ResNet-50's first layer: 7x7 at 224x224 -> 112x112). The padding is a
# temporary P, as the ONNX lowering writes it: the convolution then reads P with unguarded stride-2 loads
# (a ?: guard inside the reduction would make every stride-2 read a masked gather).
def conv2d_s2_pad3(float(N,C,H,W) X, float(M,C,KH,KW) F) -> (Y) {
    P(n,c,i,j) = (i >= 3 && i < H+3 && j >= 3 && j < W+3) ? X(n,c,i-3,j-3) : 0.0 where i in 0:H+6, j in 0:W+6
    Y(n,m,h,w) +=! P(n,c,2*h+kh,2*w+kw) * F(m,c,kh,kw)
        where h in 0:(H+6-KH)/2+1, w in 0:(W+6-KW)/2+1, kh in 0:KH, kw in 0:KW
}

# depthwise conv2d, stride 1, zero padding 1: one filter F(c,.,.) per channel.
def conv2d_depthwise_pad1(float(N,C,H,W) X, float(C,KH,KW) F) -> (Y) {
    Y(n,c,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ? X(n,c,h+kh-1,w+kw-1) * F(c,kh,kw) : 0.0
        where h in 0:H-KH+3, w in 0:W-KW+3, kh in 0:KH, kw in 0:KW
}
"""

# PolyBench 4.2 dataset sizes.
POLYBENCH_SIZES = {
    "two_mm": dict(MINI=dict(NI=16, NJ=18, NK=22, NL=24), SMALL=dict(NI=40, NJ=50, NK=70, NL=80),
                   MEDIUM=dict(NI=180, NJ=190, NK=210, NL=220), LARGE=dict(NI=800, NJ=900, NK=1100, NL=1200)),
    "three_mm": dict(MINI=dict(NI=16, NJ=18, NK=20, NL=22, NM=24), SMALL=dict(NI=40, NJ=50, NK=60, NL=70, NM=80),
                     MEDIUM=dict(NI=180, NJ=190, NK=200, NL=210, NM=220),
                     LARGE=dict(NI=800, NJ=900, NK=1000, NL=1100, NM=1200)),
    "atax": dict(MINI=dict(M=38, N=42), SMALL=dict(M=116, N=124), MEDIUM=dict(M=390, N=410),
                 LARGE=dict(M=1900, N=2100)),
    "bicg": dict(MINI=dict(M=38, N=42), SMALL=dict(M=116, N=124), MEDIUM=dict(M=390, N=410),
                 LARGE=dict(M=1900, N=2100)),
    "mvt": dict(MINI=dict(N=40), SMALL=dict(N=120), MEDIUM=dict(N=400), LARGE=dict(N=2000)),
    "gemver": dict(MINI=dict(N=40), SMALL=dict(N=120), MEDIUM=dict(N=400), LARGE=dict(N=2000)),
    "doitgen": dict(MINI=dict(NQ=8, NR=10, NP=12), SMALL=dict(NQ=20, NR=25, NP=30),
                    MEDIUM=dict(NQ=40, NR=50, NP=60), LARGE=dict(NQ=140, NR=150, NP=160)),
}

POLYBENCH_NAMES = {"two_mm": "2mm", "three_mm": "3mm"}

#: Seconds above which the source-order PolyBench version is measured at MEDIUM instead of LARGE.
IDENTITY_LIMIT_S = 20.0


# ---- OpenBLAS threads --------------------------------------------------------------------------------------

class BlasThreads:
    """Sets numpy's BLAS thread count: threadpoolctl, else OpenBLAS's C entry point through ctypes."""

    def __init__(self):
        self.how = None
        self._set = self._get = None
        try:
            from threadpoolctl import threadpool_info, threadpool_limits
            if any(i.get("internal_api") == "openblas" for i in threadpool_info()):
                self.how = "threadpoolctl"
                self._limits = threadpool_limits
                return
        except ImportError:
            pass
        for path in self._loaded_blas():
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for prefix in ("scipy_openblas", "openblas"):
                for suffix in ("64_", "_64_", ""):
                    setter = getattr(lib, f"{prefix}_set_num_threads{suffix}", None)
                    getter = getattr(lib, f"{prefix}_get_num_threads{suffix}", None)
                    if setter is not None and getter is not None:
                        setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                        self._set, self._get = setter, getter
                        self.how = f"ctypes {os.path.basename(path)}:{setter.__name__}"
                        return

    @staticmethod
    def _loaded_blas():
        np.dot(np.ones((2, 2)), np.ones((2, 2)))
        try:
            with open("/proc/self/maps") as maps:
                return sorted({line.split()[-1] for line in maps if "blas" in line.lower() and "/" in line})
        except OSError:
            return []

    @contextlib.contextmanager
    def limit(self, n: int):
        if self.how == "threadpoolctl":
            with self._limits(limits=n, user_api="blas"):
                yield
        elif self._set is not None:
            before = self._get()
            self._set(n)
            try:
                yield
            finally:
                self._set(before)
        else:
            yield

    def describe(self) -> str:
        if self.how is None:
            return ("NOT controlled (no threadpoolctl, no OpenBLAS entry point found): numpy used "
                    f"OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}")
        kernel = ""
        if self.how == "threadpoolctl":
            from threadpoolctl import threadpool_info
            arch = {i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"}
            kernel = f"; OpenBLAS kernel {', '.join(sorted(a for a in arch if a))}"
        before = os.environ.get("_POLYC_BENCH_BLAS")
        coretype = os.environ.get("OPENBLAS_CORETYPE", "unset") + (f", the environment's {before}" if before else "")
        return f"set with {self.how}{kernel} (OPENBLAS_CORETYPE={coretype})"


# ---- timing ------------------------------------------------------------------------------------------------

def median_time(fn, runs: int, budget_s: float = 4.0, best: bool = False) -> tuple[float, int]:
    """(median seconds, samples) of ``fn``: a warm-up call, then up to ``runs`` timed calls within about
    ``budget_s``; a warm-up call over a second counts as the only sample. ``best``: the fastest sample
    instead of the median."""
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    if first > 1.0:
        n = min(runs, int(budget_s / first))
        if n < 1:
            return first, 1
    else:
        n = max(1, min(runs, int(budget_s / max(first, 1e-9))))
    samples = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return (min(samples) if best else statistics.median(samples)), len(samples)


def paired_times(fn_a, fn_b, runs: int, budget_s: float = 8.0) -> tuple[float, float]:
    """(median seconds of ``fn_a``, of ``fn_b``), the two timed alternately (a, b, a, b, ...) after a warm-up
    call of each, up to ``runs`` pairs within about ``budget_s``: a slow spell of the machine (another guest
    holding a VM's core for a while) falls on both, not on whichever ran during it. For single-threaded
    callables only: a thread pool that spins after a call (onnxruntime's) holds a core while the other runs
    (tried at 2 threads: both engines then ran at 1-thread speed, or in between)."""
    t = time.perf_counter()
    fn_a()
    fn_b()
    n = max(1, min(runs, int(budget_s / max(time.perf_counter() - t, 1e-9))))
    a, b = [], []
    for _ in range(n):
        for fn, samples in ((fn_a, a), (fn_b, b)):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
    return statistics.median(a), statistics.median(b)


@dataclass
class Row:
    kernel: str
    size: str
    threads: int
    peer: str
    polyc_s: float | None
    peer_s: float | None
    flops: float
    dtype: str
    compile_s: float | None = None
    check: str = ""
    note: str = ""


def close(got, want, dtype) -> tuple[bool, str]:
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    worst = 0.0
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if g.shape != w.shape:
            return False, f"shape {g.shape} vs {w.shape}"
        scale = max(1.0, float(np.max(np.abs(w)))) if w.size else 1.0
        rtol = 1e-3 if np.dtype(dtype).itemsize <= 4 else 1e-8
        err = float(np.max(np.abs(g - w) / (np.abs(w) + scale))) if w.size else 0.0
        worst = max(worst, err)
        if not np.allclose(g, w, rtol=rtol, atol=rtol * scale):
            return False, f"MISMATCH (rel err {err:.2g})"
    return True, "ok"


_COMPILE_SECONDS: dict = {}


def scop_of(compiled):
    """The Scop of a compiled kernel (the one place this script reaches into the compiled stages)."""
    return compiled.stages.scop


def kernel_flops(compiled) -> int:
    """The FLOPs of one call of ``compiled``, counted on its Scop (:func:`polyc.poly.analysis.flops`)."""
    return analysis.flops(scop_of(compiled))


def polyc_callable(kernel: polyc.Kernel, inputs, options: Options):
    """Compile (timed) and return (compiled, compile seconds, call, outputs of one call). A specialization
    the kernel already holds reports the time of its first compilation."""
    t = time.perf_counter()
    compiled = kernel.specialize(*inputs, options=options)
    compile_s = _COMPILE_SECONDS.setdefault(id(compiled), time.perf_counter() - t)
    outs = [np.zeros(s.shape, s.dtype) for s in compiled.outputs]

    def call():
        compiled(*inputs, out=outs)

    call()
    result = tuple(o.copy() for o in outs)
    return compiled, compile_s, call, result[0] if len(result) == 1 else result


class Bench:
    def __init__(self, args):
        self.args = args
        self.blas = BlasThreads()
        self.rows: list[Row] = []
        self.fma: FmaPeak | None = None
        self.fma_peaks: dict = {}  # (dtype, threads) -> GFLOP/s of the FMA loop
        self.fma_runs = 0
        self.gemm_peaks: dict = {}  # (dtype, threads) -> GFLOP/s of numpy's GEMM at peak_size^3 (a reference)
        self.rng = np.random.default_rng(0)
        self.library: dict = {}
        self.notes: list[str] = []
        self.overheads: list = []
        self.peak_size = 0
        self.load_before = _loadavg()

    # ---- helpers ----
    def options(self, base: Options | None, threads: int) -> Options:
        """``base`` (None: the defaults) with ``--options`` on top and ``threads``."""
        spec = ",".join(filter(None, [(base or Options()).to_spec(), self.args.options]))
        return Options.from_spec(spec).replace(threads=threads)

    def kernel(self, family: str, name: str) -> polyc.Kernel:
        key = (family, name)
        if key not in self.library:
            source = BENCH_SOURCE if family == "bench" else polyc.kernels.source(family)
            self.library[key] = polyc.define(source, name=name)
        return self.library[key]

    def normal(self, *shape, dtype=np.float32):
        return self.rng.standard_normal(shape).astype(dtype)

    def numpy_time(self, fn, threads: int) -> tuple[float, object]:
        with self.blas.limit(threads):
            result = fn()
            seconds, _ = median_time(fn, self.args.runs)
        return seconds, result

    def compare(self, name, size, threads, peer_name, kernel, inputs, peer_fn, flops, dtype, options=None,
                note=""):
        """One row: polyc (``options`` with ``threads``) and a peer callable (returning the outputs).
        ``flops`` None: those of the compiled kernel (:func:`kernel_flops`)."""
        compiled, compile_s, call, got = polyc_callable(kernel, inputs, self.options(options, threads))
        if flops is None:
            flops = kernel_flops(compiled)
        polyc_s, _ = median_time(call, self.args.runs)
        peer_s, want = peer_fn()
        ok, check = close(got, want, dtype)
        row = Row(name, size, threads, peer_name, polyc_s, peer_s, flops, dtype, compile_s, check, note)
        self.rows.append(row)
        self.progress(row)
        return row

    def progress(self, row: Row):
        print(f"  measured {row.kernel} {row.size} t={row.threads} vs {row.peer}: polyc "
              f"{_ms(row.polyc_s)} ms, peer {_ms(row.peer_s)} ms, {row.check}", file=sys.stderr, flush=True)

    def peak(self, dtype: str, threads: int) -> float:
        """A row's peak: the FMA peak of its dtype at its thread count (the GEMM fallback: the best numpy
        figure of its dtype for at most ``threads`` threads)."""
        if self.fma is not None:
            return self.fma_peaks.get((dtype, threads), float("nan"))
        figures = [v for (d, t), v in self.gemm_peaks.items() if d == dtype and t <= threads]
        return max(figures) if figures else float("nan")

    # ---- sections ----
    def measure_peaks(self):
        """The FMA peak (fp32, fp64 at 1 and ``--threads`` threads), then numpy's GEMM as a reference."""
        thread_counts = sorted({1, self.args.threads})
        runs = max(5, self.args.runs)
        self.fma_runs = runs
        try:
            fma = FmaPeak()
            for dtype in ("float32", "float64"):
                for t, gflops in fma.measure(dtype, thread_counts, runs, 0.05 if self.args.quick else 0.2).items():
                    self.fma_peaks[(dtype, t)] = gflops
                    print(f"  peak: FMA loop {'fp32' if dtype == 'float32' else 'fp64'} at {t} thread(s): "
                          f"{gflops:.1f} GFLOP/s", file=sys.stderr, flush=True)
            self.fma = fma
            for dtype in ("float32", "float64"):
                t = thread_counts[-1]
                one, many = self.fma_peaks[(dtype, 1)], self.fma_peaks[(dtype, t)]
                expected = min(t, os.cpu_count() or 1)
                if many < 0.8 * expected * one:
                    self.notes.append(
                        f"the {'fp32' if dtype == 'float32' else 'fp64'} FMA loop ran only {many / one:.2f}x faster "
                        f"at {t} threads than at 1 (expected about {expected}x on {os.cpu_count()} CPUs): other work "
                        f"was likely sharing the cores, so the {t}-thread peak is low and its rows' % of peak high")
        except Exception as exc:  # no llvmlite target for this host, or the JIT failed: keep the GEMM figures
            print(f"  peak: the FMA loop failed ({type(exc).__name__}: {exc}); using numpy GEMM instead",
                  file=sys.stderr, flush=True)
            self.notes.append(f"the FMA peak could not be measured ({type(exc).__name__}: {exc}): % of peak is "
                              f"of numpy's GEMM figure instead, the best of its dtype at most the row's threads")
            self.fma_peaks.clear()
        n = 512 if self.args.quick else 2048
        self.peak_size = n
        for dtype in ("float32", "float64"):
            a, b = self.normal(n, n, dtype=dtype), self.normal(n, n, dtype=dtype)
            c = np.empty((n, n), dtype)
            for t in thread_counts:
                with self.blas.limit(t):
                    seconds, _ = median_time(lambda: np.matmul(a, b, out=c), max(5, self.args.runs), best=True)
                self.gemm_peaks[(dtype, t)] = 2 * n ** 3 / seconds / 1e9
                print(f"  reference: numpy {'S' if dtype == 'float32' else 'D'}GEMM {n}^3 at {t} thread(s): "
                      f"{self.gemm_peaks[(dtype, t)]:.1f} GFLOP/s", file=sys.stderr, flush=True)

    def gemm(self):
        sizes = (128, 256) if self.args.quick else (256, 512, 1024, 2048)
        kernel = self.kernel("matmul", "matmul")
        for n in sizes:
            a, b = self.normal(n, n), self.normal(n, n)
            c = np.empty((n, n), np.float32)
            rows = [self.compare("gemm fp32", f"{n}x{n}x{n}", t, "numpy (OpenBLAS)", kernel, (a, b),
                                 lambda: self.numpy_time(lambda: np.matmul(a, b, out=c), t), None, "float32")
                    for t in sorted({1, self.args.threads})]
            if len(rows) == 2 and rows[1].peer_s > rows[0].peer_s:
                rows[1].note = f"numpy is slower at {rows[1].threads} threads than at 1"

    def bmm(self):
        nb, m, k, n = (4, 64, 64, 64) if self.args.quick else (16, 256, 256, 256)
        a, b = self.normal(nb, m, k), self.normal(nb, k, n)
        c = np.empty((nb, m, n), np.float32)
        t = self.args.threads
        self.compare("batch matmul", f"{nb}x{m}x{k}x{n}", t, "numpy.matmul", self.kernel("matmul", "batch_matmul"),
                     (a, b), lambda: self.numpy_time(lambda: np.matmul(a, b, out=c), t), None, "float32")

    def mlp(self):
        m, k, n = (16, 128, 256) if self.args.quick else (64, 768, 3072)
        x, w, b = self.normal(m, k), self.normal(k, n) * np.float32(1 / math.sqrt(k)), self.normal(n)
        p = np.empty((m, n), np.float32)

        def numpy_mlp():
            np.matmul(x, w, out=p)
            np.add(p, b, out=p)
            return 0.5 * p * (1.0 + np.tanh(np.float32(0.79788456080286536) * (p + np.float32(0.044715) * p * p * p)))

        t = self.args.threads
        self.compare("MLP layer + bias + GELU", f"{m}x{k}x{n}", t, "numpy", self.kernel("bench", "mlp_gelu"),
                     (x, w, b), lambda: self.numpy_time(numpy_mlp, t), 2 * m * k * n, "float32",
                     note="GEMM flops only")

    def conv(self):
        try:
            import onnxruntime  # noqa: F401
            from onnx import helper  # noqa: F401
        except ImportError as exc:
            print(f"conv: skipped, onnxruntime/onnx not importable ({exc})", file=sys.stderr)
            self.notes.append(f"conv rows skipped: {exc}")
            return
        # (label, C, H, W, M, K, stride, pad, group, polyc kernel)
        shapes = [("3x3 pad 1, 64ch", 64, 56, 56, 64, 3, 1, 1, 1, ("conv2d", "conv2d_pad1")),
                  ("1x1, 256->64", 256, 56, 56, 64, 1, 1, 0, 1, ("conv2d", "conv2d")),
                  ("3x3 pad 1, 128ch", 128, 28, 28, 128, 3, 1, 1, 1, ("conv2d", "conv2d_pad1")),
                  ("7x7 s2 pad 3, 3->64", 3, 224, 224, 64, 7, 2, 3, 1, ("bench", "conv2d_s2_pad3")),
                  ("depthwise 3x3 pad 1, 256ch", 256, 56, 56, 256, 3, 1, 1, 256, ("bench", "conv2d_depthwise_pad1"))]
        if self.args.quick:
            shapes = [("3x3 pad 1, 8ch", 8, 14, 14, 8, 3, 1, 1, 1, ("conv2d", "conv2d_pad1")),
                      ("1x1, 32->8", 32, 14, 14, 8, 1, 1, 0, 1, ("conv2d", "conv2d")),
                      ("7x7 s2 pad 3, 3->8", 3, 29, 29, 8, 7, 2, 3, 1, ("bench", "conv2d_s2_pad3")),
                      ("depthwise 3x3 pad 1, 16ch", 16, 14, 14, 16, 3, 1, 1, 16,
                       ("bench", "conv2d_depthwise_pad1"))]
        t = self.args.threads
        for label, c, h, w, m, k, stride, pad, group, (family, name) in shapes:
            x = self.normal(1, c, h, w)
            f = self.normal(m, c // group, k, k) * np.float32(1 / math.sqrt(c // group * k * k))
            session = ort_conv_session(x.shape, f, stride, pad, group, t)
            polyc_f = f.reshape(m, k, k) if group > 1 else f

            def peer(session=session, x=x):
                run = lambda: session.run(["Y"], {"X": x})[0]  # noqa: E731
                seconds, _ = median_time(run, self.args.runs)
                return seconds, run()

            self.compare(f"conv2d {label}", f"1x{c}x{h}x{w}", t, "onnxruntime Conv", self.kernel(family, name),
                         (x, polyc_f), peer, None, "float32")

    def resnet50(self):
        """Every ResNet-50 convolution as one ONNX Conv node, compiled by ``polyc.onnx`` (what a model gets:
        the graph passes, the lowering, the kernel) and run by onnxruntime; both time ``run`` calls (alternately at 1
        thread, :func:`paired_times`)."""
        import polyc.onnx as ponnx

        t = self.args.threads
        shapes = RESNET50_CONVS[1:3] if self.args.quick else RESNET50_CONVS
        for c, h, m, k, stride, pad in shapes:
            if self.args.quick:
                c, h, m = min(c, 16), min(h, 14), min(m, 16)
            x = self.normal(1, c, h, h)
            f = self.normal(m, c, k, k) * np.float32(1 / math.sqrt(c * k * k))
            o = (h + 2 * pad - k) // stride + 1
            session = ort_conv_session(x.shape, f, stride, pad, 1, t)
            t0 = time.perf_counter()
            model = ponnx.compile(conv_model(x.shape, f, stride, pad, 1), self.options(None, t), progress=False)
            compile_s = time.perf_counter() - t0
            run = lambda model=model, x=x: model.run({"X": x})[0]  # noqa: E731
            peer = lambda session=session, x=x: session.run(["Y"], {"X": x})[0]  # noqa: E731
            got, want = run(), peer()
            if t == 1:
                polyc_s, peer_s = paired_times(run, peer, self.args.runs)
            else:
                polyc_s, _ = median_time(run, self.args.runs)
                peer_s, _ = median_time(peer, self.args.runs)
            ok, check = close(got, want, "float32")
            row = Row(f"resnet50 conv {k}x{k}" + (f"/{stride}" if stride > 1 else "") + f", {c}->{m}",
                      f"1x{c}x{h}x{h}", t, "onnxruntime Conv", polyc_s, peer_s, 2 * m * c * k * k * o * o,
                      "float32", compile_s, check)
            self.rows.append(row)
            self.progress(row)

    def polybench(self):
        dataset = "SMALL" if self.args.quick else "LARGE"
        t = self.args.threads
        for name in POLYBENCH_SIZES:
            label = POLYBENCH_NAMES.get(name, name)
            kernel = self.kernel("polybench", name)
            sizes = POLYBENCH_SIZES[name][dataset]
            inputs = polybench_inputs(name, sizes, self.rng)
            size_text = f"{dataset} " + "x".join(str(v) for v in sizes.values())
            row = self.compare(label, size_text, t, "numpy", kernel, inputs,
                               lambda: self.numpy_time(lambda: polybench_numpy(name, inputs), t), None, "float64")
            # the source-order version: at LARGE unless a MEDIUM run says it would take over the limit
            identity = Options.naive().replace(scheduler="identity")
            use, note = dataset, ""
            if dataset == "LARGE":
                medium = POLYBENCH_SIZES[name]["MEDIUM"]
                m_inputs = polybench_inputs(name, medium, self.rng)
                m_compiled, _, call, _ = polyc_callable(kernel, m_inputs, identity)
                t0 = time.perf_counter()
                call()
                guess = (time.perf_counter() - t0) * row.flops / kernel_flops(m_compiled) * 1.5
                if guess > IDENTITY_LIMIT_S:
                    use = "MEDIUM"
                    note = f"MEDIUM: source order at LARGE would take ~{guess:.0f} s a run"
            if use != dataset:
                sizes = POLYBENCH_SIZES[name][use]
                inputs = polybench_inputs(name, sizes, self.rng)
                size_text = f"{use} " + "x".join(str(v) for v in sizes.values())

            def peer(inputs=inputs):
                _, compile_s, call, result = polyc_callable(kernel, inputs, identity)
                seconds, _ = median_time(call, self.args.runs, budget_s=IDENTITY_LIMIT_S)
                return seconds, result

            self.compare(label, size_text, t, "polyc source order, no transforms", kernel, inputs, peer, None,
                         "float64", note=note)

    def overhead(self):
        kernel = self.kernel("elementwise", "add")
        x, y = np.ones((1, 1), np.float32), np.ones((1, 1), np.float32)
        compiled = kernel.specialize(x, y)
        out = np.zeros((1, 1), np.float32)
        pointers = [x.ctypes.data, y.ctypes.data, out.ctypes.data]
        cases = [("compiled.run_pointers(ptrs)", lambda: compiled.run_pointers(pointers)),
                 ("compiled(x, y, out=out)", lambda: compiled(x, y, out=out)),
                 ("compiled(x, y)", lambda: compiled(x, y)),
                 ("kernel(x, y)  (shape lookup each call)", lambda: kernel(x, y)),
                 ("numpy.add(x, y, out=out)  (for scale)", lambda: np.add(x, y, out=out))]
        for label, fn in cases:
            n = 2000 if self.args.quick else 20000
            per_call = []
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(n):
                    fn()
                per_call.append((time.perf_counter() - t) / n)
            self.overheads.append((label, statistics.median(per_call) * 1e6))
        assert out[0, 0] == 2.0

    # ---- report ----
    def report(self):
        a = self.args
        print(f"# polyc kernel benchmarks\n")
        print(f"- machine: {cpu_name()}, {os.cpu_count()} logical CPUs; {platform.python_implementation()} "
              f"{platform.python_version()}, numpy {np.__version__} ({blas_name()}), polyc {polyc.__version__}"
              + (f", onnxruntime {ort_version()}" if ort_version() else ""))
        if a.options:
            print(f"- polyc options on every row: `{a.options}` (on top of each row's own)")
        print(f"- numpy BLAS threads: {self.blas.describe()}; polyc threads via Options(threads=...); "
              f"onnxruntime via intra_op_num_threads")
        if self.fma is not None:
            figures = "; ".join(
                f"{'fp32' if d == 'float32' else 'fp64'} " + ", ".join(
                    f"{t} thread{'s' if t > 1 else ''} {v:.1f}" for (d2, t), v in sorted(self.fma_peaks.items())
                    if d2 == d)
                for d in ("float32", "float64"))
            print(f"- peak (the % of peak column): the machine's FMA throughput measured at the start of the run, "
                  f"{self.fma.describe()}, best of {self.fma_runs} runs, N threads = N Python threads running the "
                  f"loop at once; GFLOP/s: {figures}; a row's % is of the figure of its dtype at its thread count")
        elif self.gemm_peaks:
            print(f"- peak (the % of peak column): the FMA loop could not run (see the notes below), so numpy's "
                  f"GEMM figures below stand in; a row's % is of the best figure of its dtype at most its thread "
                  f"count")
        if self.gemm_peaks:
            gemm = "; ".join(
                f"numpy {'S' if d == 'float32' else 'D'}GEMM {self.peak_size}^3: " + ", ".join(
                    f"{v:.1f} GFLOP/s at {t} thread{'s' if t > 1 else ''}"
                    for (d2, t), v in sorted(self.gemm_peaks.items()) if d2 == d)
                for d in ("float32", "float64"))
            print(f"- reference{'' if self.fma is None else ' (not used for the %)'}: {gemm} "
                  f"(best of {max(5, a.runs)} runs)")
        print(f"- times: median of up to {a.runs} runs after a warm-up (slow calls fewer); polyc and its peer "
              f"measured back to back; other work on the machine makes timings noisy (1-minute load average "
              f"{self.load_before} at the start, {_loadavg()} at the end on {os.cpu_count()} CPUs)"
              + ("; --quick: small sizes" if a.quick else ""))
        if self.fma is not None:
            pct = ("; % of peak = GFLOP/s / peak, an upper bound: loads, stores and non-FMA operations take issue "
                   "slots the FMA loop does not use, so even a good GEMM stays below 100%")
        elif self.gemm_peaks:
            pct = (f"; % of peak = GFLOP/s / numpy's GEMM figure, which can pass 100% at sizes where numpy itself "
                   f"beats its {self.peak_size}^3 figure")
        else:
            pct = ""
        print(f"- ratio = peer ms / polyc ms (above 1: polyc is faster){pct}")
        print()
        if self.rows:
            print("| kernel | size | threads | peer | polyc ms | peer ms | ratio | GFLOP/s | % of peak | compile ms "
                  "| check |")
            print("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
            for r in self.rows:
                gflops = r.flops / r.polyc_s / 1e9 if r.polyc_s else None
                pct = 100 * gflops / self.peak(r.dtype, r.threads) if gflops else None
                ratio = r.peer_s / r.polyc_s if r.polyc_s and r.peer_s else None
                check = r.check + (f"; {r.note}" if r.note else "")
                print(f"| {r.kernel} | {r.size} | {r.threads} | {r.peer} | {_ms(r.polyc_s)} | {_ms(r.peer_s)} | "
                      f"{ratio:.2f} | {gflops:.1f} | {pct:.0f}% | {r.compile_s * 1e3:.0f} | {check} |")
            print()
        if self.overheads:
            print("Per-call overhead of a compiled kernel called from Python (1-element fp32 add):\n")
            print("| call | us per call |")
            print("| --- | ---: |")
            for label, us in self.overheads:
                print(f"| `{label}` | {us:.2f} |")
            print()
        for note in self.notes:
            print(f"- {note}")


def _loadavg() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "unknown"


def _ms(seconds) -> str:
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}" if ms >= 10 else f"{ms:.3f}" if ms < 1 else f"{ms:.2f}"


# ---- peers -------------------------------------------------------------------------------------------------

def conv_model(x_shape, weights, stride, pad, group):
    """A model of one Conv node ``Y = Conv(X, W)`` (weights as an initializer, output shape inferred)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    m, _, kh, kw = weights.shape
    node = helper.make_node("Conv", ["X", "W"], ["Y"], kernel_shape=[kh, kw], pads=[pad] * 4,
                            strides=[stride, stride], group=group)
    graph = helper.make_graph([node], "conv", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(weights, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return onnx.shape_inference.infer_shapes(model)


def ort_conv_session(x_shape, weights, stride, pad, group, threads):
    """An onnxruntime session running one Conv node (weights as an initializer)."""
    import onnxruntime as ort

    model = conv_model(x_shape, weights, stride, pad, group)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def polybench_inputs(name: str, s: dict, rng) -> tuple:
    d = lambda *shape: rng.standard_normal(shape)  # noqa: E731 - float64, PolyBench's default DATA_TYPE
    if name == "two_mm":
        return d(s["NI"], s["NK"]), d(s["NK"], s["NJ"]), d(s["NJ"], s["NL"]), d(s["NI"], s["NL"]), 1.5, 1.2
    if name == "three_mm":
        return d(s["NI"], s["NK"]), d(s["NK"], s["NJ"]), d(s["NJ"], s["NM"]), d(s["NM"], s["NL"])
    if name == "atax":
        return d(s["M"], s["N"]), d(s["N"])
    if name == "bicg":
        return d(s["N"], s["M"]), d(s["N"]), d(s["M"])
    if name == "mvt":
        return (d(s["N"], s["N"]),) + tuple(d(s["N"]) for _ in range(4))
    if name == "gemver":
        return (d(s["N"], s["N"]),) + tuple(d(s["N"]) for _ in range(8)) + (1.5, 1.2)
    if name == "doitgen":
        return d(s["NR"], s["NQ"], s["NP"]), d(s["NP"], s["NP"])
    raise KeyError(name)


def polybench_numpy(name: str, args: tuple):
    if name == "two_mm":
        a, b, c, d, alpha, beta = args
        t = a @ b
        t *= alpha
        e = t @ c
        e += beta * d
        return e
    if name == "three_mm":
        a, b, c, d = args
        return (a @ b) @ (c @ d)
    if name == "atax":
        a, x = args
        return a.T @ (a @ x)
    if name == "bicg":
        a, r, p = args
        return a.T @ r, a @ p
    if name == "mvt":
        a, x1, x2, y1, y2 = args
        return x1 + a @ y1, x2 + a.T @ y2
    if name == "gemver":
        a, u1, v1, u2, v2, w, x, y, z, alpha, beta = args
        ah = a + np.outer(u1, v1) + np.outer(u2, v2)
        xo = x + beta * (ah.T @ y) + z
        return ah, xo, w + alpha * (ah @ xo)
    if name == "doitgen":
        a, c4 = args
        return (a.reshape(-1, a.shape[2]) @ c4).reshape(a.shape)
    raise KeyError(name)


# ---- machine description -----------------------------------------------------------------------------------

def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
                    platform.processor())
        flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
        isa = "AVX-512" if "avx512f" in flags else "AVX2" if "avx2" in flags else "SSE"
        return f"{name} ({isa}{' + FMA' if 'fma' in flags else ''})"
    except OSError:
        return platform.processor() or "unknown CPU"


def blas_name() -> str:
    try:
        config = np.show_config(mode="dicts")
        blas = config["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:
        return "BLAS unknown"


def ort_version() -> str | None:
    try:
        import onnxruntime
        return onnxruntime.__version__
    except ImportError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="a few small sizes (a smoke run)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                    help="threads for the multi-threaded rows (default: all %(default)s cores); GEMM also runs at 1")
    ap.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {', '.join(SECTIONS)}")
    ap.add_argument("--runs", type=int, default=None, help="timed runs per measurement (default 5, --quick 3)")
    ap.add_argument("--options", default="",
                    help="an Options spec applied on top of every polyc row's options (e.g. prefetch=0): one "
                         "decision's A/B against a run without it")
    ap.add_argument("--blas-coretype", choices=("match", "env"), default="match",
                    help="numpy's OpenBLAS kernel: 'match' polyc's instruction set (OPENBLAS_CORETYPE SkylakeX or "
                         "Haswell, the default) or keep the environment's")
    args = ap.parse_args(argv)
    args.runs = args.runs or (3 if args.quick else 5)
    try:
        Options.from_spec(args.options)
    except PolycError as exc:
        ap.error(f"--options: {exc}")
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        ap.error(f"unknown sections {sorted(unknown)}; expected some of {', '.join(SECTIONS)}")
    if args.threads < 1:
        ap.error("--threads must be at least 1")

    bench = Bench(args)
    print(f"numpy BLAS threads {bench.blas.describe()}", file=sys.stderr)
    if bench.blas.how is None:
        bench.notes.append("numpy's thread count was not controlled; install threadpoolctl or run with "
                           "OPENBLAS_NUM_THREADS=1 and =2 separately")
    if any(s in only for s in ("gemm", "bmm", "mlp", "conv", "resnet50", "polybench")):
        bench.measure_peaks()
    for section in SECTIONS:
        if section in only:
            print(f"{section} ...", file=sys.stderr, flush=True)
            getattr(bench, section)()
    bench.report()
    bad = [r for r in bench.rows if not r.check.startswith("ok")]
    if bad:
        print(f"{len(bad)} row(s) did not match their peer", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
