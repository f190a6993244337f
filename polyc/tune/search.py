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

:class:`ModelSearch` is model-based, as TVM's AutoTVM and MetaSchedule are (there XGBoost over features of the
lowered program; here a random forest over features of the options, :func:`option_features`, and of the
kernel, :func:`kernel_features`): each round fits scikit-learn's ``RandomForestRegressor`` to the log of every
measured time relative to the default's (a failed candidate counts as twice the slowest), scores a pool of
:data:`ModelSearch.POOL` fresh random draws without measuring them, and proposes those with the lowest lower
confidence bound (the forest's mean prediction minus :data:`ModelSearch.KAPPA` times its trees' standard
deviation: a candidate the model is unsure of may be very good), plus one random draw a round. Its ``history``
is *transfer learning*, as AutoTVM's transfer from earlier tuning logs: the records of other kernels measured
on the same target (:func:`polyc.tune.history`) are rows of the same forest, each of this kernel's own
measurements weighing :data:`ModelSearch.OWN_WEIGHT` times one of theirs, so what paid on other kernels (of a
similar shape and time: the kernel features) ranks the first candidates; with history the model ranks from the
second round, without it after a first sample of :data:`ModelSearch.SAMPLE` random draws. Fitting and scoring
take 0.2-0.5 s a round, inside the same budget. All three searches are deterministic for a seed.
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


class ModelSearch(RandomSearch):
    """Model-based search (see the module docstring): a random forest predicts a candidate's log time from its
    options (:func:`option_features`) and the kernel's (:func:`kernel_features`); the pool's candidates with
    the lowest lower confidence bound are proposed. ``history``: rows of :func:`history_rows` (other kernels
    measured on this target), fitted beside this kernel's measurements (transfer learning); ``kernel``: the
    checked def being tuned (its features; None: none, as without history). Needs scikit-learn
    (``pip install polyc[tune]``; PolycError otherwise)."""

    #: Candidates measured before the model is first fitted without history (the default and random draws);
    #: with history the model ranks from the second round on.
    SAMPLE = 8
    #: Fresh random draws the model scores per round (unmeasured). As many as a measured pool of the study
    #: (``scripts/tune_study.py``) holds: ranked among 1000 draws and children of the best, the bound's
    #: spread picked the space's extremes (4x4x4 tiles at 0.08x the default) and lost to random sampling live.
    POOL = 100
    #: Standard deviations of the trees' predictions taken off the mean (the lower confidence bound).
    KAPPA = 1.5
    #: How much one measurement of the kernel being tuned weighs against one row of history.
    OWN_WEIGHT = 3.0

    def __init__(self, choices: dict, seed: int = 0, history=(), kernel=None):
        super().__init__(choices, seed)
        try:
            from sklearn.ensemble import RandomForestRegressor
        except ImportError:
            raise PolycError("the model-based search needs scikit-learn", hint="pip install polyc[tune]") from None
        self._forest = lambda: RandomForestRegressor(n_estimators=48, min_samples_leaf=2, max_features=0.5,
                                                     random_state=self.rng.randrange(2 ** 31))
        self.history = list(history)
        self.kernel = kernel
        self.lanes = choices["cols"][0] if choices.get("cols") else 1

    def propose(self, count: int, measured: list) -> list[dict]:
        """``measured``: ``(fields, median seconds or None)`` of every candidate so far."""
        scored = [(self.seen[spec_of(f)], t) for f, t in measured if spec_of(f) in self.seen]
        if len(scored) < (1 if self.history else self.SAMPLE) or not any(t is not None for _, t in scored):
            return self._fresh(count, self._draw)
        pool, specs = [], set()
        for _ in range(self.POOL):
            genes = self._draw()
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
        fitted to ``scored`` (``(genotype, seconds or None)``, at least one with seconds; times relative to the
        default's, a failed one as twice the slowest) and the history."""
        measured = [(Options(**options_of(g)), t) for g, t in scored]
        own = history_rows(measured, self.lanes, self.kernel)
        rows = own + self.history
        x = np.array([r for r, _ in rows])
        y = np.array([t for _, t in rows])
        weights = np.array([self.OWN_WEIGHT] * len(own) + [1.0] * len(self.history))
        varies = x.std(axis=0) > 0  # constant columns only dilute the forest's random choice of split columns
        forest = self._forest().fit(x[:, varies], y, sample_weight=weights)
        described = kernel_features(self.kernel, _default_seconds(measured))
        candidates = np.array([option_features(Options(**options_of(g)), self.lanes) + described
                               for g in pool])[:, varies]
        per_tree = np.array([tree.predict(candidates) for tree in forest.estimators_])
        bound = per_tree.mean(axis=0) - self.KAPPA * per_tree.std(axis=0)
        return [pool[k] for k in np.argsort(bound, kind="stable")]


#: The Options fields :func:`option_features` encodes one-hot, with their values.
ONE_HOT = (("unroll", (None, 0, 4, 8, 16)), ("reduction_unroll", (None, 1, 2, 8)), ("promote", (None, True, False)),
           ("prefetch", (None, True, False)), ("fusion", ("smart", "max", "min")))

#: Tile-size columns of :func:`option_features` (the sizes cycle over them, as over a band's members).
TILE_COLUMNS = 7


def option_features(options: Options, lanes: int) -> list[float]:
    """A candidate's Options as numbers that mean the same for every kernel, so measurements of other kernels
    inform this one's: the :data:`ONE_HOT` fields one-hot, ``rar`` and ``tile`` as 0/1, explicit tile sizes as
    a flag, the log2 of the smallest and the largest and of the first :data:`TILE_COLUMNS` (cycled, as the
    strategy applies them to a band's members; zeros when derived or untiled), an explicit register tile as a
    flag, log2 rows and log2 of its columns in vectors of ``lanes``."""
    row = []
    for name, values in ONE_HOT:
        row.extend(1.0 if getattr(options, name) == v else 0.0 for v in values)
    row += [1.0 if options.rar else 0.0, 0.0 if options.tile is False else 1.0]
    sizes = options.tile_sizes if options.tile is not False and options.tile_sizes else None
    if sizes:
        logs = [math.log2(s) for s in sizes]
        row += [1.0, min(logs), max(logs)] + [logs[k % len(logs)] for k in range(TILE_COLUMNS)]
    else:
        row += [0.0] * (3 + TILE_COLUMNS)
    registers = options.register_tile_sizes
    row += [1.0, math.log2(registers[0]), math.log2(registers[-1] / lanes)] if registers else [0.0] * 3
    return row


def kernel_features(checked, default_seconds: float) -> list[float]:
    """A kernel as numbers, beside :func:`option_features`: the log of its default's time (``default_seconds``)
    and, of ``checked`` (a :class:`~polyc.lang.ast.CheckedDef`; None: zeros), the statement count and its
    largest statement's loops, reduction loops and left-hand loops."""
    if checked is None or not checked.statements:
        return [math.log(default_seconds), 0.0, 0.0, 0.0, 0.0]
    largest = max(checked.statements, key=lambda s: len(s.indices))
    return [math.log(default_seconds), float(len(checked.statements)), float(len(largest.indices)),
            float(len(largest.reduction_indices)), float(len(largest.lhs_indices))]


def history_rows(measured: list, lanes: int, checked=None) -> list[tuple[list, float]]:
    """One kernel's measurements as the model's rows: ``measured`` is ``(Options, seconds or None)`` with the
    default (``Options()``) among them; each row is ``(option_features + kernel_features, log(seconds / the
    default's))``, a failed candidate at the log of twice the slowest's ratio (without a default: relative
    to the median time; ``[]`` when no candidate has a time). ``checked``: the kernel's def
    (:func:`kernel_features`)."""
    default = _default_seconds(measured)
    if default is None:
        return []
    described = kernel_features(checked, default)
    ratios = [math.log(t / default) for _, t in measured if t is not None]
    failed = max(ratios) + math.log(2)
    return [(option_features(f, lanes) + described, math.log(t / default) if t is not None else failed)
            for f, t in measured]


def _default_seconds(measured: list) -> float | None:
    """The median time of the default candidates (``Options()``) in ``measured``, else of all that have one;
    None when none has."""
    default = Options()
    times = sorted(t for o, t in measured if o == default and t) or sorted(t for _, t in measured if t)
    return times[len(times) // 2] if times else None


def _cycle(items: list):
    """A draw function that returns ``items`` in order, then repeats the last (``_fresh`` stops on its own)."""
    state = iter(items)
    last = items[-1]

    def draw():
        nonlocal last
        last = next(state, last)
        return last
    return draw
