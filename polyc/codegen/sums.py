"""Compensated sums: long float ``+=`` reductions summed in blocks, each block folded into the element with more
precision than the element has.

A float ``+=`` reduction of more than :data:`SUM_BLOCK` terms per element (:func:`compensated`) accumulates
partial sums of at most that many terms; :func:`fold_sum` adds each partial to the element through a shadow
buffer that keeps the running sum exactly enough that the error stays about one rounding. A scalar loop that
is one such sum is blocked by :func:`emit_blocked_reduction`; a vector loop's reduction
(:func:`polyc.codegen.vector.emit_vector_reduction`) folds its accumulators with :func:`fold_sum` too.
"""
from __future__ import annotations

import islpy as isl
from llvmlite import ir

from ..lang import ast as L
from ..poly.scop import PolyStatement
from . import expr as X
from .region import (KernelEmitter, Region, call_strides, emit_isl_expr, emit_loop, emit_trip_count, loop_bounds,
                     user_nodes, walk, with_id)

I32, I64 = X.I32, X.I64


#: Float ``+=`` reductions of at least this many terms per element accumulate in register partials of at most
#: this many terms (numpy's pairwise block: 128) that are added to the element with :func:`fold_sum`.
SUM_BLOCK = 128


def compensated(k: KernelEmitter, stmt: PolyStatement) -> bool:
    """Whether ``stmt`` is a float ``+=`` reduction long enough (more than :data:`SUM_BLOCK` terms per element,
    from the Scop's index ranges) to be summed in blocks with :func:`fold_sum`."""
    if stmt.op != "+=" or k.scop.tensor(stmt.tensor).dtype not in ("float32", "float64"):
        return False
    terms = 1
    for index in stmt.indices:
        if index not in stmt.lhs:
            lo, hi = k.scop.ranges.get((stmt.name, index), (0, 0))
            terms *= max(0, hi - lo)
    return terms > SUM_BLOCK


def fold_sum(k: KernelEmitter, r: Region, tensor: str, flat: ir.Value, partial: ir.Value, b: ir.IRBuilder) -> None:
    """``tensor[flat] += partial``, where the running sum keeps more precision than the element.

    A long reduction adds many block partials (register sums of at most :data:`SUM_BLOCK` terms, or a vector
    reduction's fold) to one element; added plainly, the error grows with the number of partials. Here the
    element's shadow (8 bytes per element of the tensor, ``KernelEmitter.shadow``) keeps the running sum in more
    precision, and the element holds it rounded. For float32 the shadow is a double ``s``::

        if ((float)s != T) s = T;      // T was written by anything else (init, plain update, NaN): restart
        s += (double)x;  T = (float)s;

    For float64 it is Neumaier's compensated sum (Kahan's variant that also holds when ``|x| > |s|``): the
    running sum ``s`` and the rounding error ``c`` lost so far, with ``T = s + c``::

        if (s + c != T) { s = T; c = 0; }
        t = s + x;  c += |s| >= |x| ? (s - t) + x : (x - t) + s;  s = t;  T = s + c   // c kept if t is inf

    Either way the element's error stays about one rounding whatever the number of partials, and the
    shadow needs no initialisation beyond zero (the check restarts it from the element).
    """
    dtype = k.scop.tensor(tensor).dtype
    ty = X.llvm_type(dtype)
    env = X.Env(k.module, k.scop, r.tensors, {}, r.fail, **k.env_args(r))
    element = X.element_pointer(env, tensor, flat, b)
    old = b.load(element, typ=ty)
    base = k.shadow(r, tensor, b)
    if dtype == "float32":
        wide = ir.DoubleType()
        s_ptr = b.gep(base, [b.mul(flat, ir.Constant(I64, 2))], inbounds=True, source_etype=wide)
        copy_ptr = b.gep(s_ptr, [ir.Constant(I64, 1)], inbounds=True, source_etype=wide)
        s, copy = b.load(s_ptr, typ=wide), b.load(copy_ptr, typ=I32)
        x = b.fpext(partial, wide)
        # both sums, then the choice (bits of T against those last stored): the check stays off the chain
        # of dependent adds through s
        valid = b.icmp_unsigned("==", b.bitcast(old, I32), copy)
        s = b.select(valid, b.fadd(s, x), b.fadd(b.fpext(old, wide), x))
        result = b.fptrunc(s, ty)
        b.store(s, s_ptr)
        b.store(b.bitcast(result, I32), copy_ptr)
        b.store(result, element)
        return
    s_ptr = b.gep(base, [b.mul(flat, ir.Constant(I64, 2))], inbounds=True, source_etype=ty)
    c_ptr = b.gep(s_ptr, [ir.Constant(I64, 1)], inbounds=True, source_etype=ty)
    s, c = b.load(s_ptr, typ=ty), b.load(c_ptr, typ=ty)
    valid = b.fcmp_ordered("==", b.fadd(s, c), old)
    s, c = b.select(valid, s, old), b.select(valid, c, ir.Constant(ty, 0.0))
    t = b.fadd(s, partial)
    fabs = X.intrinsic(k.module, "fabs", ty, 1)
    s_big = b.fcmp_ordered(">=", b.call(fabs, [s]), b.call(fabs, [partial]))
    error = b.select(s_big, b.fadd(b.fsub(s, t), partial), b.fadd(b.fsub(partial, t), s))
    finite = b.fcmp_ordered("!=", b.call(fabs, [t]), ir.Constant(ty, float("inf")))
    c = b.select(finite, b.fadd(c, error), c)
    b.store(t, s_ptr)
    b.store(c, c_ptr)
    b.store(b.fadd(t, c), element)


# ---- scalar reductions into one element ----

def blocked_reduction_plan(k: KernelEmitter, node: isl.AstNode):
    """The user node of a loop that is one compensated sum (:func:`compensated`) into
    an element that stays put along the loop, not reading the reduced tensor; else None."""
    bounds = loop_bounds(node)
    users = user_nodes(node.for_get_body())
    if bounds is None or not users or len(users) != 1:
        return None
    found = call_strides(k, users[0], node.for_get_iterator().get_id().name)
    if found is None or not compensated(k, found[0]):
        return None
    stmt, strides = found
    lhs = [L.Ident(i, dtype="int32", kind="index") for i in stmt.lhs]
    if X.flat_stride(k.scop, stmt.tensor, lhs, strides) != 0:
        return None
    if any(isinstance(e, L.Access) and e.tensor == stmt.tensor for e in walk(stmt.rhs)):
        return None
    return users[0]


def emit_blocked_reduction(k: KernelEmitter, r: Region, node: isl.AstNode, block: ir.Block,
                           user: isl.AstNode) -> ir.Block:
    """A scalar sum into one element (:func:`blocked_reduction_plan`) in blocks of at most
    :data:`SUM_BLOCK` iterations, each summed in a register and added with
    :func:`fold_sum`::

        for (cb = lo; cb <= hi; cb += B * step) {
            p = 0
            for (c = cb; c <= min(hi, cb + (B - 1) * step); c += step)   p += rhs(c)
            fold_sum(T[...], p)
        }

    The error is that of a sum of ``B`` terms plus about one rounding, instead of growing with the loop."""
    call = user.user_get_expr()
    stmt = k.statements[call.get_op_arg(0).get_id().name]
    dtype = k.scop.tensor(stmt.tensor).dtype
    ty = X.llvm_type(dtype)
    it = node.for_get_iterator().get_id().name
    b = X.Builder(block)
    bounds = loop_bounds(node)
    init, last, _ = emit_trip_count(r, bounds, b)
    step = ir.Constant(I64, bounds[2])
    value = r.alloca(ty, "partial")
    # the element's indices do not move along the loop: its flat index at the first iteration
    indices = with_id(r, it, init, lambda: {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), b)
                                            for n, i in enumerate(stmt.indices)})
    flat = X.flat_index(X.Env(k.module, k.scop, r.tensors, indices, r.fail, **k.env_args(r)), stmt.tensor,
                        [indices[i] for i in stmt.lhs], b)

    def term(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        indices = {i: emit_isl_expr(r.ids, call.get_op_arg(n + 1), bb) for n, i in enumerate(stmt.indices)}
        env = k.env(r, indices, stmt)
        bb.store(X.emit_update(env, "+=", dtype, stmt.rhs, bb.load(value, typ=ty), bb), value)
        return bb.block

    def blocked(blk: ir.Block) -> ir.Block:
        bb = X.Builder(blk)
        start = r.ids[f"{it}.block"]
        stop = bb.add(start, ir.Constant(I64, (SUM_BLOCK - 1) * bounds[2]))
        stop = bb.select(bb.icmp_signed("<", last, stop), last, stop)
        bb.store(ir.Constant(ty, 0.0), value)
        after = emit_loop(r, bb.block, it, start, lambda bx, iv: bx.icmp_signed("<=", iv, stop), step, term)
        bb = X.Builder(after)
        fold_sum(k, r, stmt.tensor, flat, bb.load(value, typ=ty), bb)
        return bb.block

    return emit_loop(r, b.block, f"{it}.block", init, lambda bb, iv: bb.icmp_signed("<=", iv, last),
                     ir.Constant(I64, SUM_BLOCK * bounds[2]), blocked)
