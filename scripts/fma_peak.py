#!/usr/bin/env python
"""The machine's FMA throughput peak, measured: the "% of peak" of ``scripts/bench_kernels.py``.

A JIT-compiled loop of independent vector FMA chains (``llvm.fma``, built with llvmlite for the host CPU and
its features), timed at 1 and N threads (N Python threads calling it at once; ctypes releases the GIL), for
fp32 and fp64, for the CPU polyc targets (``POLYC_CPU`` overrides the host's, as for the kernels). Run it
on its own to print the figures::

    python scripts/fma_peak.py [--threads N] [--runs R]
"""
from __future__ import annotations

import argparse
import ctypes
import math
import os
import sys
import threading
import time


class FmaPeak:
    """The machine's FMA throughput: a JIT-compiled loop of independent vector FMA chains.

    One function per dtype, ``T fma_<f32|f64>(i64 n, T a, T b)``: ``chains`` accumulators (distinct starting
    vectors, so none can be merged), each updated ``acc = fma(acc, splat(a), splat(b))`` ``UNROLL`` times per
    iteration for ``n`` iterations, then summed into the returned scalar so the loop is live. ``a`` and ``b``
    are arguments (0.999 and 0.001 when run), so nothing folds and the values converge to 1 without
    overflow or denormals. Built with llvmlite's IR builder for ``llvm.get_host_cpu_name()`` and its
    features, compiled by MCJIT at opt level 3 without the IR optimizer (the loop is already minimal), and
    called through ctypes, which releases the GIL, so several Python threads run it at once.
    """

    UNROLL = 4

    def __init__(self):
        from llvmlite import ir
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        from polyc.target import host_target

        target = host_target()  # the CPU polyc generates code for: POLYC_CPU=znver3 measures AVX2's peak
        self.cpu, self.features = target.cpu, target.features
        enabled = {f[1:] for f in self.features.split(",") if f.startswith("+")}
        self.bits = target.vector_bits
        # at least FMA latency x FMA pipes chains keep every pipe busy (4 x 2 on Zen 4/5 and recent Intel
        # cores); the chains, a and b must all stay in the vector registers (32 with AVX-512, 16 with AVX2)
        self.chains = min(16, target.vector_registers - 4)
        self.isa = {512: "AVX-512", 256: "AVX2" if "avx2" in enabled else "AVX", 128: "128-bit"}[self.bits]
        self.lanes = {"float32": self.bits // 32, "float64": self.bits // 64}

        i32, i64 = ir.IntType(32), ir.IntType(64)
        module = ir.Module(name="fma_peak")
        module.triple = llvm.get_process_triple()
        for dtype, scalar in (("float32", ir.FloatType()), ("float64", ir.DoubleType())):
            lanes = self.lanes[dtype]
            vec = ir.VectorType(scalar, lanes)
            # llvmlite's IRBuilder.fma and declare_intrinsic take scalars only: declare the vector intrinsic
            fma = ir.Function(module, ir.FunctionType(vec, [vec] * 3), f"llvm.fma.v{lanes}f{dtype[-2:]}")
            fn = ir.Function(module, ir.FunctionType(scalar, [i64, scalar, scalar]), self._name(dtype))
            n, a, b = fn.args
            entry, loop, done = (fn.append_basic_block(x) for x in ("entry", "loop", "done"))
            bld = ir.IRBuilder(entry)
            undef = ir.Constant(vec, ir.Undefined)
            splat = lambda x: bld.shuffle_vector(  # noqa: E731
                bld.insert_element(undef, x, ir.Constant(i32, 0)), undef,
                ir.Constant(ir.VectorType(i32, lanes), [0] * lanes))
            va, vb = splat(a), splat(b)
            bld.branch(loop)
            bld.position_at_end(loop)
            i = bld.phi(i64)
            accs = [bld.phi(vec) for _ in range(self.chains)]
            values = list(accs)
            for _ in range(self.UNROLL):
                values = [bld.call(fma, [v, va, vb]) for v in values]
            step = bld.add(i, ir.Constant(i64, 1))
            i.add_incoming(ir.Constant(i64, 0), entry)
            i.add_incoming(step, loop)
            for c, (acc, v) in enumerate(zip(accs, values)):
                acc.add_incoming(ir.Constant(vec, [1.0 + c + 0.01 * lane for lane in range(lanes)]), entry)
                acc.add_incoming(v, loop)
            bld.cbranch(bld.icmp_signed("<", step, n), loop, done)
            bld.position_at_end(done)
            total = values[0]
            for v in values[1:]:
                total = bld.fadd(total, v)
            result = bld.extract_element(total, ir.Constant(i32, 0))
            for lane in range(1, lanes):
                result = bld.fadd(result, bld.extract_element(total, ir.Constant(i32, lane)))
            bld.ret(result)

        mod = llvm.parse_assembly(str(module))
        mod.verify()
        tm = llvm.Target.from_triple(module.triple).create_target_machine(
            cpu=self.cpu, features=self.features, opt=3, jit=True)
        self._engine = llvm.create_mcjit_compiler(mod, tm)  # keeps the machine code alive
        self._engine.finalize_object()
        self.functions = {}
        for dtype, ctype in (("float32", ctypes.c_float), ("float64", ctypes.c_double)):
            address = self._engine.get_function_address(self._name(dtype))
            self.functions[dtype] = ctypes.CFUNCTYPE(ctype, ctypes.c_int64, ctype, ctype)(address)

    @staticmethod
    def _name(dtype: str) -> str:
        return f"fma_{'f32' if dtype == 'float32' else 'f64'}"

    def flops_per_iteration(self, dtype: str) -> int:
        return 2 * self.lanes[dtype] * self.chains * self.UNROLL

    def measure(self, dtype: str, thread_counts, runs: int, call_s: float) -> dict:
        """{threads: GFLOP/s} for ``dtype``: the best of ``runs`` runs, each ``threads`` Python threads
        calling the loop at once (iterations sized for about ``call_s`` seconds a call); a run's figure is all
        the threads' flops over the wall time from the first thread's start to the last one's finish."""
        fn = self.functions[dtype]
        n = 10_000
        while True:  # size the loop from a timed call
            t = time.perf_counter()
            value = fn(n, 0.999, 0.001)
            seconds = time.perf_counter() - t
            if seconds > 0.01 or n > 1 << 40:
                break
            n *= 10
        if not math.isfinite(value):
            raise RuntimeError(f"FMA loop returned {value}")
        n = max(1, int(n * call_s / seconds))
        result = {}
        for threads in thread_counts:
            best = 0.0
            for _ in range(runs):
                barrier = threading.Barrier(threads)
                spans = [None] * threads

                def work(k):
                    barrier.wait()
                    start = time.perf_counter()
                    fn(n, 0.999, 0.001)
                    spans[k] = (start, time.perf_counter())

                workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
                for w in workers:
                    w.start()
                for w in workers:
                    w.join()
                wall = max(e for _, e in spans) - min(s for s, _ in spans)
                best = max(best, threads * n * self.flops_per_iteration(dtype) / wall / 1e9)
            result[threads] = best
        return result

    def describe(self) -> str:
        return (f"{self.chains} independent chains of <{self.lanes['float32']} x float> / "
                f"<{self.lanes['float64']} x double> llvm.fma ({self.isa}, unrolled {self.UNROLL}x; llvmlite "
                f"MCJIT for {self.cpu})")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)
    peak = FmaPeak()
    print(f"FMA peak: {peak.describe()}")
    for dtype in ("float32", "float64"):
        figures = peak.measure(dtype, sorted({1, args.threads}), args.runs, 0.2)
        print(f"{dtype}: " + ", ".join(f"{t} thread{'s' if t > 1 else ''} {g:.1f} GFLOP/s"
                                       for t, g in sorted(figures.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
