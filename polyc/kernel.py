"""``define`` / ``Kernel``: specialise a definition on shapes, run the one pipeline function, cache, call.

    >>> matmul = polyc.define('''
    ... def matmul(float(M,K) A, float(K,N) B) -> (C) {
    ...     C(m,n) +=! A(m,k) * B(k,n)
    ... }''')
    >>> C = matmul(A, B)                  # compiled for these shapes/dtypes on the first call, cached after
    >>> print(matmul.specialize(A, B).stage("ast"))

Arrays are C-contiguous numpy arrays (other layouts are copied). Outputs and temporaries are allocated by
polyc and zero-initialised, so ``+=`` without ``!`` accumulates onto zeros (onto ``out=``'s contents when
given). An ``out=`` array that overlaps an input is computed into a temporary and copied back, as numpy's
ufuncs do, so ``k(a, out=a)`` is correct.

Element types are numpy's; a ``half`` (float16) tensor is a ``np.float16`` array and a ``bfloat16`` one an
array of ``ml_dtypes.bfloat16`` (numpy has no bfloat16; ``a.view(ml_dtypes.bfloat16)`` reinterprets uint16
bits). Both are storage types computed in float32 (see :mod:`polyc.lang.ast`).

Thread safety: a :class:`Kernel` and a :class:`Compiled` may be called from several threads at once. Compiling
(the pipeline, isl and LLVM) is serialized by one process-wide lock; a first call racing another compiles
once and both use the result. Running compiled code takes no lock.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import os
import time

import numpy as np

from . import debug
from .codegen import compile_module, load_object
from .errors import KernelRuntimeError, PolycError, ShapeError, UnsupportedError
from .lang import ast as L
from .lang import check_def, parse
from .lang.einsum import einsum_source
from .lang.grad import grad_def
from .lang.sema import numpy_dtype
from .options import Options
from .pipeline import COMPILE_LOCK, Stages, compile_kernel, resolve_options, symbol
from .poly import schedule as schedule_module
from .poly.affine import SIZE_MAX, Sym, constant_value, isl_name
from .poly.build import build_scop, checked_reads, input_shapes
from .poly.promote import packed_array
from .runtime import cache, records
from .target import host_target


def status_error(where: str, status: int, reads=()):
    """The KernelRuntimeError for a non-zero kernel status: 1 an index checked at run time (data-dependent
    or non-affine) was out of range — ``reads`` lists the checked reads (``"A(i*i) at 1:36"``) when known —,
    2 no memory for a kernel-owned buffer (a packed operand or a summation shadow)."""
    if status == 2:
        return KernelRuntimeError(f"{where}: out of memory allocating a kernel buffer (status 2)",
                                  hint="free memory, or compile with Options(promote=False)")
    which = f"; the reads checked at run time are {', '.join(reads)}" if reads else ""
    return KernelRuntimeError(f"{where}: an index is out of range (status {status}){which}",
                              hint="check the index tensors' values and the index expressions against "
                                   "the tensors' shapes")


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """A kernel argument: name, numpy dtype name, shape (elements), role (input/output/temp); ``packed``:
    the panel width when the kernel reads this input packed (:func:`polyc.poly.promote.packed_array` of an
    array of ``shape``), else 0; ``packed_order``: the order of the packed layout's middle dimensions, ``()``
    for their own."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    role: str
    packed: int = 0
    packed_order: tuple = ()


class Compiled:
    """A kernel specialised on shapes and dtypes, compiled to native code.

    ``tensors`` is the native argument order (inputs, outputs, temporaries). ``stage(name)`` prints a stage;
    for an entry loaded from the disk cache the stages are rebuilt on first request. ``constants``: the
    inputs it was compiled to take packed where the strategy packs them (``TensorSpec.packed``): a call
    packs them (:meth:`__call__`), a caller of :meth:`run_pointers` passes them packed.
    """

    def __init__(self, kernel: "Kernel", sizes: dict, options: Options, tensors, jit, stages=None,
                 constants: frozenset = frozenset(), size_args: tuple = (), restage=None):
        """``size_args``: for a generic kernel's code, the value of each of its parameters (int64, in
        ``Scop.params`` order), passed after the tensors; ``restage``: what builds the stages again when
        ``stages`` is None (default: the pipeline at ``sizes``)."""
        self.kernel = kernel
        self.sizes = dict(sizes)
        self.options = options
        self.constants = frozenset(constants)
        self.tensors = tuple(tensors)
        self._jit = jit
        self._stages = stages
        self.name = kernel.checked.name
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(jit.address(symbol(self.name)))
        self.inputs = tuple(t for t in self.tensors if t.role == "input")
        self.outputs = tuple(t for t in self.tensors if t.role == "output")
        self.temps = tuple(t for t in self.tensors if t.role == "temp")
        self._size_args = np.array(size_args, dtype=np.int64) if size_args else None
        self._restage = restage

    @property
    def stages(self) -> Stages:
        """Every stage of the compilation. A kernel loaded from the disk cache holds only its machine code:
        on the first request its stages are built again through the pipeline, once (said at
        ``POLYC_DEBUG=1``); the code it runs stays the cached one."""
        with COMPILE_LOCK:
            if self._stages is None:
                debug.log(f"{self.name} {self.sizes}: loaded from the disk cache; compiling again to show its "
                          "stages")
                self._stages = self._restage() if self._restage is not None else compile_kernel(
                    self.kernel.checked, self.sizes, self.options, self.kernel.target, self.constants,
                    compile_ir=self.kernel.compile_ir)
        return self._stages

    def stage(self, name: str) -> str:
        """The text of one stage (see :data:`polyc.pipeline.STAGES`)."""
        return self.stages.text(name)

    @property
    def output_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(t.shape for t in self.outputs)

    def run_pointers(self, pointers) -> None:
        """Call the native kernel on raw data pointers (``tensors`` order). Raises KernelRuntimeError."""
        extra = [self._size_args.ctypes.data] if self._size_args is not None else []
        args = (ctypes.c_void_p * (len(pointers) + len(extra)))(*pointers, *extra)
        status = self._fn(ctypes.addressof(args))
        if status != 0:
            reads = checked_reads(build_scop(self.kernel.checked, self.sizes)) if status == 1 else ()
            raise status_error(f"kernel '{self.name}'", status, reads)

    def _checked_inputs(self, args) -> list[np.ndarray]:
        """``args`` coerced to the inputs' dtypes; ShapeError naming an argument of another shape."""
        arrays = self.kernel._coerce_inputs(args)
        for a, t in zip(arrays, self.inputs):
            if a.shape != t.shape:
                raise ShapeError(f"argument '{t.name}': this kernel was compiled for shape {list(t.shape)}, "
                                 f"got {list(a.shape)}", hint="call the Kernel, which compiles per shape")
        return arrays

    def _packed(self, arrays) -> list[np.ndarray]:
        """``arrays`` (the inputs), those this kernel takes packed copied into their packed layout."""
        return [packed_array(a, t.packed, t.packed_order) if t.packed else a for a, t in zip(arrays, self.inputs)]

    def arguments(self, *args) -> list[np.ndarray]:
        """The arrays :meth:`run_pointers` takes for inputs ``args`` (as for :meth:`__call__`): the inputs
        coerced, those compiled as constants packed (:attr:`constants`), then fresh outputs and zeroed
        temporaries; pass ``[a.ctypes.data for a in arrays]`` and keep the arrays alive meanwhile. For calling
        a kernel repeatedly on the same inputs without packing them each time (timing it as a model's executor
        runs it). Raises ShapeError as :meth:`__call__`."""
        arrays = self._checked_inputs(args)
        check_memory(self.name, self.outputs + self.temps)
        packed = self._packed(arrays)
        return packed + [_zeros(t) for t in self.outputs] + [_zeros(t) for t in self.temps]

    def __call__(self, *args, out=None):
        """Run on ``args`` (numpy arrays of the shapes and dtypes this kernel was compiled for; 0-d inputs
        also take Python scalars). Returns the output, or a tuple in the ``-> (...)`` order; with ``out=``
        (an array or a sequence, one per output, C-contiguous and writeable) fills and returns those.

        Raises ShapeError naming the argument for a wrong count, shape or dtype, an out-of-range scalar,
        ``out=`` arrays that overlap each other, or outputs and temporaries too large for this machine's
        memory; KernelRuntimeError when the kernel detects a fault (a gather index out of range).
        """
        arrays = self._checked_inputs(args)
        check_memory(self.name, (self.outputs if out is None else ()) + self.temps)
        outs = _prepare_outputs(self.outputs, out)
        targets = list(outs)
        if out is not None:  # an out= array overlapping an input: compute into a copy, then copy back
            for k, o in enumerate(outs):
                if any(np.may_share_memory(o, a) for a in arrays):
                    targets[k] = o.copy()
        temps = [_zeros(t) for t in self.temps]
        arrays = self._packed(arrays)
        pointers = ([a.ctypes.data for a in arrays] + [o.ctypes.data for o in targets]
                    + [t.ctypes.data for t in temps])
        self.run_pointers(pointers)
        for o, target in zip(outs, targets):
            if target is not o:
                np.copyto(o, target)
        return outs[0] if len(outs) == 1 else tuple(outs)


def check_memory(name: str, specs) -> None:
    """Raise ShapeError, with the bytes needed, when the tensors ``specs`` (to be allocated for a call of
    kernel ``name``) cannot fit: one larger than the address space, or all together more than the
    machine's physical memory."""
    sizes = [(t, int(np.prod(t.shape, dtype=object)) * numpy_dtype(t.dtype).itemsize) for t in specs]
    total = sum(n for _, n in sizes)
    try:
        physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        physical = 1 << 62
    if total > min(physical, np.iinfo(np.intp).max):
        biggest, n = max(sizes, key=lambda tn: tn[1])
        raise ShapeError(f"kernel '{name}' needs {_bytes(total)} for its outputs and temporaries "
                         f"({biggest.role} '{biggest.name}' is {biggest.dtype}{list(biggest.shape)}, "
                         f"{_bytes(n)}); this machine has {_bytes(physical)} of memory",
                         hint="use smaller sizes")


def _bytes(n: int) -> str:
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit} ({n} bytes)"
    return f"{n} bytes"


def _zeros(t: "TensorSpec") -> np.ndarray:
    """A zeroed array for ``t``; ShapeError with the bytes needed when there is no memory for it."""
    try:
        return np.zeros(t.shape, numpy_dtype(t.dtype))
    except (MemoryError, ValueError):
        n = int(np.prod(t.shape, dtype=object)) * numpy_dtype(t.dtype).itemsize
        raise ShapeError(f"out of memory allocating {t.role} '{t.name}' ({t.dtype}{list(t.shape)}, "
                         f"{_bytes(n)})", hint="free memory or use smaller sizes") from None


def _prepare_outputs(specs, out):
    """The output arrays: new zeroed ones, or ``out=`` checked (count, shape, dtype, layout, no overlap)."""
    if out is None:
        return [_zeros(t) for t in specs]
    outs = [out] if isinstance(out, np.ndarray) else list(out)
    if len(outs) != len(specs):
        raise ShapeError(f"out= has {len(outs)} arrays; the kernel returns {len(specs)}")
    for o, t in zip(outs, specs):
        if not isinstance(o, np.ndarray) or o.shape != t.shape or o.dtype != numpy_dtype(t.dtype):
            got = f"{o.dtype}{list(o.shape)}" if isinstance(o, np.ndarray) else type(o).__name__
            raise ShapeError(f"out= for output '{t.name}': expected {t.dtype}{list(t.shape)}, got {got}")
        if not o.flags.c_contiguous or not o.flags.writeable:
            raise ShapeError(f"out= for output '{t.name}' must be a writeable C-contiguous array")
    for i in range(len(outs)):
        for j in range(i):
            if np.may_share_memory(outs[i], outs[j]):
                raise ShapeError(f"out= arrays for outputs '{specs[j].name}' and '{specs[i].name}' overlap",
                                 hint="give each output its own array")
    return outs


class Kernel:
    """A definition of the language, compiled per (shapes, dtypes, options) on demand.

    Raises ParseError/SemanticError/UnsupportedError at construction for a bad definition, ShapeError at
    call time for arguments that do not fit.
    """

    def __init__(self, source: str, name: str | None = None, options: Options | None = None,
                 filename: str = "<source>", records: bool = True):
        """``records``: compile with the best tuning record's options where there is one and the options are
        the defaults (:func:`tuned_options`); the tuner itself passes False."""
        self.source = source
        self.options = resolve_options(options or Options())  # POLYC_NUM_THREADS; the cores at compile time
        self.records = records
        self.target = host_target()
        try:
            program = parse(source, filename)
        except PolycError as exc:
            raise exc.with_source(source, filename) from None
        names = [d.name for d in program.defs]
        if not names:
            raise PolycError("the source defines no kernel; expected 'def NAME(...) -> (...) { ... }'")
        if name is None:
            if len(names) > 1:
                raise PolycError(f"the source defines {len(names)} kernels ({', '.join(names)}); "
                                 "pick one with name= (on the command line: --def NAME)")
            name = names[0]
        if name not in names:
            raise PolycError(f"no def named '{name}'; the source defines: {', '.join(names)}")
        defn = program.defs[names.index(name)]
        try:
            self.checked = check_def(defn, source)
        except PolycError as exc:
            raise exc.with_source(source, filename) from None
        self.name = name
        self._compiled: dict = {}
        self._signatures: dict = {}
        self._scops: dict = {}  # sizes → the Scop signature() built, until the pipeline takes it

    def __repr__(self) -> str:
        return f"<polyc.Kernel {self.name}>"

    # ---- binding arguments ----
    def _coerce_inputs(self, args) -> list[np.ndarray]:
        inputs = self.checked.inputs
        if len(args) != len(inputs):
            raise ShapeError(f"{self.name} takes {len(inputs)} arguments ({', '.join(t.name for t in inputs)}), "
                             f"got {len(args)}")
        arrays = []
        for value, t in zip(args, inputs):
            if not isinstance(value, np.ndarray):
                if t.dims:
                    raise ShapeError(f"argument '{t.name}' must be a numpy array of {t.dtype} with "
                                     f"{len(t.dims)} dimensions, got {type(value).__name__}")
                value = _scalar_array(value, t)
            want = numpy_dtype(t.dtype)
            if value.dtype != want:
                if value.ndim == 0 and not t.dims and (
                        value.dtype.kind in "biuf" and t.dtype in L.STORAGE_DTYPES
                        or np.can_cast(value.dtype, want, "same_kind")
                        or value.dtype.kind in "biu" and want.kind in "iu"):
                    value = _cast_scalar(value, t)
                else:
                    module = "ml_dtypes" if t.dtype == "bfloat16" else "np"
                    raise ShapeError(f"argument '{t.name}': expected dtype {t.dtype}, got {value.dtype}",
                                     hint=f"convert it with .astype({module}.{t.dtype})")
            if value.ndim != len(t.dims or ()):
                raise ShapeError(f"argument '{t.name}': expected {len(t.dims or ())} dimensions, "
                                 f"got shape {list(value.shape)}")
            arrays.append(value if value.flags.c_contiguous else np.ascontiguousarray(value))
        return arrays

    def bind_sizes(self, shapes) -> dict:
        """Size name → extent from the input shapes; raises ShapeError naming both tensors and the size when
        two inputs disagree, or the tensor and the dim when a literal extent differs."""
        sizes: dict = {}
        where: dict = {}
        for shape, t in zip(shapes, self.checked.inputs):
            for k, (extent, dim) in enumerate(zip(shape, t.dims or ())):
                if isinstance(dim.value, int):
                    if extent != dim.value:
                        raise ShapeError(f"argument '{t.name}' dimension {k} must be {dim.value}, got {extent}")
                elif dim.value in sizes and sizes[dim.value] != extent:
                    other, other_k = where[dim.value]
                    raise ShapeError(f"size '{dim.value}' is {sizes[dim.value]} in '{other}' (dimension "
                                     f"{other_k}) but {extent} in '{t.name}' (dimension {k})")
                else:
                    sizes[dim.value] = extent
                    where.setdefault(dim.value, (t.name, k))
        return sizes

    # ---- compiling ----
    def specialize(self, *arrays_or_shapes, options: Options | None = None) -> Compiled:
        """The kernel compiled for these input shapes (arrays, or shape tuples; 0-d inputs as ``()``)."""
        if len(arrays_or_shapes) != len(self.checked.inputs):
            raise ShapeError(f"{self.name} takes {len(self.checked.inputs)} arguments, "
                             f"got {len(arrays_or_shapes)}")
        shapes = []
        for a, t in zip(arrays_or_shapes, self.checked.inputs):
            shape = tuple(a) if isinstance(a, (tuple, list)) else np.shape(a)
            if len(shape) != len(t.dims or ()):
                raise ShapeError(f"argument '{t.name}': expected {len(t.dims or ())} dimensions, "
                                 f"got shape {list(shape)}")
            shapes.append(shape)
        return self.specialize_sizes(self.bind_sizes(shapes), options or self.options)

    def specialize_sizes(self, sizes: dict, options: Options | None = None,
                         constants: frozenset = frozenset()) -> Compiled:
        """The kernel compiled for the given sizes (size name → extent, every size of the def): from this
        kernel's memory, else the disk cache, else the pipeline. ``constants`` names inputs whose values the
        caller keeps between calls: where the strategy packs one, the kernel takes it packed
        (:class:`Compiled`). Thread-safe: concurrent first calls compile once. Raises ShapeError for a
        missing size, and what the pipeline raises."""
        sizes = self._every_size(sizes)
        options = options or self.options
        if options.generic:
            return self.generic(sizes, options).at(sizes)
        constants = frozenset(constants)
        key = (tuple(sorted(sizes.items())), options, constants)
        compiled = self._compiled.get(key)
        if compiled is not None:
            return compiled
        with COMPILE_LOCK:
            compiled = self._compiled.get(key)  # another thread may have compiled it while this one waited
            if compiled is None:
                compiled = self._compiled[key] = self._compile(sizes, options, constants)
        return compiled

    def _compile(self, sizes: dict, options: Options, constants: frozenset) -> Compiled:
        """:meth:`specialize_sizes` after a miss in memory: the disk cache or the pipeline."""
        options = resolve_options(options, self.target)
        if self.records:
            options = tuned_options(self.source, self.name, sizes, self.target, options, constants)
        disk_key = cache.make_key(self.source, self.name, sorted(sizes.items()), options.to_spec(),
                                  sorted(constants), self.target.key())
        t = time.perf_counter()

        def decode(entry) -> Compiled:
            jit = load_object(entry["object"], self.target, (symbol(self.name),))
            tensors = [TensorSpec(name, dtype, tuple(shape), role, packed, tuple(order[0]) if order else ())
                       for name, dtype, shape, role, packed, *order in entry["tensors"]]
            return Compiled(self, sizes, options, tensors, jit, constants=constants)

        compiled = cache.fetch(disk_key, decode, f"entry for {self.name}")
        if compiled is None:
            cut_before = schedule_module.cut_off
            stages = compile_kernel(self.checked, sizes, options, self.target, constants, self.take_scop(sizes),
                                    self.compile_ir)
            shapes = input_shapes(self.checked, sizes)  # a packed input's Scop shape is its packed one
            tensors = [TensorSpec(t.name, t.dtype, shapes[t.name] if t.packed else tuple(t.shape), t.role, t.packed,
                                  t.packed_order) for t in stages.scop.tensors if t.role != "local"]
            compiled = Compiled(self, sizes, options, tensors, stages.jit, stages, constants)
            if schedule_module.cut_off == cut_before:  # else a fallback of a loaded moment: not for good
                cache.store(disk_key, {"object": stages.jit.object_code,
                                       "tensors": [(t.name, t.dtype, t.shape, t.role, t.packed, list(t.packed_order))
                                                   for t in tensors]})
        debug.log(f"{self.name} {sizes}: ready in {(time.perf_counter() - t) * 1e3:.1f} ms "
                  f"({'disk cache' if compiled._stages is None else 'compiled'})")
        return compiled

    def generic(self, hint: dict, options: Options | None = None, fixed=()) -> "GenericCompiled":
        """The kernel compiled once for every size (``Options.generic``), deciding its schedule at the sizes
        ``hint`` (size name → extent): from this kernel's memory (the first hint asked for with these options
        and ``fixed`` stays), else the disk cache, else the pipeline. ``fixed`` names sizes that keep the
        hint's value (specialised, as a convolution's window: ``("KH", "KW")``); the kernel then serves the
        shapes with those values. Raises ShapeError for a missing size, and what the pipeline raises."""
        hint = self._every_size(hint)
        options = resolve_options((options or self.options).replace(generic=True), self.target)
        fixed = {n: hint[n] for n in self.checked.sizes if n in set(fixed)}
        key = ("generic", options, tuple(fixed.items()))
        found = self._compiled.get(key)
        if found is not None:
            return found
        with COMPILE_LOCK:
            found = self._compiled.get(key)
            if found is None:
                found = self._compiled[key] = self._compile_generic(hint, options, fixed)
        return found

    def _compile_generic(self, hint: dict, options: Options, fixed: dict) -> "GenericCompiled":
        t = time.perf_counter()
        sizes = symbolic_sizes(hint, fixed)
        disk_key = cache.make_key(self.source, self.name, "generic", sorted(hint.items()), sorted(fixed),
                                  options.to_spec(), self.target.key())
        compiled = cache.fetch(disk_key, lambda entry: GenericCompiled(
            self, hint, options, build_scop(self.checked, sizes),
            load_object(entry["object"], self.target, (symbol(self.name),)), fixed=fixed),
            f"generic entry for {self.name}")
        if compiled is None:
            stages = compile_kernel(self.checked, sizes, options, self.target, compile_ir=self.compile_ir)
            compiled = GenericCompiled(self, hint, options, stages.scop, stages.jit, stages, fixed)
            cache.store(disk_key, {"object": stages.jit.object_code})
        debug.log(f"{self.name}: generic kernel (hint {hint}) ready in {(time.perf_counter() - t) * 1e3:.1f} ms")
        return compiled

    def compile_ir(self, text: str, target, opt_level: int, unroll: bool):
        """:func:`~polyc.codegen.compile_module` behind the disk cache keyed by the LLVM IR text itself, a
        second tier under the kernel's key: option sets or shapes that lower to the same IR (a tile size
        larger than the loop, fusion options on a def with nothing to fuse) share one object instead of
        running LLVM again (Triton keys its kernel cache by the IR the same way). The loaded module makes its
        ``asm`` from ``text`` on demand."""
        key = cache.make_key("object", text, target.key(), opt_level, unroll)
        symbols = (symbol(self.name),)
        jit = cache.fetch(key, lambda entry: load_object(entry["object"], target, symbols, text, opt_level, unroll),
                          f"object of {self.name}")
        if jit is None:
            jit = compile_module(text, target, opt_level, unroll)
            cache.store(key, {"object": jit.object_code})
        return jit

    def take_scop(self, sizes: dict):
        """The Scop :meth:`signature` built for ``sizes``, handed over once (the pipeline starts from it, so
        a kernel whose signature was asked for first builds its Scop once), else None."""
        return self._scops.pop(tuple(sorted(sizes.items())), None)

    def _every_size(self, sizes: dict) -> dict:
        """``sizes`` as ints, one per size of the def in declaration order; ShapeError naming the missing."""
        missing = [n for n in self.checked.sizes if n not in sizes]
        if missing:
            raise ShapeError(f"{self.name}: no value for size {', '.join(missing)}",
                             hint="give every size, e.g. " + ",".join(f"{n}=64" for n in self.checked.sizes))
        return {n: int(sizes[n]) for n in self.checked.sizes}

    def signature(self, sizes: dict) -> tuple[TensorSpec, ...]:
        """The kernel's tensors for these sizes (inputs, outputs, temporaries; shapes from range inference)
        without compiling: parse, checks and the Scop only, or the disk cache (keyed like a kernel, without
        the options, which do not change the signature). Raises like :meth:`specialize_sizes`."""
        sizes = self._every_size(sizes)
        key = tuple(sorted(sizes.items()))
        found = self._signatures.get(key)
        if found is not None:
            return found
        with COMPILE_LOCK:
            found = self._signatures.get(key) or self._signature(sizes, key)
            self._signatures[key] = found
        return found

    def _signature(self, sizes: dict, key: tuple) -> tuple[TensorSpec, ...]:
        """:meth:`signature` after a miss in memory: the disk cache or the Scop (kept for the pipeline,
        :meth:`take_scop`)."""
        disk_key = cache.make_key("signature", self.source, self.name, key)
        found = cache.fetch(disk_key, lambda entry: tuple(TensorSpec(name, dtype, tuple(shape), role)
                                                          for name, dtype, shape, role in entry["tensors"]),
                            f"signature of {self.name}")
        if found is None:
            scop = self._scops[key] = build_scop(self.checked, sizes)
            found = tuple(TensorSpec(t.name, t.dtype, tuple(t.shape), t.role) for t in scop.tensors
                          if t.role != "local")
            cache.store(disk_key, {"tensors": [(t.name, t.dtype, t.shape, t.role) for t in found]})
        return found

    def __call__(self, *args, out=None, options: Options | None = None):
        """Run on numpy arrays (0-d parameters also take Python scalars), compiling for their shapes and
        ``options`` on first use; returns the output or a tuple in the ``-> (...)`` order, or fills ``out=``.
        Thread-safe. Raises ShapeError naming the argument (count, rank, extent, dtype, a scalar out of its
        dtype's range, outputs too large for memory), KernelRuntimeError for a fault the kernel detects."""
        arrays = self._coerce_inputs(args)
        compiled = self.specialize_sizes(self.bind_sizes([a.shape for a in arrays]), options or self.options)
        return compiled(*arrays, out=out)


def symbolic_sizes(hint: dict, fixed: dict) -> dict:
    """The sizes a generic kernel is built with: each size a :class:`~polyc.poly.affine.Sym` (an isl
    parameter with the hint's value) but those in ``fixed``, which stay ints."""
    return {n: v if n in fixed else Sym(v, isl_name(n)) for n, v in hint.items()}


class GenericCompiled:
    """A kernel compiled once for every size (``Options.generic``): its sizes are isl parameters
    (``[M, N, K] -> { S[m, n, k] : ... }``) and arguments of one native function. :meth:`at` gives the
    :class:`Compiled` for some sizes (the same code, the shapes of those sizes), and a call runs on arrays of
    any shapes the def accepts::

        mm = polyc.define(source, options=polyc.Options(generic=True))
        mm(A, B)                    # compiles once, deciding tiles at these shapes (the hint)
        mm(A2, B2)                  # any other shapes: the same code, no compile

    The code serves the sizes of its ``Scop.context``: each from 1 to
    :data:`polyc.poly.affine.SIZE_MAX`, with every inferred range non-empty. ``hint``: the sizes its
    decisions were taken at; ``stages``: the pipeline's stages (None when loaded from the disk cache)."""

    def __init__(self, kernel: Kernel, hint: dict, options: Options, scop, jit, stages=None, fixed=None):
        self.kernel = kernel
        self.hint = dict(hint)
        self.fixed = dict(fixed or {})
        self.options = options
        self.scop = scop
        self._stages = stages
        self._jit = jit
        self._at: dict = {}

    @property
    def stages(self) -> Stages:
        """The pipeline's stages; for code loaded from the disk cache, compiled again on first request (the
        code that runs stays the cached one)."""
        with COMPILE_LOCK:
            if self._stages is None:
                sizes = symbolic_sizes(self.hint, self.fixed)
                self._stages = compile_kernel(self.kernel.checked, sizes, self.options, self.kernel.target,
                                              compile_ir=self.kernel.compile_ir)
        return self._stages

    def __call__(self, *args, out=None):
        """Run on numpy arrays of any shapes the def accepts (see :meth:`Compiled.__call__`)."""
        arrays = self.kernel._coerce_inputs(args)
        return self.at(self.kernel.bind_sizes([a.shape for a in arrays]))(*arrays, out=out)

    def at(self, sizes: dict) -> Compiled:
        """The :class:`Compiled` running this code at ``sizes`` (size name → extent). Raises ShapeError when
        the sizes are outside what the kernel serves (an empty range, an extent above SIZE_MAX)."""
        sizes = self.kernel._every_size(sizes)
        key = tuple(sizes.items())
        found = self._at.get(key)
        if found is None and any(sizes[n] != v for n, v in self.fixed.items()):
            given = ", ".join(f"{n}={sizes[n]}" for n in self.fixed)
            want = ", ".join(f"{n}={v}" for n, v in self.fixed.items())
            raise ShapeError(f"{self.kernel.name}: this generic kernel was compiled for {want}, got {given}",
                             hint="compile another with Kernel.generic(sizes, fixed=...)")
        if found is None:
            shapes = self.shapes(sizes)
            tensors = [TensorSpec(t.name, t.dtype, shapes[t.name], t.role) for t in self.scop.tensors]
            found = Compiled(self.kernel, sizes, self.options, tensors, self._jit, self._stages,
                             size_args=tuple(sizes[p] for p in self.scop.params), restage=lambda: self.stages)
            self._at[key] = found
        return found

    def shapes(self, sizes: dict) -> dict[str, tuple[int, ...]]:
        """Each tensor's shape at ``sizes``: its extents (ints, and affine functions of the parameters,
        evaluated by isl). Raises ShapeError outside ``Scop.context``."""
        shapes = self.scop.shapes_at(sizes)
        if shapes is None:
            given = ", ".join(f"{n}={v}" for n, v in sizes.items())
            raise ShapeError(f"{self.kernel.name}: sizes {given} are outside what this generic kernel serves "
                             f"({self.scop.context})", hint="every inferred range must be non-empty and every "
                             f"size at most {SIZE_MAX}")
        return shapes


def tuned_options(source: str, name: str, sizes: dict, target, options: Options,
                  constants: frozenset = frozenset()) -> Options:
    """``options``, or, when they are the defaults (any thread count), the options of the best tuning record
    of the def ``name`` of ``source`` at ``sizes`` for ``target``, that thread count and the inputs taken as
    ``constants`` (:func:`polyc.runtime.records.best`: only a record that beat the default, made by this polyc
    version on this target). ``POLYC_TUNING_RECORDS=off`` turns records off."""
    if options.replace(threads=None) != Options():
        return options
    found = records.best(records.record_key(source, name, sizes, target, options.threads, constants))
    if found is None:
        return options
    try:
        tuned = Options.from_spec(found["options"]).replace(threads=options.threads)
    except (PolycError, KeyError, TypeError) as exc:
        debug.log(f"tuning records: record {found.get('key', '?')[:12]} has unusable options ({exc}); ignored")
        return options
    debug.log(f"{name} {sizes}: tuned options '{found['options']}' ({found['median'] * 1e3:.3f} ms when measured)")
    return tuned


def _scalar_array(value, t) -> np.ndarray:
    """A Python (or numpy) scalar for the 0-d parameter ``t`` as a 0-d array of its natural dtype; ShapeError
    naming ``t`` for anything that is not a number (a string, an object, an int beyond 64 bits)."""
    if isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, (str, bytes)):
        try:
            array = np.asarray(value)
        except OverflowError:
            array = None
        if array is not None and array.dtype.kind in "biuf":
            return array
    raise ShapeError(f"argument '{t.name}': expected a scalar of type {t.dtype} ({_range_of(t.dtype)}), "
                     f"got {type(value).__name__} {value!r:.40}")


def _cast_scalar(value: np.ndarray, t) -> np.ndarray:
    """The 0-d ``value`` as ``t.dtype``; ShapeError naming ``t`` and its range when an integer does not fit
    (numpy would wrap it silently)."""
    target = numpy_dtype(t.dtype)
    if target.kind in "iu" and value.dtype.kind in "iu":
        info = np.iinfo(target)
        if not info.min <= int(value) <= info.max:
            raise ShapeError(f"argument '{t.name}': {int(value)} does not fit in {t.dtype} "
                             f"({_range_of(t.dtype)})")
    return value.astype(target)


def _range_of(dtype: str) -> str:
    d = numpy_dtype(dtype)
    if d.kind in "iu":
        info = np.iinfo(d)
        return f"an integer in {info.min}..{info.max}"
    if d.kind == "b":
        return "True or False"
    return "a real number"


def define(source: str, name: str | None = None, options: Options | None = None,
           filename: str = "<source>") -> Kernel:
    """Define a kernel from source text of the language; ``name`` picks one ``def`` when there are several.

    Raises ParseError, SemanticError or UnsupportedError (with line:column and a caret) for bad source, and
    PolycError listing the defs when ``name`` is missing or wrong.
    """
    return Kernel(source, name, options, filename)


class GradKernel(Kernel):
    """The gradient of a kernel (:func:`grad`): a :class:`Kernel` whose def :func:`polyc.lang.grad.grad_def`
    wrote. ``source`` is its text (``print(g.source)``), ``forward`` the differentiated kernel, ``seeds`` the
    ``(output, seed input)`` pairs and ``wrt`` the ``(input, gradient output)`` pairs.

    Binding shapes also checks what the text cannot say: each seed has its output's shape (ShapeError
    naming the seed otherwise), and the ranges the gradient assumes for the forward statements' indices are
    the ones the forward kernel's range inference gives (UnsupportedError naming the index otherwise: a
    where clause in the forward def settles it).
    """

    def __init__(self, forward: Kernel, wrt, name: str | None = None, options: Options | None = None):
        if isinstance(wrt, str):
            wrt = (wrt,)
        try:
            gradient = grad_def(forward.checked, tuple(wrt), name)
        except PolycError as exc:
            raise exc.with_source(forward.source, f"<{forward.name}>") from None
        super().__init__(gradient.source, gradient.definition.name, options or forward.options,
                         filename=f"<gradient of {forward.name}>")
        self.forward = forward
        self.gradient = gradient
        self.seeds = gradient.seeds
        self.wrt = gradient.wrt
        self._checked_sizes: set = set()

    def __repr__(self) -> str:
        return f"<polyc.GradKernel {self.name} of {self.forward.name} wrt {', '.join(t for t, _ in self.wrt)}>"

    def bind_sizes(self, shapes) -> dict:
        """The forward kernel's sizes from its inputs' shapes, checked (:class:`GradKernel`), then the
        gradient def's (the seeds' own extents too)."""
        named = dict(zip((t.name for t in self.checked.inputs), (tuple(s) for s in shapes)))
        fwd_sizes = self.forward.bind_sizes([named[t.name] for t in self.forward.checked.inputs])
        key = tuple(sorted(named.items()))
        if key not in self._checked_sizes:
            self._check_forward(fwd_sizes, named)
            self._checked_sizes.add(key)
        return super().bind_sizes(shapes)

    def _check_forward(self, fwd_sizes: dict, shapes: dict) -> None:
        forward = self.forward.checked
        fwd_sizes = self.forward._every_size(fwd_sizes)
        scop = build_scop(forward, fwd_sizes)
        for out, seed in self.seeds:
            want = tuple(scop.tensor(out).shape)
            got = tuple(shapes.get(seed, want))
            if got != want:
                raise ShapeError(f"argument '{seed}': the seed of output '{out}' must have its shape {list(want)}, "
                                 f"got {list(got)}")
        names = [s.name for s in scop.statements if s.op != "init"]
        for k, index, lows, highs in self.gradient.ranges:
            found = scop.ranges[(names[k], index)]
            assumed = (max(constant_value(lo, fwd_sizes) for lo in lows),
                       min(constant_value(hi, fwd_sizes) for hi in highs))
            if assumed != tuple(found):
                span = forward.statements[k].stmt.span
                raise UnsupportedError(
                    f"the gradient of {self.forward.name} assumes index '{index}' of the statement at "
                    f"{span.line}:{span.col} ranges over {assumed[0]}:{assumed[1]}, but range inference gives "
                    f"{found[0]}:{found[1]} for these sizes", span, forward.source,
                    hint=f"give '{index}' its range with a where clause in {self.forward.name}")


def grad(kernel: Kernel, wrt, name: str | None = None, options: Options | None = None) -> GradKernel:
    """The gradient of ``kernel`` with respect to its inputs named in ``wrt`` (a name or a sequence), as a new
    kernel compiled through the same pipeline (reverse mode; :mod:`polyc.lang.grad` gives the rules).

    ``g = polyc.grad(k, wrt=("A", "B"))`` is called as ``g(*inputs, *seeds)``: ``k``'s inputs, then one seed
    per output of ``k`` (``dY``, the output's shape and dtype: the gradient of a scalar loss with respect to
    that output), and returns the gradients in ``wrt`` order (one array when ``wrt`` names one input), each of
    its input's shape and dtype. ``print(g.source)`` shows the gradient def::

        >>> mm = polyc.define("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
        >>> print(polyc.grad(mm, wrt=("A", "B")).source)   # doctest: +NORMALIZE_WHITESPACE
        def mm_grad(float32(M, K) A, float32(K, N) B, float32(M, N) dC) -> (float32(M, K) dA, float32(K, N) dB) {
            dA(m, k) +=! dC(m, n) * B(k, n) where m in 0:M, k in 0:K, n in 0:N
            dB(k, n) +=! dC(m, n) * A(m, k) where k in 0:K, n in 0:N, m in 0:M
        }

    Raises PolycError for a ``wrt`` name that is not a float input, UnsupportedError (naming the statement or
    read) for what cannot be differentiated (module :mod:`polyc.lang.grad`), and at call time what
    :class:`GradKernel` checks.
    """
    return GradKernel(kernel, wrt, name, options)


#: How many einsum kernels (one per subscripts, shapes, dtypes, options) are kept, least recently used out.
EINSUM_KERNELS_KEPT = 128


@functools.lru_cache(maxsize=EINSUM_KERNELS_KEPT)
def _einsum_kernel(subscripts: str, shapes: tuple, dtypes: tuple, options: Options | None) -> Kernel:
    source, name = einsum_source(subscripts, list(shapes), list(dtypes))
    return define(source, name, options)


def einsum(subscripts: str, *operands, options: Options | None = None):
    """numpy-compatible ``einsum`` (explicit or implicit output, no ellipsis) compiled through the pipeline.

    Operands are numpy arrays; the result dtype is numpy's result type of the operands. The kernels of the
    last :data:`EINSUM_KERNELS_KEPT` distinct calls are kept (with their compiled code). Raises PolycError
    for bad subscripts, ShapeError for operands that do not fit them.
    """
    arrays = [np.asarray(op) for op in operands]
    kernel = _einsum_kernel(subscripts, tuple(a.shape for a in arrays), tuple(a.dtype.name for a in arrays),
                            options)
    return kernel(*arrays)
