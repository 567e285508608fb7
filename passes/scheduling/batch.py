"""Scheduling and z3-checking many pair DAGs, spread over worker processes when there are enough.

Each DAG's schedule is a pure function of the DAG and the options (the exact method aside,
whose time limit makes it depend on the machine), and so is the check, so the results and
the first error raised are the same for every number of workers.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from passes.scheduling.check import check_schedule, entries_of, prove_all
from passes.scheduling.exact import ExactSolver
from passes.scheduling.methods import Method, schedule_dag
from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import PairSchedule
from support.processes import cpu_cores, die_with_parent, run_as_helper

# Fewer distinct DAGs per worker than this are not worth a process (a fork and some copying).
MIN_DAGS_PER_WORKER = 16


def worker_count(jobs: int | None, dags: int) -> int:
    """Worker processes for ``dags`` DAGs: ``jobs`` (None: one per core), 1 for small batches."""
    wanted = jobs if jobs is not None else cpu_cores()
    return min(wanted, dags // MIN_DAGS_PER_WORKER) if dags >= 2 * MIN_DAGS_PER_WORKER else 1


# The DAGs, options and which schedules to prove that a worker process reads: set before the
# pool forks, so the workers inherit them instead of receiving them pickled.
_WORK: tuple[list[PairDAG], Method, float, ExactSolver, list[bool]] | None = None


@dataclass
class Solved:
    """Schedules of a batch of DAGs, which of them z3 proved valid, and the CPU seconds spent."""

    schedules: list[PairSchedule]
    proven: list[bool]
    schedule_seconds: float = 0.0
    prove_seconds: float = 0.0


def _solve_in_worker(k: int) -> tuple[list[float], str, str, float | None, dict, bool, float, float] | None:
    """Schedule DAG ``k`` of ``_WORK`` and, when asked, z3-prove it: (start times, method, status,
    bound, stats, proven valid, seconds scheduling, seconds proving), or None when scheduling
    failed. Failures are redone in the main process, which raises them exactly as a run without
    workers."""
    assert _WORK is not None
    dags, method, time_limit, solver, prove = _WORK
    t0 = time.process_time()
    try:
        sched = schedule_dag(dags[k], method, time_limit, solver)
    except Exception:  # noqa: BLE001 - any failure is redone in the main process
        return None
    t1 = time.process_time()
    valid = prove[k] and _proves(sched)
    return sched.start, sched.method, sched.status, sched.bound, sched.stats, valid, t1 - t0, time.process_time() - t1


def schedule_all(
    dags: list[PairDAG], method: Method, time_limit: float, solver: ExactSolver, prove: list[bool], workers: int
) -> Solved:
    """Schedules of ``dags`` in order, and for each whether z3 already proved it valid.

    Without workers nothing is proven here, and the first DAG that cannot be scheduled
    raises. With several, the DAGs are spread over forked processes that also run the z3
    proof of the DAGs ``prove`` marks (the slower half of the work); a DAG whose scheduling
    failed there is redone here, in order, so the error raised is the one a run without
    workers raises (scheduling is deterministic).
    """
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        t0 = time.process_time()
        scheds = [schedule_dag(dag, method, time_limit, solver) for dag in dags]
        return Solved(scheds, [False] * len(dags), time.process_time() - t0)
    global _WORK
    _WORK = (dags, method, time_limit, solver, prove)
    try:
        # The workers die with this process: a compile killed meanwhile leaves none running.
        with multiprocessing.get_context("fork").Pool(workers, die_with_parent, (os.getpid(),)) as pool:
            # Small chunks keep both workers busy to the end (DAG sizes vary a lot).
            results = pool.map(_solve_in_worker, range(len(dags)), chunksize=4)
    finally:
        _WORK = None
    out = Solved([], [])
    for dag, res in zip(dags, results):
        if res is None:
            t0 = time.process_time()
            out.schedules.append(schedule_dag(dag, method, time_limit, solver))
            out.proven.append(False)
            out.schedule_seconds += time.process_time() - t0
        else:
            start, used, status, bound, stats, ok, schedule_s, prove_s = res
            out.schedules.append(PairSchedule(dag, start, used, status=status, bound=bound, stats=stats))
            out.proven.append(ok)
            out.schedule_seconds += schedule_s
            out.prove_seconds += prove_s
    return out


def _proves(sched: PairSchedule) -> bool:
    """Whether z3 proves ``sched`` valid (a failure is explained later, in the main process, by
    proving it again there)."""
    try:
        check_schedule(sched.dag, entries_of(sched), prove=True)
    except Exception:  # noqa: BLE001 - any failure is redone in the main process
        return False
    return True


# What :class:`BackgroundProofs` records per schedule in the array both processes share
# (_KEPT: proven, and its ``keep`` call said it was kept).
_NOT_YET, _PROVEN, _REFUTED, _KEPT = 0, 1, 2, 3


# Schedules one process takes from the shared counter at a time and proves as one z3 problem
# (passes.scheduling.check.prove_all): 16 cost 0.55-0.7 of as many lone proofs of make demo's
# DAGs, and small batches keep both processes busy to the end.
PROOF_BATCH = 16


def _take(next_index: Any, count: int) -> range:
    """The next schedules nobody has taken yet (at most ``PROOF_BATCH``; empty when all are taken)."""
    with next_index.get_lock():
        k = int(next_index.value)
        end = min(count, k + PROOF_BATCH)
        next_index.value = end
    return range(k, end)


def _prove_taken(
    schedules: list[PairSchedule], next_index: Any, state: Any, keep: Callable[[int], bool] | None = None,
) -> None:
    """Prove schedules a batch at a time, as they are taken, recording each answer in ``state``: a
    batch z3 does not prove as a whole is proven schedule by schedule, so that only the schedules
    that fail are refuted. Each proven schedule is then handed to ``keep`` (its index), here,
    with SIGTERM held off meanwhile so that :meth:`BackgroundProofs.cancel` never stops a process
    halfway through keeping one (a cache file written but not yet renamed into place)."""
    held = hasattr(signal, "pthread_sigmask") and keep is not None
    while taken := _take(next_index, len(schedules)):
        if prove_all([schedules[k] for k in taken]):
            answers = [_PROVEN] * len(taken)
        else:
            answers = [_PROVEN if _proves(schedules[k]) else _REFUTED for k in taken]
        if held:
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            for k, answer in zip(taken, answers):
                state[k] = _KEPT if answer == _PROVEN and keep is not None and _kept(keep, k) else answer
        finally:
            if held:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def _kept(keep: Callable[[int], bool], k: int) -> bool:
    """``keep(k)``; an exception it raises counts as not kept (the caller keeps the schedule again
    after :meth:`BackgroundProofs.wait`, and says what failed)."""
    try:
        return keep(k)
    except Exception:  # noqa: BLE001 - see the docstring
        return False


class BackgroundProofs:
    """z3 proofs of schedules running in one forked process while the caller goes on.

    Scheduling keeps every core busy, but the passes after it run on one, so the proofs (a third
    of a cold compile's scheduling work) fit beside them. Both processes take schedules from one
    shared counter, a batch at a time: when the caller reaches :meth:`wait` with proofs still
    untaken, it proves them beside the background process instead of leaving its own core idle. :meth:`wait` returns, in
    order, whether each schedule was proven (who proved which does not change the answers);
    :meth:`cancel` stops the process when the compile fails anyway.

    ``keep(k)``, when given, is called with each schedule's index as soon as it is proven, in
    whichever process proved it, and says whether it kept the schedule (the overlap pass writes
    it to the schedule cache: a file per new entry, which at the end of a cold compile is a wait
    the compile feels (docs/records/2026-12-04-compile-time.md), and in the background process
    costs it nothing). It must only write where nothing else writes; returning False
    or raising means not kept. :meth:`kept` says afterwards which schedules it kept, so that the
    caller keeps the rest itself (a failure in the background process is then met again, and
    reported, in the caller's).
    """

    def __init__(self, schedules: list[PairSchedule], keep: Callable[[int], bool] | None = None):
        import multiprocessing

        context = multiprocessing.get_context("fork")
        self.count = len(schedules)
        self._schedules = schedules
        self._keep = keep
        self._next = context.Value("i", 0)
        self._state = context.RawArray("b", self.count)
        # Forked, so the process inherits the schedules (and keep) instead of receiving them pickled.
        self._process = context.Process(
            target=run_as_helper, args=(os.getpid(), _prove_taken, schedules, self._next, self._state, keep),
            name="tessera-z3-proofs", daemon=True,
        )
        self._process.start()

    def wait(self) -> list[bool]:
        try:
            _prove_taken(self._schedules, self._next, self._state, self._keep)
            self._process.join()
            # A schedule the process took but did not answer (it died): proven here.
            for k in range(self.count):
                if self._state[k] == _NOT_YET:
                    self._state[k] = _PROVEN if _proves(self._schedules[k]) else _REFUTED
            return [self._state[k] in (_PROVEN, _KEPT) for k in range(self.count)]
        finally:
            self.cancel()

    def kept(self) -> list[bool]:
        """After :meth:`wait`: whether ``keep`` kept each schedule."""
        return [self._state[k] == _KEPT for k in range(self.count)]

    def cancel(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()


def proofs_can_run_in_background(workers: int) -> bool:
    """Whether :class:`BackgroundProofs` pays: the batch had workers (so it is large) and forking works."""
    import multiprocessing

    return workers > 1 and "fork" in multiprocessing.get_all_start_methods()
