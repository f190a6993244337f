"""Control flow and recurrent ops as straight-line graphs: the first step of the pass pipeline.

:func:`lower_control_flow` rewrites, until none is left:

- ``If`` whose ``cond`` is a compile-time constant: replaced by the nodes of the chosen branch;
- ``Loop`` with a constant trip count ``M`` and a constant (or absent) ``cond``: the body inlined once per
  iteration (``iter_num`` a constant), scan outputs stacked with Unsqueeze + Concat. A body that computes
  its condition (rather than passing it through) is unrolled while that condition folds to a compile-time
  true (at most ``M``, or :data:`MAX_UNROLL`, iterations);
- ``Scan`` (opset 8 with its batch axis and without ``sequence_lens``, opset 9+): the body inlined once per
  position of the static scan axis, the scan inputs read with Gather (honouring ``scan_input_axes`` /
  ``directions``), scan outputs stacked along ``scan_output_axes`` (reversed where asked);
- ``LSTM`` / ``GRU`` / ``RNN``: unrolled by :func:`polyc.onnx.ops.rnn.expand_recurrent`.

Inlined nodes get fresh tensor names (``<node>/<name>``) and ids, so nothing clashes; a body's outer-scope
references keep their names, and nested subgraphs are copied with their free names renamed the same way.
Conditions and trip counts computed from constants are folded first (:func:`polyc.onnx.folding.fold_constants`).
Anything else (a data-dependent ``If`` condition, a ``Loop`` whose trip count or condition is not a
compile-time constant, Scan's ``sequence_lens``) raises :class:`~polyc.errors.UnsupportedError` naming the node.
Semantics: the ONNX spec, operators If (1, 11, 13, 16, 19, 21), Loop (1, 11, 13, 16, 19, 21), Scan (8, 9, 11, 16,
19, 21).

The pass runs before Identity removal and CSE, which do not see a subgraph's implicit reads of outer tensors.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ShapeError, UnsupportedError
from .folding import evaluate_node, fold_constants
from .graph import TensorInfo, _attr_value, connect, copy_graph, remove_op, set_constant, to_model, topo_order
from .load import ModelError, infer_shapes
from .ops.rnn import KNOWN_ATTRS, RECURRENT, Emitter, expand_recurrent

CONTROL = ("If", "Loop", "Scan") + RECURRENT


def _needed_constants(d: dict) -> list:
    """Input names of a control node that must be compile-time constants."""
    ins = list(d["inputs"])
    if d["op"] == "If":
        return ins[:1]
    if d["op"] == "Loop":
        return [t for t in ins[:2] if t]
    if d["op"] in RECURRENT:
        return [t for t in ins[4:5] if t]
    return []


def lower_control_flow(g: nx.DiGraph) -> nx.DiGraph:
    """Inline/unroll every If, Loop, Scan, LSTM, GRU and RNN node of ``g`` (see the module docstring).

    Returns a new graph (``g`` is not changed) whose new tensors carry the shapes onnx's shape inference
    gives them. Raises UnsupportedError naming a node that cannot be made static, ShapeError for a missing
    static shape.
    """
    if not any(d["op"] in CONTROL for _, d in g.nodes(data=True)):
        return g
    g = copy_graph(g)
    folded = False
    while True:
        nid = next((n for n in topo_order(g) if g.nodes[n]["op"] in CONTROL), None)
        if nid is None:
            break
        d = g.nodes[nid]
        unknown = sorted(set(d["attrs"]) - KNOWN_ATTRS[d["op"]])
        if unknown:
            raise UnsupportedError(f"unsupported attribute(s) {', '.join(unknown)} on node {nid} ({d['op']})")
        if any(t not in g.graph["constants"] for t in _needed_constants(d)) and not folded:
            g, folded = fold_constants(g), True
            continue
        folded = False
        if d["op"] in RECURRENT:
            expand_recurrent(g, nid)
            continue
        {"If": _inline_if, "Loop": _unroll_loop, "Scan": _unroll_scan}[d["op"]](g, nid)
        connect(g)
        _refresh_shapes(g)
    _refresh_shapes(g)
    return g


# ---- shapes of new tensors ----------------------------------------------------------------------------------

def _refresh_shapes(g: nx.DiGraph) -> None:
    """Record the static shapes onnx infers for tensors ``g`` does not know yet (in place; best effort)."""
    try:
        model = infer_shapes(to_model(g, weights=False))
    except Exception:  # the final infer_static_shapes pass reports what is wrong
        return
    for vi in list(model.graph.value_info) + list(model.graph.output):
        t = vi.type.tensor_type
        if vi.name in g.graph["tensors"] or not vi.type.HasField("tensor_type") or not t.HasField("shape"):
            continue
        if all(dd.HasField("dim_value") for dd in t.shape.dim) and t.elem_type:
            dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type))
            g.graph["tensors"][vi.name] = TensorInfo(tuple(int(dd.dim_value) for dd in t.shape.dim), dtype)


# ---- inlining a subgraph ------------------------------------------------------------------------------------

def _defined(body: onnx.GraphProto) -> set:
    names = {i.name for i in body.input} | {i.name for i in body.initializer}
    for node in body.node:
        names.update(o for o in node.output if o)
    return names


def _rename_free(body: onnx.GraphProto, mapping: dict) -> onnx.GraphProto:
    """A copy of ``body`` whose references to names it does not define are renamed by ``mapping``."""
    local = _defined(body)
    outer = {k: v for k, v in mapping.items() if k not in local}
    if not outer:
        return body
    out = onnx.GraphProto()
    out.CopyFrom(body)
    for node in out.node:
        for k, name in enumerate(node.input):
            if name in outer:
                node.input[k] = outer[name]
        for a in node.attribute:
            if a.type == onnx.AttributeProto.GRAPH:
                a.g.CopyFrom(_rename_free(a.g, outer))
    for o in out.output:
        if o.name in outer:
            o.name = outer[o.name]
    return out


def _inline(g: nx.DiGraph, e: Emitter, owner: str, body: onnx.GraphProto, bound: dict, fixed: dict,
            tag: str) -> list:
    """Copy ``body``'s nodes into ``g``; ``bound`` maps body input names to outer tensors, ``fixed`` body
    output names to the outer names their producers must write. Returns the outer names of the body outputs.
    """
    if len(body.sparse_initializer):
        raise UnsupportedError(f"a subgraph of node {owner} has sparse initializers")
    for vi in list(body.input) + list(body.output):
        if vi.type.WhichOneof("value") not in (None, "tensor_type", "sequence_type", "optional_type"):
            raise UnsupportedError(f"{vi.name!r} of a subgraph of node {owner} has type "
                                   f"{vi.type.WhichOneof('value').replace('_type', '')}: only tensors are supported")
    mapping = dict(bound)
    for init in body.initializer:
        mapping[init.name] = e.name(init.name + tag)
        try:
            value = numpy_helper.to_array(init)
        except Exception as err:  # a wrong raw_data size, an unknown data type ...
            raise ModelError(f"initializer {init.name!r} of a subgraph of node {owner} cannot be read: "
                             f"{type(err).__name__}: {err}") from err
        set_constant(g, mapping[init.name], value)
    for node in body.node:
        for o in node.output:
            if o:
                mapping[o] = fixed[o] if o in fixed else e.name(o + tag)
    for k, node in enumerate(body.node):
        attrs = {}
        for a in node.attribute:
            try:
                value = _attr_value(a)
            except UnsupportedError as err:
                raise UnsupportedError(f"{err.message} on node {node.name or node.op_type} in a subgraph of "
                                       f"node {owner}") from err
            attrs[a.name] = _rename_free(value, mapping) if isinstance(value, onnx.GraphProto) else value
        e.node(node.op_type, [mapping.get(t, t) if t else "" for t in node.input],
               [mapping[t] if t else "" for t in node.output], attrs,
               base=f"{owner}/{node.name or node.op_type}{tag}", domain=node.domain)
    return [mapping.get(o.name, o.name) for o in body.output]


def _finish(g: nx.DiGraph, e: Emitter, src: str, out: str) -> None:
    """Make tensor ``out`` hold ``src`` (an Identity unless ``src`` already is ``out``)."""
    if out and src != out:
        if src in g.graph["constants"] and g.graph["producer"].get(src) is None:
            g.graph["constants"][out] = g.graph["constants"][src]
            g.graph["tensors"][out] = g.graph["tensors"][src]
        else:
            e.op("Identity", [src], outputs=[out])


def _fixed_outputs(body: onnx.GraphProto, outs: list) -> dict:
    """Body output -> outer name, for body outputs a body node writes (each renamed once)."""
    produced = {o for node in body.node for o in node.output if o}
    fixed = {}
    for o, out in zip(body.output, outs):
        if out and o.name in produced and o.name not in fixed:
            fixed[o.name] = out
    return fixed


def _start(g: nx.DiGraph, nid: str) -> tuple:
    d = g.nodes[nid]
    remove_op(g, nid)
    return d, Emitter(g, nid, d["order"])


def _inline_if(g: nx.DiGraph, nid: str) -> None:
    cond = g.nodes[nid]["inputs"][0]
    if cond not in g.graph["constants"]:
        raise UnsupportedError(f"node {nid} (If): its condition {cond!r} is not a compile-time constant "
                               "(data-dependent control flow is not supported)")
    value = np.asarray(g.graph["constants"][cond])
    if value.size != 1:
        raise ShapeError(f"node {nid} (If): the condition has {value.size} elements, expected 1")
    d, e = _start(g, nid)
    body = d["attrs"]["then_branch" if bool(value.reshape(-1)[0]) else "else_branch"]
    outs = list(d["outputs"])
    if len(body.output) != len(outs):
        raise ShapeError(f"node {nid} (If): the branch has {len(body.output)} outputs, the node {len(outs)}")
    fixed = _fixed_outputs(body, outs)
    results = _inline(g, e, nid, body, {}, fixed, "")
    for src, out in zip(results, outs):
        _finish(g, e, src, out)


def _unsqueeze(g: nx.DiGraph, e: Emitter, x: str, axis: int) -> str:
    if g.graph["opset"] >= 13:
        return e.op("Unsqueeze", [x, e.index([axis])])
    return e.op("Unsqueeze", [x], axes=[axis])


def _stack(g: nx.DiGraph, e: Emitter, pieces: list, axis: int, out: str | None = None) -> str:
    """``pieces`` stacked along a new ``axis`` (Unsqueeze each, then one Concat)."""
    return e.concat([_unsqueeze(g, e, p, axis) for p in pieces], axis, [out] if out else None)


def _loop_condition_passes_through(body: onnx.GraphProto) -> bool:
    """The body's condition output is its condition input (directly or through Identity) or constant true."""
    src = body.output[0].name
    by_output = {o: node for node in body.node for o in node.output}
    while src in by_output and by_output[src].op_type == "Identity":
        src = by_output[src].input[0]
    if src == body.input[1].name:
        return True
    node = by_output.get(src)
    if node is not None and node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
        return bool(np.all(numpy_helper.to_array(node.attribute[0].t)))
    init = {i.name: i for i in body.initializer}.get(src)
    return init is not None and bool(np.all(numpy_helper.to_array(init)))


#: The most iterations of a Loop without a trip count whose condition folds to false at compile time.
MAX_UNROLL = 4096


def _constant_value(g: nx.DiGraph, name: str, memo: dict):
    """The compile-time value of tensor ``name`` (evaluating its producers whose inputs are all known with
    onnx's reference evaluator), or None when it depends on a graph input."""
    if name in g.graph["constants"]:
        return g.graph["constants"][name]
    if name in memo:
        return memo[name]
    memo[name] = None
    p = g.graph["producer"].get(name)
    if p is None:
        return None
    d = g.nodes[p]
    if d["op"] in CONTROL or d.get("domain", "") not in ("", "ai.onnx"):
        return None
    values = [_constant_value(g, t, memo) if t else None for t in d["inputs"]]
    if any(v is None for t, v in zip(d["inputs"], values) if t):
        return None
    try:
        results = evaluate_node(d, values, g.graph["opset"])
    except Exception:  # the reference evaluator rejects the node: not a constant
        return None
    for t, v in zip(d["outputs"], results):
        memo[t] = v
    return memo[name]


def _unroll_loop(g: nx.DiGraph, nid: str) -> None:
    d = g.nodes[nid]
    ins = list(d["inputs"]) + ["", ""]
    trip, cond = ins[0], ins[1]
    body = d["attrs"]["body"]
    consts = g.graph["constants"]
    if trip and trip not in consts:
        raise UnsupportedError(f"node {nid} (Loop): the trip count M is not a compile-time constant "
                               "(only loops with a static trip count are unrolled)")
    if cond and cond not in consts:
        raise UnsupportedError(f"node {nid} (Loop): the initial condition {cond!r} is not a compile-time constant")
    if len(body.input) < 2 or not body.output:
        raise ShapeError(f"node {nid} (Loop): the body needs inputs (iter_num, cond, ...) and a cond output")
    passes_through = _loop_condition_passes_through(body)
    if not trip and passes_through:
        raise UnsupportedError(f"node {nid} (Loop): no trip count and a condition that never changes "
                               "(an infinite loop)")
    count = int(np.asarray(consts[trip]).reshape(-1)[0]) if trip else MAX_UNROLL + 1
    if cond and not bool(np.asarray(consts[cond]).reshape(-1)[0]):
        count = 0
    if passes_through and count > MAX_UNROLL:
        raise UnsupportedError(f"node {nid} (Loop): {count} iterations; unrolled loops are limited to "
                               f"{MAX_UNROLL}")
    carried = list(d["inputs"][2:])
    n_scan = len(body.output) - 1 - len(carried)
    if len(body.input) != 2 + len(carried) or n_scan < 0:
        raise ShapeError(f"node {nid} (Loop): the body has {len(body.input)} inputs and {len(body.output)} "
                         f"outputs for {len(carried)} loop-carried values")
    d, e = _start(g, nid)
    outs = list(d["outputs"])
    values, scans, memo = carried, [[] for _ in range(n_scan)], {}
    for i in range(count):
        if i == MAX_UNROLL:
            raise UnsupportedError(f"node {nid} (Loop): the condition is still true after {MAX_UNROLL} "
                                   "iterations (unrolled loops are limited to that)")
        bound = {body.input[0].name: e.const(np.array(i, np.int64), np.int64, "iter"),
                 body.input[1].name: e.const(np.array(True), np.bool_, "cond")}
        bound.update({vi.name: v for vi, v in zip(body.input[2:], values)})
        fixed = _fixed_outputs(body, [""] + outs[:len(carried)]) if passes_through and i == count - 1 else {}
        results = _inline(g, e, nid, body, bound, fixed, f"#{i}")
        values = results[1:1 + len(carried)]
        for k in range(n_scan):
            scans[k].append(results[1 + len(carried) + k])
        if not passes_through:
            flag = _constant_value(g, results[0], memo)
            if flag is None:
                raise UnsupportedError(f"node {nid} (Loop): the body computes its condition from values known "
                                       "only at run time (a data-dependent trip count is not supported)")
            if not bool(np.asarray(flag).reshape(-1)[0]):
                break
    if n_scan and not scans[0]:
        raise UnsupportedError(f"node {nid} (Loop): zero iterations give zero-size scan outputs")
    for src, out in zip(values, outs[:len(carried)]):
        _finish(g, e, src, out)
    for k, out in enumerate(outs[len(carried):]):
        if out:
            _stack(g, e, scans[k], 0, out)


def _norm(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def _scan_once(g, e, nid, body, states, xs, in_axes, in_dirs, out_axes, out_dirs, state_outs, scan_outs, tag):
    """Unroll one Scan over ``xs`` (outer names, scan axis ``in_axes``); returns nothing, writes
    ``state_outs`` / ``scan_outs`` (outer names, "" for unused)."""
    shapes = [g.graph["tensors"].get(x) for x in xs]
    if any(s is None or s.shape is None for s in shapes):
        raise ShapeError(f"node {nid} (Scan): a scan input has no static shape")
    lengths = {s.shape[_norm(a, len(s.shape))] for s, a in zip(shapes, in_axes)}
    if len(lengths) != 1:
        raise ShapeError(f"node {nid} (Scan): the scan inputs have different sequence lengths {sorted(lengths)}")
    length = lengths.pop()
    n_scan_out = len(body.output) - len(states)
    if length == 0 or length > MAX_UNROLL:
        raise UnsupportedError(f"node {nid} (Scan): a scan of length {length} (unrolled scans have 1 to "
                               f"{MAX_UNROLL} steps)")
    values, scans = list(states), [[] for _ in range(n_scan_out)]
    for t in range(length):
        bound = {vi.name: v for vi, v in zip(body.input, values)}
        for vi, x, s, a, rev in zip(body.input[len(states):], xs, shapes, in_axes, in_dirs):
            pos = length - 1 - t if rev else t
            bound[vi.name] = e.op("Gather", [x, e.index(pos)], axis=_norm(a, len(s.shape)))
        fixed = _fixed_outputs(body, state_outs) if t == length - 1 else {}
        results = _inline(g, e, nid, body, bound, fixed, f"{tag}#{t}")
        values = results[:len(states)]
        for k in range(n_scan_out):
            scans[k].append(results[len(states) + k])
    for src, out in zip(values, state_outs):
        _finish(g, e, src, out)
    for k, out in enumerate(scan_outs):
        if not out:
            continue
        pieces = scans[k][::-1] if out_dirs[k] else scans[k]
        info = g.graph["tensors"].get(out)
        axis = out_axes[k]
        if axis < 0:
            if info is None or info.shape is None:
                raise ShapeError(f"node {nid} (Scan): scan output {out!r} has no static shape")
            axis += len(info.shape)
        _stack(g, e, pieces, axis, out)


def _unroll_scan(g: nx.DiGraph, nid: str) -> None:
    d = g.nodes[nid]
    a, body = d["attrs"], d["attrs"]["body"]
    m = int(a["num_scan_inputs"])
    ins = list(d["inputs"])
    opset8 = g.graph["opset"] < 9
    if opset8:
        if ins[0]:
            raise UnsupportedError(f"node {nid} (Scan): the sequence_lens input (opset 8) is not supported")
        ins = ins[1:]
    states, xs = ins[:len(ins) - m], ins[len(ins) - m:]
    n_out = len(body.output) - len(states)
    if not 0 < m <= len(ins) or len(body.input) != len(ins) or n_out < 0:
        raise ShapeError(f"node {nid} (Scan): {len(ins)} inputs with num_scan_inputs={m} do not match a body of "
                         f"{len(body.input)} inputs and {len(body.output)} outputs")
    in_axes = list(a.get("scan_input_axes", [0] * m))
    in_dirs = list(a.get("scan_input_directions", a.get("directions", [0] * m)))
    out_axes = list(a.get("scan_output_axes", [0] * n_out))
    out_dirs = list(a.get("scan_output_directions", [0] * n_out))
    if (len(in_axes), len(in_dirs), len(out_axes), len(out_dirs)) != (m, m, n_out, n_out):
        raise ShapeError(f"node {nid} (Scan): the axes/directions attributes do not match {m} scan inputs and "
                         f"{n_out} scan outputs")
    outs = list(d["outputs"]) + [""] * (len(body.output) - len(d["outputs"]))
    if not opset8:
        d, e = _start(g, nid)
        _scan_once(g, e, nid, body, states, xs, in_axes, in_dirs, out_axes, out_dirs, outs[:len(states)],
                   outs[len(states):], "")
        return
    # opset 8: axis 0 of every input and output is a batch axis; the scan axis is 1 (0 once the batch is read)
    batch = g.graph["tensors"][xs[0]].shape[0]
    d, e = _start(g, nid)
    per = [[] for _ in outs]
    for b in range(batch):
        idx = e.index(b)
        st = [e.op("Gather", [s, idx], axis=0) for s in states]
        xb = [e.op("Gather", [x, idx], axis=0) for x in xs]
        for src, dst in zip(states + xs, st + xb):
            info = g.graph["tensors"].get(src)
            if info is not None and info.shape is not None:
                g.graph["tensors"][dst] = TensorInfo(info.shape[1:], info.dtype)
        res = [e.name(f"out{k}#{b}") for k in range(len(outs))]
        _scan_once(g, e, nid, body, st, xb, [0] * m, in_dirs, [0] * n_out, [0] * n_out, res[:len(states)],
                   res[len(states):], f"@{b}")
        for k, r in enumerate(res):
            per[k].append(r)
    for k, out in enumerate(outs):
        if out:
            _stack(g, e, per[k], 0, out)
