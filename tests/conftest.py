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


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """onnx's backend cases of function-body expansions (``*_expanded``: the same computation as their
    un-expanded case, as a graph of primitive ops) run with ``-m slow``; about 400 cases, 3 minutes."""
    for item in items:
        if item.nodeid.startswith("tests/test_onnx_backend.py") and "_expanded_" in item.nodeid:
            item.add_marker(pytest.mark.slow)
