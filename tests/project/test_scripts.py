"""Smoke tests of the benchmark and research scripts: each runs in a subprocess on small sizes and its
printed markdown table is parsed and checked for the expected rows, columns and correctness checks.

No timings are asserted (they depend on the machine and on its load); only that the numbers are there,
positive and consistent (speedup = source-order time / variant time).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


def run_script(*args, timeout=180) -> subprocess.CompletedProcess:
    env = dict(os.environ, POLYC_CACHE_DIR="off")
    return subprocess.run([sys.executable, *map(str, args)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def first_table(text: str) -> tuple[list[str], list[dict]]:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("| ---"):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            rows = []
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                cells = [c.strip() for c in row.strip().strip("|").split("|")]
                assert len(cells) == len(header), f"ragged row: {row!r}"
                rows.append(dict(zip(header, cells)))
            return header, rows
    raise AssertionError(f"no markdown table in:\n{text}")


def number(cell: str) -> float:
    return float(cell.rstrip("x%"))


@pytest.fixture(scope="module")
def compare_matmul():
    return run_script(SCRIPTS / "compare_schedules.py", "kernels/matmul.tc", "--def", "matmul",
                      "--sizes", "M=24,N=20,K=16", "--runs", "1")


def test_compare_schedules_prints_every_variant(compare_matmul):
    result = compare_matmul
    assert result.returncode == 0, result.stderr
    header, rows = first_table(result.stdout)
    assert header == ["variant", "options", "compile ms", "ms", "GFLOP/s", "speedup", "check"]
    names = [r["variant"] for r in rows]
    assert names == ["source order", "isl", "+ tile", "+ register tile", "+ vectorize", "+ promote", "+ parallel",
                     "fusion=max", "fusion=min", "tile 32x32x32", "tile 64x64x128", "tile 128x256x256"]
    assert rows[0]["check"] == "reference"
    assert all(r["check"] == "ok" for r in rows[1:]), rows
    assert "scheduler=identity" in rows[0]["options"]
    assert rows[1]["options"] == "`tile=0,register_tile=0,vectorize=0,parallel=0,unroll=0,promote=0`"
    assert rows[6]["options"] == "`(default)`"
    assert rows[-1]["options"] == "`tile_sizes=128x256x256`"


def test_compare_schedules_numbers_are_consistent(compare_matmul):
    _, rows = first_table(compare_matmul.stdout)
    base = number(rows[0]["ms"])
    assert number(rows[0]["speedup"]) == 1.0
    for r in rows:
        ms, gflops, speedup = number(r["ms"]), number(r["GFLOP/s"]), number(r["speedup"])
        assert ms > 0 and gflops > 0 and speedup > 0
        # the flop count is derived from the def: 2*M*N*K for matmul
        assert gflops == pytest.approx(2 * 24 * 20 * 16 / (ms * 1e-3) / 1e9, rel=0.05, abs=0.01)
        assert speedup == pytest.approx(base / ms, rel=0.05, abs=0.01)
    assert "M=24, N=20, K=16" in compare_matmul.stdout
    assert "flops: 1.536e+04 (derived from the def)" in compare_matmul.stdout


def test_compare_schedules_flags_and_errors(tmp_path):
    result = run_script(SCRIPTS / "compare_schedules.py", "softmax", "--def", "softmax", "--sizes", "N=5,D=33",
                        "--runs", "1", "--variants", "isl,fusion=min", "--tile-sizes", "",
                        "--variant", "mine=tile_sizes=2x4,fusion=max", "--flops", "5*N*D")
    assert result.returncode == 0, result.stderr
    _, rows = first_table(result.stdout)
    assert [r["variant"] for r in rows] == ["source order", "isl", "fusion=min", "mine"]
    assert rows[-1]["options"] == "`fusion=max,tile_sizes=2x4`"
    assert all(r["check"] in ("reference", "ok") for r in rows)
    assert "(from --flops)" in result.stdout

    bad = run_script(SCRIPTS / "compare_schedules.py", "kernels/matmul.tc", "--def", "nope", "--sizes", "M=2")
    assert bad.returncode == 2 and "nope" in bad.stderr

    try:
        import matplotlib  # noqa: F401
        has_matplotlib = True
    except ImportError:
        has_matplotlib = False
    png = tmp_path / "chart.png"
    drawn = run_script(SCRIPTS / "compare_schedules.py", "kernels/matmul.tc", "--def", "matmul",
                       "--sizes", "M=8,N=8,K=8", "--runs", "1", "--variants", "isl", "--tile-sizes", "",
                       "--png", png)
    if has_matplotlib:
        assert drawn.returncode == 0, drawn.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert drawn.returncode == 2 and "matplotlib" in drawn.stderr
        assert not png.exists()


def test_fit_approximations_derives_the_inline_erf_and_tanh_tables():
    """scripts/fit_approximations.py re-derives mathlib's coefficient tables (its --check exits 1 otherwise)."""
    result = run_script(SCRIPTS / "fit_approximations.py", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    names = [line.split(" = ")[0] for line in result.stdout.splitlines()]
    assert names == ["ERF_SMALL", "ERFC_P", "ERFC_Q", "TANH_SMALL"]


def test_bench_kernels_quick_gemm():
    result = run_script(SCRIPTS / "bench_kernels.py", "--quick", "--only", "gemm", "--threads", "2")
    assert result.returncode == 0, result.stderr
    header, rows = first_table(result.stdout)
    assert header == ["kernel", "size", "threads", "peer", "polyc ms", "peer ms", "ratio", "GFLOP/s", "% of peak",
                      "compile ms", "check"]
    assert [(r["kernel"], r["size"], r["threads"]) for r in rows] == [
        ("gemm fp32", "128x128x128", "1"), ("gemm fp32", "128x128x128", "2"),
        ("gemm fp32", "256x256x256", "1"), ("gemm fp32", "256x256x256", "2")]
    for r in rows:
        assert r["peer"] == "numpy (OpenBLAS)"
        assert r["check"].split(";")[0] == "ok", r  # a note may follow, e.g. numpy slower at 2 threads
        polyc_ms, peer_ms = number(r["polyc ms"]), number(r["peer ms"])
        assert polyc_ms > 0 and peer_ms > 0
        assert number(r["ratio"]) == pytest.approx(peer_ms / polyc_ms, rel=0.1, abs=0.02)
        n = int(r["size"].split("x")[0])
        assert number(r["GFLOP/s"]) == pytest.approx(2 * n ** 3 / (polyc_ms * 1e-3) / 1e9, rel=0.1, abs=0.06)
        assert number(r["% of peak"]) >= 0
    # the peak is the FMA loop's, fp32 and fp64 at 1 and 2 threads; numpy's GEMM is a reference line
    peak_line = next(line for line in result.stdout.splitlines() if line.startswith("- peak"))
    assert "llvm.fma" in peak_line
    for figure in ("fp32 1 thread ", ", 2 threads ", "; fp64 1 thread "):
        assert figure in peak_line, peak_line
    assert "numpy SGEMM 512^3: " in result.stdout and "numpy DGEMM 512^3: " in result.stdout
    assert "Per-call overhead" not in result.stdout  # --only gemm leaves the other sections out
    # numpy's GEMM runs OpenBLAS's kernel of the instruction set polyc compiles for, whatever the environment says
    from polyc.target import host_target
    coretype = "SkylakeX" if host_target().vector_bits >= 512 else "Haswell"
    assert f"(OPENBLAS_CORETYPE={coretype}" in result.stdout


@pytest.mark.parametrize("extra", [[], ["--options", "prefetch=0,unroll=4"]])
def test_bench_kernels_quick_resnet50_convs_through_polyc_onnx(extra):
    """The ResNet-50 section, as it is and with ``--options`` on top of every row (an A/B of one decision):
    the run says which options it applied, and the rows still match onnxruntime."""
    result = run_script(SCRIPTS / "bench_kernels.py", "--quick", "--only", "resnet50", "--threads", "1", *extra)
    assert result.returncode == 0, result.stderr
    assert ("polyc options on every row: `prefetch=0,unroll=4`" in result.stdout) == bool(extra)
    _, rows = first_table(result.stdout)
    assert [r["kernel"] for r in rows] == ["resnet50 conv 1x1, 16->16", "resnet50 conv 3x3, 16->16"]
    for r in rows:
        assert r["peer"] == "onnxruntime Conv" and r["check"] == "ok", r
        assert number(r["polyc ms"]) > 0 and number(r["% of peak"]) >= 0


def test_bench_kernels_rejects_unknown_section():
    result = run_script(SCRIPTS / "bench_kernels.py", "--quick", "--only", "gemm,nope")
    assert result.returncode == 2 and "nope" in result.stderr


def test_bench_kernels_rejects_a_bad_options_spec():
    result = run_script(SCRIPTS / "bench_kernels.py", "--quick", "--only", "gemm", "--options", "prefetch=maybe")
    assert result.returncode == 2 and "--options" in result.stderr and "prefetch" in result.stderr


def test_bench_models_prints_ratios_and_where_time_goes():
    result = run_script(SCRIPTS / "bench_models.py", "--models", "squeezenet,gpt_decoder", "--tiny", "--threads", "1",
                        "--runs", "1", "--slowest", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    header, rows = first_table(result.stdout)
    assert header[:7] == ["model", "threads", "cold s", "warm s", "kernels", "arena MiB", "polyc ms"]
    assert "ratio onnxruntime/polyc" in header
    assert [r["model"] for r in rows] == ["squeezenet", "gpt_decoder"]
    for r in rows:
        assert number(r["polyc ms"]) > 0 and number(r["ratio onnxruntime/polyc"]) > 0
        assert number(r["max rel. error"]) < 1e-4  # polyc's output matches onnxruntime's
        assert 0 < number(r["FMA free"].rstrip("%")) < 1000  # the machine's share the row had, in percent
        assert 0 < number(r["memory free"].rstrip("%")) < 1000
    assert "1 thread: geometric mean of onnxruntime/polyc" in result.stdout
    assert result.stdout.count("slowest kernels") == 2
    assert "% of roofline" in result.stdout


def test_compare_schedules_adds_a_tuning_search_and_its_record(tmp_path):
    """--tune runs a search first (its records written) and adds its best; --tuned then finds the record when
    one beat the default. (--png, which also draws the search's best-so-far, needs matplotlib: the bench
    extra, not the test one.)"""
    records = tmp_path / "records.jsonl"
    env = dict(os.environ, POLYC_CACHE_DIR="off", POLYC_TUNING_RECORDS=str(records))
    args = [sys.executable, str(SCRIPTS / "compare_schedules.py"), "kernels/matmul.tc", "--def", "matmul", "--sizes",
            "M=24,N=20,K=16", "--runs", "1", "--tile-sizes", "", "--variants", "+ parallel", "--threads", "1"]
    tuned = subprocess.run(args + ["--tune", "2"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert tuned.returncode == 0, tuned.stderr
    _, rows = first_table(tuned.stdout)
    assert [r["variant"] for r in rows] == ["source order", "+ parallel", "tuned (search)"]
    assert all(r["check"] in ("reference", "ok") for r in rows)
    assert records.exists()
    again = subprocess.run(args + ["--tuned"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stderr
    names = [r["variant"] for r in first_table(again.stdout)[1]]
    assert names[-1] == "tuned (record)" or "no tuning record" in again.stderr


def test_tune_kernels_prints_gains_and_compares_searches(tmp_path):
    env = dict(os.environ, POLYC_CACHE_DIR="off", POLYC_TUNING_RECORDS=str(tmp_path / "records.jsonl"))
    run = subprocess.run([sys.executable, str(SCRIPTS / "tune_kernels.py"), "--budget", "2", "--threads", "1",
                          "--only", "atax"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr
    header, rows = first_table(run.stdout)
    assert header[:5] == ["kernel", "sizes", "default ms", "tuned ms", "gain"] and rows[0]["kernel"] == "atax"
    assert number(rows[0]["tuned ms"]) <= number(rows[0]["default ms"]) and number(rows[0]["gain"]) >= 1.0
    assert "geometric mean gain" in run.stdout
    compared = subprocess.run([sys.executable, str(SCRIPTS / "tune_kernels.py"), "--compare", "1", "--threads", "1",
                               "--only", "atax", "--seeds", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=180)
    assert compared.returncode == 0, compared.stderr
    header, rows = first_table(compared.stdout)
    assert header[0] == "kernel" and header[2] == "mean" and len(rows) == 1
    assert number(rows[0]["mean"]) >= 1.0  # a confirmed gain: the default when nothing beat it
    assert "geometric mean of the confirmed gains" in compared.stdout


def test_tune_study_measures_a_pool_and_replays_searches_on_it(tmp_path):
    """--measure writes one JSON line per candidate (the default first, each with its IR fingerprint); the replay
    prints a row per kernel: its pool, the distinct programs in it, each strategy's mean gain and their paired
    ratio with its standard error."""
    result = run_script(SCRIPTS / "tune_study.py", "--measure", "6", "--only", "atax", "--data", tmp_path,
                        "--trials", "4", "--seeds", "2", timeout=600)
    assert result.returncode == 0, result.stderr
    pools = list(tmp_path.glob("*_atax.jsonl"))
    assert len(pools) == 1
    lines = [json.loads(line) for line in pools[0].read_text().splitlines()]
    assert len(lines) == 7 and lines[0]["spec"] == "" and all(len(r["ir"]) == 16 for r in lines if r["median"])
    _, rows = first_table(result.stdout)
    assert [r["kernel"] for r in rows] == ["atax"]
    row = rows[0]
    assert number(row["candidates"]) == 7 and 1 <= number(row["distinct IR"]) <= 7
    assert number(row["best gain"]) >= 1.0 and number(row["random"]) > 0 and number(row["model"]) > 0
    ratio, error = (float(x) for x in row["model / random"].split("+-"))  # paired over the seeds
    assert ratio > 0 and error >= 0
    assert "geometric mean gain: random" in result.stdout and "standard error" in result.stdout
