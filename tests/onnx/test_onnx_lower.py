"""Fusion groups, lowering to TC text, the memory plan, and the API's errors (mostly no kernel compiles)."""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc.onnx
import polyc.onnx.backend as backend
from polyc.errors import PolycError, ShapeError, UnsupportedError
from polyc.onnx import graph as G
from polyc.onnx import passes, testing
from polyc.onnx.fusion import fusion_groups, groups_summary
from polyc.onnx.graph import LAYOUT_ATTR, NCHW_IN, NHWC
from polyc.onnx.load import load_model
from polyc.onnx.lower import lower_groups
from polyc.onnx.memory import plan_memory
from polyc.onnx.ops import core
from targets import RUNNABLE_CPUS


def simplified(path_or_model):
    return passes.simplify(G.from_model(load_model(path_or_model)))


@pytest.fixture(scope="module")
def resnet():
    g = simplified(testing.light_model_path("resnet50"))
    groups = fusion_groups(g)
    return g, groups, lower_groups(g, groups)


def test_resnet_groups_fuse_conv_bias_residual_relu(resnet):
    g, groups, _ = resnet
    ops = [gr.ops for gr in groups]
    assert ops.count(("Conv", "Sum", "Relu")) == 16  # every residual block's last conv + Add + Relu
    assert ops.count(("Conv", "Relu")) == 33
    assert all(gr.kind == "alias" for gr in groups if gr.ops == ("Reshape",))
    assert "Conv+Sum+Relu" in groups_summary(g, groups)
    # strided convolutions were rewritten to stride 1 over the input's phases (space-to-depth) where that adds
    # little work (the 1x1 downsamplings); the 3x3 stride-2 ones (16/9 the work) stay strided, and so does the
    # 7x7 stem, which heads a stem region with the MaxPool (channels-last, polyc.onnx.layout.stem_region)
    strided = [d for _, d in g.nodes(data=True) if d["op"] == "Conv" and d["attrs"].get("strides", [1, 1]) != [1, 1]]
    stem = [d for d in strided if d["attrs"].get(LAYOUT_ATTR) == NCHW_IN]
    assert len(stem) == 1 and g.graph["constants"][stem[0]["inputs"][1]].shape[1:] == (3, 7, 7)
    assert [d["op"] for _, d in g.nodes(data=True) if d["op"] == "MaxPool" and d["attrs"].get(LAYOUT_ATTR) == NHWC]
    assert all(g.graph["constants"][d["inputs"][1]].shape[2:] == (3, 3) for d in strided if d not in stem)


def test_lowered_conv_writes_in_place_and_identical_groups_share_text(resnet):
    _, _, kernels = resnet
    first = next(k.source for k in kernels if k and "(float(1,64,56,56) Y0)" in k.source and "+=!" in k.source
                 and "+r1" in k.source)  # the 3x3 convolution over 64 channels at 56x56
    # the input comes padded by its own Pad kernel (explicit_conv_padding): 56 + 2, and no guarded read
    assert first.startswith("def onnx_conv_relu(float(1,64,58,58) X0, ") and "?" not in first
    if core.channels_last((1, 64, 56, 56), 1, True, (3, 3), in_channels=64):  # accumulated in T0(n, h, w, m), read back
        assert "float(64,3,3,64) X1" in first and "T0(i0, i1, i2, i3) +=! X0(i0, r0, i1+r1, i2+r2) * " \
            "X1(r0, r1, r2, i3)" in first
        assert "Y0(i0, i1, i2, i3) = max((T0(i0, i2, i3, i1) + X2(i1)), 0.0)" in first
    else:  # NCHW: accumulated in the output itself
        assert "Y0(i0, i1, i2, i3) +=! " in first and "X0(i0, r0, i2+r1, i3+r2)" in first
        assert "Y0(i0, i1, i2, i3) = max((Y0(i0, i1, i2, i3) + X2(i1)), 0.0)" in first
    assert len({k.source for k in kernels if k}) < sum(k is not None for k in kernels)


def test_one_by_one_conv_has_no_window_reduction(resnet):
    _, _, kernels = resnet
    one = next(k for k in kernels if k and "float(64,64,1,1)" in k.source)
    assert "X0(i0, r0, i2, i3) * X1(i1, r0, 0, 0)" in one.source


@pytest.mark.parametrize("name", testing.LIGHT_MODELS)
def test_memory_plan_never_overlaps_live_tensors(name):
    g = simplified(testing.light_model_path(name))
    groups = fusion_groups(g)
    plan = plan_memory(g, groups)
    items = [(plan.offsets[t], plan.sizes[t], *plan.lifetimes[t]) for t in plan.offsets]
    for k, (o1, s1, f1, l1) in enumerate(items):
        assert o1 % 64 == 0
        for o2, s2, f2, l2 in items[k + 1:]:
            if not (l1 < f2 or l2 < f1):
                assert o1 + s1 <= o2 or o2 + s2 <= o1
    assert plan.arena_bytes <= plan.total_bytes
    assert "arena" in str(plan)


def test_diamonds_of_elementwise_nodes_fuse_into_the_anchor():
    """A tensor read by several elementwise nodes that meet again (GELU's Div, Erf, Add, Mul, Mul after a
    MatMul + bias; x * sigmoid(x) after a Conv) fuses whole into the anchor's group; a diamond that does not
    close (a reader that is no elementwise node) stops the group there. Results match onnxruntime."""
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    inits = [numpy_helper.from_array(a, n) for n, a in [("w", f(16, 24)), ("bias", f(24)),
                                                         ("sq2", np.float32(1.4142135)), ("one", np.float32(1.0)),
                                                         ("half", np.float32(0.5)), ("k", f(8, 3, 3, 3))]]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["x"]),
             helper.make_node("Div", ["x", "sq2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["gelu"]),
             helper.make_node("Conv", ["i", "k"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"]), helper.make_node("Mul", ["c", "s"], ["silu"]),
             helper.make_node("Relu", ["silu"], ["r"]),
             helper.make_node("MaxPool", ["silu"], ["p"], kernel_shape=[2, 2])]
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [5, 16]),
                                           helper.make_tensor_value_info("i", TensorProto.FLOAT, [1, 3, 9, 9])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in
                               (("gelu", [5, 24]), ("r", [1, 8, 9, 9]), ("p", [1, 8, 8, 8]))],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    g = simplified(model)
    kernels = sorted("+".join(gr.ops) for gr in fusion_groups(g) if gr.kind == "kernel")
    assert kernels == ["Conv+Sigmoid+Mul", "MatMul+Add+Div+Erf+Add+Mul+Mul", "MaxPool", "Pad", "Relu"]
    feeds = {"a": f(5, 16), "i": f(1, 3, 9, 9)}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    expected = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    for got, want in zip(polyc.onnx.compile(model, progress=False).run(feeds), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def _relu_model(shape=(2, 3), elem=TensorProto.FLOAT):
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "r",
                              [helper.make_tensor_value_info("x", elem, list(shape))],
                              [helper.make_tensor_value_info("y", elem, list(shape))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


def test_feeds_are_checked_by_name_shape_and_dtype():
    model = polyc.onnx.compile(_relu_model())
    assert model.input_names == ("x",) and model.input_shapes == ((2, 3),) and model.output_names == ("y",)
    x = np.array([[-1, 2, -3], [4, -5, 6]], np.float32)
    np.testing.assert_array_equal(model.run({"x": x})[0], np.maximum(x, 0))
    np.testing.assert_array_equal(model(x)[0], np.maximum(x, 0))
    with pytest.raises(ShapeError, match="unknown input 'z'.*x float32\\[2, 3\\]"):
        model.run({"z": x})
    with pytest.raises(ShapeError, match="missing input 'x': expected float32\\[2, 3\\]"):
        model.run({})
    with pytest.raises(ShapeError, match="input 'x': expected shape \\[2, 3\\], got \\[3, 2\\]"):
        model.run({"x": x.T.copy()})
    with pytest.raises(ShapeError, match="input 'x': expected dtype float32, got float64"):
        model.run({"x": x.astype(np.float64)})


def test_dynamic_shape_error_and_pinning_through_compile():
    model = _relu_model(shape=("N", 3))
    with pytest.raises(ShapeError, match="input 'x' has a dynamic shape"):
        polyc.onnx.compile(model)
    compiled = polyc.onnx.compile(model, input_shapes={"x": (4, 3)})
    assert compiled.output_shapes == ((4, 3),)


def test_unsupported_op_rejected_before_any_kernel_compiles():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("RandomUniformLike", ["a"], ["b"], name="hm"),
             helper.make_node("Det", ["b"], ["y"], name="det")]
    graph = helper.make_graph(nodes, "u", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(UnsupportedError, match="(?s)2 unsupported feature.*RandomUniformLike on node hm.*Det on node det"):
        polyc.onnx.compile(model)


def test_missing_initializer_is_a_clear_error():
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "m",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    with pytest.raises(PolycError, match="node Add_0 \\(Add\\) reads tensor 'w', which no graph input, initializer"):
        polyc.onnx.compile(model)


def test_backend_module_interface():
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    x = np.array([-1.0, 2.0], np.float32)
    (y,) = backend.run_node(helper.make_node("Relu", ["x"], ["y"]), [x])
    np.testing.assert_array_equal(y, [0.0, 2.0])
    rep = backend.prepare(_relu_model())
    np.testing.assert_array_equal(rep.run([np.ones((2, 3), np.float32)])[0], np.ones((2, 3)))
    w = numpy_helper.from_array(np.ones(3, np.float32), "w")
    assert w is not None


def test_narrow_convolutions_compute_channels_last(resnet):
    _, _, kernels = resnet
    narrow = [k for k in kernels if k and "512,7,7) Y0" in k.source and "+=!" in k.source]
    assert len(narrow) >= 3
    for k in narrow:
        # the weights, transposed at compile time to (c, kh, kw, m), make the output channel stride-1
        (name, table), = [(n, t) for n, t in k.constants.items() if "_wT_" in n]
        assert table.shape[-1] == 512 and table.ndim == 4
        assert "T0(i0, i1, i2, i3) +=! " in k.source  # T0(n, h, w, m)
        assert "Y0(i0, i1, i2, i3) = " in k.source and "T0(i0, i2, i3, i1)" in k.source
    wide = next(k for k in kernels if k and "(float(1,64,56,56) Y0)" in k.source and "+=!" in k.source
                and "+r1" in k.source)  # the 3x3 convolution over 64 channels at 56x56
    # 56 columns in tiles of 16 (AVX2) or 32 (AVX-512) leave 8 of 64 lanes empty; 64 channels fill them
    assert any("_wT_" in n for n in wide.constants) == core.channels_last((1, 64, 56, 56), 1, True, (3, 3),
                                                                           in_channels=64)
    one = next(k for k in kernels if k and "float(256,64,1,1)" in k.source)
    assert not any("_wT_" in n for n in one.constants)  # a 1x1 conv over a wide image: NCHW as written


@pytest.mark.parametrize("lanes", [8, 16])
def test_channels_last_when_channels_fill_the_vectors_and_the_width_does_not(monkeypatch, lanes):
    monkeypatch.setattr(core, "vector_lanes", lambda dtype: lanes)
    nr = 2 * lanes
    assert core.channels_last((1, 64, 28, 28), 1, True, (3, 3), in_channels=64)  # 28 of 32 lanes
    assert core.channels_last((1, 128, 56, 56), 1, True, (3, 3), in_channels=64)         # 56 of 64
    assert not core.channels_last((1, 64, 28, 28), 1, True, (1, 1))  # 1x1: the flattened image decides
    assert not core.channels_last((1, 40, 28, 28), 1, True, (3, 3), in_channels=64)  # 40 channels: a half tile
    assert not core.channels_last((1, 64, 28, 28), 2, True, (3, 3), in_channels=64)      # grouped
    assert not core.channels_last((1, 64, 28, 28), 1, False, (3, 3))     # weights at run time
    assert not core.channels_last((1, 16, 7, 7), 1, True, (3, 3), in_channels=64)  # too few channels
    assert core.channels_last((1, 32, 7, 7), 1, True, (1, 1))            # narrower than 16 columns
    assert not core.channels_last((1, 64, 4 * nr, 4 * nr), 1, True, (3, 3), in_channels=64)  # full tiles
    assert not core.channels_last((1, 64, 28, 28), 1, True, (3, 3), in_channels=12)  # a network's stem
    # a 1x1 over a flattened 7x7 image: 49 pixels leave 15 of 64 lanes empty, a deep reduction pays the read-back
    assert core.channels_last((1, 4 * nr, 1, 49), 1, True, (1, 1), in_channels=core.CHANNELS_LAST_MIN_DEPTH)
    assert not core.channels_last((1, 4 * nr, 1, 49), 1, True, (1, 1), in_channels=128)  # a shallow one does not
    assert not core.channels_last((1, 4 * nr + 8, 1, 49), 1, True, (1, 1), in_channels=512)  # a partial tile
    assert not core.channels_last((1, 4 * nr, 1, 196), 1, True, (1, 1), in_channels=512)  # 14x14: tiles nearly full
    assert not core.channels_last((1, 4 * nr, 1, 49), 1, True, (), in_channels=512)  # no window given


@pytest.mark.parametrize("cpu", ["znver3", pytest.param("znver4", marks=pytest.mark.skipif(
    "znver4" not in RUNNABLE_CPUS, reason="the host cannot run AVX-512 code"))])
@pytest.mark.parametrize("in_channels", [64, 256])
def test_a_deep_pointwise_convolution_over_a_narrow_image_accumulates_channels_last_over_its_pixels(
        monkeypatch, cpu, in_channels):
    """A 1x1 Conv at 7x7 (49 pixels, a partial register tile whichever the vectors) with 256 input channels
    accumulates channels-last over the flattened image, ``T0(n, 0, p, m)`` read back to NCHW in its epilogue
    with the bias and ReLU; with 64 it does not (NCHW over the flattened pixels with AVX2, channels-last by
    rows of the image with AVX-512). Results match onnxruntime."""
    import onnxruntime as ort
    monkeypatch.setenv("POLYC_CPU", cpu)
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, in_channels ** -0.5, (64, in_channels, 1, 1)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, 64).astype(np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "pointwise", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                  [1, in_channels, 7, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 7, 7])],
                              initializer=[w, b])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = passes.simplify(G.from_model(load_model(model)))
    kernel, = [k for k in lower_groups(g, fusion_groups(g)) if k and "+=!" in k.source]
    flat = "T0(i0, i1, i2, i3) +=! X0(i0, r0, i1, i2)" in kernel.source and "i2 in 0:49" in kernel.source
    assert flat == (in_channels == 256)
    x = rng.normal(0, 1, (1, in_channels, 7, 7)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    for threads in (1, 2):
        got = polyc.onnx.compile(model, polyc.Options(threads=threads), progress=False).run({"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)



@pytest.mark.parametrize("stride", [1, 2])
def test_a_strided_1d_convolution_with_a_gelu_runs_channels_last(stride):
    """A Whisper-style 1-D convolution (k3, 64 -> 96 channels, 300 columns) with an erf GELU after it: at
    stride 2 it accumulates channels-last (NCHW would load its input with stride 2; core.channels_last's
    ``strided``), its GELU epilogue vectorized along the channels (written back by a scatter); at stride 1 it
    stays NCHW. Results match onnxruntime."""
    import onnxruntime as ort
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.normal(0, 0.1, (96, 64, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.normal(0, 0.1, 96).astype(np.float32), "b")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in
              (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3], strides=[stride], pads=[1, 1]),
             helper.make_node("Div", ["c", "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["f"]), helper.make_node("Mul", ["c", "f"], ["g"]),
             helper.make_node("Mul", ["g", "half"], ["y"])]
    graph = helper.make_graph(nodes, "gelu_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 300])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "c", "l"])],
                              initializer=[w, b] + consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    g = passes.simplify(G.from_model(load_model(model)))
    kernels = [k for k in lower_groups(g, fusion_groups(g)) if k and "erf" in k.source]
    assert len(kernels) == 1 and ("T0(i0, i1, i2) +=!" in kernels[0].source) == (stride == 2)
    x = rng.normal(0, 1, (1, 64, 300)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = polyc.onnx.compile(model, progress=False).run({"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_tap_boxes_are_the_used_taps_of_each_run_of_channels():
    w = np.zeros((5, 6, 4, 4), np.float32)
    w[:, 0:2] = 1                         # channels 0-1: every tap
    w[2, 2:4, :, 0:3] = 1                 # 2-3: the first three columns, used by one output channel only
    w[:, 5, 1:3, 2] = np.nan              # 5: a NaN weight is used; channel 4 uses nothing
    assert core.tap_boxes(w) == [(0, 2, ((0, 4), (0, 4))), (2, 4, ((0, 4), (0, 3))), (5, 6, ((1, 3), (2, 3)))]
    assert core.tap_boxes(np.ones((2, 3, 3, 3), np.float32)) is None           # every tap used
    assert core.tap_boxes(np.zeros((2, 3, 3, 3), np.float32)) is None          # nothing used: nothing to skip
    ring = np.ones((2, 1, 3, 3), np.float32)
    ring[:, :, 1, 1] = 0
    assert core.tap_boxes(ring) is None                                        # not a box
    many = np.zeros((1, 2 * core.MAX_TAP_BOXES + 2, 3), np.float32)
    many[:, ::2, 0] = 1
    many[:, 1::2, 1] = 1
    assert core.tap_boxes(many) is None                                        # too many pieces
    # a window dim of extent 1 is the literal 0 and needs no condition
    cond = core.tap_condition([(0, 2, ((0, 4), (0, 1))), (2, 4, ((1, 3), (0, 1)))], "r0", ["r1", "0"], 4, [4, 1])
    assert cond == "((r0 < 2) || (r0 >= 2 && r1 >= 1 && r1 < 3))"


@pytest.mark.parametrize("kernel,strides,pads", [((7, 7), (2, 2), (3, 3, 3, 3)), ((7, 4), (2, 2), (3, 1, 2, 2))])
def test_a_convolution_over_phases_skips_its_zero_taps(kernel, strides, pads):
    """A strided convolution rewritten over its input's phases (passes.strided_conv_to_space_to_depth) reduces
    over the taps of the original window only: the lowered statement's iteration domain has exactly
    K*K' taps per input channel, not P*P'*A*A', and the results match onnxruntime, also where the input holds
    an infinity a skipped zero tap would have turned into a NaN."""
    import onnxruntime as ort
    import polyc
    from polyc.poly.build import build_scop
    rng = np.random.default_rng(11)
    c, m, h, wd = 3, 8, 23, 20
    w = rng.normal(0, 0.2, (m, c) + kernel).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=list(kernel), strides=list(strides),
                            pads=list(pads))
    model = testing.one_node_model(node, {"x": np.zeros((1, c, h, wd), np.float32)}, {"w": w})
    g = passes.simplify(G.from_model(load_model(model)))
    convs = [d for _, d in g.nodes(data=True) if d["op"] == "Conv"]
    assert len(convs) == 1 and convs[0]["attrs"][G.ZERO_TAPS_ATTR] == 1
    kernels = [k for k in lower_groups(g, fusion_groups(g)) if k and "+=!" in k.source]
    assert len(kernels) == 1 and "||" in kernels[0].source
    out = g.graph["tensors"]["y"].shape
    scop = build_scop(polyc.define(kernels[0].source).checked, {})
    sets = []
    scop.domain.foreach_set(sets.append)
    (reduction,) = [s for s in sets if s.n_dim() > 4]
    taps = reduction.count_val().to_python() // (out[1] * out[2] * out[3])
    assert taps == c * kernel[0] * kernel[1]
    x = rng.normal(0, 1, (1, c, h, wd)).astype(np.float32)
    x[0, 1, h - 3, wd - 4] = np.inf  # row 20 = 2*8 + 7 - 3: a zero tap of output row 8 reads it
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = polyc.onnx.compile(model, progress=False).run({"x": x})[0]
    assert np.isinf(want).any()
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fold_residual_accumulates_onto_a_dying_input():
    """fold_residual: the residual term of a reduction's epilogue chain becomes the accumulator's start when
    the input dies in the kernel, is read once and has the output's shape and dtype; anything else keeps the
    statements as they were."""
    import polyc
    from polyc.onnx.builder import _Stmt
    from polyc.onnx.lower import fold_residual
    reduction = "Y0(i0, i1) +=! X0(i0, r0) * X1(r0, i1)\n        where i0 in 0:4, i1 in 0:6, r0 in 0:8"
    epilogue = "Y0(i0, i1) = max(((Y0(i0, i1) + X2(i1)) + X3(i0, i1)), 0.0)\n        where i0 in 0:4, i1 in 0:6"
    f32 = np.dtype(np.float32)
    types = {"X0": ((4, 8), f32), "X1": ((8, 6), f32), "X2": ((6,), f32), "X3": ((4, 6), f32), "Y0": ((4, 6), f32)}

    def fold(epi=epilogue, dying=("X3",), kinds=types):
        stmts = [_Stmt("Y0", reduction), _Stmt("Y0", epi)]
        return fold_residual(stmts, kinds, frozenset(dying)), [s.text for s in stmts]

    pairs, texts = fold()
    assert pairs == {"Y0": "X3"}
    assert texts[0].startswith("Y0(i0, i1) += X0(i0, r0) * X1(r0, i1)")
    assert texts[1].startswith("Y0(i0, i1) = max((Y0(i0, i1) + X2(i1)), 0.0)")
    header = "def k(float(4,8) X0, float(8,6) X1, float(6) X2{}) -> (float(4,6) Y0) {{\n    {}\n    {}\n}}\n"
    x0, x1, x2, x3 = (np.random.default_rng(3).standard_normal(s).astype(np.float32)
                      for s in [(4, 8), (8, 6), (6,), (4, 6)])
    want = polyc.define(header.format(", float(4,6) X3", reduction, epilogue))(x0, x1, x2, x3)
    got = polyc.define(header.format("", *texts))(x0, x1, x2, out=x3.copy())  # onto the residual's values
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert fold(dying=())[0] == {}                                         # the residual is needed later
    assert fold(dying=("X2",))[0] == {}                                    # a bias: not the output's shape
    assert fold(kinds={**types, "X3": ((4, 6), np.dtype(np.float64))})[0] == {}  # another dtype
    assert fold(epilogue.replace("+ X3(i0, i1)", "+ (X3(i0, i1) * X3(i0, i1))"))[0] == {}  # read twice
    assert fold(epilogue.replace("+ X3(i0, i1)", "- X3(i0, i1)"))[0] == {}  # a difference
    assert fold(epilogue.replace("max(((Y0(i0, i1) + X2(i1)) + X3(i0, i1)), 0.0)",
                                 "(max((Y0(i0, i1) + X2(i1)), 0.0) + X3(i0, i1))"))[0] == {}  # after the max
    pairs, texts = fold(epilogue.replace("max(((Y0(i0, i1) + X2(i1)) + X3(i0, i1)), 0.0)", "(X3(i0, i1) + Y0(i0, i1))"))
    assert pairs == {"Y0": "X3"} and len(texts) == 1                       # the epilogue was the Add alone


def _residual_model(residual_is_output=False):
    """x -> Conv 1x1 (a) -> Relu -> Conv 1x1 (b) + a -> Relu -> y: the residual ``a`` dies in the second
    kernel (unless it is also a graph output)."""
    rng = np.random.default_rng(5)
    c = 16
    w1, w2 = (rng.normal(0, 0.3, (c, c, 1, 1)).astype(np.float32) for _ in range(2))
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Relu", ["a"], ["r"]),
             helper.make_node("Conv", ["r", "w2"], ["b"]), helper.make_node("Add", ["b", "a"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, 9, 11])]
    if residual_is_output:
        outputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, c, 9, 11]))
    graph = helper.make_graph(nodes, "residual", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 9, 11])],
                              outputs, [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("residual_is_output", [False, True])
def test_a_residual_add_updates_the_residual_in_place(residual_is_output):
    """A Conv + Add(residual) + Relu kernel whose residual dies there writes its output over the residual's
    memory (the memory plan aliases them) and computes onnxruntime's result, with the native program and the
    Python-driven executor, run after run; a residual that is also a graph output keeps its own memory."""
    import onnxruntime as ort
    model = _residual_model(residual_is_output)
    x = np.random.default_rng(6).normal(0, 1, (1, 16, 9, 11)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    compiled = polyc.onnx.compile(model, progress=False)
    folded = {out: x_ for k in compiled.kernels if k is not None for out, x_ in k.inplace.items()}
    if residual_is_output:
        assert not folded
    else:
        assert len(folded) == 1
        (out, residual), = folded.items()
        assert compiled.plan.root(out) == compiled.plan.root(residual)
    for _ in range(2):
        for got, w in zip(compiled.run({"x": x}), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)
    from polyc.onnx.executor import PythonExecutor
    python_driven = PythonExecutor(compiled.executor.program)
    for _ in range(2):
        for got, w in zip(python_driven.run({"x": x}), want):
            np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


def _dense_block_model(layers=3, growth=4, width=6, size=7, extra=None):
    """A DenseNet-style block, NCHW: ``x_{l+1} = Concat(x_l, Relu(Conv(x_l)))`` on the channel axis, ending in a
    1x1 Conv; ``extra`` adds nodes reading the block's tensors (a test's odd cases)."""
    rng = np.random.default_rng(3)
    nodes, inits, c = [helper.make_node("Relu", ["x"], ["x0"])], [], width
    for k in range(layers):
        w = numpy_helper.from_array(rng.normal(0, 0.3, (growth, c, 3, 3)).astype(np.float32), f"w{k}")
        inits.append(w)
        nodes += [helper.make_node("Conv", [f"x{k}", f"w{k}"], [f"c{k}"], pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{k}"], [f"f{k}"]),
                  helper.make_node("Concat", [f"x{k}", f"f{k}"], [f"x{k + 1}"], axis=1)]
        c += growth
    inits.append(numpy_helper.from_array(rng.normal(0, 0.3, (5, c, 1, 1)).astype(np.float32), "wo"))
    nodes.append(helper.make_node("Conv", [f"x{layers}", "wo"], ["y"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra is not None:
        more, more_outputs, *more_inits = extra(layers)
        nodes += more
        inits += more_inits
        outputs += [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in more_outputs]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                             [1, width, size, size])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return _with_output_shapes(model)


def _with_output_shapes(model):
    """``model`` with its outputs' shapes filled in by onnx's shape inference (the checker wants them)."""
    import onnx
    inferred = onnx.shape_inference.infer_shapes(model)
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        if not out.type.tensor_type.HasField("shape") and out.name in known:
            out.type.CopyFrom(known[out.name].type)
    return model


def _same_as_onnxruntime(model, x, views):
    """Compile ``model``, check its view groups' count and every output against onnxruntime, with the native
    program and the Python-driven executor, two runs each, at 1 and 2 threads; return the compiled model."""
    import onnxruntime as ort
    from polyc import Options
    from polyc.onnx.executor import PythonExecutor
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for threads in (1, 2):
        compiled = polyc.onnx.compile(model, Options(threads=threads), progress=False)
        assert sum(gr.kind == "view" for gr in compiled.groups) == views
        for run in (compiled.run, PythonExecutor(compiled.executor.program).run):
            for _ in range(2):
                for got, w in zip(run({"x": x}), want):
                    np.testing.assert_allclose(got, w, rtol=1e-4, atol=1e-5)
    return compiled


def test_a_channel_concat_is_written_in_place_by_its_producers():
    """Each Concat of a dense block (channels of a batch-1 NCHW tensor: contiguous blocks) becomes a view
    group: no kernel, its inputs views at byte offsets of its output (nested: x1 is a block of x2, which is a
    block of x3), the output alive from its first block's write; results equal onnxruntime's."""
    model = _dense_block_model()
    x = np.random.default_rng(4).normal(0, 1, (1, 6, 7, 7)).astype(np.float32)
    compiled = _same_as_onnxruntime(model, x, views=3)
    plan = compiled.plan
    assert not any(k is not None and "Concat" in k.name for k in compiled.kernels)
    assert {plan.root(t) for t in ("x0", "f0", "x1", "f1", "x2", "f2", "x3")} == {plan.root("x3")}
    plane = 7 * 7 * 4
    assert [plan.byte_offset(t) for t in ("x0", "f0", "f1", "f2")] == [0, 6 * plane, 10 * plane, 14 * plane]
    assert plan.byte_offset("x2") == 0 and plan.byte_offset("x3") == 0
    first, _ = plan.lifetimes[plan.root("x3")]
    writes_x0 = next(k for k, gr in enumerate(compiled.groups) if "x0" in gr.outputs)
    assert first == writes_x0


@pytest.mark.parametrize("case", ["part_is_output", "part_read_twice", "input_part", "outer_axis", "part_reused",
                                  "residual_over_block"])
def test_a_concat_stays_a_copy_where_a_view_would_be_wrong(case):
    """A Concat keeps its kernel when an input is a graph output or a graph input, when its axis is not
    the outermost non-unit one (blocks would not be contiguous), and an input is taken by one view only; an
    input read by other nodes as well stays a view; a residual Add whose residual is a block of a tensor the
    same kernel reads is not folded onto it. Results equal onnxruntime's in every case."""
    x = np.random.default_rng(5).normal(0, 1, (1, 6, 7, 7)).astype(np.float32)
    if case == "part_is_output":  # f0 and (through an Identity, which the graph passes remove) f1 are outputs
        model = _dense_block_model(extra=lambda n: ([helper.make_node("Identity", ["f1"], ["f1_out"])],
                                                    ["f1_out"]))
        model.graph.output.append(helper.make_tensor_value_info("f0", TensorProto.FLOAT, None))
        model, views = _with_output_shapes(model), 1  # only x3 = Concat(x2, f2)
    elif case == "part_read_twice":  # f0 and x1 also feed a Sigmoid, x1 a Sum: views all the same
        model, views = _dense_block_model(extra=lambda n: (
            [helper.make_node("Sigmoid", ["f0"], ["s"]), helper.make_node("Sum", ["x1", "x1"], ["t"])],
            ["s", "t"])), 3
    elif case == "input_part":  # a Concat of the graph input itself
        model, views = _dense_block_model(extra=lambda n: (
            [helper.make_node("Sigmoid", ["f0"], ["s"]), helper.make_node("Concat", ["x", "s"], ["xi"], axis=1)],
            ["xi"])), 3
    elif case == "outer_axis":  # along the height of 4-channel tensors: blocks interleave
        model, views = _dense_block_model(extra=lambda n: (
            [helper.make_node("Sigmoid", ["f0"], ["s"]), helper.make_node("Tanh", ["f1"], ["t"]),
             helper.make_node("Concat", ["s", "t"], ["h"], axis=2)], ["h"])), 3
    elif case == "part_reused":  # f1 in two Concats: the second copies
        model, views = _dense_block_model(extra=lambda n: (
            [helper.make_node("Concat", ["f1", "f2"], ["z"], axis=1)], ["z"])), 3
    else:  # Conv(x3) + f0 last reads x3: f0 dies there but is a block of x3, so the sum may not overwrite it
        rng = np.random.default_rng(8)

        def extra(n):
            return ([helper.make_node("Conv", [f"x{n}", "wr"], ["cr"]), helper.make_node("Add", ["cr", "f0"], ["r"]),
                     helper.make_node("Relu", ["r"], ["rr"])], ["rr"],
                    numpy_helper.from_array(rng.normal(0, 0.3, (4, 18, 1, 1)).astype(np.float32), "wr"))
        model, views = _dense_block_model(extra=extra), 3
    compiled = _same_as_onnxruntime(model, x, views)
    if case == "residual_over_block":
        assert not any(k.inplace for k in compiled.kernels if k is not None)
