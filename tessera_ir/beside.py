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

import os
import pickle
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def beside(work: Callable[[], T]) -> Callable[[], T]:
    """Start ``work`` in a forked process; return a function that waits for its result."""
    if not hasattr(os, "fork"):
        done = work()
        return lambda: done
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: answer through the pipe and leave without the parent's exit handlers
        code = 1
        try:
            os.close(read_end)
            data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent redoes the work and reports its failure
            pass
        finally:
            os._exit(code)
    os.close(write_end)

    def wait() -> T:
        try:
            with os.fdopen(read_end, "rb") as answer:
                data = answer.read()
        finally:
            _, status = os.waitpid(pid, 0)
        if status == 0 and data:
            return pickle.loads(data)  # type: ignore[no-any-return]
        return work()

    return wait
