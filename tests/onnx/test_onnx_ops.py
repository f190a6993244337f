"""Each supported op as a one-node model, compiled by polyc and compared with onnxruntime, across opsets.

The cases cover the attributes ONNX defines for each op and the opset-dependent forms (attributes that
became inputs; Softmax's flatten-at-axis rule before 13).
"""
import numpy as np
import pytest
from onnx import helper

import polyc.onnx
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def ort_session(model):
    """An onnxruntime session with warnings silenced."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

R = np.random.default_rng(0)


def f32(*shape, lo=None):
    a = R.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.1 if lo == "pos" else a


def i64(values):
    return np.array(values, dtype=np.int64)


# (id, op, opset, attrs, inputs (graph inputs), constants (initializers), number of outputs)
CASES = [
    ("relu", "Relu", 13, {}, {"x": f32(2, 3, 4)}, {}, 1),
    ("sigmoid", "Sigmoid", 13, {}, {"x": f32(2, 3, 4)}, {}, 1),
    ("tanh", "Tanh", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("exp", "Exp", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("log", "Log", 13, {}, {"x": f32(5, 7, lo="pos")}, {}, 1),
    ("sqrt", "Sqrt", 13, {}, {"x": f32(5, 7, lo="pos")}, {}, 1),
    ("erf", "Erf", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("neg", "Neg", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("abs", "Abs", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("reciprocal", "Reciprocal", 13, {}, {"x": f32(5, 7, lo="pos")}, {}, 1),
    ("floor", "Floor", 13, {}, {"x": f32(5, 7)}, {}, 1),
    ("leaky_relu", "LeakyRelu", 13, {"alpha": 0.2}, {"x": f32(3, 5)}, {}, 1),
    ("gelu", "Gelu", 20, {}, {"x": f32(3, 5)}, {}, 1),
    ("gelu_tanh", "Gelu", 20, {"approximate": "tanh"}, {"x": f32(3, 5)}, {}, 1),
    ("clip_v7_attrs", "Clip", 7, {"min": -0.5, "max": 0.7}, {"x": f32(3, 5)}, {}, 1),
    ("clip_v13_inputs", "Clip", 13, {}, {"x": f32(3, 5)},
     {"lo": np.array(-0.5, np.float32), "hi": np.array(0.7, np.float32)}, 1),
    ("clip_v13_min_only", "Clip", 13, {}, {"x": f32(3, 5)}, {"lo": np.array(-0.5, np.float32)}, 1),
    ("add_broadcast", "Add", 13, {}, {"a": f32(2, 3, 4), "b": f32(3, 1)}, {}, 1),
    ("sub_scalar_const", "Sub", 13, {}, {"a": f32(2, 3)}, {"b": np.array([1.5], np.float32)}, 1),
    ("mul_rows", "Mul", 7, {}, {"a": f32(4, 1, 5), "b": f32(3, 1)}, {}, 1),
    ("div", "Div", 13, {}, {"a": f32(2, 3), "b": f32(2, 3, lo="pos")}, {}, 1),
    ("pow", "Pow", 13, {}, {"a": f32(2, 3, lo="pos"), "b": f32(3)}, {}, 1),
    ("pow_square", "Pow", 13, {}, {"a": f32(2, 3)}, {"b": np.array(2.0, np.float32)}, 1),
    ("sum3", "Sum", 13, {}, {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}, {}, 1),
    ("max3", "Max", 13, {}, {"a": f32(2, 3), "b": f32(3), "c": f32(2, 1)}, {}, 1),
    ("min2", "Min", 13, {}, {"a": f32(2, 3), "b": f32(2, 3)}, {}, 1),
    ("cast_f2i", "Cast", 13, {"to": 6}, {"x": f32(3, 4) * 4}, {}, 1),
    ("cast_f2d", "Cast", 13, {"to": 11}, {"x": f32(3, 4)}, {}, 1),
    ("conv_pads_strides", "Conv", 11, {"pads": [1, 2, 1, 0], "strides": [2, 1]},
     {"x": f32(1, 3, 9, 8)}, {"w": f32(4, 3, 3, 3), "b": f32(4)}, 1),
    ("conv_7x5_strides_2x3", "Conv", 11, {"pads": [3, 2, 2, 1], "strides": [2, 3]}, {"x": f32(1, 3, 17, 14)},
     {"w": f32(4, 3, 7, 5), "b": f32(4)}, 1),
    ("conv_1x1_stride2", "Conv", 11, {"strides": [2, 2]}, {"x": f32(1, 5, 9, 8)}, {"w": f32(6, 5, 1, 1)}, 1),
    ("conv_dilation_group", "Conv", 11, {"dilations": [2, 2], "group": 2, "pads": [2, 2, 2, 2]},
     {"x": f32(2, 4, 7, 7)}, {"w": f32(6, 2, 3, 3)}, 1),
    ("conv_depthwise", "Conv", 11, {"group": 5, "pads": [1, 1, 1, 1]}, {"x": f32(1, 5, 6, 6)}, {"w": f32(5, 1, 3, 3)}, 1),
    ("conv_same_upper", "Conv", 11, {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, {"x": f32(1, 2, 7, 6)},
     {"w": f32(3, 2, 4, 4)}, 1),
    ("conv_same_lower", "Conv", 11, {"auto_pad": "SAME_LOWER"}, {"x": f32(1, 2, 5, 5)}, {"w": f32(3, 2, 2, 2)}, 1),
    ("conv_valid_1d", "Conv", 11, {"auto_pad": "VALID"}, {"x": f32(2, 3, 11)}, {"w": f32(4, 3, 3)}, 1),
    # narrow outputs with many channels compute channels-last (output channel as the vector dimension)
    ("conv_channels_last_3x3_bias", "Conv", 11, {"pads": [1, 1, 1, 1]}, {"x": f32(1, 7, 7, 7)},
     {"w": f32(37, 7, 3, 3), "b": f32(37)}, 1),
    ("conv_channels_last_1x1_stride2", "Conv", 11, {"strides": [2, 2]}, {"x": f32(2, 5, 13, 11)},
     {"w": f32(33, 5, 1, 1)}, 1),
    ("conv_channels_last_1d", "Conv", 11, {"pads": [2, 1]}, {"x": f32(1, 3, 9)}, {"w": f32(40, 3, 4)}, 1),
    # a window over a width whose tiles leave lanes empty, with channels that fill them (28 columns, 64 channels)
    ("conv_channels_last_wide_3x3", "Conv", 11, {"pads": [1, 1, 1, 1]}, {"x": f32(1, 5, 28, 28)},
     {"w": f32(64, 5, 3, 3), "b": f32(64)}, 1),
    ("conv_3d", "Conv", 11, {"pads": [1, 0, 1, 1, 0, 1]}, {"x": f32(1, 2, 4, 5, 3)}, {"w": f32(2, 2, 3, 2, 3)}, 1),
    ("conv_transpose", "ConvTranspose", 11, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"x": f32(1, 3, 4, 5)},
     {"w": f32(3, 2, 3, 3), "b": f32(2)}, 1),
    ("conv_transpose_outpad_group", "ConvTranspose", 11,
     {"strides": [2, 3], "output_padding": [1, 1], "group": 2}, {"x": f32(1, 4, 3, 3)}, {"w": f32(4, 1, 2, 3)}, 1),
    ("conv_transpose_output_shape", "ConvTranspose", 11, {"strides": [2, 2], "output_shape": [9, 10]},
     {"x": f32(1, 2, 4, 5)}, {"w": f32(2, 3, 3, 3)}, 1),
    ("gemm_trans_alpha_beta", "Gemm", 11, {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0},
     {"a": f32(4, 3)}, {"b": f32(5, 4), "c": f32(5)}, 1),
    ("gemm_c_column", "Gemm", 13, {}, {"a": f32(3, 4), "b": f32(4, 5), "c": f32(3, 1)}, {}, 1),
    ("gemm_no_c", "Gemm", 13, {}, {"a": f32(3, 4), "b": f32(4, 5)}, {}, 1),
    ("matmul_2d", "MatMul", 13, {}, {"a": f32(3, 4), "b": f32(4, 5)}, {}, 1),
    ("matmul_batched_broadcast", "MatMul", 13, {}, {"a": f32(2, 1, 3, 4), "b": f32(5, 4, 6)}, {}, 1),
    ("matmul_vec_left", "MatMul", 13, {}, {"a": f32(4), "b": f32(2, 4, 3)}, {}, 1),
    ("matmul_vec_right", "MatMul", 13, {}, {"a": f32(2, 3, 4), "b": f32(4)}, {}, 1),
    ("batchnorm_inputs", "BatchNormalization", 15, {"epsilon": 1e-3},
     {"x": f32(2, 3, 4, 5), "s": f32(3), "bb": f32(3), "m": f32(3), "v": f32(3, lo="pos")}, {}, 1),
    ("lrn", "LRN", 13, {"size": 3, "alpha": 1e-3, "beta": 0.75, "bias": 2.0}, {"x": f32(1, 6, 4, 4)}, {}, 1),
    ("maxpool_pads_strides", "MaxPool", 12, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     {"x": f32(1, 2, 9, 8)}, {}, 1),
    ("maxpool_ceil_dilation", "MaxPool", 12, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1,
                                              "dilations": [2, 1]}, {"x": f32(1, 2, 9, 8)}, {}, 1),
    ("maxpool_same_upper", "MaxPool", 12, {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
     {"x": f32(1, 2, 7, 8)}, {}, 1),
    ("avgpool_exclude_pad", "AveragePool", 11, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     {"x": f32(1, 2, 9, 8)}, {}, 1),
    ("avgpool_include_pad", "AveragePool", 11, {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1],
                                                "count_include_pad": 1}, {"x": f32(1, 2, 6, 5)}, {}, 1),
    ("avgpool_ceil", "AveragePool", 11, {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
     {"x": f32(1, 2, 5, 7)}, {}, 1),
    ("global_avgpool", "GlobalAveragePool", 13, {}, {"x": f32(2, 3, 5, 4)}, {}, 1),
    ("global_maxpool", "GlobalMaxPool", 13, {}, {"x": f32(2, 3, 5, 4)}, {}, 1),
    ("softmax_v11_flatten", "Softmax", 11, {"axis": 1}, {"x": f32(2, 3, 4)}, {}, 1),
    ("softmax_v13_axis", "Softmax", 13, {"axis": 1}, {"x": f32(2, 3, 4)}, {}, 1),
    ("softmax_v13_default", "Softmax", 13, {}, {"x": f32(2, 3, 4)}, {}, 1),
    ("logsoftmax_v11", "LogSoftmax", 11, {}, {"x": f32(2, 3, 4)}, {}, 1),
    ("logsoftmax_v13", "LogSoftmax", 13, {"axis": 0}, {"x": f32(2, 3, 4)}, {}, 1),
    ("layernorm", "LayerNormalization", 17, {"epsilon": 1e-3}, {"x": f32(2, 3, 8)}, {"s": f32(8), "b": f32(8)}, 1),
    ("layernorm_axis1_stats", "LayerNormalization", 17, {"axis": 1}, {"x": f32(2, 3, 4)}, {"s": f32(3, 4)}, 3),
    ("concat3", "Concat", 13, {"axis": 1}, {"a": f32(2, 3, 2), "b": f32(2, 1, 2), "c": f32(2, 4, 2)}, {}, 1),
    ("concat_neg_axis", "Concat", 13, {"axis": -1}, {"a": f32(2, 3), "b": f32(2, 2)}, {}, 1),
    ("split_v11_attr", "Split", 11, {"axis": 1, "split": [2, 3]}, {"x": f32(2, 5)}, {}, 2),
    ("split_v13_input", "Split", 13, {"axis": 0}, {"x": f32(6, 2)}, {"s": i64([1, 5])}, 2),
    ("split_v18_num_outputs", "Split", 18, {"axis": 1, "num_outputs": 3}, {"x": f32(2, 7)}, {}, 3),
    ("slice_v9_attrs", "Slice", 9, {"starts": [1, 0], "ends": [3, -1], "axes": [0, 1]}, {"x": f32(4, 5)}, {}, 1),
    ("slice_v13_steps", "Slice", 13, {}, {"x": f32(6, 7)},
     {"st": i64([5, 1]), "en": i64([0, 100]), "ax": i64([0, 1]), "sp": i64([-2, 3])}, 1),
    ("transpose", "Transpose", 13, {"perm": [2, 0, 1]}, {"x": f32(2, 3, 4)}, {}, 1),
    ("transpose_default", "Transpose", 13, {}, {"x": f32(2, 3, 4)}, {}, 1),
    ("pad_v10_attr", "Pad", 10, {"pads": [1, 0, 2, 1], "value": 1.5}, {"x": f32(2, 3)}, {}, 1),
    ("pad_v13_input", "Pad", 13, {}, {"x": f32(2, 3, 4)}, {"p": i64([0, 1, 0, 0, 2, 1]),
                                                            "v": np.array(-1.0, np.float32)}, 1),
    ("pad_v18_axes_negative", "Pad", 18, {}, {"x": f32(4, 5)}, {"p": i64([2, -1]), "ax": i64([1])}, 1),
    ("pad_v7_reflect_attr", "Pad", 7, {"pads": [0, 2, 1, 0, 1, 2], "mode": "reflect"}, {"x": f32(2, 4, 3)}, {}, 1),
    ("pad_v13_reflect_3dims", "Pad", 13, {"mode": "reflect"}, {"x": f32(3, 4, 5)},
     {"p": i64([1, 2, 0, 2, 1, 4])}, 1),
    ("pad_v13_reflect_crop", "Pad", 13, {"mode": "reflect"}, {"x": f32(1, 3, 6)},
     {"p": i64([0, 0, 2, 0, -1, -3])}, 1),
    ("pad_v13_edge", "Pad", 13, {"mode": "edge"}, {"x": f32(2, 3, 4)}, {"p": i64([0, 5, 1, 0, 0, 7])}, 1),
    ("pad_v18_edge_extent_1", "Pad", 18, {"mode": "edge"}, {"x": f32(1, 1, 4)},
     {"p": i64([2, 3, 1, 1]), "ax": i64([1, -1])}, 1),
    ("pad_v19_wrap", "Pad", 19, {"mode": "wrap"}, {"x": f32(2, 3, 4)}, {"p": i64([0, 3, 2, 1, 1, 4])}, 1),
    ("center_crop_pad_all_axes", "CenterCropPad", 18, {}, {"x": f32(5, 4, 6)}, {"s": i64([2, 7, 6])}, 1),
    ("center_crop_pad_negative_axes", "CenterCropPad", 18, {"axes": [-1, 0]}, {"x": f32(3, 4, 8)},
     {"s": i64([3, 6])}, 1),
    ("reduce_mean_v11", "ReduceMean", 11, {"axes": [1], "keepdims": 0}, {"x": f32(2, 3, 4)}, {}, 1),
    ("reduce_mean_v18", "ReduceMean", 18, {}, {"x": f32(2, 3, 4)}, {"ax": i64([0, 2])}, 1),
    ("reduce_sum_v13_all", "ReduceSum", 13, {"keepdims": 0}, {"x": f32(2, 3, 4)}, {}, 1),
    ("reduce_sum_v11", "ReduceSum", 11, {"axes": [-1]}, {"x": f32(2, 3, 4)}, {}, 1),
    ("reduce_max_v18", "ReduceMax", 18, {"keepdims": 1}, {"x": f32(2, 3, 4)}, {"ax": i64([1])}, 1),
    ("gather_const_indices", "Gather", 13, {"axis": 1}, {"x": f32(3, 5, 2)}, {"i": i64([[0, -1], [2, 2]])}, 1),
    ("gather_scalar_index", "Gather", 13, {"axis": 0}, {"x": f32(4, 3)}, {"i": np.array(-2, np.int64)}, 1),
    ("gather_dynamic_indices", "Gather", 13, {"axis": 0}, {"x": f32(4, 3), "i": i64([3, -1, 0])}, {}, 1),
    ("resize_nearest_v13", "Resize", 13, {"mode": "nearest"}, {"x": f32(1, 2, 3, 4)},
     {"roi": np.array([], np.float32), "sc": np.array([1, 1, 2, 1.5], np.float32)}, 1),
    ("resize_nearest_floor_asym", "Resize", 13, {"mode": "nearest", "nearest_mode": "floor",
                                                 "coordinate_transformation_mode": "asymmetric"},
     {"x": f32(1, 1, 4, 4)}, {"roi": np.array([], np.float32), "sc": np.array([1, 1, 0.5, 2], np.float32)}, 1),
    ("resize_linear_half_pixel", "Resize", 13, {"mode": "linear"}, {"x": f32(1, 2, 3, 4)},
     {"roi": np.array([], np.float32), "sc": np.array([1, 1, 2, 2], np.float32)}, 1),
    ("resize_linear_align_corners_sizes", "Resize", 13, {"mode": "linear",
                                                         "coordinate_transformation_mode": "align_corners"},
     {"x": f32(1, 1, 4, 5)}, {"roi": np.array([], np.float32), "sc": np.array([], np.float32),
                               "sz": i64([1, 1, 7, 3])}, 1),
    ("upsample_v9_nearest", "Upsample", 9, {"mode": "nearest"}, {"x": f32(1, 2, 2, 3)},
     {"sc": np.array([1, 1, 2, 3], np.float32)}, 1),
    ("reshape_alias", "Reshape", 13, {}, {"x": f32(2, 3, 4)}, {"s": i64([4, -1])}, 1),
    ("flatten_alias", "Flatten", 13, {"axis": 2}, {"x": f32(2, 3, 4)}, {}, 1),
    ("squeeze_v11_attr", "Squeeze", 11, {"axes": [1]}, {"x": f32(2, 1, 4)}, {}, 1),
    ("unsqueeze_v13_input", "Unsqueeze", 13, {}, {"x": f32(2, 4)}, {"ax": i64([0, 3])}, 1),
]

# node input names: graph inputs first, then initializers, in the order listed above
INPUT_ORDER = {
    "Clip": ["x", "lo", "hi"], "Sub": ["a", "b"], "Pow": ["a", "b"], "Conv": ["x", "w", "b"],
    "ConvTranspose": ["x", "w", "b"], "Gemm": ["a", "b", "c"], "BatchNormalization": ["x", "s", "bb", "m", "v"],
    "LayerNormalization": ["x", "s", "b"], "Split": ["x", "s"], "Slice": ["x", "st", "en", "ax", "sp"],
    "Pad": ["x", "p", "v", "ax"], "CenterCropPad": ["x", "s"],
    "ReduceMean": ["x", "ax"], "ReduceMax": ["x", "ax"], "Gather": ["x", "i"],
    "Resize": ["x", "roi", "sc", "sz"], "Upsample": ["x", "sc"], "Reshape": ["x", "s"], "Unsqueeze": ["x", "ax"],
}


def node_inputs(op, inputs, consts):
    names = list(inputs) + list(consts)
    order = INPUT_ORDER.get(op)
    if order is None:
        return names
    present = [n for n in order if n in names]
    # keep positional slots: an absent optional input in the middle is ""
    last = max(order.index(n) for n in present)
    return [n if n in names else "" for n in order[:last + 1]]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op_matches_onnxruntime(case):
    _, op, opset, attrs, inputs, consts, n_out = case
    outputs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, node_inputs(op, inputs, consts), outputs, **attrs)
    model = testing.one_node_model(node, inputs, consts, opset)
    expected = ort_session(model).run(None, inputs)
    got = polyc.onnx.compile(model).run(inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode,pads,limit", [("reflect", [0, 3, 0, 0], 2), ("wrap", [0, 0, 0, 4], 3)])
def test_pad_past_the_extent_is_a_clean_error(mode, pads, limit):
    """A reflect pad longer than the extent minus 1 (wrap: the extent) has no single mirror image; the error
    names the node, the dim and the limit (onnxruntime refuses it too)."""
    inputs = {"x": f32(2, 3)}
    node = helper.make_node("Pad", ["x", "p"], ["y0"], mode=mode, name="the_pad")
    model = testing.one_node_model(node, inputs, {"p": i64(pads)}, 13)
    with pytest.raises(polyc.errors.UnsupportedError, match=rf"Pad mode {mode} .* \(at most {limit}\) on node the_pad"):
        polyc.onnx.compile(model)


def test_max_pool_padding_never_wins_over_minus_infinity():
    """MaxPool's padding is excluded (ONNX's reference): a window of -inf inputs and padding is -inf, not the
    lowest finite float a padded fill would give (onnxruntime gives that at some edges, so the reference here
    is onnx's ReferenceEvaluator); finite inputs are unchanged. The fill is max=!'s identity, so the build
    moves the guard on the rows (not the vectorized columns) into the iteration domain: the taps in the
    padding rows are never visited."""
    from onnx import TensorProto
    from onnx.reference import ReferenceEvaluator

    from polyc.poly.build import build_scop

    shape = [1, 3, 7, 6]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 3])
    nodes = [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[2, 2])]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    rng = np.random.default_rng(5)
    a = np.full(shape, -np.inf, np.float32)
    a[0, 1] = rng.standard_normal(shape[2:]).astype(np.float32)
    a[0, 2, 0, 0] = 2.0
    want = ReferenceEvaluator(model).run(None, {"x": a})[0]
    compiled = polyc.onnx.compile(model)
    got = compiled.run({"x": a})[0]
    assert np.array_equal(got, want)
    assert np.isneginf(got[0, 0]).all() and got[0, 2, 0, 0] == 2.0
    step, = compiled.steps
    update = build_scop(step.kernel.checked, dict(step.sizes)).statements[-1]
    # 3 channels x 4 x 3 outputs x 3 x 3 taps, less the taps in padding rows (rows -1 and 7: 3 x 2 x 3 x 3)
    assert update.domain.count_val().to_python() == 3 * 4 * 3 * 9 - 3 * 2 * 3 * 3
