"""The code generator's folding IR builder (:class:`polyc.codegen.irbase.Builder`): every fold gives the value
LLVM computes for the same instruction, and what it folds away (constant trip counts, remainder loops of
constant bounds) leaves kernels computing what numpy does."""
import ctypes
import re

import numpy as np
import pytest
from llvmlite import ir

import polyc
from polyc.codegen import compile_module, host_target, new_module
from polyc.codegen.irbase import Builder, int_value
from targets import RUNNABLE_CPUS

TARGET = host_target()
I64 = ir.IntType(64)
BINARY = ("add", "sub", "mul", "sdiv", "srem", "and_", "or_")
COMPARE = ("==", "!=", "<", "<=", ">", ">=")
WIDTHS = (1, 8, 32, 64)


def edge_values(width):
    """Values of a ``width``-bit signed integer that exercise wrap-around, signs and rounding."""
    lo, hi = -(1 << (width - 1)), (1 << (width - 1)) - 1
    rng = np.random.default_rng(width)
    values = {lo, lo + 1, -7, -3, -2, -1, 0, 1, 2, 3, 7, hi - 1, hi,
              *(int(v) for v in rng.integers(lo, hi, size=6, endpoint=True))}
    return sorted(v for v in values if lo <= v <= hi)


@pytest.fixture(scope="module")
def llvm_ops():
    """``{(op, width): f(int64 a, int64 b) -> int64}``: the instruction on the arguments truncated to
    ``width`` bits, computed by LLVM at run time (never folded: the operands are the function's arguments),
    the result sign-extended (comparisons zero-extended)."""
    module = new_module(TARGET)
    names = {}
    for width in WIDTHS:
        ty = ir.IntType(width)
        for op in BINARY + COMPARE:
            name = f"f{len(names)}"
            fn = ir.Function(module, ir.FunctionType(I64, [I64, I64]), name)
            b = ir.IRBuilder(fn.append_basic_block())
            x, y = (b.trunc(a, ty) if width < 64 else a for a in fn.args)
            if op in COMPARE:
                b.ret(b.zext(b.icmp_signed(op, x, y), I64))
            else:
                value = getattr(b, op)(x, y)
                b.ret(b.sext(value, I64) if width < 64 else value)
            names[(op, width)] = name
    jit = compile_module(module, TARGET, opt_level=0)
    kind = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    return jit, {key: kind(jit.address(name)) for key, name in names.items()}


def _undefined(op, x, y, width):
    """LLVM's ``sdiv``/``srem`` are undefined for a zero divisor and for the overflowing MIN / -1."""
    return op in ("sdiv", "srem") and (y == 0 or (x == -(1 << (width - 1)) and y == -1))


@pytest.mark.parametrize("width", WIDTHS)
def test_folded_arithmetic_equals_what_llvm_computes(llvm_ops, width):
    _, ops = llvm_ops
    ty = ir.IntType(width)
    b = Builder(ir.Function(new_module(TARGET), ir.FunctionType(ir.VoidType(), []), "g").append_basic_block())
    checked = 0
    for op in BINARY + COMPARE:
        for x in edge_values(width):
            for y in edge_values(width):
                if _undefined(op, x, y, width):
                    continue
                lhs, rhs = ir.Constant(ty, x), ir.Constant(ty, y)
                folded = b.icmp_signed(op, lhs, rhs) if op in COMPARE else getattr(b, op)(lhs, rhs)
                assert isinstance(folded, ir.Constant), (op, x, y)
                got = int_value(folded)  # signed: an i1 true is -1, as LLVM's sext gives
                assert (got != 0 if op in COMPARE else got) == ops[(op, width)](x, y), (op, width, x, y)
                checked += 1
    assert checked > (20 if width == 1 else 1000)
    assert not b.block.instructions  # everything folded, nothing emitted


def test_division_by_zero_is_left_to_llvm():
    b = Builder(ir.Function(new_module(TARGET), ir.FunctionType(ir.VoidType(), []), "g").append_basic_block())
    for op in ("sdiv", "srem"):
        assert isinstance(getattr(b, op)(ir.Constant(I64, 5), ir.Constant(I64, 0)), ir.Instruction)


def test_identities_return_the_operand_and_selects_pick_a_side():
    fn = ir.Function(new_module(TARGET), ir.FunctionType(I64, [I64, I64]), "g")
    b = Builder(fn.append_basic_block())
    x, y = fn.args
    zero, one = ir.Constant(I64, 0), ir.Constant(I64, 1)
    assert b.add(x, zero) is x and b.add(zero, x) is x and b.sub(x, zero) is x
    assert b.mul(x, one) is x and b.mul(one, x) is x and b.sdiv(x, one) is x
    assert b.select(ir.Constant(ir.IntType(1), 1), x, y) is x
    assert b.select(ir.Constant(ir.IntType(1), 0), x, y) is y
    assert not b.block.instructions
    assert isinstance(b.sub(zero, x), ir.Instruction)  # 0 - x is not x
    with pytest.raises(ValueError):  # a type mismatch is still llvmlite's error, not a silent fold
        b.add(x, ir.Constant(ir.IntType(32), 0))


def test_casts_of_constants_fold():
    b = Builder(ir.Function(new_module(TARGET), ir.FunctionType(ir.VoidType(), []), "g").append_basic_block())
    i8, i1 = ir.IntType(8), ir.IntType(1)
    assert int_value(b.zext(ir.Constant(i8, -1), I64)) == 255
    assert int_value(b.sext(ir.Constant(i8, -1), I64)) == -1
    assert int_value(b.zext(ir.Constant(i1, 1), I64)) == 1
    assert int_value(b.trunc(ir.Constant(I64, 511), i8)) == -1
    assert not b.block.instructions


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
def test_guarded_vector_loops_of_constant_bounds_emit_only_the_widths_that_run(cpu, monkeypatch):
    """A GEMM whose reduction is split into blocks initialises its register tiles under ``if (c2 == 0)``:
    guarded vector loops keep their loop form (polyc.codegen.vector). With constant bounds the remainder
    is only the widths that run: N = 196 = 12 x 16 + 4 columns make full vectors and one 4-wide step, no
    8- or 2-wide loop and no scalar one (the builder folds the trip counts, so the empty loops are not
    emitted); the kernel computes numpy's product."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    kernel = polyc.define("def mm(float(M,K) A, float(K,N) B) -> (C) {\n    C(m,n) +=! A(m,k) * B(k,n)\n}",
                          options=polyc.Options(threads=1))
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((48, 348)).astype(np.float32), rng.standard_normal((348, 196)).astype(np.float32)
    compiled = kernel.specialize(a, b)
    assert "if (c2 == 0)" in compiled.stage("ast")  # the guarded init this test is about
    lanes = host_target().vector_bits // 32
    text = compiled.stage("llvm")
    assert set(re.findall(r"store <(\d+) x float>", text)) == {str(lanes), "4"}
    assert not re.search(r"store float ", text)
    np.testing.assert_allclose(compiled(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
