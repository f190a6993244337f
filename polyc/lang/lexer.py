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

import re
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


#: One token or one run of blanks at a position: spaces, line breaks and ``#`` comments; an identifier; a
#: number (digits with an optional fraction and exponent); an operator (:data:`OPERATORS`, longest first, so
#: the first alternative that matches is the longest one). Only ASCII letters and digits (``[0-9]``, not
#: ``\d``, which takes any Unicode digit).
_TOKEN = re.compile("|".join((
    r"(?P<blank>(?:[ \t\r\f\v\n]|#[^\n]*)+)",
    r"(?P<ident>[A-Za-z_][A-Za-z0-9_]*)",
    r"(?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)",
    "(?P<op>" + "|".join(re.escape(op) for op in OPERATORS) + ")",
)))
#: TC's dimension specifier right after an identifier (``T.1``).
_DIMENSION = re.compile(r"\.[0-9]+")
#: What a number must not run into (``1e``, ``2x``, ``1.2.3``): the rest of the malformed literal.
_NUMBER_TAIL = re.compile(r"[A-Za-z0-9_.]+")


def tokenize(source: str) -> list[Token]:
    """Split ``source`` into tokens, ending with an ``eof`` token.

    Raises :class:`ParseError` (with the source attached) on a character outside the language or a
    malformed number.
    """
    tokens: list[Token] = []
    pos, line, col, newline = 0, 1, 1, True
    match = _TOKEN.match
    while pos < len(source):
        m = match(source, pos)
        if m is None:
            c = source[pos]
            shown = c if c.isprintable() else repr(c)
            raise ParseError(f"unexpected character '{shown}'", Span.point(line, col), source,
                             hint="the language uses identifiers, numbers, operators and '#' comments")
        kind, text, end = m.lastgroup, m.group(), m.end()
        if kind == "blank":
            breaks = text.count("\n")
            if breaks:
                line, col, newline = line + breaks, len(text) - text.rfind("\n"), True
            else:
                col += len(text)
            pos = end
            continue
        value = None
        if kind == "ident":
            if text in KEYWORDS:
                kind = "keyword"
            else:
                dim = _DIMENSION.match(source, end)
                if dim:
                    end = dim.end()
                    text = source[pos:end]
        elif kind == "number":
            kind, value = _number(source, pos, end, line, col)
        span = Span(line, col, line, col + len(text))
        tokens.append(Token(kind, text, span, newline, value))
        pos, col, newline = end, col + len(text), False
    tokens.append(Token("eof", "", Span.point(line, col), newline))
    return tokens


def _number(source: str, start: int, end: int, line: int, col: int) -> tuple[str, int | float]:
    """The kind (``"int"`` or ``"float"``) and value of the number literal ``source[start:end]`` at
    ``line:col``. Raises :class:`ParseError` when it runs into a letter, digit, ``_`` or ``.`` (a malformed
    number) or is out of range."""
    text = source[start:end]
    tail = _NUMBER_TAIL.match(source, end)
    if tail:
        bad = source[start:tail.end()]
        raise ParseError(f"malformed number '{bad}'", Span(line, col, line, col + len(bad)), source,
                         hint="write integers as 42 and floats as 4.2, 4.2e-3 or 1e9")
    span = Span(line, col, line, col + len(text))
    if any(c in text for c in ".eE"):
        value = float(text)
        if value in (float("inf"), float("-inf")):
            raise ParseError(f"float literal '{text}' is out of range", span, source,
                             hint="the largest float literal is about 1.8e308")
        return "float", value
    value = int(text)
    if value > MAX_INT_LITERAL:
        raise ParseError(f"integer literal {text} is out of range", span, source,
                         hint=f"integer literals must be at most {MAX_INT_LITERAL} (int64)")
    return "int", value
