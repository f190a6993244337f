"""Native programs: many kernels linked into one LLVM module with a generated entry point — a whole model
as one native call.

``link_program(name, kernels, calls, n_slots)`` compiles each kernel through the pipeline
(:func:`polyc.pipeline.lower`, :func:`~polyc.pipeline.emit`) into an object of its own — in worker processes
at once when there are many (:mod:`polyc.runtime.workers`) — adds an entry ``i32 @name(ptr buffers)`` that
makes the :class:`KernelCall` s in order (:func:`polyc.codegen.emit_entry`) and loads the objects linked
together (:func:`polyc.codegen.load_objects`); the objects are cached on disk, per kernel and per program.
The ONNX executor (:mod:`polyc.onnx.native`) is its user.
"""
from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass

import numpy as np

from . import debug, env
from .codegen import compile_object, emit_entry, load_objects, new_module
from .errors import ShapeError
from .kernel import Kernel, status_error, tuned_options
from .lang.ast import itemsize
from .options import Options
from .pipeline import COMPILE_LOCK, emit, lower, resolve_options
from .poly import schedule as schedule_module
from .poly.build import input_shapes
from .poly.promote import packed_array
from .runtime import cache
from .runtime.workers import run_jobs
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
    ``source`` (elements of ``itemsize`` bytes, read as ``shape``) in panels of ``block``, the middle
    dimensions in ``order`` (:func:`~polyc.poly.promote.packed_array`)."""

    source: int
    shape: tuple
    itemsize: int
    block: int
    order: tuple = ()

    def pack(self, constant: np.ndarray) -> np.ndarray:
        """The packed copy of ``constant`` (the array at slot ``source``: its bytes, in any shape; packing
        moves whole elements, so they are handled as unsigned integers of the same size)."""
        values = np.ascontiguousarray(constant).reshape(-1).view(np.uint8)
        return packed_array(values.view(np.dtype(f"u{self.itemsize}")).reshape(self.shape), self.block, self.order)


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

    Each distinct kernel is compiled once to an object of its own, by worker processes at once when there are
    many (:func:`compile_processes`), and the objects are linked with the entry's when loaded;
    ``on_kernel(index, seconds)``, when given, is called for each kernel in order once it is compiled (0
    seconds for one from the disk cache), so on an error the kernels reported so far are the ones that
    succeeded. Each kernel's object is cached on disk under a key over its source, def, sizes, constants,
    the options and the target; the whole program's objects under a key over every kernel's source, def,
    sizes, the options, the calls, the constant slots and the target: a hit skips the compiler entirely and
    reports no kernel. Raises what the pipeline raises, CompileError when a compile worker dies.

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


@dataclass(frozen=True)
class KernelJob:
    """One kernel of a program to compile to an object on its own (:func:`compile_kernel_object`); plain data
    that crosses to a compile worker process: the def's ``source`` and ``name``, its ``sizes`` (sorted
    ``(size, extent)`` pairs), the ``constants`` it may read packed, the resolved ``options``, the ``target``,
    the ``symbol`` its function gets, whether the verifier runs between stages and whether the object goes
    into a shared library (position-independent code)."""

    source: str
    name: str
    sizes: tuple
    constants: frozenset
    options: Options
    target: object
    symbol: str
    verify: bool
    shared: bool = False


@dataclass(frozen=True)
class KernelObject:
    """A kernel compiled to a relocatable object: ``object_code`` defines ``i32 @symbol(ptr args)``;
    ``packed`` lists ``(argument index, shape, itemsize, block, order)`` of the inputs it reads packed; ``fallback``
    says the scheduler's time box cut a run short while compiling it (such an object is not cached)."""

    object_code: bytes
    packed: tuple
    fallback: bool
    seconds: float


def compile_kernel_object(job: KernelJob, kernel: Kernel | None = None) -> KernelObject:
    """Lower, emit and compile ``job`` into a module of its own (``kernel``: the job's kernel when this process
    has it, so its parse and its Scop are reused). Runs in a compile worker or in this process; raises what
    the pipeline raises."""
    started = time.perf_counter()
    cut_before = schedule_module.cut_off
    sizes = dict(job.sizes)
    if kernel is None:
        kernel = Kernel(job.source, job.name, job.options)
    lowered = lower(kernel.checked, sizes, job.options, job.target, job.constants, kernel.take_scop(sizes),
                    verify=job.verify)
    module = new_module(job.target)
    emit(module, lowered, job.symbol, job.target, job.options)
    object_code = compile_object(module, job.target, job.options.opt_level, job.options.unroll != 0,
                                 shared=job.shared)
    shapes = input_shapes(kernel.checked, sizes)  # a packed input's Scop shape is its packed one
    packed = tuple((j, shapes[t.name], itemsize(t.dtype), t.packed, t.packed_order)
                   for j, t in enumerate(lowered.scop.tensors) if t.packed)
    return KernelObject(object_code, packed, schedule_module.cut_off != cut_before,
                        time.perf_counter() - started)


def compile_processes(count: int) -> int:
    """How many processes compile ``count`` kernels: ``POLYC_COMPILE_JOBS``, else the target's usable cores;
    1 (this process) below :data:`PARALLEL_MIN_KERNELS` kernels or while a debug level or stage timing asks
    for the stages' output in order."""
    if count < PARALLEL_MIN_KERNELS or debug.level() > 0 or env.time_stages():
        return 1
    return min(count, env.compile_jobs() or host_target().cores)


#: Fewer kernels to compile than this and a program compiles them in this process: starting the worker
#: processes (once per process, about 0.3 s each) and their first compile would cost more than they save.
PARALLEL_MIN_KERNELS = 8


@dataclass(frozen=True)
class ProgramObjects:
    """A program compiled to relocatable objects (:func:`program_objects`): ``objects[0]`` defines the entry
    ``i32 @name(ptr buffers)``, the others one kernel each (``symbols[i]``: kernel ``i``'s function);
    ``packed``: the slots added for constants read packed (:class:`PackedSlot`); ``compiled``: how many
    kernels were compiled (the others came from the disk cache); ``from_cache``: the whole program did."""

    name: str
    objects: tuple
    symbols: tuple
    packed: tuple
    compiled: int
    from_cache: bool


def program_objects(name: str, kernels, calls, n_slots: int, options: Options, on_kernel=None,
                    constant_slots: frozenset = frozenset(), shared: bool = False) -> ProgramObjects:
    """The objects of :func:`link_program` (its arguments), without loading them: for this process's JIT, or
    (``shared``) position-independent ones for a shared library (:mod:`polyc.export`). Call under
    :data:`~polyc.pipeline.COMPILE_LOCK`.

    Each kernel is compiled to an object of its own (:func:`compile_kernel_object`), looked up first in the
    disk cache under a key over its def, sizes, constants, options and target (so models sharing a kernel, or
    a model compiled again after a change, compile only what is new); the misses are compiled by worker
    processes at once (:func:`polyc.runtime.workers.run_jobs`, :func:`compile_processes` of them). The entry
    point is a module of its own calling the kernels' symbols."""
    target = host_target()
    options = resolve_options(options, target)
    constant_inputs = [_constant_inputs(k, index, calls, constant_slots) for index, (k, _) in enumerate(kernels)]
    chosen = [tuned_options(k.source, k.name, sizes, target, options, constants) if k.records else options
              for (k, sizes), constants in zip(kernels, constant_inputs)]  # a kernel's tuning record, if any
    described = [(k.source, k.name, sorted(sizes.items()), o.to_spec()) for (k, sizes), o in zip(kernels, chosen)]
    layout = [(c.kernel, c.args) for c in calls]
    key = cache.make_key("program", name, described, layout, n_slots, sorted(constant_slots),
                         options.to_spec(), target.key(), shared)
    jobs = []
    for (k, sizes), opts, constants in zip(kernels, chosen, constant_inputs):
        job_key = cache.make_key("kernel object", k.source, k.name, sorted(sizes.items()), sorted(constants),
                                 opts.to_spec(), target.key(), shared)
        jobs.append((job_key, KernelJob(k.source, k.name, tuple(sorted(sizes.items())), constants, opts, target,
                                        f"polyc.{k.name}.{job_key[:16]}", env.verify(), shared)))
    symbols = tuple(job.symbol for _, job in jobs)

    def decode(entry) -> ProgramObjects:
        blob, objects = entry["objects"], []
        for size in entry["sizes"]:
            objects.append(blob[:size])
            blob = blob[size:]
        packed = tuple(PackedSlot(s, tuple(shape), size, block, tuple(order[0]) if order else ())
                       for s, shape, size, block, *order in entry["packed"])
        return ProgramObjects(name, tuple(objects), symbols, packed, 0, True)

    found = cache.fetch(key, decode, f"program {name}")
    if found is not None:
        return found
    started = time.perf_counter()
    results: dict[str, KernelObject] = {}  # job key -> its object (identical kernels compile once)
    todo = {}
    for index, (job_key, job) in enumerate(jobs):
        if job_key in results or job_key in todo:
            continue
        hit = cache.fetch(job_key, lambda e: KernelObject(e["object"], tuple(
            (j, tuple(shape), size, block, tuple(order[0]) if order else ())
            for j, shape, size, block, *order in e["packed"]), False, 0.0),
            f"object of kernel {job.name}")
        if hit is not None:
            results[job_key] = hit
        else:
            todo[job_key] = index
    processes = compile_processes(len(todo))
    work = [jobs[i][1] for i in todo.values()]
    if processes > 1:
        for i in todo.values():  # the workers build their own: drop the Scops signature() kept
            kernels[i][0].take_scop(dict(jobs[i][1].sizes))
        compiled = run_jobs(compile_kernel_object, work, processes)
    else:
        compiled = (compile_kernel_object(job, kernels[i][0]) for job, i in zip(work, todo.values()))
    fallback = False
    for index, (job_key, _) in enumerate(jobs):  # in kernel order, as the contract of on_kernel says
        seconds = 0.0  # a kernel from the disk cache, or one identical to an earlier one
        if todo.get(job_key) == index:
            result = results[job_key] = next(compiled)
            seconds, fallback = result.seconds, fallback or result.fallback
            if not result.fallback:
                cache.store(job_key, {"object": result.object_code, "packed": [list(p) for p in result.packed]})
        if on_kernel is not None:
            on_kernel(index, seconds)
    packed_slots: dict = {}  # PackedSlot -> its slot
    entry_calls = []
    for c in calls:
        args = list(c.args)
        for j, shape, size, block, *order in results[jobs[c.kernel][0]].packed:
            slot = PackedSlot(args[j][0], tuple(shape), size, block, tuple(order[0]) if order else ())
            args[j] = (packed_slots.setdefault(slot, n_slots + len(packed_slots)), 0)
        entry_calls.append((symbols[c.kernel], args))
    module = new_module(target)
    emit_entry(module, name, entry_calls, external=True)
    objects = [compile_object(module, target, options.opt_level, options.unroll != 0, frozenset(symbols), shared)]
    objects += [results[k].object_code for k in dict.fromkeys(k for k, _ in jobs)]
    packed = tuple(packed_slots)
    if not fallback:  # see polyc.poly.schedule.cut_off
        cache.store(key, {"objects": b"".join(objects), "sizes": [len(o) for o in objects],
                          "packed": [(p.source, list(p.shape), p.itemsize, p.block, list(p.order)) for p in packed]})
    debug.log(f"program {name}: {len(kernels)} kernels ({len(todo)} compiled, in {processes} "
              f"process{'es' if processes > 1 else ''}) in {(time.perf_counter() - started):.2f} s"
              + (f", {len(packed)} constants packed once" if packed else ""))
    return ProgramObjects(name, tuple(objects), symbols, packed, len(todo), False)


def _link_program(name: str, kernels, calls, n_slots: int, options: Options, on_kernel,
                  constant_slots: frozenset) -> NativeProgram:
    """:func:`link_program` under the compile lock: :func:`program_objects`, then MCJIT loads the objects
    linked together."""
    made = program_objects(name, kernels, calls, n_slots, options, on_kernel, constant_slots)
    load = (host_target(), (name, *made.symbols))
    jit = load_objects(made.objects, *load) if made.from_cache else \
        debug.StageLogger()("link", load_objects, made.objects, *load, show=lambda _: None)
    return NativeProgram(name, jit, made.symbols, n_slots, made.from_cache, made.packed)
