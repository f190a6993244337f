"""The pipeline: a checked definition, specialised on sizes, through every stage to native code.

:func:`lower` is the polyhedral half, one stage per line (Scop → dependences → isl schedule → CPU strategy →
promotion → isl AST); :func:`emit` writes the lowered kernel into an LLVM module; :func:`compile_kernel` is
both for one kernel in a module of its own, JIT-compiled. A native program (:mod:`polyc.program`) lowers and
emits each of its kernels the same way into one shared module. Each stage runs under a
:class:`~polyc.debug.StageLogger`, which times it (``POLYC_TIME_STAGES``), prints it (``POLYC_DEBUG``) and
runs the verifier after it when verification is on (``POLYC_VERIFY``, on under pytest).
"""
from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

from . import debug, env
from .codegen import compile_module, emit_kernel, new_module
from .errors import PolycError
from .lang import ast as L
from .options import Options
from .poly.affine import isl_name
from .poly.astbuild import ast_to_c, build_ast, c_condition, c_expression
from .poly.build import build_scop
from .poly.deps import compute_dependences
from .poly.promote import promote
from .poly.schedule import compute_schedule, tree_text
from .poly.strategy import apply_strategy
from .poly.verify import verify_stage
from .target import Target

#: Serializes compiling (isl's context and LLVM are shared by the whole process); reentrant. Callers of
#: :func:`lower` and :func:`compile_kernel` hold it (the kernel cache and program linking do).
COMPILE_LOCK = threading.RLock()

#: The stages a compiled kernel can print, in pipeline order.
STAGES = ("domain", "deps", "schedule", "transformed", "ast", "llvm", "asm")


def resolve_options(options: Options, target: Target | None = None) -> Options:
    """``options`` with the thread count decided — the one place its default comes from: ``Options.threads``,
    else ``POLYC_NUM_THREADS``, else (with a ``target``) the target's usable cores. The count is baked into
    the code, so it is resolved before compiling and is part of every cache key."""
    if options.threads is not None:
        return options
    threads = env.num_threads() or (target.cores if target is not None else None)
    return options.replace(threads=threads) if threads else options


def symbol(def_name: str) -> str:
    """The native symbol of a def: prefixed, so a def named like a libm function (``pow``, ``exp``) cannot
    shadow the function its own code calls."""
    return f"polyc.{def_name}"


@dataclass(frozen=True, eq=False)
class Lowered:
    """The polyhedral stages of one kernel: ``scop`` (promoted: its ``local`` tensors are not kernel
    arguments; an input named in ``constants`` may arrive packed, see :func:`~polyc.poly.promote.promote`),
    ``dependences`` (of the Scop before promotion), ``schedule`` (isl's), ``transformed`` (after the CPU
    strategy and promotion) and ``ast`` (isl's AST of ``transformed``)."""

    scop: object
    dependences: object
    schedule: object
    transformed: object
    ast: object


def lower(checked: L.CheckedDef, sizes: dict, options: Options, target: Target,
          constants: frozenset = frozenset(), scop=None, verify: bool | None = None) -> Lowered:
    """The polyhedral half of the pipeline for ``checked`` at ``sizes`` (size name → extent). ``scop``: the
    Scop of these sizes when the caller built it already (:meth:`polyc.Kernel.signature` does), so no stage
    runs twice; ``constants``: inputs whose values the caller keeps between calls (they may arrive packed);
    ``verify``: run the verifier between stages (None: as ``POLYC_VERIFY`` says, :func:`polyc.env.verify`).
    Raises what the stages raise (CompileError from the verifier)."""
    log = debug.StageLogger([verify_stage] if (env.verify() if verify is None else verify) else [])
    scop = log.given("scop", scop) if scop is not None else log("scop", build_scop, checked, sizes)
    deps = log("dependences", compute_dependences, scop)
    schedule = log("schedule", compute_schedule, scop, deps, options, show=tree_text)
    transformed, packings = log("transformed", apply_strategy, schedule, scop, deps, target, options, constants,
                                show=lambda v: tree_text(v[0]))
    promoted, transformed = log("promoted", promote, scop, transformed, packings, target, options, constants,
                                show=lambda v: tree_text(v[1]) if packings else None)
    ast = log("ast", build_ast, transformed, scop.context, show=ast_to_c)
    return Lowered(promoted, deps, schedule, transformed, ast)


def c_interface(lowered: Lowered) -> tuple[dict, dict, str]:
    """A generic kernel's interface in C, for glue code (:mod:`polyc.export`): ``(names, shapes,
    condition)``: each parameter's C name (its isl spelling), each tensor's extents as C expressions of them
    (ints as text too; :func:`~polyc.poly.astbuild.c_expression`), and the C condition the sizes must meet
    (the Scop's context: every size in 1..2^24, every inferred range non-empty)."""
    scop = lowered.scop
    names = {p: isl_name(p) for p in scop.params}

    def extent(e) -> str:
        return str(e) if type(e) is int else f"({c_expression(e.text, scop.prefix, scop.context)})"
    shapes = {t.name: tuple(extent(e) for e in (t.extents or t.shape)) for t in scop.tensors}
    return names, shapes, c_condition(scop.context) if scop.context is not None else "1"


def emit(module, lowered: Lowered, name: str, target: Target, options: Options) -> None:
    """Write ``lowered`` into the LLVM ``module`` as the function ``name`` (``i32 name(ptr args)``)."""
    emit_kernel(module, dataclasses.replace(lowered.scop, name=name), lowered.ast, target, options)


@dataclass(frozen=True, eq=False)
class Stages(Lowered):
    """Every stage of one compilation of one kernel: the :class:`Lowered` stages, its LLVM IR module text and
    the JIT-compiled module (``jit.asm`` its machine code)."""

    llvm: str
    jit: object

    def text(self, stage: str) -> str:
        """The stage in the field's notation (one of :data:`STAGES`): isl's text for the Scop and the
        dependences, isl's block YAML for schedule trees (one field per line), C for the AST, LLVM IR, the
        target's assembly."""
        if stage == "domain":
            return str(self.scop)
        if stage == "deps":
            return str(self.dependences)
        if stage == "schedule":
            return tree_text(self.schedule)
        if stage == "transformed":
            return tree_text(self.transformed)
        if stage == "ast":
            return ast_to_c(self.ast)
        if stage == "llvm":
            return self.llvm
        if stage == "asm":
            return self.jit.asm
        raise PolycError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")


def compile_kernel(checked: L.CheckedDef, sizes: dict, options: Options, target: Target,
                   constants: frozenset = frozenset(), scop=None, compile_ir=compile_module) -> Stages:
    """The whole pipeline for one kernel: :func:`lower`, :func:`emit` into a module of its own (function
    :func:`symbol` of the def), LLVM's optimizer and the JIT: ``compile_ir(ir_text, target, opt_level,
    unroll)`` (:func:`~polyc.codegen.compile_module`, or a caller's cache in front of it)."""
    lowered = lower(checked, sizes, options, target, constants, scop)

    def llvm_module() -> str:
        module = new_module(target)
        emit(module, lowered, symbol(checked.name), target, options)
        return str(module)

    log = debug.StageLogger()
    llvm = log("llvm", llvm_module)
    jit = log("jit", compile_ir, llvm, target, options.opt_level, options.unroll != 0, show=lambda _: None)
    return Stages(**vars(lowered), llvm=llvm, jit=jit)
