"""Per-op converters: ONNX node -> TC statements / lazy values, chosen by opset.

Each converter is a plain function ``convert(b, node) -> list[Val]`` (one Val per output) using the
:class:`~polyc.onnx.builder.Builder` ``b``. The converters live in one module per family (:mod:`.core`:
elementwise, Conv/Gemm/MatMul, pooling, normalization; :mod:`.movement`: Concat, Slice, Gather,
Resize ...; :mod:`.reduction`: the ReduceX ops; :mod:`.indexing`: GatherElements, Scatter, ArgMax, Einsum
...). Each family module declares four tables, merged here:

- ``CONVERTERS``: op -> ``((since_version, function), ...)``, oldest first; :func:`converter` picks the newest
  one not newer than the model's opset (TVM's ``_impl_vN`` idea);
- ``KNOWN_ATTRS``: op -> every attribute ONNX defines for it; anything else is reported;
- ``SUPPORTED_VALUES``: op -> {attribute: predicate(value)}, False for a value polyc does not handle;
- ``CONSTANT_INPUTS``: op -> ``((input index, since_opset, name), ...)`` inputs that must be compile-time constants.

:func:`check_node` lists what a node uses that polyc does not support. Shared helpers are in :mod:`.common`.
"""
from __future__ import annotations

import numpy as np
import onnx

from . import attention, core, indexing, logic, loss, movement, norm, quant, reduction, rnn, unary

FAMILIES = (core, movement, reduction, indexing, logic, unary, norm, attention, loss, rnn, quant)


def _merge(table: str) -> dict:
    out = {}
    for module in FAMILIES:
        for op, value in getattr(module, table).items():
            if op in out and table == "CONVERTERS":
                raise AssertionError(f"op {op} has converters in two modules")
            out[op] = value if op not in out else (out[op] | value if isinstance(value, set) else {**out[op], **value})
    return out


CONVERTERS = _merge("CONVERTERS")
KNOWN_ATTRS = _merge("KNOWN_ATTRS")
SUPPORTED_VALUES = _merge("SUPPORTED_VALUES")
CONSTANT_INPUTS = _merge("CONSTANT_INPUTS")


def converter(op: str, opset: int):
    """The converter of ``op`` for ``opset`` (the newest with ``since <= opset``), or None if unsupported."""
    best = None
    for since, fn in CONVERTERS.get(op, ()):
        if since <= opset:
            best = fn
    if best is None:
        return None
    # an op removed from the standard at some opset (Upsample at 10) is unsupported after it
    try:
        schema = onnx.defs.get_schema(op, opset)
        if schema.deprecated:
            return None
    except Exception:
        return None
    return best


def _show(v) -> str:
    if isinstance(v, bytes):
        return v.decode(errors="replace")
    if isinstance(v, np.ndarray):
        return f"tensor{list(v.shape)}"
    return str(v)


def check_node(g, nid: str, d: dict) -> list:
    """Every reason node ``nid`` cannot be compiled (empty list when it can)."""
    op, opset = d["op"], g.graph["opset"]
    problems = []
    known = KNOWN_ATTRS.get(op, set())
    for name, value in d["attrs"].items():
        if name not in known:
            problems.append(f"unsupported attribute {name}={_show(value)} on node {nid} ({op})")
        elif name in SUPPORTED_VALUES.get(op, {}) and not SUPPORTED_VALUES[op][name](value):
            problems.append(f"unsupported attribute {name}={_show(value)} on node {nid} ({op})")
    for index, since, name in CONSTANT_INPUTS.get(op, ()):
        if opset >= since and index < len(d["inputs"]) and d["inputs"][index] \
                and d["inputs"][index] not in g.graph["constants"]:
            problems.append(f"input {name} ({d['inputs'][index]!r}) of node {nid} ({op}) must be a compile-time "
                            "constant")
    if op == "MaxPool" and len(d["outputs"]) > 1 and d["outputs"][1]:
        problems.append(f"unsupported output Indices of node {nid} (MaxPool)")
    return problems
