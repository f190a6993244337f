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
import sys
import time

from . import env

_LEVEL: contextvars.ContextVar[int | None] = contextvars.ContextVar("polyc_debug", default=None)

#: The debug level at which each stage is printed.
STAGE_LEVELS = {"scop": 2, "dependences": 2, "schedule": 3, "transformed": 3, "promoted": 3, "ast": 4, "llvm": 5,
                "jit": 6, "link": 6}


def level() -> int:
    """The current debug level (0 = silent)."""
    value = _LEVEL.get()
    if value is not None:
        return value
    return env.debug_level()


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


class StageLogger:
    """Runs the stages of one compilation, timing and printing each (Halide's ``LoweringLogger``).

    ``log(stage, fn, *args, show=str)`` calls ``fn(*args)`` and returns its value, after which: with
    ``POLYC_TIME_STAGES=1`` the stage's milliseconds are printed (``[polyc] <stage>: <ms> ms``); at the
    stage's debug level (:data:`STAGE_LEVELS`) ``show(value)`` is printed (``show`` is called only then; it
    may return None to print nothing); every hook is called as ``hook(stage, values)`` with ``values`` the
    stage name → value of every stage so far (the between-stage verifier). ``log.given(stage, value)``
    records a value computed earlier (not timed, not printed, no hook). ``seconds`` holds each stage's time.
    """

    def __init__(self, hooks=()):
        self.hooks = tuple(h for h in hooks if h is not None)
        self.values: dict = {}
        self.seconds: dict = {}

    def given(self, stage: str, value):
        self.values[stage] = value
        return value

    def __call__(self, stage: str, fn, *args, show=str):
        started = time.perf_counter()
        value = fn(*args)
        self.seconds[stage] = time.perf_counter() - started
        self.values[stage] = value
        if env.time_stages():
            print(f"[polyc] {stage}: {self.seconds[stage] * 1e3:.2f} ms", file=sys.stderr)
        if level() >= STAGE_LEVELS.get(stage, 2):
            text = show(value)
            if text is not None:
                print(f"[polyc] ---- {stage} ----\n{text}", file=sys.stderr)
        for hook in self.hooks:
            hook(stage, self.values)
        return value
