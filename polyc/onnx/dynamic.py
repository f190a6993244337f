"""Models with symbolic dimensions (a batch, a sequence length) whose kernels are compiled once.

:func:`compile_dynamic` takes a model whose inputs have symbolic dims (``dim_param``, or no value) and returns a
:class:`DynamicModel` that runs on any value of them. The ONNX lowering writes each kernel with literal
extents, so the model is lowered at two values of its dims (the hint, and the hint + 3, + 4, ... per dim)
and each kernel's two texts are *unified*: the integer literals that differ become sizes of one generic def
(a dim of the signature becomes a size ``D0``, ``D1``..., a literal elsewhere the affine function ``a*D + c``
of one of them that fits both values), compiled once as a generic kernel (:meth:`polyc.Kernel.generic`, the sizes as isl
parameters, the hint's extents deciding its schedule). A run at a new value of the dims lowers the model
again at those shapes (the graph passes, the lowering and the memory plan: Python, no LLVM) and matches each
kernel's text against its template, which gives the generic kernel's sizes; the kernels run from Python on an
arena of that value's size (:class:`~polyc.onnx.executor.PythonExecutor`). A kernel whose text does not match
(a literal that is no affine function of one size, a def the generic pipeline refuses) is compiled for that
value on its own: correct, only not shared; :attr:`DynamicModel.specialised` counts them.
"""
from __future__ import annotations

import re
import threading
from typing import Mapping

import numpy as np

from .. import kernel as _kernel
from ..errors import PolycError, ShapeError
from ..options import Options
from .api import _front, _guarded, _options
from .executor import PythonExecutor
from .load import read_model

#: An integer literal of a TC text: not part of a name (``X0``, ``i1``) or of a float (``0.5``, ``1e-05``).
_INTEGER = re.compile(r"(?<![\w.])(?<![eE][-+])\d+(?![\w.])")

#: The value the symbolic dims take at the first lowering, when no hint is given.
DEFAULT_HINT = 4


def compile_dynamic(model_or_path, options=None, hint: Mapping[str, int] | None = None) -> "DynamicModel":
    """Compile ``model_or_path`` (a path, bytes or ModelProto) for every value of its symbolic input dims.

    ``hint`` (dim name → value, the names of the model's ``dim_param``; ``"?"`` for unnamed dims) gives the
    values the kernels' schedules are decided at (default :data:`DEFAULT_HINT`). Raises like
    :func:`polyc.onnx.compile`, and ShapeError when the model has no symbolic input dim."""
    options = _options(options) or Options()
    return _guarded(lambda m, o, s, p, stage: DynamicModel(m, o, hint or {}, stage), model_or_path, options,
                    None, False)


class DynamicModel:
    """A model compiled once for every value of its symbolic dims (see the module docstring). ``run(feeds)``
    (or calling it) returns the outputs as a list; ``dims`` are the symbolic dims' names, ``generic`` the
    distinct generic kernels, ``specialised`` how many kernel compiles a value of the dims needed beyond
    them."""

    def __init__(self, model, options: Options, hint: Mapping[str, int], stage: list):
        self.proto = read_model(model)
        self.options = options.replace(generic=False)
        graph_inputs = {i.name for i in self.proto.graph.initializer}
        self.inputs = []  # (name, [(position, dim name)])
        for vi in self.proto.graph.input:
            if vi.name in graph_inputs:
                continue
            dims = vi.type.tensor_type.shape.dim
            symbolic = [(k, d.dim_param or "?") for k, d in enumerate(dims) if not d.HasField("dim_value")]
            self.inputs.append((vi.name, [d.dim_value for d in dims], symbolic))
        self.dims = tuple(dict.fromkeys(name for _, _, sym in self.inputs for _, name in sym))
        if not self.dims:
            raise ShapeError("the model has no symbolic input dimension; compile it with polyc.onnx.compile")
        unknown = set(hint) - set(self.dims)
        if unknown:
            raise ShapeError(f"hint names {', '.join(sorted(unknown))}, not symbolic dims of the model "
                             f"({', '.join(self.dims)})")
        first = {d: int(hint.get(d, DEFAULT_HINT)) for d in self.dims}
        second = {d: v + 3 + k for k, (d, v) in enumerate(first.items())}  # dims apart by their values
        stage[0] = "lowering the model at its hint"
        steps_a = self._front(first)["program"].steps
        stage[0] = "lowering the model at a second value of its dims"
        steps_b = self._front(second)["program"].steps
        if [s.kernel.source.split("(")[0] for s in steps_a] != [s.kernel.source.split("(")[0] for s in steps_b]:
            raise ShapeError("the model's kernels differ between two values of its symbolic dims",
                             hint="pin the dims with polyc.onnx.compile(..., input_shapes=...)")
        stage[0] = "compiling the generic kernels"
        self.templates = [_template(a.kernel.source, b.kernel.source) for a, b in zip(steps_a, steps_b)]
        self.generic = {}
        for template, step in zip(self.templates, steps_a):
            if template is None or template.source in self.generic:
                continue
            sizes = template.match(step.kernel.source)
            try:
                kernel = _kernel.define(template.source, options=self.options.replace(generic=True))
                self.generic[template.source] = kernel.generic(sizes)
            except PolycError:  # the generic pipeline refuses the def: compiled per value instead
                self.generic[template.source] = None
        self.specialised = 0
        self._runs: dict = {}
        self._lock = threading.Lock()

    def _front(self, values: Mapping[str, int]) -> dict:
        shapes = {name: tuple(values[dict(sym)[k]] if k in dict(sym) else base[k] for k in range(len(base)))
                  for name, base, sym in self.inputs}
        return _front(self.proto, self.options, shapes, False, ["lowering the model"])

    def bind(self, feeds: Mapping[str, np.ndarray]) -> dict:
        """The symbolic dims' values from the feeds' shapes; ShapeError for a missing input or two feeds that
        disagree on a dim."""
        values, where = {}, {}
        for name, _, sym in self.inputs:
            if name not in feeds:
                raise ShapeError(f"missing input {name!r}")
            shape = np.shape(feeds[name])
            for k, dim in sym:
                if k >= len(shape):
                    raise ShapeError(f"input {name!r} has {len(shape)} dimensions; dim {dim!r} is its dimension {k}")
                if dim in values and values[dim] != shape[k]:
                    raise ShapeError(f"dim {dim!r} is {values[dim]} in {where[dim]!r} but {shape[k]} in {name!r}")
                values[dim], where[dim] = int(shape[k]), name
        return values

    def executor(self, values: Mapping[str, int]) -> PythonExecutor:
        """The executor at these values of the dims: the model lowered at their shapes, each step running its
        generic kernel at the sizes its text gives (or, not matching, compiled for these values)."""
        key = tuple(values[d] for d in self.dims)
        with self._lock:
            found = self._runs.get(key)
            if found is not None:
                return found
            program = _guarded(lambda *_: self._front(values)["program"], None, None, None, False)
            plans = []
            for template, step in zip(self.templates, program.steps):
                generic = self.generic.get(template.source) if template is not None else None
                sizes = template.match(step.kernel.source) if generic is not None else None
                plans.append(generic.at(sizes) if sizes is not None else None)
            self.specialised += sum(p is None for p in plans)
            compiled = iter(plans)

            def compile_step(step, constants):
                found = next(compiled)
                return found if found is not None else step.compile(constants)
            executor = self._runs[key] = PythonExecutor(program, compile_step=compile_step)
        return executor

    def run(self, feeds: Mapping[str, np.ndarray]) -> list:
        """The model's outputs for ``feeds`` (input name → array of any value of the symbolic dims)."""
        feeds = {k: np.ascontiguousarray(v) for k, v in feeds.items()}
        return self.executor(self.bind(feeds)).run(feeds)

    __call__ = run


class _Template:
    """A kernel's text with the integer literals that vary between lowerings replaced: ``source`` is the
    generic def (sizes ``D0``, ``D1``... in its signature), ``slots`` per varying literal its size and the
    affine function ``(size, a, c)`` giving the literal ``a*size + c``."""

    def __init__(self, pieces: list, slots: list, source: str):
        self.pieces, self.slots, self.source = pieces, slots, source

    def match(self, text: str) -> dict | None:
        """The sizes of the generic def at which it computes what ``text`` does, None when ``text`` is not an
        instance of the template (other literals, or values no sizes explain)."""
        pieces, values = _split(text)
        if pieces != self.pieces or len(values) != len(self.slots):
            return None
        sizes: dict = {}
        for value, slot in zip(values, self.slots):
            if isinstance(slot, int):
                if value != slot:
                    return None
                continue
            size, a, c = slot
            if a == 1 and c == 0:
                if sizes.setdefault(size, value) != value:
                    return None
        for value, slot in zip(values, self.slots):
            if not isinstance(slot, int) and (slot[0] not in sizes or slot[1] * sizes[slot[0]] + slot[2] != value):
                return None
        return sizes


def _split(text: str) -> tuple[list, list]:
    """``(the text between integer literals, the literals)``."""
    pieces, values, last = [], [], 0
    for m in _INTEGER.finditer(text):
        pieces.append(text[last:m.start()])
        values.append(int(m.group()))
        last = m.end()
    pieces.append(text[last:])
    return pieces, values


def _template(a: str, b: str) -> _Template | None:
    """The template of a kernel lowered as ``a`` and as ``b`` at two values of the dims; None when the texts
    differ in more than integer literals, or a literal that varies is no affine function of a dim of the
    signature."""
    pieces, va = _split(a)
    other, vb = _split(b)
    if pieces != other or len(va) != len(vb):
        return None
    header = len(a[:a.index("{")]) if "{" in a else len(a)
    offsets, position = [], 0
    for piece, value in zip(pieces, va):
        position += len(piece)
        offsets.append(position)
        position += len(str(value))
    sizes: dict = {}  # (value at a, value at b) -> size name, for literals of the signature
    for offset, x, y in zip(offsets, va, vb):
        if x != y and offset < header and (x, y) not in sizes:
            sizes[(x, y)] = f"D{len(sizes)}"
    slots, texts = [], []
    for offset, x, y in zip(offsets, va, vb):
        if x == y:
            slots.append(x)
            texts.append(str(x))
            continue
        if (x, y) in sizes:
            slots.append((sizes[(x, y)], 1, 0))
            texts.append(sizes[(x, y)])
            continue
        for (sx, sy), name in sizes.items():
            if (y - x) % (sy - sx) == 0:
                k = (y - x) // (sy - sx)
                c = x - k * sx
                slots.append((name, k, c))
                texts.append(f"({k}*{name}{c:+d})")
                break
        else:
            return None
    source = pieces[0] + "".join(t + p for t, p in zip(texts, pieces[1:]))
    return _Template(pieces, slots, source)

