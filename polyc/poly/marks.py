"""The marks the CPU strategy puts in schedule trees and codegen reads: one place that writes and reads them.

A mark node's id names what to do with the ``for`` right below it: ``parallel`` (split across the thread
pool), ``vector`` (LLVM vector code of the target's width), ``unroll`` (straight-line copies). A ``parallel``
mark also names the schedule dimension it parallelizes, ``parallel_c<depth>`` (isl calls that loop's iterator
``c<depth>``): where isl splits the marked band into pieces (full and partial tiles), only the loop of that
dimension in each piece runs in parallel.
"""
from __future__ import annotations

#: Mark kinds understood by codegen.
MARKS = ("parallel", "vector", "unroll")


def mark_name(kind: str, depth: int | None = None) -> str:
    """The id of a mark of ``kind`` (one of :data:`MARKS`), for the loop of schedule dimension ``depth``
    when given: ``mark_name("parallel", 3) == "parallel_c3"``."""
    assert kind in MARKS, kind
    return kind if depth is None else f"{kind}_c{depth}"


def parse_mark(name: str) -> tuple[str, int | None]:
    """``(kind, depth)`` of a mark id written by :func:`mark_name` (``depth`` None when it names none)."""
    kind, _, depth = name.partition("_c")
    return kind, (int(depth) if depth else None)
