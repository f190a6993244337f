"""Malformed and hostile ONNX models (issue 16, items 5, 6 and 11): each must raise a ``polyc.PolycError``
that names the node (or the problem) — never a foreign exception, a crash, or a model that compiles and then
reads out of bounds. The models are tiny, so the whole suite stays fast."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
import polyc.onnx as ponnx
from polyc.errors import ShapeError, UnsupportedError
from polyc.onnx import ModelError
from polyc.onnx.graph import from_model
from polyc.onnx.validate import check_shapes

import onnxruntime  # noqa: E402  (a test dependency: a missing install must fail, not skip)

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def vi(name, shape, elem=F):
    """A value info; ``shape`` an int gives that rank with symbolic dims (a graph output must have a shape)."""
    if isinstance(shape, int):
        shape = [f"{name}_{k}" for k in range(shape)]
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, value):
    return numpy_helper.from_array(np.asarray(value), name)


def model(nodes, inputs, outputs, inits=(), opset=17, ir_version=8, value_info=()):
    graph = helper.make_graph(nodes, "malformed", inputs, outputs, initializer=list(inits),
                              value_info=list(value_info))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = ir_version
    return m


def node(op, inputs, outputs, name, **attrs):
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


def i64(*values):
    return np.array(values, np.int64)


# ---- (model, expected error class, regex the message must match) --------------------------------------------
CASES = {
    # item 5: movement ops whose output does not fit their input
    "reshape_to_a_bigger_shape": (model(
        [node("Reshape", ["x", "s"], ["y"], "R"), node("Relu", ["y"], ["z"], "relu")],
        [vi("x", [16, 16])], [vi("z", 2)], [const("s", i64(4096, 4096))]),
        ModelError, r"node R \(Reshape\).*256 elements.*16777216 elements"),
    "reshape_to_a_smaller_count": (model(
        [node("Reshape", ["x", "s"], ["y"], "R")], [vi("x", [2, 3])], [vi("y", 2)], [const("s", i64(4, 4))]),
        ModelError, r"node R \(Reshape\).*\[4, 4\]"),
    "reshape_minus_one_does_not_divide": (model(
        [node("Reshape", ["x", "s"], ["y"], "R")], [vi("x", [2, 3])], [vi("y", 2)], [const("s", i64(4, -1))]),
        ModelError, r"\bR\b.*Reshape|Reshape.*\bR\b"),
    "gather_constant_index_out_of_range": (model(
        [node("Gather", ["x", "i"], ["y"], "G")], [vi("x", [4, 3])], [vi("y", 2)], [const("i", i64(0, 7))]),
        ModelError, r"node G \(Gather\): index 7 is out of range for axis 0 of extent 4"),
    "gather_negative_index_out_of_range": (model(
        [node("Gather", ["x", "i"], ["y"], "G", axis=1)], [vi("x", [4, 3])], [vi("y", 2)], [const("i", i64(-4))]),
        ModelError, r"node G \(Gather\): index -4"),
    "gather_of_constants_folds_or_names_the_node": (model(
        [node("Gather", ["d", "i"], ["g"], "G"), node("Add", ["x", "g"], ["y"], "A")],
        [vi("x", [3])], [vi("y", 1)], [const("d", np.ones((4, 3), np.float32)), const("i", np.array(9, np.int64))]),
        ModelError, r"node G \(Gather\): index 9"),
    "expand_incompatible": (model(
        [node("Expand", ["x", "s"], ["y"], "E")], [vi("x", [3, 2])], [vi("y", 2)], [const("s", i64(4, 4))]),
        ModelError, r"\bE\b.*Expand|Expand.*\bE\b"),
    "transpose_repeated_perm": (model(
        [node("Transpose", ["x"], ["y"], "Tr", perm=[0, 0])], [vi("x", [3, 2])], [vi("y", 2)]),
        ModelError, r"Tr\b.*perm|perm.*Tr\b"),
    "transpose_perm_too_short": (model(
        [node("Transpose", ["x"], ["y"], "Tr", perm=[1])], [vi("x", [3, 2])], [vi("y", 2)]),
        ModelError, r"Tr\b"),
    "split_sizes_do_not_add_up": (model(
        [node("Split", ["x", "sp"], ["a", "b"], "Sp", axis=0)], [vi("x", [3, 2])], [vi("a", 2), vi("b", 2)],
        [const("sp", i64(2, 2))]), ModelError, r"Sp\b.*split|split.*Sp\b"),
    "slice_axis_out_of_range": (model(
        [node("Slice", ["x", "st", "en", "ax"], ["y"], "Sl")], [vi("x", [3, 2])], [vi("y", 2)],
        [const("st", i64(0)), const("en", i64(1)), const("ax", i64(4))]), ModelError, r"Sl\b.*axis|axis.*Sl\b"),
    "slice_step_zero": (model(
        [node("Slice", ["x", "st", "en", "ax", "sp"], ["y"], "Sl")], [vi("x", [3, 2])], [vi("y", 2)],
        [const("st", i64(0)), const("en", i64(1)), const("ax", i64(0)), const("sp", i64(0))]),
        ModelError, r"Sl\b"),
    "concat_mismatched_dims": (model(
        [node("Concat", ["x", "w"], ["y"], "Cc", axis=0)], [vi("x", [3, 2]), vi("w", [3, 4])], [vi("y", 2)]),
        ModelError, r"Cc\b"),
    "concat_axis_out_of_range": (model(
        [node("Concat", ["x", "w"], ["y"], "Cc", axis=3)], [vi("x", [3, 2]), vi("w", [3, 2])], [vi("y", 2)]),
        ModelError, r"Cc\b"),
    "squeeze_a_dim_that_is_not_one": (model(
        [node("Squeeze", ["x", "ax"], ["y"], "Sq")], [vi("x", [3, 2])], [vi("y", 1)], [const("ax", i64(0))]),
        ModelError, r"Sq\b"),
    "unsqueeze_axis_out_of_range": (model(
        [node("Unsqueeze", ["x", "ax"], ["y"], "Usq")], [vi("x", [3, 2])], [vi("y", 3)], [const("ax", i64(5))]),
        ModelError, r"Usq\b"),
    "tile_repeats_of_wrong_length": (model(
        [node("Tile", ["x", "r"], ["y"], "Ti")], [vi("x", [3, 2])], [vi("y", 2)], [const("r", i64(2))]),
        ModelError, r"Ti\b"),
    "flatten_axis_out_of_range": (model(
        [node("Flatten", ["x"], ["y"], "Fl", axis=5)], [vi("x", [3, 2])], [vi("y", 2)]), ModelError, r"Fl\b"),
    "layernorm_axis_out_of_range": (model(
        [node("LayerNormalization", ["x", "s"], ["y"], "LN", axis=1 << 40)], [vi("x", [2, 3])], [vi("y", 2)],
        [const("s", np.ones(3, np.float32))]), ModelError, r"node LN \(LayerNormalization\): axis 1099511627776"),
    "softmax_axis_out_of_range": (model(
        [node("Softmax", ["x"], ["y"], "SM", axis=-3)], [vi("x", [2, 3])], [vi("y", 2)]), ModelError, r"SM\b"),
    "reduce_axes_repeated": (model(
        [node("ReduceSum", ["x", "ax"], ["y"], "RS")], [vi("x", [2, 3])], [vi("y", 2)], [const("ax", i64(1, -1))]),
        ModelError, r"RS\b"),
    "pad_with_too_few_values": (model(
        [node("Pad", ["x", "p"], ["y"], "P")], [vi("x", [3, 2])], [vi("y", 2)], [const("p", i64(1, 1))]),
        ModelError, r"\bP\b"),
    # item 11: a kernel larger than its input
    "conv_kernel_larger_than_input": (model(
        [node("Conv", ["x", "w"], ["y"], "C")], [vi("x", [1, 1, 3, 3])], [vi("y", 4)],
        [const("w", np.ones((1, 1, 5, 5), np.float32))]),
        ModelError, r"node C \(Conv\).*x float32\[1x1x3x3\].*w float32\[1x1x5x5\]"),
    "maxpool_kernel_larger_than_input": (model(
        [node("MaxPool", ["x"], ["y"], "MP", kernel_shape=[4, 4])], [vi("x", [1, 1, 3, 3])], [vi("y", 4)]),
        polyc.PolycError, r"node MP \(MaxPool\).*[\[(]1, 1, 0, 0[\])]"),
    "maxpool_kernel_larger_than_padded_input": (model(
        [node("MaxPool", ["x"], ["y"], "MP", kernel_shape=[6, 6], pads=[1, 1, 0, 0])], [vi("x", [1, 1, 3, 3])],
        [vi("y", 4)]), ModelError, r"node MP \(MaxPool\).*kernel_shape"),
    "conv_channels_mismatch": (model(
        [node("Conv", ["x", "w"], ["y"], "C")], [vi("x", [1, 3, 5, 5])], [vi("y", 4)],
        [const("w", np.ones((2, 4, 3, 3), np.float32))]), ModelError, r"\bC\b.*Conv|Conv.*\bC\b|channel"),
    "conv_bias_of_wrong_length": (model(
        [node("Conv", ["x", "w", "b"], ["y"], "C")], [vi("x", [1, 3, 5, 5])], [vi("y", 4)],
        [const("w", np.ones((4, 3, 3, 3), np.float32)), const("b", np.ones(3, np.float32))]),
        ModelError, r"node C \(Conv\): bias 'b' of shape \[3\] should have shape \[4\]"),
    "gemm_bias_does_not_broadcast": (model(
        [node("Gemm", ["x", "w", "c"], ["y"], "G", transB=1)], [vi("x", [1, 6])], [vi("y", 2)],
        [const("w", np.ones((5, 6), np.float32)), const("c", np.ones(4, np.float32))]),
        ModelError, r"node G \(Gemm\): C 'c' of shape \[4\]"),
    "batchnorm_params_of_wrong_length": (model(
        [node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], "BN")], [vi("x", [1, 3, 2, 2])], [vi("y", 4)],
        [const(n, np.ones(k, np.float32)) for n, k in (("s", 3), ("b", 3), ("m", 2), ("v", 3))]),
        polyc.PolycError, r"BN\b"),
    # item 11: opsets, sizes
    "opset_99": (model([node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], [vi("y", [2])], opset=99),
                 UnsupportedError, r"opset 99.*opsets 7 to \d+"),
    "opset_0": (model([node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], [vi("y", [2])], opset=0),
                polyc.PolycError, r"opset"),
    "huge_input": (model([node("Relu", ["x"], ["y"], "r")], [vi("x", [1 << 20, 1 << 20])], [vi("y", 2)]),
                   UnsupportedError, r"input 'x'.*needs 4\.00 TiB \(4398046511104 bytes\)"),
    "huge_constant_of_shape": (model(
        [node("ConstantOfShape", ["s"], ["y"], "COS")], [], [vi("y", 2)], [const("s", i64(1 << 20, 1 << 20))]),
        UnsupportedError, r"node COS \(ConstantOfShape\).*4398046511104 bytes"),
    "huge_constant_of_shape_feeding_an_op": (model(
        [node("ConstantOfShape", ["s"], ["c"], "COS"), node("Add", ["x", "c"], ["y"], "A")],
        [vi("x", [1])], [vi("y", 3)], [const("s", i64(1 << 16, 1 << 16, 1 << 16))]),
        UnsupportedError, r"COS.*bytes"),
    # the onnx checker's classes
    "undefined_node_input": (model(
        [node("Relu", ["nowhere"], ["y"], "r")], [vi("x", [2])], [vi("y", [2])]),
        ModelError, r"node r \(Relu\) reads tensor 'nowhere'"),
    "missing_required_input": (model(
        [node("Add", ["x"], ["y"], "A")], [vi("x", [2])], [vi("y", [2])]), ModelError, r"\bA\b|Add"),
    "dangling_graph_output": (model(
        [node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], [vi("y", [2]), vi("ghost", [2])]),
        ModelError, r"ghost"),
    "two_nodes_write_one_tensor": (model(
        [node("Relu", ["x"], ["y"], "r1"), node("Neg", ["x"], ["y"], "r2")], [vi("x", [2])], [vi("y", [2])]),
        ModelError, r"'y'|\by\b"),
    "duplicate_graph_inputs": (model(
        [node("Relu", ["x"], ["y"], "r")], [vi("x", [2]), vi("x", [2])], [vi("y", [2])]), ModelError, r"\bx\b"),
    "cycle": (model(
        [node("Relu", ["b"], ["a"], "first"), node("Neg", ["a"], ["b"], "second")], [vi("x", [2])], [vi("a", [2])]),
        ModelError, r"node first \(Relu\) reads tensor 'b'"),
    "wrong_element_type_mix": (model(
        [node("Add", ["x", "k"], ["y"], "A")], [vi("x", [2]), vi("k", [2], I64)], [vi("y", [2])]),
        ModelError, r"\bA\b|Add"),
    "string_tensor": (model(  # a numeric op on strings (the host runs only the string ops: onnx/strings.py)
        [node("Concat", ["x", "x"], ["y"], "Cat", axis=0)], [vi("x", [2], TensorProto.STRING)],
        [vi("y", [4], TensorProto.STRING)]),
        polyc.PolycError, r"string.*Cat"),
    "unknown_op": (model([node("FooBar", ["x"], ["y"], "fb")], [vi("x", [2])], [vi("y", [2])]),
                   ModelError, r"FooBar"),
    "unknown_domain_not_imported": (model(
        [helper.make_node("Thing", ["x"], ["y"], name="th", domain="com.example")], [vi("x", [2])], [vi("y", [2])]),
        polyc.PolycError, r"com\.example|Thing"),
    "missing_required_attribute": (model(
        [node("Cast", ["x"], ["y"], "cast")], [vi("x", [2])], [vi("y", [2])]), ModelError, r"\bto\b"),
    "attribute_of_wrong_type": (model(
        [node("Transpose", ["x"], ["y"], "Tr", perm=[1.0, 0.0])], [vi("x", [3, 2])], [vi("y", 2)]),
        ModelError, r"perm"),
    "unknown_attribute": (model(
        [node("Relu", ["x"], ["y"], "r", flavour=3)], [vi("x", [2])], [vi("y", [2])]),
        polyc.PolycError, r"flavour"),
    "conv_strides_of_wrong_length": (model(
        [node("Conv", ["x", "w"], ["y"], "C", strides=[1, 1, 1])], [vi("x", [1, 1, 5, 5])], [vi("y", 4)],
        [const("w", np.ones((1, 1, 3, 3), np.float32))]), ModelError, r"\bC\b|Conv|strides"),
    "matmul_inner_dims_differ": (model(
        [node("MatMul", ["x", "w"], ["y"], "MM")], [vi("x", [3, 2]), vi("w", [4, 2])], [vi("y", 2)]),
        ModelError, r"MM\b"),
    "add_shapes_do_not_broadcast": (model(
        [node("Add", ["x", "w"], ["y"], "A")], [vi("x", [3, 2]), vi("w", [4, 2])], [vi("y", 2)]),
        ModelError, r"\bA\b"),
    "declared_output_shape_contradicts": (model(
        [node("Relu", ["x"], ["y"], "r")], [vi("x", [3, 2])], [vi("y", [2, 3])]), ModelError, r"\br\b|Relu"),
    "empty_graph": (model([], [], []), polyc.PolycError, r"output|empty|nothing"),
    "graph_without_outputs": (model([node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], []),
                              polyc.PolycError, r"output"),
    "initializer_with_wrong_byte_count": (None, ModelError, r"\bw\b.*bytes"),  # built below
    "dynamic_input_not_pinned": (model([node("Relu", ["x"], ["y"], "r")], [vi("x", ["n", 2])], [vi("y", 2)]),
                                 ShapeError, r"input 'x'.*dynamic"),
    "subgraph_attribute": (model(
        [node("If", ["c"], ["y"], "branch",
              then_branch=helper.make_graph([node("Constant", [], ["t"], "ct", value=const("v", np.ones(2, np.float32)))],
                                            "then", [], [vi("t", [2])]),
              else_branch=helper.make_graph([node("Constant", [], ["e"], "ce", value=const("v", np.zeros(2, np.float32)))],
                                            "else", [], [vi("e", [2])]))],
        [vi("c", [], TensorProto.BOOL)], [vi("y", [2])]), UnsupportedError, r"branch.*If|If.*branch"),
}


def _bad_initializer():
    w = const("w", np.ones(4, np.float32))
    w.raw_data = w.raw_data[:6]  # 6 bytes for 4 floats
    return model([node("Add", ["x", "w"], ["y"], "A")], [vi("x", [4])], [vi("y", [4])], [w])


CASES["initializer_with_wrong_byte_count"] = (_bad_initializer(),) + CASES["initializer_with_wrong_byte_count"][1:]


@pytest.mark.parametrize("name", sorted(CASES))
def test_malformed_model_raises_a_clear_polyc_error(name):
    proto, error, pattern = CASES[name]
    with pytest.raises(polyc.PolycError) as info:
        ponnx.compile(proto)
    assert isinstance(info.value, error), f"{type(info.value).__name__}: {info.value}"
    assert info.value.message and __import__("re").search(pattern, str(info.value), __import__("re").S), \
        str(info.value)


def test_onnxruntime_rejects_the_reshape_polyc_rejects():
    proto = CASES["reshape_to_a_smaller_count"][0]
    with pytest.raises(Exception):
        session = onnxruntime.InferenceSession(proto.SerializeToString())
        session.run(None, {"x": np.ones((2, 3), np.float32)})


@pytest.mark.parametrize("data", [b"", b"not an onnx model at all", bytes(range(256)) * 3, b"\x08\x07\x12"])
def test_non_model_bytes(data):
    with pytest.raises(polyc.PolycError):
        ponnx.compile(data)


def test_truncated_file_and_missing_path_and_wrong_type(tmp_path):
    good = model([node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], [vi("y", [2])]).SerializeToString()
    for cut in (len(good) // 2, len(good) - 3, 5):
        path = tmp_path / f"cut{cut}.onnx"
        path.write_bytes(good[:cut])
        with pytest.raises(polyc.PolycError):
            ponnx.compile(str(path))
    with pytest.raises(ModelError, match="cannot read"):
        ponnx.compile(str(tmp_path / "missing.onnx"))
    with pytest.raises(UnsupportedError, match="int"):
        ponnx.compile(42)
    with pytest.raises(ModelError, match="cannot read|not an ONNX model"):
        polyc.onnx.backend.prepare(b"garbage bytes")


def test_old_opset_is_converted_and_runs_right():
    proto = model([node("Add", ["x", "b"], ["s"], "A"), node("Relu", ["s"], ["y"], "r")],
                  [vi("x", [2, 3]), vi("b", [2, 3])], [vi("y", [2, 3])], [const("b", np.full((2, 3), -0.5, np.float32))],
                  opset=6, ir_version=3)
    compiled = ponnx.compile(proto)
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(compiled.run({"x": x})[0], np.maximum(x - 0.5, 0))


def test_bad_feeds_at_run_time():
    compiled = ponnx.compile(model([node("Relu", ["x"], ["y"], "r")], [vi("x", [2])], [vi("y", [2])]))
    with pytest.raises(ShapeError, match="'x'"):
        compiled.run({"x": "abc"})
    with pytest.raises(ShapeError, match="'x'"):
        compiled.run({"x": [[1.0, 2.0]]})
    with pytest.raises(ShapeError, match="missing input 'x'"):
        compiled.run({})
    np.testing.assert_array_equal(compiled.run({"x": [1.0, -2.0]})[0], np.array([1.0, 0.0], np.float32))


def test_an_unfoldable_node_stays_and_folding_never_leaks_a_foreign_exception():
    from polyc.onnx.passes import fold_constants

    proto = CASES["gather_of_constants_folds_or_names_the_node"][0]
    g = fold_constants(from_model(proto))  # the reference evaluator rejects index 9: the node stays
    assert any(d["op"] == "Gather" for _, d in g.nodes(data=True))


# ---- check_shapes on graphs whose declared shapes onnx's inference would have rejected -----------------------
# (from_model on an unchecked model keeps the declared value_info shapes, as a graph pass could get them wrong)
DIRECT = {
    "Transpose": ([node("Transpose", ["x"], ["y"], "n", perm=[1, 0])], [3, 2], [3, 2], [], r"\[2, 3\]"),
    "Gather": ([node("Gather", ["x", "i"], ["y"], "n")], [4, 3], [2, 3], [const("i", i64(1, 4))], r"index 4"),
    "Slice": ([node("Slice", ["x", "st", "en"], ["y"], "n")], [4, 3], [3, 3], [const("st", i64(1)), const("en", i64(3))],
              r"\[2, 3\]"),
    "Concat": ([node("Concat", ["x", "x"], ["y"], "n", axis=1)], [4, 3], [4, 7], [], r"\[4, 6\]"),
    "Split": ([node("Split", ["x"], ["y", "z"], "n", axis=0)], [4, 3], [3, 3], [], r"split"),
    "Tile": ([node("Tile", ["x", "r"], ["y"], "n")], [4, 3], [8, 9], [const("r", i64(2, 2))], r"\[8, 6\]"),
    "Pad": ([node("Pad", ["x", "p"], ["y"], "n")], [4, 3], [6, 3], [const("p", i64(1, 0, 1, 1))], r"\[6, 4\]"),
    "Expand": ([node("Expand", ["x", "s"], ["y"], "n")], [4, 3], [4, 5], [const("s", i64(4, 5))], r"broadcast"),
    "Unsqueeze": ([node("Unsqueeze", ["x", "a"], ["y"], "n")], [4, 3], [1, 4, 4], [const("a", i64(0))],
                  r"12 elements.*16 elements"),
    "Mul": ([node("Mul", ["x", "x"], ["y"], "n")], [4, 3], [4, 2], [], r"broadcast"),
}


@pytest.mark.parametrize("op", sorted(DIRECT))
def test_check_shapes_names_the_node_whose_output_does_not_fit(op):
    nodes, x, y, inits, pattern = DIRECT[op]
    outs = [o for o in nodes[0].output]
    proto = model(nodes, [vi("x", x)], [vi(o, y) for o in outs], inits)
    g = from_model(proto)  # no checker, no shape inference: the declared shapes stand
    with pytest.raises(ModelError, match=rf"node n \({op}\)(.|\n)*{pattern}"):
        check_shapes(g)


def test_check_shapes_accepts_a_right_graph():
    proto = model([node("Transpose", ["x"], ["t"], "tr", perm=[1, 0]), node("Gather", ["t", "i"], ["y"], "g")],
                  [vi("x", [4, 3])], [vi("y", [2, 4])], [const("i", i64(2, -1))], value_info=[vi("t", [3, 4])])
    check_shapes(from_model(proto))  # raises nothing
    compiled = ponnx.compile(proto)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(compiled.run({"x": x})[0], x.T[[2, -1]])


def test_an_arena_larger_than_memory_is_refused_before_it_is_allocated(monkeypatch):
    import polyc.onnx.validate as validate

    proto = model([node("Relu", ["x"], ["a"], "r"), node("Neg", ["x"], ["b"], "n"), node("Mul", ["a", "x"], ["m"], "m1"),
                   node("Add", ["m", "b"], ["y"], "add")], [vi("x", [16])], [vi("y", [16])])
    monkeypatch.setattr(validate, "memory_limit", lambda: 100)  # each tensor (64 bytes) fits, two at once do not
    with pytest.raises(UnsupportedError, match=r"arena.*needs \d+ bytes, more than this machine's memory"):
        ponnx.compile(proto)
    monkeypatch.undo()
    x = np.linspace(-1, 1, 16, dtype=np.float32)
    np.testing.assert_allclose(ponnx.compile(proto).run({"x": x})[0], np.maximum(x, 0) * x - x, rtol=1e-6)


@pytest.mark.parametrize("shape", [(-1, 2), ("a", 2), (2 ** 70, 2), (1.5, 2), None, 5, (3,)])
def test_bad_input_shapes_argument(shape):
    proto = model([node("Relu", ["x"], ["y"], "r")], [vi("x", ["n", 2])], [vi("y", ["n", 2])])
    with pytest.raises(ShapeError, match=r"input_shapes\['x'\]"):
        ponnx.compile(proto, input_shapes={"x": shape})


def test_bad_options_argument_and_good_pinned_shapes():
    proto = model([node("Relu", ["x"], ["y"], "r")], [vi("x", ["n", 2])], [vi("y", ["n", 2])])
    with pytest.raises(UnsupportedError, match="polyc.Options"):
        ponnx.compile(proto, options=3, input_shapes={"x": (2, 2)})
    with pytest.raises(polyc.PolycError, match="bogus"):
        ponnx.compile(proto, options="bogus", input_shapes={"x": (2, 2)})
    with pytest.raises(ShapeError, match="must map input names"):
        ponnx.compile(proto, input_shapes=[2, 2])
    compiled = ponnx.compile(proto, input_shapes={"x": np.array([3, 2])})
    x = np.array([[1, -1], [-2, 2], [0, 3]], np.float32)
    np.testing.assert_array_equal(compiled.run({"x": x})[0], np.maximum(x, 0))
