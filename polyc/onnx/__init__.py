"""polyc's ONNX front end: ``compile(model) -> CompiledModel`` and an ``onnx.backend`` Backend.

    >>> import polyc.onnx
    >>> model = polyc.onnx.compile("resnet50.onnx")
    >>> probs, = model.run({"data": x})

The stages live in their own modules: ``load`` (checker, shape inference), ``graph`` (networkx IR),
``passes`` (with ``control``, ``sequences`` and ``folding``), ``validate`` (shapes and sizes checked at compile
time, naming the node), ``fusion``, ``lower`` / ``builder`` / ``ops`` (group -> TC text; one converter module
per op family), ``memory`` (arena), ``steps`` (the compiled program), ``executor`` / ``native`` and ``api``;
``backend`` adapts it to ``onnx.backend.base.Backend``.
"""
from . import backend
from .api import CompiledModel, compile, compile_kernels
from .dynamic import DynamicModel, compile_dynamic
from .load import ModelError
from .testing import LIGHT_MODELS, light_model_path

__all__ = ["compile", "CompiledModel", "compile_dynamic", "DynamicModel", "compile_kernels", "backend", "ModelError",
           "light_model_path",
           "LIGHT_MODELS"]
