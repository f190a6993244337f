"""polyc as an ``onnx.backend``: ``prepare``, ``run_model``, ``run_node``, ``supports_device``.

Drives polyc the way ``onnxruntime.backend`` drives onnxruntime, so ``onnx.backend.test.BackendTest`` and
other harnesses can run it::

    import onnx.backend.test, polyc.onnx.backend
    onnx.backend.test.BackendTest(polyc.onnx.backend, __name__)
"""
from __future__ import annotations

import numpy as np
from onnx.backend.base import Backend, BackendRep

from .api import CompiledModel, compile as _compile


class PolycRep(BackendRep):
    """A prepared model: ``run(inputs)`` takes a list (graph input order) or a dict, returns a list."""

    def __init__(self, compiled: CompiledModel):
        self.compiled = compiled

    def run(self, inputs, **kwargs):
        if isinstance(inputs, dict):
            feeds = inputs
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            feeds = dict(zip(self.compiled.input_names, inputs))
        return self.compiled.run(feeds)


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
            raise RuntimeError(f"polyc supports only CPU, not {device}")
        options = kwargs.get("options")
        shapes = kwargs.get("input_shapes")
        return PolycRep(_compile(model, options=options, input_shapes=shapes))

    @classmethod
    def run_model(cls, model, inputs, device: str = "CPU", **kwargs):
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node, inputs, device: str = "CPU", outputs_info=None, **kwargs):
        """Run one NodeProto on numpy ``inputs`` (by building a one-node model)."""
        from .testing import one_node_model

        names = [n for n in node.input if n]
        feeds = {n: np.asarray(a) for n, a in zip(names, inputs)}
        model = one_node_model(node, feeds, opset=kwargs.get("opset_version"))
        return cls.prepare(model, device).run(feeds)


prepare = PolycBackend.prepare
run_model = PolycBackend.run_model
run_node = PolycBackend.run_node
supports_device = PolycBackend.supports_device
is_compatible = PolycBackend.is_compatible
