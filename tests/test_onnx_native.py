"""The native executor: a whole model as one LLVM module with a generated entry point."""
import numpy as np

import polyc.onnx as ponnx
from polyc.onnx.native import NativeExecutor
from polyc.onnx.testing import light_model_path, reweight

import onnxruntime  # noqa: E402  (a test dependency: a missing install must fail, not skip)


def test_native_matches_the_python_executor_and_onnxruntime_and_reloads_from_cache(tmp_path, monkeypatch):
    import onnx

    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))  # weights are data: another test's squeezenet hits

    model = reweight(onnx.load(light_model_path("squeezenet")), seed=3)
    compiled = ponnx.compile(model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(compiled.input_shapes[0]).astype(np.float32)
    feeds = compiled.check_feeds({compiled.input_names[0]: x})
    program = compiled.executor.program
    native = compiled.executor
    assert isinstance(native, NativeExecutor)  # the default
    python_side = [a for a in ponnx.executor.PythonExecutor(program).run(feeds)]
    got = native.run(feeds)
    for a, b in zip(got, python_side):
        np.testing.assert_array_equal(a, b)  # the same kernels, the same order: bit-identical
    session = onnxruntime.InferenceSession(model.SerializeToString())
    expected = session.run(None, {compiled.input_names[0]: x})
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)
    again = NativeExecutor(program)
    assert again.native.from_cache and not native.native.from_cache
    np.testing.assert_array_equal(again.run(feeds)[0], got[0])
