"""``polyc export MODEL.onnx``: a whole model as a C library (:mod:`polyc.export` describes the files).

The library's entry point runs the model's native program, the one :class:`~polyc.onnx.native.NativeExecutor`
runs in-process, on buffers the caller owns::

    size_t <name>_workspace_bytes(void);      // the arena of intermediates (a multiple of 64)
    int <name>_run(const void *const *inputs, void *const *outputs, void *workspace);

``inputs`` and ``outputs`` hold one pointer per graph input and output in the model's order (C-contiguous
arrays of the shapes and dtypes the header lists); ``workspace`` is 64-byte aligned, of
``<name>_workspace_bytes()`` bytes, its contents irrelevant; the result is a status code (0: done). The weights
(and the copies of them the kernels read packed, made here once) are embedded in the library. Overridable
initializers are fixed at their values; a model with string tensors is refused (they run in Python).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import PolycError
from ..export import (C_TYPES, STATUS_ARGUMENT, STATUS_CPU, Library, Tensor, c_name, cpu_check, shared_objects,
                      write_library)
from ..options import Options
from ..target import host_target
from .api import compile_program
from .load import ModelLike
from .native import Layout

#: Alignment of each constant in the embedded blob (bytes): what the arena gives the kernels' tensors.
BLOB_ALIGN = 64


def export_model(model_or_path: ModelLike, directory, name: str | None = None, options: Options | None = None,
                 input_shapes=None) -> Library:
    """Compile the model and write ``lib<name>.so``, ``<name>.o`` and ``<name>.h`` into ``directory``.
    ``name`` (a C identifier is made of it) defaults to the model file's stem, else ``model``; ``options``
    and ``input_shapes`` as for :func:`polyc.onnx.compile`. Raises what :func:`polyc.onnx.compile` raises,
    UnsupportedError for string tensors, PolycError without a C compiler."""
    program = compile_program(model_or_path, options, input_shapes)
    if name is None:
        name = Path(model_or_path).stem if isinstance(model_or_path, (str, Path)) else "model"
    cname = c_name(name)
    layout = Layout(program)
    target = host_target()
    options = program.steps[0].kernel.options if program.steps else (options or Options())
    made = None
    if program.steps:
        done = []
        try:
            made, options = shared_objects(f"{cname}_entry", layout.kernels, layout.calls, layout.n_slots, options,
                                           lambda i, _: done.append(i), frozenset(layout.constant_slots.values()))
        except PolycError as exc:
            if len(done) == len(layout.kernels):
                raise
            raise layout.failed_kernel(exc, len(done)) from exc
    constants = [np.ascontiguousarray(program.constants[n]) for n in layout.constant_names]
    if made is not None:
        by_slot = {slot: program.constants[n] for n, slot in layout.constant_slots.items()}
        constants += [p.pack(by_slot[p.source]) for p in made.packed]
    blob, offsets = bytearray(), []
    for array in constants:
        blob += bytes(-len(blob) % BLOB_ALIGN)
        offsets.append(len(blob))
        blob += array.tobytes()
    tensors = program.tensors
    inputs = tuple(Tensor(n, np.dtype(tensors[n].dtype).name, tuple(tensors[n].shape)) for n in program.inputs)
    outputs = tuple(Tensor(n, np.dtype(tensors[n].dtype).name, tuple(tensors[n].shape)) for n in program.outputs)
    workspace = -(-max(program.plan.arena_bytes, 64) // 64) * 64
    glue = _glue(cname, layout, offsets, workspace, inputs, outputs, cpu_check(target), made is not None)
    declarations = [f"#define {cname.upper()}_NUM_INPUTS {len(inputs)}",
                    f"#define {cname.upper()}_NUM_OUTPUTS {len(outputs)}",
                    f"#define {cname.upper()}_WORKSPACE_BYTES {workspace}", "",
                    f"size_t {cname}_workspace_bytes(void);",
                    f"int {cname}_run(const void *const *inputs, void *const *outputs, void *workspace);"]
    usage = [f"static {_c_type(t)} in{i}[{_count(t)}];  // input {i}: {t.describe()}" for i, t in enumerate(inputs)]
    usage += [f"static {_c_type(t)} out{k}[{_count(t)}];  // output {k}: {t.describe()}"
              for k, t in enumerate(outputs)]
    usage += [f"const void *inputs[] = {{{', '.join(f'in{i}' for i in range(len(inputs))) or 'NULL'}}};",
              f"void *outputs[] = {{{', '.join(f'out{k}' for k in range(len(outputs)))}}};",
              f"void *workspace = aligned_alloc(64, {cname}_workspace_bytes());",
              f"int status = {cname}_run(inputs, outputs, workspace);  // 0: done",
              "free(workspace);"]
    about = f"the ONNX model '{name}' ({len(program.steps)} kernels)"
    return write_library(directory, cname, made.objects if made is not None else (), glue, declarations, about,
                         usage, inputs, outputs, target, options, bytes(blob), f"{cname}_weights")


def _c_type(t: Tensor) -> str:
    return C_TYPES[t.dtype]


def _count(t: Tensor) -> int:
    return max(1, int(np.prod(t.shape, dtype=np.int64)))


def _glue(cname: str, layout: Layout, offsets: list, workspace: int, inputs, outputs, cpu: str,
          has_program: bool) -> str:
    """The C of ``<cname>_run`` and ``<cname>_workspace_bytes`` (see the module docstring)."""
    n_slots = layout.n_slots + len(offsets) - len(layout.constant_names)
    lines = [f"extern const unsigned char {cname}_weights[];"]
    if has_program:
        lines.append(f"extern int {cname}_entry(void **buffers);")
    lines += [f"static const size_t offsets[{max(1, len(offsets))}] = {{{', '.join(map(str, offsets)) or '0'}}};",
              "", f"size_t {cname}_workspace_bytes(void) {{ return {workspace}; }}", "",
              f"int {cname}_run(const void *const *inputs, void *const *outputs, void *workspace) {{",
              f"    if (!({cpu})) return {STATUS_CPU};",
              f"    if (!inputs || !outputs || !workspace || ((uintptr_t)workspace & 63)) return {STATUS_ARGUMENT};",
              f"    for (int i = 0; i < {len(inputs)}; i++) if (!inputs[i]) return {STATUS_ARGUMENT};",
              f"    for (int i = 0; i < {len(outputs)}; i++) if (!outputs[i]) return {STATUS_ARGUMENT};",
              f"    void *buffers[{max(1, n_slots)}];",
              "    buffers[0] = workspace;",
              f"    for (int i = 0; i < {len(inputs)}; i++) buffers[1 + i] = (void *)inputs[i];",
              f"    for (int i = 0; i < {len(offsets)}; i++) buffers[{1 + len(inputs)} + i] = "
              f"(void *)({cname}_weights + offsets[i]);"]
    if has_program:
        lines += [f"    int status = {cname}_entry(buffers);", "    if (status != 0) return status;"]
    for k, (slot, offset, _dtype, _shape, nbytes, _root) in enumerate(layout.output_places()):
        lines.append(f"    memmove(outputs[{k}], (const char *)buffers[{slot}] + {offset}, {nbytes});")
    lines += ["    return 0;", "}"]
    return "\n".join(lines)
