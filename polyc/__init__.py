"""polyc: a polyhedral loop-optimizing compiler for tensor operators.

Public API: :func:`define`, :func:`einsum`, :class:`Kernel`, :class:`Options`, :class:`PolycError` (and its
subclasses in :mod:`polyc.errors`), and the ONNX entry ``polyc.onnx.compile``.
"""
from .errors import PolycError, ParseError, SemanticError, ShapeError, UnsupportedError
from .kernel import Compiled, Kernel, define, einsum
from .options import Options

__version__ = "0.1.0"

__all__ = ["define", "einsum", "Kernel", "Compiled", "Options", "PolycError", "ParseError", "SemanticError",
           "ShapeError", "UnsupportedError", "__version__"]
