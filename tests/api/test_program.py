"""Several kernels linked into one module with a generated native entry point (the ONNX execution path)."""
import numpy as np
import pytest

import polyc
from polyc.errors import KernelRuntimeError
from polyc.program import KernelCall, link_program

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
