"""Differential fuzzing of polyc: random TC programs against an independent reference interpreter.

    python scripts/fuzz.py --programs 2000 --seed 1 [--jobs 2] [--options default,tiles,...] [--timeout 60]

Each program (``tests/fuzz_programs.py``) is first judged by the reference (``tests/tc_reference.py``) at
2-3 small sizes (1 and odd primes among them); a candidate invalid at every size is mostly replaced before
polyc sees it. polyc then compiles it 3-5 times: the default options at a valid size (LLVM -O3) and at
another size (-O0; where the reference finds a read out of bounds, or the program invalid), tiles with two
threads, and a rotating extra set (naive, fusion=min, wild, identity), each at -O0; 5% of programs also
run at a large size with two threads. Indices include products of indices (checked at run time by polyc),
wrapping casts and divisions by negative constants (checked at compile time), and some programs get
out-of-range index data: where the reference finds a read out of bounds, polyc must raise a PolycError
(``oob caught``) and never return a result; where it finds every read in bounds, polyc's results must match
and a run-time failure is a mismatch. polyc's between-stage verifier is on for 10% of the tiled runs only.

polyc runs in worker processes (restarted when one dies) with a per-program time limit, so a segfault is
counted as a crash and a compile that does not finish as a timeout. Prints a summary table, the CPU time of
the workers (user + system, with their children: the figure to compare across runs on a shared machine) and
a reproducer for every failure; exits 1 on any mismatch, crash or foreign exception. ``--json FILE`` writes
the summary and failures.

Each worker uses a private temporary disk cache (``POLYC_CACHE_DIR``) unless the environment sets one.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

FAILURES = ("mismatch", "crash", "foreign")


def program_seed(seed: int, index: int) -> int:
    return (seed * 1_000_003 + index) & 0x7FFFFFFF


# ---- worker ------------------------------------------------------------------------------------------------

def _cpu() -> float:
    """CPU seconds (user + system) of this process and of its finished children (polyc may run isl's
    scheduler in a forked child)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def worker_main() -> None:
    """Read one JSON task per line ({"index", "seed", "options"}), answer with "start" lines before each polyc
    run and one "done" line per task."""
    import fuzz_programs as F

    out = os.fdopen(os.dup(1), "w")  # answers go to the original stdout; anything polyc prints to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    for line in sys.stdin:
        task = json.loads(line)
        cpu = _cpu()
        program = F.generate(task["seed"])
        if task.get("options"):
            program.plan = [p for p in program.plan if p[0] in task["options"]]

        def started(name, spec, sizes):
            out.write(json.dumps({"start": [name, spec, sizes]}) + "\n")
            out.flush()

        t = time.perf_counter()
        try:
            outcomes = [o.__dict__ for o in F.run_program(program, on_start=started)]
        except Exception:  # noqa: BLE001 - a bug of the fuzzer itself, reported as such
            import traceback
            outcomes = [{"option_set": "-", "spec": "", "sizes": {}, "status": "harness",
                         "detail": traceback.format_exc(), "seconds": 0.0}]
        out.write(json.dumps({"done": outcomes, "seconds": time.perf_counter() - t,
                              "cpu": _cpu() - cpu, "text": program.text,
                              "attempt": program.attempt}) + "\n")
        out.flush()


class Worker:
    def __init__(self, env):
        self.env = env
        self.proc = None
        self.start()

    def start(self):
        self.proc = subprocess.Popen([sys.executable, "-u", __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=self.env,
                                     start_new_session=True, text=True)
        self.task = None
        self.current = None
        self.deadline = None
        self.buffer = ""

    def send(self, task, timeout):
        self.task = task
        self.current = None
        self.deadline = time.monotonic() + timeout
        self.proc.stdin.write(json.dumps(task) + "\n")
        self.proc.stdin.flush()

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def restart(self):
        self.kill()
        self.start()


def supervise(tasks, jobs: int, timeout: float, env, on_result) -> None:
    """Run ``tasks`` on ``jobs`` workers; ``on_result(task, outcomes_or_None, kind, where)`` per task, with
    kind ``done``/``crash``/``timeout`` and where the (option set, spec, sizes) that was running."""
    pending = list(reversed(tasks))
    workers = [Worker(env) for _ in range(min(jobs, len(tasks)) or 1)]
    for w in workers:
        if pending:
            w.send(pending.pop(), timeout)
    try:
        while any(w.task is not None for w in workers):
            busy = [w for w in workers if w.task is not None]
            wait = max(0.0, min(w.deadline for w in busy) - time.monotonic())
            ready, _, _ = select.select([w.proc.stdout for w in busy], [], [], wait)
            for w in busy:
                if w.proc.stdout in ready:
                    chunk = os.read(w.proc.stdout.fileno(), 1 << 20)
                    if not chunk:  # the worker died
                        code = w.proc.wait()
                        on_result(w.task, None, "crash", (w.current, code))
                        w.restart()
                    else:
                        w.buffer += chunk.decode()
                        while "\n" in w.buffer and w.task is not None:
                            line, w.buffer = w.buffer.split("\n", 1)
                            msg = json.loads(line)
                            if "start" in msg:
                                w.current = msg["start"]
                            else:
                                on_result(w.task, msg["done"], "done", msg)
                                w.task = None
                        if w.task is not None:
                            continue
                elif time.monotonic() >= w.deadline:
                    on_result(w.task, None, "timeout", (w.current, None))
                    w.restart()
                else:
                    continue
                if w.task is None and pending:
                    w.send(pending.pop(), timeout)
    finally:
        for w in workers:
            w.kill()


# ---- parent ------------------------------------------------------------------------------------------------

def reproducer(seed, text, kind, option_set, spec, sizes, case, bad_index, detail) -> str:
    data = "out-of-range index data" if bad_index else "in-range data"
    return (f"### {kind}: program seed {seed}, options '{option_set}' (`{spec or '(default)'}`), "
            f"sizes {sizes} ({data})\n\n```\n{text}\n```\n\n{detail}\n\nReproduce: `python -c 'import sys; "
            f"sys.path.insert(0, \"tests\"); import fuzz_programs as F; F.reproduce({seed}, \"{option_set}\", "
            f"{case})'`\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per program (all its runs)")
    parser.add_argument("--options", default="", help="comma-separated option-set names to run (default: all)")
    parser.add_argument("--json", default="", help="write the summary and failures to this file")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker_main()
        return 0
    import fuzz_programs as F

    selected = [s for s in args.options.split(",") if s]
    unknown = [s for s in selected if s not in F.OPTION_SETS and s != "parallel"]
    if unknown:
        parser.error(f"unknown option sets {unknown}; known: {', '.join(F.OPTION_SETS)}, parallel")
    env = dict(os.environ)
    cache_dir = None
    if "POLYC_CACHE_DIR" not in env:
        cache_dir = tempfile.mkdtemp(prefix="polyc-fuzz-")
        env["POLYC_CACHE_DIR"] = cache_dir
    env.setdefault("POLYC_NUM_THREADS", "2")
    tasks = [{"index": i, "seed": program_seed(args.seed, i), "options": selected}
             for i in range(args.programs)]
    counts = Counter()
    runs = Counter()
    failures, rejections = [], []
    seconds = []
    cpu_seconds = []
    bar = None
    if not args.quiet:
        from tqdm import tqdm
        bar = tqdm(total=len(tasks), unit="prog", file=sys.stderr)

    def on_result(task, outcomes, kind, where):
        counts["programs"] += 1
        if kind != "done":
            counts[kind + "ed" if kind == "crash" else "timeouts"] += 1
            program = F.generate(task["seed"])
            current, code = where
            name, spec, sizes = current if current else ("?", "?", "?")
            case = program.sizes.index(sizes) if sizes in program.sizes else 0
            detail = (f"the worker died (exit status {code})" if kind == "crash"
                      else f"no answer within {args.timeout:.0f} s")
            failures.append((kind, reproducer(task["seed"], program.text, kind, name, spec, sizes, case,
                                              program.bad_index[case], detail)))
        else:
            cpu_seconds.append(where["cpu"])
            statuses = Counter(o["status"] for o in outcomes)
            runs.update(statuses)
            seconds.extend(o["seconds"] for o in outcomes if o["status"] in ("ok", "mismatch"))
            if statuses["ok"] or statuses["mismatch"]:
                counts["compiled"] += 1
            elif any(statuses[k] for k in ("rejected", "agreed-invalid", "agreed-oob", "runtime-check")):
                counts["rejected"] += 1
            if statuses["runtime-check"] or statuses["agreed-oob"]:
                counts["oob caught"] += 1
            if any(o["bad_index"] for o in outcomes):
                counts["bad index data"] += 1
            if where["attempt"]:
                counts["regenerated"] += 1
            for k in ("mismatch", "foreign", "harness"):
                if statuses[k]:
                    counts[{"mismatch": "mismatched", "harness": "harness errors"}.get(k, k)] += 1
            for o in outcomes:
                if o["status"] in ("mismatch", "foreign", "harness"):
                    failures.append((o["status"], reproducer(task["seed"], where["text"], o["status"],
                                                             o["option_set"], o["spec"], o["sizes"], o["case"],
                                                             o["bad_index"], o["detail"])))
                elif o["status"] == "rejected" and len(rejections) < 30:
                    rejections.append(f"seed {task['seed']} sizes {o['sizes']} `{o['spec']}`: {o['detail']}")
        if bar is not None:
            bar.update(1)
            bar.set_postfix(fail=len(failures), refresh=False)

    started = time.perf_counter()
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        supervise(tasks, args.jobs, args.timeout, env, on_result)
    finally:
        if bar is not None:
            bar.close()
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    elapsed = time.perf_counter() - started
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = (children.ru_utime + children.ru_stime) - (children_before.ru_utime + children_before.ru_stime)
    columns = ("programs", "compiled", "rejected", "mismatched", "crashed", "foreign", "timeouts", "oob caught",
               "bad index data", "regenerated")
    print("| " + " | ".join(columns) + " |")
    print("|" + " ---: |" * len(columns))
    print("| " + " | ".join(str(counts[c]) for c in columns) + " |")
    print(f"\n{counts['programs']} programs in {elapsed:.1f} s ({counts['programs'] / elapsed:.2f} programs/s, "
          f"{args.jobs} jobs); polyc runs: " + ", ".join(f"{k} {v}" for k, v in sorted(runs.items())))
    n = max(1, counts["programs"])
    print(f"CPU: {worker_cpu:.1f} s in workers ({worker_cpu / n:.3f} s per program, start-up included); "
          f"{sum(cpu_seconds):.1f} s running programs ({sum(cpu_seconds) / max(1, len(cpu_seconds)):.3f} s "
          f"per finished program)")
    if seconds:
        seconds.sort()
        print(f"compile+run seconds per accepted run: median {seconds[len(seconds) // 2]:.3f}, "
              f"max {seconds[-1]:.2f}")
    if rejections:
        print(f"\nSample of rejections of programs the reference evaluates ({len(rejections)} shown):")
        for r in rejections:
            print("- " + r)
    for kind, text in failures:
        print("\n" + text)
    if args.json:
        Path(args.json).write_text(json.dumps({"counts": dict(counts), "runs": dict(runs), "seconds": elapsed,
                                               "failures": [{"kind": k, "text": t} for k, t in failures],
                                               "rejections": rejections}, indent=1))
    if counts["harness errors"]:
        print(f"\n{counts['harness errors']} programs hit an error of the fuzzer itself (shown above)")
    bad = counts["mismatched"] + counts["crashed"] + counts["foreign"] + counts["harness errors"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
