"""Codegen: hand-built Scops and isl schedules → isl AST → LLVM IR → JIT, compared with numpy.

Each test writes its statements as typed lang expressions (:mod:`polyc.lang.ast` nodes), its domains and
schedules in isl text, runs the kernel on numpy arrays through ctypes and checks every element.
"""
import ctypes
import dataclasses
import math
import re

import islpy as isl
import numpy as np
import pytest
from llvmlite import ir

import polyc
from polyc.codegen import Target, compile_module, emit_kernel, host_target, load_object, new_module
from polyc.codegen.llvm import emit_isl_expr
from polyc.errors import CompileError
from polyc.lang import ast as L
from polyc.options import Options
from polyc.poly.scop import PolyStatement, Scop, Tensor
from targets import RUNNABLE_CPUS

TARGET = host_target()
DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64")
INTS = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
FLOATS = ("float32", "float64")
CMP = ("<", "<=", ">", ">=", "==", "!=", "&&", "||")
RNG = np.random.default_rng(20240601)


# ---- building Scops by hand ----

def I(name):
    """Index variable ``name`` (int32, as sema types it)."""
    return L.Ident(name, dtype="int32", kind="index")


def C(value, dtype):
    return L.Const(value, dtype=dtype)


def read(tensor, dtype, *args):
    return L.Access(tensor, tuple(I(a) if isinstance(a, str) else a for a in args), dtype=dtype)


def binary(op, a, b):
    return L.Binary(op, a, b, dtype="bool" if op in CMP else a.dtype)


def call(func, *args, dtype=None):
    return L.Call(func, tuple(args), dtype=dtype or args[0].dtype)


def cast(to, e):
    return L.Cast(to, e, dtype=to)


def statement(name, ranges, tensor, lhs, op, rhs):
    """A statement over the box ``ranges`` (index → extent) writing ``tensor(lhs)``."""
    indices = tuple(ranges)
    box = " and ".join(f"0 <= {i} < {n}" for i, n in ranges.items())
    domain = isl.Set(f"{{ {name}[{', '.join(indices)}] : {box} }}" if box else f"{{ {name}[] }}")
    write = isl.Map(f"{{ {name}[{', '.join(indices)}] -> {tensor}[{', '.join(lhs)}] }}")
    return PolyStatement(name, indices, domain, tensor, tuple(lhs), op, rhs, write, isl.UnionMap("{ }"))


def scop_of(name, tensors, statements, sizes=None):
    return Scop(name, tuple(Tensor(*t) for t in tensors), tuple(statements), dict(sizes or {}))


def band(statements, dim):
    """The schedule band member giving each statement its index ``dim`` (a name per statement)."""
    parts = [f"{s.name}[{', '.join(s.indices)}] -> [({d})]" for s, d in zip(statements, dim)]
    return "{ " + "; ".join(parts) + " }"


def sequence_schedule(scop):
    """Statements in order, each with its indices as one band (``insert_partial_schedule``, ``Schedule.sequence``)."""
    schedule = None
    for s in scop.statements:
        node = isl.Schedule.from_domain(isl.UnionSet.from_set(s.domain)).get_root().child(0)
        if s.indices:
            mupa = "[" + ", ".join(band([s], [i]) for i in s.indices) + "]"
            node = node.insert_partial_schedule(isl.MultiUnionPwAff(mupa))
        schedule = node.get_schedule() if schedule is None else schedule.sequence(node.get_schedule())
    return schedule


def build_ast(schedule):
    return isl.AstBuild.from_context(isl.Set("{ : }")).node_from_schedule(schedule)


def compile_scop(scop, schedule=None, options=Options(), target=TARGET, opt_level=3):
    """(module text, JitModule) of ``scop`` under ``schedule`` (default: :func:`sequence_schedule`)."""
    ast = build_ast(schedule if schedule is not None else sequence_schedule(scop))
    module = new_module(target)
    emit_kernel(module, scop, ast, target, options)
    text = str(module)
    return text, compile_module(module, target, opt_level)


def call_kernel(jit, scop, arrays):
    """Call kernel ``scop.name`` with ``arrays[t.name]`` for each tensor; returns its status."""
    for t in scop.tensors:
        a = arrays[t.name]
        assert a.dtype == np.dtype(t.dtype) and a.shape == t.shape and a.flags.c_contiguous, t.name
    pointers = (ctypes.c_void_p * len(scop.tensors))(*[arrays[t.name].ctypes.data for t in scop.tensors])
    fn = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p)(jit.address(scop.name))
    return fn(pointers)


def run(scop, arrays, schedule=None, options=Options(), target=TARGET):
    """Compile and run; fills the outputs in ``arrays`` (allocating zeros for missing ones); returns status."""
    for t in scop.tensors:
        if t.name not in arrays:
            arrays[t.name] = np.zeros(t.shape, dtype=t.dtype)
    text, jit = compile_scop(scop, schedule, options, target)
    return call_kernel(jit, scop, arrays)


def random_array(dtype, shape, lo=-20, hi=20):
    if dtype == "bool":
        return RNG.random(shape) < 0.5
    if dtype in FLOATS:
        return (RNG.standard_normal(shape) * 3).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(max(lo, info.min), min(hi, info.max), size=shape, endpoint=True).astype(dtype)


# ---- matmul: schedules, tiles, marks ----

M, N, K = 13, 37, 11


def matmul_scop(name="matmul", dtype="float32", m=M, n=N, k=K):
    init = statement("S0", {"m": m, "n": n}, "C", ("m", "n"), "init", C(0, dtype))
    update = statement("S1", {"m": m, "n": n, "k": k}, "C", ("m", "n"), "+=",
                       binary("*", read("A", dtype, "m", "k"), read("B", dtype, "k", "n")))
    return scop_of(name, [("A", dtype, (m, k), "input"), ("B", dtype, (k, n), "input"),
                          ("C", dtype, (m, n), "output")], [init, update], {"M": m, "N": n, "K": k})


def matmul_schedule(scop, tile=None, outer_mark=None, vector=False, point_mark=None):
    """Band ``(m, n)`` over both statements (optionally tiled, marked), then S0 before the k loop of S1.

    ``outer_mark`` marks the outermost loop, ``point_mark`` the first point loop of the tiled band.

    With ``vector=True`` the order is ``m`` then S0's ``n``, and S1's ``k, n``: ``n`` innermost, marked "vector".
    """
    s0, s1 = scop.statements
    root = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    if vector:
        node = root.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s0, s1], ['m', 'm'])}]"))
    else:
        node = root.insert_partial_schedule(isl.MultiUnionPwAff(
            f"[{band([s0, s1], ['m', 'm'])}, {band([s0, s1], ['n', 'n'])}]"))
        if tile:
            node = node.band_tile(isl.MultiVal("{ [" + ", ".join(map(str, tile)) + "] }")).child(0)
            if point_mark:
                node = node.insert_mark(isl.Id(point_mark)).child(0)
    if outer_mark:
        node = node.get_schedule().get_root().child(0).insert_mark(isl.Id(outer_mark)).child(0)
        while node.get_type() != isl.schedule_node_type.leaf:
            node = node.child(0)
    else:
        node = node.child(0)
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, 2).add(isl.UnionSet("{ S0[m, n] }")).add(
        isl.UnionSet("{ S1[m, n, k] }"))
    node = node.insert_sequence(filters)
    if vector:
        node = node.child(0).child(0).insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s0], ['n'])}]"))
        node = node.insert_mark(isl.Id("vector")).parent().parent()
        node = node.child(1).child(0).insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s1], ['k'])}]"))
        node = node.child(0).insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s1], ['n'])}]"))
        node = node.insert_mark(isl.Id("vector"))
    else:
        node = node.child(1).child(0).insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s1], ['k'])}]"))
    return node.get_schedule()


def matmul_arrays(dtype="float32", m=M, n=N, k=K):
    return {"A": random_array(dtype, (m, k)), "B": random_array(dtype, (k, n))}


def check_matmul(arrays, dtype="float32"):
    expected = arrays["A"].astype("float64") @ arrays["B"].astype("float64")
    np.testing.assert_allclose(arrays["C"], expected.astype(dtype), rtol=1e-5, atol=1e-4)


def test_matmul_identity_schedule():
    scop = matmul_scop()
    arrays = matmul_arrays()
    assert run(scop, arrays) == 0
    check_matmul(arrays)


def test_matmul_isl_scheduler():
    scop = matmul_scop()
    validity = isl.UnionMap("{ S0[m, n] -> S1[m, n, k]; S1[m, n, k] -> S1[m, n, k + 1] }").intersect_domain(
        scop.domain).intersect_range(scop.domain)
    schedule = isl.ScheduleConstraints.on_domain(scop.domain).set_validity(validity).set_proximity(
        validity).compute_schedule()
    arrays = matmul_arrays()
    assert run(scop, arrays, schedule) == 0
    check_matmul(arrays)


@pytest.mark.parametrize("tile", [(4, 8), (5, 3), (16, 64)])
def test_matmul_tiled_provokes_floord_min_max(tile):
    scop = matmul_scop()
    schedule = matmul_schedule(scop, tile=tile)
    ast_text = build_ast(schedule).to_C_str()
    assert ("min(" in ast_text) == any(e > t and e % t for e, t in zip((M, N), tile))  # partial tiles only
    arrays = matmul_arrays()
    assert run(scop, arrays, schedule) == 0
    check_matmul(arrays)


@pytest.mark.parametrize("dtype", ["float64", "int32", "uint8"])
def test_matmul_dtypes(dtype):
    scop = matmul_scop(dtype=dtype)
    arrays = matmul_arrays(dtype)
    assert run(scop, arrays, matmul_schedule(scop, tile=(4, 4))) == 0
    if dtype in FLOATS:
        check_matmul(arrays, dtype)
    else:
        expected = np.einsum("mk,kn->mn", arrays["A"], arrays["B"], dtype=dtype)
        np.testing.assert_array_equal(arrays["C"], expected)


# ---- the parallel mark ----

@pytest.mark.parametrize("threads,m", [(2, M), (3, 7), (8, 3), (2, 1)])
def test_parallel_matmul(threads, m):
    scop = matmul_scop(m=m)
    schedule = matmul_schedule(scop, outer_mark="parallel")
    arrays = matmul_arrays(m=m)
    text, jit = compile_scop(scop, schedule, Options(threads=threads))
    assert "polyc_parallel_run" in text
    arrays["C"] = np.full((m, N), np.nan, dtype="float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


def test_parallel_tiled_matmul_two_threads_equals_sequential():
    scop = matmul_scop(m=29, n=31, k=17)
    arrays = matmul_arrays(m=29, n=31, k=17)
    sequential = dict(arrays)
    assert run(scop, sequential, matmul_schedule(scop, tile=(4, 8))) == 0
    assert run(scop, arrays, matmul_schedule(scop, tile=(4, 8), outer_mark="parallel"), Options(threads=2)) == 0
    np.testing.assert_array_equal(arrays["C"], sequential["C"])
    check_matmul(arrays)


def test_parallel_with_one_thread_is_sequential():
    scop = matmul_scop()
    text, jit = compile_scop(scop, matmul_schedule(scop, outer_mark="parallel"), Options(threads=1))
    assert "polyc_parallel_run" not in text
    arrays = matmul_arrays()
    arrays["C"] = np.zeros((M, N), "float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


def test_vector_loops_inside_parallel_chunks():
    scop = matmul_scop(m=9, n=45)
    text, jit = compile_scop(scop, matmul_schedule(scop, vector=True, outer_mark="parallel"), Options(threads=2))
    assert "polyc_parallel_run" in text and " x float>" in text
    arrays = matmul_arrays(m=9, n=45)
    arrays["C"] = np.full((9, 45), np.nan, "float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


def test_naive_options_ignore_parallel_and_vector_marks():
    scop = matmul_scop()
    text, jit = compile_scop(scop, matmul_schedule(scop, vector=True, outer_mark="parallel"), Options.naive())
    assert "polyc_parallel_run" not in text and " x float>" not in text
    arrays = matmul_arrays()
    arrays["C"] = np.zeros((M, N), "float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


def test_parallel_loop_inside_a_sequential_loop():
    """``for m: parallel for n: C(m,n) = A(m,n) * 2`` spawns threads on every m iteration."""
    s = statement("S0", {"m": 5, "n": 9}, "C", ("m", "n"), "=", binary("*", read("A", "float32", "m", "n"),
                                                                      C(2.0, "float32")))
    scop = scop_of("nested_parallel", [("A", "float32", (5, 9), "input"), ("C", "float32", (5, 9), "output")], [s])
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s], ['m'])}]")).child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s], ['n'])}]")).insert_mark(isl.Id("parallel"))
    arrays = {"A": random_array("float32", (5, 9))}
    assert run(scop, arrays, node.get_schedule(), Options(threads=2)) == 0
    np.testing.assert_array_equal(arrays["C"], arrays["A"] * 2)


# ---- every dtype: arithmetic, comparison, reductions ----

def lowest(dtype):
    if dtype == "bool":
        return False
    return -math.inf if dtype in FLOATS else int(np.iinfo(dtype).min)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype(dtype):
    r, c = 7, 5
    a, b = read("A", dtype, "i", "j"), read("B", dtype, "i", "j")
    if dtype == "bool":
        arith = binary("*", binary("+", a, b), a)
    else:
        arith = binary("-", binary("+", binary("*", a, b), a), b)
    stmts = [
        statement("S0", {"i": r, "j": c}, "E", ("i", "j"), "=", arith),
        statement("S1", {"i": r, "j": c}, "L", ("i", "j"), "=", binary("<=", a, b)),
        statement("S2", {"i": r}, "Mx", ("i",), "init", C(lowest(dtype), dtype)),
        statement("S3", {"i": r, "j": c}, "Mx", ("i",), "max=", a),
        statement("S4", {"i": r}, "Sum", ("i",), "init", C(0, dtype)),
        statement("S5", {"i": r, "j": c}, "Sum", ("i",), "+=", a),
        statement("S6", {"i": r}, "Prod", ("i",), "init", C(1, dtype)),
        statement("S7", {"i": r, "j": c}, "Prod", ("i",), "*=", b),
        statement("S8", {"i": r}, "Mn", ("i",), "init", C(1 if dtype == "bool" else 100, dtype)),
        statement("S9", {"i": r, "j": c}, "Mn", ("i",), "min=", a),
    ]
    tensors = [("A", dtype, (r, c), "input"), ("B", dtype, (r, c), "input"), ("E", dtype, (r, c), "output"),
               ("L", "bool", (r, c), "output"), ("Mx", dtype, (r,), "output"), ("Sum", dtype, (r,), "output"),
               ("Prod", dtype, (r,), "output"), ("Mn", dtype, (r,), "output")]
    scop = scop_of(f"every_{dtype}", tensors, stmts)
    arrays = {"A": random_array(dtype, (r, c), 0, 50), "B": random_array(dtype, (r, c), 0, 3)}
    if dtype not in ("bool",) and dtype not in FLOATS and not dtype.startswith("uint"):
        arrays["A"] = random_array(dtype, (r, c), -50, 50)
    assert run(scop, arrays) == 0
    A, B = arrays["A"], arrays["B"]
    with np.errstate(over="ignore"):
        expected = (A + B) * A if dtype == "bool" else A * B + A - B
        sums = A.sum(axis=1, dtype=dtype)
        prods = B.prod(axis=1, dtype=dtype)
    mins = np.minimum(A.min(axis=1), np.array(1 if dtype == "bool" else 100, dtype=dtype))
    if dtype in FLOATS:
        np.testing.assert_allclose(arrays["E"], expected, rtol=1e-6, atol=1e-5)
        np.testing.assert_allclose(arrays["Sum"], sums, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(arrays["Prod"], prods, rtol=1e-5)
    else:
        np.testing.assert_array_equal(arrays["E"], expected)
        np.testing.assert_array_equal(arrays["Sum"], sums)
        np.testing.assert_array_equal(arrays["Prod"], prods)
    np.testing.assert_array_equal(arrays["L"], A <= B)
    np.testing.assert_array_equal(arrays["Mx"], A.max(axis=1))
    np.testing.assert_array_equal(arrays["Mn"], mins)


# ---- integer division and modulo ----

@pytest.mark.parametrize("dtype", INTS)
def test_integer_div_mod_floor_and_by_zero(dtype):
    info = np.iinfo(dtype)
    special = [info.min, info.max, 0, 1, 7, 100] + ([-1, -7, -100] if info.min < 0 else [3, 250])
    a = np.array([x for x in special for _ in special], dtype=dtype)
    b = np.array([y for _ in special for y in special], dtype=dtype)
    a = np.concatenate([a, random_array(dtype, (64,), -1000, 1000)])
    b = np.concatenate([b, random_array(dtype, (64,), -9, 9)])
    n = a.size
    x, y = read("A", dtype, "i"), read("B", dtype, "i")
    scop = scop_of(f"divmod_{dtype}", [("A", dtype, (n,), "input"), ("B", dtype, (n,), "input"),
                                       ("Q", dtype, (n,), "output"), ("R", dtype, (n,), "output")],
                   [statement("S0", {"i": n}, "Q", ("i",), "=", binary("/", x, y)),
                    statement("S1", {"i": n}, "R", ("i",), "=", binary("%", x, y))])
    arrays = {"A": a, "B": b}
    assert run(scop, arrays) == 0
    with np.errstate(all="ignore"):
        q = np.floor_divide(a, b)
        r = np.remainder(a, b)
    q[b == 0] = 0
    r[b == 0] = 0
    np.testing.assert_array_equal(arrays["Q"], q)
    np.testing.assert_array_equal(arrays["R"], r)
    if info.min < 0:  # spot checks of the rounding toward minus infinity
        pairs = {(int(p), int(s)): (int(qq), int(rr)) for p, s, qq, rr in zip(a, b, arrays["Q"], arrays["R"])}
        assert pairs[(-7, 100)] == (-1, 93) and pairs[(7, -100)] == (-1, -93) and pairs[(-100, 7)] == (-15, 5)


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_mod_follows_numpy(dtype):
    a = np.array([5.5, -5.5, 5.5, -5.5, 0.0, -0.0, 3.0, -3.0, 1e10, 2.5, 7.0], dtype=dtype)
    b = np.array([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 1.5, 3.0, np.inf, -3.5], dtype=dtype)
    a = np.concatenate([a, random_array(dtype, (50,))])
    b = np.concatenate([b, random_array(dtype, (50,))])
    n = a.size
    scop = scop_of(f"fmod_{dtype}", [("A", dtype, (n,), "input"), ("B", dtype, (n,), "input"),
                                     ("R", dtype, (n,), "output")],
                   [statement("S0", {"i": n}, "R", ("i",), "=", binary("%", read("A", dtype, "i"),
                                                                        read("B", dtype, "i")))])
    arrays = {"A": a, "B": b}
    assert run(scop, arrays) == 0
    with np.errstate(all="ignore"):
        expected = np.mod(a, b)
    np.testing.assert_array_equal(arrays["R"], expected)
    np.testing.assert_array_equal(np.signbit(arrays["R"][:6]), np.signbit(expected[:6]))


# ---- casts ----

def cast_input(src, n):
    if src in FLOATS:
        return np.concatenate([np.array([-2.7, -0.5, 0.0, 0.5, 2.7, 99.9, -99.9], dtype=src),
                               (RNG.standard_normal(n - 7) * 50).astype(src)])
    if src == "bool":
        return RNG.random(n) < 0.5
    info = np.iinfo(src)
    return RNG.integers(info.min, info.max, size=n, endpoint=True, dtype=src)


@pytest.mark.parametrize("src", DTYPES)
def test_casts_follow_numpy_astype(src):
    n = 40
    outputs = [d for d in DTYPES if d != src]
    stmts = [statement(f"S{k}", {"i": n}, f"O_{d}", ("i",), "=", cast(d, read("A", src, "i")))
             for k, d in enumerate(outputs)]
    scop = scop_of(f"cast_{src}", [("A", src, (n,), "input")] + [(f"O_{d}", d, (n,), "output") for d in outputs],
                   stmts)
    a = cast_input(src, n)
    arrays = {"A": a}
    assert run(scop, arrays) == 0
    for d in outputs:
        keep = np.ones(n, dtype=bool)
        if src in FLOATS and d != "bool" and d not in FLOATS:  # numpy leaves out-of-range values undefined
            info = np.iinfo(d)
            keep = (a > info.min - 1) & (a < info.max + 1) & ((a > -1) if d.startswith("uint") else True)
        with np.errstate(all="ignore"):
            expected = a.astype(d)
        np.testing.assert_array_equal(arrays[f"O_{d}"][keep], expected[keep], err_msg=f"{src} -> {d}")


def test_float_to_bool_is_nonzero_and_nan_is_true():
    a = np.array([0.0, -0.0, 1.0, np.nan, -np.inf, 1e-30], dtype="float32")
    scop = scop_of("tobool", [("A", "float32", (6,), "input"), ("O", "bool", (6,), "output")],
                   [statement("S0", {"i": 6}, "O", ("i",), "=", cast("bool", read("A", "float32", "i")))])
    arrays = {"A": a}
    assert run(scop, arrays) == 0
    np.testing.assert_array_equal(arrays["O"], a.astype(bool))


# ---- builtins ----

UNARY = {"exp": np.exp, "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x), "tanh": np.tanh,
         "sigmoid": lambda x: 1 / (1 + np.exp(-x)), "fabs": np.abs, "abs": np.abs, "floor": np.floor,
         "ceil": np.ceil, "sin": np.sin, "cos": np.cos, "erf": np.vectorize(math.erf)}
BINARY = {"pow": np.power, "fmin": np.fmin, "fmax": np.fmax, "min": np.minimum, "max": np.maximum}


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_builtins(dtype):
    n = 23
    x, y, z = read("X", dtype, "i"), read("Y", dtype, "i"), read("Z", dtype, "i")
    stmts, tensors = [], [("X", dtype, (n,), "input"), ("Y", dtype, (n,), "input"), ("Z", dtype, (n,), "input")]
    for k, f in enumerate(list(UNARY) + list(BINARY) + ["fma"]):
        args = (x,) if f in UNARY else (x, y) if f in BINARY else (x, y, z)
        stmts.append(statement(f"S{k}", {"i": n}, f"O_{f}", ("i",), "=", call(f, *args)))
        tensors.append((f"O_{f}", dtype, (n,), "output"))
    scop = scop_of(f"builtins_{dtype}", tensors, stmts)
    X = RNG.uniform(0.05, 3.0, n).astype(dtype)
    X[:4] = [0.5, 1.5, 2.0, 2.5]  # floor/ceil at and between integers
    arrays = {"X": X, "Y": RNG.uniform(-2, 2, n).astype(dtype), "Z": RNG.uniform(-2, 2, n).astype(dtype)}
    assert run(scop, arrays) == 0
    rtol = 2e-6 if dtype == "float32" else 1e-13
    for f, ref in {**UNARY, **BINARY}.items():
        args = (X,) if f in UNARY else (X, arrays["Y"])
        np.testing.assert_allclose(arrays[f"O_{f}"], ref(*args).astype(dtype), rtol=rtol, atol=rtol, err_msg=f)
    np.testing.assert_allclose(arrays["O_fma"], X * arrays["Y"] + arrays["Z"], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", FLOATS)
def test_min_max_nan(dtype):
    a = np.array([1.0, np.nan, 2.0, np.nan, -0.5], dtype=dtype)
    b = np.array([2.0, 1.0, np.nan, np.nan, -1.5], dtype=dtype)
    stmts, tensors = [], [("A", dtype, (5,), "input"), ("B", dtype, (5,), "input")]
    for k, f in enumerate(BINARY):
        if f != "pow":
            stmts.append(statement(f"S{k}", {"i": 5}, f"O_{f}", ("i",), "=",
                                   call(f, read("A", dtype, "i"), read("B", dtype, "i"))))
            tensors.append((f"O_{f}", dtype, (5,), "output"))
    scop = scop_of(f"nan_{dtype}", tensors, stmts)
    arrays = {"A": a, "B": b}
    assert run(scop, arrays) == 0
    for f in ("fmin", "fmax", "min", "max"):
        np.testing.assert_array_equal(arrays[f"O_{f}"], BINARY[f](a, b), err_msg=f)


@pytest.mark.parametrize("dtype", INTS)
def test_integer_abs_min_max(dtype):
    info = np.iinfo(dtype)
    a = np.array([info.min, info.max, 0, 1, info.max // 2 + 1] + list(cast_input(dtype, 20)), dtype=dtype)
    b = np.array([0, info.min, info.max, info.max // 2 + 3, 2] + list(cast_input(dtype, 20)), dtype=dtype)
    n = a.size
    x, y = read("A", dtype, "i"), read("B", dtype, "i")
    scop = scop_of(f"intmm_{dtype}", [("A", dtype, (n,), "input"), ("B", dtype, (n,), "input"),
                                      ("Abs", dtype, (n,), "output"), ("Mn", dtype, (n,), "output"),
                                      ("Mx", dtype, (n,), "output")],
                   [statement("S0", {"i": n}, "Abs", ("i",), "=", call("abs", x)),
                    statement("S1", {"i": n}, "Mn", ("i",), "=", call("min", x, y)),
                    statement("S2", {"i": n}, "Mx", ("i",), "=", call("fmax", x, y))])
    arrays = {"A": a, "B": b}
    assert run(scop, arrays) == 0
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(arrays["Abs"], np.abs(a))
    np.testing.assert_array_equal(arrays["Mn"], np.minimum(a, b))
    np.testing.assert_array_equal(arrays["Mx"], np.maximum(a, b))


def test_scalar_parameter_size_and_index_values():
    """``C(i) = alpha * A(i) + float(N) + float(i)`` with a 0-d ``alpha`` and a size ``N``."""
    n = 9
    alpha = L.Ident("alpha", dtype="float32", kind="scalar")
    rhs = binary("+", binary("+", binary("*", alpha, read("A", "float32", "i")),
                             cast("float32", L.Ident("N", dtype="int32", kind="size"))), cast("float32", I("i")))
    scop = scop_of("axpb", [("A", "float32", (n,), "input"), ("alpha", "float32", (), "input"),
                            ("C", "float32", (n,), "output")],
                   [statement("S0", {"i": n}, "C", ("i",), "=", rhs)], {"N": n})
    arrays = {"A": random_array("float32", (n,)), "alpha": np.array(2.5, dtype="float32")}
    assert run(scop, arrays) == 0
    np.testing.assert_allclose(arrays["C"], 2.5 * arrays["A"] + n + np.arange(n), rtol=1e-6)


# ---- data-dependent indices (gathers) ----

def gather_scop(index_dtype="int32", guarded=False, n=6, extent=10):
    index = read("B", index_dtype, "i")
    value = read("A", "float32", index)
    if guarded:  # B(i) >= 0 ? A(B(i)) : -1
        value = L.Select(binary(">=", index, C(0, index_dtype)), value, C(-1.0, "float32"), dtype="float32")
    return scop_of(f"gather_{index_dtype}_{guarded}", [("A", "float32", (extent,), "input"),
                                                         ("B", index_dtype, (n,), "input"),
                                                         ("C", "float32", (n,), "output")],
                   [statement("S0", {"i": n}, "C", ("i",), "=", value)])


@pytest.mark.parametrize("index_dtype", ["int32", "int64", "uint8", "int8"])
def test_gather_in_range(index_dtype):
    scop = gather_scop(index_dtype)
    arrays = {"A": random_array("float32", (10,)), "B": np.array([0, 9, 3, 3, 5, 1], dtype=index_dtype)}
    assert run(scop, arrays) == 0
    np.testing.assert_array_equal(arrays["C"], arrays["A"][arrays["B"]])


@pytest.mark.parametrize("bad", [10, -1, 255, 2 ** 31 - 1, -(2 ** 31)])
def test_gather_out_of_range_returns_1(bad):
    scop = gather_scop()
    b = np.array([0, 9, 3, 3, 5, 1], dtype="int32")
    b[4] = np.int32(bad)
    arrays = {"A": random_array("float32", (10,)), "B": b}
    assert run(scop, arrays) == 1


def test_guarded_gather_does_not_check_the_untaken_branch():
    scop = gather_scop(guarded=True)
    b = np.array([0, -5, 3, -1, 9, 2], dtype="int32")
    arrays = {"A": random_array("float32", (10,)), "B": b}
    assert run(scop, arrays) == 0
    np.testing.assert_array_equal(arrays["C"], np.where(b >= 0, arrays["A"][np.maximum(b, 0)], -1))
    arrays["B"] = np.array([0, -5, 3, -1, 10, 2], dtype="int32")
    assert run(scop, arrays) == 1


def test_nested_gather_in_two_dimensions():
    """``C(i, j) = A(B(i), j)`` with a 2-d A: only the data-dependent dimension is checked."""
    s = statement("S0", {"i": 4, "j": 3}, "C", ("i", "j"), "=", read("A", "float64", read("B", "int32", "i"), I("j")))
    scop = scop_of("gather2d", [("A", "float64", (5, 3), "input"), ("B", "int32", (4,), "input"),
                                ("C", "float64", (4, 3), "output")], [s])
    arrays = {"A": random_array("float64", (5, 3)), "B": np.array([4, 0, 2, 4], dtype="int32")}
    assert run(scop, arrays) == 0
    np.testing.assert_array_equal(arrays["C"], arrays["A"][arrays["B"]])


@pytest.mark.parametrize("bad_at", [0, 5, 11])
def test_gather_error_propagates_from_every_parallel_chunk(bad_at):
    n = 12
    scop = gather_scop(n=n)
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band(scop.statements, ['i'])}]"))
    schedule = node.insert_mark(isl.Id("parallel")).get_schedule()
    b = np.arange(n, dtype="int32") % 10
    text, jit = compile_scop(scop, schedule, Options(threads=3))
    arrays = {"A": random_array("float32", (10,)), "B": b, "C": np.zeros(n, "float32")}
    assert call_kernel(jit, scop, arrays) == 0
    np.testing.assert_array_equal(arrays["C"], arrays["A"][b])
    arrays["B"] = b.copy()
    arrays["B"][bad_at] = 10
    assert call_kernel(jit, scop, arrays) == 1


# ---- isl AST expressions: every operator ----

N_PARAM = isl.Id("n")


def jit_isl_expr(expr):
    """A JIT function ``int64 f(int64 n)`` evaluating isl AST expression ``expr`` (i1 results widened)."""
    module = new_module(TARGET)
    fn = ir.Function(module, ir.FunctionType(ir.IntType(64), [ir.IntType(64)]), "f")
    b = ir.IRBuilder(fn.append_basic_block())
    value = emit_isl_expr({"n": fn.args[0]}, expr, b)
    b.ret(b.zext(value, ir.IntType(64)) if value.type == ir.IntType(1) else value)
    jit = compile_module(module, TARGET)
    return jit, ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_int64)(jit.address("f"))


def isl_ops(e, found):
    if e.get_type() == isl.ast_expr_type.op:
        found.add(e.get_op_type())
        for i in range(e.get_op_n_arg()):
            isl_ops(e.get_op_arg(i), found)
    return found


def isl_ops_of_ast(node, found):
    """The operators in every expression of an isl AST (loop bounds, conditions, statement arguments)."""
    t = node.get_type()
    if t == isl.ast_node_type.for_:
        for e in (node.for_get_init(), node.for_get_cond(), node.for_get_inc()):
            isl_ops(e, found)
        isl_ops_of_ast(node.for_get_body(), found)
    elif t == isl.ast_node_type.if_:
        isl_ops(node.if_get_cond(), found)
        isl_ops_of_ast(node.if_get_then_node(), found)
        if node.if_has_else_node():
            isl_ops_of_ast(node.if_get_else_node(), found)
    elif t == isl.ast_node_type.block:
        children = node.block_get_children()
        for i in range(children.n_ast_node()):
            isl_ops_of_ast(children.get_at(i), found)
    elif t == isl.ast_node_type.mark:
        isl_ops_of_ast(node.mark_get_node(), found)
    elif t == isl.ast_node_type.user:
        isl_ops(node.user_get_expr(), found)
    return found


def floordiv(a, b):
    return a // b


ISL_EXPRS = [
    # (isl text, python value of n) — built by isl_ast_build_expr_from_pw_aff / expr_from_set
    ("[n] -> { [(floor(n/4))] }", lambda n: floordiv(n, 4)),
    ("[n] -> { [(max(n, 3))] }", lambda n: max(n, 3)),
    ("[n] -> { [(min(n, 3) + 2*n)] }", lambda n: min(n, 3) + 2 * n),
    ("[n] -> { [(n mod 5)] }", lambda n: n % 5),
    ("[n] -> { [(n)] : n >= 0; [(-n)] : n < 0 }", abs),
    ("[n] -> { [(floor(n/3))] : n >= 0; [(2)] : n < 0 }", lambda n: n // 3 if n >= 0 else 2),
    ("[n] -> { : n mod 3 = 0 }", lambda n: int(n % 3 == 0)),
    ("[n] -> { : n >= 2 and n <= 7 }", lambda n: int(2 <= n <= 7)),
    ("[n] -> { : n < 0 or n > 10 }", lambda n: int(n < 0 or n > 10)),
    ("[n] -> { : (n mod 3 = 0 and n > 0) or n < -5 }", lambda n: int((n % 3 == 0 and n > 0) or n < -5)),
    ("[n] -> { : exists e: n = 4e + 1 and n > 0 }", lambda n: int(n > 0 and (n - 1) % 4 == 0)),
]


def hand_built_exprs():
    """Operators isl builds only inside loops or not from affine text: made with the AstExpr constructors."""
    n = isl.AstExpr.from_id(N_PARAM)
    k = lambda v: isl.AstExpr.from_val(isl.Val(v))  # noqa: E731
    plus = n.add(k(60))  # a non-negative dividend for pdiv_q / pdiv_r
    return [
        (n.mul(k(6)).div(k(3)), lambda v: 2 * v),
        (plus.pdiv_q(k(7)), lambda v: (v + 60) // 7),
        (plus.pdiv_r(k(7)), lambda v: (v + 60) % 7),
        (n.gt(k(0)).and_then(n.lt(k(5))), lambda v: int(0 < v < 5)),
        (n.lt(k(-3)).or_else(n.ge(k(4))), lambda v: int(v < -3 or v >= 4)),
        (n.eq(k(2)).or_(n.le(k(-10))), lambda v: int(v == 2 or v <= -10)),
        (n.neg().sub(k(1)).mul(k(3)), lambda v: (-v - 1) * 3),
    ]


def test_every_isl_ast_operator():
    build = isl.AstBuild.from_context(isl.Set("[n] -> { : -50 <= n <= 50 }"))
    cases = []
    for text, ref in ISL_EXPRS:
        obj = isl.Set(text) if ": " in text and "[(" not in text else isl.PwAff(text)
        expr = build.expr_from_set(obj) if isinstance(obj, isl.Set) else build.expr_from_pw_aff(obj)
        cases.append((expr, ref))
    cases += hand_built_exprs()
    found = set()
    for expr, ref in cases:
        isl_ops(expr, found)
        _, f = jit_isl_expr(expr)
        for v in range(-40, 41):
            assert f(v) == ref(v), (expr.to_C_str(), v)
    # max and min come from the loop bounds of tiled nests (run by the tests above and below)
    isl_ops_of_ast(build_ast(matmul_schedule(matmul_scop(), tile=(4, 8))), found)
    isl_ops_of_ast(build_ast(skewed_schedule(skewed_scop())), found)
    op = isl.ast_expr_op_type
    wanted = {op.and_, op.and_then, op.or_, op.or_else, op.max, op.min, op.minus, op.add, op.sub, op.mul, op.div,
              op.fdiv_q, op.pdiv_q, op.pdiv_r, op.zdiv_r, op.select, op.eq, op.le, op.lt, op.ge, op.gt}
    assert wanted <= found, wanted - found  # isl_ast_build never makes "cond" (emitted like "select")


def skewed_scop():
    s = statement("S0", {"i": 10, "j": 10}, "C", ("i", "j"), "=",
                  binary("+", cast("float32", I("i")), binary("*", cast("float32", I("j")), C(100.0, "float32"))))
    s = dataclasses.replace(s, domain=isl.Set("{ S0[i, j] : 0 <= i < 10 and 0 <= j < 10 and i + j >= 3 }"))
    return scop_of("skewed", [("C", "float32", (10, 10), "output")], [s])


def skewed_schedule(scop):
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff("[{ S0[i, j] -> [(i + j)] }, { S0[i, j] -> [(j)] }]"))
    return node.band_tile(isl.MultiVal("{ [3, 4] }")).get_schedule()


def test_isl_max_min_from_bounds():
    """A skewed, tiled domain makes isl emit ``max``/``min``/``%`` in loop bounds; results must match."""
    scop = skewed_scop()
    schedule = skewed_schedule(scop)
    text = build_ast(schedule).to_C_str()
    assert "max(" in text and "min(" in text and "%" in text
    arrays = {"C": np.full((10, 10), -1.0, dtype="float32")}
    assert run(scop, arrays, schedule) == 0
    i, j = np.meshgrid(np.arange(10), np.arange(10), indexing="ij")
    np.testing.assert_array_equal(arrays["C"], np.where(i + j >= 3, i + 100.0 * j, -1.0))


# ---- vector and unroll marks ----

@pytest.mark.parametrize("bits", [128, 256, 512])
@pytest.mark.parametrize("n", [1, 7, 24, 37, 40, 64])
def test_vector_mark_matmul(bits, n):
    target = dataclasses.replace(TARGET, vector_bits=bits)
    scop = matmul_scop(n=n)
    text, jit = compile_scop(scop, matmul_schedule(scop, vector=True), target=target)
    # isl makes a 1-iteration loop degenerate; a constant loop narrower than the target's vector runs as
    # narrower vectors (7 floats: 4 + 2 + 1)
    assert (" x float>" in text) == (n > 1)
    assert (f"<{bits // 32} x float>" in text) == (n >= bits // 32)
    arrays = matmul_arrays(n=n)
    arrays["C"] = np.full((M, n), np.nan, dtype="float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


def _for_node(extent):
    """The isl AST ``for`` of ``{ S[i] : 0 <= i < extent }``."""
    domain = isl.UnionSet(f"{{ S[i] : 0 <= i < {extent} }}")
    schedule = isl.Schedule.from_domain(domain).insert_partial_schedule(isl.MultiUnionPwAff("[{ S[i] -> [(i)] }]"))
    return isl.AstBuild.from_context(isl.Set("{ : }")).node_from_schedule(schedule)


@pytest.mark.parametrize("extent, lanes, steps", [
    (32, 16, [(0, 16), (16, 16)]),                 # AVX-512 NR: two vectors, no loop
    (16, 8, [(0, 8), (8, 8)]),                     # AVX2 NR
    (7, 8, [(0, 4), (4, 2), (6, 1)]),              # narrower than a vector: 4 + 2 + 1
    (40, 16, [(0, 16), (16, 16), (32, 8)]),
    (64, 16, [(0, 16), (16, 16), (32, 16), (48, 16)]),
    (72, 16, [(0, 16), (16, 16), (32, 16), (48, 16), (64, 8)]),
    (80, 16, None),                                # more than MAX_STRAIGHT_STEPS vectors: a loop
    (64, 8, None)])
def test_constant_vector_loops_run_straight_line(extent, lanes, steps):
    from polyc.codegen.vector import _constant_steps
    from polyc.codegen.region import loop_bounds
    assert _constant_steps(loop_bounds(_for_node(extent)), lanes) == steps


def test_a_register_tile_starts_in_registers(monkeypatch, capfd):
    """A GEMM's register tile (init, k loop, epilogue) keeps its accumulators in registers: the optimized IR
    stores no zero vector (nor a memset) to the output to load it back before the k loop (with the output's
    lines not in cache, that reload waits for memory). The cache tile spans the whole reduction: a host whose
    L1 makes the strategy split it (Zen 4's 32 KiB: blocks of 128) guards the init with ``if (c2 == 0)``,
    which keeps the loop form (:mod:`polyc.codegen.vector`)."""
    monkeypatch.setenv("POLYC_CACHE_DIR", "off")
    src = """def mm(float(64,256) A, float(256,64) B) -> (C) {
        C(m,n) +=! A(m,k) * B(k,n)
    }"""
    with polyc.debug.override(6):
        compiled = polyc.define(src, options=Options(threads=1, tile_sizes=(64, 64, 256))).specialize_sizes({})
    assert "if (" not in compiled.stage("ast")
    optimized = "".join(part for part in capfd.readouterr().err.split("---- optimized llvm")[1:]
                        if "polyc.mm.body" in part)
    a = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal((256, 64)).astype(np.float32)
    np.testing.assert_allclose(compiled(a, b), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert "fmul contract <16 x float>" in optimized or "fmul contract <8 x float>" in optimized
    assert "llvm.memset" not in optimized
    assert not re.search(r"store <\d+ x float> zeroinitializer", optimized)


@pytest.mark.parametrize("dtype", DTYPES)
def test_vector_mark_every_dtype(dtype):
    """``E(i, j) = A(i, j) * s(i) + B(j)`` vectorized along ``j`` (s broadcast), plus bool/compare/cast code."""
    r, c = 3, 45
    a, b, s = read("A", dtype, "i", "j"), read("B", dtype, "j"), read("S", dtype, "i")
    arith = binary("*", binary("+", a, b), s) if dtype == "bool" else binary("+", binary("*", a, s), b)
    stmts = [statement("S0", {"i": r, "j": c}, "E", ("i", "j"), "=", arith),
             statement("S1", {"i": r, "j": c}, "L", ("i", "j"), "=", binary("<", a, b)),
             statement("S2", {"i": r, "j": c}, "F", ("i", "j"), "+=", cast("float64", a))]
    scop = scop_of(f"vec_{dtype}", [("A", dtype, (r, c), "input"), ("B", dtype, (c,), "input"),
                                    ("S", dtype, (r,), "input"), ("E", dtype, (r, c), "output"),
                                    ("L", "bool", (r, c), "output"), ("F", "float64", (r, c), "output")], stmts)
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band(stmts, ['i'] * 3)}]")).child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band(stmts, ['j'] * 3)}]")).insert_mark(
        isl.Id("vector"))
    text, jit = compile_scop(scop, node.get_schedule())
    assert " x " in text  # vector types were emitted
    arrays = {"A": random_array(dtype, (r, c)), "B": random_array(dtype, (c,)), "S": random_array(dtype, (r,)),
              "E": np.zeros((r, c), dtype), "L": np.zeros((r, c), bool), "F": np.ones((r, c), "float64")}
    assert call_kernel(jit, scop, arrays) == 0
    A, B, S = arrays["A"], arrays["B"], arrays["S"]
    with np.errstate(over="ignore"):
        expected = (A + B) * S[:, None] if dtype == "bool" else A * S[:, None] + B
    if dtype in FLOATS:
        np.testing.assert_allclose(arrays["E"], expected, rtol=1e-6, atol=1e-6)
    else:
        np.testing.assert_array_equal(arrays["E"], expected)
    np.testing.assert_array_equal(arrays["L"], A < B)
    np.testing.assert_array_equal(arrays["F"], 1 + A.astype("float64"))


def test_vector_mark_strided_reads_vectorize_gathers_and_reductions_fall_back():
    """Stride-2 reads become a span load and a shuffle; gathers and reductions along the marked loop are
    emitted as scalar loops; every result is exact."""
    n = 10
    stmts = [statement("S0", {"i": n}, "C", ("i",), "=", read("A", "float32", binary("*", I("i"), C(2, "int32")))),
             statement("S1", {"i": n}, "D", ("i",), "=", read("A", "float32", read("G", "int32", "i"))),
             statement("S2", {"i": n}, "R", (), "+=", read("A", "float32", "i"))]
    scop = scop_of("fallback", [("A", "float32", (2 * n,), "input"), ("G", "int32", (n,), "input"),
                                ("C", "float32", (n,), "output"), ("D", "float32", (n,), "output"),
                                ("R", "float32", (), "output")], stmts)
    schedule = None
    for s in stmts:
        node = isl.Schedule.from_domain(isl.UnionSet.from_set(s.domain)).get_root().child(0)
        node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s], ['i'])}]")).insert_mark(
            isl.Id("vector"))
        schedule = node.get_schedule() if schedule is None else schedule.sequence(node.get_schedule())
    text, jit = compile_scop(scop, schedule)
    assert "shufflevector" in text
    arrays = {"A": random_array("float32", (2 * n,)), "G": (np.arange(n, dtype="int32") * 7) % 20,
              "C": np.zeros(n, "float32"), "D": np.zeros(n, "float32"), "R": np.zeros((), "float32")}
    assert call_kernel(jit, scop, arrays) == 0
    np.testing.assert_array_equal(arrays["C"], arrays["A"][::2])
    np.testing.assert_array_equal(arrays["D"], arrays["A"][arrays["G"]])
    np.testing.assert_allclose(arrays["R"], arrays["A"][:n].sum(), rtol=1e-5)


def test_unroll_mark():
    scop = matmul_scop(k=5)
    s0, s1 = scop.statements
    node = isl.Schedule.from_domain(scop.domain).get_root().child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(
        f"[{band([s0, s1], ['m', 'm'])}, {band([s0, s1], ['n', 'n'])}]")).child(0)
    filters = isl.UnionSetList.alloc(isl.DEFAULT_CONTEXT, 2).add(isl.UnionSet("{ S0[m, n] }")).add(
        isl.UnionSet("{ S1[m, n, k] }"))
    node = node.insert_sequence(filters).child(1).child(0)
    node = node.insert_partial_schedule(isl.MultiUnionPwAff(f"[{band([s1], ['k'])}]")).insert_mark(isl.Id("unroll"))
    text, jit = compile_scop(scop, node.get_schedule(), opt_level=0)
    assert "k.head" not in text and "c2.head" not in text  # no loop left for k
    arrays = matmul_arrays(k=5)
    arrays["C"] = np.zeros((M, N), "float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


@pytest.mark.parametrize("tile", [(5, 3), (4, 37)])
def test_unroll_mark_on_partial_tile_point_loops(tile):
    """The point loop ``c2 <= min(4, -c0 + 12)`` unrolls 5 times, each copy guarded by the loop condition."""
    scop = matmul_scop()
    schedule = matmul_schedule(scop, tile=tile, point_mark="unroll")
    ast_text = build_ast(schedule).to_C_str()
    assert "// unroll" in ast_text and "min(" in ast_text
    text, jit = compile_scop(scop, schedule, opt_level=0)
    assert '"c2.head"' not in text and f'"c2.{tile[0] - 1}"' in text
    arrays = matmul_arrays()
    arrays["C"] = np.zeros((M, N), "float32")
    assert call_kernel(jit, scop, arrays) == 0
    check_matmul(arrays)


# ---- modules, the JIT and the target ----

def test_two_kernels_in_one_module_and_unique_names():
    module = new_module(TARGET)
    first, second = matmul_scop("mm_a"), matmul_scop("mm_b", m=4)
    for scop in (first, second):
        emit_kernel(module, scop, build_ast(matmul_schedule(scop, outer_mark="parallel")), TARGET,
                    Options(threads=2))
    with pytest.raises(CompileError, match="mm_a"):
        emit_kernel(module, first, build_ast(sequence_schedule(first)), TARGET, Options())
    jit = compile_module(module, TARGET)
    assert set(jit.kernels) >= {"mm_a", "mm_b"}
    for scop, m in ((first, M), (second, 4)):
        arrays = matmul_arrays(m=m)
        arrays["C"] = np.zeros((m, N), "float32")
        assert call_kernel(jit, scop, arrays) == 0
        check_matmul(arrays)


def test_jit_from_text_ir_asm_and_object_reload():
    scop = matmul_scop()
    module = new_module(TARGET)
    emit_kernel(module, scop, build_ast(matmul_schedule(scop, vector=True)), TARGET, Options())
    jit = compile_module(str(module), TARGET, opt_level=2)
    assert "define" in jit.ir and "matmul" in jit.ir
    assert "ret" in jit.asm
    if TARGET.has_feature("fma"):
        assert "vfmadd" in jit.asm
    reloaded = load_object(jit.object_code, TARGET)
    arrays = matmul_arrays()
    arrays["C"] = np.zeros((M, N), "float32")
    assert call_kernel(reloaded, scop, arrays) == 0
    check_matmul(arrays)


def test_jit_errors_are_compile_errors():
    with pytest.raises(CompileError, match="parse"):
        compile_module("define i32 @broken( {", TARGET)
    bad = "define i32 @bad_kernel() {\nentry:\n  ret i64 0\n}\n"
    with pytest.raises(CompileError):
        compile_module(bad, TARGET)
    missing = ("declare i32 @polyc_no_such_function()\n"
               "define i32 @calls_missing() {\nentry:\n  %r = call i32 @polyc_no_such_function()\n  ret i32 %r\n}\n")
    with pytest.raises(CompileError, match="polyc_no_such_function"):
        compile_module(missing, TARGET)
    with pytest.raises(CompileError, match="no function"):
        compile_module(new_module(TARGET), TARGET).address("nothing")


def test_host_target():
    t = host_target()
    assert t.vector_bits in (128, 256, 512)
    assert t.cores >= 1 and t.l1d_bytes > 0 and t.l2_bytes >= t.l1d_bytes and t.l3_bytes > 0
    assert t.triple and t == host_target() and t.key() == host_target().key()
    assert t.lanes("float32") == t.vector_bits // 32 and t.lanes("bool") == t.vector_bits // 8
    if t.has_feature("avx512f"):
        assert t.vector_bits == 512
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.cores = 3
    assert isinstance(t, Target) and "cores=" in str(t)


def _target_cpu(monkeypatch, cpu) -> None:
    """Compile for ``cpu`` (None: the host). A pre-AVX2 host cannot run znver3 code at all (polyc refuses it:
    test_target.py), so that row is skipped there with this reason; the host row still runs."""
    if cpu is not None:
        if not host_target().has_feature("avx2"):  # pre-AVX2 hosts only: the code cannot run there at all
            pytest.skip("the host cannot run AVX2 code (znver3), which polyc refuses to run on it")
        monkeypatch.setenv("POLYC_CPU", cpu)


@pytest.mark.parametrize("cpu", [None, "znver3"])
def test_inline_exp_float32_is_within_one_ulp_everywhere(monkeypatch, cpu):
    """The inline float32 exp (AVX-512's vscalefps path in 16-lane vectors; elsewhere, in AVX2 vectors and the
    scalar remainder, one integer add to the exponent field where every lane of a step gives a normal float
    and the two-step exponent-field scaling in any other step) against float64 numpy over a sweep of every
    97th float in [-110, 95] (its steps near -87.0 and 88.4, where n leaves [-125, 127], mix both kinds of
    lanes), plus overflow, underflow to subnormals and zero, infinities and NaN."""
    _target_cpu(monkeypatch, cpu)
    k = polyc.define("def e(float(N) X) -> (Y) { Y(i) = exp(X(i)) }")
    pos = np.arange(0, np.float32(95.0).view(np.int32), 97, dtype=np.int32).view(np.float32)
    neg = -np.arange(0, np.float32(110.0).view(np.int32), 97, dtype=np.int32).view(np.float32)
    edges = np.array([np.nan, np.inf, -np.inf, 88.72283, 88.7229, 89.5, -87.33655, -103.97, -103.28, -104.5],
                     np.float32)
    x = np.concatenate([pos, neg, edges])
    y = k(x)
    with np.errstate(over="ignore"):
        exact = np.exp(x.astype(np.float64))
        rounded = exact.astype(np.float32)
    normal = np.isfinite(rounded) & (np.abs(rounded) >= np.finfo(np.float32).tiny)
    ulps = np.abs(y[normal] - exact[normal]) / np.spacing(rounded[normal]).astype(np.float64)
    assert ulps.max() <= 1.0, (ulps.max(), x[normal][ulps.argmax()])
    tiny = (rounded < np.finfo(np.float32).tiny) & ~np.isnan(x)  # subnormal or zero: within one subnormal step
    assert np.abs(y[tiny].astype(np.float64) - exact[tiny]).max() <= 1.5e-45
    special = ~np.isfinite(rounded)
    np.testing.assert_array_equal(y[special], rounded[special])  # inf where it overflows, NaN for NaN


@pytest.mark.parametrize("name, top, bound", [("erf", 4.5, 1.2), ("tanh", 12.0, 1.4)])
@pytest.mark.parametrize("cpu", [None, "znver3"])
def test_inline_erf_tanh_float32_accuracy(monkeypatch, cpu, name, top, bound):
    """The inline float32 erf and tanh (two pieces on |x|, the sign bit put back; the same code in vectors
    of either ISA and in the scalar remainder) against float64 references over every 97th float in
    [-top, top] (past where both are ±1 in float32): within ``bound`` ulp (the measured worst, 1.12 and 1.37,
    rounded up), ±0 keeps its sign, ±1 at ±inf and beyond the saturation points, NaN for NaN."""
    _target_cpu(monkeypatch, cpu)
    k = polyc.define(f"def f(float(N) X) -> (Y) {{ Y(i) = {name}(X(i)) }}")
    pos = np.arange(0, np.float32(top).view(np.int32), 97, dtype=np.int32).view(np.float32)
    edges = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.625, -0.625, 3.93, 9.02, 1e30, -1e-40],
                     np.float32)
    x = np.concatenate([pos, -pos, edges])
    y = k(x)
    assert not re.search(rf"@\"?(_ZGV\w*_)?{name}f\b", k.specialize(x).stage("llvm"))  # inline: no libm call
    reference = np.vectorize(math.erf) if name == "erf" else np.tanh
    exact = reference(x.astype(np.float64))
    finite = np.isfinite(x)
    ulps = np.abs(y[finite] - exact[finite]) / np.spacing(exact[finite].astype(np.float32)).astype(np.float64)
    assert ulps.max() <= bound, (ulps.max(), x[finite][ulps.argmax()])
    assert y[-13:-10].tolist()[1:] == [1.0, -1.0] and np.isnan(y[-13])
    assert np.signbit(y[x == 0.0]).tolist() == np.signbit(x[x == 0.0]).tolist()
    assert (np.abs(y[np.abs(x) >= 9.02]) == 1.0).all() and (np.abs(y[~np.isnan(x)]) <= 1.0).all()


@pytest.mark.parametrize("cpu", [None, "znver3"])
def test_inline_sigmoid_float32_accuracy(monkeypatch, cpu):
    """The inline float32 sigmoid (exp with one-product scaling: vscalefps in 16-lane vectors, the exponent
    field in AVX2 vectors and the scalar remainder) against float64 numpy over every 97th float in
    [-100, 100]: within 3 ulp where the result is a normal float, within 1.2e-38 below that, exact at 0
    (0.5) and beyond 17.5 (1.0), NaN for NaN."""
    _target_cpu(monkeypatch, cpu)
    k = polyc.define("def s(float(N) X) -> (Y) { Y(i) = sigmoid(X(i)) }")
    pos = np.arange(0, np.float32(100.0).view(np.int32), 97, dtype=np.int32).view(np.float32)
    x = np.concatenate([pos, -pos, np.array([np.nan, np.inf, -np.inf, 17.5, 88.0, -87.0, -87.4, -89.0, 0.0, 1.0,
                                              -1.0], np.float32)])
    y = k(x)
    exact = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    rounded = exact.astype(np.float32)
    normal = np.isfinite(x) & (rounded >= np.finfo(np.float32).tiny)
    ulps = np.abs(y[normal] - exact[normal]) / np.spacing(rounded[normal]).astype(np.float64)
    assert ulps.max() <= 3.0, (ulps.max(), x[normal][ulps.argmax()])
    small = np.isfinite(x) & ~normal
    assert np.abs(y[small].astype(np.float64) - exact[small]).max() <= 1.2e-38
    assert y[x == 0.0].tolist() == [0.5] * int((x == 0.0).sum()) and (y[x >= 17.5] == 1.0).all()
    assert np.isnan(y[np.isnan(x)]).all() and y[x == np.inf].tolist() == [1.0]
    assert 0.0 <= y[x == -np.inf][0] <= 1.2e-38


def test_guarded_strided_reads_are_masked_loads_of_a_power_of_two_width():
    """A stride-2 read under a padding guard is one masked load of the span its lanes cover, rounded up to
    a power of two (LLVM splits an odd width such as <31 x float> down to single elements); the lanes past
    the span and the ones the guard forbids are masked off, so the border is exact."""
    import re

    src = """def s2(float(1,4,45) X, float(4,3) W) -> (float(1,4,23) Y) {
        Y(n, c, i) +=! (2*i+r-1 >= 0 && 2*i+r-1 < 45) ? X(n, c, 2*i+r-1) * W(c, r) : 0.0
            where n in 0:1, c in 0:4, i in 0:23, r in 0:3
    }"""
    rng = np.random.default_rng(4)
    X, W = rng.standard_normal((1, 4, 45)).astype(np.float32), rng.standard_normal((4, 3)).astype(np.float32)
    compiled = polyc.define(src).specialize(X, W)
    widths = [int(w) for w in re.findall(r"llvm\.masked\.load\.v(\d+)f32", compiled.stage("llvm"))]
    assert widths and all(w & (w - 1) == 0 for w in widths), widths
    padded = np.pad(X[0], ((0, 0), (1, 1)))
    expected = sum(padded[:, r:r + 45:2][:, :23] * W[:, r:r + 1] for r in range(3))
    np.testing.assert_allclose(compiled(X, W)[0], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cpu", RUNNABLE_CPUS)
@pytest.mark.parametrize("guarded", [False, True])
def test_a_transposing_epilogue_runs_as_gathers_and_scatters(cpu, guarded, monkeypatch):
    """A channels-last accumulation read back into NCHW in the same tile (the form of a channels-last
    convolution's epilogue): the vector loop runs along the channels, so the ``=`` statement writes ``Y(m, h,
    w)`` and reads the residual ``R(m, h, w)`` a row apart: a scatter and a gather (``llvm.masked.*``), under
    a guard too, instead of a scalar loop; results are numpy's and the naive kernel's, on two threads too. The
    epilogue reads the tile through a laundered pointer (``llvm._launder``: an empty ``asm``), the same kernel
    with the epilogue in the tile's own order does not."""
    monkeypatch.setenv("POLYC_CPU", cpu)
    residual = "(w >= 1 ? R(m, h, w - 1) : 0.0)" if guarded else "R(m, h, w)"
    src = f"""def clconv(float(C,H,W) X, float(C,M) Wt, float(M,H,W) R) -> (Y) {{
        T(h, w, m) +=! X(c, h, w) * Wt(c, m)
        Y(m, h, w) = tanh(T(h, w, m) + {residual})
    }}"""
    rng = np.random.default_rng(21)
    x, wt, r = (rng.standard_normal(s).astype(np.float32) for s in ((40, 7, 9), (40, 100), (100, 7, 9)))
    shifted = np.concatenate([np.zeros((100, 7, 1)), r[:, :, :-1]], axis=2) if guarded else r
    want = np.tanh(np.einsum("chw,cm->mhw", x.astype(np.float64), wt) + shifted)
    kernel = polyc.define(src)
    compiled = kernel.specialize(x, wt, r)
    ir_text = compiled.stage("llvm")
    assert "llvm.masked.scatter" in ir_text and "llvm.masked.gather" in ir_text
    assert re.search(r'asm\s+"",\s*"=r,0"\(ptr %"T"\)', ir_text)
    if not guarded:  # the epilogue in the tile's own order: no laundering
        own_src = (src.replace("float(M,H,W) R", "float(H,W,M) R").replace("R(m, h, w)", "R(h, w, m)")
                   .replace("Y(m, h, w) =", "Y(h, w, m) ="))
        r_own = np.ascontiguousarray(r.transpose(1, 2, 0))
        own = polyc.define(own_src).specialize(x, wt, r_own)
        assert "asm " not in own.stage("llvm")
        np.testing.assert_allclose(own(x, wt, r_own), want.transpose(1, 2, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(compiled(x, wt, r), want, rtol=1e-4, atol=1e-4)
    naive = kernel.specialize(x, wt, r, options=Options.naive())
    np.testing.assert_allclose(compiled(x, wt, r), naive(x, wt, r), rtol=1e-5, atol=1e-5)
    two = kernel.specialize(x, wt, r, options=Options(threads=2))
    np.testing.assert_allclose(two(x, wt, r), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cpu", [None, "znver3"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("stride", [2, 3, 4])
def test_strided_window_max_min_and_copy_with_nan(monkeypatch, cpu, dtype, stride):
    """Vector reads of stride 2-4 (full vector loads of the span, joined and picked; the last load ends where
    the span ends) feeding ``max=!``/``min=!`` reductions (``maxps``/``minps`` and a NaN blend on x86) and a
    plain strided copy, against numpy: NaN anywhere in a window gives NaN, wherever it falls in the lanes;
    rows whose span ends exactly at the end of the tensor."""
    _target_cpu(monkeypatch, cpu)
    rows, out = 5, 37  # 37 outputs: full vectors and a remainder with either ISA and dtype
    width = stride * (out - 1) + 3
    src = f"""def w(float{'' if dtype == 'float32' else '64'}({rows},{width}) X) -> (Mx, Mn, C) {{
        Mx(r, o) max=! X(r, {stride}*o + t) where t in 0:3, o in 0:{out}
        Mn(r, o) min=! X(r, {stride}*o + t) where t in 0:3, o in 0:{out}
        C(r, o) = X(r, {stride}*o + 2) where o in 0:{out}
    }}"""
    k = polyc.define(src.replace("float64(", "double("))
    rng = np.random.default_rng(stride)
    x = rng.standard_normal((rows, width)).astype(dtype)
    x[rng.random(x.shape) < 0.04] = np.nan
    x[0, :6] = [0.0, -0.0, np.inf, -np.inf, 0.0, -0.0]
    mx, mn, c = k(x)
    windows = np.stack([x[:, t:t + stride * (out - 1) + 1:stride] for t in range(3)])
    np.testing.assert_array_equal(mx, windows.max(axis=0))
    np.testing.assert_array_equal(mn, windows.min(axis=0))
    np.testing.assert_array_equal(c, windows[2])
    assert np.isnan(mx).any() and not np.isnan(mx).all()
