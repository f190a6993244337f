"""The tuning search: the space of Options a kernel can be compiled with, and two ways to search it.

The space (:func:`space`) is what :class:`~polyc.Options` can override, seeded from the strategy's own
derivation: the default options (every decision derived from the schedule tree and the target) are always
the first candidate, so tuning never picks something slower than the default *as measured*. Around it:

- ``register_tile_sizes``: rows 1 .. half the vector registers, columns 1-4 vectors of the target's width;
- ``tile_sizes``: one size per loop of the def's largest statement, each a power of two from 4 to 512 (the
  strategy clips them to the loops' extents and multiples of the register tile);
- ``unroll`` (None, 0, 4, 8, 16), ``promote`` (None, True, False), ``fusion`` (smart, max, min), ``rar`` and
  ``tile`` (on or off).

:class:`Evolution` is a steady-state genetic search in the manner of Tensor Comprehensions' autotuner, seeded
by the strategy: the first round is the default and its neighbours (one field changed), then a population of
the best measured candidates breeds, with a quarter of each round drawn at random (immigrants, so a winner
far from the default stays reachable): parents picked by tournament (the best of 3 at random), a child
made by uniform crossover of two parents' fields and then mutated (each field redrawn with probability
1/number of fields, at least one), duplicates of measured candidates redrawn. :class:`RandomSearch` draws
each field uniformly: the baseline the evolution is compared with (``scripts/tune_kernels.py --compare``).
Both are deterministic for a seed.
"""
from __future__ import annotations

import random

from ..kernel import Kernel
from ..options import Options
from ..target import Target

TILE_CHOICES = (4, 8, 16, 32, 64, 128, 256, 512)


def space(kernel: Kernel, target: Target) -> dict:
    """Field -> the values a candidate may take (see the module docstring). ``None`` or the field's default
    comes first in each list."""
    lanes = max(1, target.vector_bits // 32)
    loops = max(len(s.indices) for s in kernel.checked.statements) if kernel.checked.statements else 1
    tiles = [None] + [tuple(random.Random(f"{kernel.source}{k}").choice(TILE_CHOICES) for _ in range(loops))
                      for k in range(24)]
    return {
        "register_tile_sizes": [None] + [(rows, cols * lanes) for rows in range(1, target.vector_registers // 2 + 1)
                                         for cols in (1, 2, 3, 4)],
        "tile_sizes": tiles,
        "unroll": [None, 0, 4, 8, 16],
        "promote": [None, True, False],
        "fusion": ["smart", "max", "min"],
        "rar": [False, True],
        "tile": [True, False],
    }


def spec_of(fields: dict) -> str:
    """The options spec of a candidate (``fields``: the non-default ones)."""
    return Options(**fields).to_spec()


class RandomSearch:
    """Each candidate's fields drawn uniformly from the space (the default first)."""

    def __init__(self, choices: dict, seed: int = 0):
        self.choices = choices
        self.rng = random.Random(seed)
        self.seen: set[str] = set()

    def _draw(self) -> dict:
        return {f: self.rng.choice(values) for f, values in self.choices.items()}

    def propose(self, count: int, measured: list) -> list[dict]:
        """``count`` new candidates (dicts of fields) not measured yet; the default first of all."""
        return self._fresh(count, self._draw)

    def _fresh(self, count: int, draw, found: list | None = None) -> list[dict]:
        """``found`` (default none) topped up to ``count`` candidates by calling ``draw()``, skipping those
        already proposed; the default first of all when nothing has been proposed yet."""
        found = [] if found is None else found
        if not self.seen:
            found.append({})
            self.seen.add(spec_of({}))
        for _ in range(count * 50):
            if len(found) >= count:
                break
            fields = _clean(draw())
            spec = spec_of(fields)
            if spec not in self.seen:
                self.seen.add(spec)
                found.append(fields)
        return found


class Evolution(RandomSearch):
    """A steady-state genetic search (see the module docstring); ``population`` best candidates breed."""

    def __init__(self, choices: dict, seed: int = 0, population: int = 8):
        super().__init__(choices, seed)
        self.population = population

    def propose(self, count: int, measured: list) -> list[dict]:
        """``measured``: ``(fields, median seconds or None)`` of every candidate so far."""
        good = sorted((m for m in measured if m[1] is not None), key=lambda m: m[1])[:self.population]
        if len(good) < 2:  # nothing to breed yet: the default and its neighbours (one field changed)
            return self._neighbours(count)
        immigrants = count // 4  # random draws among the children: a winner far from the default stays reachable
        found = self._fresh(immigrants, self._draw) if immigrants else []
        return self._fresh(count, lambda: self._child(good), found)

    def _child(self, good: list) -> dict:
        """Uniform crossover of two tournament winners, then a mutation of at least one field."""
        a, b = self._tournament(good), self._tournament(good)
        child = {f: (a if self.rng.random() < 0.5 else b).get(f, self.choices[f][0]) for f in self.choices}
        fields = list(self.choices)
        changed = [f for f in fields if self.rng.random() < 1 / len(fields)] or [self.rng.choice(fields)]
        for f in changed:
            child[f] = self.rng.choice(self.choices[f])
        return child

    def _neighbours(self, count: int) -> list[dict]:
        """The default and candidates that change one of its fields."""
        def one_field():
            field = self.rng.choice(list(self.choices))
            return {field: self.rng.choice(self.choices[field])}
        return self._fresh(count, one_field)

    def _tournament(self, good: list) -> dict:
        return min(self.rng.sample(good, min(3, len(good))), key=lambda m: m[1])[0]


def _clean(fields: dict) -> dict:
    """Only the fields that differ from the defaults and matter (tile sizes without tiling do not), so
    candidates that compile alike have equal specs."""
    default = Options()
    fields = {f: v for f, v in fields.items() if v != getattr(default, f)}
    if fields.get("tile") is False:
        fields.pop("tile_sizes", None)
    return fields
