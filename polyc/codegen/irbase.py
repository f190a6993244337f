"""The LLVM IR vocabulary of the code generator: integer and float types per polyc dtype, constants and
splats over scalars or vectors, declarations of external functions and LLVM intrinsics, ``freeze``, and IR
names. Everything in :mod:`polyc.codegen` that builds IR uses these (through :mod:`polyc.codegen.expr`,
which re-exports them)."""
from __future__ import annotations

import hashlib
import operator

from llvmlite import ir

from ..errors import CompileError
from ..lang.ast import itemsize

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
PTR = ir.PointerType()
FLOAT = ("float32", "float64")
STORAGE = ("float16", "bfloat16")
UNSIGNED = ("bool", "uint8", "uint16", "uint32", "uint64")
_BITS = {"bool": 1, "int8": 8, "int16": 16, "int32": 32, "int64": 64,
         "uint8": 8, "uint16": 16, "uint32": 32, "uint64": 64}
_CONTRACT = ("contract",)


#: Longest IR value or block name passed to llvmlite: LLVM truncates local names past 1024 characters, so two
#: long names with a common prefix would collide ("multiple definition of local value").
MAX_IR_NAME = 64


def ir_name(name: str) -> str:
    """``name`` as safe for an LLVM value, block or symbol name: unchanged when short and plain
    (``[A-Za-z0-9_.]``, at most :data:`MAX_IR_NAME` characters), else a plain prefix and a hash of the whole
    name, so distinct long identifiers (legal in the language) stay distinct and LLVM never truncates them."""
    if len(name) <= MAX_IR_NAME and all(c.isascii() and (c.isalnum() or c in "_.") for c in name):
        return name
    prefix = "".join(c if c.isascii() and (c.isalnum() or c in "_.") else "_" for c in name[:MAX_IR_NAME - 17])
    return f"{prefix}.{hashlib.sha1(name.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


def scalar_type(dtype: str) -> ir.Type:
    """The register type of one element: bool → i1, intN/uintN → iN, float32 → float, float64 → double,
    float16 → half, bfloat16 → i16 (its bits: llvmlite has no bfloat type)."""
    if dtype == "float32":
        return ir.FloatType()
    if dtype == "float64":
        return ir.DoubleType()
    if dtype == "float16":
        return ir.HalfType()
    if dtype == "bfloat16":
        return ir.IntType(16)
    return ir.IntType(_BITS[dtype])


def llvm_type(dtype: str, lanes: int = 1) -> ir.Type:
    """The register type of ``dtype``, a ``<lanes x T>`` vector when ``lanes > 1``."""
    t = scalar_type(dtype)
    return t if lanes == 1 else ir.VectorType(t, lanes)


def memory_type(dtype: str) -> ir.Type:
    """The in-memory element type (numpy layout): as :func:`scalar_type` but bool is one byte (i8)."""
    return I8 if dtype == "bool" else scalar_type(dtype)


def element_bytes(dtype: str) -> int:
    """Bytes of one element in memory (:func:`polyc.lang.ast.itemsize`)."""
    return itemsize(dtype)


# ---- small helpers on scalar-or-vector values ----

def const(ty: ir.Type, value) -> ir.Constant:
    """A constant of ``ty``, splatted when ``ty`` is a vector; ints are wrapped to the type's width."""
    if isinstance(ty, ir.VectorType):
        return ir.Constant(ty, [const(ty.element, value)] * ty.count)
    if isinstance(ty, ir.IntType):
        value = int(value) & ((1 << ty.width) - 1)
        if ty.width > 1 and value >= 1 << (ty.width - 1):
            value -= 1 << ty.width
        return ir.Constant(ty, value)
    return ir.Constant(ty, float(value))


def int_value(v: ir.Value) -> int | None:
    """The value of a scalar integer constant (signed), else None."""
    if isinstance(v, ir.Constant) and isinstance(v.type, ir.IntType) and isinstance(v.constant, int):
        value = int(v.constant) & ((1 << v.type.width) - 1)
        return value - (1 << v.type.width) if value >> (v.type.width - 1) else value  # i1 true is -1, as in LLVM
    return None


class Builder(ir.IRBuilder):
    """llvmlite's ``IRBuilder`` folding scalar integer arithmetic on constants as it builds: ``add sub mul
    sdiv srem`` of two constants, ``x + 0``, ``x - 0``, ``x * 1``, ``x / 1``, signed comparisons of two
    constants, ``select`` on a constant condition and integer casts of a constant, with two's complement
    wrap-around at the type's width and C's truncating division; a division by zero is left to LLVM, and
    operands of different types raise llvmlite's ValueError as before. LLVM's InstCombine folds the same, so
    the machine code stays as it was (the 12 benchmark models' kernels: identical but for the order of
    independent instructions in 4 of 487); what shrinks is the IR the code generator builds, prints and LLVM
    parses (index arithmetic of unrolled register tiles, trip counts of loops with constant bounds, and
    through them the remainder loops :mod:`~polyc.codegen.vector` no longer emits): DenseNet's serial compile
    52 -> 35-41 s (Intel Emerald Rapids, 1 process)."""

    def _binop(self, op, lhs, rhs, name, flags, fold, neutral=None, commutative=False):
        """``op`` (llvmlite's method) unless it folds: ``x op neutral`` is ``x`` (``neutral op x`` too when
        ``commutative``), two constants are ``fold(x, y)`` (None: not folded)."""
        if lhs.type == rhs.type:
            x, y = int_value(lhs), int_value(rhs)
            if neutral is not None and y == neutral:
                return lhs
            if neutral is not None and commutative and x == neutral:
                return rhs
            if x is not None and y is not None and (value := fold(x, y)) is not None:
                return const(lhs.type, value)
        return op(self, lhs, rhs, name, flags)

    def add(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.add, lhs, rhs, name, flags, operator.add, 0, commutative=True)

    def sub(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.sub, lhs, rhs, name, flags, operator.sub, 0)

    def mul(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.mul, lhs, rhs, name, flags, operator.mul, 1, commutative=True)

    def sdiv(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.sdiv, lhs, rhs, name, flags, _truncating_div, 1)

    def srem(self, lhs, rhs, name="", flags=()):
        def rem(x, y):
            q = _truncating_div(x, y)
            return None if q is None else x - q * y
        return self._binop(ir.IRBuilder.srem, lhs, rhs, name, flags, rem)

    def and_(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.and_, lhs, rhs, name, flags, operator.and_)

    def or_(self, lhs, rhs, name="", flags=()):
        return self._binop(ir.IRBuilder.or_, lhs, rhs, name, flags, operator.or_)

    def icmp_signed(self, cmpop, lhs, rhs, name=""):
        x, y = int_value(lhs), int_value(rhs)
        if x is not None and y is not None and lhs.type == rhs.type and cmpop in _COMPARE:
            return ir.Constant(I1, int(_COMPARE[cmpop](x, y)))
        return super().icmp_signed(cmpop, lhs, rhs, name)

    def select(self, cond, lhs, rhs, name="", flags=()):
        c = int_value(cond) if cond.type == I1 else None
        if c is not None:
            return lhs if c else rhs
        return super().select(cond, lhs, rhs, name, flags)

    def zext(self, value, typ, name=""):
        x = int_value(value)
        if x is not None and isinstance(typ, ir.IntType):
            return const(typ, x & ((1 << value.type.width) - 1))
        return super().zext(value, typ, name)

    def sext(self, value, typ, name=""):
        x = int_value(value)
        if x is not None and isinstance(typ, ir.IntType) and value.type.width > 1:
            return const(typ, x)
        return super().sext(value, typ, name)

    def trunc(self, value, typ, name=""):
        x = int_value(value)
        if x is not None and isinstance(typ, ir.IntType):
            return const(typ, x)
        return super().trunc(value, typ, name)


def _truncating_div(x: int, y: int) -> int | None:
    """C's (and LLVM's ``sdiv``) quotient, rounded towards zero; None where it is undefined (y = 0)."""
    if y == 0:
        return None
    q = abs(x) // abs(y)
    return q if (x < 0) == (y < 0) else -q


_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}


def splat(b: ir.IRBuilder, value: ir.Value, lanes: int) -> ir.Value:
    """``<lanes x T>`` with every lane ``value`` (``insertelement`` + ``shufflevector``)."""
    if lanes == 1:
        return value
    vty = ir.VectorType(value.type, lanes)
    one = b.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(I32, 0))
    return b.shuffle_vector(one, ir.Constant(vty, ir.Undefined), ir.Constant(ir.VectorType(I32, lanes), [0] * lanes))


def _with_elem(ty: ir.Type, elem: ir.Type) -> ir.Type:
    return ir.VectorType(elem, ty.count) if isinstance(ty, ir.VectorType) else elem


def _elem(ty: ir.Type) -> ir.Type:
    return ty.element if isinstance(ty, ir.VectorType) else ty


def declare(module: ir.Module, name: str, fnty: ir.FunctionType) -> ir.Function:
    """The function ``name`` of ``module``, declared with ``fnty`` if not yet there."""
    existing = module.globals.get(name)
    if existing is not None:
        return existing
    return ir.Function(module, fnty, name)


def loop_unroll_metadata(module: ir.Module, count: int) -> ir.Value:
    """A loop ID for a loop's latch branch (``llvm.loop``) asking LLVM's loop unroller to unroll the loop
    ``count`` times (``llvm.loop.unroll.count``). A loop ID's first operand is the node itself, which
    ``Module.add_metadata`` cannot build: the node is made with a unique string in that place, which is
    then replaced by the node."""
    hint = module.add_metadata([ir.MetaDataString(module, "llvm.loop.unroll.count"), ir.Constant(I32, count)])
    node = module.add_metadata([ir.MetaDataString(module, f"polyc.loop.{len(module.metadata)}"), hint])
    node.operands = (node, hint)
    return node


def intrinsic(module: ir.Module, base: str, ty: ir.Type, nargs: int) -> ir.Function:
    """``llvm.<base>.<f32|f64|vNf32|vNf64>`` taking ``nargs`` values of ``ty`` and returning ``ty``.

    Raises CompileError for an integer ``ty`` (sema converts the arguments of float builtins: a polyc bug)."""
    if not isinstance(_elem(ty), (ir.FloatType, ir.DoubleType)):
        raise CompileError(f"codegen: float intrinsic llvm.{base} on {ty}")
    elem = "f32" if isinstance(_elem(ty), ir.FloatType) else "f64"
    suffix = f"v{ty.count}{elem}" if isinstance(ty, ir.VectorType) else elem
    return declare(module, f"llvm.{base}.{suffix}", ir.FunctionType(ty, [ty] * nargs))


def freeze(b: ir.IRBuilder, value: ir.Value) -> ir.Value:
    """LLVM's ``freeze``: poison (e.g. from an out-of-range ``fptosi``) becomes some fixed value."""
    instr = ir.instructions.Instruction(b.block, value.type, "freeze", [value])
    b._insert(instr)  # llvmlite has no builder method for freeze
    return instr
