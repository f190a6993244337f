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

from ..builder import Builder, lazy, lit, times
from .common import attr, norm_axis


def _shift(i: str, off: int) -> str:
    return i if off == 0 else (f"{i}+{off}" if off > 0 else f"{i}{off}")


def concat(b: Builder, node):
    """Concat: the joined axis picks its input with a chain of ``?:``."""
    ys, dtype = b.out_shape(node), b.out_dtype(node)
    axis = norm_axis(attr(node, "axis", 0 if b.opset < 4 else None), len(ys))
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
    """Split: sizes from the attribute (< 13), the input (>= 13) or ``num_outputs`` (>= 18)."""
    x = b.input(node, 0)
    axis = norm_axis(attr(node, "axis", 0), len(x.shape))
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
        starts, ends = attr(node, "starts"), attr(node, "ends")
        axes, steps = attr(node, "axes", None), None
    else:
        starts = [int(v) for v in b.const_input(node, 1, "starts").reshape(-1)]
        ends = [int(v) for v in b.const_input(node, 2, "ends").reshape(-1)]
        a, s = b.const_input(node, 3, "axes"), b.const_input(node, 4, "steps")
        axes = None if a is None else [int(v) for v in a.reshape(-1)]
        steps = None if s is None else [int(v) for v in s.reshape(-1)]
    axes = list(range(len(starts))) if axes is None else [norm_axis(a, rank) for a in axes]
    steps = [1] * len(starts) if steps is None else steps
    return starts, ends, axes, steps


def slice_(b: Builder, node):
    """Slice: starts/ends/axes attributes before opset 10, inputs (with steps) after."""
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
    """Transpose by ``perm`` (default: reversed dims)."""
    x = b.input(node, 0)
    rank = len(x.shape)
    perm = list(attr(node, "perm", list(range(rank - 1, -1, -1))))
    ys = b.out_shape(node)

    def text(idx):
        j = [None] * rank
        for k, p in enumerate(perm):
            j[p] = idx[k]
        return x.at(j)
    return [lazy(ys, x.dtype, text, cheap=True)]


def _mode_index(mode: str, t: str, n: int) -> tuple[str, str]:
    """``(before, after)``: the source index of output index ``t`` (already shifted by the leading pad) along
    a dim of extent ``n`` in Pad's ``mode`` where ``t < 0`` and where ``t >= n``: reflect mirrors without
    repeating the edge element (numpy's ``reflect``), edge repeats it, wrap continues from the other end."""
    last = n - 1
    if mode == "edge" or (mode == "reflect" and n == 1):
        return "0", str(last)
    if mode == "reflect":
        return f"-({t})", f"{2 * last}-({t})"
    return f"{t}+{n}", f"{t}-{n}"  # wrap


def pad(b: Builder, node):
    """Pad: pads/value attributes before opset 11, inputs (and axes >= 18) after. Mode ``constant`` guards
    the read; ``reflect``/``edge``/``wrap`` read the mirrored, clamped or wrapped element, one padded dim at
    a time (a ``?:`` per dim, at most two dims inlined into one expression, then stored). A reflect or
    wrap pad must not exceed the dim's extent minus 1 (reflect) or its extent (wrap), as onnxruntime
    requires too; negative pads crop."""
    x = b.input(node, 0)
    ys, rank = b.out_shape(node), len(x.shape)
    mode = attr(node, "mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if b.opset < 11:
        pads = list(attr(node, "pads"))
        value = (lambda t=lit(attr(node, "value", 0.0), x.dtype): t)
    else:
        pads = [int(v) for v in b.const_input(node, 1, "pads").reshape(-1)]
        cv = b.input(node, 2)
        value = (lambda t=lit(0, x.dtype): t) if cv is None else (lambda v=cv: v.at(["0"] * len(v.shape)))
        axes = b.const_input(node, 3, "axes") if b.opset >= 18 else None
        if axes is not None:
            axes = [norm_axis(int(a), rank) for a in axes.reshape(-1)]
            full = [0] * 2 * rank
            for k, a in enumerate(axes):
                full[a], full[rank + a] = pads[k], pads[len(axes) + k]
            pads = full
    begin = pads[:rank]
    if mode != "constant":
        return [_pad_mode(b, x, ys, begin, pads[rank:], mode)]
    return [_pad_constant(x, ys, begin, value)]


def _pad_constant(x, ys, begin, value):
    """``x`` shifted by ``begin`` per dim into shape ``ys`` (negative: cropped), ``value()`` outside it."""
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
    return lazy(ys, x.dtype, text)


def center_crop_pad(b: Builder, node):
    """CenterCropPad (18): each dim of ``axes`` (default all) cropped or zero-padded to the constant
    ``shape``, centred; an odd difference puts the extra element at the end (onnx's reference)."""
    x = b.input(node, 0)
    rank = len(x.shape)
    target = [int(v) for v in b.const_input(node, 1, "shape").reshape(-1)]
    axes = [norm_axis(int(a), rank) for a in attr(node, "axes", list(range(rank)))]
    begin = [0] * rank
    for a, size in zip(axes, target):
        d = size - x.shape[a]
        begin[a] = d // 2 if d >= 0 else -((-d) // 2)
    ys = tuple(target[axes.index(d)] if d in axes else x.shape[d] for d in range(rank))
    return [_pad_constant(x, ys, begin, lambda t=lit(0, x.dtype): t)]


def _pad_mode(b: Builder, x, ys, begin, end, mode):
    """Pad in mode reflect/edge/wrap: each padded dim in turn maps its index with :func:`_mode_index`."""
    if 0 in x.shape and any(p > 0 for p in list(begin) + list(end)):
        raise b.error(f"Pad mode {mode} of an empty tensor has nothing to {mode}")
    limit = {"reflect": 1, "wrap": 0}.get(mode)
    for d, n in enumerate(x.shape):
        if limit is not None and n > 1 and max(begin[d], end[d]) > n - limit:
            raise b.error(f"Pad mode {mode} with pads {begin[d]}, {end[d]} on dim {d} of extent {n} "
                          f"(at most {n - limit})")
    v, inlined = x, 0
    for d in range(len(ys)):
        if begin[d] == 0 and end[d] == 0:
            continue
        if inlined == 2:
            v, inlined = b.materialize(v), 0
        shape = tuple(ys[e] if e <= d else v.shape[e] for e in range(len(ys)))

        def text(idx, d=d, src=v):
            t = _shift(idx[d], -begin[d])
            before, after = _mode_index(mode, t, x.shape[d])
            at = lambda i: src.at(idx[:d] + [i] + idx[d + 1:])  # noqa: E731
            out = at(t)
            if end[d] > 0:  # elements after the last
                out = f"({t} > {x.shape[d] - 1} ? {at(after)} : {out})"
            if begin[d] > 0:  # elements before the first
                out = f"({t} < 0 ? {at(before)} : {out})"
            return out
        v, inlined = lazy(shape, x.dtype, text), inlined + 1
    return v


def gather(b: Builder, node):
    """Gather along ``axis``; constant indices are normalised at compile time."""
    x = b.input(node, 0)
    rank = len(x.shape)
    axis = norm_axis(attr(node, "axis", 0), rank)
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

def _resize_coords(b: Builder, node, x_shape, ys, attrs: dict) -> list:
    """Per dim, the source coordinate of each output position (None where the dim is not resized).

    onnx's reference Resize (opset 13+ form) runs on a float64 tensor holding each position's own index along
    dim ``d``: nearest then returns the picked index and linear the interpolated coordinate, so every
    coordinate mode, rounding mode, ``axes`` and ``keep_aspect_ratio_policy`` matches onnx exactly.
    """
    rank = len(x_shape)
    if node["op"] == "Upsample" or b.opset < 11:
        scales = attr(node, "scales", None) if node["op"] == "Upsample" and b.opset < 9 else \
            b.const_input(node, 1, "scales")
        feeds = {"roi": np.array([], np.float64), "scales": np.asarray(scales, np.float32).reshape(-1)}
        names = ["x", "roi", "scales"]
        opset = 13
    else:
        names, feeds = ["x"], {}
        for k, key in ((1, "roi"), (2, "scales"), (3, "sizes")):
            value = b.const_input(node, k, key)
            names.append(key if value is not None else "")
            if value is not None:
                feeds[key] = value
        while names and names[-1] == "":
            names.pop()
        opset = max(b.opset, 13)
        for key in ("axes", "keep_aspect_ratio_policy", "extrapolation_value"):
            if key in node["attrs"]:
                attrs[key] = attr(node, key)
    # dims whose scale is exactly 1 are left alone by every mode: run the reference with extent 1 there
    axes = [norm_axis(a, rank) for a in attrs.get("axes", range(rank))]
    keep = [False] * rank
    if "scales" in feeds and np.size(feeds["scales"]):
        for a, sc in zip(axes, np.asarray(feeds["scales"]).reshape(-1)):
            keep[a] = sc == 1.0 and x_shape[a] == ys[a]
    elif "sizes" in feeds and attrs.get("keep_aspect_ratio_policy", "stretch") == "stretch":
        for a, sz in zip(axes, np.asarray(feeds["sizes"]).reshape(-1)):
            keep[a] = sz == x_shape[a] == ys[a]
    small_x = [1 if keep[d] else x_shape[d] for d in range(rank)]
    small_y = [1 if keep[d] else ys[d] for d in range(rank)]
    if "sizes" in feeds and np.size(feeds["sizes"]):
        feeds["sizes"] = np.array([1 if keep[a] else int(sz) for a, sz in
                                   zip(axes, np.asarray(feeds["sizes"]).reshape(-1))], np.int64)
    ref_node = helper.make_node("Resize", names, ["y"], **attrs)
    vis = [helper.make_tensor_value_info("x", 11, small_x)] + [
        helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(feeds[n]).dtype),
                                      list(np.shape(feeds[n]))) for n in names[1:] if n]
    graph = helper.make_graph([ref_node], "resize", vis, [helper.make_tensor_value_info("y", 11, None)])
    evaluator = ReferenceEvaluator(helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)]))
    coords = []
    for d in range(rank):
        if keep[d]:
            coords.append(None)
            continue
        shape = [1] * rank
        shape[d] = x_shape[d]
        index = np.broadcast_to(np.arange(x_shape[d], dtype=np.float64).reshape(shape), small_x)
        y = evaluator.run(None, {"x": np.ascontiguousarray(index), **feeds})[0]
        if list(y.shape) != small_y:
            raise ValueError(f"reference Resize gave shape {y.shape}, expected {tuple(small_y)}")
        line = y[tuple(slice(None) if k == d else 0 for k in range(rank))]
        coords.append(None if np.array_equal(line, np.arange(ys[d])) else line)
    return coords


def resize(b: Builder, node):
    """Resize (opset 10+) and Upsample: nearest and (n-)linear through compile-time tables."""
    x = b.input(node, 0)
    ys = b.out_shape(node)
    mode = attr(node, "mode", "nearest")
    attrs = {"mode": mode}
    if node["op"] == "Upsample" or b.opset < 11:
        attrs.update(coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    else:
        for key in ("coordinate_transformation_mode", "nearest_mode", "cubic_coeff_a", "exclude_outside"):
            if key in node["attrs"]:
                attrs[key] = attr(node, key)
    coords = _resize_coords(b, node, x.shape, ys, attrs)
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


#: op -> ((since_version, converter), ...), oldest first (see :data:`polyc.onnx.ops.CONVERTERS`).
CONVERTERS = {
    "Concat": ((1, concat),), "Split": ((1, split),), "Slice": ((1, slice_),),
    "Transpose": ((1, transpose),), "Pad": ((1, pad),), "Gather": ((1, gather),),
    "CenterCropPad": ((18, center_crop_pad),),
    "Resize": ((10, resize),), "Upsample": ((7, resize),),
}

#: Attributes of the movement ops and of the alias ops the passes remove (Reshape, Flatten, ...).
KNOWN_ATTRS = {
    "Concat": {"axis"}, "Split": {"axis", "split", "num_outputs"}, "Slice": {"starts", "ends", "axes"},
    "Transpose": {"perm"}, "Reshape": {"allowzero"}, "Flatten": {"axis"}, "Squeeze": {"axes"},
    "Unsqueeze": {"axes"}, "Gather": {"axis"}, "Pad": {"mode", "pads", "value"}, "CenterCropPad": {"axes"},
    "Resize": {"antialias", "axes", "coordinate_transformation_mode", "cubic_coeff_a", "exclude_outside",
               "extrapolation_value", "keep_aspect_ratio_policy", "mode", "nearest_mode"},
    "Upsample": {"mode", "scales"}, "Dropout": {"ratio", "seed"},
}

SUPPORTED_VALUES = {
    "Pad": {"mode": lambda v: (v.decode() if isinstance(v, bytes) else v) in ("constant", "reflect", "edge", "wrap")},
    "Resize": {"mode": lambda v: v in (b"nearest", b"linear", "nearest", "linear"),
               "antialias": lambda v: v == 0,
               "coordinate_transformation_mode": lambda v: v not in (b"tf_crop_and_resize", "tf_crop_and_resize")},
    "Upsample": {"mode": lambda v: v in (b"nearest", b"linear", "nearest", "linear")},
}

CONSTANT_INPUTS = {
    "Reshape": ((1, 5, "shape"),), "Squeeze": ((1, 13, "axes"),), "Unsqueeze": ((1, 13, "axes"),),
    "Split": ((1, 13, "split"),), "Slice": ((1, 10, "starts"), (2, 10, "ends"), (3, 10, "axes"), (4, 10, "steps")),
    "Pad": ((1, 11, "pads"), (3, 18, "axes")), "CenterCropPad": ((1, 18, "shape"),),
    "Resize": ((1, 10, "scales/roi"), (2, 11, "scales"), (3, 11, "sizes")),
    "Upsample": ((1, 9, "scales"),),
}
