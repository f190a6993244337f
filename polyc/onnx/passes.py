"""Graph passes: plain functions ``pass(graph) -> graph`` that never mutate their argument.

:func:`simplify` runs them in order: control flow and sequences made static (:mod:`polyc.onnx.control`,
:mod:`polyc.onnx.sequences`), Identity/Dropout removal, constant folding (:mod:`polyc.onnx.folding`, with
Shape/Size of static tensors turned into constants, so shape computations and Reshape targets resolve at
compile time), common subexpression elimination, BatchNormalization folded into the preceding Conv (or
decomposed into Mul/Add with folded constants), dead code elimination, and a final shape inference that
requires every tensor to have a static shape.
"""
from __future__ import annotations

import hashlib

import networkx as nx
import numpy as np
from onnx import helper

from ..errors import CompileError, ShapeError
from .control import lower_control_flow
from .folding import NONDETERMINISTIC, evaluate_node, fold_constants, fold_with_shapes, refresh_shapes
from .graph import (ZERO_TAPS_ATTR, TensorInfo, add_op, connect, consumers, copy_graph, fresh_name, producer, remove_op,
                    replace_uses, set_constant, to_model, topo_order)
from .fusion import ALIASES, ELEMENTWISE, close_diamond
from .layout import LAYOUT_ATTR, NCHW_IN, NHWC, TO_NCHW, TO_NHWC, channels_last_regions, find_regions
from .load import infer_shapes
from .ops import converter
from .ops.core import channels_last, vector_lanes
from .sequences import lower_sequences

#: Ops that forward their first input unchanged at inference time.
FORWARDING = {"Identity", "Dropout"}


def _forward(g: nx.DiGraph, out: str, src: str) -> bool:
    """Make readers of ``out`` read ``src``; keeps graph output names. False when that is not possible."""
    outputs = g.graph["outputs"]
    if out not in outputs:
        replace_uses(g, out, src)
        return True
    if src in g.graph["constants"]:
        set_constant(g, out, g.graph["constants"][src])
        return True
    p = producer(g, src)
    if p is None or src in outputs or src in g.graph["inputs"]:
        return False
    # rename src to out: its producer now writes the graph output directly
    readers = consumers(g, src)
    d = g.nodes[p]
    d["outputs"] = tuple(out if t == src else t for t in d["outputs"])
    for v in readers:
        g.nodes[v]["inputs"] = tuple(out if t == src else t for t in g.nodes[v]["inputs"])
    g.graph["tensors"][out] = g.graph["tensors"].get(src, g.graph["tensors"].get(out))
    connect(g)
    return True


def _dropout_is_inference(g: nx.DiGraph, d: dict) -> bool:
    """A Dropout is the identity unless its training_mode input (opset 12+) is true or not a constant."""
    if len(d["inputs"]) < 3 or not d["inputs"][2]:
        return True
    mode = g.graph["constants"].get(d["inputs"][2])
    return mode is not None and not bool(np.asarray(mode).reshape(-1)[0])


def remove_identities(g: nx.DiGraph) -> nx.DiGraph:
    """Remove Identity and (inference-mode) Dropout nodes; a used Dropout mask becomes a constant of ones."""
    g = copy_graph(g)
    for nid in topo_order(g):
        d = g.nodes[nid]
        if d["op"] not in FORWARDING:
            continue
        out, src = d["outputs"][0], d["inputs"][0]
        if d["op"] == "Dropout" and not _dropout_is_inference(g, d):
            continue
        if d["op"] == "Dropout" and len(d["outputs"]) > 1 and d["outputs"][1]:
            mask = d["outputs"][1]
            if consumers(g, mask) or mask in g.graph["outputs"]:
                shape = g.graph["tensors"][src].shape
                if shape is None:
                    continue
                set_constant(g, mask, np.ones(shape, dtype=bool))
        remove_op(g, nid)
        if not _forward(g, out, src):
            add_op(g, nid, "Identity", [src], [out], order=d["order"])
    connect(g)
    return g


def _attrs_key(attrs: dict):
    items = []
    for k, v in sorted(attrs.items()):
        if isinstance(v, np.ndarray):
            v = (v.dtype.str, v.shape, v.tobytes())
        elif isinstance(v, list):
            v = tuple((x.dtype.str, x.shape, x.tobytes()) if isinstance(x, np.ndarray) else x for x in v)
        items.append((k, v))
    return tuple(items)


def eliminate_common_subexpressions(g: nx.DiGraph) -> nx.DiGraph:
    """Merge equal constants (same dtype, shape and bytes) and nodes with the same op, inputs and attributes."""
    g = copy_graph(g)
    seen_const: dict = {}
    for name in list(g.graph["constants"]):
        if name in g.graph["outputs"] or name in g.graph["inputs"]:
            continue
        v = g.graph["constants"][name]
        key = (v.dtype.str, v.shape, hashlib.sha1(np.ascontiguousarray(v).tobytes()).hexdigest())
        if key in seen_const:
            replace_uses(g, name, seen_const[key])
        else:
            seen_const[key] = name
    seen: dict = {}
    for nid in topo_order(g):
        d = g.nodes[nid]
        if d["op"] in NONDETERMINISTIC:
            continue
        key = (d["op"], d.get("domain", ""), d["inputs"], len(d["outputs"]), _attrs_key(d["attrs"]))
        if key not in seen:
            seen[key] = nid
            continue
        first = g.nodes[seen[key]]
        if any(t in g.graph["outputs"] for t in d["outputs"]):
            continue
        for old, new in zip(d["outputs"], first["outputs"]):
            if old:
                replace_uses(g, old, new)
        remove_op(g, nid)
    connect(g)
    return g


def _bn_scale_shift(g: nx.DiGraph, d: dict):
    """(scale, shift) per channel of an inference BatchNormalization with constant parameters, or None."""
    consts = g.graph["constants"]
    if len(d["inputs"]) < 5 or not all(t in consts for t in d["inputs"][1:5]):
        return None
    if any(o for o in d["outputs"][1:]) or d["attrs"].get("training_mode", 0):
        return None
    if d["attrs"].get("spatial", 1) != 1:
        return None
    gamma, beta, mean, var = (consts[t].astype(np.float64) for t in d["inputs"][1:5])
    if gamma.ndim != 1:
        return None
    eps = d["attrs"].get("epsilon", 1e-5)
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def fold_batchnorm(g: nx.DiGraph) -> nx.DiGraph:
    """Fold an inference BatchNormalization into the Conv that feeds it: ``W' = W*s[o]``, ``B' = (B-mean)*s+beta``.

    The Conv must have constant weights (and bias) and the BatchNormalization must be its only reader.
    """
    g = copy_graph(g)
    consts = g.graph["constants"]
    for nid in topo_order(g):
        d = g.nodes[nid]
        if d["op"] != "BatchNormalization":
            continue
        conv = producer(g, d["inputs"][0])
        if conv is None or g.nodes[conv]["op"] != "Conv":
            continue
        c = g.nodes[conv]
        x_out = c["outputs"][0]
        if len(consumers(g, x_out)) != 1 or x_out in g.graph["outputs"]:
            continue
        if c["inputs"][1] not in consts or (len(c["inputs"]) > 2 and c["inputs"][2]
                                           and c["inputs"][2] not in consts):
            continue
        ss = _bn_scale_shift(g, d)
        if ss is None:
            continue
        scale, shift = ss
        w = consts[c["inputs"][1]]
        b = consts[c["inputs"][2]] if len(c["inputs"]) > 2 and c["inputs"][2] else np.zeros(w.shape[0], w.dtype)
        new_w = (w.astype(np.float64) * scale.reshape(-1, *[1] * (w.ndim - 1))).astype(w.dtype)
        new_b = (b.astype(np.float64) * scale + shift).astype(w.dtype)
        wname, bname = fresh_name(g, f"{conv}_W_bn"), fresh_name(g, f"{conv}_B_bn")
        set_constant(g, wname, new_w)
        set_constant(g, bname, new_b)
        y = d["outputs"][0]
        remove_op(g, nid)
        remove_op(g, conv)
        add_op(g, conv, "Conv", [c["inputs"][0], wname, bname], [y], c["attrs"], order=c["order"])
    connect(g)
    return g


def decompose_batchnorm(g: nx.DiGraph) -> nx.DiGraph:
    """Rewrite each remaining inference BatchNormalization as ``Mul(X, s) -> Add(., t)`` with folded constants."""
    g = copy_graph(g)
    for nid in topo_order(g):
        d = g.nodes[nid]
        if d["op"] != "BatchNormalization":
            continue
        ss = _bn_scale_shift(g, d)
        x = d["inputs"][0]
        info = g.graph["tensors"].get(x)
        if ss is None or info is None or info.shape is None or len(info.shape) < 2:
            continue
        dtype = info.dtype
        bshape = (-1,) + (1,) * (len(info.shape) - 2)
        sname, tname = fresh_name(g, f"{nid}_scale"), fresh_name(g, f"{nid}_shift")
        set_constant(g, sname, ss[0].astype(dtype).reshape(bshape))
        set_constant(g, tname, ss[1].astype(dtype).reshape(bshape))
        mid = fresh_name(g, f"{nid}_scaled")
        g.graph["tensors"][mid] = info
        y = d["outputs"][0]
        remove_op(g, nid)
        add_op(g, f"{nid}_mul", "Mul", [x, sname], [mid], order=d["order"])
        add_op(g, f"{nid}_add", "Add", [mid, tname], [y], order=d["order"])
    connect(g)
    return g


def _conv_geometry(g: nx.DiGraph, d: dict, at: int = -2):
    """(strides, kernel, pads_begin, out spatial) of a 2-D group-1 Conv with static shapes, or None; the
    image's two spatial axes are ``at``, ``at + 1`` from the end (-2 in NCHW, -3 in NHWC)."""
    x, y = g.graph["tensors"].get(d["inputs"][0]), g.graph["tensors"].get(d["outputs"][0])
    w = g.graph["constants"].get(d["inputs"][1])
    if x is None or y is None or w is None or x.shape is None or y.shape is None or len(x.shape) != 4 \
            or len(y.shape) != 4:
        return None
    a = d["attrs"]
    if int(a.get("group", 1)) != 1 or any(v != 1 for v in a.get("dilations", [1, 1])):
        return None
    strides, kernel = list(a.get("strides", [1, 1])), list(np.asarray(w).shape[2:])
    sx, sy = x.shape[4 + at:][:2], y.shape[4 + at:][:2]
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        total = [max((sy[i] - 1) * strides[i] + kernel[i] - sx[i], 0) for i in range(2)]
        pb = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
    elif auto == "VALID":
        pb = [0, 0]
    else:
        pb = list(a.get("pads", [0, 0, 0, 0]))[:2]
    return strides, kernel, pb, list(sy)


#: A strided convolution becomes a stride-1 one over its input's phases when its phases' boxes of taps cover
#: at most this many times its window (``P*P'*A*A' / (K*K')``; the lowering skips the zero taps, so the
#: multiply-adds are the same, but each phase's reduction is shorter). Measured (1 thread, Zen 4, AVX2 and
#: AVX-512 alike, zero taps still computed): a 3x3 stride-2 convolution (16/9) runs 1.7-1.9x faster direct,
#: now that a strided read is a power-of-two masked load and a shuffle (ResNet-50's 128 channels at 56: 3.9
#: -> 2.2 ms on AVX-512, 4.6 -> 2.3 ms on AVX2); a 7x7 stride-2 stem (64/49) stays 1.4x faster over phases on
#: AVX2 (level on AVX-512); a 1x1 stride-2 one (a subsampling Slice, 1x) 1.8-2.3x faster rewritten. With the
#: zero taps skipped (this Zen 5 host, the Conv alone, AVX-512 / AVX2 ms, direct -> phases): 3x3/2 stays
#: faster direct (128 channels at 56 0.96 -> 1.49 / 1.99 -> 3.11, 3 -> 32 at 224 0.16 -> 0.23 / 0.27 -> 0.36),
#: so does 5x5/2 (36/25; 32 -> 64 at 112 1.34 -> 1.39 / 3.07 -> 4.49); the 7x7/2 stem gains 1.30 -> 1.04.
SPACE_TO_DEPTH_MAX_WORK = 1.35


def strided_conv_to_space_to_depth(g: nx.DiGraph) -> nx.DiGraph:
    """Rewrite a strided 2-D Conv with constant weights into a stride-1 Conv over its input's phases, when
    their taps cover at most SPACE_TO_DEPTH_MAX_WORK times its window.

    ``Y(oh) = sum_k Xpad(s*oh + k) W(k)`` with ``k = s*a + p`` reads phase ``p`` of the padded input at
    ``oh + a``: so ``Pad -> Reshape (N,C,E,s,E',s') -> Slice (phases < K) -> Transpose (N,p,p',C,E,E')
    -> Reshape (N,P*P'*C,E,E') -> Conv(stride 1, W2)`` where ``W2[o, (p*P' + p')*C + c, a, a'] =
    W[o, c, s*a+p, s'*a'+p']``, zero past the kernel: unit-stride reads. The new Conv carries
    :data:`~polyc.onnx.graph.ZERO_TAPS_ATTR`, so its lowering leaves those zero taps out of the reduction
    (phase-major channels make each phase one box of taps, :func:`polyc.onnx.ops.core.tap_boxes`) and it does
    the ``K*K'`` multiply-adds of the strided convolution, not ``P*P'*A*A'``: a 7x7/2 stem from 3 channels at
    224 (1 thread, this Zen 5 host, the Conv alone) 1.30 -> 1.00 ms with AVX-512, 2.43 -> 1.88 with AVX2. A
    1x1 stride-2 convolution becomes a subsampling Slice and a 1x1 convolution.
    A convolution of a channels-last region (:func:`polyc.onnx.layout.find_regions`: a stem region's head, a
    strided 1x1 one in ResNet's downsampling path) stays as it is: channels-last it reads its strided window
    one broadcast pixel at a time, without the phases' zero taps or the subsampling copy. The regions are
    those of the graph as rewritten so far, found again after each round until a round rewrites nothing: a
    rewrite outside a region can leave it below find_regions' bars (ResNet-50 with AVX2: once its layer-4
    strided 1x1 convolution is rewritten, only the stem's region is left), and a convolution it held would
    otherwise run NCHW with strided vector reads (the layer-2 downsampling 1x1, AVX2, Zen 4, in the model:
    3.2 ms, 2.0 rewritten; ResNet-50 +1.7% at 1 thread, within noise at 2).
    """
    g = copy_graph(g)
    while True:  # a rewrite can shrink a region below find_regions' bars: repeat until no strided conv is left out
        regions = set().union(*find_regions(g))
        changed = False
        for nid in topo_order(g):
            if g.nodes[nid]["op"] == "Conv" and nid not in regions:
                changed = _space_to_depth(g, nid) or changed
        connect(g)
        if not changed:
            return g


def _space_to_depth(g: nx.DiGraph, nid: str) -> bool:
    """Rewrite strided Conv ``nid`` over its input's phases (:func:`strided_conv_to_space_to_depth`) in place;
    False when it is not one to rewrite."""
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    d = g.nodes[nid]
    geo = _conv_geometry(g, d)
    if geo is None:
        return False
    strides, kernel, pb, out = geo
    if all(s == 1 for s in strides):
        return False
    x_name, w_name = d["inputs"][0], d["inputs"][1]
    n, c, h, wd = tensors[x_name].shape
    dtype = tensors[x_name].dtype
    taps = [-(-k // s) for k, s in zip(kernel, strides)]          # A = ceil(K / s)
    phases = [min(s, k) for k, s in zip(kernel, strides)]         # P
    if phases[0] * phases[1] * taps[0] * taps[1] > SPACE_TO_DEPTH_MAX_WORK * kernel[0] * kernel[1]:
        return False
    extent = [o + a - 1 for o, a in zip(out, taps)]                # E
    pe = [s * e - size - b for s, e, size, b in zip(strides, extent, (h, wd), pb)]
    if any(v < 0 for v in pe):
        return False
    w = consts[w_name]
    w2 = np.zeros((w.shape[0], phases[0], phases[1], c, taps[0], taps[1]), w.dtype)
    for ph in range(phases[0]):
        for pw in range(phases[1]):
            for ah in range(taps[0]):
                for aw in range(taps[1]):
                    kh, kw = strides[0] * ah + ph, strides[1] * aw + pw
                    if kh < kernel[0] and kw < kernel[1]:
                        w2[:, ph, pw, :, ah, aw] = w[:, :, kh, kw]
    w2 = w2.reshape(w.shape[0], phases[0] * phases[1] * c, taps[0], taps[1])

    def const(base, value):
        name = fresh_name(g, f"{nid}_{base}")
        set_constant(g, name, np.asarray(value))
        return name

    def tensor(base, shape):
        name = fresh_name(g, f"{nid}_{base}")
        tensors[name] = TensorInfo(tuple(shape), dtype)
        return name
    order = d["order"]
    padded = tensor("padded", (n, c, strides[0] * extent[0], strides[1] * extent[1]))
    blocks = tensor("blocks", (n, c, extent[0], strides[0], extent[1], strides[1]))
    kept = tensor("phases", (n, c, extent[0], phases[0], extent[1], phases[1]))
    moved = tensor("moved", (n, phases[0], phases[1], c, extent[0], extent[1]))
    grouped = tensor("s2d", (n, phases[0] * phases[1] * c, extent[0], extent[1]))
    opset = g.graph["opset"]
    pads = [0, 0, pb[0], pb[1], 0, 0, pe[0], pe[1]]
    if any(pads):
        if opset >= 11:
            add_op(g, f"{nid}_pad", "Pad", [x_name, const("pads", np.array(pads, np.int64))], [padded], order=order)
        else:
            add_op(g, f"{nid}_pad", "Pad", [x_name], [padded], {"pads": pads}, order=order)
    else:
        padded = x_name
    add_op(g, f"{nid}_blocks", "Reshape", [padded, const("shape6", np.array(tensors[blocks].shape, np.int64))],
           [blocks], order=order)
    if phases != strides:
        ends = np.array([phases[0], phases[1]], np.int64)
        if opset >= 10:
            add_op(g, f"{nid}_phases", "Slice", [blocks, const("starts", np.zeros(2, np.int64)),
                                                const("ends", ends), const("axes", np.array([3, 5], np.int64))],
                   [kept], order=order)
        else:
            add_op(g, f"{nid}_phases", "Slice", [blocks], [kept],
                   {"starts": [0, 0], "ends": list(ends), "axes": [3, 5]}, order=order)
    else:
        kept = blocks
    add_op(g, f"{nid}_move", "Transpose", [kept], [moved], {"perm": [0, 3, 5, 1, 2, 4]}, order=order)
    add_op(g, f"{nid}_s2d", "Reshape", [moved, const("shape4", np.array(tensors[grouped].shape, np.int64))],
           [grouped], order=order)
    inputs = [grouped, const("W", w2)] + list(d["inputs"][2:3])
    remove_op(g, nid)
    add_op(g, nid, "Conv", inputs, d["outputs"], {"kernel_shape": taps, ZERO_TAPS_ATTR: 1}, order=order)
    return True


def flatten_min_pixels() -> int:
    """:func:`flatten_pointwise_conv` leaves a channels-last convolution alone below this many pixels: two
    register tiles of the target's vectors (2 x NR = 4 x the float32 lanes: 64 with AVX-512, 32 with AVX2).
    Fewer fill those vectors worse than the output channels do (7x7, 96 -> 576 channels, AVX-512: 0.13 ms
    flattened, 0.08 channels-last), more fill them better (14x14, 240 -> 40 channels: 0.044 ms flattened, 0.052
    channels-last). With AVX2's 8 lanes a 7x7 image (49 pixels) is past it: 160 -> 960 channels 0.35-0.52 ms
    channels-last, 0.26-0.41 flattened (one process, interleaved, 1 thread, Zen 3); MobileNetV2 1 thread
    0.67-0.71 -> 0.74-0.77 of onnxruntime, 2 threads 10.4 -> 9.8 ms; EfficientNet-B0 0.77 -> 0.83."""
    return 4 * vector_lanes("float32")


def flatten_pointwise_conv(g: nx.DiGraph) -> nx.DiGraph:
    """Give each 1x1 Conv (stride 1, no padding, group 1, 4-D, constant weights) the shape of a GEMM over
    the flattened image: ``Reshape (N,C,H,W) -> (N,C,1,H*W) -> Conv -> ... -> Reshape (N,K,H,W)``. A
    pointwise convolution reads and writes each image contiguously, so its vector loop may run over the
    ``H*W`` pixels instead of one row of ``W`` (55 columns run as 16+16+16+7 with a 3-register partial tile;
    3025 pixels as 189 full tiles and one partial one), as onnxruntime runs a 1x1 convolution as a GEMM.
    The Reshape back moves past the chain of elementwise nodes the convolution's fusion group would take in
    (each the single reader of the previous one, of the same output shape; their other inputs broadcast over
    the pixels, or are images of the same size, reshaped too, a compile-time constant reshaped at once), so
    the group stays one kernel; Reshapes of contiguous data are memory aliases, not kernels. A convolution
    the lowering computes channels-last (:func:`polyc.onnx.ops.core.channels_last`: vectors over the output
    channels) stays as it is when its image has fewer than :func:`flatten_min_pixels` pixels, unless it
    computes channels-last flattened as well (a deep reduction over a narrow image: its register tile's rows
    then run over all ``H*W`` pixels instead of one image row).

    A 1x1 Conv of a channels-last region (``polyc_layout=NHWC``, :mod:`polyc.onnx.layout`) is flattened the
    same way, ``(N,H,W,C) -> (N,1,H*W,C)``: its vectors run over the output channels either way, and its
    register tile's rows over the ``H*W`` pixels instead of one row of ``W`` (13 columns as rows of 5, 5
    and 3 with AVX2; 169 pixels as 28 rows of 6 and one). SqueezeNet's 512 -> 1000 classifier at 13x13, 1
    thread, Zen 4, AVX2 / AVX-512: 1.76 -> 1.59 / 1.66 -> 1.60 ms."""
    g = copy_graph(g)
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    for nid in topo_order(g):
        if nid not in g:
            continue
        d = g.nodes[nid]
        layout = d["attrs"].get(LAYOUT_ATTR)
        if d["op"] != "Conv" or d["inputs"][1] not in consts or layout not in (None, NHWC):
            continue
        at = -3 if layout == NHWC else -2  # the image's axes from the end: -2, -1 in NCHW, -3, -2 in NHWC
        geo = _conv_geometry(g, d, at)
        if geo is None:
            continue
        strides, kernel, pb, out = geo
        x_shape, image = tensors[d["inputs"][0]].shape, tensors[d["outputs"][0]].shape
        h, w = x_shape[at], x_shape[at + 1]
        if kernel != [1, 1] or strides != [1, 1] or any(pb) or out != [h, w] or h == 1:
            continue

        def flat(shape):  # ``shape`` with the image's two axes as (1, H*W)
            k = len(shape) + at
            return tuple(shape[:k]) + (1, shape[k] * shape[k + 1]) + tuple(shape[k + 2:])
        if layout is None and channels_last(image, 1, True) and h * w < flatten_min_pixels() \
                and not channels_last(flat(image), 1, True, (1, 1), tensors[d["inputs"][0]].dtype, x_shape[1]):
            continue
        order = d["order"]

        def const(base, value):
            name = fresh_name(g, f"{nid}_{base}")
            set_constant(g, name, np.asarray(value))
            return name

        def view(tensor, shape):  # a Reshape of ``tensor`` to ``shape`` (a constant: reshaped now)
            if tensor in consts:
                return const("flat", np.asarray(consts[tensor]).reshape(shape))
            source = producer(g, tensor)  # the Reshape back of a flattened chain before: its input
            if source is not None and g.nodes[source]["op"] == "Reshape":
                flat_input = g.nodes[source]["inputs"][0]
                if tuple(tensors[flat_input].shape) == tuple(shape):
                    return flat_input
            name = fresh_name(g, f"{tensor}_flat")
            tensors[name] = TensorInfo(tuple(shape), tensors[tensor].dtype)
            add_op(g, f"{name}_reshape", "Reshape", [tensor, const("shape", np.array(shape, np.int64))], [name],
                   order=order)
            return name
        # the chain the fusion group would absorb, ending where the image shape is needed again
        chain, tail = [], d["outputs"][0]
        while tail not in g.graph["outputs"]:
            readers = consumers(g, tail)
            if len(readers) > 1:  # a diamond the fusion group takes in whole (x * sigmoid(x))
                readers = close_diamond(g, [nid] + chain, tail, {}) or [None]
            if not all(r is not None and _flattens_node(g, r, [nid] + chain + readers[:k], image, at)
                       for k, r in enumerate(readers)):
                break
            chain += readers
            tail = g.nodes[readers[-1]]["outputs"][0]
        x = view(d["inputs"][0], flat(x_shape))
        renamed = {}
        for node in [nid] + chain:
            nd = g.nodes[node]
            inputs = []
            for t in nd["inputs"]:
                if t in renamed:
                    inputs.append(renamed[t])
                elif node == nid:
                    inputs.append(x if t == nd["inputs"][0] else t)
                elif t and len(tensors[t].shape) >= -at and tuple(tensors[t].shape[at:at + 2 or None]) == (h, w):
                    inputs.append(view(t, flat(tensors[t].shape)))
                else:
                    inputs.append(t)
            out = nd["outputs"][0]
            renamed[out] = fresh_name(g, f"{out}_flat")
            tensors[renamed[out]] = TensorInfo(flat(image), tensors[out].dtype)
            attrs = dict(nd["attrs"])
            op = nd["op"]
            remove_op(g, node)
            add_op(g, node, op, inputs, [renamed[out]] + list(nd["outputs"][1:]), attrs, order=nd["order"])
        add_op(g, f"{nid}_unflatten", "Reshape", [renamed[tail], const("shape", np.array(image, np.int64))],
               [tail], order=g.nodes[([nid] + chain)[-1]]["order"])
    connect(g)
    return g


#: Elementwise ops :func:`flatten_pointwise_conv` carries past (the fusion group's epilogue): those the fusion
#: groups take in, but for the ones whose attributes name an axis.
_POINTWISE_CHAIN_OPS = ELEMENTWISE - {"QuantizeLinear", "DequantizeLinear", "Expand"}


def _flattens_node(g: nx.DiGraph, node: str, group: list, image, at: int = -2) -> bool:
    """Whether elementwise ``node`` of a chain after the pointwise Conv ``group[0]`` can run over the
    flattened image (its axes ``at``, ``at + 1`` from the end): an op of _POINTWISE_CHAIN_OPS, one output of
    the image's shape, every input from the chain or flattening (:func:`_flattens`)."""
    d, tensors = g.nodes[node], g.graph["tensors"]
    outs = [o for o in d["outputs"] if o]
    produced = {t for m in group for t in g.nodes[m]["outputs"]}
    return (d["op"] in _POINTWISE_CHAIN_OPS and len(outs) == 1 and tensors[outs[0]].shape == image
            and all(_flattens(tensors[t].shape, image, at) for t in d["inputs"] if t and t not in produced))


def _flattens(shape, image, at: int = -2) -> bool:
    """Whether another input of ``shape`` of an elementwise node over ``image`` (N,K,H,W, or N,H,W,K with
    ``at`` -3) can follow the flattening of the image's axes ``at``, ``at + 1`` from the end: it broadcasts
    over both, or spans both (numpy's broadcasting: missing leading axes are 1)."""
    shape = (1,) * (len(image) - len(shape or ())) + tuple(shape or ())
    axes = shape[len(shape) + at:len(shape) + at + 2]
    return axes == (1, 1) or axes == tuple(image[len(image) + at:len(image) + at + 2])


#: A Conv reads an explicitly zero-padded copy of its input (:func:`explicit_conv_padding`) when each input
#: element feeds at least this many multiply-adds (output channels per group x window taps): the copy costs
#: one load and store per element, at most 1/PAD_COPY_MIN_REUSE of the multiply-adds, while the guards it
#: replaces test every multiply-add and keep the register tile's vector loads masked. Depthwise convolutions
#: (one output channel per group, 9 taps: memory-bound, where a copy is a second pass) keep their guards.
PAD_COPY_MIN_REUSE = 16


def explicit_conv_padding(g: nx.DiGraph) -> nx.DiGraph:
    """Give each padded Conv with constant weights and enough reuse (:data:`PAD_COPY_MIN_REUSE`) a Pad node
    of its own: ``Pad(x, pads) -> Conv(pads=0)``, the Pad extended at the end only as far as the windows
    reach (``(out-1)*stride + (k-1)*dilation - pad_begin - (in-1)``). The Pad is a kernel of its own, so the
    convolution's window reads need no bounds guard (as onnxruntime's and oneDNN's padded-input paths). A
    channels-last region's head (``polyc_layout=NCHW_IN``, :mod:`polyc.onnx.layout`) reads an NCHW input too,
    a group-1 Conv with NHWC input (``polyc_layout=NHWC``) an NHWC one, padded along H and W: with guards,
    the bounds of the unrolled row of its register tile vary with the tap at the image's edges (ResNet-18/2's
    3x3 convolutions of 128 channels at 14x14, 1 thread, AVX-512: 0.68 ms guarded, 0.21 padded). A depthwise
    one keeps its guards (memory-bound: the copy would cost more than the guards)."""
    g = copy_graph(g)
    consts, tensors = g.graph["constants"], g.graph["tensors"]
    for nid in topo_order(g):
        d = g.nodes[nid]
        layout = d["attrs"].get(LAYOUT_ATTR) if d["op"] == "Conv" else None
        if d["op"] != "Conv" or d["inputs"][1] not in consts \
                or (layout == NHWC and int(d["attrs"].get("group", 1)) != 1):
            continue
        x_name = d["inputs"][0]
        x, y, w = tensors.get(x_name), tensors.get(d["outputs"][0]), consts[d["inputs"][1]]
        if x is None or y is None or x.shape is None or y.shape is None or len(x.shape) < 3:
            continue
        if layout in (NCHW_IN, NHWC):  # a channels-last region's: NHWC output (and input), seen as NCHW here
            y = TensorInfo(tuple(y.shape[p] for p in TO_NCHW), y.dtype)
        if layout == NHWC:
            x = TensorInfo(tuple(x.shape[p] for p in TO_NCHW), x.dtype)
        a = d["attrs"]
        nsp = len(x.shape) - 2
        kernel = list(w.shape[2:])
        if int(w.shape[0]) // int(a.get("group", 1)) * int(np.prod(kernel)) < PAD_COPY_MIN_REUSE:
            continue
        strides = list(a.get("strides", [1] * nsp))
        dil = list(a.get("dilations", [1] * nsp))
        auto = a.get("auto_pad", b"NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto in ("SAME_UPPER", "SAME_LOWER"):
            total = [max((y.shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] + 1 - x.shape[2 + i], 0)
                     for i in range(nsp)]
            pb = [t // 2 if auto == "SAME_UPPER" else t - t // 2 for t in total]
        elif auto == "VALID":
            pb = [0] * nsp
        else:
            pb = list(a.get("pads", [0] * 2 * nsp))[:nsp]
        pe = [max(0, (y.shape[2 + i] - 1) * strides[i] + (kernel[i] - 1) * dil[i] - pb[i] - (x.shape[2 + i] - 1))
              for i in range(nsp)]
        if not any(pb) and not any(pe):
            continue
        padded = fresh_name(g, f"{nid}_padded")
        shape = tuple(x.shape[:2]) + tuple(x.shape[2 + i] + pb[i] + pe[i] for i in range(nsp))
        pads = [0, 0] + pb + [0, 0] + pe
        if layout == NHWC:
            shape = tuple(shape[p] for p in TO_NHWC)
            pads = [pads[p] for p in TO_NHWC] + [pads[4 + p] for p in TO_NHWC]
        tensors[padded] = TensorInfo(shape, x.dtype)
        order = d["order"]
        if g.graph["opset"] >= 11:
            pads_name = fresh_name(g, f"{nid}_pads")
            set_constant(g, pads_name, np.array(pads, np.int64))
            add_op(g, f"{nid}_pad", "Pad", [x_name, pads_name], [padded], order=order)
        else:
            add_op(g, f"{nid}_pad", "Pad", [x_name], [padded], {"pads": pads}, order=order)
        attrs = {k: v for k, v in a.items() if k not in ("pads", "auto_pad")}
        inputs, outputs = [padded] + list(d["inputs"][1:]), list(d["outputs"])
        remove_op(g, nid)
        add_op(g, nid, "Conv", inputs, outputs, attrs, order=order)
    connect(g)
    return g


def eliminate_dead_code(g: nx.DiGraph) -> nx.DiGraph:
    """Remove nodes that no graph output depends on, and constants nothing reads."""
    g = copy_graph(g)
    live = set()
    for t in g.graph["outputs"]:
        p = producer(g, t)
        if p is not None:
            live.add(p)
            live |= nx.ancestors(g, p)
    for nid in [n for n in g.nodes if n not in live]:
        remove_op(g, nid)
    read = set(g.graph["outputs"]) | set(g.graph["inputs"])
    for _, d in g.nodes(data=True):
        read.update(d["inputs"])
    g.graph["constants"] = {k: v for k, v in g.graph["constants"].items() if k in read}
    connect(g)
    return g


def infer_static_shapes(g: nx.DiGraph) -> nx.DiGraph:
    """Re-run onnx shape inference on the graph; every tensor a node writes must get a static shape."""
    g = copy_graph(g)
    try:
        model = to_model(g, weights=False)
    except Exception as e:  # onnx.helper on a value it cannot serialise
        raise CompileError(f"cannot re-export the simplified graph for shape inference: {type(e).__name__}: {e}") \
            from e
    model = infer_shapes(model)
    infos = {}
    for vi in list(model.graph.value_info) + list(model.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape") and all(dd.HasField("dim_value") for dd in t.shape.dim):
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
            infos[vi.name] = TensorInfo(tuple(int(dd.dim_value) for dd in t.shape.dim), dtype)
    vague = set()  # tensors of unsupported nodes and of nodes after them: check_supported names those nodes
    for nid in topo_order(g):
        d = g.nodes[nid]
        unsupported = d.get("domain", "") not in ("", "ai.onnx") or (
            d["op"] not in ALIASES and converter(d["op"], g.graph["opset"]) is None)
        if unsupported or any(t in vague for t in d["inputs"]):
            vague.update(t for t in d["outputs"] if t and t not in infos)
        for t in d["outputs"]:
            if not t or t in vague:
                continue
            if t not in infos:
                raise ShapeError(f"tensor {t!r} written by node {nid} ({d['op']}) has no static shape "
                                 f"after shape inference", hint="pin dynamic input dims with input_shapes=")
            g.graph["tensors"][t] = infos[t]
    return g


def simplify(g: nx.DiGraph, space_to_depth: bool = True) -> nx.DiGraph:
    """The standard pass pipeline, in order; each step is a pure ``graph -> graph`` function.

    ``space_to_depth=False`` keeps strided convolutions as they are (see
    :func:`strided_conv_to_space_to_depth`).
    """
    g = lower_control_flow(lower_sequences(g))
    g = remove_identities(g)
    g = fold_constants(g)
    g = eliminate_common_subexpressions(g)
    g = fold_batchnorm(g)
    g = decompose_batchnorm(g)
    if space_to_depth:
        g = strided_conv_to_space_to_depth(g)
    g = fold_constants(g)
    g = fold_with_shapes(g)
    g = eliminate_dead_code(g)
    g = infer_static_shapes(g)
    # shapes are final from here: the passes below set the shapes of what they write themselves
    g = channels_last_regions(g)
    g = explicit_conv_padding(g)
    g = flatten_pointwise_conv(g)
    g = eliminate_dead_code(g)
    return g


__all__ = ["remove_identities", "fold_constants", "eliminate_common_subexpressions", "fold_batchnorm",
           "decompose_batchnorm", "strided_conv_to_space_to_depth", "explicit_conv_padding", "flatten_pointwise_conv",
           "eliminate_dead_code", "infer_static_shapes", "simplify", "evaluate_node", "refresh_shapes",
           "fold_with_shapes"]
