"""The health watch: a failed or silent rank is named by every other rank, and the first failure stands."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from runtime.errors import PlanError
from runtime.health import HealthWatch, start_job_watch


class Outcome:
    def __init__(self) -> None:
        self.reports: list[str] = []
        self.codes: list[int] = []


def watch(store, rank: int, world: int, outcome: Outcome) -> HealthWatch:
    return HealthWatch(
        store, rank, world, interval_s=0.02, stale_s=0.3, diagnose_s=1.0,
        report=outcome.reports.append, exit_process=outcome.codes.append,
    )


def wait_for(outcome: Outcome, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not outcome.codes and time.monotonic() < deadline:
        time.sleep(0.02)


def test_a_rank_that_raises_is_named_by_the_others():
    store = dist.HashStore()
    seen = [Outcome() for _ in range(3)]
    watches = [watch(store, r, 3, seen[r]).start() for r in range(3)]
    record = watches[2].fail("RuntimeError: injected failure")
    assert record == "rank 2: RuntimeError: injected failure"
    for r in (0, 1):
        wait_for(seen[r])
        assert seen[r].codes == [1]
        assert seen[r].reports == [f"[rank {r}] error: stopping because another rank failed: rank 2: RuntimeError: injected failure"]
    assert seen[2].codes == []  # the failing rank handles its own exit
    for w in watches:
        w.finish()


def test_a_rank_that_goes_silent_is_declared_dead():
    store = dist.HashStore()
    alive, dead = Outcome(), Outcome()
    a = watch(store, 0, 2, alive).start()
    b = watch(store, 1, 2, dead).start()
    time.sleep(0.1)
    b._stop.set()  # its heartbeats stop without it saying it finished: killed
    wait_for(alive)
    assert alive.codes == [1]
    assert "rank 1: stopped responding" in alive.reports[0]
    a.finish()


def test_the_first_failure_stands_and_a_finished_rank_is_not_dead():
    store = dist.HashStore()
    outcomes = [Outcome(), Outcome()]
    a, b = (watch(store, r, 2, outcomes[r]).start() for r in range(2))
    b.finish()  # ended normally: its silence from now on is fine
    time.sleep(0.5)
    assert outcomes[0].codes == []
    assert b.fail("second") == "rank 1: second"
    assert a.fail("later, caused by the first") == "rank 1: second"
    assert a.first_failure() == "rank 1: second"
    a.finish()


def ended_process() -> int:
    """The id of a process of this host that has ended (and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_rank_whose_process_ended_is_named_at_once():
    # Killed in its first seconds, before a heartbeat could go stale: its process is gone.
    store = dist.HashStore()
    outcome = Outcome()
    pid = ended_process()
    store.set("proc/1", f"{socket.gethostname()} {pid}")
    store.add("hb/1", 1)
    survivor = HealthWatch(store, 0, 2, interval_s=0.02, stale_s=60.0, diagnose_s=1.0,
                           report=outcome.reports.append, exit_process=outcome.codes.append).start()
    wait_for(outcome)
    assert outcome.codes == [1]
    assert outcome.reports == [f"[rank 0] error: stopping because another rank failed: rank 1: its process (pid {pid}) "
                               "ended without reporting an error (killed or crashed)"]
    survivor.finish()


def test_a_rank_on_another_host_is_judged_by_its_heartbeat_only():
    store = dist.HashStore()
    outcome = Outcome()
    store.set("proc/1", f"another-host-{socket.gethostname()} {ended_process()}")
    store.add("hb/1", 1)
    a = HealthWatch(store, 0, 2, interval_s=0.02, stale_s=0.3, diagnose_s=1.0, report=outcome.reports.append,
                    exit_process=outcome.codes.append).start()
    wait_for(outcome)
    assert outcome.codes == [1] and "rank 1: stopped responding" in outcome.reports[0]
    a.finish()


def test_a_rank_that_never_started_is_named_when_the_launcher_stops_the_job():
    store = dist.HashStore()
    outcomes = [Outcome(), Outcome()]
    watches = [watch(store, r, 3, outcomes[r]) for r in range(2)]  # rank 2 died before its watch started
    for w in watches:
        w.start()
    time.sleep(0.1)
    assert outcomes[0].codes == []  # not while the job runs: it may still be starting
    watches[0]._on_termination()  # what SIGTERM from the launcher runs
    assert outcomes[0].codes == [1]
    assert outcomes[0].reports == ["[rank 0] error: stopped by the launcher because another rank failed: rank 2: ended "
                                   "before its health watch started (killed or crashed at start-up)"]
    watches[1].finish()


def test_a_broken_connection_blames_the_rank_that_died_not_the_one_that_saw_it():
    store = dist.HashStore()
    pid = ended_process()
    store.set("proc/1", f"{socket.gethostname()} {pid}")
    store.add("hb/1", 1)
    outcome = Outcome()
    mine = HealthWatch(store, 0, 2, interval_s=0.02, stale_s=60.0, diagnose_s=2.0, report=outcome.reports.append,
                       exit_process=outcome.codes.append)
    mine.store.add("hb/0", 1)  # not started: the training thread alone looks
    err = RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")
    assert mine.failure_of(err).startswith(f"rank 1: its process (pid {pid}) ended")


def test_a_rank_records_its_own_failure_and_a_refusal_without_a_class_name():
    store = dist.HashStore()
    outcome = Outcome()
    mine = watch(store, 0, 1, outcome)
    assert mine.failure_of(PlanError("checksum mismatch: the plan's bytes changed", "checksum")) == (
        "rank 0: checksum mismatch: the plan's bytes changed")
    other = watch(dist.HashStore(), 0, 1, outcome)
    assert other.failure_of(ValueError("bad input")) == "rank 0: ValueError: bad input"


def test_the_job_watch_needs_the_launchers_environment(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError, match="launch the job with torchrun"):
        start_job_watch()
