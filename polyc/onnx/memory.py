"""Static memory planning: the intermediate tensors of a compiled model share one arena.

Each tensor written by a kernel group lives from the group that writes it to the last group that reads it
(or to the end for graph outputs). Alias groups (Reshape, Flatten, Squeeze, Unsqueeze, Identity) make no new
tensor: their output is a view of their input's memory and extends its lifetime. Offsets are assigned
greedily by size (largest first, each at the lowest 64-byte-aligned offset that does not overlap a
tensor alive at the same time), the strategy of TFLite's arena planner.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class MemoryPlan:
    """``offsets``: root tensor -> byte offset in the arena; ``alias``: view tensor -> root tensor;
    ``lifetimes``: root -> (first group index, last group index); ``arena_bytes``: the arena's size;
    ``total_bytes``: what the intermediates would take without sharing."""

    offsets: dict
    sizes: dict
    alias: dict
    lifetimes: dict
    arena_bytes: int
    total_bytes: int = field(default=0)

    def root(self, tensor: str) -> str:
        """The tensor whose memory ``tensor`` uses (itself unless it is an alias)."""
        return _root(self.alias, tensor)

    def __str__(self) -> str:
        saved = 1 - self.arena_bytes / self.total_bytes if self.total_bytes else 0.0
        return (f"arena {self.arena_bytes / 2**20:.2f} MiB for {len(self.offsets)} intermediates of "
                f"{self.total_bytes / 2**20:.2f} MiB in total ({saved:.0%} saved by sharing)")


def _root(alias: dict, tensor: str) -> str:
    """The tensor whose memory ``tensor`` uses under ``alias`` (view or in-place output -> its tensor)."""
    while tensor in alias:
        tensor = alias[tensor]
    return tensor


def _liveness(g: nx.DiGraph, groups: list, scratch: dict, inplace: dict) -> tuple:
    """``(tensors, alias, first, last)`` over the group order (see :func:`plan_memory`): ``alias`` maps a view
    or an in-place output to the tensor whose memory it uses, ``first``/``last`` the first and last group
    index of each root (``len(groups)`` for the graph's outputs)."""
    tensors = dict(g.graph["tensors"])
    alias, first, last = {}, {}, {}

    def root(t):
        return _root(alias, t)
    for k, gr in enumerate(groups):
        for t in gr.inputs:
            r = root(t)
            if r in first:
                last[r] = max(last.get(r, k), k)
        if gr.kind == "alias":
            node = g.nodes[gr.nodes[0]]
            alias[node["outputs"][0]] = node["inputs"][0]
            continue
        for t in gr.outputs:
            if t in inplace:
                alias[t] = inplace[t]
                continue
            first[t] = k
            last[t] = max(last.get(t, k), k)
        for t, info in scratch.get(gr.name, {}).items():
            tensors[t] = info
            first[t] = last[t] = k
    end = len(groups)
    for t in g.graph["outputs"]:
        r = root(t)
        if r in first:
            last[r] = end
    return tensors, alias, first, last


def dying_inputs(g: nx.DiGraph, groups: list) -> dict:
    """Group name -> the inputs of that group whose memory no later group and no graph output needs: each is
    (a view of) a tensor some kernel wrote, read for the last time by this group. Such an input's memory may
    become the memory of an output of the same shape and dtype (an in-place update, :func:`plan_memory`'s
    ``inplace``)."""
    _, alias, first, last = _liveness(g, groups, {}, {})
    return {gr.name: frozenset(t for t in gr.inputs if _root(alias, t) in first and last[_root(alias, t)] == k)
            for k, gr in enumerate(groups) if gr.kind != "alias"}


def plan_memory(g: nx.DiGraph, groups: list, scratch: dict | None = None, inplace: dict | None = None) -> MemoryPlan:
    """Assign every kernel-written tensor an arena offset by liveness over the group order.

    ``scratch`` (group name -> {tensor name: TensorInfo}) adds the kernels' own temporaries (tensors a def
    writes but does not return), each alive only while its group runs. ``inplace`` (output tensor -> input
    tensor of the same group, one :func:`dying_inputs` gave) makes the output use the input's memory: the
    kernel updates it in place (a residual Add folded into a convolution's accumulator, see
    :func:`polyc.onnx.lower.fold_residual`).
    """
    tensors, alias, first, last = _liveness(g, groups, scratch or {}, inplace or {})
    sizes = {t: max(tensors[t].nbytes, 1) for t in first}
    order = sorted(first, key=lambda t: (-sizes[t], first[t], t))
    placed: list = []  # (offset, size, first, last)
    offsets = {}
    for t in order:
        lo, hi = first[t], last[t]
        conflicts = sorted((o, s) for o, s, f, la in placed if not (la < lo or f > hi))
        offset = 0
        for o, s in conflicts:
            if offset + sizes[t] <= o:
                break
            offset = max(offset, _align(o + s))
        offsets[t] = offset
        placed.append((offset, sizes[t], lo, hi))
    arena = _align(max((offsets[t] + sizes[t] for t in offsets), default=0))
    return MemoryPlan(offsets, sizes, alias, {t: (first[t], last[t]) for t in first}, arena,
                      sum(_align(s) for s in sizes.values()))
