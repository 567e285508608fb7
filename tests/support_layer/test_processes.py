"""Forked helpers: work beside the caller (its result comes back; a failure is redone here), and
every helper dies with its parent."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support.processes import ORPHANED_EXIT_STATUS, beside, child_answer, die_with_parent, fork_child

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_the_result_comes_back_from_the_child() -> None:
    parent = os.getpid()
    assert beside(lambda: {"pid_differs": os.getpid() != parent, "list": [1.5, 2]})() == {"pid_differs": True, "list": [1.5, 2]}


def test_a_child_that_dies_is_replaced_by_doing_the_work_here() -> None:
    parent = os.getpid()

    def dies_in_the_child() -> str:
        if os.getpid() != parent:
            os._exit(3)
        return "done here"

    assert beside(dies_in_the_child)() == "done here"


def test_the_work_s_own_error_is_raised_by_the_wait() -> None:
    def always_fails() -> None:
        raise ValueError("the simulation's own error")

    wait = beside(always_fails)  # nothing raised yet: the child failed, the parent has not waited
    with pytest.raises(ValueError, match="own error"):
        wait()


def test_the_child_does_not_change_what_the_parent_sees() -> None:
    shared = [1]

    def grows() -> int:
        shared.append(2)
        return len(shared)

    assert beside(grows)() == 2 and shared == [1]


def test_the_child_keeps_what_it_inherited_out_of_the_collector_s_way() -> None:
    """Inherited objects are frozen in the child (a full collection there would copy every page it
    inherited); the parent's collector is left as it was."""
    import gc

    before = gc.get_freeze_count()
    inherited = [[k] for k in range(1000)]  # lists: objects the collector tracks
    assert all(gc.is_tracked(x) for x in inherited)
    assert beside(gc.get_freeze_count)() >= before + len(inherited)
    assert gc.get_freeze_count() == before


# ---------------------------------------------------------------- children die with their parent

# A parent process that starts one helper of the given kind, prints its pid and waits.
_PARENT = """
import multiprocessing, os, sys, time
from support.processes import fork_child, run_as_helper

kind = sys.argv[1]
if kind == "fork_child, polling":  # the best effort where the kernel is not asked (not Linux)
    import support.processes

    support.processes._kernel_ends_orphans = lambda: False
if kind.startswith("fork_child"):
    pid, _ = fork_child(lambda: time.sleep(120))
elif kind == "process":
    child = multiprocessing.get_context("fork").Process(target=run_as_helper, args=(os.getpid(), time.sleep, 120))
    child.start()
    pid = child.pid
elif kind == "pool":
    from support.processes import die_with_parent

    pool = multiprocessing.get_context("fork").Pool(1, die_with_parent, (os.getpid(),))
    pid = pool.apply(os.getpid)
else:  # the pair executor's spawned workers (an idle one also ends on its closed pipe; a busy one on the signal)
    from runtime.pair_executor import PairExecutor

    executor = PairExecutor(world_size=2).start()
    pid = executor._context.processes[1].pid
print(pid, flush=True)
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting to be reaped by whoever adopted it counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: ask the kernel
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return not _alive(pid)


@pytest.mark.parametrize("kind", ["fork_child", "fork_child, polling", "process", "pool", "pair executor"])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_helper_dies_with_its_parent(kind: str, how: signal.Signals) -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT, kind], stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert _alive(child)
        parent.send_signal(how)
        parent.wait(timeout=10)
        assert _gone_within(child, 5.0), f"the {kind} helper {child} outlived its parent ({how.name})"
    finally:
        parent.kill()
        parent.wait()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)


def test_a_child_whose_parent_ended_before_it_asked_ends_itself() -> None:
    """The race the parent-pid check closes: the parent ended between the fork and the request
    to the kernel (here: the pid given is not the child's parent)."""
    pid = os.fork()
    if pid == 0:
        try:
            die_with_parent(os.getpid())  # never this process's parent
            os._exit(0)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == ORPHANED_EXIT_STATUS


def test_a_helper_keeps_running_while_its_parent_does() -> None:
    def parent_after_a_while() -> int:
        time.sleep(0.3)
        return os.getppid()

    pid, read_end = fork_child(parent_after_a_while)
    data = child_answer(pid, read_end)
    assert data is not None and pickle.loads(data) == os.getpid()


def test_a_pool_of_helpers_ends_when_a_parent_holding_sigterm_terminates_it() -> None:
    # A trainer holds SIGTERM (runtime.health.hold_termination_signals) and its mask passes through
    # fork; Pool.terminate ends the workers with SIGTERM and joins them, so a helper that kept the
    # mask blocked would be waited for for ever.
    script = (
        "import multiprocessing, os, signal\n"
        "from support.processes import die_with_parent\n"
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "with multiprocessing.get_context('fork').Pool(2, die_with_parent, (os.getpid(),)) as pool:\n"
        "    assert pool.map(abs, [-1, -2, -3]) == [1, 2, 3]\n"
        "    blocked = pool.apply(signal.pthread_sigmask, (signal.SIG_BLOCK, []))\n"
        "print('sigterm blocked in a helper:', signal.SIGTERM in blocked)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "sigterm blocked in a helper: False" in done.stdout
