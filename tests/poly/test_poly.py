"""The polyhedral stages: range inference, domains and accesses, dependences, schedules, the verifier."""
import islpy as isl
import pytest

from polyc.errors import CompileError, RangeError
from polyc.lang import check_def, parse
from polyc.options import Options
from polyc.poly.build import build_scop
from polyc.poly.deps import compute_dependences
from polyc.poly.schedule import compute_schedule
from polyc.poly.verify import check_schedule


def scop_of(source, **sizes):
    program = parse(source)
    return build_scop(check_def(program.defs[0], source), sizes)


def ranges_of(scop, stmt):
    return {index: r for (s, index), r in scop.ranges.items() if s == stmt}


def test_conv_ranges_are_the_largest_in_bounds():
    scop = scop_of("""
def conv(float(N,C,H,W) I, float(O,C,KH,KW) Wt) -> (Out) {
    Out(n,o,h,w) +=! I(n,c,h+kh,w+kw) * Wt(o,c,kh,kw)
}""", N=1, C=3, H=10, W=7, O=4, KH=3, KW=2)
    assert ranges_of(scop, "S1") == {"n": (0, 1), "o": (0, 4), "h": (0, 8), "w": (0, 6), "c": (0, 3),
                                     "kh": (0, 3), "kw": (0, 2)}
    assert scop.tensor("Out").shape == (1, 4, 8, 6)


def test_strided_range_uses_floor():
    scop = scop_of("""
def s2(float(H) I, float(K) Wt) -> (O) {
    O(h) +=! I(2*h+k) * Wt(k)
}""", H=11, K=3)
    # 0 <= 2h + k < 11 for every k in 0..2  <=>  h <= 4
    assert ranges_of(scop, "S1")["h"] == (0, 5)
    assert scop.tensor("O").shape == (5,)


def test_where_range_comes_first_and_guarded_reads_are_in_bounds():
    scop = scop_of("""
def pad(float(N) A) -> (B) {
    B(i) = (i >= 1 && i <= N) ? A(i-1) : 0.0 where i in 0:N+2
}""", N=5)
    assert scop.tensor("B").shape == (7,)
    read = scop.statements[0].reads
    # the read of A happens only under the guard
    assert read.is_equal(isl.UnionMap("{ S0[i] -> A[i - 1] : 1 <= i <= 5 }"))


def test_unguarded_read_out_of_bounds_is_an_error():
    with pytest.raises(RangeError, match="access to 'A' leaves its shape"):
        scop_of("""
def shift(float(N) A) -> (B) {
    B(i) = A(i+1) where i in 0:N
}""", N=5)


def test_index_without_range_is_an_error_with_a_hint():
    with pytest.raises(RangeError, match="cannot infer the range of index 'i'") as info:
        scop_of("""
def f(float(N) A) -> (B) {
    B(i) = A(0) * 2.0
}""", N=5)
    assert "where i in" in str(info.value)


def test_empty_range_is_an_error():
    with pytest.raises(RangeError, match="empty"):
        scop_of("""
def conv1(float(H) I, float(K) Wt) -> (O) {
    O(h) +=! I(h+k) * Wt(k)
}""", H=2, K=3)


def test_gather_is_over_approximated_to_the_whole_dimension():
    scop = scop_of("""
def gather(float(N) A, int32(M) Idx) -> (B) {
    B(i) = A(Idx(i))
}""", N=6, M=4)
    reads = scop.statements[0].reads
    assert reads.is_equal(isl.UnionMap("{ S0[i] -> A[o] : 0 <= i < 4 and 0 <= o < 6; S0[i] -> Idx[i] : 0 <= i < 4 }"))


SOFTMAX = """
def softmax(float(N,D) X) -> (Y) {
    mx(n) max=! X(n,d)
    e(n,d) = exp(X(n,d) - mx(n))
    s(n) +=! e(n,d)
    Y(n,d) = e(n,d) / s(n)
}"""


def test_dependences_of_a_multi_statement_def():
    scop = scop_of(SOFTMAX, N=3, D=5)
    assert [t.role for t in scop.tensors] == ["input", "output", "temp", "temp", "temp"]
    deps = compute_dependences(scop)
    # e reads mx after the whole reduction: flow from the last max= instance (d = 4) only
    raw = deps.raw.extract_map(isl.Space.create_from_names(isl.DEFAULT_CONTEXT, in_=["n", "d"],
                                                           out=["n2", "d2"]).set_tuple_name(
        isl.dim_type.in_, "S1").set_tuple_name(isl.dim_type.out, "S2"))
    assert raw.is_equal(isl.Map("{ S1[n, d] -> S2[n, d2] : 0 <= n < 3 and d = 4 and 0 <= d2 < 5 }"))


@pytest.mark.parametrize("options", [Options(), Options(fusion="min"), Options(fusion="max"),
                                     Options(scheduler="identity")], ids=lambda o: o.to_spec() or "default")
def test_every_schedule_respects_the_dependences(options):
    scop = scop_of(SOFTMAX, N=3, D=5)
    deps = compute_dependences(scop)
    check_schedule(compute_schedule(scop, deps, options), scop, deps, "test")


def test_the_verifier_rejects_a_reversed_reduction():
    scop = scop_of("""
def cumsum(float(N) A) -> (float(N) B) {
    B(i) = A(i) where i in 0:1
    B(i) += B(i-1) + A(i) where i in 1:N
}""", N=6)
    deps = compute_dependences(scop)
    good = compute_schedule(scop, deps, Options())
    check_schedule(good, scop, deps, "good")
    bad = isl.Schedule.from_domain(scop.domain).insert_partial_schedule(
        isl.MultiUnionPwAff("[{ S0[i] -> [(0)]; S1[i] -> [(-i)] }]"))
    with pytest.raises(CompileError, match="violates dependences"):
        check_schedule(bad, scop, deps, "bad")


def test_guarded_reads_do_not_shrink_ranges():
    # the read of X runs only where the guard holds, so it must not restrict kh: padding stays correct
    scop = scop_of("""
def conv_pad1(float(H) X, float(K) F) -> (Y) {
    Y(h) +=! ((h+k-1 >= 0 && h+k-1 < H) ? X(h+k-1) : 0.0) * F(k) where h in 0:H
}""", H=6, K=3)
    assert ranges_of(scop, "S1") == {"h": (0, 6), "k": (0, 3)}
