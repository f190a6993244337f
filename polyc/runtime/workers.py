"""Compile workers: independent jobs (one kernel each) run in worker processes, results in job order.

islpy's context and LLVM are not thread-safe and most of a kernel's compile is Python holding the GIL (the
llvmlite IR builder), so compiling kernels at once takes processes. :func:`run_jobs` hands ``fn(job)`` to
``processes`` workers and yields the results in the order of ``jobs``, whatever order they finish in, so a
caller reports progress and the first failure exactly as a serial loop would. ``fn`` and the jobs must be
picklable (``fn`` a module-level function). With ``processes <= 1`` the jobs run here, one after the other.

A worker is a fresh interpreter (``sys.executable``, this process's ``sys.path``) running :func:`serve`:
pickled ``(fn, job)`` requests on its stdin, pickled ``(ok, result or exception)`` replies on the stdout it
had at start (its ``print`` goes to stderr). Not :mod:`multiprocessing`: its ``spawn`` and ``forkserver``
start methods run the caller's main script again in every worker (a script without an
``if __name__ == "__main__"`` guard would compile its model again there, recursively), and ``fork`` would
copy the caller's threads' held locks (the JIT's thread pool). A thread of this process drives each request
(:class:`concurrent.futures.ThreadPoolExecutor`), waiting on a pipe without the GIL.

Workers are kept for the life of the process (starting one costs an interpreter and polyc's imports, about
0.3 s) and end when their stdin closes (at exit). A worker that dies mid-job (a crash inside isl or LLVM)
raises CompileError for that job and is replaced by the next request.
"""
from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, Iterator

from ..errors import CompileError

_BOOT = ("import pickle, sys; sys.path[:] = pickle.load(sys.stdin.buffer); "
         "from polyc.runtime.workers import serve; serve()")


class _Worker:
    """One worker process and its pipes."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE)
        pickle.dump(list(sys.path), self.process.stdin)
        self.process.stdin.flush()

    def call(self, fn: Callable, job):
        try:
            pickle.dump((fn, job), self.process.stdin, protocol=pickle.HIGHEST_PROTOCOL)
            self.process.stdin.flush()
            ok, value = pickle.load(self.process.stdout)
        except (OSError, EOFError, pickle.UnpicklingError) as exc:
            self.close()
            raise CompileError(f"a compile worker process died ({type(exc).__name__}: {exc}; exit status "
                               f"{self.process.poll()})",
                               hint="set POLYC_COMPILE_JOBS=1 to compile in this process and see the failure") \
                from None
        if not ok:
            raise value
        return value

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.alive():
            self.process.kill()
        self.process.wait()


class _Pool:
    """``size`` workers (started on first use) driven by as many threads."""

    def __init__(self, size: int):
        self.idle: queue.SimpleQueue = queue.SimpleQueue()
        for _ in range(size):
            self.idle.put(None)  # a worker slot, started when first taken
        self.threads = ThreadPoolExecutor(size, thread_name_prefix="polyc-compile")

    def _run(self, fn: Callable, job):
        worker = self.idle.get()
        try:
            if worker is None or not worker.alive():
                worker = _Worker()
            return worker.call(fn, job)
        finally:
            self.idle.put(worker if worker is not None and worker.alive() else None)

    def submit(self, fn: Callable, job):
        return self.threads.submit(self._run, fn, job)


_POOLS: dict[int, _Pool] = {}
_POOLS_LOCK = threading.Lock()


def run_jobs(fn: Callable, jobs: Iterable, processes: int) -> Iterator:
    """``fn(job)`` for each of ``jobs``, yielded in job order: in ``processes`` worker processes at once, or
    here one by one when ``processes <= 1``. An exception ``fn`` raises is raised from the yield of its job
    (the jobs after it not yet started are cancelled). Raises CompileError when a worker process dies."""
    jobs = list(jobs)
    if processes <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield fn(job)
        return
    with _POOLS_LOCK:
        pool = _POOLS.get(processes) or _POOLS.setdefault(processes, _Pool(processes))
    futures = [pool.submit(fn, job) for job in jobs]
    try:
        for future in futures:
            yield future.result()
    finally:
        for future in futures:
            future.cancel()


def serve() -> None:
    """A worker's loop (see the module docstring): answer requests until stdin closes."""
    replies = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stray output of the jobs goes to stderr
    requests = sys.stdin.buffer
    while True:
        try:
            fn, job = pickle.load(requests)
        except EOFError:
            return
        try:
            reply = (True, fn(job))
        except Exception as exc:  # noqa: BLE001 - handed to the caller, which raises it
            reply = (False, exc)
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # noqa: BLE001 - an exception that cannot cross: its text does
            data = pickle.dumps((False, CompileError(f"{type(reply[1]).__name__}: {reply[1]}")))
        replies.write(data)
        replies.flush()
