"""Read-after-read input reuse as proximity (``Options.rar``, Pluto's ``--rar``): the relation, what isl's
scheduler does with it, and results against numpy."""
from __future__ import annotations

import zlib

import islpy as isl
import numpy as np
import pytest

import polyc.kernels
from polyc.lang import check_def, parse
from polyc.options import Options
from polyc.poly.build import build_scop
from polyc.poly.deps import compute_dependences
from polyc.poly.schedule import compute_schedule, read_after_read
from polyc.poly.transforms import bands
from polyc.poly.verify import check_schedule

from kernel_refs import CASES, tolerance

POLYBENCH = polyc.kernels.source("polybench")
ELEMENTWISE = polyc.kernels.source("elementwise")
SOFTMAX = polyc.kernels.source("softmax")


def scop_of(source: str, name: str, **sizes):
    program = parse(source)
    defn = next(d for d in program.defs if d.name == name)
    return build_scop(check_def(defn, source), sizes)


def statements_of(node: isl.ScheduleNode) -> set[str]:
    names = set()
    node.get_domain().foreach_set(lambda s: names.add(s.get_tuple_name()))
    return names


def test_bicg_rar_pairs_the_two_reads_of_the_matrix():
    scop = scop_of(POLYBENCH, "bicg", N=5, M=3)
    rar = read_after_read(scop, compute_dependences(scop))
    # s(j) +=! r(i) * A(i,j) is S1[j, i]; q(i) +=! A(i,j) * p(j) is S3[i, j]: both read A[i, j]
    expected = isl.UnionMap("{ S1[j, i] -> S3[i, j] : 0 <= i < 5 and 0 <= j < 3 }")
    assert rar.is_equal(expected)


def test_mvt_rar_pairs_a_row_with_a_column():
    scop = scop_of(POLYBENCH, "mvt", N=4)
    rar = read_after_read(scop, compute_dependences(scop))
    # x1o(i) += A(i,j) * y_1(j) is S1[i, j]; x2o(i) += A(j,i) * y_2(j) is S3[i, j], reading A[j, i]
    assert rar.is_equal(isl.UnionMap("{ S1[i, j] -> S3[j, i] : 0 <= i < 4 and 0 <= j < 4 }"))


@pytest.mark.parametrize("source,name,sizes", [(SOFTMAX, "softmax", dict(N=3, D=5)),
                                               (POLYBENCH, "atax", dict(M=3, N=4))])
def test_no_rar_between_statements_dependences_connect(source, name, sizes):
    # softmax's statements all read X, atax's both read A, but flow dependences join them already
    scop = scop_of(source, name, **sizes)
    assert read_after_read(scop, compute_dependences(scop)).is_empty()


def test_rar_fuses_independent_readers_of_one_input():
    scop = scop_of(ELEMENTWISE, "divmod_i32", M=5, N=7)
    deps = compute_dependences(scop)
    assert read_after_read(scop, deps).is_equal(
        isl.UnionMap("{ S0[i, j] -> S1[i, j] : 0 <= i < 5 and 0 <= j < 7 }"))
    apart = bands(compute_schedule(scop, deps, Options()))
    assert sorted(statements_of(b) == {"S0", "S1"} for b in apart) == [False, False]
    fused = compute_schedule(scop, deps, Options(rar=True))
    check_schedule(fused, scop, deps, "rar")
    (band,) = bands(fused)
    assert statements_of(band) == {"S0", "S1"}
    assert [band.band_member_get_coincident(k) for k in range(band.band_n_member())] == [True, True]


@pytest.mark.parametrize("name,sizes", [("bicg", dict(N=7, M=5)), ("mvt", dict(N=6))])
def test_rar_never_costs_parallelism(name, sizes):
    # RAR pairs are proximity only: isl keeps a coincident outer loop for every statement, so bicg's and
    # mvt's two passes over A stay apart (a fused loop would carry one statement's reduction)
    scop = scop_of(POLYBENCH, name, **sizes)
    deps = compute_dependences(scop)
    schedule = compute_schedule(scop, deps, Options(rar=True))
    check_schedule(schedule, scop, deps, "rar")
    outer = bands(schedule)
    assert set().union(*(statements_of(b) for b in outer)) == {"S0", "S1", "S2", "S3"}
    assert all(b.band_member_get_coincident(0) for b in outer)


def test_rar_option_round_trips():
    o = Options(rar=True, fusion="max")
    assert o.to_spec() == "fusion=max,rar=1"
    assert Options.from_spec(o.to_spec()) == o
    assert Options().rar is False


@pytest.mark.parametrize("family,name", [("elementwise", "divmod_i32"), ("polybench", "bicg"),
                                         ("polybench", "mvt"), ("polybench", "atax")])
def test_rar_results_match_numpy(family, name):
    case = next(c for c in CASES if c.family == family and c.name == name)
    kernel = polyc.kernels.load(family, name, options=Options(rar=True))
    for shape in case.shapes:
        rng = np.random.default_rng(zlib.crc32(f"{family}.{name}{sorted(shape.items())}".encode()))
        inputs = case.make_inputs(rng, shape)
        expected = case.reference(*inputs)
        got = kernel(*inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected, strict=True):
            rtol, atol = tolerance(e.dtype, case.reduction(shape))
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=f"{name} at {shape}")
