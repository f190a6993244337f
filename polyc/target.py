"""The machine polyc compiles for: LLVM triple, CPU, vector width, cores and cache sizes.

A :class:`Target` is plain frozen data, so it can be part of a cache key and be written in tests by hand::

    >>> t = Target(triple="x86_64-unknown-linux-gnu", cpu="znver3", features="+avx2,+fma",
    ...            vector_bits=256, cores=2, l1d_bytes=32768, l2_bytes=524288, l3_bytes=33554432)
    >>> t.lanes("float32")
    8

:func:`host_target` describes the machine polyc runs on (the JIT always compiles for the host). The
environment variable ``POLYC_CPU`` overrides its CPU with an LLVM CPU name of an instruction-set level the
host can run — ``znver3`` or ``x86-64-v3`` for AVX2 (256-bit vectors, 16 registers), ``znver4``/``znver5``
or ``x86-64-v4`` for AVX-512 (512-bit, 32 registers) — so that an AVX-512 machine generates, runs and
measures AVX2 code (see :data:`AVX2_CPUS`, :data:`AVX512_CPUS`).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import llvmlite.binding as llvm
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, so np.dtype("bfloat16") is its table entry)
import numpy as np

from . import env
from .errors import PolycError

#: Cache sizes assumed when /sys does not tell (bytes): a common x86 L1d, L2 and L3.
DEFAULT_CACHES = {1: 32 * 1024, 2: 512 * 1024, 3: 8 * 1024 * 1024}

_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"

#: LLVM CPU names ``POLYC_CPU`` accepts, by instruction-set level: AVX2 + FMA (256-bit vectors, 16 vector
#: registers) and AVX-512 (512-bit vectors, 32 vector registers).
AVX2_CPUS = ("x86-64-v3", "haswell", "broadwell", "skylake", "alderlake", "znver1", "znver2", "znver3")
AVX512_CPUS = ("x86-64-v4", "skylake-avx512", "cascadelake", "icelake-server", "sapphirerapids", "znver4",
               "znver5")


@dataclass(frozen=True)
class Target:
    """A CPU to generate code for.

    - ``triple``: the LLVM target triple, e.g. ``"x86_64-unknown-linux-gnu"``;
    - ``cpu``: the LLVM CPU name, e.g. ``"znver3"`` (``""`` means generic);
    - ``features``: the LLVM feature string, e.g. ``"+avx2,+fma,-avx512f"``;
    - ``vector_bits``: width of one SIMD register in bits (512 with AVX-512, 256 with AVX/AVX2, else 128);
    - ``cores``: CPUs this process may run on (the default thread count of parallel loops);
    - ``l1d_bytes``, ``l2_bytes``, ``l3_bytes``: data cache sizes per level, in bytes;
    - ``vector_registers``: architectural SIMD registers (x86-64: 32 with AVX-512, else 16).
    """

    triple: str
    cpu: str
    features: str
    vector_bits: int
    cores: int
    l1d_bytes: int
    l2_bytes: int
    l3_bytes: int
    vector_registers: int = 16

    def lanes(self, dtype: str) -> int:
        """How many elements of ``dtype`` (numpy name; bool counts as 1 byte) fit one vector register."""
        return max(1, self.vector_bits // (8 * np.dtype(dtype).itemsize))

    def has_feature(self, name: str) -> bool:
        """Whether ``features`` enables ``name`` (without the sign, e.g. ``"fma"``)."""
        return ("+" + name) in self.features.split(",")

    def key(self) -> str:
        """Every field as one stable line: part of on-disk cache keys (machine code depends on all of them)."""
        return (f"{self.triple}|{self.cpu}|{self.features}|{self.vector_bits}|{self.cores}|"
                f"{self.l1d_bytes}|{self.l2_bytes}|{self.l3_bytes}|{self.vector_registers}")

    def __str__(self) -> str:
        return (f"{self.triple} cpu={self.cpu or 'generic'} vector={self.vector_bits}bx{self.vector_registers} cores={self.cores} "
                f"L1d={self.l1d_bytes // 1024}K L2={self.l2_bytes // 1024}K L3={self.l3_bytes // 1024}K")


def host_target() -> Target:
    """The machine this process runs on, as it generates code (``POLYC_CPU`` read at each call; the
    description of each CPU setting is computed once per process).

    Reads the triple, CPU name and features from LLVM (``llvm.get_process_triple``,
    ``llvm.get_host_cpu_name``, ``llvm.get_host_cpu_features``), the usable cores from the process's CPU
    affinity (``os.sched_getaffinity``, else ``os.cpu_count()``) and the cache sizes from
    ``/sys/devices/system/cpu/cpu0/cache`` (:data:`DEFAULT_CACHES` where that is absent). With
    ``POLYC_CPU`` set, the CPU is overridden (:func:`override_cpu`); raises PolycError when that names a CPU
    outside :data:`AVX2_CPUS`/:data:`AVX512_CPUS` or one whose instructions this machine lacks.
    """
    return _target_for(env.cpu())


@functools.lru_cache(maxsize=None)
def _target_for(requested: str) -> Target:
    """:func:`host_target` for the ``POLYC_CPU`` value ``requested`` (``""``: the host's own CPU)."""
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name() or ""
    if cpu == "generic":
        cpu = ""
    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:  # LLVM cannot tell on this host: compile for the generic CPU
        features = ""
    caches = _read_caches()
    bits = _vector_bits(features)
    host = Target(triple=triple, cpu=cpu, features=features, vector_bits=bits, cores=_usable_cores(),
                  l1d_bytes=caches[1], l2_bytes=caches[2], l3_bytes=caches[3],
                  vector_registers=32 if bits == 512 else 16)
    return override_cpu(host, requested) if requested else host


def override_cpu(host: Target, cpu: str) -> Target:
    """``host`` generating code for the LLVM CPU ``cpu`` of an instruction-set level ``host`` can run: for
    an AVX2 CPU (:data:`AVX2_CPUS`) every AVX-512 feature of the host is turned off (256-bit vectors, 16
    registers); for an AVX-512 CPU (:data:`AVX512_CPUS`) the host's features stay (512-bit, 32 registers).
    Cores and caches stay the host's. Raises PolycError for another name, or when the host lacks the level
    (AVX2 and FMA, or AVX-512F)."""
    enabled = {f[1:] for f in host.features.split(",") if f.startswith("+")}
    if cpu in AVX2_CPUS:
        if not {"avx2", "fma"} <= enabled:
            raise PolycError(f"POLYC_CPU={cpu}: this machine cannot run AVX2 + FMA code",
                             hint="unset POLYC_CPU to compile for the host")
        features = ",".join(("-" + f[1:]) if f.startswith("+") and _is_avx512(f[1:]) else f
                            for f in host.features.split(",") if f)
        return replace(host, cpu=cpu, features=features, vector_bits=256, vector_registers=16)
    if cpu in AVX512_CPUS:
        if "avx512f" not in enabled:
            raise PolycError(f"POLYC_CPU={cpu}: this machine cannot run AVX-512 code",
                             hint=f"use an AVX2 CPU ({', '.join(AVX2_CPUS)}) or unset POLYC_CPU")
        return replace(host, cpu=cpu, vector_bits=512, vector_registers=32)
    raise PolycError(f"POLYC_CPU={cpu!r} is not a CPU polyc can target",
                     hint=f"AVX2: {', '.join(AVX2_CPUS)}; AVX-512: {', '.join(AVX512_CPUS)}")


def _is_avx512(feature: str) -> bool:
    """Whether an LLVM feature name belongs to AVX-512 (or needs its 512-bit registers)."""
    return feature.startswith(("avx512", "avx10", "amx")) or feature == "evex512"


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
