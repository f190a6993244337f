"""Graph-level ONNX behaviour (issue 10): constant folding that never lets a foreign exception out, opsets
older than 7 converted with onnx's version converter, zero-size tensors, grouped UnsupportedError messages,
and the conformance script (scripts/onnx_conformance.py) on a handful of cases.

Results are compared with onnxruntime (or numpy where onnxruntime refuses the model).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc.onnx
from polyc.errors import PolycError, UnsupportedError
from polyc.onnx import passes
from polyc.onnx.graph import from_model
from polyc.onnx.load import load_model

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

ROOT = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(10)


def make_model(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = max(3, helper.find_min_ir_version_for(list(model.opset_import)))
    return model


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def ort_run(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


# ---- constant folding -------------------------------------------------------------------------------------------

def _gather_elements_model(data, indices, axis, opset=17):
    """``y = x + float(GatherElements(data, indices))``: the gather folds, only the Add is compiled."""
    shape = list(indices.shape)
    nodes = [helper.make_node("GatherElements", ["d", "i"], ["t"], axis=axis),
             helper.make_node("Cast", ["t"], ["tf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "tf"], ["y"])]
    return make_model(nodes, [vi("x", shape)], [vi("y", shape)],
                      [numpy_helper.from_array(data, "d"), numpy_helper.from_array(indices, "i")], opset)


@pytest.mark.parametrize("data_shape,index_shape,axis", [
    ((1, 512), (1, 128), 1),      # a BERT token_type_ids buffer: 512 choices, past np.choose's 64
    ((3, 97), (3, 67), -1),       # odd primes, a negative axis
    ((200, 5), (131, 5), 0),      # along axis 0
    ((2, 70, 3), (2, 65, 1), 1),  # indices smaller than data on another axis
])
def test_gather_elements_with_many_choices_folds(data_shape, index_shape, axis):
    data = RNG.integers(0, 2, data_shape).astype(np.int64)
    n = data_shape[axis]
    indices = RNG.integers(-n, n, index_shape).astype(np.int64)
    model = _gather_elements_model(data, indices, axis)
    folded = passes.fold_constants(from_model(load_model(model)))
    assert "GatherElements" not in {d["op"] for _, d in folded.nodes(data=True)}
    x = RNG.standard_normal(index_shape).astype(np.float32)
    got = polyc.onnx.compile(model)(x)[0]
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-6)


def test_a_node_that_cannot_be_folded_stays():
    # an index out of range: polyc's GatherElements raises, the node stays for later checks to name
    data = np.zeros((1, 100), np.int64)
    indices = np.full((1, 5), 100, np.int64)
    model = _gather_elements_model(data, indices, 1)
    folded = passes.fold_constants(from_model(load_model(model)))
    assert "GatherElements" in {d["op"] for _, d in folded.nodes(data=True)}
    with pytest.raises(PolycError):
        polyc.onnx.compile(model)


def test_evaluator_exceptions_never_escape(monkeypatch):
    def broken(d, values, opset):
        raise ValueError("np.choose: too many choices")
    monkeypatch.setattr("polyc.onnx.folding.evaluate_node", broken)
    data = np.zeros((1, 100), np.int64)
    model = _gather_elements_model(data, np.zeros((1, 5), np.int64), 1)
    folded = passes.fold_constants(from_model(load_model(model)))
    assert "GatherElements" in {d["op"] for _, d in folded.nodes(data=True)}



def test_shapes_known_after_folding_fold_further():
    # Pad's pads come from a fed size (frozen by the backend) through Max/Sub/Div; Shape(Pad(...)) then feeds
    # Slice's starts: onnx's first inference cannot see through Max, so shapes are inferred again after folding
    import polyc.onnx.backend as backend

    k2 = numpy_helper.from_array(np.array([2], np.int64), "k2")
    nodes = [helper.make_node("Shape", ["x"], ["xs"]), helper.make_node("Max", ["xs", "size"], ["ps"]),
             helper.make_node("Sub", ["ps", "xs"], ["amount"]), helper.make_node("Div", ["amount", "k2"], ["left"]),
             helper.make_node("Sub", ["amount", "left"], ["right"]),
             helper.make_node("Concat", ["left", "right"], ["pads"], axis=0),
             helper.make_node("Pad", ["x", "pads"], ["padded"]), helper.make_node("Shape", ["padded"], ["ps2"]),
             helper.make_node("Sub", ["ps2", "size"], ["diff"]), helper.make_node("Div", ["diff", "k2"], ["start"]),
             helper.make_node("Add", ["start", "size"], ["end"]),
             helper.make_node("Slice", ["padded", "start", "end"], ["y"])]
    model = make_model(nodes, [vi("x", [5, 8]), vi("size", [2], TensorProto.INT64)], [vi("y", ["h", "w"])], [k2],
                       opset=18)
    x = RNG.standard_normal((5, 8)).astype(np.float32)
    size = np.array([7, 3], np.int64)
    got = backend.prepare(model).run([x, size])[0]
    np.testing.assert_allclose(got, ort_run(model, {"x": x, "size": size})[0])
    assert got.shape == (7, 3)


# ---- UnsupportedError: grouped by operator, ends with what is supported -----------------------------------------

def test_unsupported_error_groups_by_operator_and_lists_supported_ops():
    nodes, prev = [], "x"
    for k in range(19):
        nodes.append(helper.make_node("Bernoulli", [prev], [f"a{k}"], name=f"hs{k}"))
        prev = f"a{k}"
    nodes += [helper.make_node("LayerNormalization", [prev, "s"], ["b"], stash_type=0, name="ln1"),
              helper.make_node("LayerNormalization", ["b", "s"], ["c"], stash_type=0, name="ln2"),
              helper.make_node("RandomNormalLike", ["c"], ["y"], name="e")]
    model = make_model(nodes, [vi("x", [3, 4])], [vi("y", [3, 4])],
                       [numpy_helper.from_array(np.ones(4, np.float32), "s")])
    with pytest.raises(UnsupportedError) as e:
        polyc.onnx.compile(model)
    text = e.value.message
    assert "3 unsupported feature(s)" in text
    assert "unsupported operator Bernoulli ×19 (first: node hs0, opset 17)" in text
    assert "unsupported attribute stash_type=0 (LayerNormalization) ×2 (first: node ln1)" in text
    assert "unsupported operator RandomNormalLike on node e (opset 17)" in text
    assert text.count("hs1") == 0 and text.count("ln2") == 0  # every problem once
    supported = text.split("polyc supports", 1)[1]
    assert "Conv," in supported and "Reshape" in supported and "HardSwish" in supported and "Bernoulli" not in supported


def _sequence_model():
    nodes = [helper.make_node("SequenceInsert", ["s", "t"], ["out"])]
    seq = helper.make_tensor_sequence_value_info
    return make_model(nodes, [seq("s", TensorProto.INT64, None), vi("t", [2], TensorProto.INT64)],
                      [seq("out", TensorProto.INT64, None)], opset=12)


def test_sequence_inputs_are_a_clean_error():
    with pytest.raises(UnsupportedError, match=r"input 's' has type seq\(tensor\(int64\)\).*tensors only"):
        polyc.onnx.compile(_sequence_model())
    import polyc.onnx.backend as backend
    with pytest.raises(UnsupportedError, match="input 's' has type seq"):
        backend.prepare(_sequence_model()).run([[np.zeros(2, np.int64), np.ones(3, np.int64)],
                                                 np.ones(2, np.int64)])


def test_unsupported_producer_without_static_shape_is_reported_as_unsupported():
    # NonZero -> Unique: no static shape for either output (data-dependent); the ops are named, no ShapeError
    # (sequence ops, this test's first example, are resolved by polyc.onnx.sequences now)
    nodes = [helper.make_node("NonZero", ["x"], ["nz"], name="nz"),
             helper.make_node("Unique", ["nz"], ["u"], name="uq"),
             helper.make_node("Cast", ["u"], ["y"], to=TensorProto.FLOAT)]
    model = make_model(nodes, [vi("x", [2, 3])], [vi("y", ["n"])], opset=12)
    with pytest.raises(UnsupportedError, match="(?s)NonZero on node nz.*Unique on node uq"):
        polyc.onnx.compile(model)


# ---- zero-size tensors ------------------------------------------------------------------------------------------

def _check_against_ort(model, feeds):
    got = polyc.onnx.compile(model).run(feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("shape", [(0, 3), (2, 0, 5), (0,)])
def test_elementwise_on_an_empty_input_keeps_its_shape(shape):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Add", ["a", "x"], ["y"])]
    model = make_model(nodes, [vi("x", list(shape))], [vi("y", list(shape))])
    _check_against_ort(model, {"x": np.zeros(shape, np.float32)})


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"])
def test_reduction_over_an_empty_axis_gives_its_identity(op):
    # ONNX spec (ReduceX, opset 18): the empty set reduces to 0 (sum), -inf (max), +inf (min), nan (mean)
    nodes = [helper.make_node(op, ["x", "axes"], ["r"], keepdims=1),
             helper.make_node("Add", ["r", "z"], ["y"])]
    model = make_model(nodes, [vi("x", [3, 0, 2]), vi("z", [3, 1, 2])], [vi("y", [3, 1, 2])],
                       [numpy_helper.from_array(np.array([1], np.int64), "axes")], opset=18)
    feeds = {"x": np.zeros((3, 0, 2), np.float32), "z": RNG.standard_normal((3, 1, 2)).astype(np.float32)}
    got = polyc.onnx.compile(model).run(feeds)[0]
    identity = {"ReduceSum": 0.0, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceMean": np.nan}[op]
    np.testing.assert_allclose(got, identity + feeds["z"])


def test_split_with_a_zero_size_part_and_concat_with_an_empty_input():
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b", "c"], axis=1),
             helper.make_node("Concat", ["b", "c", "a"], ["y"], axis=1),
             helper.make_node("Relu", ["b"], ["e"])]
    model = make_model(nodes, [vi("x", [2, 7])], [vi("y", [2, 7]), vi("e", [2, 0])],
                       [numpy_helper.from_array(np.array([3, 0, 4], np.int64), "sizes")], opset=13)
    _check_against_ort(model, {"x": RNG.standard_normal((2, 7)).astype(np.float32)})


def test_slice_to_nothing_and_an_unused_empty_input():
    nodes = [helper.make_node("Slice", ["x", "st", "en"], ["s"]),
             helper.make_node("Sigmoid", ["s"], ["y"]),
             helper.make_node("Neg", ["x"], ["n"])]
    model = make_model(nodes, [vi("x", [5, 3]), vi("like", [0])], [vi("y", [0, 3]), vi("n", [5, 3])],
                       [numpy_helper.from_array(np.array([7], np.int64), "st"),
                        numpy_helper.from_array(np.array([9], np.int64), "en")], opset=13)
    _check_against_ort(model, {"x": RNG.standard_normal((5, 3)).astype(np.float32), "like": np.zeros(0, np.float32)})


def test_empty_dims_pinned_through_input_shapes():
    model = make_model([helper.make_node("Exp", ["x"], ["y"])], [vi("x", ["n", 4])], [vi("y", ["n", 4])])
    compiled = polyc.onnx.compile(model, input_shapes={"x": (0, 4)})
    assert compiled(np.zeros((0, 4), np.float32))[0].shape == (0, 4)


def test_a_conv_kernel_larger_than_its_input_is_still_rejected():
    w = numpy_helper.from_array(np.ones((1, 1, 5, 5), np.float32), "w")
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", [1, 1, 4, 4])],
                       [vi("y", [1, 1, 0, 0])], [w])
    with pytest.raises(PolycError, match="empty or negative size|shape"):
        polyc.onnx.compile(model)


# ---- opsets older than 7 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("b_shape,axis", [((3, 5), None), ((3,), 1), ((2, 3), 0), ((5,), -1), ((2,), 0)])
def test_opset_6_model_with_legacy_broadcast_is_converted(b_shape, axis):
    # before opset 7, broadcast=1 lays B on A's dims axis .. axis+rank(B)-1 (default: A's suffix)
    attrs = {"broadcast": 1} if axis is None else {"broadcast": 1, "axis": axis}
    nodes = [helper.make_node("Mul", ["x", "b"], ["a"], **attrs), helper.make_node("Relu", ["a"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 3, 5]), vi("b", list(b_shape))], [vi("y", [2, 3, 5])], opset=6)
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    b = RNG.standard_normal(b_shape).astype(np.float32)
    start = 3 - len(b_shape) if axis is None else axis % 3
    aligned = b.reshape(b_shape + (1,) * (3 - start - len(b_shape)))
    got = polyc.onnx.compile(model)(x, b)[0]
    np.testing.assert_allclose(got, np.maximum(x * aligned, 0), rtol=1e-6)


@pytest.mark.parametrize("x_shape,ir", [((2, 3, 4), 3), ((1, 3, 5, 7), 4)])
def test_opset_6_prelu_slope_is_per_channel_after_conversion(x_shape, ir):
    # PRelu-6: a slope of C values applies along axis 1; opset 7 broadcasts numpy-style, so it is reshaped
    model = make_model([helper.make_node("PRelu", ["x", "slope"], ["y"])], [vi("x", list(x_shape))],
                       [vi("y", list(x_shape))],
                       [numpy_helper.from_array(np.array([0.1, 0.2, 0.3], np.float32), "slope")],
                       opset=6)
    model.ir_version = ir  # IR 4: the initializer is not listed as a graph input (the converter wants it listed)
    converted = load_model(model)
    assert next(i.version for i in converted.opset_import if i.domain in ("", "ai.onnx")) >= 7
    x = RNG.standard_normal(x_shape).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], np.float32).reshape((3,) + (1,) * (len(x_shape) - 2))
    np.testing.assert_allclose(ort_run(converted, {"x": x})[0], np.where(x > 0, x, x * slope), rtol=1e-6)


@pytest.mark.parametrize("ir", [3, 8])
def test_shape_inference_without_the_large_initializers_infers_what_onnx_infers_with_them(ir, monkeypatch):
    """load_model hands onnx's shape inference the initializers of more than INFER_MAX_VALUES elements as typed
    graph inputs (onnx would serialize them and parse them back): the value_info, outputs and subgraphs it
    infers are those of the whole model (a Reshape whose target is a small initializer, data propagation
    through Shape of a large weight, an If whose branches read it), and the weights keep their values."""
    w = RNG.standard_normal((64, 48)).astype(np.float32)                 # 3072 elements: handed over as a type
    target = np.array([4, -1], np.int64)                                  # small: data propagation reads it
    then = helper.make_graph([helper.make_node("Relu", ["m"], ["t"])], "then", [], [vi("t", [2, 48])])
    other = helper.make_graph([helper.make_node("Neg", ["m"], ["e"])], "else", [], [vi("e", [2, 48])])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]),
             helper.make_node("Reshape", ["m", "target"], ["r"]),
             helper.make_node("Shape", ["w"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["z"]),
             helper.make_node("ReduceSum", ["z"], ["zs"], keepdims=0),
             helper.make_node("Greater", ["zs", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(target, "target"),
             numpy_helper.from_array(np.array(0, np.float32), "zero")]
    model = make_model(nodes, [vi("x", [2, 64])], [vi("r", ["a", "b"]), vi("y", [2, 48])], inits)
    if ir == 3:  # IR 3 lists every initializer among the graph inputs
        model.graph.input.extend(vi(t.name, list(t.dims), t.data_type) for t in inits)
    model.ir_version = ir
    full = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True, data_prop=True)
    handed = []
    infer = onnx.shape_inference.infer_shapes
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda m, **kw: handed.append([t.name for t in m.graph.initializer]) or infer(m, **kw))
    loaded = load_model(model)
    assert handed == [["target", "zero"]]
    assert [vi.SerializeToString() for vi in loaded.graph.value_info] == \
        [vi.SerializeToString() for vi in full.graph.value_info]
    assert [o.SerializeToString() for o in loaded.graph.output] == [o.SerializeToString() for o in full.graph.output]
    assert [n.SerializeToString() for n in loaded.graph.node] == [n.SerializeToString() for n in full.graph.node]
    assert [d.dim_value for d in loaded.graph.output[0].type.tensor_type.shape.dim] == [4, 24]
    assert [t.name for t in loaded.graph.initializer] == ["w", "target", "zero"]
    np.testing.assert_array_equal(numpy_helper.to_array(loaded.graph.initializer[0]), w)
    assert [i.name for i in loaded.graph.input] == [i.name for i in model.graph.input]
    x = RNG.standard_normal((2, 64)).astype(np.float32)
    got = polyc.onnx.compile(model)(x)
    np.testing.assert_allclose(got[0], (x @ w).reshape(4, 24), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], -(x @ w), rtol=1e-5, atol=1e-5)


def test_opset_1_model_is_converted():
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"])], [vi("x", [7, 3])], [vi("y", [7, 3])], opset=1)
    x = RNG.standard_normal((7, 3)).astype(np.float32)
    np.testing.assert_allclose(polyc.onnx.compile(model)(x)[0], 1 / (1 + np.exp(-x)), rtol=1e-5)


def test_a_failed_opset_conversion_names_the_opset_and_the_reason(monkeypatch):
    from onnx import version_converter

    def refuse(model, target):
        raise RuntimeError(f"No Adapter For Sigmoid to {target}")
    monkeypatch.setattr(version_converter, "convert_version", refuse)
    model = make_model([helper.make_node("Sigmoid", ["x"], ["y"])], [vi("x", [7, 3])], [vi("y", [7, 3])], opset=5)
    with pytest.raises(UnsupportedError, match=r"opset 5 is older.*could not convert.*No Adapter For Sigmoid to 7"):
        polyc.onnx.compile(model)


# ---- scripts/onnx_conformance.py ---------------------------------------------------------------------------------

def _conformance_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("onnx_conformance", ROOT / "scripts" / "onnx_conformance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_conformance_script_prints_a_table_per_suite(tmp_path):
    out = tmp_path / "report.json"
    env = dict(os.environ, POLYC_CACHE_DIR=os.environ.get("POLYC_CACHE_DIR", "off"))
    # the on-disk suites load at once (the node suite is built by running ~1900 export functions)
    proc = subprocess.run([sys.executable, "scripts/onnx_conformance.py", "--kinds", "simple,pytorch-operator",
                           "--limit", "2",
                           "--match", r"^test_(single_relu_model|gradient_of_add|operator_addconstant)$",
                           "--jobs", "1", "--json", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert rows[0].split("|")[1:-1] == [" suite ", " cases ", " polyc passed ", " wrong results ", " clean errors ",
                                        " crashes ", " onnxruntime passed ", " reference passed "]
    cells = {r.split("|")[1].strip(): [c.strip() for c in r.split("|")[2:-1]] for r in rows[1:]}
    # the training domain's Gradient runs nowhere (a clean error for polyc); onnxruntime refuses the opset-6
    # pytorch export, which polyc converts to opset 7
    assert cells == {"simple": ["2", "1", "0", "1", "0", "1", "1"],
                     "pytorch-operator": ["1", "1", "0", "0", "0", "0", "1"]}
    report = json.loads(out.read_text())
    assert report["simple"]["cases"]["test_gradient_of_add"]["polyc"][0] == "error"
    assert "Gradient" in report["simple"]["cases"]["test_gradient_of_add"]["polyc"][1]


def test_conformance_counts_crashes_and_wrong_results(monkeypatch):
    conformance = _conformance_module()

    class Case:
        def __init__(self, name):
            self.name = name

    def fake(case, runner):
        if runner != "polyc":
            return "pass", ""
        if case.name == "segfault":
            import faulthandler
            faulthandler.disable()  # pytest's handler would print the worker's stack
            os.kill(os.getpid(), 11)
        if case.name == "hang":
            import time
            time.sleep(60)
        return ("wrong", "mismatch") if case.name == "wrong" else ("pass", "")
    monkeypatch.setattr(conformance, "run_case", fake)
    results = conformance.run_all([Case(n) for n in ("segfault", "hang", "wrong", "fine")], jobs=2, timeout=3)
    summary = conformance.summarize(results)
    assert summary["polyc"] == {"pass": 1, "wrong": 1, "error": 0, "crash": 2}
    assert summary["reference"]["pass"] == 4
    assert "exit code -11" in results["segfault"]["polyc"][1] and "timed out" in results["hang"]["polyc"][1]
