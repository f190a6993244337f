"""Converters for data movement: Concat, Split, Slice, Transpose, Pad, Gather, Resize/Upsample.

Each returns lazy values (an index mapping, guarded by ``?:`` where a read can leave its tensor); the group
lowering writes them out. Resize and Upsample compute their source-index and weight tables at compile time
(with onnx's reference Resize on ``arange``, so every coordinate mode matches onnx) and read them as extra
kernel inputs.
"""
from __future__ import annotations

import numpy as np
from onnx import helper
from onnx.reference import ReferenceEvaluator

from .lower import Builder, lazy, lit, times


def _attr(node, name, default=None):
    v = node["attrs"].get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _shift(i: str, off: int) -> str:
    return i if off == 0 else (f"{i}+{off}" if off > 0 else f"{i}{off}")


def concat(b: Builder, node):
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    axis = _axis(_attr(node, "axis", 0 if b.opset < 4 else None), len(ys))
    parts, off = [], 0
    for k in range(len(node["inputs"])):
        v = b.input(node, k)
        if v is None or v.shape[axis] == 0:
            continue
        parts.append((off, v))
        off += v.shape[axis]

    def text(idx):
        def read(p):
            o, v = parts[p]
            j = list(idx)
            j[axis] = _shift(idx[axis], -o)
            return v.at(j)
        e = read(len(parts) - 1)
        for p in range(len(parts) - 2, -1, -1):
            e = f"({idx[axis]} < {parts[p + 1][0]} ? {read(p)} : {e})"
        return e
    return [lazy(ys, dtype, text)]


def split(b: Builder, node):
    x = b.input(node, 0)
    axis = _axis(_attr(node, "axis", 0), len(x.shape))
    outs, off = [], 0
    for k, name in enumerate(node["outputs"]):
        shape = b.out_shape(node, k) if name else None
        if shape is None:
            outs.append(None)
            continue

        def text(idx, o=off):
            j = list(idx)
            j[axis] = _shift(idx[axis], o)
            return x.at(j)
        outs.append(lazy(shape, x.dtype, text, cheap=True))
        off += shape[axis]
    return outs


def _slice_params(b: Builder, node):
    rank = len(b.tensors[node["inputs"][0]].shape)
    if b.opset < 10:
        starts, ends = _attr(node, "starts"), _attr(node, "ends")
        axes, steps = _attr(node, "axes", None), None
    else:
        starts = [int(v) for v in b.const_input(node, 1, "starts").reshape(-1)]
        ends = [int(v) for v in b.const_input(node, 2, "ends").reshape(-1)]
        a, s = b.const_input(node, 3, "axes"), b.const_input(node, 4, "steps")
        axes = None if a is None else [int(v) for v in a.reshape(-1)]
        steps = None if s is None else [int(v) for v in s.reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [_axis(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return starts, ends, axes, steps


def slice_(b: Builder, node):
    x = b.input(node, 0)
    ys = b.out_shape(node)
    starts, ends, axes, steps = _slice_params(b, node)
    first = [0] * len(x.shape)
    step = [1] * len(x.shape)
    for s, e, a, st in zip(starts, ends, axes, steps):
        r = range(x.shape[a])[slice(s, e, st)]
        first[a], step[a] = (r.start if len(r) else 0), st

    def text(idx):
        j = []
        for d, i in enumerate(idx):
            if step[d] == 1:
                j.append(_shift(i, first[d]))
            elif step[d] > 0:
                j.append(_shift(times(step[d], i), first[d]))
            else:
                j.append(f"{first[d]}-({times(-step[d], i)})")
        return x.at(j)
    return [lazy(ys, x.dtype, text, cheap=True)]


def transpose(b: Builder, node):
    x = b.input(node, 0)
    rank = len(x.shape)
    perm = list(_attr(node, "perm", list(range(rank - 1, -1, -1))))
    ys = b.out_shape(node)

    def text(idx):
        j = [None] * rank
        for k, p in enumerate(perm):
            j[p] = idx[k]
        return x.at(j)
    return [lazy(ys, x.dtype, text, cheap=True)]


def pad(b: Builder, node):
    x = b.input(node, 0)
    ys, rank = b.out_shape(node), len(x.shape)
    if b.opset < 11:
        pads = list(_attr(node, "pads"))
        value = (lambda t=lit(_attr(node, "value", 0.0), x.dtype): t)
    else:
        pads = [int(v) for v in b.const_input(node, 1, "pads").reshape(-1)]
        cv = b.input(node, 2)
        value = (lambda t=lit(0, x.dtype): t) if cv is None else (lambda v=cv: v.at([]))
        axes = b.const_input(node, 3, "axes") if b.opset >= 18 else None
        if axes is not None:
            axes = [_axis(int(a), rank) for a in axes.reshape(-1)]
            full = [0] * 2 * rank
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = full
    begin = pads[:rank]

    def text(idx):
        j, conds = [], []
        for d, i in enumerate(idx):
            t = _shift(i, -begin[d])
            j.append(t)
            if begin[d] > 0:
                conds.append(f"{t} >= 0")
            if ys[d] - begin[d] > x.shape[d]:
                conds.append(f"{t} < {x.shape[d]}")
        read = x.at(j)
        return f"(({' && '.join(conds)}) ? {read} : {value()})" if conds else read
    return [lazy(ys, x.dtype, text)]


def gather(b: Builder, node):
    x = b.input(node, 0)
    rank = len(x.shape)
    axis = _axis(_attr(node, "axis", 0), rank)
    ys = b.out_shape(node)
    name = node["inputs"][1]
    extent = x.shape[axis]
    if name in b.consts:
        ind = np.asarray(b.consts[name]).astype(np.int64)
        ind = np.where(ind < 0, ind + extent, ind)
        if ind.size == 1:
            k = str(int(ind.reshape(-1)[0]))
            q = ind.ndim
            return [lazy(ys, x.dtype, lambda idx: x.at(idx[:axis] + [k] + idx[axis + q:]), cheap=True)]
        iv = b.constant_table(ind, "indices")

        def text(idx):
            q = len(iv.shape)
            return x.at(idx[:axis] + [iv.at(idx[axis:axis + q])] + idx[axis + q:])
        return [lazy(ys, x.dtype, text, cheap=True)]
    iv = b.input(node, 1)
    q = len(iv.shape)

    def text_dyn(idx):
        i = iv.at(idx[axis:axis + q])
        return x.at(idx[:axis] + [f"({i} < 0 ? {i} + {extent} : {i})"] + idx[axis + q:])
    return [lazy(ys, x.dtype, text_dyn)]


# ---- Resize / Upsample ----------------------------------------------------------------------------------------

def _resize_1d(in_n: int, out_n: int, scale: float, attrs: dict, opset: int, roi=None) -> np.ndarray:
    """onnx's reference Resize on ``arange(in_n)`` (float64): source coordinate of each output position."""
    inputs = [helper.make_tensor_value_info("x", 11, [in_n]), helper.make_tensor_value_info("roi", 11, [None]),
              helper.make_tensor_value_info("scales", 1, [1])]
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], **attrs)
    graph = helper.make_graph([node], "r", inputs, [helper.make_tensor_value_info("y", 11, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", max(opset, 13))])
    roi = np.array([], np.float64) if roi is None else np.asarray(roi, np.float64)
    y = ReferenceEvaluator(model).run(None, {"x": np.arange(in_n, dtype=np.float64), "roi": roi,
                                             "scales": np.array([scale], np.float32)})[0]
    if y.shape[0] != out_n:
        raise ValueError(f"reference Resize gave {y.shape[0]} points, expected {out_n}")
    return y


def _resize_scales(b: Builder, node, x_shape, ys):
    """Per-dim scale used by the coordinate transform."""
    rank = len(x_shape)
    if node["op"] == "Upsample":
        scales = _attr(node, "scales", None) if b.opset < 9 else b.const_input(node, 1, "scales")
        return [float(s) for s in np.asarray(scales).reshape(-1)]
    if b.opset < 11:
        return [float(s) for s in b.const_input(node, 1, "scales").reshape(-1)]
    scales = b.const_input(node, 2, "scales")
    sizes = b.const_input(node, 3, "sizes")
    axes = _attr(node, "axes", None)
    axes = list(range(rank)) if axes is None else [_axis(a, rank) for a in axes]
    out = [1.0] * rank
    if scales is not None and scales.size:
        for a, s in zip(axes, scales.reshape(-1)):
            out[a] = float(s)
        return out
    sizes = [int(s) for s in sizes.reshape(-1)]
    policy = _attr(node, "keep_aspect_ratio_policy", "stretch")
    ratios = [sizes[k] / x_shape[a] for k, a in enumerate(axes)]
    for k, a in enumerate(axes):
        out[a] = ratios[k] if policy == "stretch" else (min(ratios) if policy == "not_larger" else max(ratios))
    return out


def resize(b: Builder, node):
    x = b.input(node, 0)
    ys = b.out_shape(node)
    mode = _attr(node, "mode", "nearest")
    attrs = {"mode": mode}
    if node["op"] == "Upsample" or b.opset < 11:
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        for key in ("coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside"):
            if key in node["attrs"]:
                attrs[key] = _attr(node, key)
    scales = _resize_scales(b, node, x.shape, ys)
    coords = []
    for d, (n_in, n_out) in enumerate(zip(x.shape, ys)):
        y = _resize_1d(n_in, n_out, scales[d], attrs, b.opset)
        coords.append(None if np.array_equal(y, np.arange(n_out)) else y)
    if mode == "nearest":
        tables = [None if c is None else b.constant_table(np.rint(c).astype(np.int32), f"near{d}")
                  for d, c in enumerate(coords)]

        def text(idx):
            return x.at([i if t is None else t.at([i]) for i, t in zip(idx, tables)])
        return [lazy(ys, x.dtype, text)]
    # linear: per resized dim a low index, a high index and the weight of the high one
    dims = []
    for d, c in enumerate(coords):
        if c is None:
            dims.append(None)
            continue
        lo = np.clip(np.floor(c), 0, x.shape[d] - 1).astype(np.int32)
        w = np.clip(c - lo, 0.0, 1.0).astype(x.dtype)
        hi = np.minimum(lo + 1, x.shape[d] - 1).astype(np.int32)
        dims.append((b.constant_table(lo, f"lo{d}"), b.constant_table(hi, f"hi{d}"), b.constant_table(w, f"w{d}")))
    resized = [d for d, t in enumerate(dims) if t is not None]

    def text(idx):
        terms = []
        for corner in range(1 << len(resized)):
            j, weights = list(idx), []
            for bit, d in enumerate(resized):
                lo, hi, w = dims[d]
                if corner >> bit & 1:
                    j[d] = hi.at([idx[d]])
                    weights.append(w.at([idx[d]]))
                else:
                    j[d] = lo.at([idx[d]])
                    weights.append(f"({lit(1.0, x.dtype)} - {w.at([idx[d]])})")
            terms.append(" * ".join(weights + [x.at(j)]))
        return "(" + " + ".join(terms) + ")"
    return [lazy(ys, x.dtype, text)]
