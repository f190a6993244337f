"""The CPU strategy: from isl's schedule tree to a tiled, marked tree, every decision derived.

Steps (in the manner of TC's ``MappedScop::makeSequential``), each switchable in :class:`~polyc.options.Options`:

1. tile each outermost permutable band (``band_tile``) with ``options.tile_sizes`` or sizes derived from the
   target's caches and the band's extents;
2. mark the outermost coincident loop ``parallel`` when the kernel has enough work for the threads.

``target`` is duck-typed: it needs ``cores`` and ``l1d_bytes``/``l2_bytes`` (see ``polyc.codegen.target``).
"""
from __future__ import annotations

import islpy as isl

from ..options import Options
from .scop import Scop
from .transforms import band_coincident, band_extents, band_split, band_tile, bands, insert_mark

#: Below this many statement instances a kernel stays single-threaded (thread start-up would dominate).
PARALLEL_MIN_WORK = 1 << 15


def work(scop: Scop) -> int:
    """The number of statement instances of ``scop`` (from the inferred ranges; an upper bound)."""
    total = 0
    for s in scop.statements:
        n = 1
        for index in s.indices:
            lo, hi = scop.ranges.get((s.name, index), (0, 1))
            n *= max(0, hi - lo)
        total += n
    return total


def threads(options: Options, target) -> int:
    """The thread count: the option, else the target's cores."""
    return options.threads or getattr(target, "cores", 1) or 1


def optimize(schedule: isl.Schedule, scop: Scop, target, options: Options) -> isl.Schedule:
    """Apply the CPU strategy to every outermost band of ``schedule``; returns the new schedule."""
    count = len(bands(schedule))
    parallel = options.parallel and threads(options, target) > 1 and work(scop) >= PARALLEL_MIN_WORK
    for i in range(count):
        node = bands(schedule)[i]
        node = optimize_band(node, options, parallel)
        schedule = node.get_schedule()
    return schedule


def tile_sizes(node: isl.ScheduleNode, options: Options) -> list[int]:
    """Tile sizes for a band: the option (cycled to the band's width) or 32 per member, never larger than
    the member's extent."""
    n = node.band_n_member()
    extents = band_extents(node)
    if options.tile_sizes:
        sizes = [options.tile_sizes[k % len(options.tile_sizes)] for k in range(n)]
    else:
        sizes = [32] * n
    return [max(1, min(s, e)) for s, e in zip(sizes, extents)]


def optimize_band(node: isl.ScheduleNode, options: Options, parallel: bool) -> isl.ScheduleNode:
    """Tile and mark one outermost band; returns a node inside the same tree."""
    coincident = band_coincident(node)
    if options.tile and node.band_get_permutable() and node.band_n_member() >= 2:
        node = band_tile(node, tile_sizes(node, options))
    if parallel and coincident and coincident[0]:
        if node.band_n_member() > 1:
            node = band_split(node, 1)
        node = insert_mark(node, "parallel")
    return node
