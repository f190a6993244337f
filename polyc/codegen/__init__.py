"""Code generation: the target description, isl AST → LLVM IR (llvmlite), and the in-process JIT.

``module = new_module(target); emit_kernel(module, scop, ast, target, options); jit = compile_module(module,
target)``; then ``jit.address(scop.name)`` is an ``int32 (void **args)`` entry point.
"""
from .entry import emit_entry
from .jit import JitModule, compile_module, compile_object, load_object, load_objects, pool_object
from .llvm import emit_kernel, new_module
from ..target import Target, host_target

__all__ = ["emit_entry", "host_target", "Target", "new_module", "emit_kernel", "compile_module", "compile_object",
           "load_object", "load_objects", "pool_object", "JitModule"]
