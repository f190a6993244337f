"""The one pipeline (polyc/pipeline.py): each stage runs once, under the stage logger, with the verifier after
it; options resolved once; every POLYC_* variable read in polyc/env.py and documented."""
import re
from pathlib import Path

import numpy as np
import pytest

import islpy as isl

import polyc
from polyc import Options, env, pipeline
from polyc.errors import CompileError
from polyc.poly import verify

ROOT = Path(__file__).resolve().parents[2]
MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_every_environment_variable_is_read_in_env_and_documented():
    readers = {}
    for path in (ROOT / "polyc").rglob("*.py"):
        text = path.read_text()
        for line in text.splitlines():
            if re.search(r"os\.environ|getenv", line):
                readers.setdefault(path.relative_to(ROOT).as_posix(), []).append(line.strip())
    assert set(readers) == {"polyc/env.py"}, readers
    source = (ROOT / "polyc" / "env.py").read_text()
    named = set(re.findall(r'"(POLYC_[A-Z_]+)"', source))
    assert named == set(env.VARIABLES)
    readme = (ROOT / "README.md").read_text()
    for name in env.VARIABLES:
        assert f"| `{name}` |" in readme, f"{name} is not in README's table of environment variables"


def test_threads_are_resolved_once_from_the_option_the_environment_or_the_cores(monkeypatch):
    target = polyc.Kernel(MATMUL).target
    monkeypatch.delenv("POLYC_NUM_THREADS", raising=False)
    assert pipeline.resolve_options(Options(), target).threads == target.cores
    assert pipeline.resolve_options(Options(threads=3), target).threads == 3
    monkeypatch.setenv("POLYC_NUM_THREADS", "5")
    assert pipeline.resolve_options(Options(), target).threads == 5
    assert pipeline.resolve_options(Options(threads=1), target).threads == 1


def _stage_lines(err: str) -> list:
    return re.findall(r"^\[polyc\] (\w+): [0-9.]+ ms$", err, re.MULTILINE)


def test_each_stage_runs_once_and_times_itself(monkeypatch, capsys):
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")
    monkeypatch.setenv("POLYC_TIME_STAGES", "1")
    kernel = polyc.define(MATMUL)
    kernel.signature({"M": 16, "K": 8, "N": 24})  # builds the Scop, which the pipeline then starts from
    capsys.readouterr()
    a, b = np.ones((16, 8), np.float32), np.ones((8, 24), np.float32)
    np.testing.assert_array_equal(kernel(a, b), a @ b)
    assert _stage_lines(capsys.readouterr().err) == ["dependences", "schedule", "transformed", "promoted", "ast",
                                                     "llvm", "jit"]
    other = polyc.define(MATMUL.replace("mm(", "mm2("))
    other(a, b)  # no signature first: the pipeline builds the Scop itself
    assert _stage_lines(capsys.readouterr().err) == ["scop", "dependences", "schedule", "transformed", "promoted",
                                                     "ast", "llvm", "jit"]


def test_the_verifier_runs_after_the_stages_that_change_the_schedule(monkeypatch):
    seen = []
    real = verify.verify_stage

    def recording(stage, values):
        seen.append(stage)
        real(stage, values)

    monkeypatch.setenv("POLYC_VERIFY", "1")
    monkeypatch.setattr(pipeline, "verify_stage", recording)
    kernel = polyc.define(MATMUL, options=Options(promote=True))
    lowered = pipeline.lower(kernel.checked, {"M": 9, "K": 11, "N": 45}, kernel.options, kernel.target)
    assert seen == ["scop", "dependences", "schedule", "transformed", "promoted", "ast"]
    assert lowered.scop.tensor("B__p0").role == "local"  # promoted: the copy's Scop was checked too
    seen.clear()
    monkeypatch.setenv("POLYC_VERIFY", "0")
    pipeline.lower(kernel.checked, {"M": 9, "K": 11, "N": 45}, kernel.options, kernel.target)
    assert seen == []


def test_a_schedule_that_breaks_a_dependence_is_stopped_between_stages(monkeypatch):
    """The hook is the verifier: a strategy that puts a reduction's updates at one time is refused."""
    monkeypatch.setenv("POLYC_VERIFY", "1")
    recurrence = polyc.define("def pre(float(N) A) -> (S) { S(i) +=! A(j) * (j <= i ? 1.0 : 0.0) where i in 0:N, j in 0:N }")
    def collapsed_schedule(schedule, scop, deps, target, options, constants):
        # every instance at one time: a band of constant 0 orders nothing, so the reduction's updates collide
        text = "{ domain: \"%s\", child: { schedule: \"[{ %s }]\" } }" % (
            scop.domain, "; ".join(f"{s.name}[{', '.join(s.indices)}] -> [(0)]" for s in scop.statements))
        return isl.Schedule.read_from_str(schedule.get_ctx(), text), ()

    monkeypatch.setattr(pipeline, "apply_strategy", collapsed_schedule)
    with pytest.raises(CompileError, match="transformed"):
        pipeline.lower(recurrence.checked, {"N": 5}, recurrence.options, recurrence.target)


@pytest.mark.parametrize("shape", [(7, 5, 33), (64, 48, 96)])
def test_unroll_zero_unrolls_nothing_and_changes_no_result(shape):
    m, k, n = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    unrolled = polyc.define(MATMUL, options=Options(threads=1)).specialize(a, b)
    rolled = polyc.define(MATMUL, options=Options(threads=1, unroll=0)).specialize(a, b)
    multiplies = re.compile(r"= fmul ")
    copies = len(multiplies.findall(unrolled.stage("llvm")))
    assert copies > len(multiplies.findall(rolled.stage("llvm"))) >= 1  # the register tile's rows stay a loop
    np.testing.assert_allclose(rolled(a, b), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(rolled(a, b), unrolled(a, b), rtol=1e-5, atol=1e-5)
    with pytest.raises(polyc.PolycError, match="unroll"):
        Options(unroll=-1)
    assert Options.from_spec(Options(unroll=0).to_spec()).unroll == 0
