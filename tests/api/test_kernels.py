"""The operator library (``kernels/*.tc``) against numpy.

Every def of every family runs on the shapes of its :class:`~kernel_refs.KernelCase` and is compared with
the case's numpy reference: same number of outputs, same shapes, same dtypes, values within the dtype's
tolerance (exact for integers), inputs left untouched. Each def is also compiled with every transformation
off (``Options.naive()``) and checked on one shape, so a failure can be pinned on lowering or on a transform.
"""
from __future__ import annotations

import functools
import importlib.util
import re
import sys
from pathlib import Path

import numpy as np
import pytest

from kernel_refs import CASES, KernelCase, run_and_compare, shape_id

from polyc.options import Options

KERNEL_DIR = Path(__file__).resolve().parents[2] / "kernels"
DEF_RE = re.compile(r"^\s*def\s+([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.MULTILINE)


def _kernels_module():
    """``polyc.kernels``; when polyc is used from a source checkout without being installed (so the
    ``package_dir`` mapping of setup.cfg is not in effect), load it from ``kernels/`` under that name."""
    try:
        import polyc.kernels as module
        return module
    except ModuleNotFoundError:
        import polyc
        spec = importlib.util.spec_from_file_location("polyc.kernels", KERNEL_DIR / "__init__.py",
                                                      submodule_search_locations=[str(KERNEL_DIR)])
        module = importlib.util.module_from_spec(spec)
        sys.modules["polyc.kernels"] = module
        spec.loader.exec_module(module)
        polyc.kernels = module
        return module


kernels = _kernels_module()


def _defs_in_files() -> set[tuple[str, str]]:
    found = set()
    for tc in sorted(KERNEL_DIR.glob("*.tc")):
        text = "\n".join(line.split("#", 1)[0] for line in tc.read_text().splitlines())
        found.update((tc.stem, name) for name in DEF_RE.findall(text))
    return found


@functools.lru_cache(maxsize=None)
def _kernel(family: str, name: str, naive: bool = False):
    return kernels.load(family, name, options=Options.naive() if naive else None)


def _params():
    for case in CASES:
        for shape in case.shapes:
            yield pytest.param(case, shape, id=f"{case.id}[{shape_id(shape)}]")


def _check(case: KernelCase, shape: dict, naive: bool = False):
    run_and_compare(case, shape, _kernel(case.family, case.name, naive))


@pytest.mark.parametrize("case,shape", list(_params()))
def test_kernel_matches_numpy(case: KernelCase, shape: dict):
    _check(case, shape)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_kernel_without_transforms_matches_numpy(case: KernelCase):
    """The same def compiled with every transformation off (Options.naive()), on its second shape: a failure
    here and not above points at lowering; above and not here, at a transformation."""
    _check(case, case.shapes[1], naive=True)


def test_every_def_has_a_case():
    in_files = _defs_in_files()
    in_cases = {(case.family, case.name) for case in CASES}
    assert in_files, "no defs found in kernels/*.tc"
    assert not in_files - in_cases, f"defs without a KernelCase: {sorted(in_files - in_cases)}"
    assert not in_cases - in_files, f"KernelCases without a def: {sorted(in_cases - in_files)}"


def test_cases_are_unique_and_shapes_cover_small_extents():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert len(case.shapes) >= 3, case.id
        extents = {v for shape in case.shapes for v in shape.values()}
        assert 1 in extents, f"{case.id}: no shape has an extent of 1"
        assert extents & {3, 5, 7, 13}, f"{case.id}: no odd prime extent"


def test_names_are_the_tc_files():
    assert kernels.names() == sorted(p.stem for p in KERNEL_DIR.glob("*.tc"))


def test_source_and_path():
    for family in kernels.names():
        assert kernels.path(family).name == f"{family}.tc"
        assert kernels.source(family) == kernels.path(family).read_text()
        assert DEF_RE.search(kernels.source(family)), family


def test_unknown_family_lists_the_families():
    from polyc.errors import PolycError
    for call in (kernels.load, kernels.source, kernels.path):
        with pytest.raises(PolycError) as info:
            call("nope")
        message = str(info.value)
        assert "nope" in message
        for family in kernels.names():
            assert family in message
