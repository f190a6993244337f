"""Tuning records: every measured candidate of :mod:`polyc.tune`, one JSON object per line of a file.

The file is ``POLYC_TUNING_RECORDS`` (a path; ``off`` stops both writing and applying records), else
``tuning.jsonl`` in the disk cache's directory (:func:`polyc.runtime.cache.cache_dir`). A record::

    {"key": <sha256 of the fields below>, "source": <the def's text>, "name": <def name>,
     "sizes": {"M": 64, ...}, "target": <Target.key()>, "cpu": <LLVM CPU>, "version": <polyc>,
     "threads": 2, "options": <Options.to_spec() without threads>, "seconds": [..], "median": 0.00123,
     "default": false, "ok": true, "error": "", "strategy": "evolution", "time": <unix seconds>,
     "final": true,   # "final": a measurement of the confirmation that ends a search
     "constants": ["W"]}   # the inputs taken as constants (packed once), [] when none

and revocations, ``{"key": .., "revoked": true, "reason": .., "time": ..}`` (:func:`revoke`).

The key covers the canonical kernel text (the def as written, dtypes included), the sizes, the target (CPU
name, features, vector width, registers, caches, cores), the thread count, the inputs taken as constants (a
model's kernels take their weights packed once: other code than the same def with every input fed) and
polyc's version: a record from
another machine, CPU override or polyc version never matches, so it is never applied silently
(:func:`best`). ``Options.from_spec(record["options"])`` replays a record by hand. Appends are one ``write``
of a whole line on a file opened for appending (atomic for lines under the pipe buffer size on Linux): two
tuners may share a file.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .. import debug, env
from .cache import cache_dir


#: Nesting depth of :func:`disabled`.
_DISABLED = [0]


@contextlib.contextmanager
def disabled():
    """Within: records are off in this process, as with ``POLYC_TUNING_RECORDS=off`` (for compiling a model
    with its default options beside the tuned ones). Not thread-safe."""
    _DISABLED[0] += 1
    try:
        yield
    finally:
        _DISABLED[0] -= 1


def records_path() -> Path | None:
    """The records file, or None when records are off (``POLYC_TUNING_RECORDS=off``, :func:`disabled`, or no
    cache directory)."""
    if _DISABLED[0]:
        return None
    configured = env.tuning_records()
    if configured:
        return None if configured.lower() in ("off", "0", "none") else Path(configured)
    directory = cache_dir()
    return None if directory is None else directory / "tuning.jsonl"


@functools.lru_cache(maxsize=None)
def polyc_version() -> str:
    """The installed polyc's version (package metadata; read once a process: each read scans the installed
    distributions, 2 ms, once per kernel of a model)."""
    try:
        return version("polyc")
    except PackageNotFoundError:
        return "unknown"


def record_key(source: str, name: str, sizes: dict, target, threads: int, constants=()) -> str:
    """The key of a kernel's records (see the module docstring); ``constants``: the inputs the kernel takes as
    constants (a model's weights, packed once: :meth:`polyc.kernel.Kernel.specialize_sizes`), which change
    the code it runs."""
    fields = [source, name, sorted((k, int(v)) for k, v in sizes.items()), target.key(), int(threads),
              polyc_version()]
    text = json.dumps(fields + ([sorted(constants)] if constants else []))
    return hashlib.sha256(text.encode()).hexdigest()


def append(record: dict, path: Path | None = None) -> None:
    """Append ``record`` (a JSON-serializable dict) as one line; a failure to write is logged and ignored."""
    path = path if path is not None else records_path()
    if path is None:
        return
    line = json.dumps(record, sort_keys=True) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        debug.log(f"tuning records: cannot write {path} ({exc})")


def read(path: Path | None = None) -> list[dict]:
    """Every record of the file (lines that are not a JSON object are skipped, logged)."""
    path = path if path is not None else records_path()
    if path is None or not path.exists():
        return []
    found = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            debug.log(f"tuning records: {path}:{number} is not JSON; skipped")
            continue
        if isinstance(record, dict):
            found.append(record)
    return found


#: Parsed records per file, with the file's (size, mtime) they were read at: a kernel looks its record up on
#: every compile, and a model has hundreds of kernels.
_READ: dict = {}


def revoke(keys, reason: str, path: Path | None = None) -> None:
    """Append a revocation for each key of ``keys``: :func:`best` then applies none of the records written
    under it before (a model whose tuned kernels did not run it faster: ``polyc tune MODEL.onnx``'s model
    check); ``reason`` says why. Records measured later count again."""
    for key in keys:
        append(dict(key=key, revoked=True, reason=reason, time=now()), path)


def best(key: str, path: Path | None = None) -> dict | None:
    """The fastest correct *confirmed* record under ``key`` (``"final": true``: measured alternately with the
    default at the end of a search, :func:`polyc.tune.tune`), None when there is none or the default was the
    fastest: a candidate that won one noisy measurement is never applied; nor is one written before a
    revocation of its key (:func:`revoke`)."""
    path = path if path is not None else records_path()
    if path is None:
        return None
    try:
        stat = path.stat()
    except OSError:
        return None
    stamp = (stat.st_size, stat.st_mtime_ns)
    cached = _READ.get(path)
    if cached is None or cached[0] != stamp:
        by_key: dict = {}
        records = read(path)
        revoked = {}
        for record in records:
            if record.get("revoked"):
                revoked[record.get("key")] = max(revoked.get(record.get("key"), 0), record.get("time", 0))
        for record in records:
            if record.get("ok") and record.get("final") and isinstance(record.get("median"), (int, float)) \
                    and record.get("time", 0) > revoked.get(record.get("key"), -1):
                by_key.setdefault(record.get("key"), []).append(record)
        cached = _READ[path] = (stamp, by_key)
    candidates = cached[1].get(key)
    if not candidates:
        return None
    winner = min(candidates, key=lambda r: r["median"])
    return None if winner.get("default") else winner


def now() -> float:
    """Unix seconds, for a record's ``time``."""
    return time.time()
