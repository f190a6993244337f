#!/usr/bin/env python
"""Benchmark the gradient kernels ``polyc.grad`` builds against their forward kernels and against onnxruntime
running the same computation as an inference op, and print a markdown table.

Rows, batch 1, fp32:

- ``gemm`` at 1024 (``--quick``: 256): the forward ``C = A B`` (``kernels/matmul.tc: matmul``), its gradient
  with respect to ``A`` (``dA = dC B^T``) and to ``B`` (``dB = A^T dC``); onnxruntime's peers are ``MatMul``
  and ``Gemm`` with ``transB=1`` / ``transA=1``;
- ``conv3x3``: the 3x3, pad 1, stride 1 convolutions of ResNet-50 (64 channels at 56x56, 128 at 28, 256 at
  14, 512 at 7; ``kernels/conv2d.tc: conv2d_pad1``), the gradient with respect to the input (``dX``, a
  convolution of ``dY`` with the filters flipped: onnxruntime's ``ConvTranspose``) and to the filters
  (``dF``, a correlation of ``X`` with ``dY``: onnxruntime's ``Conv`` of ``X`` as ``C`` images of ``N``
  channels with ``dY`` as ``M`` filters of ``OH x OW``).

Columns: kernel, shape, polyc ms, x forward (the gradient's time over the forward's: each has the forward's
FLOP count), GFLOP/s, onnxruntime ms, ratio (onnxruntime / polyc: above 1 polyc is faster), check (polyc's
result against onnxruntime's, relative max error). Times are medians of ``--runs`` calls after a warm-up,
all rows of one run side by side. ``--cpu znver3`` (AVX2) or ``znver5`` (AVX-512) sets the target of polyc's
code (``POLYC_CPU``); onnxruntime picks its kernels for the machine it runs on.

    python scripts/bench_grad.py --threads 1 --cpu znver3
    python scripts/bench_grad.py --quick
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time


def median_ms(fn, runs: int) -> float:
    fn()
    samples = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e3


def ort_session(nodes, inputs, initializers, threads):
    """An onnxruntime session of ``nodes`` (onnx.helper nodes) with float inputs ``{name: shape}``."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(s))
                                           for n, s in inputs.items()],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
                              initializer=[numpy_helper.from_array(v, k) for k, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def error(got, want) -> str:
    import numpy as np
    return f"{float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30)):.0e}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cpu", default=None, help="POLYC_CPU for polyc's code: znver3 (AVX2), znver5 (AVX-512)")
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    args = parser.parse_args(argv)
    if args.cpu:
        os.environ["POLYC_CPU"] = args.cpu
    os.environ.setdefault("POLYC_CACHE_DIR", "off")

    import numpy as np
    from onnx import helper

    import polyc
    from polyc import kernels

    options = polyc.Options(threads=args.threads)
    rng = np.random.default_rng(0)
    rows = []

    def row(kernel, shape, polyc_ms, forward_ms, flops, ort_ms, check):
        rows.append(f"| {kernel} | {shape} | {polyc_ms:.3f} | {polyc_ms / forward_ms:.2f} | "
                    f"{flops / polyc_ms / 1e6:.0f} | {ort_ms:.3f} | {ort_ms / polyc_ms:.2f} | {check} |")
        print(rows[-1], file=sys.stderr, flush=True)

    n = 256 if args.quick else 1024
    mm = kernels.load("matmul", "matmul", options=options)
    grads = {w: polyc.grad(mm, w, options=options) for w in ("A", "B")}
    a, b, dc = (rng.standard_normal((n, n), np.float32) for _ in range(3))
    feeds = {"A": a, "B": b}
    peers = {
        "forward": (ort_session([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": a.shape, "B": b.shape}, {},
                                args.threads), lambda: mm(a, b)),
        "dA": (ort_session([helper.make_node("Gemm", ["dC", "B"], ["Y"], transB=1)],
                           {"dC": dc.shape, "B": b.shape}, {}, args.threads), lambda: grads["A"](a, b, dc)),
        "dB": (ort_session([helper.make_node("Gemm", ["A", "dC"], ["Y"], transA=1)],
                           {"A": a.shape, "dC": dc.shape}, {}, args.threads), lambda: grads["B"](a, b, dc)),
    }
    feeds = {"forward": {"A": a, "B": b}, "dA": {"dC": dc, "B": b}, "dB": {"A": a, "dC": dc}}
    forward_ms = None
    for what, (session, run) in peers.items():
        polyc_ms = median_ms(run, args.runs)
        forward_ms = forward_ms or polyc_ms
        ort_ms = median_ms(lambda: session.run(None, feeds[what]), args.runs)
        row(f"gemm {what}", f"{n}^3", polyc_ms, forward_ms, 2 * n ** 3, ort_ms,
            error(run(), session.run(None, feeds[what])[0]))

    conv = kernels.load("conv2d", "conv2d_pad1", options=options)
    grads = {w: polyc.grad(conv, w, options=options) for w in ("X", "F")}
    shapes = [(64, 14), (128, 7)] if args.quick else [(64, 56), (128, 28), (256, 14), (512, 7)]
    for c, h in shapes:
        x = rng.standard_normal((1, c, h, h), np.float32)
        f = (rng.standard_normal((c, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)
        dy = rng.standard_normal((1, c, h, h), np.float32)
        flops = 2 * c * c * 9 * h * h
        forward = ort_session([helper.make_node("Conv", ["X", "W"], ["Y"], kernel_shape=[3, 3], pads=[1] * 4)],
                              {"X": x.shape}, {"W": f}, args.threads)
        data = ort_session([helper.make_node("ConvTranspose", ["dY", "W"], ["Y"], kernel_shape=[3, 3], pads=[1] * 4)],
                           {"dY": dy.shape}, {"W": f}, args.threads)
        xt, dyt = np.ascontiguousarray(x.transpose(1, 0, 2, 3)), np.ascontiguousarray(dy.transpose(1, 0, 2, 3))
        weights = ort_session([helper.make_node("Conv", ["Xt", "dYt"], ["Y"], kernel_shape=[h, h], pads=[1] * 4)],
                              {"Xt": xt.shape, "dYt": dyt.shape}, {}, args.threads)
        cases = [("forward", forward, {"X": x}, lambda: conv(x, f), lambda o: o),
                 ("dX", data, {"dY": dy}, lambda: grads["X"](x, f, dy), lambda o: o),
                 ("dF", weights, {"Xt": xt, "dYt": dyt}, lambda: grads["F"](x, f, dy),
                  lambda o: o.transpose(1, 0, 2, 3))]
        forward_ms = None
        for what, session, feed, run, layout in cases:
            polyc_ms = median_ms(run, args.runs)
            forward_ms = forward_ms or polyc_ms
            ort_ms = median_ms(lambda: session.run(None, feed), args.runs)
            row(f"conv3x3 {what}", f"{c}ch {h}x{h}", polyc_ms, forward_ms, flops, ort_ms,
                error(run(), layout(session.run(None, feed)[0])))

    import polyc.target
    target = polyc.target.host_target()
    print(f"\n{target.cpu} ({target.vector_bits}-bit vectors, {target.vector_registers} registers), "
          f"{args.threads} thread(s), medians of {args.runs}\n")
    print("| kernel | shape | polyc ms | x forward | GFLOP/s | onnxruntime ms | ratio | check |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
