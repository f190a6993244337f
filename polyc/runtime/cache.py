"""The on-disk kernel cache: compiled object code keyed by everything that determines it.

An entry is one file ``<key>.polyc`` under the cache directory (``POLYC_CACHE_DIR``, else
``$XDG_CACHE_HOME/polyc``, else ``~/.cache/polyc``; ``POLYC_CACHE_DIR=off`` disables the disk cache). Its layout::

    b"POLYC2\\n" + mac + b"\\n" + header + b"\\n" + blob_1 + blob_2 + ...

``header`` is JSON: ``{"key": <the full key>, "value": <the entry's JSON fields>, "blobs": [[field, length],
...]}``; each ``bytes`` field of the stored dict (the object code) is a raw blob after the header, never
pickled, so reading an entry executes nothing. ``mac`` is the hex HMAC-SHA256 of everything after it, under
a per-directory secret (the file ``secret``: 32 random bytes created with the directory, mode 0600, owned by
the user). An entry is used only when its MAC verifies, the key inside it equals the key asked for (an
entry copied over another kernel's file is a miss) and the blobs have the lengths the header gives; anything
else is a corrupt or forged entry: it is deleted and reported as a miss, never trusted. Object code is then
checked again as an ELF object by the JIT before LLVM reads it (:func:`polyc.codegen.jit.check_object`).
Without the secret nobody can make an entry this cache will load; whoever can read the secret (the same
user) could, but could also change polyc itself. A secret that is readable by others or owned by another user
disables the cache (logged) rather than being trusted.

The key is a sha256 over a fingerprint of polyc's own source code and the caller's description (source
text, def name, shapes, dtypes, options spec, target, versions of islpy and llvmlite), so a kernel compiled
by other compiler code is never reused. Writes go to a temporary file renamed into place, so a concurrent
reader (thread or process) never sees half an entry.
"""
from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from .. import debug, env

_MAGIC = b"POLYC2\n"
_SECRET = "secret"


def cache_dir() -> Path | None:
    """The directory of the disk cache, or ``None`` when disabled (``POLYC_CACHE_DIR=off``)."""
    configured = env.cache_dir()
    if configured:
        if configured.lower() in ("off", "0", "none"):
            return None
        return Path(configured)
    return Path(env.user_cache_home()) / "polyc"


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


@functools.cache
def library_versions() -> tuple[str, ...]:
    """Versions of the libraries whose output the cache holds (islpy, llvmlite; from package metadata, no
    imports; read once per process: a lookup costs milliseconds, and every key needs it)."""
    found = []
    for package in ("islpy", "llvmlite"):
        try:
            found.append(version(package))
        except PackageNotFoundError:
            found.append("")
    return tuple(found)


def make_key(*parts) -> str:
    """A hex sha256 key over the compiler's :func:`code_fingerprint`, the :func:`library_versions` and the
    ``repr`` of ``parts``."""
    h = hashlib.sha256(code_fingerprint().encode())
    h.update(repr(library_versions()).encode())
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def _secret(directory: Path, create: bool) -> bytes | None:
    """The directory's MAC secret; created (with the directory, 0700, and the file, 0600) when ``create``.
    ``None`` when it is missing (and not created) or not safe to trust (logged)."""
    path = directory / _SECRET
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        if not create:
            return None
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd_tmp, tmp = tempfile.mkstemp(dir=directory, prefix=".secret", suffix=".tmp")  # mode 0600
        try:
            with os.fdopen(fd_tmp, "wb") as f:
                f.write(secrets.token_bytes(32))
            try:
                os.link(tmp, path)  # atomic and never replaces: of two racing creators, one secret wins
            except FileExistsError:
                pass
        finally:
            os.unlink(tmp)
        return _secret(directory, False)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o077 or info.st_uid != os.getuid():
            debug.log(f"cache: {path} is not a private file of this user (mode {oct(info.st_mode)}); "
                      "the disk cache is not used")
            return None
        value = f.read(64)
    return value if len(value) == 32 else None


def _mac(secret: bytes, body: bytes) -> bytes:
    return hmac.new(secret, body, hashlib.sha256).hexdigest().encode()


def load(key: str) -> dict | None:
    """The dict stored under ``key``, or ``None`` on a miss or a corrupt, forged or misplaced entry (which
    is removed). JSON fields come back as JSON gives them (tuples as lists); blobs as ``bytes``."""
    directory = cache_dir()
    if directory is None:
        return None
    path = directory / f"{key}.polyc"
    try:
        data = path.read_bytes()
        secret = _secret(directory, create=False)
    except OSError:
        return None
    try:
        if secret is None:
            raise ValueError("the cache directory has no usable secret, so no entry can be verified")
        if not data.startswith(_MAGIC):
            raise ValueError("bad magic")
        mac, _, body = data[len(_MAGIC):].partition(b"\n")
        if not hmac.compare_digest(mac, _mac(secret, body)):
            raise ValueError("MAC mismatch (corrupt, or not written by this cache)")
        header_text, _, blobs = body.partition(b"\n")
        header = json.loads(header_text)
        if header.get("key") != key:
            raise ValueError("the entry belongs to another key")
        value = dict(header["value"])
        offset = 0
        for name, length in header["blobs"]:
            if not isinstance(length, int) or length < 0 or offset + length > len(blobs):
                raise ValueError("blob lengths do not match the file")
            value[name] = blobs[offset:offset + length]
            offset += length
        if offset != len(blobs):
            raise ValueError("trailing bytes")
        return value
    except Exception as exc:  # any defect of the file means: rebuild
        debug.log(f"cache: discarding corrupt entry {path.name}: {exc}")
        remove(key)
        return None


def fetch(key: str, decode, what: str):
    """``decode(entry)`` of the entry under ``key``, or None on a miss. An entry ``decode`` cannot use (a
    stale or foreign one: ``decode`` raises) is logged as ``what``, removed and counted as a miss, so the
    caller rebuilds it and stores the new one (:func:`store`)."""
    entry = load(key)
    if entry is None:
        return None
    try:
        return decode(entry)
    except Exception as exc:  # a stale or foreign entry: rebuild it
        debug.log(f"cache: {what} unusable ({exc}); rebuilding")
        remove(key)
        return None


def store(key: str, value: dict) -> None:
    """Write ``value`` under ``key``: a dict of JSON-serializable fields and ``bytes`` fields (stored raw).
    Failures to write are logged and ignored (the cache is an optimization)."""
    directory = cache_dir()
    if directory is None:
        return
    fields = {k: v for k, v in value.items() if not isinstance(v, (bytes, bytearray))}
    blobs = [(k, bytes(v)) for k, v in value.items() if isinstance(v, (bytes, bytearray))]
    header = json.dumps({"key": key, "value": fields, "blobs": [[k, len(v)] for k, v in blobs]})
    body = header.encode() + b"\n" + b"".join(v for _, v in blobs)
    try:
        secret = _secret(directory, create=True)
        if secret is None:
            return
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_MAGIC + _mac(secret, body) + b"\n" + body)
            os.replace(tmp, directory / f"{key}.polyc")
        except BaseException:
            os.unlink(tmp)
            raise
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
