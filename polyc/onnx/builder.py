"""What the converters write TC text with: tensor values and the builder of one def.

Every tensor value inside a def is a :class:`Val`: a function from index texts to expression text. Elementwise
ops build values lazily (so ``Conv -> Add(bias) -> Relu`` becomes one expression over the convolution's
tensor); reductions, anchors and data movement write tensors with a statement (:meth:`Builder.emit`). The
helpers spell dtypes, literals and indices the way every def spells them.

float16 and bfloat16 tensors are the language's storage types (``half``, ``bfloat16``): a node computes in
float32 (its temporaries are float32, so reductions accumulate in float32) and its float16/bfloat16 output is
rounded once (:func:`rounded`, ``half(...)`` around the node's expression), as numpy computes a float16 ufunc;
the rounded values stay lazy, so fusion is unchanged. Inside a converter a bfloat16 value looks like a float32
one (:func:`value_dtype`: numpy calls ml_dtypes' bfloat16 kind ``V``).

:mod:`polyc.onnx.lower` drives a :class:`Builder` over a fusion group; the converters of :mod:`polyc.onnx.ops`
call its methods.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx
import numpy as np

from ..errors import UnsupportedError
from .fusion import Group


def tc_type(dtype) -> str:
    """The TC spelling of a numpy dtype (``float`` for float32, ``double`` for float64, ``half`` for float16,
    ``bfloat16`` for ml_dtypes' bfloat16)."""
    name = np.dtype(dtype).name
    if name == "float32":
        return "float"
    if name == "float64":
        return "double"
    if name == "float16":
        return "half"
    if name in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bfloat16"):
        return name
    raise UnsupportedError(f"dtype {name} is not supported by polyc kernels")


#: The storage types (TC ``half`` and ``bfloat16``): stored in 2 bytes, computed in float32.
STORAGE = ("float16", "bfloat16")


def value_dtype(dtype) -> np.dtype:
    """The dtype a converter sees for a tensor of ``dtype``: float32 for bfloat16 (its values compute as
    float32, and numpy's kind of ml_dtypes' bfloat16 is ``V``), else ``dtype``."""
    dtype = np.dtype(dtype)
    return np.dtype(np.float32) if dtype.name == "bfloat16" else dtype


def lit(value, dtype=np.float32) -> str:
    """A literal for ``value``: positional float text (``0.02``, ``(-1.5)``) or an int, parenthesised if negative.

    A float literal computes as float32 next to a float16/bfloat16 value, so it is written as one (an
    infinity as float32's largest value, which rounds to infinity when stored in 2 bytes)."""
    dtype = np.dtype(dtype)
    if dtype.name in STORAGE:
        dtype, value = np.dtype(np.float32), float(value)
    if dtype.kind == "f":
        v = np.float32(value) if dtype == np.float32 else np.float64(value)
        if np.isinf(v):
            v = np.finfo(dtype).max * np.sign(v)
        text = np.format_float_positional(v, unique=True, trim="0")
    elif dtype.kind == "b":
        text = "1" if value else "0"
    else:
        text = str(int(value))
    return f"({text})" if text.startswith("-") else text


def times(k: int, expr: str) -> str:
    """Index text for ``k*expr`` (``k`` a positive int), constant first as in ``2*i2``."""
    return expr if k == 1 else f"{k}*{expr}"


@dataclass(frozen=True)
class Val:
    """A tensor value inside a def: ``at(index_texts) -> expression text``.

    ``tensor`` is the TC name when the value is stored (a parameter or a written tensor); ``cheap`` says the
    expression may be repeated in a formula without redoing much work.
    """

    shape: tuple
    dtype: np.dtype
    at: Callable
    tensor: str | None = None
    cheap: bool = True


@dataclass
class _Stmt:
    lhs: str
    text: str


class Builder:
    """Collects parameters and statements of one def; converters call its methods."""

    def __init__(self, g: nx.DiGraph, group: Group):
        self.g = g
        self.group = group
        self.opset = g.graph["opset"]
        self.consts = g.graph["constants"]
        self.tensors = g.graph["tensors"]
        self.params: list = []  # (tc name, onnx name, shape, dtype)
        self.extra_constants: dict = {}
        self.stmts: list[_Stmt] = []
        self.values: dict = {}
        self.temps = 0
        self.temp_dtypes: dict = {}  # temporary name -> dtype (an output only takes over one of its own dtype)
        self.node_id = ""
        self.node_op = ""

    # ---- values ----
    def error(self, message: str) -> UnsupportedError:
        return UnsupportedError(f"{message} on node {self.node_id} ({self.node_op}, opset {self.opset})")

    def value(self, name: str) -> Val:
        """The :class:`Val` of ONNX tensor ``name``: a computed value, an inlined scalar constant, or a parameter."""
        if name in self.values:
            return self.values[name]
        info = self.tensors.get(name)
        if name in self.consts and np.asarray(self.consts[name]).size == 1:
            arr = np.asarray(self.consts[name])
            text = lit(arr.reshape(-1)[0], arr.dtype)
            v = Val(tuple(arr.shape), value_dtype(arr.dtype), lambda idx, t=text: t)
        elif info is not None and info.shape is not None and 0 in info.shape:
            v = empty(info.shape, info.dtype)  # no element is ever read: no parameter
        else:
            info = self.tensors[name]
            v = self.add_param(name, info.shape, info.dtype)
        self.values[name] = v
        return v

    def add_param(self, onnx_name: str, shape, dtype, constant=None) -> Val:
        tc = f"X{len(self.params)}"
        self.params.append((tc, onnx_name, tuple(shape), np.dtype(dtype)))
        if constant is not None:
            self.extra_constants[onnx_name] = constant
        return self.tensor_val(tc, tuple(shape), dtype)

    def constant_table(self, array: np.ndarray, hint: str) -> Val:
        """A compile-time table (e.g. Resize source indices) passed as an extra kernel input."""
        name = f"__{self.group.name}_{hint}_{len(self.params)}"
        return self.add_param(name, array.shape, array.dtype, constant=array)

    @staticmethod
    def tensor_val(tc: str, shape: tuple, dtype) -> Val:
        dtype = value_dtype(dtype)
        if len(shape) == 0:
            return Val(shape, np.dtype(dtype), lambda idx, t=tc: t, tc)
        return Val(shape, np.dtype(dtype), lambda idx, t=tc: f"{t}({', '.join(idx)})", tc)

    def input(self, node: dict, k: int):
        """The Val of input ``k`` of ``node``, or None when absent."""
        names = node["inputs"]
        if k >= len(names) or not names[k]:
            return None
        return self.value(names[k])

    def const_input(self, node: dict, k: int, what: str):
        """The numpy value of input ``k`` (must be a compile-time constant), or None when absent."""
        names = node["inputs"]
        if k >= len(names) or not names[k]:
            return None
        if names[k] not in self.consts:
            raise self.error(f"input {what} ({names[k]!r}) must be a compile-time constant")
        return np.asarray(self.consts[names[k]])

    def out_shape(self, node: dict, k: int = 0) -> tuple:
        return self.tensors[node["outputs"][k]].shape

    def out_dtype(self, node: dict, k: int = 0):
        return value_dtype(self.tensors[node["outputs"][k]].dtype)

    # ---- statements ----
    def emit(self, shape, dtype, body: Callable, op: str = "=", reductions=(), name: str | None = None) -> Val:
        """Write a statement ``NAME(i..) op body(i.., r..)`` with ranges ``where i in 0:shape, r in 0:extent``.

        ``body`` gets the list of lhs index names and the list of reduction index names; ``name`` names the
        written tensor (a fresh temporary when None).
        """
        shape = tuple(shape)
        if 0 in shape:  # an empty domain: the statement would do nothing (TC ranges are not empty)
            return empty(shape, dtype)
        tc_shape = shape or (1,)
        if name is None:
            name = f"T{self.temps}"
            self.temps += 1
        idx = [f"i{k}" for k in range(len(tc_shape))]
        red = [f"r{k}" for k in range(len(reductions))]
        rhs = body(idx if shape else [], red)
        ranges = [f"{i} in 0:{n}" for i, n in zip(idx, tc_shape)] + [f"{r} in 0:{n}" for r, n in zip(red, reductions)]
        text = f"{name}({', '.join(idx)}) {op} {rhs}\n        where {', '.join(ranges)}"
        self.stmts.append(_Stmt(name, text))
        self.temp_dtypes.setdefault(name, np.dtype(dtype))
        v = self.tensor_val(name, tc_shape, dtype)
        if not shape:  # a 0-d value stored with shape (1,)
            v = Val((), np.dtype(dtype), lambda _idx, t=name: f"{t}(0)", name)
        return v

    def materialize(self, v: Val, name: str | None = None) -> Val:
        """``v`` as a stored tensor (writes a statement unless it already is one and no name is asked)."""
        if v.tensor is not None and name is None:
            return v
        return self.emit(v.shape, v.dtype, lambda idx, red: v.at(idx), name=name)

    def simple(self, v: Val) -> Val:
        """``v`` if it is cheap to repeat in a formula, else ``v`` stored in a temporary."""
        return v if v.cheap or v.tensor is not None else self.materialize(v)


def broadcast_index(v: Val, out_shape: tuple, idx: list) -> list:
    """Index texts reading ``v`` (numpy-broadcast to ``out_shape``) at output index ``idx``."""
    r = len(v.shape)
    tail = idx[len(idx) - r:] if r else []
    return ["0" if d == 1 and n != 1 else i for i, d, n in zip(tail, v.shape, out_shape[len(out_shape) - r:])]


def empty(shape, dtype) -> Val:
    """The value of a tensor with a 0 extent: nothing reads an element of it (every loop over it is empty)."""
    return Val(tuple(shape), np.dtype(dtype), lambda idx: lit(0, dtype), None, True)


def lazy(shape, dtype, fn: Callable, cheap: bool = False) -> Val:
    """An unstored value computed by ``fn(idx)``."""
    return Val(tuple(shape), np.dtype(dtype), fn, None, cheap)


def rounded(v: Val, dtype) -> Val:
    """The output ``v`` of a node whose ONNX type is ``dtype``: for float16/bfloat16 rounded to it (lazily,
    ``half(...)``), unless it is read from a kernel parameter (already of that type); else ``v``."""
    if dtype is None or np.dtype(dtype).name not in STORAGE or (v.tensor or "").startswith("X"):
        return v
    t = tc_type(dtype)
    return Val(v.shape, value_dtype(dtype), lambda idx: f"{t}({v.at(idx)})", None, v.cheap or v.tensor is not None)
