"""Autotuning: search the Options a kernel compiles with, measure each candidate, keep replayable records.

    result = polyc.tune.tune(source, {"M": 512, "N": 512, "K": 512}, budget=60)
    result.best_spec, result.default_seconds, result.best_seconds

The search (:mod:`polyc.tune.search`: model-based by default, learning from the records of other kernels on
this target too; genetic without scikit-learn; random sampling for comparison) proposes candidates in rounds
of :data:`ROUND`; the default options are always the first. Each candidate is compiled,
checked against the default's output and timed (:mod:`polyc.tune.measure`). Every measured candidate becomes
a record (:mod:`polyc.runtime.records`: canonical kernel text, sizes, target, polyc version, thread count, the
options spec and the times). A search ends with a confirmation: the default and the best candidate measured
again, alternately, :data:`CONFIRM` times. :func:`polyc.define` and :func:`polyc.onnx.compile` then compile
the kernel with its best confirmed record's options (only when it beat the default there) wherever their
options are the defaults (``POLYC_TUNING_RECORDS=off`` turns that off), and
``Options.from_spec(record["options"])`` replays one by hand.

Where candidates are measured:

- locally (the default): a round's candidates compile at once in worker processes
  (:func:`polyc.runtime.workers.run_jobs`; the objects land in the disk cache), then this process loads and
  times them one after the other, with nothing else compiling: measurements never overlap;
- on Ray (``ray="auto"`` or a cluster address; ``pip install polyc[tune]``): each candidate is one Ray task
  that compiles, checks and times it on a worker node, asking for all of that node's CPUs, so a node runs one
  measurement at a time and a cluster of n nodes measures n candidates at once (compiles run inside the
  task, on the node that times them). The records come back to this process, which writes them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .. import debug
from ..errors import PolycError
from ..kernel import Kernel
from ..options import Options
from ..pipeline import resolve_options
from ..runtime import records
from ..runtime.records import disabled as records_disabled, revoke  # noqa: F401  (for polyc.cli)
from ..runtime.workers import run_jobs
from ..target import host_target
from .measure import MeasureJob, compile_or_error, outputs, time_candidate
from .search import Evolution, ModelSearch, RandomSearch, history_rows, space

#: Candidates proposed (and compiled at once) per round.
ROUND = 4

#: Rounds of the confirmation that ends a search: the default and the best candidate measured alternately;
#: the medians of these rounds decide (and are the records :func:`polyc.runtime.records.best` applies).
CONFIRM = 5

STRATEGIES = {"evolution": Evolution, "model": ModelSearch, "random": RandomSearch}


def default_strategy() -> str:
    """``"model"`` (the model-based search with the records of other kernels as history: the one measured to
    beat random sampling, see the README's Tuning section) when scikit-learn is installed (the ``tune``
    extra), else ``"evolution"``."""
    try:
        import sklearn  # noqa: F401
    except ImportError:
        debug.log("tune: scikit-learn is not installed (pip install polyc[tune]): the genetic search")
        return "evolution"
    return "model"


@dataclass
class TuneResult:
    """What :func:`tune` found: the default's and the best candidate's median seconds, the best spec
    (``""``: the default), every record written (dicts, in measurement order) and ``history``: ``(seconds
    since the start, best median so far)`` after each measurement."""

    name: str
    sizes: dict
    default_seconds: float
    best_seconds: float
    best_spec: str
    records: list = field(default_factory=list)
    history: list = field(default_factory=list)

    @property
    def gain(self) -> float:
        """Default time over best time (1.0: the default is the best found)."""
        return self.default_seconds / self.best_seconds


def tune(source: str, sizes: dict, name: str | None = None, budget: float = 60.0, trials: int | None = None,
         strategy: str | None = None, ray: str | None = None, threads: int | None = None, seed: int = 0,
         processes: int | None = None, write: bool = True, constants=(), transfer: bool = True) -> TuneResult:
    """Tune the def ``name`` of ``source`` at ``sizes`` for ``budget`` seconds (wall clock) or ``trials``
    candidates, whichever ends first; ``strategy`` ``"model"``, ``"evolution"`` or ``"random"`` (None:
    :func:`default_strategy`); ``ray``: a Ray address to measure on (None: locally); ``threads``: the thread
    count the kernel runs with (default as :func:`polyc.define`); ``processes``: compile workers for local
    measurement (default the usable cores);
    ``write``: append the records to the records file; ``constants``: the inputs the kernel takes as constants
    where it runs (a model's weights: compiled to take them packed, packed once before timing, and the records
    keyed by them, :func:`polyc.runtime.records.record_key`); ``transfer``: the model-based search also learns
    from the records of other kernels on this target and thread count (:func:`history`). Raises PolycError for
    an unknown strategy, a def that does not compile with the default options, or Ray missing when asked for."""
    strategy = strategy or default_strategy()
    if strategy not in STRATEGIES:
        raise PolycError(f"unknown search strategy {strategy!r}; expected one of {', '.join(STRATEGIES)}")
    kernel = Kernel(source, name, Options(threads=threads), records=False)
    kernel.signature(sizes)  # ShapeError naming a missing size
    sizes = {n: int(sizes[n]) for n in kernel.checked.sizes}
    target = host_target()
    threads = resolve_options(kernel.options, target).threads
    constants = tuple(sorted(constants))
    key = records.record_key(source, kernel.name, sizes, target, threads, constants)
    base = MeasureJob(source, kernel.name, tuple(sorted(sizes.items())), threads, "", seed, constants)
    reference = outputs(base)  # raises for a def the default options cannot compile
    choices = space(kernel, target)
    if strategy == "model":
        search = ModelSearch(choices, seed, history=history(target, threads, exclude=key) if transfer else (),
                             kernel=kernel.checked)
    else:
        search = STRATEGIES[strategy](choices, seed)
    measure = _ray_measurer(ray) if ray else _local_measurer(processes or target.cores)
    started = time.monotonic()
    result = TuneResult(kernel.name, sizes, float("inf"), float("inf"), "")
    measured: list = []
    while time.monotonic() - started < budget and (trials is None or len(measured) < trials):
        wanted = ROUND if trials is None else min(ROUND, trials - len(measured))
        proposals = search.propose(wanted, measured)
        if not proposals:
            break
        jobs = [MeasureJob(source, kernel.name, base.sizes, threads, _spec(p), seed, constants) for p in proposals]
        for fields, job, outcome in zip(proposals, jobs, measure(jobs, reference)):
            measured.append((fields, outcome["median"] if outcome["ok"] else None))
            record = dict(key=key, source=source, name=kernel.name, sizes=sizes, target=target.key(),
                          cpu=target.cpu, version=records.polyc_version(), threads=threads,
                          constants=list(constants), options=job.spec, default=job.spec == "", strategy=strategy,
                          time=records.now(), **outcome)
            result.records.append(record)
            if write:
                records.append(record)
            if outcome["ok"]:
                if job.spec == "":
                    result.default_seconds = outcome["median"]
                if outcome["median"] < result.best_seconds:
                    result.best_seconds, result.best_spec = outcome["median"], job.spec
            result.history.append((time.monotonic() - started, result.best_seconds))
            debug.log(f"tune {kernel.name}: [{job.spec or 'default'}] "
                      + (f"{outcome['median'] * 1e3:.3f} ms" if outcome["ok"] else outcome["error"]))
    if result.default_seconds == float("inf"):
        raise PolycError(f"tuning {kernel.name}: the default options did not run within the budget",
                         hint="give a larger budget")
    # the confirmation: the best and the default measured again, alternately (a search's best is also the
    # candidate whose one measurement was luckiest); only its records are ever applied (records.best)
    if result.best_spec:
        pair = [MeasureJob(source, kernel.name, base.sizes, threads, spec, seed, constants)
                for spec in ("", result.best_spec)]
        times = {"": [], result.best_spec: []}
        for _ in range(CONFIRM):
            for job, outcome in zip(pair, measure(pair, reference)):
                if outcome["ok"]:
                    times[job.spec].append(outcome["median"])
        medians = {spec: sorted(t)[len(t) // 2] if t else float("inf") for spec, t in times.items()}
        for spec, median in medians.items():
            record = dict(key=key, source=source, name=kernel.name, sizes=sizes, target=target.key(),
                          cpu=target.cpu, version=records.polyc_version(), threads=threads,
                          constants=list(constants), options=spec, default=spec == "", strategy=strategy,
                          time=records.now(), seconds=times[spec],
                          median=None if median == float("inf") else median, ok=median != float("inf"),
                          error="" if median != float("inf") else "failed in the confirmation", final=True)
            result.records.append(record)
            if write:
                records.append(record)
        result.default_seconds, result.best_seconds = medians[""], medians[result.best_spec]
        if result.best_seconds >= result.default_seconds:
            result.best_spec, result.best_seconds = "", result.default_seconds
    return result


#: The most recent history rows the model-based search fits (a forest's fit grows with them).
HISTORY_ROWS = 4000


def history(target, threads: int, exclude: str | None = None, path=None) -> list:
    """The records of other kernels (keys other than ``exclude``) measured on ``target`` with ``threads``, any
    polyc version, as :func:`polyc.tune.search.history_rows` (the model's training rows: options and kernel
    features, log of the time relative to the kernel's default); the :data:`HISTORY_ROWS` most recent. Keys
    without a timed default, records whose options no longer parse and defs that no longer compile are
    skipped. ``path``: the records file (default :func:`polyc.runtime.records.records_path`)."""
    by_key: dict = {}
    for record in records.read(path):
        if record.get("target") == target.key() and record.get("threads") == threads and "options" in record \
                and record.get("key") != exclude:
            by_key.setdefault(record["key"], []).append(record)
    lanes = max(1, target.vector_bits // 32)
    rows: list = []
    for group in sorted(by_key.values(), key=lambda g: max(r.get("time", 0) for r in g), reverse=True):
        try:
            checked = Kernel(group[0]["source"], group[0]["name"], records=False).checked
        except (PolycError, KeyError, TypeError):
            continue
        measured = []
        for record in group:
            try:
                measured.append((Options.from_spec(record["options"]), record["median"] if record.get("ok") else None))
            except (PolycError, TypeError):
                continue
        if any(o == Options() and t for o, t in measured):
            rows += history_rows(measured, lanes, checked)
        if len(rows) >= HISTORY_ROWS:
            break
    return rows[:HISTORY_ROWS]


def _spec(fields: dict) -> str:
    return Options(**fields).to_spec()


def _local_measurer(processes: int):
    """Compile a round in worker processes at once, then time each candidate here, one after the other."""
    def measure(jobs: list, reference: list) -> list:
        failed = {}
        compiled = run_jobs(compile_or_error, jobs, processes)
        for job, error in zip(jobs, compiled):
            if error:
                failed[job.spec] = error
        return [dict(seconds=[], median=None, ok=False, error=failed[job.spec]) if job.spec in failed
                else time_candidate(job, reference) for job in jobs]
    return measure


def _ray_measurer(address: str):
    """Each candidate a Ray task holding all the CPUs of the smallest node (one measurement per node at once)."""
    try:
        import ray
    except ImportError:
        raise PolycError("tuning on Ray needs the ray package", hint="pip install polyc[tune]") from None
    if not ray.is_initialized():
        ray.init(address=None if address == "local" else address, ignore_reinit_error=True)
    cpus = min((node["Resources"].get("CPU", 1) for node in ray.nodes() if node.get("Alive")), default=1)
    remote = ray.remote(num_cpus=cpus)(time_candidate)

    def measure(jobs: list, reference: list) -> list:
        ref = ray.put(reference)
        return ray.get([remote.remote(job, ref) for job in jobs])
    return measure


def best_record(source: str, sizes: dict, name: str | None = None, threads: int | None = None) -> dict | None:
    """The record :func:`polyc.define` would apply to the def ``name`` of ``source`` at ``sizes`` with
    ``threads`` (default as it resolves them) on this target and polyc version, or None."""
    kernel = Kernel(source, name, Options(threads=threads), records=False)
    threads = resolve_options(kernel.options, kernel.target).threads
    return records.best(records.record_key(source, kernel.name, {n: int(sizes[n]) for n in kernel.checked.sizes},
                                           kernel.target, threads))


def show(path=None) -> str:
    """The records as a markdown table, per kernel the default and the best candidate (from the confirmation
    that ends a search when there is one): def, sizes, CPU, threads, default ms, best ms, gain, the best
    options, the candidates measured."""
    by_key: dict = {}
    for record in records.read(path):
        if record.get("ok"):
            by_key.setdefault(record["key"], []).append(record)
    lines = ["| def | sizes | cpu | threads | default ms | best ms | gain | best options | candidates |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: |"]
    for group in by_key.values():
        final = [r for r in group if r.get("final")]
        decided = final or group  # a search's confirmation decides; without one, its single measurements
        default = min((r["median"] for r in decided if r.get("default")), default=None)
        best = min(decided, key=lambda r: r["median"])
        sizes = ",".join(f"{k}={v}" for k, v in best["sizes"].items()) or "(in the def)"
        gain = f"{default / best['median']:.2f}" if default else "-"
        lines.append(f"| {best['name']} | {sizes} | {best.get('cpu', '')} | {best['threads']} | "
                     f"{'-' if default is None else f'{default * 1e3:.3f}'} | {best['median'] * 1e3:.3f} | {gain} | "
                     f"{best['options'] or '(default)'} | {len(group)} |")
    return "\n".join(lines)
