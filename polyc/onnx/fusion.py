"""Fusion groups: which ONNX nodes become one TC kernel.

Rules, applied greedily in topological order:

- an *anchor* (Conv, ConvTranspose, Gemm, MatMul), an elementwise op, or any other kernel op with one
  output (pooling, Concat, Softmax ...) starts a group;
- the group grows along its single output while that tensor has exactly one reader, the reader is
  elementwise, its output has the group output's shape (no broadcast growth), and merging it keeps the
  group graph acyclic (its other inputs must not depend on the group). So ``Conv -> Add(bias) -> Relu``,
  a residual ``Conv -> Add(., shortcut) -> Relu`` and chains of elementwise ops become one group each;
- *alias* ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity) on contiguous data need no kernel: they form
  groups of kind ``"alias"`` whose output shares its input's memory;
- every other op is a group of its own.
"""
from __future__ import annotations

from dataclasses import dataclass

import networkx as nx

from .graph import consumers, producer, topo_order

ANCHORS = frozenset({"Conv", "ConvTranspose", "Gemm", "MatMul"})
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Sum", "Max", "Min", "Pow", "Relu", "LeakyRelu", "Sigmoid",
                         "Tanh", "Clip", "Erf", "Gelu", "Exp", "Log", "Sqrt", "Cast", "Neg", "Abs",
                         "Reciprocal", "Mean", "HardSigmoid", "Elu", "Selu", "Softplus", "Floor", "Ceil",
                         # ops/logic.py, ops/unary.py
                         "Where", "Expand", "And", "Or", "Xor", "Not", "Equal", "Less", "LessOrEqual", "Greater",
                         "GreaterOrEqual", "IsNaN", "IsInf", "Mod", "BitShift", "BitwiseAnd", "BitwiseOr",
                         "BitwiseXor", "BitwiseNot", "HardSwish", "Celu", "Softsign", "ThresholdedRelu", "PRelu",
                         "Mish", "Shrink", "Sign", "Round", "CastLike", "Sin", "Cos", "Tan", "Asin", "Acos",
                         "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
                         # ops/quant.py
                         "QuantizeLinear", "DequantizeLinear"})
ALIASES = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})


@dataclass(frozen=True)
class Group:
    """A set of nodes compiled as one kernel (``kind="kernel"``) or a memory alias (``kind="alias"``).

    ``inputs``: tensors read from outside (graph inputs, constants, other groups' outputs), in first-read
    order; ``outputs``: tensors read outside the group or returned by the graph; ``nodes``: node ids in
    topological order.
    """

    name: str
    kind: str
    nodes: tuple
    ops: tuple
    inputs: tuple
    outputs: tuple

    def __str__(self) -> str:
        return f"{self.name} [{self.kind}] {'+'.join(self.ops)}: ({', '.join(self.inputs)}) -> ({', '.join(self.outputs)})"


def _can_absorb(g: nx.DiGraph, members: list, tail: str, reader: str) -> bool:
    d = g.nodes[reader]
    if d["op"] not in ELEMENTWISE or len([o for o in d["outputs"] if o]) != 1:
        return False
    tensors = g.graph["tensors"]
    if tensors[d["outputs"][0]].shape != tensors[tail].shape:
        return False
    member_set = set(members)
    for t in d["inputs"]:
        if t == tail or not t:
            continue
        p = producer(g, t)
        if p is None or p in member_set:
            continue
        if any(nx.has_path(g, m, p) for m in members):
            return False
    return True


#: The most elementwise nodes :func:`close_diamond` takes in at once.
DIAMOND_MAX_NODES = 12


def close_diamond(g: nx.DiGraph, members: list, tail: str, assigned: dict) -> list | None:
    """The elementwise nodes that close the diamond opened by ``tail`` having several readers, or None.

    From the readers of ``tail``, nodes are taken in topological order while some tensor of the group is
    still read outside it: each must be elementwise of the group's shape (:func:`_can_absorb`) and read only
    tensors of the group or from before it; the diamond closes when a single tensor of the group is read
    outside (``y = x * sigmoid(x)``: Sigmoid, then Mul; GELU's Div, Erf, Add, Mul, Mul), and that one
    continues the chain. Gives up past DIAMOND_MAX_NODES nodes or at any node it cannot take."""
    taken, inside = [], set(members)
    order = {n: k for k, n in enumerate(topo_order(g))}
    open_ = {tail}
    while len(open_) > 1 or tail in open_:
        frontier = sorted({r for t in open_ for r in consumers(g, t) if r not in inside}, key=order.get)
        if not frontier or len(taken) >= DIAMOND_MAX_NODES:
            return None
        node = frontier[0]
        d = g.nodes[node]
        if node in assigned or not any(t in open_ for t in d["inputs"]):
            return None
        source = next(t for t in d["inputs"] if t in open_)
        if not _can_absorb(g, members + taken, source, node):
            return None
        taken.append(node)
        inside.add(node)
        open_ = {t for m in members + taken for t in g.nodes[m]["outputs"] if t and
                 (t in g.graph["outputs"] or any(r not in inside for r in consumers(g, t)))}
        if any(t in g.graph["outputs"] for t in open_ if t != g.nodes[node]["outputs"][0]):
            return None
    return taken


def _io(g: nx.DiGraph, name: str, kind: str, members: list) -> Group:
    member_set = set(members)
    inputs, outputs = [], []
    written = set()
    for m in members:
        d = g.nodes[m]
        for t in d["inputs"]:
            if t and t not in written and t not in inputs:
                inputs.append(t)
        for t in d["outputs"]:
            if not t:
                continue
            written.add(t)
            readers = consumers(g, t)
            if t in g.graph["outputs"] or any(r not in member_set for r in readers):
                outputs.append(t)
    ops = tuple(g.nodes[m]["op"] for m in members)
    return Group(name, kind, tuple(members), ops, tuple(inputs), tuple(outputs))


def fusion_groups(g: nx.DiGraph) -> list:
    """Partition the nodes of ``g`` into :class:`Group` s, in an order that respects dependences."""
    assigned: dict = {}
    members_of: list = []
    for nid in topo_order(g):
        if nid in assigned:
            continue
        d = g.nodes[nid]
        members = [nid]
        if d["op"] not in ALIASES:
            while True:
                outs = [o for o in g.nodes[members[-1]]["outputs"] if o]
                if len(outs) != 1 or outs[0] in g.graph["outputs"]:
                    break
                readers = consumers(g, outs[0])
                if len(readers) > 1:  # a diamond (x * sigmoid(x), GELU): taken in whole, or not at all
                    closed = close_diamond(g, members, outs[0], assigned)
                    if closed is None:
                        break
                    members += closed
                    continue
                if len(readers) != 1 or readers[0] in assigned or not _can_absorb(g, members, outs[0], readers[0]):
                    break
                members.append(readers[0])
        for m in members:
            assigned[m] = len(members_of)
        members_of.append(members)
    # order groups topologically on the contracted graph
    dag = nx.DiGraph()
    dag.add_nodes_from(range(len(members_of)))
    for u, v in g.edges:
        if assigned[u] != assigned[v]:
            dag.add_edge(assigned[u], assigned[v])
    order = list(nx.lexicographical_topological_sort(dag))
    groups = []
    for k, index in enumerate(order):
        members = members_of[index]
        kind = "alias" if len(members) == 1 and g.nodes[members[0]]["op"] in ALIASES else "kernel"
        groups.append(_io(g, f"g{k}", kind, members))
    return groups


def groups_summary(g: nx.DiGraph, groups: list) -> str:
    """A printable table: one line per group with its ops and the shape of its outputs."""
    tensors = g.graph["tensors"]
    lines = [f"{len(groups)} groups ({sum(gr.kind == 'kernel' for gr in groups)} kernels) for {len(g)} nodes"]
    for gr in groups:
        shapes = ", ".join(str(tensors[t]) for t in gr.outputs)
        lines.append(f"  {gr.name:>5} {gr.kind:6} {'+'.join(gr.ops):32} -> {shapes}")
    return "\n".join(lines)
