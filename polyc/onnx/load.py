"""Load an ONNX model: read it, run the checker and strict shape inference, pin dynamic input dims.

The result of :func:`load_model` is a checked :class:`onnx.ModelProto` whose graph inputs all have static
shapes and whose ``value_info`` carries the shapes onnx could infer. The opset is read from the model's
``opset_import`` by :func:`model_opset`.
"""
from __future__ import annotations

import os
from typing import Mapping, Sequence, Union

import onnx
from onnx import shape_inference

from ..errors import PolycError, ShapeError, UnsupportedError

ModelLike = Union[str, os.PathLike, bytes, onnx.ModelProto]


class ModelError(PolycError):
    """The model file is unreadable or fails onnx's checker or shape inference."""


def model_opset(model: onnx.ModelProto) -> int:
    """The version of the default ("" or "ai.onnx") domain in ``model.opset_import``."""
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            return int(imp.version)
    raise ModelError("the model imports no version of the default ONNX domain (opset_import)")


def _read(model: ModelLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        copy = onnx.ModelProto()
        copy.CopyFrom(model)
        return copy
    if isinstance(model, bytes):
        return onnx.load_model_from_string(model)
    try:
        return onnx.load(os.fspath(model))
    except Exception as e:  # OSError, protobuf's DecodeError and friends
        raise ModelError(f"cannot read ONNX model {model!r}: {e}") from e


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs that are real inputs (not initializers listed as inputs, as IR < 4 models do)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


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


def _pin_inputs(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> None:
    names = {i.name: i for i in graph_inputs(model)}
    for name, shape in input_shapes.items():
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
        if any(d == 0 for d in dims):
            raise UnsupportedError(f"input {vi.name!r} has shape {tuple(dims)}: zero-size tensors are not supported")
        if any(not isinstance(d, int) for d in dims):
            shown = ", ".join(str(d) for d in dims)
            example = ", ".join(str(d) if isinstance(d, int) else "1" for d in dims)
            raise ShapeError(f"input {vi.name!r} has a dynamic shape ({shown}); polyc compiles for static shapes",
                             hint=f'pin it with input_shapes={{"{vi.name}": ({example},)}}')


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


def infer_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """onnx shape inference in strict mode with data propagation; errors become :class:`ModelError`."""
    try:
        return shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    except Exception as e:
        raise ModelError(f"onnx shape inference failed: {e}") from e


def load_model(model: ModelLike, input_shapes: Mapping[str, Sequence[int]] | None = None) -> onnx.ModelProto:
    """Read ``model`` (a path, serialized bytes or a ModelProto, which is copied), check and shape-infer it.

    ``input_shapes`` pins dynamic input dims: ``{"data": (1, 3, 224, 224)}``. A dynamic input dim that is
    not pinned raises :class:`~polyc.errors.ShapeError` naming the input.
    """
    proto = _read(model)
    for imp in proto.opset_import:
        if imp.domain not in ("", "ai.onnx"):
            used = sorted({n.op_type for n in proto.graph.node if n.domain == imp.domain})
            if used:
                raise UnsupportedError(f"operators of domain {imp.domain!r} are not supported: {', '.join(used)}")
    _check_defined(proto)
    try:
        onnx.checker.check_model(proto)
    except Exception as e:
        raise ModelError(f"onnx checker rejected the model: {e}") from e
    if input_shapes:
        _pin_inputs(proto, input_shapes)
    _check_static_inputs(proto)
    model_opset(proto)
    return infer_shapes(proto)
