"""Fuzzing the front end (hypothesis): nothing but a PolycError escapes, and printed ASTs parse back."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polyc.errors import PolycError
from polyc.lang import ast as A
from polyc.lang import check_def, format_program, parse
from polyc.lang.printer import format_statement
from polyc.lang.lexer import KEYWORDS, OPERATORS
from polyc.lang.parser import UNSUPPORTED_TYPES

CORPUS = [
    "def matmul(float(M,K) A, float(K,N) B) -> (C) {\n    C(m,n) +=! A(m,k) * B(k,n)\n}\n",
    "def conv(float(N,C,H,W) I, float(F,C,KH,KW) Wt, float(F) b) -> (O) {\n"
    "    O(n,f,h,w) +=! I(n,c,h+kh,w+kw) * Wt(f,c,kh,kw)\n    O(n,f,h,w) = O(n,f,h,w) + b(f)\n}\n",
    "def softmax(float(N,D) X) -> (Y, double(N) S) {\n    M(n) max=! X(n,d)\n"
    "    E(n,d) = exp(X(n,d) - M(n))\n    S(n) +=! E(n,d)\n    Y(n,d) = E(n,d) / S(n)\n}\n",
    "def gather(float(N) A, int32(M) I, float alpha) -> (O) {\n"
    "    O(m) = I(m) >= 0 && I(m) < N ? alpha * A(I(m)) : 0 where m in 0:M\n}\n",
    "def pad(float(N) A) -> (float(N) O) {\n    O(i) = x > 0 ? x : -x where x = A(i) * 2.5e-1 + 1, i in 0:N\n"
    "    O(i) max= A(N - 1 - i) % 3; T() = 0\n}\n"
    "def s(int8 a, uint16(K) b) -> (double r) { r +=! int64(b(k)) * a + fma(1, 2.0, float(b(k))) }\n",
]

RESERVED = set(KEYWORDS) | set(A.TYPE_NAMES) | set(UNSUPPORTED_TYPES) | set(A.BUILTINS)
TOKENS = ([op for op in OPERATORS] + sorted(KEYWORDS) + ["float", "int32", "half", "max", "min", "exp", "A", "B",
          "i", "k", "N", "0", "1", "2.5", "1e3", "\n", "#c\n", "max=", "min=!"])


def only_polyc_errors(text: str) -> None:
    """Parse and check ``text``; any exception other than a PolycError fails the test."""
    try:
        program = parse(text)
    except PolycError:
        return
    for d in program.defs:
        try:
            check_def(d, program.source)
        except PolycError:
            pass


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text(text):
    only_polyc_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=60))
def test_token_soup(tokens):
    only_polyc_errors(" ".join(tokens))
    only_polyc_errors("def f(float(N) A) -> (O) { O(i) = " + " ".join(tokens) + " }")


@st.composite
def mutated(draw):
    text = draw(st.sampled_from(CORPUS))
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 8)))
        choice = draw(st.integers(0, 3))
        if choice == 0:
            text = text[:i] + text[j:]
        elif choice == 1:
            text = text[:i] + draw(st.sampled_from(TOKENS)) + text[i:]
        elif choice == 2:
            text = text[:i] + text[j:] + text[i:j]
        else:
            text = text[:i] + draw(st.text(max_size=3)) + text[j:]
    return text


def test_corpus_is_valid():
    for text in CORPUS:
        program = parse(text)
        for d in program.defs:
            check_def(d, program.source)


@settings(max_examples=500, deadline=None)
@given(mutated())
def test_mutated_programs(text):
    only_polyc_errors(text)


@settings(max_examples=300, deadline=None)
@given(mutated())
def test_parsed_programs_round_trip(text):
    try:
        program = parse(text)
    except PolycError:
        return
    assert parse(format_program(program)) == program


# ---- generated ASTs ----

names = st.builds(lambda a, b: a + b, st.sampled_from("abeimnxzABKMN_"), st.text("abefinotx019_", max_size=3)
                  ).filter(lambda n: n not in RESERVED)
consts = st.one_of(st.integers(0, 2**63 - 1),
                   st.floats(min_value=0, allow_nan=False, allow_infinity=False).map(abs)).map(A.Const)
leaves = st.one_of(consts, names.map(A.Ident))


def _extend(children):
    args = st.lists(children, max_size=3).map(tuple)
    return st.one_of(
        st.builds(A.Unary, st.sampled_from(["-", "!"]), children),
        st.builds(A.Binary, st.sampled_from(["+", "-", "*", "/", "%", "<", "<=", ">", ">=", "==", "!=", "&&", "||"]),
                  children, children),
        st.builds(A.Select, children, children, children),
        st.builds(A.Access, names, args),
        st.builds(A.Call, st.sampled_from(A.BUILTINS), args),
        st.builds(A.Cast, st.sampled_from(A.DTYPES), children),
    )


exprs = st.recursive(leaves, _extend, max_leaves=12)
clauses = st.one_of(st.builds(A.RangeClause, names, exprs, exprs), st.builds(A.ExistsClause, exprs),
                    st.builds(A.LetClause, names, exprs))
statements = st.builds(A.Statement, names, st.lists(names.map(A.IndexVar), max_size=3).map(tuple),
                       st.sampled_from(A.ASSIGN_OPS), exprs, st.lists(clauses, max_size=3).map(tuple))
dims = st.lists(st.one_of(names, st.integers(0, 1000)).map(A.Dim), max_size=3).map(tuple)
params = st.builds(A.Param, names, st.sampled_from(A.DTYPES), dims)
outputs = st.one_of(names.map(A.Output), st.builds(A.Output, names, st.sampled_from(A.DTYPES), dims))
defs = st.builds(A.Def, names, st.lists(params, max_size=3).map(tuple), st.lists(outputs, min_size=1,
                 max_size=3).map(tuple), st.lists(statements, max_size=4).map(tuple))
programs = st.lists(defs, max_size=3).map(tuple).map(A.Program)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs)
def test_generated_asts_round_trip(program):
    text = format_program(program)
    assert parse(text) == program
    assert format_program(parse(text)) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(defs)
def test_generated_defs_check_or_raise_polyc_errors(d):
    try:
        check_def(d, format_program(A.Program((d,))))
    except PolycError:
        pass


# ---- plausible defs: known names, so that checking gets past name resolution into typing ----

HEADER = "def f(float(N,M) A, int32(N) I, double s, int8(M) B, bool(N) C) -> (O, double(N) P) {\n"
index_vars = st.sampled_from(["i", "j", "k"])
typed_leaves = st.one_of(consts, consts, st.sampled_from(["i", "j", "k", "N", "M", "s", "q"]).map(A.Ident))
index_exprs = st.one_of(index_vars.map(A.Ident), st.builds(A.Binary, st.sampled_from(["+", "-", "*", "/"]),
                                                           index_vars.map(A.Ident), consts))


def _extend_typed(children):
    return st.one_of(
        _extend(children),
        st.builds(lambda a, b: A.Access("A", (a, b)), index_exprs, index_exprs),
        st.builds(lambda a: A.Access("I", (a,)), index_exprs),
        st.builds(lambda a: A.Access("B", (a,)), st.one_of(index_exprs, children)),
        st.builds(lambda a: A.Access("C", (a,)), index_exprs),
        st.builds(A.Call, st.sampled_from(A.BUILTINS), st.lists(children, min_size=1, max_size=3).map(tuple)),
    )


typed_exprs = st.recursive(typed_leaves, _extend_typed, max_leaves=10)
ints = st.integers(0, 9).map(A.Const)
targets = st.sampled_from([("O", ("i", "j")), ("P", ("i",)), ("T", ("k",))])
typed_statements = st.builds(
    lambda target, op, rhs, where: A.Statement(target[0], tuple(map(A.IndexVar, target[1])), op, rhs, where),
    targets, st.sampled_from(["=", "+=!", "max=!", "+=", "*=!"]), typed_exprs,
    st.lists(st.one_of(st.builds(A.RangeClause, index_vars, ints, st.sampled_from([A.Ident("N"), A.Ident("M")])),
                       st.builds(A.LetClause, st.just("q"), typed_exprs)), max_size=2).map(tuple))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(typed_statements, min_size=1, max_size=4))
def test_plausible_defs_check_or_raise_polyc_errors(stmts):
    body = "".join(f"    {format_statement(s)}\n" for s in stmts)
    only_polyc_errors(HEADER + body + "    O(i, j) = 0\n    P(i) = 0\n}\n")
