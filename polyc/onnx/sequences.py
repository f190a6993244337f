"""Sequence and optional values resolved at compile time: a graph pass that leaves only tensors.

polyc's kernels compute tensors only, but exporters put sequence values *inside* graphs whose inputs and
outputs are tensors (torch's ``split`` + ``cat``, list comprehensions). :func:`lower_sequences` follows
every sequence value through the graph as a list of tensor names known at compile time, and every optional
value as "empty" or the value it holds, and rewrites the ops on them into standard tensor ops:

- ``SequenceConstruct`` / ``SequenceEmpty`` / ``SequenceInsert`` / ``SequenceErase``: list edits (no node);
- ``SequenceAt``: an ``Identity`` of the chosen element; ``SequenceLength``: an int64 constant;
- ``ConcatFromSequence``: ``Concat`` (``new_axis=1``: ``Unsqueeze`` of each element, then ``Concat``);
- ``SplitToSequence``: one ``Slice`` per piece (``Squeeze`` of the axis when ``split`` is absent and
  ``keepdims=0``);
- ``SequenceMap``: its body inlined once per position (the same way :mod:`polyc.onnx.control` inlines a
  Loop body);
- ``Identity`` of a sequence or optional, ``Optional``, ``OptionalHasElement`` (a bool constant) and
  ``OptionalGetElement`` (an ``Identity``, or the sequence it holds).

Control flow: the pass unrolls ``If`` / ``Loop`` / ``Scan`` (and the recurrent ops) itself, one node at a
time in topological order, with :func:`polyc.onnx.control.lower_control_flow`: a Loop's trip count is often
the ``SequenceLength`` of a sequence above it (torch's export of ``for p in x.split(k): out.append(...)``),
and its body appends to a loop-carried sequence, which the unrolled copies resolve like any other.

Positions must be compile-time constants (folded from Constant nodes and shape computations where they are
computed); negative positions count from the end as the spec says. A sequence whose length or elements
depend on data (``SplitToSequence`` with a ``split`` known only at run time; its length alone is still
fine when only ``SequenceLength`` reads it), a sequence or optional read by any other op, or one that is a
graph input or output raises :class:`~polyc.errors.UnsupportedError` naming the node. Out-of-range
positions and splits that do not add up raise :class:`~polyc.errors.ShapeError`.

Semantics: the ONNX spec, operators SequenceConstruct (11), SequenceEmpty (11), SequenceInsert (11),
SequenceErase (11), SequenceAt (11), SequenceLength (11), ConcatFromSequence (11), SplitToSequence (11, 24),
SequenceMap (17), Optional (15), OptionalHasElement (15, 18), OptionalGetElement (15, 18), Identity (14, 16).
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import onnx

from ..errors import ShapeError, UnsupportedError
from .control import CONTROL, _constant_value, _inline, _refresh_shapes, lower_control_flow
from .folding import refresh_shapes
from .graph import TensorInfo, connect, copy_graph, remove_op, set_constant, topo_order
from .ops.rnn import Emitter

#: Ops this pass removes (an ``Identity`` of a sequence or optional is removed too).
SEQUENCE_OPS = ("SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceErase", "SequenceAt",
                "SequenceLength", "ConcatFromSequence", "SplitToSequence", "SequenceMap")
OPTIONAL_OPS = ("Optional", "OptionalHasElement", "OptionalGetElement")

#: Every attribute the ONNX spec defines for each op of this pass.
KNOWN_ATTRS = {"SequenceConstruct": set(), "SequenceEmpty": {"dtype"}, "SequenceInsert": set(),
               "SequenceErase": set(), "SequenceAt": set(), "SequenceLength": set(),
               "ConcatFromSequence": {"axis", "new_axis"}, "SplitToSequence": {"axis", "keepdims"},
               "SequenceMap": {"body"}, "Optional": {"type"}, "OptionalHasElement": set(),
               "OptionalGetElement": set(), "Identity": set()}

#: The most elements a sequence may have (each becomes a tensor of the graph).
MAX_LENGTH = 4096


def supported_ops(opset: int) -> set:
    """The sequence and optional ops this pass resolves that exist at ``opset`` (Optional* since 15,
    SequenceMap since 17)."""
    since = {"Optional": 15, "OptionalHasElement": 15, "OptionalGetElement": 15, "SequenceMap": 17}
    return {op for op in SEQUENCE_OPS + OPTIONAL_OPS if opset >= since.get(op, 11)}


@dataclass(frozen=True)
class Seq:
    """A sequence value: the names of its element tensors, in order. ``elements`` is None when only the
    length is known (``SplitToSequence`` with a run-time ``split``); ``origin`` then names the node."""

    length: int
    elements: tuple | None = None
    origin: str = ""


@dataclass(frozen=True)
class Opt:
    """An optional value: ``value`` is None (empty), a tensor name, or a :class:`Seq`."""

    value: object = None


def lower_sequences(g: nx.DiGraph) -> nx.DiGraph:
    """Resolve every sequence and optional value of ``g`` into tensors (see the module docstring).

    Returns a new graph (``g`` is not changed); a graph without sequence or optional ops is returned as it
    is. New tensors get the shapes their inputs' static shapes give; the pipeline's final shape inference
    checks them. Raises UnsupportedError (a value not known at compile time, an op reading a sequence that
    has no tensor rewrite) or ShapeError (a position out of range, a split that does not fit), each naming
    the node.
    """
    if not any(_uses_sequences(d) for _, d in g.nodes(data=True)):
        return g
    g = copy_graph(g)
    values: dict = {}  # tensor name -> Seq | Opt
    memo: dict = {}
    done: set = set()
    while True:
        nid = next((n for n in topo_order(g) if n not in done and (
            g.nodes[n]["op"] in CONTROL or _is_sequence_node(g, n, values))), None)
        if nid is None:
            break
        if g.nodes[nid]["op"] in CONTROL:  # its trip count or condition may come from a sequence op above
            g = _unroll_one(g, nid)
            continue
        d = g.nodes[nid]
        unknown = sorted(set(d["attrs"]) - KNOWN_ATTRS.get(d["op"], set()))
        if unknown:
            raise UnsupportedError(f"unsupported attribute(s) {', '.join(unknown)} on node {nid} ({d['op']})")
        handler = _HANDLERS.get(d["op"])
        if handler is None:
            name = next(t for t in d["inputs"] if t in values)
            raise UnsupportedError(
                f"node {nid} ({d['op']}) reads {_kind(values[name])} {name!r}: polyc resolves sequences and "
                f"optionals at compile time and only {', '.join(SEQUENCE_OPS + OPTIONAL_OPS)} and Identity may "
                "read them", hint="rewrite the model so that the op reads tensors (a ConcatFromSequence or "
                                  "SequenceAt first)")
        memo.clear()
        handler(g, nid, d, values, lambda t: _constant_value(g, t, memo))
        done.add(nid)
        if nid in g:
            remove_op(g, nid)
        connect(g)
    for name in g.graph["outputs"]:
        if name in values:
            raise UnsupportedError(f"graph output {name!r} is {_kind(values[name])}: polyc compiles tensors only",
                                   hint="output a tensor (ConcatFromSequence of the sequence, say)")
    for name in values:
        if g.graph["tensors"].get(name, TensorInfo(None, None)).dtype is None:
            g.graph["tensors"].pop(name, None)
    return g


def _uses_sequences(d: dict) -> bool:
    """Whether node data ``d`` is a sequence or optional op, or has a subgraph (If/Loop/Scan body) using one."""
    if d["op"] in SEQUENCE_OPS + OPTIONAL_OPS:
        return True
    stack = [v for v in d["attrs"].values() if isinstance(v, onnx.GraphProto)]
    while stack:
        body = stack.pop()
        for node in body.node:
            if node.op_type in SEQUENCE_OPS + OPTIONAL_OPS:
                return True
            stack.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    return False


def _unroll_one(g: nx.DiGraph, nid: str) -> nx.DiGraph:
    """``g`` with control node ``nid`` inlined or unrolled by :func:`polyc.onnx.control.lower_control_flow`,
    the other control nodes left for later (hidden from it under a private domain meanwhile): their trip
    counts and conditions may be sequence lengths not resolved yet."""
    hidden = {n: (d["op"], d.get("domain", "")) for n, d in g.nodes(data=True) if d["op"] in CONTROL and n != nid}
    for n in hidden:
        g.nodes[n]["op"], g.nodes[n]["domain"] = "Later", "polyc.sequences"
    try:
        h = lower_control_flow(g)
    finally:
        for n, (op, domain) in hidden.items():
            g.nodes[n]["op"], g.nodes[n]["domain"] = op, domain
    for n, (op, domain) in hidden.items():
        if n in h:
            h.nodes[n]["op"], h.nodes[n]["domain"] = op, domain
    return h


def _kind(v) -> str:
    return "a sequence" if isinstance(v, Seq) else "an optional"


def _is_sequence_node(g: nx.DiGraph, nid: str, values: dict) -> bool:
    d = g.nodes[nid]
    if d.get("domain", "") not in ("", "ai.onnx"):
        return False
    return d["op"] in SEQUENCE_OPS or d["op"] in OPTIONAL_OPS or any(t in values for t in d["inputs"] if t)


# ---- helpers ------------------------------------------------------------------------------------------------

class _Emit:
    """Adds nodes and constants for the rewrite of node ``nid`` (fresh names ``<nid>/<hint>``)."""

    def __init__(self, g: nx.DiGraph, nid: str, order):
        self.g, self.nid, self.order, self.count = g, nid, order, 0

    def name(self, hint: str) -> str:
        base, k = f"{self.nid}/{hint}", 0
        name = base
        while name in self.g.graph["tensors"] or name in self.g.graph["producer"]:
            k += 1
            name = f"{base}_{k}"
        self.g.graph["tensors"][name] = TensorInfo(None, None)  # reserved; the shape comes later
        return name

    def index(self, values) -> str:
        name = self.name("index")
        set_constant(self.g, name, np.asarray(values, dtype=np.int64))
        return name

    def op(self, op: str, inputs, output: str | None = None, info: TensorInfo | None = None, **attrs) -> str:
        out = output or self.name(op.lower())
        self.count += 1
        base, k = f"{self.nid}/{op}", 0
        nid = base
        while nid in self.g:
            k += 1
            nid = f"{base}_{k}"
        self.g.add_node(nid, op=op, inputs=tuple(inputs), outputs=(out,), attrs=attrs,
                        order=self.order + self.count * 1e-6, domain="")
        self.g.graph["producer"][out] = nid
        if info is not None:
            self.g.graph["tensors"][out] = info
        return out


def _info(g: nx.DiGraph, name: str):
    info = g.graph["tensors"].get(name)
    return info if info is not None and info.shape is not None and info.dtype is not None else None


def _known(g: nx.DiGraph, nid: str, names) -> list:
    """The static infos of tensors ``names`` read (through sequences) by node ``nid``, None where unknown.

    Tensors computed from a sequence element had no shape when the model was loaded (onnx cannot tell which
    element a SequenceAt picks); once the nodes above them are tensor ops, shape inference on those nodes
    alone (without the sequence ops still below) gives their shapes."""
    if all(_info(g, t) is not None for t in names):
        return [_info(g, t) for t in names]
    above = set()
    for t in names:
        p = g.graph["producer"].get(t)
        if p is not None and p != nid:
            above |= {p} | nx.ancestors(g, p)
    sub = copy_graph(g)
    sub.remove_nodes_from([n for n in g.nodes if n not in above])
    sub.graph["outputs"] = []
    connect(sub)
    tensors = refresh_shapes(sub).graph["tensors"]
    for name, info in tensors.items():
        if info is not None and info.shape is not None and _info(g, name) is None:
            g.graph["tensors"][name] = info
    return [_info(g, t) for t in names]


def _seq(nid: str, d: dict, values: dict, k: int = 0) -> Seq:
    """Input ``k`` of node ``nid`` as a sequence (an optional holding one counts)."""
    name = d["inputs"][k] if k < len(d["inputs"]) else ""
    v = values.get(name)
    if isinstance(v, Opt) and isinstance(v.value, Seq):
        v = v.value
    if not isinstance(v, Seq):
        what = "no input" if not name else f"{name!r}, which is not a sequence polyc could resolve"
        raise UnsupportedError(f"node {nid} ({d['op']}): input {k} is {what}",
                               hint="sequences must be built inside the graph (a sequence graph input is not "
                                    "supported)")
    return v


def _elements(nid: str, d: dict, s: Seq) -> tuple:
    if s.elements is None:
        raise UnsupportedError(f"node {nid} ({d['op']}) reads the elements of the sequence made by node "
                               f"{s.origin} (SplitToSequence), whose split is known only at run time",
                               hint="make the split sizes a constant (an initializer), or use Split")
    return s.elements


def _position(nid: str, d: dict, k: int, const, length: int, default: int | None, insert: bool = False) -> int:
    """The constant position of input ``k`` in ``[0, length)`` (``[0, length]`` for an insert)."""
    name = d["inputs"][k] if k < len(d["inputs"]) else ""
    if not name:
        if default is None:
            raise ShapeError(f"node {nid} ({d['op']}) needs a position input")
        return default
    value = const(name)
    if value is None:
        raise UnsupportedError(f"node {nid} ({d['op']}): the position {name!r} is not a compile-time constant",
                               hint="sequence positions must be known at compile time")
    value = np.asarray(value)
    if value.size != 1 or value.dtype.kind not in "iu":
        raise ShapeError(f"node {nid} ({d['op']}): the position must be one integer, got {value.dtype.name}"
                         f"{list(value.shape)}")
    pos = int(value.reshape(-1)[0])
    high = length if insert else length - 1
    if not -length <= pos <= high:
        raise ShapeError(f"node {nid} ({d['op']}): position {pos} is out of range for a sequence of "
                         f"{length} element(s) (allowed: {-length} to {high})")
    return pos + length if pos < 0 else pos


def _alias(g: nx.DiGraph, nid: str, d: dict, src: str, out: str) -> None:
    """Make tensor ``out`` hold tensor ``src`` (an Identity, removed later by remove_identities)."""
    if not out:
        return
    if src in g.graph["constants"] and g.graph["producer"].get(src) is None:
        set_constant(g, out, g.graph["constants"][src])
        return
    _Emit(g, nid, d["order"]).op("Identity", [src], out, _info(g, src))


# ---- the ops ------------------------------------------------------------------------------------------------

def sequence_construct(g, nid, d, values, const) -> None:
    """SequenceConstruct (ONNX spec, opset 11): the sequence of its tensor inputs, in order."""
    ins = [t for t in d["inputs"] if t]
    if any(t in values for t in ins):
        raise UnsupportedError(f"node {nid} (SequenceConstruct): its inputs must be tensors")
    values[d["outputs"][0]] = Seq(len(ins), tuple(ins))


def sequence_empty(g, nid, d, values, const) -> None:
    """SequenceEmpty (ONNX spec, opset 11): the empty sequence (``dtype`` is the element type)."""
    values[d["outputs"][0]] = Seq(0, ())


def sequence_insert(g, nid, d, values, const) -> None:
    """SequenceInsert (ONNX spec, opset 11): ``tensor`` inserted at ``position`` (default: appended);
    ``position`` in ``[-n, n]``, negative counted from the end."""
    s = _seq(nid, d, values)
    elems = _elements(nid, d, s)
    tensor = d["inputs"][1]
    if tensor in values:
        raise UnsupportedError(f"node {nid} (SequenceInsert): the inserted value must be a tensor")
    if elems:
        first, new = _known(g, nid, [elems[0], tensor])
        if first is not None and new is not None and first.dtype != new.dtype:
            raise ShapeError(f"node {nid} (SequenceInsert): inserts a {new.dtype.name} tensor into a sequence of "
                             f"{first.dtype.name}")
    pos = _position(nid, d, 2, const, len(elems), len(elems), insert=True)
    values[d["outputs"][0]] = Seq(len(elems) + 1, elems[:pos] + (tensor,) + elems[pos:])


def sequence_erase(g, nid, d, values, const) -> None:
    """SequenceErase (ONNX spec, opset 11): the sequence without the element at ``position`` (default: the
    last); ``position`` in ``[-n, n-1]``."""
    s = _seq(nid, d, values)
    elems = _elements(nid, d, s)
    if not elems:
        raise ShapeError(f"node {nid} (SequenceErase): erases from an empty sequence")
    pos = _position(nid, d, 1, const, len(elems), len(elems) - 1)
    values[d["outputs"][0]] = Seq(len(elems) - 1, elems[:pos] + elems[pos + 1:])


def sequence_at(g, nid, d, values, const) -> None:
    """SequenceAt (ONNX spec, opset 11): the element at ``position`` (in ``[-n, n-1]``) as a tensor."""
    elems = _elements(nid, d, _seq(nid, d, values))
    pos = _position(nid, d, 1, const, len(elems), None)
    remove_op(g, nid)
    _alias(g, nid, d, elems[pos], d["outputs"][0])


def sequence_length(g, nid, d, values, const) -> None:
    """SequenceLength (ONNX spec, opset 11): the number of elements, an int64 scalar (here a constant)."""
    s = _seq(nid, d, values)
    remove_op(g, nid)
    set_constant(g, d["outputs"][0], np.array(s.length, dtype=np.int64))


def _unsqueeze(g, e: _Emit, x: str, axis: int) -> str:
    info = _info(g, x)
    out = None if info is None else TensorInfo(info.shape[:axis] + (1,) + info.shape[axis:], info.dtype)
    if g.graph["opset"] >= 13:
        return e.op("Unsqueeze", [x, e.index([axis])], info=out)
    return e.op("Unsqueeze", [x], info=out, axes=[axis])


def concat_from_sequence(g, nid, d, values, const) -> None:
    """ConcatFromSequence (ONNX spec, opset 11): the elements concatenated along ``axis``; with
    ``new_axis=1`` stacked along a new axis instead (``axis`` then in ``[-r-1, r]`` for elements of rank r).
    An empty sequence has no shape to give: UnsupportedError."""
    elems = _elements(nid, d, _seq(nid, d, values))
    if not elems:
        raise UnsupportedError(f"node {nid} (ConcatFromSequence): concatenates an empty sequence (its result has "
                               "no defined shape)")
    infos = _known(g, nid, elems)
    if any(i is None for i in infos):
        raise ShapeError(f"node {nid} (ConcatFromSequence): an element has no static shape",
                         hint="pin dynamic input dims with input_shapes=")
    rank = len(infos[0].shape)
    if any(len(i.shape) != rank for i in infos) or len({i.dtype for i in infos}) != 1:
        raise ShapeError(f"node {nid} (ConcatFromSequence): the elements have different ranks or dtypes "
                         f"({', '.join(str(i) for i in infos)})")
    new_axis = int(d["attrs"].get("new_axis", 0))
    if "axis" not in d["attrs"]:
        raise ShapeError(f"node {nid} (ConcatFromSequence): the axis attribute is required")
    axis = int(d["attrs"]["axis"])
    out_rank = rank + (1 if new_axis else 0)
    if not -out_rank <= axis < out_rank or (not new_axis and rank == 0):
        raise ShapeError(f"node {nid} (ConcatFromSequence): axis {axis} is out of range for elements of rank "
                         f"{rank}" + (" with new_axis=1" if new_axis else ""))
    axis = axis + out_rank if axis < 0 else axis
    remove_op(g, nid)
    e = _Emit(g, nid, d["order"])
    parts = [_unsqueeze(g, e, t, axis) for t in elems] if new_axis else list(elems)
    shapes = [g.graph["tensors"][p].shape if p in g.graph["tensors"] else None for p in parts]
    if any(s is None for s in shapes) or any(s[:axis] + s[axis + 1:] != shapes[0][:axis] + shapes[0][axis + 1:]
                                             for s in shapes):
        raise ShapeError(f"node {nid} (ConcatFromSequence): the elements' shapes "
                         f"{', '.join(str(i) for i in infos)} differ outside axis {axis}")
    shape = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
    e.op("Concat", parts, d["outputs"][0], TensorInfo(shape, infos[0].dtype), axis=axis)


def split_to_sequence(g, nid, d, values, const) -> None:
    """SplitToSequence (ONNX spec, opsets 11 and 24): ``input`` split along ``axis`` into a sequence.

    ``split`` absent: pieces of length 1, the axis squeezed when ``keepdims=0``; a scalar ``split``: pieces
    of that length (the last one shorter when it does not divide the extent); a 1-D ``split``: pieces of
    those lengths (they must add up to the extent). A ``split`` known only at run time gives a sequence of
    known length (1-D ``split`` of static size) whose elements cannot be read.
    """
    x = d["inputs"][0]
    info = _known(g, nid, [x])[0]
    split = d["inputs"][1] if len(d["inputs"]) > 1 else ""
    keepdims = int(d["attrs"].get("keepdims", 1))
    if info is None:
        raise ShapeError(f"node {nid} (SplitToSequence): the input {x!r} has no static shape",
                         hint="pin dynamic input dims with input_shapes=")
    rank = len(info.shape)
    axis = int(d["attrs"].get("axis", 0))
    if not -rank <= axis < rank:
        raise ShapeError(f"node {nid} (SplitToSequence): axis {axis} is out of range for rank {rank}")
    axis = axis + rank if axis < 0 else axis
    extent = info.shape[axis]
    squeeze = False
    if not split:
        sizes, squeeze = [1] * extent, keepdims == 0
    else:
        value = const(split)
        if value is None:
            sinfo = g.graph["tensors"].get(split)
            if sinfo is not None and sinfo.shape is not None and len(sinfo.shape) == 1:
                values[d["outputs"][0]] = Seq(sinfo.shape[0], None, nid)
                remove_op(g, nid)
                return
            raise UnsupportedError(f"node {nid} (SplitToSequence): the split {split!r} is not a compile-time "
                                   "constant, so the sequence's length is known only at run time",
                                   hint="make the split sizes a constant (an initializer)")
        value = np.asarray(value)
        if value.dtype.kind not in "iu" or value.ndim > 1:
            raise ShapeError(f"node {nid} (SplitToSequence): split must be an integer scalar or 1-D tensor")
        if value.ndim == 0:
            chunk = int(value)
            if chunk <= 0:
                raise ShapeError(f"node {nid} (SplitToSequence): split {chunk} must be positive")
            sizes = [min(chunk, extent - s) for s in range(0, extent, chunk)]
        else:
            sizes = [int(v) for v in value]
            if any(v < 0 for v in sizes) or sum(sizes) != extent:
                raise ShapeError(f"node {nid} (SplitToSequence): split {sizes} does not add up to the extent "
                                 f"{extent} of axis {axis}")
    if len(sizes) > MAX_LENGTH:
        raise UnsupportedError(f"node {nid} (SplitToSequence): {len(sizes)} pieces (at most {MAX_LENGTH})")
    remove_op(g, nid)
    e = _Emit(g, nid, d["order"])
    elems, start = [], 0
    for size in sizes:
        shape = info.shape[:axis] + (size,) + info.shape[axis + 1:]
        piece = e.op("Slice", [x, e.index([start]), e.index([start + size]), e.index([axis])],
                     info=TensorInfo(shape, info.dtype))
        if squeeze:
            out = TensorInfo(info.shape[:axis] + info.shape[axis + 1:], info.dtype)
            if g.graph["opset"] >= 13:
                piece = e.op("Squeeze", [piece, e.index([axis])], info=out)
            else:
                piece = e.op("Squeeze", [piece], info=out, axes=[axis])
        elems.append(piece)
        start += size
    values[d["outputs"][0]] = Seq(len(elems), tuple(elems))


def sequence_map(g, nid, d, values, const) -> None:
    """SequenceMap (ONNX spec, opset 17): ``body`` applied to the i-th element of every sequence input
    (tensor inputs passed whole) for each position i; each body output makes one output sequence."""
    body = d["attrs"]["body"]
    ins = list(d["inputs"])
    first = _seq(nid, d, values, 0)
    length = first.length
    seqs = {}
    for k, t in enumerate(ins):
        if t in values:
            s = _seq(nid, d, values, k)
            if s.length != length:
                raise ShapeError(f"node {nid} (SequenceMap): its sequences have lengths {length} and {s.length}")
            seqs[k] = _elements(nid, d, s)
    if len(body.input) != len(ins) or len(body.output) != len(d["outputs"]):
        raise ShapeError(f"node {nid} (SequenceMap): the body has {len(body.input)} inputs and "
                         f"{len(body.output)} outputs for {len(ins)} inputs and {len(d['outputs'])} outputs")
    remove_op(g, nid)
    e = Emitter(g, nid, d["order"])
    outs = [[] for _ in d["outputs"]]
    for i in range(length):
        bound = {vi.name: (seqs[k][i] if k in seqs else t) for k, (vi, t) in enumerate(zip(body.input, ins))}
        results = _inline(g, e, nid, body, bound, {}, f"#{i}")
        for k, r in enumerate(results):
            outs[k].append(r)
    for out, elems in zip(d["outputs"], outs):
        if out:
            values[out] = Seq(length, tuple(elems))
    connect(g)
    _refresh_shapes(g)


def identity(g, nid, d, values, const) -> None:
    """Identity (ONNX spec, opsets 14 and 16 take sequences and optionals): the same value."""
    values[d["outputs"][0]] = values[d["inputs"][0]]


def optional(g, nid, d, values, const) -> None:
    """Optional (ONNX spec, opset 15): an optional holding ``input``, or an empty one without input."""
    src = d["inputs"][0] if d["inputs"] else ""
    if src in values and isinstance(values[src], Opt):
        raise UnsupportedError(f"node {nid} (Optional): an optional of an optional is not a valid ONNX type")
    values[d["outputs"][0]] = Opt(values.get(src, src) if src else None)


def optional_has_element(g, nid, d, values, const) -> None:
    """OptionalHasElement (ONNX spec, opsets 15 and 18): whether the optional holds a value, a bool scalar
    (a constant here); a tensor or sequence input holds one, a missing input does not (opset 18)."""
    src = d["inputs"][0] if d["inputs"] else ""
    v = values.get(src, src)
    has = bool(src) and not (isinstance(v, Opt) and v.value is None)
    remove_op(g, nid)
    set_constant(g, d["outputs"][0], np.array(has))


def optional_get_element(g, nid, d, values, const) -> None:
    """OptionalGetElement (ONNX spec, opsets 15 and 18): the value an optional holds (a tensor or sequence
    input is returned as it is); an empty optional is an error."""
    src = d["inputs"][0] if d["inputs"] else ""
    v = values.get(src, src)
    if isinstance(v, Opt):
        if v.value is None:
            raise ShapeError(f"node {nid} (OptionalGetElement): the optional {src!r} is empty")
        v = v.value
    if isinstance(v, Seq):
        values[d["outputs"][0]] = v
        return
    if not v:
        raise ShapeError(f"node {nid} (OptionalGetElement): it has no input")
    remove_op(g, nid)
    _alias(g, nid, d, v, d["outputs"][0])


_HANDLERS = {"SequenceConstruct": sequence_construct, "SequenceEmpty": sequence_empty,
             "SequenceInsert": sequence_insert, "SequenceErase": sequence_erase, "SequenceAt": sequence_at,
             "SequenceLength": sequence_length, "ConcatFromSequence": concat_from_sequence,
             "SplitToSequence": split_to_sequence, "SequenceMap": sequence_map, "Identity": identity,
             "Optional": optional, "OptionalHasElement": optional_has_element,
             "OptionalGetElement": optional_get_element}

__all__ = ["lower_sequences", "supported_ops", "SEQUENCE_OPS", "OPTIONAL_OPS", "Seq", "Opt"]
