"""Graph passes keep results: onnxruntime on the original model vs on the model re-serialised after the passes.

Also: the load-time errors (dynamic shapes, unsupported ops and attributes) and what each pass removes.
Needs no compiler.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from polyc.errors import ShapeError, UnsupportedError
from polyc.onnx import graph as G
from polyc.onnx import passes, testing
from polyc.onnx.fusion import fusion_groups
from polyc.onnx.load import load_model
from polyc.onnx.lower import check_supported

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def ort_session(model):
    """An onnxruntime session with warnings silenced."""
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])

RNG = np.random.default_rng(0)


def make_model(nodes, inputs, outputs, initializers=(), opset=13):
    graph = helper.make_graph(nodes, "t", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = max(4, helper.find_min_ir_version_for(list(model.opset_import)))
    return model


def vi(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def const(name, array):
    return numpy_helper.from_array(np.asarray(array), name)


def run_ort(model, feeds):
    return ort_session(model).run(None, feeds)


def simplified_model(model):
    g = passes.simplify(G.from_model(load_model(model)))
    return g, G.to_model(g)


def assert_same(model, feeds, rtol=1e-5, atol=1e-6):
    g, after = simplified_model(model)
    onnx.checker.check_model(after)
    for a, b in zip(run_ort(model, feeds), run_ort(after, feeds)):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return g


def ops_of(g):
    return sorted(d["op"] for _, d in g.nodes(data=True))


# ---- one-node and small models ----------------------------------------------------------------------------------

def test_constant_folding_of_shape_computations():
    # Reshape target computed from Shape -> Gather -> Unsqueeze -> Concat: all folds away
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "axes0"], ["n1"]),
        helper.make_node("Concat", ["n1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Relu", ["y"], ["z"]),
    ]
    inits = [const("zero", np.array(0, np.int64)), const("axes0", np.array([0], np.int64)),
             const("minus1", np.array([-1], np.int64))]
    model = make_model(nodes, [vi("x", [2, 3, 4])], [vi("z", [2, 12])], inits)
    g = assert_same(model, {"x": RNG.standard_normal((2, 3, 4)).astype(np.float32)})
    assert ops_of(g) == ["Relu", "Reshape"]
    assert g.graph["tensors"]["z"].shape == (2, 12)


def test_constant_of_shape_weights_fold():
    nodes = [helper.make_node("ConstantOfShape", ["wshape"], ["w"], value=numpy_helper.from_array(np.array([0.5], np.float32))),
             helper.make_node("MatMul", ["x", "w"], ["y"])]
    model = make_model(nodes, [vi("x", [3, 4])], [vi("y", [3, 5])], [const("wshape", np.array([4, 5], np.int64))])
    g = assert_same(model, {"x": RNG.standard_normal((3, 4)).astype(np.float32)})
    assert ops_of(g) == ["MatMul"]
    w = g.nodes[next(iter(g.nodes))]["inputs"][1]
    assert g.graph["constants"][w].shape == (4, 5)


def test_identity_and_dropout_removed_output_names_kept():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Dropout", ["a"], ["b"], ratio=0.3),
             helper.make_node("Identity", ["b"], ["y"])]
    model = make_model(nodes, [vi("x", [4, 5])], [vi("y", [4, 5])], opset=11)
    g = assert_same(model, {"x": RNG.standard_normal((4, 5)).astype(np.float32)})
    assert ops_of(g) == ["Relu"]
    assert g.graph["outputs"] == ["y"]


def test_batchnorm_folds_into_conv():
    w = RNG.standard_normal((8, 3, 3, 3)).astype(np.float32)
    bn = [RNG.uniform(0.5, 1.5, 8), RNG.standard_normal(8), RNG.standard_normal(8), RNG.uniform(0.5, 1.5, 8)]
    inits = [const("w", w), const("b", RNG.standard_normal(8).astype(np.float32))] + \
        [const(n, v.astype(np.float32)) for n, v in zip(["s", "bb", "m", "v"], bn)]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["y"], epsilon=1e-3)]
    model = make_model(nodes, [vi("x", [1, 3, 9, 9])], [vi("y", [1, 8, 9, 9])], inits)
    g = assert_same(model, {"x": RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)}, rtol=1e-4, atol=1e-5)
    assert ops_of(g) == ["Conv", "Pad"]  # the BatchNormalization folded; the padding is a node of its own


@pytest.mark.parametrize("opset,per_channel", [(10, False), (13, False), (13, True), (21, True)])
def test_dequantized_constant_weights_fold(opset, per_channel):
    """A QDQ export's int8 weights with their DequantizeLinear fold into float32 weights (onnx's reference
    evaluator has no DequantizeLinear before opset 19: polyc's own folder), so the Conv gets constant
    weights; the folded model matches onnxruntime on the original."""
    wq = RNG.integers(-128, 128, (8, 3, 3, 3)).astype(np.int8)
    scale = RNG.uniform(0.001, 0.02, 8 if per_channel else ()).astype(np.float32)
    zero = RNG.integers(-3, 4, 8 if per_channel else ()).astype(np.int8)
    nodes = [helper.make_node("DequantizeLinear", ["wq", "s", "z"], ["w"], **({"axis": 0} if per_channel else {})),
             helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [vi("x", [1, 3, 9, 9])], [vi("y", [1, 8, 9, 9])],
                       [const("wq", wq), const("s", scale), const("z", zero)], opset=opset)
    g = assert_same(model, {"x": RNG.standard_normal((1, 3, 9, 9)).astype(np.float32)}, rtol=1e-5, atol=1e-6)
    assert "DequantizeLinear" not in ops_of(g) and "Conv" in ops_of(g)
    folded = next(v for v in g.graph["constants"].values() if v.shape == wq.shape)
    shape = (8, 1, 1, 1) if per_channel else ()
    expected = (wq.astype(np.int64) - zero.reshape(shape)).astype(np.float32) * scale.reshape(shape)
    np.testing.assert_array_equal(folded, expected)


@pytest.mark.parametrize("shape,kernel,attrs,opset", [
    ((1, 3, 11), (3,), dict(pads=[1, 2]), 13),                                      # 1-D, uneven pads
    ((1, 3, 9, 8), (3, 3), dict(pads=[1, 1, 1, 1]), 9),                             # pads as a Pad attribute
    ((1, 3, 9, 8), (3, 2), dict(auto_pad="SAME_UPPER"), 13),
    ((1, 3, 9, 8), (3, 3), dict(auto_pad="SAME_LOWER", strides=[1, 2]), 13),
    ((1, 3, 9, 9), (3, 3), dict(pads=[2, 2, 2, 2], dilations=[2, 2]), 13),
    ((1, 3, 9, 9), (3, 3), dict(pads=[2, 0, 3, 1], strides=[3, 1]), 13),          # windows stop short of the end
    ((1, 2, 5, 6, 4), (3, 3, 3), dict(pads=[1, 1, 1, 1, 1, 1]), 13),               # 3-D
])
def test_padded_conv_reads_an_explicit_pad(shape, kernel, attrs, opset):
    w = RNG.standard_normal((8, shape[1]) + kernel).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], **attrs)]
    model = make_model(nodes, [vi("x", list(shape))], [vi("y", None)], [const("w", w)], opset=opset)
    model = onnx.shape_inference.infer_shapes(model)
    g = assert_same(model, {"x": RNG.standard_normal(shape).astype(np.float32)}, rtol=1e-4, atol=1e-5)
    assert ops_of(g).count("Pad") == 1  # a strided conv also gets its space-to-depth movement ops
    conv = next(d for _, d in g.nodes(data=True) if d["op"] == "Conv")
    assert not any(conv["attrs"].get("pads", [])) and "auto_pad" not in conv["attrs"]


def test_depthwise_and_unpadded_convs_keep_their_form():
    dw = RNG.standard_normal((4, 1, 3, 3)).astype(np.float32)
    w = RNG.standard_normal((4, 4, 3, 3)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "dw"], ["d"], pads=[1, 1, 1, 1], group=4),  # 1 x 9 taps < 16: guards
             helper.make_node("Conv", ["d", "w"], ["y"])]                              # no padding at all
    model = make_model(nodes, [vi("x", [1, 4, 7, 7])], [vi("y", [1, 4, 5, 5])], [const("dw", dw), const("w", w)])
    g = assert_same(model, {"x": RNG.standard_normal((1, 4, 7, 7)).astype(np.float32)}, rtol=1e-4, atol=1e-5)
    assert ops_of(g) == ["Conv", "Conv"]


def test_batchnorm_without_conv_becomes_mul_add():
    inits = [const(n, RNG.uniform(0.5, 1.5, 4).astype(np.float32)) for n in ["s", "bb", "m", "v"]]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("BatchNormalization", ["r", "s", "bb", "m", "v"], ["y"])]
    model = make_model(nodes, [vi("x", [2, 4, 3, 3])], [vi("y", [2, 4, 3, 3])], inits, opset=9)
    g = assert_same(model, {"x": RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)})
    assert ops_of(g) == ["Add", "Mul", "Relu"]


@pytest.mark.parametrize("kernel,strides,pads,phases", [
    ((1, 1), (2, 2), (0, 0, 0, 0), True),    # a subsampling Slice: no extra work
    ((7, 7), (2, 2), (3, 3, 3, 3), True),    # 64/49 of the work
    ((4, 4), (2, 2), (1, 1, 2, 2), True),    # no zero taps
    ((3, 3), (2, 2), (1, 1, 1, 1), False),   # 16/9: direct
    ((7, 5), (2, 3), (3, 2, 2, 1), False),   # 48/35
    ((4, 4), (3, 1), (0, 1, 2, 1), False)])  # 24/16
def test_strided_conv_becomes_space_to_depth_when_it_adds_little_work(kernel, strides, pads, phases):
    """Over its input's phases when the zero taps add at most SPACE_TO_DEPTH_MAX_WORK of the multiply-adds,
    else strided as it is; the result is the reference's either way."""
    w = RNG.standard_normal((4, 3) + kernel).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=list(strides), pads=list(pads))]
    x = RNG.standard_normal((1, 3, 17, 14)).astype(np.float32)
    inits = [const("w", w), const("b", RNG.standard_normal(4).astype(np.float32))]
    shape = [1, 4] + [(n + pads[i] + pads[i + 2] - kernel[i]) // strides[i] + 1 for i, n in enumerate((17, 14))]
    model = make_model(nodes, [vi("x", [1, 3, 17, 14])], [vi("y", shape)], inits)
    g = assert_same(model, {"x": x}, rtol=1e-4, atol=1e-5)
    convs = [d for _, d in g.nodes(data=True) if d["op"] == "Conv"]
    assert len(convs) == 1
    assert convs[0]["attrs"].get("strides", [1, 1]) == ([1, 1] if phases else list(strides))


def test_a_strided_conv_of_a_region_a_rewrite_dissolves_is_rewritten_too(monkeypatch):
    """Convolutions of channels-last regions keep their stride, but rewriting one outside a region can leave
    the region below find_regions' bars (ResNet-50 with AVX2: once its layer-4 strided 1x1 convolution is
    rewritten, only the stem's region is left): the regions are found again after each round, so the strided
    convolution the dissolved region held is rewritten in the next one (it ran NCHW with stride-2 vector
    reads: ResNet-50's layer-2 downsampling convolution 3.2 ms against 2.0 rewritten, AVX2, Zen 4)."""
    calls = []

    def regions(g):  # "a" is in a region while "b" still has its stride
        calls.append(1)
        conv = {d["outputs"][0]: (n, d) for n, d in g.nodes(data=True) if d["op"] == "Conv"}
        strided = conv["y"][1]["attrs"].get("strides", [1, 1]) != [1, 1]
        return [{conv["t"][0]}] if strided else []

    monkeypatch.setattr(passes, "find_regions", regions)
    nodes = [helper.make_node("Conv", ["x", "wa"], ["t"], strides=[2, 2]),
             helper.make_node("Relu", ["t"], ["r"]),
             helper.make_node("Conv", ["r", "wb"], ["y"], strides=[2, 2])]
    inits = [const("wa", RNG.standard_normal((6, 3, 1, 1)).astype(np.float32)),
             const("wb", RNG.standard_normal((5, 6, 1, 1)).astype(np.float32))]
    model = make_model(nodes, [vi("x", [1, 3, 12, 12])], [vi("y", [1, 5, 3, 3])], inits)
    g = assert_same(model, {"x": RNG.standard_normal((1, 3, 12, 12)).astype(np.float32)}, rtol=1e-4, atol=1e-5)
    convs = [d for _, d in g.nodes(data=True) if d["op"] == "Conv"]
    assert len(convs) == 2 and all(d["attrs"].get("strides", [1, 1]) == [1, 1] for d in convs)
    assert ops_of(g).count("Slice") == 2 and len(calls) == 3  # b, then a, then nothing left


@pytest.mark.parametrize("shape,channels,lanes,flattened", [
    ((1, 6, 9, 7), 8, 16, True), ((2, 5, 11, 13), 3, 16, True),
    ((1, 16, 7, 7), 40, 16, False),  # channels-last below two register tiles of pixels: 64 with AVX-512,
    ((1, 16, 7, 7), 40, 8, True),    # 32 with AVX2's 8 lanes
    ((1, 16, 5, 5), 40, 8, False)])
def test_pointwise_conv_runs_over_the_flattened_image(monkeypatch, shape, channels, lanes, flattened):
    """A 1x1 Conv and the elementwise nodes its fusion group takes in (a per-channel constant, a residual
    image, an activation; a diamond such as x * sigmoid(x)) run over (N, C, 1, H*W), with one Reshape back
    where the image is read otherwise (a pooling), and each group is still one kernel."""
    monkeypatch.setattr(passes, "vector_lanes", lambda dtype: lanes)
    n, c, h, w = shape
    wt = RNG.standard_normal((channels, c, 1, 1)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["t"]),
             helper.make_node("Mul", ["t", "s"], ["u"]),
             helper.make_node("Add", ["u", "r"], ["v"]),
             helper.make_node("Relu", ["v"], ["y"]),
             helper.make_node("GlobalAveragePool", ["y"], ["p"]),
             helper.make_node("Conv", ["y", "w2"], ["z"]),
             helper.make_node("Sigmoid", ["z"], ["z1"]),
             helper.make_node("Mul", ["z", "z1"], ["o"])]
    inits = [const("w", wt), const("b", RNG.standard_normal(channels).astype(np.float32)),
             const("s", RNG.standard_normal((channels, 1, 1)).astype(np.float32)),
             const("w2", RNG.standard_normal((channels, channels, 1, 1)).astype(np.float32))]
    model = make_model(nodes, [vi("x", list(shape)), vi("r", [n, channels, h, w])], [vi("o", None), vi("p", None)],
                       inits)
    model = onnx.shape_inference.infer_shapes(model)
    feeds = {"x": RNG.standard_normal(shape).astype(np.float32),
             "r": RNG.standard_normal((n, channels, h, w)).astype(np.float32)}
    g = assert_same(model, feeds, rtol=1e-4, atol=1e-5)
    convs = [d for _, d in g.nodes(data=True) if d["op"] == "Conv"]
    assert all(g.graph["tensors"][d["outputs"][0]].shape[-2:] == ((1, h * w) if flattened else (h, w))
               for d in convs)
    kernels = ["+".join(grp.ops) for grp in fusion_groups(g) if grp.kind == "kernel"]
    assert sorted(kernels) == ["Conv+Mul+Add+Relu", "Conv+Sigmoid+Mul", "GlobalAveragePool"]
    # x and r flattened; y back for the pooling (the second Conv reads its flat form) and o at the end
    assert ops_of(g).count("Reshape") == (4 if flattened else 0)


@pytest.mark.parametrize("lanes", [8, 16])
def test_a_small_channels_last_pointwise_conv_stays_so_whatever_its_weight_size(monkeypatch, lanes):
    """A 1x1 Conv on a 5x5 image (fewer pixels than two register tiles of AVX2's or AVX-512's vectors) stays
    channels-last with weights of twice the L2 size: packed once, they stream contiguously either way."""
    from polyc.onnx.ops import core
    monkeypatch.setattr(passes, "vector_lanes", lambda dtype: lanes)
    monkeypatch.setattr(core, "vector_lanes", lambda dtype: lanes)
    monkeypatch.setattr(core, "l2_bytes", lambda: 16 * 1024)   # weights: 64 x 128 x 4 = 32 KiB
    w = RNG.standard_normal((128, 64, 1, 1)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"])], [vi("x", [1, 64, 5, 5])],
                       [vi("y", [1, 128, 5, 5])], [const("w", w)])
    g = assert_same(model, {"x": RNG.standard_normal((1, 64, 5, 5)).astype(np.float32)}, rtol=1e-4, atol=1e-5)
    conv = next(d for _, d in g.nodes(data=True) if d["op"] == "Conv")
    assert g.graph["tensors"][conv["outputs"][0]].shape == (1, 128, 5, 5)


def test_common_subexpressions_merge():
    nodes = [helper.make_node("Exp", ["x"], ["a"]), helper.make_node("Exp", ["x"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [vi("x", [3])], [vi("y", [3])])
    g = assert_same(model, {"x": RNG.standard_normal(3).astype(np.float32)})
    assert ops_of(g) == ["Add", "Exp"]


def test_dead_code_removed():
    nodes = [helper.make_node("Exp", ["x"], ["dead"]), helper.make_node("Relu", ["x"], ["y"])]
    model = make_model(nodes, [vi("x", [3])], [vi("y", [3])])
    g = assert_same(model, {"x": RNG.standard_normal(3).astype(np.float32)})
    assert ops_of(g) == ["Relu"]


def test_passes_do_not_mutate_their_input():
    nodes = [helper.make_node("Identity", ["x"], ["a"]), helper.make_node("Relu", ["a"], ["y"])]
    g = G.from_model(load_model(make_model(nodes, [vi("x", [3])], [vi("y", [3])])))
    before = G.summary(g)
    passes.simplify(g)
    assert G.summary(g) == before


# ---- errors ---------------------------------------------------------------------------------------------------------

def test_dynamic_input_dim_names_input_and_suggests_input_shapes():
    model = make_model([helper.make_node("Relu", ["data"], ["y"])], [vi("data", ["batch", 3])], [vi("y", [5, 3])])
    with pytest.raises(ShapeError) as e:
        load_model(model)
    assert "'data'" in str(e.value) and 'input_shapes={"data": (1, 3,)}' in str(e.value)
    g = G.from_model(load_model(model, input_shapes={"data": (5, 3)}))
    assert g.graph["tensors"]["data"].shape == (5, 3)
    assert passes.simplify(g).graph["tensors"]["y"].shape == (5, 3)


def test_input_shapes_must_name_an_input():
    model = make_model([helper.make_node("Relu", ["data"], ["y"])], [vi("data", ["batch", 3])], [vi("y", [5, 3])])
    with pytest.raises(ShapeError, match="not an input"):
        load_model(model, input_shapes={"date": (1, 3)})


def test_unsupported_ops_are_all_listed_at_once():
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="ok"),
             helper.make_node("RandomUniformLike", ["a"], ["b"], name="bad1"),
             helper.make_node("Det", ["b"], ["c"], name="bad2")]
    model = make_model(nodes, [vi("x", [3, 3])], [vi("c", [])])
    g = passes.simplify(G.from_model(load_model(model)))
    with pytest.raises(UnsupportedError) as e:
        check_supported(g)
    text = str(e.value)
    assert "RandomUniformLike on node bad1" in text and "Det on node bad2" in text and "node ok" not in text


def test_unsupported_attribute_names_value_node_and_op():
    nodes = [helper.make_node("LayerNormalization", ["x", "s"], ["y"], stash_type=0, name="norm")]
    model = make_model(nodes, [vi("x", [3, 4])], [vi("y", [3, 4])], [const("s", np.ones(4, np.float32))], opset=17)
    g = passes.simplify(G.from_model(load_model(model)))
    with pytest.raises(UnsupportedError,
                       match=r"unsupported attribute stash_type=0 on node norm \(LayerNormalization\)"):
        check_supported(g)


# ---- the model-zoo light models ---------------------------------------------------------------------------------

#: The three models with hundreds of MB of weights (onnxruntime runs each twice here) run with ``-m slow``,
#: as in tests/onnx/test_onnx_models.py; the passes meet every layer kind of theirs in the other six.
HEAVY = ("vgg19", "zfnet512", "bvlc_alexnet")


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in HEAVY else n
                                  for n in testing.LIGHT_MODELS])
def test_light_model_passes_keep_results(name):
    model = testing.reweight(onnx.load(testing.light_model_path(name)), seed=1)
    model = testing.expose(model, testing.softmax_inputs(model))
    g, after = simplified_model(model)
    ops = ops_of(g)
    assert "ConstantOfShape" not in ops and "BatchNormalization" not in ops and "Dropout" not in ops
    inp = g.graph["inputs"][0]
    x = RNG.standard_normal(g.graph["tensors"][inp].shape).astype(np.float32)
    for a, b in zip(run_ort(model, {inp: x}), run_ort(after, {inp: x})):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4 * (np.abs(a).max() + 1e-6))
    check_supported(g)
    assert fusion_groups(g)


def test_unweighted_light_model_folds_every_constant_of_shape():
    g = passes.simplify(G.from_model(load_model(testing.light_model_path("resnet50"))))
    assert all(d["op"] not in ("ConstantOfShape", "BatchNormalization") for _, d in g.nodes(data=True))
    assert sum(d["op"] == "Conv" for _, d in g.nodes(data=True)) == 53
