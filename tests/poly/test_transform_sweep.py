"""The transformation sweep: every kernel of the library under many option sets, compared with numpy.

A transformation that changes a result must fail here. Each def of ``kernels/*.tc`` (every
:class:`~kernel_refs.KernelCase` of ``tests/kernel_refs.py``) is compiled on one *sweep shape* under a set of
:class:`polyc.Options` and its outputs are compared with the case's numpy reference (shapes, dtypes, values
within the dtype's tolerance, exact for integers; inputs left untouched).

The sweep shape of a case is its largest test shape that has an odd prime extent of at least 5 (for most
cases the last one, e.g. matmul M=37, K=67, N=41): small enough to compile and run in well under a second,
large enough that a register tile (6 rows by two vectors) and a full vector of the target's width fit in
it, and odd so that every tiled and vectorized loop also runs its partial tile and remainder path.

To keep the whole file at a few minutes on a 2-core machine the option sets are split:

- ``ALL_OPTIONS`` (the six most distinct) run on every case: source-order schedule, tiny tiles (3: every
  tile partial), no cache tile, scalar code, a 2-row register tile, packing wherever the access allows it
  (``promote=1``: the strategy would only pack long rows). Every transform off (``Options.naive()``) on every
  case is ``tests/api/test_kernels.py::test_kernel_without_transforms_matches_numpy``;
- ``FUSION_OPTIONS`` (``fusion=min`` / ``fusion=max``) run on every case with more than one statement
  (reductions count: their initialisation is a statement), where fusion can change anything;
- ``SUBSET_OPTIONS`` (the default options, ``tile_sizes=4x8x16``, ``register_tile=0``, parallel on two
  threads with and without packing, source order with transforms off) run on a representative subset of kernels;
- ``PARALLEL_SHAPES``: the strategy marks a loop parallel only above ~65k statement instances, so a few
  kernels run on larger shapes with ``parallel=1,threads=2``; the test checks that the AST really has a
  ``parallel`` loop and that the two-thread result is bit-identical to the one-thread result.

The default options on every shape of every case are covered by ``tests/api/test_kernels.py``.
"""
from __future__ import annotations

import functools
import re

import numpy as np
import pytest

from kernel_refs import CASES, KernelCase, run_and_compare, shape_id

import polyc
import polyc.kernels
from polyc import Options
from polyc.lang import parse

ALL_OPTIONS = {
    "identity": Options(scheduler="identity"),
    "tile_sizes=3": Options(tile_sizes=(3,)),
    "tile=0": Options(tile=False),
    "vectorize=0": Options(vectorize=False),
    "register_tile_sizes=2": Options(register_tile_sizes=(2,)),
    "promote=1": Options(promote=True),
}

FUSION_OPTIONS = {
    "fusion=min": Options(fusion="min"),
    "fusion=max": Options(fusion="max"),
}

SUBSET_OPTIONS = {
    "default": Options(),
    "tile_sizes=4x8x16": Options(tile_sizes=(4, 8, 16)),
    "register_tile=0": Options(register_tile=False),
    "parallel=1,threads=2": Options(parallel=True, threads=2),
    "promote=1,parallel=1,threads=2": Options(promote=True, parallel=True, threads=2),
    "identity+naive": Options.naive().replace(scheduler="identity"),
}

#: The representative subset: a GEMM, a convolution, a multi-statement row reduction, a PolyBench chain of
#: products, a pooling, an elementwise op with broadcasting, a padded conv and a layernorm.
SUBSET = ("matmul.matmul", "matmul.gemm_bias", "conv2d.conv2d", "conv2d.conv2d_pad1", "softmax.softmax",
          "polybench.two_mm", "pool.maxpool3x3_s2", "elementwise.add_row", "layernorm.layernorm")

#: Shapes with well over 65k statement instances, so that the strategy marks a loop parallel.
PARALLEL_SHAPES = (
    ("matmul.matmul", dict(M=131, K=67, N=97)),
    ("conv2d.conv2d", dict(N=1, C=5, H=37, W=41, M=13, KH=3, KW=3)),
    ("softmax.softmax", dict(N=131, D=523)),
    ("polybench.two_mm", dict(NI=67, NJ=71, NK=73, NL=61, NM=1)),
    ("pool.maxpool2x2", dict(N=2, C=17, H=131, W=67)),
    ("elementwise.add_row", dict(M=257, N=263)),
)

CASES_BY_ID = {case.id: case for case in CASES}
ODD_PRIMES = {5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97, 101,
              103, 107, 109, 113, 127, 131}


def sweep_shape(case: KernelCase) -> dict:
    """The case's largest shape (by product of extents) with an odd prime extent of at least 5."""
    odd = [s for s in case.shapes if set(s.values()) & ODD_PRIMES] or list(case.shapes)
    return max(odd, key=lambda s: (int(np.prod(list(s.values()))), case.shapes.index(s)))


def kernel(case_id: str) -> polyc.Kernel:
    """A fresh Kernel per test (not cached: a Kernel keeps every specialization it compiled, and the sweep
    compiles several hundred)."""
    case = CASES_BY_ID[case_id]
    return polyc.kernels.load(case.family, case.name)


@functools.lru_cache(maxsize=None)
def statement_count(case_id: str) -> int:
    """Statements of the case's polyhedral model (the ``S0: Y(i,j) = ...`` lines of its ``domain`` stage)."""
    case = CASES_BY_ID[case_id]
    inputs = case.make_inputs(np.random.default_rng(0), case.shapes[1])
    text = kernel(case_id).specialize(*inputs, options=Options.naive()).stage("domain")
    return len(set(re.findall(r"^\s*(S\d+): .* \.\.\.\s*$", text, re.MULTILINE)))


def source_statement_count(case: KernelCase) -> int:
    """:func:`statement_count` read from the def's source without compiling: one per statement, one more per
    reduction that initialises (``+=!``). test_fusion_sweep_has_every_multi_statement_case checks they agree."""
    (defn,) = [d for d in parse(polyc.kernels.source(case.family)).defs if d.name == case.name]
    return len(defn.statements) + sum(s.initializes for s in defn.statements)


#: The cases where fusion can change anything: two statements or more (one statement: nothing to fuse).
MULTI_STATEMENT = tuple(c.id for c in CASES if source_statement_count(c) >= 2)


def run_case(case: KernelCase, shape: dict, options: Options):
    """Compile ``case`` for ``shape`` under ``options``, run it, compare with numpy; returns
    ``(compiled, outputs)``."""
    compiled = None

    def call(*inputs):
        nonlocal compiled
        compiled = kernel(case.id).specialize(*inputs, options=options)
        return compiled(*inputs)

    got = run_and_compare(case, shape, call, f" with options [{options.to_spec() or 'default'}]")
    return compiled, got


def _params(option_sets: dict, case_ids):
    for case_id in case_ids:
        for label, options in option_sets.items():
            yield pytest.param(case_id, options, id=f"{case_id}[{label}]")


@pytest.mark.parametrize("case_id,options", list(_params(ALL_OPTIONS, [c.id for c in CASES])))
def test_every_kernel_under_distinct_options(case_id: str, options: Options):
    case = CASES_BY_ID[case_id]
    run_case(case, sweep_shape(case), options)


@pytest.mark.parametrize("case_id,options", list(_params(FUSION_OPTIONS, MULTI_STATEMENT)))
def test_fusion_strategies(case_id: str, options: Options):
    case = CASES_BY_ID[case_id]
    run_case(case, sweep_shape(case), options)


@pytest.mark.parametrize("case_id,options", list(_params(SUBSET_OPTIONS, SUBSET)))
def test_subset_under_more_options(case_id: str, options: Options):
    case = CASES_BY_ID[case_id]
    run_case(case, sweep_shape(case), options)


@pytest.mark.parametrize("case_id,shape", [pytest.param(c, s, id=f"{c}[{shape_id(s)}]")
                                           for c, s in PARALLEL_SHAPES])
def test_parallel_code_runs_and_matches(case_id: str, shape: dict):
    case = CASES_BY_ID[case_id]
    two, got_two = run_case(case, shape, Options(parallel=True, threads=2))
    assert "parallel" in two.stage("ast"), f"{case_id} at {shape_id(shape)}: no parallel loop in the AST"
    one, got_one = run_case(case, shape, Options(parallel=True, threads=1))
    # splitting the outermost coincident loop across threads must not change any element's computation
    for k, (a, b) in enumerate(zip(got_one, got_two)):
        np.testing.assert_array_equal(a, b, err_msg=f"{case_id} output {k}: 2 threads differ from 1")


def test_sweep_covers_the_library():
    """Every def of the library is in the sweep, and every subset/parallel entry names a real case."""
    library = {f"{family}.{d.name}" for family in polyc.kernels.names()
               for d in parse(polyc.kernels.source(family)).defs}
    assert {c.id for c in CASES} == library
    for case_id in SUBSET + tuple(c for c, _ in PARALLEL_SHAPES):
        assert case_id in CASES_BY_ID, case_id
    families = {c.family for c in CASES}
    assert families == set(polyc.kernels.names())


def test_fusion_sweep_has_every_multi_statement_case():
    """The fusion sweep's cases are exactly those whose polyhedral model has two statements or more."""
    for case in CASES:
        assert source_statement_count(case) == statement_count(case.id), case.id
    assert MULTI_STATEMENT and len(MULTI_STATEMENT) < len(CASES)


def test_sweep_shapes_have_partial_tiles():
    """Each sweep shape has an odd extent above the tiny tile size, so tile_sizes=3 leaves partial tiles."""
    for case in CASES:
        shape = sweep_shape(case)
        assert any(v % 2 == 1 and v > 3 for v in shape.values()), f"{case.id}: {shape_id(shape)}"
