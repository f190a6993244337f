"""Load an ONNX model: read it, run the checker and strict shape inference, pin dynamic input dims.

The result of :func:`load_model` is a checked :class:`onnx.ModelProto` whose graph inputs all have static
shapes and whose ``value_info`` carries the shapes onnx could infer. The opset is read from the model's
``opset_import`` by :func:`model_opset`.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence, Union

import numpy as np
import onnx
from onnx import shape_inference

from ..errors import PolycError, ShapeError, UnsupportedError

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]

#: Oldest default-domain opset the converters handle (older models are converted up to it).
MIN_OPSET = 7


class ModelError(PolycError):
    """The model is unreadable or invalid: onnx's checker or shape inference rejects it, or a node's shapes
    do not fit its op (:mod:`polyc.onnx.validate`). The message names the node where there is one."""


def model_opset(model: onnx.ModelProto) -> int:
    """The version of the default ("" or "ai.onnx") domain in ``model.opset_import``."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ModelError("the model imports no version of the default ONNX domain (opset_import)")


def read_model(model: ModelLike) -> onnx.ModelProto:
    """``model`` as a ModelProto of its own: a copy of a ModelProto, or parsed from serialized bytes or a path.

    Raises :class:`ModelError` when the file cannot be read or the bytes are not an ONNX model (a truncated
    file, another format), and :class:`~polyc.errors.UnsupportedError` for any other type of argument.
    """
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, (bytes, bytearray, memoryview)):
        what = f"{len(model)} bytes"
        load = lambda: onnx.load_model_from_string(bytes(model))  # noqa: E731
    elif isinstance(model, (str, os.PathLike)):
        what = repr(os.fspath(model))
        load = lambda: onnx.load(os.fspath(model))  # noqa: E731
    else:
        raise UnsupportedError(f"cannot compile a {type(model).__name__}: pass an onnx.ModelProto, the "
                               "serialized model (bytes) or the path of a .onnx file")
    try:
        proto = load()
    except Exception as e:  # OSError, protobuf's DecodeError and friends
        raise ModelError(f"cannot read ONNX model {what}: {type(e).__name__}: {e}",
                         hint="is it a complete .onnx file? (truncated or another format)") from e
    if not proto.HasField("graph"):
        raise ModelError(f"{what} is not an ONNX model: it has no graph",
                         hint="is it a complete .onnx file? (truncated or another format)")
    return proto


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are real inputs (not initializers listed as inputs, as IR < 4 models do)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def overridable_initializers(model: onnx.ModelProto) -> dict:
    """Initializers that a feed may override: name -> TensorProto.

    Per the ONNX IR spec (IR version 4 and later) an initializer that is also listed in ``graph.input`` is
    only a default value for that input; onnxruntime lets a feed replace it. In older IR versions every
    initializer had to be listed as an input and is a constant (onnxruntime's rule too), so none is returned.
    """
    if model.ir_version < 4:
        return {}
    listed = {i.name for i in model.graph.input}
    return {t.name: t for t in model.graph.initializer if t.name in listed}


def feed_initializers(model: onnx.ModelProto, inputs=(), values: Mapping | None = None) -> onnx.ModelProto:
    """A copy of ``model`` where the initializers named in ``inputs`` become real graph inputs (their declared
    input type gets the initializer's shape when it has none) and those in ``values`` (name -> numpy array)
    take the given value instead of their default. Both must name overridable initializers."""
    from onnx import numpy_helper

    values = dict(values or {})
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: t for t in out.graph.initializer}
    kept = []
    for t in out.graph.initializer:
        if t.name in inputs:
            continue
        if t.name in values:
            t = numpy_helper.from_array(values[t.name], t.name)
        kept.append(t)
    for vi in out.graph.input:
        dims = _dims(vi)
        if vi.name in inputs and (dims is None or not all(isinstance(d, int) for d in dims)):
            vi.type.tensor_type.shape.Clear()
            vi.type.tensor_type.shape.SetInParent()
            for d in inits[vi.name].dims:
                vi.type.tensor_type.shape.dim.add().dim_value = int(d)
    del out.graph.initializer[:]
    out.graph.initializer.extend(kept)
    return out


def _dims(vi: onnx.ValueInfoProto) -> list:
    """Dims of a value info: int for a known extent, str (the dim_param or '?') otherwise."""
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    out = []
    for d in t.shape.dim:
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            out.append(d.dim_param or "?")
    return out


def _shape_arg(name: str, shape) -> tuple:
    """``input_shapes[name]`` as a tuple of non-negative ints (0: an empty tensor), else ShapeError saying
    what is wrong."""
    def dim(d):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer, float, np.floating)) or int(d) != d:
            raise ValueError(d)
        return int(d)
    try:
        dims = tuple(dim(d) for d in shape)
    except (TypeError, ValueError, OverflowError):
        raise ShapeError(f"input_shapes[{name!r}] = {shape!r} is not a sequence of integer extents",
                         hint=f'write it as input_shapes={{"{name}": (1, 3, 224, 224)}}') from None
    if any(d < 0 or d >= 1 << 62 for d in dims):
        raise ShapeError(f"input_shapes[{name!r}] = {dims}: every extent must be at least 0 (and below 2**62)")
    return dims


def _pin_inputs(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
    names = {i.name: i for i in graph_inputs(model)}
    if not isinstance(input_shapes, Mapping):
        raise ShapeError(f"input_shapes must map input names to shapes, not a {type(input_shapes).__name__}",
                         hint='write it as input_shapes={"x": (1, 3, 224, 224)}')
    for name, shape in input_shapes.items():
        shape = _shape_arg(name, shape)
        if name not in names:
            raise ShapeError(f"input_shapes names {name!r}, which is not an input of the model "
                             f"(inputs: {', '.join(names) or 'none'})")
        t = names[name].type.tensor_type
        old = _dims(names[name])
        if old is not None and len(old) != len(shape):
            raise ShapeError(f"input_shapes[{name!r}] = {tuple(shape)} has rank {len(shape)}, "
                             f"but the model declares rank {len(old)} {tuple(old)}")
        if old is not None:
            for o, s in zip(old, shape):
                if isinstance(o, int) and o != int(s):
                    raise ShapeError(f"input_shapes[{name!r}] = {tuple(shape)} contradicts the model's "
                                     f"static shape {tuple(old)}")
        t.shape.Clear()
        for s in shape:
            t.shape.dim.add().dim_value = int(s)


def _check_static_inputs(model: onnx.ModelProto) -> None:
    for vi in graph_inputs(model):
        dims = _dims(vi)
        if dims is None:
            raise ShapeError(f"input {vi.name!r} has no shape in the model",
                             hint=f'pin it with input_shapes={{"{vi.name}": (...)}}')
        if any(not isinstance(d, int) for d in dims):
            shown = ", ".join(str(d) for d in dims)
            example = ", ".join(str(d) if isinstance(d, int) else "1" for d in dims)
            raise ShapeError(f"input {vi.name!r} has a dynamic shape ({shown}); polyc compiles for static shapes",
                             hint=f'pin it with input_shapes={{"{vi.name}": ({example},)}}')


def _type_text(type_proto: onnx.TypeProto) -> str:
    """``seq(tensor(float))``, ``optional(tensor(int64))``, ``map(string, float)``: ONNX's type notation."""
    kind = type_proto.WhichOneof("value")
    if kind == "tensor_type":
        elem = onnx.TensorProto.DataType.Name(type_proto.tensor_type.elem_type).lower()
        return f"tensor({elem})"
    if kind == "sparse_tensor_type":
        return "sparse_tensor"
    if kind == "sequence_type":
        return f"seq({_type_text(type_proto.sequence_type.elem_type)})"
    if kind == "optional_type":
        return f"optional({_type_text(type_proto.optional_type.elem_type)})"
    if kind == "map_type":
        key = onnx.TensorProto.DataType.Name(type_proto.map_type.key_type).lower()
        return f"map({key}, {_type_text(type_proto.map_type.value_type)})"
    return "an undeclared type"


def check_tensor_types(model: onnx.ModelProto) -> None:
    """Raise :class:`~polyc.errors.UnsupportedError` naming every graph input and output that is not a
    tensor (a sequence, an optional, a map, a sparse tensor): polyc compiles tensor programs only."""
    problems = []
    for where, values in (("input", graph_inputs(model)), ("output", model.graph.output)):
        for vi in values:
            if vi.type.WhichOneof("value") != "tensor_type":
                problems.append(f"{where} {vi.name!r} has type {_type_text(vi.type)}")
    if problems:
        raise UnsupportedError("; ".join(problems) + ": polyc compiles tensors only (no sequences, optionals, "
                               "maps or sparse tensors)")


def _check_defined(model: onnx.ModelProto) -> None:
    """Every tensor a node reads is a graph input, an initializer or an earlier node's output."""
    known = {i.name for i in model.graph.input} | {t.name for t in model.graph.initializer} | {""}
    missing = []
    for index, node in enumerate(model.graph.node):
        for name in node.input:
            if name not in known:
                label = node.name or f"{node.op_type}_{index}"
                missing.append(f"node {label} ({node.op_type}) reads tensor {name!r}, which no graph input, "
                               "initializer or earlier node provides")
        known.update(node.output)
    if missing:
        raise ModelError("; ".join(missing), hint="a missing initializer? check the model's initializer list")


#: Ops that broadcast B onto A by the ``broadcast``/``axis`` attributes before opset 7.
LEGACY_BROADCAST = {"Add", "Sub", "Mul", "Div", "Pow", "And", "Or", "Xor", "Equal", "Greater", "Less"}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _legacy_axis_to_suffix(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of an opset < 7 model whose ``broadcast=1, axis=k`` binary nodes read B through an Unsqueeze
    that appends B's missing trailing dims, so B lines up with A's suffix and ``axis`` can go.

    Before opset 7 (ONNX spec, Add-6 and its kin) B of rank r broadcasts onto A's dims ``axis .. axis+r-1``;
    onnx 1.23's version converter compares B with A's leading dims instead and rejects such a node. A
    PRelu-6 slope of rank 1 is per channel, so it gets the same treatment with axis 1. Nodes whose ranks
    are unknown are left as they are."""
    try:
        inferred = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - the converter reports what is wrong
        return model
    ranks = {t.name: len(t.dims) for t in model.graph.initializer}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape"):
            ranks.setdefault(vi.name, len(vi.type.tensor_type.shape.dim))
    out = _copy(model)
    nodes, names = [], {n for node in model.graph.node for n in list(node.input) + list(node.output)}
    for node in out.graph.node:
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "PRelu" and len(node.input) == 2 and ranks.get(node.input[0], 0) > 2 \
                and ranks.get(node.input[1]) == 1:
            # PRelu-6: a slope of C values is per channel (axis 1), as if it were given axis=1
            attrs["axis"] = onnx.helper.make_attribute("axis", 1)
            attrs["broadcast"] = onnx.helper.make_attribute("broadcast", 1)
        if node.op_type in LEGACY_BROADCAST | {"PRelu"} and "axis" in attrs and attrs.get("broadcast") is not None \
                and attrs["broadcast"].i == 1 and len(node.input) == 2 and node.input[0] in ranks \
                and node.input[1] in ranks:
            a_rank, b_rank = ranks[node.input[0]], ranks[node.input[1]]
            axis = attrs["axis"].i + (a_rank if attrs["axis"].i < 0 else 0)
            trailing = a_rank - axis - b_rank
            if 0 <= axis and trailing >= 0:
                if trailing:
                    name, k = f"{node.input[1]}_suffix", 0
                    while name in names:
                        k += 1
                        name = f"{node.input[1]}_suffix{k}"
                    names.add(name)
                    nodes.append(onnx.helper.make_node("Unsqueeze", [node.input[1]], [name],
                                                       axes=list(range(b_rank, b_rank + trailing))))
                    node.input[1] = name
                keep = [a for a in node.attribute if a.name != "axis"]
                del node.attribute[:]
                node.attribute.extend(keep)
        nodes.append(node)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def _supported_opset(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` when its default-domain opset is one polyc supports; an older one (1 to 6) converted with
    ``onnx.version_converter`` up to :data:`MIN_OPSET`, or else to the oldest newer opset it converts to
    cleanly (the converter succeeds and onnx's checker accepts the result); else
    :class:`~polyc.errors.UnsupportedError` naming the opset and the converter's reason."""
    opset = model_opset(model)
    newest = onnx.defs.onnx_opset_version()
    supported = f"polyc supports opsets {MIN_OPSET} to {newest} (the installed onnx's newest)"
    if opset > newest:
        raise UnsupportedError(f"the model's opset {opset} is newer than {supported}",
                               hint="re-export the model with an older opset")
    if opset >= MIN_OPSET:
        return model
    if opset < 1:
        raise ModelError(f"the model's opset {opset} is not a valid ONNX opset; {supported}")
    from onnx import version_converter
    model = _legacy_axis_to_suffix(model)
    # the converter sees only initializers that are also graph inputs (as IR version 3 required)
    listed = {i.name for i in model.graph.input}
    unlisted = [t for t in model.graph.initializer if t.name not in listed]
    if unlisted:
        model = _copy(model)
        model.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                 for t in unlisted)
    first = None
    for target in range(MIN_OPSET, newest + 1):
        try:
            converted = version_converter.convert_version(model, target)
            if unlisted and converted.ir_version >= 4:  # IR 3 wants every initializer listed
                names = {t.name for t in unlisted}
                kept = [i for i in converted.graph.input if i.name not in names]
                del converted.graph.input[:]
                converted.graph.input.extend(kept)
            onnx.checker.check_model(converted)
            return converted
        except Exception as e:  # noqa: BLE001 - the C++ adapters raise RuntimeError, ValueError, checker errors
            first = first or e
    reason = " ".join(str(first).split())[:400]
    raise UnsupportedError(f"the model's opset {opset} is older than {supported}, and onnx's version converter "
                           f"could not convert it to opset {MIN_OPSET} or newer: {reason}",
                           hint=f"re-export the model with opset {MIN_OPSET} or newer") from first


#: Initializers of more elements than this are handed to onnx's shape inference as typed graph inputs, without
#: their values (the values of shapes, axes and indices that data propagation reads are far smaller).
INFER_MAX_VALUES = 1024


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the shapes onnx infers (shape inference in strict mode with data propagation) in its
    graph's ``value_info``, outputs and nodes (subgraphs); errors become :class:`ModelError`.

    onnx serializes the model it infers and parses the result back: for ResNet-50's 100 MB of weights that was
    a fifth of a warm compile. Initializers of more than :data:`INFER_MAX_VALUES` elements go to onnx as typed
    graph inputs instead, and the inferred graph's parts are copied into ``model`` (a model of the caller's
    own: it is changed in place and returned)."""
    heavy = [t for t in model.graph.initializer if int(np.prod(t.dims, dtype=np.int64)) > INFER_MAX_VALUES]
    light = model
    if heavy:
        names = {t.name for t in heavy}
        listed = {i.name for i in model.graph.input}
        graph = onnx.helper.make_graph(
            model.graph.node, model.graph.name,
            list(model.graph.input) + [onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                       for t in heavy if t.name not in listed],
            model.graph.output, [t for t in model.graph.initializer if t.name not in names],
            value_info=model.graph.value_info, sparse_initializer=model.graph.sparse_initializer)
        light = onnx.helper.make_model(graph, ir_version=model.ir_version, opset_imports=model.opset_import,
                                       functions=model.functions)
    try:
        inferred = shape_inference.infer_shapes(light, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ModelError(f"onnx shape inference failed: {e}") from e
    if not heavy:
        return inferred
    for field in ("node", "value_info", "output"):
        model.graph.ClearField(field)
        getattr(model.graph, field).extend(getattr(inferred.graph, field))
    return model


def load_model(model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """Read ``model`` (a path, serialized bytes or a ModelProto, which is copied), check and shape-infer it.

    ``input_shapes`` pins dynamic input dims: ``{"data": (1, 3, 224, 224)}``. A dynamic input dim that is
    not pinned raises :class:`~polyc.errors.ShapeError` naming the input.
    """
    proto = read_model(model)
    for imp in proto.opset_import:
        if imp.domain not in ("", "ai.onnx"):
            used = [f"{n.name or f'{n.op_type}_{k}'} ({n.op_type})" for k, n in enumerate(proto.graph.node)
                    if n.domain == imp.domain]
            if used:
                raise UnsupportedError(f"operators of domain {imp.domain!r} are not supported, used by node(s) "
                                       f"{', '.join(used[:10])}" + (" ..." if len(used) > 10 else ""))
    check_tensor_types(proto)
    proto = _supported_opset(proto)
    _check_defined(proto)
    if not proto.graph.output:
        raise ModelError("the model's graph has no outputs: there is nothing to compute",
                         hint="list the tensors to compute in graph.output")
    try:
        onnx.checker.check_model(proto)
    except Exception as e:
        raise ModelError(f"onnx checker rejected the model: {e}") from e
    if input_shapes:
        _pin_inputs(proto, input_shapes)
    _check_static_inputs(proto)
    model_opset(proto)
    return infer_shapes(proto)
