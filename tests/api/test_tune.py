"""Autotuning (polyc/tune): candidates checked against the default, records that replay, the Ray path."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import polyc
import polyc.tune as tune
from polyc.cli import main
from polyc.kernel import Kernel, tuned_options
from polyc.options import Options
from polyc.runtime import records
from polyc.target import host_target
from polyc.tune.measure import MeasureJob, outputs, time_candidate
from polyc.tune.search import Evolution, ModelSearch, RandomSearch, options_of, space, spec_of

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
SIZES = {"M": 48, "K": 37, "N": 64}


@pytest.fixture
def record_file(tmp_path, monkeypatch):
    path = tmp_path / "records.jsonl"
    monkeypatch.setenv("POLYC_TUNING_RECORDS", str(path))
    return path


def test_the_search_starts_from_the_default_and_never_repeats_a_candidate():
    choices = space(Kernel(MATMUL), host_target())
    for search in (RandomSearch(choices, seed=1), Evolution(choices, seed=1), ModelSearch(choices, seed=1)):
        first = search.propose(4, [])
        assert first[0] == {} and len({spec_of(f) for f in first}) == 4
        measured = [(f, 1e-3 * (i + 1)) for i, f in enumerate(first)]
        more = search.propose(6, measured)
        measured += [(f, 1e-3) for f in more]
        more += search.propose(6, measured)  # the model-based search fits its model from here on
        specs = [spec_of(f) for f in first + more]
        assert len(specs) == len(set(specs)) == 16
        for fields in more:  # every candidate is valid Options and round-trips as a spec
            assert Options.from_spec(spec_of(fields)) == Options(**fields)


def test_the_model_based_search_learns_which_genes_pay():
    """On a made-up cost (:func:`_toy_cost`) the model, fitted to its own 24 measurements, ranks a pool of fresh
    random draws with the candidates that carry all three paying genes near the top (mean position under 0.35
    of the pool, over six seeds; random order: 0.5, standard error about 0.04), and proposes the failing
    fusion=min at most once a round (its random draw)."""
    choices = space(Kernel(MATMUL), host_target())
    positions, proposed = [], []
    for seed in range(6):
        search, measured = ModelSearch(choices, seed=seed), []
        while len(measured) < 24:
            batch = search.propose(4, measured)
            proposed += batch if len(measured) >= ModelSearch.SAMPLE else []
            measured += [(f, _toy_cost(f)) for f in batch]
        draws = RandomSearch(choices, seed=100 + seed)
        ranked = search.rank([draws._draw() for _ in range(300)], [(search.seen[spec_of(f)], t) for f, t in measured])
        positions += [k / len(ranked) for k, g in enumerate(ranked) if _toy_good(options_of(g))]
    assert len(positions) > 30 and sum(positions) / len(positions) < 0.35
    assert sum(f.get("fusion") == "min" for f in proposed) <= 6 * 4


GEMV = "def gemv(float(N,K) W, float(K) x) -> (y) { y(n) +=! W(n,k) * x(k) }"


def _toy_cost(fields):
    """A made-up cost: tiling off, promotion off and unroll 16 each pay; fusion=min fails (no time)."""
    if fields.get("fusion") == "min":
        return None
    return ((1.5 if fields.get("tile", True) else 1.0) * (1.2 if fields.get("promote") is not False else 1.0)
            * (1.0 if fields.get("unroll") == 16 else 1.3))


def _toy_good(fields):
    return fields.get("tile") is False and fields.get("promote") is False and fields.get("unroll") == 16


def test_history_is_the_records_of_other_kernels_on_this_target(record_file):
    """tune.history: rows of every other key measured on this target with these threads (times relative to
    that key's default, a failed candidate above the slowest); not the excluded key, another thread count or
    another target; records that no longer parse are skipped."""
    target = host_target()
    common = dict(target=target.key(), cpu=target.cpu, version="0", constants=[], ok=True, time=1.0)
    for key, source, name, threads, tkey in (("a", GEMV, "gemv", 1, target.key()), ("b", MATMUL, "mm", 1, target.key()),
                                             ("c", GEMV, "gemv", 2, target.key()), ("d", GEMV, "gemv", 1, "other")):
        for spec, median in (("", 2e-3), ("unroll=16", 1e-3), ("tile=0", 4e-3), ("fusion=min", None)):
            records.append(dict(common, key=key, source=source, name=name, threads=threads, options=spec,
                                default=spec == "", median=median, ok=median is not None, target=tkey))
    records.append(dict(common, key="a", source=GEMV, name="gemv", threads=1, options="nonsense=1", median=1e-3))
    rows = tune.history(target, 1, exclude="b")
    assert [round(float(np.exp(y)), 6) for _, y in rows] == [1.0, 0.5, 2.0, 4.0]  # 2x the slowest ratio
    width = len(rows[0][0])
    assert all(len(x) == width for x, _ in rows)
    assert len(tune.history(target, 1)) == 8 and tune.history(target, 2, exclude="c") == []


def test_history_from_other_kernels_guides_the_model_from_its_second_round():
    """Transfer: with another kernel's measurements as history (on :func:`_toy_cost`), the model ranks from the
    second round on, after the default and three random draws, and already then puts the candidates with the
    three paying genes near the top of a pool of fresh draws (mean position under 0.35, over six seeds)."""
    target = host_target()
    lanes = max(1, target.vector_bits // 32)
    other = Kernel(GEMV)
    pool = [{}] + RandomSearch(space(other, target), seed=99).propose(60, [])[1:]
    history = tune.search.history_rows([(Options(**f), _toy_cost(f)) for f in pool], lanes, other.checked)
    choices = space(Kernel(MATMUL), target)
    positions = []
    for seed in range(6):
        search = ModelSearch(choices, seed=seed, history=history, kernel=Kernel(MATMUL).checked)
        measured = [(f, _toy_cost(f)) for f in search.propose(4, [])]
        assert len(search.propose(4, measured)) == 4  # ranked: the model is fitted from the second round
        draws = RandomSearch(choices, seed=100 + seed)
        ranked = search.rank([draws._draw() for _ in range(300)], [(search.seen[spec_of(f)], t) for f, t in measured])
        positions += [k / len(ranked) for k, g in enumerate(ranked) if _toy_good(options_of(g))]
    assert len(positions) > 30 and sum(positions) / len(positions) < 0.35


def test_the_default_search_is_the_model_with_history_and_genetic_without_scikit_learn(record_file, monkeypatch):
    """tune() without a strategy: the model-based search, given the records of the other kernels on this target
    as history (the GEMV's, not the tuned def's own); without scikit-learn the genetic search."""
    target = host_target()
    for spec, median in (("", 2e-3), ("unroll=16", 1e-3)):
        records.append(dict(key="other", source=GEMV, name="gemv", sizes={}, target=target.key(), cpu=target.cpu,
                            version="0", threads=1, constants=[], options=spec, default=spec == "", ok=True,
                            median=median, time=1.0))
    seen = []
    original = ModelSearch.__init__

    def spy(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append((len(self.history), self.kernel.name))
    monkeypatch.setattr(ModelSearch, "__init__", spy)
    result = tune.tune(MATMUL, SIZES, trials=2, threads=1, processes=1, write=False)
    assert seen == [(2, "mm")] and all(r["strategy"] == "model" for r in result.records)
    tune.tune(MATMUL, SIZES, trials=1, threads=1, processes=1, write=False, transfer=False)
    assert seen[-1] == (0, "mm")
    monkeypatch.setitem(sys.modules, "sklearn", None)  # import sklearn now raises ImportError
    assert tune.default_strategy() == "evolution"
    result = tune.tune(MATMUL, SIZES, trials=2, threads=1, processes=1, write=False)
    assert all(r["strategy"] == "evolution" for r in result.records) and len(seen) == 2


def test_a_candidate_that_changes_the_result_is_not_ok():
    job = MeasureJob(MATMUL, "mm", tuple(sorted(SIZES.items())), 1, "")
    reference = outputs(job)
    assert time_candidate(job, reference)["ok"]
    wrong = [reference[0] + 1e-2 * np.abs(reference[0]).max()]
    outcome = time_candidate(MeasureJob(MATMUL, "mm", job.sizes, 1, "unroll=0"), wrong)
    assert not outcome["ok"] and "differs" in outcome["error"] and outcome["median"] is None


def test_tuning_writes_records_that_replay_and_are_applied(record_file):
    """Every candidate is a record; the confirmed best (when it beats the default) is what define() then
    compiles with, in a new process too; its options replay by hand; records are keyed by target and threads."""
    result = tune.tune(MATMUL, SIZES, budget=60, trials=8, threads=1)
    lines = [json.loads(line) for line in record_file.read_text().splitlines()]
    assert len(lines) == len(result.records) and lines[0]["default"] and lines[0]["options"] == ""
    assert {r["key"] for r in lines} == {records.record_key(MATMUL, "mm", SIZES, host_target(), 1)}
    assert all(r["version"] == records.polyc_version() and r["target"] == host_target().key() for r in lines)
    assert len([r for r in lines if r.get("final")]) in (0, 2)  # the confirmation: default and best
    for r in lines:
        if r["ok"]:
            Options.from_spec(r["options"])  # every record replays
    assert result.best_seconds <= result.default_seconds
    kernel = Kernel(MATMUL, options=Options(threads=1))
    chosen = tuned_options(MATMUL, "mm", SIZES, kernel.target, kernel.options)
    expected = Options.from_spec(result.best_spec).replace(threads=1) if result.best_spec else kernel.options
    assert chosen == expected
    assert tuned_options(MATMUL, "mm", SIZES, kernel.target, kernel.options.replace(threads=2)).replace(threads=1) \
        == kernel.options  # another thread count: another key, no record
    assert tuned_options(MATMUL, "mm", SIZES, kernel.target, Options(threads=1, unroll=4)) == \
        Options(threads=1, unroll=4)  # options the user chose are never replaced
    code = ("import polyc.kernel as k, polyc; from polyc.options import Options; "
            f"kern = k.Kernel({MATMUL!r}, options=Options(threads=1)); "
            f"print(k.tuned_options({MATMUL!r}, 'mm', {SIZES!r}, kern.target, kern.options).to_spec())")
    replayed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ,
                              check=True).stdout.strip()
    assert replayed == expected.to_spec()
    a = np.random.default_rng(0).standard_normal((48, 37)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((37, 64)).astype(np.float32)
    np.testing.assert_allclose(polyc.define(MATMUL, options=Options(threads=1))(a, b), a @ b, rtol=1e-4, atol=1e-4)


def test_a_kernel_with_constants_is_tuned_as_a_model_runs_it(record_file):
    """With ``constants`` (a model's weights) every candidate is compiled to take them packed and timed on a
    copy packed once, as the model's executor runs it; the records say so and are keyed by them, apart from
    the same def's records with every input fed."""
    result = tune.tune(MATMUL, SIZES, trials=3, threads=1, constants=("B",), processes=1)
    lines = [json.loads(line) for line in record_file.read_text().splitlines()]
    assert lines and all(r["constants"] == ["B"] for r in lines)
    keyed = records.record_key(MATMUL, "mm", SIZES, host_target(), 1, ("B",))
    assert {r["key"] for r in lines} == {keyed} != {records.record_key(MATMUL, "mm", SIZES, host_target(), 1)}
    assert result.default_seconds > 0 and all(r["ok"] for r in result.records)
    compiled = Kernel(MATMUL, options=Options(threads=1)).specialize_sizes(SIZES, constants=frozenset({"B"}))
    assert compiled.inputs[1].packed  # the strategy packs the weights: the timed code reads the packed copy
    a = np.random.default_rng(0).standard_normal((48, 37)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((37, 64)).astype(np.float32)
    held = compiled.arguments(a, b)
    assert held[1].shape != b.shape and held[2].shape == (48, 64)
    compiled.run_pointers([x.ctypes.data for x in held])
    np.testing.assert_allclose(held[2], a @ b, rtol=1e-4, atol=1e-4)


def test_a_winning_record_is_used_by_define_and_off_switches_it(record_file, monkeypatch):
    """A confirmed record that beat the default changes what define() compiles; POLYC_TUNING_RECORDS=off
    and a record of another polyc version do not."""
    target = host_target()
    key = records.record_key(MATMUL, "mm", SIZES, target, 1)
    for spec, median in (("", 2e-3), ("unroll=0,promote=0", 1e-3)):
        records.append(dict(key=key, name="mm", options=spec, default=spec == "", ok=True, final=True,
                            median=median, sizes=SIZES, threads=1))
    kernel = polyc.define(MATMUL, options=Options(threads=1))
    a = np.ones((48, 37), np.float32)
    b = np.ones((37, 64), np.float32)
    assert kernel(a, b)[0, 0] == 37
    assert kernel.specialize_sizes(SIZES).options == Options(threads=1, unroll=0, promote=False)
    monkeypatch.setenv("POLYC_TUNING_RECORDS", "off")
    assert polyc.define(MATMUL, options=Options(threads=1)).specialize_sizes(SIZES).options == Options(threads=1)
    monkeypatch.setenv("POLYC_TUNING_RECORDS", str(record_file))
    monkeypatch.setattr(records, "polyc_version", lambda: "0.0.0-other")
    assert polyc.define(MATMUL, options=Options(threads=1)).specialize_sizes(SIZES).options == Options(threads=1)


def test_the_tune_command_and_show(record_file, tmp_path, capsys):
    source = tmp_path / "mm.tc"
    source.write_text(MATMUL)
    assert main(["tune", str(source), "--sizes", "M=16,K=16,N=16", "--trials", "4", "--threads", "1"]) == 0
    assert "mm M=16,K=16,N=16: default" in capsys.readouterr().out
    assert main(["tune", "--show"]) == 0
    table = capsys.readouterr().out
    assert "| mm | K=16,M=16,N=16 |" in table  # sizes by name


def test_the_ray_path_measures_on_a_local_cluster(record_file):
    import ray  # the test extra installs it; polyc[tune] for users
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        result = tune.tune(MATMUL, {"M": 8, "K": 8, "N": 8}, trials=4, threads=1, ray="auto")
    finally:
        ray.shutdown()
    assert len([r for r in result.records if not r.get("final")]) == 4
    assert result.records[0]["default"] and result.records[0]["ok"]
    assert all(r["ok"] or r["error"] for r in result.records)


def test_a_model_compiles_each_kernel_with_its_record(record_file, monkeypatch, tmp_path):
    """polyc.onnx.compile looks up every kernel's record: the kernel with a winning record is compiled with
    its options, the others with the model's; the record is the one of the kernel taking the model's weights as
    constants (a record of the same def fed every input, other code, is not applied); the result still
    equals onnxruntime's."""
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    import polyc.onnx as ponnx
    import polyc.program as program_module
    from polyc.onnx.api import compile_program
    from polyc.onnx.steps import constant_params

    w = np.random.default_rng(0).normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["c"]), helper.make_node("Relu", ["c"], ["y"]),
                               helper.make_node("Softmax", ["y"], ["z"], axis=-1)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 8, 7, 7])],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "cache"))  # cold: every kernel is compiled
    program = compile_program(model, Options(threads=1))
    steps = program.steps
    assert len({s.kernel.source for s in steps}) == 2
    tuned = steps[0].kernel
    weights = constant_params(program, steps[0])
    assert len(weights) == 1
    key = records.record_key(tuned.source, tuned.name, dict(steps[0].sizes), host_target(), 1, weights)
    fed = records.record_key(tuned.source, tuned.name, dict(steps[0].sizes), host_target(), 1)
    for k, winner in ((key, "unroll=0"), (fed, "unroll=4")):
        for spec, median in (("", 2e-3), (winner, 1e-3)):
            records.append(dict(key=k, options=spec, default=spec == "", ok=True, final=True, median=median))
    used = {}
    real = program_module.compile_kernel_object
    monkeypatch.setattr(program_module, "compile_kernel_object",
                        lambda job, kernel=None: used.setdefault(job.name, job.options) and real(job, kernel))
    compiled = ponnx.compile(model, Options(threads=1))
    assert used == {steps[0].kernel.name: Options(threads=1, unroll=0), steps[1].kernel.name: Options(threads=1)}
    x = np.random.default_rng(1).standard_normal((1, 4, 9, 9)).astype(np.float32)
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(compiled.run({"x": x})[0], expected, rtol=1e-4, atol=1e-5)


def test_a_revoked_record_is_not_applied_until_measured_again(record_file):
    """records.revoke: the winner written before it is no longer applied; a confirmation written after it is."""
    key = records.record_key(MATMUL, "mm", SIZES, host_target(), 1)
    for spec, median in (("", 2e-3), ("unroll=0", 1e-3)):
        records.append(dict(key=key, options=spec, default=spec == "", ok=True, final=True, median=median,
                            time=records.now()))
    assert records.best(key)["options"] == "unroll=0"
    records.revoke([key], "a test")
    assert records.best(key) is None
    later = records.now() + 1
    for spec, median in (("", 2e-3), ("unroll=4", 1e-3)):
        records.append(dict(key=key, options=spec, default=spec == "", ok=True, final=True, median=median,
                            time=later))
    assert records.best(key)["options"] == "unroll=4"


def test_the_model_check_revokes_records_that_do_not_speed_the_model_up(record_file, monkeypatch, tmp_path, capsys):
    """polyc tune MODEL.onnx ends by running the model with its kernels' new records and with the defaults;
    records that do not make the model faster (here: a ratio no model can reach) are revoked, and the model
    compiles with its default options again."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import polyc.cli as cli
    from polyc.onnx.api import compile_program
    from polyc.onnx.steps import constant_params

    w = np.random.default_rng(0).normal(0, 0.3, (8, 4, 3, 3)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 9, 9])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 7, 7])],
                              [numpy_helper.from_array(w, "w")])
    path = tmp_path / "conv.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    program = compile_program(str(path), Options(threads=1))
    step = program.steps[0]
    key = records.record_key(step.kernel.source, step.kernel.name, dict(step.sizes), host_target(), 1,
                             constant_params(program, step))
    for spec, median in (("", 2e-3), ("unroll=0", 1e-3)):
        records.append(dict(key=key, options=spec, default=spec == "", ok=True, final=True, median=median,
                            time=records.now()))
    assert records.best(key) is not None
    monkeypatch.setattr(cli, "MODEL_CHECK_MAX_RATIO", 0.0)
    monkeypatch.setattr(cli, "MODEL_CHECK_RUNS", 2)
    cli._check_tuned_model(str(path), Options(threads=1), [key])
    assert "records revoked" in capsys.readouterr().out
    assert records.best(key) is None
