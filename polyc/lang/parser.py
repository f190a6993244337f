"""The parser: TC source text → :class:`~polyc.lang.ast.Program` (untyped, every node with its span).

A recursive-descent parser over the tokens of :mod:`polyc.lang.lexer`; expressions use precedence climbing
(lowest to highest: ``?:``, ``||``, ``&&``, ``== !=``, ``< <= > >=``, ``+ -``, ``* / %``, unary ``- !``)::

    >>> p = parse("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    >>> p.defs[0].statements[0].rhs == A.Binary("+", A.Access("A", (A.Ident("i"),)), A.Access("B", (A.Ident("i"),)))
    True

A statement is ``T(indices) op rhs [<=> name(args)] [where clauses]``; the ``<=> name(args)`` annotation (TC's
equivalent library call, kept as :class:`~polyc.lang.ast.Equivalent` metadata) may also follow the where
clauses. A statement ends at a newline, a ``;`` or the ``}``, or, as in TC, where its expression ends when the
next tokens are a left-hand side and an assignment operator (``{ A(i) = B(i) C(i) = A(i) }``). The expression
parser never looks at line breaks, so this only accepts text that used to be an error.

``NAME(args)`` is a :class:`Cast` when ``NAME`` is a type, a :class:`Call` when it is one of
:data:`~polyc.lang.ast.BUILTINS`, and a tensor :class:`Access` otherwise. A left-hand side takes index
variables only (TC's rule: ``T(i, j) = ...``; ``T(i*i)`` or ``T(i+1)`` is a ParseError at the index), so every
write is in bounds once ranges are inferred; any expression may index a read (non-affine and data-dependent
reads are checked at run time, see ``polyc.poly.build.mark_checked``). The parser raises only
:class:`ParseError` (with the source attached, so the caret shows) and :class:`UnsupportedError` (a type of
:data:`UNSUPPORTED_TYPES`).
"""
from __future__ import annotations

from ..errors import ParseError, PolycError, Span, UnsupportedError
from . import ast as A
from .lexer import Token, tokenize

#: Binary operators and their precedence (higher binds tighter); ``?:`` is level 0, unary is level 7.
BINARY_PRECEDENCE = {
    "||": 1, "&&": 2, "==": 3, "!=": 3, "<": 4, "<=": 4, ">": 4, ">=": 4,
    "+": 5, "-": 5, "*": 6, "/": 6, "%": 6,
}

#: Type spellings polyc recognises but does not handle yet, spelling → dtype (none since float16 and bfloat16
#: became storage types; the mechanism stays for the next one).
UNSUPPORTED_TYPES: dict = {}

#: How deeply parentheses, calls and unary operators may nest while parsing.
MAX_NESTING = 100

#: How deep an expression tree may be (a long chain ``a + b + c + ...`` is deep without nesting).
MAX_DEPTH = 200

_ASSIGN_SIMPLE = ("=", "+=", "*=", "+=!", "*=!")


def parse(source: str, filename: str = "<source>") -> A.Program:
    """Parse TC source text (any number of defs) into a :class:`~polyc.lang.ast.Program`.

    Raises :class:`ParseError` for text outside the language and :class:`UnsupportedError` for a type of
    :data:`UNSUPPORTED_TYPES`.
    """
    try:
        return _Parser(source, filename).program()
    except PolycError as e:
        if e.source is None:
            e.with_source(source, filename)
        elif e.filename != filename:
            e.with_source(e.source, filename)
        raise
    except RecursionError:
        raise ParseError("the input is nested too deeply", source=source, filename=filename,
                         hint="split the expression with where-clause bindings or temporaries") from None


#: The direct sub-expressions of a node (:func:`polyc.lang.ast.children`).
expr_children = A.children


def expr_depth(e: A.Expr) -> int:
    """The height of an expression tree (a leaf has depth 1), computed without recursion."""
    deepest = 0
    stack = [(e, 1)]
    while stack:
        node, d = stack.pop()
        deepest = max(deepest, d)
        stack.extend((c, d + 1) for c in expr_children(node))
    return deepest


class _Parser:
    def __init__(self, source: str, filename: str):
        self.source = source
        self.filename = filename
        self.tokens = tokenize(source)
        self.pos = 0
        self.nesting = 0

    # ---- token helpers ----

    @property
    def tok(self) -> Token:
        return self.tokens[self.pos]

    def peek(self, k: int = 1) -> Token:
        return self.tokens[min(self.pos + k, len(self.tokens) - 1)]

    def advance(self) -> Token:
        t = self.tokens[self.pos]
        if t.kind != "eof":
            self.pos += 1
        return t

    @property
    def prev_span(self) -> Span:
        return self.tokens[self.pos - 1].span if self.pos else self.tok.span

    def error(self, message: str, span: Span, hint: str | None = None) -> ParseError:
        return ParseError(message, span, self.source, hint=hint, filename=self.filename)

    def expect(self, op: str, context: str) -> Token:
        if not self.tok.is_op(op):
            raise self.error(f"expected '{op}' {context}, found {self.tok.describe()}", self.tok.span)
        return self.advance()

    def accept(self, op: str) -> bool:
        if self.tok.is_op(op):
            self.advance()
            return True
        return False

    def name(self, what: str) -> Token:
        """An identifier that names something (a def, tensor, size, index or let binding)."""
        t = self.tok
        if t.kind != "ident":
            raise self.error(f"expected {what}, found {t.describe()}", t.span)
        if t.text in A.TYPE_NAMES or t.text in UNSUPPORTED_TYPES:
            raise self.error(f"'{t.text}' is a type name and cannot be used as {what}", t.span,
                             hint="choose another name")
        if "." in t.text:
            raise self.error(f"'{t.text}' is a dimension of a tensor and cannot be used as {what}", t.span,
                             hint="choose a name without '.'")
        return self.advance()

    # ---- program and defs ----

    def program(self) -> A.Program:
        defs = []
        while self.tok.kind != "eof":
            if not self.tok.is_keyword("def"):
                raise self.error(f"expected 'def', found {self.tok.describe()}", self.tok.span,
                                 hint="a source is a sequence of 'def name(inputs) -> (outputs) { ... }'")
            defs.append(self.definition())
        return A.Program(tuple(defs), self.source)

    def definition(self) -> A.Def:
        start = self.advance().span
        name = self.name("a def name").text
        self.expect("(", "after the def name")
        params = []
        if not self.tok.is_op(")"):
            params.append(self.param())
            while self.accept(","):
                params.append(self.param())
        self.expect(")", "after the parameters")
        self.expect("->", "after the parameters (outputs are written '-> (C)')")
        self.expect("(", "before the outputs")
        outputs = [self.output()]
        while self.accept(","):
            outputs.append(self.output())
        self.expect(")", "after the outputs")
        self.expect("{", "to open the def body")
        statements = []
        while not self.tok.is_op("}"):
            if self.accept(";"):
                continue
            if self.tok.kind == "eof":
                raise self.error("expected '}' to close the def body, found end of input", self.tok.span)
            statements.append(self.statement())
            self.end_of_statement()
        end = self.advance().span
        return A.Def(name, tuple(params), tuple(outputs), tuple(statements), start.to(end))

    def type_name(self) -> tuple[str, Span]:
        t = self.tok
        if t.kind == "ident" and t.text in UNSUPPORTED_TYPES:
            raise UnsupportedError(f"{UNSUPPORTED_TYPES[t.text]} is not supported yet", t.span, self.source,
                                   hint="use float (float32) or double (float64)", filename=self.filename)
        if t.kind != "ident" or t.text not in A.TYPE_NAMES:
            raise self.error(f"expected a type such as float or int32, found {t.describe()}", t.span,
                             hint="types: bool, int8..int64, uint8..uint64, half (float16), bfloat16, "
                                  "float (float32), double (float64)")
        self.advance()
        return A.TYPE_NAMES[t.text], t.span

    def dims(self) -> tuple[A.Dim, ...]:
        self.advance()  # '('
        dims = []
        if not self.tok.is_op(")"):
            dims.append(self.dim())
            while self.accept(","):
                dims.append(self.dim())
        self.expect(")", "after the dimensions")
        return tuple(dims)

    def dim(self) -> A.Dim:
        t = self.tok
        if t.kind == "int":
            self.advance()
            return A.Dim(t.value, t.span)
        return A.Dim(self.name("a size name or an integer").text, t.span)

    def param(self) -> A.Param:
        dtype, start = self.type_name()
        dims = self.dims() if self.tok.is_op("(") else ()
        t = self.name("an input name")
        return A.Param(t.text, dtype, dims, start.to(t.span))

    def output(self) -> A.Output:
        t = self.tok
        if t.kind == "ident" and (t.text in A.TYPE_NAMES or t.text in UNSUPPORTED_TYPES):
            dtype, start = self.type_name()
            dims = self.dims() if self.tok.is_op("(") else ()
            n = self.name("an output name")
            return A.Output(n.text, dtype, dims, start.to(n.span))
        n = self.name("an output name")
        return A.Output(n.text, None, None, n.span)

    # ---- statements ----

    def end_of_statement(self) -> None:
        """Check that the statement just parsed ends here: at a newline, ``;``, ``}``, the end of input, or
        (TC's rule) right before the next statement's ``NAME(indices) op``. Consumes nothing."""
        t = self.tok
        if t.is_op(";", "}") or t.newline_before or t.kind == "eof" or self.at_statement_start():
            return
        raise self.error(f"expected a newline or ';' after the statement, found {t.describe()}", t.span,
                         hint="put each statement on its own line or separate statements with ';'")

    def at_statement_start(self) -> bool:
        """Whether the tokens from here read ``NAME [( ... )] op`` with ``op`` an assignment operator: the
        start of a statement written right after the previous one. Looks ahead only."""
        t = self.tok
        if t.kind != "ident" or t.text in A.TYPE_NAMES or t.text in UNSUPPORTED_TYPES:
            return False
        k = 1
        if self.peek(k).is_op("("):
            depth = 0
            while True:
                u = self.peek(k)
                if u.kind == "eof" or u.is_op("{", "}", ";"):
                    return False
                if u.is_op("("):
                    depth += 1
                elif u.is_op(")"):
                    depth -= 1
                k += 1
                if depth == 0:
                    break
        return self.assign_op_at(k) is not None

    def assign_op_at(self, k: int) -> tuple[str, int] | None:
        """The assignment operator starting ``k`` tokens ahead and how many tokens it spans, or None."""
        t = self.peek(k)
        if t.kind == "op" and t.text in _ASSIGN_SIMPLE:
            return t.text, 1
        if t.kind == "ident" and t.text in ("max", "min"):
            eq = self.peek(k + 1)
            if eq.is_op("=") and _adjacent(t, eq):
                bang = self.peek(k + 2)
                if bang.is_op("!") and _adjacent(eq, bang):
                    return t.text + "=!", 3
                return t.text + "=", 2
        return None

    def statement(self) -> A.Statement:
        head = self.name("a tensor name to start a statement")
        indices: list[A.IndexVar] = []
        if self.tok.is_op("("):
            self.advance()
            if not self.tok.is_op(")"):
                indices.append(self.lhs_index())
                while self.accept(","):
                    indices.append(self.lhs_index())
            self.expect(")", "after the left-hand side indices")
        op = self.assign_op()
        rhs = self.expr()
        equivalent = self.equivalent()
        where: list[A.WhereClause] = []
        if self.tok.is_keyword("where"):
            self.advance()
            where.append(self.where_clause())
            while self.accept(","):
                where.append(self.where_clause())
        if self.tok.is_op("<=>"):
            if equivalent is not None:
                raise self.error("a statement takes one '<=>' annotation", self.tok.span,
                                 hint="write it once, before or after the where clauses")
            equivalent = self.equivalent()
        span = head.span.to(self.prev_span)
        exprs = [rhs] + [x for c in where for x in _clause_exprs(c)] + list(equivalent.args if equivalent else ())
        for e in exprs:
            if expr_depth(e) > MAX_DEPTH:
                raise self.error(f"expression nested too deeply (more than {MAX_DEPTH} levels)", e.span,
                                 hint="split it with where-clause bindings or temporaries")
        return A.Statement(head.text, tuple(indices), op, rhs, tuple(where), span, equivalent)

    def equivalent(self) -> A.Equivalent | None:
        """``<=> name(args)``, TC's equivalent-library-call annotation, if one comes next."""
        if not self.tok.is_op("<=>"):
            return None
        start = self.advance().span
        name = self.name("a library function name after '<=>'")
        self.expect("(", f"after '{name.text}' (the annotation is written '<=> name(args)')")
        args = []
        if not self.tok.is_op(")"):
            args.append(self.expr())
            while self.accept(","):
                args.append(self.expr())
        end = self.expect(")", f"to close the arguments of '{name.text}'").span
        return A.Equivalent(name.text, tuple(args), start.to(end))

    def lhs_index(self) -> A.IndexVar:
        e = self.expr()
        if not isinstance(e, A.Ident):
            raise self.error("the left-hand side takes index variables only", e.span,
                             hint="write T(i) = ... and move offsets to the right-hand side, e.g. T(i) = A(i + 1)")
        return A.IndexVar(e.name, e.span)

    def assign_op(self) -> str:
        t = self.tok
        found = self.assign_op_at(0)
        if found is not None:
            for _ in range(found[1]):
                self.advance()
            return found[0]
        raise self.error(f"expected an assignment operator, found {t.describe()}", t.span,
                         hint="operators: = += *= max= min= and the initializing forms +=! *=! max=! min=!")

    def where_clause(self) -> A.WhereClause:
        t = self.tok
        if t.is_keyword("exists"):
            self.advance()
            e = self.expr()
            return A.ExistsClause(e, t.span.to(e.span))
        n = self.name("a where clause ('i in lo:hi', 'exists expr' or 'x = expr')")
        if self.tok.is_keyword("in"):
            self.advance()
            lo = self.expr()
            self.expect(":", "between the bounds of a range (write 'i in lo:hi')")
            hi = self.expr()
            return A.RangeClause(n.text, lo, hi, n.span.to(hi.span))
        if self.tok.is_op("="):
            self.advance()
            e = self.expr()
            return A.LetClause(n.text, e, n.span.to(e.span))
        raise self.error(f"expected 'in' or '=' after '{n.text}' in a where clause, found {self.tok.describe()}",
                         self.tok.span, hint="where clauses are 'i in lo:hi', 'exists expr' or 'x = expr'")

    # ---- expressions ----

    def enter(self, span: Span) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise self.error(f"expression nested too deeply (more than {MAX_NESTING} levels)", span,
                             hint="split it with where-clause bindings or temporaries")

    def expr(self) -> A.Expr:
        """``cond ? then : other`` (right-associative) or a binary expression."""
        self.enter(self.tok.span)
        cond = self.binary(1)
        if self.accept("?"):
            then = self.expr()
            self.expect(":", "in a conditional expression 'c ? a : b'")
            other = self.expr()
            cond = A.Select(cond, then, other, cond.span.to(other.span))
        self.nesting -= 1
        return cond

    def binary(self, min_prec: int) -> A.Expr:
        lhs = self.unary()
        while self.tok.kind == "op" and BINARY_PRECEDENCE.get(self.tok.text, 0) >= min_prec:
            op = self.advance().text
            self.enter(self.tok.span)
            rhs = self.binary(BINARY_PRECEDENCE[op] + 1)
            self.nesting -= 1
            lhs = A.Binary(op, lhs, rhs, lhs.span.to(rhs.span))
        return lhs

    def unary(self) -> A.Expr:
        t = self.tok
        if t.is_op("-", "!"):
            self.advance()
            self.enter(t.span)
            operand = self.unary()
            self.nesting -= 1
            return A.Unary(t.text, operand, t.span.to(operand.span))
        return self.primary()

    def primary(self) -> A.Expr:
        t = self.tok
        if t.kind == "int" or t.kind == "float":
            self.advance()
            return A.Const(t.value, t.span)
        if t.is_op("("):
            self.advance()
            e = self.expr()
            self.expect(")", "to close the parenthesis")
            return e
        if t.kind == "ident":
            if self.peek().is_op("(") and "." in t.text:
                raise self.error(f"'{t.text}' is a dimension of a tensor (a number) and takes no arguments",
                                 t.span, hint=f"write '{t.text}' alone")
            if self.peek().is_op("("):
                return self.application()
            if t.text in A.TYPE_NAMES or t.text in UNSUPPORTED_TYPES:
                raise self.error(f"type name '{t.text}' used as a value", t.span,
                                 hint=f"a cast is written {t.text}(expr)")
            self.advance()
            return A.Ident(t.text, t.span)
        raise self.error(f"expected an expression, found {t.describe()}", t.span)

    def application(self) -> A.Expr:
        """``NAME(args)``: a cast, a builtin call or a tensor access."""
        t = self.tok
        if t.text in UNSUPPORTED_TYPES:
            self.type_name()  # raises UnsupportedError
        self.advance()
        self.advance()  # '('
        args = []
        if not self.tok.is_op(")"):
            args.append(self.expr())
            while self.accept(","):
                args.append(self.expr())
        end = self.expect(")", f"to close the arguments of '{t.text}'").span
        span = t.span.to(end)
        if t.text in A.TYPE_NAMES:
            if len(args) != 1:
                raise self.error(f"a cast to {t.text} takes one argument, got {len(args)}", span,
                                 hint=f"write {t.text}(expr)")
            return A.Cast(A.TYPE_NAMES[t.text], args[0], span)
        if t.text in A.BUILTINS:
            return A.Call(t.text, tuple(args), span)
        return A.Access(t.text, tuple(args), span)


def _adjacent(a: Token, b: Token) -> bool:
    return a.span.end_line == b.span.line and a.span.end_col == b.span.col


def _clause_exprs(c: A.WhereClause) -> tuple:
    if isinstance(c, A.RangeClause):
        return (c.lo, c.hi)
    return (c.expr,)
