"""polyc's operator library: Tensor Comprehensions definitions shipped as package data.

Each ``<family>.tc`` file in this package holds the defs of one operator family (``matmul``, ``conv2d``,
``softmax``, ...), each documented by a ``#`` comment above it. Load one by family and def name::

    >>> import polyc.kernels
    >>> polyc.kernels.names()                              # doctest: +SKIP
    ['batchnorm', 'concat', 'conv2d', ...]
    >>> matmul = polyc.kernels.load("matmul", "matmul_tn")  # doctest: +SKIP
    >>> C = matmul(A, B)                                    # doctest: +SKIP

This module does not import the compiler until :func:`load` is called.
"""
from __future__ import annotations

import importlib.resources
from pathlib import Path

_SUFFIX = ".tc"


def _package_files():
    return importlib.resources.files(__name__)


def names() -> list[str]:
    """The family names: the stems of the ``.tc`` files of the library, sorted."""
    return sorted(entry.name[: -len(_SUFFIX)] for entry in _package_files().iterdir()
                  if entry.name.endswith(_SUFFIX) and entry.is_file())


def _check_family(family: str) -> None:
    available = names()
    if family not in available:
        from polyc.errors import PolycError
        raise PolycError(f"unknown kernel family {family!r}; available families: {', '.join(available)}",
                         hint="polyc.kernels.names() lists the families")


def path(family: str) -> Path:
    """The file holding the defs of ``family``."""
    _check_family(family)
    return Path(str(_package_files() / f"{family}{_SUFFIX}"))


def source(family: str) -> str:
    """The TC text of ``family`` (every def of the file)."""
    _check_family(family)
    return (_package_files() / f"{family}{_SUFFIX}").read_text(encoding="utf-8")


def load(family: str, name: str | None = None, options=None):
    """``polyc.define`` on the source of ``family``: the def called ``name`` (or as ``define`` picks when
    ``name`` is None), compiled with ``options`` when given."""
    text = source(family)
    import polyc
    if options is None:
        return polyc.define(text, name=name)
    return polyc.define(text, name=name, options=options)
