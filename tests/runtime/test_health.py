"""The health watch: a failed or silent rank is named by every other rank, and the first failure stands."""

from __future__ import annotations

import time

import torch.distributed as dist

from runtime.health import HealthWatch


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
