"""The language front end: parse TC text, check it into a typed AST, and print it back.

    >>> program = parse("def add(float(N) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }")
    >>> checked = check_def(program.defs[0], program.source)
    >>> [t.role for t in checked.tensors]
    ['input', 'input', 'output']
    >>> print(format_program(program), end="")
    def add(float32(N) A, float32(N) B) -> (C) {
        C(i) = A(i) + B(i)
    }
"""
from .parser import parse
from .printer import format_def, format_expr, format_program
from .sema import check_def

__all__ = ["parse", "check_def", "format_program", "format_def", "format_expr"]
