"""Debug output of the compiler stages.

``POLYC_DEBUG`` (environment, overridable in-process with :func:`override`) selects what is printed to
stderr while kernels compile:

====  ==========================================================
1     one line per compiled kernel: shapes, compile ms
2     + the Scop (iteration domains, access relations) and dependences
3     + the schedule tree before and after the CPU transforms
4     + the isl AST as C
5     + the LLVM IR
====  ==========================================================

``POLYC_TIME_STAGES=1`` prints the milliseconds of each stage.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import sys
import time

_LEVEL: contextvars.ContextVar[int | None] = contextvars.ContextVar("polyc_debug", default=None)

#: The debug level at which each stage is printed.
STAGE_LEVELS = {"scop": 2, "dependences": 2, "schedule": 3, "transformed": 3, "ast": 4, "llvm": 5}


def level() -> int:
    """The current debug level (0 = silent)."""
    value = _LEVEL.get()
    if value is not None:
        return value
    try:
        return int(os.environ.get("POLYC_DEBUG", "0") or 0)
    except ValueError:
        return 0


@contextlib.contextmanager
def override(debug: int):
    """Within the ``with`` block, use ``debug`` as the level whatever the environment says."""
    token = _LEVEL.set(debug)
    try:
        yield
    finally:
        _LEVEL.reset(token)


def log(message: str, at: int = 1) -> None:
    """Print ``message`` to stderr if the level is at least ``at``."""
    if level() >= at:
        print(f"[polyc] {message}", file=sys.stderr)


def log_stage(name: str, value, started: float | None = None) -> None:
    """Print a stage's value (its ``str``) at the level given by :data:`STAGE_LEVELS`.

    ``started`` is the ``time.perf_counter()`` when the stage began; with ``POLYC_TIME_STAGES=1`` the
    stage's milliseconds are printed.
    """
    if started is not None and os.environ.get("POLYC_TIME_STAGES"):
        print(f"[polyc] {name}: {(time.perf_counter() - started) * 1e3:.2f} ms", file=sys.stderr)
    if level() >= STAGE_LEVELS.get(name, 2):
        print(f"[polyc] ---- {name} ----\n{value}", file=sys.stderr)
