"""onnx's backend test suite driven through ``polyc.onnx.backend``, on the node tests of the supported ops.

The node cases come from ``onnx.backend.test.loader`` in memory (the wheel lacks the data directory). A case
is included when every op of its model is one polyc supports (``polyc.onnx.ops.CONVERTERS``, the alias
ops, the sequence ops resolved by ``polyc.onnx.sequences`` and the string ops of ``polyc.onnx.strings``); the count of passes is quoted in the README.
The cases not included (other ops, the CUDA device) are deselected at collection by tests/conftest.py, so a
skip in this file is a real one.
Run ``pytest tests/onnx/test_onnx_backend.py -q`` to count.
"""
import re
import warnings
from pathlib import Path

import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

import polyc.onnx.backend
from polyc.onnx.ops import CONVERTERS
from polyc.onnx.sequences import OPTIONAL_OPS, SEQUENCE_OPS
from polyc.onnx.strings import HOST_OPS

SUPPORTED = set(CONVERTERS) | {"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Dropout"} \
    | set(SEQUENCE_OPS) | set(OPTIONAL_OPS) | set(HOST_OPS)


def supported_node_tests():
    """Names of node test cases whose models use only supported ops."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cases = load_model_tests(kind="node")
    names = []
    for case in cases:
        model = case.model
        if model is None:
            continue
        if all(n.op_type in SUPPORTED and n.domain in ("", "ai.onnx") for n in model.graph.node):
            names.append(case.name)
    return sorted(names)


def known_failures() -> list[str]:
    """The cases listed in ``onnx_backend_known_failures/*.txt`` (one file per converter family, grouped by
    cause): expected failures, so the rest must pass, and a listed case that starts passing is reported (an
    unexpected success fails the run)."""
    folder = Path(__file__).resolve().parent / "onnx_backend_known_failures"
    return [line.strip() for path in sorted(folder.glob("*.txt")) for line in path.read_text().splitlines()
            if line.strip() and not line.startswith("#")]


def any_of(names, prefix: str = "") -> str:
    """One pattern matching exactly the case names ``prefix + name + "_cpu"``: onnx's runner searches every
    pattern in every case name, so a thousand patterns of one name each took seconds of every collection."""
    return rf"^{re.escape(prefix)}(?:{'|'.join(re.escape(n) for n in names)})_cpu$"


backend_test = onnx.backend.test.BackendTest(polyc.onnx.backend, __name__)
backend_test.include(any_of(supported_node_tests()))
backend_test.xfail(any_of(known_failures(), "test_"))

globals().update(backend_test.test_cases)
