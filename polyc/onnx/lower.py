"""Lowering: each fusion group becomes the source text of one TC def.

A group is lowered node by node into a :class:`~polyc.onnx.builder.Builder`. Every tensor value is a
:class:`~polyc.onnx.builder.Val`: a function from index expressions to expression text. Elementwise ops build
values lazily (so ``Conv -> Add(bias) -> Relu`` becomes one expression over the convolution's tensor);
reductions, anchors and data movement write tensors with a statement. At the end each group output is written
("materialized"); when the final statement of an output only reads a same-shaped temporary at the output's own
index, the temporary *becomes* the output and the statement an in-place update::

    def conv_add_relu(float(1,3,224,224) X0, float(64,3,7,7) X1, float(64) X2) -> (float(1,64,112,112) Y0) {
        Y0(i0, i1, i2, i3) +=! (...) ? X0(i0, r0, i2*2+r1-3, i3*2+r2-3) * X1(i1, r0, r1, r2) : 0.0
            where i0 in 0:1, ..., r2 in 0:7
        Y0(i0, i1, i2, i3) = max(Y0(i0, i1, i2, i3) + X2(i1), 0.0)
            where i0 in 0:1, ...
    }

Sizes are integer literals (shapes are static), every index gets an explicit ``where`` range, inputs are
named ``X<k>``, outputs ``Y<k>``, temporaries ``T<k>``, so identical groups give identical text.

float16 and bfloat16 outputs are rounded once per node (:func:`~polyc.onnx.builder.rounded`, see
:mod:`polyc.onnx.builder`).

Converters are plain functions ``convert_<op>(b, node) -> list[Val]`` in :mod:`polyc.onnx.ops`, chosen by opset
through :data:`~polyc.onnx.ops.CONVERTERS` (``(since_version, function)`` pairs, TVM's ``_impl_vN`` idea).
"""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

import networkx as nx
import numpy as np
import onnx

from ..errors import CompileError, PolycError, UnsupportedError
from .builder import STORAGE, Builder, Val, rounded, tc_type
from .fusion import Group
from .load import MIN_OPSET
from .memory import dying_inputs, view_blocks
from .ops import CONVERTERS, check_node, converter
from .sequences import supported_ops as sequence_ops
from .strings import supported_ops as string_ops


@dataclass(frozen=True)
class LoweredKernel:
    """One group as TC text. ``inputs``/``outputs`` are ONNX tensor names in parameter/return order;
    ``constants`` holds extra inputs made by lowering (e.g. Resize index tables), keyed by their names in
    ``inputs``; ``tc_shapes`` the shapes the def declares (a 0-d ONNX output is declared with shape (1,));
    ``inplace`` maps an output to the input whose memory it must use (:func:`fold_residual`: the def
    accumulates onto that input's values, which are no longer a parameter)."""

    group: str
    name: str
    source: str
    inputs: tuple
    outputs: tuple
    constants: dict = field(default_factory=dict, compare=False)
    tc_shapes: dict = field(default_factory=dict, compare=False)
    inplace: dict = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return self.source


# ---- the group lowering --------------------------------------------------------------------------------------

def _def_name(group: Group) -> str:
    ops = [re.sub(r"[^a-z0-9]", "", o.lower()) for o in group.ops]
    name = "_".join(ops[:4]) + ("_etc" if len(ops) > 4 else "")
    return "onnx_" + (name or "kernel")  # a def named like a libm function (pow, exp) would call itself


def _rename(stmts: list, old: str, new: str) -> None:
    pattern = re.compile(rf"\b{re.escape(old)}\b")
    for s in stmts:
        s.text = pattern.sub(new, s.text)
        if s.lhs == old:
            s.lhs = new


def _finish_output(b: Builder, v: Val, name: str, keep=frozenset()) -> None:
    """Write group output ``v`` as tensor ``name``, in place over a temporary when that is possible (never
    over one in ``keep``: the temporaries that are other outputs, as TopK's indices)."""
    if v.tensor is not None and v.tensor.startswith("T") and not any(s.lhs == name for s in b.stmts) \
            and b.temp_dtypes.get(v.tensor, v.dtype) == v.dtype:
        _rename(b.stmts, v.tensor, name)
        return
    b.materialize(v, name=name)
    last = b.stmts[-1]
    shape = v.shape or (1,)
    own = f"({', '.join(f'i{k}' for k in range(len(shape)))})"
    for temp in sorted(set(re.findall(r"\bT\d+\b", last.text))):
        uses = re.findall(rf"\b{temp}\b(\([^()]*\))?", last.text)
        if not all(u == own for u in uses):
            continue
        elsewhere = any(re.search(rf"\b{temp}\b", s.text) and s.lhs != temp for s in b.stmts[:-1])
        written_shape = next((s for s in b.stmts if s.lhs == temp), None)
        if elsewhere or temp in keep or written_shape is None \
                or not _same_ranges(written_shape.text, last.text, len(shape)) \
                or b.temp_dtypes.get(temp) != np.dtype(v.dtype):
            continue
        _rename(b.stmts, temp, name)
        return


def _same_ranges(a: str, b: str, rank: int) -> bool:
    def ranges(text):
        return [m for m in re.findall(r"\bi(\d+) in 0:(\d+)", text)][:rank]
    return ranges(a) == ranges(b)


def _is_empty(g: nx.DiGraph, name: str) -> bool:
    info = g.graph["tensors"].get(name)
    return info is not None and info.shape is not None and 0 in info.shape


def lower_group(g: nx.DiGraph, group: Group, dying: frozenset = frozenset()) -> LoweredKernel | None:
    """The TC def of a kernel group (None for an alias or view group, and for a group whose outputs are all
    empty: their storage, of 0 bytes, is all there is to them). An empty output is not returned by the def.
    ``dying``: the group's inputs whose memory an output may take over (:func:`fold_residual`)."""
    if group.kind in ("alias", "view") or all(_is_empty(g, t) for t in group.outputs):
        return None
    b = Builder(g, group)
    for nid in group.nodes:
        node = g.nodes[nid]
        b.node_id, b.node_op = nid, node["op"]
        fn = converter(node["op"], b.opset)
        if fn is None:
            raise b.error("unsupported operator")
        try:
            outs = fn(b, node)
        except PolycError:
            raise
        except Exception as e:  # a converter's own bug, or onnx's reference evaluator (Resize tables)
            raise CompileError(f"lowering node {nid} ({node['op']}, opset {b.opset}) failed: "
                               f"{type(e).__name__}: {e}") from e
        for name, v in zip(node["outputs"], outs):
            if name and v is not None:
                b.values[name] = rounded(v, getattr(b.tensors.get(name), "dtype", None))
    out_names = []
    returned = tuple(t for t in group.outputs if not _is_empty(g, t))
    outputs_kept = frozenset(b.values[o].tensor for o in returned if b.values[o].tensor)
    for k, onnx_name in enumerate(returned):
        tc = f"Y{k}"
        v, dtype = b.values[onnx_name], np.dtype(b.tensors[onnx_name].dtype)
        if dtype.name in STORAGE:  # already rounded: no float32 temporary may become the output in place
            b.materialize(v, name=tc)
        else:
            _finish_output(b, v, tc, outputs_kept)
        out_names.append(tc)
    tc_shapes = {}
    params = []
    for tc, onnx_name, shape, dtype in b.params:
        dims = f"({','.join(str(d) for d in shape)})" if shape else ""
        params.append(f"{tc_type(dtype)}{dims} {tc}")
        tc_shapes[onnx_name] = shape
    outs = []
    for tc, onnx_name in zip(out_names, returned):
        info = b.tensors[onnx_name]
        shape = info.shape or (1,)
        outs.append(f"{tc_type(info.dtype)}({','.join(str(d) for d in shape)}) {tc}")
        tc_shapes[onnx_name] = shape
    onnx_of = {tc: onnx_name for tc, onnx_name, _, _ in b.params}
    types = {tc: (tuple(shape), np.dtype(dtype)) for tc, _, shape, dtype in b.params}
    types.update({tc: (tuple(b.tensors[o].shape or (1,)), np.dtype(b.tensors[o].dtype))
                  for tc, o in zip(out_names, returned)})
    folded = fold_residual(b.stmts, types, frozenset(tc for tc, o in onnx_of.items() if o in dying))
    params = [text for text, (tc, *_) in zip(params, b.params) if tc not in folded.values()]
    body = "\n".join(f"    {s.text}" for s in b.stmts)
    name = _def_name(group)
    source = f"def {name}({', '.join(params)}) -> ({', '.join(outs)}) {{\n{body}\n}}\n"
    inputs = tuple(p[1] for p in b.params if p[0] not in folded.values())
    inplace = {returned[out_names.index(y)]: onnx_of[x] for y, x in folded.items()}
    return LoweredKernel(group.name, name, source, inputs, returned, dict(b.extra_constants), tc_shapes, inplace)


def lower_groups(g: nx.DiGraph, groups: list) -> list:
    """:func:`lower_group` over every group, in order (None entries for alias and view groups), each with the
    inputs whose memory its outputs may take over (:func:`polyc.onnx.memory.dying_inputs`; none for a group
    that writes an input of a view group: that output's memory is a block of the view's)."""
    dying = dying_inputs(g, groups)
    in_views = set(view_blocks(g, groups))
    return [lower_group(g, gr, frozenset() if in_views & set(gr.outputs) else dying.get(gr.name, frozenset()))
            for gr in groups]


# ---- the supported-op check ------------------------------------------------------------------------------------

#: Ops with no kernel of their own: their output is their input's memory under another shape.
ALIAS_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def supported_ops(opset: int) -> list:
    """The default-domain ops polyc compiles at ``opset``: those with a converter, the alias ops,
    Dropout (removed in inference mode by :func:`~polyc.onnx.passes.remove_identities`), the sequence and
    optional ops resolved at compile time by :mod:`polyc.onnx.sequences` and the string ops the host runs
    (:mod:`polyc.onnx.strings`)."""
    return sorted({op for op in CONVERTERS if converter(op, opset) is not None} | set(ALIAS_OPS) | {"Dropout"}
                  | sequence_ops(opset) | string_ops(opset))


def _grouped(problems: list) -> list:
    """``(key, node, text)`` problems as one line per key, in order of first appearance: the text itself
    when it occurs once, else ``what ×count (first: node ...)``."""
    groups: dict = {}
    for key, node, text in problems:
        groups.setdefault(key, []).append((node, text))
    lines = []
    for key, items in groups.items():
        if len(items) == 1:
            lines.append(items[0][1])
        else:
            lines.append(f"{key} ×{len(items)} (first: {items[0][0]})")
    return lines


def check_supported(g: nx.DiGraph) -> None:
    """Raise :class:`~polyc.errors.UnsupportedError` listing *every* unsupported node and attribute at once.

    Problems are grouped: one line per unsupported operator (``unsupported operator HardSwish ×19 (first:
    node hs_3, opset 17)``), per unsupported attribute value, per unsupported dtype; a problem seen once is
    named with its node. The message ends with the list of supported operators at the model's opset.
    """
    opset = g.graph["opset"]
    problems = []  # (group key, first node, full text)
    if opset < MIN_OPSET:
        text = f"opset {opset} is older than the oldest supported opset {MIN_OPSET}"
        problems.append((text, "", text))
    newest = onnx.defs.onnx_opset_version()
    if opset > newest:
        text = f"opset {opset} is newer than the installed onnx ({newest})"
        problems.append((text, "", text))
    for nid, d in sorted(g.nodes(data=True), key=lambda x: x[1]["order"]):
        if d.get("domain", "") not in ("", "ai.onnx"):
            key = f"unsupported operator {d['domain']}.{d['op']}"
            problems.append((key, f"node {nid}", f"{key} on node {nid}"))
            continue
        if d["op"] in ALIAS_OPS:
            pass
        elif converter(d["op"], opset) is None:
            key = f"unsupported operator {d['op']}"
            problems.append((key, f"node {nid}, opset {opset}", f"{key} on node {nid} (opset {opset})"))
            continue
        for text in check_node(g, nid, d):
            key = re.sub(rf" (on|of) node {re.escape(nid)}\b", "", text)
            key = re.sub(r" \('[^']*'\)", "", key)  # an input's tensor name differs from node to node
            problems.append((key, f"node {nid}", text))
    made_by = {}  # tensor -> the node that makes it, or for a graph input the first node that reads it
    for nid, d in sorted(g.nodes(data=True), key=lambda x: -x[1]["order"]):
        made_by.update({t: f" (input of node {nid}, {d['op']})" for t in d["inputs"] if t})
    for nid, d in g.nodes(data=True):
        made_by.update({t: f" (output of node {nid}, {d['op']})" for t in d["outputs"] if t})
    for name in g.graph["inputs"] + [t for _, d in g.nodes(data=True) for t in d["outputs"] if t]:
        info = g.graph["tensors"].get(name)
        if info is None or info.dtype is None:
            continue
        try:
            tc_type(info.dtype)
        except UnsupportedError:
            kind = "string" if np.dtype(info.dtype).kind in "OUS" else np.dtype(info.dtype).name
            problems.append((f"unsupported dtype {kind}", f"tensor {name!r}{made_by.get(name, '')}",
                             f"tensor {name!r}{made_by.get(name, '')} has dtype {kind}, which polyc does not "
                             "support"))
    if problems:
        lines = _grouped(problems)
        ops = supported_ops(opset)
        known = textwrap.fill(", ".join(ops), width=108, initial_indent="    ", subsequent_indent="    ")
        raise UnsupportedError(f"the model uses {len(lines)} unsupported feature(s):\n  " + "\n  ".join(lines)
                               + f"\npolyc supports {len(ops)} operators at opset {opset}:\n{known}")


_STATEMENT = re.compile(r"^(\w+)\(([^()]*)\) (\S+) (.*)\n\s*where (.*)$", re.S)
_TOKEN = re.compile(r"\s*(?:([A-Za-z_]\w*)|(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)|(\S))")


def fold_residual(stmts: list, types: dict, dying: frozenset) -> dict:
    """Fold a residual Add into the reduction that produces an output (onnxruntime's Conv + Sum fusion,
    MLAS's ``beta = 1``); returns ``{output: input}`` for the outputs folded (TC names), ``stmts`` (the
    Builder's) rewritten in place.

    An output ``Y`` written exactly twice, by a reduction ``Y(i...) +=! R`` and then an epilogue ``Y(i...) =
    f(... (Y(i...) + ... + X(i...)) ...)`` over the same ranges, whose ``+`` chain holds ``X(i...)``: an input
    in ``dying`` (its memory is free once this kernel has read it) of ``Y``'s shape and dtype (``types``: TC
    name -> (shape, dtype)), read nowhere else. The def then accumulates onto ``X``'s values (``Y(i...) +=
    R``, ``X`` dropped from the chain; the caller drops the parameter) and the caller must give ``Y`` the
    memory ``X`` is in (:func:`polyc.onnx.memory.plan_memory`'s ``inplace``): ``f(R + ... + X)`` with ``X``
    added first instead of last (a different rounding of the same sum). The output then needs no memory of
    its own, which it would first fetch from memory to write (a 56x56x256 residual convolution of ResNet-50:
    0.59 -> 0.42 ms once its output's lines were in cache), and the kernel reads one tensor fewer."""
    folded: dict = {}
    if not dying:
        return folded
    for out in sorted({s.lhs for s in stmts}):
        writers = [k for k, s in enumerate(stmts) if s.lhs == out]
        if out not in types or len(writers) != 2:
            continue
        red, epi = (_STATEMENT.match(stmts[k].text) for k in writers)
        if red is None or epi is None or red.group(3) != "+=!" or epi.group(3) != "=" \
                or red.group(2) != epi.group(2) or not _same_ranges(red.group(5), epi.group(5), len(types[out][0])) \
                or any(re.search(rf"\b{out}\b", stmts[k].text) for k in range(writers[0] + 1, writers[1])):
            continue
        own = f"{out}({epi.group(2)})"
        rhs = epi.group(4)
        if rhs.count(f"{out}(") != 1:
            continue
        for x in sorted(dying - set(folded.values())):
            term = f"{x}({epi.group(2)})"
            if types.get(x) != types[out] or sum(len(re.findall(rf"\b{x}\b", s.text)) for s in stmts) != 1 \
                    or term not in rhs:
                continue
            new_rhs = _drop_term(rhs, own, term)
            if new_rhs is None:
                continue
            stmts[writers[0]].text = stmts[writers[0]].text.replace(" +=! ", " += ", 1)
            if new_rhs == own:  # the epilogue was the Add alone
                del stmts[writers[1]]
            else:
                stmts[writers[1]].text = f"{own} = {new_rhs}\n        where {epi.group(5)}"
            folded[out] = x
            break
    return folded


def _drop_term(text: str, own: str, term: str) -> str | None:
    """``text`` (an expression as the Builder writes it: each binary operation in parentheses) with ``term``
    removed from the ``+`` chain that holds ``own`` as a term too; None when there is no such chain."""
    tokens, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            return None
        tokens.append((m.group(m.lastindex), m.start(m.lastindex), m.end()))
        pos = m.end()
    spans: dict = {}  # start of a parenthesized '+' node -> (end, [term spans])

    def parse(i):  # one operand from token i: (start, end, next token, terms or None)
        if i >= len(tokens):
            raise ValueError
        tok, start, end = tokens[i]
        if tok == "(":
            items, i = [], i + 1
            while tokens[i][0] != ")":
                if tokens[i][0] in "+-*/%<>=!&|?:,":
                    items.append(tokens[i][0])
                    i += 1
                else:
                    s, e, i, terms = parse(i)
                    items.append((s, e, terms))
            end = tokens[i][2]
            if len(items) == 3 and items[1] == "+":
                terms = (items[0][2] or [items[0][:2]]) + (items[2][2] or [items[2][:2]])
                spans[start] = (end, terms)
                return start, end, i + 1, terms
            return start, end, i + 1, None
        if i + 1 < len(tokens) and tokens[i + 1][0] == "(" and (tok[0].isalpha() or tok[0] == "_"):
            i += 2
            while tokens[i][0] != ")":
                if tokens[i][0] == ",":
                    i += 1
                    continue
                _, _, i, _ = parse_seq(i)
            return start, tokens[i][2], i + 1, None
        return start, end, i + 1, None

    def parse_seq(i):  # operands and operators up to a ',' or ')' at this depth
        start = tokens[i][1]
        end = start
        while i < len(tokens) and tokens[i][0] not in ",)":
            if tokens[i][0] in "+-*/%<>=!&|?:":
                i += 1
                continue
            _, end, i, _ = parse(i)
        return start, end, i, None

    try:
        parse_seq(0)
    except (ValueError, IndexError):
        return None
    for start, (end, terms) in sorted(spans.items()):  # outermost first: a chain's root
        texts = [text[s:e] for s, e in terms]
        if own in texts and term in texts:
            rest = [t for t in texts if t != term]
            chain = rest[0]
            for t in rest[1:]:
                chain = f"({chain} + {t})"
            return text[:start] + chain + text[end:]
    return None
