"""numpy ``einsum`` subscripts → TC source text.

    >>> text, name = einsum_source("ij,jk->ik", [(2, 3), (3, 4)], ["float32", "float32"])
    >>> print(text, end="")
    def einsum_ij_jk_to_ik(float32(N_i, N_j) in0, float32(N_j, N_k) in1) -> (float32(N_i, N_k) out) {
        out(i, k) +=! in0(i, j) * in1(j, k)
    }

The letter rules are numpy's: without ``->`` the output is the letters that appear exactly once, sorted
(upper case before lower case); a letter repeated within one operand takes that operand's diagonal; a letter
that is not in the output is summed (``+=!``; ``max=!`` — logical or — for bool, as numpy does); a dimension
of extent 1 broadcasts against the letter's extent elsewhere (it is read at index 0). Operands whose dtype
differs from the result (``np.result_type`` of the operands) are cast to it. Ellipsis (``...``) is not
supported. A float16 or bfloat16 result is summed in a float32 temporary ``acc`` and rounded once at the end
(``out(i) = half(acc(i))``); bfloat16 promotes as float16 does, and the two together give float32.
"""
from __future__ import annotations

import numpy as np

from ..errors import PolycError, ShapeError, UnsupportedError
from . import ast as A


def einsum_source(subscripts: str, shapes: list, dtypes: list) -> tuple[str, str]:
    """The TC text of ``np.einsum(subscripts, *operands)`` for operands of these shapes and dtypes.

    Returns ``(source, def name)``. Raises :class:`PolycError` for a malformed subscript string,
    :class:`ShapeError` when the shapes do not fit it and :class:`UnsupportedError` for ``...`` or a dtype
    outside the language (complex, float8, ...).
    """
    inputs, output = parse_subscripts(subscripts, len(shapes))
    if len(dtypes) != len(shapes):
        raise PolycError(f"einsum got {len(shapes)} shapes but {len(dtypes)} dtypes",
                         hint="give one dtype per operand")
    try:
        shapes = [tuple(int(n) for n in s) for s in shapes]
    except (TypeError, ValueError) as e:
        raise ShapeError(f"einsum shapes must be tuples of integers, got {shapes!r}") from e
    names = [canonical_dtype(d) for d in dtypes]
    extents = letter_extents(subscripts, inputs, shapes)
    result = _result_dtype(names)
    name = "einsum_" + "_".join(inputs) + "_to_" + output
    params = ", ".join(_param(subs, shape, dtype, extents, k)
                       for k, (subs, shape, dtype) in enumerate(zip(inputs, shapes, names)))
    out_dims = "(" + ", ".join(f"N_{c}" for c in output) + ")" if output else ""
    summed = any(c not in output for s in inputs for c in s)
    op = ("max=!" if result == "bool" else "+=!") if summed else "="
    reads = [_read(subs, shape, dtype, result, extents, k)
             for k, (subs, shape, dtype) in enumerate(zip(inputs, shapes, names))]
    rhs = (" && " if result == "bool" else " * ").join(reads) if reads else "1"
    lhs = f"out({', '.join(output)})"
    if result in A.STORAGE_DTYPES and summed:
        acc = f"acc({', '.join(output)})"
        body = f"{acc} {op} {rhs}\n    {lhs} = {result}({acc})"
    elif result in A.STORAGE_DTYPES and len(reads) > 1:
        body = f"{lhs} = {result}({rhs})"
    else:
        body = f"{lhs} {op} {rhs}"
    text = f"def {name}({params}) -> ({result}{out_dims} out) {{\n    {body}\n}}\n"
    return text, name


def _result_dtype(names: list) -> str:
    """``np.result_type`` of the operands' dtypes, bfloat16 promoting as float16 (with float16: float32)."""
    if not names:
        return "float32"
    result = np.result_type(*[np.dtype("float16" if d == "bfloat16" else d) for d in names]).name
    storage = {d for d in names if d in A.STORAGE_DTYPES}
    if result == "float16" and "bfloat16" in storage:
        return "bfloat16" if storage == {"bfloat16"} else "float32"
    return result


def parse_subscripts(subscripts: str, n_operands: int) -> tuple[list[str], str]:
    """``(input subscripts, output subscript)``; the output follows numpy's implicit rule when ``->`` is absent."""
    text = "".join(subscripts.split())
    if "." in text:
        if "..." in text:
            raise UnsupportedError(f"einsum ellipsis ('...') broadcasting is not supported: {subscripts!r}",
                                   hint="spell out every dimension with a letter")
        raise PolycError(f"einsum subscripts {subscripts!r} contain a '.' outside an ellipsis",
                         hint="subscripts are letters, ',' between operands and '->' before the output")
    if text.count("->") > 1:
        raise PolycError(f"einsum subscripts {subscripts!r} contain more than one '->'",
                         hint="write 'ij,jk->ik'")
    lhs, arrow, out = text.partition("->")
    for c in lhs + out:
        if not (c.isascii() and c.isalpha()) and c != ",":
            raise PolycError(f"einsum subscripts {subscripts!r} contain the invalid character {c!r}",
                             hint="subscripts are letters a-z and A-Z, ',' between operands and '->' before the output")
    if "," in out:
        raise PolycError(f"einsum subscripts {subscripts!r} have a ',' in the output",
                         hint="the output is one subscript, e.g. '->ik'")
    inputs = lhs.split(",")
    if len(inputs) != n_operands:
        raise PolycError(f"einsum subscripts {subscripts!r} name {len(inputs)} operands but {n_operands} were given",
                         hint="give one subscript per operand, separated by ','")
    letters = "".join(inputs)
    if not arrow:
        out = "".join(sorted(c for c in set(letters) if letters.count(c) == 1))
    for c in out:
        if out.count(c) > 1:
            raise PolycError(f"einsum output subscript {out!r} repeats the letter '{c}'",
                             hint="each output letter appears once")
        if c not in letters:
            raise PolycError(f"einsum output letter '{c}' does not appear in any input",
                             hint="output letters must come from the input subscripts")
    return inputs, out


def canonical_dtype(dtype) -> str:
    """The language's name for a numpy dtype (``ml_dtypes.bfloat16`` is bfloat16); complex types, float8 and
    the other ml_dtypes are not supported."""
    try:
        name = "bfloat16" if isinstance(dtype, str) and dtype == "bfloat16" else np.dtype(dtype).name
    except TypeError as e:
        raise PolycError(f"einsum got the unknown dtype {dtype!r}", hint="use a numpy dtype such as 'float32'") from e
    if name not in A.DTYPES:
        raise UnsupportedError(f"{name} is not supported yet", hint="use float32, float64, float16 or bfloat16")
    return name


def letter_extents(subscripts: str, inputs: list, shapes: list) -> dict:
    """Each letter's extent; every operand's rank must match its subscript; extent 1 broadcasts."""
    extents: dict = {}
    for k, (subs, shape) in enumerate(zip(inputs, shapes)):
        if len(subs) != len(shape):
            raise ShapeError(f"einsum operand {k} has rank {len(shape)} but its subscript '{subs}' has "
                             f"{len(subs)} letters", hint=f"check the subscripts {subscripts!r}")
        for c, n in zip(subs, shape):
            seen = extents.get(c, 1)
            if n != seen and 1 not in (n, seen):
                raise ShapeError(f"einsum letter '{c}' has extent {seen} in one place and {n} in operand {k}",
                                 hint="a letter must have one extent (or 1, which broadcasts)")
            extents[c] = max(seen, n)
    return extents


def _broadcast(c: str, n: int, extents: dict) -> bool:
    return n == 1 and extents[c] != 1


def _param(subs: str, shape: tuple, dtype: str, extents: dict, k: int) -> str:
    dims = ", ".join("1" if _broadcast(c, n, extents) else f"N_{c}" for c, n in zip(subs, shape))
    return f"{dtype}({dims}) in{k}" if subs else f"{dtype} in{k}"


def _read(subs: str, shape: tuple, dtype: str, result: str, extents: dict, k: int) -> str:
    args = ", ".join("0" if _broadcast(c, n, extents) else c for c, n in zip(subs, shape))
    read = f"in{k}({args})" if subs else f"in{k}"
    return read if dtype == result else f"{result}({read})"
