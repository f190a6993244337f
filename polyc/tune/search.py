"""The tuning search: the space of Options a kernel can be compiled with, and two ways to search it.

The space (:func:`space`) is what :class:`~polyc.Options` can override, seeded from the strategy's own
derivation: the default options (every decision derived from the schedule tree and the target) are always
the first candidate, so tuning never picks something slower than the default *as measured*. A candidate is
a genotype, one value per gene (:func:`options_of` turns it into Options fields):

- ``registers`` (derived, or explicit ``rows`` x ``cols``: rows 1 .. half the vector registers, columns 1-4
  vectors of the target's width);
- ``tiles`` (derived, or explicit: one gene ``tile.k`` per loop of the def's largest statement, each a power
  of two from 4 to 512; the strategy clips them to the loops' extents and multiples of the register tile);
- ``unroll`` (None, 0, 4, 8, 16), ``reduction_unroll`` (None, 1, 2, 8), ``promote`` and ``prefetch`` (None,
  True, False), ``fusion`` (smart, max, min), ``rar`` and ``tile`` (on or off).

:class:`Evolution` is a steady-state genetic search in the manner of Tensor Comprehensions' autotuner, seeded
by the strategy: the first round is the default and its neighbours (one gene changed), then a population of
the best measured candidates breeds, with a quarter of each round drawn at random (immigrants, so a winner
far from the default stays reachable): parents picked by tournament (the best of 3 at random), a child
made by uniform crossover of two parents' genes and then mutated (each gene with probability 1/number of
genes, at least one): an ordered gene (a tile size, the register tile's rows or columns) steps to a
neighbouring value three times in four, so the search climbs along a size that pays, any other gene is
redrawn; duplicates of measured candidates are redrawn. :class:`RandomSearch` draws each gene uniformly:
the baseline the others are compared with (``scripts/tune_kernels.py --compare``).

:class:`ModelSearch` is model-based, as TVM's AutoTVM and MetaSchedule are (there XGBoost over features of
the lowered program; here a random forest over the genes): after a first sample (the default and random
draws, :data:`ModelSearch.SAMPLE` candidates), each round fits scikit-learn's ``RandomForestRegressor`` to
the log of every measured time (a failed candidate counts as twice the slowest), scores a pool of fresh
random draws and of children of the best measured candidates (the evolution's crossover and mutation)
without measuring them, and proposes those with the lowest lower confidence bound (the forest's mean
prediction minus :data:`ModelSearch.KAPPA` times its trees' standard deviation: a candidate the model is
unsure of may be very good), plus one random draw a round. Fitting and scoring take about 0.2 s a round,
inside the same budget. All three searches are deterministic for a seed.
"""
from __future__ import annotations

import math
import random

import numpy as np

from ..errors import PolycError
from ..kernel import Kernel
from ..options import Options
from ..target import Target

TILE_CHOICES = (4, 8, 16, 32, 64, 128, 256, 512)

#: Genes whose values are ordered (a mutation steps to a neighbouring value).
ORDINAL = ("rows", "cols")


def space(kernel: Kernel, target: Target) -> dict:
    """Gene -> the values it may take (see the module docstring); the default's value comes first. A
    candidate is a *genotype* (one value per gene, :func:`options_of` gives its Options fields): ``tiles``
    (``derived`` or ``explicit``) with one gene per loop of the def's largest statement, ``tile.0`` ... (a
    power of two each, used when ``explicit``);
    ``registers`` (``derived`` or ``explicit``) with ``rows`` (1 .. half the vector registers) and ``cols``
    (1-4 vectors of the target's width); the :data:`PLAIN_GENES` as Options has them."""
    loops = max(len(s.indices) for s in kernel.checked.statements) if kernel.checked.statements else 1
    lanes = max(1, target.vector_bits // 32)
    genes = {
        "tiles": ["derived", "explicit"],
        **{f"tile.{k}": list(TILE_CHOICES) for k in range(loops)},
        "registers": ["derived", "explicit"],
        "rows": list(range(1, target.vector_registers // 2 + 1)),
        "cols": [c * lanes for c in (1, 2, 3, 4)],
        "unroll": [None, 0, 4, 8, 16],
        "reduction_unroll": [None, 1, 2, 8],
        "promote": [None, True, False],
        "prefetch": [None, True, False],
        "fusion": ["smart", "max", "min"],
        "rar": [False, True],
        "tile": [True, False],
    }
    return genes


#: The genes that are Options fields as they are.
PLAIN_GENES = ("unroll", "reduction_unroll", "promote", "prefetch", "fusion", "rar", "tile")


def options_of(genes: dict) -> dict:
    """The Options fields of a genotype that differ from the defaults and matter (tile sizes without tiling
    do not), so genotypes that compile alike have equal specs."""
    fields = {f: genes[f] for f in PLAIN_GENES if f in genes}
    if genes.get("tiles") == "explicit":
        fields["tile_sizes"] = tuple(genes[f"tile.{k}"] for k in range(sum(g.startswith("tile.") for g in genes)))
    if genes.get("registers") == "explicit":
        fields["register_tile_sizes"] = (genes["rows"], genes["cols"])
    default = Options()
    fields = {f: v for f, v in fields.items() if v != getattr(default, f)}
    if fields.get("tile") is False:
        fields.pop("tile_sizes", None)
    return fields


def spec_of(fields: dict) -> str:
    """The options spec of a candidate (``fields``: Options fields, the non-default ones)."""
    return Options(**fields).to_spec()


class RandomSearch:
    """Each gene drawn uniformly from the space (the default first)."""

    def __init__(self, choices: dict, seed: int = 0):
        self.choices = choices
        self.rng = random.Random(seed)
        self.seen: dict[str, dict] = {}  # spec -> the genotype proposed for it

    def _default(self) -> dict:
        return {g: values[0] for g, values in self.choices.items()}

    def _draw(self) -> dict:
        return {g: self.rng.choice(values) for g, values in self.choices.items()}

    def propose(self, count: int, measured: list) -> list[dict]:
        """``count`` new candidates (Options fields) not measured yet; the default first of all."""
        return self._fresh(count, self._draw)

    def _fresh(self, count: int, draw, found: list | None = None) -> list[dict]:
        """``found`` (default none) topped up to ``count`` candidates by calling ``draw()`` (a genotype),
        skipping those whose options were already proposed; the default first of all."""
        found = [] if found is None else found
        if not self.seen:
            found.append({})
            self.seen[spec_of({})] = self._default()
        for _ in range(count * 50):
            if len(found) >= count:
                break
            genes = draw()
            fields = options_of(genes)
            spec = spec_of(fields)
            if spec not in self.seen:
                self.seen[spec] = genes
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
        good = [(self.seen.get(spec_of(f), self._default()), t) for f, t in good]
        if len(good) < 2:  # nothing to breed yet: the default and its neighbours (one gene changed)
            return self._neighbours(count)
        immigrants = count // 4  # random draws among the children: a winner far from the default stays reachable
        found = self._fresh(immigrants, self._draw) if immigrants else []
        return self._fresh(count, lambda: self._child(good), found)

    def _child(self, good: list) -> dict:
        """Uniform crossover of two tournament winners, then a mutation of at least one gene."""
        a, b = self._tournament(good), self._tournament(good)
        child = {g: (a if self.rng.random() < 0.5 else b)[g] for g in self.choices}
        genes = list(self.choices)
        for g in [g for g in genes if self.rng.random() < 1 / len(genes)] or [self.rng.choice(genes)]:
            child[g] = self._mutate(g, child[g])
        return child

    def _mutate(self, gene: str, value):
        """A new value of ``gene``: an ordered gene (tile sizes, register tile rows and columns) steps to a
        neighbouring value three times in four (local search: a size that helps is worth doubling again),
        else any value is drawn."""
        values = self.choices[gene]
        if (gene in ORDINAL or gene.startswith("tile.")) and self.rng.random() < 0.75:
            k = values.index(value)
            return values[max(0, min(len(values) - 1, k + self.rng.choice((-1, 1))))]
        return self.rng.choice(values)

    def _neighbours(self, count: int) -> list[dict]:
        """The default and candidates that change one of its genes (tile sizes and register tile: made
        explicit with drawn values)."""
        def one_gene():
            genes = self._default()
            gene = self.rng.choice(["tiles", "registers", *PLAIN_GENES])
            if gene in ("tiles", "registers"):  # made explicit, with drawn sizes
                drawn = self._draw()
                genes.update({g: drawn[g] for g in genes if g.startswith("tile.") or g in ORDINAL})
                genes[gene] = "explicit"
            else:
                genes[gene] = self.rng.choice(self.choices[gene])
            return genes
        return self._fresh(count, one_gene)

    def _tournament(self, good: list) -> dict:
        return min(self.rng.sample(good, min(3, len(good))), key=lambda m: m[1])[0]


class ModelSearch(Evolution):
    """Model-based search (see the module docstring): a random forest predicts a candidate's log time from its
    genes; the pool's candidates with the lowest lower confidence bound are proposed. Needs scikit-learn
    (``pip install polyc[tune]``; PolycError otherwise)."""

    #: Candidates measured before the model is first fitted (the default and random draws).
    SAMPLE = 8
    #: Unmeasured candidates the model scores per round: fresh random draws and children of the best.
    POOL = 1000
    #: Standard deviations of the trees' predictions taken off the mean (the lower confidence bound).
    KAPPA = 0.5

    def __init__(self, choices: dict, seed: int = 0, population: int = 8):
        super().__init__(choices, seed, population)
        try:
            from sklearn.ensemble import RandomForestRegressor
        except ImportError:
            raise PolycError("the model-based search needs scikit-learn", hint="pip install polyc[tune]") from None
        self._forest = lambda: RandomForestRegressor(n_estimators=64, min_samples_leaf=1, max_features=0.5,
                                                     random_state=self.rng.randrange(2 ** 31))

    def propose(self, count: int, measured: list) -> list[dict]:
        """``measured``: ``(fields, median seconds or None)`` of every candidate so far."""
        scored = [(self.seen[spec_of(f)], t) for f, t in measured if spec_of(f) in self.seen]
        if len(scored) < self.SAMPLE or not any(t is not None for _, t in scored):
            return self._fresh(count, self._draw)
        good = sorted((m for m in scored if m[1] is not None), key=lambda m: m[1])[:self.population]
        pool, specs = [], set()
        for k in range(self.POOL):
            genes = self._draw() if k % 2 else self._child(good)
            spec = spec_of(options_of(genes))
            if spec not in self.seen and spec not in specs:
                specs.add(spec)
                pool.append(genes)
        if not pool:
            return self._fresh(count, self._draw)
        found = self._fresh(1, self._draw)  # one random draw a round: the model's blind spots stay reachable
        return self._fresh(count, _cycle(self.rank(pool, scored)), found)

    def rank(self, pool: list[dict], scored: list) -> list[dict]:
        """The genotypes of ``pool`` from the most promising on: by the lower confidence bound of a random forest
        fitted to ``scored`` (``(genotype, seconds or None)``, at least one with seconds; a failed one counts
        as twice the slowest)."""
        worst = max(math.log(t) for _, t in scored if t is not None) + math.log(2)
        x = np.array([self.features(g) for g, _ in scored])
        y = np.array([math.log(t) if t is not None else worst for _, t in scored])
        forest = self._forest().fit(x, y)
        candidates = np.array([self.features(g) for g in pool])
        per_tree = np.array([tree.predict(candidates) for tree in forest.estimators_])
        bound = per_tree.mean(axis=0) - self.KAPPA * per_tree.std(axis=0)
        return [pool[k] for k in np.argsort(bound, kind="stable")]

    def features(self, genes: dict) -> list[float]:
        """The genotype as numbers: an ordered gene as log2 of its value (0 where it has no effect: tile sizes
        when the tiles are derived or tiling is off, the register tile when derived), any other gene one-hot."""
        row = []
        tiled = genes.get("tile", True) is not False
        for gene, values in self.choices.items():
            value = genes[gene]
            if gene.startswith("tile."):
                row.append(math.log2(value) if tiled and genes.get("tiles") == "explicit" else 0.0)
            elif gene in ORDINAL:
                row.append(math.log2(value) if genes.get("registers") == "explicit" else 0.0)
            else:
                row.extend(1.0 if value == v else 0.0 for v in values)
        return row


def _cycle(items: list):
    """A draw function that returns ``items`` in order, then repeats the last (``_fresh`` stops on its own)."""
    state = iter(items)
    last = items[-1]

    def draw():
        nonlocal last
        last = next(state, last)
        return last
    return draw
