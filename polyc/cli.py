"""The ``polyc`` command.

    polyc show FILE.tc --def NAME --sizes M=64,N=64,K=64 [--stage domain|deps|schedule|transformed|ast|llvm|asm|all]
    polyc run FILE.tc --def NAME --sizes M=64,N=64,K=64 [--runs 10] [--options SPEC]
    polyc run [MODEL.onnx] [--input NAME=file.npy ...] [--bench N]     (no model: the bundled ResNet-50)
    polyc compile MODEL.onnx [--show-groups]
    polyc export MODEL.onnx -o DIR [--name NAME] [--threads N]
    polyc export FILE.tc --def NAME --sizes M=64,N=64,K=64 -o DIR [--name NAME] [--options SPEC] [--generic]
    polyc tune FILE.tc --def NAME --sizes M=64,N=64,K=64 [--budget S] [--trials N] [--strategy S] [--ray ADDR]
    polyc tune MODEL.onnx [--budget S] ...       (every distinct kernel, S seconds each)
    polyc tune --show                             (the records, per kernel the default and the best)
    polyc grad FILE.tc --def NAME --wrt A,B [-o GRAD.tc] [--name NAME]   (the gradient def, for polyc show/run)

Errors of the compiler and of the command line are printed as their message (no traceback) with exit status
1; so is a bundled model whose output does not match the expected output shipped with it.
"""
from __future__ import annotations

import argparse
import os
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


def read_source(path: str) -> str:
    """The text of a .tc file; PolycError for an ONNX model or any file that is not UTF-8 text."""
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".onnx") or b"\0" in data[:4096]:
        raise PolycError(f"{path} is an ONNX model (or another binary file), not a .tc definition",
                         hint=f"'polyc compile {path} --show-groups' prints a model's fusion groups and the TC "
                              "source of each kernel; 'polyc show' on one of those defs prints its stages")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise PolycError(f"{path} is not a UTF-8 text file (byte {e.start}): expected a .tc definition") from None


def _kernel(args):
    from .kernel import define

    source = read_source(args.file)
    options = Options.from_spec(args.options) if args.options else None
    kernel = define(source, args.def_name, options, filename=args.file)
    sizes = parse_sizes(args.sizes)
    unknown = [name for name in sizes if name not in kernel.checked.sizes]
    if unknown:
        raise PolycError(f"{kernel.name} has no size {', '.join(unknown)}; its sizes are "
                         f"{', '.join(kernel.checked.sizes) or '(none)'}",
                         hint="e.g. --sizes " + ",".join(f"{n}=64" for n in kernel.checked.sizes))
    return kernel.specialize_sizes(sizes, options)


def cmd_show(args) -> None:
    from .pipeline import STAGES

    compiled = _kernel(args)
    stages = STAGES if args.stage == "all" else (args.stage,)
    for stage in stages:
        print(f"==== {stage} ====")
        print(compiled.stage(stage))


def cmd_run(args) -> int:
    if args.file is None or args.file.endswith(".onnx"):
        return _run_model(args)
    compiled = _kernel(args)
    inputs = random_inputs(compiled)
    outputs = compiled(*inputs)
    times = []
    for _ in range(args.runs):
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


#: ONNX ``elem_type`` -> numpy dtype name, for checking feeds before the model is compiled.
_ONNX_DTYPES = {1: "float32", 2: "uint8", 3: "int8", 4: "uint16", 5: "int16", 6: "int32", 7: "int64", 9: "bool",
                10: "float16", 11: "float64", 12: "uint32", 13: "uint64", 16: "bfloat16"}


def load_feeds(path: str, specs: list[str]) -> dict:
    """``NAME=file.npy`` specs loaded and checked against the model's graph inputs (names, shapes, dtypes)
    before anything is compiled; PolycError naming the input and what it expects."""
    given = {}
    for spec in specs:
        name, sep, file = spec.partition("=")
        if not sep or not name or not file:
            raise PolycError(f"bad --input {spec!r}; expected NAME=file.npy")
        try:
            given[name] = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise PolycError(f"--input {name}: cannot read {file} as a .npy array: {e}") from None
    if not given:
        return given
    from .onnx.load import graph_inputs, load_model

    expected = {}
    for vi in graph_inputs(load_model(path)):
        t = vi.type.tensor_type
        expected[vi.name] = ([int(d.dim_value) for d in t.shape.dim], _ONNX_DTYPES.get(t.elem_type))
    for name, value in given.items():
        if name not in expected:
            raise PolycError(f"unknown input {name!r}; the model's inputs are "
                             + ", ".join(f"{n} {d or '?'}{s}" for n, (s, d) in expected.items()))
        shape, dtype = expected[name]
        if list(value.shape) != shape or (dtype is not None and value.dtype != np.dtype(dtype)):
            raise PolycError(f"--input {name}: {file_of(specs, name)} holds {value.dtype}{list(value.shape)}, "
                             f"the model expects {dtype or '?'}{shape}")
    return given


def file_of(specs: list[str], name: str) -> str:
    return next((s.partition("=")[2] for s in specs if s.partition("=")[0] == name), "?")


def _feeds(model, given: dict) -> dict:
    """Feeds: the arrays ``given`` (checked by :func:`load_feeds`); inputs not given get seeded random
    values (for a string input, words of random lowercase letters)."""
    rng = np.random.default_rng(0)
    feeds = {}
    for name, shape, dtype in zip(model.input_names, model.input_shapes, model.input_dtypes):
        if name in given:
            feeds[name] = given[name]
        elif dtype == np.dtype(object):
            letters = rng.integers(ord("a"), ord("z") + 1, (int(np.prod(shape, dtype=np.int64)), 6))
            feeds[name] = np.array(["".join(map(chr, w)) for w in letters], dtype=object).reshape(shape)
        elif np.issubdtype(dtype, np.floating):
            feeds[name] = rng.standard_normal(shape).astype(dtype)
        else:
            feeds[name] = rng.integers(0, 2, shape).astype(dtype)
    return feeds


def bundled_model_name(path: str) -> str | None:
    """The name of a bundled model-zoo "light" model (``light_NAME.onnx`` in the onnx package's test data,
    which ships its expected output), else None."""
    from .onnx import testing

    base = os.path.basename(path)
    name = base[len("light_"):-len(".onnx")] if base.startswith("light_") and base.endswith(".onnx") else None
    if name not in testing.LIGHT_MODELS or not os.path.samefile(os.path.dirname(os.path.abspath(path)),
                                                                 testing.light_dir()):
        return None
    return name


def _run_model(args) -> int:
    from .onnx import light_model_path, testing

    path = args.file or light_model_path("resnet50")
    given = load_feeds(path, args.input)
    bundled = bundled_model_name(path) if not given else None
    model = _compile_model(args)
    print(model.summary())
    feeds = _feeds(model, given)
    if bundled is not None:  # the input onnx's own test runner feeds this model, for its expected output
        feeds[model.input_names[0]] = testing.dummy_input(model.input_shapes[0])
    outputs = model.run(feeds)
    for name, out in zip(model.output_names, outputs):
        flat = out.reshape(-1)
        if out.dtype == np.dtype(object):
            print(f"output {name}: string{list(out.shape)} first={flat[:4].tolist()}")
            continue
        top = int(np.argmax(flat)) if flat.size else -1
        print(f"output {name}: {out.dtype}{list(out.shape)} min={flat.min():.6g} max={flat.max():.6g} "
              f"mean={flat.mean():.6g} argmax={top}")
    status = 0
    if bundled is not None:
        status = _compare_expected(bundled, outputs[0])
    runs = args.bench or 5
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        model.run(feeds)
        times.append(time.perf_counter() - t)
    print(f"latency: median {statistics.median(times) * 1e3:.2f} ms over {runs} runs")
    return status


def _compare_expected(name: str, got: np.ndarray) -> int:
    """Print whether ``got`` matches the expected output shipped with light model ``name``; 1 if not."""
    from .onnx import testing

    expected = testing.light_expected_output(name)
    rtol, atol = testing.LIGHT_TOLERANCES[name]
    if got.shape != expected.shape:
        print(f"MISMATCH: the output has shape {list(got.shape)}, the expected output {list(expected.shape)}")
        return 1
    diff = np.abs(got.astype(np.float64) - expected)
    bad = int(np.count_nonzero(diff > atol + rtol * np.abs(expected)))
    where = f"onnx's expected output for light_{name}.onnx (tolerance rtol={rtol:g}, atol={atol:g})"
    if bad:
        print(f"MISMATCH: {bad} of {got.size} elements differ from {where}; max abs diff {diff.max():.3g}")
        return 1
    print(f"matches {where}: max abs diff {diff.max():.3g}")
    if float(np.ptp(expected)) < 1e-3:
        print(f"(the light models' weights are all 0.02, so their expected output is nearly uniform; "
              f"tests/onnx/test_onnx_models.py also checks them re-weighted against onnxruntime)")
    return 0


def cmd_compile(args) -> int:
    model = _compile_model(args)
    print(model.summary())
    if args.show_groups:
        for kernel in model.kernels:
            if kernel is not None:
                print(f"\n# group {kernel.group}: inputs {', '.join(kernel.inputs)} -> "
                      f"outputs {', '.join(kernel.outputs)}")
                print(kernel.source.strip())
    return 0


def cmd_export(args) -> int:
    options = Options.from_spec(args.options) if args.options else Options()
    if args.threads:
        options = options.replace(threads=args.threads)
    if args.file.endswith(".onnx"):
        from .onnx.export import export_model
        lib = export_model(args.file, args.output, args.name, options)
    else:
        from .export import export_generic_kernel, export_kernel
        if args.generic:
            lib = export_generic_kernel(read_source(args.file), parse_sizes(args.sizes), args.output, args.name,
                                        options, args.def_name)
        else:
            lib = export_kernel(read_source(args.file), parse_sizes(args.sizes), args.output, args.name, options,
                                args.def_name)
    for path in (lib.library, lib.object, lib.header):
        print(path)
    return 0


def cmd_tune(args) -> int:
    from . import tune
    if args.show:
        print(tune.show())
        return 0
    if not args.file:
        raise PolycError("polyc tune needs a .tc file or an .onnx model (or --show)")
    if args.file.endswith(".onnx"):
        from .onnx.api import compile_program
        from .onnx.steps import constant_params
        program = compile_program(args.file, Options(threads=args.threads) if args.threads else None)
        work = {}  # each distinct kernel, with the weights it takes as constants, as the model runs it
        for step in program.steps:
            work.setdefault((step.kernel.source, step.kernel.name, step.sizes, constant_params(program, step)), step)
        kernels = [(source, name, dict(sizes), constants) for source, name, sizes, constants in work]
        print(f"polyc: tuning {len(kernels)} distinct kernels of {args.file}, {args.budget:g} s each",
              file=sys.stderr)
    else:
        kernels = [(read_source(args.file), args.def_name, parse_sizes(args.sizes), frozenset())]
    winners = []
    for source, name, sizes, constants in kernels:
        result = tune.tune(source, sizes, name, budget=args.budget, trials=args.trials, strategy=args.strategy,
                           ray=args.ray, threads=args.threads, constants=constants)
        print(f"{result.name} {','.join(f'{k}={v}' for k, v in result.sizes.items())}: default "
              f"{result.default_seconds * 1e3:.3f} ms, best {result.best_seconds * 1e3:.3f} ms "
              f"({result.gain:.2f}x) [{result.best_spec or 'default'}] after {len(result.records)} measurements")
        if result.best_spec:
            winners.append(result.records[-1]["key"])
    if args.file.endswith(".onnx") and winners:
        _check_tuned_model(args.file, Options(threads=args.threads) if args.threads else None, winners)
    return 0


#: ``polyc tune MODEL.onnx`` keeps its kernels' winning records when the model runs at most this share of its
#: time with the default options (:func:`_check_tuned_model`), else revokes them.
MODEL_CHECK_MAX_RATIO = 0.99
#: Runs of the model each way in that check (alternating, medians).
MODEL_CHECK_RUNS = 15


def _check_tuned_model(path: str, options, winners: list) -> None:
    """The model check of ``polyc tune MODEL.onnx``: the model compiled with its kernels' new records and with
    the default options, run alternately (:data:`MODEL_CHECK_RUNS` each, medians); unless the tuned model runs
    in at most :data:`MODEL_CHECK_MAX_RATIO` of the default's time, the records under ``winners`` (the keys of
    the kernels whose search found a winner) are revoked (:func:`polyc.runtime.records.revoke`): tuning never
    leaves a model slower than its default, as the kernel-level confirmation keeps a kernel. Each kernel
    is tuned on its own, its weights and inputs warm in cache; in the model its weights come from memory and
    its neighbours compete for the caches: ResNet-50's kernels with AVX2 gained up to 1.25x each on their own
    and the model ran 0.97-0.99x with their records (Zen 4, 1 thread)."""
    from . import onnx as ponnx
    from . import tune

    tuned = ponnx.compile(path, options)
    with tune.records_disabled():
        default = ponnx.compile(path, options)
    feeds = _feeds(tuned, {})
    times = {"default": [], "tuned": []}
    for _ in range(MODEL_CHECK_RUNS):
        for label, model in (("default", default), ("tuned", tuned)):
            model.run(feeds)
            t = time.perf_counter()
            model.run(feeds)
            times[label].append(time.perf_counter() - t)
    base, mine = statistics.median(times["default"]), statistics.median(times["tuned"])
    verdict = "records kept" if mine <= MODEL_CHECK_MAX_RATIO * base else "records revoked"
    print(f"model check: default {base * 1e3:.2f} ms, tuned {mine * 1e3:.2f} ms ({base / mine:.3f}x): {verdict}")
    if verdict == "records revoked":
        tune.revoke(winners, f"the model ran {base / mine:.3f}x with them")


def cmd_grad(args) -> int:
    from .kernel import define, grad

    forward = define(read_source(args.file), args.def_name, filename=args.file)
    wrt = [w.strip() for w in args.wrt.split(",") if w.strip()]
    text = grad(forward, wrt, args.name).source
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            f.write(text)
        print(args.output)
    else:
        print(text, end="")
    return 0


def _positive(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv=None) -> int:
    """Run the ``polyc`` command on ``argv`` (default ``sys.argv[1:]``); returns the exit status: 0, or 1
    after printing a PolycError's message (2 for a command-line usage error, from argparse)."""
    parser = argparse.ArgumentParser(
        prog="polyc", description="polyhedral compiler for tensor operators (Tensor Comprehensions, ONNX)",
        epilog="run 'polyc COMMAND --help' for a command's options")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {"show": "print every compiler stage of one def of a .tc file (domain, dependences, schedule "
                     "trees, AST, LLVM IR, assembly)",
             "run": "run a def of a .tc file on random inputs and time it, or compile and run an ONNX model "
                    "(none given: the bundled ResNet-50, checked against its expected output)"}
    for name in ("show", "run"):
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        p.add_argument("file", nargs="?" if name == "run" else None, default=None,
                       help="a .tc file (or, for run, an .onnx model; none: the bundled ResNet-50)")
        p.add_argument("--def", dest="def_name", default=None, help="the def to use when the file has several")
        p.add_argument("--sizes", default="", help="size values, e.g. M=64,N=64,K=64")
        p.add_argument("--options", default=None, help="an Options spec, e.g. tile_sizes=32x32x64,parallel=0")
        if name == "show":
            p.add_argument("--stage", default="all",
                           choices=["domain", "deps", "schedule", "transformed", "ast", "llvm", "asm", "all"])
        else:
            p.add_argument("--runs", type=_positive, default=10, help="timed runs of a kernel (median printed)")
            p.add_argument("--input", action="append", default=[], help="NAME=file.npy for a model input")
            p.add_argument("--bench", type=_positive, default=None,
                           help="for a model: timed runs (median printed; default 5)")
            p.add_argument("--threads", type=_positive, default=None, help="threads per kernel")
    what = "compile an ONNX model and print its fusion groups, kernels, compile times and memory arena"
    p = sub.add_parser("compile", help=what, description=what)
    p.add_argument("file", help="an .onnx model")
    p.add_argument("--show-groups", action="store_true",
                   help="also print the generated TC source of every fusion group's kernel")
    p.add_argument("--threads", type=_positive, default=None, help="threads per kernel")
    what = "write a C library (lib<name>.so, <name>.o, <name>.h) running an ONNX model or a def of a .tc file"
    p = sub.add_parser("export", help=what, description=what)
    p.add_argument("file", help="an .onnx model or a .tc file")
    p.add_argument("-o", "--output", required=True, help="the directory to write into (created)")
    p.add_argument("--name", default=None, help="the C name of the library and its functions (default: the "
                                                "model file's stem or the def's name)")
    p.add_argument("--def", dest="def_name", default=None, help="the def to export when the file has several")
    p.add_argument("--sizes", default="", help="for a def: size values, e.g. M=64,N=64,K=64")
    p.add_argument("--generic", action="store_true", help="for a def: one function for every size, taking the "
                                                          "sizes as arguments (--sizes is then the hint)")
    p.add_argument("--options", default=None, help="an Options spec, e.g. tile_sizes=32x32x64,parallel=0")
    p.add_argument("--threads", type=_positive, default=None, help="threads of the parallel loops (default: "
                                                                   "this machine's usable cores)")
    what = "search the options of a def of a .tc file, or of every kernel of an ONNX model, and record the best"
    p = sub.add_parser("tune", help=what, description=what)
    p.add_argument("file", nargs="?", default=None, help="a .tc file or an .onnx model")
    p.add_argument("--def", dest="def_name", default=None, help="the def to tune when the file has several")
    p.add_argument("--sizes", default="", help="for a def: size values, e.g. M=64,N=64,K=64")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of search per kernel (default 60)")
    p.add_argument("--trials", type=_positive, default=None, help="at most this many candidates per kernel")
    p.add_argument("--strategy", default=None, choices=["model", "evolution", "random"],
                   help="the search: model-based (the default with scikit-learn installed: a random forest that "
                        "also learns from the records of other kernels on this target), genetic or random")
    p.add_argument("--ray", default=None, help="measure on Ray: 'auto', 'local' or a cluster address")
    p.add_argument("--threads", type=_positive, default=None, help="threads the kernels run with")
    p.add_argument("--show", action="store_true", help="print the records (per kernel, default and best)")
    what = ("write the gradient of a def of a .tc file as a def (reverse mode, polyc.grad): it takes the inputs, "
            "then one seed dY per output, and returns the gradients of the --wrt inputs")
    p = sub.add_parser("grad", help=what, description=what)
    p.add_argument("file", help="a .tc file")
    p.add_argument("--def", dest="def_name", default=None, help="the def to differentiate when the file has several")
    p.add_argument("--wrt", required=True, help="the inputs to differentiate with respect to, e.g. A,B")
    p.add_argument("--name", default=None, help="the gradient def's name (default: NAME_grad)")
    p.add_argument("-o", "--output", default=None, help="write the def to this file instead of printing it")
    args = parser.parse_args(argv)
    commands = {"show": cmd_show, "run": cmd_run, "compile": cmd_compile, "export": cmd_export, "tune": cmd_tune,
                "grad": cmd_grad}
    try:
        return commands[args.command](args) or 0
    except PolycError as exc:
        print(f"polyc: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a file that does not exist or cannot be read
        print(f"polyc: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
