"""The polyc command: show / run on .tc files, and clean errors (exit 1, no traceback)."""
from pathlib import Path

from polyc.cli import main

MATMUL = str(Path(__file__).resolve().parents[2] / "kernels" / "matmul.tc")


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


CONV2D = str(Path(__file__).resolve().parents[2] / "kernels" / "conv2d.tc")


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


# ---- issue 16, item 12: newcomer papercuts ------------------------------------------------------------------

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from polyc import cli  # noqa: E402
from polyc.onnx import testing  # noqa: E402


@pytest.fixture
def tiny_model(tmp_path):
    """Relu(X + Y) over float32[2, 3] as a .onnx file."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["X", "Y"], ["S"]), helper.make_node("Relu", ["S"], ["Z"])], "tiny",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 3]) for n in ("X", "Y")],
        [helper.make_tensor_value_info("Z", TensorProto.FLOAT, [2, 3])])
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return str(path)


def test_help_describes_every_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "print every compiler stage" in out and "run a def of a .tc file" in out
    assert "compile an ONNX model and print its fusion groups" in out


def test_show_on_an_onnx_model_says_what_to_use(capsys, tiny_model, tmp_path):
    assert main(["show", tiny_model]) == 1
    err = capsys.readouterr().err
    assert "is an ONNX model" in err and "polyc compile" in err and "Traceback" not in err
    binary = tmp_path / "latin1.tc"
    binary.write_bytes(b"def f(float(N) A) -> (B) { B(i) = A(i) } # \xff\xfe")
    assert main(["show", str(binary), "--sizes", "N=4"]) == 1
    assert "not a UTF-8 text file" in capsys.readouterr().err


def test_unknown_sizes_and_non_positive_runs_are_rejected(capsys):
    assert main(["show", MATMUL, "--def", "matmul", "--sizes", "M=8,N=8,K=8,Q=3", "--stage", "ast"]) == 1
    assert "matmul has no size Q; its sizes are M, K, N" in capsys.readouterr().err
    for bad in ("0", "-2", "x"):
        with pytest.raises(SystemExit) as done:
            main(["run", MATMUL, "--def", "matmul", "--sizes", "M=4,N=4,K=4", "--runs", bad])
        assert done.value.code == 2
        assert "expected a positive integer" in capsys.readouterr().err


def test_compile_show_groups_prints_each_kernels_source(capsys, tiny_model):
    assert main(["compile", tiny_model]) == 0
    plain = capsys.readouterr().out
    assert "groups" in plain and "def " not in plain
    assert main(["compile", tiny_model, "--show-groups"]) == 0
    shown = capsys.readouterr().out
    assert "# group" in shown and "def " in shown and "-> outputs Z" in shown


def test_a_feed_of_the_wrong_shape_is_reported_before_compiling(capsys, tiny_model, tmp_path):
    wrong = tmp_path / "x.npy"
    np.save(wrong, np.zeros((3, 2), np.float32))
    assert main(["run", tiny_model, "--input", f"X={wrong}"]) == 1
    captured = capsys.readouterr()
    assert "--input X: " in captured.err and "float32[3, 2], the model expects float32[2, 3]" in captured.err
    assert "compiling" not in captured.err  # rejected before the model was compiled
    assert main(["run", tiny_model, "--input", f"W={wrong}"]) == 1
    assert "unknown input 'W'; the model's inputs are X float32[2, 3], Y float32[2, 3]" in capsys.readouterr().err
    good = tmp_path / "good.npy"
    np.save(good, np.full((2, 3), -1, np.float32))
    assert main(["run", tiny_model, "--input", f"X={good}", "--bench", "1"]) == 0
    out = capsys.readouterr().out
    assert "output Z: float32[2, 3]" in out and "latency" in out
    assert "expected output" not in out  # not a bundled model: nothing to compare with


def test_bundled_model_output_is_compared_with_its_expected_output(capsys):
    path = testing.light_model_path("resnet50")
    assert cli.bundled_model_name(path) == "resnet50"
    assert cli.bundled_model_name(MATMUL) is None
    expected = testing.light_expected_output("resnet50")
    assert cli._compare_expected("resnet50", expected.copy()) == 0
    assert "matches onnx's expected output for light_resnet50.onnx" in capsys.readouterr().out
    wrong = expected.copy()
    wrong[0, 7] += 0.01
    assert cli._compare_expected("resnet50", wrong) == 1
    assert "MISMATCH: 1 of 1000 elements differ" in capsys.readouterr().out
    assert cli._compare_expected("resnet50", expected[:, :10]) == 1


def test_run_feeds_words_to_a_string_input(capsys, tmp_path):
    import re

    g = helper.make_graph([helper.make_node("StringNormalizer", ["x"], ["y"], case_change_action="UPPER")], "g",
                          [helper.make_tensor_value_info("x", TensorProto.STRING, [3])],
                          [helper.make_tensor_value_info("y", TensorProto.STRING, [3])])
    path = str(tmp_path / "strings.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["run", path, "--bench", "1"]) == 0
    printed = capsys.readouterr().out
    assert "on the host (strings): StringNormalizer 1" in printed
    words = printed.split("output y: string[3] first=")[1].splitlines()[0]
    assert re.fullmatch(r"\['[A-Z]{6}', '[A-Z]{6}', '[A-Z]{6}'\]", words)


def test_grad_writes_a_def_that_show_and_run_take(capsys, tmp_path):
    out = tmp_path / "g.tc"
    assert main(["grad", CONV2D, "--def", "conv2d_s2", "--wrt", "X,F", "-o", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("def conv2d_s2_grad(") and "-> (float32(N, C, H, W) dX, float32(M, C, KH, KW) dF)" in text
    sizes = "N=1,C=2,H=9,W=9,M=3,KH=3,KW=3,dY_2=4,dY_3=4"
    assert main(["show", str(out), "--sizes", sizes, "--stage", "ast"]) == 0
    assert "// vector" in capsys.readouterr().out
    assert main(["run", str(out), "--sizes", sizes, "--runs", "2"]) == 0
    assert "dF: float32[3, 2, 3, 3]" in capsys.readouterr().out
    assert main(["grad", CONV2D, "--def", "conv2d_s2", "--wrt", "Z"]) == 1
    assert "'Z' is not an input" in capsys.readouterr().err
