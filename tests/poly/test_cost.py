"""polyc.poly.cost: FLOPs and compulsory bytes of a Scop, the roofline bound (checked by hand counts)."""
from __future__ import annotations

import pytest

import polyc
from polyc.poly.cost import Cost, cost, value_operations
from polyc.poly.build import build_scop


def _cost(src: str, **sizes) -> Cost:
    kernel = polyc.define(src)
    return cost(build_scop(kernel.checked, sizes))


def test_matmul_counts_two_flops_per_multiply_add_and_each_tensor_once():
    c = _cost("def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }", M=5, K=7, N=3)
    assert c.flops == 2 * 5 * 7 * 3
    assert c.bytes == 4 * (5 * 7 + 7 * 3 + 5 * 3)


def test_instances_follow_range_inference_and_index_arithmetic_is_free():
    # i's range is inferred from A(i+1): N-1 instances; the add and the multiply count, the index arithmetic
    # i+1 does not
    c = _cost("def f(double(N) A) -> (B) { B(i) = A(i+1) + A(i) * 2.0 }", N=9)
    assert c.flops == 8 * 2
    assert c.bytes == 8 * (9 + 8)


def test_value_operations_counts_calls_and_skips_casts():
    kernel = polyc.define("def f(float(N) A) -> (B) { B(i) = exp(A(i) * 2.0) + float(int32(A(i))) }")
    stmt = build_scop(kernel.checked, {"N": 4}).statements[-1]
    assert value_operations(stmt.rhs) == 3  # *, exp, +


@pytest.mark.parametrize("flops,nbytes,memory", [(10**9, 10**6, False), (10**6, 10**9, True)])
def test_roofline_bound_is_the_larger_of_compute_and_traffic(flops, nbytes, memory):
    c = Cost(flops, nbytes)
    assert c.roofline_seconds(1e11, 1e10) == max(flops / 1e11, nbytes / 1e10)
    assert c.memory_bound(1e11, 1e10) is memory
