"""Concurrent ``run`` calls on one compiled ONNX model (issue 16, item 4): every output of every thread must
equal the single-threaded result for the same input, on the native executor, the Python executor and the
backend's prepared rep, as onnxruntime users expect of ``InferenceSession.run``."""
import threading

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import polyc.onnx as ponnx
import polyc.onnx.backend as pbackend
from polyc.onnx.executor import PythonExecutor
from polyc.onnx.native import NativeExecutor

import onnxruntime  # noqa: E402  (a test dependency: a missing install must fail, not skip)

THREADS = 6
RUNS = 60


def arena_model(seed: int = 0):
    """Conv -> Relu -> Conv -> Add(skip) -> Relu -> Flatten -> Gemm -> Softmax: intermediates and kernel
    temporaries in the arena, several kernels per run (so runs overlap long enough to race)."""
    rng = np.random.default_rng(seed)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("Flatten", ["r2"], ["f"]),
             helper.make_node("Gemm", ["f", "wf", "bf"], ["g"], transB=1),
             helper.make_node("Softmax", ["g"], ["y"], axis=1)]
    graph = helper.make_graph(nodes, "threads", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10]),
                               helper.make_tensor_value_info("r1", TensorProto.FLOAT, [1, 16, 16, 16])],
                              [init("w1", 16, 16, 3, 3), init("b1", 16), init("w2", 16, 16, 3, 3), init("b2", 16),
                               init("wf", 10, 4096), init("bf", 10)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def hammer(run, inputs, expected):
    """Call ``run(x)`` from THREADS threads at once, each on its own rotation through ``inputs``; returns the
    number of outputs that differ from ``expected`` (bit for bit) and the exceptions raised."""
    wrong, errors = [0], []
    start = threading.Barrier(THREADS)
    lock = threading.Lock()

    def work(t):
        try:
            start.wait()
            for k in range(RUNS):
                i = (k * 7 + t * 3) % len(inputs)
                got = run(inputs[i])
                bad = sum(not np.array_equal(a, b) for a, b in zip(got, expected[i]))
                with lock:
                    wrong[0] += bad
        except Exception as exc:  # reported by the test
            with lock:
                errors.append(exc)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return wrong[0], errors


@pytest.fixture(scope="module")
def model_and_inputs():
    model = arena_model()
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((1, 16, 16, 16)).astype(np.float32) for _ in range(9)]
    return model, inputs


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_concurrent_runs_match_single_threaded_results(model_and_inputs, native):
    model, inputs = model_and_inputs
    compiled = ponnx.compile(model)
    program = compiled.executor.program
    executor = NativeExecutor(program) if native else PythonExecutor(program)
    expected = [executor.run(compiled.check_feeds({"x": x})) for x in inputs]
    session = onnxruntime.InferenceSession(model.SerializeToString())
    for x, exp in zip(inputs, expected):
        for a, b in zip(exp, session.run(None, {"x": x})):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    wrong, errors = hammer(lambda x: executor.run(compiled.check_feeds({"x": x})), inputs, expected)
    assert not errors, errors
    assert wrong == 0, f"{wrong} of {THREADS * RUNS * 2} outputs differ from the single-threaded run"
    assert executor.arenas.created >= 1


def test_concurrent_compiled_model_run_and_backend_rep(model_and_inputs):
    model, inputs = model_and_inputs
    compiled = ponnx.compile(model)
    expected = [compiled.run({"x": x}) for x in inputs]
    wrong, errors = hammer(lambda x: compiled.run({"x": x}), inputs, expected)
    assert not errors, errors
    assert wrong == 0, f"{wrong} outputs of CompiledModel.run differ under {THREADS} threads"
    rep = pbackend.prepare(model)
    wrong, errors = hammer(lambda x: rep.run({"x": x}), inputs, expected)
    assert not errors, errors
    assert wrong == 0, f"{wrong} outputs of the backend rep differ under {THREADS} threads"


def test_arena_pool_reuses_and_bounds_idle_arenas():
    from polyc.onnx.executor import ArenaPool

    made = []
    pool = ArenaPool(lambda: made.append(object()) or made[-1], keep=2)
    with pool.lease() as a:
        with pool.lease() as b:
            with pool.lease() as c:
                assert len({id(a), id(b), id(c)}) == 3  # busy ones are never handed out twice
    assert pool.created == 3 and len(made) == 3
    with pool.lease() as d:
        assert d in (a, b, c)  # an idle one is reused
    assert pool.created == 3
    assert len(pool._idle) == 2  # no more than ``keep`` idle arenas stay allocated
