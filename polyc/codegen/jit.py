"""LLVM IR → native code in this process: parse, verify, optimize (new pass manager), MCJIT.

:func:`compile_module` returns a :class:`JitModule` that owns the execution engine; the addresses it hands
out stay valid while it lives. The machine code is for the :class:`~polyc.codegen.target.Target` (the
host: its CPU name and features, so AVX2/AVX-512 and FMA are used).

External symbols the generated code calls (libm's ``tanhf``/``erff``..., libmvec's vector functions) are
resolved in-process; libm is loaded with ``llvm.load_library_permanently``. ``polyc_parallel_run``, which
every parallel loop calls, is the thread pool of :mod:`polyc.codegen.pool`: compiled once per process, before
the first kernel, and registered with ``llvm.add_symbol``. A symbol that cannot be resolved raises
:class:`~polyc.errors.CompileError` before MCJIT would abort the process.
"""
from __future__ import annotations

import ctypes.util
import functools

import llvmlite.binding as llvm
from llvmlite import ir

from .. import debug
from ..errors import CompileError
from .pool import PARALLEL_RUN, pool_module
from .target import Target


@functools.cache
def _init_llvm() -> None:
    """Once per process: the native target and asm printer, and the C math library for the JIT.

    (``llvm.initialize()`` is gone in llvmlite ≥ 0.45: LLVM's core initializes itself.)
    """
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    for lib in ("m", "mvec", "pthread"):
        path = ctypes.util.find_library(lib)
        if path:
            try:
                llvm.load_library_permanently(path)
            except RuntimeError:  # e.g. a static-only libpthread: glibc ≥ 2.34 has it in libc anyway
                pass


#: The thread pool's compiled module, kept alive for the life of the process (its workers run its code).
_POOL: list = []


def _ensure_pool(target: Target) -> None:
    """Compile the thread pool (:func:`~polyc.codegen.pool.pool_module`) once per process and make
    ``polyc_parallel_run`` resolvable by every module compiled or loaded after it."""
    if not _POOL:
        pool = _compile(str(pool_module(target.triple)), target, 2)
        llvm.add_symbol(PARALLEL_RUN, pool.address(PARALLEL_RUN))
        _POOL.append(pool)


class JitModule:
    """A compiled module living in this process.

    - :meth:`address` gives a function's entry point (call it through ``ctypes.CFUNCTYPE``);
    - ``ir`` is the optimized LLVM IR text, ``asm`` the assembly (made on first use);
    - ``kernels``: names of the functions the module defines;
    - ``object_code``: the relocatable object MCJIT compiled (bytes), which :func:`load_object` loads again.

    Keep this object alive while any address is in use: dropping it frees the machine code.
    """

    def __init__(self, engine, module_ref, target_machine, kernels: tuple[str, ...], object_code: bytes,
                 ir_text: str = ""):
        self._engine = engine
        self._module = module_ref
        self._tm = target_machine
        self.kernels = kernels
        self.object_code = object_code
        self.ir = ir_text
        self._asm: str | None = None

    def address(self, name: str) -> int:
        """The address of function ``name`` (via ``ExecutionEngine.get_function_address``).

        Raises CompileError if the module does not define it.
        """
        addr = self._engine.get_function_address(name)
        if not addr:
            raise CompileError(f"jit: no function {name!r} in the compiled module "
                               f"(it defines {', '.join(self.kernels) or 'nothing'})")
        return addr

    @property
    def asm(self) -> str:
        """The module's assembly, from ``TargetMachine.emit_assembly`` on a copy of the optimized IR."""
        if self._asm is None:
            if not self.ir:
                return "; loaded from an object file: no assembly text"
            copy = llvm.parse_assembly(self.ir)
            self._asm = self._tm.emit_assembly(copy)
        return self._asm


def compile_module(module_or_ir_text, target: Target, opt_level: int = 3) -> JitModule:
    """Compile an llvmlite ``ir.Module`` (or LLVM IR text) for ``target`` and load it into this process.

    Steps: ``llvm.parse_assembly`` and ``ModuleRef.verify``; a ``TargetMachine`` with ``target.cpu`` and
    ``target.features`` (``jit=True``); the new pass manager's default module pipeline at ``opt_level``
    (``create_pipeline_tuning_options`` + ``create_pass_builder`` + ``getModulePassManager``, loop and SLP
    vectorization on from level 2); then ``create_mcjit_compiler`` and ``finalize_object``.

    Raises :class:`CompileError` naming the kernels when LLVM rejects the IR, the target is unknown, or a
    called external function cannot be resolved in this process.
    """
    _init_llvm()
    if not 0 <= opt_level <= 3:
        raise CompileError(f"jit: opt_level must be 0..3, got {opt_level}")
    _ensure_pool(target)
    return _compile(module_or_ir_text, target, opt_level)


def _compile(module_or_ir_text, target: Target, opt_level: int) -> JitModule:
    """:func:`compile_module` without the pool (which is compiled through here itself)."""
    text = str(module_or_ir_text) if isinstance(module_or_ir_text, ir.Module) else module_or_ir_text
    try:
        mod = llvm.parse_assembly(text)
    except RuntimeError as e:
        raise CompileError(f"jit: LLVM cannot parse the IR of {_names_in_text(text)}: {e}") from None
    kernels = tuple(f.name for f in mod.functions if not f.is_declaration)
    what = ", ".join(kernels) or "an empty module"
    try:
        mod.verify()
    except RuntimeError as e:
        raise CompileError(f"jit: invalid LLVM IR in {what}: {e}") from None
    try:
        tm = llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.features, opt=opt_level, reloc="default",
            codemodel="jitdefault", jit=True)
    except RuntimeError as e:
        raise CompileError(f"jit: cannot make a target machine for {target.triple} ({target.cpu}) "
                           f"to compile {what}: {e}") from None
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)

    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pto.loop_unrolling = opt_level >= 2
    pb = llvm.create_pass_builder(tm, pto)
    pb.getModulePassManager().run(mod, pb)
    debug.log(f"---- optimized llvm ({what}) ----\n{mod}", at=6)

    _check_externals(mod, what)
    ir_text = str(mod)
    objects: list[bytes] = []
    try:
        engine = llvm.create_mcjit_compiler(mod, tm)
        engine.set_object_cache(notify_func=lambda _module, data: objects.append(data))
        engine.finalize_object()
    except RuntimeError as e:
        raise CompileError(f"jit: MCJIT failed on {what}: {e}") from None
    return JitModule(engine, mod, tm, kernels, b"".join(objects), ir_text)


def load_object(object_code: bytes, target: Target) -> JitModule:
    """Load an object made by :func:`compile_module` (``JitModule.object_code``) into this process.

    Uses an MCJIT engine on an empty module and ``ExecutionEngine.add_object_file``; the object must have
    been compiled for the same ``target``. ``ir`` is empty and ``kernels`` unknown (empty) on the result.
    Raises CompileError if LLVM cannot read the object.
    """
    _init_llvm()
    _ensure_pool(target)
    try:
        tm = llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.features, opt=0, reloc="default", codemodel="jitdefault", jit=True)
        empty = llvm.parse_assembly(f'target triple = "{target.triple}"')
        engine = llvm.create_mcjit_compiler(empty, tm)
        engine.add_object_file(llvm.ObjectFileRef.from_data(bytes(object_code)))
        engine.finalize_object()
    except RuntimeError as e:
        raise CompileError(f"jit: cannot load a cached object for {target.triple}: {e}") from None
    return JitModule(engine, empty, tm, (), bytes(object_code))


def _check_externals(mod, what: str) -> None:
    """Every declared non-intrinsic function must resolve in-process (MCJIT would abort otherwise)."""
    for f in mod.functions:
        if f.is_declaration and not f.name.startswith("llvm.") and not llvm.address_of_symbol(f.name):
            raise CompileError(f"jit: {what} calls {f.name!r}, which is not found in this process",
                               hint="the C library providing it must be loaded (libm, glibc)")


def _names_in_text(text: str) -> str:
    names = [line.split("@", 1)[1].split("(", 1)[0].strip('"') for line in text.splitlines()
             if line.startswith("define ") and "@" in line]
    return ", ".join(names) or "the module"
