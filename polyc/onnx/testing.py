"""Helpers for tests and benchmarks: the bundled model-zoo "light" models and seeded re-weighting.

(onnxruntime, a test-only dependency, is not imported here; the tests make their own sessions.)

The light models build every weight with ``ConstantOfShape(0.02)``, so their expected outputs are almost
input-independent. :func:`reweight` replaces each such weight with seeded random values scaled per role
(He-scaled Conv/Gemm weights, BatchNormalization scale and variance near 1, small biases) so that a model's
output depends on its input.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper

#: The nine light models shipped in the onnx wheel.
LIGHT_MODELS = ("resnet50", "vgg19", "bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "shufflenet",
                "squeezenet", "zfnet512")


def light_dir() -> str:
    """The ``onnx/backend/test/data/light`` directory of the installed onnx package."""
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")


def light_model_path(name: str) -> str:
    """Path of ``light_NAME.onnx``."""
    return os.path.join(light_dir(), f"light_{name}.onnx")


def light_expected_output(name: str) -> np.ndarray:
    """The expected output ``light_NAME_output_0.pb`` as a numpy array."""
    t = onnx.TensorProto()
    with open(os.path.join(light_dir(), f"light_{name}_output_0.pb"), "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


def _random_weight(rng, shape, op: str, index: int, attrs: dict) -> np.ndarray:
    shape = tuple(int(s) for s in shape)
    if op == "BatchNormalization" and index == 1:  # gamma: below 1 keeps residual sums from exploding
        return rng.uniform(0.4, 0.8, shape)
    if op == "BatchNormalization" and index == 4:  # variance
        return rng.uniform(0.5, 1.5, shape)
    if op == "Mul" and len(shape) <= 1:
        return rng.uniform(0.5, 1.5, shape)
    if len(shape) >= 2 and op in ("Conv", "ConvTranspose"):
        fan_in = int(np.prod(shape[1:]))
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    if len(shape) == 2 and op in ("Gemm", "MatMul"):
        fan_in = shape[1] if op == "Gemm" and attrs.get("transB", 0) else shape[0]
        return rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)
    return rng.standard_normal(shape) * 0.02


def reweight(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` whose ``ConstantOfShape`` weights are initializers of seeded random values."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inits = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    readers = {}
    for node in out.graph.node:
        for k, name in enumerate(node.input):
            readers.setdefault(name, (node, k))
    keep = []
    for node in out.graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shape = inits[node.input[0]]
            reader, index = readers.get(node.output[0], (None, 0))
            # look through Unsqueeze (densenet's per-channel affine) to the real reader
            while reader is not None and reader.op_type in ("Unsqueeze", "Reshape") and index == 0:
                reader, index = readers.get(reader.output[0], (None, 0))
            op = reader.op_type if reader is not None else ""
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in reader.attribute} if reader else {}
            value = _random_weight(rng, shape, op, index, attrs).astype(np.float32)
            out.graph.initializer.append(numpy_helper.from_array(value, node.output[0]))
        else:
            keep.append(node)
    del out.graph.node[:]
    out.graph.node.extend(keep)
    read = {name for node in keep for name in node.input}
    used = [t for t in out.graph.initializer if t.name in read or t.name in {o.name for o in out.graph.output}]
    del out.graph.initializer[:]
    out.graph.initializer.extend(used)
    names = {t.name for t in used}
    inputs = [i for i in out.graph.input if i.name in names or i.name not in inits]
    del out.graph.input[:]
    out.graph.input.extend(inputs)
    out.ir_version = max(out.ir_version, 4)  # initializers need not be graph inputs
    return out


def softmax_inputs(model: onnx.ModelProto) -> list:
    """Names of the tensors that feed Softmax nodes (the logits: more telling to compare than probabilities)."""
    return [n.input[0] for n in model.graph.node if n.op_type in ("Softmax", "LogSoftmax")]


def expose(model: onnx.ModelProto, names) -> onnx.ModelProto:
    """A copy of ``model`` that also returns the tensors ``names`` (typed by onnx shape inference)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    have = {o.name for o in out.graph.output}
    for name in names:
        if name not in have:
            out.graph.output.append(inferred[name])
    return out


def one_node_model(node: onnx.NodeProto, inputs: dict, initializers: dict | None = None,
                   opset: int | None = None) -> onnx.ModelProto:
    """A model of one node: ``inputs`` (name -> array) become typed graph inputs, ``initializers`` constants;
    output types come from onnx shape inference."""
    from onnx import helper

    opset = opset or onnx.defs.onnx_opset_version()
    initializers = initializers or {}
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.asarray(a).dtype), np.shape(a))
           for n, a in inputs.items()]
    inits = [numpy_helper.from_array(np.asarray(a), n) for n, a in initializers.items()]
    outs = [helper.make_empty_tensor_value_info(n) for n in node.output if n]
    graph = helper.make_graph([node], f"one_{node.op_type}", vis, outs, initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = max(4, helper.find_min_ir_version_for(list(model.opset_import)))
    inferred = {vi.name: vi for vi in onnx.shape_inference.infer_shapes(model).graph.value_info}
    typed = [inferred.get(o.name, o) for o in graph.output]
    del model.graph.output[:]
    model.graph.output.extend(typed)
    return model


#: Tolerances onnx's backend tests use for the light models (``onnx.backend.test.loader``, kind "real").
LIGHT_TOLERANCES = {name: (2e-3 if name == "densenet121" else 1e-3, 1e-7) for name in LIGHT_MODELS}


def dummy_input(shape) -> np.ndarray:
    """The input onnx's backend runner feeds the light models: ``arange(n).reshape(shape) / n`` as float32."""
    n = int(np.prod(shape))
    return (np.arange(n).reshape(shape) / n).astype(np.float32)
