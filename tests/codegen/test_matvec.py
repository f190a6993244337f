"""Matrix-vector schedules: rows streamed under the reductions, and vector reductions with several
accumulators, against numpy on lengths that hit every path (full unrolled steps, single vectors, scalar
remainders) and with every transform switched off in turn."""
from __future__ import annotations

import re
import zlib

import numpy as np
import pytest

import polyc
from polyc import Options

from kernel_refs import CASES, tolerance

SOURCE = """
def rowdot(float(M,N) A, float(N) x) -> (y) { y(i) +=! A(i,j) * x(j) }
def coldot(float(M,N) A, float(M) t) -> (y) { y(j) +=! A(i,j) * t(i) }
def colmax(float(M,N) A) -> (y) { y(j) max=! A(i,j) }
"""

#: 1031 float32 columns: a row is 4124 bytes, past the strategy's page-jump threshold (PACK_MIN_ROW_BYTES)
LONG = 1031

OPTIONS = {"default": Options(), "threads=2": Options(threads=2), "tile_sizes=3": Options(tile_sizes=(3,)),
           "tile=0": Options(tile=False), "vectorize=0": Options(vectorize=False), "naive": Options.naive()}


def _data(m: int, n: int):
    rng = np.random.default_rng(zlib.crc32(f"{m}x{n}".encode()))
    return rng.standard_normal((m, n)).astype(np.float32), rng.standard_normal(n).astype(np.float32), \
        rng.standard_normal(m).astype(np.float32)


@pytest.mark.parametrize("label", OPTIONS)
@pytest.mark.parametrize("m", [1, 7, 37])
def test_streamed_column_sums_match_numpy(label, m):
    A, _, t = _data(m, LONG)
    kernel = polyc.define(SOURCE, name="coldot", options=OPTIONS[label])
    np.testing.assert_allclose(kernel(A, t), A.T.astype(np.float64) @ t, rtol=1e-4, atol=1e-4)
    colmax = polyc.define(SOURCE, name="colmax", options=OPTIONS[label])
    np.testing.assert_array_equal(colmax(A), A.max(axis=0))


def test_long_rows_are_streamed_with_the_vector_loop_innermost():
    A, _, t = _data(37, LONG)
    ast = polyc.define(SOURCE, name="coldot").specialize(A, t).stage("ast")
    # the vector loop walks j (the first index of S1) inside the loop over the reduction index i
    assert re.search(r"for \(int (c\d+) .*\n\s*// vector\n\s*for \(int (c\d+) .*\n\s*S1\(c\d+ \+ \2, (c\d+ \+ )?\1\)",
                     ast), ast
    # short rows keep the register tile: S1's vector loops cover one block of NR = 2 vectors at most
    short = polyc.define(SOURCE, name="coldot").specialize((37, 61), (37,)).stage("ast")
    blocks = re.findall(r"// vector\n\s*for \(int c\d+ = 0; c\d+ <= (\d+); c\d+ \+= 1\)\n\s*S1\(", short)
    assert blocks and max(int(b) for b in blocks) < 32, short


@pytest.mark.parametrize("n", [1, 7, 16, 17, 63, 64, 65, 130, LONG])
def test_vector_row_reductions_on_every_length(n):
    # 16 fp32 lanes x 4 accumulators: n below one vector, between one and four, a multiple, and remainders
    A, x, _ = _data(5, n)
    got = polyc.define(SOURCE, name="rowdot")(A, x)
    np.testing.assert_allclose(got, A.astype(np.float64) @ x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,sizes", [("atax", dict(M=7, N=521)), ("bicg", dict(N=521, M=7)),
                                        ("mvt", dict(N=521)), ("gemver", dict(N=521))])
@pytest.mark.parametrize("label", ["default", "threads=2", "tile_sizes=3"])
def test_polybench_matrix_vector_kernels_with_long_rows(name, sizes, label):
    import polyc.kernels

    case = next(c for c in CASES if c.family == "polybench" and c.name == name)
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    inputs = case.make_inputs(rng, sizes)
    expected = case.reference(*inputs)
    got = polyc.kernels.load("polybench", name, options=OPTIONS[label])(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    got = got if isinstance(got, tuple) else (got,)
    for g, e in zip(got, expected, strict=True):
        rtol, atol = tolerance(e.dtype, case.reduction(sizes))
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{name} [{label}]")
