"""The ``polyc`` command.

    polyc show FILE.tc --def NAME --sizes M=64,N=64,K=64 [--stage domain|deps|schedule|transformed|ast|llvm|asm|all]
    polyc run FILE.tc --def NAME --sizes M=64,N=64,K=64 [--runs 10] [--options SPEC]
    polyc run [MODEL.onnx] [--input NAME=file.npy ...] [--bench N]     (no model: the bundled ResNet-50)
    polyc compile MODEL.onnx [--show-groups]

Errors of the compiler are printed as their message (no traceback) with exit status 1.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

from .errors import PolycError
from .options import Options


def parse_sizes(text: str | None) -> dict:
    """``"M=64,N=32"`` → ``{"M": 64, "N": 32}``; raises PolycError on a malformed entry."""
    sizes = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, sep, value = part.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise PolycError(f"bad size {part!r}; expected NAME=INTEGER, e.g. M=64")
        sizes[name.strip()] = int(value)
    return sizes


def random_inputs(compiled, seed: int = 0) -> list[np.ndarray]:
    """Seeded random arrays for the inputs of a compiled kernel (floats in [-1, 1), small integers)."""
    rng = np.random.default_rng(seed)
    arrays = []
    for t in compiled.inputs:
        if t.dtype.startswith("float"):
            arrays.append(rng.uniform(-1, 1, t.shape).astype(t.dtype))
        elif t.dtype == "bool":
            arrays.append(rng.integers(0, 2, t.shape).astype(bool))
        else:
            arrays.append(rng.integers(0, 4, t.shape).astype(t.dtype))
    return arrays


def _kernel(args):
    from .kernel import define

    with open(args.file) as f:
        source = f.read()
    options = Options.from_spec(args.options) if args.options else None
    kernel = define(source, args.def_name, options, filename=args.file)
    return kernel.specialize_sizes(parse_sizes(args.sizes), options)


def cmd_show(args) -> None:
    from .kernel import STAGES

    compiled = _kernel(args)
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        print(f"==== {stage} ====")
        print(compiled.stage(stage))


def cmd_run(args) -> None:
    if args.file is None or args.file.endswith(".onnx"):
        return _run_model(args)
    compiled = _kernel(args)
    inputs = random_inputs(compiled)
    outputs = compiled(*inputs)
    times = []
    for _ in range(max(1, args.runs)):
        t = time.perf_counter()
        compiled(*inputs)
        times.append(time.perf_counter() - t)
    outs = outputs if isinstance(outputs, tuple) else (outputs,)
    for spec, out in zip(compiled.outputs, outs):
        print(f"{spec.name}: {out.dtype}{list(out.shape)} mean={float(np.mean(out)):.6g}")
    print(f"{compiled.name}: median {statistics.median(times) * 1e3:.3f} ms over {len(times)} runs")


def _compile_model(args):
    from . import onnx as ponnx

    path = args.file or ponnx.light_model_path("resnet50")
    options = Options(threads=args.threads) if getattr(args, "threads", None) else None
    print(f"polyc: compiling {path}", file=sys.stderr)
    t = time.perf_counter()
    model = ponnx.compile(path, options, progress=True)
    print(f"compiled in {time.perf_counter() - t:.1f} s")
    return model


def _feeds(model, specs: list[str]) -> dict:
    """Feeds from ``NAME=file.npy`` specs; inputs not given get seeded random values."""
    given = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep:
            raise PolycError(f"bad --input {spec!r}; expected NAME=file.npy")
        given[name] = np.load(file)
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape, dtype in zip(model.input_names, model.input_shapes, model.input_dtypes):
        if name in given:
            feeds[name] = given.pop(name)
        elif np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
    if given:
        raise PolycError(f"unknown input(s) {', '.join(given)}; the model's inputs are "
                         f"{', '.join(model.input_names)}")
    return feeds


def _run_model(args) -> None:
    model = _compile_model(args)
    print(model.summary())
    feeds = _feeds(model, args.input)
    outputs = model.run(feeds)
    for name, out in zip(model.output_names, outputs):
        flat = out.reshape(-1)
        top = int(np.argmax(flat)) if flat.size else -1
        print(f"output {name}: {out.dtype}{list(out.shape)} min={flat.min():.6g} max={flat.max():.6g} "
              f"mean={flat.mean():.6g} argmax={top}")
    runs = args.bench or 5
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - t)
    print(f"latency: median {statistics.median(times) * 1e3:.2f} ms over {runs} runs")


def cmd_compile(args) -> None:
    model = _compile_model(args)
    print(model.summary())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="polyc", description="polyhedral compiler for tensor operators")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("show", "run"):
        p = sub.add_parser(name)
        p.add_argument("file", nargs="?" if name == "run" else None, default=None,
                       help="a .tc file (or, for run, an .onnx model; none: the bundled ResNet-50)")
        p.add_argument("--def", dest="def_name", default=None, help="the def to use when the file has several")
        p.add_argument("--sizes", default="", help="size values, e.g. M=64,N=64,K=64")
        p.add_argument("--options", default=None, help="an Options spec, e.g. tile_sizes=32x32x64,parallel=0")
        if name == "show":
            p.add_argument("--stage", default="all",
                           choices=["domain", "deps", "schedule", "transformed", "ast", "llvm", "asm", "all"])
        else:
            p.add_argument("--runs", type=int, default=10, help="timed runs (median printed)")
            p.add_argument("--input", action="append", default=[], help="NAME=file.npy for a model input")
            p.add_argument("--bench", type=int, default=0, help="for a model: timed runs (median printed)")
            p.add_argument("--threads", type=int, default=None)
    p = sub.add_parser("compile")
    p.add_argument("file")
    p.add_argument("--show-groups", action="store_true")
    p.add_argument("--threads", type=int, default=None)
    args = parser.parse_args(argv)
    try:
        {"show": cmd_show, "run": cmd_run, "compile": cmd_compile}[args.command](args)
    except PolycError as exc:
        print(f"polyc: error: {exc}", file=sys.stderr)
        return 1
    except FileNotFoundError as exc:
        print(f"polyc: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
