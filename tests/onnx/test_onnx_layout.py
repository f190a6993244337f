"""Channels-last regions (polyc/onnx/layout.py): which convolutions run NHWC, and the results stay onnxruntime's.

Each model is compiled by polyc (the native program and the Python executor) and compared with onnxruntime on
the original model; the simplified graph is checked for the NHWC Convs and the boundary Transposes.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
import polyc.onnx as ponnx
from polyc.onnx import graph as G
from polyc.onnx import passes
from polyc.onnx.fusion import fusion_groups
from polyc.onnx.layout import LAYOUT_ATTR, NCHW_IN, NHWC, find_regions
from polyc.onnx.load import load_model
from targets import RUNNABLE_CPUS

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

RNG = np.random.default_rng(7)


class Net:
    """A small ONNX graph builder: each method appends a node and returns its output's name."""

    def __init__(self, shape):
        self.nodes, self.inits, self.shape, self.k = [], [], shape, 0

    def _name(self, base):
        self.k += 1
        return f"{base}{self.k}"

    def const(self, array):
        name = self._name("c")
        self.inits.append(numpy_helper.from_array(np.asarray(array, np.float32), name))
        return name

    def op(self, op, inputs, **attrs):
        out = self._name(op.lower())
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def conv(self, x, cin, cout, k=1, stride=1, group=1, bias=True, **attrs):
        w = self.const(RNG.normal(0, (2 / (cin // group * k * k)) ** 0.5, (cout, cin // group, k, k)))
        inputs = [x, w] + ([self.const(RNG.normal(0, 0.1, cout))] if bias else [])
        if "pads" not in attrs and "auto_pad" not in attrs:
            attrs["pads"] = [k // 2] * 4
        return self.op("Conv", inputs, kernel_shape=[k, k], strides=[stride, stride], group=group, **attrs)

    def clip(self, x):
        return self.op("Clip", [x, self.const(0.0), self.const(6.0)])

    def model(self, outputs):
        graph = helper.make_graph(self.nodes, "net", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                                    self.shape)],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, [f"{o}_{d}" for d in "nchw"])
                                   for o in outputs],
                                  initializer=self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 7
        return model


def inverted_residual(net, x, c, expand, k=3, stride=1, **dw):
    """MobileNetV2's block: 1x1 expand + ReLU6, depthwise k x k + ReLU6, 1x1 project, residual Add."""
    h = net.clip(net.conv(x, c, c * expand))
    h = net.clip(net.conv(h, c * expand, c * expand, k=k, stride=stride, group=c * expand, **dw))
    h = net.conv(h, c * expand, c)
    return net.op("Add", [h, x]) if stride == 1 else h


def simplified(model):
    return passes.simplify(G.from_model(load_model(model)))


def nhwc_convs(g, layout=NHWC):
    """The Convs of ``g`` with NHWC input and output (``layout=NCHW_IN``: the regions' heads, NCHW input)."""
    return sorted(n for n, d in g.nodes(data=True) if d["op"] == "Conv" and d["attrs"].get(LAYOUT_ATTR) == layout)


def check_against_onnxruntime(model, shape, monkeypatch, rtol=2e-4, atol=2e-5):
    """polyc's native program and its Python executor against onnxruntime on the original model."""
    x = RNG.normal(0, 1, shape).astype(np.float32)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for executor in ("native", "python"):
        monkeypatch.setenv("POLYC_EXECUTOR", executor)
        got = ponnx.compile(model, polyc.Options(threads=2), progress=False).run({"x": x})
        assert len(got) == len(want)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


def test_mobilenet_stage_runs_channels_last(monkeypatch):
    """Two inverted residuals at 14x14 after a stride-2 depthwise one from 28x28: one region holding every
    convolution, the first 1x1 (28 wide) as its head (reading the NCHW input, writing NHWC), and one
    Transpose, out to the final graph output."""
    net = Net([1, 16, 28, 28])
    h = net.clip(net.conv("x", 16, 64))
    h = net.clip(net.conv(h, 64, 64, k=3, stride=2, group=64))
    h = net.conv(h, 64, 32)
    h = inverted_residual(net, h, 32, 4)
    y = inverted_residual(net, h, 32, 6)
    model = net.model([y])
    g = simplified(model)
    convs = [n for n, d in g.nodes(data=True) if d["op"] == "Conv"]
    assert len(nhwc_convs(g)) == len(convs) - 1 == 8 and len(nhwc_convs(g, NCHW_IN)) == 1
    transposes = [d["attrs"]["perm"] for n, d in g.nodes(data=True) if d["op"] == "Transpose"]
    assert transposes == [[0, 3, 1, 2]]
    assert g.graph["tensors"][y].shape == (1, 32, 14, 14)
    check_against_onnxruntime(model, [1, 16, 28, 28], monkeypatch)


def test_a_pointwise_convolution_of_a_region_runs_over_the_flattened_pixels(monkeypatch):
    """Each 1x1 convolution inside a region (not its head, which reads NCHW) runs over (N, 1, H*W, C), its
    register tile's rows over the 196 pixels instead of one row of 14, and the elementwise nodes its group
    takes in (ReLU6, the residual Add of an NHWC image) with it: each group is still one kernel, the
    Reshapes around it are aliases, and the depthwise convolutions keep their images."""
    net = Net([1, 16, 14, 14])
    h = net.clip(net.conv("x", 16, 16))
    y = inverted_residual(net, inverted_residual(net, h, 16, 4), 16, 6)
    model = net.model([y])
    g = simplified(model)
    tensors = g.graph["tensors"]
    pointwise = [n for n in nhwc_convs(g) if g.nodes[n]["attrs"]["kernel_shape"] == [1, 1]]
    depthwise = [n for n in nhwc_convs(g) if g.nodes[n]["attrs"]["kernel_shape"] == [3, 3]]
    assert len(pointwise) == 4 and len(depthwise) == 2 and len(nhwc_convs(g, NCHW_IN)) == 1
    for n in pointwise:
        x, out = (tensors[t].shape for t in (g.nodes[n]["inputs"][0], g.nodes[n]["outputs"][0]))
        assert x[:3] == out[:3] == (1, 1, 196)
    for n in depthwise:
        assert tensors[g.nodes[n]["outputs"][0]].shape[:3] == (1, 14, 14)
    kernels = sorted("+".join(grp.ops) for grp in fusion_groups(g) if grp.kind == "kernel")
    assert kernels.count("Conv+Add") == 2 and kernels.count("Conv+Clip") == 5
    check_against_onnxruntime(model, [1, 16, 14, 14], monkeypatch)


@pytest.mark.parametrize("dw", [dict(pads=[0, 1, 2, 1]), dict(auto_pad="SAME_UPPER"), dict(auto_pad="VALID"),
                                dict(pads=[2, 2, 2, 2], dilations=[2, 2]), dict(pads=[1, 1, 1, 1], bias=False)],
                         ids=["asymmetric", "same_upper", "valid", "dilated", "no_bias"])
def test_depthwise_geometries(dw, monkeypatch):
    """Padding (asymmetric, SAME_UPPER, none), dilation and a missing bias in an NHWC depthwise convolution,
    with a 5x5 window, at an odd width; a second depthwise conv, and the GlobalAveragePool at the end as a
    ReduceMean over the NHWC image."""
    net = Net([1, 48, 11, 11])
    h = net.clip(net.conv("x", 48, 48))
    bias = dw.pop("bias", True)
    h = net.conv(h, 48, 48, k=5 if "dilations" not in dw else 3, group=48, bias=bias, **dw)
    h = net.conv(net.op("Relu", [h]), 48, 64)
    h = net.conv(net.conv(h, 64, 64, k=3, group=64), 64, 32)
    model = net.model([net.op("GlobalAveragePool", [h])])
    g = simplified(model)
    assert len(nhwc_convs(g)) == 4 and len(nhwc_convs(g, NCHW_IN)) == 1
    assert [d["op"] for n, d in g.nodes(data=True) if d["op"] in ("ReduceMean", "GlobalAveragePool")] == ["ReduceMean"]
    check_against_onnxruntime(model, [1, 48, 11, 11], monkeypatch)


def test_region_tensors_read_outside_and_broadcast_operands(monkeypatch):
    """A tensor of the region that is also a graph output and read by a node outside (a GlobalMaxPool: a
    Transpose back to NCHW under its own name), a squeeze-excitation Mul by a (1, C, 1, 1) tensor computed
    in the region from a GlobalAveragePool, per-channel constants (C, 1, 1) and (1, C, 1, 1), a HardSwish."""
    net = Net([1, 32, 7, 7])
    h = net.op("HardSwish", [net.conv("x", 32, 64)])
    h = net.conv(h, 64, 64, k=3, group=64)
    scale = net.op("Sigmoid", [net.conv(net.op("GlobalAveragePool", [h]), 64, 64, k=1, pads=[0, 0, 0, 0])])
    h = net.op("Mul", [h, scale])
    h = net.op("Add", [h, net.const(RNG.normal(0, 1, (64, 1, 1)))])
    mid = net.op("Mul", [h, net.const(RNG.normal(0, 1, (1, 64, 1, 1)))])
    h = net.conv(net.conv(mid, 64, 64, k=3, group=64), 64, 64, k=3, group=64)
    y = net.conv(h, 64, 32)
    model = net.model([y, mid, net.op("GlobalMaxPool", [mid])])
    g = simplified(model)
    assert len(nhwc_convs(g)) == 5 and len(nhwc_convs(g, NCHW_IN)) == 1
    transposes = [d["attrs"]["perm"] for n, d in g.nodes(data=True) if d["op"] == "Transpose"]
    assert transposes == [[0, 3, 1, 2]] * 2  # mid, y
    check_against_onnxruntime(model, [1, 32, 7, 7], monkeypatch)


def test_stem_heads_the_region_from_an_explicitly_padded_copy(monkeypatch):
    """A network's stem (3x3 stride 2, 3 input channels, 29 columns) heads the region: it reads the NCHW Pad
    of its input as NCHW convolutions do, with no guard, and writes NHWC for the depthwise convs after it."""
    net = Net([1, 3, 29, 29])
    h = net.clip(net.conv("x", 3, 32, k=3, stride=2))
    h = net.clip(net.conv(h, 32, 32, k=3, group=32))
    h = net.conv(net.conv(net.conv(h, 32, 16), 16, 96), 96, 96, k=3, stride=2, group=96)
    model = net.model([net.op("GlobalAveragePool", [h])])
    g = simplified(model)
    head, = nhwc_convs(g, NCHW_IN)
    source = g.nodes[head]["inputs"][0]
    assert g.nodes[next(n for n, d in g.nodes(data=True) if source in d["outputs"])]["op"] == "Pad"
    assert list(g.nodes[head]["attrs"].get("pads", [0] * 4)) == [0] * 4
    assert len(nhwc_convs(g)) == 4
    check_against_onnxruntime(model, [1, 3, 29, 29], monkeypatch)


def test_regions_need_to_save_more_than_their_boundary_and_two_convolutions():
    """A ResNet-like run of 1x1 and 3x3 convolutions at 7x7 keeps the per-convolution form (no region: its
    input and output cross the boundary, twice what the 3x3 convolution's read-back saves), and so does a
    lone depthwise convolution."""
    net = Net([1, 64, 7, 7])
    h = net.op("Relu", [net.conv("x", 64, 64)])
    h = net.op("Relu", [net.conv(h, 64, 64, k=3)])
    resnet = net.model([net.op("Add", [net.conv(h, 64, 64), "x"])])
    g = simplified(resnet)
    assert find_regions(G.from_model(load_model(resnet))) == [] and nhwc_convs(g) == []
    net = Net([1, 64, 7, 7])
    lone = net.model([net.clip(net.conv("x", 64, 64, k=3, group=64))])
    assert nhwc_convs(simplified(lone)) == []


def test_regions_whose_boundary_costs_more_than_they_save_stay_nchw():
    """One inverted residual (ShuffleNetV2's branch): its depthwise conv writes 144 channels, its result and its
    input (for the residual Add) cross the boundary with 24 each, and the result is copied back: no region.
    Two of them in a row: the boundary is the same, the depthwise convs write twice as much: a region."""
    net = Net([1, 24, 56, 56])
    one = net.model([inverted_residual(net, "x", 24, 2)])
    assert nhwc_convs(simplified(one)) == []
    net = Net([1, 24, 56, 56])
    two = net.model([inverted_residual(net, inverted_residual(net, "x", 24, 3), 24, 3)])
    assert len(nhwc_convs(simplified(two))) == 5 and len(nhwc_convs(simplified(two), NCHW_IN)) == 1


def nhwc_pools(g):
    return sorted(n for n, d in g.nodes(data=True) if d["op"] == "MaxPool" and d["attrs"].get(LAYOUT_ATTR) == NHWC)


@pytest.mark.parametrize("stem", [dict(k=7, stride=2, pool=dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4)),
                                  dict(k=3, stride=2, pads=[0] * 4,
                                       pool=dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),
                                  dict(k=3, stride=1, pool=dict(kernel_shape=[2, 2], strides=[2, 2],
                                                                dilations=[2, 2], pads=[0, 0, 1, 1]))],
                         ids=["resnet", "squeezenet_ceil", "dilated_pool_asymmetric"])
def test_a_stem_and_its_max_pool_run_channels_last(stem, monkeypatch):
    """A ResNet/SqueezeNet stem (3 input channels, 64 output channels, a BatchNorm-like scale and ReLU) and the
    MaxPool after it head a region: the convolution stays strided (no space-to-depth) and reads its NCHW
    input, the MaxPool runs NHWC, and the 1x1 convolution after it joins them (the MaxPool's NHWC input is
    what the region saves, its boundary is the 32-channel result), so only that result is transposed back."""
    net = Net([1, 3, 45, 45])
    pool = stem.pop("pool")
    h = net.conv("x", 3, 64, **stem)
    h = net.op("Relu", [net.op("Mul", [h, net.const(RNG.normal(1, 0.1, (64, 1, 1)))])])
    h = net.op("MaxPool", [h], **pool)
    model = net.model([net.op("Relu", [net.conv(h, 64, 32)])])
    g = simplified(model)
    head, = nhwc_convs(g, NCHW_IN)
    assert g.nodes[head]["attrs"]["strides"] == [stem["stride"]] * 2 and len(nhwc_pools(g)) == 1
    assert len(nhwc_convs(g)) == 1
    transposes = [(d["attrs"]["perm"], g.graph["tensors"][d["outputs"][0]].shape[1])
                  for n, d in g.nodes(data=True) if d["op"] == "Transpose"]
    assert transposes == [([0, 3, 1, 2], 32)]
    check_against_onnxruntime(model, [1, 3, 45, 45], monkeypatch)


def test_a_stem_without_a_max_pool_or_read_twice_stays_nchw():
    """No stem region when the stem's result goes elsewhere too, when no MaxPool follows, or when its 24
    output channels do not fill the vectors (DenseNet's and ShuffleNet's stems)."""
    net = Net([1, 3, 32, 32])
    h = net.op("Relu", [net.conv("x", 3, 64, k=3, stride=2)])
    twice = net.model([net.op("MaxPool", [h], kernel_shape=[2, 2], strides=[2, 2]), h])
    net = Net([1, 3, 32, 32])
    no_pool = net.model([net.op("AveragePool", [net.op("Relu", [net.conv("x", 3, 64, k=3, stride=2)])],
                                kernel_shape=[2, 2], strides=[2, 2])])
    net = Net([1, 3, 32, 32])
    narrow = net.model([net.op("MaxPool", [net.op("Relu", [net.conv("x", 3, 24, k=3, stride=2)])],
                               kernel_shape=[2, 2], strides=[2, 2])])
    for model in (twice, no_pool, narrow):
        g = simplified(model)
        assert nhwc_convs(g, NCHW_IN) == [] and nhwc_pools(g) == []


def fire(net, x, cin, squeeze, expand):
    """SqueezeNet's fire module: 1x1 squeeze + ReLU, then 1x1 and 3x3 expand + ReLU, concatenated."""
    s = net.op("Relu", [net.conv(x, cin, squeeze)])
    e1 = net.op("Relu", [net.conv(s, squeeze, expand)])
    e3 = net.op("Relu", [net.conv(s, squeeze, expand, k=3)])
    return net.op("Concat", [e1, e3], axis=1)


def test_squeezenet_fire_modules_and_pools_run_as_one_region_without_a_depthwise_convolution(monkeypatch):
    """Fire modules around a MaxPool: no depthwise convolution, but the 3x3 expand convolutions (channels-last
    by the per-convolution rule, which would read their results back to NCHW) and the MaxPool's input are
    what the region saves, and its boundary is its input and pooled output only: one region, the Concats
    joining along NHWC's channel axis (3), the 3x3 convolutions reading an explicitly padded NHWC copy
    (no guards); the first squeeze heads it (NCHW input), one Transpose puts the pooled result back."""
    net = Net([1, 32, 15, 15])
    h = fire(net, fire(net, "x", 32, 16, 32), 64, 16, 32)
    h = net.op("MaxPool", [h], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)
    model = net.model([net.op("GlobalAveragePool", [fire(net, h, 64, 16, 32)])])
    g = simplified(model)
    assert len(nhwc_convs(g)) == 8 and len(nhwc_convs(g, NCHW_IN)) == 1 and len(nhwc_pools(g)) == 1
    assert sorted(d["attrs"]["axis"] for n, d in g.nodes(data=True) if d["op"] == "Concat") == [3, 3, 3]
    assert [d["attrs"]["perm"] for n, d in g.nodes(data=True) if d["op"] == "Transpose"] == [[0, 3, 1, 2]]
    for n in nhwc_convs(g):
        attrs = g.nodes[n]["attrs"]
        if attrs["kernel_shape"] == [3, 3]:
            assert not any(attrs.get("pads", [0] * 4))
            padder = next(m for m, d in g.nodes(data=True) if g.nodes[n]["inputs"][0] in d["outputs"])
            assert g.nodes[padder]["op"] == "Pad"
            assert g.graph["tensors"][g.nodes[padder]["outputs"][0]].shape[1:3] in ((17, 17), (9, 9))
    check_against_onnxruntime(model, [1, 32, 15, 15], monkeypatch)


def test_a_strided_pointwise_convolution_in_a_region_stays_strided(monkeypatch):
    """ResNet's downsampling path (a 1x1 stride-2 convolution beside a 3x3 stride-2 one, added): inside a
    region the strided 1x1 convolution reads its NHWC input with stride 2 as it is, instead of the subsampling
    Slice of space-to-depth (which would leave the region through a Transpose)."""
    net = Net([1, 32, 14, 14])
    x = net.op("Relu", [net.conv("x", 32, 32, k=3)])
    main = net.conv(net.op("Relu", [net.conv(x, 32, 64, k=3, stride=2)]), 64, 64, k=3)
    model = net.model([net.op("Relu", [net.op("Add", [main, net.conv(x, 32, 64, stride=2)])])])
    g = simplified(model)
    assert not [n for n, d in g.nodes(data=True) if d["op"] == "Slice"]
    strided = [n for n in nhwc_convs(g) if g.nodes[n]["attrs"]["kernel_shape"] == [1, 1]]
    assert len(strided) == 1 and g.nodes[strided[0]]["attrs"]["strides"] == [2, 2]
    check_against_onnxruntime(model, [1, 32, 14, 14], monkeypatch)


@pytest.mark.parametrize("cpu", ["znver3", pytest.param("znver4", marks=pytest.mark.skipif(
    "znver4" not in RUNNABLE_CPUS, reason="the host cannot run AVX-512 code"))])
def test_a_pointwise_convolution_with_weights_beyond_l2_joins_its_region(monkeypatch, cpu):
    """A 1x1 convolution with weights of twice the L2 size or more between 3x3 convolutions at 7x7 joins the
    channels-last region with AVX2 and AVX-512 alike: its weights are packed once, so a step of the input
    channel reads the next line of a panel, not a line of the next weight row a page away."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    from polyc.onnx.ops.core import l2_bytes
    cin = 512
    cout = -(-2 * l2_bytes() // (4 * cin) // 64) * 64
    net = Net([1, 32, 7, 7])
    h = net.op("Relu", [net.conv("x", 32, 64, k=3)])
    h = net.op("MaxPool", [net.op("Relu", [net.conv(h, 64, cin, k=3)])], kernel_shape=[2, 2], strides=[1, 1])
    h = net.op("Relu", [net.conv(h, cin, cout)])
    model = net.model([net.op("Relu", [net.conv(h, cout, 32, k=3)])])
    g = simplified(model)
    big = [n for n, d in g.nodes(data=True) if d["op"] == "Conv" and d["inputs"][1] in g.graph["constants"]
           and np.asarray(g.graph["constants"][d["inputs"][1]]).shape[:2] == (cout, cin)]
    assert len(big) == 1 and big[0] in nhwc_convs(g)
    assert len(nhwc_convs(g)) >= 1 and len(nhwc_pools(g)) == 1
    check_against_onnxruntime(model, [1, 32, 7, 7], monkeypatch)
