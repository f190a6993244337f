"""Ahead-of-time export (polyc/export.py, polyc/onnx/export.py): C programs built with the system C compiler
against the exported libraries give what polyc gives in-process, and the libraries need no Python."""
import subprocess

import numpy as np
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc
import polyc.onnx as ponnx
from polyc.cli import main
from polyc.export import C_TYPES, export_kernel
from polyc.onnx.export import export_model

MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"
GATHER = "def gather(float(N) A, int32(M) I) -> (B) { B(i) = A(I(i)) }"


def _kernel_driver(lib, workdir):
    """A C program calling the exported kernel on inputs read from files ``argv[1..]`` and writing each output
    to ``out<k>.bin``; exits with the status."""
    loads = "\n".join(f"    {C_TYPES[t.dtype]} *a{i} = load(argv[{1 + i}], {t.nbytes});"
                      for i, t in enumerate(lib.inputs))
    outs = "\n".join(f"    {C_TYPES[t.dtype]} *o{k} = malloc({t.nbytes});" for k, t in enumerate(lib.outputs))
    args = ", ".join([f"a{i}" for i in range(len(lib.inputs))] + [f"o{k}" for k in range(len(lib.outputs))])
    saves = "\n".join(f'    save("out{k}.bin", o{k}, {t.nbytes});' for k, t in enumerate(lib.outputs))
    return _build(lib, workdir, f"""{loads}
{outs}
    int status = {lib.name}({args});
{saves}
    return status;""")


def _model_driver(lib, workdir, workspace_offset=0):
    """A C program running the exported model twice (one workspace, reused) on inputs from files."""
    loads = "\n".join(f"    inputs[{i}] = load(argv[{1 + i}], {t.nbytes});" for i, t in enumerate(lib.inputs))
    outs = "\n".join(f"    outputs[{k}] = malloc({t.nbytes});" for k, t in enumerate(lib.outputs))
    saves = "\n".join(f'    save("out{k}.bin", outputs[{k}], {t.nbytes});' for k, t in enumerate(lib.outputs))
    return _build(lib, workdir, f"""    const void *inputs[{max(1, len(lib.inputs))}];
    void *outputs[{len(lib.outputs)}];
{loads}
{outs}
    char *workspace = aligned_alloc(64, {lib.name}_workspace_bytes() + 64);
    int status = {lib.name}_run(inputs, outputs, workspace + {workspace_offset});
    if (status == 0) status = {lib.name}_run(inputs, outputs, workspace + {workspace_offset});
    if (status == 0) status = {lib.name}_run(inputs, NULL, workspace) == {lib.name.upper()}_BAD_ARGUMENT ? 0 : 99;
{saves}
    return status;""")


def _build(lib, workdir, body):
    source = workdir / "main.c"
    source.write_text(f"""#include <stdio.h>
#include <stdlib.h>
#include "{lib.header.name}"

static void *load(const char *path, size_t n) {{
    void *p = malloc(n ? n : 1);
    FILE *f = fopen(path, "rb");
    if (!f || fread(p, 1, n, f) != n) exit(98);
    fclose(f);
    return p;
}}

static void save(const char *path, const void *p, size_t n) {{
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}}

int main(int argc, char **argv) {{
    (void)argc;
{body}
}}
""")
    program = workdir / "main"
    subprocess.run(["cc", "-std=c11", "-O1", str(source), "-I", str(lib.header.parent), "-L", str(lib.library.parent),
                    f"-l{lib.name}", f"-Wl,-rpath,{lib.library.parent}", "-o", str(program)], check=True)
    return program


def _run(program, lib, arrays, workdir):
    """Run ``program`` on ``arrays`` (written to files); returns (exit status, outputs as numpy arrays)."""
    paths = []
    for i, a in enumerate(arrays):
        paths.append(workdir / f"in{i}.bin")
        np.ascontiguousarray(a).tofile(paths[-1])
    done = subprocess.run([str(program), *map(str, paths)], cwd=workdir, capture_output=True, text=True)
    outputs = [np.fromfile(workdir / f"out{k}.bin", dtype=np.dtype(t.dtype)).reshape(t.shape)
               for k, t in enumerate(lib.outputs)]
    return done.returncode, outputs


def _needs_no_python(lib):
    linked = subprocess.run(["ldd", str(lib.library)], capture_output=True, text=True).stdout
    assert "python" not in linked.lower() and "libc.so" in linked, linked
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib.library)], capture_output=True,
                              text=True).stdout.split()
    assert {s for s in exported if len(s) > 1 and not s.isupper() and not s[0].isdigit()} <= \
        {lib.name, f"{lib.name}_run", f"{lib.name}_workspace_bytes"}, exported


@pytest.mark.parametrize("sizes", [dict(M=1, K=1, N=1), dict(M=5, K=7, N=37), dict(M=64, K=33, N=100)])
def test_an_exported_kernel_run_from_c_equals_polyc_and_numpy(tmp_path, sizes):
    lib = export_kernel(MATMUL, sizes, tmp_path / "lib", options=polyc.Options(threads=2))
    assert lib.name == "mm" and "int mm(const float *A, const float *B, float *C);" in lib.header.read_text()
    _needs_no_python(lib)
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (sizes["M"], sizes["K"])).astype(np.float32)
    b = rng.uniform(-1, 1, (sizes["K"], sizes["N"])).astype(np.float32)
    status, (c,) = _run(_kernel_driver(lib, tmp_path), lib, [a, b], tmp_path)
    assert status == 0
    np.testing.assert_array_equal(c, polyc.define(MATMUL, options=polyc.Options(threads=2))(a, b))
    np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)


def test_an_exported_kernel_returns_the_status_of_an_index_out_of_range(tmp_path):
    lib = export_kernel(GATHER, {"N": 4, "M": 3}, tmp_path / "lib")
    program = _kernel_driver(lib, tmp_path)
    a = np.arange(4, dtype=np.float32)
    status, (b,) = _run(program, lib, [a, np.array([3, 0, 2], np.int32)], tmp_path)
    assert status == 0 and b.tolist() == [3.0, 0.0, 2.0]
    status, _ = _run(program, lib, [a, np.array([1, 4, 0], np.int32)], tmp_path)
    assert status == 1  # GATHER_INDEX_OUT_OF_RANGE, nothing read out of bounds


def _small_cnn():
    rng = np.random.default_rng(1)
    w1 = rng.normal(0, 0.3, (8, 3, 3, 3)).astype(np.float32)
    w2 = rng.normal(0, 0.3, (16, 8, 1, 1)).astype(np.float32)
    fc = rng.normal(0, 0.3, (16, 5)).astype(np.float32)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p1", "w2"], ["c2"]),
             helper.make_node("GlobalAveragePool", ["c2"], ["g"]),
             helper.make_node("Flatten", ["g"], ["f"]),
             helper.make_node("MatMul", ["f", "fc"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 12, 12])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5]),
                               helper.make_tensor_value_info("p1", TensorProto.FLOAT, [2, 8, 6, 6])],
                              [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2"),
                               numpy_helper.from_array(fc, "fc")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _attention_block():
    rng = np.random.default_rng(2)
    d = 16
    weights = {n: rng.normal(0, 0.25, (d, d)).astype(np.float32) for n in ("wq", "wk", "wv")}
    scale, bias = np.ones(d, np.float32), np.zeros(d, np.float32)
    nodes = [helper.make_node("MatMul", ["x", "wq"], ["q"]), helper.make_node("MatMul", ["x", "wk"], ["k"]),
             helper.make_node("MatMul", ["x", "wv"], ["v"]),
             helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Add", ["s", "mask"], ["sm"]),
             helper.make_node("Softmax", ["sm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["a"]),
             helper.make_node("Add", ["a", "x"], ["h"]),
             helper.make_node("LayerNormalization", ["h", "scale", "bias"], ["y"], axis=-1)]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, d]),
                                               helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2, 1, 7])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, d])],
                              [numpy_helper.from_array(v, n) for n, v in weights.items()]
                              + [numpy_helper.from_array(scale, "scale"), numpy_helper.from_array(bias, "bias")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("build", [_small_cnn, _attention_block])
def test_an_exported_model_run_from_c_equals_polyc_in_process(tmp_path, build):
    """The library's outputs (two runs on one reused workspace) are bit for bit those of the compiled model in
    this process, and match onnxruntime; a NULL outputs array is refused with status 3."""
    model = build()
    lib = export_model(model, tmp_path / "lib", name="net", options=polyc.Options(threads=2))
    _needs_no_python(lib)
    text = lib.header.read_text()
    assert "size_t net_workspace_bytes(void);" in text and "#define NET_NUM_INPUTS" in text
    rng = np.random.default_rng(3)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    if "mask" in feeds:
        feeds["mask"] = np.where(rng.random(feeds["mask"].shape) < 0.3, -1e4, 0).astype(np.float32)
    status, outputs = _run(_model_driver(lib, tmp_path), lib, [feeds[t.name] for t in lib.inputs], tmp_path)
    assert status == 0
    compiled = ponnx.compile(model, polyc.Options(threads=2))
    expected = onnxruntime.InferenceSession(model.SerializeToString()).run(None, feeds)
    for got, mine, theirs in zip(outputs, compiled.run(feeds), expected):
        np.testing.assert_array_equal(got, mine)
        np.testing.assert_allclose(got, theirs, rtol=1e-4, atol=1e-5)


def test_a_misaligned_workspace_is_refused(tmp_path):
    lib = export_model(_small_cnn(), tmp_path / "lib", name="net")
    x = np.zeros((2, 3, 12, 12), np.float32)
    status, _ = _run(_model_driver(lib, tmp_path, workspace_offset=8), lib, [x], tmp_path)
    assert status == 3  # NET_BAD_ARGUMENT


def test_the_export_command_writes_the_library(tmp_path, capsys):
    source = tmp_path / "ops.tc"
    source.write_text(MATMUL + "\ndef relu(float(M,N) X) -> (Y) { Y(m,n) = max(X(m,n), 0.0) }\n")
    assert main(["export", str(source), "--def", "relu", "--sizes", "M=3,N=5", "-o", str(tmp_path / "out"),
                 "--name", "my relu"]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(tmp_path / "out" / n) for n in ("libmy_relu.so", "my_relu.o", "my_relu.h")]
    assert main(["export", str(source), "-o", str(tmp_path / "out2")]) == 1
    assert "defines 2 kernels" in capsys.readouterr().err


def test_without_a_c_compiler_the_export_says_what_is_missing(tmp_path, monkeypatch):
    monkeypatch.setenv("CC", "no-such-compiler-polyc")
    with pytest.raises(polyc.PolycError, match="needs a C compiler.*no-such-compiler-polyc"):
        export_kernel(MATMUL, dict(M=2, K=2, N=2), tmp_path)


GENERIC_DRIVER = """    int64_t M = atol(argv[3]), K = atol(argv[4]), N = atol(argv[5]);
    if (mm_extent(M, K, N, 2, 0) != M || mm_extent(M, K, N, 2, 1) != N) return 97;
    float *A = load(argv[1], sizeof(float) * M * K), *B = load(argv[2], sizeof(float) * K * N);
    float *C = malloc(sizeof(float) * M * N);
    int status = mm(A, B, C, M, K, N);
    if (status == 0) save("out0.bin", C, sizeof(float) * M * N);
    if (status == 0) status = mm(A, B, C, 0, K, N) == MM_BAD_ARGUMENT ? 0 : 96;
    return status;"""


def test_a_generic_kernel_exported_serves_every_size_from_c(tmp_path):
    """``export_generic_kernel``: one library, the sizes as arguments; a C driver runs it at sizes of 1, primes
    and larger than the hint, bit for bit what polyc's generic kernel gives in-process; sizes the kernel does
    not serve are BAD_ARGUMENT; no Python in the library."""
    from polyc.export import export_generic_kernel
    hint = dict(M=32, K=16, N=48)
    lib = export_generic_kernel(MATMUL, hint, tmp_path / "lib", options=polyc.Options(threads=2))
    header = lib.header.read_text()
    assert "int mm(const float *A, const float *B, float *C, int64_t M, int64_t K, int64_t N);" in header
    exported = subprocess.run(["nm", "-D", "--defined-only", str(lib.library)], capture_output=True,
                              text=True).stdout.split()
    assert {s for s in exported if len(s) > 1 and not s.isupper() and not s[0].isdigit()} == {"mm", "mm_extent"}
    assert "python" not in subprocess.run(["ldd", str(lib.library)], capture_output=True, text=True).stdout.lower()
    program = _build(lib, tmp_path, GENERIC_DRIVER)
    generic = polyc.define(MATMUL, options=polyc.Options(generic=True, threads=2)).generic(hint)
    rng = np.random.default_rng(5)
    for m, k, n in ((1, 1, 1), (7, 13, 31), (64, 17, 100), (33, 48, 5)):
        a = rng.uniform(-1, 1, (m, k)).astype(np.float32)
        b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
        a.tofile(tmp_path / "a.bin")
        b.tofile(tmp_path / "b.bin")
        done = subprocess.run([str(program), str(tmp_path / "a.bin"), str(tmp_path / "b.bin"), str(m), str(k),
                               str(n)], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, (m, k, n, done.returncode, done.stderr)
        got = np.fromfile(tmp_path / "out0.bin", dtype=np.float32).reshape(m, n)
        np.testing.assert_array_equal(got, generic(a, b))
        np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
