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
