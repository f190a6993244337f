"""Typed lang expressions (:mod:`polyc.lang.ast`) → llvmlite values, scalar or vector.

:func:`emit_expr` evaluates a typed expression at the point of an ``ir.IRBuilder``. Every helper works on
scalars and on ``<lanes x T>`` vectors alike, so the vector emitter reuses this file: in vector mode an index
variable ``i`` with stride ``s`` in the vectorized loop is ``<i, i+s, ..., i+(lanes-1)*s>``, a stride-1 access
is one vector load and a loop-invariant one a broadcast.

Semantics (numpy's where the language says so):

- integer ``/`` and ``%`` round toward minus infinity (Halide); ``x/0 == 0`` and ``x%0 == 0``; unsigned
  operands use ``udiv``/``urem``; nothing is undefined behaviour (``INT_MIN / -1`` wraps);
- float ``%`` is ``np.mod``: ``frem`` then the sign of the divisor;
- float → int truncates toward zero as ``ndarray.astype`` does on x86 (``fptosi`` to 32 or 64 bits, then
  ``trunc``; the result is ``freeze``-d so an out-of-range value is some integer, never poison);
  int/float → bool is ``!= 0``;
- the storage types (:data:`STORAGE`) are ``half`` (float16) and ``i16`` (bfloat16) in registers and
  memory and are only converted (sema computes with them in float32), by :mod:`polyc.codegen.storage`
  (rounded once to nearest even; integers → float16 through float32, → bfloat16 through float64);
- the float builtins (``exp``, ``erfinv``, ``atan2``, ...) are :mod:`polyc.codegen.mathlib`'s: LLVM
  intrinsics, glibc's libm and libmvec, and inline approximations, each documented there;
  ``min``/``max`` propagate NaN (``np.minimum``: x86 vectors use ``maxps``/``minps`` and a NaN blend, see
  :func:`min_max`); ``fmin``/``fmax`` ignore it;
  integer ``abs`` wraps at the type's minimum; ``bitand bitor bitxor bitnot shl shr`` are the integer
  instructions, a shift by the type's width or more giving 0 (``shr`` of a negative signed value: -1), as
  numpy's.
- A read whose index depends on data (``A(B(i))``, or an index using a 0-d parameter) or that the model
  marks ``checked`` (a non-affine index such as ``A(i*i)``, which the compile-time bounds check cannot bound)
  is checked against each dimension's extent; out of range branches to ``env.fail()`` (the kernel returns 1)
  before any load. ``?:``, ``&&`` and ``||`` evaluate such reads only when taken.
- Index arithmetic is :func:`index_value`'s: exact in 64 bits for int32/int64, wrapping for narrower types,
  the value ``polyc.poly.affine`` proves in bounds.

Float ``+ - *`` carry the ``contract`` fast-math flag so the backend may fuse them into FMA.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from llvmlite import ir

from ..errors import CompileError
from ..lang import ast as L
from ..poly.affine import children, index_names
from ..poly.scop import Scop
from . import mathlib, storage
from .irbase import (FLOAT, I1, I32, I64, I8, MAX_IR_NAME, PTR, STORAGE, UNSIGNED, _BITS, _CONTRACT, Builder,
                     _elem, _with_elem, const, declare, element_bytes, freeze, int_value, intrinsic, ir_name, llvm_type,
                     loop_unroll_metadata, memory_type, scalar_type, splat)

@dataclass
class Env:
    """What an expression sees while it is emitted.

    - ``module``: for declarations of intrinsics and libm functions;
    - ``scop``: tensors' shapes and dtypes, and size values;
    - ``tensors``: tensor name → data pointer (``ptr``);
    - ``indices``: lang index name → its value (i64); in vector mode the value of lane 0;
    - ``fail``: returns the block that makes the kernel return 1 (made on first use);
    - ``lanes`` and ``strides`` (vector mode): the vector length and, per lang index, its step from one
      lane to the next (0 for indices invariant in the vectorized loop);
    - ``mask``: inside a branch of ``?:``, where the branch is taken; a read touches memory only there
      (a masked vector load, or the tensor's first element standing in), so a guarded read such as
      padding's ``X(h-1)`` never leaves its tensor;
    - ``safe_reads``: the statement's reads that stay in bounds without the guard (read unmasked).
    """

    module: ir.Module
    scop: Scop
    tensors: dict[str, ir.Value]
    indices: dict[str, ir.Value]
    fail: Callable[[], ir.Block]
    lanes: int = 1
    strides: dict[str, int] = field(default_factory=dict)
    mask: ir.Value | None = None  # i1 / <lanes x i1>: reads happen only where it is true (a ?: guard)
    safe_reads: frozenset = frozenset()  # reads in bounds whatever the mask (PolyStatement.safe_reads)
    #: a generic kernel's run-time sizes (i64): each parameter by name, each size-dependent extent as
    #: ``"T.k"`` (tensor ``T``'s dimension ``k``); empty when specialised
    sizes: dict[str, ir.Value] = field(default_factory=dict)
    #: tensor → (alias scopes, noalias scopes): metadata nodes its loads and stores carry (an unrolled copy
    #: that touches the tensor apart from the other copies, :func:`polyc.codegen.region.disjoint_copies`)
    alias: dict = field(default_factory=dict)


# ---- integer division with floor semantics and no undefined behaviour ----

def int_div_mod(b: ir.IRBuilder, x: ir.Value, y: ir.Value, unsigned: bool, want: str) -> ir.Value:
    """``x / y`` (``want="div"``) or ``x % y`` (``"mod"``) rounding toward minus infinity, ``x/0 = x%0 = 0``.

    Signed: ``sdiv``/``srem`` on a safe divisor (1 when ``y`` is 0 or -1), then the floor adjustment.
    Unsigned: ``udiv``/``urem``.
    """
    ty = x.type
    zero, one = const(ty, 0), const(ty, 1)
    if not unsigned and (int_value(y) or 0) > 0:
        r = b.srem(x, y)  # a positive constant divisor (isl's floord): only the floor adjustment
        negative = b.icmp_signed("<", r, zero)
        if want == "div":
            return b.sub(b.sdiv(x, y), b.zext(negative, ty))
        return b.add(r, b.select(negative, y, zero))
    by_zero = b.icmp_unsigned("==", y, zero)
    if unsigned:
        safe = b.select(by_zero, one, y)
        result = b.udiv(x, safe) if want == "div" else b.urem(x, safe)
        return b.select(by_zero, zero, result)
    by_minus_one = b.icmp_signed("==", y, const(ty, -1))
    special = b.or_(by_zero, by_minus_one)
    safe = b.select(special, one, y)
    r = b.srem(x, safe)
    if want == "mod" and _element_bits(ty) <= 32:
        # floor(x mod y) = trunc((r + y) srem y) in twice the width (no overflow, no select): the form
        # with a sign-test select is miscompiled by LLVM 22's x86 backend (AVX-512) once SLP packs the
        # unrolled scalar copies of an int32 `%` (tests/codegen/test_index_safety.py, found by scripts/fuzz.py)
        wide = _widened(ty)
        wide_safe = b.sext(safe, wide)
        floor_r = b.trunc(b.srem(b.add(b.sext(r, wide), wide_safe), wide_safe), ty)
        return b.select(special, zero, floor_r)
    q = b.sdiv(x, safe)
    adjust = b.and_(b.icmp_signed("!=", r, zero), b.icmp_signed("<", b.xor(r, safe), zero))
    if want == "div":
        q = b.select(adjust, b.sub(q, one), q)
        return b.select(by_zero, zero, b.select(by_minus_one, b.sub(zero, x), q))
    r = b.select(adjust, b.add(r, safe), r)
    return b.select(special, zero, r)


def _element_bits(ty: ir.Type) -> int:
    return (ty.element if isinstance(ty, ir.VectorType) else ty).width


def _widened(ty: ir.Type) -> ir.Type:
    """The integer type (or vector of it) of twice ``ty``'s element width."""
    wide = ir.IntType(2 * _element_bits(ty))
    return ir.VectorType(wide, ty.count) if isinstance(ty, ir.VectorType) else wide


def float_mod(b: ir.IRBuilder, module: ir.Module, x: ir.Value, y: ir.Value) -> ir.Value:
    """``np.mod(x, y)``: ``frem``, plus ``y`` when the signs differ, and a zero with the sign of ``y``."""
    ty = x.type
    zero = const(ty, 0.0)
    r = b.frem(x, y)
    differ = b.xor(b.fcmp_ordered("<", r, zero), b.fcmp_ordered("<", y, zero))
    fix = b.and_(b.fcmp_ordered("!=", r, zero), differ)
    r = b.select(fix, b.fadd(r, y), r)
    signed_zero = b.call(intrinsic(module, "copysign", ty, 2), [zero, y])
    return b.select(b.fcmp_ordered("==", r, zero), signed_zero, r)


# ---- conversions ----

def convert(b: ir.IRBuilder, value: ir.Value, src: str, dst: str) -> ir.Value:
    """Convert ``value`` from dtype ``src`` to ``dst`` (numpy ``astype`` semantics, see the module doc)."""
    if src == dst:
        return value
    lanes = value.type.count if isinstance(value.type, ir.VectorType) else 1
    if src in STORAGE:
        value, src = storage.to_float32(b, value, src), "float32"
        if dst == src:
            return value
    if dst in STORAGE:
        if src not in FLOAT:  # exactly or once rounded (ints beyond 2**24 overflow float16 anyway)
            value, src = convert(b, value, src, "float32" if dst == "float16" else "float64"), \
                ("float32" if dst == "float16" else "float64")
        return storage.from_float(b, value, src, dst)
    to = llvm_type(dst, lanes)
    if dst == "bool":
        if src in FLOAT:
            return b.fcmp_unordered("!=", value, const(value.type, 0.0))
        return b.icmp_unsigned("!=", value, const(value.type, 0))
    if src in FLOAT and dst in FLOAT:
        return b.fpext(value, to) if dst == "float64" else b.fptrunc(value, to)
    if src in FLOAT:
        if dst == "uint64":
            return freeze(b, b.fptoui(value, to))
        wide = 64 if dst in ("int64", "uint32") else 32
        result = freeze(b, b.fptosi(value, _with_elem(value.type, ir.IntType(wide))))
        return result if wide == _BITS[dst] else b.trunc(result, to)
    if dst in FLOAT:
        return b.uitofp(value, to) if src in UNSIGNED else b.sitofp(value, to)
    if _BITS[dst] < _BITS[src]:
        return b.trunc(value, to)
    if _BITS[dst] > _BITS[src]:
        return b.zext(value, to) if src in UNSIGNED else b.sext(value, to)
    return value


def to_i64(b: ir.IRBuilder, value: ir.Value, dtype: str) -> ir.Value:
    """An integer (or bool) value widened to i64 for address arithmetic."""
    if dtype in FLOAT:
        raise CompileError(f"codegen: a {dtype} value used as an index")
    return convert(b, value, dtype, "int64") if dtype != "int64" else value


# ---- expressions ----

def emit_expr(env: Env, e: L.Expr, b: ir.IRBuilder) -> ir.Value:
    """The value of typed expression ``e`` at ``b`` (a ``<env.lanes x T>`` vector in vector mode).

    May add blocks (checked gathers, lazy ``?:``/``&&``/``||``): ``b`` is left at the end of the code.
    Raises CompileError on an untyped or unknown node (a polyc bug upstream).
    """
    if e.dtype is None:
        raise CompileError(f"codegen: untyped expression {e!r}")
    if isinstance(e, L.Const):
        return const(llvm_type(e.dtype, env.lanes), e.value)
    if isinstance(e, L.Ident):
        return _emit_ident(env, e, b)
    if isinstance(e, L.Access):
        return load_access(env, e, b)
    if isinstance(e, L.Cast):
        return convert(b, emit_expr(env, e.operand, b), e.operand.dtype, e.to)
    if isinstance(e, L.Unary):
        x = emit_expr(env, e.operand, b)
        if e.op == "!":
            return b.xor(x, const(x.type, 1))
        if e.op == "-":
            return b.fneg(x) if e.dtype in FLOAT else b.sub(const(x.type, 0), x)
        raise CompileError(f"codegen: unknown unary operator {e.op!r}")
    if isinstance(e, L.Binary):
        return _emit_binary(env, e, b)
    if isinstance(e, L.Select):
        return _emit_select(env, e, b)
    if isinstance(e, L.Call):
        return _emit_call(env, e, b)
    raise CompileError(f"codegen: unknown expression node {type(e).__name__}")


def _emit_ident(env: Env, e: L.Ident, b: ir.IRBuilder) -> ir.Value:
    if e.kind == "size":
        if e.name in env.sizes:
            return splat(b, convert(b, env.sizes[e.name], "int64", e.dtype), env.lanes)
        return const(llvm_type(e.dtype, env.lanes), env.scop.sizes[e.name])
    if e.kind == "scalar":
        value = load_scalar(env, e.name, b)
        return splat(b, convert(b, value, env.scop.tensor(e.name).dtype, e.dtype), env.lanes)
    if e.kind == "index":
        value = env.indices[e.name]
        stride = env.strides.get(e.name, 0)
        if env.lanes > 1:
            value = splat(b, value, env.lanes)
            if stride:
                value = b.add(value, ir.Constant(value.type, [stride * k for k in range(env.lanes)]))
        return convert(b, value, "int64", e.dtype)
    raise CompileError(f"codegen: identifier {e.name!r} of kind {e.kind!r} cannot be evaluated")


def _emit_binary(env: Env, e: L.Binary, b: ir.IRBuilder) -> ir.Value:
    op = e.op
    if op in ("&&", "||") and may_fail(e.rhs):
        return _emit_lazy(env, e.lhs, e.rhs if op == "&&" else None, e.rhs if op == "||" else None, b)
    x = emit_expr(env, e.lhs, b)
    y = emit_expr(env, e.rhs, b)
    dtype = e.lhs.dtype
    if op == "&&":
        return b.and_(x, y)
    if op == "||":
        return b.or_(x, y)
    if op in ("<", "<=", ">", ">=", "==", "!="):
        if dtype in FLOAT:
            return b.fcmp_unordered(op, x, y) if op == "!=" else b.fcmp_ordered(op, x, y)
        return b.icmp_unsigned(op, x, y) if dtype in UNSIGNED else b.icmp_signed(op, x, y)
    if dtype in FLOAT:
        if op == "+":
            return b.fadd(x, y, flags=_CONTRACT)
        if op == "-":
            return b.fsub(x, y, flags=_CONTRACT)
        if op == "*":
            return b.fmul(x, y, flags=_CONTRACT)
        if op == "/":
            return b.fdiv(x, y)
        if op == "%":
            return float_mod(b, env.module, x, y)
    elif dtype == "bool" and op in ("+", "*"):
        return b.or_(x, y) if op == "+" else b.and_(x, y)
    else:
        if op == "+":
            return b.add(x, y)
        if op == "-":
            return b.sub(x, y)
        if op == "*":
            return b.mul(x, y)
        if op in ("/", "%"):
            return int_div_mod(b, x, y, dtype in UNSIGNED, "div" if op == "/" else "mod")
    raise CompileError(f"codegen: operator {op!r} on {dtype}")


def _emit_select(env: Env, e: L.Select, b: ir.IRBuilder) -> ir.Value:
    if may_fail(e.then) or may_fail(e.other):
        return _emit_lazy(env, e.cond, e.then, e.other, b)
    if env.lanes > 1 and (reads(e.then) or reads(e.other)) and _uniform(env, e.cond):
        # a guard the same for every lane (a Pad's border test, the vector along the channels): a branch on
        # it, so the side taken reads with plain vector loads. Masked loads and a select made an NHWC Pad of
        # 64 channels at 56x56 run at 13 GB/s (127 us; a plain copy 34 us)
        scalar = dataclasses.replace(env, lanes=1, strides={}, mask=None)
        return _emit_lazy(env, e.cond, e.then, e.other, b, emit_expr(scalar, e.cond, b))
    c = emit_expr(env, e.cond, b)
    if not (reads(e.then) or reads(e.other)):
        return b.select(c, emit_expr(env, e.then, b), emit_expr(env, e.other, b))
    # each branch reads memory only where it is taken
    then_env = dataclasses.replace(env, mask=c if env.mask is None else b.and_(env.mask, c))
    not_c = b.xor(c, const(c.type, 1))
    other_env = dataclasses.replace(env, mask=not_c if env.mask is None else b.and_(env.mask, not_c))
    return b.select(c, emit_expr(then_env, e.then, b), emit_expr(other_env, e.other, b))


def reads(e: L.Expr) -> bool:
    """Whether ``e`` reads a tensor (an access or a 0-d parameter)."""
    if isinstance(e, L.Access):
        return True
    return any(reads(c) for c in children(e))


def _uniform(env: Env, cond: L.Expr) -> bool:
    """Whether ``cond`` has one value for all the lanes of a vector step: no reads, and every index in it
    stays put along the vector loop."""
    return not reads(cond) and all(env.strides.get(i, 0) == 0 for i in index_names(cond))


def _emit_lazy(env: Env, cond: L.Expr, then: L.Expr | None, other: L.Expr | None,
               b: ir.IRBuilder, c: ir.Value | None = None) -> ir.Value:
    """``cond ? then : other`` with branches; ``None`` stands for ``cond`` itself. ``c``: the condition's i1
    when the caller has it (a scalar condition for vector sides), else ``cond`` is emitted in ``env``
    (scalar only)."""
    if c is None:
        c = emit_expr(env, cond, b)
    then_block = b.append_basic_block("sel.then")
    else_block = b.append_basic_block("sel.else")
    join = b.append_basic_block("sel.join")
    b.cbranch(c, then_block, else_block)
    values = []
    for block, part in ((then_block, then), (else_block, other)):
        b.position_at_end(block)
        values.append((c if part is None else emit_expr(env, part, b), b.block))
        b.branch(join)
    b.position_at_end(join)
    phi = b.phi(values[0][0].type)
    for value, block in values:
        phi.add_incoming(value, block)
    return phi


def _emit_call(env: Env, e: L.Call, b: ir.IRBuilder) -> ir.Value:
    f = e.func
    args = [emit_expr(env, a, b) for a in e.args]
    dtype = e.args[0].dtype if e.args else e.dtype
    ty = args[0].type
    if f == "abs" and dtype not in FLOAT:
        if dtype in UNSIGNED:
            return args[0]
        x = args[0]
        return b.select(b.icmp_signed("<", x, const(ty, 0)), b.sub(const(ty, 0), x), x)
    if f == "abs":
        f = "fabs"
    if f in ("min", "max", "fmin", "fmax"):
        return min_max(b, f, args[0], args[1], dtype)
    if f in _BITWISE:
        return _bitwise(b, f, args, dtype)
    return mathlib.emit_builtin(env.module, f, args, b, tuple(a.dtype for a in e.args))


_BITWISE = ("bitand", "bitor", "bitxor", "bitnot", "shl", "shr")


def _bitwise(b: ir.IRBuilder, f: str, args: list, dtype: str) -> ir.Value:
    """The integer builtins; shifts by the width or more (or a negative count) saturate as numpy's do."""
    x = args[0]
    if dtype in FLOAT:
        raise CompileError(f"codegen: {f} on {dtype}")
    if f == "bitnot":
        return b.xor(x, const(x.type, -1))
    y = args[1]
    if f in ("bitand", "bitor", "bitxor"):
        return {"bitand": b.and_, "bitor": b.or_, "bitxor": b.xor}[f](x, y)
    width = _BITS[dtype]
    over = b.icmp_unsigned(">=", y, const(y.type, width))
    if f == "shl":
        return b.select(over, const(x.type, 0), b.shl(x, b.select(over, const(y.type, 0), y)))
    if dtype in UNSIGNED:
        return b.select(over, const(x.type, 0), b.lshr(x, b.select(over, const(y.type, 0), y)))
    return b.ashr(x, b.select(over, const(y.type, width - 1), y))


#: x86's packed max/min intrinsics by vector width in bits and element type: ``maxps(a, b)`` is ``a > b ? a :
#: b``, so ``b`` when either is NaN; the 512-bit forms take a rounding argument (4: the current mode).
_X86_MINMAX = {(128, "float"): ("sse.{}.ps", False), (256, "float"): ("avx.{}.ps.256", False),
               (512, "float"): ("avx512.{}.ps.512", True), (128, "double"): ("sse2.{}.pd", False),
               (256, "double"): ("avx.{}.pd.256", False), (512, "double"): ("avx512.{}.pd.512", True)}


def _x86_min_max(b: ir.IRBuilder, want_max: bool, y: ir.Value, x: ir.Value) -> ir.Value | None:
    """``maxps/minps(y, x)`` (``x`` when either is NaN) for a float vector of 128, 256 or 512 bits on an x86
    module, else None. A vector's bits never exceed the target's (:mod:`polyc.codegen.vector` sizes it from
    ``Target.vector_bits``), so the form exists on the target."""
    ty = x.type
    if not isinstance(ty, ir.VectorType) or not (b.module.triple or "").startswith(("x86_64", "i686")):
        return None
    elem = "float" if isinstance(ty.element, ir.FloatType) else "double" if isinstance(ty.element, ir.DoubleType) \
        else None
    found = _X86_MINMAX.get((ty.count * (32 if elem == "float" else 64), elem)) if elem else None
    if found is None:
        return None
    name, rounding = found
    args = [y, x] + ([const(I32, 4)] if rounding else [])
    fn = declare(b.module, "llvm.x86." + name.format("max" if want_max else "min"),
                   ir.FunctionType(ty, [a.type for a in args]))
    return b.call(fn, args)


def min_max(b: ir.IRBuilder, f: str, x: ir.Value, y: ir.Value, dtype: str) -> ir.Value:
    """``min``/``max`` (NaN-propagating: ``np.minimum``/``np.maximum``) or ``fmin``/``fmax`` (NaN-ignoring).

    The NaN-propagating pair is ``isnan(y) ? y : (y > x ? y : x)`` (for ``max``): in a reduction, ``x`` the
    accumulator, only the max and the blend are on the accumulator's dependence chain, not the NaN test. On
    x86 vectors the inner select is the ``maxps``/``minps`` intrinsic, because LLVM folds the two selects of
    the generic form back into one compare-or-compare-select (four instructions with a mask ``or`` on the
    chain; three with the intrinsic: a channels-last MaxPool 3x3/2 of 64 channels at 111x111, 1 thread,
    AVX-512, 0.062 -> 0.046 ms). Of two equal operands (only the sign of a zero can tell) ``x`` is returned."""
    want_max = f in ("max", "fmax")
    if dtype not in FLOAT:
        cmp = b.icmp_unsigned if dtype in UNSIGNED else b.icmp_signed
        return b.select(cmp(">" if want_max else "<", x, y), x, y)
    if f in ("max", "min"):
        inner = _x86_min_max(b, want_max, y, x)
        if inner is None:
            inner = b.select(b.fcmp_ordered(">" if want_max else "<", y, x), y, x)
        return b.select(b.fcmp_unordered("uno", y, y), y, inner)
    pick_x = b.fcmp_ordered(">" if want_max else "<", x, y)
    pick_x = b.or_(pick_x, b.fcmp_unordered("uno", y, y))  # y is NaN: ignore it
    return b.select(pick_x, x, y)


def combine(b: ir.IRBuilder, op: str, dtype: str, old: ir.Value, new: ir.Value) -> ir.Value:
    """The value a statement with operator ``op`` stores: ``new`` for init/``=``, else ``old op new``."""
    if op in ("init", "="):
        return new
    if op in ("max=", "min="):
        return min_max(b, op[:3], old, new, dtype)
    if dtype == "bool":
        return b.or_(old, new) if op == "+=" else b.and_(old, new)
    if op == "+=":
        return b.fadd(old, new, flags=_CONTRACT) if dtype in FLOAT else b.add(old, new)
    if op == "*=":
        return b.fmul(old, new, flags=_CONTRACT) if dtype in FLOAT else b.mul(old, new)
    raise CompileError(f"codegen: unknown statement operator {op!r}")


def emit_update(env: Env, op: str, dtype: str, rhs: L.Expr, old: ir.Value | None, b: ir.IRBuilder) -> ir.Value:
    """The value a statement ``T(...) op rhs`` stores, given the current element ``old`` (None for init/``=``).

    A guarded contribution ``c ? t : e`` whose ``e`` is the identity of ``op`` (``0`` for ``+=``, ``1`` for
    ``*=``: padding in a convolution) becomes ``c ? old op t : old``, so the multiply in ``t`` and the
    accumulation stay one (masked) FMA. The only difference from the literal form is the sign of a zero sum:
    ``-0.0 + 0.0`` is ``+0.0`` but the select keeps ``-0.0``.
    """
    if old is not None and isinstance(rhs, L.Select) and not may_fail(rhs.then) and _is_identity(rhs.other, op):
        c = emit_expr(env, rhs.cond, b)
        then_env = dataclasses.replace(env, mask=c if env.mask is None else b.and_(env.mask, c))
        then = convert(b, emit_expr(then_env, rhs.then, b), rhs.then.dtype, dtype)
        return b.select(c, combine(b, op, dtype, old, then), old)
    value = convert(b, emit_expr(env, rhs, b), rhs.dtype, dtype)
    return value if old is None else combine(b, op, dtype, old, value)


def _is_identity(e: L.Expr, op: str) -> bool:
    while isinstance(e, L.Cast):
        e = e.operand
    return isinstance(e, L.Const) and not isinstance(e.value, bool) and (
        (op == "+=" and e.value == 0) or (op == "*=" and e.value == 1))


# ---- tensor accesses ----

def is_data_dependent(e: L.Expr) -> bool:
    """Whether ``e``'s value depends on tensor data (an access or a 0-d parameter inside)."""
    if isinstance(e, L.Access) or (isinstance(e, L.Ident) and e.kind == "scalar"):
        return True
    return any(is_data_dependent(c) for c in children(e))


def may_fail(e: L.Expr) -> bool:
    """Whether evaluating ``e`` checks an index at run time (and so may make the kernel return 1): a read
    marked ``checked`` (an index the compile-time check cannot bound) or with a data-dependent index."""
    if isinstance(e, L.Access) and (e.checked or any(is_data_dependent(a) for a in e.args)):
        return True
    return any(may_fail(c) for c in children(e))


#: Integer dtypes whose index arithmetic :func:`index_value` computes (as ``polyc.poly.affine`` models it).
_INDEX_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")


def index_value(env: Env, e: L.Expr, b: ir.IRBuilder, nsw: bool = True) -> ir.Value | None:
    """An index expression built from indices, sizes, integer constants, integer casts and ``+ - * / %``,
    evaluated in i64 exactly as :func:`polyc.poly.affine.affine_text` models it (so the compile-time bounds
    check sees the value used here):

    - int32 and int64 arithmetic is done in 64 bits (no int32 wrap-around, no sign extensions in address
      arithmetic); ``nsw`` marks it as not overflowing (pass False for a value checked at run time);
    - arithmetic in a narrower type (int8, int16, uint8, uint16, uint32) and casts to a narrower type wrap
      around to that type (truncate, then sign- or zero-extend back to i64); a cast to uint64 keeps the bits.

    Returns None for anything else (bool or uint64 arithmetic, calls, reads: the caller evaluates those with
    :func:`emit_expr`). In vector mode this is the value of lane 0.
    """
    flags = ("nsw",) if nsw else ()
    if isinstance(e, L.Const) and isinstance(e.value, (int, bool)) and e.dtype not in FLOAT:
        return const(I64, int(e.value))
    if isinstance(e, L.Ident) and e.kind == "index":
        return env.indices[e.name]
    if isinstance(e, L.Ident) and e.kind == "size":
        return env.sizes[e.name] if e.name in env.sizes else const(I64, env.scop.sizes[e.name])
    if isinstance(e, L.Cast) and e.to in _INDEX_DTYPES + ("uint64",) and e.operand.dtype in _INDEX_DTYPES:
        x = index_value(env, e.operand, b, nsw)
        return x if x is None or e.to == "uint64" else _wrap(b, x, e.to, cast=True)
    if isinstance(e, L.Unary) and e.op == "-" and e.dtype in _INDEX_DTYPES:
        x = index_value(env, e.operand, b, nsw)
        return None if x is None else _wrap(b, b.sub(const(I64, 0), x, flags=flags), e.dtype)
    if isinstance(e, L.Binary) and e.op in ("+", "-", "*", "/", "%") and e.dtype in _INDEX_DTYPES:
        x = index_value(env, e.lhs, b, nsw)
        y = index_value(env, e.rhs, b, nsw) if x is not None else None
        if y is None:
            return None
        if e.op == "+":
            value = b.add(x, y, flags=flags)
        elif e.op == "-":
            value = b.sub(x, y, flags=flags)
        elif e.op == "*":
            value = b.mul(x, y, flags=flags)
        else:  # the operands of a narrow type are in its range: the signed floor division is the same
            value = int_div_mod(b, x, y, False, "div" if e.op == "/" else "mod")
        return _wrap(b, value, e.dtype)
    return None


def _wrap(b: ir.IRBuilder, value: ir.Value, dtype: str, cast: bool = False) -> ir.Value:
    """The i64 ``value`` as a ``dtype`` value (truncated, then sign- or zero-extended back to i64); int32
    arithmetic (not a ``cast``) stays in 64 bits, see :func:`index_value`."""
    if dtype == "int64" or (dtype == "int32" and not cast):
        return value
    narrow = b.trunc(value, ir.IntType(_BITS[dtype]))
    return b.zext(narrow, I64) if dtype in UNSIGNED else b.sext(narrow, I64)


def index_stride(e: L.Expr, strides: dict[str, int]) -> int | None:
    """How much index expression ``e`` grows per lane of the vectorized loop, or None if not affine.

    ``strides`` gives each lang index's step per lane. Data-dependent expressions give None.
    """
    if is_data_dependent(e):
        return None
    if isinstance(e, L.Ident):
        return strides.get(e.name, 0) if e.kind == "index" else 0
    if isinstance(e, L.Const):
        return 0
    if isinstance(e, L.Cast) and e.to in ("int32", "int64") and e.operand.dtype in ("int32", "int64"):
        return index_stride(e.operand, strides)
    if isinstance(e, L.Unary) and e.op == "-":
        s = index_stride(e.operand, strides)
        return None if s is None else -s
    parts = [index_stride(c, strides) for c in children(e)]
    if any(p is None for p in parts):
        return None
    if not any(parts):
        return 0
    if isinstance(e, L.Binary) and e.op in ("+", "-"):
        return parts[0] + parts[1] if e.op == "+" else parts[0] - parts[1]
    if isinstance(e, L.Binary) and e.op == "*":
        constant = e.lhs if parts[0] == 0 else e.rhs
        if isinstance(constant, L.Const):
            return int(constant.value) * (parts[1] if parts[0] == 0 else parts[0])
    return None


def flat_index(env: Env, tensor: str, dims: list[ir.Value], b: ir.IRBuilder) -> ir.Value:
    """The C-order element offset ``((i0*d1 + i1)*d2 + i2)...`` of i64 indices ``dims`` (0 for a 0-d tensor).

    Constant terms of the indices (``c3 + 2`` in an unrolled copy) are pulled out into one constant added
    last, so the copies of an unrolled loop address ``same base + different constants``: LLVM's alias
    analysis then tells their accumulators apart and keeps them in registers (an ``add`` that instcombine
    turned into an ``or`` hid this before).
    """
    shape = extent_values(env, tensor)
    if any(not isinstance(extent, int) for extent in shape):  # a generic kernel: Horner's rule at run time
        flat = const(I64, 0)
        for extent, value in zip(shape, dims):
            flat = b.add(b.mul(flat, const(I64, extent) if isinstance(extent, int) else extent, flags=("nsw",)),
                         value, flags=("nsw",))
        return flat
    flat = None
    offset = 0
    for extent, value in zip(shape, dims):
        variable, constant = _split_constant(value)
        offset = offset * extent + constant
        if flat is not None:
            flat = b.mul(flat, const(I64, extent), flags=("nsw",))
        if variable is not None:
            flat = variable if flat is None else b.add(flat, variable, flags=("nsw",))
    if flat is None:
        return const(I64, offset)
    return b.add(flat, const(I64, offset), flags=("nsw",)) if offset else flat


def extent_values(env: Env, tensor: str) -> list:
    """The extents of ``tensor``: ints, and in a generic kernel i64 values for those that depend on the
    sizes (``env.sizes["T.k"]``)."""
    t = env.scop.tensor(tensor)
    if not t.extents:
        return list(t.shape)
    return [env.sizes[f"{tensor}.{k}"] if type(e) is not int else e for k, e in enumerate(t.extents)]


def _split_constant(value: ir.Value) -> tuple[ir.Value | None, int]:
    """``(x, c)`` with ``value == x + c`` for an i64 ``add`` with a constant operand (``x`` None: constant)."""
    if int_value(value) is not None:
        return None, int_value(value)
    if isinstance(value, ir.Instruction) and value.opname == "add" and value.type == I64:
        left, right = value.operands
        lv, lc = _split_constant(left)
        rv, rc = _split_constant(right)
        if lv is None or rv is None:
            return (rv if lv is None else lv), lc + rc
    return value, 0


def element_pointer(env: Env, tensor: str, flat: ir.Value, b: ir.IRBuilder) -> ir.Value:
    """``getelementptr inbounds T, ptr %tensor, i64 flat``."""
    dtype = env.scop.tensor(tensor).dtype
    return b.gep(env.tensors[tensor], [flat], inbounds=True, source_etype=memory_type(dtype))


def access_offset(env: Env, e: L.Access, b: ir.IRBuilder) -> ir.Value:
    """The element offset of read ``e`` (lane 0 in vector mode), with unproven indices checked.

    Every index of a read marked ``checked`` (non-affine, see ``polyc.poly.build.mark_checked``) and every
    data-dependent index outside ``[0, extent)`` branches to ``env.fail()``: no load happens.
    """
    t = env.scop.tensor(e.tensor)
    if len(e.args) != len(t.shape):
        raise CompileError(f"codegen: {e.tensor} has {len(t.shape)} dimensions but is read with {len(e.args)}")
    dims = []
    for extent, arg in zip(extent_values(env, e.tensor), e.args):
        check = e.checked or is_data_dependent(arg)
        value = None if is_data_dependent(arg) else index_value(env, arg, b, nsw=not check)
        if value is None:
            if env.lanes > 1 and index_stride(arg, env.strides) != 0:
                raise CompileError(f"codegen: vector read of {e.tensor} with an index that is not affine")
            scalar = env if env.lanes == 1 else dataclasses.replace(env, lanes=1, strides={})
            value = to_i64(b, emit_expr(scalar, arg, b), arg.dtype)
        if check:
            in_range = b.icmp_unsigned("<", value, const(I64, extent) if isinstance(extent, int) else extent)
            ok = b.append_basic_block(ir_name(f"{e.tensor}.index_ok"))
            b.cbranch(in_range, ok, env.fail())
            b.position_at_end(ok)
        dims.append(value)
    return flat_index(env, e.tensor, dims, b)


def load_access(env: Env, e: L.Access, b: ir.IRBuilder) -> ir.Value:
    """Read ``e``: a scalar load; in vector mode a vector load (stride 1) or a broadcast (stride 0)."""
    flat = access_offset(env, e, b)
    stride = 0
    if env.lanes > 1:
        stride = flat_stride(env.scop, e.tensor, e.args, env.strides)
        if stride is None or stride < 0:
            raise CompileError(f"codegen: vector read of {e.tensor} with stride {stride}")
        if stride > MAX_READ_STRIDE:
            return gather(env, e.tensor, flat, stride, env.mask if e not in env.safe_reads else None, b)
    if env.mask is not None and e not in env.safe_reads:
        return _guarded_load(env, e.tensor, flat, stride, b)
    if stride > 1:
        return _strided_load(env, e.tensor, flat, stride, b)
    value = load(env, e.tensor, flat, b, lanes=env.lanes if stride == 1 else 1)
    return splat(b, value, env.lanes) if env.lanes > 1 and stride == 0 else value


def _strided_load(env: Env, tensor: str, flat: ir.Value, stride: int, b: ir.IRBuilder) -> ir.Value:
    """``env.lanes`` elements ``stride`` apart from ``flat`` (no guard): the span they cover, ``stride *
    (lanes - 1) + 1`` elements, as full vector loads, the last one moved back to end where the span ends (so
    nothing past it is touched), joined and every stride-th element picked. One load of the odd-width span
    (``<15 x float>``) is split by LLVM into loads of 8, 4, 2 and 1 elements and inserts; full vectors and
    one two-source shuffle (``vpermt2ps`` with AVX-512) are about a third of the instructions (an NCHW
    MaxPool 3x3/2 of 128 channels at 55x55, 1 thread: AVX-512 0.077 -> 0.058 ms, AVX2 0.083 -> 0.057)."""
    lanes = env.lanes
    span = stride * (lanes - 1) + 1
    starts = [min(k * lanes, span - lanes) for k in range(-(-span // lanes))]
    chunks = [load(env, tensor, b.add(flat, const(I64, start)), b, lanes=lanes) for start in starts]
    while len(chunks) & (len(chunks) - 1):  # a power of two of chunks, to join pairwise
        chunks.append(ir.Constant(chunks[0].type, ir.Undefined))
    index = {}  # element offset -> position in the joined vector
    for k, start in enumerate(starts):
        for j in range(lanes):
            index.setdefault(start + j, k * lanes + j)
    while len(chunks) > 1:
        width = chunks[0].type.count
        both = ir.Constant(ir.VectorType(I32, 2 * width), list(range(2 * width)))
        chunks = [b.shuffle_vector(chunks[i], chunks[i + 1], both) for i in range(0, len(chunks), 2)]
    picks = ir.Constant(ir.VectorType(I32, lanes), [index[stride * j] for j in range(lanes)])
    return b.shuffle_vector(chunks[0], ir.Constant(chunks[0].type, ir.Undefined), picks)


#: Reads whose element stride per vector lane is at most this are vectorized as loads of the span (masked
#: under a guard; a stride-2 convolution reads its input with stride 2), wider ones as gathers.
MAX_READ_STRIDE = 4


def _lane_pointers(env: Env, tensor: str, flat: ir.Value, stride: int, b: ir.IRBuilder) -> ir.Value:
    """The vector of ``env.lanes`` element pointers ``flat + stride * j`` of ``tensor``."""
    step = stride * element_bytes(env.scop.tensor(tensor).dtype)
    base = splat(b, b.ptrtoint(element_pointer(env, tensor, flat, b), I64), env.lanes)
    addresses = b.add(base, ir.Constant(ir.VectorType(I64, env.lanes), [step * j for j in range(env.lanes)]))
    return b.inttoptr(addresses, ir.VectorType(PTR, env.lanes))


def gather(env: Env, tensor: str, flat: ir.Value, stride: int, mask: ir.Value | None,
           b: ir.IRBuilder) -> ir.Value:
    """``env.lanes`` elements of ``tensor`` ``stride`` apart from ``flat`` (``llvm.masked.gather``; lanes off
    in ``mask`` touch no memory): a channels-last convolution's NCHW epilogue reads its residual operand
    along the channels, a row apart."""
    dtype = env.scop.tensor(tensor).dtype
    mty = memory_type(dtype)
    vty = ir.VectorType(mty, env.lanes)
    mask = mask if mask is not None else const(ir.VectorType(ir.IntType(1), env.lanes), 1)
    pty = ir.VectorType(PTR, env.lanes)
    fn = declare(env.module, f"llvm.masked.gather.v{env.lanes}{_type_suffix(mty)}.v{env.lanes}p0",
                 ir.FunctionType(vty, [pty, I32, mask.type, vty]))
    value = b.call(fn, [_lane_pointers(env, tensor, flat, stride, b), ir.Constant(I32, element_bytes(dtype)), mask,
                        ir.Constant(vty, None)])
    return b.icmp_unsigned("!=", value, const(vty, 0)) if dtype == "bool" else value


def scatter(env: Env, tensor: str, flat: ir.Value, stride: int, value: ir.Value, b: ir.IRBuilder) -> None:
    """Store the ``env.lanes`` values of ``value`` ``stride`` elements apart from ``flat``
    (``llvm.masked.scatter``, every lane on): a channels-last convolution's NCHW read-back, computed as vectors
    along the channels."""
    dtype = env.scop.tensor(tensor).dtype
    mty = memory_type(dtype)
    if dtype == "bool":
        value = b.zext(value, _with_elem(value.type, I8))
    vty = ir.VectorType(mty, env.lanes)
    mask = const(ir.VectorType(ir.IntType(1), env.lanes), 1)
    fn = declare(env.module, f"llvm.masked.scatter.v{env.lanes}{_type_suffix(mty)}.v{env.lanes}p0",
                 ir.FunctionType(ir.VoidType(), [vty, ir.VectorType(PTR, env.lanes), I32, mask.type]))
    b.call(fn, [value, _lane_pointers(env, tensor, flat, stride, b), ir.Constant(I32, element_bytes(dtype)), mask])


def _guarded_load(env: Env, tensor: str, flat: ir.Value, stride: int, b: ir.IRBuilder) -> ir.Value:
    """A read under ``env.mask``: ``llvm.masked.load`` for a vector; for one element, the address of the
    tensor's first element (always valid) where the mask is off, so no lane can touch memory outside."""
    dtype = env.scop.tensor(tensor).dtype
    if env.lanes > 1 and stride > 1:
        # one masked load of the span the lanes cover (lane j's element at stride * j, the elements between
        # masked off, so no lane touches memory its guard forbids), then every stride-th element: a gather
        # costs about one element per cycle on x86, a masked load one vector. The load is a power of two
        # wide (the lanes past the span masked off too): LLVM splits an odd width such as <31 x float> into
        # pieces down to single elements, each with its own test and branch.
        mty = memory_type(dtype)
        span = stride * (env.lanes - 1) + 1
        span = 1 << (span - 1).bit_length()
        vty = ir.VectorType(mty, span)
        off = ir.Constant(ir.VectorType(ir.IntType(1), env.lanes), [0] * env.lanes)
        spread = b.shuffle_vector(env.mask, off, ir.Constant(ir.VectorType(I32, span), [
            e // stride if e % stride == 0 and e // stride < env.lanes else env.lanes for e in range(span)]))
        fn = declare(env.module, f"llvm.masked.load.v{span}{_type_suffix(mty)}.p0",
                     ir.FunctionType(vty, [PTR, I32, ir.VectorType(ir.IntType(1), span), vty]))
        wide = b.call(fn, [element_pointer(env, tensor, flat, b), ir.Constant(I32, element_bytes(dtype)), spread,
                           ir.Constant(vty, None)])
        picks = ir.Constant(ir.VectorType(I32, env.lanes), [stride * j for j in range(env.lanes)])
        value = b.shuffle_vector(wide, ir.Constant(vty, ir.Undefined), picks)
        return b.icmp_unsigned("!=", value, const(ir.VectorType(mty, env.lanes), 0)) if dtype == "bool" else value
    if env.lanes > 1 and stride == 1:
        mty = memory_type(dtype)
        vty = ir.VectorType(mty, env.lanes)
        suffix = f"v{env.lanes}{_type_suffix(mty)}"
        fn = declare(env.module, f"llvm.masked.load.{suffix}.p0",
                     ir.FunctionType(vty, [PTR, I32, ir.VectorType(ir.IntType(1), env.lanes), vty]))
        value = b.call(fn, [element_pointer(env, tensor, flat, b), ir.Constant(I32, element_bytes(dtype)),
                            env.mask, ir.Constant(vty, None)])
        return b.icmp_unsigned("!=", value, const(vty, 0)) if dtype == "bool" else value
    active = env.mask
    if env.lanes > 1:
        fn = declare(env.module, f"llvm.vector.reduce.or.v{env.lanes}i1",
                     ir.FunctionType(ir.IntType(1), [env.mask.type]))
        active = b.call(fn, [env.mask])
    safe = b.select(active, flat, const(I64, 0))
    value = load(env, tensor, safe, b)
    return splat(b, value, env.lanes) if env.lanes > 1 else value


def _type_suffix(ty: ir.Type) -> str:
    if isinstance(ty, ir.HalfType):
        return "f16"
    if isinstance(ty, ir.FloatType):
        return "f32"
    if isinstance(ty, ir.DoubleType):
        return "f64"
    return f"i{ty.width}"


def flat_stride(scop: Scop, tensor: str, args, strides: dict[str, int]) -> int | None:
    """The element stride of access ``tensor(args)`` per vector lane (None if not affine), C order.

    A packed buffer (role ``local``, or an input that arrives packed, :mod:`polyc.poly.promote`) is read at
    ``v / c`` and ``v % c``: the
    strategy packs only along a vector loop whose lanes stay inside one block of ``c``, so there ``v / c``
    is invariant and ``v % c`` moves like ``v``.
    """
    t = scop.tensor(tensor)
    shape = t.shape
    symbolic = [type(e) is not int for e in t.extents] if t.extents else [False] * len(shape)
    total, step, unknown = 0, 1, False  # unknown: step depends on the sizes (a generic kernel)
    for extent, arg, varies in reversed(list(zip(shape, args, symbolic))):
        if (t.role == "local" or t.packed) and isinstance(arg, L.Binary) and arg.op in ("/", "%") \
                and isinstance(arg.rhs, L.Const):
            s = index_stride(arg.lhs, strides)
            s = None if s is None else (0 if arg.op == "/" else s)
        else:
            s = index_stride(arg, strides)
        if s is None or (s and unknown):
            return None
        total += s * step
        step *= extent
        unknown = unknown or varies
    return total


def load(env: Env, tensor: str, flat: ir.Value, b: ir.IRBuilder, lanes: int = 1) -> ir.Value:
    """Load ``lanes`` consecutive elements of ``tensor`` at ``flat`` as register values (bool: ``!= 0``)."""
    dtype = env.scop.tensor(tensor).dtype
    mty = memory_type(dtype)
    ty = mty if lanes == 1 else ir.VectorType(mty, lanes)
    value = b.load(element_pointer(env, tensor, flat, b), typ=ty, align=element_bytes(dtype))
    _scoped(env, tensor, value)
    return b.icmp_unsigned("!=", value, const(ty, 0)) if dtype == "bool" else value


def _scoped(env: Env, tensor: str, instruction) -> None:
    """Tag a load or store of ``tensor`` with the alias scopes of ``env`` (``!alias.scope``, ``!noalias``)."""
    if tensor in env.alias:
        scopes, others = env.alias[tensor]
        instruction.set_metadata("alias.scope", env.module.add_metadata(scopes))
        instruction.set_metadata("noalias", env.module.add_metadata(others))


def store(env: Env, tensor: str, flat: ir.Value, value: ir.Value, b: ir.IRBuilder) -> None:
    """Store register value(s) ``value`` at element ``flat`` of ``tensor`` (bool as one byte each)."""
    dtype = env.scop.tensor(tensor).dtype
    if dtype == "bool":
        value = b.zext(value, _with_elem(value.type, I8))
    _scoped(env, tensor, b.store(value, element_pointer(env, tensor, flat, b), align=element_bytes(dtype)))


def load_scalar(env: Env, tensor: str, b: ir.IRBuilder) -> ir.Value:
    """The value of 0-d tensor ``tensor``."""
    return load(env, tensor, const(I64, 0), b)
