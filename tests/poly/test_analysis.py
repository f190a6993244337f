"""polyc.poly.analysis: statement instances, FLOPs and memory footprint of a Scop, against hand counts.

Every expected number is derived by hand from the kernel's text and the sizes (not from the implementation):
the loops' trip counts, the operators written in the statement, the elements each access can reach.
"""
from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyc
from polyc.lang import check_def, parse
from polyc.poly.analysis import accessed, flops, footprint, instances, int_ops, value_ops
from polyc.poly.build import build_scop
from polyc.poly.cost import cost


def scop_of(src: str, **sizes):
    """The Scop of the first def of ``src`` at ``sizes``, built without compiling."""
    return build_scop(check_def(parse(src).defs[0], src), sizes)


MATMUL = "def mm(float(M,K) A, float(K,N) B) -> (C) { C(m,n) +=! A(m,k) * B(k,n) }"


def test_matmul_instances_flops_and_footprint():
    M, K, N = 5, 7, 3
    scop = scop_of(MATMUL, M=M, K=K, N=N)
    # S0 sets C to 0 (one instance per element of C), S1 accumulates (one per (m, n, k))
    assert instances(scop) == {"S0": M * N, "S1": M * N * K}
    assert flops(scop) == 2 * M * N * K  # a multiply and an add per (m, n, k); the initialisation is free
    assert int_ops(scop) == 0
    fp = footprint(scop)
    assert fp.elements == {"A": M * K, "B": K * N, "C": M * N}
    assert fp.tensors == {"A": 4 * M * K, "B": 4 * K * N, "C": 4 * M * N}
    assert fp.total_bytes == (M * K + K * N + M * N) * 4
    assert fp.traffic == fp.total_bytes  # every tensor is an input or the output
    assert cost(scop).flops == flops(scop) and cost(scop).bytes == fp.traffic


CONV_PAD1 = """
def conv(float(N,C,H,W) X, float(M,C,KH,KW) F) -> (Y) {
    Y(n,m,h,w) +=! (h+kh >= 1 && h+kh <= H && w+kw >= 1 && w+kw <= W) ? X(n,c,h+kh-1,w+kw-1) * F(m,c,kh,kw) : 0.0
        where h in 0:H-KH+3, w in 0:W-KW+3, kh in 0:KH, kw in 0:KW
}
"""


def test_padded_conv2d_counts_the_guarded_multiply_add_only():
    N, C, H, W, M, KH, KW = 2, 3, 5, 4, 2, 3, 3
    scop = scop_of(CONV_PAD1, N=N, C=C, H=H, W=W, M=M, KH=KH, KW=KW)
    out = N * M * H * W  # padding 1 with a 3x3 window keeps H x W
    # the guard's conditions on the rows are the update's domain (build.guard_into_domain): only the (h, kh)
    # whose row lies inside the image run; the conditions on w (the stride-1 index) stay a ?: per instance
    rows = sum(1 for h in range(H) for kh in range(KH) if 1 <= h + kh <= H)
    reduction = N * M * C * rows * W * KW
    assert instances(scop) == {"S0": out, "S1": reduction}
    # what is left of the guard is integer work: w+kw (written twice, computed once), 2 comparisons, 1 &&;
    # the select and the 0.0 branch are free; the value is one multiply and the reduction's add
    assert flops(scop) == 2 * reduction
    assert int_ops(scop) == (1 + 2 + 1) * reduction
    fp = footprint(scop)
    # the guard keeps the reads of X inside X: the padding is never read, every element of X is
    assert fp.elements == {"X": N * C * H * W, "F": M * C * KH * KW, "Y": out}
    assert fp.total_bytes == 4 * (N * C * H * W + M * C * KH * KW + out)


def test_elementwise_builtins_count_one_and_fma_two():
    n = 11
    scop = scop_of("def f(float(N) A) -> (B) { B(i) = exp(A(i)) * 2.0 + tanh(A(i)) }", N=n)
    assert instances(scop) == {"S0": n}
    assert flops(scop) == 4 * n  # exp, *, tanh, +
    assert footprint(scop).total_bytes == 2 * 4 * n
    scop = scop_of("def f(float(N) A, float(N) B) -> (C) { C(i) = fma(A(i), B(i), 1.0) }", N=n)
    assert flops(scop) == 2 * n


def test_select_and_comparison_are_not_flops_and_casts_are_free():
    n = 6
    relu = scop_of("def f(float(N) A) -> (B) { B(i) = A(i) > 0.0 ? A(i) : 0.0 }", N=n)
    assert flops(relu) == 0 and int_ops(relu) == n  # the comparison only
    both = scop_of("def f(float(N) A) -> (B) { B(i) = A(i) > 0.0 ? A(i) * 2.0 : A(i) - 1.0 }", N=n)
    assert flops(both) == 2 * n  # both branches are computed, then one is selected
    cast = scop_of("def f(float(N) A) -> (B) { B(i) = float(int32(A(i))) + 1.0 }", N=n)
    assert flops(cast) == n


def test_operations_on_literals_and_sizes_are_folded():
    n = 6
    mask = scop_of("def f(float(N) A, bool(N) C) -> (B) { B(i) = C(i) ? A(i) / 4.0 : -1000.0 }", N=n)
    assert flops(mask) == n  # the division; -1000.0 is a literal, not a negation at run time
    scaled = scop_of("def f(float(N) A) -> (B) { B(i) = A(i) * (2.0 * 3.0) + float(N - 1) }", N=n)
    assert flops(scaled) == 2 * n and int_ops(scaled) == 0


def test_where_binding_is_computed_once():
    n = 5
    scop = scop_of("def f(float(N) A) -> (B) { B(i) = x * x where x = A(i) + 1.0 }", N=n)
    assert flops(scop) == 2 * n  # the + of x once (sema substitutes it twice), the *
    stmt = scop.statements[0]
    assert value_ops(stmt.rhs) == (2, 0)


def test_integer_statement_counts_no_flops():
    n = 8
    scop = scop_of("def f(int32(N) A) -> (B) { B(i) = A(i) * 2 + 1 }", N=n)
    assert flops(scop) == 0
    assert int_ops(scop) == 2 * n
    total = scop_of("def f(int32(M,N) A) -> (s) { s(m) +=! A(m,i) }", M=1, N=n)
    assert flops(total) == 0 and int_ops(total) == n  # the integer reduction's updates


def test_two_statements_with_a_temporary():
    M, K = 4, 6
    src = """def f(float(M,K) A, float(K) x) -> (y) {
        t(m) +=! A(m,k) * x(k)
        y(m) = t(m) * t(m) + 1.0
    }"""
    scop = scop_of(src, M=M, K=K)
    assert instances(scop) == {"S0": M, "S1": M * K, "S2": M}
    assert flops(scop) == 2 * M * K + 2 * M  # the GEMV; then t*t (t(m) read once) and + 1.0
    fp = footprint(scop)
    assert fp.elements == {"A": M * K, "x": K, "y": M, "t": M}
    assert fp.total_bytes == 4 * (M * K + K + M + M)
    assert fp.traffic == 4 * (M * K + K + M)  # the temporary t stays out of the compulsory traffic


def test_strided_and_overlapping_accesses_count_distinct_elements():
    n = 7
    strided = scop_of("def f(float(L) B) -> (C) { C(i) = B(2*i) where i in 0:7 }", L=20)
    fp = footprint(strided)
    assert fp.elements["B"] == n  # B[0], B[2], ..., B[12] of 20
    assert fp.tensors == {"B": 4 * n, "C": 4 * n}
    assert accessed(strided)["B"].is_equal(isl.Set("{ B[e] : 0 <= e <= 12 and e mod 2 = 0 }"))
    window = scop_of("def f(float(L) B) -> (C) { C(i) +=! B(i+j) where i in 0:5, j in 0:3 }", L=9)
    assert instances(window)["S1"] == 15
    assert footprint(window).elements["B"] == 7  # B[0..6]: 15 reads, 7 distinct elements
    shifted = scop_of("def f(double(N) A) -> (B) { B(i) = A(i+1) + A(i) * 2.0 }", N=9)
    assert instances(shifted) == {"S0": 8}  # range inference: i < N-1
    assert flops(shifted) == 2 * 8
    assert footprint(shifted).elements == {"A": 9, "B": 8}


def test_float64_elements_are_eight_bytes():
    n = 9
    scop = scop_of("def f(double(N) A, float(N) B) -> (C) { C(i) = A(i) * 3.0 + double(B(i)) }", N=n)
    fp = footprint(scop)
    assert fp.tensors == {"A": 8 * n, "B": 4 * n, "C": 8 * n}
    assert fp.total_bytes == 20 * n
    assert flops(scop) == 2 * n


def test_data_dependent_read_covers_its_whole_dimension():
    scop = scop_of("def g(float(N) A, int32(K) I) -> (B) { B(k) = A(I(k)) }", N=10, K=3)
    fp = footprint(scop)
    assert fp.elements == {"A": 10, "I": 3, "B": 3}  # an upper bound for A: any element may be read


def test_scalar_parameters_are_one_element():
    scop = scop_of("def f(float(N) A, float alpha) -> (B) { B(i) = alpha * A(i) }", N=4)
    assert footprint(scop).elements == {"A": 4, "alpha": 1, "B": 4}
    assert flops(scop) == 4


def test_counts_on_the_compiled_scop_match_the_built_one():
    """The public path: ``Kernel.specialize`` → the compiled stages' Scop (after promotion: a copy
    statement only moves data, so it adds no FLOPs)."""
    kernel = polyc.define(MATMUL)
    compiled = kernel.specialize(np.zeros((16, 24), np.float32), np.zeros((24, 8), np.float32))
    scop = compiled.stages.scop
    assert flops(scop) == 2 * 16 * 24 * 8
    assert instances(scop)["S1"] == 16 * 24 * 8
    assert footprint(scop).traffic == 4 * (16 * 24 + 24 * 8 + 16 * 8)


def test_functions_are_pure():
    scop = scop_of(MATMUL, M=3, K=2, N=4)
    assert flops(scop) == flops(scop) == 48
    assert footprint(scop) == footprint(scop)


@pytest.mark.parametrize("n", [1, 13])
def test_sizes_one_and_prime(n):
    scop = scop_of(MATMUL, M=n, K=n, N=n)
    assert flops(scop) == 2 * n ** 3
    assert footprint(scop).total_bytes == 3 * 4 * n * n
