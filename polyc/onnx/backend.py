"""polyc as an ``onnx.backend``: ``prepare``, ``run_model``, ``run_node``, ``supports_device``.

Drives polyc the way ``onnxruntime.backend`` drives onnxruntime, so ``onnx.backend.test.BackendTest`` and
other harnesses can run it::

    import onnx.backend.test, polyc.onnx.backend
    onnx.backend.test.BackendTest(polyc.onnx.backend, __name__)
"""
from __future__ import annotations

import threading

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.backend.base import Backend, BackendRep

from ..errors import UnsupportedError
from .api import CompiledModel, compile as _compile, needs_constant
from .load import check_tensor_types, read_model
from .testing import one_node_model


def _graph_input_names(model: onnx.ModelProto) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _shape_like_inputs(model: onnx.ModelProto) -> set:
    """Graph inputs whose values polyc needs at compile time: those feeding a slot that must be a constant
    (Reshape's shape, axes, pads ...), directly or through the nodes that compute it
    (:func:`~polyc.onnx.api.needs_constant`: a CenterCropPad expansion computes Pad's pads from its input)."""
    return needs_constant(model) & set(_graph_input_names(model))


def _is_dynamic(model: onnx.ModelProto) -> bool:
    inits = {t.name for t in model.graph.initializer}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        t = vi.type.tensor_type
        if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
            return True
    return False


def _freeze(model: onnx.ModelProto, values: dict) -> onnx.ModelProto:
    """A copy of ``model`` whose graph inputs ``values`` (name -> array) are initializers."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    keep = [vi for vi in out.graph.input if vi.name not in values]
    del out.graph.input[:]
    out.graph.input.extend(keep)
    out.graph.initializer.extend(numpy_helper.from_array(np.asarray(v), n) for n, v in values.items())
    return out


class PolycRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (graph input order) or a dict, returns a list.

    A model with dynamic input dims, or whose graph inputs feed slots polyc needs as constants (Reshape's
    shape, Slice's starts, axes, pads, Resize's scales ...), is compiled at the first ``run`` for the given
    shapes and those inputs' values (one compiled model per distinct key), as TVM's ``freeze_params`` does.
    An initializer that is also a graph input (IR >= 4) may be fed: the feed overrides it, as in onnxruntime
    (see :meth:`CompiledModel.run`). ``run`` may be called from several threads at once.
    """

    def __init__(self, model: onnx.ModelProto, options=None):
        self.model = model
        self.options = options
        self.names = _graph_input_names(model)
        self.frozen = _shape_like_inputs(model)
        self.compiled = None
        self.specialized: dict = {}
        self.lock = threading.Lock()
        check_tensor_types(model)  # a sequence input would otherwise meet numpy at the first run
        if not self.frozen and not _is_dynamic(model):
            self.compiled = _compile(model, options=options)

    def _specialize(self, feeds: dict) -> CompiledModel:
        feeds = {n: a for n, a in feeds.items() if n in self.names}  # fed initializers: CompiledModel.run
        key = tuple((n, np.shape(a), np.asarray(a).dtype.str,
                     np.asarray(a).tobytes() if n in self.frozen else b"") for n, a in sorted(feeds.items()))
        with self.lock:
            if key not in self.specialized:
                model = _freeze(self.model, {n: feeds[n] for n in self.frozen if n in feeds})
                shapes = {n: np.shape(a) for n, a in feeds.items() if n not in self.frozen}
                self.specialized[key] = _compile(model, options=self.options, input_shapes=shapes)
            return self.specialized[key]

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self.names, inputs))
        compiled = self.compiled or self._specialize(feeds)
        return compiled.run({n: a for n, a in feeds.items() if n in compiled.input_names or n in compiled.defaults})


class PolycBackend(Backend):
    """An ``onnx.backend.base.Backend`` that compiles with polyc (CPU only)."""

    @classmethod
    def is_compatible(cls, model, device: str = "CPU", **kwargs) -> bool:
        return cls.supports_device(device)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).upper().startswith("CPU")

    @classmethod
    def prepare(cls, model, device: str = "CPU", **kwargs) -> PolycRep:
        """Compile ``model`` (ModelProto, bytes or path); ``kwargs`` may hold ``options`` and ``input_shapes``."""
        if not cls.supports_device(device):
            raise UnsupportedError(f"polyc supports only the CPU device, not {device!r}")
        if not isinstance(model, onnx.ModelProto):
            model = read_model(model)
        if kwargs.get("input_shapes"):
            rep = PolycRep.__new__(PolycRep)
            rep.model, rep.options, rep.frozen, rep.specialized = model, kwargs.get("options"), set(), {}
            rep.lock = threading.Lock()
            rep.names = _graph_input_names(model)
            rep.compiled = _compile(model, options=rep.options, input_shapes=kwargs["input_shapes"])
            return rep
        return PolycRep(model, kwargs.get("options"))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on numpy ``inputs`` (by building a one-node model)."""
        names = [n for n in node.input if n]
        feeds = {n: np.asarray(a) for n, a in zip(names, inputs)}
        model = one_node_model(node, feeds, opset=kwargs.get("opset_version"))
        return cls.prepare(model, device).run(feeds)


prepare = PolycBackend.prepare
run_model = PolycBackend.run_model
run_node = PolycBackend.run_node
supports_device = PolycBackend.supports_device
is_compatible = PolycBackend.is_compatible
