"""One native entry point calling many kernels: the driver of a whole compiled model.

For a program of kernel calls, :func:`emit_entry` adds to a module (which already holds the kernels, added
with :func:`~polyc.codegen.llvm.emit_kernel`)::

    define i32 @model(ptr %buffers) {
      ; call k: args[i] = buffers[slot_i] + byte_offset_i for each tensor of the kernel
      %s0 = call i32 @k0_conv(ptr %args)      ; a non-zero status is returned at once
      ...
      ret i32 0
    }

so a model runs as one native call with no Python between kernels; ``buffers`` holds the base pointers the
caller owns (the arena, the weights, the inputs and outputs).
"""
from __future__ import annotations

from llvmlite import ir

from ..errors import CompileError

I32 = ir.IntType(32)
I64 = ir.IntType(64)
I8 = ir.IntType(8)
PTR = ir.PointerType()


def emit_entry(module: ir.Module, name: str, calls, external: bool = False) -> ir.Function:
    """Add ``define i32 @<name>(ptr %buffers)`` running ``calls`` in order.

    ``calls`` is a sequence of ``(function name, [(slot, byte offset), ...])``: the kernel (signature
    ``i32 (ptr)``) and, per tensor argument of the kernel, the index of its base pointer in ``buffers`` and the
    offset in bytes from it. A kernel must be in the module already, unless ``external``: then the kernels the
    module lacks are declared, to be defined by other objects linked with it. Raises CompileError for an
    unknown kernel.
    """
    if external:
        for callee, _ in calls:
            if module.globals.get(callee) is None:
                ir.Function(module, ir.FunctionType(I32, [PTR]), callee)
    fn = ir.Function(module, ir.FunctionType(I32, [PTR]), name)
    fn.args[0].name = "buffers"
    fn.attributes.add("nounwind")
    entry = fn.append_basic_block("entry")
    b = ir.IRBuilder(entry)
    width = max((len(args) for _, args in calls), default=1) or 1
    array = b.alloca(PTR, size=ir.Constant(I64, width), name="args")
    failed = fn.append_basic_block("failed")
    status_slot = b.alloca(I32, name="status")
    for k, (callee, args) in enumerate(calls):
        target = module.globals.get(callee)
        if target is None:
            raise CompileError(f"codegen: the model calls {callee!r}, which the module does not define")
        for i, (slot, offset) in enumerate(args):
            base = b.load(b.gep(fn.args[0], [ir.Constant(I64, slot)], inbounds=True, source_etype=PTR),
                          typ=PTR, align=8)
            pointer = b.gep(base, [ir.Constant(I64, offset)], inbounds=True, source_etype=I8)
            b.store(pointer, b.gep(array, [ir.Constant(I64, i)], inbounds=True, source_etype=PTR))
        status = b.call(target, [array])
        b.store(status, status_slot)
        ok = fn.append_basic_block(f"after{k}")
        b.cbranch(b.icmp_signed("!=", status, ir.Constant(I32, 0)), failed, ok)
        b.position_at_end(ok)
    b.ret(ir.Constant(I32, 0))
    fb = ir.IRBuilder(failed)
    fb.ret(fb.load(status_slot, typ=I32))
    return fn
