"""Conversions of the storage types float16 and bfloat16 to and from float32/float64, scalar or vector.

Registers and memory hold float16 as LLVM ``half`` and bfloat16 as ``i16`` (its bits: llvmlite has no
``bfloat`` type). Sema computes with both in float32, so these conversions are all the code ever does with
them, and none calls a runtime library (LLVM lowers ``fptrunc double to half`` and, without AVX512-BF16,
``fptrunc float to bfloat`` to ``__truncdfhf2``/``__truncsfbf2``, which the JIT need not find):

- float16 ↔ float32: ``fpext``/``fptrunc`` (F16C's ``vcvtph2ps``/``vcvtps2ph``, 8 or 16 lanes at once);
- bfloat16 → float32: the 16 bits shifted to the top of a 32-bit word;
- float32 → bfloat16: round to nearest even in integer arithmetic, ``(bits + 0x7FFF + lsb) >> 16``, a NaN
  kept a quiet NaN (``(bits >> 16) | 0x40``) — ml_dtypes' and onnx's rule;
- float64 → either: rounded to float32 *to odd* first (toward zero, the last bit set when inexact), which
  makes the second rounding to 11 or 8 bits the correctly rounded result (Boldo and Melquiond, "Emulation
  of FMA and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008). numpy's
  float64 → float16 agrees; ml_dtypes rounds float64 → bfloat16 through float32, twice.
"""
from __future__ import annotations

from llvmlite import ir

I32 = ir.IntType(32)


def _vec(elem: ir.Type, like: ir.Value) -> ir.Type:
    """``elem``, or ``<n x elem>`` when ``like`` is an ``n``-lane vector."""
    return ir.VectorType(elem, like.type.count) if isinstance(like.type, ir.VectorType) else elem


def _const(ty: ir.Type, value) -> ir.Constant:
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [ir.Constant(ty.element, value)] * ty.count)
    return ir.Constant(ty, value)


def to_float32(b: ir.IRBuilder, value: ir.Value, src: str) -> ir.Value:
    """A float16 or bfloat16 ``value`` as float32 (exact)."""
    f32 = _vec(ir.FloatType(), value)
    if src == "float16":
        return b.fpext(value, f32)
    wide = b.zext(value, _vec(I32, value))
    return b.bitcast(b.shl(wide, _const(wide.type, 16)), f32)


def from_float(b: ir.IRBuilder, value: ir.Value, src: str, dst: str) -> ir.Value:
    """A float32 or float64 ``value`` (``src``) rounded once, to nearest even, to ``dst`` (float16/bfloat16)."""
    if src == "float64":
        value = round_to_odd_float32(b, value)
    if dst == "float16":
        return b.fptrunc(value, _vec(ir.HalfType(), value))
    i32 = _vec(I32, value)
    bits = b.bitcast(value, i32)
    high = b.lshr(bits, _const(i32, 16))
    rounded = b.lshr(b.add(bits, b.add(_const(i32, 0x7FFF), b.and_(high, _const(i32, 1)))), _const(i32, 16))
    quiet = b.or_(high, _const(i32, 0x40))
    result = b.select(b.fcmp_unordered("uno", value, value), quiet, rounded)
    return b.trunc(result, _vec(ir.IntType(16), value))


def round_to_odd_float32(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """A float64 ``value`` as float32 rounded to odd: the nearest float32 when exact, else the one of the two
    neighbours toward and away from zero whose last bit is 1 (an infinity from overflow becomes the largest
    finite float32, which still rounds to infinity in 2 bytes; a NaN stays a NaN)."""
    f32, i32 = _vec(ir.FloatType(), value), _vec(I32, value)
    nearest = b.fptrunc(value, f32)
    back = b.fpext(nearest, value.type)
    inexact = b.fcmp_ordered("!=", back, value)
    positive = b.fcmp_ordered(">", value, _const(value.type, 0.0))
    away = b.select(positive, b.fcmp_ordered(">", back, value), b.fcmp_ordered("<", back, value))
    bits = b.bitcast(nearest, i32)
    odd = b.or_(b.sub(bits, b.zext(away, i32)), _const(i32, 1))
    return b.bitcast(b.select(inexact, odd, bits), f32)
