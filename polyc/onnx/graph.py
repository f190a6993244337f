"""The graph IR: a networkx DiGraph of operator nodes joined by tensor edges.

Node ids are unique strings (the ONNX node name, or ``Op_<index>`` when it has none). Each node carries

- ``op``: the ONNX op type; ``inputs`` / ``outputs``: tuples of tensor names ("" for an absent optional);
- ``attrs``: a dict of Python values (ints, floats, bytes, lists; tensor attributes as numpy arrays; subgraph
  attributes of control-flow ops as :class:`onnx.GraphProto`, inlined by :mod:`polyc.onnx.control`);
- ``order``: its position in the original model, used to break ties in topological order.

An edge ``u -> v`` carries ``tensors``: the set of tensor names ``u`` writes and ``v`` reads. The graph-level
dict holds ``opset``, ``inputs``, ``outputs`` (tensor names), ``tensors`` (name -> :class:`TensorInfo`),
``constants`` (name -> numpy array: initializers and folded values) and ``name``.

Passes never mutate their argument: they start from :func:`copy_graph`, edit nodes with :func:`add_op` /
:func:`remove_op` / :func:`replace_uses`, and the edges are kept up to date by those helpers.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx
import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..errors import UnsupportedError
from .load import ModelError, graph_inputs, model_opset

#: The attribute :mod:`polyc.onnx.layout` sets on a Conv or MaxPool of a channels-last region, and its values:
#: ``NHWC`` (input and output NHWC) and ``NCHW_IN`` (a Conv heading a region: NCHW input, NHWC output).
#: :func:`to_model` writes such a node as the standard ONNX op between Transposes.
LAYOUT_ATTR = "polyc_layout"
NHWC = "NHWC"
NCHW_IN = "NCHW_IN"

#: The attribute :func:`polyc.onnx.passes.strided_conv_to_space_to_depth` sets on the Conv it builds: the
#: zero taps of its weights are structural (a phase's taps past the original window), not data, so the
#: lowering leaves them out of the reduction (:func:`polyc.onnx.ops.core.tap_boxes`). A Conv from a model
#: never has it: skipping a zero weight would turn ``inf * 0 = NaN`` into a finite result.
ZERO_TAPS_ATTR = "polyc_zero_taps"

#: Attributes of polyc's own that :func:`to_model` leaves out.
INTERNAL_ATTRS = (LAYOUT_ATTR, ZERO_TAPS_ATTR)


@dataclass(frozen=True)
class TensorInfo:
    """The static type of a tensor: ``shape`` (a tuple of ints, or None when unknown) and numpy ``dtype``."""

    shape: tuple | None
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def __str__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
        return f"{np.dtype(self.dtype).name}[{dims}]"


def _dtype(elem_type: int) -> np.dtype:
    if elem_type == 0:
        return None
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def _info(vi: onnx.ValueInfoProto) -> TensorInfo:
    t = vi.type.tensor_type
    shape = None
    if t.HasField("shape"):
        dims = []
        for d in t.shape.dim:
            if not d.HasField("dim_value"):
                dims = None
                break
            dims.append(int(d.dim_value))
        shape = None if dims is None else tuple(dims)
    return TensorInfo(shape, _dtype(t.elem_type))


def _attr_value(a: onnx.AttributeProto):
    if a.type == onnx.AttributeProto.GRAPH:  # a control-flow body: polyc.onnx.control inlines or rejects it
        return a.g
    if a.type == onnx.AttributeProto.GRAPHS:
        raise UnsupportedError(f"subgraph list attribute {a.name!r} is not supported")
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.SPARSE_TENSOR:
        raise UnsupportedError(f"sparse tensor attribute {a.name!r} is not supported")
    v = helper.get_attribute_value(a)
    if a.type in (onnx.AttributeProto.INTS, onnx.AttributeProto.FLOATS, onnx.AttributeProto.STRINGS):
        return list(v)
    if a.type == onnx.AttributeProto.TENSORS:
        return [numpy_helper.to_array(t) for t in v]
    return v


def from_model(model: onnx.ModelProto) -> nx.DiGraph:
    """Build the graph IR from a loaded, shape-inferred model (see :func:`polyc.onnx.load.load_model`)."""
    g = nx.DiGraph()
    tensors: dict[str, TensorInfo] = {}
    for vi in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        tensors[vi.name] = _info(vi)
    constants = {}
    for t in model.graph.initializer:
        try:
            arr = numpy_helper.to_array(t)
        except Exception as e:  # a wrong raw_data size, missing external data, an unknown data type ...
            raise ModelError(f"initializer {t.name!r} cannot be read: {type(e).__name__}: {e}") from e
        constants[t.name] = arr
        tensors[t.name] = TensorInfo(tuple(arr.shape), arr.dtype)
    g.graph.update(opset=model_opset(model), name=model.graph.name or "model",
                   inputs=[i.name for i in graph_inputs(model)], outputs=[o.name for o in model.graph.output],
                   tensors=tensors, constants=constants)
    used = set()
    for index, node in enumerate(model.graph.node):
        nid = node.name if node.name and node.name not in used else f"{node.op_type}_{index}"
        while nid in used:
            nid += "_"
        used.add(nid)
        try:
            attrs = {a.name: _attr_value(a) for a in node.attribute}
        except UnsupportedError as e:
            raise UnsupportedError(f"{e.message} on node {nid} ({node.op_type})") from e
        except Exception as e:  # a tensor attribute onnx cannot decode
            raise ModelError(f"an attribute of node {nid} ({node.op_type}) cannot be read: "
                             f"{type(e).__name__}: {e}") from e
        g.add_node(nid, op=node.op_type, inputs=tuple(node.input), outputs=tuple(node.output),
                   attrs=attrs, order=index, domain=node.domain)
    connect(g)
    return g


def connect(g: nx.DiGraph) -> nx.DiGraph:
    """Recompute every edge (and the producer map) from the nodes' input and output lists."""
    g.remove_edges_from(list(g.edges))
    producer = {}
    for nid, data in g.nodes(data=True):
        for t in data["outputs"]:
            if t:
                producer[t] = nid
    g.graph["producer"] = producer
    for nid, data in g.nodes(data=True):
        for t in data["inputs"]:
            p = producer.get(t)
            if p is not None:
                if g.has_edge(p, nid):
                    g.edges[p, nid]["tensors"].add(t)
                else:
                    g.add_edge(p, nid, tensors={t})
    return g


def copy_graph(g: nx.DiGraph) -> nx.DiGraph:
    """A copy whose nodes, attrs and graph-level dicts can be edited without touching ``g`` (arrays are shared)."""
    h = nx.DiGraph()
    h.graph.update({k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
                    for k, v in g.graph.items()})
    for nid, data in g.nodes(data=True):
        h.add_node(nid, **{**data, "attrs": dict(data["attrs"])})
    for u, v, data in g.edges(data=True):
        h.add_edge(u, v, tensors=set(data["tensors"]))
    return h


def producer(g: nx.DiGraph, tensor: str):
    """The id of the node that writes ``tensor``, or None (graph input, constant, absent)."""
    return g.graph["producer"].get(tensor)


def consumers(g: nx.DiGraph, tensor: str) -> list:
    """Ids of the nodes that read ``tensor``, in topological order."""
    p = producer(g, tensor)
    if p is not None:
        cands = [v for v in g.successors(p) if tensor in g.edges[p, v]["tensors"]]
    else:
        cands = [n for n, d in g.nodes(data=True) if tensor in d["inputs"]]
    return sorted(cands, key=lambda n: g.nodes[n]["order"])


def topo_order(g: nx.DiGraph) -> list:
    """Node ids in a topological order that follows the original model's order where it can."""
    return list(nx.lexicographical_topological_sort(g, key=lambda n: (g.nodes[n]["order"], n)))


def add_op(g: nx.DiGraph, nid: str, op: str, inputs, outputs, attrs=None, order=None) -> str:
    """Add an operator node (a fresh id is made from ``nid`` if taken) and connect it; returns its id."""
    base, k = nid, 0
    while nid in g:
        k += 1
        nid = f"{base}_{k}"
    if order is None:
        order = max((d["order"] for _, d in g.nodes(data=True)), default=0) + 1
    g.add_node(nid, op=op, inputs=tuple(inputs), outputs=tuple(outputs), attrs=dict(attrs or {}),
               order=order, domain="")
    producer_map = g.graph["producer"]
    for t in outputs:
        if t:
            producer_map[t] = nid
    for t in inputs:
        p = producer_map.get(t)
        if p is not None and p != nid:
            if g.has_edge(p, nid):
                g.edges[p, nid]["tensors"].add(t)
            else:
                g.add_edge(p, nid, tensors={t})
    for t in outputs:  # consumers that already exist
        for v, d in g.nodes(data=True):
            if v != nid and t and t in d["inputs"]:
                if g.has_edge(nid, v):
                    g.edges[nid, v]["tensors"].add(t)
                else:
                    g.add_edge(nid, v, tensors={t})
    return nid


def remove_op(g: nx.DiGraph, nid: str) -> None:
    """Remove a node; the tensors it produced lose their producer."""
    for t in g.nodes[nid]["outputs"]:
        if g.graph["producer"].get(t) == nid:
            del g.graph["producer"][t]
    g.remove_node(nid)


def replace_uses(g: nx.DiGraph, old: str, new: str) -> None:
    """Make every reader of tensor ``old`` (nodes and graph outputs) read ``new`` instead."""
    for v in consumers(g, old):
        d = g.nodes[v]
        d["inputs"] = tuple(new if t == old else t for t in d["inputs"])
        p = producer(g, old)
        if p is not None and g.has_edge(p, v):
            g.edges[p, v]["tensors"].discard(old)
            if not g.edges[p, v]["tensors"]:
                g.remove_edge(p, v)
        q = producer(g, new)
        if q is not None:
            if g.has_edge(q, v):
                g.edges[q, v]["tensors"].add(new)
            else:
                g.add_edge(q, v, tensors={new})
    g.graph["outputs"] = [new if t == old else t for t in g.graph["outputs"]]


def set_constant(g: nx.DiGraph, name: str, value: np.ndarray) -> None:
    """Record ``name`` as a compile-time constant with its shape and dtype."""
    value = np.asarray(value)
    g.graph["constants"][name] = value
    g.graph["tensors"][name] = TensorInfo(tuple(value.shape), value.dtype)


def fresh_name(g: nx.DiGraph, base: str) -> str:
    """A tensor name not used in ``g``."""
    name, k = base, 0
    while name in g.graph["tensors"] or name in g.graph["producer"]:
        k += 1
        name = f"{base}_{k}"
    return name


def _value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(info.dtype)) if info.dtype is not None else 0
    return helper.make_tensor_value_info(name, elem, None if info.shape is None else list(info.shape))


def export_attr(v):
    """An attribute value as onnx.helper.make_node takes it (numpy arrays become TensorProtos)."""
    if isinstance(v, np.ndarray):
        return numpy_helper.from_array(v)
    return v


def to_model(g: nx.DiGraph, ir_version: int | None = None, weights: bool = True) -> onnx.ModelProto:
    """Serialise the graph back into an ONNX model (for testing that passes keep results). A node of a
    channels-last region (attribute :data:`LAYOUT_ATTR`) becomes the standard op between Transposes.

    With ``weights=False`` constants of more than 1024 elements become typed graph inputs instead of
    initializers: enough for shape inference, and cheap.
    """
    tensors = g.graph["tensors"]
    nodes, used = [], set()
    for nid in topo_order(g):
        d = g.nodes[nid]
        inputs, outputs = list(d["inputs"]), list(d["outputs"])
        attrs = {k: export_attr(v) for k, v in d["attrs"].items() if k not in INTERNAL_ATTRS}
        layout = d["attrs"].get(LAYOUT_ATTR)
        if layout == NHWC:  # the NCHW op between Transposes: NHWC -> NCHW before, NCHW -> NHWC after
            nodes.append(helper.make_node("Transpose", [inputs[0]], [f"{nid}__nchw_in"], name=f"{nid}__to_nchw",
                                          perm=[0, 3, 1, 2]))
            inputs[0] = f"{nid}__nchw_in"
        if layout in (NHWC, NCHW_IN):
            nodes.append(helper.make_node(d["op"], inputs, [f"{nid}__nchw_out"], name=nid, **attrs))
            nodes.append(helper.make_node("Transpose", [f"{nid}__nchw_out"], outputs[:1], name=f"{nid}__to_nhwc",
                                          perm=[0, 2, 3, 1]))
        else:
            nodes.append(helper.make_node(d["op"], inputs, outputs, name=nid, domain=d.get("domain", ""), **attrs))
        used.update(d["inputs"])
    for name in g.graph["outputs"]:
        if producer(g, name) is None and name in g.graph["constants"] and name not in g.graph["inputs"]:
            value = numpy_helper.from_array(np.asarray(g.graph["constants"][name]))
            nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_const", value=value))
    inits, inputs = [], [_value_info(n, tensors[n]) for n in g.graph["inputs"]]
    for name, v in g.graph["constants"].items():
        if name in used and name not in g.graph["inputs"]:
            v = np.asarray(v)
            if weights or v.size <= 1024:
                inits.append(numpy_helper.from_array(v, name))
            else:
                inputs.append(_value_info(name, TensorInfo(tuple(v.shape), v.dtype)))
    outputs = [_value_info(n, tensors[n]) for n in g.graph["outputs"]]
    graph = helper.make_graph(nodes, g.graph["name"], inputs, outputs, initializer=inits)
    opsets = [helper.make_opsetid("", g.graph["opset"])]
    model = helper.make_model(graph, opset_imports=opsets)
    # the oldest IR version that knows the opset, so that older runtimes load it
    model.ir_version = ir_version or max(4, helper.find_min_ir_version_for(opsets))
    return model


def summary(g: nx.DiGraph) -> str:
    """One line per node: ``id: Op(inputs) -> outputs``, in topological order."""
    lines = []
    for nid in topo_order(g):
        d = g.nodes[nid]
        lines.append(f"{nid}: {d['op']}({', '.join(d['inputs'])}) -> {', '.join(d['outputs'])}")
    return "\n".join(lines)
