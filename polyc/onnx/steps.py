"""A compiled model as an executor takes it: the steps, the memory plan, and the arenas runs lease.

:class:`Program` is what the compiler (:func:`polyc.onnx.compile`) hands to an executor: the steps (one
kernel per kernel group, specialised on its shapes, with the ONNX names of its arguments), the memory plan,
the constants and the graph's inputs and outputs. Both executors (:class:`~polyc.onnx.executor.PythonExecutor`
and :class:`~polyc.onnx.native.NativeExecutor`) run the same :class:`Program` over arenas (:func:`new_arena`)
leased from an :class:`ArenaPool`; a kernel's temporaries live in the arena under :func:`scratch_name`.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..errors import CompileError, PolycError
from .memory import MemoryPlan


@dataclass(frozen=True)
class Step:
    """One kernel call: ``kernel`` (a :class:`polyc.Kernel`) specialised on ``sizes`` (sorted ``(size,
    extent)`` pairs) on ``inputs`` writing ``outputs`` (ONNX tensor names, in the def's parameter and return
    order). ``tensors`` is the kernel's signature (:meth:`polyc.Kernel.signature`: inputs, outputs,
    temporaries, in native argument order)."""

    group: str
    name: str
    kernel: object
    sizes: tuple
    tensors: tuple
    inputs: tuple
    outputs: tuple

    @property
    def temps(self) -> tuple:
        """The kernel's temporaries (TensorSpecs), which the memory plan places in the arena."""
        return tuple(t for t in self.tensors if t.role == "temp")

    def compile(self, constants: frozenset = frozenset()):
        """The kernel JIT-compiled on its own (a ``polyc.kernel.Compiled``), built on first use and kept by
        the kernel (and the disk cache); ``constants``: its parameters that are the model's constants (taken
        packed where the strategy packs them, as the native executor does). Only the Python-driven executor
        needs it; raises CompileError naming the kernel and its group."""
        try:
            return self.kernel.specialize_sizes(dict(self.sizes), constants=constants)
        except PolycError as exc:
            raise CompileError(f"compiling kernel {self.name} of group {self.group} failed: {exc.message}",
                               hint=f"the kernel's source:\n{self.kernel.source}") from exc


@dataclass(frozen=True)
class Program:
    """Everything an executor needs: ``steps`` in order, the memory ``plan``, ``constants`` (name -> array
    in the shape the kernels read), ``tensors`` (name -> TensorInfo), graph ``inputs`` and ``outputs``."""

    steps: tuple
    plan: MemoryPlan
    constants: dict
    tensors: dict
    inputs: tuple
    outputs: tuple


def constant_params(program: Program, step) -> frozenset:
    """Names of the parameters of ``step``'s kernel whose tensors are constants of ``program`` (its weights,
    which the executors hand the kernel packed once where the strategy packs them)."""
    params = [p.name for p in step.kernel.checked.inputs]
    return frozenset(p for p, name in zip(params, step.inputs) if program.plan.root(name) in program.constants)


class ArenaPool:
    """Workspaces (an arena and whatever an executor derives from it) for concurrent runs.

    ``lease()`` is a context manager yielding a workspace no other run is using: an idle one when there is
    one, else a new one made by ``make()``. On exit the workspace goes back to the pool; at most ``keep``
    idle workspaces are kept (the extra ones are freed), so memory grows only with the number of runs that
    were really concurrent. One run at a time costs one workspace, as before.
    """

    def __init__(self, make, keep: int = 4):
        self._make = make
        self._keep = keep
        self._idle = [make()]
        self._lock = threading.Lock()
        self.created = 1

    @contextmanager
    def lease(self):
        workspace = self.acquire()
        try:
            yield workspace
        finally:
            self.release(workspace)

    def acquire(self):
        """A workspace for one run (give it back with :meth:`release`; :meth:`lease` does both)."""
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.created += 1
        return self._make()

    def release(self, workspace) -> None:
        """Return a workspace taken with :meth:`acquire` to the pool."""
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(workspace)


def new_arena(plan: MemoryPlan) -> np.ndarray:
    """A zeroed, 64-byte-aligned arena of ``plan.arena_bytes`` bytes (at least 64)."""
    nbytes = max(plan.arena_bytes, 64)
    raw = np.zeros(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + nbytes]


def scratch_name(group: str, k: int) -> str:
    """The arena name of temporary ``k`` of the kernel of ``group`` (a tensor its def does not return)."""
    return f"{group}/scratch{k}"
