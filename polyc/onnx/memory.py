"""Static memory planning: the intermediate tensors of a compiled model share one arena.

Each tensor written by a kernel group lives from the group that writes it to the last group that reads it
(or to the end for graph outputs). Alias groups (Reshape, Flatten, Squeeze, Unsqueeze, Identity) make no new
tensor: their output is a view of their input's memory and extends its lifetime. View groups (a Concat whose
inputs are contiguous blocks of its output, :func:`concat_views`) make no copy: each input is written by its
producer straight into its block of the output, a view at a byte offset, and the output lives from the first
of those writes. Offsets are assigned greedily by size (largest first, each at the lowest 64-byte-aligned
offset that does not overlap a tensor alive at the same time), the strategy of TFLite's arena planner.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import networkx as nx
import numpy as np

ALIGN = 64


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class MemoryPlan:
    """``offsets``: root tensor -> byte offset in the arena; ``alias``: view tensor -> the tensor whose memory
    it is in; ``lifetimes``: root -> (first group index, last group index); ``arena_bytes``: the arena's size;
    ``total_bytes``: what the intermediates would take without sharing; ``view_offsets``: view tensor -> its
    byte offset in the tensor ``alias`` names (a Concat input in its output, :func:`concat_views`; absent: 0)."""

    offsets: dict
    sizes: dict
    alias: dict
    lifetimes: dict
    arena_bytes: int
    total_bytes: int = field(default=0)
    view_offsets: dict = field(default_factory=dict)

    def root(self, tensor: str) -> str:
        """The tensor whose memory ``tensor`` uses (itself unless it is an alias)."""
        return _root(self.alias, tensor)

    def byte_offset(self, tensor: str) -> int:
        """Where ``tensor`` starts in its root's memory, in bytes (0 but for the inputs of a Concat view)."""
        offset = 0
        while tensor in self.alias:
            offset += self.view_offsets.get(tensor, 0)
            tensor = self.alias[tensor]
        return offset

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
    # a view group's inputs are in its output's memory before their producers run
    alias = {t: out for t, (out, _) in view_blocks(g, groups).items()}
    first, last = {}, {}

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
            r = root(t)  # t itself, or the Concat output t is a block of (written from its first block on)
            first.setdefault(r, k)
            last[r] = max(last.get(r, k), k)
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
    (a view of) a tensor some kernel wrote, read for the last time by this group, and no other input of the
    group shares its memory (a Reshape of it, or the Concat output it is a block of: an in-place output would
    overwrite what the kernel still reads through that one). Such an input's memory may become the memory of
    an output of the same shape and dtype (an in-place update, :func:`plan_memory`'s ``inplace``)."""
    _, alias, first, last = _liveness(g, groups, {}, {})
    dying = {}
    for k, gr in enumerate(groups):
        if gr.kind != "kernel":
            continue
        roots = [_root(alias, t) for t in gr.inputs]
        dying[gr.name] = frozenset(t for t, r in zip(gr.inputs, roots)
                                   if r in first and last[r] == k and roots.count(r) == 1)
    return dying


def concat_views(g: nx.DiGraph, groups: list) -> list:
    """``groups`` with each Concat that can be done without a copy turned into a ``"view"`` group.

    A Concat qualifies when its inputs are contiguous blocks of its output (every dimension before the axis is
    1: channels of a batch-1 NCHW tensor, as in DenseNet's blocks) and each input is a distinct, non-empty
    tensor of the output's dtype that a kernel group (or another view group) writes, that no graph output
    is, and that no other view takes. Its producers then write each input straight into its block of the
    output (:func:`plan_memory` makes it a view at a byte offset, :func:`view_blocks`), so the Concat runs no
    kernel: OpenVINO's in-place concatenation. A kernel group writing such an input does not also take a
    dying input's memory (:func:`polyc.onnx.lower.lower_groups`).
    """
    tensors = g.graph["tensors"]
    producer = {t: gr for gr in groups for t in gr.outputs}
    outputs = set(g.graph["outputs"])
    taken: set = set()
    result = []
    for gr in groups:
        node = g.nodes[gr.nodes[0]] if len(gr.nodes) == 1 else None
        if gr.kind != "kernel" or node is None or node["op"] != "Concat" or "axis" not in node["attrs"]:
            result.append(gr)
            continue
        out = tensors.get(node["outputs"][0])
        parts = list(node["inputs"])
        infos = [tensors.get(t) for t in parts]
        ok = out is not None and out.shape is not None and all(i is not None and i.shape is not None for i in infos)
        if ok:
            axis = int(node["attrs"]["axis"]) % len(out.shape)
            ok = (all(d == 1 for d in out.shape[:axis]) and len(set(parts)) == len(parts)
                  and not taken & set(parts)
                  and all(np.dtype(i.dtype) == np.dtype(out.dtype) and i.nbytes > 0 for i in infos)
                  and all(t not in outputs and t in producer and producer[t].kind in ("kernel", "view")
                          for t in parts))
        if not ok:
            result.append(gr)
            continue
        taken.update(parts)
        result.append(dataclasses.replace(gr, kind="view"))
    return result


def view_blocks(g: nx.DiGraph, groups: list) -> dict:
    """Input tensor of a view group -> ``(the group's output, its byte offset in it)`` (:func:`concat_views`)."""
    blocks = {}
    for gr in groups:
        if gr.kind == "view":
            node = g.nodes[gr.nodes[0]]
            at = 0
            for t in node["inputs"]:
                blocks[t] = (node["outputs"][0], at)
                at += g.graph["tensors"][t].nbytes
    return blocks


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
    views = {t: at for t, (_, at) in view_blocks(g, groups).items()}
    return MemoryPlan(offsets, sizes, alias, {t: (first[t], last[t]) for t in first}, arena,
                      sum(_align(s) for s in sizes.values()), views)
