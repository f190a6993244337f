"""Shared test configuration: golden files with --accept, the between-stage verifier on."""
import os

import pytest

os.environ.setdefault("POLYC_VERIFY", "1")


def pytest_addoption(parser):
    parser.addoption("--accept", action="store_true", default=False,
                     help="rewrite golden files under tests/poly/golden/ with the current output")


@pytest.fixture
def accept(request):
    return request.config.getoption("--accept")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Each test session gets its own disk cache, so tests never read a developer's cache. The workers of one
    ``-n 2`` session share it (the parent of a worker's base temp is the session's): a kernel one worker
    compiled, the other loads (writes are atomic renames, :func:`polyc.runtime.cache.store`)."""
    if "POLYC_CACHE_DIR" not in os.environ:
        base = tmp_path_factory.getbasetemp()
        folder = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "polyc-cache"
        folder.mkdir(exist_ok=True)
        os.environ["POLYC_CACHE_DIR"] = str(folder)
    yield


#: The reason onnx's ``BackendTest`` gives a case that no ``include`` pattern matched: its
#: ``Runner._filtered_test_items`` wraps the test in ``unittest.skip("no matched include pattern")``, which sets
#: ``__unittest_skip_why__`` on the test function (onnx.backend.test.runner, onnx 1.14 to 1.19).
ONNX_NOT_INCLUDED = "no matched include pattern"


def _onnx_not_included(item) -> bool:
    """A case of onnx's backend suite that tests/onnx/test_onnx_backend.py did not include (an unsupported op, the
    CUDA device): not part of polyc's suite. Any other skip, of those cases or others, stays a skip."""
    func = getattr(item, "obj", None)
    return getattr(func, "__unittest_skip__", False) and getattr(func, "__unittest_skip_why__", None) == ONNX_NOT_INCLUDED


#: onnx's Attention cases (opset 23/24) that run by default: each feature once — 3-D and 4-D inputs, float, bool,
#: 3-D and 4-D masks, causal, grouped-query heads, different head sizes for V, scale, softcap, past and present
#: key/value, the four ``qk_matmul_output_mode`` values, the non-padded prefill/decode lengths, local windows,
#: fully masked rows, float16 and bfloat16. The other ~70 cases combine these features (about 1 s of compiling
#: each) and run with ``-m slow``.
ATTENTION_DEFAULT = frozenset(f"test_attention_{name}_cpu" for name in """
    3d 4d 4d_attn_mask 4d_attn_mask_bool 4d_attn_mask_3d_causal 4d_attn_mask_4d 4d_causal 4d_gqa
    4d_diff_heads_sizes 4d_scaled 4d_softcap 4d_with_past_and_present 3d_gqa_with_past_and_present
    4d_with_qk_matmul 4d_with_qk_matmul_bias 4d_with_qk_matmul_softcap 4d_with_qk_matmul_softmax
    4d_with_past_and_present_qk_matmul_bias_4d_mask_causal 4d_causal_nonpad_batch_prefill
    4d_gqa_causal_nonpad_decode local_window local_window_with_past 23_boolmask_fullymasked_row_nan_robustness
    24_fullymasked_qk_matmul_output_mode3_zero 4d_softcap_neginf_mask_poison 4d_fp16 3d_causal_bf16
    """.split())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """onnx's backend cases that test_onnx_backend.py does not include are deselected (reported as such, not
    as ~3,400 skips that would hide a real one). Its cases of function-body expansions (``*_expanded``: the
    same computation as their un-expanded case, as a graph of primitive ops; about 400 cases, 3 minutes) and
    its Attention cases but :data:`ATTENTION_DEFAULT` run with ``-m slow``."""
    not_included = [item for item in items if _onnx_not_included(item)]
    if not_included:
        dropped = set(map(id, not_included))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=not_included)
    for item in items:
        if not item.nodeid.startswith("tests/onnx/test_onnx_backend.py"):
            continue
        if "_expanded_" in item.nodeid or (item.name.startswith("test_attention_")
                                           and item.name not in ATTENTION_DEFAULT):
            item.add_marker(pytest.mark.slow)
