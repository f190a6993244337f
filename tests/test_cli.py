"""The polyc command: show / run on .tc files, and clean errors (exit 1, no traceback)."""
from pathlib import Path

from polyc.cli import main

MATMUL = str(Path(__file__).resolve().parent.parent / "kernels" / "matmul.tc")


def test_show_prints_every_stage(capsys):
    assert main(["show", MATMUL, "--def", "matmul", "--sizes", "M=64,N=64,K=64"]) == 0
    out = capsys.readouterr().out
    for stage in ("domain", "deps", "schedule", "transformed", "ast", "llvm", "asm"):
        assert f"==== {stage} ====" in out
    assert "S1[m, n, k]" in out and "RAW" in out and "// vector" in out and "define" in out


def test_show_one_stage(capsys):
    assert main(["show", MATMUL, "--def", "matmul", "--sizes", "M=8,N=8,K=8", "--stage", "ast"]) == 0
    out = capsys.readouterr().out
    assert "==== ast ====" in out and "==== llvm ====" not in out


def test_run_prints_a_median_time(capsys):
    assert main(["run", MATMUL, "--def", "matmul", "--sizes", "M=16,N=8,K=4", "--runs", "3"]) == 0
    out = capsys.readouterr().out
    assert "C: float32[16, 8]" in out and "median" in out


def test_errors_are_messages_not_tracebacks(capsys):
    assert main(["show", MATMUL, "--def", "matmul", "--sizes", "M=8"]) == 1
    err = capsys.readouterr().err
    assert "no value for size" in err and "Traceback" not in err
    assert main(["show", MATMUL, "--sizes", "M=8"]) == 1
    assert "matmul, matmul_tn" in capsys.readouterr().err
    assert main(["show", MATMUL, "--def", "matmul", "--sizes", "M=x"]) == 1
    assert "bad size" in capsys.readouterr().err
    assert main(["show", "/nonexistent.tc", "--def", "f"]) == 1


CONV2D = str(Path(__file__).resolve().parent.parent / "kernels" / "conv2d.tc")


def _loops(ast: str) -> dict:
    """The marks of the printed isl AST and whether it has tile loops (a loop stepping by more than 1)."""
    import re

    return {"tile": bool(re.search(r"for \(int c\d+ = .*; c\d+ \+= (?!1\))\d+\)", ast)),
            "parallel": "// parallel" in ast, "vector": "// vector" in ast, "unroll": "// unroll" in ast}


def test_show_matmul_and_conv2d_have_tile_parallel_and_vector_loops(capsys):
    # issue 4's acceptance: the tile loops, the parallel loop and the vector loop are visible in `polyc show`
    for file, name, sizes in ((MATMUL, "matmul", "M=256,N=256,K=256"),
                              (CONV2D, "conv2d", "N=1,C=32,H=30,W=30,M=64,KH=3,KW=3")):
        assert main(["show", file, "--def", name, "--sizes", sizes, "--stage", "ast",
                     "--options", "threads=2"]) == 0
        loops = _loops(capsys.readouterr().out)
        assert loops == {"tile": True, "parallel": True, "vector": True, "unroll": True}, (name, loops)
