"""Imports point down DESIGN.md's table, and no polyc module imports itself back.

Every ``import`` statement of every module under ``polyc/`` is read, those inside functions included (an
import inside a function runs later, but it ties the two modules together all the same):

- a package imports only the polyc packages :data:`ALLOWED` lists for it (DESIGN.md's "Package layout"
  table), and islpy/llvmlite/onnx/networkx stay in the packages :data:`LIBRARIES` lists;
- the module import graph has no cycle. ``from . import x`` is an import of the submodule ``x``, ``from .m
  import name`` one of ``m`` (the package ``__init__`` when ``m`` is a package). The package ``__init__``
  Python runs before a submodule is not an edge: a package re-exporting its own submodules is no cycle;
- :data:`ALLOWED` itself is acyclic: no package may import one that may import it back.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2] / "polyc"

#: package (a directory or a top-level module of polyc; ``__init__`` is polyc's own) -> the polyc packages it
#: may import besides itself: DESIGN.md's table, lowest first. An entry for a package that does not exist
#: (yet) is harmless. codegen imports lang: the statement bodies it emits are lang expressions (the Scop
#: carries them as ``PolyStatement.rhs``). ``export`` (ahead-of-time C libraries) sits beside ``program``, under
#: ``onnx`` (whose model export uses it); DESIGN.md's table does not list it yet (that file is read-only here).
ALLOWED = {
    "errors": set(),
    "env": {"errors"},
    "debug": {"errors", "env"},
    "options": {"errors"},
    "target": {"errors", "env"},
    "lang": {"errors"},
    "poly": {"lang", "options", "errors", "debug", "env", "target"},
    "codegen": {"poly", "lang", "options", "errors", "debug", "env", "target"},
    "runtime": {"errors", "debug", "env", "target"},
    "pipeline": {"lang", "poly", "codegen", "options", "errors", "debug", "env", "target"},
    "kernel": {"lang", "poly", "codegen", "pipeline", "runtime", "options", "errors", "debug", "env", "target"},
    "program": {"kernel", "lang", "poly", "codegen", "pipeline", "runtime", "options", "errors", "debug", "env",
                "target"},
    "export": {"kernel", "program", "pipeline", "codegen", "runtime", "lang", "options", "errors", "debug", "env",
               "target"},
    "onnx": {"kernel", "program", "export", "options", "errors", "debug", "env", "target"},
    "tune": {"kernel", "pipeline", "runtime", "options", "errors", "debug", "env", "target"},
    "cli": {"kernel", "pipeline", "program", "export", "tune", "options", "errors", "debug", "env", "target", "onnx",
            "__init__"},
    "__init__": {"kernel", "options", "errors", "onnx"},
}
#: third-party library -> the packages where it may be imported (``target``: the host CPU's name and features)
LIBRARIES = {"islpy": {"poly", "codegen"}, "llvmlite": {"codegen", "target"}, "onnx": {"onnx"},
             "networkx": {"onnx"}, "onnxruntime": set()}

FILES = sorted(ROOT.rglob("*.py"))


def _module(path: Path) -> str:
    """``polyc/onnx/ops/core.py`` -> ``polyc.onnx.ops.core``; ``polyc/onnx/__init__.py`` -> ``polyc.onnx``."""
    parts = ("polyc",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(p): p for p in FILES}


def _package(module: str) -> str:
    """The row of the table a polyc module belongs to: ``polyc.onnx.ops.core`` -> ``onnx``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


@dataclass(frozen=True)
class Import:
    """One imported module: ``target`` absolute (``polyc.onnx.lower``, ``numpy``), where it is imported, and
    the function it is imported in (None: at module level)."""

    source: str
    target: str
    line: int
    function: str | None

    def where(self) -> str:
        place = f"{MODULES[self.source].relative_to(ROOT.parent)}:{self.line}"
        return place if self.function is None else f"{place}, inside function {self.function}()"


def _imports(path: Path):
    """Every :class:`Import` of the module at ``path``, those inside functions included."""
    module = _module(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]

    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield Import(module, alias.name, child.lineno, function)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    parts = package.split(".")
                    base = ".".join(parts[:len(parts) - (child.level - 1)] + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    yield Import(module, sub if sub in MODULES else base, child.lineno, function)
            else:
                inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
                yield from walk(child, inner)

    yield from walk(ast.parse(path.read_text()), None)


def _polyc_module(name: str) -> str | None:
    """The polyc module an import of ``name`` loads (``polyc.onnx.builder.Builder`` -> ``polyc.onnx.builder``),
    None for a library."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def module_graph() -> nx.DiGraph:
    """polyc module -> polyc module it imports; each edge's ``imports`` lists the :class:`Import` statements."""
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for path in FILES:
        for imp in _imports(path):
            target = _polyc_module(imp.target) if imp.target.split(".")[0] == "polyc" else None
            if target is None or target == imp.source:
                continue
            if not g.has_edge(imp.source, target):
                g.add_edge(imp.source, target, imports=[])
            g.edges[imp.source, target]["imports"].append(imp)
    return g


def _statements(g: nx.DiGraph, source: str, target: str) -> list:
    """The import statements of edge ``source -> target``, one per line."""
    return list({(i.line, i.function): i for i in g.edges[source, target]["imports"]}.values())


def _describe(g: nx.DiGraph, cycle: list) -> str:
    lines = []
    for source, target in cycle:
        lines.append(f"    {source} imports {target} ({'; '.join(i.where() for i in _statements(g, source, target))})")
    hidden = [i for s, t in cycle for i in _statements(g, s, t) if i.function is not None]
    note = ""
    if hidden:
        note = ("\n    the import(s) inside a function only hide the cycle: " + ", ".join(i.where() for i in hidden)
                + "\n    move what both modules need into a module of its own that both import")
    return "\n".join(lines) + note


def test_no_import_cycles():
    g = module_graph()
    knots = [sorted(c) for c in nx.strongly_connected_components(g) if len(c) > 1]
    cycles = [nx.find_cycle(g.subgraph(knot)) for knot in knots]
    message = "\n".join(f"import cycle {i + 1} (one of those through {', '.join(knot)}):\n{_describe(g, c)}"
                        for i, (knot, c) in enumerate(zip(knots, cycles)))
    assert not cycles, f"{len(cycles)} import cycle(s) between polyc modules:\n{message}"


def test_the_allowed_imports_are_acyclic():
    layers = nx.DiGraph([(p, q) for p, allowed in ALLOWED.items() for q in allowed])
    assert set(layers) <= set(ALLOWED), f"ALLOWED names unknown packages: {set(layers) - set(ALLOWED)}"
    cycle = next(iter(nx.simple_cycles(layers)), None)
    assert cycle is None, f"ALLOWED lets these packages import each other in a circle: {' -> '.join(cycle)}"


def test_every_package_has_a_row():
    missing = sorted({_package(m) for m in MODULES} - set(ALLOWED))
    assert not missing, f"packages missing from ALLOWED (and DESIGN.md's table): {missing}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_follow_the_layers(path):
    package = _package(_module(path))
    for imp in _imports(path):
        top = imp.target.split(".")[0]
        if top == "polyc":
            target = _package(_polyc_module(imp.target))
            if target != package:
                assert target in ALLOWED.get(package, set()), \
                    f"{imp.where()}: {package} may not import polyc.{target} (DESIGN.md's table)"
        elif top in LIBRARIES:
            assert package in LIBRARIES[top], f"{imp.where()}: {top} may be imported only in {LIBRARIES[top]}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_stay_small(path):
    assert len(path.read_text().splitlines()) <= 900, f"{path} is over the ~800-line budget"
