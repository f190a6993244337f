"""Normalization, attention and loss ops as one-node models, compiled by polyc and compared with onnxruntime
(or onnx's ReferenceEvaluator where onnxruntime lacks the op/opset), on shapes with extents 1 and odd primes
and on the attribute/opset variants ONNX defines."""
import numpy as np
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import polyc.onnx
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

R = np.random.default_rng(10)


def f32(*shape, lo=None, shift=0.0):
    a = R.standard_normal(shape).astype(np.float32) + np.float32(shift)
    return np.abs(a) + np.float32(0.1) if lo == "pos" else a


def f64(*shape):
    return R.standard_normal(shape)


def expected(model, inputs, ref):
    if ref == "ort":
        so = ort.SessionOptions()
        so.log_severity_level = 3
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        return sess.run(None, inputs)
    return ReferenceEvaluator(model).run(None, inputs)


def check(op, opset, attrs, inputs, consts, in_names, n_out, ref="ort", rtol=1e-4, atol=1e-5):
    outputs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, in_names, outputs, **attrs)
    model = testing.one_node_model(node, inputs, consts, opset)
    if any(not o.type.tensor_type.HasField("shape") for o in model.graph.output):
        # onnx infers no output shape for some function ops (GroupNormalization-18, MeanVarianceNormalization)
        got = ReferenceEvaluator(model).run(None, inputs)
        del model.graph.output[:]
        model.graph.output.extend(helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                                  for n, v in zip(outputs, got))
    want = expected(model, inputs, ref)
    got = polyc.onnx.compile(model).run(inputs)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        e = np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# ---- normalization ----------------------------------------------------------------------------------------------

NORM_CASES = [
    # (id, op, opset, attrs, inputs, consts, input names, ref)
    ("instnorm_2d", "InstanceNormalization", 6, {}, {"x": f32(2, 3, 5, 7)}, {"s": f32(3), "b": f32(3)}, "ort"),
    ("instnorm_1d_eps", "InstanceNormalization", 22, {"epsilon": 1e-2},
     {"x": f32(1, 5, 13, shift=100.0), "s": f32(5), "b": f32(5)}, {}, "ref"),  # ort: E[x^2]-mu^2 loses digits
    ("instnorm_3d_ones", "InstanceNormalization", 11, {}, {"x": f32(3, 1, 1, 3, 1)}, {"s": f32(1), "b": f32(1)},
     "ort"),
    ("instnorm_f64", "InstanceNormalization", 13, {}, {"x": f64(2, 3, 7)}, {"s": f64(3), "b": f64(3)}, "ref"),
    ("groupnorm_v21_per_channel", "GroupNormalization", 21, {"num_groups": 3, "epsilon": 1e-3},
     {"x": f32(2, 9, 7)}, {"s": f32(9), "b": f32(9)}, "ort"),
    ("groupnorm_v21_one_group", "GroupNormalization", 21, {"num_groups": 1},
     {"x": f32(1, 5, 3, 3)}, {"s": f32(5), "b": f32(5)}, "ort"),
    ("groupnorm_v21_instance", "GroupNormalization", 21, {"num_groups": 5},
     {"x": f32(2, 5, 11)}, {"s": f32(5), "b": f32(5)}, "ort"),
    ("groupnorm_v21_f64_stash_double", "GroupNormalization", 21, {"num_groups": 3, "stash_type": 11},
     {"x": f64(2, 6, 5)}, {"s": f64(6), "b": f64(6)}, "ref"),
    ("rmsnorm_last", "RMSNormalization", 23, {}, {"x": f32(2, 3, 7)}, {"s": f32(7)}, "ort"),
    ("rmsnorm_axis1_eps", "RMSNormalization", 23, {"axis": 1, "epsilon": 1e-2}, {"x": f32(3, 5, 1)},
     {"s": f32(5, 1)}, "ort"),
    ("rmsnorm_axis0_scale_bcast", "RMSNormalization", 23, {"axis": 0}, {"x": f32(2, 3)}, {"s": f32(3)}, "ort"),
    ("rmsnorm_f64_stash_float", "RMSNormalization", 23, {}, {"x": f64(3, 7)}, {"s": f64(7)}, "ref"),
    ("groupnorm_f64_stash_float", "GroupNormalization", 21, {"num_groups": 2}, {"x": f64(1, 4, 3)},
     {"s": f64(4), "b": f64(4)}, "ref"),
    ("mvn_default_axes", "MeanVarianceNormalization", 13, {"axes": [0, 2, 3]},
     {"x": f32(3, 5, 2, 7, shift=10.0)}, {}, "ort"),
    ("mvn_axes_last", "MeanVarianceNormalization", 9, {"axes": [-1]}, {"x": f32(3, 1, 11)}, {}, "ort"),
    ("mvn_all_axes", "MeanVarianceNormalization", 13, {"axes": [0, 1]}, {"x": f32(5, 3)}, {}, "ort"),
    ("lpnorm_p2", "LpNormalization", 13, {}, {"x": f32(3, 1, 7)}, {}, "ort"),
    ("lpnorm_p1_axis0", "LpNormalization", 22, {"p": 1, "axis": 0}, {"x": f32(5, 3)}, {}, "ort"),
    ("lppool_p2", "LpPool", 11, {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
     {"x": f32(1, 3, 7, 5)}, {}, "ort"),
    ("lppool_p3_1d", "LpPool", 18, {"kernel_shape": [3], "p": 3}, {"x": f32(2, 1, 11)}, {}, "ref"),
    # onnx's reference LpPool counts the windows past the edge under ceil_mode: onnxruntime is the oracle
    ("lppool_p1_dil_ceil", "LpPool", 18, {"kernel_shape": [2, 2], "p": 1, "dilations": [2, 1], "ceil_mode": 1,
                                          "strides": [2, 2]}, {"x": f32(1, 2, 7, 5)}, {}, "ort"),
    ("lppool_same_upper", "LpPool", 22, {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER", "strides": [2, 1]},
     {"x": f32(1, 2, 5, 3)}, {}, "ort"),
    ("global_lppool_p2", "GlobalLpPool", 13, {}, {"x": f32(2, 3, 5, 7)}, {}, "ort"),
    ("global_lppool_p3", "GlobalLpPool", 13, {"p": 3}, {"x": f32(1, 3, 1, 5)}, {}, "ort"),
    ("global_lppool_p1_1d", "GlobalLpPool", 7, {"p": 1}, {"x": f32(3, 1, 7)}, {}, "ort"),
]


@pytest.mark.parametrize("case", NORM_CASES, ids=[c[0] for c in NORM_CASES])
def test_norm_op(case):
    _, op, opset, attrs, inputs, consts, ref = case
    names = list(inputs) + list(consts)
    check(op, opset, attrs, inputs, consts, names, 1, ref)


def test_groupnorm_large_mean_is_accurate():
    """Centred second moment: a mean of 50 against a spread of 1 keeps float32 accuracy (float64 numpy)."""
    x, s, b = f32(2, 9, 7, shift=50.0), f32(9), f32(9)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y0"], num_groups=3, epsilon=1e-3)
    model = testing.one_node_model(node, {"x": x}, {"s": s, "b": b}, 21)
    del model.graph.output[:]
    model.graph.output.append(helper.make_tensor_value_info("y0", 1, x.shape))
    got = polyc.onnx.compile(model).run({"x": x})[0]
    xx = x.astype(np.float64).reshape(2, 3, -1)
    want = ((xx - xx.mean(-1, keepdims=True)) / np.sqrt(xx.var(-1, keepdims=True) + 1e-3)).reshape(x.shape)
    np.testing.assert_allclose(got, want * s[:, None] + b[:, None], rtol=1e-4, atol=2e-5)


def test_rmsnorm_stash_double():
    """stash_type=11 (onnx's reference lacks it): float64 statistics, against numpy."""
    x, s = f64(2, 1, 5), f64(5)
    node = helper.make_node("RMSNormalization", ["x", "s"], ["y0"], axis=1, stash_type=11, epsilon=1e-3)
    model = testing.one_node_model(node, {"x": x}, {"s": s}, 23)
    got = polyc.onnx.compile(model).run({"x": x})[0]
    eps = float(np.float32(1e-3))  # the attribute is a float32
    want = x / np.sqrt((x * x).mean(axis=(1, 2), keepdims=True) + eps) * s
    np.testing.assert_allclose(got, want, rtol=1e-12)


def test_groupnorm_bad_groups_is_polyc_error():
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y0"], num_groups=4)
    model = testing.one_node_model(node, {"x": f32(1, 6, 3)}, {"s": f32(6), "b": f32(6)}, 21)
    with pytest.raises(polyc.PolycError):
        polyc.onnx.compile(model)


# ---- attention ----------------------------------------------------------------------------------------------------

def b8(*shape):
    return R.random(shape) < 0.7


ATTENTION_CASES = [
    # (id, opset, attrs, named inputs (None: absent), number of outputs)
    ("mha_4d", 23, {}, {"Q": f32(2, 3, 5, 4), "K": f32(2, 3, 7, 4), "V": f32(2, 3, 7, 3)}, 1),
    ("ones_4d", 23, {}, {"Q": f32(1, 1, 1, 1), "K": f32(1, 1, 1, 1), "V": f32(1, 1, 1, 1)}, 1),
    ("gqa_4d_scale_causal", 23, {"scale": 0.3, "is_causal": 1},
     {"Q": f32(1, 6, 5, 4), "K": f32(1, 2, 5, 4), "V": f32(1, 2, 5, 5)}, 1),
    ("mqa_3d_softcap", 23, {"q_num_heads": 3, "kv_num_heads": 1, "softcap": 2.0},
     {"Q": f32(2, 5, 12), "K": f32(2, 7, 4), "V": f32(2, 7, 3)}, 1),
    ("gqa_3d_float_mask", 23, {"q_num_heads": 4, "kv_num_heads": 2},
     {"Q": f32(1, 3, 8), "K": f32(1, 5, 4), "V": f32(1, 5, 6), "attn_mask": f32(3, 5)}, 1),
    ("bool_mask_4d_causal", 23, {"is_causal": 1},
     {"Q": f32(2, 2, 3, 5), "K": f32(2, 2, 3, 5), "V": f32(2, 2, 3, 5), "attn_mask": b8(2, 1, 3, 3)}, 1),
    ("short_mask_past_present", 23, {},
     {"Q": f32(1, 2, 3, 4), "K": f32(1, 2, 3, 4), "V": f32(1, 2, 3, 2), "attn_mask": f32(2, 3, 4),
      "past_key": f32(1, 2, 2, 4), "past_value": f32(1, 2, 2, 2)}, 3),
    ("past_causal_qk_bias", 23, {"is_causal": 1, "qk_matmul_output_mode": 2},
     {"Q": f32(1, 2, 3, 4), "K": f32(1, 2, 3, 4), "V": f32(1, 2, 3, 4), "attn_mask": b8(3, 5),
      "past_key": f32(1, 2, 2, 4), "past_value": f32(1, 2, 2, 4)}, 4),
    ("qk_raw", 23, {}, {"Q": f32(1, 1, 3, 2), "K": f32(1, 1, 5, 2), "V": f32(1, 1, 5, 2)}, 4),
    ("qk_softmax_3d_past", 23, {"q_num_heads": 2, "kv_num_heads": 2, "qk_matmul_output_mode": 3},
     {"Q": f32(2, 3, 6), "K": f32(2, 3, 6), "V": f32(2, 3, 4), "attn_mask": None,
      "past_key": f32(2, 2, 1, 3), "past_value": f32(2, 2, 1, 2)}, 4),
    ("qk_softcap_mode1", 23, {"softcap": 1.5, "qk_matmul_output_mode": 1},
     {"Q": f32(1, 1, 3, 2), "K": f32(1, 1, 5, 2), "V": f32(1, 1, 5, 2), "attn_mask": f32(3, 5)}, 4),
    ("fully_masked_row", 23, {"qk_matmul_output_mode": 3},
     {"Q": f32(1, 1, 2, 3), "K": f32(1, 1, 3, 3), "V": f32(1, 1, 3, 3),
      "attn_mask": np.array([[True, False, True], [False, False, False]])}, 4),
    ("nonpad_causal_v24", 24, {"is_causal": 1},
     {"Q": f32(2, 2, 2, 4), "K": f32(2, 1, 5, 4), "V": f32(2, 1, 5, 3), "attn_mask": None, "past_key": None,
      "past_value": None, "nonpad_kv_seqlen": np.array([4, 1], np.int64)}, 1),
    ("window_v25", 25, {"left_window_size": 2, "right_window_size": 1},
     {"Q": f32(1, 2, 4, 3), "K": f32(1, 2, 6, 3), "V": f32(1, 2, 6, 3)}, 1),
    ("window_causal_past_v25", 25, {"left_window_size": 1, "is_causal": 1},
     {"Q": f32(1, 1, 3, 3), "K": f32(1, 1, 3, 3), "V": f32(1, 1, 3, 3), "attn_mask": None,
      "past_key": f32(1, 1, 2, 3), "past_value": f32(1, 1, 2, 3)}, 3),
    ("f64_precision_double", 23, {"softmax_precision": 11},
     {"Q": f64(1, 2, 3, 4), "K": f64(1, 2, 3, 4), "V": f64(1, 2, 3, 4)}, 1),
    ("f32_precision_double", 23, {"softmax_precision": 11},
     {"Q": f32(1, 2, 3, 4), "K": f32(1, 2, 3, 4), "V": f32(1, 2, 3, 4)}, 1),
]


@pytest.mark.parametrize("case", ATTENTION_CASES, ids=[c[0] for c in ATTENTION_CASES])
def test_attention(case):
    _, opset, attrs, named, n_out = case
    names = [n if v is not None else "" for n, v in named.items()]
    inputs = {n: v for n, v in named.items() if v is not None}
    check("Attention", opset, attrs, inputs, {}, names, n_out, "ref")


def test_attention_qk_output_mode0_is_raw_with_softcap():
    """Mode 0 returns the raw ``QK^T`` even with softcap, as the spec says and onnxruntime does (onnx's
    reference implementation returns the softcapped product)."""
    inputs = {"Q": f32(1, 2, 3, 2) * 3, "K": f32(1, 2, 5, 2) * 3, "V": f32(1, 2, 5, 2)}
    check("Attention", 23, {"softcap": 1.0}, inputs, {}, list(inputs), 4, "ort")


def test_attention_matches_onnxruntime():
    inputs = {"Q": f32(2, 5, 12), "K": f32(2, 7, 6), "V": f32(2, 7, 4), "attn_mask": f32(5, 7)}
    check("Attention", 23, {"q_num_heads": 4, "kv_num_heads": 2, "is_causal": 0}, inputs, {}, list(inputs), 1,
          "ort")


ROPE_CASES = [
    # (id, attrs, inputs, position ids or None)
    ("4d_pos", {}, {"x": f32(2, 3, 5, 8), "cos": f32(11, 4), "sin": f32(11, 4)},
     np.array([[0, 3, 10, 2, 1], [4, 4, 0, 9, -1]], np.int64)),
    ("4d_interleaved_rotdim", {"interleaved": 1, "rotary_embedding_dim": 4},
     {"x": f32(1, 2, 3, 6), "cos": f32(5, 2), "sin": f32(5, 2)}, np.array([[1, 0, 4]], np.int64)),
    ("3d_heads", {"num_heads": 3}, {"x": f32(2, 5, 12), "cos": f32(7, 2), "sin": f32(7, 2)},
     np.array([[0, 1, 2, 3, 4], [6, 5, 4, 3, 2]], np.int64)),
    ("3d_no_pos_interleaved", {"num_heads": 2, "interleaved": 1},
     {"x": f32(1, 3, 8), "cos": f32(1, 3, 2), "sin": f32(1, 3, 2)}, None),
    ("4d_no_pos_rotdim", {"rotary_embedding_dim": 2}, {"x": f32(3, 1, 1, 5), "cos": f32(3, 1, 1), "sin": f32(3, 1, 1)},
     None),
]


@pytest.mark.parametrize("case", ROPE_CASES, ids=[c[0] for c in ROPE_CASES])
def test_rotary_embedding(case):
    _, attrs, inputs, pos = case
    inputs = dict(inputs)
    if pos is not None:
        inputs["pos"] = pos
    check("RotaryEmbedding", 23, attrs, inputs, {}, list(inputs), 1, "ref")


# ---- losses -----------------------------------------------------------------------------------------------------

def labels(shape, classes, ignore=None, dtype=np.int64):
    t = R.integers(0, classes, shape).astype(dtype)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    return t


LOSS_CASES = [
    # (id, op, opset, attrs, inputs (scores/log-probs, target[, weight]), number of outputs)
    ("nll_mean_2d", "NegativeLogLikelihoodLoss", 13, {}, {"x": f32(5, 3), "t": labels((5,), 3)}, 1),
    ("nll_none_nc1", "NegativeLogLikelihoodLoss", 22, {"reduction": "none"},
     {"x": f32(1, 1), "t": labels((1,), 1)}, 1),
    ("nll_sum_weight_spatial", "NegativeLogLikelihoodLoss", 13, {"reduction": "sum"},
     {"x": f32(2, 5, 3, 7), "t": labels((2, 3, 7), 5, dtype=np.int32), "w": f32(5, lo="pos")}, 1),
    ("nll_mean_weight_ignore", "NegativeLogLikelihoodLoss", 13, {"ignore_index": 1},
     {"x": f32(3, 4, 5), "t": labels((3, 5), 4, ignore=1), "w": f32(4, lo="pos")}, 1),
    ("nll_mean_ignore_negative", "NegativeLogLikelihoodLoss", 12, {"ignore_index": -7},
     {"x": f32(7, 3, 1), "t": labels((7, 1), 3, ignore=-7)}, 1),
    ("sce_mean", "SoftmaxCrossEntropyLoss", 13, {}, {"x": f32(5, 7), "t": labels((5,), 7)}, 1),
    ("sce_none_log_prob", "SoftmaxCrossEntropyLoss", 13, {"reduction": "none"},
     {"x": f32(2, 3, 5), "t": labels((2, 5), 3)}, 2),
    ("sce_sum_weight_ignore_log_prob", "SoftmaxCrossEntropyLoss", 12, {"reduction": "sum", "ignore_index": 0},
     {"x": f32(3, 5, 2, 3), "t": labels((3, 2, 3), 5, ignore=0), "w": f32(5, lo="pos")}, 2),
    ("sce_mean_weight_f64", "SoftmaxCrossEntropyLoss", 13, {}, {"x": f64(4, 3), "t": labels((4,), 3), "w": f64(3)}, 1),
    ("sce_mean_ignore_big_shift", "SoftmaxCrossEntropyLoss", 13, {"ignore_index": 2},
     {"x": f32(5, 3, shift=80.0), "t": labels((5,), 3, ignore=2)}, 1),
]


@pytest.mark.parametrize("case", LOSS_CASES, ids=[c[0] for c in LOSS_CASES])
def test_loss(case):
    _, op, opset, attrs, inputs, n_out = case
    check(op, opset, attrs, inputs, {}, list(inputs), n_out, "ref")


def test_loss_target_out_of_range_is_polyc_error():
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["y0"], reduction="none")
    x, t = f32(3, 4), np.array([0, 4, 1], np.int64)
    model = testing.one_node_model(node, {"x": x, "t": t}, {}, 13)
    with pytest.raises(polyc.PolycError):
        polyc.onnx.compile(model).run({"x": x, "t": t})


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_loss_matches_onnxruntime(op):
    inputs = {"x": f32(3, 5, 7), "t": labels((3, 7), 5, ignore=4), "w": f32(5, lo="pos")}
    check(op, 13, {"ignore_index": 4}, inputs, {}, list(inputs), 1, "ort")


@pytest.mark.parametrize("op,attrs,inputs,n_in,opset", [
    ("LpNormalization", {"p": 3}, {"x": f32(2, 3)}, 1, 13),
    ("Attention", {"softmax_precision": 10}, {"Q": f32(1, 1, 2, 2), "K": f32(1, 1, 2, 2), "V": f32(1, 1, 2, 2)}, 3, 23),
    ("Attention", {"q_num_heads": 2, "kv_num_heads": 2}, {"Q": f32(1, 2, 4), "K": f32(1, 2, 6), "V": f32(1, 2, 4)},
     3, 23),  # head sizes 2 (Q) and 3 (K) differ
    ("RotaryEmbedding", {"rotary_embedding_dim": 3}, {"x": f32(1, 1, 2, 4), "c": f32(2, 1), "s": f32(2, 1),
                                                      "p": np.array([[0, 1]], np.int64)}, 4, 23),
])
def test_unsupported_or_invalid_is_polyc_error(op, attrs, inputs, n_in, opset):
    node = helper.make_node(op, list(inputs)[:n_in], ["y0"], **attrs)
    model = testing.one_node_model(node, inputs, {}, opset)
    if not model.graph.output[0].type.tensor_type.HasField("shape"):
        del model.graph.output[:]
        model.graph.output.append(helper.make_tensor_value_info("y0", 1, [1, 1, 2, 4]))
    with pytest.raises(polyc.PolycError):
        polyc.onnx.compile(model)
