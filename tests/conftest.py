"""Shared test configuration: golden files with --accept, the between-stage verifier on."""
import os

import pytest

os.environ.setdefault("POLYC_VERIFY", "1")


def pytest_addoption(parser):
    parser.addoption("--accept", action="store_true", default=False,
                     help="rewrite golden files under tests/golden/ with the current output")


@pytest.fixture
def accept(request):
    return request.config.getoption("--accept")


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Each test session gets its own disk cache, so tests never read a developer's cache."""
    if "POLYC_CACHE_DIR" not in os.environ:
        os.environ["POLYC_CACHE_DIR"] = str(tmp_path_factory.mktemp("polyc-cache"))
    yield


#: The reason onnx's ``BackendTest`` gives a case that no ``include`` pattern matched: its
#: ``Runner._filtered_test_items`` wraps the test in ``unittest.skip("no matched include pattern")``, which sets
#: ``__unittest_skip_why__`` on the test function (onnx.backend.test.runner, onnx 1.14 to 1.19).
ONNX_NOT_INCLUDED = "no matched include pattern"


def _onnx_not_included(item) -> bool:
    """A case of onnx's backend suite that tests/test_onnx_backend.py did not include (an unsupported op, the
    CUDA device): not part of polyc's suite. Any other skip, of those cases or others, stays a skip."""
    func = getattr(item, "obj", None)
    return getattr(func, "__unittest_skip__", False) and getattr(func, "__unittest_skip_why__", None) == ONNX_NOT_INCLUDED


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """onnx's backend cases that test_onnx_backend.py does not include are deselected (reported as such, not
    as ~3,400 skips that would hide a real one). Its cases of function-body expansions (``*_expanded``: the
    same computation as their un-expanded case, as a graph of primitive ops) run with ``-m slow``; about 400
    cases, 3 minutes."""
    not_included = [item for item in items if _onnx_not_included(item)]
    if not_included:
        dropped = set(map(id, not_included))
        items[:] = [item for item in items if id(item) not in dropped]
        config.hook.pytest_deselected(items=not_included)
    for item in items:
        if item.nodeid.startswith("tests/test_onnx_backend.py") and "_expanded_" in item.nodeid:
            item.add_marker(pytest.mark.slow)
