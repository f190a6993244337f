"""Indexing and reduction ops as one-node models, compiled by polyc and compared with onnxruntime (or onnx's
ReferenceEvaluator where onnxruntime lacks the op or opset), on shapes with extents 1 and odd primes and
across attribute and opset variants."""
import numpy as np
import onnx
import pytest
from onnx import helper
from onnx.reference import ReferenceEvaluator

import polyc.onnx
from polyc.errors import KernelRuntimeError, PolycError
from polyc.onnx import testing

import onnxruntime as ort  # noqa: E402  (a test dependency: a missing install must fail, not skip)

R = np.random.default_rng(7)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def ints(lo, hi, *shape, dtype=np.int64):
    return R.integers(lo, hi, shape).astype(dtype)


def i64(values):
    return np.array(values, dtype=np.int64)


def expected(model, inputs, oracle):
    if oracle == "ref":
        return ReferenceEvaluator(model).run(None, inputs)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)


def run_case(op, opset, attrs, node_inputs, inputs, consts, n_out=1, oracle="ort", rtol=1e-5, atol=1e-5):
    """Compile the one-node model and compare every output with the oracle (shapes, dtypes, values)."""
    outputs = [f"y{k}" for k in range(n_out)]
    node = helper.make_node(op, node_inputs, outputs, **attrs)
    model = testing.one_node_model(node, inputs, consts, opset)
    want = expected(model, inputs, oracle)
    got = polyc.onnx.compile(model).run(inputs)
    assert len(got) == len(want)
    for g, e in zip(got, want):
        e = np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, (g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# (id, op, opset, attrs, node input names, graph inputs, initializers[, oracle])
CASES = [
    # GatherElements: axis, negative and int32 indices, constant indices (a compile-time table)
    ("gather_elements_axis0", "GatherElements", 13, {"axis": 0}, ["x", "i"],
     {"x": f32(3, 5), "i": ints(-3, 3, 7, 5)}, {}),
    ("gather_elements_axis1_int32", "GatherElements", 11, {"axis": 1}, ["x", "i"],
     {"x": f32(1, 5, 7), "i": ints(-5, 5, 1, 3, 7, dtype=np.int32)}, {}),
    ("gather_elements_axis_neg_smaller", "GatherElements", 13, {"axis": -1}, ["x", "i"],
     {"x": f32(3, 5, 7), "i": ints(-7, 7, 2, 3, 11)}, {}),
    ("gather_elements_const", "GatherElements", 13, {"axis": 1}, ["x", "i"], {"x": f32(3, 5)},
     {"i": ints(-5, 5, 3, 2)}),
    # GatherND: batch_dims 0..2, full-depth and partial indices
    ("gather_nd_b0_partial", "GatherND", 11, {}, ["x", "i"], {"x": f32(3, 5, 7), "i": ints(-3, 3, 2, 1)}, {}),
    ("gather_nd_b0_full", "GatherND", 13, {}, ["x", "i"],
     {"x": f32(3, 5), "i": np.stack([ints(-3, 3, 7), ints(-5, 5, 7)], -1)}, {}),
    ("gather_nd_const", "GatherND", 13, {}, ["x", "i"], {"x": f32(3, 5, 7)}, {"i": i64([[[0, -1]], [[2, 3]]])}),
    ("gather_nd_b1", "GatherND", 12, {"batch_dims": 1}, ["x", "i"], {"x": f32(3, 5, 7), "i": ints(-5, 5, 3, 1, 1)}, {}),
    ("gather_nd_b2", "GatherND", 13, {"batch_dims": 2}, ["x", "i"],
     {"x": f32(3, 1, 5, 7), "i": ints(0, 5, 3, 1, 2, 1)}, {}),
    # ScatterElements / Scatter: every reduction, axes, opsets (duplicates only with a reduction)
    ("scatter_elements_none_axis0", "ScatterElements", 13, {"axis": 0}, ["x", "i", "u"],
     {"x": f32(5, 3), "i": np.array([[4, 0, -1], [1, 2, 3]], np.int64), "u": f32(2, 3)}, {}),
    ("scatter_elements_none_axis1_v11", "ScatterElements", 11, {"axis": 1}, ["x", "i", "u"],
     {"x": f32(3, 7), "i": np.array([[6], [0], [-7]], np.int64), "u": f32(3, 1)}, {}),
    ("scatter_elements_add", "ScatterElements", 16, {"axis": 1, "reduction": "add"}, ["x", "i", "u"],
     {"x": f32(3, 5, 7), "i": ints(-5, 5, 2, 4, 7), "u": f32(2, 4, 7)}, {}),
    ("scatter_elements_mul", "ScatterElements", 18, {"axis": -1, "reduction": "mul"}, ["x", "i", "u"],
     {"x": f32(3, 5), "i": ints(0, 5, 3, 7), "u": f32(3, 7)}, {}),
    ("scatter_elements_max", "ScatterElements", 18, {"axis": 0, "reduction": "max"}, ["x", "i", "u"],
     {"x": f32(5, 3), "i": ints(0, 5, 7, 3), "u": f32(7, 3)}, {}),
    ("scatter_elements_min_int32", "ScatterElements", 18, {"axis": 0, "reduction": "min"}, ["x", "i", "u"],
     {"x": ints(-9, 9, 5, 3, dtype=np.int32), "i": ints(0, 5, 7, 3), "u": ints(-9, 9, 7, 3, dtype=np.int32)}, {}),
    ("scatter_elements_const_indices", "ScatterElements", 13, {"axis": 1}, ["x", "i", "u"],
     {"x": f32(3, 7), "u": f32(2, 3)}, {"i": np.array([[6, 0, -2], [1, -7, 3]], np.int64)}),
    ("scatter_elements_const_add", "ScatterElements", 18, {"axis": 0, "reduction": "add"}, ["x", "i", "u"],
     {"x": f32(3, 5), "u": f32(2, 5)}, {"i": ints(-3, 3, 2, 5)}),
    ("scatter_v9", "Scatter", 9, {"axis": 1}, ["x", "i", "u"],
     {"x": f32(3, 5), "i": np.array([[1, 3], [0, 4], [2, 1]], np.int64), "u": f32(3, 2)}, {}),
    # ScatterND: partial and full-depth indices, every reduction
    ("scatter_nd_rows", "ScatterND", 11, {}, ["x", "i", "u"],
     {"x": f32(5, 3, 7), "i": np.array([[4], [0], [-3]], np.int64), "u": f32(3, 3, 7)}, {}),
    ("scatter_nd_elements", "ScatterND", 13, {}, ["x", "i", "u"],
     {"x": f32(3, 5), "i": np.array([[[0, 1], [2, -1]], [[1, 1], [-3, 3]]], np.int64), "u": f32(2, 2)}, {}),
    ("scatter_nd_single_slice", "ScatterND", 13, {}, ["x", "i", "u"],
     {"x": f32(3, 5, 7), "i": np.array([1, 4], np.int64), "u": f32(7)}, {}),
    ("scatter_nd_const_rows", "ScatterND", 13, {}, ["x", "i", "u"], {"x": f32(5, 3, 7), "u": f32(2, 3, 7)},
     {"i": np.array([[4], [-5]], np.int64)}),
    ("scatter_nd_const_elements", "ScatterND", 13, {}, ["x", "i", "u"], {"x": f32(3, 5), "u": f32(3)},
     {"i": np.array([[0, 4], [-1, -1], [1, 0]], np.int64)}),
    ("scatter_nd_const_single", "ScatterND", 13, {}, ["x", "i", "u"], {"x": f32(3, 5, 7), "u": f32(7)},
     {"i": np.array([2, 1], np.int64)}),
    ("scatter_nd_add", "ScatterND", 16, {"reduction": "add"}, ["x", "i", "u"],
     {"x": f32(5, 7), "i": np.array([[1], [3], [1]], np.int64), "u": f32(3, 7)}, {}),
    ("scatter_nd_mul", "ScatterND", 18, {"reduction": "mul"}, ["x", "i", "u"],
     {"x": f32(5, 7), "i": np.array([[1, 2], [1, 2], [4, 6]], np.int64), "u": f32(3)}, {}),
    ("scatter_nd_max", "ScatterND", 18, {"reduction": "max"}, ["x", "i", "u"],
     {"x": f32(5, 7), "i": np.array([[1], [3], [1]], np.int64), "u": f32(3, 7)}, {}),
    ("scatter_nd_min", "ScatterND", 18, {"reduction": "min"}, ["x", "i", "u"],
     {"x": f32(5, 7), "i": np.array([[1], [3], [1]], np.int64), "u": f32(3, 7)}, {}),
    # OneHot: axes, negative and out-of-range indices (a row of off values), float indices, opsets
    ("one_hot_last", "OneHot", 11, {}, ["i", "d", "v"], {"i": np.array([[0, -1, 4], [5, -6, 2]], np.int64)},
     {"d": np.array(5, np.int64), "v": np.array([-1.0, 3.0], np.float32)}),
    ("one_hot_axis0_v9", "OneHot", 9, {"axis": 0}, ["i", "d", "v"], {"i": np.array([1, 2, 0], np.int64)},
     {"d": np.array(3.0, np.float32), "v": np.array([0, 1], np.int64)}, {"oracle": "ref"}),
    ("one_hot_axis1_float_indices", "OneHot", 11, {"axis": 1}, ["i", "d", "v"],
     {"i": np.array([[1.0, 6.0], [-2.0, 0.0]], np.float32)}, {"d": np.array(7, np.int32),
                                                                 "v": np.array([2.0, 5.0], np.float32)},
     {"oracle": "ref"}),
    # ArgMax / ArgMin: keepdims, select_last_index with ties, integers, opsets
    ("argmax_keep", "ArgMax", 13, {"axis": 1}, ["x"], {"x": f32(3, 5, 7)}, {}),
    ("argmax_nokeep_last_ties", "ArgMax", 12, {"axis": -1, "keepdims": 0, "select_last_index": 1}, ["x"],
     {"x": np.round(f32(3, 11))}, {}),
    ("argmax_first_ties_v11", "ArgMax", 11, {"axis": 0}, ["x"], {"x": np.round(f32(5, 3))}, {}),
    ("argmin_int32", "ArgMin", 13, {"axis": 0, "keepdims": 0}, ["x"], {"x": ints(-3, 3, 7, 5, dtype=np.int32)}, {}),
    ("argmin_last_ties", "ArgMin", 13, {"axis": 2, "select_last_index": 1}, ["x"], {"x": np.round(f32(1, 3, 5))}, {}),
    # Hardmax: flatten-at-axis before 13, one axis from 13
    ("hardmax_v11_axis1", "Hardmax", 11, {"axis": 1}, ["x"], {"x": np.round(f32(3, 5, 7))}, {}),
    ("hardmax_v11_axis0", "Hardmax", 11, {"axis": 0}, ["x"], {"x": f32(3, 5)}, {}),
    ("hardmax_v13", "Hardmax", 13, {}, ["x"], {"x": np.round(f32(3, 1, 7))}, {}),
    ("hardmax_v13_axis0", "Hardmax", 13, {"axis": 0}, ["x"], {"x": np.round(f32(5, 3))}, {}),
    # TopK: k attribute (< 10) or constant input, largest, ties (lower index first)
    ("topk_v1", "TopK", 1, {"k": 2, "axis": 0}, ["x"], {"x": f32(5, 3)}, {}, {"n_out": 2}),
    ("topk_largest_ties", "TopK", 11, {}, ["x", "k"], {"x": np.round(f32(3, 7))}, {"k": i64([3])}, {"n_out": 2}),
    ("topk_smallest_axis1", "TopK", 11, {"axis": 1, "largest": 0}, ["x", "k"], {"x": np.round(f32(2, 7, 3))},
     {"k": i64([5])}, {"n_out": 2}),
    ("topk_int64", "TopK", 11, {}, ["x", "k"], {"x": ints(-5, 5, 11)}, {"k": i64([11])},
     {"n_out": 2, "oracle": "ref"}),
    # CumSum / CumProd: exclusive, reverse, negative axis, integers
    ("cumsum", "CumSum", 11, {}, ["x", "a"], {"x": f32(3, 5)}, {"a": i64(1)}),
    ("cumsum_excl", "CumSum", 14, {"exclusive": 1}, ["x", "a"], {"x": f32(7, 3)}, {"a": np.array(0, np.int32)}),
    ("cumsum_rev", "CumSum", 14, {"reverse": 1}, ["x", "a"], {"x": ints(-9, 9, 3, 5, dtype=np.int32)}, {"a": i64(-1)}),
    ("cumsum_excl_rev", "CumSum", 14, {"exclusive": 1, "reverse": 1}, ["x", "a"], {"x": f32(1, 7, 3)}, {"a": i64(1)}),
    ("cumsum_long_axis_rev", "CumSum", 14, {"reverse": 1}, ["x", "a"], {"x": f32(3, 10007)}, {"a": i64(1)},
     {"rtol": 1e-4, "atol": 1e-3}),
    ("cumprod_excl_rev", "CumProd", 26, {"exclusive": 1, "reverse": 1}, ["x", "a"], {"x": f32(3, 5)},
     {"a": i64(1)}, {"oracle": "ref"}),
    ("cumprod", "CumProd", 26, {}, ["x", "a"], {"x": f32(7, 3)}, {"a": i64(0)}, {"oracle": "ref"}),
    # Tile, Trilu, EyeLike
    ("tile", "Tile", 13, {}, ["x", "r"], {"x": f32(3, 1, 5)}, {"r": i64([2, 3, 1])}),
    ("tile_v6_int", "Tile", 6, {}, ["x", "r"], {"x": ints(0, 9, 1, 7)}, {"r": i64([5, 2])}),
    ("triu", "Trilu", 14, {}, ["x"], {"x": f32(5, 7)}, {}),
    ("triu_k_neg", "Trilu", 14, {}, ["x", "k"], {"x": f32(2, 7, 5)}, {"k": i64(-2)}),
    ("tril_k_pos", "Trilu", 14, {"upper": 0}, ["x", "k"], {"x": f32(7, 5)}, {"k": i64(3)}),
    ("tril_k_input", "Trilu", 14, {"upper": 0}, ["x", "k"], {"x": f32(3, 5, 7), "k": i64(-1)}, {}),
    ("eyelike", "EyeLike", 9, {}, ["x"], {"x": f32(5, 5)}, {}),
    ("eyelike_k_dtype", "EyeLike", 9, {"k": 2, "dtype": 6}, ["x"], {"x": f32(3, 7)}, {}),
    ("eyelike_k_neg_int", "EyeLike", 22, {"k": -1}, ["x"], {"x": ints(0, 3, 7, 3)}, {}, {"oracle": "ref"}),
    # DepthToSpace / SpaceToDepth
    ("depth_to_space_v1", "DepthToSpace", 1, {"blocksize": 2}, ["x"], {"x": f32(1, 12, 3, 5)}, {}),
    ("depth_to_space_dcr", "DepthToSpace", 13, {"blocksize": 3, "mode": "DCR"}, ["x"], {"x": f32(2, 9, 1, 3)}, {}),
    ("depth_to_space_crd", "DepthToSpace", 11, {"blocksize": 2, "mode": "CRD"}, ["x"], {"x": f32(1, 12, 5, 3)}, {}),
    ("space_to_depth", "SpaceToDepth", 13, {"blocksize": 2}, ["x"], {"x": f32(2, 3, 6, 10)}, {}),
    ("space_to_depth_b3", "SpaceToDepth", 1, {"blocksize": 3}, ["x"], {"x": f32(1, 5, 3, 9)}, {}),
    ("space_to_depth_crd_v28", "SpaceToDepth", 28, {"blocksize": 2, "mode": "CRD"}, ["x"], {"x": f32(1, 3, 4, 6)},
     {}, {"oracle": "ref"}),
    # ReverseSequence: time/batch axes
    ("reverse_sequence_time0", "ReverseSequence", 10, {}, ["x", "l"], {"x": f32(5, 3, 2), "l": i64([5, 1, 3])}, {}),
    ("reverse_sequence_time1", "ReverseSequence", 10, {"time_axis": 1, "batch_axis": 0}, ["x", "l"],
     {"x": f32(3, 7), "l": i64([7, 2, 1])}, {}),
    # Einsum: matmul, batch, transpose, trace, diagonal, sum, outer, implicit output, ellipsis, three operands
    ("einsum_matmul", "Einsum", 12, {"equation": "ij,jk->ik"}, ["a", "b"], {"a": f32(3, 5), "b": f32(5, 7)}, {}),
    ("einsum_batch", "Einsum", 12, {"equation": "bij,bjk->bik"}, ["a", "b"],
     {"a": f32(2, 3, 5), "b": f32(2, 5, 1)}, {}),
    ("einsum_transpose", "Einsum", 12, {"equation": "ijk->kji"}, ["a"], {"a": f32(3, 5, 7)}, {}),
    ("einsum_trace_implicit", "Einsum", 12, {"equation": "ii"}, ["a"], {"a": f32(5, 5)}, {}),
    ("einsum_diagonal", "Einsum", 12, {"equation": "ii->i"}, ["a"], {"a": f32(7, 7)}, {}),
    ("einsum_sum", "Einsum", 12, {"equation": "ij->"}, ["a"], {"a": f32(3, 5)}, {}),
    ("einsum_outer", "Einsum", 12, {"equation": "i,j->ij"}, ["a", "b"], {"a": f32(3), "b": f32(5)}, {}),
    ("einsum_implicit", "Einsum", 12, {"equation": "ba,ac"}, ["a", "b"], {"a": f32(3, 5), "b": f32(5, 7)}, {}),
    ("einsum_ellipsis_broadcast", "Einsum", 12, {"equation": "...ij,...jk->...ik"}, ["a", "b"],
     {"a": f32(2, 1, 3, 5), "b": f32(1, 7, 5, 3)}, {}),
    ("einsum_ellipsis_implicit", "Einsum", 12, {"equation": "...i, ...i"}, ["a", "b"],
     {"a": f32(3, 5), "b": f32(1, 5)}, {}),
    ("einsum_ellipsis_ort", "Einsum", 12, {"equation": "...ij,...jk"}, ["a", "b"],
     {"a": f32(2, 1, 3, 5), "b": f32(2, 7, 5, 3)}, {}),
    ("einsum_three", "Einsum", 12, {"equation": "ij,jk,kl->il"}, ["a", "b", "c"],
     {"a": f32(3, 5), "b": f32(5, 7), "c": f32(7, 1)}, {}),
    ("einsum_int", "Einsum", 12, {"equation": "ij,j->i"}, ["a", "b"],
     {"a": ints(-5, 5, 3, 7, dtype=np.int32), "b": ints(-5, 5, 7, dtype=np.int32)}, {}, {"oracle": "ref"}),
]

# the ReduceX ops: axes attribute (before 13/18) or constant input, keepdims, noop_with_empty_axes, integers
_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
           "ReduceLogSumExp", "ReduceSumSquare")
for _op in _REDUCE:
    _since = 13 if _op == "ReduceSum" else 18
    _x = (np.abs(f32(3, 5, 7)) + 0.5) if _op == "ReduceLogSum" else f32(3, 5, 7)
    CASES += [
        (f"{_op}_attr_axes", _op, _since - 2, {"axes": [0, 2], "keepdims": 0}, ["x"], {"x": _x}, {}),
        (f"{_op}_attr_all", _op, 11, {}, ["x"], {"x": _x[:1]}, {}),
        (f"{_op}_input_axes", _op, _since, {}, ["x", "a"], {"x": _x}, {"a": i64([-1])}),
        (f"{_op}_input_axes_nokeep", _op, _since, {"keepdims": 0}, ["x", "a"], {"x": _x}, {"a": i64([1, 0])}),
        (f"{_op}_no_axes", _op, _since, {"keepdims": 0}, ["x"], {"x": _x}, {}),
        (f"{_op}_noop", _op, _since, {"noop_with_empty_axes": 1}, ["x"], {"x": _x}, {}, {"oracle": "ref"}),
    ]
    if "Log" not in _op:
        CASES.append((f"{_op}_int32", _op, _since, {}, ["x", "a"], {"x": ints(-3, 4, 3, 5, 2, dtype=np.int32)},
                      {"a": i64([1])}))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_op(case):
    _, op, opset, attrs, names, inputs, consts, *rest = case
    kw = rest[0] if rest else {}
    run_case(op, opset, attrs, names, inputs, consts, **kw)


def _compile(op, opset, attrs, names, inputs, consts=None):
    node = helper.make_node(op, names, ["y"], **attrs)
    return polyc.onnx.compile(testing.one_node_model(node, inputs, consts or {}, opset))


@pytest.mark.parametrize("op,attrs,names,inputs,bad", [
    ("GatherElements", {"axis": 1}, ["x", "i"], {"x": f32(3, 5), "i": ints(0, 5, 3, 2)}, ("i", (1, 1), 5)),
    ("GatherElements", {"axis": 1}, ["x", "i"], {"x": f32(3, 5), "i": ints(0, 5, 3, 2)}, ("i", (2, 0), -6)),
    ("GatherND", {}, ["x", "i"], {"x": f32(3, 5), "i": ints(0, 3, 2, 1)}, ("i", (1, 0), 3)),
    ("ScatterElements", {"axis": 0}, ["x", "i", "u"], {"x": f32(3, 5), "i": ints(0, 3, 2, 5), "u": f32(2, 5)},
     ("i", (0, 4), 3)),
    ("ScatterElements", {"axis": 0, "reduction": "add"}, ["x", "i", "u"],
     {"x": f32(3, 5), "i": ints(0, 3, 2, 5), "u": f32(2, 5)}, ("i", (1, 2), -4)),
    ("ScatterND", {}, ["x", "i", "u"], {"x": f32(3, 5), "i": np.array([[0], [2]], np.int64), "u": f32(2, 5)},
     ("i", (1, 0), 7)),
])
def test_index_out_of_range_fails_cleanly(op, attrs, names, inputs, bad):
    """A data-dependent index outside ``[-n, n)`` makes the call fail with KernelRuntimeError (nothing is
    read or written out of bounds); the same kernel still runs on good indices afterwards."""
    k = _compile(op, 18, attrs, names, inputs)
    good = k.run(inputs)[0]
    name, at, value = bad
    broken = {n: a.copy() for n, a in inputs.items()}
    broken[name][at] = value
    with pytest.raises(KernelRuntimeError):
        k.run(broken)
    np.testing.assert_array_equal(k.run(inputs)[0], good)


def test_scatter_repeated_index_without_reduction_picks_an_update():
    """A repeated index with reduction ``none`` is undefined in the spec: polyc must not crash, and each
    written element holds one of the updates aimed at it (polyc takes the last)."""
    x, u = f32(5, 3), f32(4, 3)
    i = np.array([[1, 1, 1], [3, 1, 0], [1, 4, 1], [3, 1, 0]], np.int64)
    got = _compile("ScatterElements", 18, {"axis": 0}, ["x", "i", "u"], {"x": x, "i": i, "u": u}).run(
        {"x": x, "i": i, "u": u})[0]
    want = x.copy()
    for r in range(4):
        for c in range(3):
            want[i[r, c], c] = u[r, c]
    np.testing.assert_array_equal(got, want)
    ind = np.array([[1], [1]], np.int64)
    upd = f32(2, 3)
    got = _compile("ScatterND", 18, {}, ["x", "i", "u"], {"x": x, "i": ind, "u": upd}).run(
        {"x": x, "i": ind, "u": upd})[0]
    np.testing.assert_array_equal(got[1], upd[1])
    # constant indices: the same choice made at compile time
    got = _compile("ScatterND", 18, {}, ["x", "i", "u"], {"x": x, "u": upd}, {"i": ind}).run({"x": x, "u": upd})[0]
    assert any(np.array_equal(got[1], upd[k]) for k in range(2))
    got = _compile("ScatterElements", 18, {"axis": 0}, ["x", "i", "u"], {"x": x, "u": u}, {"i": i}).run(
        {"x": x, "u": u})[0]
    for c in range(3):
        for row in set(i[:, c]):
            assert got[row, c] in u[i[:, c] == row, c]


def test_range_with_constant_inputs_folds():
    """Range of constant inputs is folded at compile time; its result feeds a kernel."""
    node = helper.make_node("Range", ["s", "l", "d"], ["r"])
    add = helper.make_node("Add", ["x", "r"], ["y"])
    consts = {"s": np.array(2, np.int64), "l": np.array(-9, np.int64), "d": np.array(-3, np.int64)}
    inits = [onnx.numpy_helper.from_array(v, n) for n, v in consts.items()]
    graph = helper.make_graph([node, add], "range", [helper.make_tensor_value_info("x", onnx.TensorProto.INT64, [4])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.INT64, [4])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.arange(4, dtype=np.int64)
    np.testing.assert_array_equal(polyc.onnx.compile(model).run({"x": x})[0], x + np.arange(2, -9, -3))


def test_range_with_graph_inputs_is_reported():
    """Range of run-time inputs has no static length: a clean UnsupportedError names the input."""
    node = helper.make_node("Range", ["s", "l", "d"], ["y"])
    inputs = {"s": np.array(0.0, np.float32), "l": np.array(5.0, np.float32), "d": np.array(1.0, np.float32)}
    with pytest.raises(PolycError, match="Range"):
        polyc.onnx.compile(testing.one_node_model(node, inputs, {}, 13))



def test_indices_that_do_not_fit_the_data_are_shape_errors():
    """Indices larger than the data outside the axis (which onnx's shape inference lets through) and
    constant indices out of range are reported as ShapeError naming the node, before any kernel runs."""
    from polyc.errors import ShapeError
    with pytest.raises(ShapeError, match="GatherElements"):
        _compile("GatherElements", 13, {"axis": 1}, ["x", "i"], {"x": f32(3, 5), "i": ints(0, 5, 4, 2)})
    with pytest.raises(ShapeError, match="out of range"):
        _compile("GatherElements", 13, {"axis": 1}, ["x", "i"], {"x": f32(3, 5)}, {"i": i64([[0], [5], [1]])})
    with pytest.raises(ShapeError, match="out of range"):
        _compile("ScatterND", 13, {}, ["x", "i", "u"], {"x": f32(3, 5), "u": f32(2)}, {"i": i64([[0, 1], [3, 0]])})
    with pytest.raises(ShapeError, match="out of range"):
        _compile("ScatterElements", 13, {"axis": 1}, ["x", "i", "u"], {"x": f32(3, 5), "u": f32(3, 1)},
                 {"i": i64([[0], [-6], [1]])})
    with pytest.raises(ShapeError, match="out of range"):
        _compile("GatherND", 13, {}, ["x", "i"], {"x": f32(3, 5)}, {"i": i64([[0, 1], [1, -6]])})
    with pytest.raises(ShapeError, match="ScatterElements"):
        _compile("ScatterElements", 13, {"axis": 0}, ["x", "i", "u"],
                 {"x": f32(3, 5), "i": ints(0, 3, 2, 7), "u": f32(2, 7)})


def _with_nan():
    x = f32(3, 7)
    x[0, 2] = x[0, 4] = np.nan
    x[1, :] = np.nan
    x[2, 5] = np.inf
    x[2, 1] = -np.inf
    return x


@pytest.mark.parametrize("op,attrs,extra", [
    ("ArgMax", {"axis": 1}, {}), ("ArgMin", {"axis": 1, "select_last_index": 1}, {}), ("Hardmax", {"axis": 1}, {}),
    ("TopK", {"axis": 1}, {"k": i64([4])}), ("TopK", {"axis": 1, "largest": 0}, {"k": i64([5])}),
    ("ReduceLogSumExp", {"axes": [1]}, {}), ("ReduceMax", {"axes": [1]}, {}), ("ReduceMin", {"axes": [0]}, {}),
])
def test_nan_and_inf_follow_numpy(op, attrs, extra):
    """NaN is the extremum (numpy's rule, which onnx's reference follows): ArgMax/ArgMin/Hardmax find the
    NaN, TopK sorts NaN above every number, an infinite maximum gives an infinite LogSumExp; indices stay
    in range."""
    run_case(op, 13, attrs, ["x"] + list(extra), {"x": _with_nan()}, extra, n_out=2 if op == "TopK" else 1,
             oracle="ref")


def test_ops_compose_in_a_graph():
    """RoBERTa-style position ids (CumSum of a mask) feeding an embedding Gather, then ArgMax,
    ReduceLogSumExp, Einsum attention scores, Trilu, TopK and GatherElements, against onnxruntime."""
    from onnx import TensorProto, numpy_helper
    emb = f32(16, 8)
    nodes = [
        helper.make_node("CumSum", ["mask", "ax"], ["cs"]), helper.make_node("Mul", ["cs", "mask"], ["m"]),
        helper.make_node("Add", ["m", "one"], ["pos"]), helper.make_node("Gather", ["emb", "pos"], ["e"]),
        helper.make_node("ArgMax", ["e"], ["am"], axis=-1, keepdims=0),
        helper.make_node("ReduceLogSumExp", ["e", "axes"], ["lse"], keepdims=0),
        helper.make_node("Einsum", ["e", "e"], ["att"], equation="bid,bjd->bij"),
        helper.make_node("Trilu", ["att"], ["tri"], upper=0),
        helper.make_node("TopK", ["tri", "k"], ["tv", "ti"], axis=-1),
        helper.make_node("GatherElements", ["tri", "ti"], ["ge"], axis=2),
    ]
    consts = {"ax": np.array(1, np.int64), "one": np.array(1, np.int64), "emb": emb, "axes": i64([-1]), "k": i64([3])}
    outs = [helper.make_tensor_value_info(n, t, s) for n, t, s in
            zip(["am", "lse", "tv", "ti", "ge"], [7, 1, 1, 7, 1], [[2, 7], [2, 7], [2, 7, 3], [2, 7, 3], [2, 7, 3]])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("mask", TensorProto.INT64, [2, 7])], outs,
                              initializer=[numpy_helper.from_array(a, n) for n, a in consts.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"mask": np.array([[1, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]], np.int64)}
    for g, e in zip(polyc.onnx.compile(model).run(feeds), expected(model, feeds, "ort")):
        assert g.dtype == e.dtype
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


def test_constant_gather_elements_past_numpy_choose_limit():
    """GatherElements of constant data and indices along an axis of 128 (onnx's reference evaluator fails
    past 64 choices, so the node is not folded): the node is lowered instead (BERT's buffered
    token_type_ids)."""
    from onnx import TensorProto, numpy_helper
    data = np.arange(2 * 128, dtype=np.int64).reshape(2, 128)
    ind = ints(-128, 128, 2, 128)
    nodes = [helper.make_node("GatherElements", ["d", "i"], ["t"], axis=1), helper.make_node("Add", ["x", "t"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [2, 128])],
                              [helper.make_tensor_value_info("y", TensorProto.INT64, [2, 128])],
                              initializer=[numpy_helper.from_array(data, "d"), numpy_helper.from_array(ind, "i")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    x = np.ones((2, 128), np.int64)
    got = polyc.onnx.compile(model).run({"x": x})[0]
    np.testing.assert_array_equal(got, x + np.take_along_axis(data, np.where(ind < 0, ind + 128, ind), 1))


def _topk_row():
    x = np.round(f32(2, 2053) * 2)  # many ties
    x[0, 5] = x[0, 77] = x[0, 2000] = np.nan
    x[0, 9], x[0, 10] = np.inf, -np.inf
    x[1, :] = np.nan
    x[1, 3], x[1, 1000] = 1.0, -np.inf
    return x


@pytest.mark.parametrize("largest,k", [(1, 1), (1, 5), (0, 4)])
def test_topk_of_a_long_row_by_passes(largest, k):
    """TopK with a small k on a long row (a vocabulary) picks one element per pass: ties by index, NaN
    first (largest) or last, as onnx's reference; integers too."""
    run_case("TopK", 11, {"axis": 1, "largest": largest}, ["x", "k"], {"x": _topk_row()}, {"k": i64([k])},
             n_out=2, oracle="ref")
    xi = ints(-3, 3, 2053, 2)
    run_case("TopK", 11, {"axis": 0, "largest": largest}, ["x", "k"], {"x": xi}, {"k": i64([k])}, n_out=2)
