"""Work in a forked process beside the caller, for the compiler's second core.

A compile's last steps run on one core: printing the planned module, rendering its reports.
Work that only reads what exists now (verifying the planned module; simulating one of the
capacity report's two configurations) runs in a forked child meanwhile, and its answer comes
back pickled through a pipe. The child changes nothing the parent sees. If it fails or dies,
the wait does the work itself, so the caller gets exactly the answer, or the error, it would
have had without the child. Where processes cannot fork, the work is done at once.

Forking is only safe where the caller knows which threads its process runs (the command-line
compile does); library callers ask for it explicitly.
"""

from __future__ import annotations

import gc
import os
import pickle
import sys
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream: nothing more can reach it
            pass


def fork_child(work: Callable[[], object]) -> tuple[int, int]:
    """Fork a child that sends ``work()`` pickled through a pipe and ends; return its pid and the
    pipe's read end, for :func:`child_answer`.

    The child ends without the parent's exit handlers, with status 0 once its answer is written
    and 1 if ``work`` raised or its answer did not pickle. Both processes' standard streams are
    flushed around the fork (the parent's before it, so nothing it printed is printed twice; the
    child's before it ends, so nothing the work printed is lost).
    """
    _flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            # Every object inherited from the parent out of the collector's way: a full collection
            # walks them all, writing to each one's header, which copies every inherited page
            # (what that cost a compile: docs/records/2026-12-04-compile-time.md).
            gc.freeze()
            os.close(read_end)
            data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent decides what a failed child means
            pass
        finally:
            _flush()
            os._exit(code)
    os.close(write_end)
    return pid, read_end


def child_answer(pid: int, read_end: int) -> bytes | None:
    """Wait for a :func:`fork_child` child: its pickled answer, or None when it failed or died."""
    try:
        with os.fdopen(read_end, "rb") as answer:
            data = answer.read()
    finally:
        _, status = os.waitpid(pid, 0)
    return data if status == 0 and data else None


def beside(work: Callable[[], T]) -> Callable[[], T]:
    """Start ``work`` in a forked process; return a function that waits for its result."""
    if not hasattr(os, "fork"):
        done = work()
        return lambda: done
    pid, read_end = fork_child(work)

    def wait() -> T:
        data = child_answer(pid, read_end)
        if data is not None:
            return pickle.loads(data)  # type: ignore[no-any-return]
        return work()

    return wait
