"""Export the small transformer, speech, vision and recurrent models of ``tests/onnx/models/`` to ONNX.

This script needs PyTorch and transformers, which polyc and its tests do not: run it in a separate
virtual environment, never in polyc's own (the test suite reads only the committed files)::

    python3 -m venv /tmp/export-venv
    /tmp/export-venv/bin/pip install torch==2.13.0 onnx onnxruntime onnxscript transformers
    /tmp/export-venv/bin/python scripts/export_models.py [--out tests/onnx/models] [NAME ...]

Each model is built from a small config (hidden 32-64, 2 layers, 2-4 heads, a small vocabulary) with
seeded random weights, put in eval mode, and exported with ``torch.onnx.export`` at opset 17 with fixed
shapes, through the TorchScript exporter (``dynamo=False``: the graphs most published ONNX models have)
except ``bert_dynamo``, the same BERT through the torch.export-based one (torch's default since 2.9).
BERT and GPT-2 use transformers' default attention (``sdpa``: the exported mask handling has IsNaN and
Where), RoBERTa, T5 and wav2vec2 the ``eager`` one (explicit MatMul, Add of the mask, Softmax).
Models that take an ``attention_mask`` are exported with it, and the stored masks have zeros (padding),
so the mask arithmetic (Where, Expand, Equal, CumSum, ...) is exercised for real. ``bert_buffers`` is
BERT called without token_type_ids (read from a buffer by a GatherElements over 128 positions);
``wav2vec2_base`` has wav2vec2-base's GroupNorm feature extractor (InstanceNormalization) and no mask.

For each NAME it writes ``NAME.onnx`` (checked with ``onnx.checker``, kept under about 1 MB) and
``NAME.npz``: the seeded inputs under the graph's input names and onnxruntime's outputs under the
graph's output names. It prints, per model, the file size and the op types with their counts, and
writes them to ``README.md`` beside the models.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import numpy as np
import onnx
import onnxruntime as ort
import torch
from torch import nn

OPSET = 17
SEED = 0
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --- transformers models: tiny configs, the eager attention (explicit MatMul / Softmax) ---

def _ids(rng, shape, vocab, low=0):
    return torch.from_numpy(rng.integers(low, vocab, size=shape).astype(np.int64))


def _mask(batch, seq, lengths):
    """A (batch, seq) int64 mask: row b is 1 on its first lengths[b] positions, 0 after (right padding)."""
    m = np.zeros((batch, seq), dtype=np.int64)
    for b, n in enumerate(lengths):
        m[b, :n] = 1
    return torch.from_numpy(m)


class _Outputs(nn.Module):
    """Calls a transformers model with keyword inputs and returns the named tensors of its output."""

    def __init__(self, model, keys, fields):
        super().__init__()
        self.model, self.keys, self.fields = model, keys, fields

    def forward(self, *args):
        out = self.model(**dict(zip(self.keys, args)), return_dict=True)
        return tuple(getattr(out, f) for f in self.fields)


def bert(rng, token_types=True, max_positions=16):
    """BERT; without ``token_types`` the token type ids come from a buffer the model holds (a GatherElements
    over ``max_positions`` choices, which constant folding must handle)."""
    from transformers import BertConfig, BertModel
    config = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=max_positions, type_vocab_size=2,
                        initializer_range=0.1, attn_implementation="sdpa")
    model = BertModel(config)
    batch, seq = 2, 12
    inputs = {"input_ids": _ids(rng, (batch, seq), 128),
              "attention_mask": _mask(batch, seq, (12, 7)),
              "token_type_ids": _mask(batch, seq, (5, 9)).flip(1).contiguous()}
    if not token_types:
        del inputs["token_type_ids"]
    return model, inputs, ("last_hidden_state", "pooler_output")


def gpt2(rng):
    from transformers import GPT2Config, GPT2Model
    config = GPT2Config(vocab_size=128, n_positions=16, n_embd=32, n_layer=2, n_head=2, n_inner=64,
                        bos_token_id=0, eos_token_id=0, initializer_range=0.1, use_cache=False,
                        attn_implementation="sdpa")
    model = GPT2Model(config)
    batch, seq = 2, 12
    inputs = {"input_ids": _ids(rng, (batch, seq), 128),
              "attention_mask": _mask(batch, seq, (12, 8))}
    return model, inputs, ("last_hidden_state",)


def roberta(rng):
    from transformers import RobertaConfig, RobertaModel
    # position ids come from input_ids: a cumulative sum over the non-padding tokens (pad_token_id = 1)
    config = RobertaConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=20, type_vocab_size=1, pad_token_id=1,
                           initializer_range=0.1, attn_implementation="eager")
    model = RobertaModel(config)
    batch, seq = 2, 12
    ids = _ids(rng, (batch, seq), 128, low=3)
    mask = _mask(batch, seq, (12, 6))
    ids = torch.where(mask.bool(), ids, torch.ones_like(ids))  # padded positions hold pad_token_id
    return model, {"input_ids": ids, "attention_mask": mask}, ("last_hidden_state", "pooler_output")


def t5_encoder(rng):
    from transformers import T5Config, T5EncoderModel
    # relative position buckets: Abs, Log, Min, Less, Where on the position differences
    config = T5Config(vocab_size=128, d_model=32, d_kv=16, d_ff=64, num_layers=2, num_heads=2,
                      relative_attention_num_buckets=8, relative_attention_max_distance=16,
                      feed_forward_proj="gated-gelu", initializer_factor=1.0, attn_implementation="eager")
    model = T5EncoderModel(config)
    batch, seq = 2, 12
    inputs = {"input_ids": _ids(rng, (batch, seq), 128),
              "attention_mask": _mask(batch, seq, (12, 9))}
    return model, inputs, ("last_hidden_state",)


def wav2vec2(rng, norm="layer"):
    """wav2vec2. ``norm="layer"`` (wav2vec2-large's layout) takes an attention_mask over the raw samples;
    ``norm="group"`` (wav2vec2-base's) has a GroupNorm on the first feature conv (exported as
    InstanceNormalization) and takes no mask."""
    from transformers import Wav2Vec2Config, Wav2Vec2Model
    config = Wav2Vec2Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
                            feat_extract_norm=norm, do_stable_layer_norm=norm == "layer",
                            num_conv_pos_embeddings=8, num_conv_pos_embedding_groups=4,
                            mask_time_prob=0.0, initializer_range=0.1, attn_implementation="eager")
    model = Wav2Vec2Model(config)
    batch, samples = 2, 400
    values = torch.from_numpy(rng.standard_normal((batch, samples)).astype(np.float32))
    inputs = {"input_values": values}
    if norm == "layer":
        inputs["attention_mask"] = _mask(batch, samples, (400, 260))
    return model, inputs, ("last_hidden_state", "extract_features")


# --- MobileNetV3-small-style net in plain torch ---

def _divisible(v, d=8):
    return max(d, int(v + d / 2) // d * d)


class SqueezeExcite(nn.Module):
    def __init__(self, channels):
        super().__init__()
        squeezed = _divisible(channels // 4)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeezed, 1)
        self.fc2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        s = torch.relu(self.fc1(self.pool(x)))
        return x * nn.functional.hardsigmoid(self.fc2(s))


class InvertedResidual(nn.Module):
    """Expand 1x1 -> depthwise kxk (stride s) -> optional SE -> project 1x1, with a residual when shapes match."""

    def __init__(self, cin, kernel, expanded, cout, se, act, stride):
        super().__init__()
        Act = nn.Hardswish if act == "HS" else nn.ReLU
        layers = []
        if expanded != cin:
            layers += [nn.Conv2d(cin, expanded, 1, bias=False), nn.BatchNorm2d(expanded), Act()]
        layers += [nn.Conv2d(expanded, expanded, kernel, stride, kernel // 2, groups=expanded, bias=False),
                   nn.BatchNorm2d(expanded), Act()]
        if se:
            layers.append(SqueezeExcite(expanded))
        layers += [nn.Conv2d(expanded, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.block(x)
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    """MobileNetV3-small's layout (Howard et al. 2019, table 2) at a quarter of the width, 5 blocks."""

    # (kernel, expanded, out, SE, activation, stride)
    BLOCKS = ((3, 16, 8, True, "RE", 2), (3, 24, 16, False, "RE", 2), (3, 32, 16, False, "RE", 1),
              (5, 48, 24, True, "HS", 2), (5, 64, 24, True, "HS", 1))

    def __init__(self, classes=10):
        super().__init__()
        layers = [nn.Conv2d(3, 8, 3, 2, 1, bias=False), nn.BatchNorm2d(8), nn.Hardswish()]
        cin = 8
        for k, e, c, se, act, s in self.BLOCKS:
            layers.append(InvertedResidual(cin, k, e, c, se, act, s))
            cin = c
        layers += [nn.Conv2d(cin, 96, 1, bias=False), nn.BatchNorm2d(96), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(96, 64), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(64, classes))

    def forward(self, x):
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


def mobilenetv3(rng):
    model = MobileNetV3Small()
    for m in model.modules():  # non-trivial batch-norm statistics, so folding them matters
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.2, 0.2)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.2, 0.2)
    x = torch.from_numpy(rng.standard_normal((1, 3, 64, 64)).astype(np.float32))
    return model, {"pixel_values": x}, ("logits",)


# --- recurrent: nn.LSTM (2 layers, bidirectional) then nn.GRU ---

class Recurrent(nn.Module):
    def __init__(self, features=16, hidden=24):
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * hidden, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 8)

    def forward(self, x, h0, c0):
        y, (h, c) = self.lstm(x, (h0, c0))
        z, g = self.gru(y)
        return self.head(z), h, c, g


def lstm_gru(rng):
    model = Recurrent()
    batch, seq = 2, 10
    inputs = {"x": torch.from_numpy(rng.standard_normal((batch, seq, 16)).astype(np.float32)),
              "h0": torch.from_numpy(0.5 * rng.standard_normal((4, batch, 24)).astype(np.float32)),
              "c0": torch.from_numpy(0.5 * rng.standard_normal((4, batch, 24)).astype(np.float32))}
    return model, inputs, ("y", "h", "c", "gru_h")


#: name -> (builder, its keyword arguments, exported with the torch.export-based exporter)
MODELS = {"bert": (bert, {}, False),
          "bert_dynamo": (bert, {}, True),
          "bert_buffers": (bert, {"token_types": False, "max_positions": 128}, False),
          "gpt2": (gpt2, {}, False),
          "roberta": (roberta, {}, False),
          "t5_encoder": (t5_encoder, {}, False),
          "wav2vec2": (wav2vec2, {}, False),
          "wav2vec2_base": (wav2vec2, {"norm": "group"}, False),
          "mobilenetv3": (mobilenetv3, {}, False),
          "lstm_gru": (lstm_gru, {}, False)}
TRANSFORMERS = {bert, gpt2, roberta, t5_encoder, wav2vec2}


def export(name: str, out_dir: str) -> None:
    """Build, export, check and run model ``name``; write ``out_dir/name.onnx`` and ``name.npz``."""
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)
    build, kwargs, dynamo = MODELS[name]
    model, inputs, outputs = build(rng, **kwargs)
    if build in TRANSFORMERS:
        model = _Outputs(model, tuple(inputs), outputs)
    model.eval()  # the wrapper too: the exporter restores the outer module's mode recursively
    path = os.path.join(out_dir, f"{name}.onnx")
    args = tuple(inputs.values())
    with torch.no_grad():
        torch.onnx.export(model, args, path, dynamo=dynamo, opset_version=OPSET, input_names=list(inputs),
                          output_names=list(outputs), do_constant_folding=True, external_data=False)
    proto = onnx.load(path)
    onnx.checker.check_model(proto, full_check=True)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    graph_inputs = [i.name for i in session.get_inputs()]  # an input torch found unused is not in the graph
    feeds = {n: v.numpy() for n, v in inputs.items() if n in graph_inputs}
    got = session.run(None, feeds)
    with torch.no_grad():
        want = model(*args)
    want = want if isinstance(want, tuple) else (want,)
    for n, g, w in zip(outputs, got, want):
        np.testing.assert_allclose(g, w.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"{name}: {n}, torch vs onnxruntime")
    np.savez(os.path.join(out_dir, f"{name}.npz"), **feeds, **dict(zip(outputs, got)))
    print(summary(path))
    if os.path.getsize(path) > 1 << 20:
        print(f"  warning: {name}.onnx is over 1 MiB", file=sys.stderr)


def summary(path: str) -> str:
    """One markdown paragraph for ``path``: file size, inputs, node count, op types with their counts."""
    proto = onnx.load(path)
    counts = collections.Counter(n.op_type for n in proto.graph.node)
    inputs = ", ".join(f"`{i.name}` {[d.dim_value for d in i.type.tensor_type.shape.dim]}" for i in proto.graph.input)
    ops = ", ".join(f"{op} {k}" for op, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
    name = os.path.basename(path)[:-5]
    return (f"- **{name}** ({os.path.getsize(path) / 1024:.0f} KiB, {len(proto.graph.node)} nodes; inputs {inputs}): "
            f"{ops}")


def write_readme(out_dir: str) -> None:
    """``out_dir/README.md``: what made the files and, per model, :func:`summary`."""
    lines = ["# Exported test models", "",
             "Made by `scripts/export_models.py` (see its docstring: it needs PyTorch and transformers, the tests",
             "do not), checked by `tests/onnx/test_onnx_exports.py`. `NAME.npz` holds the inputs under the graph's input",
             "names and onnxruntime's outputs under its output names. Op types as exported, before polyc's passes:",
             ""]
    lines += [summary(os.path.join(out_dir, f"{name}.onnx")) for name in MODELS
              if os.path.exists(os.path.join(out_dir, f"{name}.onnx"))]
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help="models to export (default: all): " + ", ".join(MODELS))
    parser.add_argument("--out", default=os.path.join(ROOT, "tests", "models"))
    opts = parser.parse_args(argv)
    unknown = [n for n in opts.names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s): {', '.join(unknown)}")
    os.makedirs(opts.out, exist_ok=True)
    for name in opts.names or MODELS:
        export(name, opts.out)
    write_readme(opts.out)


if __name__ == "__main__":
    main()
