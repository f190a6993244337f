"""Converters of the comparison, logical, selection and integer ops: Where, Expand, And/Or/Xor/Not, Equal,
Less(OrEqual), Greater(OrEqual), IsNaN, IsInf, Mod, BitShift, BitwiseAnd/Or/Xor/Not.

All are elementwise with numpy (multidirectional) broadcasting, so each is a lazy value: ``Where`` is the
language's ``c ? x : y``, a comparison its ``<`` ... ``==`` (a bool result), the logical ops ``&&``, ``||``,
``!=`` and ``!`` on bools. Expand is a broadcast read of its input at the output's index (its ``shape`` input
must be a compile-time constant). Semantics follow the ONNX operator specification (onnx/docs/Operators.md).
"""
from __future__ import annotations

import numpy as np

from ..builder import Builder, broadcast_index, lazy, lit
from .common import attr, nary, unary


def _nary_simple(op_fn):
    """:func:`~.common.nary` whose inputs are first made cheap to repeat (``op_fn`` may use a term twice)."""
    def convert(b: Builder, node):
        shape, dtype = b.out_shape(node), b.out_dtype(node)
        vals = [b.simple(b.input(node, k)) for k in range(len(node["inputs"])) if node["inputs"][k]]

        def text(idx):
            return op_fn([v.at(broadcast_index(v, shape, idx)) for v in vals], dtype, node)
        return [lazy(shape, dtype, text)]
    return convert


def _binary(op: str):
    return nary(lambda ts, t, n: f"({ts[0]} {op} {ts[1]})")


# ---- selection and broadcast -------------------------------------------------------------------------------

where = nary(lambda ts, t, n: f"({ts[0]} ? {ts[1]} : {ts[2]})")
where.__doc__ = """Where(condition, X, Y): ``condition ? X : Y`` with the three inputs broadcast together."""


def expand(b: Builder, node):
    """Expand(input, shape): ``input`` broadcast (numpy rules) with ``shape``; ``shape`` must be constant."""
    b.const_input(node, 1, "shape")
    x = b.input(node, 0)
    shape, dtype = b.out_shape(node), b.out_dtype(node)
    return [lazy(shape, dtype, lambda idx: x.at(broadcast_index(x, shape, idx)),
                 cheap=x.cheap or x.tensor is not None)]


# ---- comparison and logic ----------------------------------------------------------------------------------

equal = _binary("==")
less = _binary("<")
less_or_equal = _binary("<=")
greater = _binary(">")
greater_or_equal = _binary(">=")
and_ = _binary("&&")
or_ = _binary("||")
xor = _binary("!=")  # on bools, exclusive or
not_ = unary(lambda e, n, t: f"(!{e})")
is_nan = unary(lambda e, n, t: f"({e} != {e})", simple=True)


def is_inf(b: Builder, node):
    """IsInf(X) -> bool: ``|x|`` above the largest finite value of X's dtype; ``detect_positive`` and
    ``detect_negative`` (both 1 by default) pick the signs counted."""
    x = b.simple(b.input(node, 0))
    big = lit(np.finfo(x.dtype).max, x.dtype)
    pos, neg = attr(node, "detect_positive", 1), attr(node, "detect_negative", 1)

    def text(idx):
        e = x.at(idx)
        if pos and neg:
            return f"(fabs({e}) > {big})"
        if pos:
            return f"({e} > {big})"
        if neg:
            return f"({e} < (-{big}))"
        return f"({e} != {e} && {e} == {e})"  # neither sign: always false
    return [lazy(x.shape, b.out_dtype(node), text)]


# ---- integer arithmetic ------------------------------------------------------------------------------------

def _mod_text(ts, t, node):
    """Mod: ``fmod=0`` the sign of the divisor (the language's ``%``, numpy's ``mod``; also for floats),
    ``fmod=1`` the sign of the dividend (C's ``fmod``/``%``): floats through the ``fmod`` builtin, signed
    integers by moving a floor remainder whose sign differs from the dividend's back by the divisor."""
    a, c = ts
    kind = np.dtype(t).kind
    if not attr(node, "fmod", 0) or kind == "u":
        return f"({a} % {c})"
    if kind == "f":
        return f"fmod({a}, {c})"
    r = f"({a} % {c})"
    return f"(({r} != 0 && (({r} < 0) != ({a} < 0))) ? {r} - {c} : {r})"


mod = _nary_simple(_mod_text)


def _shift_text(ts, t, node):
    """BitShift: ``direction`` LEFT or RIGHT; shifts by the width or more give 0, as numpy's."""
    return f"{'shl' if attr(node, 'direction') == 'LEFT' else 'shr'}({ts[0]}, {ts[1]})"


bit_shift = nary(_shift_text)
bitwise_and = nary(lambda ts, t, n: f"bitand({ts[0]}, {ts[1]})")
bitwise_or = nary(lambda ts, t, n: f"bitor({ts[0]}, {ts[1]})")
bitwise_xor = nary(lambda ts, t, n: f"bitxor({ts[0]}, {ts[1]})")
bitwise_not = unary(lambda e, n, t: f"bitnot({e})")


#: op -> ((since_version, converter), ...), oldest first.
CONVERTERS = {
    "Where": ((9, where),), "Expand": ((8, expand),),
    "And": ((7, and_),), "Or": ((7, or_),), "Xor": ((7, xor),), "Not": ((1, not_),),
    "Equal": ((7, equal),), "Less": ((7, less),), "LessOrEqual": ((12, less_or_equal),),
    "Greater": ((7, greater),), "GreaterOrEqual": ((12, greater_or_equal),),
    "IsNaN": ((9, is_nan),), "IsInf": ((10, is_inf),),
    "Mod": ((10, mod),), "BitShift": ((11, bit_shift),),
    "BitwiseAnd": ((18, bitwise_and),), "BitwiseOr": ((18, bitwise_or),), "BitwiseXor": ((18, bitwise_xor),),
    "BitwiseNot": ((18, bitwise_not),),
}

#: Every attribute ONNX defines for the op (opsets 7..newest).
KNOWN_ATTRS = {
    "IsInf": {"detect_negative", "detect_positive"}, "Mod": {"fmod"}, "BitShift": {"direction"},
}

#: Attribute values polyc does not handle (none: every value the spec allows is lowered).
SUPPORTED_VALUES = {
    "BitShift": {"direction": lambda v: (v.decode() if isinstance(v, bytes) else v) in ("LEFT", "RIGHT")},
    "Mod": {"fmod": lambda v: v in (0, 1)},
}

#: Inputs that must be compile-time constants.
CONSTANT_INPUTS = {"Expand": ((1, 8, "shape"),)}
