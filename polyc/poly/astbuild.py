"""Schedule tree → isl AST (``isl_ast_build_node_from_schedule``).

The build context is what the parameters may be: the universe ``{ : }`` for a kernel specialised on its sizes, a
generic kernel's :attr:`~polyc.poly.scop.Scop.context` (``1 <= N <= SIZE_MAX``), which no loop then tests. Mark nodes of the schedule tree
(``parallel``, ``vector``, ``unroll``) become AST mark nodes around the loop they mark.
"""
from __future__ import annotations

import islpy as isl


def build_ast(schedule: isl.Schedule, context: isl.Set | None = None) -> isl.AstNode:
    """The isl AST of ``schedule`` (``context``: the parameters' values, None for none); print it as C with
    ``ast_to_c(node)``."""
    build = isl.AstBuild.from_context(context if context is not None else isl.Set("{ : }"))
    return build.node_from_schedule(schedule)


def ast_to_c(node: isl.AstNode) -> str:
    """The AST as C-like text (isl's printer; marks are printed as ``// mark``)."""
    return node.to_C_str()
