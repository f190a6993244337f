"""Every ``POLYC_*`` environment variable, read in this one module (documented in README's "Environment").

Each function reads the environment when called (tests and users may change it in-process), so a value is
never cached here; callers that bake a value into compiled code (the thread count, the CPU) resolve it once
before compiling and make it part of the cache key.

==========================  ========================================================================================
``POLYC_CPU``               LLVM CPU name to generate code for instead of the host's (``znver3``/``x86-64-v3``: AVX2;
                            ``znver5``/``x86-64-v4``: AVX-512); see :func:`polyc.target.host_target`
``POLYC_NUM_THREADS``       threads of parallel loops when ``Options.threads`` is None (default: the usable cores)
``POLYC_COMPILE_JOBS``      processes that compile a model's kernels at once (default: the usable cores; ``1``: in
                            this process, one after the other); see :mod:`polyc.runtime.workers`
``POLYC_TUNING_RECORDS``    the tuning records file (default ``tuning.jsonl`` in the cache directory); ``off``: no
                            records are written or applied (:mod:`polyc.runtime.records`)
``POLYC_CACHE_DIR``         the disk cache's directory (default ``$XDG_CACHE_HOME/polyc`` or ``~/.cache/polyc``);
                            ``off`` disables it
``POLYC_DEBUG``             0-5: what the compiler prints to stderr while it compiles (:mod:`polyc.debug`)
``POLYC_TIME_STAGES``       1: print the milliseconds of every pipeline stage
``POLYC_VERIFY``            1/0: run the between-stage verifier (default: on under pytest, off otherwise)
``POLYC_EXECUTOR``          ``python``: run an ONNX model node by node from Python instead of its native program
``CC``                      the C compiler ``polyc export`` links libraries with (default ``cc``)
==========================  ========================================================================================
"""
from __future__ import annotations

import os
import sys

#: Every variable this module reads, for documentation and tests.
VARIABLES = ("POLYC_CPU", "POLYC_NUM_THREADS", "POLYC_COMPILE_JOBS", "POLYC_TUNING_RECORDS", "POLYC_CACHE_DIR",
             "POLYC_DEBUG", "POLYC_TIME_STAGES", "POLYC_VERIFY", "POLYC_EXECUTOR")


def cpu() -> str:
    """``POLYC_CPU`` stripped (``""``: the host's CPU)."""
    return os.environ.get("POLYC_CPU", "").strip()


def num_threads() -> int | None:
    """``POLYC_NUM_THREADS`` as a positive int, else None (unset, empty or not a positive number)."""
    value = os.environ.get("POLYC_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def compile_jobs() -> int | None:
    """``POLYC_COMPILE_JOBS`` as a positive int, else None (unset, empty or not a positive number)."""
    value = os.environ.get("POLYC_COMPILE_JOBS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def tuning_records() -> str | None:
    """``POLYC_TUNING_RECORDS`` as given (``off``: records off), else None (the default file)."""
    return os.environ.get("POLYC_TUNING_RECORDS", "").strip() or None


def cache_dir() -> str | None:
    """``POLYC_CACHE_DIR`` as given (``"off"``, ``"0"`` or ``"none"`` mean disabled), else None (the default
    directory)."""
    return os.environ.get("POLYC_CACHE_DIR") or None


def user_cache_home() -> str:
    """The user's cache root: ``$XDG_CACHE_HOME``, else ``~/.cache``."""
    return os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")


def debug_level() -> int:
    """``POLYC_DEBUG`` as an int (0 when unset or not a number)."""
    try:
        return int(os.environ.get("POLYC_DEBUG", "0") or 0)
    except ValueError:
        return 0


def time_stages() -> bool:
    """Whether ``POLYC_TIME_STAGES`` is set (non-empty)."""
    return bool(os.environ.get("POLYC_TIME_STAGES"))


def verify() -> bool:
    """Whether the between-stage verifier runs: ``POLYC_VERIFY`` (``0`` or empty: off), else whether the
    process runs under pytest."""
    flag = os.environ.get("POLYC_VERIFY")
    if flag is not None:
        return flag not in ("0", "")
    return "pytest" in sys.modules


def python_executor() -> bool:
    """Whether ``POLYC_EXECUTOR=python`` asks ONNX models to run node by node from Python."""
    return os.environ.get("POLYC_EXECUTOR", "native") == "python"


def c_compiler() -> str:
    """``CC`` (the C compiler ``polyc export`` links with), else ``cc``."""
    return os.environ.get("CC", "").strip() or "cc"
