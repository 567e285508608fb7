"""The Tessera runtime: load a plan (.tsb) and step one rank through it.

A trainer embeds this package alone: it imports nothing of the compiler, and
torch only in the executor (``runtime.pair_executor``).

    program = runtime.load_plan("plan.tsb", rank=pp_rank, signature=expected)
    fsm = runtime.FSM(program)
    while (action := fsm.advance()).kind != runtime.ActionKind.DONE:
        ...  # issue the work the action names, then fsm.complete(action.id)

``load_plan`` and ``FSM`` are the C++ interpreter (``runtime._core``);
``runtime.reference`` is the same semantics in pure Python. The extension is
loaded on first use, so the pair executor (``runtime.pair_executor``) also runs
where it was never built: a GPU host that only measures pairs.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import TYPE_CHECKING

from runtime.bytecode import FORMAT_VERSION, Collective, Group, Op, Payload, Stream, plan_bytes
from runtime.errors import REASONS, PlanError
from runtime.reference import COUNTER_NAMES, ActionKind
from support.extensions import load_extension


def _extension() -> ModuleType:
    """The C++ extension, loaded the first time anything asks for it."""
    core = globals().get("_core")
    if core is None:
        # TESSERA_RUNTIME_EXTENSION names another build of it (the sanitizer build `make test`
        # runs the runtime tests against). Not ``from runtime import _core``: that asks this
        # module's __getattr__ first.
        core = load_extension("runtime._core", "TESSERA_RUNTIME_EXTENSION")
        globals()["_core"] = core
    return core


if TYPE_CHECKING:
    from runtime import _core as _core
    from runtime._core import FSM, Action, Program
else:

    def __getattr__(name: str) -> object:
        # The extension and the names it provides, loaded when first asked for.
        if name == "_core":
            return _extension()
        if name in ("FSM", "Program", "Action"):
            value = getattr(_extension(), name)
            globals()[name] = value
            return value
        raise AttributeError(f"module 'runtime' has no attribute '{name}'")


def load_plan(source: str | os.PathLike[str] | bytes | bytearray | memoryview, rank: int, signature: bytes | None = None) -> Program:
    """The program of pipeline rank ``rank`` from a plan file or its bytes.

    ``signature`` is the plan signature of the model being trained (see
    docs/bytecode.md); a plan compiled for anything else is refused. Every
    refusal raises ``PlanError`` whose ``reason`` names the problem (a path that
    cannot be read: "unreadable"); a ``rank`` that is not an integer, or a
    ``signature`` that is not 32 bytes, raises TypeError or ValueError.
    """
    # Reading is shared with the reference loader; rank and signature are checked in C++.
    program: Program = _extension().load_program(plan_bytes(source), rank, signature)
    return program


__all__ = [
    "COUNTER_NAMES",
    "FORMAT_VERSION",
    "REASONS",
    "Action",
    "ActionKind",
    "Collective",
    "FSM",
    "Group",
    "Op",
    "Payload",
    "PlanError",
    "Program",
    "Stream",
    "load_plan",
]
