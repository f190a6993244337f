"""Imports point down DESIGN.md's table: a module may import only the polyc packages listed for it, and
islpy/llvmlite/onnx/networkx stay in their packages."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "polyc"

#: package → polyc packages it may import (besides itself)
ALLOWED = {
    "errors": set(),
    "debug": {"errors"},
    "options": {"errors"},
    "lang": {"errors", "debug"},
    "poly": {"lang", "options", "errors", "debug"},
    "codegen": {"poly", "lang", "options", "errors", "debug"},
    "runtime": {"errors", "debug"},
    "kernel": {"lang", "poly", "codegen", "runtime", "options", "errors", "debug"},
    "onnx": {"kernel", "options", "errors", "debug", "__init__"},
    "tune": {"kernel", "options", "errors", "debug"},
    "cli": {"kernel", "options", "errors", "debug", "onnx", "__init__"},
    "__init__": {"kernel", "options", "errors", "onnx"},
}
#: third-party library → the packages where it may be imported
LIBRARIES = {"islpy": {"poly", "codegen"}, "llvmlite": {"codegen"}, "onnx": {"onnx"},
             "networkx": {"onnx"}, "onnxruntime": set()}


def _package(path: Path) -> str:
    rel = path.relative_to(ROOT)
    return rel.parts[0].removesuffix(".py")


def _imports(path: Path):
    tree = ast.parse(path.read_text())
    pkg = _package(path)
    depth = len(path.relative_to(ROOT).parts) - 1
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                yield node.lineno, node.module or ""
            else:
                up = node.level - 1
                if up < depth:  # inside the same package
                    yield node.lineno, f"polyc.{pkg}"
                else:
                    target = (node.module or "").split(".")[0]
                    if target:
                        yield node.lineno, f"polyc.{target}"
                    else:
                        for alias in node.names:
                            yield node.lineno, f"polyc.{alias.name}"


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    pkg = _package(path)
    for line, module in _imports(path):
        top = module.split(".")[0]
        if top == "polyc":
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else "__init__"
            if target == pkg:
                continue
            assert target in ALLOWED[pkg], f"{path.name}:{line}: {pkg} may not import polyc.{target}"
        elif top in LIBRARIES:
            assert pkg in LIBRARIES[top], f"{path.name}:{line}: {top} may be imported only in {LIBRARIES[top]}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_stay_small(path):
    assert len(path.read_text().splitlines()) <= 900, f"{path} is over the ~800-line budget"
