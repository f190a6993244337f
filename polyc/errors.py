"""The polyc error tree and source spans.

Every error polyc raises on purpose derives from :class:`PolycError`. Errors about a definition carry a
:class:`Span` and render the source line with a caret under the offending text (in the manner of TC's
``error_report.h``)::

    <source>:3:22: error: undefined variable 'q'
        C(m,n) +=! A(m,k) * q
                            ^
    hint: declare 'q' as a parameter or bind it with a where clause
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """A region of source text; lines and columns are 1-based, ``end_col`` is exclusive."""

    line: int
    col: int
    end_line: int
    end_col: int

    @staticmethod
    def point(line: int, col: int) -> "Span":
        return Span(line, col, line, col + 1)

    def to(self, other: "Span") -> "Span":
        """The span from the start of ``self`` to the end of ``other``."""
        return Span(self.line, self.col, other.end_line, other.end_col)

    def __str__(self) -> str:
        return f"{self.line}:{self.col}"


class PolycError(Exception):
    """Base of every error polyc raises on purpose.

    ``message`` says what is wrong; ``span``/``source`` (optional) locate it in a definition; ``hint``
    (optional) says what to do about it.
    """

    def __init__(self, message: str, span: Span | None = None, source: str | None = None,
                 hint: str | None = None, filename: str = "<source>"):
        self.message = message
        self.span = span
        self.source = source
        self.hint = hint
        self.filename = filename
        super().__init__(self.render())

    def __reduce__(self):
        """Pickled with every field (an error crosses from a compile worker process whole)."""
        return _restore, (type(self), dict(self.__dict__))

    def render(self) -> str:
        """The full message: location, the source line with a caret, and the hint."""
        if self.span is None:
            text = self.message
        else:
            text = f"{self.filename}:{self.span.line}:{self.span.col}: {self.message}"
            if self.source is not None:
                lines = self.source.splitlines()
                if 1 <= self.span.line <= len(lines):
                    line = lines[self.span.line - 1]
                    width = 1
                    if self.span.end_line == self.span.line:
                        width = max(1, self.span.end_col - self.span.col)
                    text += f"\n    {line}\n    {' ' * (self.span.col - 1)}{'^' * width}"
        if self.hint:
            text += f"\nhint: {self.hint}"
        return text

    def with_source(self, source: str, filename: str | None = None) -> "PolycError":
        """Attach the definition text (and file name) so the error can show the caret line."""
        self.source = source
        if filename:
            self.filename = filename
        self.args = (self.render(),)
        return self


class ParseError(PolycError):
    """The text is not in the language (lexer or parser)."""


class SemanticError(PolycError):
    """The definition parses but breaks a rule of the language (types, indices, range inference)."""


class RangeError(SemanticError):
    """Range inference could not give an index a range, or gave it an empty one."""


class UnsupportedError(PolycError):
    """Valid input that polyc does not handle (yet): float16, an ONNX operator or attribute, ..."""


class ShapeError(PolycError):
    """Arguments at call time do not fit the definition: count, rank, extent, dtype."""


class CompileError(PolycError):
    """A compiler stage failed on valid input: a polyc bug; the message names the stage."""


class KernelRuntimeError(PolycError):
    """A compiled kernel detected a fault while running (e.g. a gather index out of range)."""


def _restore(cls: type, fields: dict) -> PolycError:
    """An unpickled :class:`PolycError` (of class ``cls``) with its ``fields``."""
    error = cls.__new__(cls)
    error.__dict__.update(fields)
    error.args = (error.render(),)
    return error
