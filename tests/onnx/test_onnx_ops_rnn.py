"""LSTM, GRU, RNN (unrolled by polyc.onnx.ops.rnn) and If, Loop, Scan (polyc.onnx.control) against onnxruntime.

Each recurrent case is a one-node model over directions, layouts (layout 1 against onnx's reference
evaluator: onnxruntime's CPU kernels reject it), optional inputs present or absent, constant
``sequence_lens``, activations, clip, input_forget and linear_before_reset, with sequence lengths 1 and odd.
Control flow cases are small models built with onnx.helper; the unsupported forms must raise an
UnsupportedError naming the node.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import polyc.onnx
from polyc.errors import UnsupportedError
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

_GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(model, feeds, reference="ort", rtol=1e-4, atol=1e-5):
    got = polyc.onnx.compile(model)(feeds)
    want = _ort(model, feeds) if reference == "ort" else ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, np.asarray(w), rtol=rtol, atol=atol)


def _recurrent_model(op, t, b, i, h, *, direction="forward", layout=0, bias=True, seq=None, init_h=False,
                     init_c=False, peep=False, weights_as_inputs=False, outputs=("Y", "Y_h", "Y_c"),
                     dtype=np.float32, opset=None, seed=0, **attrs):
    rng = np.random.default_rng(seed)
    d = 2 if direction == "bidirectional" else 1
    g = _GATES[op]

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(dtype)
    feeds = {"X": rand(t, b, i) if layout == 0 else rand(b, t, i)}
    consts = {}
    (feeds if weights_as_inputs else consts).update(W=rand(d, g * h, i), R=rand(d, g * h, h))
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        consts["B"] = rand(d, 2 * g * h)
        names[3] = "B"
    if seq is not None:
        consts["seq"] = np.array(seq, np.int32)
        names[4] = "seq"
    state = (d, b, h) if layout == 0 else (b, d, h)
    if init_h:
        feeds["h0"] = rand(*state)
        names[5] = "h0"
    if init_c:
        feeds["c0"] = rand(*state)
        names[6] = "c0"
    if peep:
        consts["P"] = rand(d, 3 * h)
        names[7] = "P"
    while names and not names[-1]:
        names.pop()
    outs = [o if o in outputs else "" for o in (("Y", "Y_h", "Y_c") if op == "LSTM" else ("Y", "Y_h"))]
    while outs and not outs[-1]:
        outs.pop()
    if layout:
        attrs["layout"] = layout
    node = helper.make_node(op, names, outs, name="rec", hidden_size=h, direction=direction, **attrs)
    opset = opset or (14 if layout else 13)
    return testing.one_node_model(node, feeds, consts, opset=opset), feeds


# (id, op, T, B, I, H, options)
RECURRENT_CASES = [
    ("lstm_fwd", "LSTM", 5, 3, 4, 7, {}),
    ("lstm_seq1", "LSTM", 1, 2, 3, 5, {}),
    ("lstm_reverse_init", "LSTM", 3, 2, 5, 4, dict(direction="reverse", init_h=True, init_c=True)),
    ("lstm_bidir_peep", "LSTM", 5, 3, 2, 3, dict(direction="bidirectional", init_h=True, init_c=True, peep=True)),
    ("lstm_nobias_only_yh", "LSTM", 4, 1, 3, 5, dict(bias=False, outputs=("Y_h",))),
    ("lstm_seq_lens_bidir", "LSTM", 5, 3, 2, 3, dict(direction="bidirectional", seq=[5, 2, 3], init_h=True,
                                                     init_c=True, peep=True)),
    ("lstm_short_lens_bidir", "LSTM", 5, 2, 3, 3, dict(direction="bidirectional", seq=[2, 3])),
    ("lstm_clip_input_forget", "LSTM", 3, 2, 3, 4, dict(clip=0.4, input_forget=1)),
    ("lstm_activations", "LSTM", 3, 2, 3, 4, dict(
        direction="bidirectional", activations=["HardSigmoid", "Tanh", "Relu", "Sigmoid", "Softsign", "Elu"],
        activation_alpha=[0.3, 0.8], activation_beta=[0.4])),
    ("lstm_weights_as_inputs", "LSTM", 3, 2, 3, 4, dict(weights_as_inputs=True, init_h=True)),
    ("gru_fwd", "GRU", 5, 3, 4, 7, {}),
    ("gru_seq1_lbr", "GRU", 1, 2, 3, 5, dict(linear_before_reset=1, init_h=True)),
    ("gru_reverse_lbr_nobias", "GRU", 3, 2, 5, 4, dict(direction="reverse", linear_before_reset=1, bias=False)),
    ("gru_bidir_seq_lens", "GRU", 5, 3, 2, 3, dict(direction="bidirectional", seq=[1, 5, 4], init_h=True)),
    ("gru_short_lens_reverse", "GRU", 4, 2, 3, 5, dict(direction="reverse", seq=[1, 2], init_h=True)),
    ("gru_clip_activations", "GRU", 3, 2, 3, 4, dict(clip=0.5, activations=["Sigmoid", "ScaledTanh"],
                                                     activation_alpha=[1.5], activation_beta=[0.7])),
    ("rnn_fwd", "RNN", 5, 3, 4, 7, {}),
    ("rnn_seq1", "RNN", 1, 1, 3, 5, dict(init_h=True)),
    ("rnn_bidir_relu_seq_lens", "RNN", 3, 2, 3, 4, dict(direction="bidirectional", activations=["Relu", "Tanh"],
                                                        seq=[3, 1])),
    ("rnn_reverse_affine_clip", "RNN", 3, 2, 3, 4, dict(direction="reverse", activations=["Affine"],
                                                        activation_alpha=[0.5], activation_beta=[0.1], clip=1.0)),
    ("rnn_leakyrelu_softplus", "RNN", 3, 2, 3, 4, dict(direction="bidirectional",
                                                       activations=["LeakyRelu", "Softplus"],
                                                       activation_alpha=[0.2])),
]


@pytest.mark.parametrize("case", RECURRENT_CASES, ids=[c[0] for c in RECURRENT_CASES])
def test_recurrent_matches_onnxruntime(case):
    _, op, t, b, i, h, options = case
    model, feeds = _recurrent_model(op, t, b, i, h, **options)
    _check(model, feeds)


# layout 1 (batch first) and float64 LSTM: onnxruntime's CPU kernels do not take them; onnx's reference
# evaluator does
LAYOUT1_CASES = [
    ("lstm_batchwise", "LSTM", 3, 2, 3, 5, dict(init_h=True, init_c=True)),
    ("lstm_batchwise_bidir_peep", "LSTM", 5, 3, 2, 3, dict(direction="bidirectional", peep=True)),
    ("gru_batchwise_reverse", "GRU", 3, 1, 3, 4, dict(direction="reverse", init_h=True)),
    ("rnn_batchwise_bidir", "RNN", 1, 3, 2, 5, dict(direction="bidirectional", init_h=True)),
    ("lstm_batchwise_double", "LSTM", 3, 2, 3, 4, dict(dtype=np.float64, init_c=True)),
]


@pytest.mark.parametrize("case", LAYOUT1_CASES, ids=[c[0] for c in LAYOUT1_CASES])
def test_recurrent_layout1_matches_reference(case):
    _, op, t, b, i, h, options = case
    model, feeds = _recurrent_model(op, t, b, i, h, layout=1, **options)
    _check(model, feeds, reference="onnx")


def test_recurrent_old_opset_and_unrolled_kernels_compile_once():
    model, feeds = _recurrent_model("LSTM", 6, 2, 3, 4, opset=7, init_h=True, init_c=True)
    _check(model, feeds)
    compiled = polyc.onnx.compile(model)
    sources = [k.source for k in compiled.kernels if k is not None]
    assert len(set(sources)) < len(sources) / 3  # the steps share their kernels


def test_recurrent_unsupported_forms_name_the_node():
    model, feeds = _recurrent_model("RNN", 3, 2, 3, 4, activations=["ThresholdedRelu"])
    with pytest.raises(UnsupportedError, match=r"rec.*RNN|thresholdedrelu"):
        polyc.onnx.compile(model)
    # sequence_lens as a graph input (not a constant): polyc needs it at compile time
    model, feeds = _recurrent_model("GRU", 3, 2, 3, 4)
    model.graph.node[0].input.extend(["", "lens"][len(model.graph.node[0].input) - 3:])
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [2]))
    with pytest.raises(UnsupportedError, match=r"sequence_lens.*rec|rec.*sequence_lens"):
        polyc.onnx.compile(model)


# ---- control flow -------------------------------------------------------------------------------------------

def _model(nodes, inputs, outputs, inits=(), opset=13):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = max(4, helper.find_min_ir_version_for(list(model.opset_import)))
    return model


def _vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def _branch(name, nodes, outputs, inits=()):
    return helper.make_graph(nodes, name, [], outputs, initializer=list(inits))


@pytest.mark.parametrize("cond", [True, False])
def test_if_with_constant_condition_inlines_the_branch(cond):
    # the branches read outer tensors (x, s), have their own initializer and a node named like an outer one
    then_b = _branch("then", [helper.make_node("Mul", ["x", "two"], ["m"], name="n"),
                              helper.make_node("Add", ["m", "s"], ["t_out"], name="n2")], [_vi("t_out", [3, 5])],
                     [numpy_helper.from_array(np.float32(2.0).reshape(()), "two")])
    else_b = _branch("else", [helper.make_node("Sub", ["x", "s"], ["e_out"])], [_vi("e_out", [3, 5])])
    nodes = [helper.make_node("Relu", ["x0"], ["x"], name="n"),
             helper.make_node("Sigmoid", ["x0"], ["s"]),
             helper.make_node("Greater", ["a", "b"], ["c"]),  # folded: both constants
             helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_b, else_branch=else_b),
             helper.make_node("Tanh", ["y"], ["z"])]
    inits = [numpy_helper.from_array(np.array(1.0 if cond else -1.0, np.float32), "a"),
             numpy_helper.from_array(np.array(0.0, np.float32), "b")]
    model = _model(nodes, [_vi("x0", [3, 5])], [_vi("z", [3, 5]), _vi("y", [3, 5])], inits)
    _check(model, {"x0": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)})


def test_if_branch_returning_an_outer_tensor_and_a_constant():
    then_b = _branch("then", [helper.make_node("Identity", ["x"], ["xo"]),
                              helper.make_node("Constant", [], ["k"], value=numpy_helper.from_array(
                                  np.arange(4, dtype=np.float32), "kv"))], [_vi("xo", [4]), _vi("k", [4])])
    else_b = _branch("else", [helper.make_node("Identity", ["x"], ["xe"])], [_vi("xe", [4]), _vi("xe", [4])])
    nodes = [helper.make_node("If", ["c"], ["y1", "y2"], then_branch=then_b, else_branch=else_b),
             helper.make_node("Add", ["y1", "y2"], ["z"])]
    model = _model(nodes, [_vi("x", [4])], [_vi("z", [4])], [numpy_helper.from_array(np.array(True), "c")])
    _check(model, {"x": np.arange(4, dtype=np.float32) * 3})


def test_data_dependent_if_is_unsupported():
    then_b = _branch("then", [helper.make_node("Neg", ["x"], ["t"])], [_vi("t", [2])])
    else_b = _branch("else", [helper.make_node("Abs", ["x"], ["e"])], [_vi("e", [2])])
    nodes = [helper.make_node("ReduceSum", ["x"], ["r"], keepdims=0),
             helper.make_node("Greater", ["r", "zero"], ["c"]),
             helper.make_node("If", ["c"], ["y"], name="pick", then_branch=then_b, else_branch=else_b)]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])], [numpy_helper.from_array(np.float32(0), "zero")])
    with pytest.raises(UnsupportedError, match=r"pick \(If\)"):
        polyc.onnx.compile(model)


def _loop_body(carried_shape, scan=True):
    # (iter, cond, acc) -> (cond, acc + x * iter, acc) ; x is an outer tensor
    nodes = [helper.make_node("Cast", ["i"], ["fi"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["x", "fi"], ["xi"]),
             helper.make_node("Add", ["acc", "xi"], ["acc_out"]),
             helper.make_node("Identity", ["cond_in"], ["cond_out"])]
    outs = [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_out", carried_shape)]
    if scan:
        nodes.append(helper.make_node("Relu", ["acc"], ["acc_seen"]))
        outs.append(_vi("acc_seen", carried_shape))
    return helper.make_graph(nodes, "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL),
                                             _vi("acc", carried_shape)], outs)


@pytest.mark.parametrize("trips", [1, 4])
def test_loop_with_constant_trip_count_is_unrolled(trips):
    nodes = [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc", "seen"], name="loop", body=_loop_body([2, 3])),
             helper.make_node("Mul", ["acc", "acc"], ["sq"])]
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "M"), numpy_helper.from_array(np.array(True), "cond")]
    model = _model(nodes, [_vi("x", [2, 3]), _vi("acc0", [2, 3])],
                   [_vi("sq", [2, 3]), _vi("seen", [trips, 2, 3]), _vi("acc", [2, 3])], inits)
    rng = np.random.default_rng(2)
    _check(model, {"x": rng.standard_normal((2, 3)).astype(np.float32),
                   "acc0": rng.standard_normal((2, 3)).astype(np.float32)})


def test_loop_without_condition_and_nested_if():
    # the body holds an If on a constant that reads a body-local tensor (renamed per iteration)
    inner = _branch("then", [helper.make_node("Add", ["acc_out", "one"], ["bumped"])], [_vi("bumped", [3])])
    other = _branch("else", [helper.make_node("Identity", ["acc_out"], ["same"])], [_vi("same", [3])])
    body = helper.make_graph(
        [helper.make_node("Mul", ["acc", "x"], ["acc_out"]),
         helper.make_node("If", ["flag"], ["acc_next"], then_branch=inner, else_branch=other),
         helper.make_node("Identity", ["cond_in"], ["cond_out"])],
        "body", [_vi("i", [], TensorProto.INT64), _vi("cond_in", [], TensorProto.BOOL), _vi("acc", [3])],
        [_vi("cond_out", [], TensorProto.BOOL), _vi("acc_next", [3])])
    nodes = [helper.make_node("Loop", ["M", "", "acc0"], ["acc"], body=body)]
    inits = [numpy_helper.from_array(np.array(3, np.int64), "M"), numpy_helper.from_array(np.array(True), "flag"),
             numpy_helper.from_array(np.float32(1.0).reshape(()), "one")]
    model = _model(nodes, [_vi("x", [3]), _vi("acc0", [3])], [_vi("acc", [3])], inits)
    _check(model, {"x": np.array([0.5, -1.0, 2.0], np.float32), "acc0": np.array([1.0, 2.0, 3.0], np.float32)})


def _counting_body(stop):
    """A while-loop body: ``cond_out = iter < stop`` (a condition that folds once iter is a constant)."""
    body = _loop_body([2], scan=True)
    body.node[3].CopyFrom(helper.make_node("Less", ["i", "stop"], ["cond_out"]))
    body.initializer.append(numpy_helper.from_array(np.array(stop, np.int64), "stop"))
    return body


@pytest.mark.parametrize("trips, stop", [(5, 2), (3, 10), (None, 0), (None, 4)])
def test_loop_whose_condition_folds_is_unrolled_until_false(trips, stop):
    nodes = [helper.make_node("Loop", ["M" if trips else "", "cond", "acc0"], ["acc", "seen"],
                              body=_counting_body(stop))]
    inits = [numpy_helper.from_array(np.array(True), "cond")]
    if trips:
        inits.append(numpy_helper.from_array(np.array(trips, np.int64), "M"))
    n = min(trips or 10**6, stop + 1)
    model = _model(nodes, [_vi("x", [2]), _vi("acc0", [2])], [_vi("acc", [2]), _vi("seen", [n, 2])], inits)
    _check(model, {"x": np.array([0.5, -1.0], np.float32), "acc0": np.array([1.0, 2.0], np.float32)})


def test_loop_with_dynamic_trip_count_or_condition_is_unsupported():
    nodes = [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc"], name="dyn", body=_loop_body([2], scan=False))]
    model = _model(nodes, [_vi("x", [2]), _vi("acc0", [2]), _vi("M", [], TensorProto.INT64)], [_vi("acc", [2])],
                   [numpy_helper.from_array(np.array(True), "cond")])
    with pytest.raises(UnsupportedError, match=r"dyn \(Loop\).*trip count"):
        polyc.onnx.compile(model)
    model = _model(nodes, [_vi("x", [2]), _vi("acc0", [2])], [_vi("acc", [2])],
                   [numpy_helper.from_array(np.array(True), "cond"),
                    numpy_helper.from_array(np.array(10**9, np.int64), "M")])
    with pytest.raises(UnsupportedError, match=r"dyn \(Loop\).*limited"):
        polyc.onnx.compile(model)
    body = _loop_body([2], scan=False)  # cond_out = sum(acc) < 3: known only at run time
    body.node[3].CopyFrom(helper.make_node("ReduceSum", ["acc_out"], ["total"], keepdims=0))
    body.node.append(helper.make_node("Less", ["total", "three"], ["cond_out"]))
    body.initializer.append(numpy_helper.from_array(np.float32(3.0).reshape(()), "three"))
    nodes = [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc"], name="dyn", body=body)]
    model = _model(nodes, [_vi("x", [2]), _vi("acc0", [2])], [_vi("acc", [2])],
                   [numpy_helper.from_array(np.array(True), "cond"),
                    numpy_helper.from_array(np.array(5, np.int64), "M")])
    with pytest.raises(UnsupportedError, match=r"dyn \(Loop\).*condition"):
        polyc.onnx.compile(model)


def _scan_body():
    # state s [2], scan input slice x [2] -> (s + x, (s + x) * 2)
    return helper.make_graph(
        [helper.make_node("Add", ["s", "xt"], ["s_out"]), helper.make_node("Mul", ["s_out", "two"], ["y"])],
        "body", [_vi("s", [2]), _vi("xt", [2])], [_vi("s_out", [2]), _vi("y", [2])],
        [numpy_helper.from_array(np.float32(2.0).reshape(()), "two")])


@pytest.mark.parametrize("axes", [dict(), dict(scan_input_axes=[1], scan_input_directions=[1]),
                                  dict(scan_output_axes=[-1], scan_output_directions=[1]),
                                  dict(scan_input_axes=[-1], scan_output_axes=[1])])
def test_scan_is_unrolled(axes):
    length = 5
    x_shape = [length, 2] if axes.get("scan_input_axes", [0])[0] == 0 else [2, length]
    out_shape = [length, 2] if axes.get("scan_output_axes", [0])[0] == 0 else [2, length]
    nodes = [helper.make_node("Scan", ["s0", "x"], ["s", "ys"], name="scan", body=_scan_body(), num_scan_inputs=1,
                              **axes)]
    model = _model(nodes, [_vi("s0", [2]), _vi("x", x_shape)], [_vi("s", [2]), _vi("ys", out_shape)], opset=11)
    rng = np.random.default_rng(3)
    _check(model, {"s0": rng.standard_normal(2).astype(np.float32),
                   "x": rng.standard_normal(x_shape).astype(np.float32)})


def test_scan_opset8_batched():
    body = _scan_body()
    nodes = [helper.make_node("Scan", ["", "s0", "x"], ["s", "ys"], body=body, num_scan_inputs=1, directions=[1])]
    model = _model(nodes, [_vi("s0", [3, 2]), _vi("x", [3, 4, 2])], [_vi("s", [3, 2]), _vi("ys", [3, 4, 2])],
                   opset=8)
    rng = np.random.default_rng(4)
    _check(model, {"s0": rng.standard_normal((3, 2)).astype(np.float32),
                   "x": rng.standard_normal((3, 4, 2)).astype(np.float32)})


def test_sequence_typed_branch_is_resolved():
    """A branch returning a sequence: inlined here, resolved into tensors by polyc.onnx.sequences."""
    then_b = _branch("then", [helper.make_node("SequenceConstruct", ["x"], ["sq"])],
                     [helper.make_tensor_sequence_value_info("sq", TensorProto.FLOAT, [2])])
    else_b = _branch("else", [helper.make_node("SequenceConstruct", ["x"], ["sq2"])],
                     [helper.make_tensor_sequence_value_info("sq2", TensorProto.FLOAT, [2])])
    nodes = [helper.make_node("If", ["c"], ["seq"], name="seqif", then_branch=then_b, else_branch=else_b),
             helper.make_node("SequenceAt", ["seq", "zero"], ["y"])]
    model = _model(nodes, [_vi("x", [2])], [_vi("y", [2])],
                   [numpy_helper.from_array(np.array(True), "c"),
                    numpy_helper.from_array(np.array(0, np.int64), "zero")])
    x = np.arange(2, dtype=np.float32)
    np.testing.assert_array_equal(polyc.onnx.compile(model)({"x": x})[0], x)


def test_stacked_bidirectional_lstms_as_exported_by_frameworks():
    # LSTM -> Transpose/Reshape (Y [T, 2, B, H] -> [T, B, 2H]) -> LSTM -> Squeeze, weights as initializers
    rng = np.random.default_rng(5)
    t, b, i, h = 4, 3, 5, 6

    def w(*shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.4).astype(np.float32))
    inits = [w(2, 4 * h, i), w(2, 4 * h, h), w(2, 8 * h), w(1, 4 * h, 2 * h), w(1, 4 * h, h), w(1, 8 * h)]
    for init, name in zip(inits, ["W1", "R1", "B1", "W2", "R2", "B2"]):
        init.name = name
    inits.append(numpy_helper.from_array(np.array([t, b, 2 * h], np.int64), "shape"))
    inits.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
    nodes = [helper.make_node("LSTM", ["x", "W1", "R1", "B1"], ["y1"], hidden_size=h, direction="bidirectional"),
             helper.make_node("Transpose", ["y1"], ["y1t"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["y1t", "shape"], ["x2"]),
             helper.make_node("LSTM", ["x2", "W2", "R2", "B2"], ["y2", "h2"], hidden_size=h),
             helper.make_node("Squeeze", ["y2", "axes"], ["out"])]
    model = _model(nodes, [_vi("x", [t, b, i])], [_vi("out", [t, b, h]), _vi("h2", [1, b, h])], inits)
    _check(model, {"x": rng.standard_normal((t, b, i)).astype(np.float32)})
