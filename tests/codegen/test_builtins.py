"""Every builtin function of the language (TC's CUDA math library, ``tc/lang/builtins.h``, plus ``nearbyint`` and
``ldexp``) in float32 and float64, against independent float64 references: Python's ``math`` module and numpy
for the exact operations (``trunc round nearbyint logb copysign fdim fdivide nextafter remainder ldexp``), mpmath
(:data:`DPS` digits, rounded once) for every transcendental one. (``math.erf``, ``math.cbrt``... are glibc's
float64 libm, which the float64 code itself calls: no independent check there.)

All the builtins of one dtype are statements of one def (one compile), each reading its own input tensors:
N = 1003 runs the 8-lane (AVX2) or 16-lane (AVX-512) vector loop, a 2-lane remainder and a scalar iteration;
``Options.naive()`` runs everything scalar (libm instead of libmvec); N = 1 and 3 run the small shapes.
Errors are measured in ulps of the result dtype: ``|got - exact| / spacing(exact rounded to the dtype)``,
so a correctly rounded result is within 0.5 and a subnormal result is measured in subnormal steps. NaN must be
NaN, an infinite (or overflowing) result exactly that infinity. The bound of each builtin (:data:`CASES`) is
its measured worst case rounded up a little (0.51 for the float32 builtins computed in double: correctly
rounded but for a double error below 1% of an ulp), far below what a wrong formula gives.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from typing import Callable

import mpmath as mp
import numpy as np
import pytest

import polyc
from polyc import PolycError
from polyc.codegen import mathlib
from polyc.codegen.mathlib import has_libmvec
from polyc.lang.ast import BUILTINS

N = 1003
DPS = 30  # digits of the mpmath references (a float64 result is compared with one rounded from ~100 bits)
INF, NAN = math.inf, math.nan
SPECIAL = [0.0, -0.0, INF, -INF, NAN]


def _tiny(dtype) -> list:
    """Subnormals and the smallest normals of ``dtype``, both signs."""
    fi = np.finfo(dtype)
    s, t = float(fi.smallest_subnormal), float(fi.tiny)
    return [s, -s, 3 * s, t, -t, t / 3, -t / 7, t * 1.5]


def _huge(dtype) -> list:
    fi = np.finfo(dtype)
    return [float(fi.max), -float(fi.max), float(fi.max) / 3, -float(fi.max) / 5]


def _uniform(lo, hi):
    return lambda rng, n: rng.uniform(lo, hi, n)


def _log_uniform(lo_exp, hi_exp, signed=True):
    """``±10^u``, u uniform in [lo_exp, hi_exp]."""
    def sample(rng, n):
        v = 10.0 ** rng.uniform(lo_exp, hi_exp, n)
        return v * rng.choice([-1.0, 1.0], n) if signed else v
    return sample


def _mix(*samplers):
    """Samples split evenly between ``samplers``."""
    def sample(rng, n):
        parts = [s(rng, n // len(samplers) + 1) for s in samplers]
        return np.concatenate(parts)[:n]
    return sample


@dataclass(frozen=True)
class Case:
    """One builtin: its arity, the inputs (edge values then samples, per dtype), the scalar reference on
    float64 arguments, and the error bound in ulps for float32 and float64. ``signed_zero``: a zero result
    must have the reference's sign; ``int_exponent``: the last argument is an int32 (``ldexp``); ``abs_tol``:
    an absolute bound that also passes a float64 result (glibc's double ``j0 j1 y0 y1`` are accurate in
    absolute terms, not in ulps, next to their zeros, as CUDA documents its own).
    """

    name: str
    arity: int
    edges: Callable[[type], list]  # dtype -> list of tuples (one value per argument) or of values (arity 1)
    sample: Callable[[type], list]  # dtype -> one sampler per argument
    reference: Callable[..., float]
    ulps: tuple[float, float]
    signed_zero: bool = False
    int_exponent: bool = False
    distinct: int = N  # at most this many distinct inputs (the samples repeat): for slow references
    abs_tol: float = 0.0  # float64 results this close to the exact value pass whatever their ulps


def _safe(f, overflow=INF):
    """``f`` with math's domain errors as NaN and overflow as ``overflow`` (a value or a function of the args)."""
    def g(*args):
        try:
            return f(*args)
        except ValueError:
            return NAN
        except OverflowError:
            return overflow(*args) if callable(overflow) else overflow
    return g


def _mp_real(f, domain=lambda x: True, at_inf=None, keep_zero=False):
    """A one-argument reference by mpmath (:data:`DPS` digits): NaN outside ``domain`` or for NaN; ``at_inf(x)`` for
    ±inf when given; ``keep_zero``: f(±0) = ±0 (odd functions, whose zero mpmath leaves unsigned)."""
    def g(x):
        if math.isnan(x) or not domain(x):
            return NAN
        if keep_zero and x == 0:
            return x
        if math.isinf(x) and at_inf is not None:
            return at_inf(x)
        with mp.workdps(DPS):
            return float(f(mp.mpf(x)))
    return g


def _log_ref(f):
    """A logarithm: -inf at ±0, NaN below 0, +inf at +inf."""
    return lambda x: -INF if x == 0 else _mp_real(f, lambda v: v >= 0, lambda v: INF)(x)


def _atan2(y, x):
    if y == 0 or x == 0 or math.isinf(x) or math.isinf(y) or math.isnan(x) or math.isnan(y):
        return math.atan2(y, x)  # C's signed zeros and infinities
    with mp.workdps(DPS):
        return float(mp.atan2(mp.mpf(y), mp.mpf(x)))


# ---- references that need care ----

def _round_half_away(x):
    if not math.isfinite(x):
        return x
    r = math.trunc(x)
    r = r + math.copysign(1, x) if abs(x - r) >= 0.5 else r
    return math.copysign(float(r), x)


def _logb(x):
    if math.isnan(x):
        return NAN
    if math.isinf(x):
        return INF
    if x == 0:
        return -INF
    return float(math.frexp(x)[1] - 1)


def _fdim(x, y):
    if math.isnan(x) or math.isnan(y):
        return NAN
    return x - y if x > y else 0.0


def _erfinv(x):
    if math.isnan(x) or abs(x) > 1:
        return NAN
    if abs(x) == 1:
        return math.copysign(INF, x)
    if x == 0:
        return x
    with mp.workdps(DPS):
        return float(mp.erfinv(mp.mpf(x)))


def _erfcinv_mp(y):
    """erfcinv(y) as an mpf (y an mpf in (0, 2)); below 1e-10 by Newton steps on log erfc(t) = log y from
    the asymptotic erfc(t) ~ exp(-t²)/(t sqrt(pi)) (no 1 - y to round), above by mpmath's erfinv(1 - y)."""
    if y < mp.mpf("1e-10"):
        with mp.workdps(DPS):
            log_y = mp.log(y)
            t = mp.sqrt(-log_y)
            t = mp.sqrt(-log_y - mp.log(t * mp.sqrt(mp.pi)))
            for _ in range(30):
                e = mp.erfc(t)
                step = (mp.log(e) - log_y) * e * mp.sqrt(mp.pi) / 2 * mp.exp(t * t)
                t += step
                if abs(step) < mp.mpf(10) ** (5 - DPS) * t:
                    return t
            raise AssertionError(f"no erfcinv reference for {y}")
    with mp.workdps(DPS):  # 1 - y is exact in 30 digits (~100 bits) for a double y >= 1e-10
        return mp.erfinv(1 - y)


def _erfcinv(y):
    if math.isnan(y) or y < 0 or y > 2:
        return NAN
    if y == 0:
        return INF
    if y == 2:
        return -INF
    return float(_erfcinv_mp(mp.mpf(y)))


def _normcdfinv(p):
    if math.isnan(p) or p < 0 or p > 1:
        return NAN
    if p == 0:
        return -INF
    if p == 1:
        return INF
    with mp.workdps(DPS):
        return float(-mp.sqrt(2) * _erfcinv_mp(2 * mp.mpf(p)))


def _erfcx(x):
    if math.isnan(x):
        return NAN
    if x == INF:
        return 0.0
    if x == -INF:
        return INF
    with mp.workdps(DPS):
        v = mp.mpf(x)
        if v > 1e6:  # the asymptotic series: the next term is below 1e-36
            return float(1 / (v * mp.sqrt(mp.pi)) * (1 - 1 / (2 * v * v) + 3 / (4 * v ** 4)))
        return float(mp.erfc(v) * mp.exp(v * v))


def _normcdf(x):
    if math.isnan(x):
        return NAN
    with mp.workdps(DPS):
        return float(mp.ncdf(mp.mpf(x)))


def _lgamma(x):
    if math.isnan(x):
        return NAN
    if math.isinf(x) or (x <= 0 and x == math.floor(x)):
        return INF
    with mp.workdps(DPS):
        return float(mp.re(mp.loggamma(mp.mpf(x))))


def _tgamma(x):
    if math.isnan(x) or x == -INF:
        return NAN
    if x == INF:
        return INF
    if x == 0:
        return math.copysign(INF, x)
    if x < 0 and x == math.floor(x):
        return NAN
    with mp.workdps(DPS):
        return float(mp.gamma(mp.mpf(x)))


def _bessel(kind, order):
    def f(x):
        if math.isnan(x) or (x == 0 and order == 1 and kind != "y"):
            return x  # NaN; I1 and J1 are odd: ±0 at ±0
        if kind == "i":
            if math.isinf(x):
                return INF if order == 0 else x
            with mp.workdps(DPS):
                return float(mp.besseli(order, mp.mpf(x)))
        if kind == "y" and (x < 0):
            return NAN
        if kind == "y" and x == 0:
            return -INF
        if math.isinf(x):
            return math.copysign(0.0, x) if kind == "j" and order == 1 else 0.0
        with mp.workdps(DPS):
            return float((mp.besselj if kind == "j" else mp.bessely)(order, mp.mpf(x)))
    cached = functools.lru_cache(maxsize=None)(lambda x, sign: f(x))  # the sign: 0.0 and -0.0 are equal keys
    return lambda x: cached(x, math.copysign(1.0, x))


def _sinpi_cospi(want_sin):
    def f(x):
        if not math.isfinite(x):
            return NAN
        with mp.workdps(DPS):
            return float(mp.sinpi(mp.mpf(x)) if want_sin else mp.cospi(mp.mpf(x)))
    return f


def _norm(reciprocal):
    def f(*args):
        if any(math.isinf(a) for a in args):
            return 0.0 if reciprocal else INF
        if any(math.isnan(a) for a in args):
            return NAN
        with mp.workdps(DPS):
            r = mp.sqrt(sum(mp.mpf(a) ** 2 for a in args))
            if reciprocal:
                return INF if r == 0 else float(1 / r)
            return float(r)
    return f


def _rcbrt(x):
    if math.isnan(x):
        return NAN
    if x == 0:
        return math.copysign(INF, x)
    if math.isinf(x):
        return math.copysign(0.0, x)
    with mp.workdps(DPS):
        return math.copysign(float(1 / mp.cbrt(abs(mp.mpf(x)))), x)


def _divide(x, y):
    with np.errstate(all="ignore"):
        return float(np.float64(x) / np.float64(y))


def _ldexp(x, n):
    return _safe(math.ldexp, lambda x, n: math.copysign(INF, x))(x, int(n))


def _nextafter(dtype):
    def f(x, y):
        with np.errstate(over="ignore"):
            return float(np.nextafter(dtype(x), dtype(y)))
    return f


def _pair(xs, ys):
    return list(zip(xs, ys))


# ---- the cases ----

def _by_dtype(f32, f64):
    return lambda dtype: f32 if dtype == np.float32 else f64


CASES = [
    Case("exp2", 1, lambda d: SPECIAL + [1, -1, 0.5, 127.99, 128, -126, -149, -149.5, -150, 1023.9, 1024, -1074, -1075],
         _by_dtype([_uniform(-160, 140)], [_uniform(-1100, 1040)]), _mp_real(lambda v: mp.power(2, v), at_inf=lambda v: INF if v > 0 else 0.0), (2, 2)),
    Case("exp10", 1, lambda d: SPECIAL + [1, 2, -1, 38.5, 38.6, -45.3, -46, 308.2, 308.3, -323.3, -324.5],
         _by_dtype([_uniform(-48, 40)], [_uniform(-330, 310)]), _mp_real(lambda v: mp.power(10, v), at_inf=lambda v: INF if v > 0 else 0.0),
         # float32: glibc's libmvec promises 4 ulps (its AVX-512 exp10f, _ZGVeN16v_exp10f, measured 3.38 on Zen 5)
         (4, 2)),
    Case("expm1", 1, lambda d: SPECIAL + _tiny(d) + [1e-10, -1e-10, 88.7, 89, 709.7, 710, -20, -40],
         _by_dtype([_mix(_uniform(-30, 90), _log_uniform(-12, 0))], [_mix(_uniform(-40, 710), _log_uniform(-20, 0))]),
         _mp_real(mp.expm1, at_inf=lambda v: INF if v > 0 else -1.0, keep_zero=True), (2, 2),
         signed_zero=True),
    Case("log2", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, 2, 0.5, -1, 1024, 1 + 2 ** -20],
         lambda d: [_log_uniform(-40, 38, signed=False)], _log_ref(lambda v: mp.log(v, 2)), (2, 2)),
    Case("log10", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, 10, 100, 1e-5, -3, 1 + 2 ** -20],
         lambda d: [_log_uniform(-40, 38, signed=False)], _log_ref(mp.log10), (2, 2)),
    Case("log1p", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [-1, -1.5, -0.999999, 1e-9, -1e-9, 1],
         lambda d: [_mix(_uniform(-1, 10), _log_uniform(-30, 30, signed=False))],
         _mp_real(mp.log1p, lambda v: v >= -1, lambda v: INF, True), (2, 2), signed_zero=True),
    Case("cbrt", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [27, -8, 1, -1, 1e-30],
         lambda d: [_log_uniform(-40, 38)], _mp_real(lambda v: mp.sign(v) * mp.cbrt(abs(v)), at_inf=lambda v: v, keep_zero=True),
         (3, 3), signed_zero=True),
    Case("rcbrt", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [27, -8, 1, -1, 1e-30],
         lambda d: [_log_uniform(-40, 38)], _rcbrt, (0.51, 2), signed_zero=True),
    Case("erfc", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 3, 9.19, 10.05, 10.1, 26.5, 27.3, 28, -6],
         _by_dtype([_uniform(-5, 11)], [_uniform(-7, 28)]), _mp_real(mp.erfc, at_inf=lambda v: 0.0 if v > 0 else 2.0), (3, 3)),
    Case("erfcx", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, -1, 11.99, 12, 12.01, 30, 1e5, 1e10, 1e20, 1e30,
                                                                 -9.3, -9.4, -26.5, -26.7, 1e300],
         lambda d: [_mix(_uniform(-9, 40), _log_uniform(-3, 30, signed=False))], _erfcx, (0.51, 4)),
    Case("erfinv", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 1.5, -2, 0.5, -0.5, 0.9999, 1 - 2.0 ** -24, -(1 - 2.0 ** -24),
                                                       1 - 2.0 ** -53, 1 - 2.0 ** -40, 1e-10, 0.25],
         lambda d: [_mix(_uniform(-1, 1), lambda r, n: (1 - 10 ** r.uniform(-16, 0, n)) * r.choice([-1, 1], n))],
         _erfinv, (0.51, 4), signed_zero=True, distinct=300),
    Case("erfcinv", 1, lambda d: SPECIAL + _tiny(d) + [1, 2, -0.5, 2.5, 0.5, 1.5, 1e-30, 1e-300, 2 - 2.0 ** -23,
                                                        2 - 2.0 ** -52, 1e-7, 1 + 2.0 ** -20],
         lambda d: [_mix(_uniform(0, 2), _log_uniform(-44 if d == np.float32 else -320, 0, signed=False))],
         _erfcinv, (0.51, 4), distinct=300),
    Case("normcdf", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, -10, -13.9, -14.1, -37, -38.4, -38.5, 5.5, 8.3, 40],
         _by_dtype([_uniform(-15, 7)], [_uniform(-39, 9)]), _normcdf, (0.51, 4)),
    Case("normcdfinv", 1, lambda d: SPECIAL + _tiny(d) + [1, 0.5, 0.25, 0.75, -0.1, 1.1, 1e-30, 1e-300,
                                                           1 - 2.0 ** -24, 1 - 2.0 ** -53],
         lambda d: [_mix(_uniform(0, 1), _log_uniform(-44 if d == np.float32 else -320, 0, signed=False))],
         _normcdfinv, (0.51, 4), distinct=300),
    Case("lgamma", 1, lambda d: SPECIAL + _tiny(d) + [1, 2, 3, -1, -2, -2.5, 0.5, -0.5, 4e36, 2e305, 1e300, 1e-30,
                                                       -1e-30, 1e10, -2.4570247, -3.5, -100.5],
         lambda d: [_mix(_uniform(-30, 40), _log_uniform(-5, 30, signed=False))], _lgamma, (1, 4)),
    Case("tgamma", 1, lambda d: SPECIAL + _tiny(d) + [1, 2, 3, 5, -1, -2, 0.5, -0.5, -1.5, 35.04, 35.05, 171.6, 171.7,
                                                       -41.5, -42.5, -184.5, 1e-30, -1e-30],
         _by_dtype([_uniform(-40, 36)], [_uniform(-180, 172)]), _tgamma, (1, 8)),
    Case("j0", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 2.404825557695773, 5.520078110286311, 100, 1e4, -1e4],
         lambda d: [_uniform(-60, 60)], _bessel("j", 0), (1, 8), abs_tol=2.0 ** -54),
    Case("j1", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 3.831705970207512, 7.015586669815619, 100, 1e4, -1e4],
         lambda d: [_uniform(-60, 60)], _bessel("j", 1), (1, 8), signed_zero=True, abs_tol=2.0 ** -54),
    Case("y0", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 0.8935769662791675, 3.957678419314858, 100, 1e4],
         lambda d: [_mix(_uniform(0, 60), _log_uniform(-30, 1, signed=False))], _bessel("y", 0), (1, 8), abs_tol=2.0 ** -54,
         distinct=100),
    Case("y1", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 2.197141326031017, 5.429681040794135, 100, 1e4],
         lambda d: [_mix(_uniform(0, 60), _log_uniform(-30, 1, signed=False))], _bessel("y", 1), (1, 8), abs_tol=2.0 ** -54,
         distinct=100),
    Case("cyl_bessel_i0", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 3.75, 21.99, 22, 22.01, 91.9, 92, 713.9, 714],
         _by_dtype([_uniform(-95, 95)], [_mix(_uniform(-22, 22), _uniform(-22, 22), _uniform(-715, 715))]),
         _bessel("i", 0), (0.51, 5), distinct=400),
    Case("cyl_bessel_i1", 1, lambda d: SPECIAL + _tiny(d) + [1, -1, 3.75, 21.99, 22, 22.01, 91.9, -92, 713.9, -714],
         _by_dtype([_uniform(-95, 95)], [_mix(_uniform(-22, 22), _uniform(-22, 22), _uniform(-715, 715))]),
         _bessel("i", 1), (0.51, 5), signed_zero=True, distinct=400),
    Case("sinpi", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, -1, 2, -2, 0.5, -0.5, 1.5, -2.5, 0.25, 1 / 3,
                                                                 2.0 ** 23 + 1, 2.0 ** 24, 2.0 ** 52 + 1, 1e30],
         lambda d: [_mix(_uniform(-8, 8), lambda r, n: r.integers(-100, 100, n) / 2, _log_uniform(-30, 20))],
         _sinpi_cospi(True), (0.51, 2)),
    Case("cospi", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, -1, 2, -2, 0.5, -0.5, 1.5, -2.5, 0.25, 1 / 3,
                                                                 2.0 ** 23 + 1, 2.0 ** 24, 2.0 ** 52 + 1, 1e30],
         lambda d: [_mix(_uniform(-8, 8), lambda r, n: r.integers(-100, 100, n) / 2, _log_uniform(-30, 20))],
         _sinpi_cospi(False), (0.51, 2)),
    Case("trunc", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [0.5, -0.5, 1.5, -2.5, 2.0 ** 23 + 1, 2.0 ** 52 + 1],
         lambda d: [_mix(_uniform(-10, 10), lambda r, n: r.integers(-20, 20, n) / 2)],
         lambda x: float(np.trunc(x)), (0, 0), signed_zero=True),
    Case("round", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [0.5, -0.5, 1.5, -2.5, 0.49999997, -0.4,
                                                                 0.49999999999999994, 2.0 ** 23 + 1, 2.0 ** 52 + 1],
         lambda d: [_mix(_uniform(-10, 10), lambda r, n: r.integers(-20, 20, n) / 2)],
         _round_half_away, (0, 0), signed_zero=True),
    Case("nearbyint", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [0.5, -0.5, 1.5, -2.5, 2.5, 0.49999997, -0.4,
                                                                     2.0 ** 23 + 1, 2.0 ** 52 + 1],
         lambda d: [_mix(_uniform(-10, 10), lambda r, n: r.integers(-20, 20, n) / 2)],
         lambda x: float(np.rint(x)), (0, 0), signed_zero=True),
    Case("logb", 1, lambda d: SPECIAL + _tiny(d) + _huge(d) + [1, 2, 0.5, 3, -3, 0.75, 1024, 1e-40, 1e-310],
         lambda d: [_log_uniform(-45, 38)], _logb, (0, 0)),
    Case("atan2", 2, lambda d: _pair([0.0, -0.0, 0.0, -0.0, 1, -1, INF, -INF, INF, NAN, 1, 0, 1e-40, 3e38],
                                     [0.0, 0.0, -0.0, -0.0, 0, 0, INF, INF, -INF, 1, NAN, -1, 1e38, -1e-40]),
         lambda d: [_uniform(-10, 10), _uniform(-10, 10)], _atan2, (3, 3), signed_zero=True),
    Case("copysign", 2, lambda d: _pair([1, 1, -1, 0.0, -0.0, INF, NAN, 2], [-0.0, 0.0, 1, -1, 1, -INF, -1, NAN]),
         lambda d: [_uniform(-10, 10), _uniform(-10, 10)], math.copysign, (0, 0), signed_zero=True),
    Case("fdim", 2, lambda d: _pair([1, 2, 3, NAN, 1, INF, INF, -INF, 0.0, 3e38, 1e308],
                                    [2, 1, 3, 1, NAN, INF, 1, -INF, -0.0, -3e38, -1e308]),
         lambda d: [_uniform(-10, 10), _uniform(-10, 10)], _fdim, (0.51, 0), signed_zero=True),
    Case("fdivide", 2, lambda d: _pair([1, 1, -1, 0.0, 0.0, INF, 1, 3e38, 1e-40], [0.0, -0.0, 0.0, 0.0, INF, INF, 3, 1e-3, 1e10]),
         lambda d: [_uniform(-10, 10), _uniform(-10, 10)], _divide, (0.51, 0)),
    Case("hypot", 2, lambda d: _pair([3, INF, NAN, -INF, 3e38, 1e308, 1e-40, 1e-310, 0.0, -0.0],
                                     [4, NAN, INF, 1, 3e38, 1e308, 1e-40, 1e-310, 0.0, -0.0]),
         lambda d: [_log_uniform(-40, 38), _log_uniform(-40, 38)], _norm(False), (2, 2)),
    Case("rhypot", 2, lambda d: _pair([3, INF, NAN, -INF, 3e38, 1e308, 1e-40, 1e-310, 0.0, -0.0, 1e-45],
                                      [4, NAN, INF, 1, 3e38, 1e308, 1e-40, 1e-310, 0.0, -0.0, 0.0]),
         lambda d: [_log_uniform(-40, 38), _log_uniform(-40, 38)], _norm(True), (0.51, 3)),
    Case("nextafter", 2, lambda d: _pair([0.0, 0.0, -0.0, 1, 1, 1, NAN, 1, INF, float(np.finfo(d).max), -0.0, 1e-45],
                                         [1, -1, -0.0, 2, 0, 1, 1, NAN, 0, INF, 0.0, 0.0]),
         lambda d: [_log_uniform(-40, 38), _log_uniform(-40, 38)], None, (0, 0), signed_zero=True),
    Case("remainder", 2, lambda d: _pair([5, 7, -5, 1, INF, NAN, 1, 3e38, 1e-40, 0.0, -0.0],
                                         [2, 2, 2, 0.0, 1, 1, INF, 1.5, 3e-41, 1, 1]),
         lambda d: [_uniform(-100, 100), _uniform(-10, 10)], _safe(math.remainder), (0, 0), signed_zero=True),
    Case("ldexp", 2, lambda d: _pair([1, 1, 1, -1, 1.5, 0.0, -0.0, INF, NAN, 3, 1e-40, 3e38, 1, 1],
                                     [127, 128, -149, -150, -149, 5, -5, -1000, 0, 1023, 100, -300, 1024, -1075]),
         lambda d: [_uniform(-10, 10), lambda r, n: r.integers(-1100, 1100, n)], _ldexp, (0.5, 0.5),
         signed_zero=True, int_exponent=True),
    Case("norm3d", 3, lambda d: [(3, 4, 12), (INF, NAN, 1), (NAN, 1, 1), (3e38, 3e38, 3e38), (1e308, 1e308, 1e308),
                                 (1e-40, 1e-40, 1e-40), (1e-310, -1e-310, 1e-310), (0.0, -0.0, 0.0)],
         lambda d: [_log_uniform(-30, 30)] * 3, _norm(False), (0.51, 2)),
    Case("rnorm3d", 3, lambda d: [(3, 4, 12), (INF, NAN, 1), (NAN, 1, 1), (3e38, 3e38, 3e38), (1e308, 1e308, 1e308),
                                  (1e-40, 1e-40, 1e-40), (1e-310, -1e-310, 1e-310), (0.0, -0.0, 0.0)],
         lambda d: [_log_uniform(-30, 30)] * 3, _norm(True), (0.51, 3)),
    Case("norm4d", 4, lambda d: [(1, 2, 2, 4), (1, NAN, -INF, 1), (3e38, 3e38, 3e38, 3e38), (1e-45, 0.0, 0.0, 1e-45),
                                 (1e308, -1e308, 1e308, 1e308), (1e-320, 0.0, 1e-320, 0.0)],
         lambda d: [_log_uniform(-30, 30)] * 4, _norm(False), (0.51, 2)),
    Case("rnorm4d", 4, lambda d: [(1, 2, 2, 4), (1, NAN, -INF, 1), (3e38, 3e38, 3e38, 3e38), (1e-45, 0.0, 0.0, 1e-45),
                                  (1e308, -1e308, 1e308, 1e308), (1e-320, 0.0, 1e-320, 0.0)],
         lambda d: [_log_uniform(-30, 30)] * 4, _norm(True), (0.51, 3)),
]
BY_NAME = {c.name: c for c in CASES}
DTYPES = {"float32": np.float32, "float64": np.float64}


def test_cases_cover_every_float_builtin():
    """Every name TC's builtins.h lists, plus nearbyint and ldexp, is a builtin; the new ones are all tested
    here (the ones polyc had before are tested in test_codegen.py and test_onnx_ops_logic.py)."""
    tc = ("acos acosh asin asinh atan2 atan atanh cbrt ceil copysign cos cosh cospi cyl_bessel_i0 cyl_bessel_i1 erfc "
          "erfcinv erfcx erf erfinv exp10 exp2 exp expm1 fabs fdim fdivide floor fma fmax fmin fmod hypot j0 j1 lgamma "
          "log10 log1p log2 logb log nextafter norm3d norm4d normcdf normcdfinv pow rcbrt remainder rhypot rnorm3d "
          "rnorm4d round rsqrt sin sinh sinpi sqrt tan tanh tgamma trunc y0 y1").split()
    missing = [f for f in tc + ["nearbyint", "ldexp"] if f not in BUILTINS]
    assert not missing
    old = ("exp log sqrt rsqrt tanh fabs fmax fmin fma pow erf floor ceil sin cos tan asin acos atan sinh cosh asinh "
           "acosh atanh fmod").split()
    assert sorted(set(tc + ["nearbyint", "ldexp"]) - set(old)) == sorted(BY_NAME)


# ---- inputs, one def for all, and the comparison ----

@functools.cache
def inputs(dtype_name: str) -> dict:
    """Builtin name -> its argument arrays (N each): the edge values first, then seeded samples."""
    dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(11)
    out = {}
    for case in CASES:
        edges = [e if isinstance(e, tuple) else (e,) for e in case.edges(dtype)]
        samplers = case.sample(dtype)
        columns = []
        with np.errstate(over="ignore"):
            count = min(N, case.distinct) - len(edges)
            for k in range(case.arity):
                values = np.resize(samplers[k](rng, count), N - len(edges))
                values = np.concatenate([[e[k] for e in edges], values])
                if case.int_exponent and k == case.arity - 1:
                    columns.append(values.astype(np.int32))
                else:
                    columns.append(values.astype(dtype))
        out[case.name] = columns
    return out


def source(type_name: str) -> str:
    """One def with every builtin: ``O_f(i) = f(A0_f(i), A1_f(i), ...)``."""
    params, outs, body = [], [], []
    for case in CASES:
        names = [f"A{k}_{case.name}" for k in range(case.arity)]
        params += [f"{'int32' if case.int_exponent and k == case.arity - 1 else type_name}(N) {n}"
                   for k, n in enumerate(names)]
        outs.append(f"O_{case.name}")
        body.append(f"    O_{case.name}(i) = {case.name}({', '.join(f'{n}(i)' for n in names)})")
    return f"def builtins({', '.join(params)}) -> ({', '.join(outs)}) {{\n" + "\n".join(body) + "\n}"


@functools.cache
def kernel(dtype_name: str, naive: bool) -> polyc.Kernel:
    type_name = "float" if dtype_name == "float32" else "double"
    return polyc.define(source(type_name), options=polyc.Options.naive() if naive else None)


@functools.cache
def results(dtype_name: str, naive: bool, n: int = N) -> dict:
    """Builtin name -> (its arguments, the kernel's result) on the first ``n`` elements (n < N: a spread pick)."""
    pick = np.arange(N) if n == N else np.array([7, 500, N - 1])[:n]
    args = {name: [a[pick] for a in cols] for name, cols in inputs(dtype_name).items()}
    flat = [a for case in CASES for a in args[case.name]]
    got = kernel(dtype_name, naive)(*flat)
    return {case.name: (args[case.name], g) for case, g in zip(CASES, got)}


@functools.cache
def reference(dtype_name: str, name: str) -> np.ndarray:
    """The float64 reference of builtin ``name`` on its N inputs."""
    case = BY_NAME[name]
    dtype = DTYPES[dtype_name]
    f = _nextafter(dtype) if name == "nextafter" else case.reference
    cols = [c.astype(np.float64) for c in inputs(dtype_name)[name]]
    known = {}  # repeated inputs (Case.distinct) once; the sign tells 0.0 from -0.0
    values = []
    for row in zip(*cols):
        key = tuple((float(v), math.copysign(1.0, v)) for v in row)
        if key not in known:
            known[key] = f(*map(float, row))
        values.append(known[key])
    return np.array(values, np.float64)


def ulp_errors(got: np.ndarray, exact: np.ndarray, dtype) -> np.ndarray:
    """``|got - exact|`` in units of the spacing of ``exact`` rounded to ``dtype`` (0 where both are the
    same NaN or infinity, inf where only one is NaN or infinite)."""
    with np.errstate(over="ignore", invalid="ignore"):
        rounded = exact.astype(dtype)
        spacing = np.spacing(np.abs(rounded)).astype(np.float64)
        err = np.abs(got.astype(np.float64) - exact) / spacing
    same = (np.isnan(got) & np.isnan(exact)) | (np.isinf(rounded) & (got == rounded))
    err[same] = 0.0
    err[np.isnan(err)] = np.inf
    return err


def check(name: str, dtype_name: str, args: list, got: np.ndarray, exact: np.ndarray) -> None:
    case = BY_NAME[name]
    dtype = DTYPES[dtype_name]
    bound = case.ulps[0 if dtype_name == "float32" else 1]
    err = ulp_errors(got, exact, dtype)
    if dtype_name == "float64" and case.abs_tol:
        with np.errstate(invalid="ignore"):
            err[np.abs(got - exact) <= case.abs_tol] = 0.0
    worst = int(np.argmax(err))
    assert err[worst] <= bound, (f"{name}({', '.join(repr(a[worst]) for a in args)}) = {got[worst]!r}, exact "
                                 f"{exact[worst]!r}: {err[worst]:.3g} ulp > {bound}")
    if case.signed_zero:
        zero = (exact == 0) & (got == 0)
        bad = np.flatnonzero(zero & (np.signbit(got) != np.signbit(exact)))
        assert bad.size == 0, f"{name}: zero of the wrong sign at {[tuple(a[bad[0]] for a in args)]}"


# ---- the tests ----

@pytest.mark.parametrize("naive", [False, True], ids=["default", "naive"])
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
@pytest.mark.parametrize("name", [c.name for c in CASES])
def test_builtin_accuracy(name, dtype_name, naive):
    """Each builtin on N = 1003 inputs (vector loop, remainder, scalar; or all scalar with naive options)
    within its bound of the reference."""
    args, got = results(dtype_name, naive)[name]
    assert got.dtype == DTYPES[dtype_name]
    check(name, dtype_name, args, got, reference(dtype_name, name))


#: Builtins whose code is the same instructions in vector and scalar form (no libm/libmvec difference).
SAME_IN_EVERY_FORM = ("trunc", "round", "nearbyint", "logb", "copysign", "fdim", "fdivide", "nextafter", "sinpi",
                      "cospi", "rhypot", "norm3d", "norm4d", "rnorm3d", "rnorm4d", "remainder", "ldexp")


@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_naive_and_default_agree(dtype_name):
    """The unoptimised (scalar) kernel and the default (vectorized) one agree: bit for bit where the code is
    the same instructions, within each builtin's bound of each other where libmvec replaces libm."""
    for case in CASES:
        args, a = results(dtype_name, False)[case.name]
        _, b = results(dtype_name, True)[case.name]
        if case.name in SAME_IN_EVERY_FORM:
            np.testing.assert_array_equal(a, b, err_msg=case.name)
            assert (np.signbit(a) == np.signbit(b)).all(), case.name
        else:
            bound = case.ulps[0 if dtype_name == "float32" else 1]
            assert ulp_errors(a, b.astype(np.float64), DTYPES[dtype_name]).max() <= 2 * bound + 1, case.name


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize("dtype_name", ["float32", "float64"])
def test_small_sizes(dtype_name, n):
    """N = 1 and 3: no full vector, the remainder and scalar code alone."""
    pick = np.array([7, 500, N - 1])[:n]
    for case in CASES:
        args, got = results(dtype_name, False, n)[case.name]
        check(case.name, dtype_name, args, got, reference(dtype_name, case.name)[pick])


# ---- exact cases the ulp bounds cannot see ----

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sinpi_cospi_exact_zeros_and_signs(dtype):
    """sinpi is ±0 (the sign of x) at the integers and ±1 at the half integers; cospi +0 at the half integers and
    ±1 at the integers (CUDA's and C23's values), also for huge arguments, which are all even integers."""
    t = "float" if dtype == np.float32 else "double"
    k = polyc.define(f"def f({t}(N) X) -> (S, C) {{\n S(i) = sinpi(X(i))\n C(i) = cospi(X(i))\n}}")
    ints = np.array([0.0, -0.0, 1, -1, 2, -2, 3, -7, 2.0 ** 23 + 1, float(np.finfo(dtype).max), -1e30], dtype)
    s, c = k(ints)
    assert (s == 0).all() and (np.signbit(s) == np.signbit(ints)).all()
    np.testing.assert_array_equal(c, np.where(np.mod(ints, 2) == 0, 1.0, -1.0).astype(dtype))
    halves = np.arange(-9.5, 10, 1.0).astype(dtype)
    s, c = k(halves)
    assert (c == 0).all() and not np.signbit(c).any()
    np.testing.assert_array_equal(s, np.where(np.mod(halves - 0.5, 2) == 0, 1.0, -1.0).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_round_nearbyint_trunc_halfway(dtype):
    t = "float" if dtype == np.float32 else "double"
    k = polyc.define(f"def f({t}(N) X) -> (R, E, T) {{\n R(i) = round(X(i))\n E(i) = nearbyint(X(i))\n"
                     f" T(i) = trunc(X(i))\n}}")
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, -0.3], dtype)
    r, e, tr = k(x)
    np.testing.assert_array_equal(r, np.array([1, 2, 3, -1, -2, -3, 0, -0.0], dtype))
    np.testing.assert_array_equal(e, np.array([0, 2, 2, -0.0, -2, -2, 0, -0.0], dtype))
    assert np.signbit(r[-1]) and np.signbit(e[3]) and np.signbit(tr[3]) and np.signbit(tr[-1])


def test_ldexp_exponent_types_saturate():
    """ldexp's exponent keeps its integer type (sema) and saturates to int32 (codegen): an int64 or uint64
    exponent beyond int32 gives the infinity or zero C's ldexp would."""
    k = polyc.define("def f(float(N) X, int64(N) E, uint64(N) U, int8(N) S, bool(N) B) -> (A, C, D, F) {\n"
                     " A(i) = ldexp(X(i), E(i))\n C(i) = ldexp(X(i), U(i))\n D(i) = ldexp(X(i), S(i))\n"
                     " F(i) = ldexp(X(i), B(i))\n}")
    x = np.array([1.5, -1.0, 3.0, 0.0], np.float32)
    e = np.array([2 ** 40, -2 ** 40, -2, 2 ** 62], np.int64)
    u = np.array([2 ** 63 + 5, 2 ** 32, 3, 2 ** 64 - 1], np.uint64)
    s = np.array([-128, 127, 5, -1], np.int8)
    bo = np.array([True, False, True, True])
    a, c, d, f = k(x, e, u, s, bo)
    np.testing.assert_array_equal(a, np.array([np.inf, -0.0, 0.75, 0.0], np.float32))
    assert np.signbit(a[1])
    np.testing.assert_array_equal(c, np.array([np.inf, -np.inf, 24.0, 0.0], np.float32))
    np.testing.assert_array_equal(d, np.array([1.5 * 2.0 ** -128, -2.0 ** 127, 96.0, 0.0], np.float32))
    np.testing.assert_array_equal(f, np.array([3.0, -1.0, 6.0, 0.0], np.float32))
    k64 = polyc.define("def f(double(N) X, int32(N) E) -> (A) { A(i) = ldexp(X(i), E(i)) }")
    np.testing.assert_array_equal(k64(np.array([1.0, 1.0, 3.0]), np.array([1023, -1074, -1075], np.int32)),
                                  np.array([2.0 ** 1023, 5e-324, 1e-323]))  # 1.5 * 2^-1074: to even


def _vector_llvm():
    k = polyc.define("def f(float(N) X, float(N) Y) -> (A, B, C) {\n A(i) = erfc(X(i))\n"
                     " B(i) = atan2(X(i), Y(i))\n C(i) = rcbrt(X(i))\n}", options=polyc.Options(opt_level=0))
    x = np.linspace(0.5, 2, 64, dtype=np.float32)
    return k.specialize(x, x).stage("llvm")


def test_vector_loops_call_libmvec(monkeypatch, tmp_path):
    """In a vectorized loop a function glibc's libmvec has is one call per vector (two halves for a float32
    vector computed in double, as rcbrt's cbrt), not one libm call per lane; without libmvec (glibc before
    2.35, simulated here on every machine) the same loop calls libm per lane."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    if has_libmvec("_ZGVbN4v_erfcf"):
        llvm = _vector_llvm()
        assert re.search(r"_ZGV[bde]N(4|8|16)v_erfcf\b", llvm) and re.search(r"_ZGV[bde]N(4|8|16)vv_atan2f\b", llvm)
        assert re.search(r"_ZGV[bde]N(2|4|8)v_cbrt\b", llvm)
    monkeypatch.setattr(mathlib, "has_libmvec", lambda symbol="": False)
    llvm = _vector_llvm()
    assert re.search(r'@"?erfcf\b', llvm) and re.search(r'@"?atan2f\b', llvm) and "_ZGV" not in llvm


def test_lgamma_in_parallel_loops():
    """lgamma keeps its sign in a stack slot of the kernel's function (glibc's lgamma writes the global
    signgam): the parallel loop's threads give the same values as one thread."""
    k = polyc.define("def f(double(M, N) X) -> (Y) { Y(m, n) = lgamma(X(m, n)) + tgamma(X(m, n) / 64.0) }")
    x = np.random.default_rng(5).uniform(-20, 20, (64, 257))
    expected = np.array([[math.lgamma(v) + math.gamma(v / 64) for v in row] for row in x])
    np.testing.assert_allclose(k(x), expected, rtol=1e-13)


def test_integer_and_mixed_arguments_are_converted():
    """Integer arguments convert to float32, a float64 argument makes the whole call float64 (sema)."""
    k = polyc.define("def f(int32(N) A, double(N) B) -> (X, Y, Z) {\n X(i) = norm4d(A(i), 2, 2, 4)\n"
                     " Y(i) = atan2(A(i), B(i))\n Z(i) = erfinv(A(i) / 4.0)\n}")
    a = np.array([1, -3, 0], np.int32)
    x, y, z = k(a, np.array([2.0, 0.5, -1.0]))
    assert x.dtype == np.float32 and y.dtype == np.float64 and z.dtype == np.float32
    np.testing.assert_allclose(x, np.sqrt(a.astype(np.float64) ** 2 + 24), rtol=1e-7)
    np.testing.assert_allclose(y, np.arctan2(a, [2.0, 0.5, -1.0]), rtol=1e-15)
    np.testing.assert_allclose(z, [_erfinv(0.25), _erfinv(-0.75), 0.0], rtol=1e-7)


# ---- errors ----

def test_unknown_function_lists_the_builtins():
    with pytest.raises(PolycError) as info:
        polyc.define("def f(float(N) A) -> (B) {\n  B(i) = erfcxx(A(i))\n}")(np.zeros(2, np.float32))
    text = str(info.value)
    assert "erfcxx" in text and "normcdfinv" in text and "cyl_bessel_i0" in text and "ldexp" in text


@pytest.mark.parametrize("call,message,caret", [
    ("norm3d(A(i), A(i))", "'norm3d' takes 3 arguments, got 2", "norm3d"),
    ("rnorm4d(A(i))", "'rnorm4d' takes 4 arguments, got 1", "rnorm4d"),
    ("sinpi(A(i), 1)", "'sinpi' takes 1 argument, got 2", "sinpi"),
    ("ldexp(A(i))", "'ldexp' takes 2 arguments, got 1", "ldexp"),
    ("ldexp(A(i), 2.0)", "the exponent of 'ldexp' must be an integer, got float32", "2.0"),
])
def test_wrong_arguments_give_line_and_column(call, message, caret):
    line = f"  B(i) = 1 + {call}"
    with pytest.raises(PolycError) as info:
        polyc.define(f"def f(float(N) A) -> (B) {{\n{line}\n}}")(np.zeros(2, np.float32))
    e = info.value
    assert message in str(e) and (e.span.line, e.span.col) == (2, line.index(caret) + 1), (str(e), e.span)
    assert f"2:{line.index(caret) + 1}" in str(e)


def test_arity_hint_names_every_argument():
    with pytest.raises(PolycError, match=r"norm4d\(x, y, z, w\)"):
        polyc.define("def f(float(N) A) -> (B) { B(i) = norm4d(A(i)) }")(np.zeros(2, np.float32))
    with pytest.raises(PolycError, match=r"ldexp\(x, n\)"):
        polyc.define("def f(float(N) A) -> (B) { B(i) = ldexp(A(i)) }")(np.zeros(2, np.float32))


def test_builtin_names_are_reserved():
    with pytest.raises(PolycError, match="input 'y0' has the name of a builtin function"):
        polyc.define("def f(float(N) y0) -> (B) { B(i) = y0(i) }")(np.zeros(2, np.float32))
