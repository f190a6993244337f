"""The whole-model benchmark set: twelve ONNX models of different families, built here with ``onnx.helper``.

Each model is a function of a ``tiny`` flag: the bench size (what ``scripts/bench_models.py`` measures) or a shrunk
variant of the same layout (few channels and blocks, a small input) for the tests. Every graph is opset 17 with fixed
shapes and batch 1, passes ``onnx.checker.check_model(model, full_check=True)`` and runs in onnxruntime. Weights are
seeded random numbers with sane scales, so activations neither explode nor vanish and outputs depend on the inputs:
Kaiming (He) normal for convolutions and linear layers, std = sqrt(1 / (fan_in * m)) with m the second moment of
what the layer reads (the builder follows it through the graph: 1/2 after ReLU, which is He's sqrt(2 / fan_in);
about 1/3 after HardSwish or SiLU; less after a squeeze-excitation gate; 1 after a linear layer or LayerNorm);
BatchNormalization kept in the graph as exporters leave it (running mean about 0, running variance about 1, gamma
about 1, beta small; the BatchNorm closing a residual branch has gamma about 0.5, so a long chain of residual blocks
grows slowly); LayerNorm gamma about 1. Bench-size outputs have a standard deviation between about 0.2 and 10.
Random-noise inputs differ little after a CNN's global average pool: another seed changes a CNN's output by about
1-50% of its largest magnitude (DenseNet least), a transformer's by 50-100%.

    import model_zoo                      # with scripts/ on sys.path
    model = model_zoo.build("resnet50")   # onnx.ModelProto
    inputs = model_zoo.feeds(model)       # {input name: numpy array}

No PyTorch: the layouts follow the published architectures (torchvision's ResNet, MobileNetV2/V3, ShuffleNetV2,
SqueezeNet 1.1 and DenseNet; EfficientNet-B0; Whisper's audio encoder; ViT; BERT; GPT-2) and the node patterns
their ONNX exports contain (GELU as Erf or Tanh formulas, SiLU as x * Sigmoid(x), ReLU6 as Clip, depthwise as a
grouped Conv, channel shuffle as Reshape/Transpose/Reshape, the attention mask as arithmetic on the scores).
"""
from __future__ import annotations

import math
import zlib

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17

# E[f(z)^2] for z ~ N(0, 1): the second moment each nonlinearity leaves (numerically integrated)
_MOMENT = {"relu": 0.5, "relu6": 0.5, "hswish": 0.332, "hsigmoid": 0.278, "sigmoid": 0.294, "silu": 0.356,
           "gelu": 0.426, "gelu_tanh": 0.426}
_MOVEMENT = {"MaxPool", "AveragePool", "GlobalAveragePool", "Flatten", "Reshape", "Transpose", "Split", "Gather"}

NAMES = ("resnet18_half", "resnet50", "mobilenetv2", "mobilenetv3_small", "efficientnet_b0", "shufflenetv2",
         "squeezenet", "densenet", "conv1d_audio", "vit", "bert_encoder", "gpt_decoder")


class Graph:
    """A small ONNX graph builder: each layer method appends nodes and initializers and returns the name of its
    output tensor. Names are unique (``prefix_N``); weights come from one seeded generator."""

    def __init__(self, name: str, seed: int):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.nodes, self.initializers, self.inputs, self.outputs = [], [], [], []
        self._count = {}
        self.moment = {}  # tensor name -> its estimated second moment E[t^2] (unknown: 1)

    # -- plumbing ------------------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        n = self._count.get(prefix, 0)
        self._count[prefix] = n + 1
        return f"{prefix}_{n}"

    def input(self, name: str, shape, elem_type=TensorProto.FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        return name

    def output(self, name: str, shape, elem_type=TensorProto.FLOAT):
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))

    def const(self, value, prefix: str = "const", dtype=np.float32) -> str:
        """An initializer holding ``value`` (numpy array or scalar, cast to ``dtype``)."""
        name = self.fresh(prefix)
        self.moment[name] = 0.0  # a bias or shift adds (next to) nothing to the scale of what it is added to
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def shape(self, dims) -> str:
        return self.const(np.array(dims, dtype=np.int64), "shape", np.int64)

    def op(self, op_type: str, *inputs, outputs: int = 1, **attrs):
        """Append one node; returns its output name (a list of names when ``outputs`` > 1). Records the output's
        second moment where it follows from the inputs' (data movement, Add, Concat, Relu; see :meth:`he`)."""
        names = [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, name=self.fresh("n_" + op_type), **attrs))
        m = [self.moment.get(i, 1.0) for i in inputs]
        if op_type in _MOVEMENT:
            for n in names:
                self.moment[n] = m[0]
        elif op_type in ("Add", "Concat"):  # sum of independent terms; the channels' mean
            self.moment[names[0]] = sum(m) / (1 if op_type == "Add" else len(m))
        elif op_type == "Relu":
            self.moment[names[0]] = _MOMENT["relu"] * m[0]
        return names if outputs > 1 else names[0]

    def he(self, shape, fan_in: int, x: str | None = None) -> np.ndarray:
        """Kaiming-normal weights for a layer reading ``x``: std = sqrt(1 / (fan_in * m)) where m = E[f(z)^2] for
        z ~ N(0, 1) and f the nonlinearity that made ``x`` (He et al. 2015; m = 1/2 for ReLU gives their
        sqrt(2 / fan_in), m = 1 for a linear input), so each layer keeps its input's scale."""
        return self.rng.standard_normal(shape) / math.sqrt(fan_in * self.moment.get(x, 1.0))

    def finish(self, output: str, shape, elem_type=TensorProto.FLOAT) -> onnx.ModelProto:
        self.nodes.append(helper.make_node("Identity", [output], ["output"], name=self.fresh("n_Identity")))
        self.output("output", shape, elem_type)
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                                  producer_name="polyc model_zoo")
        model.ir_version = 8
        return model

    # -- convolutional layers --------------------------------------------------------------------------------
    def conv(self, x, cin, cout, k, stride=1, pad=None, group=1, bias=False, dilation=1, dims=2):
        """Conv (1-D for ``dims`` 1) with Kaiming-normal weights (cout, cin/group, k...) (:meth:`he`) and an
        optional small bias; ``pad`` defaults to 'same' for odd k."""
        pad = dilation * (k - 1) // 2 if pad is None else pad
        w = self.const(self.he((cout, cin // group) + (k,) * dims, cin // group * k ** dims, x), "w")
        ins = [x, w] + ([self.const(self.rng.standard_normal(cout) * 0.05, "b")] if bias else [])
        return self.op("Conv", *ins, kernel_shape=[k] * dims, strides=[stride] * dims, pads=[pad] * (2 * dims),
                       dilations=[dilation] * dims, group=group)

    def bn(self, x, c, gamma=1.0):
        """BatchNormalization (inference) with running mean ~ 0, variance ~ 1, scale ~ ``gamma``, bias small."""
        scale = self.const(gamma * (1 + 0.1 * self.rng.standard_normal(c)), "bn_scale")
        beta = self.const(0.05 * self.rng.standard_normal(c), "bn_bias")
        mean = self.const(0.05 * self.rng.standard_normal(c), "bn_mean")
        var = self.const(self.rng.uniform(0.8, 1.2, c), "bn_var")
        y = self.op("BatchNormalization", x, scale, beta, mean, var, epsilon=1e-5)
        self.moment[y] = gamma ** 2 * self.moment.get(x, 1.0)
        return y

    def conv_bn(self, x, cin, cout, k, stride=1, group=1, act="relu", gamma=1.0, pad=None):
        return self.act(self.bn(self.conv(x, cin, cout, k, stride, pad=pad, group=group), cout, gamma), act)

    def act(self, x, kind):
        """The nonlinearity ``kind`` (relu, relu6, hswish, hsigmoid, sigmoid, silu, gelu, gelu_tanh) of ``x``."""
        if kind is None:
            return x
        y = self._act(x, kind)
        gate = kind in ("sigmoid", "hsigmoid")
        self.moment[y] = _MOMENT[kind] * (1.0 if gate else self.moment.get(x, 1.0))
        return y

    def _act(self, x, kind):
        if kind == "relu":
            return self.op("Relu", x)
        if kind == "relu6":
            return self.op("Clip", x, self.const(0.0, "min"), self.const(6.0, "max"))
        if kind == "hswish":
            return self.op("HardSwish", x)
        if kind == "hsigmoid":
            return self.op("HardSigmoid", x, alpha=1.0 / 6, beta=0.5)
        if kind == "sigmoid":
            return self.op("Sigmoid", x)
        if kind == "silu":
            return self.op("Mul", x, self.op("Sigmoid", x))
        if kind == "gelu":  # the Erf form of torch.nn.GELU()'s export
            e = self.op("Erf", self.op("Div", x, self.const(math.sqrt(2.0), "sqrt2")))
            return self.op("Mul", self.op("Mul", x, self.op("Add", e, self.const(1.0, "one"))),
                           self.const(0.5, "half"))
        if kind == "gelu_tanh":  # GPT-2's gelu_new
            cube = self.op("Pow", x, self.const(3.0, "three"))
            inner = self.op("Add", x, self.op("Mul", cube, self.const(0.044715, "c")))
            t = self.op("Tanh", self.op("Mul", inner, self.const(math.sqrt(2.0 / math.pi), "c")))
            return self.op("Mul", self.op("Mul", x, self.const(0.5, "half")),
                           self.op("Add", t, self.const(1.0, "one")))
        raise ValueError(kind)

    def residual_relu(self, y, short, identity: bool):
        """Relu(y + short). An identity shortcut is already >= 0 and Relu passes it on whole."""
        out = self.op("Relu", self.op("Add", y, short))
        m_short = self.moment.get(short, 1.0)
        self.moment[out] = 0.5 * self.moment.get(y, 1.0) + (m_short if identity else 0.5 * m_short)
        return out

    def max_pool(self, x, k, stride, pad=0, ceil=0):
        return self.op("MaxPool", x, kernel_shape=[k, k], strides=[stride, stride], pads=[pad] * 4, ceil_mode=ceil)

    def squeeze_excite(self, x, c, mid, inner="relu", gate="hsigmoid"):
        s = self.op("GlobalAveragePool", x)
        s = self.act(self.conv(s, c, mid, 1, bias=True), inner)
        s = self.act(self.conv(s, mid, c, 1, bias=True), gate)
        y = self.op("Mul", x, s)
        self.moment[y] = self.moment.get(x, 1.0) * _MOMENT[gate]
        return y

    def classifier(self, x, cin, classes):
        """GlobalAveragePool, Flatten, Gemm (transB=1): (1, cin, H, W) -> (1, classes)."""
        x = self.op("Flatten", self.op("GlobalAveragePool", x), axis=1)
        return self.gemm(x, cin, classes)

    def gemm(self, x, cin, cout):
        w = self.const(self.he((cout, cin), cin, x), "fc_w")
        return self.op("Gemm", x, w, self.const(0.05 * self.rng.standard_normal(cout), "fc_b"), transB=1)

    # -- transformer layers ----------------------------------------------------------------------------------
    def linear(self, x, din, dout):
        """MatMul by a (din, dout) He-normal weight, then Add a bias: (1, S, din) -> (1, S, dout)."""
        y = self.op("MatMul", x, self.const(self.he((din, dout), din, x), "lin_w"))
        return self.op("Add", y, self.const(0.05 * self.rng.standard_normal(dout), "lin_b"))

    def layer_norm(self, x, d, eps=1e-5):
        gamma = self.const(1 + 0.1 * self.rng.standard_normal(d), "ln_scale")
        beta = self.const(0.05 * self.rng.standard_normal(d), "ln_bias")
        return self.op("LayerNormalization", x, gamma, beta, axis=-1, epsilon=eps)

    def attention(self, x, seq, d, heads, mask=None, causal=None):
        """Multi-head self-attention as exporters write it: (1, seq, d) -> (1, seq, d). ``mask`` is an additive
        (1, 1, 1, seq) tensor; ``causal`` a (seq, seq) bool tensor (True: attend) applied with Where."""
        dh = d // heads
        split = self.shape([1, seq, heads, dh])

        def proj(perm):
            return self.op("Transpose", self.op("Reshape", self.linear(x, d, d), split), perm=perm)
        q, k, v = proj([0, 2, 1, 3]), proj([0, 2, 3, 1]), proj([0, 2, 1, 3])
        scores = self.op("Div", self.op("MatMul", q, k), self.const(math.sqrt(dh), "sqrt_dh"))
        if mask is not None:
            scores = self.op("Add", scores, mask)
        if causal is not None:
            scores = self.op("Where", causal, scores, self.const(-1e9, "neg"))
        p = self.op("Softmax", scores, axis=-1)
        ctx = self.op("Transpose", self.op("MatMul", p, v), perm=[0, 2, 1, 3])
        return self.linear(self.op("Reshape", ctx, self.shape([1, seq, d])), d, d)

    def mlp(self, x, d, hidden, act):
        return self.linear(self.act(self.linear(x, d, hidden), act), hidden, d)

    def pre_ln_block(self, x, seq, d, heads, act="gelu", eps=1e-5, causal=None):
        x = self.op("Add", x, self.attention(self.layer_norm(x, d, eps), seq, d, heads, causal=causal))
        return self.op("Add", x, self.mlp(self.layer_norm(x, d, eps), d, 4 * d, act))


def _graph(name: str, tiny: bool) -> Graph:
    return Graph(name + ("_tiny" if tiny else ""), zlib.crc32(name.encode()) + tiny)


# -- CNNs ------------------------------------------------------------------------------------------------------
def resnet18_half(tiny: bool = False) -> onnx.ModelProto:
    """ResNet-18 (basic blocks 2-2-2-2) at half width, 32..256 channels; input (1, 3, 224, 224) -> (1, 1000)."""
    px, widths, blocks, classes = (32, (8, 16), 1, 10) if tiny else (224, (32, 64, 128, 256), 2, 1000)
    g = _graph("resnet18_half", tiny)
    x = g.conv_bn(g.input("input", (1, 3, px, px)), 3, widths[0], 7, 2)
    x = g.max_pool(x, 3, 2, 1)
    c = widths[0]
    for stage, w in enumerate(widths):
        for b in range(blocks):
            stride = 2 if stage > 0 and b == 0 else 1
            y = g.conv_bn(g.conv_bn(x, c, w, 3, stride), w, w, 3, act=None, gamma=0.5)
            short = g.conv_bn(x, c, w, 1, stride, act=None) if stride != 1 or c != w else x
            x, c = g.residual_relu(y, short, short is x), w
    return g.finish(g.classifier(x, c, classes), (1, classes))


def resnet50(tiny: bool = False) -> onnx.ModelProto:
    """ResNet-50 v1.5 (bottlenecks 3-4-6-3, stride on the 3x3), 64..2048 channels; (1, 3, 224, 224) -> (1, 1000)."""
    px, widths, blocks, classes = ((32, (4, 8), (2, 1), 10) if tiny else
                                   (224, (64, 128, 256, 512), (3, 4, 6, 3), 1000))
    g = _graph("resnet50", tiny)
    stem = 16 if tiny else 64
    x = g.max_pool(g.conv_bn(g.input("input", (1, 3, px, px)), 3, stem, 7, 2), 3, 2, 1)
    c = stem
    for stage, (w, n) in enumerate(zip(widths, blocks)):
        for b in range(n):
            stride = 2 if stage > 0 and b == 0 else 1
            y = g.conv_bn(g.conv_bn(x, c, w, 1), w, w, 3, stride)
            y = g.conv_bn(y, w, 4 * w, 1, act=None, gamma=0.5)
            short = g.conv_bn(x, c, 4 * w, 1, stride, act=None) if b == 0 else x
            x, c = g.residual_relu(y, short, short is x), 4 * w
    return g.finish(g.classifier(x, c, classes), (1, classes))


def mobilenetv2(tiny: bool = False) -> onnx.ModelProto:
    """MobileNetV2 1.0: inverted residuals (expand 1x1, depthwise 3x3, linear 1x1), ReLU6 as Clip;
    (1, 3, 224, 224) -> (1, 1000)."""
    if tiny:
        px, stem, last, classes = 32, 8, 32, 10
        config = ((1, 8, 1, 1), (6, 8, 2, 2), (6, 16, 1, 2))
    else:
        px, stem, last, classes = 224, 32, 1280, 1000
        config = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                  (6, 320, 1, 1))
    g = _graph("mobilenetv2", tiny)
    x = g.conv_bn(g.input("input", (1, 3, px, px)), 3, stem, 3, 2, act="relu6")
    c = stem
    for t, out, n, s in config:
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), c * t
            y = g.conv_bn(x, c, hidden, 1, act="relu6") if t != 1 else x
            y = g.conv_bn(y, hidden, hidden, 3, stride, group=hidden, act="relu6")
            y = g.conv_bn(y, hidden, out, 1, act=None, gamma=0.5 if stride == 1 and c == out else 1.0)
            x, c = (g.op("Add", x, y) if stride == 1 and c == out else y), out
    x = g.conv_bn(x, c, last, 1, act="relu6")
    return g.finish(g.classifier(x, last, classes), (1, classes))


def _divisible(v: float, divisor: int = 8) -> int:
    new = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new + divisor if new < 0.9 * v else new


def mobilenetv3_small(tiny: bool = False) -> onnx.ModelProto:
    """MobileNetV3-Small: HardSwish, squeeze-excitation (GlobalAveragePool, 1x1 convs, HardSigmoid), depthwise
    3x3/5x5; (1, 3, 224, 224) -> (1, 1000)."""
    # kernel, expanded, out, squeeze-excite, activation, stride (torchvision's table)
    config = ((3, 16, 16, True, "relu", 2), (3, 72, 24, False, "relu", 2), (3, 88, 24, False, "relu", 1),
              (5, 96, 40, True, "hswish", 2), (5, 240, 40, True, "hswish", 1), (5, 240, 40, True, "hswish", 1),
              (5, 120, 48, True, "hswish", 1), (5, 144, 48, True, "hswish", 1), (5, 288, 96, True, "hswish", 2),
              (5, 576, 96, True, "hswish", 1), (5, 576, 96, True, "hswish", 1))
    px, stem, last, hidden, classes = 224, 16, 576, 1024, 1000
    if tiny:
        config = ((3, 8, 8, True, "relu", 2), (3, 16, 8, False, "relu", 1), (5, 24, 16, True, "hswish", 2))
        px, stem, last, hidden, classes = 32, 8, 32, 32, 10
    g = _graph("mobilenetv3_small", tiny)
    x = g.conv_bn(g.input("input", (1, 3, px, px)), 3, stem, 3, 2, act="hswish")
    c = stem
    for k, exp, out, se, act, stride in config:
        y = g.conv_bn(x, c, exp, 1, act=act) if exp != c else x
        y = g.conv_bn(y, exp, exp, k, stride, group=exp, act=act)
        if se:
            y = g.squeeze_excite(y, exp, _divisible(exp / 4))
        residual = stride == 1 and c == out
        y = g.conv_bn(y, exp, out, 1, act=None, gamma=0.5 if residual else 1.0)
        x, c = (g.op("Add", x, y) if residual else y), out
    x = g.conv_bn(x, c, last, 1, act="hswish")
    x = g.act(g.gemm(g.op("Flatten", g.op("GlobalAveragePool", x), axis=1), last, hidden), "hswish")
    return g.finish(g.gemm(x, hidden, classes), (1, classes))


def efficientnet_b0(tiny: bool = False) -> onnx.ModelProto:
    """EfficientNet-B0 at width 0.5 (depth 1.0): MBConv with 3x3/5x5 depthwise, SiLU as x * Sigmoid(x),
    squeeze-excitation (ratio 0.25 of the block's input); (1, 3, 224, 224) -> (1, 1000)."""
    # expand, kernel, stride, out, repeats (the B0 table)
    config = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
              (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))
    px, stem, head, classes, width = 224, 32, 1280, 1000, 0.5
    if tiny:
        config = ((1, 3, 1, 8, 1), (6, 5, 2, 8, 2))
        px, stem, head, classes, width = 32, 8, 32, 10, 1.0
    g = _graph("efficientnet_b0", tiny)
    stem = _divisible(stem * width)
    x = g.conv_bn(g.input("input", (1, 3, px, px)), 3, stem, 3, 2, act="silu")
    c = stem
    for expand, k, s, out, n in config:
        out = _divisible(out * width)
        for i in range(n):
            stride, hidden = (s if i == 0 else 1), c * expand
            y = g.conv_bn(x, c, hidden, 1, act="silu") if expand != 1 else x
            y = g.conv_bn(y, hidden, hidden, k, stride, group=hidden, act="silu")
            y = g.squeeze_excite(y, hidden, max(1, c // 4), inner="silu", gate="sigmoid")
            residual = stride == 1 and c == out
            y = g.conv_bn(y, hidden, out, 1, act=None, gamma=0.5 if residual else 1.0)
            x, c = (g.op("Add", x, y) if residual else y), out
    head = _divisible(head * width)
    x = g.conv_bn(x, c, head, 1, act="silu")
    return g.finish(g.classifier(x, head, classes), (1, classes))


def shufflenetv2(tiny: bool = False) -> onnx.ModelProto:
    """ShuffleNetV2 x1.0: Split into halves, depthwise 3x3, Concat, channel shuffle (Reshape, Transpose,
    Reshape); (1, 3, 224, 224) -> (1, 1000)."""
    px, stem, stages, repeats, last, classes = 224, 24, (116, 232, 464), (4, 8, 4), 1024, 1000
    if tiny:
        px, stem, stages, repeats, last, classes = 32, 8, (16, 32), (2, 2), 32, 10
    g = _graph("shufflenetv2", tiny)
    x = g.max_pool(g.conv_bn(g.input("input", (1, 3, px, px)), 3, stem, 3, 2), 3, 2, 1)
    c, size = stem, px // 4

    def shuffle(t, channels, hw):
        t = g.op("Reshape", t, g.shape([1, 2, channels // 2, hw, hw]))
        t = g.op("Transpose", t, perm=[0, 2, 1, 3, 4])
        return g.op("Reshape", t, g.shape([1, channels, hw, hw]))

    for out, n in zip(stages, repeats):
        half = out // 2
        for i in range(n):
            if i == 0:
                size = (size + 1) // 2
                left = g.conv_bn(g.conv_bn(x, c, c, 3, 2, group=c, act=None), c, half, 1)
                right = g.conv_bn(x, c, half, 1)
            else:
                left, right = g.op("Split", x, g.shape([half, half]), outputs=2, axis=1)
                right = g.conv_bn(right, half, half, 1)
            right = g.conv_bn(right, half, half, 3, 2 if i == 0 else 1, group=half, act=None)
            right = g.conv_bn(right, half, half, 1)
            x, c = shuffle(g.op("Concat", left, right, axis=1), out, size), out
    x = g.conv_bn(x, c, last, 1)
    return g.finish(g.classifier(x, last, classes), (1, classes))


def squeezenet(tiny: bool = False) -> onnx.ModelProto:
    """SqueezeNet 1.1: fire modules (1x1 squeeze, 1x1 and 3x3 expand, Concat), MaxPool 3x3/2 with ceil_mode, no
    BatchNorm, a 1x1 conv classifier; (1, 3, 224, 224) -> (1, 1000)."""
    if tiny:
        px, stem, classes = 32, 8, 10
        layout = ((4, 8), "pool", (4, 8), "pool", (8, 16))
    else:
        px, stem, classes = 224, 64, 1000
        layout = ((16, 64), (16, 64), "pool", (32, 128), (32, 128), "pool", (48, 192), (48, 192), (64, 256),
                  (64, 256))
    g = _graph("squeezenet", tiny)
    x = g.op("Relu", g.conv(g.input("input", (1, 3, px, px)), 3, stem, 3, 2, pad=0, bias=True))
    x, c = g.max_pool(x, 3, 2, ceil=1), stem
    for item in layout:
        if item == "pool":
            x = g.max_pool(x, 3, 2, ceil=1)
            continue
        squeeze, expand = item
        s = g.op("Relu", g.conv(x, c, squeeze, 1, bias=True))
        e1 = g.op("Relu", g.conv(s, squeeze, expand, 1, bias=True))
        e3 = g.op("Relu", g.conv(s, squeeze, expand, 3, bias=True))
        x, c = g.op("Concat", e1, e3, axis=1), 2 * expand
    x = g.op("Relu", g.conv(x, c, classes, 1, bias=True))
    return g.finish(g.op("Flatten", g.op("GlobalAveragePool", x), axis=1), (1, classes))


def densenet(tiny: bool = False) -> onnx.ModelProto:
    """DenseNet-121 layout (dense blocks 6-12-24-16, bottleneck 4k, compression 0.5) at growth rate k = 12:
    pre-activation BN-ReLU-Conv layers, a running Concat, transitions with AveragePool 2x2/2;
    (1, 3, 224, 224) -> (1, 1000)."""
    px, growth, blocks, classes = (32, 8, (2, 2), 10) if tiny else (224, 12, (6, 12, 24, 16), 1000)
    g = _graph("densenet", tiny)
    c = 2 * growth
    x = g.max_pool(g.conv_bn(g.input("input", (1, 3, px, px)), 3, c, 7, 2), 3, 2, 1)
    for i, n in enumerate(blocks):
        for _ in range(n):
            y = g.conv(g.op("Relu", g.bn(x, c)), c, 4 * growth, 1)
            y = g.conv(g.op("Relu", g.bn(y, 4 * growth)), 4 * growth, growth, 3)
            x, c = g.op("Concat", x, y, axis=1), c + growth
        if i + 1 < len(blocks):
            x = g.conv(g.op("Relu", g.bn(x, c)), c, c // 2, 1)
            x, c = g.op("AveragePool", x, kernel_shape=[2, 2], strides=[2, 2]), c // 2
    x = g.op("Relu", g.bn(x, c))
    return g.finish(g.classifier(x, c, classes), (1, classes))


# -- sequence models -------------------------------------------------------------------------------------------
def _sinusoids(length: int, d: int) -> np.ndarray:
    t = np.arange(length)[:, None] / 10000 ** (np.arange(d // 2)[None, :] / max(d // 2 - 1, 1))
    return np.concatenate([np.sin(t), np.cos(t)], axis=1)[None].astype(np.float32)


def conv1d_audio(tiny: bool = False) -> onnx.ModelProto:
    """A Whisper-style audio encoder: Conv1d k3 + GELU, Conv1d k3 stride 2 + GELU, sinusoidal positions added,
    pre-LN transformer layers (d 256, 4 heads, MLP 4d, GELU as Erf), a final LayerNorm;
    mel (1, 80, 1000) -> (1, 500, 256)."""
    mels, frames, d, heads, layers = (16, 32, 32, 2, 1) if tiny else (80, 1000, 256, 4, 2)
    g = _graph("conv1d_audio", tiny)
    x = g.act(g.conv(g.input("mel", (1, mels, frames)), mels, d, 3, bias=True, dims=1), "gelu")
    x = g.act(g.conv(x, d, d, 3, 2, bias=True, dims=1), "gelu")
    seq = (frames + 1) // 2
    x = g.op("Add", g.op("Transpose", x, perm=[0, 2, 1]), g.const(_sinusoids(seq, d), "positions"))
    for _ in range(layers):
        x = g.pre_ln_block(x, seq, d, heads)
    return g.finish(g.layer_norm(x, d), (1, seq, d))


def vit(tiny: bool = False) -> onnx.ModelProto:
    """A ViT at 112 px: patch 16 embedding as a Conv of stride 16, a class token (Concat), learned positions,
    pre-LN layers (d 192, 3 heads, MLP 4d, GELU as Erf), a final LayerNorm, the class token's head (Gather);
    (1, 3, 112, 112) -> (1, 1000)."""
    px, patch, d, heads, layers, classes = (32, 8, 32, 2, 1, 10) if tiny else (112, 16, 192, 3, 6, 1000)
    g = _graph("vit", tiny)
    n = (px // patch) ** 2
    x = g.conv(g.input("input", (1, 3, px, px)), 3, d, patch, patch, pad=0, bias=True)
    x = g.op("Transpose", g.op("Reshape", x, g.shape([1, d, n])), perm=[0, 2, 1])
    x = g.op("Concat", g.const(0.02 * g.rng.standard_normal((1, 1, d)), "cls_token"), x, axis=1)
    x = g.op("Add", x, g.const(0.5 * g.rng.standard_normal((1, n + 1, d)), "pos_embedding"))
    for _ in range(layers):
        x = g.pre_ln_block(x, n + 1, d, heads, eps=1e-6)
    x = g.op("Gather", g.layer_norm(x, d, 1e-6), g.const(0, "cls_index", np.int64), axis=1)
    return g.finish(g.gemm(x, d, classes), (1, classes))


def _embed(g: Graph, ids: str, vocab: int, seq: int, d: int) -> str:
    """Token embedding (Gather by ids) plus learned positions (Gather by a constant 0..seq-1): (1, seq, d)."""
    tokens = g.op("Gather", g.const(0.5 * g.rng.standard_normal((vocab, d)), "token_embedding"), ids, axis=0)
    positions = g.op("Gather", g.const(0.5 * g.rng.standard_normal((seq, d)), "position_embedding"),
                     g.const(np.arange(seq)[None], "position_ids", np.int64), axis=0)
    return g.op("Add", tokens, positions)


def bert_encoder(tiny: bool = False) -> onnx.ModelProto:
    """A BERT-style encoder: token + position embeddings, LayerNorm, post-LN layers (d 256, 4 heads, MLP 4d,
    GELU as Erf), the padding mask as (1 - mask) * -10000 added to the scores; inputs ``input_ids`` and
    ``attention_mask`` int64 (1, 128) -> (1, 128, 256)."""
    seq, d, heads, layers, vocab = (16, 32, 2, 1, 64) if tiny else (128, 256, 4, 4, 2048)
    g = _graph("bert_encoder", tiny)
    ids = g.input("input_ids", (1, seq), TensorProto.INT64)
    mask = g.input("attention_mask", (1, seq), TensorProto.INT64)
    mask = g.op("Cast", g.op("Unsqueeze", mask, g.shape([1, 2])), to=TensorProto.FLOAT)
    mask = g.op("Mul", g.op("Sub", g.const(1.0, "one"), mask), g.const(-10000.0, "mask_value"))
    x = g.layer_norm(_embed(g, ids, vocab, seq, d), d, 1e-12)
    for _ in range(layers):
        x = g.layer_norm(g.op("Add", x, g.attention(x, seq, d, heads, mask=mask)), d, 1e-12)
        x = g.layer_norm(g.op("Add", x, g.mlp(x, d, 4 * d, "gelu")), d, 1e-12)
    return g.finish(x, (1, seq, d))


def gpt_decoder(tiny: bool = False) -> onnx.ModelProto:
    """A GPT-2-style decoder: token + position embeddings, pre-LN blocks (d 256, 4 heads, MLP 4d, GELU as the
    Tanh formula), a causal mask made in the graph (Trilu of a constant of ones, Where with -1e9), a final
    LayerNorm and an LM head; ``input_ids`` int64 (1, 128) -> logits (1, 128, 2048)."""
    seq, d, heads, layers, vocab = (16, 32, 2, 1, 64) if tiny else (128, 256, 4, 4, 2048)
    g = _graph("gpt_decoder", tiny)
    x = _embed(g, g.input("input_ids", (1, seq), TensorProto.INT64), vocab, seq, d)
    causal = g.op("Trilu", g.const(np.ones((seq, seq)), "ones", np.bool_), upper=0)
    for _ in range(layers):
        x = g.pre_ln_block(x, seq, d, heads, act="gelu_tanh", causal=causal)
    logits = g.op("MatMul", g.layer_norm(x, d), g.const(g.he((d, vocab), d), "lm_head"))
    return g.finish(logits, (1, seq, vocab))


_MODELS = {
    "resnet18_half": (resnet18_half, "CNN, ResNet-18 at half width (32..256 ch), 224 px, 1.8 GFLOP-class: "
                      "3x3/7x7 convs with BatchNorm, residual Add+Relu, MaxPool, GlobalAveragePool, Gemm"),
    "resnet50": (resnet50, "CNN, ResNet-50 v1.5, 224 px, 4.1 GMAC: 1x1/3x3 bottleneck convs (64..2048 ch), "
                 "BatchNorm, residual Add+Relu, strided 1x1 projections, MaxPool, Gemm"),
    "mobilenetv2": (mobilenetv2, "mobile CNN, MobileNetV2 1.0, 224 px: inverted residuals, depthwise 3x3 (grouped "
                    "Conv), ReLU6 as Clip, linear bottlenecks, 1x1 convs up to 1280 ch"),
    "mobilenetv3_small": (mobilenetv3_small, "mobile CNN, MobileNetV3-Small, 224 px: depthwise 3x3/5x5, HardSwish, "
                          "squeeze-excitation (GlobalAveragePool, 1x1 convs, HardSigmoid, Mul)"),
    "efficientnet_b0": (efficientnet_b0, "mobile CNN, EfficientNet-B0 at width 0.5, 224 px: MBConv with 3x3/5x5 "
                        "depthwise, SiLU as x*Sigmoid(x), squeeze-excitation"),
    "shufflenetv2": (shufflenetv2, "mobile CNN, ShuffleNetV2 x1.0, 224 px: Split, depthwise 3x3, Concat, channel "
                     "shuffle as Reshape/Transpose/Reshape"),
    "squeezenet": (squeezenet, "CNN, SqueezeNet 1.1, 224 px: fire modules (1x1 squeeze, 1x1+3x3 expand, Concat), "
                   "MaxPool 3x3/2 ceil_mode, biased convs without BatchNorm"),
    "densenet": (densenet, "CNN, DenseNet-121 layout at growth 12, 224 px: 58 dense layers (BN-Relu-Conv1x1-BN-Relu-"
                 "Conv3x3), a growing Concat, transitions with AveragePool 2x2"),
    "conv1d_audio": (conv1d_audio, "audio, Whisper-style encoder, 80 mel x 1000 frames: Conv1d k3 and k3/2 + GELU "
                     "(Erf), 2 pre-LN transformer layers d=256 4 heads at 500 positions"),
    "vit": (vit, "vision transformer, ViT at 112 px patch 16: Conv stride 16 patch embedding, class token Concat, "
            "6 pre-LN layers d=192 3 heads, GELU (Erf), 50 tokens"),
    "bert_encoder": (bert_encoder, "NLP encoder, BERT-style, seq 128: Gather embeddings, 4 post-LN layers d=256 4 "
                     "heads, additive padding mask (Unsqueeze/Cast/Sub/Mul), GELU (Erf)"),
    "gpt_decoder": (gpt_decoder, "NLP decoder, GPT-2-style, seq 128: Gather embeddings, 4 pre-LN blocks d=256 4 "
                    "heads, causal mask (Trilu + Where), GELU (Tanh), LM head to vocab 2048"),
}
assert tuple(_MODELS) == NAMES


def build(name: str, tiny: bool = False) -> onnx.ModelProto:
    """The model ``name`` (one of :data:`NAMES`) as an opset-17 ``onnx.ModelProto`` with fixed shapes, batch 1:
    the bench size, or with ``tiny`` a shrunk variant (8-32 channels, 32 px or 16-32 positions, 1-2 blocks per
    stage) for tests. Image models take ``input`` float32 (1, 3, H, W); ``conv1d_audio`` takes ``mel`` float32
    (1, 80, 1000); the NLP models take int64 (1, 128) ``input_ids`` (and ``attention_mask``). The single output is
    named ``output``. The same name always gives the same weights. Raises ValueError for an unknown name."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(NAMES)}")
    return _MODELS[name][0](tiny)


def describe(name: str) -> str:
    """One line about model ``name``: its family, size and what it exercises. Raises ValueError for an unknown name."""
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(NAMES)}")
    return _MODELS[name][1]


def _vocab(model: onnx.ModelProto, ids: str) -> int:
    """The first dimension of the table a Gather reads with ``ids``."""
    tables = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Gather" and node.input[1] == ids and node.input[0] in tables:
            return int(tables[node.input[0]].dims[0])
    raise ValueError(f"no Gather reads a table with {ids!r}")


def feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Seeded inputs for each graph input of ``model``, keyed by name: float32 standard normal for float inputs;
    for int64 ``input_ids`` token ids uniform in [0, vocab) (vocab: the rows of the embedding table the ids
    index); for int64 ``attention_mask`` ones with the last quarter of the positions zero (padding)."""
    rng = np.random.default_rng(seed)
    out = {}
    initializers = {t.name for t in model.graph.initializer}
    for value in model.graph.input:
        if value.name in initializers:
            continue
        shape = tuple(d.dim_value for d in value.type.tensor_type.shape.dim)
        dtype = helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type)
        if value.name == "attention_mask":
            mask = np.ones(shape, dtype=dtype)
            mask[..., shape[-1] - shape[-1] // 4:] = 0
            out[value.name] = mask
        elif value.name == "input_ids":
            out[value.name] = rng.integers(0, _vocab(model, value.name), size=shape).astype(dtype)
        elif np.issubdtype(dtype, np.floating):
            out[value.name] = rng.standard_normal(shape).astype(dtype)
        else:
            raise ValueError(f"no feed rule for input {value.name!r} of dtype {dtype}")
    return out
