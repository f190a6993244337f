"""Channels-last regions: runs of convolutions that keep their images in NHWC between them.

In NCHW the only stride-1 dimension of an image is its width, and a width of 7 or 14 (the last stages of
ResNet, MobileNet, EfficientNet) fills vectors badly. :func:`polyc.onnx.ops.core.channels_last` already lets
one such convolution accumulate channels-last and read its NCHW result back in its epilogue; a depthwise
convolution cannot, because its input is read along the channel it writes, and in NCHW that is a gather.

:func:`channels_last_regions` does what onnxruntime's NCHWc transformer and OpenVINO's layout propagation do,
per region instead of for the whole graph: it finds the connected runs of *candidate* convolutions (those the
per-convolution rule computes channels-last, and depthwise ones of the same narrow width) joined by
elementwise nodes, and where a run holds at least :data:`REGION_MIN_CONVS` convolutions, rewrites it to NHWC:

- each Conv of the region gets the attribute ``polyc_layout = "NHWC"`` (its input and output are NHWC; its
  weights stay ONNX's ``(M, C/group, kh, kw)`` constant, re-laid by the converter at compile time);
- each elementwise node computes on the NHWC tensors, its constant operands transposed once (a per-channel
  bias ``(C, 1, 1)`` becomes ``(1, 1, 1, C)``);
- a Transpose node puts an NCHW tensor from outside into NHWC where the region reads it, and one puts a region
  tensor back into NCHW where something outside reads it (or it is a graph output), under its original name.

Shapes are set here (the graph's shape inference has run: the pass comes after
:func:`polyc.onnx.passes.infer_static_shapes`), so ONNX's NCHW rules never see an NHWC Conv.
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from .graph import TensorInfo, add_op, connect, consumers, copy_graph, fresh_name, producer, remove_op, topo_order
from .ops.core import CHANNELS_LAST_MAX_WIDTH, channels_last

#: The attribute that marks a Conv computed channels-last (:func:`polyc.onnx.ops.core.conv`).
LAYOUT_ATTR = "polyc_layout"
NHWC = "NHWC"
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

#: Elementwise ops a region computes in NHWC: their result does not depend on the layout once their
#: broadcast operands are transposed alike.
REGION_ELEMENTWISE = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu",
                                "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Exp"})

#: A region is rewritten when it holds at least this many convolutions: one alone pays a Transpose in and one
#: out, which the per-convolution channels-last form (an epilogue read-back, no input copy) does not.
REGION_MIN_CONVS = 2


def _image(g: nx.DiGraph, t: str):
    info = g.graph["tensors"].get(t)
    return None if info is None or info.shape is None or len(info.shape) != 4 else tuple(info.shape)


def candidate_conv(g: nx.DiGraph, nid: str) -> bool:
    """Whether Conv ``nid`` computes channels-last inside a region: 2-D, float32, constant weights (and bias),
    and either group 1 and chosen by :func:`~polyc.onnx.ops.core.channels_last`, or depthwise (one filter per
    channel) with an output narrower than CHANNELS_LAST_MAX_WIDTH."""
    d = g.nodes[nid]
    if d["op"] != "Conv" or len(d["inputs"]) < 2:
        return False
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    x, y = _image(g, d["inputs"][0]), _image(g, d["outputs"][0])
    w = d["inputs"][1]
    bias = d["inputs"][2] if len(d["inputs"]) > 2 else ""
    if x is None or y is None or w not in consts or (bias and bias not in consts) \
            or np.dtype(tensors[d["inputs"][0]].dtype) != np.float32:
        return False
    group = int(d["attrs"].get("group", 1))
    kernel = list(np.asarray(consts[w]).shape[2:])
    if group == 1:
        return channels_last(y, 1, True, kernel, "float32", x[1])
    return group == x[1] == y[1] and np.asarray(consts[w]).shape[1] == 1 and y[3] < CHANNELS_LAST_MAX_WIDTH


def _broadcasts(shape, out) -> bool:
    """Whether a tensor of ``shape`` broadcasts (numpy rules) to the 4-D ``out``."""
    shape = tuple(shape)
    if len(shape) > 4:
        return False
    padded = (1,) * (4 - len(shape)) + shape
    return all(s in (1, o) for s, o in zip(padded, out))


def _elementwise(g: nx.DiGraph, nid: str) -> bool:
    """Whether ``nid`` can compute in NHWC: an op of REGION_ELEMENTWISE with one 4-D output, whose inputs
    are constants that broadcast to it or 4-D tensors that do."""
    d = g.nodes[nid]
    outs = [t for t in d["outputs"] if t]
    if d["op"] not in REGION_ELEMENTWISE or len(outs) != 1 or _image(g, outs[0]) is None:
        return False
    out = _image(g, outs[0])
    tensors, consts = g.graph["tensors"], g.graph["constants"]
    for t in d["inputs"]:
        if not t:
            continue
        info = tensors.get(t)
        if info is None or info.shape is None or not _broadcasts(info.shape, out):
            return False
        if t not in consts and len(info.shape) != 4:
            return False
    return True


def find_regions(g: nx.DiGraph) -> list[set]:
    """The node sets :func:`channels_last_regions` rewrites: connected components of candidate convolutions and
    NHWC-capable elementwise nodes (joined where one reads what another writes), without the elementwise
    nodes at their head (whose every data input comes from outside: they would move a Transpose before them
    and out of their producer's epilogue), and holding at least REGION_MIN_CONVS convolutions."""
    able = {n for n in g.nodes if candidate_conv(g, n) or _elementwise(g, n)}
    joined = nx.Graph()
    joined.add_nodes_from(able)
    for n in able:
        for t in g.nodes[n]["outputs"]:
            for r in consumers(g, t) if t else ():
                if r in able:
                    joined.add_edge(n, r)
    regions = []
    consts = g.graph["constants"]
    for comp in nx.connected_components(joined):
        comp = set(comp)
        changed = True
        while changed:  # drop heads until none is left
            changed = False
            for n in sorted(comp):
                d = g.nodes[n]
                if d["op"] == "Conv":
                    continue
                data = [t for t in d["inputs"] if t and t not in consts]
                if not any(producer(g, t) in comp for t in data):
                    comp.discard(n)
                    changed = True
        convs = [n for n in comp if g.nodes[n]["op"] == "Conv"]
        if len(convs) >= REGION_MIN_CONVS and any(int(g.nodes[n]["attrs"].get("group", 1)) != 1 for n in convs):
            regions.append(comp)
    return regions


def channels_last_regions(g: nx.DiGraph) -> nx.DiGraph:
    """Rewrite each region of :func:`find_regions` to NHWC (see the module docstring); a new graph."""
    g = copy_graph(g)
    regions = find_regions(g)
    if not regions:
        return g
    tensors, consts = g.graph["tensors"], g.graph["constants"]
    inside = set().union(*regions)
    outside_readers = {t: t in g.graph["outputs"] or any(r not in inside for r in consumers(g, t))
                       for n in inside for t in g.nodes[n]["outputs"] if t}
    nhwc: dict = {}

    def permuted(t: str) -> TensorInfo:
        info = tensors[t]
        return TensorInfo(tuple(info.shape[p] for p in TO_NHWC), info.dtype)

    def read(t: str, order) -> str:
        """The NHWC name of input ``t``: a region tensor's, a transposed constant, or a Transpose of ``t``."""
        if t in nhwc:
            return nhwc[t]
        if t in consts:
            value = np.asarray(consts[t])
            if value.ndim == 0 or value.size == 1:
                return t
            name = fresh_name(g, f"{t}_nhwc")
            value = value.reshape((1,) * (4 - value.ndim) + value.shape)
            g.graph["constants"][name] = np.ascontiguousarray(np.transpose(value, TO_NHWC))
            tensors[name] = TensorInfo(g.graph["constants"][name].shape, value.dtype)
            return name
        name = fresh_name(g, f"{t}_nhwc")
        tensors[name] = permuted(t)
        add_op(g, f"{name}_transpose", "Transpose", [t], [name], {"perm": list(TO_NHWC)}, order=order)
        nhwc[t] = name
        return name

    for nid in topo_order(g):
        if nid not in inside:
            continue
        d = g.nodes[nid]
        op, attrs, order = d["op"], dict(d["attrs"]), d["order"]
        if op == "Conv":
            inputs = [read(d["inputs"][0], order)] + list(d["inputs"][1:])
            attrs[LAYOUT_ATTR] = NHWC
        else:
            inputs = [read(t, order) if t else t for t in d["inputs"]]
        outputs = []
        for t in d["outputs"]:
            if not t:
                outputs.append(t)
                continue
            name = fresh_name(g, f"{t}_nhwc")
            tensors[name] = permuted(t)
            nhwc[t] = name
            outputs.append(name)
        remove_op(g, nid)
        add_op(g, nid, op, inputs, outputs, attrs, order=order)
        for t in d["outputs"]:
            if t and outside_readers[t]:
                add_op(g, f"{t}_nchw", "Transpose", [nhwc[t]], [t], {"perm": list(TO_NCHW)}, order=order)
    connect(g)
    return g
