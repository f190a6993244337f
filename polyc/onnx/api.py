"""``polyc.onnx.compile``: an ONNX model to a :class:`CompiledModel`, stage by stage.

    model = load_model(path, input_shapes)      # onnx checker + strict shape inference, static inputs
    graph = from_model(model)                   # networkx graph IR
    graph = simplify(graph)                     # folding, CSE, BN folding, DCE, static shapes
    graph, strings = split_strings(graph)       # string ops: a stage the host runs before the kernels
    check_shapes(graph); check_sizes(graph)     # every node's shapes fit its op; fits in memory
    check_supported(graph)                      # every unsupported node listed at once
    groups = concat_views(graph, fusion_groups(graph))  # which nodes become one kernel; copy-free Concats
    kernels = lower_groups(graph, groups)       # one TC def per kernel group
    steps = compile_kernels(kernels, options)   # polyc.define(...) + signature: shapes, no native code yet
    plan = plan_memory(graph, groups, scratch)  # one arena by liveness (the kernels' temporaries included)
    executor = make_executor(Program(...))      # native: every kernel compiled once, linked into one program
"""
from __future__ import annotations

import ctypes
import gc
import sys
import threading
import time
from typing import Mapping, Sequence

import numpy as np
from onnx.defs import onnx_opset_version

from .. import kernel as _kernel
from ..errors import CompileError, PolycError, ShapeError, UnsupportedError
from ..options import Options
from .executor import PythonExecutor, make_executor
from .fusion import fusion_groups, groups_summary
from .graph import TensorInfo, from_model
from .load import ModelLike, feed_initializers, load_model, overridable_initializers, read_model
from .lower import check_supported, lower_groups
from .memory import concat_views, plan_memory
from .ops import CONSTANT_INPUTS
from .passes import simplify
from .steps import Program, Step, scratch_name
from .strings import STRING, as_strings, split_strings
from .validate import check_shapes, check_sizes, too_large


def compile_kernels(kernels: list, options=None, progress: bool = False) -> tuple:
    """Define each lowered kernel (``polyc.define``) and bind it to its shapes; identical defs are defined
    once. No native code is made here: each step carries its kernel's signature (argument shapes, from the
    Scop or the disk cache), the executor compiles (:func:`~polyc.onnx.executor.make_executor`), and
    ``step.compiled`` JIT-compiles one kernel on its own when something needs it.

    Returns ``(steps, timings)`` where timings maps a def's text to the seconds spent on it here. Raises
    CompileError naming the kernel and its group.
    """
    distinct = {}
    for k in kernels:
        if k is not None:
            distinct.setdefault(k.source, k)
    items = list(distinct.values())
    if progress:
        from tqdm import tqdm
        items = tqdm(items, desc="binding kernels", unit="kernel", leave=False)
    bound, timings = {}, {}
    for k in items:
        t = time.perf_counter()
        try:
            kern = _kernel.define(k.source, options=options)
            sizes = kern.bind_sizes([k.tc_shapes[name] for name in k.inputs])
            bound[k.source] = (kern, tuple(sorted(sizes.items())), kern.signature(sizes))
        except PolycError as exc:
            raise CompileError(f"compiling kernel {k.name} of group {k.group} failed: {exc.message}",
                               hint=f"the kernel's source:\n{k.source}") from exc
        timings[k.source] = time.perf_counter() - t
    steps = tuple(Step(k.group, k.name, *bound[k.source], k.inputs, k.outputs) for k in kernels if k is not None)
    return steps, timings


class CompiledModel:
    """An ONNX model compiled by polyc. ``run(feeds)`` (or calling it) returns the outputs as a list.

    ``input_names``/``input_shapes``/``input_dtypes`` and the ``output_*`` counterparts describe the model;
    ``summary()`` prints the fusion groups, the slowest kernels to compile and the arena.
    """

    def __init__(self, graph, groups, kernels, plan, steps, timings, executor, stage_seconds, strings=None,
                 interface=None):
        """``graph``: the graph the kernels compute; ``interface``: the model's whole graph (its inputs and
        outputs), when a :class:`~polyc.onnx.strings.StringStage` ``strings`` runs part of it on the host."""
        self.graph = graph
        self.groups = groups
        self.kernels = kernels
        self.plan = plan
        self.steps = steps
        self.compile_seconds = timings
        self.stage_seconds = stage_seconds
        self.executor = executor
        self.strings = strings
        self._profiler = None
        interface = graph if interface is None else interface
        tensors = interface.graph["tensors"]
        self.input_names = tuple(interface.graph["inputs"])
        self.input_shapes = tuple(tensors[n].shape for n in self.input_names)
        self.input_dtypes = tuple(np.dtype(tensors[n].dtype) for n in self.input_names)
        self.output_names = tuple(interface.graph["outputs"])
        self.output_shapes = tuple(tensors[n].shape for n in self.output_names)
        self.output_dtypes = tuple(np.dtype(tensors[n].dtype) for n in self.output_names)

    #: Initializers a feed may override (name -> default array); set by :func:`compile`.
    defaults: dict = {}

    def check_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict:
        """Feeds as C-contiguous arrays; a wrong name, a missing input, or a wrong shape or dtype raises
        :class:`~polyc.errors.ShapeError` naming the input and what was expected. Overridable initializers
        (:attr:`defaults`) may be fed too, with their default's shape and dtype."""
        if len(feeds) == len(self.input_names) and not self.defaults:  # the common case, checked cheaply
            for name, shape, dtype in zip(self.input_names, self.input_shapes, self.input_dtypes):
                value = feeds.get(name)
                if type(value) is not np.ndarray or value.dtype != dtype or value.shape != tuple(shape) \
                        or not value.flags.c_contiguous or dtype == STRING:
                    break
            else:
                return dict(feeds)
        expected = dict(zip(self.input_names, zip(self.input_shapes, self.input_dtypes)))
        optional = {n: (v.shape, v.dtype) for n, v in self.defaults.items() if n not in expected}
        for name in feeds:
            if name not in expected and name not in optional:
                raise ShapeError(f"unknown input {name!r}; the model's inputs are: "
                                 + ", ".join(f"{n} {d.name}{list(s)}" for n, (s, d) in expected.items())
                                 + "".join(f", {n} {d.name}{list(s)} (optional: an initializer)"
                                           for n, (s, d) in optional.items()))
        out = {}
        for name, (shape, dtype) in list(expected.items()) + [(n, optional[n]) for n in feeds if n in optional]:
            if name not in feeds:
                raise ShapeError(f"missing input {name!r}: expected {dtype.name}{list(shape)}")
            value = feeds[name]
            if dtype == STRING:
                value = as_strings(value, name)
            elif not isinstance(value, np.ndarray):
                try:
                    value = np.asarray(value, dtype=dtype)
                except (TypeError, ValueError, OverflowError) as e:
                    raise ShapeError(f"input {name!r}: cannot convert a {type(value).__name__} to "
                                     f"{dtype.name}{list(shape)}: {e}") from e
            if value.dtype != dtype:
                raise ShapeError(f"input {name!r}: expected dtype {dtype.name}, got {value.dtype.name}",
                                 hint=f"convert it with .astype("
                                      f"{'ml_dtypes' if dtype.name == 'bfloat16' else 'np'}.{dtype.name})")
            if tuple(value.shape) != tuple(shape):
                raise ShapeError(f"input {name!r}: expected shape {list(shape)}, got {list(value.shape)}")
            out[name] = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # keeps 0-d
        return out

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        """The model's outputs (numpy arrays, in ``output_names`` order) for ``feeds`` (input name -> array).

        Safe to call from several threads at once: each run uses its own arena. A feed for an initializer
        that is also a graph input (IR version >= 4; see :attr:`defaults`) overrides its value, as in
        onnxruntime: the model is compiled for it on the first such run (once per set of overridden names,
        and per value for inputs polyc needs as constants, such as a Reshape's shape).
        """
        checked = self.check_feeds(feeds)
        if not self.defaults:
            return self._execute(checked)
        fed = {n: v for n, v in checked.items() if n in self.defaults and n not in self.input_names}
        overridden = {n: v for n, v in fed.items() if not np.array_equal(v, self.defaults[n])}
        if not overridden:
            return self._execute({n: v for n, v in checked.items() if n not in fed})
        variant = self._variant(overridden)
        return variant.run({n: v for n, v in checked.items() if n in variant.input_names})

    def _execute(self, feeds: dict) -> list:
        """The outputs for checked ``feeds``: the kernels, after the host's string stage when there is one."""
        if self.strings is None:
            return self.executor.run(feeds)
        return self.strings.run(feeds, self.executor)

    def _variant(self, overridden: dict) -> "CompiledModel":
        """The model compiled with the initializers in ``overridden`` fed (see :meth:`run`)."""
        frozen = {n: v for n, v in overridden.items() if n in self._constant_like}
        key = (tuple(sorted(n for n in overridden if n not in frozen)),
               tuple(sorted((n, v.tobytes()) for n, v in frozen.items())))
        with self._variants_lock:
            if key not in self._variants:
                source = feed_initializers(self._source, inputs=key[0], values=frozen)
                self._variants[key] = compile(source, self._options, self._input_shapes, progress=False)
            return self._variants[key]

    def profile(self, feeds: Mapping[str, np.ndarray], repeat: int = 1) -> list:
        """``(seconds, group, kernel name)`` per kernel group, slowest first, averaged over ``repeat`` runs
        after one unrecorded warm-up run (a fresh arena's first writes page-fault: the first kernel to write a
        large tensor, a network's stem, measured 2x its time in that run).

        Per-kernel times need the Python-driven executor: unless the model already runs on one, the first
        call builds one, which JIT-compiles each kernel on its own (from the disk cache when it can).
        """
        times: dict = {}
        checked = self.check_feeds(feeds)
        if self.strings is not None:
            checked = self.strings.kernel_feeds(checked)[1]
        if self._profiler is None:
            self._profiler = self.executor if isinstance(self.executor, PythonExecutor) \
                else PythonExecutor(self.executor.program)
        self._profiler.run(checked)
        for _ in range(repeat):
            self._profiler.run(checked, profile=times)
        names = {s.group: s.name for s in self.steps}
        return sorted(((t / repeat, g, names[g]) for g, t in times.items()), reverse=True)

    def __call__(self, *args, **feeds):
        """``model(x)`` (positional, in input order), ``model(feeds_dict)`` or ``model(name=array)``."""
        if len(args) == 1 and isinstance(args[0], Mapping):
            feeds = dict(args[0])
        elif args:
            if len(args) != len(self.input_names):
                raise ShapeError(f"the model takes {len(self.input_names)} inputs ({', '.join(self.input_names)}), "
                                 f"got {len(args)}")
            feeds = dict(zip(self.input_names, args))
        return self.run(feeds)

    @property
    def arena_bytes(self) -> int:
        return self.plan.arena_bytes

    @property
    def constant_bytes(self) -> int:
        """Bytes of the constants the kernels read (the weights, re-laid as the kernels read them; the copies
        packed once for the register tiles not counted)."""
        return sum(np.asarray(v).nbytes for v in self.executor.program.constants.values())

    def summary(self, slowest: int = 10) -> str:
        """Fusion groups, kernel count, the slowest kernel compiles, the arena and the stage times."""
        ops: dict = {}
        for _, d in self.graph.nodes(data=True):
            ops[d["op"]] = ops.get(d["op"], 0) + 1
        lines = [f"ops after passes: " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items(), key=lambda x: -x[1])),
                 groups_summary(self.graph, self.groups),
                 f"kernels: {len(self.steps)} calls, {len(self.compile_seconds)} distinct defs compiled"]
        if self.strings is not None:
            lines.insert(1, self.strings.summary())
        by_time = sorted(self.compile_seconds.items(), key=lambda x: -x[1])[:slowest]
        names = {k.source: k.name for k in self.kernels if k is not None}
        for source, seconds in by_time:
            lines.append(f"  {seconds * 1e3:8.1f} ms  {names[source]}")
        lines.append(str(self.plan))
        lines.append("stages: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.stage_seconds.items()))
        return "\n".join(lines)


def compile(model_or_path: ModelLike, options=None, input_shapes: Mapping[str, Sequence[int]] | None = None,
            progress: bool | None = None) -> CompiledModel:
    """Compile an ONNX model (a path, bytes or ModelProto) into a :class:`CompiledModel`.

    ``options`` (a :class:`polyc.Options`) apply to every kernel; ``input_shapes`` pins dynamic input dims
    (``{"data": (1, 3, 224, 224)}``); ``progress`` shows a tqdm bar while kernels compile (default: when
    stderr is a terminal). Raises :class:`~polyc.errors.UnsupportedError` listing every unsupported
    node before any kernel is compiled, :class:`~polyc.errors.ShapeError` for a dynamic dimension,
    :class:`~polyc.onnx.ModelError` for an unreadable or invalid model (naming the node where there is one:
    a Reshape that changes the element count, a Conv kernel larger than its input ...), UnsupportedError
    giving the bytes needed when a tensor cannot fit in this machine's memory, and CompileError for a
    failure of polyc itself: never another exception.
    """
    compiled = _guarded(_compile, model_or_path, options, input_shapes, progress)
    if compiled.constant_bytes >= RETURN_MEMORY_MIN_BYTES:
        _return_free_memory()
    return compiled


def compile_program(model_or_path: ModelLike, options=None,
                    input_shapes: Mapping[str, Sequence[int]] | None = None) -> Program:
    """:func:`compile` up to the :class:`~polyc.onnx.steps.Program` (the kernels bound to their shapes, the
    memory plan, the constants), without making native code: for :mod:`polyc.onnx.export`. Raises like
    :func:`compile`, and UnsupportedError for a model with string tensors (run by a host stage)."""
    return _guarded(_program_only, model_or_path, options, input_shapes, False)


def _program_only(model_or_path, options, input_shapes, progress, stage: list) -> Program:
    front = _front(model_or_path, options, input_shapes, progress, stage)
    if front["strings"] is not None:
        raise UnsupportedError("the model computes on string tensors, which run in Python (a host stage): it "
                               "cannot be exported to a C library")
    return front["program"]


def _guarded(stages, model_or_path, options, input_shapes, progress):
    """``stages(model_or_path, options, input_shapes, progress, stage)`` with every failure a PolycError
    naming the stage it happened in."""
    stage = ["reading the model"]
    try:
        return stages(model_or_path, options, input_shapes, progress, stage)
    except PolycError:
        raise
    except MemoryError as e:
        raise UnsupportedError(f"out of memory while {stage[0]}", hint="use smaller input shapes") from e
    except Exception as e:  # a polyc bug or an onnx failure not caught where it happened
        raise CompileError(f"internal error while {stage[0]}: {type(e).__name__}: {e}",
                           hint="please report it with the model") from e


def _options(options):
    """``options`` as a :class:`polyc.Options` (None stays None; a text spec is parsed)."""
    if options is None or isinstance(options, Options):
        return options
    if isinstance(options, str):
        return Options.from_spec(options)
    raise UnsupportedError(f"options must be a polyc.Options (or its text spec), not a {type(options).__name__}")


def _compile(model_or_path, options, input_shapes, progress, stage: list) -> CompiledModel:
    """:func:`compile`'s stages; ``stage[0]`` names the current one (for errors)."""
    front = _front(model_or_path, options, input_shapes, progress, stage)
    seconds, timings, program = front["seconds"], front["timings"], front["program"]
    t = time.perf_counter()
    executor = make_executor(program, progress=front["progress"])
    seconds["executor"] = time.perf_counter() - t
    for source, spent in executor.compile_seconds.items():
        timings[source] = timings.get(source, 0.0) + spent
    release_constants(front["graph"])
    compiled = CompiledModel(front["graph"], front["groups"], front["kernels"], program.plan, program.steps,
                             timings, executor, seconds, front["strings"], front["interface"])
    proto, defaults = front["proto"], front["defaults"]
    compiled.defaults = defaults
    compiled._source = proto if defaults else None  # kept only to compile a variant with fed initializers
    compiled._constant_like = needs_constant(proto) if defaults else set()
    compiled._options, compiled._input_shapes = front["options"], input_shapes
    compiled._variants, compiled._variants_lock = {}, threading.Lock()
    return compiled


def release_constants(graph) -> None:
    """Drop the constants' values from ``graph`` (in place) once its kernels are linked: each kernel reads
    copies of its own (re-laid channels-last, folded, packed), and the graph kept for :meth:`CompiledModel.summary`
    only needs its nodes and ``graph.graph["tensors"]`` (every constant's shape and dtype stays there;
    ``graph.graph["released_constants"]`` names them). Without this a compiled ResNet-50 held its 98 MiB of
    weights three times over: the graph's (batch-norm folded), the kernels' (re-laid) and the packed ones."""
    graph.graph["released_constants"] = frozenset(graph.graph["constants"])
    graph.graph["constants"] = {}


#: :func:`compile` hands the heap's free pages back to the system (:func:`_return_free_memory`) after a model
#: with at least this many bytes of constants: the collection and the trim cost 10-60 ms (a full ``gc``
#: pass over the process), more than a small model's whole compile. MobileNetV2 and the BERT encoder of
#: ``scripts/model_zoo.py`` (14 MiB of weights each) keep 224-226 MiB resident after it, 245-260 without.
RETURN_MEMORY_MIN_BYTES = 4 << 20


def _return_free_memory() -> None:
    """Hand the heap's free pages back to the system: a full garbage collection (the compile's reference
    cycles hold much of what it no longer needs), then glibc's ``malloc_trim`` (nothing where there is no
    glibc). A compile frees far more than it keeps (isl's sets, LLVM's modules, the graph passes' arrays), and
    glibc returns little of it on its own: a ResNet-50 compiled in a fresh process kept 861 MiB resident, 559
    after (onnxruntime's session: 555; the process held 427 before either, the model's weights are 98)."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    gc.collect()
    trim(0)


def _front(model_or_path, options, input_shapes, progress, stage: list) -> dict:
    """The stages of :func:`compile` before native code: a dict of the Program and what led to it."""
    options = _options(options)
    seconds = {}
    t = time.perf_counter()
    proto = read_model(model_or_path)
    stage[0] = "checking the model and inferring shapes"
    model = load_model(proto, input_shapes)
    graph = from_model(model)
    defaults = {n: graph.graph["constants"][n] for n in overridable_initializers(proto)}
    seconds["load"] = time.perf_counter() - t
    t = time.perf_counter()
    stage[0] = "running the graph passes"
    graph = simplify(graph)
    interface = graph
    graph, strings = split_strings(graph)
    seconds["passes"] = time.perf_counter() - t
    stage[0] = "validating shapes"
    check_shapes(graph)
    check_sizes(graph)
    check_supported(graph)
    t = time.perf_counter()
    stage[0] = "lowering the fusion groups to TC"
    groups = concat_views(graph, fusion_groups(graph))
    kernels = lower_groups(graph, groups)
    seconds["lower"] = time.perf_counter() - t
    t = time.perf_counter()
    if progress is None:
        progress = sys.stderr.isatty()
    stage[0] = "binding the kernels"
    steps, timings = compile_kernels(kernels, options, progress)
    seconds["kernels"] = time.perf_counter() - t
    stage[0] = "planning memory and compiling the kernels"
    scratch = {s.group: {scratch_name(s.group, k): TensorInfo(tuple(spec.shape), np.dtype(spec.dtype))
                         for k, spec in enumerate(s.temps)} for s in steps}
    inplace = {out: x for k in kernels if k is not None for out, x in k.inplace.items()}
    plan = plan_memory(graph, groups, scratch, inplace)
    error = too_large(f"the arena of the model's intermediates ({len(plan.offsets)} tensors)", plan.arena_bytes)
    if error is not None:
        raise error
    constants = dict(graph.graph["constants"])
    for k in kernels:
        if k is not None:
            constants.update(k.constants)
    # only what a step reads or the graph returns: a Conv's batch-norm-folded weights, re-laid by the lowering
    # into a table of their own, are read by no step (89 of ResNet-50's 187 MiB of constants)
    used = {plan.root(n) for s in steps for n in s.inputs} | {plan.root(n) for n in graph.graph["outputs"]}
    constants = {n: v for n, v in constants.items() if n in used}
    tensors = dict(graph.graph["tensors"])
    for infos in scratch.values():
        tensors.update(infos)
    program = Program(steps, plan, constants, tensors, tuple(graph.graph["inputs"]), tuple(graph.graph["outputs"]))
    return dict(program=program, graph=graph, groups=groups, kernels=kernels, timings=timings, seconds=seconds,
                strings=strings, interface=interface, proto=proto, defaults=defaults, options=options,
                progress=progress)


def needs_constant(model) -> set:
    """Tensor names whose values polyc needs at compile time: those read by a slot that must be a constant
    (a Reshape's shape, Slice's starts, pads, axes ... :data:`~polyc.onnx.ops.CONSTANT_INPUTS`) and, going
    back through the nodes that compute them, their sources (a Shape or Size node needs only its input's
    shape, not its value)."""
    opset = next((i.version for i in model.opset_import if i.domain in ("", "ai.onnx")), onnx_opset_version())
    needed = set()
    for node in reversed(model.graph.node):
        for index, since, _ in CONSTANT_INPUTS.get(node.op_type, ()):
            if opset >= since and index < len(node.input) and node.input[index]:
                needed.add(node.input[index])
        if node.op_type not in ("Shape", "Size") and any(o in needed for o in node.output):
            needed.update(i for i in node.input if i)
    return needed
