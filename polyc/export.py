"""Ahead-of-time export: a compiled kernel or model as a C library that runs without Python.

:func:`export_kernel` (a def at given sizes) and :func:`polyc.onnx.export.export_model` (a whole model) write into
a directory:

- ``lib<name>.so``: the shared library; it needs only libc, libm (with glibc's libmvec, where the kernels call
  vector math) and pthreads, and exports only the functions of the header;
- ``<name>.o``: the same code as one relocatable object, to link statically (``cc main.c <name>.o -lmvec -lm
  -lpthread``);
- ``<name>.h``: the C declarations, the tensors' shapes and dtypes, the status codes and a usage example.

The code is what the in-process JIT runs (the same pipeline and kernels, :func:`polyc.program.program_objects`),
compiled as position-independent code for the same CPU (the host's, or ``POLYC_CPU``): the library checks the
CPU's features on every call and returns :data:`STATUS_CPU` rather than fault on a machine without them. A
model's weights (and the copies of them its kernels read packed) are embedded in the library (``.incbin``), so
there is no file to find at run time. The parallel loops run on polyc's thread pool, compiled into the library
(:mod:`polyc.codegen.pool`), with the thread count fixed at export (``Options.threads``, default the exporting
machine's usable cores).

The C glue (argument tables, the CPU check, copying outputs) is generated C compiled by the system C compiler
(``cc``, or ``$CC``), which also links the library; raises :class:`~polyc.errors.PolycError` naming what is
missing when there is none.
"""
from __future__ import annotations

import ctypes.util
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from . import env
from .codegen import compile_object, new_module, pool_object
from .errors import PolycError
from .kernel import Kernel, symbolic_sizes
from .lang.ast import itemsize
from .options import Options
from .pipeline import COMPILE_LOCK, c_interface, emit, lower, resolve_options
from .program import KernelCall, ProgramObjects, program_objects
from .runtime.records import polyc_version
from .target import host_target

#: Status codes the exported functions return (also in the header).
STATUS_OK, STATUS_INDEX, STATUS_MEMORY, STATUS_ARGUMENT, STATUS_CPU = 0, 1, 2, 3, 4

#: C type of each dtype (bool is one byte; float16/bfloat16 are their 16-bit patterns).
C_TYPES = {"bool": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
           "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t",
           "float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double"}

#: ``__builtin_cpu_supports`` names checked when the target has the LLVM feature of the same name.
_CPU_FEATURES = ("sse4.2", "avx", "avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl")


@dataclass(frozen=True)
class Tensor:
    """A tensor of an exported function's interface: its ONNX or def ``name``, ``dtype`` and ``shape``."""

    name: str
    dtype: str
    shape: tuple

    @property
    def nbytes(self) -> int:
        count = 1
        for extent in self.shape:
            count *= extent
        return count * itemsize(self.dtype)

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} [{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class Library:
    """What an export wrote: ``library`` (``lib<name>.so``), ``object`` (``<name>.o``), ``header``
    (``<name>.h``), the C ``name`` prefix of its functions, the ``inputs`` and ``outputs``
    (:class:`Tensor`)."""

    library: Path
    object: Path
    header: Path
    name: str
    inputs: tuple
    outputs: tuple


def c_name(name: str) -> str:
    """``name`` as a C identifier: other characters become ``_``, a leading digit gets a ``_`` in front."""
    ident = re.sub(r"\W", "_", name, flags=re.ASCII) or "model"
    return "_" + ident if ident[0].isdigit() else ident


def c_compiler() -> str:
    """The C compiler that compiles the glue and links the library: ``$CC``, else ``cc``. Raises PolycError
    when there is none."""
    found = shutil.which(env.c_compiler())
    if found is None:
        raise PolycError(f"polyc export needs a C compiler to link the library; '{env.c_compiler()}' was not "
                         "found", hint="install gcc or clang, or set CC to one")
    return found


def cpu_check(target) -> str:
    """The C condition that the running CPU has the features the code was compiled for."""
    have = set(f[1:] for f in target.features.split(",") if f.startswith("+"))
    names = [f for f in _CPU_FEATURES if f in have]
    return " && ".join(f'__builtin_cpu_supports("{f}")' for f in names) or "1"


def shared_objects(name: str, kernels, calls, n_slots: int, options: Options, on_kernel=None,
                   constant_slots: frozenset = frozenset()) -> tuple[ProgramObjects, Options]:
    """:func:`~polyc.program.program_objects` of a program (its arguments) as position-independent objects for a
    library, and the options they were compiled with (the thread count resolved)."""
    options = resolve_options(options, host_target())
    with COMPILE_LOCK:
        return program_objects(name, kernels, calls, n_slots, options, on_kernel, constant_slots, shared=True), \
            options


def export_kernel(source: str, sizes: dict, directory, name: str | None = None, options: Options | None = None,
                  def_name: str | None = None) -> Library:
    """Export the def ``def_name`` of ``source`` at ``sizes`` (size name -> extent) to ``directory`` as the C
    function ``int <name>(const T *input..., T *output...)`` (``name`` defaults to the def's). Outputs are
    written whole; temporaries are allocated and freed by the function (:data:`STATUS_MEMORY` when that
    fails). Raises what compiling raises, ShapeError for a missing size, PolycError without a C compiler."""
    kernel = Kernel(source, def_name, options)
    specs = kernel.signature(sizes)  # ShapeError for a missing size
    sizes = {n: int(sizes[n]) for n in kernel.checked.sizes}
    cname = c_name(name or kernel.name)
    calls = [KernelCall(0, tuple((i, 0) for i in range(len(specs))))]
    made, options = shared_objects(f"{cname}_entry", [(kernel, sizes)], calls, len(specs), kernel.options)
    inputs = tuple(Tensor(t.name, t.dtype, tuple(t.shape)) for t in specs if t.role == "input")
    outputs = tuple(Tensor(t.name, t.dtype, tuple(t.shape)) for t in specs if t.role == "output")
    temps = [Tensor(t.name, t.dtype, tuple(t.shape)) for t in specs if t.role == "temp"]
    params = [f"const {C_TYPES[t.dtype]} *{c_name(t.name)}" for t in inputs] + \
        [f"{C_TYPES[t.dtype]} *{c_name(t.name)}" for t in outputs]
    signature = f"int {cname}({', '.join(params)})"
    slots = [c_name(t.name) for t in inputs + outputs]
    body = [f"    void *buffers[{max(1, len(specs))}];"]
    body += [f"    buffers[{i}] = (void *){s};" for i, s in enumerate(slots)]
    body.append(f"    if ({' || '.join(f'!{s}' for s in slots) or '0'}) return {STATUS_ARGUMENT};")
    body += _call_with_temps("buffers", len(slots), [f"1, {max(1, t.nbytes)}" for t in temps],
                             f"{cname}_entry(buffers)")
    glue = [f"extern int {cname}_entry(void **buffers);", "", f"{signature} {{",
            f"    if (!({cpu_check(kernel.target)})) return {STATUS_CPU};", *body, "}"]
    usage = [f"{C_TYPES[t.dtype]} {c_name(t.name)}[{t.nbytes // itemsize(t.dtype)}];  // {t.describe()}"
             for t in inputs + outputs]
    usage.append(f"int status = {cname}({', '.join(slots)});  // {STATUS_OK}: done")
    about = f"the def '{kernel.name}' at {', '.join(f'{k}={v}' for k, v in sizes.items())}"
    declarations = [f"{signature};"]
    return write_library(directory, cname, made.objects, "\n".join(glue), declarations, about, usage,
                         inputs, outputs, kernel.target, options)


def export_generic_kernel(source: str, hint: dict, directory, name: str | None = None,
                          options: Options | None = None, def_name: str | None = None, fixed=()) -> Library:
    """Export the def ``def_name`` of ``source`` as a generic kernel (:meth:`polyc.Kernel.generic`, its schedule
    decided at the sizes ``hint``; ``fixed`` sizes keep the hint's value) to ``directory``: the C function
    ``int <name>(const T *input..., T *output..., int64_t size...)`` with the def's sizes, in declaration order,
    after the tensors; ``<name>_extent(size..., int tensor, int dim)`` gives the extent of dimension ``dim``
    of tensor ``tensor`` (inputs then outputs, in order) at those sizes. Sizes outside what the kernel serves
    (an empty range, a size above 2^24) return :data:`STATUS_ARGUMENT`. Raises like :func:`export_kernel`."""
    kernel = Kernel(source, def_name, options)
    hint = kernel._every_size(hint)
    options = resolve_options(kernel.options.replace(generic=True), host_target())
    fixed = {n: hint[n] for n in kernel.checked.sizes if n in set(fixed)}
    target = kernel.target
    cname = c_name(name or kernel.name)
    with COMPILE_LOCK:
        lowered = lower(kernel.checked, symbolic_sizes(hint, fixed), options, target)
        module = new_module(target)
        emit(module, lowered, f"{cname}_kernel", target, options)
        code = compile_object(module, target, options.opt_level, options.unroll != 0, shared=True)
    scop = lowered.scop
    names = [n for n in kernel.checked.sizes if n not in fixed]
    params, shapes, context = c_interface(lowered)
    tensors = [t for t in scop.tensors if t.role != "local"]
    inputs = tuple(Tensor(t.name, t.dtype, shapes[t.name]) for t in tensors if t.role == "input")
    outputs = tuple(Tensor(t.name, t.dtype, shapes[t.name]) for t in tensors if t.role == "output")
    temps = [t for t in tensors if t.role == "temp"]
    size_args = ", ".join(f"int64_t {params[n]}" for n in names)
    args = [f"const {C_TYPES[t.dtype]} *{c_name(t.name)}" for t in inputs] + \
        [f"{C_TYPES[t.dtype]} *{c_name(t.name)}" for t in outputs]
    signature = f"int {cname}({', '.join(args + [f'int64_t {params[n]}' for n in names])})"
    extent_signature = f"int64_t {cname}_extent({size_args}{', ' if names else ''}int tensor, int dim)"
    slots = [c_name(t.name) for t in inputs + outputs]
    n = len(tensors)
    body = [f"    if ({' || '.join(f'!{s}' for s in slots) or '0'}) return {STATUS_ARGUMENT};",
            f"    if (!({context})) return {STATUS_ARGUMENT};",
            f"    void *args[{n + 1}];", f"    int64_t sizes[{max(1, len(scop.params))}] = "
            f"{{{', '.join(params[p] for p in scop.params) or '0'}}};"]
    body += [f"    args[{i}] = (void *){s};" for i, s in enumerate(slots)]
    body.append(f"    args[{n}] = sizes;")
    counts = [" * ".join(f"(size_t)({e})" for e in shapes[t.name]) or "1" for t in temps]
    body += _call_with_temps("args", len(slots), [f"{c} + 1, {itemsize(t.dtype)}" for c, t in zip(counts, temps)],
                             f"{cname}_kernel(args)")
    cases = []
    for i, t in enumerate(inputs + outputs):
        dims = " ".join(f"if (dim == {d}) return {e};" for d, e in enumerate(t.shape))
        cases.append(f"    if (tensor == {i}) {{ {dims} }}")
    glue = ["#define floord(n, d) (((n) < 0) ? -((-(n) + (d) - 1) / (d)) : (n) / (d))",
            "#define min(a, b) ((a) < (b) ? (a) : (b))", "#define max(a, b) ((a) > (b) ? (a) : (b))",
            f"extern int {cname}_kernel(void **args);", "", f"{signature} {{",
            f"    if (!({cpu_check(target)})) return {STATUS_CPU};", *body, "}", "",
            f"{extent_signature} {{", *cases, "    return -1;", "}"]
    usage = [f"// {t.describe()}" for t in inputs + outputs]
    usage.append(f"int status = {cname}({', '.join(slots + [params[n] for n in names])});  // {STATUS_OK}: done")
    about = (f"the def '{kernel.name}' for every size ({', '.join(names)} are arguments; schedule decided at "
             f"{', '.join(f'{k}={v}' for k, v in hint.items())})")
    return write_library(directory, cname, [code], "\n".join(glue), [f"{signature};", f"{extent_signature};"],
                         about, usage, inputs, outputs, target, options)


def _call_with_temps(array: str, first: int, callocs: list, call: str) -> list:
    """C lines that allocate the temporaries (``calloc(<callocs[k]>)`` into ``array[first + k]``), return
    :data:`STATUS_MEMORY` when one fails, else ``call``'s status, and free them."""
    slots = [f"{array}[{first + k}]" for k in range(len(callocs))]
    if not slots:
        return [f"    return {call};"]
    lines = [f"    {s} = calloc({c});" for s, c in zip(slots, callocs)]
    lines.append(f"    int status = ({' || '.join(f'!{s}' for s in slots)}) ? {STATUS_MEMORY} : {call};")
    return lines + [f"    free({s});" for s in slots] + ["    return status;"]


def write_library(directory, name: str, objects, glue: str, declarations: list, about: str, usage: list,
                  inputs, outputs, target, options: Options, blob: bytes = b"",
                  blob_symbol: str = "") -> Library:
    """Write ``lib<name>.so``, ``<name>.o`` and ``<name>.h`` into ``directory`` (created): ``objects`` (from
    :func:`~polyc.program.program_objects` with ``shared=True``) and the thread pool, the C ``glue`` (which
    defines the ``declarations``), and ``blob`` (a model's constants) as the 64-byte aligned array
    ``blob_symbol``. The header says what the library computes (``about``), for which CPU, and how to call it
    (``usage``: C lines). Only the declared functions are exported. Raises PolycError when the C compiler
    fails (with its message)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cc = c_compiler()
    header = directory / f"{name}.h"
    header.write_text(_header(name, declarations, about, usage, inputs, outputs, target, options))
    exported = [m.group(1) for m in (re.search(r"(\w+)\(", d) for d in declarations if not d.startswith("#"))
                if m]
    with tempfile.TemporaryDirectory(prefix="polyc-export-") as tmp:
        tmp = Path(tmp)
        paths = []
        for i, code in enumerate([*objects, pool_object(target)]):
            paths.append(tmp / f"part{i}.o")
            paths[-1].write_bytes(code)
        (tmp / "glue.c").write_text(f'#include <stdint.h>\n#include <stdlib.h>\n#include <string.h>\n'
                                    f'#include "{header.name}"\n\n{glue}\n')
        _run([cc, "-std=c11", "-O2", "-fPIC", "-I", str(directory), "-c", str(tmp / "glue.c"), "-o",
              str(tmp / "glue.o")])
        paths.append(tmp / "glue.o")
        if blob_symbol:
            (tmp / "blob.bin").write_bytes(blob)
            (tmp / "blob.S").write_text(f'    .section .rodata\n    .balign 64\n    .globl {blob_symbol}\n'
                                        f'{blob_symbol}:\n    .incbin "{tmp / "blob.bin"}"\n'
                                        f'    .section .note.GNU-stack,"",@progbits\n')
            _run([cc, "-c", str(tmp / "blob.S"), "-o", str(tmp / "blob.o")])
            paths.append(tmp / "blob.o")
        obj = directory / f"{name}.o"
        _run([cc, "-r", "-nostdlib", "-o", str(obj), *map(str, paths)])
        objcopy = shutil.which("objcopy")
        if objcopy:  # only the API stays global: two exported libraries link into one program
            _run([objcopy, *[f"--keep-global-symbol={s}" for s in exported], str(obj)])
        script = tmp / "exports.map"
        script.write_text("{\n  global:\n" + "".join(f"    {s};\n" for s in exported) + "  local: *;\n};\n")
        library = directory / f"lib{name}.so"
        _run([cc, "-shared", "-o", str(library), str(obj), f"-Wl,--version-script={script}", "-Wl,-z,noexecstack",
              *_libraries()])
    return Library(library, obj, header, name, tuple(inputs), tuple(outputs))


def _libraries() -> list[str]:
    """The libraries an exported library links: glibc's libmvec where it exists, libm, pthreads."""
    mvec = [] if not _has_library("mvec") else ["-lmvec"]
    return [*mvec, "-lm", "-lpthread"]


def _has_library(lib: str) -> bool:
    return ctypes.util.find_library(lib) is not None


def _run(command: list) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise PolycError(f"polyc export: '{Path(command[0]).name} {' '.join(map(str, command[1:4]))} ...' failed "
                         f"(exit status {done.returncode}):\n{(done.stderr or done.stdout).strip()[:2000]}")


def _header(name: str, declarations: list, about: str, usage: list, inputs, outputs, target,
            options: Options) -> str:
    guard = f"POLYC_{name.upper()}_H"
    lines = [f"/* {name}.h: {about}, exported by polyc {polyc_version()}.",
             " *",
             f" * Code for CPU {target.cpu or 'generic'} ({target.vector_bits}-bit vectors), "
             f"{options.threads} thread{'s' if options.threads != 1 else ''} in its parallel loops.",
             " * Inputs:"]
    lines += [f" *   {i}. {t.describe()}" for i, t in enumerate(inputs)]
    lines.append(" * Outputs:")
    lines += [f" *   {i}. {t.describe()}" for i, t in enumerate(outputs)]
    lines += [" * Arrays are C-contiguous (row-major), in the dtype's C type (float16/bfloat16: uint16_t bits).",
              " *",
              " * Status codes: 0 done; 1 an index read at run time was out of range (nothing was read out of",
              " * bounds; outputs are incomplete); 2 out of memory; 3 a NULL or misaligned argument; 4 this CPU",
              " * lacks an instruction set the code was compiled for. Calls may run at once from several",
              " * threads when they pass different output and workspace arrays.",
              " *",
              " * Usage:"]
    lines += [f" *   {line}" for line in usage]
    lines += [f" * Link: cc main.c -L. -l{name} -Wl,-rpath,'$ORIGIN'   (or statically: cc main.c {name}.o "
              f"{' '.join(_libraries())})", " */",
              f"#ifndef {guard}", f"#define {guard}", "", "#include <stddef.h>", "#include <stdint.h>", "",
              "#ifdef __cplusplus", 'extern "C" {', "#endif", "",
              f"#define {name.upper()}_OK {STATUS_OK}", f"#define {name.upper()}_INDEX_OUT_OF_RANGE {STATUS_INDEX}",
              f"#define {name.upper()}_OUT_OF_MEMORY {STATUS_MEMORY}",
              f"#define {name.upper()}_BAD_ARGUMENT {STATUS_ARGUMENT}",
              f"#define {name.upper()}_UNSUPPORTED_CPU {STATUS_CPU}", ""]
    lines += declarations
    lines += ["", "#ifdef __cplusplus", "}", "#endif", f"#endif /* {guard} */", ""]
    return "\n".join(lines)

