"""Several kernels linked into one module with a generated native entry point (the ONNX execution path)."""
import os

import numpy as np
import pytest

import polyc
import polyc.program as program_module
from polyc.codegen import compile_object, load_objects
from polyc.errors import CompileError, KernelRuntimeError, PolycError
from polyc.program import KernelCall, link_program
from polyc.runtime.workers import run_jobs

MM = polyc.define("def matmul(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }")
RELU = polyc.define("def relu(float(M,N) X) -> (Y) { Y(m,n) = max(X(m,n), 0.0) }")
GATHER = polyc.define("def gather(float(N) A, int32(M) I) -> (B) { B(i) = A(I(i)) }")


def test_signature_gives_shapes_without_compiling():
    specs = MM.signature({"M": 5, "K": 4, "N": 3})
    assert [(t.name, t.shape, t.role) for t in specs] == [("A", (5, 4), "input"), ("B", (4, 3), "input"),
                                                          ("C", (5, 3), "output")]


def test_two_kernels_in_one_entry_point_share_an_arena_and_hit_the_cache():
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (7, 5)).astype(np.float32)
    b = rng.uniform(-1, 1, (5, 3)).astype(np.float32)
    arena = np.zeros(128 + 7 * 3 * 4, np.uint8)
    out = np.zeros((7, 3), np.float32)
    kernels = [(MM, {"M": 7, "K": 5, "N": 3}), (RELU, {"M": 7, "N": 3})]
    calls = [KernelCall(0, ((0, 0), (1, 0), (2, 128))), KernelCall(1, ((2, 128), (3, 0)))]
    first = link_program("two", kernels, calls, 4)
    first.run([a.ctypes.data, b.ctypes.data, arena.ctypes.data, out.ctypes.data])
    np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)
    second = link_program("two", kernels, calls, 4)
    assert second.from_cache and not first.from_cache
    out[:] = 0
    second.run([a.ctypes.data, b.ctypes.data, arena.ctypes.data, out.ctypes.data])
    np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-6)


def test_a_fault_in_one_kernel_stops_the_program():
    a = np.arange(4, dtype=np.float32)
    idx = np.array([1, 9], np.int32)
    out = np.zeros(2, np.float32)
    relu_out = np.full(2, -1, np.float32)
    program = link_program("faulty", [(GATHER, {"N": 4, "M": 2}), (RELU, {"M": 1, "N": 2})],
                           [KernelCall(0, ((0, 0), (1, 0), (2, 0))), KernelCall(1, ((2, 0), (3, 0)))], 4)
    with pytest.raises(KernelRuntimeError, match="out of range"):
        program.run([a.ctypes.data, idx.ctypes.data, out.ctypes.data, relu_out.ctypes.data])
    assert (relu_out == -1).all()  # the second kernel never ran


def _chain():
    """Three distinct kernels in a row: C = A @ B (7x5 @ 5x3), D = relu(C), E = D @ F (7x3 @ 3x4)."""
    kernels = [(MM, {"M": 7, "K": 5, "N": 3}), (RELU, {"M": 7, "N": 3}), (MM, {"M": 7, "K": 3, "N": 4})]
    calls = [KernelCall(0, ((0, 0), (1, 0), (2, 0))), KernelCall(1, ((2, 0), (2, 128))),
             KernelCall(2, ((2, 128), (3, 0), (4, 0)))]
    return kernels, calls


def _run_chain(program, a, b, f):
    arena = np.zeros(256, np.uint8)
    out = np.zeros((7, 4), np.float32)
    program.run([a.ctypes.data, b.ctypes.data, arena.ctypes.data, f.ctypes.data, out.ctypes.data])
    return out


def test_kernels_compiled_in_worker_processes_link_into_the_same_program(monkeypatch, tmp_path):
    """Above PARALLEL_MIN_KERNELS (lowered here to 2) a program's kernels compile in worker processes, each
    to an object of its own, linked when loaded: the result equals numpy's and, bit for bit, the program
    compiled kernel after kernel in this process."""
    rng = np.random.default_rng(3)
    a, b, f = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((7, 5), (5, 3), (3, 4)))
    kernels, calls = _chain()
    monkeypatch.setattr(program_module, "PARALLEL_MIN_KERNELS", 2)
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "workers"))
    monkeypatch.setenv("POLYC_COMPILE_JOBS", "2")
    assert program_module.compile_processes(3) == 2
    reported = []
    in_workers = link_program("chain", kernels, calls, 5, on_kernel=lambda i, s: reported.append(i))
    assert reported == [0, 1, 2] and not in_workers.from_cache
    expected = np.maximum(a @ b, 0) @ f
    np.testing.assert_allclose(_run_chain(in_workers, a, b, f), expected, rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path / "serial"))
    monkeypatch.setenv("POLYC_COMPILE_JOBS", "1")
    assert program_module.compile_processes(3) == 1
    serial = link_program("chain", kernels, calls, 5)
    np.testing.assert_array_equal(_run_chain(serial, a, b, f), _run_chain(in_workers, a, b, f))


def test_a_kernel_compiled_once_is_reused_by_another_program(monkeypatch, tmp_path):
    """Each kernel's object is cached on its own: a second program with a kernel the first compiled (other
    calls, another name) compiles only what is new."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    compiled = []
    real = program_module.compile_kernel_object
    monkeypatch.setattr(program_module, "compile_kernel_object",
                        lambda job, kernel=None: compiled.append(job.name) or real(job, kernel))
    kernels, calls = _chain()
    link_program("first", kernels[:2], calls[:2], 5)
    assert compiled == ["matmul", "relu"]
    compiled.clear()
    rng = np.random.default_rng(4)
    a, b, f = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((7, 5), (5, 3), (3, 4)))
    second = link_program("second", kernels, calls, 5)
    assert compiled == ["matmul"]  # the 7x3 @ 3x4 one; 7x5 @ 5x3 and relu come from the disk cache
    np.testing.assert_allclose(_run_chain(second, a, b, f), np.maximum(a @ b, 0) @ f, rtol=1e-5, atol=1e-6)


def test_worker_processes_give_results_in_order_and_errors_whole():
    """run_jobs yields in job order; an exception raised in a worker is raised here with its fields (a
    PolycError keeps its hint); a worker that dies is a CompileError, and the next call starts another."""
    assert list(run_jobs(int, [str(i) for i in range(9)], 2)) == list(range(9))
    with pytest.raises(ValueError, match="invalid literal"):
        list(run_jobs(int, ["1", "x", "3"], 2))
    with pytest.raises(PolycError) as caught:
        list(run_jobs(polyc.Options.from_spec, ["threads=1", "no_such_option=3"], 2))
    assert caught.value.message and "no_such_option" in str(caught.value)
    with pytest.raises(CompileError, match="worker process died"):
        list(run_jobs(os._exit, [3, 4], 2))
    assert list(run_jobs(abs, [-1, -2, -3], 2)) == [1, 2, 3]


def test_linked_objects_must_define_each_function_once_and_everything_they_call():
    """load_objects refuses two objects defining one function, and a call nothing resolves (MCJIT would end
    the process), before LLVM sees either."""
    target = polyc.Kernel("def f(float(N) A) -> (B) { B(i) = A(i) }").target
    define = 'target triple = "%s"\ndefine i32 @{name}(ptr %%a) {{\n  ret i32 0\n}}\n' % target.triple
    one = compile_object(define.format(name="twice"), target)
    with pytest.raises(CompileError, match="both define 'twice'"):
        load_objects([one, compile_object(define.format(name="twice"), target)], target)
    caller = ('target triple = "%s"\ndeclare i32 @nowhere(ptr)\ndefine i32 @calls(ptr %%a) {\n'
              '  %%s = call i32 @nowhere(ptr %%a)\n  ret i32 %%s\n}\n' % target.triple)
    with pytest.raises(CompileError, match="not found in this process"):
        compile_object(caller, target)
    linked = compile_object(caller, target, linked=frozenset({"nowhere"}))
    with pytest.raises(CompileError, match="'nowhere'"):
        load_objects([linked, one], target)
    callee = compile_object(define.format(name="nowhere"), target)
    jit = load_objects([linked, callee], target, ("calls",))
    assert jit.address("calls")
