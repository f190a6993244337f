#!/usr/bin/env python
"""Compare schedules of one kernel: what each polyhedral transformation buys.

Compiles one def of a ``.tc`` file for the given sizes under a ladder of schedule variants, runs each on the
same random inputs, checks every variant's outputs against the first one's (source order; ``allclose`` for
floating point, exact for integers), and prints a markdown table::

    | variant | options | compile ms | ms | GFLOP/s | speedup |

The variants (``--variants`` picks a subset by name, ``--variant NAME=SPEC`` adds your own):

- ``source order``: the identity scheduler (the loops as written) with every transform off;
- ``isl``: isl's schedule, transforms off (``Options.naive()``);
- ``+ tile``, ``+ register tile`` (with its rows unrolled), ``+ vectorize``, ``+ promote``, ``+ parallel``: each adds one transform
  to the previous (``+ promote`` packs where the strategy finds it pays, so it changes nothing on small
  sizes: add ``--variant packed=promote=1`` to force it; ``+ parallel`` is the full default strategy on
  ``--threads`` threads);
- ``fusion=max`` / ``fusion=min``: the default strategy with isl's maximal / minimal fusion;
- ``tile AxBxC``: the default strategy with forced cache tile sizes (``--tile-sizes``);
- ``tuned (record)`` with ``--tuned``: the options of this kernel's best tuning record (``polyc tune``), if
  it has one that beat the default; ``tuned (search)`` with ``--tune SECONDS``: a search of that many
  seconds run first (its records written), its best; with ``--png`` the search's best-so-far over time goes
  to ``<png stem>-search.png``.

The ladder itself never uses tuning records (the kernel is made with ``records=False``): ``+ parallel`` is
the derived default, whatever was tuned.

``ms`` is the median of ``--runs`` calls after one warm-up call (compile time is separate: the disk cache is
off, ``POLYC_CACHE_DIR=off``, unless you set it). GFLOP/s uses ``--flops EXPR`` (an expression in the sizes,
e.g. ``2*M*N*K``) or, without it, a count derived from the def: ``polyc.poly.analysis.flops`` of the
compiled kernel's Scop (per statement, the points of its iteration domain counted by isl times the
floating-point operations of its right-hand side, plus one for a reduction's update; that function's
docstring gives the rules for builtins, selects and comparisons). ``--png FILE`` writes a bar chart (needs
matplotlib).

Run it as::

    python scripts/compare_schedules.py kernels/matmul.tc --def matmul --sizes M=512,N=512,K=512
    python scripts/compare_schedules.py kernels/softmax.tc --def softmax --sizes N=256,D=1024 --png sm.png
    python scripts/compare_schedules.py conv2d --def conv2d --sizes N=1,C=64,H=58,W=58,M=64,KH=3,KW=3 \\
        --variant "mine=tile_sizes=8x32x64,fusion=min"

(a family name of the library, like ``conv2d``, stands for ``kernels/conv2d.tc``). Exit status: 0 when every
variant matched, 1 when one did not, 2 for a usage error or a missing matplotlib with ``--png``.
Uses polyc's public API, and ``polyc.poly.analysis`` for the flop count.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("POLYC_CACHE_DIR", "off")

import numpy as np  # noqa: E402

import polyc  # noqa: E402
import polyc.tune  # noqa: E402
from polyc import Options  # noqa: E402
from polyc.poly import analysis  # noqa: E402

DEFAULT_TILE_SIZES = ("32x32x32", "64x64x128", "128x256x256")


# ---- variants ----------------------------------------------------------------------------------------------

def variants(threads: int | None, tile_sizes) -> list[tuple[str, Options]]:
    """The ladder of (name, options), source order first."""
    naive = Options.naive()
    out = [("source order", naive.replace(scheduler="identity")),
           ("isl", naive)]
    step = naive
    for name, change in (("+ tile", dict(tile=True)), ("+ register tile", dict(register_tile=True, unroll=None)),
                         ("+ vectorize", dict(vectorize=True)), ("+ promote", dict(promote=None)),
                         ("+ parallel", dict(parallel=True, threads=threads))):
        step = step.replace(**change)
        out.append((name, step))
    full = Options(threads=threads)
    out.append(("fusion=max", full.replace(fusion="max")))
    out.append(("fusion=min", full.replace(fusion="min")))
    for spec in tile_sizes:
        sizes = tuple(int(s) for s in spec.split("x"))
        out.append((f"tile {spec}", full.replace(tile_sizes=sizes)))
    return out


# ---- inputs, flops -----------------------------------------------------------------------------------------

def parse_sizes(text: str) -> dict:
    sizes = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = part.partition("=")
        if not sep:
            raise SystemExit(f"--sizes: expected NAME=VALUE, got {part!r}")
        try:
            sizes[name.strip()] = int(value)
        except ValueError:
            raise SystemExit(f"--sizes: {name.strip()} must be an integer, got {value!r}") from None
    return sizes


def make_inputs(specs, sizes: dict, seed: int) -> list:
    """Random inputs for the kernel's input tensors: standard normal floats, integers in ``[0, smallest
    size)`` (so they are valid indices into any dimension), random booleans."""
    rng = np.random.default_rng(seed)
    low_extent = max(1, min(sizes.values())) if sizes else 1
    arrays = []
    for t in specs:
        dtype = np.dtype(t.dtype)
        if dtype.kind == "f":
            a = rng.standard_normal(t.shape).astype(dtype)
        elif dtype.kind == "b":
            a = rng.random(t.shape) < 0.5
        else:
            a = rng.integers(0, low_extent, size=t.shape).astype(dtype)
        arrays.append(np.asarray(a))
    return arrays


def scop_of(compiled):
    """The Scop of a compiled kernel (the one place this script reaches into the compiled stages)."""
    return compiled.stages.scop


def derived_flops(compiled) -> float | None:
    """The FLOPs of one call, counted on the compiled kernel's Scop by :func:`polyc.poly.analysis.flops`
    (None for a kernel without floating-point work)."""
    return float(analysis.flops(scop_of(compiled))) or None


# ---- timing ------------------------------------------------------------------------------------------------

def time_calls(fn, runs: int) -> float:
    """Median seconds of ``runs`` calls after one warm-up call."""
    fn()
    samples = []
    for _ in range(max(1, runs)):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def matches(a: np.ndarray, b: np.ndarray) -> tuple[bool, str]:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False, f"{a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"
    if a.dtype.kind != "f":
        same = np.array_equal(a, b)
        return same, "" if same else f"{int(np.sum(a != b))} elements differ"
    scale = float(np.max(np.abs(b))) if b.size else 0.0
    rtol, atol = (1e-3, 1e-4 * max(scale, 1.0)) if a.dtype.itemsize <= 4 else (1e-9, 1e-12 * max(scale, 1.0))
    ok = np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=True)
    return ok, "" if ok else f"max abs error {float(np.max(np.abs(a.astype(np.float64) - b))):.3g}"


# ---- main --------------------------------------------------------------------------------------------------

def load_source(path_or_family: str) -> tuple[str, str]:
    path = Path(path_or_family)
    if path.is_file():
        return path.read_text(encoding="utf-8"), str(path)
    import polyc.kernels
    family = path.stem if path.suffix == ".tc" else path_or_family
    if family in polyc.kernels.names():
        return polyc.kernels.source(family), str(polyc.kernels.path(family))
    raise SystemExit(f"no such file: {path_or_family} (and no kernel family of that name; "
                     f"families: {', '.join(polyc.kernels.names())})")


def fmt(value, digits=3) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.{digits}g}" if value < 1 else f"{value:.2f}"


def write_search_png(path: str, history, title: str) -> None:
    """The best median so far of a tuning search (``polyc.tune.TuneResult.history``) over its seconds."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.5))
    ax.step([t for t, _ in history], [b * 1e3 for _, b in history], where="post")
    ax.set_xlabel("seconds of search")
    ax.set_ylabel("best ms so far")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_png(path: str, rows, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["variant"] for r in rows]
    speedups = [r["speedup"] for r in rows]
    fig, ax = plt.subplots(figsize=(max(6.0, 0.8 * len(rows)), 4.0))
    bars = ax.bar(range(len(rows)), speedups, color=["#888888" if r["ok"] else "#cc3333" for r in rows])
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(names, rotation=35, ha="right")
    ax.set_ylabel("speedup over source order")
    if max(speedups) / max(min(speedups), 1e-9) > 30:
        ax.set_yscale("log")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['ms']:.3g} ms", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=7)
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kernel", help="a .tc file (or the name of a family of the library, e.g. matmul)")
    ap.add_argument("--def", dest="name", default=None, help="the def to compile (needed when the file has several)")
    ap.add_argument("--sizes", required=True, help="every size of the def, e.g. M=512,N=512,K=512")
    ap.add_argument("--runs", type=int, default=5, help="timed calls per variant (median); default 5")
    ap.add_argument("--threads", type=int, default=None, help="threads of the parallel variants (default: all cores)")
    ap.add_argument("--flops", default=None, help="flop count as an expression in the sizes, e.g. 2*M*N*K")
    ap.add_argument("--tile-sizes", default=",".join(DEFAULT_TILE_SIZES),
                    help="comma-separated forced tile sizes to compare (default %(default)s; '' for none)")
    ap.add_argument("--variants", default=None,
                    help="only these variants (comma-separated names as in the table; source order and "
                         "--variant ones always run)")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SPEC",
                    help="an extra variant: a name and an Options spec, e.g. 'mine=tile_sizes=8x32x64,fusion=min'")
    ap.add_argument("--png", default=None, help="write a bar chart of the speedups to this file (needs matplotlib)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tuned", action="store_true", help="add this kernel's best tuning record as a variant")
    ap.add_argument("--tune", type=float, default=None, metavar="SECONDS",
                    help="run a tuning search of SECONDS first and add its best as a variant")
    args = ap.parse_args(argv)

    if args.png:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --png needs matplotlib, which is not installed (pip install matplotlib)", file=sys.stderr)
            return 2

    source, where = load_source(args.kernel)
    sizes = parse_sizes(args.sizes)
    try:
        kernel = polyc.Kernel(source, name=args.name, records=False)
    except polyc.PolycError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    ladder = variants(args.threads, [s for s in args.tile_sizes.split(",") if s.strip()])
    extras = []
    for extra in args.variant:
        name, sep, spec = extra.partition("=")
        if not sep:
            print(f"error: --variant expects NAME=SPEC, got {extra!r}", file=sys.stderr)
            return 2
        try:
            extras.append((name.strip(), Options.from_spec(spec)))
        except polyc.PolycError as exc:
            print(f"error: --variant {name}: {exc}", file=sys.stderr)
            return 2
    if args.variants:
        wanted = {w.strip() for w in args.variants.split(",")}
        unknown = wanted - {n for n, _ in ladder}
        if unknown:
            print(f"error: unknown variants {sorted(unknown)}; known: {', '.join(n for n, _ in ladder)}",
                  file=sys.stderr)
            return 2
        ladder = [ladder[0]] + [(n, o) for n, o in ladder[1:] if n in wanted]
    ladder += extras
    search = None
    if args.tuned:
        record = polyc.tune.best_record(source, sizes, kernel.name, args.threads)
        if record is None:
            print("note: no tuning record of this kernel beat the default (polyc tune makes them)", file=sys.stderr)
        else:
            ladder.append(("tuned (record)", Options.from_spec(record["options"]).replace(threads=args.threads)))
    if args.tune:
        search = polyc.tune.tune(source, sizes, kernel.name, budget=args.tune, threads=args.threads)
        ladder.append(("tuned (search)", Options.from_spec(search.best_spec).replace(threads=args.threads)))

    flops = None
    if args.flops:
        try:
            flops = float(eval(args.flops, {"__builtins__": {}}, dict(sizes)))  # noqa: S307 - a user's formula
        except Exception as exc:
            print(f"error: --flops {args.flops!r}: {exc}", file=sys.stderr)
            return 2

    rows = []
    reference = None
    inputs = None
    for name, options in ladder:
        t = time.perf_counter()
        try:
            compiled = kernel.specialize_sizes(sizes, options)
        except polyc.PolycError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        compile_ms = (time.perf_counter() - t) * 1e3
        if inputs is None:
            inputs = make_inputs(compiled.inputs, sizes, args.seed)
            if flops is None:
                flops = derived_flops(compiled)
        outs = [np.zeros(t.shape, t.dtype) for t in compiled.outputs]
        compiled(*inputs, out=outs)
        got = [o.copy() for o in outs]
        if reference is None:
            reference = got
            ok, why = True, ""
        else:
            checks = [matches(g, r) for g, r in zip(got, reference)]
            ok = all(c[0] for c in checks)
            why = "; ".join(c[1] for c in checks if not c[0])
        seconds = time_calls(lambda: compiled(*inputs, out=outs), args.runs)
        rows.append(dict(variant=name, spec=options.to_spec() or "(default)", compile_ms=compile_ms,
                         ms=seconds * 1e3, gflops=flops / seconds / 1e9 if flops else None, ok=ok, why=why))
    base = rows[0]["ms"]
    for r in rows:
        r["speedup"] = base / r["ms"]

    size_text = ", ".join(f"{k}={v}" for k, v in sizes.items())
    print(f"## {kernel.name} ({where}) at {size_text}\n")
    print(f"median of {args.runs} runs after a warm-up; threads for the parallel variants: "
          f"{args.threads or 'all cores'}; flops: "
          f"{'%.4g' % flops if flops else 'unknown (pass --flops)'}"
          f"{' (from --flops)' if args.flops else ' (derived from the def)' if flops else ''}\n")
    print("| variant | options | compile ms | ms | GFLOP/s | speedup | check |")
    print("| --- | --- | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        check = "reference" if r is rows[0] else ("ok" if r["ok"] else f"MISMATCH: {r['why']}")
        print(f"| {r['variant']} | `{r['spec']}` | {r['compile_ms']:.0f} | {fmt(r['ms'])} | {fmt(r['gflops'])} | "
              f"{r['speedup']:.2f}x | {check} |")
    if args.png:
        write_png(args.png, rows, f"{kernel.name} at {size_text}")
        if search is not None:
            write_search_png(str(Path(args.png).with_name(Path(args.png).stem + "-search.png")), search.history,
                             f"{kernel.name} at {size_text}: tuning search")
        print(f"\nwrote {args.png}")
    bad = [r["variant"] for r in rows if not r["ok"]]
    if bad:
        print(f"\n{len(bad)} variant(s) did not match source order: {', '.join(bad)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
