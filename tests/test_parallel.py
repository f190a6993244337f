"""Parallel marks land only on loops that carry no dependence.

isl emits no loop for a band member with a single value (one tile), and a mark applies to the first loop
below it. A 1x1 convolution at 7x7 with 128 output channels has one tile in every output dimension, so the
first real loop is the reduction's tile loop: marking it parallel made two threads race on the output
(wrong results that depended on the output buffer's old contents)."""
import numpy as np

import polyc
from polyc import Options

SOURCE = """
def conv_epilogue(float(1,1024,7,7) X, float(128,1024) W, float(128) B) -> (float(1,128,7,7) Y) {
    Y(n, m, h, w) +=! X(n, c, h, w) * W(m, c) where n in 0:1, m in 0:128, h in 0:7, w in 0:7, c in 0:1024
    Y(n, m, h, w) = max(Y(n, m, h, w) + B(m), 0.0) where n in 0:1, m in 0:128, h in 0:7, w in 0:7
}"""


def test_single_tile_outputs_do_not_parallelize_the_reduction():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 1024, 7, 7)).astype(np.float32)
    w = rng.standard_normal((128, 1024)).astype(np.float32)
    b = rng.standard_normal(128).astype(np.float32)
    expected = np.maximum(np.einsum("nchw,mc->nmhw", x, w) + b[None, :, None, None], 0)
    compiled = polyc.define(SOURCE, options=Options(threads=2)).specialize(x.shape, w.shape, b.shape)
    for _ in range(20):
        out = np.full(expected.shape, 1.0, np.float32)
        compiled(x, w, b, out=out)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_the_outermost_coincident_loop_with_several_tiles_is_parallel():
    compiled = polyc.define(SOURCE, options=Options(threads=2, tile_sizes=(8, 32, 256, 256))).specialize(
        (1, 1024, 7, 7), (128, 1024), (128,))
    ast = compiled.stage("ast")
    marked = ast.split("// parallel_c", 1)[1].split("\n", 1)[1].lstrip().splitlines()[0]
    assert marked.startswith("for (int c") and "+= 32" in marked  # the output-channel tile loop
