"""Random einsum strings (hypothesis) through the whole pipeline, against numpy.einsum."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import polyc

LETTERS = "ijklm"


@st.composite
def einsum_cases(draw):
    extents = {c: draw(st.sampled_from([1, 2, 3, 5])) for c in LETTERS}
    n_operands = draw(st.integers(1, 3))
    operands = []
    for _ in range(n_operands):
        rank = draw(st.integers(0, 3))
        operands.append("".join(draw(st.lists(st.sampled_from(LETTERS), min_size=rank, max_size=rank))))
    used = sorted(set("".join(operands)))
    explicit = draw(st.booleans())
    if explicit:
        out = "".join(draw(st.permutations(used))[:draw(st.integers(0, len(used)))])
        spec = ",".join(operands) + "->" + out
    else:
        spec = ",".join(operands)
    shapes = [tuple(extents[c] for c in op) for op in operands]
    return spec, shapes


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(einsum_cases(), st.integers(0, 2**31 - 1))
def test_random_einsum_matches_numpy(case, seed):
    spec, shapes = case
    rng = np.random.default_rng(seed)
    arrays = [rng.uniform(-1, 1, s).astype(np.float32) for s in shapes]
    expected = np.einsum(spec, *arrays)
    got = polyc.einsum(spec, *arrays)
    assert np.shape(got) == np.shape(expected)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
