"""Constant folding: every node whose inputs are compile-time constants becomes a constant.

:func:`fold_constants` evaluates such nodes (:func:`evaluate_node`: polyc's own numpy code for the ops in
:data:`FOLDERS`, else onnx's reference evaluator), and Shape/Size of static tensors, so shape computations and
Reshape targets resolve at compile time; :func:`refresh_shapes` and :func:`fold_with_shapes` infer shapes
again once folding made constant what a shape depended on. Plain functions ``graph -> graph`` that never
mutate their argument, used by the pass pipeline (:func:`polyc.onnx.passes.simplify`) and by the control-flow
and sequence passes (:mod:`polyc.onnx.control`, :mod:`polyc.onnx.sequences`) that fold as they unroll.
"""
from __future__ import annotations

import warnings

import networkx as nx
import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .graph import TensorInfo, connect, copy_graph, export_attr, remove_op, set_constant, to_model, topo_order
from .load import infer_shapes
from .validate import WINDOW_OPS, too_large

#: Ops never folded: their value is not a function of their inputs.
NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                    "Bernoulli"}


def _static_shape_value(g: nx.DiGraph, d: dict):
    """The value of a Shape or Size node whose input has a static shape, else None."""
    info = g.graph["tensors"].get(d["inputs"][0])
    if info is None or info.shape is None:
        return None
    shape = np.array(info.shape, dtype=np.int64)
    if d["op"] == "Size":
        return np.array(int(np.prod(shape)), dtype=np.int64)
    rank = len(shape)
    start = d["attrs"].get("start", 0)
    end = d["attrs"].get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return shape[start:end]


def _gather_elements(d: dict, values: list) -> list:
    """GatherElements (ONNX spec, opset 11+; 13 widens the types): ``out[i..] = data[i.. with i_axis =
    indices[i..]]``, negative indices counted from the end. onnx's reference uses ``np.choose``, which
    takes at most 64 choices (and its fallback reshapes wrongly), so folding uses ``np.take_along_axis``.
    ``indices`` may be smaller than ``data`` on the other axes (the output has its shape).
    Raises ValueError for a rank mismatch or an index out of range (the node then stays unfolded)."""
    data, indices = np.asarray(values[0]), np.asarray(values[1]).astype(np.int64)
    rank = data.ndim
    axis = int(d["attrs"].get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    if indices.ndim != rank or not 0 <= axis < rank:
        raise ValueError(f"GatherElements: indices of rank {indices.ndim}, data of rank {rank}, axis {axis}")
    if any(i > n for k, (i, n) in enumerate(zip(indices.shape, data.shape)) if k != axis):
        raise ValueError("GatherElements: indices larger than data outside the axis")
    n = data.shape[axis]
    if indices.size and (indices.min() < -n or indices.max() >= n):
        raise ValueError(f"GatherElements: an index is out of range for extent {n}")
    indices = np.where(indices < 0, indices + n, indices)
    view = data[tuple(slice(None) if k == axis else slice(0, indices.shape[k]) for k in range(rank))]
    return [np.take_along_axis(view, indices, axis=axis)]


def _dequantize_linear(d: dict, values: list) -> list | None:
    """DequantizeLinear with a float32 scale per tensor or per ``axis`` (default 1) and no ``block_size``:
    ``(x - x_zero_point) * x_scale``, the difference exact in int64, then float32 (ONNX spec, opsets 10-25;
    onnxruntime's order). onnx's reference evaluator implements only opsets 19 and later, so quantized
    weights of an opset-10/13 model (QDQ exports) would otherwise reach the kernels as int8 and a
    DequantizeLinear kernel. None for the other cases (the reference evaluator folds them)."""
    x, scale = np.asarray(values[0]), np.asarray(values[1])
    zero = np.asarray(values[2]) if len(values) > 2 and values[2] is not None else np.zeros((), x.dtype)
    if scale.dtype != np.float32 or d["attrs"].get("block_size", 0) or scale.ndim > 1 \
            or zero.shape != scale.shape or x.dtype.kind not in "iu":
        return None
    if scale.ndim == 1:
        axis = int(d["attrs"].get("axis", 1))
        axis = axis + x.ndim if axis < 0 else axis
        if not 0 <= axis < x.ndim or x.shape[axis] != scale.size:
            raise ValueError(f"DequantizeLinear: {scale.size} scales for axis {axis} of shape {x.shape}")
        shape = [1] * x.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    diff = x.astype(np.int64) - zero.astype(np.int64)
    return [(diff.astype(np.float32) * scale).astype(np.float32)]


#: Ops folded by polyc's own numpy code, where onnx's reference evaluator is wrong or limited (a folder
#: returning None leaves the node to the reference evaluator).
FOLDERS = {"GatherElements": _gather_elements, "DequantizeLinear": _dequantize_linear}


def evaluate_node(d: dict, values: list, opset: int) -> list:
    """Run one node on numpy inputs: polyc's own code for the ops in :data:`FOLDERS`, else
    :class:`onnx.reference.ReferenceEvaluator`. Any exception means the node cannot be evaluated."""
    if d["op"] in FOLDERS and values and values[0] is not None:
        result = FOLDERS[d["op"]](d, values)
        if result is not None:
            return result
    if d["op"] == "Constant":
        a = d["attrs"]
        for key in ("value", "value_float", "value_int"):
            if key in a:
                return [np.asarray(a[key], dtype=np.float32 if key == "value_float" else
                                   np.int64 if key == "value_int" else None)]
        if "value_floats" in a:
            return [np.asarray(a["value_floats"], dtype=np.float32)]
        if "value_ints" in a:
            return [np.asarray(a["value_ints"], dtype=np.int64)]
    if d["op"] == "ConstantOfShape" and values[0] is not None:
        fill = d["attrs"].get("value", np.zeros(1, np.float32))
        return [np.full(tuple(int(v) for v in values[0]), fill.reshape(-1)[0], dtype=fill.dtype)]
    names = [f"i{k}" if v is not None else "" for k, v in enumerate(values)]
    outs = [f"o{k}" for k in range(len(d["outputs"]))]
    node = helper.make_node(d["op"], names, outs, **{k: export_attr(v) for k, v in d["attrs"].items()})
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
              for n, v in zip(names, values) if n]
    outputs = [helper.make_tensor_value_info(n, 0, None) for n in outs]
    model = helper.make_model(helper.make_graph([node], "fold", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the mean of an empty set is nan, quietly
        warnings.simplefilter("ignore")
        result = ReferenceEvaluator(model).run(None, {n: v for n, v in zip(names, values) if n})
    if any(r is None or isinstance(r, (list, tuple, dict)) for r in result):
        raise ValueError(f"{d['op']} yields a sequence, a map or an absent optional, not a tensor")
    return [np.asarray(r) for r in result]


def _check_fold_size(g: nx.DiGraph, nid: str, d: dict, values: list) -> None:
    """Raise UnsupportedError (the bytes needed, the node) before folding a node whose output could not be
    allocated: a ConstantOfShape's shape is its input; other outputs have the shapes onnx inferred."""
    shapes = []
    if d["op"] == "ConstantOfShape" and values and values[0] is not None:
        fill = d["attrs"].get("value", np.zeros(1, np.float32))
        shapes.append((d["outputs"][0], [int(v) for v in np.asarray(values[0]).reshape(-1)],
                       np.asarray(fill).dtype))
    else:
        for t in d["outputs"]:
            info = g.graph["tensors"].get(t) if t else None
            if info is not None and info.shape is not None and info.dtype is not None:
                shapes.append((t, list(info.shape), np.dtype(info.dtype)))
    for t, shape, dtype in shapes:
        if any(v < 0 for v in shape):
            continue  # an invalid shape: the node stays, check_shapes names it
        error = too_large(f"tensor {t!r} ({dtype.name}{shape}) computed by node {nid} ({d['op']}) at compile "
                          f"time", int(np.prod(shape, dtype=object)) * dtype.itemsize)
        if error is not None:
            raise error


def _fits_outputs(g: nx.DiGraph, d: dict, results) -> bool:
    """Whether folded ``results`` can replace the node: one numpy array per named output, each with the
    shape onnx inferred for it (when it inferred one); otherwise the node stays to be compiled."""
    try:
        results = list(results)
    except TypeError:
        return False
    names = list(d["outputs"])
    if len(results) < len([o for o in names if o]):
        return False
    for name, value in zip(names, results):
        if not name:
            continue
        if not isinstance(value, np.ndarray) or value.dtype.kind in "OUSV":
            return False
        info = g.graph["tensors"].get(name)
        if info is not None and info.shape is not None and tuple(info.shape) != tuple(value.shape):
            return False
    return True


def _empty(info) -> bool:
    """Whether a tensor's static type says it holds no element (a 0 extent)."""
    return info is not None and info.shape is not None and info.dtype is not None and 0 in info.shape \
        and min(info.shape) >= 0


def _empty_value(info) -> np.ndarray:
    return np.zeros(info.shape, np.dtype(info.dtype))


def fold_constants(g: nx.DiGraph) -> nx.DiGraph:
    """Evaluate every node whose inputs are all compile-time constants; Shape/Size of static tensors fold too.

    The folded node disappears and its outputs join ``g.graph["constants"]``. A node that cannot be evaluated
    (any exception from :func:`evaluate_node`, or results that are not arrays of the inferred shapes) stays
    in the graph to be compiled, and later checks name what is wrong with it; one whose output would not fit
    in memory raises :class:`~polyc.errors.UnsupportedError` giving the bytes needed.

    Zero-size tensors: a tensor with a 0 extent has no value to compute, so it is a constant (an empty
    array): an empty graph input is one too (its feed is still checked), and a node whose outputs are all
    empty is removed (unless it is a window op over a non-empty input, which :func:`check_shapes` rejects).
    Nodes reading empty tensors then fold like any other: a reduction over an empty set gives its identity
    (ONNX spec, ReduceX opset 18: 0 for ReduceSum, 1 for ReduceProd, -inf for ReduceMax and ReduceLogSum ...).
    """
    g = copy_graph(g)
    consts = g.graph["constants"]
    tensors = g.graph["tensors"]
    for name in g.graph["inputs"]:
        if _empty(tensors.get(name)):
            consts[name] = _empty_value(tensors[name])
    for nid in topo_order(g):
        d = g.nodes[nid]
        if d.get("domain", "") not in ("", "ai.onnx"):
            continue
        outs = [t for t in d["outputs"] if t]
        if outs and all(_empty(tensors.get(t)) for t in outs) and not (
                d["op"] in WINDOW_OPS and not any(_empty(tensors.get(t)) for t in d["inputs"] if t)):
            remove_op(g, nid)
            for name in outs:
                set_constant(g, name, _empty_value(tensors[name]))
            continue
        if d["op"] in NONDETERMINISTIC:
            continue
        if d["op"] in ("Shape", "Size"):
            value = _static_shape_value(g, d)
            if value is None:
                continue
            results = [value]
        else:
            if not all(t == "" or t in consts for t in d["inputs"]):
                continue
            values = [consts[t] if t else None for t in d["inputs"]]
            _check_fold_size(g, nid, d, values)
            try:
                results = evaluate_node(d, values, g.graph["opset"])
            except Exception:  # noqa: BLE001 - whatever the evaluator raises, the node stays to be compiled
                continue
            if not _fits_outputs(g, d, results):
                continue
        remove_op(g, nid)
        for name, value in zip(d["outputs"], results):
            if name:
                set_constant(g, name, value)
    connect(g)
    return g


def _shapes_pending(g: nx.DiGraph) -> bool:
    tensors = g.graph["tensors"]
    return any(t and (t not in tensors or tensors[t].shape is None)
               for _, d in g.nodes(data=True) for t in d["outputs"])


def refresh_shapes(g: nx.DiGraph) -> nx.DiGraph:
    """Shape inference again (with data propagation) on the graph as it is: folding may have made constant
    what a shape depended on (a Pad's pads computed from a fed crop size). Tensors that get a static shape
    take it; nothing else changes, and a failing inference leaves the graph as it was."""
    try:
        model = infer_shapes(to_model(g, weights=False))
    except Exception:  # noqa: BLE001 - infer_static_shapes reports it at the end
        return g
    g = copy_graph(g)
    tensors = g.graph["tensors"]
    for vi in list(model.graph.value_info) + list(model.graph.output):
        t = vi.type.tensor_type
        old = tensors.get(vi.name)
        if (old is None or old.shape is None) and t.HasField("shape") and t.elem_type \
                and all(dd.HasField("dim_value") for dd in t.shape.dim):
            tensors[vi.name] = TensorInfo(tuple(int(dd.dim_value) for dd in t.shape.dim),
                                          np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))
    return g


def fold_with_shapes(g: nx.DiGraph, rounds: int = 4) -> nx.DiGraph:
    """:func:`fold_constants` after :func:`refresh_shapes`, again while some tensor has no static shape and
    a round folds something (at most ``rounds`` times): ``Shape(Pad(x, pads))`` folds once pads are known."""
    for _ in range(rounds):
        if not _shapes_pending(g):
            break
        folded = fold_constants(refresh_shapes(g))
        if folded.number_of_nodes() == g.number_of_nodes():
            break
        g = folded
    return g
