"""The machine polyc compiles for: LLVM triple, CPU, vector width, cores and cache sizes.

A :class:`Target` is plain frozen data, so it can be part of a cache key and be written in tests by hand::

    >>> t = Target(triple="x86_64-unknown-linux-gnu", cpu="znver3", features="+avx2,+fma",
    ...            vector_bits=256, cores=2, l1d_bytes=32768, l2_bytes=524288, l3_bytes=33554432)
    >>> t.lanes("float32")
    8

:func:`host_target` describes the machine polyc runs on (the JIT always compiles for the host).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import llvmlite.binding as llvm

#: Cache sizes assumed when /sys does not tell (bytes): a common x86 L1d, L2 and L3.
DEFAULT_CACHES = {1: 32 * 1024, 2: 512 * 1024, 3: 8 * 1024 * 1024}

_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"

_DTYPE_BITS = {"bool": 8, "int8": 8, "uint8": 8, "int16": 16, "uint16": 16, "int32": 32, "uint32": 32,
               "int64": 64, "uint64": 64, "float32": 32, "float64": 64}


@dataclass(frozen=True)
class Target:
    """A CPU to generate code for.

    - ``triple``: the LLVM target triple, e.g. ``"x86_64-unknown-linux-gnu"``;
    - ``cpu``: the LLVM CPU name, e.g. ``"znver3"`` (``""`` means generic);
    - ``features``: the LLVM feature string, e.g. ``"+avx2,+fma,-avx512f"``;
    - ``vector_bits``: width of one SIMD register in bits (512 with AVX-512, 256 with AVX/AVX2, else 128);
    - ``cores``: CPUs this process may run on (the default thread count of parallel loops);
    - ``l1d_bytes``, ``l2_bytes``, ``l3_bytes``: data cache sizes per level, in bytes.
    """

    triple: str
    cpu: str
    features: str
    vector_bits: int
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int

    def lanes(self, dtype: str) -> int:
        """How many elements of ``dtype`` (numpy name; bool counts as 1 byte) fit one vector register."""
        return max(1, self.vector_bits // _DTYPE_BITS[dtype])

    def has_feature(self, name: str) -> bool:
        """Whether ``features`` enables ``name`` (without the sign, e.g. ``"fma"``)."""
        return ("+" + name) in self.features.split(",")

    def key(self) -> str:
        """Every field as one stable line: part of on-disk cache keys (machine code depends on all of them)."""
        return (f"{self.triple}|{self.cpu}|{self.features}|{self.vector_bits}|{self.cores}|"
                f"{self.l1d_bytes}|{self.l2_bytes}|{self.l3_bytes}")

    def __str__(self) -> str:
        return (f"{self.triple} cpu={self.cpu or 'generic'} vector={self.vector_bits}b cores={self.cores} "
                f"L1d={self.l1d_bytes // 1024}K L2={self.l2_bytes // 1024}K L3={self.l3_bytes // 1024}K")


def host_target() -> Target:
    """The machine this process runs on.

    Reads the triple, CPU name and features from LLVM (``llvm.get_process_triple``,
    ``llvm.get_host_cpu_name``, ``llvm.get_host_cpu_features``), the usable cores from the process's CPU
    affinity (``os.sched_getaffinity``, else ``os.cpu_count()``) and the cache sizes from
    ``/sys/devices/system/cpu/cpu0/cache`` (:data:`DEFAULT_CACHES` where that is absent). Never raises.
    """
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name() or ""
    if cpu == "generic":
        cpu = ""
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot tell on this host: compile for the generic CPU
        features = ""
    caches = _read_caches()
    return Target(triple=triple, cpu=cpu, features=features, vector_bits=_vector_bits(features),
                  cores=_usable_cores(), l1d_bytes=caches[1], l2_bytes=caches[2], l3_bytes=caches[3])


def _vector_bits(features: str) -> int:
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        return 512
    if "avx" in enabled or "avx2" in enabled:
        return 256
    return 128


def _usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _read_caches() -> dict[int, int]:
    """Data/unified cache size per level (1, 2, 3) in bytes, from sysfs, with defaults."""
    caches = dict(DEFAULT_CACHES)
    try:
        entries = sorted(os.listdir(_CACHE_DIR))
    except OSError:
        return caches
    for entry in entries:
        if not entry.startswith("index"):
            continue
        path = os.path.join(_CACHE_DIR, entry)
        try:
            level = int(_read(path, "level"))
            kind = _read(path, "type")
            size = _parse_size(_read(path, "size"))
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and level in caches and size > 0:
            caches[level] = size
    return caches


def _read(directory: str, name: str) -> str:
    with open(os.path.join(directory, name)) as f:
        return f.read().strip()


def _parse_size(text: str) -> int:
    """``"32K"`` → 32768; ``"1M"`` → 1048576; a plain number is bytes."""
    units = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}
    text = text.strip().upper()
    if text and text[-1] in units:
        return int(text[:-1]) * units[text[-1]]
    return int(text)
