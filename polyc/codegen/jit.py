"""LLVM IR → native code in this process: parse, verify, optimize (new pass manager), MCJIT.

:func:`compile_module` returns a :class:`JitModule` that owns the execution engine; the addresses it hands
out stay valid while it lives. The machine code is for the :class:`~polyc.target.Target` (the
host: its CPU name and features, so AVX2/AVX-512 and FMA are used).

External symbols the generated code calls (libm's ``tanhf``/``erff``..., libmvec's vector functions) are
resolved in-process; libm is loaded with ``llvm.load_library_permanently``. ``polyc_parallel_run``, which
every parallel loop calls, is the thread pool of :mod:`polyc.codegen.pool`: compiled once per process, before
the first kernel, and registered with ``llvm.add_symbol``. A symbol that cannot be resolved raises
:class:`~polyc.errors.CompileError` before MCJIT would abort the process.

Memory: a module is optimized, turned into a relocatable object (``TargetMachine.emit_object``) and its LLVM
IR freed at once; the object is then loaded exactly like a disk-cache hit (an MCJIT engine over an empty
module), so a live :class:`JitModule` holds only its machine code, the object bytes and the optimized IR
text. (llvmlite 0.50's new-pass-manager pipeline itself leaks about 60 KiB inside LLVM per run, which no
caller can free; ``tests/codegen/test_jit_memory.py`` bounds the growth per compiled kernel.)

Objects are checked before LLVM sees them (:func:`check_object`: a well-formed ELF relocatable object for
this machine whose sections, symbols and relocations lie inside the file and which defines the expected
functions): LLVM's object loader trusts its input and crashes the process on a malformed one.

Thread safety: LLVM's global context and target machines are not thread-safe, so every LLVM call of this
module runs under one process-wide lock; calling the compiled code needs no lock.
"""
from __future__ import annotations

import ctypes.util
import functools
import struct
import threading

import llvmlite.binding as llvm
from llvmlite import ir

from .. import debug
from ..errors import CompileError
from .pool import PARALLEL_RUN, pool_module
from ..target import Target

#: Serializes every LLVM call of this module (LLVM's global context is not thread-safe).
_LOCK = threading.RLock()


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
    ``polyc_parallel_run`` resolvable by every module compiled or loaded after it. Call under ``_LOCK``."""
    if not _POOL:
        pool = _compile(str(pool_module(target.triple)), target, 2)
        llvm.add_symbol(PARALLEL_RUN, pool.address(PARALLEL_RUN))
        _POOL.append(pool)


def _target_machine(target: Target, opt_level: int, shared: bool = False):
    """LLVM's target machine for ``target``: for this process's JIT, or (``shared``) for position-independent
    code with the small code model, which a shared library can hold."""
    if shared:
        return llvm.Target.from_triple(target.triple).create_target_machine(
            cpu=target.cpu, features=target.features, opt=opt_level, reloc="pic", codemodel="default")
    return llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=opt_level, reloc="default", codemodel="jitdefault",
        jit=True)


class JitModule:
    """A compiled module living in this process.

    - :meth:`address` gives a function's entry point (call it through ``ctypes.CFUNCTYPE``);
    - ``ir`` is the optimized LLVM IR text (empty when loaded from an object), ``asm`` the assembly (made on
      first use);
    - ``kernels``: names of the functions the module defines (those asked for, when loaded from an object);
    - ``object_code``: the relocatable object (bytes), which :func:`load_object` loads again.

    Keep this object alive while any address is in use: dropping it frees the machine code.
    """

    def __init__(self, engine, target: Target, kernels: tuple[str, ...], object_code: bytes,
                 ir_text: str = "", opt_level: int = 3):
        self._engine = engine
        self._target = target
        self._opt_level = opt_level
        self.kernels = kernels
        self.object_code = object_code
        self.ir = ir_text
        self._asm: str | None = None
        self._source: tuple[str, bool] | None = None  # (unoptimized IR, unroll) of a loaded object, for asm

    def address(self, name: str) -> int:
        """The address of function ``name`` (via ``ExecutionEngine.get_function_address``).

        Raises CompileError if the module does not define it.
        """
        with _LOCK:
            addr = self._engine.get_function_address(name)
        if not addr:
            raise CompileError(f"jit: no function {name!r} in the compiled module "
                               f"(it defines {', '.join(self.kernels) or 'nothing'})")
        return addr

    @property
    def asm(self) -> str:
        """The module's assembly, from ``TargetMachine.emit_assembly`` on a copy of the optimized IR (for a
        module loaded from an object, the IR it was compiled from optimized again, when the loader gave it)."""
        if self._asm is None:
            with _LOCK:
                if self.ir:
                    copy = llvm.parse_assembly(self.ir)
                elif self._source is not None:
                    text, unroll = self._source
                    copy, machine, _ = _optimize(text, self._target, self._opt_level, unroll)
                    machine.close()
                else:
                    return "; loaded from an object file: no assembly text"
                self._asm = _target_machine(self._target, self._opt_level).emit_assembly(copy)
        return self._asm


def compile_module(module_or_ir_text, target: Target, opt_level: int = 3, unroll: bool = True) -> JitModule:
    """Compile an llvmlite ``ir.Module`` (or LLVM IR text) for ``target`` and load it into this process.

    Steps: ``llvm.parse_assembly`` and ``ModuleRef.verify``; a ``TargetMachine`` with ``target.cpu`` and
    ``target.features`` (``jit=True``); the new pass manager's default module pipeline at ``opt_level``
    (``create_pipeline_tuning_options`` + ``create_pass_builder`` + ``getModulePassManager``, loop and SLP
    vectorization on from level 2, loop unrolling too unless ``unroll`` is False); ``TargetMachine.emit_object``,
    the IR freed; then the object loaded by
    an MCJIT engine (as :func:`load_object` does). Thread-safe (serialized).

    Raises :class:`CompileError` naming the kernels when LLVM rejects the IR, the target is unknown, or a
    called external function cannot be resolved in this process.
    """
    text = _ir_text(module_or_ir_text, opt_level)
    with _LOCK:
        _init_llvm()
        _ensure_pool(target)
        return _compile(text, target, opt_level, unroll)


def _ir_text(module_or_ir_text, opt_level: int) -> str:
    """The IR text of an ``ir.Module`` (or the text given); CompileError for an opt level outside 0..3."""
    if not 0 <= opt_level <= 3:
        raise CompileError(f"jit: opt_level must be 0..3, got {opt_level}")
    return str(module_or_ir_text) if isinstance(module_or_ir_text, ir.Module) else module_or_ir_text


def compile_object(module_or_ir_text, target: Target, opt_level: int = 3, unroll: bool = True,
                   linked: frozenset = frozenset(), shared: bool = False) -> bytes:
    """:func:`compile_module` up to the relocatable object, without loading it: the object code (bytes) for
    :func:`load_objects`, here or in another process of the same machine (a compile worker). ``linked``: the
    functions the module declares that other objects loaded with it define. ``shared``: position-independent
    code for a shared library (:mod:`polyc.export`) instead of this process's JIT. Thread-safe (serialized);
    raises like :func:`compile_module`."""
    text = _ir_text(module_or_ir_text, opt_level)
    with _LOCK:
        _init_llvm()
        _ensure_pool(target)
        return _emit_object(text, target, opt_level, unroll, linked, shared)[0]


def pool_object(target: Target) -> bytes:
    """The thread pool (:func:`~polyc.codegen.pool.pool_module`, defining ``polyc_parallel_run``) as
    position-independent object code for a shared library."""
    with _LOCK:
        _init_llvm()
        return _emit_object(str(pool_module(target.triple)), target, 2, True, shared=True)[0]


def _compile(text: str, target: Target, opt_level: int, unroll: bool = True) -> JitModule:
    """:func:`compile_module` without the pool (which is compiled through here itself). Call under ``_LOCK``."""
    object_code, kernels, ir_text = _emit_object(text, target, opt_level, unroll)
    return _load([object_code], target, kernels, ir_text, opt_level)


def _emit_object(text: str, target: Target, opt_level: int, unroll: bool, linked: frozenset = frozenset(),
                 shared: bool = False) -> tuple[bytes, tuple[str, ...], str]:
    """Optimize ``text`` and emit its object: ``(object code, the functions it defines, optimized IR text)``.
    Call under ``_LOCK``."""
    mod, tm, kernels = _optimize(text, target, opt_level, unroll, shared)
    what = ", ".join(kernels) or "an empty module"
    _check_externals(mod, what, linked)
    ir_text = str(mod)
    try:
        object_code = bytes(tm.emit_object(mod))
    except RuntimeError as e:
        raise CompileError(f"jit: LLVM cannot generate code for {what}: {e}") from None
    finally:
        mod.close()
        tm.close()
    return object_code, kernels, ir_text


def _optimize(text: str, target: Target, opt_level: int, unroll: bool, shared: bool = False):
    """Parse, verify and optimize ``text``: ``(module, target machine, names of the functions it defines)``.
    Call under ``_LOCK``."""
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
        tm = _target_machine(target, opt_level, shared)
    except RuntimeError as e:
        raise CompileError(f"jit: cannot make a target machine for {target.triple} ({target.cpu}) "
                           f"to compile {what}: {e}") from None
    mod.triple = target.triple
    mod.data_layout = str(tm.target_data)

    pto = llvm.create_pipeline_tuning_options(speed_level=opt_level)
    pto.loop_vectorization = opt_level >= 2
    pto.slp_vectorization = opt_level >= 2
    pto.loop_unrolling = opt_level >= 2 and unroll
    pb = llvm.create_pass_builder(tm, pto)
    mpm = pb.getModulePassManager()
    mpm.run(mod, pb)
    mpm.close()
    pb.close()
    pto.close()
    debug.log(f"---- optimized llvm ({what}) ----\n{mod}", at=6)
    return mod, tm, kernels


def _load(objects: list[bytes], target: Target, kernels: tuple[str, ...], ir_text: str = "",
          opt_level: int = 3) -> JitModule:
    """An MCJIT engine over an empty module with ``objects`` added (their symbols resolve each other's
    references when the engine is finalized). Call under ``_LOCK``."""
    try:
        tm = _target_machine(target, 0)
        empty = llvm.parse_assembly(f'target triple = "{target.triple}"')
        engine = llvm.create_mcjit_compiler(empty, tm)
        for object_code in objects:
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
        engine.finalize_object()
    except RuntimeError as e:
        raise CompileError(f"jit: cannot load an object for {target.triple} "
                           f"({', '.join(kernels) or 'no kernel named'}): {e}") from None
    return JitModule(engine, target, kernels, b"".join(objects) if len(objects) > 1 else objects[0], ir_text,
                     opt_level)


def load_object(object_code: bytes, target: Target, symbols: tuple[str, ...] = (), source: str = "",
                opt_level: int = 3, unroll: bool = True) -> JitModule:
    """Load an object made by :func:`compile_module` (``JitModule.object_code``) into this process.

    The object is first checked by :func:`check_object` (it must be an ELF relocatable object for
    ``target``'s machine that defines every function in ``symbols``), then loaded by an MCJIT engine on an
    empty module (``ExecutionEngine.add_object_file``). ``ir`` is empty on the result and ``kernels`` is
    ``symbols``; ``source`` (optional) is the LLVM IR the object was compiled from with ``opt_level`` and
    ``unroll``, from which ``asm`` is made on demand. Thread-safe (serialized). Raises CompileError if the
    object is malformed, lacks a symbol, or LLVM cannot load it.
    """
    object_code = bytes(object_code)
    check_object(object_code, target, symbols)
    with _LOCK:
        _init_llvm()
        _ensure_pool(target)
        jit = _load([object_code], target, tuple(symbols), opt_level=opt_level)
    jit._source = (source, unroll) if source else None
    return jit


def load_objects(objects, target: Target, symbols: tuple[str, ...] = ()) -> JitModule:
    """Load several objects (:func:`compile_object`) into one MCJIT engine, linked together: a call from one
    object to a function another defines resolves when the engine is finalized. Each object is checked
    (:func:`check_object`); ``symbols`` (the functions the caller will ask for) must be defined by one of them.
    ``object_code`` of the result is the objects concatenated (not loadable as one: keep the list). Thread-safe
    (serialized). Raises CompileError like :func:`load_object`, or when two objects define the same function."""
    objects = [bytes(o) for o in objects]
    defined: dict[str, int] = {}
    needed: set[str] = set()
    for i, object_code in enumerate(objects):
        exported, undefined = check_object(object_code, target)
        needed |= undefined
        for name in exported:
            if name in defined:
                raise CompileError(f"jit: objects {defined[name]} and {i} both define {name!r}")
            defined[name] = i
    missing = [s for s in symbols if s not in defined]
    if missing:
        raise CompileError(f"jit: no object defines {', '.join(map(repr, missing))}")
    with _LOCK:
        _init_llvm()
        _ensure_pool(target)
        unresolved = sorted(n for n in needed - defined.keys() if not llvm.address_of_symbol(n))
        if unresolved:  # MCJIT would abort the process
            raise CompileError(f"jit: the objects call {', '.join(map(repr, unresolved))}, which no object "
                               "defines and this process does not have")
        return _load(objects, target, tuple(symbols))


# ---- checking an object before LLVM reads it ---------------------------------------------------------

#: ELF ``e_machine`` of the architectures LLVM JITs for, by the triple's first component.
_ELF_MACHINES = {"x86_64": 62, "aarch64": 183, "arm64": 183, "riscv64": 243, "ppc64le": 21, "s390x": 22}
_SHT_SYMTAB, _SHT_STRTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 3, 4, 8, 9


def check_object(data: bytes, target: Target, symbols: tuple[str, ...] = ()) -> tuple[set, set]:
    """Check that ``data`` is a well-formed 64-bit little-endian ELF relocatable object for ``target``'s
    machine, every section (and the section header table) lies inside the file, the symbol table's names,
    section indices and every relocation's symbol and offset are in range, and each name in ``symbols`` is a
    defined function. Returns ``(exported, undefined)``: the names of the global functions it defines and
    of the symbols it needs from elsewhere. Raises CompileError saying what is wrong (the object must then not
    be loaded)."""
    try:
        return _check_elf(data, target, symbols)
    except struct.error as e:
        raise CompileError(f"jit: malformed object: truncated ({e})") from None


def _check_elf(data: bytes, target: Target, symbols: tuple[str, ...]) -> tuple[set, set]:
    def bad(why: str):
        return CompileError(f"jit: malformed object ({len(data)} bytes): {why}",
                            hint="a corrupt or foreign object is never loaded; it is recompiled")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise bad("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise bad("not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", data, 16)
    machine = _ELF_MACHINES.get(target.triple.split("-", 1)[0])
    if e_type != 1:
        raise bad(f"ELF type {e_type}, expected 1 (relocatable)")
    if machine is not None and e_machine != machine:
        raise bad(f"ELF machine {e_machine}, expected {machine} for {target.triple}")
    e_shoff, = struct.unpack_from("<Q", data, 40)
    e_shentsize, e_shnum, e_shstrndx = struct.unpack_from("<HHH", data, 58)
    if e_shentsize != 64 or not 0 < e_shnum < 65280 or e_shoff + e_shnum * 64 > len(data):
        raise bad("section header table outside the file")
    if e_shstrndx >= e_shnum:
        raise bad("section name table index out of range")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + 64 * i) for i in range(e_shnum)]
    for i, (_name, kind, _flags, _addr, offset, size, link, _info, _align, _entsize) in enumerate(sections):
        if kind != _SHT_NOBITS and (offset > len(data) or size > len(data) - offset):
            raise bad(f"section {i} lies outside the file")
        if link >= e_shnum:
            raise bad(f"section {i} links to section {link} of {e_shnum}")
    defined: set[str] = set()
    exported: set[str] = set()
    undefined: set[str] = set()
    n_symbols: dict[int, int] = {}
    for i, (_name, kind, _flags, _addr, offset, size, link, _info, _align, entsize) in enumerate(sections):
        if kind != _SHT_SYMTAB:
            continue
        if entsize != 24 or size % 24:
            raise bad(f"symbol table {i} has entries of {entsize} bytes")
        if sections[link][1] != _SHT_STRTAB:
            raise bad(f"symbol table {i} names its strings in a section that is not a string table")
        str_off, str_size = sections[link][4], sections[link][5]
        n_symbols[i] = size // 24
        for k in range(size // 24):
            st_name, st_info, _other, st_shndx = struct.unpack_from("<IBBH", data, offset + 24 * k)
            if st_name >= max(str_size, 1) or (st_shndx >= e_shnum and st_shndx < 0xFF00):
                raise bad(f"symbol {k} has a name or section index out of range")
            end = data.find(b"\0", str_off + st_name, str_off + str_size)
            if end < 0:
                raise bad(f"symbol {k}'s name is not terminated")
            name = data[str_off + st_name:end].decode("utf-8", "replace")
            if st_shndx != 0 and st_info & 0xF == 2:  # a defined function
                defined.add(name)
                if st_info >> 4 != 0:  # not a local one
                    exported.add(name)
            elif st_shndx == 0 and name:
                undefined.add(name)
    for i, (_name, kind, _flags, _addr, offset, size, link, info, _align, entsize) in enumerate(sections):
        if kind not in (_SHT_RELA, _SHT_REL):
            continue
        width = 24 if kind == _SHT_RELA else 16
        if entsize != width or size % width or link not in n_symbols or info >= e_shnum:
            raise bad(f"relocation section {i} is inconsistent")
        patched = sections[info][5]
        for k in range(size // width):
            r_offset, r_info = struct.unpack_from("<QQ", data, offset + width * k)
            if r_offset >= patched or (r_info >> 32) >= n_symbols[link]:
                raise bad(f"relocation {k} of section {i} is out of range")
    missing = [name for name in symbols if name not in defined]
    if missing:
        raise bad(f"it does not define {', '.join(missing)}")
    return exported, undefined


def _check_externals(mod, what: str, linked: frozenset = frozenset()) -> None:
    """Every declared non-intrinsic function but those in ``linked`` must resolve in-process (MCJIT would
    abort otherwise)."""
    for f in mod.functions:
        if f.is_declaration and not f.name.startswith("llvm.") and f.name not in linked \
                and not llvm.address_of_symbol(f.name):
            raise CompileError(f"jit: {what} calls {f.name!r}, which is not found in this process",
                               hint="the C library providing it must be loaded (libm, glibc)")


def _names_in_text(text: str) -> str:
    names = [line.split("@", 1)[1].split("(", 1)[0].strip('"') for line in text.splitlines()
             if line.startswith("define ") and "@" in line]
    return ", ".join(names) or "the module"
