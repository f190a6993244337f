"""Compile-time validation of a simplified graph: shapes that fit the ops, indices in range, sizes that fit.

onnx's shape inference derives each output shape from the attributes and constant inputs but does not check
everything a kernel relies on: a Reshape to ``[4096, 4096]`` of a ``[16, 16]`` tensor gets that shape, and a
kernel lowered from it would read past its input. polyc rejects such a model at compile time, as onnxruntime
does, naming the node: :func:`check_shapes` recomputes, for each shape-producing or data-movement op, what
its output shape must be from its input shapes and constant operands (element counts, broadcasting, axes,
permutations, split sizes, slice bounds, gather indices) and compares. :func:`check_sizes` rejects a tensor
that could not be allocated on this machine, giving the bytes it needs, before anything is allocated.
"""
from __future__ import annotations

import os

import networkx as nx
import numpy as np

from ..errors import UnsupportedError
from .load import ModelError
from .layout import LAYOUT_ATTR, NCHW_IN, NHWC, TO_NCHW

#: Ops that broadcast their inputs numpy-style (multidirectional broadcasting) to the output.
BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
             "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Mod", "BitShift", "PRelu"}

#: Ops with an ``axis`` attribute that must name a dimension of their first input.
AXIS_OPS = {"Softmax", "LogSoftmax", "Hardmax", "LayerNormalization", "Concat", "Split", "Gather", "Flatten",
            "ArgMax", "ArgMin", "CumSum", "GatherElements", "ScatterElements", "QuantizeLinear",
            "DequantizeLinear"}

#: Ops sliding a window over their input: an empty output from a non-empty input means the window does not
#: fit (a kernel larger than the padded input), which is invalid; other ops may legitimately give empty tensors.
WINDOW_OPS = {"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "MaxPool", "AveragePool", "LpPool",
              "MaxUnpool", "DeformConv", "Col2Im"}

#: Ops whose output is the input's memory seen with another shape (see :mod:`polyc.onnx.memory`).
SAME_COUNT = {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}


def memory_limit() -> int:
    """The bytes one tensor, or the arena, may take: this machine's physical memory."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):  # not a POSIX system: a generous fixed bound
        return 1 << 40


def show_bytes(n: int) -> str:
    """``n`` bytes in binary units: ``'4.00 TiB (4398046511104 bytes)'``."""
    value, unit = float(n), "bytes"
    for u in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if value < 1024:
            break
        value, unit = value / 1024, u
    return f"{n} bytes" if unit == "bytes" else f"{value:.2f} {unit} ({n} bytes)"


def too_large(what: str, nbytes: int, limit: int | None = None) -> UnsupportedError | None:
    """An error saying ``what`` needs ``nbytes``, more than ``limit`` (default: :func:`memory_limit`)."""
    limit = memory_limit() if limit is None else limit
    if nbytes <= limit:
        return None
    return UnsupportedError(f"{what} needs {show_bytes(nbytes)}, more than this machine's memory "
                            f"({show_bytes(limit)})", hint="use smaller input shapes or a smaller model")


def _count(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def check_sizes(g: nx.DiGraph) -> None:
    """Raise :class:`~polyc.errors.UnsupportedError` when a graph input, constant or computed tensor needs more
    bytes than this machine has (the message names the tensor, its node and op, and the bytes needed)."""
    tensors = g.graph["tensors"]
    writer = {t: nid for nid, d in g.nodes(data=True) for t in d["outputs"] if t}
    for name, info in tensors.items():
        if info.shape is None or info.dtype is None:
            continue
        nbytes = _count(info.shape) * np.dtype(info.dtype).itemsize
        if name in writer:
            where = f"tensor {name!r} ({info}) written by node {writer[name]} ({g.nodes[writer[name]]['op']})"
        elif name in g.graph["inputs"]:
            where = f"input {name!r} ({info})"
        else:
            where = f"tensor {name!r} ({info})"
        error = too_large(where, nbytes)
        if error is not None:
            raise error


def _broadcastable(shape, out) -> bool:
    if len(shape) > len(out):
        return False
    return all(d == 1 or d == o for d, o in zip(reversed(shape), reversed(out)))


def _axis(axis: int, rank: int):
    """``axis`` made non-negative, or None when it is outside ``[-rank, rank)``."""
    axis = int(axis)
    return axis + rank if -rank <= axis < 0 else axis if 0 <= axis < rank else None


def _const(g, d, k):
    names = d["inputs"]
    if k < len(names) and names[k] and names[k] in g.graph["constants"]:
        return np.asarray(g.graph["constants"][names[k]])
    return None


def _attr(d, name, default=None):
    v = d["attrs"].get(name, default)
    return v.decode() if isinstance(v, bytes) else v


def _slice_shape(g, d, x):
    """The output shape of a Slice of a tensor of shape ``x``, or a problem string."""
    if g.graph["opset"] < 10:
        starts, ends, axes, steps = _attr(d, "starts"), _attr(d, "ends"), _attr(d, "axes"), None
    else:
        vals = [_const(g, d, k) for k in range(1, 5)]
        if vals[0] is None or vals[1] is None or (len(d["inputs"]) > 3 and d["inputs"][3] and vals[2] is None) \
                or (len(d["inputs"]) > 4 and d["inputs"][4] and vals[3] is None):
            return None  # not constant: check_supported reports it
        starts, ends = vals[0].reshape(-1).tolist(), vals[1].reshape(-1).tolist()
        axes = None if vals[2] is None else vals[2].reshape(-1).tolist()
        steps = None if vals[3] is None else vals[3].reshape(-1).tolist()
    if starts is None or ends is None:
        return "starts and ends are required"
    axes = list(range(len(starts))) if axes is None else list(axes)
    steps = [1] * len(starts) if steps is None else list(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        return f"starts, ends, axes and steps have different lengths ({len(starts)}, {len(ends)}, " \
               f"{len(axes)}, {len(steps)})"
    out = list(x)
    seen = set()
    for s, e, a, st in zip(starts, ends, axes, steps):
        k = _axis(a, len(x))
        if k is None:
            return f"axis {a} is out of range for rank {len(x)}"
        if k in seen:
            return f"axis {a} is repeated"
        seen.add(k)
        if st == 0:
            return "a step is 0"
        out[k] = len(range(x[k])[slice(int(s), int(e), int(st))])
    return tuple(out)


def _expected(g, nid, d):
    """``(expected output shapes or None, problem or None)`` for one node; None: nothing to check."""
    t = g.graph["tensors"]
    op = d["op"]
    ins = [t[n].shape if n and n in t else None for n in d["inputs"]]
    outs = [t[n].shape if n and n in t else None for n in d["outputs"]]
    x = ins[0] if ins else None
    if op in SAME_COUNT and x is not None and outs[0] is not None and _count(x) != _count(outs[0]):
        return None, (f"cannot reshape {t[d['inputs'][0]]} ({_count(x)} elements) into shape {list(outs[0])} "
                      f"({_count(outs[0])} elements)")
    if op in BROADCAST or op == "Expand":
        operands = ins[:1] if op == "Expand" else ins
        for name, s in zip(d["inputs"], operands):
            if s is not None and outs[0] is not None and not _broadcastable(s, outs[0]):
                return None, f"input {name!r} of shape {list(s)} does not broadcast to the output shape {list(outs[0])}"
        return None, None
    if x is None:
        return None, None
    rank = len(x)
    if "axis" in d["attrs"] and op in AXIS_OPS:
        limit = rank + 1 if op == "Flatten" else rank  # Flatten's axis may be the rank itself
        if not -limit <= int(d["attrs"]["axis"]) < limit:
            return None, f"axis {d['attrs']['axis']} is out of range for input shape {list(x)}"
    axes = d["attrs"].get("axes") if op.startswith("Reduce") else None
    if axes is None and op.startswith("Reduce") and g.graph["opset"] >= 13:
        axes = _const(g, d, 1)
    if axes is not None:
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        wrapped = [_axis(a, rank) for a in axes]
        if None in wrapped or len(set(wrapped)) != len(wrapped):
            return None, f"axes {axes} are out of range or repeated for input shape {list(x)}"
    if op == "Transpose":
        perm = list(_attr(d, "perm", list(range(rank - 1, -1, -1))))
        if sorted(perm) != list(range(rank)):
            return None, f"perm {perm} is not a permutation of the {rank} axes of input shape {list(x)}"
        return [tuple(x[p] for p in perm)], None
    if op == "Gather":
        axis = _axis(_attr(d, "axis", 0), rank)
        if axis is None:
            return None, f"axis {_attr(d, 'axis', 0)} is out of range for input shape {list(x)}"
        ind = _const(g, d, 1)
        if ind is not None:
            bad = ind[(ind < -x[axis]) | (ind >= x[axis])]
            if bad.size:
                return None, (f"index {int(bad.reshape(-1)[0])} is out of range for axis {axis} of extent "
                              f"{x[axis]} (input shape {list(x)})")
        q = ins[1] if len(ins) > 1 else None
        return (None if q is None else [tuple(x[:axis]) + tuple(q) + tuple(x[axis + 1:])]), None
    if op == "Concat":
        axis = _axis(_attr(d, "axis", 0), rank)
        if axis is None:
            return None, f"axis {_attr(d, 'axis', 0)} is out of range for rank {rank}"
        parts = [s for s in ins if s is not None]
        for name, s in zip(d["inputs"], ins):
            if s is not None and (len(s) != rank or any(a != b for k, (a, b) in enumerate(zip(s, x)) if k != axis)):
                return None, (f"input {name!r} of shape {list(s)} does not match {list(x)} outside axis {axis}")
        return [tuple(sum(s[axis] for s in parts) if k == axis else x[k] for k in range(rank))], None
    if op == "Split":
        axis = _axis(_attr(d, "axis", 0), rank)
        if axis is None:
            return None, f"axis {_attr(d, 'axis', 0)} is out of range for rank {rank}"
        sizes = [s[axis] for s in outs if s is not None]
        if any(s is not None and (len(s) != rank or any(a != b for k, (a, b) in enumerate(zip(s, x)) if k != axis))
               for s in outs) or (all(s is not None for s in outs) and sum(sizes) != x[axis]):
            return None, (f"output shapes {[list(s) if s else None for s in outs]} do not split input shape "
                          f"{list(x)} along axis {axis}")
        return None, None
    if op == "Slice":
        shape = _slice_shape(g, d, x)
        if isinstance(shape, str):
            return None, shape
        return (None if shape is None else [shape]), None
    if op == "Tile":
        reps = _const(g, d, 1)
        if reps is None:
            return None, None
        reps = reps.reshape(-1).tolist()
        if len(reps) != rank or any(r < 0 for r in reps):
            return None, f"repeats {reps} do not fit input shape {list(x)}"
        return [tuple(a * r for a, r in zip(x, reps))], None
    if op == "Pad":
        pads = _attr(d, "pads") if g.graph["opset"] < 11 else _const(g, d, 1)
        if pads is None:
            return None, None
        pads = np.asarray(pads).reshape(-1).tolist()
        if g.graph["opset"] >= 18 and _const(g, d, 3) is not None:
            return None, None  # the axes form: onnx's inference checks it, the converter expands it
        if len(pads) != 2 * rank:
            return None, f"pads {pads} should hold {2 * rank} values for input shape {list(x)}"
        return [tuple(x[k] + pads[k] + pads[rank + k] for k in range(rank))], None
    if op in ("Conv", "ConvTranspose") and len(ins) > 1 and ins[1] is not None:
        w, group = ins[1], int(_attr(d, "group", 1))
        if len(w) != rank:
            return None, f"weights of shape {list(w)} do not match input shape {list(x)} (rank)"
        channels = w[1] * group if op == "Conv" else w[0]
        if _attr(d, LAYOUT_ATTR) in (NHWC, NCHW_IN):  # a Conv of a channels-last region: NHWC output
            x = tuple(x[p] for p in TO_NCHW) if _attr(d, LAYOUT_ATTR) == NHWC else x
            outs = [None if o is None else tuple(o[p] for p in TO_NCHW) for o in outs]
        if x[1] != channels:
            return None, (f"input shape {list(x)} has {x[1]} channels, the weights {list(w)} with group {group} "
                          f"expect {channels}")
        bias = ins[2] if len(ins) > 2 else None
        if bias is not None and outs[0] is not None and tuple(bias) != (outs[0][1],):
            return None, f"bias {d['inputs'][2]!r} of shape {list(bias)} should have shape [{outs[0][1]}]"
    if op == "Gemm" and len(ins) > 2 and ins[2] is not None and outs[0] is not None \
            and not _broadcastable(ins[2], outs[0]):
        return None, f"C {d['inputs'][2]!r} of shape {list(ins[2])} does not broadcast to the output {list(outs[0])}"
    if op == "BatchNormalization" and rank >= 2:
        for name, s in zip(d["inputs"][1:5], ins[1:5]):
            if s is not None and tuple(s) != (x[1],):
                return None, f"{name!r} of shape {list(s)} should have shape [{x[1]}] (the input's channels)"
    if op == "LayerNormalization":
        axis = _axis(_attr(d, "axis", -1), rank)
        for name, s in zip(d["inputs"][1:3], ins[1:3]):
            if axis is not None and s is not None and not _broadcastable(s, x[axis:]):
                return None, f"{name!r} of shape {list(s)} does not broadcast to the normalized shape {list(x[axis:])}"
    return None, None


def check_shapes(g: nx.DiGraph) -> None:
    """Raise :class:`~polyc.onnx.load.ModelError` listing every node whose output shapes do not follow from
    its inputs (a Reshape that changes the element count, a bad perm, out-of-range constant gather indices,
    split sizes that do not add up, non-broadcastable operands ...), and every tensor with a negative size, or
    an empty output of a window op (:data:`WINDOW_OPS`) over a non-empty input (a Conv kernel larger than its
    padded input, say), naming the node, its op and the shapes involved."""
    t = g.graph["tensors"]
    problems = []
    for nid, d in sorted(g.nodes(data=True), key=lambda x: x[1]["order"]):
        label = f"node {nid} ({d['op']})"
        empty_input = any(n and n in t and t[n].shape is not None and 0 in t[n].shape for n in d["inputs"])
        for name in d["outputs"]:
            info = t.get(name) if name else None
            if info is not None and info.shape is not None and (
                    any(s < 0 for s in info.shape) or (0 in info.shape and d["op"] in WINDOW_OPS and not empty_input)):
                shown = ", ".join(f"{n} {t[n]}" for n in d["inputs"] if n and n in t)
                attrs = {k: v for k, v in d["attrs"].items() if k in ("kernel_shape", "pads", "strides",
                                                                        "dilations", "auto_pad")}
                problems.append(f"{label} would write {name!r} with shape {list(info.shape)}: its inputs "
                                f"({shown}{', ' + str(attrs) if attrs else ''}) give an empty or negative size")
        if problems and problems[-1].startswith(label):
            continue
        expected, problem = _expected(g, nid, d)
        if problem is None and expected is not None:
            for name, want in zip(d["outputs"], expected):
                have = t[name].shape if name in t else None
                if want is not None and have is not None and tuple(have) != tuple(want):
                    problem = f"output {name!r} has shape {list(have)}, but its inputs give {list(want)}"
                    break
        if problem is not None:
            problems.append(f"{label}: {problem}")
    if problems:
        raise ModelError(f"the model is invalid: {len(problems)} node(s) have shapes that do not fit:\n  "
                         + "\n  ".join(problems), hint="onnxruntime rejects such a model too; fix the exporter")
