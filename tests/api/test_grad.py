"""polyc.grad: gradients of the kernel library's defs against central finite differences (float64) and
against hand-derived numpy gradients; the gradient defs compiled with every transformation off agree with
the optimized ones; errors for what cannot be differentiated.

The finite-difference check differentiates the scalar loss ``L = sum over outputs of sum(seed * Y)`` (seeds
random): ``dL/dx`` for sampled elements ``x`` of each float input is ``(L(x + e) - L(x - e)) / 2e``.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import polyc
from polyc import kernels
from polyc.errors import PolycError, ShapeError, UnsupportedError
from polyc.options import Options

SIZES = dict(N=2, C=3, H=7, W=6, M=4, KH=3, KW=2, G=2, D=5, K=6, T=4, B=2, NB=2, V=5, L=3, C1=2, C2=3, C3=2,
             N1=3, N2=2, NI=3, NJ=4, NK=5, NL=2, NM=3, NR=2, NQ=3, NP=4)
POSITIVE = {"var", "eps"}
SCALARS = {"lo": -0.3, "hi": 0.4}

#: Every def of the library with a float input: (family, def).
FAMILIES = ("batchnorm", "concat", "conv2d", "elementwise", "gather", "layernorm", "matmul", "pad", "polybench",
            "pool", "reduce", "softmax", "transpose")


def _library():
    found = []
    for family in FAMILIES:
        for d in polyc.lang.parse(kernels.source(family)).defs:
            if any(p.dtype in ("float32", "float64", "float", "double") for p in d.params):
                found.append((family, d.name))
    return found


def double_source(text: str) -> str:
    """The defs of ``text`` with float32 tensors made float64 (literals adopt the type they meet)."""
    return re.sub(r"\bfloat(32)?(?=[( ])", "double", text)


def make_inputs(kernel, rng, sizes=SIZES):
    arrays = []
    for t in kernel.checked.inputs:
        shape = tuple(d.value if isinstance(d.value, int) else sizes[d.value] for d in (t.dims or ()))
        if t.name in SCALARS:
            arrays.append(np.array(SCALARS[t.name], dtype=t.dtype))
        elif t.dtype.startswith(("int", "uint")):
            lo, hi = (-2, sizes["V"] + 2) if kernel.name == "take_clamped" else (0, sizes["V"])
            arrays.append(rng.integers(lo, hi, shape).astype(t.dtype))
        elif t.dtype == "bool":
            arrays.append(rng.random(shape) < 0.5)
        elif t.name in POSITIVE:
            arrays.append(rng.uniform(0.5, 1.5, shape).astype(t.dtype))
        else:
            arrays.append(rng.uniform(-1.0, 1.0, shape).astype(t.dtype))
    return arrays


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def finite_difference_check(kernel, inputs, wrt, rng, samples=8, eps=1e-6):
    """The worst relative error between polyc.grad and central differences over sampled elements."""
    g = polyc.grad(kernel, wrt=wrt)
    outputs = as_tuple(kernel(*inputs))
    seeds = [rng.uniform(-1.0, 1.0, o.shape) if o.dtype.kind == "f" else np.zeros(o.shape, o.dtype)
             for o in outputs]  # a seed per output; one of a bool or integer output is ignored
    grads = as_tuple(g(*inputs, *seeds))
    assert len(grads) == len(wrt)

    def loss(arrays):
        return sum(float(np.sum(s * y)) for s, y in zip(seeds, as_tuple(kernel(*arrays))) if y.dtype.kind == "f")

    names = [t.name for t in kernel.checked.inputs]
    worst = 0.0
    for name, gradient in zip(wrt, grads):
        i = names.index(name)
        assert gradient.shape == inputs[i].shape and gradient.dtype == inputs[i].dtype
        for p in rng.choice(max(inputs[i].size, 1), min(samples, max(inputs[i].size, 1)), replace=False):
            up = [a.copy() for a in inputs]
            down = [a.copy() for a in inputs]
            up[i].reshape(-1)[p] += eps
            down[i].reshape(-1)[p] -= eps
            fd = (loss(up) - loss(down)) / (2 * eps)
            worst = max(worst, abs(fd - gradient.reshape(-1)[p]) / max(1.0, abs(fd)))
    return worst


@pytest.mark.parametrize("family,name", _library())
def test_library_gradient_matches_finite_differences(family, name):
    kernel = polyc.define(double_source(kernels.source(family)), name)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    inputs = make_inputs(kernel, rng)
    wrt = [t.name for t in kernel.checked.inputs if t.dtype == "float64"]
    assert finite_difference_check(kernel, inputs, wrt, rng) < 1e-6


@pytest.mark.parametrize("family,name", [("matmul", "matmul"), ("conv2d", "conv2d_pad1"), ("conv2d", "conv2d_s2"),
                                         ("softmax", "softmax"), ("pool", "maxpool3x3_s2_pad1"),
                                         ("layernorm", "layernorm"), ("gather", "embedding_bag_sum")])
def test_gradient_naive_equals_optimized(family, name):
    """The float32 gradient def compiled with every transformation off gives the optimized one's result."""
    kernel = kernels.load(family, name)
    rng = np.random.default_rng(1)
    sizes = dict(SIZES, H=13, W=11, C=5, M=7, N=3, K=17, D=19)
    inputs = make_inputs(kernel, rng, sizes)
    seeds = [rng.uniform(-1, 1, o.shape).astype(np.float32) for o in as_tuple(kernel(*inputs))]
    wrt = [t.name for t in kernel.checked.inputs if t.dtype == "float32" and t.dims]
    fast = as_tuple(polyc.grad(kernel, wrt=wrt)(*inputs, *seeds))
    slow = as_tuple(polyc.grad(kernel, wrt=wrt, options=Options.naive())(*inputs, *seeds))
    for a, b in zip(fast, slow):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_matmul_gradient_is_the_transposed_products():
    mm = kernels.load("matmul", "matmul")
    rng = np.random.default_rng(2)
    for m, k, n in ((1, 1, 1), (3, 7, 5), (17, 31, 13)):
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        dc = rng.standard_normal((m, n), np.float32)
        da, db = polyc.grad(mm, wrt=("A", "B"))(a, b, dc)
        np.testing.assert_allclose(da, dc @ b.T, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(db, a.T @ dc, rtol=1e-4, atol=1e-4)


def _conv_reference(x, f, dy, stride, pad):
    """dX and dF of Y = conv(X, F) (NCHW, correlation) by scattering each output's seed."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    dxp, df = np.zeros_like(xp), np.zeros_like(f)
    kh, kw = f.shape[2:]
    for h in range(dy.shape[2]):
        for w in range(dy.shape[3]):
            window = xp[:, :, h * stride:h * stride + kh, w * stride:w * stride + kw]
            df += np.einsum("nm,nchw->mchw", dy[:, :, h, w], window)
            dxp[:, :, h * stride:h * stride + kh, w * stride:w * stride + kw] += \
                np.einsum("nm,mchw->nchw", dy[:, :, h, w], f)
    return dxp[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]], df


@pytest.mark.parametrize("name,stride,pad", [("conv2d", 1, 0), ("conv2d_pad1", 1, 1), ("conv2d_s2", 2, 0)])
def test_conv2d_gradient_matches_numpy(name, stride, pad):
    conv = kernels.load("conv2d", name)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 9, 8), np.float32)
    f = rng.standard_normal((4, 3, 3, 3), np.float32)
    dy = rng.standard_normal(conv(x, f).shape, np.float32)
    dx, df = polyc.grad(conv, wrt=("X", "F"))(x, f, dy)
    want_dx, want_df = _conv_reference(x, f, dy, stride, pad)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(df, want_df, rtol=1e-4, atol=1e-4)


def test_softmax_and_layernorm_gradients_match_numpy():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 11)).astype(np.float32)
    dy = rng.standard_normal((5, 11)).astype(np.float32)
    y = kernels.load("softmax", "softmax")(x)
    dx = polyc.grad(kernels.load("softmax", "softmax"), wrt="X")(x, dy)
    np.testing.assert_allclose(dx, y * (dy - np.sum(dy * y, axis=1, keepdims=True)), rtol=1e-4, atol=1e-5)

    gamma, beta = rng.standard_normal(11).astype(np.float32), rng.standard_normal(11).astype(np.float32)
    ln = kernels.load("layernorm", "layernorm")
    dx, dgamma, dbeta = polyc.grad(ln, wrt=("X", "gamma", "beta"))(x, gamma, beta, np.float32(1e-5), dy)
    mu, var = x.mean(1, keepdims=True), x.var(1, keepdims=True)
    r = 1 / np.sqrt(var + 1e-5)
    xhat = (x - mu) * r
    g = dy * gamma
    want = r * (g - g.mean(1, keepdims=True) - xhat * (g * xhat).mean(1, keepdims=True))
    np.testing.assert_allclose(dx, want, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(dgamma, np.sum(dy * xhat, 0), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dbeta, np.sum(dy, 0), rtol=1e-5, atol=1e-5)


def test_maxpool_routes_to_the_maximum_and_splits_ties():
    pool = kernels.load("pool", "maxpool2x2")
    x = np.array([[[[1, 5, 2, 2], [3, 0, 2, 2]]]], np.float32)
    dy = np.array([[[[10, 8]]]], np.float32)
    dx = polyc.grad(pool, wrt="X")(x, dy)
    np.testing.assert_array_equal(dx, [[[[0, 10, 2, 2], [0, 0, 2, 2]]]])


def test_relu_and_embedding_gradients():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    dy = rng.standard_normal((4, 6)).astype(np.float32)
    np.testing.assert_array_equal(polyc.grad(kernels.load("elementwise", "relu"), "X")(x, dy), dy * (x > 0))
    table = rng.standard_normal((5, 3)).astype(np.float32)
    idx = np.array([4, 0, 4, 2, 4, 0, 1], np.int32)
    dy = rng.standard_normal((7, 3)).astype(np.float32)
    want = np.zeros_like(table)
    np.add.at(want, idx, dy)
    got = polyc.grad(kernels.load("gather", "embedding"), "E")(table, idx, dy)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_product_gradient_with_zeros():
    prod = kernels.load("reduce", "prod_rows")
    x = np.array([[2, 3, 4], [2, 0, 5], [0, 3, 0]], np.float32)
    dy = np.array([1, 2, 3], np.float32)
    dx = polyc.grad(prod, wrt="X")(x, dy)
    np.testing.assert_array_equal(dx, [[12, 8, 6], [0, 20, 0], [0, 0, 0]])


def test_gradient_source_is_a_def_that_compiles_on_its_own():
    conv = kernels.load("conv2d", "conv2d_pad1")
    g = polyc.grad(conv, wrt=("X", "F"))
    assert g.source.startswith("def conv2d_pad1_grad(")
    again = polyc.define(g.source)
    rng = np.random.default_rng(6)
    x, f = rng.standard_normal((1, 2, 5, 5), np.float32), rng.standard_normal((3, 2, 3, 3), np.float32)
    dy = rng.standard_normal((1, 3, 5, 5), np.float32)
    for a, b in zip(g(x, f, dy), again(x, f, dy)):
        np.testing.assert_array_equal(a, b)
    assert "for" in g.specialize(x, f, dy).stage("ast")


def test_errors():
    mm = kernels.load("matmul", "matmul")
    with pytest.raises(PolycError, match="'Z' is not an input"):
        polyc.grad(mm, wrt="Z")
    with pytest.raises(PolycError, match="only float inputs"):
        polyc.grad(kernels.load("gather", "embedding"), wrt="idx")
    with pytest.raises(ShapeError, match="'dC'"):
        polyc.grad(mm, wrt="A")(np.ones((2, 3), np.float32), np.ones((3, 4), np.float32),
                                np.ones((2, 5), np.float32))
    lg = polyc.define("def f(float(N) X) -> (Y) { Y(i) = lgamma(X(i)) }")
    with pytest.raises(UnsupportedError, match="lgamma"):
        polyc.grad(lg, wrt="X")
    half = polyc.define("def f(half(N) X) -> (Y) { Y(i) = float(X(i)) }")
    with pytest.raises(UnsupportedError, match="float16"):
        polyc.grad(half, wrt="X")


def test_range_the_gradient_cannot_see_is_refused_not_guessed():
    """TC's range inference on symbolic sizes: ``B(i + 1)`` keeps ``i`` below N - 1 (the tighter of two
    comparable bounds). Bounds of different sizes (``A(i)`` of N, ``B(i)`` of M) cannot be compared: the
    output's extent is assumed to be the first, checked at the call, and refused there naming the index when
    range inference says otherwise; a where clause settles it."""
    rng = np.random.default_rng(8)
    a, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    shifted = polyc.define("def f(float(N) A, float(N) B) -> (C) { C(i) = A(i) * B(i + 1) }")
    np.testing.assert_allclose(polyc.grad(shifted, "B")(a, b, np.ones(5, np.float32)), np.append(0, a[:5]),
                               rtol=1e-6)
    two = polyc.define("def f(float(N) A, float(M) B) -> (C) { C(i) = A(i) * B(i) }")
    with pytest.raises(UnsupportedError, match="index 'i'.*ranges over 0:6.*gives 0:5"):
        polyc.grad(two, "A")(a, b[:5], np.ones(5, np.float32))
    np.testing.assert_allclose(polyc.grad(two, "A")(a[:5], b, np.ones(5, np.float32)), b[:5], rtol=1e-6)
    fixed = polyc.define("def f(float(N) A, float(M) B) -> (C) { C(i) = A(i) * B(i) where i in 0:M }")
    np.testing.assert_allclose(polyc.grad(fixed, "A")(a, b[:5], np.ones(5, np.float32)), np.append(b[:5], 0),
                               rtol=1e-6)
    k = polyc.define("def f(float(N) A, float(M) B) -> (C) { C(i) +=! A(i + j) * B(j) where i in 0:N-M+1 }")
    x = polyc.define("def f(float(N) A, float(N) B) -> (C) { C(i) = A(i) * B(i) where i in 0:N-1 }")
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    dy = rng.standard_normal(5).astype(np.float32)
    np.testing.assert_allclose(polyc.grad(x, "A")(a, b, dy), np.append(dy * b[:5], 0), rtol=1e-6)
    b3 = b[:3]
    dy = rng.standard_normal(4).astype(np.float32)
    want = np.zeros(6, np.float32)
    for i in range(4):
        want[i:i + 3] += dy[i] * b3
    np.testing.assert_allclose(polyc.grad(k, "A")(a, b3, dy), want, rtol=1e-5, atol=1e-6)


def test_training_script_loss_falls_as_in_numpy(capsys):
    """scripts/train_grad.py: an MLP and a CNN trained with polyc's forward and gradient kernels only; its
    exit status says both losses fell below half their start and stayed within 1% of numpy's."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "train_grad.py"
    spec = importlib.util.spec_from_file_location("train_grad", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--steps", "40", "--every", "40"]) == 0
    assert "agrees" in capsys.readouterr().out


@pytest.mark.parametrize("block", range(4))
def test_gradients_of_random_programs_match_finite_differences_or_are_refused(block):
    """The fuzzer's random programs (tests/fuzz_programs.py: shifted, strided, transposed and data-dependent
    indices, guards, every reduction, builtins) in float64: each gradient either matches central
    differences or is refused with a PolycError naming why; none is silently wrong, none crashes."""
    import fuzz_programs

    differentiated = 0
    for seed in range(block * 25, block * 25 + 25):
        program = fuzz_programs.generate(seed, parallel=False)
        valid = [k for k in range(len(program.sizes)) if fuzz_programs.reference(program, k).kind == "ok"]
        if program.dtype == "int32" or not valid:
            continue
        kernel = polyc.define(double_source(program.text))
        inputs = [np.asarray(a, np.float64) if np.asarray(a).dtype.kind == "f" else np.asarray(a)
                  for a in fuzz_programs.reference(program, valid[0]).inputs]
        wrt = [t.name for t in kernel.checked.inputs if t.dtype == "float64"]
        if not wrt:
            continue
        try:
            worst = finite_difference_check(kernel, inputs, wrt, np.random.default_rng(seed), samples=4)
        except PolycError:
            continue
        assert worst < 1e-5, f"seed {seed}: {worst}\n{program.text}"
        differentiated += 1
    assert differentiated >= 5
