"""LSTM, GRU and RNN: unrolled over the static sequence length by a graph rewrite into standard ONNX nodes.

The lowering is a graph pass, not a TC converter: :func:`expand_recurrent` (called by
:func:`polyc.onnx.control.lower_control_flow`, the first step of :func:`polyc.onnx.passes.simplify`) replaces
each recurrent node by plain ONNX nodes, and the ordinary fusion turns them into kernels. Per direction and
gate ``k`` the input projection of *all* time steps is one MatMul plus bias, ``XW_k = X @ W_k^T + Wb_k + Rb_k``
(``[T, B, H]``, or ``[B, T, H]`` for ``layout=1``); then every time step ``t`` reads its row (a Gather) and adds
the recurrent product ``H_{t-1} @ R_k^T``, followed by the gate's clip and activation, fused with them into one
kernel (the Add/activation/Mul chains are elementwise). Identical steps give identical TC text, so a step's
kernels are compiled once. This keeps each kernel small for the polyhedral scheduler (one TC def holding every
step would grow its statement count with the sequence length) and reuses the tested MatMul, Gather, Concat and
elementwise converters. The equations are the ONNX spec's (operators LSTM, GRU, RNN; opsets 7, 14, 22):

- LSTM (gates ``i, o, f, c``): ``i = f(Xi + H Ri + Pi.C + b)``, ``f = f(Xf + H Rf + Pf.C + b)`` (or ``1 - i``
  with ``input_forget``), ``c = g(Xc + H Rc + b)``, ``C' = f.C + i.c``, ``o = f(Xo + H Ro + Po.C' + b)``,
  ``H' = o.h(C')``;
- GRU (gates ``z, r, h``): ``z``, ``r`` as above, ``h = g(Xh + (r.H) Rh + Rbh + Wbh)`` or, with
  ``linear_before_reset``, ``g(Xh + r.(H Rh + Rbh) + Wbh)``; ``H' = (1 - z).h + z.H``;
- RNN: ``H' = f(Xi + H Ri + Wbi + Rbi)``.

``clip`` bounds every activation's input to ``[-clip, clip]``. A constant ``sequence_lens`` becomes per-step
constant masks: past a batch entry's length its state is kept and its ``Y`` row is zero (in the reverse
direction the masked steps come first, so the state stays the initial one until the sequence starts).
``sequence_lens`` that is not a compile-time constant is unsupported.
"""
from __future__ import annotations

import networkx as nx
import numpy as np

from ...errors import ShapeError, UnsupportedError
from ..graph import connect, remove_op, set_constant

RECURRENT = ("LSTM", "GRU", "RNN")
#: The most inputs of one emitted Concat.
CONCAT_WIDTH = 32
_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
_DEFAULT_ACTS = {"LSTM": ("sigmoid", "tanh", "tanh"), "GRU": ("sigmoid", "tanh"), "RNN": ("tanh",)}
#: activation -> (default alpha, default beta); None: the activation takes no such parameter.
ACTIVATIONS = {"relu": (None, None), "tanh": (None, None), "sigmoid": (None, None), "affine": (1.0, 0.0),
               "leakyrelu": (0.01, None), "scaledtanh": (1.0, 1.0), "hardsigmoid": (0.2, 0.5),
               "elu": (1.0, None), "softsign": (None, None), "softplus": (None, None)}


class Emitter:
    """Adds nodes and constants to ``g`` (edited in place) for the rewrite of node ``nid``; call
    :meth:`finish` at the end.

    Node ids are ``<nid>/<op>``, tensor names ``<nid>/<hint>`` (made unique), orders fall between ``nid``'s
    order and the next integer so the rewrite stays where the node was.
    """

    def __init__(self, g: nx.DiGraph, nid: str, order, dtype=np.float32):
        self.g, self.nid, self.dtype = g, nid, np.dtype(dtype)
        self.order, self.count = order, 0
        self.taken: set = set()
        self.counters: dict = {}

    def _next_order(self):
        self.count += 1
        return self.order + self.count * 1e-6

    def _unique(self, base: str, used) -> str:
        k = self.counters.get(base, 0)
        name = base if k == 0 else f"{base}_{k}"
        while name in self.taken or used(name):
            k += 1
            name = f"{base}_{k}"
        self.counters[base] = k + 1
        self.taken.add(name)
        return name

    def name(self, hint: str) -> str:
        """A fresh tensor name ``<node>/<hint>``."""
        return self._unique(f"{self.nid}/{hint}",
                            lambda n: n in self.g.graph["tensors"] or n in self.g.graph["producer"])

    def node(self, op: str, inputs, outputs, attrs: dict, base: str | None = None, domain: str = "") -> str:
        """Add a node (a fresh id from ``base``, default ``<node>/<op>``); its edges are made by
        :func:`~polyc.onnx.graph.connect` once the rewrite is done (:meth:`finish`)."""
        nid = self._unique(base or f"{self.nid}/{op}", lambda n: n in self.g)
        self.g.add_node(nid, op=op, inputs=tuple(inputs), outputs=tuple(outputs), attrs=dict(attrs),
                        order=self._next_order(), domain=domain)
        for t in outputs:
            if t:
                self.g.graph["producer"][t] = nid
        return nid

    def finish(self) -> None:
        """Recompute the graph's edges (after the nodes are added)."""
        connect(self.g)

    def const(self, value, dtype=None, hint: str = "const") -> str:
        """A new constant tensor (``dtype`` default: the emitter's float type)."""
        name = self.name(hint)
        set_constant(self.g, name, np.asarray(value, dtype=dtype or self.dtype))
        return name

    def index(self, value) -> str:
        return self.const(np.asarray(value, dtype=np.int64), np.int64, "index")

    def op(self, op: str, inputs, outputs=None, hint: str | None = None, **attrs):
        """Add node ``op``; returns its output name (a list when ``outputs`` is a list of several)."""
        if outputs is None:
            outputs = [self.name(hint or op.lower())]
        self.node(op, list(inputs), list(outputs), attrs)
        return outputs[0] if len(outputs) == 1 else list(outputs)

    def add(self, a, b):
        return b if a is None else a if b is None else self.op("Add", [a, b])

    def mul(self, a, b):
        return self.op("Mul", [a, b])

    def concat(self, parts: list, axis: int, outputs=None) -> str:
        """``Concat`` of ``parts`` along ``axis``, as a tree of Concats of at most :data:`CONCAT_WIDTH` inputs
        (a Concat's TC expression nests one ``?:`` per input)."""
        while len(parts) > CONCAT_WIDTH:
            parts = [self.op("Concat", parts[k:k + CONCAT_WIDTH], axis=axis) if len(parts[k:k + CONCAT_WIDTH]) > 1
                     else parts[k] for k in range(0, len(parts), CONCAT_WIDTH)]
        if len(parts) == 1:
            return self.op("Identity", parts, outputs=outputs)
        return self.op("Concat", parts, outputs=outputs, axis=axis)

    def scalar(self, v) -> str:
        return self.const(np.asarray(v, dtype=self.dtype), hint="scalar")


def _text(v):
    return v.decode() if isinstance(v, bytes) else v


def _activations(nid: str, d: dict, directions: int) -> list:
    """Per direction, the list of (name, alpha, beta) of the op's activation functions (spec defaults)."""
    op, a = d["op"], d["attrs"]
    per = len(_DEFAULT_ACTS[op])
    names = [_text(x).lower() for x in a.get("activations", [])] or list(_DEFAULT_ACTS[op]) * directions
    if len(names) != per * directions:
        raise ShapeError(f"node {nid} ({op}) has {len(names)} activations, expected {per * directions}")
    alphas, betas = list(a.get("activation_alpha", [])), list(a.get("activation_beta", []))
    out = []
    for name in names:
        if name not in ACTIVATIONS:
            raise UnsupportedError(f"activation {name!r} of node {nid} ({op}) is not supported "
                                   f"(supported: {', '.join(sorted(ACTIVATIONS))})")
        da, db = ACTIVATIONS[name]
        alpha = (alphas.pop(0) if alphas else da) if da is not None else None
        beta = (betas.pop(0) if betas else db) if db is not None else None
        out.append((name, alpha, beta))
    return [out[k * per:(k + 1) * per] for k in range(directions)]


def activate(e: Emitter, act: tuple, x: str, clip) -> str:
    """``act(x)`` as standard ONNX nodes, ``x`` first clipped to ``[-clip, clip]`` when ``clip`` is set."""
    if clip is not None:
        x = e.op("Min", [e.op("Max", [x, e.scalar(-clip)]), e.scalar(clip)])
    name, alpha, beta = act
    if name == "sigmoid":
        return e.op("Sigmoid", [x])
    if name == "tanh":
        return e.op("Tanh", [x])
    if name == "relu":
        return e.op("Relu", [x])
    if name == "leakyrelu":
        return e.op("LeakyRelu", [x], alpha=float(alpha))
    if name == "affine":
        return e.op("Add", [e.mul(x, e.scalar(alpha)), e.scalar(beta)])
    if name == "scaledtanh":
        return e.mul(e.op("Tanh", [e.mul(x, e.scalar(beta))]), e.scalar(alpha))
    if name == "hardsigmoid":
        lin = e.op("Add", [e.mul(x, e.scalar(alpha)), e.scalar(beta)])
        return e.op("Min", [e.op("Max", [lin, e.scalar(0.0)]), e.scalar(1.0)])
    if name == "elu":  # max(x, 0) + alpha * (exp(min(x, 0)) - 1)
        neg = e.op("Sub", [e.op("Exp", [e.op("Min", [x, e.scalar(0.0)])]), e.scalar(1.0)])
        return e.op("Add", [e.op("Max", [x, e.scalar(0.0)]), e.mul(neg, e.scalar(alpha))])
    if name == "softsign":
        return e.op("Div", [x, e.op("Add", [e.op("Abs", [x]), e.scalar(1.0)])])
    if name == "softplus":
        return e.op("Log", [e.op("Add", [e.op("Exp", [x]), e.scalar(1.0)])])
    raise AssertionError(name)


def _static_shape(g, nid, d, name, what):
    info = g.graph["tensors"].get(name)
    if info is None or info.shape is None:
        raise ShapeError(f"input {what} ({name!r}) of node {nid} ({d['op']}) has no static shape")
    return info.shape


def _rows(e: Emitter, w: str, k: int, hidden: int) -> str:
    """Rows ``k*hidden .. (k+1)*hidden`` of ``w`` along axis 0 (a Gather by a constant index vector)."""
    return e.op("Gather", [w, e.index(np.arange(k * hidden, (k + 1) * hidden))], axis=0)


def _masks(g, nid, d, seq: str, steps: int, batch: int, dtype):
    """Per time step the ``[B, 1]`` mask (1 while ``t < sequence_lens[b]``), or None when every length is
    the full sequence."""
    if not seq:
        return None
    if seq not in g.graph["constants"]:
        raise UnsupportedError(f"input sequence_lens ({seq!r}) of node {nid} ({d['op']}) must be a compile-time "
                               "constant")
    lens = np.asarray(g.graph["constants"][seq]).astype(np.int64).reshape(-1)
    if lens.shape != (batch,) or (lens < 0).any() or (lens > steps).any():
        raise ShapeError(f"sequence_lens of node {nid} ({d['op']}) is {lens.tolist()}: expected {batch} "
                         f"lengths in 0..{steps}")
    if (lens == steps).all():
        return None
    return [(t < lens).astype(dtype).reshape(batch, 1) for t in range(steps)]


def expand_recurrent(g: nx.DiGraph, nid: str) -> None:
    """Replace the LSTM / GRU / RNN node ``nid`` of ``g`` (edited in place) by its unrolled standard nodes.

    Inputs ``X`` ``[T, B, I]`` (``[B, T, I]`` for layout 1), ``W`` ``[D, G*H, I]``, ``R`` ``[D, G*H, H]``,
    optional ``B`` ``[D, 2*G*H]``, ``sequence_lens`` ``[B]`` (a compile-time constant), ``initial_h`` (and
    for LSTM ``initial_c``) ``[D, B, H]`` (``[B, D, H]`` for layout 1), LSTM's ``P`` ``[D, 3*H]``; any float
    dtype. Outputs ``Y`` ``[T, D, B, H]`` (``[B, T, D, H]``), ``Y_h`` and ``Y_c`` shaped like ``initial_h``.
    Raises ShapeError for missing static shapes or inconsistent sizes and UnsupportedError for an unknown
    activation or a non-constant ``sequence_lens``.
    """
    d = g.nodes[nid]
    op, a = d["op"], d["attrs"]
    ins = list(d["inputs"]) + [""] * (8 - len(d["inputs"]))
    x, w, r, bias, seq, h0 = ins[:6]
    c0, peep = (ins[6], ins[7]) if op == "LSTM" else ("", "")
    layout = int(a.get("layout", 0))
    xs = _static_shape(g, nid, d, x, "X")
    rs = _static_shape(g, nid, d, r, "R")
    if len(xs) != 3 or len(rs) != 3:
        raise ShapeError(f"node {nid} ({op}): X and R must be 3-D, got {list(xs)} and {list(rs)}")
    steps, batch = (xs[0], xs[1]) if layout == 0 else (xs[1], xs[0])
    direction = _text(a.get("direction", "forward"))
    if direction not in ("forward", "reverse", "bidirectional"):
        raise UnsupportedError(f"direction {direction!r} of node {nid} ({op}) is not supported")
    dirs = 2 if direction == "bidirectional" else 1
    gates = _GATES[op]
    hidden = int(a.get("hidden_size", rs[2]))
    state = (dirs, batch, hidden) if layout == 0 else (batch, dirs, hidden)
    expected = {"W": (w, (dirs, gates * hidden, xs[2])), "R": (r, (dirs, gates * hidden, hidden)),
                "B": (bias, (dirs, 2 * gates * hidden)), "initial_h": (h0, state), "initial_c": (c0, state),
                "P": (peep, (dirs, 3 * hidden))}
    for what, (name, shape) in expected.items():
        if name and _static_shape(g, nid, d, name, what) != shape:
            raise ShapeError(f"node {nid} ({op}): input {what} ({name!r}) has shape "
                             f"{list(_static_shape(g, nid, d, name, what))}, expected {list(shape)}")
    dtype = g.graph["tensors"][x].dtype
    acts = _activations(nid, d, dirs)
    clip = a.get("clip")
    clip = None if clip is None else float(clip)
    masks = _masks(g, nid, d, seq, steps, batch, dtype)
    lbr = int(a.get("linear_before_reset", 0)) if op == "GRU" else 0
    input_forget = int(a.get("input_forget", 0)) if op == "LSTM" else 0
    outputs = list(d["outputs"]) + [""] * (3 - len(d["outputs"]))
    remove_op(g, nid)
    e = Emitter(g, nid, d["order"], dtype)
    time_axis = 0 if layout == 0 else 1
    state_axis = 0 if layout == 0 else 1
    ys, hs, cs = {}, [], []
    for k in range(dirs):
        reverse = direction == "reverse" or k == 1
        wd = e.op("Gather", [w, e.index(k)], axis=0)
        rd = e.op("Gather", [r, e.index(k)], axis=0)
        bd = e.op("Gather", [bias, e.index(k)], axis=0) if bias else None
        wt = [e.op("Transpose", [_rows(e, wd, j, hidden)], perm=[1, 0]) for j in range(gates)]
        rt = [e.op("Transpose", [_rows(e, rd, j, hidden)], perm=[1, 0]) for j in range(gates)]
        wb = [_rows(e, bd, j, hidden) if bd else None for j in range(gates)]
        rb = [_rows(e, bd, gates + j, hidden) if bd else None for j in range(gates)]
        xw = []
        for j in range(gates):
            b_j = wb[j] if (op == "GRU" and j == 2 and lbr) else e.add(wb[j], rb[j])
            xw.append(e.add(e.op("MatMul", [x, wt[j]]), b_j))
        p = [_rows(e, e.op("Gather", [peep, e.index(k)], axis=0), j, hidden) for j in range(3)] if peep else None
        h = e.op("Gather", [h0, e.index(k)], axis=state_axis) if h0 else None
        c = e.op("Gather", [c0, e.index(k)], axis=state_axis) if c0 else None
        f_act, g_act = acts[k][0], acts[k][1] if gates > 1 else None
        rows = [_split_steps(e, xw[j], steps, time_axis, batch, hidden) for j in range(gates)]
        for s in range(steps):
            t = steps - 1 - s if reverse else s
            z = [rows[j][t] for j in range(gates)]
            if masks is not None and not masks[t].any():  # past every length: the state is kept, Y is 0
                ys[t, k] = e.const(np.zeros((batch, hidden)), hint="zeros")
                continue

            def pre(j):
                return e.add(z[j], e.op("MatMul", [h, rt[j]]) if h else None)
            c_new = None
            if op == "RNN":
                h_new = activate(e, f_act, pre(0), clip)
            elif op == "GRU":
                zt = activate(e, f_act, pre(0), clip)
                rt_ = activate(e, f_act, pre(1), clip)
                if lbr:
                    lin = e.add(e.op("MatMul", [h, rt[2]]) if h else None, rb[2])
                    cand = e.add(z[2], e.mul(rt_, lin) if lin else None)
                else:
                    cand = e.add(z[2], e.op("MatMul", [e.mul(rt_, h), rt[2]]) if h else None)
                cand = activate(e, g_act, cand, clip)
                keep = e.op("Sub", [e.scalar(1.0), zt])
                h_new = e.add(e.mul(keep, cand), e.mul(zt, h) if h else None)
            else:  # LSTM: gates i, o, f, c; peepholes i, o, f
                i_pre = e.add(pre(0), e.mul(p[0], c) if (p and c) else None)
                it = activate(e, f_act, i_pre, clip)
                if input_forget:
                    ft = e.op("Sub", [e.scalar(1.0), it])
                else:
                    ft = activate(e, f_act, e.add(pre(2), e.mul(p[2], c) if (p and c) else None), clip)
                ct = activate(e, g_act, pre(3), clip)
                c_new = e.add(e.mul(it, ct), e.mul(ft, c) if c else None)
                ot = activate(e, f_act, e.add(pre(1), e.mul(p[1], c_new) if p else None), clip)
                h_new = e.mul(ot, activate(e, acts[k][2], c_new, None))
            if masks is not None and not masks[t].all():
                m, keep = e.const(masks[t], hint="mask"), e.const(1 - masks[t], hint="keep")
                y = e.mul(h_new, m)
                h = e.add(y, e.mul(h, keep) if h else None)
                if c_new is not None:
                    c = e.add(e.mul(c_new, m), e.mul(c, keep) if c else None)
            else:
                y, h = h_new, h_new
                c = c_new if c_new is not None else c
            ys[t, k] = y
        hs.append(h if h else e.const(np.zeros((batch, hidden)), hint="zeros"))
        if op == "LSTM":
            cs.append(c if c else e.const(np.zeros((batch, hidden)), hint="zeros"))
    _stack(e, [ys[t, k] for t in range(steps) for k in range(dirs)], layout, (steps, dirs), batch, hidden,
           outputs[0])
    _stack(e, hs, layout, (dirs,), batch, hidden, outputs[1])
    if op == "LSTM":
        _stack(e, cs, layout, (dirs,), batch, hidden, outputs[2])
    e.finish()


def _split_steps(e: Emitter, xw: str, steps: int, axis: int, batch: int, hidden: int) -> list:
    """The ``[B, H]`` rows of ``xw`` per time step: one Split along the time ``axis`` (so that every step's
    kernel reads a tensor of its own and identical steps give identical TC text), each piece reshaped."""
    if steps == 1:
        return [e.op("Reshape", [xw, e.index([batch, hidden])])]
    opset = e.g.graph["opset"]
    pieces = [e.name("step") for _ in range(steps)]
    e.op("Split", [xw], outputs=pieces, axis=axis, **({"num_outputs": steps} if opset >= 18 else {}))
    return [e.op("Reshape", [p, e.index([batch, hidden])]) for p in pieces]


def _stack(e: Emitter, pieces: list, layout: int, dims: tuple, batch: int, hidden: int, out: str) -> None:
    """Write the ``[B, H]`` ``pieces`` (row-major over ``dims``) as ``out``: ``[*dims, B, H]`` for layout 0,
    ``[B, *dims, H]`` for layout 1 (one Concat along the joined axis, then a Reshape)."""
    if not out:
        return
    axis = 0 if layout == 0 else 1
    piece_shape = [1, batch, hidden] if layout == 0 else [batch, 1, hidden]
    pieces = [e.op("Reshape", [p, e.index(piece_shape)]) for p in pieces]
    joined = pieces[0] if len(pieces) == 1 else e.concat(pieces, axis)
    shape = list(dims) + [batch, hidden] if layout == 0 else [batch] + list(dims) + [hidden]
    e.op("Reshape", [joined, e.index(shape)], outputs=[out])


def _rewritten(b, node):
    raise b.error("recurrent and control-flow nodes are rewritten by polyc.onnx.control before lowering")


_RNN_ATTRS = {"activation_alpha", "activation_beta", "activations", "clip", "direction", "hidden_size", "layout"}

#: Handled by the graph pass (:mod:`polyc.onnx.control`); the converter entries make them known ops.
CONVERTERS = {op: ((1, _rewritten),) for op in RECURRENT + ("If", "Loop", "Scan")}

KNOWN_ATTRS = {
    "LSTM": _RNN_ATTRS | {"input_forget"}, "GRU": _RNN_ATTRS | {"linear_before_reset"}, "RNN": set(_RNN_ATTRS),
    "If": {"then_branch", "else_branch"}, "Loop": {"body"},
    "Scan": {"body", "num_scan_inputs", "scan_input_axes", "scan_input_directions", "scan_output_axes",
             "scan_output_directions", "directions"},
}

SUPPORTED_VALUES: dict = {}

CONSTANT_INPUTS = {
    "LSTM": ((4, 1, "sequence_lens"),), "GRU": ((4, 1, "sequence_lens"),), "RNN": ((4, 1, "sequence_lens"),),
    "If": ((0, 1, "cond"),), "Loop": ((0, 1, "M"), (1, 1, "cond")),
}
