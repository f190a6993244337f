"""Running a compiled model: the kernels in group order over one arena (one per concurrent run).

:class:`~polyc.onnx.steps.Program` is what the compiler hands to an executor: the steps (one kernel per kernel
group, specialised on its shapes, with the ONNX names of its arguments), the memory plan, the constants and the
graph's inputs and outputs (:mod:`polyc.onnx.steps`). A step carries its kernel's signature but no native code:
the native executor (:mod:`polyc.onnx.native`) links every kernel into one native program, and only
:class:`PythonExecutor` JIT-compiles each kernel on its own (:meth:`~polyc.onnx.steps.Step.compile`, on first
use). Both implement ``run(feeds) -> list[np.ndarray]`` on the same program; :func:`make_executor` is the one
place that picks the implementation.
"""
from __future__ import annotations

import time

import numpy as np

from .. import env
from ..errors import PolycError
from ..kernel import packed_array
from .native import NativeExecutor
from .steps import ArenaPool, Program, constant_params, new_arena, scratch_name


class PythonExecutor:
    """Calls each kernel from Python in order; intermediates and the kernels' temporaries live in one
    preallocated arena.

    Thread-safe: concurrent ``run`` calls each take their own arena from an :class:`ArenaPool` (a new one is
    allocated when every arena is in use), so they never share intermediates or temporaries.
    """

    def __init__(self, program: Program, progress: bool = False, compile_step=None):
        """JIT-compile each distinct kernel of ``program`` (see :meth:`Step.compile`; a tqdm bar with
        ``progress``), pack the constants they read packed, once, and lay out the arena.
        ``compile_seconds`` maps a def's source to its JIT seconds. ``compile_step(step, constants)``: what
        gives each step's compiled kernel (default ``step.compile(constants)``; a model with symbolic dims
        hands its generic kernels, :mod:`polyc.onnx.dynamic`)."""
        self.program = program
        self.arenas = ArenaPool(self._workspace)
        self.constants = {k: np.ascontiguousarray(v) for k, v in program.constants.items()}
        self.compile_seconds = {}
        steps = program.steps
        if progress:
            from tqdm import tqdm
            steps = tqdm(steps, desc="compiling kernels", unit="kernel", leave=False)
        self.compiled, self.packed, packed_by = {}, {}, {}
        for step in steps:
            t = time.perf_counter()
            roots = [program.plan.root(name) for name in step.inputs]
            constants = constant_params(program, step)
            compiled = self.compiled[step.group] = \
                step.compile(constants) if compile_step is None else compile_step(step, constants)
            for j, (spec, root) in enumerate(zip(compiled.inputs, roots)):
                if spec.packed:  # one packed copy per constant and layout, shared by the steps that read it
                    key = (root, spec.shape, spec.packed, spec.packed_order)
                    if key not in packed_by:
                        packed_by[key] = packed_array(self.constants[root].reshape(spec.shape), spec.packed,
                                                      spec.packed_order)
                    self.packed[(step.group, j)] = packed_by[key]
            source = step.kernel.source
            self.compile_seconds[source] = self.compile_seconds.get(source, 0.0) + time.perf_counter() - t

    def _workspace(self) -> dict:
        """A fresh arena's views: ``{"views": root tensor -> array, "temps": group -> [arrays]}``."""
        arena = new_arena(self.program.plan)
        views = {}
        for name, offset in self.program.plan.offsets.items():
            info = self.program.tensors[name]
            dtype = np.dtype(info.dtype)
            count = int(np.prod(info.shape, dtype=np.int64))
            views[name] = arena[offset:offset + count * dtype.itemsize].view(dtype).reshape(info.shape)
        temps = {step.group: [views[scratch_name(step.group, k)] for k in range(len(step.temps))]
                 for step in self.program.steps}
        return {"arena": arena, "views": views, "temps": temps}

    def _array(self, name: str, feeds: dict, views: dict) -> np.ndarray:
        plan = self.program.plan
        root = plan.root(name)
        info = self.program.tensors.get(name)
        if root in views and info is not None and info.nbytes < views[root].nbytes:  # a block of a Concat view
            offset = plan.byte_offset(name)
            raw = views[root].reshape(-1).view(np.uint8)[offset:offset + info.nbytes]
            return raw.view(np.dtype(info.dtype)).reshape(info.shape)
        if root in views:
            base = views[root]
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

        With a ``profile`` dict, each step's seconds are added under its group name. Safe to call from
        several threads at once (each run leases its own arena).
        """
        with self.arenas.lease() as ws:
            views, temps = ws["views"], ws["temps"]
            for step in self.program.steps:
                args = [self.packed.get((step.group, j)) for j in range(len(step.inputs))]
                args = [a if a is not None else self._array(t, feeds, views) for a, t in zip(args, step.inputs)]
                outs = [self._array(t, feeds, views) for t in step.outputs]
                pointers = [a.ctypes.data for a in args] + [o.ctypes.data for o in outs] + \
                    [t.ctypes.data for t in temps[step.group]]
                compiled = self.compiled[step.group]
                if profile is None:
                    compiled.run_pointers(pointers)
                else:
                    t = time.perf_counter()
                    compiled.run_pointers(pointers)
                    profile[step.group] = profile.get(step.group, 0.0) + time.perf_counter() - t
            results = []
            for name in self.program.outputs:
                value = self._array(name, feeds, views)
                results.append(np.array(value, copy=True).reshape(self.program.tensors[name].shape))
        return results


def make_executor(program: Program, native: bool | None = None, progress: bool = False):
    """The executor for ``program``: the native one (every kernel linked into one program, one native
    call per run; :mod:`polyc.onnx.native`), or the Python-driven one with ``native=False`` or
    ``POLYC_EXECUTOR=python`` (for debugging: it JIT-compiles each kernel on its own and can time each).
    ``progress`` shows a tqdm bar while kernels compile."""
    if native is None:
        native = not env.python_executor()
    if native and program.steps:
        return NativeExecutor(program, progress=progress)
    return PythonExecutor(program, progress=progress)
