"""Precision of long float reductions (issue 16, item 8): sums keep their error near one rounding.

Summed plainly, 2**25 float32 ones stop at 2**24 = 16777216 and random data loses ~100x numpy's accuracy.
Codegen sums in register blocks and adds each block to the element with a compensated update
(:func:`polyc.codegen.sums.fold_sum`), so every result here is compared with an exact (float64) reference.
"""
import numpy as np
import pytest
from onnx import helper

import polyc
import polyc.onnx
from polyc.onnx import testing

OPTIONS = {"default": polyc.Options(), "naive": polyc.Options.naive(), "threads2": polyc.Options(threads=2),
           "untiled": polyc.Options(tile=False)}

SUM_ALL = "def s(float(N) A) -> (S) { S() +=! A(i) }"
SUM_ROWS = "def s(float(M,N) A) -> (S) { S(m) +=! A(m,n) }"
SUM_COLS = "def s(float(M,N) A) -> (S) { S(n) +=! A(m,n) }"
SQUARES = "def s(float(M,N) A) -> (S) { S(m) +=! A(m,n) * A(m,n) }"
MEAN = "def s(float(M,N) A) -> (Y) { S(m) +=! A(m,n)\n Y(m) = S(m) / float(N) }"


def relative_error(got, exact):
    return float(np.max(np.abs(np.asarray(got, np.float64) - exact) / np.abs(exact)))


@pytest.mark.parametrize("name", OPTIONS)
def test_sum_of_2_25_ones_is_exact(name):
    ones = np.ones(2**25, np.float32)
    got = polyc.define(SUM_ALL, options=OPTIONS[name])(ones)
    assert got.shape == () and float(got) == 33554432.0


@pytest.mark.parametrize("name", ["default", "naive"])
def test_row_sums_of_2_24_ones_are_exact(name):
    ones = np.ones((2, 2**24), np.float32)
    got = polyc.define(SUM_ROWS, options=OPTIONS[name])(ones)
    np.testing.assert_array_equal(got, np.full(2, 16777216.0, np.float32))


def test_column_sums_past_2_24_under_naive_schedule_are_exact():
    # the naive schedule runs the long reduction innermost: blocked and compensated
    ones = np.ones((2**24 + 4096, 2), np.float32)
    got = polyc.define(SUM_COLS, options=OPTIONS["naive"])(ones)
    np.testing.assert_array_equal(got, np.full(2, 2**24 + 4096, np.float32))


@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("src, shape, reference", [
    (SUM_ALL, (3_000_001,), lambda a: a.sum()),
    (SUM_ROWS, (3, 1_000_003), lambda a: a.sum(1)),
    (SQUARES, (2, 1_500_007), lambda a: (a * a).sum(1)),
    (MEAN, (2, 1_000_001), lambda a: a.mean(1)),
], ids=["all", "rows", "squares", "mean"])
def test_random_sums_are_as_accurate_as_numpy(name, src, shape, reference):
    a = np.random.default_rng(1).uniform(0, 1, shape).astype(np.float32)
    exact = reference(a.astype(np.float64))
    ours = relative_error(polyc.define(src, options=OPTIONS[name])(a), exact)
    theirs = relative_error(reference(a), exact)  # numpy's pairwise float32 sums
    # float32 rounding of the result alone is up to 6e-8; a plain sequential sum is ~1e-5 here
    assert ours <= max(4 * theirs, 1.2e-7), (ours, theirs)


def test_sums_with_cancellation_inf_and_nan():
    rng = np.random.default_rng(2)
    a = rng.uniform(-1, 1, (4, 400_003)).astype(np.float32)
    a[0] += 1e4  # large terms that cancel against the next row's: the compensation must hold for |x| > |s|
    a[1, ::2] = 3e4
    a[1, 1::2] = -3e4
    a[2, 12345] = np.inf
    a[3, 777] = np.nan
    got = polyc.define(SUM_ROWS)(a)
    exact = a.astype(np.float64).sum(1)
    assert relative_error(got[:2], exact[:2]) <= 1.2e-7
    assert got[2] == np.inf and np.isnan(got[3])


@pytest.mark.parametrize("name", ["default", "naive"])
def test_float64_sums_are_compensated(name):
    # 1 + many tiny terms: a plain float64 sum stays 1.0 (each 1e-17 is below half an ulp of 1), 1e-11 off;
    # in blocks, only the tiny terms of 1.0's own block (at most 128) are lost
    a = np.full(1_000_003, 1e-17, np.float64)
    a[0] = 1.0
    got = polyc.define("def s(double(N) A) -> (S) { S() +=! A(i) }", options=OPTIONS[name])(a)
    assert abs(float(got) - (1.0 + 1_000_002e-17)) <= 128e-17 + 2.3e-16


def test_short_reductions_and_max_are_unchanged():
    a = np.random.default_rng(3).uniform(-1, 1, (37, 129)).astype(np.float32)
    # against the exact sum: a float32 sum of 129 terms in vector lanes (about 16 per lane, then the lanes)
    # errs by up to ~20 ulps of the magnitudes summed; 8 of them is what orderings give in practice (numpy's
    # own float32 sum is no closer to the exact one, so it cannot be the reference at 1e-6 on AVX2 and AVX-512)
    exact = a.astype(np.float64).sum(1)
    got = polyc.define(SUM_ROWS)(a)
    assert np.all(np.abs(got - exact) <= 8 * np.finfo(np.float32).eps * np.abs(a).sum(1)), np.abs(got - exact).max()
    got = polyc.define("def s(float(M,N) A) -> (S) { S(m) max=! A(m,n) }")(a)
    np.testing.assert_array_equal(got, a.max(1))


@pytest.mark.parametrize("axes, keepdims", [(None, 0), ([1], 1), ([-1], 0)])
def test_onnx_reduce_sum_of_a_long_axis(axes, keepdims):
    x = np.random.default_rng(4).uniform(0, 1, (3, 1_000_003)).astype(np.float32)
    attrs = {"keepdims": keepdims} | ({"axes": axes} if axes is not None else {})
    node = helper.make_node("ReduceSum", ["x"], ["y0"], **attrs)
    model = testing.one_node_model(node, {"x": x}, {}, 11)
    (got,) = polyc.onnx.compile(model).run({"x": x})
    exact = x.astype(np.float64).sum(axis=None if axes is None else tuple(axes), keepdims=bool(keepdims))
    assert got.shape == exact.shape
    assert relative_error(got, exact) <= 1.2e-7
    ones = np.ones((1, 2**25), np.float32)
    (got,) = polyc.onnx.compile(testing.one_node_model(node, {"x": ones}, {}, 11)).run({"x": ones})
    assert np.all(got == 33554432.0)
