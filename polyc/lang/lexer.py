"""The lexer: source text → a list of :class:`Token` with spans.

Newlines are not tokens; each token records whether a line break came before it (``newline_before``), which
the parser uses to tell statements apart (a statement ends at a newline, a ``;``, the closing ``}``, or, as in
TC, right before the next statement's left-hand side).
``#`` starts a comment that runs to the end of the line.

    >>> [t.text for t in tokenize("C(m) +=! A(m,k)  # sum")]
    ['C', '(', 'm', ')', '+=!', 'A', '(', 'm', ',', 'k', ')', '']

An identifier followed right away by ``.`` and digits is one identifier token, ``T.1``: TC's dimension
specifier (the extent of dimension 1 of ``T``); as an identifier then a number it could not occur in a valid
program.

The reduction operators ``max=`` and ``min=`` are not tokens here: ``max`` and ``min`` are also builtins, so
the parser joins an identifier ``max``/``min`` with an adjacent ``=`` (and ``!``) where an operator is due.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ParseError, Span

#: Reserved words: they cannot name a tensor, a size or an index.
KEYWORDS = frozenset({"def", "where", "in", "exists"})

#: Punctuation and operators, longest first so that the lexer takes the longest match. ``<=>`` marks TC's
#: equivalent-library-call annotation (``... <=> matmul(A, B)``); as ``<=`` then ``>`` it could not occur in a
#: valid program, so taking it as one token changes no program that parsed before.
OPERATORS = (
    "+=!", "*=!", "<=>",
    "->", "+=", "*=", "==", "!=", "<=", ">=", "&&", "||",
    "=", "<", ">", "+", "-", "*", "/", "%", "!", "?", ":", "(", ")", "{", "}", ",", ";",
)

#: The largest integer literal (the int64 range; larger values are a ParseError).
MAX_INT_LITERAL = 2**63 - 1


@dataclass(frozen=True)
class Token:
    """One token: ``kind`` is ``"ident"``, ``"keyword"``, ``"int"``, ``"float"``, ``"op"`` or ``"eof"``."""

    kind: str
    text: str
    span: Span
    newline_before: bool = False
    value: int | float | None = None

    def is_op(self, *texts: str) -> bool:
        """Whether this is one of the operators ``texts``."""
        return self.kind == "op" and self.text in texts

    def is_keyword(self, word: str) -> bool:
        return self.kind == "keyword" and self.text == word

    def describe(self) -> str:
        """How error messages name the token."""
        if self.kind == "eof":
            return "end of input"
        return f"'{self.text}'"


def _is_ident_start(c: str) -> bool:
    return c == "_" or ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_ident_char(c: str) -> bool:
    return _is_ident_start(c) or ("0" <= c <= "9")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


class _Scanner:
    """A cursor over the text that keeps line and column."""

    def __init__(self, text: str):
        self.text = text
        self.pos = 0
        self.line = 1
        self.col = 1

    def peek(self, k: int = 0) -> str:
        i = self.pos + k
        return self.text[i] if i < len(self.text) else ""

    def advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self.text[self.pos] == "\n":
                self.line += 1
                self.col = 1
            else:
                self.col += 1
            self.pos += 1


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens, ending with an ``eof`` token.

    Raises :class:`ParseError` (with the source attached) on a character outside the language or a
    malformed number.
    """
    s = _Scanner(source)
    tokens: list[Token] = []
    newline = True
    while True:
        newline = _skip_blank(s) or newline
        if s.pos >= len(source):
            tokens.append(Token("eof", "", Span.point(s.line, s.col), newline))
            return tokens
        tokens.append(_next_token(s, source, newline))
        newline = False


def _skip_blank(s: _Scanner) -> bool:
    """Skip spaces and comments; return whether a line break was skipped."""
    saw_newline = False
    while s.pos < len(s.text):
        c = s.peek()
        if c == "\n":
            saw_newline = True
            s.advance()
        elif c in " \t\r\f\v":
            s.advance()
        elif c == "#":
            while s.pos < len(s.text) and s.peek() != "\n":
                s.advance()
        else:
            break
    return saw_newline


def _next_token(s: _Scanner, source: str, newline: bool) -> Token:
    line, col, start = s.line, s.col, s.pos
    c = s.peek()
    if _is_ident_start(c):
        while _is_ident_char(s.peek()):
            s.advance()
        text = source[start:s.pos]
        kind = "keyword" if text in KEYWORDS else "ident"
        if kind == "ident" and s.peek() == "." and _is_digit(s.peek(1)):  # TC's dimension specifier T.1
            s.advance()
            while _is_digit(s.peek()):
                s.advance()
            text = source[start:s.pos]
        return Token(kind, text, Span(line, col, s.line, s.col), newline)
    if _is_digit(c) or (c == "." and _is_digit(s.peek(1))):
        return _number(s, source, newline)
    for op in OPERATORS:
        if source.startswith(op, s.pos):
            s.advance(len(op))
            return Token("op", op, Span(line, col, s.line, s.col), newline)
    shown = c if c.isprintable() else repr(c)
    raise ParseError(f"unexpected character '{shown}'", Span.point(line, col), source,
                     hint="the language uses identifiers, numbers, operators and '#' comments")


def _number(s: _Scanner, source: str, newline: bool) -> Token:
    """An integer literal (digits) or a float literal (digits with a '.' and/or an exponent)."""
    line, col, start = s.line, s.col, s.pos
    is_float = False
    while _is_digit(s.peek()):
        s.advance()
    if s.peek() == ".":
        is_float = True
        s.advance()
        while _is_digit(s.peek()):
            s.advance()
    if s.peek() in ("e", "E") and (_is_digit(s.peek(1)) or (s.peek(1) in "+-" and s.peek(1) != ""
                                                            and _is_digit(s.peek(2)))):
        is_float = True
        s.advance(2)
        while _is_digit(s.peek()):
            s.advance()
    span = Span(line, col, s.line, s.col)
    if _is_ident_char(s.peek()) or s.peek() == ".":
        while _is_ident_char(s.peek()) or s.peek() == ".":
            s.advance()
        bad = source[start:s.pos]
        raise ParseError(f"malformed number '{bad}'", Span(line, col, s.line, s.col), source,
                         hint="write integers as 42 and floats as 4.2, 4.2e-3 or 1e9")
    text = source[start:s.pos]
    if is_float:
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ParseError(f"float literal '{text}' is out of range", span, source,
                             hint="the largest float literal is about 1.8e308")
        return Token("float", text, span, newline, value)
    value = int(text)
    if value > MAX_INT_LITERAL:
        raise ParseError(f"integer literal {text} is out of range", span, source,
                         hint=f"integer literals must be at most {MAX_INT_LITERAL} (int64)")
    return Token("int", text, span, newline, value)
