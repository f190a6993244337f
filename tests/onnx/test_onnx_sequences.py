"""Sequence and optional values inside tensor graphs (polyc.onnx.sequences) against onnxruntime or onnx's
reference evaluator.

Each case is a small model built with onnx.helper whose inputs and outputs are tensors: SequenceConstruct,
SequenceEmpty, SequenceInsert / SequenceErase / SequenceAt with default, positive and negative positions,
SequenceLength, ConcatFromSequence (axis and new_axis variants), SplitToSequence (no split with keepdims 0/1,
scalar and 1-D split), SequenceMap, Identity of a sequence, and Optional / OptionalHasElement /
OptionalGetElement; extents 1 and odd primes; opsets 12 and 17. The unsupported forms must raise a clean
PolycError naming the node.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyc.onnx
from polyc.errors import PolycError, ShapeError, UnsupportedError

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

F = TensorProto.FLOAT
SEQ_F = helper.make_sequence_type_proto(helper.make_tensor_type_proto(F, None))


def _model(nodes, inputs, outputs, opset=17, inits=()):
    graph = helper.make_graph(nodes, "seq", [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
                              [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
                              initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    inferred = onnx.shape_inference.infer_shapes(model)  # outputs given without a shape take the inferred one
    for out, vi in zip(model.graph.output, inferred.graph.output):
        if not out.type.tensor_type.HasField("shape"):
            out.CopyFrom(vi)
            if not out.type.tensor_type.HasField("shape"):
                out.type.tensor_type.shape.SetInParent()
                del out.type.tensor_type.shape.dim[:]
    onnx.checker.check_model(model)
    return model


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(model, feeds, reference="ort"):
    got = polyc.onnx.compile(model)(feeds)
    want = _ort(model, feeds) if reference == "ort" else ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _i64(name, value):
    return helper.make_tensor(name, TensorProto.INT64, [], [value])


@pytest.mark.parametrize("shape,axis", [((2, 3, 4), 1), ((1, 5, 3), 0), ((3, 1, 7), -1), ((5,), 0)])
def test_construct_concat(shape, axis):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis)]
    model = _model(nodes, [(n, F, list(shape)) for n in "abc"], [("y", F, None)])
    _check(model, {n: _rand(*shape, seed=k) for k, n in enumerate("abc")})


@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("axis", [0, 1, -1, 2, -3])
def test_concat_new_axis(axis, opset):
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "a"], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=1)]
    model = _model(nodes, [("a", F, [3, 5]), ("b", F, [3, 5])], [("y", F, None)], opset=opset)
    _check(model, {"a": _rand(3, 5), "b": _rand(3, 5, seed=1)})


@pytest.mark.parametrize("pos,at", [(None, -1), (0, 0), (-1, 1), (1, -3), (2, 2)])
def test_empty_insert_at(pos, at):
    inits = [_i64("at", at)] + ([_i64("pos", pos)] if pos is not None else [])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"], dtype=F),
             helper.make_node("SequenceInsert", ["s0", "a"], ["s1"]),
             helper.make_node("SequenceInsert", ["s1", "b"], ["s2"]),
             helper.make_node("SequenceInsert", ["s2", "c"] + (["pos"] if pos is not None else []), ["s3"]),
             helper.make_node("SequenceAt", ["s3", "at"], ["y"]),
             helper.make_node("SequenceLength", ["s3"], ["n"])]
    model = _model(nodes, [("a", F, [2, 3]), ("b", F, [1, 3]), ("c", F, [5, 3])],
                   [("y", F, None), ("n", TensorProto.INT64, [])], inits=inits)
    _check(model, {"a": _rand(2, 3), "b": _rand(1, 3, seed=1), "c": _rand(5, 3, seed=2)})


@pytest.mark.parametrize("erase", [None, 0, -3, 1])
def test_erase_length_concat(erase):
    inits = [_i64("e", erase)] if erase is not None else []
    nodes = [helper.make_node("SequenceConstruct", ["a", "b", "c"], ["s"]),
             helper.make_node("SequenceErase", ["s"] + (["e"] if erase is not None else []), ["t"]),
             helper.make_node("SequenceLength", ["t"], ["n"]),
             helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0)]
    model = _model(nodes, [(n, F, [2, 7]) for n in "abc"], [("y", F, None), ("n", TensorProto.INT64, [])],
                   inits=inits)
    _check(model, {n: _rand(2, 7, seed=k) for k, n in enumerate("abc")})


def test_position_computed_from_length():
    """SequenceAt(s, SequenceLength(s) - 1): the position folds once the length is a constant."""
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("Constant", [], ["one"], value=_i64("one", 1)),
             helper.make_node("Sub", ["n", "one"], ["last"]),
             helper.make_node("SequenceAt", ["s", "last"], ["y"])]
    model = _model(nodes, [("a", F, [3]), ("b", F, [3])], [("y", F, None)])
    _check(model, {"a": _rand(3), "b": _rand(3, seed=1)})


@pytest.mark.parametrize("opset", [12, 17])
@pytest.mark.parametrize("shape,axis,keepdims", [((2, 3, 5), 0, 1), ((2, 3, 5), 1, 0), ((1, 7), -1, 0),
                                                  ((3, 1), 1, 1)])
def test_split_no_split(shape, axis, keepdims, opset):
    nodes = [helper.make_node("SplitToSequence", ["x"], ["s"], axis=axis, keepdims=keepdims),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=1 - keepdims),
             helper.make_node("SequenceAt", ["s", "p"], ["z"])]
    model = _model(nodes, [("x", F, list(shape))], [("y", F, None), ("z", F, None)], opset=opset,
                   inits=[_i64("p", -1)])
    _check(model, {"x": _rand(*shape)})


@pytest.mark.parametrize("split,axis", [(np.array(2, np.int64), 1), (np.array(3, np.int64), 0),
                                        (np.array([1, 4, 2], np.int64), 1), (np.array([7], np.int64), -1),
                                        (np.array([2, 0, 3], np.int32), 0)])
def test_split_given(split, axis):
    shape = (5, 7) if split.ndim == 0 else ((5, 7) if axis != 0 else (5, 3))
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=axis, keepdims=0),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("SequenceAt", ["s", "p"], ["first"]),
             helper.make_node("SequenceErase", ["s", "p"], ["rest"]),
             helper.make_node("ConcatFromSequence", ["rest"], ["y"], axis=axis)] if len(np.atleast_1d(split)) > 1 \
        or split.ndim == 0 else \
        [helper.make_node("SplitToSequence", ["x", "split"], ["s"], axis=axis),
         helper.make_node("SequenceLength", ["s"], ["n"]),
         helper.make_node("SequenceAt", ["s", "p"], ["first"]),
         helper.make_node("Identity", ["s"], ["s2"]),
         helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=axis)]
    inits = [onnx.numpy_helper.from_array(split, "split"), _i64("p", 0)]
    model = _model(nodes, [("x", F, list(shape))], [("n", TensorProto.INT64, []), ("first", F, None),
                                                    ("y", F, None)], inits=inits)
    # onnxruntime 1.2x squeezes a scalar split's pieces when keepdims=0; the spec ignores keepdims then
    _check(model, {"x": _rand(*shape)}, reference="reference" if split.ndim == 0 else "ort")


def test_split_runtime_sizes_length_only():
    """A run-time 1-D split of static size: the length is known, so SequenceLength folds."""
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"]),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    model = _model(nodes, [("x", F, [6]), ("split", TensorProto.INT64, [3])], [("n", TensorProto.INT64, [])])
    _check(model, {"x": _rand(6), "split": np.array([1, 2, 3], np.int64)})


def test_split_relu_cat():
    """torch's ``torch.cat([f(p) for p in x.split(2, 1)], 1)`` shape: elements read with SequenceAt."""
    nodes = [helper.make_node("SplitToSequence", ["x", "two"], ["s"], axis=1),
             helper.make_node("SequenceAt", ["s", "i0"], ["p0"]),
             helper.make_node("SequenceAt", ["s", "i1"], ["p1"]),
             helper.make_node("SequenceAt", ["s", "i2"], ["p2"]),
             helper.make_node("Relu", ["p0"], ["r0"]), helper.make_node("Neg", ["p1"], ["r1"]),
             helper.make_node("Exp", ["p2"], ["r2"]),
             helper.make_node("SequenceConstruct", ["r2", "r1", "r0"], ["t"]),
             helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=1)]
    model = _model(nodes, [("x", F, [3, 5])], [("y", F, None)],
                   inits=[_i64("two", 2), _i64("i0", 0), _i64("i1", 1), _i64("i2", -1)])
    _check(model, {"x": _rand(3, 5)})


@pytest.mark.parametrize("n", [1, 3])
def test_sequence_map(n):
    """SequenceMap: each element plus a tensor, then stacked (against onnx's reference evaluator)."""
    body = helper.make_graph([helper.make_node("Add", ["e", "t"], ["o"]), helper.make_node("Neg", ["e"], ["m"])],
                             "body", [helper.make_tensor_value_info("e", F, [2, 3]),
                                      helper.make_tensor_value_info("t", F, [2, 3])],
                             [helper.make_tensor_value_info("o", F, [2, 3]),
                              helper.make_tensor_value_info("m", F, [2, 3])])
    names = [f"x{k}" for k in range(n)]
    nodes = [helper.make_node("SequenceConstruct", names, ["s"]),
             helper.make_node("SequenceMap", ["s", "b"], ["u", "v"], body=body),
             helper.make_node("ConcatFromSequence", ["u"], ["y"], axis=0, new_axis=1),
             helper.make_node("ConcatFromSequence", ["v"], ["z"], axis=1)]
    model = _model(nodes, [(x, F, [2, 3]) for x in names] + [("b", F, [2, 3])], [("y", F, None), ("z", F, None)])
    feeds = {x: _rand(2, 3, seed=k) for k, x in enumerate(names)}
    feeds["b"] = _rand(2, 3, seed=9)
    _check(model, feeds, reference="reference")


def test_optional_of_tensor_and_empty():
    nodes = [helper.make_node("Optional", ["x"], ["o"]),
             helper.make_node("Identity", ["o"], ["o2"]),
             helper.make_node("OptionalHasElement", ["o2"], ["has"]),
             helper.make_node("OptionalGetElement", ["o2"], ["g"]),
             helper.make_node("Relu", ["g"], ["y"]),
             helper.make_node("Optional", [], ["e"], type=helper.make_tensor_type_proto(F, None)),
             helper.make_node("OptionalHasElement", ["e"], ["has_e"])]
    model = _model(nodes, [("x", F, [3, 5])], [("has", TensorProto.BOOL, []), ("y", F, None),
                                               ("has_e", TensorProto.BOOL, [])], opset=18)
    _check(model, {"x": _rand(3, 5)})


def test_optional_of_sequence():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("Optional", ["s"], ["o"]),
             helper.make_node("OptionalGetElement", ["o"], ["s2"]),
             helper.make_node("ConcatFromSequence", ["s2"], ["y"], axis=0)]
    model = _model(nodes, [("a", F, [1, 3]), ("b", F, [2, 3])], [("y", F, None)], opset=18)
    _check(model, {"a": _rand(1, 3), "b": _rand(2, 3, seed=1)})


# ---- clean errors -------------------------------------------------------------------------------------------

def _raises(model, error, *words):
    with pytest.raises(error) as info:
        polyc.onnx.compile(model)
    for w in words:
        assert w in str(info.value)
    return info.value


def test_error_runtime_position():
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="at")]
    model = _model(nodes, [("a", F, [3]), ("b", F, [3]), ("p", TensorProto.INT64, [])], [("y", F, [3])])
    _raises(model, UnsupportedError, "node at", "SequenceAt", "compile-time constant")


@pytest.mark.parametrize("op,pos", [("SequenceAt", 2), ("SequenceAt", -3), ("SequenceErase", 2),
                                    ("SequenceInsert", 3), ("SequenceInsert", -3)])
def test_error_position_out_of_range(op, pos):
    ins = ["s", "a", "p"] if op == "SequenceInsert" else ["s", "p"]
    nodes = [helper.make_node("SequenceConstruct", ["a", "b"], ["s"]),
             helper.make_node(op, ins, ["t"], name="bad"),
             helper.make_node("ConcatFromSequence", ["t"], ["y"], axis=0) if op != "SequenceAt"
             else helper.make_node("Identity", ["t"], ["y"])]
    model = _model(nodes, [("a", F, [3]), ("b", F, [3])], [("y", F, None)], inits=[_i64("p", pos)])
    _raises(model, ShapeError, "node bad", "out of range")


def test_error_runtime_split_elements():
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], name="split"),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [("x", F, [6]), ("split", TensorProto.INT64, [3])], [("y", F, None)])
    _raises(model, UnsupportedError, "split", "run time")


def test_error_runtime_scalar_split():
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], name="split"),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    model = _model(nodes, [("x", F, [6]), ("split", TensorProto.INT64, [])], [("n", TensorProto.INT64, [])])
    _raises(model, UnsupportedError, "node split", "compile-time constant")


def test_error_bad_split_sum():
    nodes = [helper.make_node("SplitToSequence", ["x", "split"], ["s"], name="split"),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    model = _model(nodes, [("x", F, [6])], [("n", TensorProto.INT64, [])],
                   inits=[onnx.numpy_helper.from_array(np.array([1, 2], np.int64), "split")])
    _raises(model, PolycError, "split", "Sum of split values")


def test_error_sequence_graph_output():
    nodes = [helper.make_node("SequenceConstruct", ["a"], ["s"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("a", F, [3])],
                              [helper.make_value_info("s", SEQ_F)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _raises(model, UnsupportedError, "'s'", "seq(tensor(float))")


def test_error_sequence_graph_input():
    nodes = [helper.make_node("SequenceAt", ["s", "p"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_value_info("s", SEQ_F)],
                              [helper.make_tensor_value_info("y", F, None)], initializer=[_i64("p", 0)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    _raises(model, UnsupportedError, "'s'", "seq(tensor(float))")


def test_error_empty_optional_get():
    nodes = [helper.make_node("Optional", [], ["e"], type=helper.make_tensor_type_proto(F, [3])),
             helper.make_node("OptionalGetElement", ["e"], ["g"], name="get"),
             helper.make_node("Add", ["g", "x"], ["y"])]
    model = _model(nodes, [("x", F, [3])], [("y", F, None)], opset=18)
    _raises(model, ShapeError, "node get", "empty")


def test_error_concat_empty_sequence():
    nodes = [helper.make_node("SequenceEmpty", [], ["s"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, name="cat")]
    model = _model(nodes, [], [("y", F, None)])
    _raises(model, UnsupportedError, "node cat", "empty sequence")


def _list_loop(trip):
    """A Loop that appends ``x * x + i`` to a sequence each iteration (a list built in a Python loop) and
    also scans it; the sequence is then stacked and counted."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["c"], ["c_out"]),
         helper.make_node("Mul", ["x", "x"], ["sq"]),
         helper.make_node("Cast", ["i"], ["fi"], to=F),
         helper.make_node("Add", ["sq", "fi"], ["v"]),
         helper.make_node("SequenceInsert", ["s_in", "v"], ["s_out"]),
         helper.make_node("Identity", ["v"], ["scan"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_value_info("s_in", SEQ_F)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_value_info("s_out", SEQ_F),
         helper.make_tensor_value_info("scan", F, [2])])
    nodes = [helper.make_node("SequenceEmpty", [], ["s0"]),
             helper.make_node("Loop", ["m", "", "s0"], ["s", "st"], body=body, name="loop"),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0, new_axis=1),
             helper.make_node("SequenceLength", ["s"], ["n"])]
    if isinstance(trip, int):
        return _model(nodes, [("x", F, [2])], [("y", F, None), ("st", F, None), ("n", TensorProto.INT64, [])],
                      inits=[_i64("m", trip)])
    return _model(nodes, [("x", F, [2]), ("m", TensorProto.INT64, [])],
                  [("y", F, None), ("st", F, None), ("n", TensorProto.INT64, [])])


@pytest.mark.parametrize("trip", [1, 3])
def test_loop_builds_sequence(trip):
    """A sequence as a loop-carried value of an unrolled Loop (polyc.onnx.control inlines the body)."""
    _check(_list_loop(trip), {"x": _rand(2)})


@pytest.mark.parametrize("cond", [True, False])
def test_if_returns_sequence(cond):
    seq_out = helper.make_value_info("out", SEQ_F)
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["a", "b"], ["out"])], "then", [], [seq_out])
    other = helper.make_graph([helper.make_node("SequenceConstruct", ["b"], ["out"])], "else", [], [seq_out])
    nodes = [helper.make_node("If", ["c"], ["s"], then_branch=then, else_branch=other),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [("a", F, [2]), ("b", F, [2])], [("y", F, None)],
                   inits=[helper.make_tensor("c", TensorProto.BOOL, [], [cond])])
    _check(model, {"a": _rand(2), "b": _rand(2, seed=1)})


def test_error_loop_runtime_trip_count_with_sequence():
    """A Loop carrying a sequence for a trip count known only at run time: a clean UnsupportedError."""
    _raises(_list_loop(None), UnsupportedError, "node loop", "trip count")


@pytest.mark.parametrize("shape,chunk", [((3, 7), 2), ((1, 5), 5), ((2, 3), 1)])
def test_scripted_split_loop_cat(shape, chunk):
    """torch.jit.script of ``for p in x.split(k, 1): out.append(relu(p) + 1); cat(out, 1)`` as torch exports
    it: a Loop whose trip count is the SequenceLength of a SplitToSequence, reading it with SequenceAt."""
    body = helper.make_graph(
        [helper.make_node("SequenceAt", ["pieces", "i"], ["p"]),
         helper.make_node("Relu", ["p"], ["r"]),
         helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", F, [], [1.0])),
         helper.make_node("Add", ["r", "one"], ["v"]),
         helper.make_node("SequenceInsert", ["acc", "v"], ["acc_out"]),
         helper.make_node("Identity", ["c"], ["c_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, []), helper.make_value_info("acc", SEQ_F)],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []), helper.make_value_info("acc_out", SEQ_F)])
    nodes = [helper.make_node("SequenceEmpty", [], ["empty"], dtype=F),
             helper.make_node("SplitToSequence", ["x", "k"], ["pieces"], axis=1),
             helper.make_node("SequenceLength", ["pieces"], ["n"]),
             helper.make_node("Loop", ["n", "true", "empty"], ["out"], body=body),
             helper.make_node("ConcatFromSequence", ["out"], ["y"], axis=1)]
    model = _model(nodes, [("x", F, list(shape))], [("y", F, None)],
                   inits=[_i64("k", chunk), helper.make_tensor("true", TensorProto.BOOL, [], [True])])
    _check(model, {"x": _rand(*shape)})


def test_if_on_optional_has_element():
    """An If whose condition is OptionalHasElement of an empty optional: the condition folds first."""
    seq_out = helper.make_value_info("out", SEQ_F)
    then = helper.make_graph([helper.make_node("SequenceConstruct", ["a"], ["out"])], "then", [], [seq_out])
    other = helper.make_graph([helper.make_node("SequenceConstruct", ["a", "a"], ["out"])], "else", [], [seq_out])
    nodes = [helper.make_node("Optional", [], ["e"], type=SEQ_F),
             helper.make_node("OptionalHasElement", ["e"], ["has"]),
             helper.make_node("If", ["has"], ["s"], then_branch=then, else_branch=other),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0)]
    model = _model(nodes, [("a", F, [3])], [("y", F, None)], opset=18)
    _check(model, {"a": _rand(3)})
