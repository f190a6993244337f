"""Printed stages of a few kernels kept as golden files: isl's schedule tree (before and after the CPU
strategy) and the isl AST. On a mismatch the test writes ``<file>.actual`` and prints the diff command;
``pytest --accept`` rewrites the golden files."""
from pathlib import Path

import pytest

import polyc
import polyc.kernels
from polyc import Options

GOLDEN = Path(__file__).resolve().parent / "golden"
#: (family, def, input shapes) — the target is fixed (AVX-512 lanes differ from AVX2), so the options pin
#: every target-derived choice: 2 threads, register tile 6 x 32
CASES = [("matmul", "matmul", [(64, 48), (48, 96)]), ("conv2d", "conv2d", [(1, 8, 10, 12), (16, 8, 3, 3)])]
OPTIONS = Options(threads=2, register_tile_sizes=(6, 32))


@pytest.mark.parametrize("family,name,shapes", CASES, ids=[c[1] for c in CASES])
@pytest.mark.parametrize("stage", ["schedule", "transformed", "ast"])
def test_stage_matches_golden(family, name, shapes, stage, accept):
    kernel = polyc.define(polyc.kernels.source(family), name, OPTIONS)
    text = kernel.specialize(*shapes).stage(stage).rstrip() + "\n"
    path = GOLDEN / f"{name}.{stage}.txt"
    if accept or not path.exists():
        path.write_text(text)
        if not accept:
            pytest.fail(f"no golden file yet: wrote {path}; check it and commit it")
        return
    expected = path.read_text()
    if text != expected:
        actual = path.with_suffix(".actual")
        actual.write_text(text)
        pytest.fail(f"{name} {stage} differs from {path.name}: diff -u {path} {actual} "
                    "(run pytest --accept to take the new output)")
