"""The float builtins as LLVM IR: intrinsics, glibc's libm and libmvec, and inline approximations.

:func:`emit_builtin` is the code of a call of a float builtin for :mod:`polyc.codegen.expr`. Sema has
converted the arguments to the type the builtin computes in, float32 or float64 (``ldexp``'s exponent stays
an integer). Every function here takes a scalar or a ``<lanes x T>`` vector (vector mode) alike. A float32
builtin that is "in double" converts its argument to float64, computes there and rounds once at the end.

How each builtin lowers:

- **LLVM intrinsics** (the backend emits instructions, or a libm call for the transcendental ones):
  ``sqrt fabs floor ceil trunc round rint nearbyint copysign fma pow`` (``round`` rounds half away from
  zero, ``rint``/``nearbyint`` half to even), ``exp log sin cos exp2 log2 log10`` (libm ``expf``... per
  lane), ``ldexp`` (``llvm.ldexp``: ``ldexpf``/``ldexp`` on AVX2, ``vscalefps`` with AVX-512; the
  exponent saturates to int32 first, which does not change the result). A vector call of ``log sin cos
  exp2 log2 log10`` uses libmvec instead (below).
- **libm**, a call per lane, or **libmvec** on a whole vector where glibc (2.35 or later) has the
  variant ``_ZGV<isa>N<lanes>v[v]_<name>[f]`` (:data:`VECTOR_MATH`; checked against the loaded library):
  ``tanh erf`` (float64), ``erfc tan asin acos atan sinh cosh asinh acosh atanh exp10 expm1 log1p cbrt
  atan2 hypot`` (libm and libmvec), ``remainder`` (libm only). In double: ``tgamma j0 j1 y0 y1`` (libm's
  double functions rounded once: glibc 2.36's ``tgammaf`` is off by up to 4.8 ulp and ``j0f``... lose
  accuracy near the zeros) and ``lgamma`` (``lgamma_r`` with a stack slot in the function's entry block for
  the sign, since ``lgamma`` writes the global ``signgam``: a data race between the threads of a parallel
  loop).
- **inline IR**:

  - ``exp`` (float32) and ``sigmoid`` (float32): Cody-Waite reduction and Cephes' ``expf`` polynomial
    (:func:`exp_float32`); ``erf`` and ``tanh`` (float32): two pieces on ``|x|`` (:func:`erf_float32`,
    :func:`tanh_float32`; minimax tables from ``scripts/fit_approximations.py``); ``rsqrt = 1/sqrt``,
    ``fdivide(x, y) = x/y``, ``fmod`` = C's (``frem``);
  - ``fdim`` (``x - y`` if ``x > y``, NaN if either is NaN, else +0), ``logb`` (the exponent field, the
    leading zeros of a subnormal; ``logb(0) = -inf``), ``nextafter`` (the neighbouring bit pattern): exact;
  - ``rcbrt = 1/cbrt`` in double (libm/libmvec ``cbrt``); ``rhypot``, ``norm3d``, ``norm4d``, ``rnorm3d``,
    ``rnorm4d``: float32 in double (the squares cannot overflow there), float64 scaled by a power of two
    taken from the largest argument's exponent (exact), so no intermediate overflows or underflows; any
    infinite argument gives +inf (+0 for the reciprocals) even next to a NaN, as CUDA's;
  - ``sinpi``/``cospi`` (:func:`_sinpi_cospi`): exact reduction ``x mod 2`` (``frem``), the nearest
    quarter turn ``n`` and ``r = 2x - n`` in [-1/2, 1/2], Taylor series of ``sin(pi r/2)``, ``cos(pi r/2)``
    (degrees 17 and 18) in double; exact zeros at the integers (``sinpi``, signed as ``x``) and half
    integers (``cospi``, +0);
  - ``erfcx`` (:func:`_erfcx`, in double): ``exp(x²) erfc(x)`` with ``x²`` split exactly by an FMA below
    12, the asymptotic series ``1/(x sqrt(pi)) Σ (-1)^k (2k-1)!!/(2x²)^k`` (A&S 7.1.23, 13 terms) above;
  - ``normcdf`` (in double): ``erfc(-x/sqrt 2)/2`` with the rounding error of ``-x/sqrt 2`` (an FMA and
    the low part of ``1/sqrt 2``) corrected by the first-order term ``-d 2/sqrt(pi) exp(-z²)``;
  - ``erfinv``, ``erfcinv``, ``normcdfinv = -sqrt(2) erfcinv(2p)`` (:func:`_inverse_erf`, in double): the
    single-precision approximation of M. Giles, "Approximating the erfinv function" (GPU Computing Gems
    Jade, 2011), below ``w = -log((1-x)(1+x)) = 16``, beyond it the fixed point of the asymptotic
    ``erfc(y) ~ exp(-y²)/(y sqrt(pi)) (1 - 1/(2y²))``; then Newton steps (one for float32, two for float64)
    on ``erf(y) = x`` where ``|x| <= 1/2`` and on ``log erfc(y) = log(1-|x|)`` (through :func:`_erfcx`, so
    nothing underflows) beyond, ``1 - |x|`` (``erfcinv``'s own argument) exact, so small ``erfcinv``
    arguments keep their accuracy down to the subnormals;
  - ``cyl_bessel_i0``/``cyl_bessel_i1`` (:func:`_bessel_i`, in double): the power series
    ``Σ (x²/4)^k/(k! (k+ν)!)`` (A&S 9.6.10, 37 terms, ``x²`` split exactly by an FMA and its low part
    added as a first-order correction) below ``|x| = 22``, the asymptotic expansion
    ``e^x/sqrt(2 pi x) Σ (-1)^k a_k(ν)/x^k`` (A&S 9.7.1, 23 terms) above, ``e^x`` as ``e^(x/2) e^(x/2)`` so
    the result overflows only where the function does (float64 beyond 700).

``tests/codegen/test_builtins.py`` measures every builtin against float64/mpmath references and states the error
bound of each.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import struct
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from math import factorial
from typing import Callable

from llvmlite import ir

from ..errors import CompileError
from .irbase import I32, PTR, UNSIGNED, _BITS, _elem, _with_elem, const, declare, freeze, intrinsic

F64 = ir.DoubleType()

#: Builtins that are one LLVM intrinsic of the same name (``llvm.<name>.<type>``), with their arity.
INTRINSICS = {"exp": 1, "log": 1, "sqrt": 1, "fabs": 1, "floor": 1, "ceil": 1, "sin": 1, "cos": 1, "pow": 2,
              "fma": 3, "rint": 1, "exp2": 1, "log2": 1, "log10": 1, "trunc": 1, "round": 1, "nearbyint": 1,
              "copysign": 2}
#: Builtins that call libm's function of the same name (``name`` + ``f`` for float32), with their arity; on
#: a vector, libmvec's variant where :data:`VECTOR_MATH` lists one.
LIBM = {"tanh": 1, "erf": 1, "tan": 1, "asin": 1, "acos": 1, "atan": 1, "sinh": 1, "cosh": 1, "asinh": 1,
        "acosh": 1, "atanh": 1, "exp10": 1, "expm1": 1, "log1p": 1, "cbrt": 1, "erfc": 1, "atan2": 2,
        "hypot": 2, "remainder": 2}
#: Builtins computed by libm's float64 function for float32 too (rounded once).
LIBM_IN_DOUBLE = ("tgamma", "j0", "j1", "y0", "y1")
#: Functions glibc's vector math library (libmvec, glibc >= 2.35 for most) has in every width, with their
#: arity: ``_ZGV<isa>N<lanes><v per argument>_<name>[f]``.
VECTOR_MATH = {**{f: 1 for f in ("exp", "log", "sin", "cos", "tanh", "erf", "tan", "asin", "acos", "atan",
                                 "sinh", "cosh", "asinh", "acosh", "atanh", "exp2", "log2", "log10", "exp10",
                                 "expm1", "log1p", "cbrt", "erfc")},
               "atan2": 2, "hypot": 2}
_ISA = {128: "b", 256: "d", 512: "e"}  # SSE4, AVX2, AVX-512 variants of the x86 vector function ABI


@functools.cache
def _libmvec():
    path = ctypes.util.find_library("mvec")
    return ctypes.CDLL(path) if path else None


@functools.cache
def has_libmvec(symbol: str = "") -> bool:
    """Whether glibc's libmvec is on this machine (the JIT loads it, ``jit._init_llvm``) and, when
    ``symbol`` is given, defines it (the variants of ``exp2``, ``erfc``, ``atan2``... are glibc 2.35's)."""
    lib = _libmvec()
    return lib is not None and (not symbol or hasattr(lib, symbol))


@dataclass(frozen=True)
class _Ctx:
    """What the code of one builtin call needs: the module (declarations), the builder, and the width in
    bits of the builtin's own argument vector (0 for a scalar). A libmvec call takes at most that width
    (at least 128, SSE's, which every x86-64 has): a float32 vector widened to double is called in two
    halves, so it never needs a wider ISA than the loop's own vectors."""

    module: ir.Module
    b: ir.IRBuilder
    chunk_bits: int


# ---- small helpers on scalar-or-vector values ----

def _k(x: ir.Value, value) -> ir.Constant:
    """The constant ``value`` of ``x``'s type."""
    return const(x.type, value)


def _intr(c: _Ctx, name: str, *args: ir.Value) -> ir.Value:
    return c.b.call(intrinsic(c.module, name, args[0].type, len(args)), list(args))


def _fma(c: _Ctx, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    return _intr(c, "fma", x, y, z)


def _horner(c: _Ctx, x: ir.Value, coefficients) -> ir.Value:
    """``Σ coefficients[i] x^(n-1-i)`` (highest power first) by FMAs."""
    p = _k(x, coefficients[0])
    for a in coefficients[1:]:
        p = _fma(c, p, x, _k(x, a))
    return p


def _cmp(c: _Ctx, op: str, x: ir.Value, y) -> ir.Value:
    """Ordered comparison (false if either side is NaN); ``y`` may be a Python number."""
    return c.b.fcmp_ordered(op, x, y if isinstance(y, ir.Value) else _k(x, y))


def _is_nan(c: _Ctx, x: ir.Value, y: ir.Value | None = None) -> ir.Value:
    return c.b.fcmp_unordered("uno", x, x if y is None else y)


def _single(ty: ir.Type) -> bool:
    return isinstance(_elem(ty), ir.FloatType)


def _in_double(c: _Ctx, args: list, fn: Callable[..., ir.Value]) -> ir.Value:
    """``fn(*args)`` computed in float64: float32 arguments are widened and the result rounded once."""
    ty = args[0].type
    if not _single(ty):
        return fn(*args)
    return c.b.fptrunc(fn(*[c.b.fpext(a, _with_elem(a.type, F64)) for a in args]), ty)


# ---- calls: libm per lane, libmvec per vector ----

def _call(c: _Ctx, name: str, args: list) -> ir.Value:
    """C's ``name`` (its double spelling) on float or double values: libmvec on a vector where glibc has
    the variant, else libm's ``name``/``name + 'f'`` lane by lane."""
    if isinstance(args[0].type, ir.VectorType):
        value = vector_math(c, name, args)
        if value is not None:
            return value
    return _per_lane(c, name + ("f" if _single(args[0].type) else ""), args)


def _per_lane(c: _Ctx, symbol: str, args: list, extra: tuple = ()) -> ir.Value:
    """Call the scalar function ``symbol`` (float arguments of the element type, then ``extra`` values)
    once, or once per lane of a vector."""
    ty = args[0].type
    elem = _elem(ty)
    fn = declare(c.module, symbol, ir.FunctionType(elem, [elem] * len(args) + [e.type for e in extra]))
    if not isinstance(ty, ir.VectorType):
        return c.b.call(fn, list(args) + list(extra))
    result = ir.Constant(ty, ir.Undefined)
    for k in range(ty.count):
        lane = ir.Constant(I32, k)
        value = c.b.call(fn, [c.b.extract_element(a, lane) for a in args] + list(extra))
        result = c.b.insert_element(result, value, lane)
    return result


def vector_math(c: _Ctx, name: str, args: list) -> ir.Value | None:
    """``name`` on whole vectors through libmvec (one call instead of one libm call per lane), in pieces of
    at most ``max(c.chunk_bits, 128)`` bits; None for a scalar, a function libmvec lacks, or a width without
    a variant (a 64-bit ``<2 x float>``)."""
    ty = args[0].type
    if not isinstance(ty, ir.VectorType) or VECTOR_MATH.get(name) != len(args) or not has_libmvec():
        return None
    single = _single(ty)
    elem_bits = 32 if single else 64
    bits = ty.count * elem_bits
    piece = min(bits, max(c.chunk_bits, 128))
    if piece not in _ISA or bits % piece:
        return None
    lanes = piece // elem_bits
    symbol = f"_ZGV{_ISA[piece]}N{lanes}{'v' * len(args)}_{name}{'f' if single else ''}"
    if not has_libmvec(symbol):
        return None
    vty = ir.VectorType(ty.element, lanes)
    fn = declare(c.module, symbol, ir.FunctionType(vty, [vty] * len(args)))
    if piece == bits:
        return c.b.call(fn, list(args))
    parts = [c.b.call(fn, [_lanes(c.b, a, k * lanes, lanes) for a in args]) for k in range(bits // piece)]
    while len(parts) > 1:
        parts = [_join(c.b, parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def _lanes(b: ir.IRBuilder, v: ir.Value, start: int, count: int) -> ir.Value:
    picks = ir.Constant(ir.VectorType(I32, count), list(range(start, start + count)))
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined), picks)


def _join(b: ir.IRBuilder, low: ir.Value, high: ir.Value) -> ir.Value:
    n = low.type.count
    return b.shuffle_vector(low, high, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n))))


def _vector_or_intrinsic(c: _Ctx, name: str, args: list) -> ir.Value:
    return vector_math(c, name, args) or _intr(c, name, *args)


# ---- the entry point ----

def emit_builtin(module: ir.Module, f: str, args: list, b: ir.IRBuilder, dtypes: tuple = ()) -> ir.Value:
    """The value of float builtin ``f`` on ``args`` (float or double scalars, or vectors of them; ``ldexp``'s
    second argument an integer of dtype ``dtypes[1]``) at ``b``.

    Raises CompileError for a name that is not a float builtin, or an integer argument (sema converts them:
    a polyc bug upstream).
    """
    ty = args[0].type
    if not isinstance(_elem(ty), (ir.FloatType, ir.DoubleType)):
        raise CompileError(f"codegen: float builtin {f} on {ty}")
    bits = ty.count * (32 if _single(ty) else 64) if isinstance(ty, ir.VectorType) else 0
    c = _Ctx(module, b, bits)
    if f == "ldexp":
        return _ldexp(c, args[0], args[1], dtypes[1] if len(dtypes) > 1 else "int32")
    special = _SPECIAL.get(f)
    if special is not None:
        return special(c, *args)
    if f in LIBM:
        return _call(c, f, args)
    if f in LIBM_IN_DOUBLE:
        return _in_double(c, args, lambda x: _call(c, f, [x]))
    if f in INTRINSICS:
        return _vector_or_intrinsic(c, f, args) if f in VECTOR_MATH else _intr(c, f, *args)
    raise CompileError(f"codegen: unknown builtin {f!r}")


def _exp(c: _Ctx, x: ir.Value) -> ir.Value:
    if _single(x.type):
        return exp_float32(c.module, x, c.b)
    return _vector_or_intrinsic(c, "exp", [x])


def _sigmoid(c: _Ctx, x: ir.Value) -> ir.Value:
    if _single(x.type):
        return sigmoid_float32(c.module, x, c.b)
    e = _vector_or_intrinsic(c, "exp", [c.b.fneg(x)])
    return c.b.fdiv(_k(x, 1.0), c.b.fadd(_k(x, 1.0), e))


def _ldexp(c: _Ctx, x: ir.Value, n: ir.Value, dtype: str) -> ir.Value:
    """``x * 2^n`` by ``llvm.ldexp`` with an i32 exponent: ``n`` saturated to int32 (beyond ±2^31 every
    float result has already overflowed to ±inf or underflowed to ±0, so nothing changes)."""
    b = c.b
    ity = _with_elem(n.type, I32)
    width = _BITS[dtype]
    if dtype in UNSIGNED:
        if width >= 32:
            n = b.select(b.icmp_unsigned(">", n, const(n.type, 2 ** 31 - 1)), const(n.type, 2 ** 31 - 1), n)
        n = b.zext(n, ity) if width < 32 else (b.trunc(n, ity) if width > 32 else n)
    elif width < 32:
        n = b.sext(n, ity)
    elif width > 32:
        n = b.select(b.icmp_signed(">", n, const(n.type, 2 ** 31 - 1)), const(n.type, 2 ** 31 - 1), n)
        n = b.select(b.icmp_signed("<", n, const(n.type, -2 ** 31)), const(n.type, -2 ** 31), n)
        n = b.trunc(n, ity)
    elem = "f32" if _single(x.type) else "f64"
    suffix = f"v{x.type.count}{elem}.v{x.type.count}i32" if isinstance(x.type, ir.VectorType) else f"{elem}.i32"
    fn = declare(c.module, f"llvm.ldexp.{suffix}", ir.FunctionType(x.type, [x.type, ity]))
    return b.call(fn, [x, n])


def _fdim(c: _Ctx, x: ir.Value, y: ir.Value) -> ir.Value:
    """C's ``fdim``: ``x - y`` where ``x > y``, +0 where not, NaN if either is NaN."""
    b = c.b
    r = b.select(_cmp(c, ">", x, y), b.fsub(x, y), _k(x, 0.0))
    return b.select(_is_nan(c, x, y), b.fadd(x, y), r)


def _int_type(ty: ir.Type) -> ir.Type:
    return _with_elem(ty, ir.IntType(32 if _single(ty) else 64))


def _logb(c: _Ctx, x: ir.Value) -> ir.Value:
    """C's ``logb``: the unbiased exponent of ``|x|`` as a float, exact. A subnormal's exponent comes from
    its leading zeros (``llvm.ctlz``); ``logb(±0) = -inf``, ``logb(±inf) = +inf``, NaN stays NaN."""
    b = c.b
    single = _single(x.type)
    ity = _int_type(x.type)
    mantissa, bias, top = (23, 127, 255) if single else (52, 1023, 2047)
    width = 32 if single else 64
    bits = b.and_(b.bitcast(x, ity), const(ity, 2 ** (width - 1) - 1))
    field = b.lshr(bits, const(ity, mantissa))
    suffix = (f"v{ity.count}" if isinstance(ity, ir.VectorType) else "") + f"i{width}"
    ctlz = declare(c.module, f"llvm.ctlz.{suffix}", ir.FunctionType(ity, [ity, ir.IntType(1)]))
    zeros = b.call(ctlz, [bits, ir.Constant(ir.IntType(1), 0)])
    # a subnormal's highest set bit p = width-1-zeros stands for 2^(p - bias - mantissa + 1)
    subnormal = b.sub(const(ity, width - 1 - bias - mantissa + 1), zeros)
    exponent = b.select(b.icmp_unsigned("==", field, const(ity, 0)), subnormal, b.sub(field, const(ity, bias)))
    r = b.sitofp(exponent, x.type)
    r = b.select(b.icmp_unsigned("==", bits, const(ity, 0)), _k(x, float("-inf")), r)
    return b.select(b.icmp_unsigned("==", field, const(ity, top)), b.fmul(x, x), r)


def _nextafter(c: _Ctx, x: ir.Value, y: ir.Value) -> ir.Value:
    """C's ``nextafter``: the float next to ``x`` toward ``y`` (its bit pattern ± 1); ``y`` where they are
    equal (so ``nextafter(0, -0) = -0``), the smallest subnormal with ``y``'s sign from ±0, NaN from NaN."""
    b = c.b
    ity = _int_type(x.type)
    grow = b.xor(_cmp(c, ">", x, 0.0), _cmp(c, ">", y, x))  # false: the magnitude grows
    step = b.select(grow, const(ity, -1), const(ity, 1))
    r = b.bitcast(b.add(b.bitcast(x, ity), step), x.type)
    tiny = _intr(c, "copysign", b.bitcast(const(ity, 1), x.type), y)
    r = b.select(_cmp(c, "==", x, 0.0), tiny, r)
    r = b.select(_cmp(c, "==", x, y), y, r)
    return b.select(_is_nan(c, x, y), b.fadd(x, y), r)


def _rcbrt(c: _Ctx, x: ir.Value) -> ir.Value:
    """``1/cbrt(x)`` in double; for float64 one Newton step for ``y^-3 = x``, ``y += y (1 - x y³)/3``,
    removes the error of libm's ``cbrt`` and the division (4 ulp measured without it, 1 with it). The
    step is skipped where ``x y³`` is not finite (``x`` 0, ±inf, NaN, or ``y`` beyond the float range)."""
    b = c.b

    def reciprocal_root(v):
        y = b.fdiv(_k(v, 1.0), _call(c, "cbrt", [v]))
        if _single(x.type):
            return y
        e = b.fsub(_k(v, 1.0), b.fmul(b.fmul(v, y), b.fmul(y, y)))
        refined = _fma(c, b.fmul(y, _k(v, 1 / 3)), e, y)
        return b.select(_cmp(c, "<", _intr(c, "fabs", e), 0.5), refined, y)
    return _in_double(c, [x], reciprocal_root)


def _norm(c: _Ctx, args: list, reciprocal: bool) -> ir.Value:
    """``sqrt(Σ args²)`` or its reciprocal (``rhypot``, ``norm3d``, ``rnorm4d``...), see the module doc."""
    b = c.b
    x0 = args[0]
    infinite = None
    for a in args:
        is_inf = _cmp(c, "==", _intr(c, "fabs", a), float("inf"))
        infinite = is_inf if infinite is None else b.or_(infinite, is_inf)
    if _single(x0.type):
        def root(*wide):
            s = b.fmul(wide[0], wide[0])
            for w in wide[1:]:
                s = _fma(c, w, w, s)
            r = _intr(c, "sqrt", s)
            return b.fdiv(_k(r, 1.0), r) if reciprocal else r
        r = _in_double(c, list(args), root)
    else:
        top = _intr(c, "fabs", x0)
        for a in args[1:]:
            m = _intr(c, "fabs", a)
            top = b.select(_cmp(c, ">", m, top), m, top)
        field = b.lshr(b.bitcast(top, _int_type(top.type)), const(_int_type(top.type), 52))
        field = b.select(b.icmp_unsigned("<", field, const(field.type, 1)), const(field.type, 1), field)
        field = b.select(b.icmp_unsigned(">", field, const(field.type, 2045)), const(field.type, 2045), field)
        scale = b.bitcast(b.shl(b.sub(const(field.type, 2046), field), const(field.type, 52)), x0.type)
        unscale = b.bitcast(b.shl(field, const(field.type, 52)), x0.type)  # 2^(e-1023) = 1/scale
        scaled = [b.fmul(a, scale) for a in args]
        s = b.fmul(scaled[0], scaled[0])
        for w in scaled[1:]:
            s = _fma(c, w, w, s)
        root = _intr(c, "sqrt", s)
        r = b.fdiv(scale, root) if reciprocal else b.fmul(root, unscale)
    return b.select(infinite, _k(x0, 0.0 if reciprocal else float("inf")), r)


# ---- constants of the inline approximations ----

with localcontext() as _context:
    _context.prec = 60
    _PI = Decimal("3.14159265358979323846264338327950288419716939937510582097494459")
    _HALF_PI = _PI / 2
    #: sin(pi r / 2) = r Σ_k (-1)^k (pi/2)^(2k+1) r^(2k) / (2k+1)!, k = 0..8 (Taylor; the first omitted term
    #: is below 1e-19 for |r| <= 1/2), highest power first
    _SIN_HALF_PI = tuple(float((-1) ** k * _HALF_PI ** (2 * k + 1) / factorial(2 * k + 1)) for k in range(8, -1, -1))
    #: cos(pi r / 2) = Σ_k (-1)^k (pi/2)^(2k) r^(2k) / (2k)!, k = 0..9
    _COS_HALF_PI = tuple(float((-1) ** k * _HALF_PI ** (2 * k) / factorial(2 * k)) for k in range(9, -1, -1))
    _SQRT_PI = float(_PI.sqrt())
    _INV_SQRT_PI = float(1 / _PI.sqrt())
    _TWO_OVER_SQRT_PI = float(2 / _PI.sqrt())
    _TWO_PI = float(2 * _PI)
    _SQRT2 = float(Decimal(2).sqrt())
    _INV_SQRT2 = float(Decimal(2).sqrt() / 2)
    _INV_SQRT2_LO = float(Decimal(2).sqrt() / 2 - Decimal(_INV_SQRT2))  # 1/sqrt(2) = _INV_SQRT2 + this

#: erfcx(x) ~ 1/(x sqrt(pi)) Σ_k (-1)^k (2k-1)!! / (2x²)^k (A&S 7.1.23), k = 0..12, highest first: at x >= 12
#: the first omitted term is below 1e-18
_ERFCX_ASYMPTOTIC = tuple(float((-1) ** k * Fraction(factorial(2 * k), factorial(k) * 2 ** k))
                          for k in range(12, -1, -1))
_ERFCX_SWITCH = 12.0

#: Giles (2011), single precision: erfinv(x) = x P(w), w = -log((1-x)(1+x)); P in w - 2.5 for w < 5 and in
#: sqrt(w) - 3 for 5 <= w (relative error below 2e-7 for w < 16.6, the float32 range)
_GILES_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                  -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_GILES_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773, -0.0076224613,
               0.00943887047, 1.00167406, 2.83297682)


def _bessel_series(order: int) -> tuple:
    """``Σ_k t^k / (k! (k+order)!)``, k = 0..36, highest first (A&S 9.6.10 with t = x²/4)."""
    return tuple(float(Fraction(1, factorial(k) * factorial(k + order))) for k in range(36, -1, -1))


def _bessel_asymptotic(order: int) -> tuple:
    """``Σ_k (-1)^k a_k(ν) / x^k``, ``a_k(ν) = Π_{j<=k} (4ν² - (2j-1)²) / (k! 8^k)``, k = 0..22, highest first
    (A&S 9.7.1: at x >= 22 the first omitted term is below 6e-18)."""
    terms, a = [], Fraction(1)
    for k in range(23):
        terms.append(float(a))
        a = a * -(4 * order * order - (2 * k + 1) ** 2) / ((k + 1) * 8)
    return tuple(reversed(terms))


_BESSEL_SERIES = (_bessel_series(0), _bessel_series(1))
_BESSEL_ASYMPTOTIC = (_bessel_asymptotic(0), _bessel_asymptotic(1))
_BESSEL_SWITCH = 22.0


# ---- inline approximations (double values) ----

def _sinpi_cospi(c: _Ctx, x: ir.Value, want_sin: bool) -> ir.Value:
    """``sin(pi x)`` or ``cos(pi x)`` of a double ``x``: exact reduction, Taylor series (module doc)."""
    b = c.b
    z = b.frem(x, _k(x, 2.0))  # exact, in (-2, 2) with x's sign; NaN for ±inf
    z = b.fadd(z, z)
    n = _intr(c, "rint", z)
    r = b.fsub(z, n)  # exact, in [-1/2, 1/2]
    r2 = b.fmul(r, r)
    s = b.fmul(r, _horner(c, r2, _SIN_HALF_PI))
    co = _horner(c, r2, _COS_HALF_PI)
    q = b.and_(freeze(b, b.fptosi(n, _with_elem(x.type, I32))), const(_with_elem(x.type, I32), 3))
    quadrants = (s, co, b.fneg(s), b.fneg(co)) if want_sin else (co, b.fneg(s), b.fneg(co), s)
    v = quadrants[3]
    for k in (2, 1, 0):
        v = b.select(b.icmp_unsigned("==", q, const(q.type, k)), quadrants[k], v)
    zero = _intr(c, "copysign", _k(x, 0.0), x) if want_sin else _k(x, 0.0)
    return b.select(_cmp(c, "==", v, 0.0), zero, v)


def _erfcx(c: _Ctx, x: ir.Value) -> ir.Value:
    """``exp(x²) erfc(x)`` of a double ``x`` (module doc); overflows to +inf below about -26.6."""
    b = c.b
    hi = b.fmul(x, x)
    lo = _fma(c, x, x, b.fneg(hi))  # x² = hi + lo exactly
    lo = b.select(_is_nan(c, lo), _k(x, 0.0), lo)  # x = ±inf
    d = b.fmul(_call(c, "exp", [hi]), _call(c, "erfc", [x]))
    direct = b.select(_cmp(c, "==", d, float("inf")), d, _fma(c, d, lo, d))  # exp(hi + lo) ~ exp(hi) (1 + lo)
    t = b.fdiv(_k(x, 0.5), hi)
    asymptotic = b.fmul(b.fdiv(_k(x, _INV_SQRT_PI), x), _horner(c, t, _ERFCX_ASYMPTOTIC))
    return b.select(_cmp(c, ">=", x, _ERFCX_SWITCH), asymptotic, direct)


def _normcdf(c: _Ctx, x: ir.Value) -> ir.Value:
    """``erfc(-x/sqrt 2)/2`` of a double ``x``, with the rounding of ``-x/sqrt 2`` corrected (module doc)."""
    b = c.b
    z = b.fmul(x, _k(x, -_INV_SQRT2))
    dz = b.fadd(_fma(c, x, _k(x, -_INV_SQRT2), b.fneg(z)), b.fmul(x, _k(x, -_INV_SQRT2_LO)))
    dz = b.select(_is_nan(c, dz), _k(x, 0.0), dz)  # ±inf
    slope = b.fmul(_k(x, _TWO_OVER_SQRT_PI), _call(c, "exp", [b.fneg(b.fmul(z, z))]))
    return b.fmul(_k(x, 0.5), b.fsub(_call(c, "erfc", [z]), b.fmul(dz, slope)))


def _inverse_erf(c: _Ctx, a: ir.Value, one_minus_a: ir.Value, steps: int) -> ir.Value:
    """``y >= 0`` with ``erf(y) = a`` for doubles ``a`` in [0, 1) given ``1 - a`` exactly (module doc).
    Values outside (``a >= 1``, NaN) give inf or NaN: the callers select their special cases."""
    b = c.b
    cc = one_minus_a
    w = b.fneg(_call(c, "log", [b.fmul(cc, b.fsub(_k(cc, 2.0), cc))]))
    central = b.fmul(_horner(c, b.fsub(w, _k(w, 2.5)), _GILES_CENTRAL), a)
    tail = b.fmul(_horner(c, b.fsub(_intr(c, "sqrt", w), _k(w, 3.0)), _GILES_TAIL), a)
    log_c = _call(c, "log", [cc])
    far = _intr(c, "sqrt", b.fneg(log_c))
    for _ in range(2):  # y² = -log c - log(y sqrt(pi)) + log(1 - 1/(2y²))
        correction = b.fsub(_call(c, "log1p", [b.fdiv(_k(far, -0.5), b.fmul(far, far))]),
                            _call(c, "log", [b.fmul(far, _k(far, _SQRT_PI))]))
        far = _intr(c, "sqrt", b.fsub(correction, log_c))
    y = b.select(_cmp(c, "<", w, 5.0), central, b.select(_cmp(c, "<", w, 16.0), tail, far))
    small = _cmp(c, "<=", a, 0.5)
    for _ in range(steps):
        # |x| <= 1/2: Newton on erf(y) - a; beyond: Newton on log erfc(y) - log(1 - a), erfc = exp(-y²) erfcx
        slope = b.fmul(_k(y, _TWO_OVER_SQRT_PI), _call(c, "exp", [b.fneg(b.fmul(y, y))]))
        near_zero = b.fsub(y, b.fdiv(b.fsub(_call(c, "erf", [y]), a), slope))
        scaled = _erfcx(c, y)
        g = b.fsub(_call(c, "log", [scaled]), _fma(c, y, y, log_c))
        beyond = _fma(c, g, b.fmul(scaled, _k(y, _SQRT_PI / 2)), y)
        y = b.select(small, near_zero, beyond)
    return y


def _erfinv(c: _Ctx, x: ir.Value) -> ir.Value:
    def inverse(v):
        b = c.b
        a = _intr(c, "fabs", v)
        cc = b.fsub(_k(v, 1.0), a)
        y = _intr(c, "copysign", _inverse_erf(c, a, cc, 1 if _single(x.type) else 2), v)
        y = b.select(_cmp(c, "==", cc, 0.0), _intr(c, "copysign", _k(v, float("inf")), v), y)
        return b.select(_cmp(c, "<", cc, 0.0), _k(v, float("nan")), y)
    return _in_double(c, [x], inverse)


def _erfcinv_d(c: _Ctx, q: ir.Value, steps: int) -> ir.Value:
    """``erfcinv`` of a double ``q``: ``a = |1 - q|`` and ``1 - a`` (``q`` or ``2 - q``) are exact."""
    b = c.b
    lower = _cmp(c, "<=", q, 1.0)
    a = b.select(lower, b.fsub(_k(q, 1.0), q), b.fsub(q, _k(q, 1.0)))
    cc = b.select(lower, q, b.fsub(_k(q, 2.0), q))
    y = _inverse_erf(c, a, cc, steps)
    y = b.select(lower, y, b.fneg(y))
    y = b.select(_cmp(c, "==", cc, 0.0), b.select(lower, _k(q, float("inf")), _k(q, float("-inf"))), y)
    return b.select(_cmp(c, "<", cc, 0.0), _k(q, float("nan")), y)


def _erfcinv(c: _Ctx, x: ir.Value) -> ir.Value:
    return _in_double(c, [x], lambda q: _erfcinv_d(c, q, 1 if _single(x.type) else 2))


def _normcdfinv(c: _Ctx, x: ir.Value) -> ir.Value:
    def inverse(p):
        y = _erfcinv_d(c, c.b.fadd(p, p), 1 if _single(x.type) else 2)
        return c.b.fadd(c.b.fmul(y, _k(p, -_SQRT2)), _k(p, 0.0))  # + 0: normcdfinv(0.5) = +0
    return _in_double(c, [x], inverse)


def _bessel_i(c: _Ctx, x: ir.Value, order: int, float64: bool) -> ir.Value:
    """The modified Bessel function ``I0``/``I1`` of a double ``x`` (module doc); ``float64``: the result
    stays double (else it is rounded to float32, which overflows long before ``e^x`` does)."""
    b = c.b
    ax = _intr(c, "fabs", x)
    hi = b.fmul(ax, ax)
    lo = _fma(c, ax, ax, b.fneg(hi))  # x² = hi + lo exactly
    t, t_lo = b.fmul(hi, _k(x, 0.25)), b.fmul(lo, _k(x, 0.25))
    p = _horner(c, t, _BESSEL_SERIES[0])
    q = _horner(c, t, _BESSEL_SERIES[1])
    if order == 0:
        small = _fma(c, t_lo, q, p)  # P'(t) = Q(t)
    else:  # t Q'(t) = P(t) - Q(t)
        slope = b.select(_cmp(c, ">", t, 0.0), b.fdiv(b.fsub(p, q), t), _k(x, 0.0))
        small = b.fmul(b.fmul(ax, _k(x, 0.5)), _fma(c, t_lo, slope, q))
    series = _horner(c, b.fdiv(_k(x, 1.0), ax), _BESSEL_ASYMPTOTIC[order])
    scaled = b.fdiv(series, _intr(c, "sqrt", b.fmul(ax, _k(x, _TWO_PI))))
    large = b.fmul(_call(c, "exp", [ax]), scaled)
    if float64:  # beyond 700: e^x = e^(x/2) e^(x/2), finite up to I's own overflow near 713.98
        half = _call(c, "exp", [b.fmul(ax, _k(x, 0.5))])
        large = b.select(_cmp(c, "<", ax, 700.0), large, b.fmul(b.fmul(half, scaled), half))
    r = b.select(_cmp(c, "<", ax, _BESSEL_SWITCH), small, large)
    r = b.select(_cmp(c, "==", ax, float("inf")), _k(x, float("inf")), r)
    return _intr(c, "copysign", r, x) if order == 1 else r


def _lgamma(c: _Ctx, x: ir.Value) -> ir.Value:
    """``log|Γ(x)|`` by libm's ``lgamma_r`` (double; the sign goes to a stack slot in the function's entry
    block, not to the global ``signgam`` that ``lgamma`` writes)."""
    def call(v):
        entry = c.b.function.entry_basic_block
        eb = ir.IRBuilder(entry)
        eb.position_at_start(entry)
        slot = eb.alloca(I32, name="lgamma.sign")
        slot.type = PTR  # an opaque pointer, as everywhere else (llvmlite types allocas as T*)
        return _per_lane(c, "lgamma_r", [v], extra=(slot,))
    return _in_double(c, [x], call)


#: Builtins with their own code here (the others are tables above).
_SPECIAL = {
    "exp": _exp,
    "sigmoid": _sigmoid,
    "erf": lambda c, x: erf_float32(c, x) if _single(x.type) else _call(c, "erf", [x]),
    "tanh": lambda c, x: tanh_float32(c, x) if _single(x.type) else _call(c, "tanh", [x]),
    "rsqrt": lambda c, x: c.b.fdiv(_k(x, 1.0), _intr(c, "sqrt", x)),
    "fmod": lambda c, x, y: c.b.frem(x, y),
    "fdivide": lambda c, x, y: c.b.fdiv(x, y),
    "fdim": _fdim,
    "logb": _logb,
    "nextafter": _nextafter,
    "rcbrt": _rcbrt,
    "rhypot": lambda c, x, y: _norm(c, [x, y], True),
    "norm3d": lambda c, *a: _norm(c, list(a), False),
    "norm4d": lambda c, *a: _norm(c, list(a), False),
    "rnorm3d": lambda c, *a: _norm(c, list(a), True),
    "rnorm4d": lambda c, *a: _norm(c, list(a), True),
    "sinpi": lambda c, x: _in_double(c, [x], lambda v: _sinpi_cospi(c, v, True)),
    "cospi": lambda c, x: _in_double(c, [x], lambda v: _sinpi_cospi(c, v, False)),
    "erfcx": lambda c, x: _in_double(c, [x], lambda v: _erfcx(c, v)),
    "normcdf": lambda c, x: _in_double(c, [x], lambda v: _normcdf(c, v)),
    "erfinv": _erfinv,
    "erfcinv": _erfcinv,
    "normcdfinv": _normcdfinv,
    "cyl_bessel_i0": lambda c, x: _in_double(c, [x], lambda v: _bessel_i(c, v, 0, not _single(x.type))),
    "cyl_bessel_i1": lambda c, x: _in_double(c, [x], lambda v: _bessel_i(c, v, 1, not _single(x.type))),
    "lgamma": _lgamma,
}


# ---- inline exp and sigmoid for float32 ----

def _exp_reduced(module: ir.Module, x: ir.Value, b: ir.IRBuilder) -> tuple:
    """``(P, n)`` with ``exp(x) = P * 2^n`` for a float32 ``x`` already clamped (see :func:`exp_float32`)."""
    n = b.call(intrinsic(module, "roundeven", x.type, 1), [b.fmul(x, const(x.type, 1.44269504088896341))])
    return _exp_polynomial(module, x, n, b), n


def _exp_polynomial(module: ir.Module, x: ir.Value, n: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``P = exp(r)`` for ``r = x - n ln2`` (Cody-Waite, ln2 in two parts; see :func:`exp_float32`)."""
    ty = x.type

    def fma(a, m, k):
        return b.call(intrinsic(module, "fma", ty, 3), [a, m, k])

    r = fma(n, const(ty, -0.693359375), x)
    r = fma(n, const(ty, 2.12194440e-4), r)
    p = const(ty, 1.9875691500e-4)
    for k in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1, 1.0, 1.0):
        p = fma(p, r, const(ty, k))
    return p


def _clamp(b: ir.IRBuilder, x: ir.Value, lo: float, hi: float) -> ir.Value:
    """``x`` clamped to [lo, hi]; NaN stays NaN (ordered compares: the backend's ``maxps``/``minps``)."""
    ty = x.type
    x = b.select(b.fcmp_ordered("<", x, const(ty, lo)), const(ty, lo), x)
    return b.select(b.fcmp_ordered(">", x, const(ty, hi)), const(ty, hi), x)


def _scalef(module: ir.Module, p: ir.Value, n: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``p * 2^n`` by AVX-512's ``vscalefps`` (a 16-lane float32 vector)."""
    ty = p.type
    scalef = declare(module, "llvm.x86.avx512.mask.scalef.ps.512",
                     ir.FunctionType(ty, [ty, ty, ty, ir.IntType(16), I32]))
    return b.call(scalef, [p, n, ir.Constant(ty, ir.Undefined), ir.Constant(ir.IntType(16), -1),
                           ir.Constant(I32, 4)])  # all lanes, the current rounding mode


def _exponent_int(b: ir.IRBuilder, n: ir.Value) -> ir.Value:
    """The integral float32 ``n`` as i32 (frozen: a NaN gives some integer, never poison)."""
    return freeze(b, b.fptosi(n, _with_elem(n.type, I32)))


def _pow2(b: ir.IRBuilder, e: ir.Value, ty: ir.Type) -> ir.Value:
    """``2^e`` as float32 (type ``ty``) for an i32 ``e`` in [-126, 127], built in the exponent field."""
    return b.bitcast(b.shl(b.add(e, const(e.type, 127)), const(e.type, 23)), ty)


def exp_float32(module: ir.Module, x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``exp`` of a float32 scalar or vector, inline (no call: LLVM schedules it with the loop around it).

    Cody and Waite's reduction ``x = n ln2 + r``, ``n = roundeven(x log2 e)``, ``|r| <= ln2/2``, with ln2 split
    in two (0.693359375, exact in 9 bits, and -2.12194440e-4); ``exp(r) = (P(r) r + 1) r + 1`` with the
    degree-5 minimax P of Cephes' ``expf``, seven FMAs; then the product with ``2^n``. On a 512-bit vector
    that is one ``vscalefps`` (AVX-512 scales with IEEE overflow to inf and gradual underflow), after ``x``
    is clamped to [-104, 89] (beyond: 0 and inf). Elsewhere (AVX2 vectors, scalars) a step whose every lane
    has ``n`` in [:data:`EXP_FAST_N_LO`, :data:`EXP_FAST_N_HI`] (``x`` in about [-86.9, 88.3]: the result a
    normal float) takes :func:`_exp_normal`, which adds ``n`` to the result's exponent field with one integer
    add, and any other step branches to :func:`_exp_any` (the clamp, and two exponent-field products
    ``2^(n>>1) 2^(n-(n>>1))``, so results that overflow become inf and subnormal ones round once more instead
    of flushing; NaN stays NaN). The test reads ``n`` from the rounding FMA's bits, an integer subtract and an
    unsigned compare (a NaN or an infinity, or an ``x`` too large for the rounding, is far outside), where a
    test of ``x`` took three floating-point operations on the pipes the polynomial's FMAs need. Measured (1
    thread, Zen 4, AVX2 code, 64 Ki floats in L2): the branch 11.6 -> 8.8 and 13.7 -> 10.3 cycles per 8 lanes
    in two runs against the two products everywhere; the integer test (1 Mi floats) 8.9-9.05 -> 8.15-8.35
    in three runs (the fast path alone 6.9-7.0). With AVX-512 the branch and the integer add lose to
    ``vscalefps`` (6.4 -> 6.8). At most 1 ulp from the correctly rounded result over the whole float range
    (tests/codegen/test_codegen.py measures it).
    """
    ty = x.type
    if isinstance(ty, ir.VectorType) and ty.count == 16:
        p, n = _exp_reduced(module, _clamp(b, x, -104.0, 89.0), b)
        return _scalef(module, p, n, b)
    t = _exp_rounding(module, x, b)
    fast = _exp_normal(module, x, t, b)
    ity = _with_elem(ty, I32)
    # n = t - magic in [LO, HI] <=> (t's bits - magic's bits - LO), unsigned, <= HI - LO
    shifted = b.sub(b.bitcast(t, ity), const(ity, _float_bits(_ROUNDING_MAGIC) + EXP_FAST_N_LO))
    outside = b.icmp_unsigned(">", shifted, const(ity, EXP_FAST_N_HI - EXP_FAST_N_LO))
    if isinstance(ty, ir.VectorType):
        mask = ir.IntType(ty.count)
        outside = b.icmp_unsigned("!=", b.bitcast(outside, mask), ir.Constant(mask, 0))
    start = b.block
    slow_block, join = b.append_basic_block("exp.any"), b.append_basic_block("exp.join")
    b.cbranch(outside, slow_block, join)
    b.position_at_end(slow_block)
    slow = _exp_any(module, x, b)
    slow_end = b.block
    b.branch(join)
    b.position_at_end(join)
    result = b.phi(ty)
    result.add_incoming(fast, start)
    result.add_incoming(slow, slow_end)
    return result


#: :func:`exp_float32`'s one-add scaling holds where ``n`` lies in [EXP_FAST_N_LO, EXP_FAST_N_HI]: ``P * 2^n``
#: (``P`` in [0.70, 1.42]) is then a normal float.
EXP_FAST_N_LO, EXP_FAST_N_HI = -125, 127

#: 1.5 x 2^23: adding it to a float of magnitude below 2^22 rounds that to an integer (to nearest even) and
#: leaves the integer in the low bits of the sum's mantissa.
_ROUNDING_MAGIC = 12582912.0


def _exp_rounding(module: ir.Module, x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``x log2(e) + magic`` by one FMA (:data:`_ROUNDING_MAGIC`): ``n = round(x log2(e))`` to nearest even is
    this minus the magic, and, while ``|n|`` is below 2^22, the magic's bits plus ``n`` are its bits."""
    return b.call(intrinsic(module, "fma", x.type, 3), [x, const(x.type, 1.44269504088896341),
                                                        const(x.type, _ROUNDING_MAGIC)])


def _float_bits(value: float) -> int:
    """The bits of float32 ``value`` as a signed int32."""
    return struct.unpack("<i", struct.pack("<f", value))[0]


def _exp_normal(module: ir.Module, x: ir.Value, t: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """:func:`exp_float32` for ``x`` whose ``n`` lies in [EXP_FAST_N_LO, EXP_FAST_N_HI] (garbage elsewhere),
    ``t`` its :func:`_exp_rounding`: ``t``'s bits shifted left by 23 are ``n`` in the exponent field (the
    magic's own bits shift out), added to ``P``'s bits as integers."""
    ty = x.type
    ity = _with_elem(ty, I32)
    p = _exp_polynomial(module, x, b.fsub(t, const(ty, _ROUNDING_MAGIC)), b)
    return b.bitcast(b.add(b.bitcast(p, ity), b.shl(b.bitcast(t, ity), const(ity, 23))), ty)


def _exp_any(module: ir.Module, x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """:func:`exp_float32` for any ``x`` (see there), without AVX-512's ``vscalefps``."""
    ty = x.type
    p, n = _exp_reduced(module, _clamp(b, x, -104.0, 89.0), b)
    ni = _exponent_int(b, n)
    half = b.ashr(ni, const(ni.type, 1))
    return b.fmul(b.fmul(p, _pow2(b, half, ty)), _pow2(b, b.sub(ni, half), ty))


def sigmoid_float32(module: ir.Module, x: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``1 / (1 + exp(-x))`` for float32, inline: ``-x`` is clamped to [-87, 88], where ``2^n`` is one normal
    float (``n`` in [-126, 127]), so the scaling is one product (or ``vscalefps``) instead of
    :func:`exp_float32`'s two. Beyond the clamp the result is 1 (x > 87) or about 6e-39 (x < -88, where
    the exact value is below that); NaN stays NaN. Within 3 ulp of the correctly rounded value where that
    is a normal float (tests/codegen/test_codegen.py measures it). The division stays: a hardware reciprocal
    estimate with two Newton steps (as accurate) measured 1.2x slower in a conv epilogue on Zen 4 (AVX2
    code), a longer dependence chain than ``vdivps``."""
    ty = x.type
    t = _clamp(b, b.fneg(x), -87.0, 88.0)
    p, n = _exp_reduced(module, t, b)
    if isinstance(ty, ir.VectorType) and ty.count == 16:
        e = _scalef(module, p, n, b)
    else:
        e = b.fmul(p, _pow2(b, _exponent_int(b, n), ty))
    return b.fdiv(const(ty, 1.0), b.fadd(const(ty, 1.0), e))


# ---- inline erf and tanh for float32 ----

#: ``erf(x) = x + x S(x²)`` for ``|x| < 1``: S's coefficients, highest power first (a degree-6 minimax
#: polynomial in ``x²``, absolute error 1.2e-9, by ``scripts/fit_approximations.py``).
ERF_SMALL = (7.889083644840866e-05, -0.0008020831737667322, 0.005189534276723862, -0.026854444295167923,
             0.11283600330352783, -0.3761262595653534, 0.12837916612625122)
#: ``erfc(|x|) = P(y) / Q(y)``, ``y = |x| - 1``, for ``1 <= |x| <= ERF_ONE``: P and Q highest power first (a
#: degree-6/6 minimax rational, absolute error 3.9e-9, by ``scripts/fit_approximations.py``).
ERFC_P = (0.00035503756953403354, -0.005711454898118973, 0.038677554577589035, -0.14129731059074402,
          0.29402223229408264, -0.33076342940330505, 0.15729920566082)
ERFC_Q = (0.027345480397343636, 0.04386225342750549, 0.168782576918602, 0.2681970000267029, 0.6453453898429871,
          0.536197304725647, 1.0)
#: Beyond this ``erfc(x) < 2^-25``: float32 ``erf`` is ±1.
ERF_ONE = 3.93
#: ``tanh(x) = x + x³ S(x²)`` for ``|x| < TANH_SPLIT``: S's coefficients, highest power first (a degree-4
#: minimax polynomial in ``x²``, absolute error 4.1e-8, so 1.6e-8 in ``x² S``; by
#: ``scripts/fit_approximations.py``).
TANH_SMALL = (-0.006113144103437662, 0.02101004868745804, -0.05385406315326691, 0.13332794606685638,
              -0.333333283662796)
TANH_SPLIT = 0.625


def _odd(c: _Ctx, x: ir.Value, split: float, small, large) -> ir.Value:
    """An odd function of float32 ``x`` from two pieces on ``a = |x|``: ``small(a)`` below ``split``,
    ``large(a)`` at and above it (and for NaN), both non-negative, computed on every lane; then ``x``'s sign
    bit put on the selected one (so ``f(-0) = -0``)."""
    b = c.b
    ity = _with_elem(x.type, I32)
    sign = b.and_(b.bitcast(x, ity), const(ity, -2 ** 31))
    a = b.bitcast(b.xor(b.bitcast(x, ity), sign), x.type)
    r = b.select(_cmp(c, "<", a, split), small(a), large(a))
    return b.bitcast(b.or_(b.bitcast(r, ity), sign), x.type)


def erf_float32(c: _Ctx, x: ir.Value) -> ir.Value:
    """``erf`` of a float32 scalar or vector, inline (:func:`_odd`'s two pieces).

    Below 1 ``a + a S(a²)`` (:data:`ERF_SMALL`; one FMA rounds the sum, and S is small against 1, so its own
    rounding errors hardly reach the result); above, ``1 - E`` with ``E`` a rational approximation of
    ``erfc`` in ``a - 1`` (:data:`ERFC_P` / :data:`ERFC_Q`, ``a`` clamped to :data:`ERF_ONE`; ``E <= 0.16``,
    so its rounding errors stay below an ulp of the result). ``erf(±0) = ±0``, ±1 at ±inf, NaN for NaN. At
    most 1.2 ulp from the correctly rounded result (tests/codegen/test_codegen.py measures it). Against
    glibc's libmvec ``erff`` it replaces (1 thread, Zen 4, 256 Ki floats, paired runs): 15.2-19.5 vs
    16.7-18.7 cycles per 8 lanes with AVX2, 12.4-13.9 vs 19.2-21.0 with AVX-512; in a kernel it also keeps
    the vector registers a call clobbers, and it needs no libmvec (glibc before 2.35 has none: one libm call
    per lane). A previous version (``1 - exp(Q(x))`` above 1, 28 constants) ran 1.8x slower with AVX2.
    """
    b = c.b

    def small(a):
        return _fma(c, a, _horner(c, b.fmul(a, a), ERF_SMALL), a)

    def large(a):
        y = b.fsub(b.select(_cmp(c, ">", a, ERF_ONE), _k(x, ERF_ONE), a), _k(x, 1.0))  # NaN stays NaN
        return b.fsub(_k(x, 1.0), b.fdiv(_horner(c, y, ERFC_P), _horner(c, y, ERFC_Q)))
    return _odd(c, x, 1.0, small, large)


def tanh_float32(c: _Ctx, x: ir.Value) -> ir.Value:
    """``tanh`` of a float32 scalar or vector, inline (:func:`_odd`'s two pieces).

    Below :data:`TANH_SPLIT` ``a + a (a² S(a²))`` (:data:`TANH_SMALL`, one FMA rounds the sum); above,
    ``1 - 2 sigmoid(-2a)`` by :func:`sigmoid_float32` and one FMA (``2 sigmoid <= 0.45`` there, so its
    rounding errors stay near an ulp of the result; it saturates to 1 by itself). ``tanh(±0) = ±0``, ±1 at
    ±inf, NaN for NaN. At most 1.4 ulp from the correctly rounded result (tests/codegen/test_codegen.py
    measures it). Against glibc's libmvec ``tanhf`` it replaces (1 thread, Zen 4, 256 Ki floats, paired runs):
    19.3-27.6 vs 22.4-30.7 cycles per 8 lanes with AVX2, 12.7-14.4 vs 13.0-15.1 with AVX-512.
    """
    b = c.b

    def small(a):
        t = b.fmul(a, a)
        return _fma(c, a, b.fmul(_horner(c, t, TANH_SMALL), t), a)

    def large(a):
        return _fma(c, sigmoid_float32(c.module, b.fmul(a, _k(x, -2.0)), b), _k(x, -2.0), _k(x, 1.0))
    return _odd(c, x, TANH_SPLIT, small, large)
