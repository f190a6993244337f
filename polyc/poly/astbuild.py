"""Schedule tree → isl AST (``isl_ast_build_node_from_schedule``).

The build context is what the parameters may be: the universe ``{ : }`` for a kernel specialised on its sizes,
a generic kernel's :attr:`~polyc.poly.scop.Scop.context` (``1 <= N <= SIZE_MAX``), which no loop then tests.
Mark nodes of the schedule tree (``parallel``, ``vector``, ``unroll``) become AST mark nodes around the loop
they mark.
"""
from __future__ import annotations

import islpy as isl


def build_ast(schedule: isl.Schedule, context: isl.Set | None = None) -> isl.AstNode:
    """The isl AST of ``schedule`` (``context``: the parameters' values, None for none); print it as C with
    ``ast_to_c(node)``."""
    build = isl.AstBuild.from_context(context if context is not None else isl.Set("{ : }"))
    return build.node_from_schedule(schedule)


def c_expression(text: str, prefix: str, context: isl.Set) -> str:
    """C text of the affine function ``text`` (isl text over the parameters declared by ``prefix``, such as
    ``H - KH + 1``), valid where ``context`` holds (``isl_ast_build_expr_from_pw_aff``; it may use
    ``floord``, ``min`` and ``max``, which the caller defines)."""
    build = isl.AstBuild.from_context(context)
    return build.expr_from_pw_aff(isl.PwAff(f"{prefix}{{ [({text})] }}")).to_C_str()


def c_condition(condition: isl.Set) -> str:
    """C text of the parameter set ``condition`` (``isl_ast_build_expr_from_set`` in the universe)."""
    universe = isl.Set.universe(isl.Space.params_alloc(condition.get_ctx(), 0)).align_params(condition.get_space())
    return isl.AstBuild.from_context(universe).expr_from_set(condition).to_C_str()


def ast_to_c(node: isl.AstNode) -> str:
    """The AST as C-like text (isl's printer; marks are printed as ``// mark``)."""
    return node.to_C_str()
