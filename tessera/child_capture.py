"""Capture in a forked child process, so that the compiling process never imports torch.

Capturing a transformers model imports torch and the model's transformers modules: seconds of
one core, and hundreds of megabytes that the compiling process would then carry through every
later step. Each process the compile forks afterwards (the schedule search's workers, the
background z3 proofs, the verifier, the capacity report's static run) copies that memory's page
tables, and the copy-on-write faults that follow cost both cores time. Measured on make demo's
compile (whole-process runs of its command with `--no-cache --timing`, alternating): the steps
after a capture read from the compile cache, which loads no torch, took 5.1-5.4 s against about
5.6-6.1 s after a capture in the process; capturing in this child instead gave a median wall
time of 9.83 against 9.98 s over four runs each, the same output bytes.

The child runs the capture exactly as the compiling process would and sends back the captured
module pickled, so the module the passes get is the same object graph. A user error (a
``TesseraError``: a model file that raises, a config that does not parse) comes back as a
``TesseraError`` with the same message, and the child's traceback as a note for ``--debug``.
What the child prints is flushed before it ends (and the parent's streams before the fork, so
nothing is printed twice). If the child ends any other way (a bug, a signal, an answer that
does not pickle), the capture runs again in the compiling process, which then fails, or
succeeds, as it would have without the child; only then does a model file run twice.

Only where it pays and is safe: on a platform that forks, and while torch is not yet imported
(an embedding caller that has it gains nothing from a child). Forking is safe here because the
command-line compile starts no thread before its capture.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from support.processes import child_answer, fork_child
from tessera_ir.errors import TesseraError

T = TypeVar("T")


def worth_a_child() -> bool:
    """Whether a capture should run in a child: the platform forks and torch is not loaded yet."""
    return hasattr(os, "fork") and "torch" not in sys.modules


def in_child(work: Callable[[], T]) -> T:
    """``work()`` (a capture) run in a forked child; its answer, or its user error, carried back."""
    if not worth_a_child():
        return work()

    def answer() -> tuple[str, object]:
        try:
            return "done", work()
        except TesseraError as err:
            return "user error", (str(err), "".join(traceback.format_exception(err)))

    data = child_answer(*fork_child(answer))
    kind: str = "failed"
    value: Any = None
    if data is not None:
        try:
            kind, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 - an answer this process cannot read: capture here instead
            kind = "unreadable"
    if kind == "done":
        return value  # type: ignore[no-any-return]
    if kind == "user error":
        message, child_traceback = value
        failure = TesseraError(message)
        failure.add_note(f"raised in the capture's child process:\n{child_traceback}")
        raise failure
    return work()
