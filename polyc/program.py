"""Native programs: many kernels linked into one LLVM module with a generated entry point — a whole model
as one native call.

``link_program(name, kernels, calls, n_slots)`` lowers each kernel through the pipeline
(:func:`polyc.pipeline.lower`, :func:`~polyc.pipeline.emit`) into one shared module, adds the entry
``i32 @name(ptr buffers)`` that makes the :class:`KernelCall` s in order (:func:`polyc.codegen.emit_entry`),
JIT-compiles the module once and caches its object code on disk. The ONNX executor
(:mod:`polyc.onnx.native`) is its user.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import numpy as np

from . import debug
from .codegen import compile_module, emit_entry, load_object, new_module
from .errors import ShapeError
from .kernel import Kernel, status_error
from .lang.ast import itemsize
from .options import Options
from .pipeline import COMPILE_LOCK, emit, lower, resolve_options
from .poly import schedule as schedule_module
from .poly.build import input_shapes
from .poly.promote import packed_array
from .runtime import cache
from .target import host_target


@dataclass(frozen=True)
class KernelCall:
    """One call of a linked program: kernel ``kernel`` (an index into the program's kernels) with, per tensor
    of its signature, ``(slot, byte offset)``: the base pointer ``buffers[slot]`` plus the offset."""

    kernel: int
    args: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class PackedSlot:
    """A buffer slot a linked program adds for a constant some kernel reads packed: the values of slot
    ``source`` (elements of ``itemsize`` bytes, read as ``shape``) in panels of ``block``
    (:func:`~polyc.poly.promote.packed_array`)."""

    source: int
    shape: tuple
    itemsize: int
    block: int

    def pack(self, constant: np.ndarray) -> np.ndarray:
        """The packed copy of ``constant`` (the array at slot ``source``: its bytes, in any shape; packing
        moves whole elements, so they are handled as unsigned integers of the same size)."""
        values = np.ascontiguousarray(constant).reshape(-1).view(np.uint8)
        return packed_array(values.view(np.dtype(f"u{self.itemsize}")).reshape(self.shape), self.block)


class NativeProgram:
    """Kernels linked into one LLVM module with a generated entry point that calls them in order.

    ``run(buffers)`` takes one base pointer (int) per slot; a kernel fault raises KernelRuntimeError naming
    the kernel. ``from_cache`` says whether the object code came from the disk cache. ``packed`` lists the
    slots the program added after the caller's (:class:`PackedSlot`: slot ``n_slots - len(packed) + i``),
    which the caller fills once with ``packed[i].pack(constant)``.
    """

    def __init__(self, name: str, jit, kernel_names: tuple[str, ...], n_slots: int, from_cache: bool,
                 packed: tuple = ()):
        self.name = name
        self._jit = jit
        self.kernel_names = kernel_names
        self.n_slots = n_slots + len(packed)
        self.packed = packed
        self.from_cache = from_cache
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(jit.address(name))
        self._table = ctypes.c_void_p * max(1, self.n_slots)

    def run(self, buffers) -> None:
        """Run every call; ``buffers`` are the slots' base addresses (ints). Thread-safe when concurrent
        calls pass disjoint writable buffers (the slot table is built per call)."""
        if len(buffers) != self.n_slots:
            raise ShapeError(f"program '{self.name}' takes {self.n_slots} buffers, got {len(buffers)}")
        table = self._table(*buffers)
        status = self._fn(ctypes.addressof(table))
        if status != 0:
            raise status_error(f"program '{self.name}'", status)


def link_program(name: str, kernels, calls, n_slots: int, options: Options | None = None,
                 on_kernel=None, constant_slots: frozenset = frozenset()) -> NativeProgram:
    """Compile ``kernels`` (``[(Kernel, sizes), ...]``) into one module whose entry ``@name(ptr buffers)``
    makes ``calls`` (:class:`KernelCall`) in order — a whole model as one native call.

    Each kernel is lowered once, straight into the shared module (no kernel is JIT-compiled on its own), in
    the order given; ``on_kernel(index, seconds)``, when given, is called after kernel ``index`` is lowered
    and emitted (so on an error, the kernels reported so far are the ones that succeeded). The object code
    is cached on disk under a key over every kernel's source, def, sizes, the options, the calls, the
    constant slots and the target; a hit skips the compiler entirely and reports no kernel. Raises what the
    pipeline raises.

    ``constant_slots``: slots whose contents never change (a model's weights). A kernel input that is at
    offset 0 of a constant slot in every call of that kernel is packed once instead of per call where the
    strategy packs it: the program reads it from a slot of its own (:attr:`NativeProgram.packed`).
    """
    with COMPILE_LOCK:
        return _link_program(name, kernels, calls, n_slots, options or Options(), on_kernel,
                             frozenset(constant_slots))


def _constant_inputs(kernel: Kernel, index: int, calls, constant_slots: frozenset) -> frozenset:
    """Names of the inputs of kernel ``index`` at offset 0 of a constant slot in every call of it."""
    mine = [c for c in calls if c.kernel == index]
    return frozenset(t.name for j, t in enumerate(kernel.checked.tensors) if t.role == "input" and mine and all(
        c.args[j][0] in constant_slots and c.args[j][1] == 0 for c in mine))


def _link_program(name: str, kernels, calls, n_slots: int, options: Options, on_kernel,
                  constant_slots: frozenset) -> NativeProgram:
    """:func:`link_program` under the compile lock."""
    target = host_target()
    options = resolve_options(options, target)
    described = [(k.source, k.name, sorted(sizes.items())) for k, sizes in kernels]
    layout = [(c.kernel, c.args) for c in calls]
    key = cache.make_key("program", name, described, layout, n_slots, sorted(constant_slots),
                         options.to_spec(), target.key())
    symbols = tuple(f"{name}.k{i}.{k.name}" for i, (k, _) in enumerate(kernels))

    def decode(entry) -> NativeProgram:
        jit = load_object(entry["object"], target, (name,))
        packed = tuple(PackedSlot(s, tuple(shape), size, block) for s, shape, size, block in entry["packed"])
        return NativeProgram(name, jit, symbols, n_slots, True, packed)

    found = cache.fetch(key, decode, f"program {name}")
    if found is not None:
        return found
    started = time.perf_counter()
    cut_before = schedule_module.cut_off
    module = new_module(target)
    packed_slots: dict = {}  # PackedSlot -> its slot
    blocks = []  # per kernel: {argument index: (shape, dtype, block)} of the inputs it reads packed
    for index, (symbol, (k, sizes)) in enumerate(zip(symbols, kernels)):
        t = time.perf_counter()
        constants = _constant_inputs(k, index, calls, constant_slots)
        lowered = lower(k.checked, sizes, options, target, constants, k.take_scop(sizes))
        emit(module, lowered, symbol, target, options)
        shapes = input_shapes(k.checked, sizes)  # a packed input's Scop shape is its packed one
        blocks.append({j: (shapes[t.name], itemsize(t.dtype), t.packed)
                       for j, t in enumerate(lowered.scop.tensors) if t.packed})
        if on_kernel is not None:
            on_kernel(index, time.perf_counter() - t)
    entry_calls = []
    for c in calls:
        args = list(c.args)
        for j, (shape, size, block) in blocks[c.kernel].items():
            slot = PackedSlot(args[j][0], shape, size, block)
            args[j] = (packed_slots.setdefault(slot, n_slots + len(packed_slots)), 0)
        entry_calls.append((symbols[c.kernel], args))
    emit_entry(module, name, entry_calls)
    jit = debug.StageLogger()("link", compile_module, str(module), target, options.opt_level,
                                   options.unroll != 0, show=lambda _: None)
    packed = tuple(packed_slots)
    if schedule_module.cut_off == cut_before:  # see polyc.poly.schedule.cut_off
        cache.store(key, {"object": jit.object_code,
                          "packed": [(p.source, list(p.shape), p.itemsize, p.block) for p in packed]})
    debug.log(f"program {name}: {len(kernels)} kernels linked in {(time.perf_counter() - started):.2f} s"
              + (f", {len(packed)} constants packed once" if packed else ""))
    return NativeProgram(name, jit, symbols, n_slots, False, packed)
