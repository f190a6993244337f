"""String tensors: the ONNX string ops run on the host, in front of the compiled kernels.

polyc's kernels compute numbers. ONNX string tensors (text cleaning and splitting in front of a model:
``StringNormalizer``, ``StringSplit``, ``RegexFullMatch`` ...) are numpy arrays of Python ``str`` (dtype
``object``, as onnxruntime takes and returns them), and their ops are routines of the runtime, as in
onnxruntime (a C++ kernel per op) and OpenVINO (string tensors unpacked into begins/ends/bytes for CPU
extension kernels); here each routine is a few lines of numpy and Python's ``str``.

:func:`split_strings` moves every node of a supported string op whose string inputs are graph inputs,
constants or outputs of other moved nodes into a :class:`StringStage`, which runs before the kernels; its
numeric outputs (``StringSplit``'s counts, ``Equal``'s and ``RegexFullMatch``'s booleans) become inputs of
the kernels, and its string outputs are model outputs. What stays in the graph is numbers only, or a string
tensor :func:`~polyc.onnx.lower.check_supported` reports (a string op polyc does not run, a numeric op on
strings). A string tensor's extent may depend on its values (the strings ``StringNormalizer`` keeps, the
most pieces ``StringSplit`` makes), which the host computes at run time; every numeric value handed to the
kernels is checked against the shape and dtype they were compiled for.

Semantics: the ONNX spec, operators StringNormalizer (10), StringConcat (20), StringSplit (20),
RegexFullMatch (20), Equal (19) and Identity of strings. Where the spec defers to the platform:

- case change (StringNormalizer's ``case_change_action``, and its case-insensitive stopword match) maps
  each character by Unicode's simple case mapping, whatever the ``locale`` attribute says; a character whose
  full mapping is several characters (``ß`` -> ``SS``) is kept, as C++'s ``towupper`` does;
- StringSplit follows Python's ``str.split``, as the spec's wording (and TensorFlow's StringSplitV2, which
  it mirrors) does: an empty string split on a delimiter is one empty piece (onnxruntime 1.2x: none), and
  without a delimiter every Unicode whitespace separates (onnxruntime: the space only);
- RegexFullMatch runs the pattern with Python's ``re`` in ASCII mode, which matches RE2's syntax for the
  common constructs (RE2 also reads ``\\w``, ``\\d``, ``\\s`` and ``\\b`` as ASCII); a pattern ``re`` cannot
  compile raises :class:`~polyc.onnx.ModelError` naming the node.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

from ..errors import PolycError, ShapeError
from .graph import copy_graph, remove_op, topo_order
from .load import ModelError

STRING = np.dtype(object)


def is_string(info) -> bool:
    """Whether a TensorInfo (or None) describes a string tensor."""
    return info is not None and info.dtype is not None and np.dtype(info.dtype) == STRING


def as_strings(value, name: str) -> np.ndarray:
    """A feed for string input ``name`` as a C-contiguous array of ``str`` (dtype object): numpy ``str_``
    arrays are converted, ``bytes`` decoded as UTF-8. Anything else raises ShapeError naming the input."""
    arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if arr.dtype.kind == "U":
        return arr.astype(object)
    if arr.dtype.kind not in "OS":
        raise ShapeError(f"input {name!r}: expected a string tensor (numpy str_ or object array of str), "
                         f"got dtype {arr.dtype.name}")
    out = np.empty(arr.shape, dtype=object)
    flat, dst = arr.reshape(-1), out.reshape(-1)
    for k, v in enumerate(flat):
        if isinstance(v, (bytes, np.bytes_)):
            try:
                v = bytes(v).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ShapeError(f"input {name!r}: element {k} is not UTF-8: {e}") from None
        elif not isinstance(v, str):
            raise ShapeError(f"input {name!r}: element {k} is a {type(v).__name__}, not a string")
        dst[k] = str(v)
    return out


def _text(value) -> str:
    """A string attribute (bytes in the graph IR) as str."""
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _case(s: str, upper: bool) -> str:
    """``s`` with each character mapped by Unicode's simple case mapping (one character to one)."""
    if s.isascii():
        return s.upper() if upper else s.lower()
    change = str.upper if upper else str.lower
    return "".join(c if len(change(c)) != 1 else change(c) for c in s)


def _string_normalizer(attrs: dict, x: np.ndarray) -> tuple:
    action = _text(attrs.get("case_change_action", b"NONE"))
    sensitive = bool(attrs.get("is_case_sensitive", 0))
    stop = [_text(w) for w in attrs.get("stopwords", [])]
    words = x.reshape(-1).tolist()
    if stop:
        if sensitive:
            stopset = set(stop)
            words = [w for w in words if w not in stopset]
        else:
            stopset = {_case(w, upper=False) for w in stop}
            words = [w for w in words if _case(w, upper=False) not in stopset]
    if action != "NONE":
        words = [_case(w, upper=action == "UPPER") for w in words]
    if not words:  # the spec: all dropped gives one empty string
        words = [""]
    out = np.empty(len(words), dtype=object)
    out[:] = words
    return (out.reshape((1, -1)) if x.ndim == 2 else out,)


def _check_string_normalizer(attrs: dict, shapes: list) -> str | None:
    action = _text(attrs.get("case_change_action", b"NONE"))
    if action not in ("NONE", "LOWER", "UPPER"):
        return f"case_change_action {action!r} is not LOWER, UPPER or NONE"
    return None  # the input's rank ([C] or [1, C]) is checked by onnx's shape inference


def _string_concat(attrs: dict, x: np.ndarray, y: np.ndarray) -> tuple:
    return (np.asarray(np.add(x, y), dtype=object),)


def _equal(attrs: dict, x: np.ndarray, y: np.ndarray) -> tuple:
    return (np.asarray(np.equal(x, y), dtype=bool),)


def _identity(attrs: dict, x: np.ndarray) -> tuple:
    return (x.copy(),)


def _string_split(attrs: dict, x: np.ndarray) -> tuple:
    delimiter = _text(attrs.get("delimiter", b"")) or None
    maxsplit = int(attrs.get("maxsplit", -1))
    if delimiter is None:  # the spec: leading and trailing whitespace is removed, runs of it separate
        pieces = [s.strip().split(None, maxsplit) for s in x.reshape(-1).tolist()]
    else:
        pieces = [s.split(delimiter, maxsplit) for s in x.reshape(-1).tolist()]
    counts = np.array([len(p) for p in pieces], dtype=np.int64).reshape(x.shape)
    width = max((len(p) for p in pieces), default=0)
    out = np.full((len(pieces), width), "", dtype=object)
    for k, p in enumerate(pieces):
        out[k, :len(p)] = p
    return out.reshape(x.shape + (width,)), counts


def _pattern(attrs: dict) -> re.Pattern:
    return re.compile(_text(attrs.get("pattern", b"")), re.ASCII)


def _regex_full_match(attrs: dict, x: np.ndarray) -> tuple:
    pattern = _pattern(attrs)
    flat = [pattern.fullmatch(s) is not None for s in x.reshape(-1).tolist()]
    return (np.array(flat, dtype=bool).reshape(x.shape),)


def _check_regex(attrs: dict, shapes: list) -> str | None:
    if "pattern" not in attrs:
        return "it has no pattern attribute"
    try:
        _pattern(attrs)
    except re.error as e:
        return f"its pattern {_text(attrs['pattern'])!r} does not compile: {e}"
    return None


@dataclass(frozen=True)
class HostOp:
    """A string op the host runs: ``run(attrs, *inputs) -> outputs`` (numpy arrays) and ``check(attrs,
    input shapes) -> problem or None`` (at compile time); ``since``: the first opset that defines it."""

    since: int
    run: object
    check: object = None


#: The string ops :class:`StringStage` runs, by ONNX op type (Equal and Identity: when they read strings).
HOST_OPS = {
    "StringNormalizer": HostOp(10, _string_normalizer, _check_string_normalizer),
    "StringConcat": HostOp(20, _string_concat),
    "StringSplit": HostOp(20, _string_split),
    "RegexFullMatch": HostOp(20, _regex_full_match, _check_regex),
    "Equal": HostOp(19, _equal),
    "Identity": HostOp(1, _identity),
}


def supported_ops(opset: int) -> set:
    """The string ops run on the host at ``opset`` (for the supported-op listing)."""
    return {op for op, h in HOST_OPS.items() if h.since <= opset and op not in ("Equal", "Identity")}


@dataclass(frozen=True)
class HostNode:
    """One node run on the host: its graph id, op, input and output tensor names and attributes."""

    nid: str
    op: str
    inputs: tuple
    outputs: tuple
    attrs: dict


@dataclass(frozen=True)
class StringStage:
    """The string nodes of a model, run on the host before the kernels.

    ``nodes`` in order; ``constants``: the string constants they or the model's outputs read;
    ``kernel_inputs``: the names the kernels read from the feeds and the host; ``kernel_outputs``: the
    names the kernels compute; ``outputs``: the model's outputs in order; ``checked``: name -> TensorInfo
    of every value the host hands to the kernels (shape and dtype the kernels were compiled for).
    """

    nodes: tuple
    constants: dict = field(default_factory=dict)
    kernel_inputs: tuple = ()
    kernel_outputs: tuple = ()
    outputs: tuple = ()
    checked: dict = field(default_factory=dict)

    def kernel_feeds(self, feeds: dict) -> tuple:
        """``(values, kernel feeds)``: every value the host computed from ``feeds`` (checked arrays by input
        name) and the dict of arrays the kernels read. Raises PolycError naming the node when a string
        routine fails or a value for the kernels has another shape or dtype than they were compiled for."""
        env = dict(self.constants)
        env.update(feeds)
        for node in self.nodes:
            args = [env[t] if t else None for t in node.inputs]
            try:
                results = HOST_OPS[node.op].run(node.attrs, *args)
            except PolycError:
                raise
            except Exception as e:  # noqa: BLE001 - a string routine failing on the values fed
                raise PolycError(f"node {node.nid} ({node.op}) failed on the host: {type(e).__name__}: {e}") from e
            for name, value in zip(node.outputs, results):
                if not name:
                    continue
                info = self.checked.get(name)
                if info is not None and (value.dtype != info.dtype or value.shape != info.shape):
                    raise PolycError(f"node {node.nid} ({node.op}) computed {name!r} as {value.dtype.name}"
                                     f"{list(value.shape)}, but the kernels were compiled for {info}",
                                     hint="the shape depends on the strings fed; give the model input strings "
                                          "that keep it fixed")
                env[name] = value
        return env, {n: env[n] for n in self.kernel_inputs}

    def run(self, feeds: dict, executor) -> list:
        """The model's outputs: the host nodes on ``feeds``, then the kernels (``executor.run``, or none
        when every output is a string the host computes)."""
        env, kernel_feeds = self.kernel_feeds(feeds)
        if self.kernel_outputs:
            env.update(zip(self.kernel_outputs, executor.run(kernel_feeds)))
        return [np.array(env[n], copy=True) if n in feeds or n in self.constants else env[n] for n in self.outputs]

    def summary(self) -> str:
        ops: dict = {}
        for node in self.nodes:
            ops[node.op] = ops.get(node.op, 0) + 1
        return "on the host (strings): " + ", ".join(f"{k} {v}" for k, v in sorted(ops.items()))


def _host_op(g: nx.DiGraph, d: dict) -> bool:
    """Whether the node with data ``d`` is a string op the host runs (Equal and Identity only on strings)."""
    op = HOST_OPS.get(d["op"])
    if op is None or d.get("domain", "") not in ("", "ai.onnx") or g.graph["opset"] < op.since:
        return False
    tensors = g.graph["tensors"]
    return any(is_string(tensors.get(t)) for t in d["inputs"] if t)


def split_strings(g: nx.DiGraph) -> tuple:
    """``(graph, stage)``: ``g`` without the string nodes the host runs, and the :class:`StringStage` that
    runs them, or ``(g, None)`` when the model has none.

    A node moves when its op is in :data:`HOST_OPS` and every string tensor it reads is a graph input, a
    constant or the output of a node that moved. Raises :class:`~polyc.onnx.ModelError` naming the node
    for attributes or shapes its op does not accept.
    """
    tensors, constants = g.graph["tensors"], g.graph["constants"]
    moved, made = [], set()
    for nid in topo_order(g):
        d = g.nodes[nid]
        if not _host_op(g, d):
            continue
        reads = [t for t in d["inputs"] if t and is_string(tensors.get(t))]
        if any(t not in made and t not in constants and t not in g.graph["inputs"] for t in reads):
            continue
        check = HOST_OPS[d["op"]].check
        problem = check(d["attrs"], [tensors[t].shape if t in tensors else None for t in d["inputs"] if t]) \
            if check else None
        if problem:
            raise ModelError(f"node {nid} ({d['op']}): {problem}")
        moved.append(HostNode(nid, d["op"], tuple(d["inputs"]), tuple(d["outputs"]), dict(d["attrs"])))
        made.update(t for t in d["outputs"] if t)
    if not moved and not any(is_string(tensors.get(t)) for t in g.graph["inputs"] + g.graph["outputs"]):
        return g, None
    rest = copy_graph(g)
    for node in moved:
        remove_op(rest, node.nid)
    read = {t for _, d in rest.nodes(data=True) for t in d["inputs"] if t}
    outputs = list(g.graph["outputs"])
    served = made | {t for t in outputs if is_string(tensors.get(t)) and (t in constants or t in g.graph["inputs"])}
    kernel_outputs = [t for t in outputs if t not in served]
    kernel_inputs = [t for t in g.graph["inputs"] if t in read or t in kernel_outputs] + \
        sorted(t for t in made if t in read)
    if not kernel_outputs:
        rest.remove_nodes_from(list(rest.nodes))  # nothing the model returns needs them
    rest.graph.update(inputs=kernel_inputs, outputs=kernel_outputs)
    string_constants = {t: constants[t] for t in constants
                        if t in served or any(t in n.inputs for n in moved)}
    stage = StringStage(tuple(moved), string_constants, tuple(kernel_inputs), tuple(kernel_outputs),
                        tuple(outputs), {t: tensors[t] for t in made if t in kernel_inputs})
    return rest, stage


__all__ = ["HOST_OPS", "StringStage", "split_strings", "as_strings", "is_string", "supported_ops"]
