"""Forked helper processes: work beside the caller, and children that die with their parent.

A compile's last steps run on one core: printing the planned module, rendering its reports.
Work that only reads what exists now (verifying the planned module; simulating one of the
capacity report's two configurations; capturing a model without loading torch into the
compiling process) runs in a forked child meanwhile, and its answer comes back pickled through
a pipe. The child changes nothing the parent sees. If it fails or dies, the wait does the work
itself, so the caller gets exactly the answer, or the error, it would have had without the
child. Where processes cannot fork, the work is done at once.

Every forked helper dies with its parent (:func:`die_with_parent`): a compile killed with
SIGKILL or SIGTERM leaves no capture child, search worker or proof process running on. On Linux
the kernel sends the child SIGTERM when the parent ends (``prctl(PR_SET_PDEATHSIG)``), with the
child's SIGTERM disposition reset to the default so that no handler inherited from the parent
keeps it alive; the parent's pid is checked right after, for a parent that ended between the
fork and the ``prctl``. The kernel ties that signal to the *thread* that forked the child, so a
helper forked from a thread that ends before it is stopped then; its wait then does the work
itself, as for any child that dies. Elsewhere a daemon thread in the child polls its parent's
pid twice a second and ends the child once the parent is gone: a best effort (a child stuck in
native code that holds the interpreter lock is ended only when it lets go of it).

Forking is only safe where the caller knows which threads its process runs (the command-line
compile does); library callers ask for it explicitly.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from support.collector import freeze_inherited

T = TypeVar("T")

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# What a child whose parent is gone exits with, when it ends itself (the parent-pid check).
ORPHANED_EXIT_STATUS = 143  # as if ended by SIGTERM
_POLL_SECONDS = 0.5


def cpu_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether this platform forks processes."""
    return hasattr(os, "fork")


def flush_streams() -> None:
    """Flush the standard streams (before a fork, so nothing is printed twice; before a child ends)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed stream: nothing more can reach it
            pass


def _kernel_ends_orphans() -> bool:
    """Ask Linux to send this process SIGTERM when its parent ends; whether that was set."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)) == 0
    except (OSError, AttributeError):  # no libc with prctl (a static or unusual interpreter)
        return False


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_POLL_SECONDS)
        os._exit(ORPHANED_EXIT_STATUS)

    threading.Thread(target=watch, name="tessera-parent-watch", daemon=True).start()


def die_with_parent(parent: int) -> None:
    """Make this process, a child of ``parent`` (its pid, read before the fork), end when the
    parent ends; called first thing in every helper process (see the module docstring)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # A parent that holds SIGTERM (a trainer after runtime.health.hold_termination_signals) passes
    # the blocked mask on through fork: its helpers must still end when it terminates them
    # (multiprocessing.Pool's terminate sends SIGTERM and joins; a blocked one would wait for ever).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    if not _kernel_ends_orphans():
        _watch_parent(parent)
    if os.getppid() != parent:  # the parent ended before the kernel was asked
        os._exit(ORPHANED_EXIT_STATUS)


def run_as_helper(parent: int, target: Callable[..., Any], *args: Any) -> Any:
    """``target(*args)`` in a helper process that dies with ``parent`` (a multiprocessing
    ``Process`` target: ``Process(target=run_as_helper, args=(os.getpid(), f, ...))``)."""
    die_with_parent(parent)
    return target(*args)


def fork_child(work: Callable[[], object]) -> tuple[int, int]:
    """Fork a child that sends ``work()`` pickled through a pipe and ends; return its pid and the
    pipe's read end, for :func:`child_answer`.

    The child dies with this process, keeps what it inherited out of the collector's walks, and
    ends without the parent's exit handlers, with status 0 once its answer is written and 1 if
    ``work`` raised or its answer did not pickle. Both processes' standard streams are flushed
    around the fork (the parent's before it, so nothing it printed is printed twice; the child's
    before it ends, so nothing the work printed is lost).
    """
    flush_streams()
    parent = os.getpid()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            die_with_parent(parent)
            freeze_inherited()
            os.close(read_end)
            data = pickle.dumps(work(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(data)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent decides what a failed child means
            pass
        finally:
            flush_streams()
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
    if not can_fork():
        done = work()
        return lambda: done
    pid, read_end = fork_child(work)

    def wait() -> T:
        data = child_answer(pid, read_end)
        if data is not None:
            return pickle.loads(data)  # type: ignore[no-any-return]
        return work()

    return wait
