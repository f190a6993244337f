"""Compilation options: every decision the CPU strategy would derive, overridable for research.

Like Tensor Comprehensions' MappingOptions, an :class:`Options` value is plain data. ``None`` for a field
means "derive it from the schedule tree, the dependences and the target". Its text spec round-trips::

    >>> o = Options(tile_sizes=(32, 32, 64), fusion="min")
    >>> Options.from_spec(o.to_spec()) == o
    True
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields

from .errors import PolycError

FUSION_STRATEGIES = ("max", "smart", "min")
SCHEDULERS = ("isl", "identity")


@dataclass(frozen=True)
class Options:
    """Frozen compilation options.

    - ``scheduler``: ``"isl"`` (isl's scheduler, the default) or ``"identity"`` (source order, for comparison).
    - ``fusion``: ``"max"``, ``"smart"`` or ``"min"`` — isl's ``schedule_serialize_sccs`` / ``whole_component``
      choices, as TC's FusionStrategy.
    - ``rar``: add read-after-read input reuse between independent statements to isl's proximity constraints
      (Pluto's ``--rar``; :func:`polyc.poly.schedule.read_after_read`), so statements streaming the same input
      may be fused. Off by default: it has not paid on the kernels measured (see :mod:`polyc.poly.schedule`).
    - ``tile``: cache-tile permutable bands; ``tile_sizes``: one size per band member (``None``: from the target's
      caches and the footprint).
    - ``register_tile``: unroll-and-jam two output dimensions; ``register_tile_sizes`` (rows, columns).
    - ``vectorize``: emit the innermost stride-1 loop as LLVM vector code of the target's width.
    - ``parallel``: run the outermost coincident loop on ``threads`` threads (``None``: ``POLYC_NUM_THREADS`` or
      all cores).
    - ``unroll``: the longest loop that is unrolled: a loop the strategy marks ``unroll`` (the register tile's
      rows) becomes straight-line copies when it has at most this many iterations (``None``: up to
      :data:`polyc.codegen.llvm.MAX_FULL_UNROLL`); ``0`` unrolls nothing — marked loops stay loops and
      LLVM's own loop unroller is off.
    - ``reduction_unroll``: how many times LLVM's loop unroller unrolls the reduction loop around a register
      tile (its innermost loop, whose body is the tile's rows): ``None``:
      :data:`polyc.codegen.llvm.REDUCTION_UNROLL`; ``1`` keeps it rolled; with ``unroll=0`` LLVM's unroller is off.
    - ``promote``: pack the register tile's vector operand (GEMM's ``B``) into a panel-major local buffer before
      the kernel (:mod:`polyc.poly.promote`): ``None`` where the strategy finds it pays (long rows, reuse),
      ``True`` wherever the access allows it (for research and tests), ``False`` never.
    - ``prefetch``: software-prefetch the next block of a constant packed once (a convolution's filter block)
      while the register tiles of the current one run, and the output lines an accumulation onto the output's
      own values starts from, two register tiles ahead (:mod:`polyc.codegen.prefetch`): ``None`` where the
      rules there say it pays, ``True`` wherever the loops allow it, ``False`` never.
    - ``opt_level``: LLVM optimization level 0-3.
    - ``generic``: compile one kernel for every size (:class:`polyc.kernel.GenericCompiled`): the sizes are
      isl parameters of the domains and access relations and arguments of the native code; every decision
      that needs a size (tile sizes, register tile, whether to run in parallel) is taken at the *hint* sizes,
      those of the first call (or given to :meth:`polyc.Kernel.generic`). Nothing is packed.
    """

    scheduler: str = "isl"
    fusion: str = "smart"
    rar: bool = False
    tile: bool = True
    tile_sizes: tuple[int, ...] | None = None
    register_tile: bool = True
    register_tile_sizes: tuple[int, ...] | None = None
    vectorize: bool = True
    parallel: bool = True
    threads: int | None = None
    unroll: int | None = None
    reduction_unroll: int | None = None
    promote: bool | None = None
    prefetch: bool | None = None
    opt_level: int = 3
    generic: bool = False

    def __post_init__(self):
        if self.scheduler not in SCHEDULERS:
            raise PolycError(f"unknown scheduler {self.scheduler!r}; expected one of {', '.join(SCHEDULERS)}")
        if self.fusion not in FUSION_STRATEGIES:
            raise PolycError(f"unknown fusion strategy {self.fusion!r}; expected one of "
                             f"{', '.join(FUSION_STRATEGIES)}")
        for name in ("tile_sizes", "register_tile_sizes"):
            sizes = getattr(self, name)
            if sizes is not None and (not sizes or any(int(s) < 1 for s in sizes)):
                raise PolycError(f"{name} must be positive integers, got {sizes!r}")
        if self.threads is not None and self.threads < 1:
            raise PolycError(f"threads must be at least 1, got {self.threads}")
        if self.unroll is not None and self.unroll < 0:
            raise PolycError(f"unroll must be 0 or more (or None), got {self.unroll}")
        if self.reduction_unroll is not None and self.reduction_unroll < 1:
            raise PolycError(f"reduction_unroll must be 1 or more (or None), got {self.reduction_unroll}")
        if not 0 <= self.opt_level <= 3:
            raise PolycError(f"opt_level must be 0..3, got {self.opt_level}")

    @staticmethod
    def naive() -> "Options":
        """Every transformation off: isl's schedule as it comes, scalar sequential code (a test oracle)."""
        return Options(tile=False, register_tile=False, vectorize=False, parallel=False, unroll=0, promote=False)

    def replace(self, **changes) -> "Options":
        """A copy with the given fields changed."""
        return dataclasses.replace(self, **changes)

    def to_spec(self) -> str:
        """The text spec, e.g. ``"fusion=min,tile_sizes=32x32x64,threads=2"`` (only non-default fields)."""
        parts = []
        default = Options()
        for f in fields(self):
            value = getattr(self, f.name)
            if value == getattr(default, f.name):
                continue
            if isinstance(value, tuple):
                text = "x".join(str(v) for v in value)
            elif isinstance(value, bool):
                text = "1" if value else "0"
            elif value is None:
                text = "auto"
            else:
                text = str(value)
            parts.append(f"{f.name}={text}")
        return ",".join(parts)

    @staticmethod
    def from_spec(spec: str) -> "Options":
        """Parse a text spec written by :meth:`to_spec`. Raises PolycError naming a bad field or value."""
        kwargs = {}
        types = {f.name: f.type for f in fields(Options)}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, sep, text = part.partition("=")
            name = name.strip()
            text = text.strip()
            if not sep or name not in types:
                raise PolycError(f"bad option {part!r}; expected NAME=VALUE with NAME one of "
                                 f"{', '.join(types)}")
            kind = types[name]
            try:
                if text == "auto" and "None" in kind:
                    value = None
                elif kind.startswith("tuple"):
                    value = tuple(int(v) for v in text.split("x"))
                elif kind.startswith("bool"):
                    if text not in ("0", "1", "true", "false"):
                        raise ValueError(text)
                    value = text in ("1", "true")
                elif kind.startswith("int"):
                    value = int(text)
                else:
                    value = text
            except ValueError:
                raise PolycError(f"bad value {text!r} for option {name}") from None
            kwargs[name] = value
        return Options(**kwargs)
