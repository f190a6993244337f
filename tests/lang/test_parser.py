"""The lexer, the parser and the printer: trees, spans, error messages with positions, round trips."""
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyc
from polyc.errors import ParseError, PolycError, Span
from polyc.lang import ast as A
from polyc.lang import check_def, format_expr, format_program, parse
from polyc.lang.printer import format_statement
from polyc.lang.lexer import tokenize
from polyc.lang.parser import MAX_DEPTH, MAX_NESTING
from test_lang_fuzz import exprs, names, statements

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


def test_spans_after_tabs_comments_and_line_breaks_and_ascii_only_identifiers():
    toks = tokenize("a\t# x\n  T.12 in.1\n\n\tb1_")
    assert [(t.kind, t.text, t.span) for t in toks] == [
        ("ident", "a", Span(1, 1, 1, 2)), ("ident", "T.12", Span(2, 3, 2, 7)), ("keyword", "in", Span(2, 8, 2, 10)),
        ("float", ".1", Span(2, 10, 2, 12)), ("ident", "b1_", Span(4, 2, 4, 5)), ("eof", "", Span(4, 5, 4, 6))]
    for bad, message, col in (("x = 2x", "malformed number '2x'", 5), ("x = 1.2.3", "malformed number '1.2.3'", 5),
                              ("x = \u0661", "unexpected character", 5), ("\u00e9", "unexpected character", 1)):
        with pytest.raises(ParseError, match=message) as info:
            tokenize(bad)
        assert info.value.span.col == col


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


# ---- TC's equivalent-library-call annotation: '<=> name(args)' ----

def test_equivalent_annotation_is_kept_as_metadata():
    src = "def mm(float(M,K) A, float(K,N) B) -> (C) {\n    C(m, n) +=! A(m, k) * B(k, n) <=> matmul(A, B)\n}"
    (s,) = parse(src).defs[0].statements
    assert s.equivalent == A.Equivalent("matmul", (A.Ident("A"), A.Ident("B")))
    assert s.equivalent.span == Span(2, 35, 2, 51)
    assert s.span == Span(2, 5, 2, 51)
    assert s.rhs == A.Binary("*", A.Access("A", (A.Ident("m"), A.Ident("k"))),
                             A.Access("B", (A.Ident("k"), A.Ident("n"))))
    # TC's own test writes accesses as the arguments; any expressions are taken, and no arguments at all
    s = parse("def f() -> (O) { O(i, j) +=! A(i, k) * B(k, j) <=> matmul(A(i, k), B(k, j)) }").defs[0].statements[0]
    assert s.equivalent.args == (A.Access("A", (A.Ident("i"), A.Ident("k"))),
                                 A.Access("B", (A.Ident("k"), A.Ident("j"))))
    assert parse("def f() -> (O) { O(i) = 1 <=> fill() }").defs[0].statements[0].equivalent == A.Equivalent("fill")


def test_equivalent_before_or_after_the_where_clauses():
    """TC's parser reads the annotation right after the expression, before 'where'; polyc also takes it after
    the where clauses (no ambiguity: '<=>' continues no expression). Both give the same statement."""
    before = parse("def f() -> (O) { O(i) = A(i + 1) <=> shift(A) where i in 0:N }").defs[0].statements[0]
    after = parse("def f() -> (O) { O(i) = A(i + 1) where i in 0:N <=> shift(A) }").defs[0].statements[0]
    assert before == after and before.equivalent == after.equivalent == A.Equivalent("shift", (A.Ident("A"),))
    assert before.where == (A.RangeClause("i", A.Const(0), A.Ident("N")),)
    assert format_statement(after) == "O(i) = A(i + 1) <=> shift(A) where i in 0:N"


def test_equivalent_does_not_change_equality_or_hash():
    """The annotation is metadata (compare=False, like spans): it does not change what the statement
    computes, so an annotated statement equals, and hashes like, the plain one."""
    plain = parse("def f(float(N) A) -> (O) { O(i) = A(i) }")
    annotated = parse("def f(float(N) A) -> (O) { O(i) = A(i) <=> copy(A) }")
    assert plain == annotated and hash(plain.defs[0]) == hash(annotated.defs[0])
    assert annotated.defs[0].statements[0].equivalent is not None


def test_equivalent_round_trips_through_the_printer():
    src = ("def f(float(M,K) A, float(K,N) B) -> (C, D) {\n"
           "  C(m,n) +=! A(m,k) * B(k,n) <=> matmul(A, B)\n"
           "  D(m) max=! C(m,n) where n in 0:N <=> rowmax(C, 1 + 2 * -N)\n"
           "  D(m) = D(m) <=> identity()\n}")
    p = parse(src)
    printed = format_program(p)
    assert "    C(m, n) +=! A(m, k) * B(k, n) <=> matmul(A, B)\n" in printed
    assert "    D(m) max=! C(m, n) <=> rowmax(C, 1 + 2 * -N) where n in 0:N\n" in printed
    back = parse(printed)
    assert back == p
    assert [s.equivalent for s in back.defs[0].statements] == [s.equivalent for s in p.defs[0].statements]
    assert format_program(back) == printed


def test_equivalent_is_ignored_by_checking_and_compiling():
    """Names in the annotation are not resolved (cublas_gemm and zz exist nowhere); the kernel is the plain one."""
    src = """def mm(float(M,K) A, float(K,N) B) -> (C) {
    C(m,n) +=! A(m,k) * B(k,n) <=> cublas_gemm(A, B, zz)
}"""
    p, plain = parse(src), parse(src.replace(" <=> cublas_gemm(A, B, zz)", ""))
    assert check_def(p.defs[0], p.source) == check_def(plain.defs[0], plain.source)
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((7, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(polyc.define(src)(a, b), a @ b, rtol=1e-5, atol=1e-5)
    a1, b1 = rng.standard_normal((1, 1)).astype(np.float32), rng.standard_normal((1, 13)).astype(np.float32)
    np.testing.assert_allclose(polyc.define(src)(a1, b1), a1 @ b1, rtol=1e-5, atol=1e-5)


def test_less_equal_still_lexes_apart_from_the_annotation():
    toks = tokenize("a <= b <=> c<=>d <= >")
    assert [t.text for t in toks] == ["a", "<=", "b", "<=>", "c", "<=>", "d", "<=", ">", ""]
    assert rhs_of("a <= b") == A.Binary("<=", A.Ident("a"), A.Ident("b"))


# ---- statements back to back (TC: a statement ends where its expression ends) ----

def test_statements_back_to_back_on_one_line():
    one_line = parse("def f(float(N) B) -> (C) { A(i) = B(i) C(i) = A(i) }")
    separate = parse("def f(float(N) B) -> (C) {\n A(i) = B(i)\n C(i) = A(i)\n}")
    assert one_line == separate and len(one_line.defs[0].statements) == 2
    assert one_line.defs[0].statements[1].span == Span(1, 40, 1, 51)
    # every assignment operator starts a statement, 0-d left-hand sides too, after where clauses and annotations
    d = parse("def f() -> (O) { s +=! A(i) t max=! A(i) O(i) = s where i in 0:3 P(i) min= 1 <=> g(P) "
              "Q(i, j) *=! 2 R(i)=1 }").defs[0]
    assert [(s.tensor, s.op) for s in d.statements] == [("s", "+=!"), ("t", "max=!"), ("O", "="), ("P", "min="),
                                                        ("Q", "*=!"), ("R", "=")]
    assert d.statements[2].where == (A.RangeClause("i", A.Const(0), A.Const(3)),)
    assert d.statements[3].equivalent == A.Equivalent("g", (A.Ident("P"),))


def test_binary_operators_and_parentheses_keep_continuing_the_expression():
    """Only text that used to be an error changes meaning: an operator at the start of the next line still
    continues the expression, and a name followed by '(' on the next line is still one access (as in TC)."""
    d = parse("def f(float(N) A, float(N) B) -> (O) {\n O(i) = A(i)\n  - B(i)\n P(i) = A(i) *\n B(i)\n}").defs[0]
    assert [s.rhs for s in d.statements] == [
        A.Binary("-", A.Access("A", (A.Ident("i"),)), A.Access("B", (A.Ident("i"),))),
        A.Binary("*", A.Access("A", (A.Ident("i"),)), A.Access("B", (A.Ident("i"),)))]
    (s,) = parse("def f(float(N) A) -> (O) {\n O(i) = A\n (i)\n}").defs[0].statements
    assert s.rhs == A.Access("A", (A.Ident("i"),))
    (s,) = parse("def f(float(N) A) -> (O) { O(i) = A(i) ? B(i) : C(i) D(i) = 1 }").defs[0].statements[:1]
    assert isinstance(s.rhs, A.Select) and s.rhs.other == A.Access("C", (A.Ident("i"),))


def _strip_comments(text: str) -> str:
    return "\n".join(line.split("#", 1)[0] for line in text.splitlines())


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[2] / "kernels").glob("*.tc")),
                         ids=lambda p: p.stem)
def test_library_parses_the_same_with_every_line_break_removed(path):
    """TC reads line breaks as blanks: each library file, comments stripped and joined into one line, gives
    the same defs as the file."""
    text = _strip_comments(path.read_text())
    one_line = re.sub(r"\s+", " ", text)
    assert "\n" not in one_line
    assert parse(one_line) == parse(text)


def test_back_to_back_statements_compile_and_run():
    src = ("def softmax(float(N,D) X) -> (Y) { Mx(n) max=! X(n,d) E(n,d) = exp(X(n,d) - Mx(n)) "
           "S(n) +=! E(n,d) Y(n,d) = E(n,d) / S(n) }")
    rng = np.random.default_rng(2)
    for shape in [(5, 7), (1, 1), (3, 13)]:
        x = rng.standard_normal(shape).astype(np.float32)
        e = np.exp(x - x.max(axis=1, keepdims=True))
        np.testing.assert_allclose(polyc.define(src)(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    src = ("def f(float(N) A, float(M) B) -> (Y, t) { Y(i) = i < N ? A(i) : B(i - N) where i in 0:N+M "
           "<=> concat(A, B) t +=! Y(i) }")
    a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    y, t = polyc.define(src)(a, b)
    np.testing.assert_array_equal(y, np.concatenate([a, b]))
    np.testing.assert_allclose(t, np.concatenate([a, b]).sum(), rtol=1e-5, atol=1e-6)


equivalents = st.one_of(st.none(), st.builds(A.Equivalent, names, st.lists(exprs, max_size=3).map(tuple)))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(statements, equivalents), min_size=1, max_size=4))
def test_generated_statements_round_trip_annotated_and_on_one_line(pairs):
    """Printed statements parse back with their annotations, and the same text with all the statements on
    one line (no separators) gives the same statements."""
    stmts = tuple(dataclasses.replace(s, equivalent=e) for s, e in pairs)
    program = A.Program((A.Def("f", (), (A.Output("O"),), stmts),))
    back = parse(format_program(program)).defs[0].statements
    assert back == stmts and [s.equivalent for s in back] == [e for _, e in pairs]
    one_line = parse("def f() -> (O) { " + " ".join(format_statement(s) for s in stmts) + " }").defs[0].statements
    assert one_line == stmts and [s.equivalent for s in one_line] == [e for _, e in pairs]


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
    ("def f() -> (O) { O(i) = A(i) B(i) + 2 }", "expected a newline or ';' after the statement, found 'B'", 1, 30),
    ("def f() -> (O) { O(i) = a b }", "expected a newline or ';' after the statement, found 'b'", 1, 27),
    ("def f() -> (O) { O(i) = A(i) B(i = 2 }", "expected a newline or ';' after the statement, found 'B'", 1, 30),
    ("def f() -> (O) { O(i) = A(i) float(i) = 2 }", "expected a newline or ';' after the statement, found 'float'",
     1, 30),
    ("def f() -> (O) { O(i) = A(i) B(i) == 2 }", "expected a newline or ';' after the statement, found 'B'", 1, 30),
    ("def f() -> (O) {\n  O(i) = A(i)\n  (i) = 2\n}", "expected a tensor name to start a statement, found '('", 3, 3),
    ("def f() -> (O) { O(i) = 1 <=> 3 }", "expected a library function name after '<=>', found '3'", 1, 31),
    ("def f() -> (O) { O(i) = 1 <=> lib }", "expected '(' after 'lib'", 1, 35),
    ("def f() -> (O) { O(i) = 1 <=> lib(A(i) }", "expected ')' to close the arguments of 'lib'", 1, 40),
    ("def f() -> (O) { O(i) = 1 <=> float(A) }", "'float' is a type name and cannot be used as a library function",
     1, 31),
    ("def f() -> (O) { O(i) = 1 <=> f(A) <=> g(A) }", "a statement takes one '<=>' annotation", 1, 36),
    ("def f() -> (O) { O(i) = 1 <=> f(A) where i in 0:3 <=> g(A) }", "a statement takes one '<=>' annotation", 1, 51),
    ("def f() -> (O) { O(i) = 1 <= > 2 }", "expected an expression, found '>'", 1, 30),
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
    # 50 levels of parentheses (below MAX_NESTING) parse, and parentheses leave no node: the rhs is the literal
    deep = parse("def f() -> (O) { O(i) = " + "(" * 50 + "1" + ")" * 50 + " }")
    assert [d.name for d in deep.defs] == ["f"] and len(deep.defs[0].statements) == 1
    assert deep.defs[0].statements[0].rhs == A.Const(1)
    assert deep == parse("def f() -> (O) { O(i) = 1 }")


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
