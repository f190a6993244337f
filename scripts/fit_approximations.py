#!/usr/bin/env python
"""Derive the coefficients of polyc's inline float32 ``erf`` and ``tanh`` (``polyc/codegen/mathlib.py``).

Each table is a minimax fit on a grid of 8000 points, computed in float64 from mpmath references (40
digits), then rounded to float32:

- ``ERF_SMALL``: ``S(t) = erf(x)/x - 1``, ``t = x²``, ``x`` in [0, 1]: a degree-6 polynomial in ``t``;
- ``ERFC_P`` / ``ERFC_Q``: ``erfc(1 + y)``, ``y`` in [0, ERF_ONE - 1]: a degree-6/6 rational in ``y``;
- ``TANH_SMALL``: ``S(t) = (tanh(x)/x - 1)/t``, ``x`` in (0, TANH_SPLIT]: a degree-4 polynomial in ``t``.

All three minimize the absolute error: each is added to 1 (or to ``x``) in one rounding, so an absolute
error is what reaches the result. The fit is Lawson's algorithm (C. L. Lawson, "Contributions to the theory
of linear least maximum approximation", 1961): weighted linear least squares whose weights are multiplied
by the current error after each solve, which converges to the minimax solution; a rational ``P/Q`` is
linearized as ``P - g Q`` with ``Q(0) = 1`` and weighted by the previous ``1/Q`` (Loeb's iteration). Run::

    python scripts/fit_approximations.py          # print the tables as Python
    python scripts/fit_approximations.py --check  # compare them with polyc's (exit status 1 if they differ)
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
from numpy.polynomial import polynomial as npoly

try:
    import mpmath as mp
except ImportError:  # a test dependency, not a core one
    sys.exit("fit_approximations.py needs mpmath: pip install mpmath (or polyc's test extra, '.[test]')")

POINTS = 8000
ITERATIONS = 400


def minimax(x: np.ndarray, g: np.ndarray, p_degree: int, q_degree: int = 0) -> tuple[float, np.ndarray, np.ndarray]:
    """Lawson/Loeb fit of ``P(x)/Q(x)`` (degrees ``p_degree``, ``q_degree``, ``Q(0) = 1``) to ``g`` on the points
    ``x``, minimizing the largest absolute error. Returns (that error, P, Q) with coefficients lowest power
    first, in ``x`` itself (the solve runs on ``x`` mapped to [0, 1])."""
    lo, hi = x.min(), x.max()
    s = (x - lo) / (hi - lo)
    weights, q_previous, best = np.ones_like(s), np.ones_like(s), None
    for _ in range(ITERATIONS):
        a = np.hstack([s[:, None] ** np.arange(p_degree + 1), -g[:, None] * s[:, None] ** np.arange(1, q_degree + 1)])
        scale = np.sqrt(weights) / q_previous
        solution, *_ = np.linalg.lstsq(a * scale[:, None], g * scale, rcond=None)
        p, q = solution[:p_degree + 1], np.concatenate([[1.0], solution[p_degree + 1:]])
        q_previous = npoly.polyval(s, q)
        error = npoly.polyval(s, p) / q_previous - g
        worst = np.abs(error).max()
        if best is None or worst < best[0]:
            best = (worst, p, q)
        weights = weights * np.abs(error)
        weights /= weights.sum()
    worst, p, q = best
    s_of_x = npoly.Polynomial([-lo / (hi - lo), 1 / (hi - lo)])  # composing with it gives the tables in x
    p, q = npoly.Polynomial(p)(s_of_x).coef, npoly.Polynomial(q)(s_of_x).coef
    return worst, p / q[0], q / q[0]


def _reference(f, xs) -> np.ndarray:
    with mp.workdps(40):
        return np.array([float(f(mp.mpf(float(v)))) for v in xs])


def tables(erf_one: float, tanh_split: float) -> dict:
    """The tables (name -> (float32 coefficients, highest power first, as Python floats; fit error))."""
    x = np.linspace(0.0, 1.0, POINTS)
    g = _reference(lambda v: mp.erf(v) / v - 1 if v else 2 / mp.sqrt(mp.pi) - 1, x)
    e_small, p_small, _ = minimax(x * x, g, 6)
    x = np.linspace(1.0, erf_one, POINTS)
    e_erfc, p_erfc, q_erfc = minimax(x - 1.0, _reference(mp.erfc, x), 6, 6)
    x = np.linspace(0.0, tanh_split, POINTS)[1:]
    e_tanh, p_tanh, _ = minimax(x * x, _reference(lambda v: (mp.tanh(v) / v - 1) / v ** 2, x), 4)

    def f32(c):
        return tuple(float(np.float32(v)) for v in c[::-1])
    return {"ERF_SMALL": (f32(p_small), e_small), "ERFC_P": (f32(p_erfc), e_erfc), "ERFC_Q": (f32(q_erfc), e_erfc),
            "TANH_SMALL": (f32(p_tanh), e_tanh)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with polyc.codegen.mathlib's tables")
    args = parser.parse_args(argv)
    from polyc.codegen import mathlib
    fitted = tables(mathlib.ERF_ONE, mathlib.TANH_SPLIT)
    differ = []
    for name, (coefficients, error) in fitted.items():
        print(f"{name} = {coefficients}  # fit error {error:.2g}")
        ours = getattr(mathlib, name)
        if not np.allclose(ours, coefficients, rtol=1e-6, atol=0):
            differ.append(name)
    if args.check and differ:
        print("differ from polyc.codegen.mathlib:", ", ".join(differ), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
