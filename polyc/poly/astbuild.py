"""Schedule tree → isl AST (``isl_ast_build_node_from_schedule``).

Sizes are specialised, so the build context is the universe ``{ : }``. Mark nodes of the schedule tree
(``parallel``, ``vector``, ``unroll``) become AST mark nodes around the loop they mark.
"""
from __future__ import annotations

import islpy as isl


def build_ast(schedule: isl.Schedule) -> isl.AstNode:
    """The isl AST of ``schedule``; print it as C with ``ast_to_c(node)``."""
    build = isl.AstBuild.from_context(isl.Set("{ : }"))
    return build.node_from_schedule(schedule)


def ast_to_c(node: isl.AstNode) -> str:
    """The AST as C-like text (isl's printer; marks are printed as ``// mark``)."""
    return node.to_C_str()
