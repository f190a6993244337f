"""The on-disk kernel cache: compiled object code keyed by everything that determines it.

An entry is one file ``<key>.polyc`` under the cache directory (``POLYC_CACHE_DIR``, else
``$XDG_CACHE_HOME/polyc``, else ``~/.cache/polyc``; ``POLYC_CACHE_DIR=off`` disables the disk cache). Its layout::

    b"POLYC1\\n" + sha256(payload).hexdigest() + b"\\n" + payload          payload = pickle of a dict

The key is a sha256 over a fingerprint of polyc's own source code and the caller's description (source
text, def name, shapes, dtypes, options spec, target, versions of islpy and llvmlite), so a kernel compiled
by other compiler code is never reused. A file whose magic or checksum is wrong, or whose payload does not
unpickle, is a corrupt entry: it is deleted and reported as a miss, never trusted. Writes go to a temporary
file renamed into place, so a concurrent reader never sees half an entry.
"""
from __future__ import annotations

import functools
import hashlib
import os
import pickle
import tempfile
from pathlib import Path

from .. import debug

_MAGIC = b"POLYC1\n"


def cache_dir() -> Path | None:
    """The directory of the disk cache, or ``None`` when disabled (``POLYC_CACHE_DIR=off``)."""
    configured = os.environ.get("POLYC_CACHE_DIR")
    if configured:
        if configured.lower() in ("off", "0", "none"):
            return None
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "polyc"


@functools.cache
def code_fingerprint() -> str:
    """A sha256 over the source of the installed polyc package: any change to the compiler's code makes
    every earlier entry a miss (a kernel compiled by older code is never reused)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def make_key(*parts) -> str:
    """A hex sha256 key over the compiler's :func:`code_fingerprint` and the ``repr`` of ``parts``."""
    h = hashlib.sha256(code_fingerprint().encode())
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def load(key: str) -> dict | None:
    """The cached payload of ``key``, or ``None`` on a miss or a corrupt entry (which is removed)."""
    directory = cache_dir()
    if directory is None:
        return None
    path = directory / f"{key}.polyc"
    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        digest, _, payload = data[len(_MAGIC):].partition(b"\n")
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise ValueError("checksum mismatch")
        value = pickle.loads(payload)
        if not isinstance(value, dict):
            raise ValueError("payload is not a dict")
        return value
    except Exception as exc:  # any defect of the file means: rebuild
        debug.log(f"cache: discarding corrupt entry {path.name}: {exc}")
        remove(key)
        return None


def store(key: str, value: dict) -> None:
    """Write ``value`` (a picklable dict) under ``key``; failures to write are logged and ignored."""
    directory = cache_dir()
    if directory is None:
        return
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    data = _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, directory / f"{key}.polyc")
    except OSError as exc:
        debug.log(f"cache: cannot write {directory}: {exc}")


def remove(key: str) -> None:
    """Delete the entry of ``key`` if present."""
    directory = cache_dir()
    if directory is None:
        return
    try:
        (directory / f"{key}.polyc").unlink()
    except OSError:
        pass
