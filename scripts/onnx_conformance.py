"""onnx's backend test suites run through polyc, onnxruntime and onnx's ReferenceEvaluator, case by case.

Every case runs in a worker process of its own (forked, with a time limit), so a crash or a hang of one
case is counted, not fatal. For each suite it prints a markdown table::

    | suite | cases | polyc passed | wrong results | clean errors | crashes | onnxruntime passed | reference passed |

- *polyc passed*: ``polyc.onnx.backend.prepare(model).run(inputs)`` matches every expected output (onnx's
  own comparison: same count, shapes and dtypes, ``assert_allclose`` with the case's rtol/atol);
- *wrong results*: polyc compiled and ran the case but an output differs: the worst failure;
- *clean errors*: a :class:`polyc.PolycError` (UnsupportedError, ShapeError, CompileError, ModelError);
- *crashes*: any other exception, a dead worker (a signal) or a time-out.

The node suite is built by onnx in memory (``onnx.backend.test.loader.load_model_tests``); the other suites
read ``model.onnx`` and ``test_data_set_*`` from the onnx wheel's data folder, and a suite whose files are
missing is reported as such. Usage::

    python scripts/onnx_conformance.py --kinds node --jobs 2 [--limit 50] [--match 'conv|pool'] [--json out.json]
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing
import os
import re
import sys
import time
import traceback
import warnings

KINDS = ("node", "simple", "pytorch-converted", "pytorch-operator")
RUNNERS = ("reference", "onnxruntime", "polyc")
OUTCOMES = ("pass", "wrong", "error", "crash")


def load_cases(kind: str) -> tuple[list, str | None]:
    """The cases of suite ``kind`` and None, or ``([], reason)`` when onnx cannot provide them."""
    from onnx.backend.test.loader import load_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cases = load_model_tests(kind=kind)
        except Exception as e:  # noqa: BLE001 - an onnx without this suite
            return [], f"onnx cannot list the {kind} suite: {type(e).__name__}: {e}"
    if not cases:
        return [], f"the installed onnx has no {kind} cases"
    usable = [c for c in cases if c.model is not None or (c.model_dir and os.path.exists(
        os.path.join(c.model_dir, "model.onnx")))]
    if not usable:
        return [], f"the installed onnx wheel lacks the data files of the {kind} suite"
    return sorted(usable, key=lambda c: c.name), None


def _load_value(path: str, type_proto):
    import onnx
    from onnx import numpy_helper

    with open(path, "rb") as f:
        content = f.read()
    if type_proto.HasField("sequence_type"):
        seq = onnx.SequenceProto()
        seq.ParseFromString(content)
        return numpy_helper.to_list(seq)
    if type_proto.HasField("optional_type"):
        opt = onnx.OptionalProto()
        opt.ParseFromString(content)
        return numpy_helper.to_optional(opt)
    tensor = onnx.TensorProto()
    tensor.ParseFromString(content)
    return numpy_helper.to_array(tensor)


def case_data(case) -> tuple:
    """``(model, [(inputs, expected outputs), ...])`` of a case, inputs in graph-input order."""
    import onnx
    from onnx import numpy_helper

    def normal(v):
        return numpy_helper.to_array(v) if isinstance(v, onnx.TensorProto) else v

    if case.model is not None and case.data_sets is not None:
        return case.model, [([normal(v) for v in i], [normal(v) for v in o]) for i, o in case.data_sets]
    model = onnx.load(os.path.join(case.model_dir, "model.onnx"))
    inits = {t.name for t in model.graph.initializer}
    ins = [vi for vi in model.graph.input if vi.name not in inits]
    sets = []
    for folder in sorted(glob.glob(os.path.join(case.model_dir, "test_data_set_*"))):
        n_in = len(glob.glob(os.path.join(folder, "input_*.pb")))
        n_out = len(glob.glob(os.path.join(folder, "output_*.pb")))
        inputs = [_load_value(os.path.join(folder, f"input_{k}.pb"), ins[k].type) for k in range(n_in)]
        outputs = [_load_value(os.path.join(folder, f"output_{k}.pb"), model.graph.output[k].type)
                   for k in range(n_out)]
        sets.append((inputs, outputs))
    return model, sets


def _input_names(model) -> list:
    inits = {t.name for t in model.graph.initializer}
    return [vi.name for vi in model.graph.input if vi.name not in inits]


def _run(runner: str, model, inputs: list) -> list:
    names = _input_names(model)
    if runner == "polyc":
        import polyc.onnx.backend

        return list(polyc.onnx.backend.prepare(model).run(inputs))
    feeds = dict(zip(names, inputs))
    if runner == "onnxruntime":
        import onnxruntime

        opts = onnxruntime.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = 1
        sess = onnxruntime.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        return list(sess.run(None, feeds))
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds))


def run_case(case, runner: str) -> tuple[str, str]:
    """``(outcome, detail)`` of one runner on one case, outcome one of :data:`OUTCOMES`."""
    from onnx.backend.test.runner import Runner

    from polyc.errors import PolycError

    try:
        model, sets = case_data(case)
    except Exception as e:  # noqa: BLE001
        return "crash", f"cannot load the case: {type(e).__name__}: {e}"
    for inputs, expected in sets:
        try:
            outputs = _run(runner, model, inputs)
        except PolycError as e:
            return "error", f"{type(e).__name__}: {e.message}"[:500]
        except Exception as e:  # noqa: BLE001
            kind = "error" if runner != "polyc" else "crash"
            return kind, f"{type(e).__name__}: {e}"[:500]
        try:
            Runner.assert_similar_outputs(expected, outputs, case.rtol, case.atol, model_dir=case.model_dir)
        except Exception as e:  # noqa: BLE001 - AssertionError, or a comparison of mismatched types
            return "wrong", f"{type(e).__name__}: {str(e).strip()}"[:500]
    return "pass", ""


def _worker(case, runners, conn) -> None:
    os.environ.setdefault("POLYC_NUM_THREADS", "1")
    warnings.simplefilter("ignore")
    for runner in runners:
        try:
            result = run_case(case, runner)
        except BaseException as e:  # noqa: BLE001 - whatever happens, the parent hears of it
            result = ("crash", f"{type(e).__name__}: {e}"[:500])
        conn.send((runner, result))
    conn.close()


def run_all(cases: list, jobs: int, timeout: float, runners=RUNNERS, progress=None) -> dict:
    """``{case name: {runner: (outcome, detail)}}``: each case in a forked worker, ``jobs`` at a time.

    The worker runs the reference and onnxruntime first, then polyc; a runner whose result never arrives
    (the worker died or ran past ``timeout`` seconds) is a crash.
    """
    ctx = multiprocessing.get_context("fork")
    results: dict = {}
    pending = list(cases)
    running = []  # (case, process, parent end, start time, results so far)
    while pending or running:
        while pending and len(running) < jobs:
            case = pending.pop(0)
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_worker, args=(case, runners, child), daemon=True)
            proc.start()
            child.close()
            running.append((case, proc, parent, time.monotonic(), {}))
        time.sleep(0.01)
        still = []
        for case, proc, conn, start, got in running:
            try:
                while conn.poll():
                    runner, result = conn.recv()
                    got[runner] = result
            except (EOFError, OSError):
                pass
            late = time.monotonic() - start > timeout
            if proc.is_alive() and not late and len(got) < len(runners):
                still.append((case, proc, conn, start, got))
                continue
            if proc.is_alive():
                proc.kill()
            proc.join()
            conn.close()
            why = f"timed out after {timeout:.0f} s" if late else f"worker died (exit code {proc.exitcode})"
            for runner in runners:
                got.setdefault(runner, ("crash", why))
            results[case.name] = got
            if progress:
                progress(case.name, got)
        running = still
    return results


def summarize(results: dict) -> dict:
    """Counts per runner and outcome: ``{"cases": n, "polyc": {"pass": .., "wrong": ..}, ...}``."""
    out = {"cases": len(results)}
    for runner in RUNNERS:
        counts = dict.fromkeys(OUTCOMES, 0)
        for got in results.values():
            if runner in got:
                counts[got[runner][0]] += 1
        out[runner] = counts
    return out


def table(rows: list) -> str:
    """The markdown table of ``(suite, summary or reason)`` rows."""
    lines = ["| suite | cases | polyc passed | wrong results | clean errors | crashes | onnxruntime passed "
             "| reference passed |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for suite, s in rows:
        if isinstance(s, str):
            lines.append(f"| {suite} | 0 | – | – | – | – | – | – |")
            continue
        p, o, r = s["polyc"], s["onnxruntime"], s["reference"]
        lines.append(f"| {suite} | {s['cases']} | {p['pass']} | {p['wrong']} | {p['error']} | {p['crash']} "
                     f"| {o['pass']} | {r['pass']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated suites (default: {','.join(KINDS)})")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2), help="cases run at once")
    ap.add_argument("--limit", type=int, default=None, help="run only the first N cases of each suite")
    ap.add_argument("--match", default=None, help="run only cases whose name matches this regular expression")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default 300)")
    ap.add_argument("--json", default=None, help="write every case's outcome and detail to this file")
    ap.add_argument("--verbose", "-v", action="store_true", help="print each case as it finishes")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS + ("real",):
            ap.error(f"unknown suite {k!r}; choose from {', '.join(KINDS)}")

    def progress(name, got):
        if args.verbose:
            print(f"{name}: " + ", ".join(f"{r} {got[r][0]}" for r in RUNNERS if r in got), file=sys.stderr,
                  flush=True)

    import onnx.reference  # noqa: F401 - imported once here, inherited by every forked worker
    import onnxruntime

    onnxruntime.set_default_logger_severity(4)  # its warnings about old opsets would drown the table
    import polyc.onnx.backend  # noqa: F401

    rows, report = [], {}
    for kind in kinds:
        cases, reason = load_cases(kind)
        if args.match:
            cases = [c for c in cases if re.search(args.match, c.name)]
        if args.limit is not None:
            cases = cases[:args.limit]
        if reason is not None:
            print(f"{kind}: {reason}", file=sys.stderr)
            rows.append((kind, reason))
            report[kind] = {"missing": reason}
            continue
        t = time.monotonic()
        results = run_all(cases, max(1, args.jobs), args.timeout, progress=progress)
        summary = summarize(results)
        summary["seconds"] = round(time.monotonic() - t, 1)
        rows.append((kind, summary))
        report[kind] = {"summary": summary, "cases": {n: {r: list(v) for r, v in got.items()}
                                                      for n, got in sorted(results.items())}}
    print(table(rows))
    for kind, s in rows:
        if isinstance(s, str):
            print(f"\n{kind}: {s}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
