"""The native executor: a whole model as one LLVM module with a generated entry point."""
import os
from pathlib import Path

import numpy as np
import pytest

import polyc.onnx as ponnx
from polyc.onnx.native import NativeExecutor
from polyc.onnx.testing import light_model_path, reweight

import onnxruntime  # noqa: E402  (a test dependency: a missing install must fail, not skip)


# a whole shufflenet (25 s): test_native_compile_lowers_each_kernel_once_and_jits_per_kernel_only_for_the_python_executor
# checks the same on a small model (native = Python executor bit for bit, onnxruntime, reload from the disk cache)
@pytest.mark.slow
def test_native_matches_the_python_executor_and_onnxruntime_and_reloads_from_cache(tmp_path, monkeypatch):
    import onnx

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))  # weights are data: another test's shufflenet hits

    model = reweight(onnx.load(light_model_path("shufflenet")), seed=3)
    compiled = ponnx.compile(model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(compiled.input_shapes[0]).astype(np.float32)
    feeds = compiled.check_feeds({compiled.input_names[0]: x})
    program = compiled.executor.program
    native = compiled.executor
    assert isinstance(native, NativeExecutor)  # the default
    python_side = [a for a in ponnx.executor.PythonExecutor(program).run(feeds)]
    got = native.run(feeds)
    for a, b in zip(got, python_side):
        np.testing.assert_array_equal(a, b)  # the same kernels, the same order: bit-identical
    session = onnxruntime.InferenceSession(model.SerializeToString())
    expected = session.run(None, {compiled.input_names[0]: x})
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    again = NativeExecutor(program)
    assert again.native.from_cache and not native.native.from_cache
    np.testing.assert_array_equal(again.run(feeds)[0], got[0])


def tiny_model(seed: int = 0):
    """Conv+Relu twice with the same shapes (one def, two calls), Flatten, Gemm: three calls, two defs."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c2"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
                              [init("w1", 4, 4, 3, 3), init("b1", 4), init("w2", 4, 4, 3, 3), init("b2", 4),
                               init("wf", 10, 144), init("bf", 10)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8  # what onnxruntime reads
    return model


def stage_counts(stderr: str) -> dict:
    """How many times each stage ran, from the ``[polyc] <stage>: <ms> ms`` lines of POLYC_TIME_STAGES=1."""
    import collections
    import re

    return collections.Counter(re.findall(r"^\[polyc\] (\w+): [0-9.]+ ms$", stderr, re.MULTILINE))


def test_native_compile_lowers_each_kernel_once_and_jits_per_kernel_only_for_the_python_executor(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))  # cold
    monkeypatch.setenv("POLYC_TIME_STAGES", "1")  # each pipeline stage prints one line when it runs
    model = tiny_model()
    capsys.readouterr()
    compiled = ponnx.compile(model)
    cold = stage_counts(capsys.readouterr().err)
    assert isinstance(compiled.executor, NativeExecutor)
    distinct = len({s.kernel.source for s in compiled.steps})
    # the two convolutions share one def, and so do the two Pad kernels in front of them (explicit padding)
    assert (len(compiled.steps), distinct) == (5, 3)
    assert cold["ast"] == distinct  # each distinct kernel lowered once, to an object of its own
    assert cold["jit"] == 0 and cold["link"] == 1  # no kernel JIT-compiled on its own; one link of the objects

    x = np.random.default_rng(1).standard_normal((1, 4, 6, 6)).astype(np.float32)
    got = compiled.run({"x": x})
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-4, atol=1e-5)

    warm = ponnx.compile(model)  # from the disk cache: nothing lowered, nothing compiled
    assert not any(stage_counts(capsys.readouterr().err).values())
    assert warm.executor.native.from_cache
    np.testing.assert_array_equal(warm.run({"x": x})[0], got[0])

    # per-kernel code is made only when the Python-driven executor needs it: once per distinct kernel
    assert len(compiled.profile({"x": x})) == 5
    assert stage_counts(capsys.readouterr().err)["jit"] == distinct
    python_side = ponnx.executor.PythonExecutor(compiled.executor.program)
    np.testing.assert_array_equal(python_side.run(compiled.check_feeds({"x": x}))[0], got[0])
    assert stage_counts(capsys.readouterr().err)["jit"] == 0  # already compiled, kept by the kernels

    monkeypatch.setenv("POLYC_EXECUTOR", "python")
    debug_model = ponnx.compile(model)
    assert isinstance(debug_model.executor, ponnx.executor.PythonExecutor)
    assert stage_counts(capsys.readouterr().err)["link"] == 0  # the Python executor links nothing
    np.testing.assert_array_equal(debug_model.run({"x": x})[0], got[0])


def test_constant_weights_are_packed_once_and_give_the_same_bits(tmp_path, monkeypatch):
    """Weights the strategy packs arrive packed (polyc.poly.promote, constants): one packed slot per weight,
    also for two calls of one def with different weights; a weight read plainly elsewhere keeps its own slot;
    results are the Python executor's (which packs them once too, kernel by kernel) bit for bit, and survive
    the disk cache."""
    from onnx import TensorProto, helper, numpy_helper

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(5)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.2).astype(np.float32), name)

    f32 = TensorProto.FLOAT
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"]),
             helper.make_node("Mul", ["w", "s"], ["ws"]),  # w read plainly by another kernel
             helper.make_node("Conv", ["a", "k1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["b", "k2"], ["c2"], pads=[1, 1, 1, 1])]  # the same def as c1
    graph = helper.make_graph(
        nodes, "packed",
        [helper.make_tensor_value_info("x", f32, [48, 256]), helper.make_tensor_value_info("a", f32, [1, 64, 10, 10]),
         helper.make_tensor_value_info("b", f32, [1, 64, 10, 10])],
        [helper.make_tensor_value_info("y", f32, [48, 1030]), helper.make_tensor_value_info("ws", f32, [256, 1030]),
         helper.make_tensor_value_info("c1", f32, [1, 128, 10, 10]),
         helper.make_tensor_value_info("c2", f32, [1, 128, 10, 10])],
        [init("w", 256, 1030), init("s", 1030), init("k1", 128, 64, 3, 3), init("k2", 128, 64, 3, 3)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    compiled = ponnx.compile(model)
    native = compiled.executor
    packed = native.native.packed
    assert len(packed) == 3 and {p.block for p in packed} == {packed[0].block}  # w, k1, k2: one panel width
    assert sorted(len(p.shape) for p in packed) == [2, 4, 4]
    feeds = compiled.check_feeds({"x": rng.standard_normal((48, 256)).astype(np.float32),
                                  "a": rng.standard_normal((1, 64, 10, 10)).astype(np.float32),
                                  "b": rng.standard_normal((1, 64, 10, 10)).astype(np.float32)})
    got = native.run(feeds)
    python_side = ponnx.executor.PythonExecutor(native.program)
    assert len(python_side.packed) == 3 and len({id(a) for a in python_side.packed.values()}) == 3
    for a, b in zip(got, python_side.run(feeds)):
        np.testing.assert_array_equal(a, b)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
    again = NativeExecutor(native.program)
    assert again.native.from_cache and again.native.packed == packed
    for a, b in zip(again.run(feeds), got):
        np.testing.assert_array_equal(a, b)


def _conv_bn_model(channels: int, layers: int, size: int = 7, seed: int = 0):
    """``layers`` x (3x3 Conv, BatchNormalization, Relu) over a ``channels`` x ``size`` x ``size`` image."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, x = [], [], "x"
    for i in range(layers):
        w = rng.standard_normal((channels, channels, 3, 3)) / (3 * np.sqrt(channels))
        stats = {"scale": 1 + 0.1 * rng.standard_normal(channels), "bias": 0.1 * rng.standard_normal(channels),
                 "mean": 0.1 * rng.standard_normal(channels), "var": 1 + 0.1 * rng.random(channels)}
        inits += [numpy_helper.from_array(w.astype(np.float32), f"w{i}")]
        inits += [numpy_helper.from_array(v.astype(np.float32), f"{n}{i}") for n, v in stats.items()]
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
                  helper.make_node("BatchNormalization", [f"c{i}"] + [f"{n}{i}" for n in stats], [f"b{i}"]),
                  helper.make_node("Relu", [f"b{i}"], [f"r{i}"])]
        x = f"r{i}"
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "conv_bn", [helper.make_tensor_value_info("x", f32, [1, channels, size, size])],
                              [helper.make_tensor_value_info(x, f32, [1, channels, size, size])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_compiled_model_keeps_each_weight_once_unpacked():
    """The program holds only the constants a step reads (or the graph returns): a Conv's batch-norm-folded
    weights, which the lowering re-lays into a table of its own, are not kept beside it; the graph a compiled
    model keeps for its summary keeps the constants' shapes, not their values. The results are onnxruntime's."""
    model = _conv_bn_model(64, 3)
    compiled = ponnx.compile(model)
    program = compiled.executor.program
    read = {program.plan.root(n) for s in program.steps for n in s.inputs}
    assert set(program.constants) <= read | {program.plan.root(n) for n in program.outputs}
    weights = 3 * 64 * 64 * 9 * 4
    assert weights <= compiled.constant_bytes < weights * 1.05  # once, with the biases
    folded = {n for n in compiled.graph.graph["released_constants"] if n.endswith("_W_bn")}
    assert len(folded) == 3 and not folded & set(program.constants)  # the Convs read re-laid tables
    assert compiled.graph.graph["constants"] == {}
    assert all(compiled.graph.graph["tensors"][n].shape == (64, 64, 3, 3) for n in folded)
    assert "Conv" in compiled.summary()
    x = np.random.default_rng(1).standard_normal((1, 64, 7, 7)).astype(np.float32)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(compiled.run({"x": x})[0], session.run(None, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_compiling_a_large_model_leaves_about_its_weights_resident(tmp_path):
    """In a fresh process, after a small model has loaded the compiler's libraries: compiling a model of 28 MiB
    of weights (three 3x3 Conv + BatchNormalization of 512 channels) grows the resident set by at most twice the
    weights (their re-laid copy and the copy packed for the register tiles), not by every copy a compile made
    on the way (folded, re-laid, packed, the heap's freed pages: 2.8x before :func:`polyc.onnx.api.compile`
    handed its free pages back and the program dropped the folded weights)."""
    import subprocess
    import sys

    script = f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_onnx_native import _conv_bn_model
import polyc.onnx as ponnx

def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096

ponnx.compile(_conv_bn_model(32, 1))
big = _conv_bn_model(512, 3)
before = rss()
compiled = ponnx.compile(big)
print((rss() - before) / (3 * 512 * 512 * 9 * 4))
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, POLYC_CACHE_DIR=str(tmp_path)))
    assert run.returncode == 0, run.stderr
    assert float(run.stdout.split()[-1]) < 2.0
