"""Semantic analysis: the typed AST (casts, dtypes, identifier kinds, reduction indices) and every error."""
import pytest

from polyc.errors import SemanticError
from polyc.lang import ast as A
from polyc.lang import check_def, format_expr, parse
from polyc.lang.sema import promote_types, widens


def check(source: str) -> A.CheckedDef:
    p = parse(source)
    return check_def(p.defs[0], p.source)


def rhs(source: str, k: int = 0) -> A.Expr:
    return check(source).statements[k].stmt.rhs


def sema_error(source: str) -> SemanticError:
    p = parse(source)
    with pytest.raises(SemanticError) as info:
        check_def(p.defs[0], p.source)
    return info.value


# ---- declarations ----

def test_matmul_checked():
    c = check("def mm(float(M,K) A, float(K,N) B) -> (C) {\n  C(m,n) +=! A(m,k) * B(k,n)\n}")
    (s,) = c.statements
    assert (s.lhs_indices, s.reduction_indices, s.indices) == (("m", "n"), ("k",), ("m", "n", "k"))
    assert [(t.name, t.dtype, t.rank, t.role) for t in c.tensors] == [
        ("A", "float32", 2, "input"), ("B", "float32", 2, "input"), ("C", "float32", 2, "output")]
    assert c.sizes == ("M", "K", "N")
    assert c.tensor("C").dims is None and c.tensor("A").dims == (A.Dim("M"), A.Dim("K"))
    assert s.stmt.rhs == A.Binary("*", A.Access("A", (A.Ident("m", dtype="int32", kind="index"),
                                                      A.Ident("k", dtype="int32", kind="index")), dtype="float32"),
                                  A.Access("B", (A.Ident("k", dtype="int32", kind="index"),
                                                 A.Ident("n", dtype="int32", kind="index")), dtype="float32"),
                                  dtype="float32")


def test_tensor_order_roles_and_temps():
    c = check("def f(float(N) A, float(N,N) B, float s) -> (double(N) O2, O1) {\n"
              " T(i) = A(i) * s\n O1(i) = T(i)\n U(i) = T(i) + 1\n O2(i) = U(i)\n}")
    assert [(t.name, t.role, t.dtype) for t in c.tensors] == [
        ("A", "input", "float32"), ("B", "input", "float32"), ("s", "input", "float32"),
        ("O2", "output", "float64"), ("O1", "output", "float32"), ("T", "temp", "float32"),
        ("U", "temp", "float32")]
    assert [t.name for t in c.temps] == ["T", "U"] and c.tensor("s").rank == 0
    assert c.sizes == ("N",)
    assert c.statements[3].stmt.rhs == A.Cast("float64", A.Access("U", (A.Ident("i", dtype="int32",
                                                                                 kind="index"),), dtype="float32"),
                                              dtype="float64")


def test_identifier_kinds():
    e = rhs("def f(float(N) A, int64 n) -> (O) { O(i) = A(N - 1 - i) + n }")
    acc, scalar = e.lhs, e.rhs
    assert acc.args[0].lhs.lhs == A.Ident("N", dtype="int32", kind="size")
    assert acc.args[0].rhs == A.Ident("i", dtype="int32", kind="index")
    # float32 + int64 -> float32 (an int with a float gives the float type)
    assert e.dtype == "float32" and scalar == A.Cast("float32", A.Ident("n", dtype="int64", kind="scalar"),
                                                     dtype="float32")


def test_reduction_indices_in_order_of_first_occurrence():
    c = check("def f(float(N,M,K) A, float(K) B) -> (O) {\n"
              " O(i) +=! j * A(i, k, j) * B(k) where k in 0:K, l in 0:3\n}")
    assert c.statements[0].reduction_indices == ("j", "k", "l")
    c = check("def f(float(N) A) -> (O) { O(i) +=! x where x = A(r), r in 0:N }")
    assert c.statements[0].reduction_indices == ("r",)


def test_let_bindings_are_substituted_and_dropped():
    s = check("def f(float(N) A) -> (O) { O(i) = y * y where x = A(i), y = x + 1, i in 0:N }").statements[0].stmt
    assert format_expr(s.rhs) == "(A(i) + 1.0) * (A(i) + 1.0)"
    assert all(not isinstance(c, A.LetClause) for c in s.where)
    assert s.where == (A.RangeClause("i", A.Const(0, dtype="int32"), A.Ident("N", dtype="int32", kind="size")),)


def test_data_dependent_read_and_zero_d_tensors():
    c = check("def g(float(N) A, int32(M) I) -> (O, S, P) {\n"
              " O(m) = A(I(m))\n S +=! O(m)\n T() = S + 1\n P(m) = O(m) + T\n}")
    acc = c.statements[0].stmt.rhs
    assert acc.args[0] == A.Access("I", (A.Ident("m", dtype="int32", kind="index"),), dtype="int32")
    assert c.statements[1].lhs_indices == () and c.statements[1].reduction_indices == ("m",)
    assert c.statements[2].stmt.rhs.lhs == A.Access("S", (), dtype="float32")
    assert c.statements[3].stmt.rhs.rhs == A.Access("T", (), dtype="float32")
    s = rhs("def f(float a) -> (O) { O = a() }")
    assert s == A.Ident("a", dtype="float32", kind="scalar")


@pytest.mark.parametrize("src, at", [
    # O is read by S, then updated: TC would compute O completely first (a cycle through T), polyc in order
    ("def g(float(N) A) -> (O, S) {\n O(m) = A(m)\n S +=! O(m)\n T() = S + 1\n O(m) += T\n}", "5:2"),
    ("def g(float(N) A) -> (O, T) {\n T(i) = A(i)\n O(i) = T(i)\n T(i) = A(i) * 2\n}", "4:2"),
])
def test_a_tensor_written_again_after_another_statement_reads_it_is_refused(src, at):
    with pytest.raises(SemanticError, match="written again after a statement reads it") as info:
        check(src)
    assert f":{at}:" in str(info.value)
    # updating a tensor in place, and reading it after its last write, are fine
    check("def g(float(N) A) -> (O, P) {\n O(i) = A(i)\n O(i) = O(i) * 2\n P(i) = O(i)\n}")


# ---- typing ----

def test_literals_adopt_the_operand_type():
    e = rhs("def f(double(N) A) -> (O) { O(i) = A(i) * 2 + 0.5 }")
    assert e.dtype == "float64"
    assert e.lhs.rhs == A.Const(2.0, dtype="float64") and e.rhs == A.Const(0.5, dtype="float64")
    e = rhs("def f(int8(N) A) -> (O) { O(i) = A(i) + 3 }")
    assert e.dtype == "int8" and e.rhs == A.Const(3, dtype="int8")
    e = rhs("def f(int8(N) A) -> (O) { O(i) = A(i) + 300 }")  # does not fit: no adoption
    assert e.dtype == "int32" and e.lhs == A.Cast("int32", A.Access("A", e.lhs.operand.args, dtype="int8"),
                                                  dtype="int32")
    e = rhs("def f(int64(N) A) -> (O) { O(i) = A(i) * 0.5 }")  # float literal next to an int: both float32
    assert e.dtype == "float32" and e.lhs.to == "float32" and e.rhs == A.Const(0.5, dtype="float32")
    e = rhs("def f(int16(N) A) -> (O) { O(i) = -1 * A(i) }")
    assert e.lhs == A.Unary("-", A.Const(1, dtype="int16"), dtype="int16")
    e = rhs("def f() -> (O) { O(i) = 1 + 2.5 }")
    assert e.dtype == "float32" and e.lhs == A.Const(1.0, dtype="float32")
    assert check("def f() -> (O) { O(i) = 3000000000 }").tensor("O").dtype == "int64"


def test_numpy_promotion_and_casts():
    e = rhs("def f(int8(N) A, uint8(N) B) -> (O) { O(i) = A(i) + B(i) }")
    assert e.dtype == "int16" and e.lhs.to == "int16" and e.rhs.to == "int16"
    e = rhs("def f(float(N) A, double(N) B) -> (O) { O(i) = A(i) - B(i) }")
    assert e.dtype == "float64" and isinstance(e.lhs, A.Cast) and e.rhs.dtype == "float64"
    e = rhs("def f(bool(N) A) -> (O) { O(i) = A(i) + A(i) }")
    assert e.dtype == "int32"
    assert promote_types("uint64", "int64") == "float64" and promote_types("int64", "float32") == "float32"


def test_comparisons_logic_and_select():
    e = rhs("def f(float(N) A, int32(N) B) -> (O) { O(i) = A(i) < B(i) && B(i) }")
    assert e.dtype == "bool"
    assert e.lhs.dtype == "bool" and e.lhs.lhs.dtype == "float32" and e.lhs.rhs.to == "float32"
    assert e.rhs == A.Binary("!=", e.rhs.lhs, A.Const(0, dtype="int32"), dtype="bool")
    e = rhs("def f(float(N) A) -> (O) { O(i) = !A(i) }")
    assert e.operand.op == "!=" and e.operand.rhs == A.Const(0.0, dtype="float32") and e.dtype == "bool"
    e = rhs("def f(float(N) A, double(N) B) -> (O) { O(i) = A(i) ? B(i) : 1 }")
    assert e.dtype == "float64" and e.cond.dtype == "bool" and e.other == A.Const(1.0, dtype="float64")


def test_builtins():
    e = rhs("def f(int32(N) A) -> (O) { O(i) = exp(A(i)) }")
    assert e.dtype == "float32" and e.args[0].to == "float32"
    e = rhs("def f(double(N) A) -> (O) { O(i) = pow(A(i), 2) + fma(A(i), 1, 0.5) }")
    assert e.lhs.args[1] == A.Const(2.0, dtype="float64") and e.rhs.dtype == "float64"
    e = rhs("def f(int8(N) A) -> (O) { O(i) = max(A(i), 0) + abs(A(i)) }")
    assert e.dtype == "int8" and e.lhs.args[1] == A.Const(0, dtype="int8")
    e = rhs("def f(int8(N) A, int16(N) B) -> (O) { O(i) = fmin(A(i), B(i)) }")
    assert e.dtype == "int16" and e.args[0].to == "int16"


def test_assignment_widens_with_a_cast():
    c = check("def f(int8(N) A, float(N) B) -> (int64(N) O, double(N) P, float(N) Q) {\n"
              " O(i) = A(i)\n P(i) = B(i)\n Q(i) = 0\n Q(i) += A(i) > 0\n}")
    assert c.statements[0].stmt.rhs.to == "int64"
    assert c.statements[1].stmt.rhs.to == "float64"
    assert c.statements[2].stmt.rhs == A.Const(0.0, dtype="float32")
    assert c.statements[3].stmt.rhs == A.Cast("float32", c.statements[3].stmt.rhs.operand, dtype="float32")
    assert widens("uint8", "int16") and not widens("uint8", "int8") and not widens("int32", "uint64")
    assert widens("int64", "float32") and not widens("float64", "float32") and widens("bool", "uint8")


def test_explicit_cast_allows_narrowing():
    e = rhs("def f(float(N) A) -> (int32(N) O) { O(i) = int32(A(i)) }")
    assert e == A.Cast("int32", e.operand, dtype="int32") and e.operand.dtype == "float32"


def test_range_clauses_are_typed():
    s = check("def f(float(N) A) -> (O) { O(i) +=! A(k) where k in 1:N - 1 }").statements[0].stmt
    assert s.where[0].hi.dtype == "int32" and s.where[0].hi.lhs.kind == "size"


# ---- errors ----

@pytest.mark.parametrize("source, message, line, col", [
    ("def f(float(M,K) A) -> (C) {\n  C(m) +=! A(m,k) * q\n}", "undefined variable 'q'", 2, 21),
    ("def f(float(M,K) A) -> (C) {\n  C(m) = A(m,k)\n}", "reduction index 'k' used without a reduction operator",
     2, 14),
    ("def f(float(N) A) -> (C) {\n  C(i) = A(i)\n  A(i) = 0\n}", "cannot assign to input 'A'", 3, 3),
    ("def f(float(N) A) -> (C) {\n  C(i) = T(i)\n  T(i) = A(i)\n}", "tensor 'T' is read before it is written",
     2, 10),
    ("def f(float(N) A) -> (C) {\n  C(i) = foo(i)\n}", "undefined tensor or function 'foo'", 2, 10),
    ("def f(float(N,M) A) -> (C) {\n  C(i) +=! A(i, j, 0)\n}",
     "tensor 'A' has rank 2 but is accessed with 3 indices", 2, 12),
    ("def f(float(N) A) -> (C) {\n  C(i) = A(i)\n  C(i, j) = 0\n}",
     "'C' is first written with rank 1 but written here with rank 2", 3, 3),
    ("def f(float(N) A) -> (float(N, N) C) {\n  C(i) = A(i)\n}",
     "'C' is declared with rank 2 but written here with rank 1", 2, 3),
    ("def f(float(N) A) -> (C, D) {\n  C(i) = A(i)\n}", "output 'D' is never written", 1, 26),
    ("def f(float(N) A) -> (C) {\n  C(i) = A(i * 0.5)\n}", "non-integral index: argument 1 of 'A' has type float32",
     2, 12),
    ("def f(float(N) A) -> (int32(N) C) {\n  C(i) = A(i)\n}",
     "narrowing conversion from float32 to int32 in assignment to 'C'; use an explicit cast such as int32(...)",
     2, 10),
    ("def f(double(N) A) -> (C) {\n  C(i) = float(A(i))\n  C(i) += A(i)\n}",
     "narrowing conversion from float64 to float32 in assignment to 'C'", 3, 11),
    ("def f(float(N) A) -> (C) {\n  C(i, i) = A(i)\n}", "index 'i' is repeated on the left-hand side of 'C'", 2, 8),
    ("def f(float(N) A) -> (C) {\n  C(N) = A(0)\n}", "size 'N' is used as an index variable", 2, 5),
    ("def f(float(N) A) -> (C) {\n  C(i) = pow(A(i))\n}", "'pow' takes 2 arguments, got 1", 2, 10),
    ("def f(float(N) A) -> (C) {\n  C(i) +=! A(k) where k in 0:i\n}", "the range of 'k' uses 'i'", 2, 30),
    ("def f(float(N) A) -> (C) {\n  T(i) += A(i)\n  C(i) = T(i)\n}",
     "temporary 'T' is first written with '+=', which reads its uninitialized value", 2, 3),
    ("def f(float(N) A, float(N) A) -> (C) {\n  C(i) = 1\n}", "input 'A' is declared twice", 1, 19),
    ("def f(float(N) A) -> (A) {\n  A(i) = 1\n}", "'A' is both an input and an output", 1, 23),
    ("def f(float(N) A) -> (float(P) C) {\n  C(i) = 1\n}", "size 'P' of output 'C' is not a size of any input",
     1, 29),
    ("def f(float a) -> (C) {\n  C(i) = a(i)\n}", "scalar parameter 'a' takes no indices", 2, 10),
    ("def f(float(N) exp) -> (C) {\n  C(i) = 1\n}", "input 'exp' has the name of a builtin function", 1, 7),
    ("def f(float(N) A) -> (C) {\n  C(i) = A(i) + N(i)\n}", "size 'N' is used like a tensor", 2, 17),
    ("def f(float(N) A) -> (C) {\n  C(i) = T(i) + 1\n}", "undefined tensor or function 'T'", 2, 10),
    ("def f(float(N) A) -> (C) {\n  C(i) = x where x = A(i), x = 2\n}",
     "where binding 'x' reuses a name already in use", 2, 28),
    ("def f(float(N) A) -> (C) {\n  T(i) = T(i - 1) + A(i)\n  C(i) = T(i)\n}",
     "'T' is read in the statement that first writes it, so its type is unknown", 2, 10),
    ("def f(float(N) A) -> (C) {\n  C(i) +=! A(k) where k in 0:N, k in 0:2\n}", "index 'k' has two ranges", 2, 33),
])
def test_semantic_errors(source, message, line, col):
    err = sema_error(source)
    assert message in err.message
    assert (err.span.line, err.span.col) == (line, col)
    assert err.hint
    assert err.source == source


def test_error_renders_the_source_line_with_a_caret():
    text = str(sema_error("def f(float(M,K) A) -> (C) {\n  C(m) +=! A(m,k) * q\n}"))
    assert text.splitlines() == ["<source>:2:21: undefined variable 'q'", "      C(m) +=! A(m,k) * q",
                                 "                        ^",
                                 "hint: declare 'q' as a parameter, use it as an index of a tensor, "
                                 "or bind it with a where clause"]


def test_hand_built_defs_are_checked_too():
    deep = A.Const(1)
    for _ in range(1000):
        deep = A.Unary("-", deep)
    d = A.Def("f", (), (A.Output("O"),), (A.Statement("O", (), "=", deep),))
    with pytest.raises(SemanticError, match="nested too deeply"):
        check_def(d)
    d = A.Def("f", (), (A.Output("O"),), (A.Statement("O", (), "=", A.Call("frob", (A.Const(1),))),))
    with pytest.raises(SemanticError, match="unknown function 'frob'"):
        check_def(d)


def test_exploding_where_bindings_are_rejected():
    lets = ", ".join(f"x{k + 1} = x{k} * x{k}" for k in range(40))
    line = f"  O(i) = x40 where x0 = A(i), {lets}"
    err = sema_error(f"def f(float(N) A) -> (O) {{\n{line}\n}}")
    assert "the where bindings expand this expression too much (24575 nodes" in err.message
    assert (err.span.line, err.span.col) == (2, line.index("x12 * x12") + 1)
