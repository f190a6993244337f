"""Channels-last regions: runs of convolutions that keep their images in NHWC between them.

In NCHW the only stride-1 dimension of an image is its width, and a width of 7 or 14 (the last stages of
ResNet, MobileNet, EfficientNet) fills vectors badly. :func:`polyc.onnx.ops.core.channels_last` already lets
one such convolution accumulate channels-last and read its NCHW result back in its epilogue; a depthwise
convolution cannot, because its input is read along the channel it writes, and in NCHW that is a gather. In
NCHW a depthwise convolution vectorizes along a row instead, a partial vector at 7 or 14 columns and a
masked load per tap at the edges; in NHWC along the channels, at the same speed as onnxruntime's NCHWc
kernels or faster (1 thread: 960 channels at 7x7 0.023 ms against 0.026, 96 channels 112 -> 56 0.13 against
0.21; NCHW 0.054 and 0.24).

:func:`channels_last_regions` does what onnxruntime's NCHWc transformer and OpenVINO's layout propagation do,
per region instead of for the whole graph. :func:`find_regions` joins *candidate* convolutions
(:func:`candidate_conv`: depthwise, 1x1, and those the per-convolution rule computes channels-last), *head*
convolutions (:func:`head_conv`: any group-1 convolution, which reads its NCHW input as it is and writes
NHWC: a network's stem), NHWC-capable elementwise nodes, Concats, MaxPools and GlobalAveragePools where one
reads what another writes, and keeps a region whose boundary copies are cheap next to what computing it
channels-last saves (:func:`_saved_bytes`: the outputs of depthwise convolutions and of the convolutions the
per-convolution rule would read back to NCHW, the inputs of MaxPools; :data:`REGION_MAX_BOUNDARY`). Measured
(1 thread, Zen 5, polyc alone before and after, AVX-512 / AVX2): SqueezeNet, one region from its stem to its
pooling, 1.17x / 1.05x faster; ResNet-18/2 1.08x / 1.02x; ResNet-50 1.02x with AVX-512 (with AVX2 its
bottlenecks' large 1x1 convolutions stay out, :func:`candidate_conv`, and so does the rest). Each region is
rewritten:

- each Conv gets the attribute ``polyc_layout``: ``"NHWC"`` (input and output NHWC) or ``"NCHW_IN"`` (a head);
  its weights stay ONNX's ``(M, C/group, kh, kw)`` constant, re-laid by the converter at compile time;
- each elementwise node computes on the NHWC tensors, its constant operands transposed once (a per-channel
  bias ``(C, 1, 1)`` becomes ``(1, 1, 1, C)``); a Concat's axis moves with its dimension (channels: 3); a
  GlobalAveragePool becomes a ReduceMean over axes 1 and 2;
- a Transpose node puts an NCHW tensor from outside into NHWC where a region node but a head reads it, and
  one puts a region tensor back into NCHW where something outside reads it (or it is a graph output), under
  its original name.

Shapes are set here (the graph's shape inference has run: the pass comes after
:func:`polyc.onnx.passes.infer_static_shapes`), so ONNX's NCHW rules never see an NHWC Conv."""
from __future__ import annotations

import networkx as nx
import numpy as np

from .graph import (LAYOUT_ATTR, NCHW_IN, NHWC, TensorInfo, add_op, connect, consumers, copy_graph, fresh_name,
                    producer, remove_op, topo_order)
from .ops.core import (CHANNELS_LAST_MIN_CHANNELS, CHANNELS_LAST_MIN_IN_CHANNELS, channels_last,
                       vector_lanes)

TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)

#: Elementwise ops a region computes in NHWC: their result does not depend on the layout once their
#: broadcast operands are transposed alike.
REGION_ELEMENTWISE = frozenset({"Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "LeakyRelu",
                                "Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Exp"})

#: A region is rewritten when it holds at least this many convolutions (one alone is better off with the
#: per-convolution forms).
REGION_MIN_CONVS = 2


def _image(g: nx.DiGraph, t: str):
    info = g.graph["tensors"].get(t)
    return None if info is None or info.shape is None or len(info.shape) != 4 else tuple(info.shape)


def head_conv(g: nx.DiGraph, nid: str) -> bool:
    """Whether Conv ``nid`` can start a region, reading its NCHW input as it is and writing NHWC (the form of
    :func:`polyc.onnx.ops.core.channels_last` without the read-back): 2-D, group 1, float32, constant weights
    (and bias). A network's stem (3 input channels, 112 columns) is one."""
    d = g.nodes[nid]
    return _plain_conv(g, nid) and int(d["attrs"].get("group", 1)) == 1


def _plain_conv(g: nx.DiGraph, nid: str) -> bool:
    """A 2-D float32 Conv with constant weights (and bias)."""
    d = g.nodes[nid]
    if d["op"] != "Conv" or len(d["inputs"]) < 2:
        return False
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    w = d["inputs"][1]
    bias = d["inputs"][2] if len(d["inputs"]) > 2 else ""
    return (_image(g, d["inputs"][0]) is not None and _image(g, d["outputs"][0]) is not None and w in consts
            and (not bias or bias in consts) and np.dtype(tensors[d["inputs"][0]].dtype) == np.float32)


def candidate_conv(g: nx.DiGraph, nid: str) -> bool:
    """Whether Conv ``nid`` computes channels-last inside a region: 2-D, float32, constant weights (and bias),
    and either depthwise (one filter per channel), or group 1 and 1x1 (a GEMM over the pixels whichever the
    layout; its weights are a constant packed once into panels, so channels-last they stream contiguously,
    however large), or group 1 and chosen by
    :func:`~polyc.onnx.ops.core.channels_last` (narrow images, or a width that fills its register tiles
    badly). Any other convolution stays NCHW (and a region's head when it reads from outside it).

    A rule kept 1x1 convolutions with weights of twice the L2 size out with AVX2, whose NR = 16 float32 are one
    cache line: channels-last, each step of the input channel read a line of the next weight row, a page
    away (measured before constants were packed once: 1024 -> 2048 channels at 7x7, 5.5 ms against 3.4
    flattened). Packed, the weights stream contiguously; without the rule ResNet-50 with AVX2 becomes one region
    and runs 86.5 -> 79.9 ms at 1 thread, 45.0 -> 41.0 at 2 (Zen 4, L2 1 MiB; the next-largest change among the
    benchmark's models: none)."""
    d = g.nodes[nid]
    if not _plain_conv(g, nid):
        return False
    consts = g.graph["constants"]
    x, y = _image(g, d["inputs"][0]), _image(g, d["outputs"][0])
    w = d["inputs"][1]
    group = int(d["attrs"].get("group", 1))
    kernel = list(np.asarray(consts[w]).shape[2:])
    if group == 1 and kernel == [1, 1]:
        return True
    if group == 1:
        return channels_last(y, 1, True, kernel, "float32", x[1])
    return depthwise(g, nid)


def depthwise(g: nx.DiGraph, nid: str) -> bool:
    """Whether Conv ``nid`` has one filter per channel (group = input channels = output channels)."""
    d = g.nodes[nid]
    x, y = _image(g, d["inputs"][0]), _image(g, d["outputs"][0])
    w = g.graph["constants"].get(d["inputs"][1])
    return (d["op"] == "Conv" and x is not None and y is not None and w is not None
            and int(d["attrs"].get("group", 1)) == x[1] == y[1] and np.asarray(w).shape[1] == 1)


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


def _pool(g: nx.DiGraph, nid: str) -> bool:
    """Whether ``nid`` is a GlobalAveragePool (a ReduceMean over H and W in NHWC) or a 2-D MaxPool without
    its indices output (``polyc_layout`` = NHWC) of a 4-D float32 image."""
    d = g.nodes[nid]
    x = _image(g, d["inputs"][0]) if d["op"] in ("GlobalAveragePool", "MaxPool") else None
    if d["op"] == "MaxPool" and (len([t for t in d["outputs"] if t]) != 1 or not d["outputs"][0]):
        return False
    return x is not None and np.dtype(g.graph["tensors"][d["inputs"][0]].dtype) == np.float32


def _concat(g: nx.DiGraph, nid: str) -> bool:
    """Whether ``nid`` is a Concat of 4-D float32 images (along any axis: in NHWC the axis moves with its
    dimension, channels to 3)."""
    d = g.nodes[nid]
    if d["op"] != "Concat" or len(d["outputs"]) != 1 or _image(g, d["outputs"][0]) is None:
        return False
    tensors, consts = g.graph["tensors"], g.graph["constants"]
    return all(t and t not in consts and _image(g, t) is not None and np.dtype(tensors[t].dtype) == np.float32
               for t in d["inputs"])


#: A region is rewritten when the bytes its boundary Transposes copy are at most this share of the bytes it
#: saves (:func:`_saved_bytes`): a Transpose costs about one pass over its tensor, the NHWC form of a
#: (memory-bound) depthwise convolution saves about half a pass over its output. ShuffleNetV2's branches
#: (one depthwise conv, its result transposed back for the Concat) stay NCHW; MobileNetV2 and EfficientNet
#: become one region each from their stem to their pooling, and so do SqueezeNet and ResNet-18/2.
REGION_MAX_BOUNDARY = 0.5


def _boundary_bytes(g: nx.DiGraph, comp: set, heads: set) -> int:
    """The bytes of the tensors a region of ``comp`` (with the head convs ``heads``) would transpose."""
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    crossing = set()
    for n in comp:
        d = g.nodes[n]
        for t in d["inputs"] if n not in heads else ():
            if t and t not in consts and producer(g, t) not in comp:
                crossing.add(t)
        for t in d["outputs"]:
            if t and (t in g.graph["outputs"] or any(r not in comp for r in consumers(g, t))):
                crossing.add(t)
    return sum(tensors[t].nbytes for t in crossing)


def _saved_bytes(g: nx.DiGraph, comp: set, heads: set) -> int:
    """What computing ``comp`` channels-last saves, in bytes of one pass each: the outputs of its depthwise
    convolutions (NCHW: a partial vector along a narrow row and masked loads at the edges), the outputs of the
    group-1 convolutions with a window that the per-convolution rule computes channels-last anyway and then
    reads back to NCHW (a scatter pass), and the inputs of its MaxPools (NCHW: a stride-2 pool picks every
    other element of its loads; NHWC takes each tap as a vector of channels)."""
    tensors, consts = g.graph["tensors"], g.graph["constants"]
    saved = 0
    for n in comp:
        d = g.nodes[n]
        if d["op"] == "Conv" and n not in heads and (
                depthwise(g, n) or np.asarray(consts[d["inputs"][1]]).shape[2:] != (1, 1)):
            saved += tensors[d["outputs"][0]].nbytes
        elif d["op"] == "MaxPool":
            saved += tensors[d["inputs"][0]].nbytes
    return saved


def stem_region(g: nx.DiGraph, nid: str) -> set | None:
    """The stem region Conv ``nid`` heads, or None: a head convolution (:func:`head_conv`) of fewer than
    CHANNELS_LAST_MIN_IN_CHANNELS input channels (a network's stem: 3 channels), at least
    CHANNELS_LAST_MIN_CHANNELS output channels that fill the register tile's vectors (a multiple of NR, two
    vectors), the chain of elementwise nodes after it (each the single reader of the one before, its other
    inputs constants) and the MaxPool that ends it: ``{conv, chain.., pool}``. Channels-last, the convolution
    broadcasts one input pixel per tap over a vector of output channels (no strided loads, no
    space-to-depth padding of the window, no read-back) and the MaxPool takes each tap as one vector of
    channels; only the pooled image, a quarter of the convolution's output, is transposed back. Measured
    (conv + ReLU + MaxPool, 1 thread, this Zen 5 host, NCHW -> region, AVX-512 / AVX2): ResNet-50's 7x7/2
    3 -> 64 at 224 px 1.55 -> 1.26 / 3.02 -> 2.28 ms, ResNet-18/2's (32 channels) 0.78 -> 0.60 / 1.55 ->
    1.21, SqueezeNet's 3x3/2 3 -> 64 with a 3x3/2 pool 0.55 -> 0.32 / 1.06 -> 0.52 (onnxruntime 0.98, 0.51,
    0.25)."""
    if not head_conv(g, nid):
        return None
    d = g.nodes[nid]
    x, y = _image(g, d["inputs"][0]), _image(g, d["outputs"][0])
    if x[1] >= CHANNELS_LAST_MIN_IN_CHANNELS or y[1] < CHANNELS_LAST_MIN_CHANNELS \
            or y[1] % (2 * vector_lanes("float32")):
        return None
    consts = g.graph["constants"]
    region, t = {nid}, d["outputs"][0]
    while True:
        readers = consumers(g, t)
        if len(readers) != 1 or t in g.graph["outputs"]:
            return None
        r = readers[0]
        if g.nodes[r]["op"] == "MaxPool" and _pool(g, r):
            return region | {r}
        if not _elementwise(g, r) or any(u and u != t and u not in consts for u in g.nodes[r]["inputs"]):
            return None
        region.add(r)
        t = g.nodes[r]["outputs"][0]


def find_regions(g: nx.DiGraph) -> list[set]:
    """The node sets :func:`channels_last_regions` rewrites: connected components of candidate and head
    convolutions, NHWC-capable elementwise nodes, Concats and pools (joined where one reads what another
    writes), without the elementwise nodes at their head (whose every data input comes from outside: they
    would move a Transpose before them and out of their producer's epilogue) and without head-only
    convolutions inside, each holding at least REGION_MIN_CONVS convolutions and a boundary of at most
    REGION_MAX_BOUNDARY times the bytes it saves (:func:`_saved_bytes`); then the stem regions
    (:func:`stem_region`) of the stems outside those."""
    candidates = {n for n in g.nodes if candidate_conv(g, n)}
    able = candidates | {n for n in g.nodes if head_conv(g, n) or _elementwise(g, n) or _pool(g, n)
                         or _concat(g, n)}
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
        while changed:  # drop elementwise heads, and head-only convs inside, until none is left
            changed = False
            for n in sorted(comp):
                d = g.nodes[n]
                data = [t for t in d["inputs"] if t and t not in consts]
                if d["op"] == "Conv":
                    drop = n not in candidates and producer(g, d["inputs"][0]) in comp
                else:
                    drop = not any(producer(g, t) in comp for t in data)
                if drop:
                    comp.discard(n)
                    changed = True
        convs = [n for n in comp if g.nodes[n]["op"] == "Conv"]
        heads = {n for n in convs if producer(g, g.nodes[n]["inputs"][0]) not in comp}
        saved = _saved_bytes(g, comp, heads)
        if len(convs) >= REGION_MIN_CONVS and saved and _boundary_bytes(g, comp, heads) <= REGION_MAX_BOUNDARY * saved:
            regions.append(comp)
    taken = set().union(*regions)
    for n in topo_order(g):
        stem = stem_region(g, n) if n not in taken and g.nodes[n]["op"] == "Conv" else None
        if stem is not None and not stem & taken:
            regions.append(stem)
            taken |= stem
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
        if op == "Conv" and int(attrs.get("group", 1)) == 1 and d["inputs"][0] not in nhwc:
            inputs = list(d["inputs"])  # a head: reads its NCHW input as it is
            attrs[LAYOUT_ATTR] = NCHW_IN
        elif op == "Conv":
            inputs = [read(d["inputs"][0], order)] + list(d["inputs"][1:])
            attrs[LAYOUT_ATTR] = NHWC
        elif op == "MaxPool":
            inputs = [read(d["inputs"][0], order)]
            attrs[LAYOUT_ATTR] = NHWC
        elif op == "Concat":
            inputs = [read(t, order) for t in d["inputs"]]
            attrs["axis"] = TO_NHWC.index(int(attrs.get("axis", 1)) % 4)
        elif op == "GlobalAveragePool":  # over H and W of the NHWC image
            inputs = [read(d["inputs"][0], order)]
            op, attrs = "ReduceMean", {"keepdims": 1}
            if g.graph["opset"] >= 18:
                axes = fresh_name(g, f"{nid}_axes")
                g.graph["constants"][axes] = np.array([1, 2], np.int64)
                tensors[axes] = TensorInfo((2,), np.dtype(np.int64))
                inputs.append(axes)
            else:
                attrs["axes"] = [1, 2]
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
