"""The lexer, the parser and the printer: trees, spans, error messages with positions, round trips."""
import pytest

from polyc.errors import ParseError, PolycError, Span
from polyc.lang import ast as A
from polyc.lang import format_expr, format_program, parse
from polyc.lang.lexer import tokenize
from polyc.lang.parser import MAX_DEPTH, MAX_NESTING

MATMUL = """\
def matmul(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n)
}
"""


def rhs_of(expr_text: str) -> A.Expr:
    """The right-hand side of ``O(i) = <expr_text>`` in a one-statement def."""
    return parse(f"def f() -> (O) {{ O(i) = {expr_text} }}").defs[0].statements[0].rhs


def parse_error(source: str) -> ParseError:
    with pytest.raises(ParseError) as info:
        parse(source)
    return info.value


# ---- lexer ----

def test_tokens_and_newlines():
    toks = tokenize("C(m) +=! A(m)  # comment\nD max=! 1.5e-3")
    assert [t.text for t in toks] == ["C", "(", "m", ")", "+=!", "A", "(", "m", ")", "D", "max", "=", "!",
                                      "1.5e-3", ""]
    assert [t.newline_before for t in toks][9] is True
    assert toks[4].span == Span(1, 6, 1, 9)
    assert toks[13].kind == "float" and toks[13].value == 1.5e-3


def test_number_kinds():
    kinds = [(t.kind, t.value) for t in tokenize("1 2.5 .5 3. 1e9 7E-2")[:-1]]
    assert kinds == [("int", 1), ("float", 2.5), ("float", 0.5), ("float", 3.0), ("float", 1e9), ("float", 0.07)]


# ---- trees ----

def test_matmul_tree():
    p = parse(MATMUL)
    (d,) = p.defs
    assert d.name == "matmul"
    assert d.params == (A.Param("A", "float32", (A.Dim("M"), A.Dim("K"))),
                        A.Param("B", "float32", (A.Dim("K"), A.Dim("N"))))
    assert d.outputs == (A.Output("C"),)
    (s,) = d.statements
    assert s.tensor == "C" and s.op == "+=!" and s.reduction_op == "+=" and s.initializes
    assert s.indices == (A.IndexVar("m"), A.IndexVar("n"))
    assert s.rhs == A.Binary("*", A.Access("A", (A.Ident("m"), A.Ident("k"))),
                             A.Access("B", (A.Ident("k"), A.Ident("n"))))
    assert s.span == Span(2, 5, 2, 31)
    assert s.rhs.span == Span(2, 16, 2, 31)
    assert p.source == MATMUL


def test_types_are_canonical_and_dims_may_be_literals():
    d = parse("def f(double(M,256) L, float alpha, uint8 b) -> (float64(M) O, int16 s, Q) { O(i) = 1 }").defs[0]
    assert [(p.name, p.dtype, p.dims) for p in d.params] == [
        ("L", "float64", (A.Dim("M"), A.Dim(256))), ("alpha", "float32", ()), ("b", "uint8", ())]
    assert d.outputs == (A.Output("O", "float64", (A.Dim("M"),)), A.Output("s", "int16", ()), A.Output("Q"))


def test_precedence_and_associativity():
    assert format_expr(rhs_of("a + b * c - d")) == "a + b * c - d"
    e = rhs_of("a - b - c")
    assert e == A.Binary("-", A.Binary("-", A.Ident("a"), A.Ident("b")), A.Ident("c"))
    e = rhs_of("a ? b : c ? d : e")
    assert e == A.Select(A.Ident("a"), A.Ident("b"), A.Select(A.Ident("c"), A.Ident("d"), A.Ident("e")))
    e = rhs_of("a || b && c == d < e + f * -g")
    assert e.op == "||" and e.rhs.op == "&&" and e.rhs.rhs.op == "==" and e.rhs.rhs.rhs.op == "<"
    assert e.rhs.rhs.rhs.rhs.rhs.rhs == A.Unary("-", A.Ident("g"))
    assert rhs_of("(a + b) * c") == A.Binary("*", A.Binary("+", A.Ident("a"), A.Ident("b")), A.Ident("c"))


def test_calls_casts_and_accesses():
    e = rhs_of("exp(x) + float(i) + int32(X(B(i))) + max(a, b)")
    assert e.lhs.lhs.lhs == A.Call("exp", (A.Ident("x"),))
    assert e.lhs.lhs.rhs == A.Cast("float32", A.Ident("i"))
    assert e.lhs.rhs == A.Cast("int32", A.Access("X", (A.Access("B", (A.Ident("i"),)),)))
    assert e.rhs == A.Call("max", (A.Ident("a"), A.Ident("b")))


def test_all_assignment_operators():
    for op in A.ASSIGN_OPS:
        s = parse(f"def f() -> (O) {{ O(i) {op} 1 }}").defs[0].statements[0]
        assert s.op == op
    s = parse("def f() -> (O) { O max=!x }").defs[0].statements[0]
    assert (s.op, s.indices, s.rhs) == ("max=!", (), A.Ident("x"))
    s = parse("def f() -> (O) { O min= !x }").defs[0].statements[0]
    assert (s.op, s.rhs) == ("min=", A.Unary("!", A.Ident("x")))


def test_where_clauses():
    s = parse("def f() -> (O) {\n O(i) +=! A(i, k) * x\n   where k in 0:K - 1, exists B(i), x = 2 * i\n}"
              ).defs[0].statements[0]
    assert s.where == (A.RangeClause("k", A.Const(0), A.Binary("-", A.Ident("K"), A.Const(1))),
                       A.ExistsClause(A.Access("B", (A.Ident("i"),))),
                       A.LetClause("x", A.Binary("*", A.Const(2), A.Ident("i"))))
    assert s.where[0].span == Span(3, 10, 3, 22)


def test_statement_separators_and_several_defs():
    p = parse("def f(float(N) A) -> (B, C) {\n B(i) = A(i); C(i) = B(i);;\n\n C(i) += 1\n}\n"
              "# a comment\ndef g() -> (D) { D = 0 }")
    assert [len(d.statements) for d in p.defs] == [3, 1]
    assert p.defs[1].statements[0].indices == ()


def test_empty_source_has_no_defs():
    assert parse("  # nothing\n").defs == ()


# ---- errors with positions ----

@pytest.mark.parametrize("source, message, line, col", [
    ("def f() -> (O) {\n  O(i) = a @ b\n}", "unexpected character '@'", 2, 12),
    ("def f() -> (O) { O(i) = 1.2.3 }", "malformed number '1.2.3'", 1, 25),
    ("def f() -> (O) { O(i) = 99999999999999999999 }", "integer literal 99999999999999999999 is out of range", 1, 25),
    ("def f() -> (O) { O(i) = 1e400 }", "float literal '1e400' is out of range", 1, 25),
    ("deff f() -> (O) {}", "expected 'def', found 'deff'", 1, 1),
    ("def f() -> (O) {\n  O(i+1) = 0\n}", "the left-hand side takes index variables only", 2, 5),
    ("def f() -> (O) { O(i) = A(i) B(i) = 2 }", "expected a newline or ';' after the statement, found 'B'", 1, 30),
    ("def f() -> (O) { O(i) == 2 }", "expected an assignment operator, found '=='", 1, 23),
    ("def f() -> (O) { O(i) max = 2 }", "expected an assignment operator, found 'max'", 1, 23),
    ("def f(floot(N) A) -> (O) {}", "expected a type such as float or int32, found 'floot'", 1, 7),
    ("def f() -> (O) { O(i) = float + 1 }", "type name 'float' used as a value", 1, 25),
    ("def f() -> (O) { O(i) = int32(a, b) }", "a cast to int32 takes one argument, got 2", 1, 25),
    ("def f(float(N) A) -> (O) {\n O(i) = A(i)\n", "expected '}' to close the def body, found end of input", 3, 1),
    ("def f() -> (O) { O(i) = 1 where k on 0:N }", "expected 'in' or '=' after 'k' in a where clause", 1, 35),
    ("def f(float(N) int32) -> (O) {}", "'int32' is a type name and cannot be used as an input name", 1, 16),
    ("def f() -> O { }", "expected '(' before the outputs, found 'O'", 1, 12),
    ("def f() -> (O) { O(i) = (1 + 2 }", "expected ')' to close the parenthesis, found '}'", 1, 32),
    ("def f() -> (O) { O(i) = 1 where in in 0:N }", "expected a where clause", 1, 33),
])
def test_parse_errors(source, message, line, col):
    err = parse_error(source)
    assert message in err.message
    assert (err.span.line, err.span.col) == (line, col)
    assert err.source == source


def test_error_renders_caret_and_filename():
    err = None
    with pytest.raises(ParseError) as info:
        parse("def f() -> (O) {\n  O(i+1) = 0\n}", filename="k.tc")
    err = info.value
    text = str(err)
    assert text.splitlines()[:3] == ["k.tc:2:5: the left-hand side takes index variables only",
                                     "      O(i+1) = 0", "        ^^^"]
    assert "hint:" in text


def test_deep_nesting_is_a_parse_error():
    err = parse_error("def f() -> (O) { O(i) = " + "(" * 5000 + "1" + ")" * 5000 + " }")
    assert f"nested too deeply (more than {MAX_NESTING} levels)" in err.message
    err = parse_error("def f() -> (O) { O(i) = " + "-" * 5000 + "1 }")
    assert "nested too deeply" in err.message
    err = parse_error("def f() -> (O) { O(i) = " + " + ".join(["a"] * 1000) + " }")
    assert f"more than {MAX_DEPTH} levels" in err.message
    assert parse("def f() -> (O) { O(i) = " + "(" * 50 + "1" + ")" * 50 + " }")


def test_only_polyc_errors_escape():
    for text in ["", "def", "def f(", "def f(float", "def f() ->", "}", "def f() -> () {}", "\x00", "é"]:
        try:
            parse(text)
        except PolycError:
            pass


# ---- printing ----

def test_round_trip_of_a_full_program():
    src = """def mm(float(M,K) A, float(K,N) B, float alpha) -> (C, double(M) D, int8 s) {
  C(m,n) +=! A(m,k) * B(k,n) * alpha  # comment
     where k in 0:K
  D(m) max=! C(m,n) > 0 ? -C(m,n) : 1.5e-3; s = 3 - (4 - 5) + (a ? b : c ? d : e)
  F(i) = !!x && (y || z) where x = 1e300, exists q(i), i in (a?1:2):N
  G(i) min= !-(a % b / c) != d
}
def g() -> (O) { O = 0.1 + 3.0 }"""
    p = parse(src)
    printed = format_program(p)
    assert parse(printed) == p
    assert format_program(parse(printed)) == printed
    assert printed.splitlines()[0] == "def mm(float32(M, K) A, float32(K, N) B, float32 alpha) -> " \
                                      "(C, float64(M) D, int8 s) {"
    assert "    C(m, n) +=! A(m, k) * B(k, n) * alpha where k in 0:K" in printed
    assert "    s() = 3 - (4 - 5) + (a ? b : c ? d : e)" in printed
    assert "    G(i) min= !-(a % b / c) != d" in printed
