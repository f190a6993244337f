"""Generic kernels (``Options(generic=True)``): one compile with the sizes as isl parameters serves every shape;
results equal numpy's and the unoptimised specialised kernel's on many shapes, 1 and primes among them."""
import numpy as np
import pytest

import polyc
from polyc.errors import RangeError, ShapeError
from polyc.kernels import source as load_source

NAIVE = polyc.Options.naive()


def _shapes(rng, hint: dict, n: int, fixed: dict | None = None) -> list[dict]:
    """``n`` size assignments: all ones, primes, and random values up to twice the hint (``fixed`` sizes
    keep their value)."""
    primes = [2, 3, 5, 7, 11, 13, 17, 31, 37, 61]
    found = [{k: 1 for k in hint}, {k: primes[i % len(primes)] for i, k in enumerate(hint)}]
    while len(found) < n:
        found.append({k: int(rng.integers(1, 2 * v + 1)) for k, v in hint.items()})
    return [{**s, **(fixed or {})} for s in found]


def _inputs(kernel: polyc.Kernel, sizes: dict, rng) -> list[np.ndarray] | None:
    """Random inputs of ``kernel`` at ``sizes``; None where the def does not accept the sizes."""
    try:
        specs = kernel.signature(sizes)
    except polyc.PolycError:
        return None
    return [rng.standard_normal(t.shape).astype(t.dtype) for t in specs if t.role == "input"]


def _check(generic, naive, sizes, arrays, reference=None):
    got = generic(*arrays)
    want = naive(*arrays)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.shape == w.shape, sizes
        np.testing.assert_allclose(g, w, rtol=2e-4, atol=2e-4, err_msg=str(sizes))
    if reference is not None:
        np.testing.assert_allclose(got[0], reference(*arrays), rtol=2e-4, atol=2e-4, err_msg=str(sizes))


CASES = [  # (file, def, hint, sizes fixed in the random shapes, numpy reference)
    ("matmul", "matmul", dict(M=64, N=48, K=40), None, lambda a, b: a @ b),
    ("softmax", "softmax", dict(N=16, D=100), None,
     lambda x: np.exp(x - x.max(1, keepdims=True)) / np.exp(x - x.max(1, keepdims=True)).sum(1, keepdims=True)),
    ("conv2d", "conv2d", dict(N=1, C=8, H=12, W=13, M=16, KH=3, KW=3), None,
     lambda x, f: np.einsum("nchwij,mcij->nmhw",
                            np.lib.stride_tricks.sliding_window_view(x, f.shape[2:], axis=(2, 3)), f)),
    ("conv2d", "conv2d_pad1", dict(N=1, C=8, H=12, W=13, M=16, KH=3, KW=3), None, None),
    ("conv2d", "conv2d_s2", dict(N=2, C=4, H=15, W=14, M=8, KH=3, KW=3), None, None),
    ("conv2d", "conv2d_nhwc_pad1", dict(N=1, C=16, H=9, W=10, M=32, KH=3, KW=3), None, None),
]


@pytest.mark.parametrize("case", CASES, ids=[c[1] for c in CASES])
def test_one_compile_serves_every_shape(case):
    """One generic kernel against numpy and the naive specialised kernel on 24 shapes it accepts (sizes of 1,
    primes, random up to twice the hint); a single compile: the stages are those of the first call."""
    file, name, hint, fixed, reference = case
    rng = np.random.default_rng(len(name))
    kernel = polyc.define(load_source(file), name, options=polyc.Options(generic=True))
    naive = polyc.define(load_source(file), name, options=NAIVE)
    generic = kernel.generic(hint)
    checked = 0
    for sizes in _shapes(rng, hint, 80, fixed):
        arrays = _inputs(naive, sizes, rng)
        if arrays is None:  # e.g. a window larger than the image: the def refuses those sizes
            with pytest.raises(ShapeError):
                generic.at(sizes)
            continue
        _check(generic, naive, sizes, arrays, reference)
        checked += 1
        if checked == 24:
            break
    assert checked == 24
    assert kernel.generic({k: 1 for k in hint}) is generic  # the first hint's code stays
    assert kernel(*_inputs(naive, hint, rng)).shape is not None and len(kernel._compiled) == 1
    ast = generic.stages.text("ast")
    assert any(size in ast for size in hint), "the AST's bounds are the sizes, not numbers"


SWEEP = [polyc.Options(generic=True, tile=False), polyc.Options(generic=True, register_tile=False),
         polyc.Options(generic=True, vectorize=False), polyc.Options(generic=True, unroll=0),
         polyc.Options(generic=True, threads=2), polyc.Options(generic=True, tile_sizes=(5, 3, 7)),
         polyc.Options(generic=True, threads=2, register_tile_sizes=(3, 16)),
         polyc.Options(generic=True, promote=True)]  # packed panels allocated at the call's sizes


@pytest.mark.parametrize("options", SWEEP, ids=[o.to_spec() for o in SWEEP])
@pytest.mark.parametrize("name", ["matmul", "conv2d_pad1"])
def test_options_sweep(options, name):
    """Every transformation of a generic kernel, on and off, against the naive specialised kernel."""
    file = "matmul" if name == "matmul" else "conv2d"
    hint = CASES[0][2] if name == "matmul" else CASES[3][2]
    rng = np.random.default_rng(7)
    kernel = polyc.define(load_source(file), name, options=options)
    naive = polyc.define(load_source(file), name, options=NAIVE)
    generic = kernel.generic(hint)
    for sizes in _shapes(rng, hint, 8):
        arrays = _inputs(naive, sizes, rng)
        if arrays is not None:
            _check(generic, naive, sizes, arrays)


def test_sizes_outside_the_kernel_are_a_shape_error():
    """A window larger than the image empties the output's range: ShapeError naming the sizes, as the
    specialised kernel refuses them (RangeError)."""
    kernel = polyc.define(load_source("conv2d"), "conv2d", options=polyc.Options(generic=True))
    generic = kernel.generic(dict(N=1, C=2, H=8, W=8, M=4, KH=3, KW=3))
    x, f = np.ones((1, 2, 2, 8), np.float32), np.ones((4, 2, 3, 3), np.float32)
    with pytest.raises(ShapeError, match="outside what this generic kernel serves"):
        generic(x, f)
    with pytest.raises(ShapeError, match="outside what this generic kernel serves"):
        kernel(x, f)


def test_a_range_that_is_not_affine_in_the_sizes_is_refused():
    """``A(i) + B(i)`` bounds ``i`` by ``min(M, N)``: a specialised kernel takes the smaller extent, a generic
    one asks for a where clause instead of guessing."""
    source = "def add(float(M) A, float(N) B) -> (C) { C(i) = A(i) + B(i) }"
    kernel = polyc.define(source, options=polyc.Options(generic=True))
    with pytest.raises(RangeError, match="not one affine function of the sizes"):
        kernel.generic(dict(M=5, N=7))
    fixed = polyc.define("def add(float(M) A, float(M) B) -> (C) { C(i) = A(i) + B(i) }",
                         options=polyc.Options(generic=True))
    a, b = np.arange(3, dtype=np.float32), np.ones(3, np.float32)
    np.testing.assert_array_equal(fixed(a, b), a + b)


def test_disk_cache_reload(tmp_path, monkeypatch):
    """A generic kernel loaded from the disk cache by another Kernel runs every shape and shows its
    parametric stages."""
    monkeypatch.setenv("POLYC_CACHE_DIR", str(tmp_path))
    rng = np.random.default_rng(3)
    hint = dict(M=32, N=32, K=32)
    first = polyc.define(load_source("matmul"), "matmul", options=polyc.Options(generic=True)).generic(hint)
    second = polyc.define(load_source("matmul"), "matmul", options=polyc.Options(generic=True)).generic(hint)
    assert second._stages is None  # from the cache
    for m, n, k in ((1, 1, 1), (7, 33, 5), (64, 17, 40)):
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        np.testing.assert_allclose(second(a, b), a @ b, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(second(a, b), first(a, b))
    assert "M" in second.at(dict(M=3, N=3, K=3)).stage("ast")


def _families():
    from polyc.kernels import names
    return names()


@pytest.mark.parametrize("family", _families())
def test_every_library_family_generic(family):
    """The first def of every family of ``kernels/`` compiled generic at a small random hint, on shapes it
    accepts (random sizes 1..11) against the naive specialised kernel."""
    import polyc.lang
    rng = np.random.default_rng(sum(map(ord, family)))
    source = load_source(family)
    name = polyc.lang.parse(source).defs[0].name
    naive = polyc.define(source, name, options=NAIVE)
    hint = None
    for _ in range(50):
        candidate = {n: int(rng.integers(2, 9)) for n in naive.checked.sizes}
        if _inputs(naive, candidate, rng) is not None:
            hint = candidate
            break
    assert hint is not None
    generic = polyc.define(source, name, options=polyc.Options(generic=True, threads=2)).generic(hint)
    checked = 0
    for _ in range(60):
        sizes = {n: int(rng.integers(1, 12)) for n in naive.checked.sizes}
        specs = None
        try:
            specs = naive.signature(sizes)
        except polyc.PolycError:
            continue
        arrays = [rng.standard_normal(t.shape).astype(t.dtype) if t.dtype.startswith("float")
                  else rng.integers(0, 3, t.shape).astype(t.dtype) for t in specs if t.role == "input"]
        _check(generic, naive, sizes, arrays)
        checked += 1
        if checked == 4:
            break
    assert checked == 4
