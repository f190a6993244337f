"""einsum subscripts → TC text: the text parses and checks, and numpy's letter rules hold."""
import numpy as np
import pytest

from polyc.errors import PolycError, ShapeError, UnsupportedError
from polyc.lang import check_def, parse
from polyc.lang.einsum import einsum_source, parse_subscripts


def checked(subscripts, shapes, dtypes):
    text, name = einsum_source(subscripts, shapes, dtypes)
    program = parse(text)
    assert [d.name for d in program.defs] == [name]
    return text, check_def(program.defs[0], program.source)


CASES = [
    ("ij,jk->ik", [(2, 3), (3, 4)], ["float32", "float32"]),
    ("ik,kj", [(3, 4), (4, 5)], ["float64", "float64"]),
    ("ij->ji", [(3, 7)], ["int32"]),
    ("ij->", [(3, 7)], ["float32"]),
    ("ii->i", [(5, 5)], ["float32"]),
    ("ii", [(5, 5)], ["int64"]),
    ("iij->ji", [(3, 3, 2)], ["float32"]),
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)], ["float32", "float32"]),
    ("i,j->ij", [(3,), (1,)], ["float32", "float32"]),
    ("ij,ij->ij", [(3, 1), (3, 4)], ["int64", "float32"]),
    ("i,i", [(4,), (4,)], ["bool", "bool"]),
    (",ij->ij", [(), (2, 3)], ["float64", "int8"]),
    ("bA", [(2, 3)], ["uint8"]),
    ("Ba,aB", [(2, 3), (3, 2)], ["int16", "uint16"]),
    (" i j , j k -> i k ", [(2, 3), (3, 4)], ["float32", "float32"]),
]


@pytest.mark.parametrize("subscripts, shapes, dtypes", CASES)
def test_source_parses_checks_and_matches_numpy(subscripts, shapes, dtypes):
    text, c = checked(subscripts, shapes, dtypes)
    ops = [np.ones(s, dtype=d) for s, d in zip(shapes, dtypes)]
    expected = np.einsum(subscripts, *ops)
    (out,) = c.outputs
    assert out.name == "out" and out.dtype == expected.dtype.name and out.rank == expected.ndim
    extents = {}
    for t, shape in zip(c.inputs, shapes):
        for d, n in zip(t.dims, shape):
            if isinstance(d.value, str):
                extents[d.value] = n
            else:
                assert d.value == n == 1
    assert tuple(extents[d.value] for d in out.dims) == expected.shape
    (s,) = c.statements
    inputs, output = parse_subscripts(subscripts, len(shapes))
    summed = {ch for sub in inputs for ch in sub} - set(output)
    assert s.lhs_indices == tuple(output)
    assert set(s.reduction_indices) == summed
    if summed:
        assert s.stmt.op == ("max=!" if out.dtype == "bool" else "+=!")
    else:
        assert s.stmt.op == "="


def test_matmul_text():
    text, name = einsum_source("ij,jk->ik", [(2, 3), (3, 4)], ["float32", "float32"])
    assert name == "einsum_ij_jk_to_ik"
    assert text == ("def einsum_ij_jk_to_ik(float32(N_i, N_j) in0, float32(N_j, N_k) in1) -> "
                    "(float32(N_i, N_k) out) {\n    out(i, k) +=! in0(i, j) * in1(j, k)\n}\n")


def test_diagonal_trace_broadcast_and_casts():
    assert "out(i) = in0(i, i)" in einsum_source("ii->i", [(3, 3)], ["float32"])[0]
    assert "out() +=! in0(i, i)" in einsum_source("ii->", [(3, 3)], ["float32"])[0]
    text = einsum_source("ij,ij->ij", [(3, 1), (3, 4)], ["int64", "float32"])[0]
    assert "int64(N_i, 1) in0" in text and "out(i, j) = float64(in0(i, 0)) * float64(in1(i, j))" in text
    text = einsum_source("i,i", [(4,), (4,)], ["bool", "bool"])[0]
    assert "-> (bool out)" in text and "out() max=! in0(i) && in1(i)" in text


@pytest.mark.parametrize("subscripts, n, expected", [
    ("ij,jk", 2, (["ij", "jk"], "ik")),
    ("ba", 1, (["ba"], "ab")),
    ("bA", 1, (["bA"], "Ab")),
    ("ii", 1, (["ii"], "")),
    ("ij,jk->", 2, (["ij", "jk"], "")),
    ("i,i->i", 2, (["i", "i"], "i")),
    ("iij", 1, (["iij"], "j")),
])
def test_letter_rules(subscripts, n, expected):
    assert parse_subscripts(subscripts, n) == expected


@pytest.mark.parametrize("subscripts, shapes, error, message", [
    ("ij,jk->ik", [(2, 3)], PolycError, "name 2 operands but 1 were given"),
    ("i$,j->i", [(2, 3), (3,)], PolycError, "contain the invalid character '$'"),
    ("ij->ii", [(2, 3)], PolycError, "output subscript 'ii' repeats the letter 'i'"),
    ("ij->k", [(2, 3)], PolycError, "output letter 'k' does not appear in any input"),
    ("ij->i->j", [(2, 3)], PolycError, "more than one '->'"),
    ("ij->i,j", [(2, 3)], PolycError, "have a ',' in the output"),
    ("i.j", [(2, 3)], PolycError, "contain a '.' outside an ellipsis"),
    ("...ij->...ji", [(2, 3)], UnsupportedError, "ellipsis ('...') broadcasting is not supported"),
    ("ijk->i", [(2, 3)], ShapeError, "einsum operand 0 has rank 2 but its subscript 'ijk' has 3 letters"),
    ("ij,jk->ik", [(2, 3), (4, 5)], ShapeError, "einsum letter 'j' has extent 3 in one place and 4 in operand 1"),
])
def test_bad_subscripts(subscripts, shapes, error, message):
    with pytest.raises(error) as info:
        einsum_source(subscripts, shapes, ["float32"] * len(shapes))
    assert message in info.value.message


def test_bad_dtypes():
    with pytest.raises(UnsupportedError, match="complex64 is not supported yet"):
        einsum_source("i->i", [(3,)], ["complex64"])
    with pytest.raises(PolycError, match="1 shapes but 2 dtypes"):
        einsum_source("i->i", [(3,)], ["float32", "float32"])
    with pytest.raises(PolycError, match="unknown dtype"):
        einsum_source("i->i", [(3,)], ["floaty"])
    assert "float64(N_i) in0" in einsum_source("i->i", [(3,)], [np.float64])[0]
