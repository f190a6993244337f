"""Running a compiled model: the kernels in group order over one arena.

:class:`Program` is what the compiler hands to an executor: the steps (one compiled kernel per kernel group,
with the ONNX names of its arguments), the memory plan, the constants and the graph's inputs and outputs.
:class:`PythonExecutor` calls each kernel's native entry from Python on pointers into the arena. A native
executor (all kernels in one module with a generated entry point) only has to implement the same
``run(feeds) -> list[np.ndarray]`` on the same :class:`Program`; :func:`make_executor` is the one place that
picks the implementation.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

from ..errors import PolycError
from .memory import MemoryPlan


@dataclass(frozen=True)
class Step:
    """One kernel call: ``compiled`` (a ``polyc.kernel.Compiled``) on ``inputs`` writing ``outputs``
    (ONNX tensor names, in the def's parameter and return order)."""

    group: str
    name: str
    compiled: object
    inputs: tuple
    outputs: tuple


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


def scratch_name(group: str, k: int) -> str:
    """The arena name of temporary ``k`` of the kernel of ``group`` (a tensor its def does not return)."""
    return f"{group}/scratch{k}"


class PythonExecutor:
    """Calls each kernel from Python in order; intermediates and the kernels' temporaries live in one
    preallocated arena.

    Not reentrant: one ``run`` at a time per executor (the arena and the kernels' temporaries are shared).
    """

    def __init__(self, program: Program):
        self.program = program
        self.arena = np.zeros(max(program.plan.arena_bytes, 64), dtype=np.uint8)
        self.views = {}
        plan = program.plan
        for name, offset in plan.offsets.items():
            self.views[name] = self._view(name, offset)
        self.temps = {step.group: [self.views[scratch_name(step.group, k)] for k in range(len(step.compiled.temps))]
                      for step in program.steps}
        self.constants = {k: np.ascontiguousarray(v) for k, v in program.constants.items()}

    def _view(self, name: str, offset: int) -> np.ndarray:
        info = self.program.tensors[name]
        dtype = np.dtype(info.dtype)
        count = int(np.prod(info.shape, dtype=np.int64))
        return self.arena[offset:offset + count * dtype.itemsize].view(dtype).reshape(info.shape)

    def _array(self, name: str, feeds: dict) -> np.ndarray:
        root = self.program.plan.root(name)
        if root in self.views:
            base = self.views[root]
        elif root in feeds:
            base = feeds[root]
        elif root in self.constants:
            base = self.constants[root]
        else:
            raise PolycError(f"internal error: tensor {name!r} has no storage (root {root!r})")
        shape = self.program.tensors[name].shape if name in self.program.tensors else base.shape
        return base if base.shape == shape or shape is None else base.reshape(shape)

    def run(self, feeds: dict, profile: dict | None = None) -> list:
        """Run every step; ``feeds`` are checked, C-contiguous arrays keyed by input name.

        With a ``profile`` dict, each step's seconds are added under its group name.
        """
        for step in self.program.steps:
            args = [self._array(t, feeds) for t in step.inputs]
            outs = [self._array(t, feeds) for t in step.outputs]
            pointers = [a.ctypes.data for a in args] + [o.ctypes.data for o in outs] + \
                [t.ctypes.data for t in self.temps[step.group]]
            if profile is None:
                step.compiled.run_pointers(pointers)
            else:
                t = time.perf_counter()
                step.compiled.run_pointers(pointers)
                profile[step.group] = profile.get(step.group, 0.0) + time.perf_counter() - t
        results = []
        for name in self.program.outputs:
            value = self._array(name, feeds)
            results.append(np.array(value, copy=True).reshape(self.program.tensors[name].shape))
        return results


def make_executor(program: Program, native: bool | None = None):
    """The executor for ``program``: the native one (every kernel in one module, one native call per run;
    :mod:`polyc.onnx.native`), or the Python-driven one with ``native=False`` or ``POLYC_EXECUTOR=python``
    (for debugging: it can time each kernel)."""
    if native is None:
        native = os.environ.get("POLYC_EXECUTOR", "native") != "python"
    if native and program.steps:
        from .native import NativeExecutor

        return NativeExecutor(program)
    return PythonExecutor(program)
