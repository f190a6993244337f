"""polyc: a polyhedral loop-optimizing compiler for tensor operators.

Public API: :func:`define`, :func:`einsum`, :func:`grad`, :class:`Kernel`, :class:`Options`, :class:`PolycError` (and its
subclasses in :mod:`polyc.errors`), and the ONNX entry ``polyc.onnx.compile``.
"""
from .errors import PolycError, ParseError, SemanticError, ShapeError, UnsupportedError
from .kernel import Compiled, GradKernel, Kernel, define, einsum, grad
from .options import Options

__version__ = "0.1.0"

__all__ = ["define", "einsum", "grad", "Kernel", "GradKernel", "Compiled", "Options", "PolycError", "ParseError", "SemanticError",
           "ShapeError", "UnsupportedError", "__version__"]
