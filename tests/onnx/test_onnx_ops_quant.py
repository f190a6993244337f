"""The quantized ops (``polyc/onnx/ops/quant.py``) as one-node models, compiled by polyc and compared bit for bit
with onnxruntime (or onnx's ReferenceEvaluator where onnxruntime lacks the case): shapes with extents 1 and odd
primes, per-tensor / per-axis / blocked parameters, int8 and uint8, values that saturate and exact .5 ties."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import polyc
import polyc.onnx
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

R = np.random.default_rng(10)


def _ort(model, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _check(op, opset, attrs, inputs, consts, n_out=1, ref="ort", names=None):
    names = names or list(inputs) + list(consts)
    outs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, names, outs, **attrs)
    model = testing.one_node_model(node, inputs, consts, opset=opset)
    if ref == "ort" and {np.dtype(np.uint8), np.dtype(np.int8)} <= {v.dtype for v in inputs.values()}:
        # uint8 x int8 products: onnxruntime's x86 kernels without AVX-512 VNNI (vpmaddubsw) add pairs of
        # products in int16 with saturation, so full-range int8 values give wrong sums (MatMulInteger 3x7 @ 7x5
        # on Zen 3: -3103 off; polyc is exact). With int8 values in [-64, 63] (oneDNN's "7-bit" remedy) no
        # pair can saturate and onnxruntime is exact on every machine
        inputs = {k: np.clip(v, -64, 63).astype(v.dtype) if v.dtype == np.int8 else v for k, v in inputs.items()}
    if ref == "ort":
        want = _ort(model, inputs)
    else:
        want = ReferenceEvaluator(model).run(None, inputs)
    got = polyc.onnx.compile(model).run(inputs)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(g, w)
    return got


def ties(shape, scale, lo, hi):
    """float32 values on the grid ``k * scale / 2`` (so many quotients are exact .5 ties) from lo to hi."""
    k = R.integers(int(2 * lo / scale), int(2 * hi / scale) + 1, size=shape)
    return (k * np.float32(scale) / 2).astype(np.float32)


# ---- QuantizeLinear -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (7,), (2, 3, 5), (1, 13, 1)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("opset", [10, 13, 19, 21])
def test_quantize_per_tensor(shape, dtype, opset):
    x = ties(shape, 0.25, -60, 60)  # quotients up to +-240: both types saturate
    zp = np.array(3 if dtype == np.int8 else 128, dtype)
    _check("QuantizeLinear", opset, {}, {"x": x}, {"s": np.array(0.25, np.float32), "z": zp})


@pytest.mark.parametrize("opset", [13, 21])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_quantize_per_axis(opset, axis, dtype):
    x = ties((3, 5, 7), 0.5, -100, 100)
    n = x.shape[axis]
    s = R.choice([0.5, 1.0, 0.25, 2.0], n).astype(np.float32)
    z = R.integers(-5 if dtype == np.int8 else 100, 6 if dtype == np.int8 else 150, n).astype(dtype)
    _check("QuantizeLinear", opset, {"axis": axis}, {"x": x}, {"s": s, "z": z})


def test_quantize_scale_input_no_zero_point():
    x = ties((5, 3), 0.5, -80, 80)
    _check("QuantizeLinear", 13, {}, {"x": x, "s": np.array(0.5, np.float32)}, {})


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
def test_quantize_16bit(dtype):
    x = ties((3, 11), 0.5, -20000, 20000)
    _check("QuantizeLinear", 21, {}, {"x": x}, {"s": np.array(0.5, np.float32), "z": np.array(7, dtype)},
           ref="reference")


def test_quantize_blocked():
    x = ties((3, 7, 2), 0.5, -70, 70)
    s = R.choice([0.5, 1.0], (3, 3, 2)).astype(np.float32)
    z = R.integers(-3, 4, (3, 3, 2)).astype(np.int8)
    _check("QuantizeLinear", 21, {"axis": 1, "block_size": 3}, {"x": x}, {"s": s, "z": z}, ref="reference")


def test_quantize_output_dtype():
    x = ties((4, 5), 0.5, -70, 70)
    _check("QuantizeLinear", 21, {"output_dtype": TensorProto.INT8}, {"x": x}, {"s": np.array(0.5, np.float32)},
           ref="reference")


def test_quantize_nan_inf_saturate():
    x = np.array([np.inf, -np.inf, 3e38, -3e38, 1e10, 0.5, 1.5, -0.5, -2.5], np.float32)
    _check("QuantizeLinear", 13, {}, {"x": x}, {"s": np.array(1.0, np.float32), "z": np.array(1, np.int8)})


def test_quantize_fuses_with_dequantize():
    x = ties((2, 7), 0.5, -70, 70)
    q = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"])
    d = helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])
    graph = helper.make_graph([q, d], "qdq", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s"),
                               onnx.numpy_helper.from_array(np.array(-3, np.int8), "z")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    compiled = polyc.onnx.compile(model)
    np.testing.assert_array_equal(compiled.run({"x": x})[0], _ort(model, {"x": x})[0])
    assert len([k for k in compiled.kernels if k is not None]) == 1


# ---- DequantizeLinear -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1,), (7,), (2, 3, 5)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32])
@pytest.mark.parametrize("opset", [10, 13, 19, 21])
def test_dequantize_per_tensor(shape, dtype, opset):
    info = np.iinfo(dtype)
    x = R.integers(max(info.min, -1000), min(info.max, 1000) + 1, shape).astype(dtype)
    consts = {"s": np.array(0.37, np.float32)}
    if dtype != np.int32:
        consts["z"] = np.array(5, dtype)
    _check("DequantizeLinear", opset, {}, {"x": x}, consts)


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_dequantize_per_axis(axis, dtype):
    info = np.iinfo(dtype)
    x = R.integers(info.min, info.max + 1, (3, 5, 7)).astype(dtype)
    n = x.shape[axis]
    s = R.uniform(0.01, 2, n).astype(np.float32)
    z = R.integers(info.min, info.max + 1, n).astype(dtype)
    _check("DequantizeLinear", 13, {"axis": axis}, {"x": x}, {"s": s, "z": z})


def test_dequantize_blocked_and_16bit():
    x = R.integers(-30000, 30000, (5, 4)).astype(np.int16)
    s = R.uniform(0.01, 2, (2, 4)).astype(np.float32)
    z = R.integers(-9, 9, (2, 4)).astype(np.int16)
    _check("DequantizeLinear", 21, {"axis": 0, "block_size": 3}, {"x": x}, {"s": s, "z": z}, ref="reference")


# ---- DynamicQuantizeLinear ------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,lo,hi", [((1,), 0.5, 0.5), ((7,), -3, 5), ((3, 5), 0.1, 9), ((2, 3, 5), -7, -1)])
def test_dynamic_quantize(shape, lo, hi):
    x = R.uniform(lo, hi, shape).astype(np.float32)
    _check("DynamicQuantizeLinear", 11, {}, {"x": x}, {}, n_out=3)


# ---- MatMulInteger / QLinearMatMul ----------------------------------------------------------------------------

def _ints(dtype, shape):
    info = np.iinfo(dtype)
    return R.integers(info.min, info.max + 1, shape).astype(dtype)


@pytest.mark.parametrize("sa,sb", [((1, 1), (1, 1)), ((3, 7), (7, 5)), ((2, 3, 7), (7, 13)), ((7,), (7, 3))])
@pytest.mark.parametrize("da,db", [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)])
def test_matmul_integer(sa, sb, da, db):
    a, m = _ints(da, sa), _ints(db, sb)
    consts = {"za": np.array(3, da), "zb": np.array(-2 if db == np.int8 else 200, db)}
    _check("MatMulInteger", 10, {}, {"a": a, "b": m}, consts, ref="reference")
    _check("MatMulInteger", 10, {}, {"a": a, "b": m}, {})


def test_matmul_integer_per_column_zero_point():
    a, m = _ints(np.uint8, (3, 7)), _ints(np.uint8, (7, 5))
    _check("MatMulInteger", 10, {}, {"a": a, "b": m}, {"za": np.array(3, np.uint8), "zb": _ints(np.uint8, (5,))})


@pytest.mark.parametrize("sa,sb", [((1, 1), (1, 1)), ((3, 7), (7, 5)), ((2, 3, 11), (11, 13))])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("opset", [10, 21])
def test_qlinear_matmul(sa, sb, dtype, opset):
    a, m = _ints(dtype, sa), _ints(dtype, sb)
    zero = np.array(0 if dtype == np.int8 else 128, dtype)
    consts = {"sa": np.array(0.05, np.float32), "za": zero, "sb": np.array(0.02, np.float32), "zb": zero,
              "sy": np.array(0.25, np.float32), "zy": np.array(3, dtype)}
    names = ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"]
    _check("QLinearMatMul", opset, {}, {"a": a, "b": m}, consts, names=names)


def test_qlinear_matmul_per_column():
    a, m = _ints(np.uint8, (5, 7)), _ints(np.int8, (7, 3))
    consts = {"sa": np.array(0.05, np.float32), "za": np.array(120, np.uint8),
              "sb": np.array([0.02, 0.03, 0.5], np.float32), "zb": np.array([0, 0, 0], np.int8),
              "sy": np.array(0.25, np.float32), "zy": np.array(130, np.uint8)}
    _check("QLinearMatMul", 10, {}, {"a": a, "b": m}, consts, names=["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])


# ---- ConvInteger / QLinearConv --------------------------------------------------------------------------------

CONVS = [({}, (1, 1, 1, 1), (1, 1, 1, 1)),
         ({"pads": [1, 1, 1, 1]}, (1, 3, 7, 5), (5, 3, 3, 3)),
         ({"strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]}, (2, 3, 11, 7), (4, 3, 3, 3)),
         ({"group": 3, "pads": [1, 1, 1, 1]}, (1, 3, 5, 5), (3, 1, 3, 3)),
         ({"auto_pad": "SAME_UPPER"}, (1, 2, 5), (3, 2, 2))]


@pytest.mark.parametrize("attrs,sx,sw", CONVS)
def test_conv_integer(attrs, sx, sw):
    x, w = _ints(np.uint8, sx), _ints(np.uint8, sw)
    _check("ConvInteger", 10, attrs, {"x": x, "w": w}, {"zx": np.array(100, np.uint8)}, ref="reference")
    _check("ConvInteger", 10, attrs, {"x": x, "w": w}, {"zx": np.array(100, np.uint8),
                                                          "zw": np.array(7, np.uint8)})


@pytest.mark.parametrize("attrs,sx,sw", CONVS)
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_conv(attrs, sx, sw, dtype):
    x = _ints(dtype, sx)
    w = _ints(np.int8, sw)
    m = sw[0]
    zero = np.array(0 if dtype == np.int8 else 128, dtype)
    consts = {"sx": np.array(0.05, np.float32), "zx": zero, "sw": R.uniform(0.005, 0.05, m).astype(np.float32),
              "zw": np.zeros(m, np.int8), "sy": np.array(0.25, np.float32), "zy": np.array(5, dtype),
              "bias": R.integers(-500, 500, m).astype(np.int32)}
    _check("QLinearConv", 10, attrs, {"x": x, "w": w}, consts,
           names=["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "bias"])


# ---- errors ---------------------------------------------------------------------------------------------------

def test_float8_output_is_a_clean_error():
    x = R.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s", "z"], ["y"], name="q8")
    zp = helper.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0.0])
    graph = helper.make_graph([node], "q8", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, x.shape)],
                              [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "s"), zp])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(polyc.PolycError, match="q8"):
        polyc.onnx.compile(model)


def test_bad_scale_shape_is_a_clean_error():
    x = R.standard_normal((3, 4)).astype(np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["y"], name="qbad", axis=1)
    model = testing.one_node_model(node, {"x": x}, {"s": np.ones(3, np.float32)}, opset=13)
    with pytest.raises(polyc.PolycError, match="qbad"):
        polyc.onnx.compile(model)


@pytest.mark.parametrize("attrs", [{}, {"precision": TensorProto.FLOAT}])
def test_quantize_float16_input(attrs):
    x = ties((3, 7), 0.3, -40, 40).astype(np.float16)
    _check("QuantizeLinear", 25 if attrs else 21, attrs, {"x": x},
           {"s": np.array(0.3, np.float16), "z": np.array(-2, np.int8)}, ref="reference")


@pytest.mark.parametrize("opset", [23, 25])
def test_quantize_dequantize_new_opsets(opset):
    x = ties((2, 5, 3), 0.5, -70, 70)
    s = np.array([0.5, 1.0, 0.25, 2.0, 0.5], np.float32)
    _check("QuantizeLinear", opset, {"axis": 1}, {"x": x}, {"s": s, "z": np.arange(5).astype(np.int8)},
           ref="reference")
    q = _ints(np.uint8, (2, 5, 3))
    _check("DequantizeLinear", opset, {"axis": 1}, {"x": q}, {"s": s, "z": np.arange(5).astype(np.uint8)},
           ref="reference")


def test_dynamic_quantize_zeros():
    _check("DynamicQuantizeLinear", 11, {}, {"x": np.zeros((2, 3), np.float32)}, {}, n_out=3)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_qlinear_ties(dtype):
    """A requantization multiplier of 0.5 makes every odd accumulator an exact .5 tie (round half to even)."""
    one, half = np.array(1.0, np.float32), np.array(2.0, np.float32)
    zero = np.array(0, dtype)
    a, m = R.integers(0, 5, (3, 7)).astype(dtype), R.integers(0, 5, (7, 5)).astype(dtype)
    _check("QLinearMatMul", 10, {}, {"a": a, "b": m},
           {"sa": one, "za": zero, "sb": one, "zb": zero, "sy": half, "zy": np.array(1, dtype)},
           names=["a", "sa", "za", "b", "sb", "zb", "sy", "zy"])
    x, w = R.integers(0, 4, (1, 2, 5, 5)).astype(dtype), R.integers(-3, 4, (3, 2, 3, 3)).astype(np.int8)
    _check("QLinearConv", 10, {"pads": [1, 1, 1, 1]}, {"x": x, "w": w},
           {"sx": one, "zx": zero, "sw": np.ones(3, np.float32), "zw": np.zeros(3, np.int8), "sy": half,
            "zy": np.array(3, dtype)}, names=["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"])


def test_qdq_conv_model():
    """The QDQ pattern (DequantizeLinear -> Conv -> Relu -> QuantizeLinear) against onnxruntime with its graph
    optimizations off (on, it rewrites the pattern into QLinearConv): the float Conv sums in another order, so
    an output may differ by one quantization step where the float result lies next to a .5 tie."""
    x = _ints(np.uint8, (1, 3, 11, 7))
    w = _ints(np.int8, (5, 3, 3, 3))
    nodes = [helper.make_node("DequantizeLinear", ["x", "sx", "zx"], ["xf"]),
             helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wf"], axis=0),
             helper.make_node("Conv", ["xf", "wf"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["y"])]
    inits = {"w": w, "sx": np.array(0.02, np.float32), "zx": np.array(128, np.uint8),
             "sw": R.uniform(0.005, 0.02, 5).astype(np.float32), "zw": np.zeros(5, np.int8),
             "sy": np.array(0.03, np.float32), "zy": np.array(0, np.uint8)}
    graph = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.UINT8, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.UINT8, (1, 5, 11, 7))],
                              [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    got = polyc.onnx.compile(model).run({"x": x})[0]
    assert got.dtype == np.uint8 and got.shape == want.shape
    diff = np.abs(got.astype(np.int32) - want.astype(np.int32))
    assert diff.max() <= 1 and (diff == 0).mean() > 0.99


@pytest.mark.parametrize("op,attrs,inputs,consts", [
    ("QuantizeLinear", {"axis": 1, "block_size": 2}, {"x": np.zeros((3, 7), np.float32)},
     {"s": np.ones((3, 3), np.float32)}),
    ("DequantizeLinear", {"axis": 0}, {"x": np.zeros((3, 5), np.int8)}, {"s": np.ones((3, 1), np.float32)}),
    ("MatMulInteger", {}, {"a": np.zeros((3, 7), np.uint8), "b": np.zeros((7, 5), np.uint8)},
     {"za": np.array([1, 2], np.uint8)}),
    ("ConvInteger", {}, {"x": np.zeros((1, 2, 5, 5), np.uint8), "w": np.zeros((3, 2, 3, 3), np.uint8)},
     {"zx": np.array([3, 4], np.uint8)}),
])
def test_parameter_shapes_that_fit_nothing(op, attrs, inputs, consts):
    node = helper.make_node(op, list(inputs) + list(consts), ["y"], name="bad", **attrs)
    model = testing.one_node_model(node, inputs, consts, opset=21 if "block_size" in attrs else 13)
    with pytest.raises(polyc.errors.ShapeError, match="node bad"):
        polyc.onnx.compile(model)
