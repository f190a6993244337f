"""One candidate of a tuning search: compiled, checked against the default's output, timed.

A :class:`MeasureJob` is plain data (it crosses to a compile worker or a Ray task): the def, its sizes, the
thread count, the candidate's options spec (without threads), the input seed and the inputs taken as constants
(a model's weights: the kernel is compiled to take them packed, and they are packed once before the timing, as
the model's executor does; timed otherwise, a candidate would be another program than the one the model runs).
:func:`compile_candidate` only compiles (the object lands in the disk cache, where :func:`time_candidate` in
another process finds it); :func:`time_candidate` compiles or loads, runs on seeded inputs, checks the result
against the reference (the default options' output: allclose with rtol 1e-3 and atol 1e-4 of the reference's
largest magnitude for floats, equality for integers and bools) and times it: :data:`WARMUP` calls, then calls
until :data:`TIME_BUDGET` seconds or :data:`MAX_CALLS` (at least :data:`MIN_CALLS`); calls slower than the
median by more than 3 median absolute deviations (a preempted call) are dropped, and the median of the rest is
the candidate's time. The timing calls the kernel's native entry on arrays prepared once
(:meth:`~polyc.kernel.Compiled.run_pointers`), as a model's executor does.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from ..errors import PolycError
from ..kernel import Kernel
from ..options import Options

WARMUP, MIN_CALLS, MAX_CALLS, TIME_BUDGET = 2, 5, 50, 0.25


@dataclass(frozen=True)
class MeasureJob:
    """A candidate to measure: ``source``/``name`` (the def), ``sizes`` (sorted ``(size, extent)`` pairs),
    ``threads``, ``spec`` (:meth:`Options.to_spec` without threads), the inputs' ``seed`` and ``constants``
    (sorted names of the inputs taken as constants)."""

    source: str
    name: str
    sizes: tuple
    threads: int
    spec: str
    seed: int = 0
    constants: tuple = ()

    def options(self) -> Options:
        return Options.from_spec(self.spec).replace(threads=self.threads)

    def kernel(self) -> Kernel:
        return Kernel(self.source, self.name, self.options(), records=False)


def inputs_for(kernel: Kernel, sizes: dict, seed: int) -> list[np.ndarray]:
    """Seeded inputs for ``kernel`` at ``sizes``: floats uniform in [-1, 1), integers in [0, 4), bools."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t in kernel.signature(sizes):
        if t.role != "input":
            continue
        dtype = np.dtype(t.dtype) if t.dtype not in ("float16", "bfloat16") else np.float16
        if dtype.kind == "f":
            arrays.append(rng.uniform(-1, 1, t.shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 4, t.shape).astype(dtype))
    return arrays


def compile_candidate(job: MeasureJob) -> float:
    """Compile ``job``'s candidate (stored in the disk cache); returns the seconds it took. Raises what
    compiling raises."""
    started = time.perf_counter()
    job.kernel().specialize_sizes(dict(job.sizes), constants=frozenset(job.constants))
    return time.perf_counter() - started


def compile_or_error(job: MeasureJob) -> str:
    """Compile ``job`` (a compile worker's task, :func:`polyc.runtime.workers.run_jobs`): ``""``, or the error
    that stopped it (``"ShapeError: ..."``)."""
    try:
        compile_candidate(job)
    except PolycError as exc:
        return f"{type(exc).__name__}: {exc.message}"
    return ""


def outputs(job: MeasureJob) -> list[np.ndarray]:
    """The outputs of ``job``'s candidate on its seeded inputs (the reference, for the default)."""
    kernel = job.kernel()
    sizes = dict(job.sizes)
    result = kernel.specialize_sizes(sizes, constants=frozenset(job.constants))(*inputs_for(kernel, sizes, job.seed))
    return list(result) if isinstance(result, tuple) else [result]


def time_candidate(job: MeasureJob, reference: list) -> dict:
    """Compile (or load), check and time ``job``'s candidate against ``reference`` (the default's outputs).
    Returns ``{"seconds": [...], "median": s, "ok": bool, "error": text}``: a candidate that fails to compile,
    faults or differs from the reference is not ok (its error says why) and never chosen."""
    try:
        kernel = job.kernel()
        sizes = dict(job.sizes)
        compiled = kernel.specialize_sizes(sizes, constants=frozenset(job.constants))
        arrays = inputs_for(kernel, sizes, job.seed)
        result = compiled(*arrays)
        got = list(result) if isinstance(result, tuple) else [result]
    except PolycError as exc:
        return dict(seconds=[], median=None, ok=False, error=f"{type(exc).__name__}: {exc.message}")
    for k, (mine, theirs) in enumerate(zip(got, reference)):
        if not _close(mine, theirs):
            return dict(seconds=[], median=None, ok=False, error=f"output {k} differs from the default's")
    held = compiled.arguments(*arrays)  # constants packed once, as a model's executor does
    pointers = [a.ctypes.data for a in held]
    for _ in range(WARMUP):
        compiled.run_pointers(pointers)
    seconds, spent = [], 0.0
    while len(seconds) < MIN_CALLS or (spent < TIME_BUDGET and len(seconds) < MAX_CALLS):
        t = time.perf_counter()
        compiled.run_pointers(pointers)
        seconds.append(time.perf_counter() - t)
        spent += seconds[-1]
    median = statistics.median(seconds)
    spread = statistics.median(abs(s - median) for s in seconds)
    kept = [s for s in seconds if s <= median + 3 * spread] or seconds
    return dict(seconds=seconds, median=statistics.median(kept), ok=True, error="")


def _close(mine: np.ndarray, theirs: np.ndarray) -> bool:
    if mine.shape != theirs.shape or mine.dtype != theirs.dtype:
        return False
    if mine.dtype.kind not in "fc":
        return bool(np.array_equal(mine, theirs))
    a, b = mine.astype(np.float64), theirs.astype(np.float64)
    scale = float(np.nanmax(np.abs(b))) if b.size and not np.isnan(b).all() else 0.0
    return bool(np.allclose(a, b, rtol=1e-3, atol=1e-4 * scale + 1e-30, equal_nan=True))
