"""The ``overlap-schedule`` pass: a schedule for every forward/backward pair.

Before (from ``candidates``, or written by hand)::

    plan pair @pair.0 {bwd = [@l2, @l3], fwd = [@l0, @l1]}

After (``overlap-schedule``)::

    plan pair @pair.0 {bwd = [@l2, @l3], fwd = [@l0, @l1], lower_bound = 790.0, makespan = 812.5,
                       schedule = @sched.0}
    plan pair_schedule @sched.0 {bound_ratio = 1.028, lower_bound = 790.0, makespan = 812.5,
                                 method = "gap-fit", pairs = [@pair.0], serial = 1403.2, tasks = 32,
                                 verified = true} {
      @l0.linear_attention.fwd {duration = 120.0, order = 0, start = 0.0, stream = "compute"}
      ...
    }

For each ``pair`` op the pass builds the pair DAG (``PlanView.pair_dag``): the forward tasks
of its forward layers beside the dgrad/wgrad tasks of its backward layers, each with its
isolated duration on the module's target hardware (``PlanView.duration``: a task's
``duration_us`` when given, else the analytic estimate). A movable task with a ``deadline``
attribute (µs from the start of the pair) must finish by then; without one it only has to
finish within the pair.

Pairs whose DAGs are identical up to task names (same kinds, durations, dependencies, in
the same order) share one schedule: it is computed once, emitted once, and its entries
name the tasks of the first such pair; the other pairs match it position by position
(entries are listed in DAG order).

Methods (option ``method``): ``gap-fit`` (default; constructive schedules and local search on
the stream orders, :mod:`passes.scheduling.gap_fit`), ``serial`` and ``fixed-template``
(baselines, :mod:`passes.scheduling.baselines`), ``exact`` (CP-SAT, :mod:`passes.scheduling.exact`;
``time-limit`` deterministic seconds per pair, ``solver`` cpsat|highs|cbc; the schedule op
records ``status`` = optimal/feasible/timeout).

Checking (option ``verify``): every schedule, computed or cached, passes the exact validity
check (:func:`passes.scheduling.check.check_schedule`, the conditions of
``tessera_ir.schedule_rules``); z3 proves them independently for each distinct DAG the first
time it is scheduled (``new``, default: the proof is recorded in the cache entry), for a sample
chosen by the DAG's key (``sample``), or for every schedule on every run (``true``); ``false``
checks nothing. z3 decides the proofs a batch of schedules at a time, as one problem
(:func:`passes.scheduling.check.prove_all`: the same answer for each schedule, at less cost); a
batch it does not prove is proven schedule by schedule, to name the one that fails and why.
When the DAGs are spread over worker processes, the proofs of the new schedules
run in one more process beside the passes after this one (``prove-beside``, default; the pass
manager waits for them after the last pass and a schedule z3 refutes fails the pipeline then,
with the same error), since those passes leave a core idle; the IR is the same either way. A schedule that fails stops the pass with a
:class:`~passes.scheduling.check.ScheduleError`; a cached one that fails is dropped with a
warning and the pair scheduled again.

Cache (options ``cache``, ``cache-dir``, ``cache-max-mb``): schedules are kept on disk beside
the profile cache (:mod:`passes.scheduling.cache`), keyed by the DAG's signature and the
scheduler's version and options, so a recompile schedules only DAGs it has not seen. The IR is
byte-identical with and without the cache. A new schedule proven in the background is written
by the process that proved it, as soon as it is proven, so the compile does not wait for the
files after its last pass; nothing unproven is written as proven.

Speed: each distinct side of a pair (a list of forward or backward layers) is built once
by the view, and pairs are grouped by their two side signatures, so a DAG is built only
per distinct signature. The distinct DAGs are scheduled and checked by ``jobs`` worker
processes (default: one per CPU core; small modules always stay in-process,
:mod:`passes.scheduling.batch`). Scheduling and checking are deterministic, so the output
and the first error reported are the same for every ``jobs``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from passes.manager import ModulePass, PassError, finish_later, note_time, option
from passes.plan_view import PlanView
from passes.scheduling.batch import (
    PROOF_BATCH,
    BackgroundProofs,
    proofs_can_run_in_background,
    schedule_all,
    worker_count,
)
from passes.scheduling.cache import ScheduleCache, sampled, schedule_key
from passes.scheduling.check import ScheduleEntry, ScheduleError, check_schedule, entries_of, prove_all
from passes.scheduling.exact import ExactSolver
from passes.scheduling.gap_fit import SCHEDULER_VERSION
from passes.scheduling.methods import Method, schedule_dag
from passes.scheduling.pair_dag import PairDAG, join_sides
from passes.scheduling.schedule import PairSchedule, schedule_op
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanOp, SymbolRef
from tessera_ir.plan_ops import PairScheduleOp, entity_kinds


def plan_entries(op: PlanOp) -> list[ScheduleEntry]:
    """The schedule entries of a ``pair_schedule`` op, as the z3 checker reads them."""
    out = []
    for e in op.entries:
        start, duration, stream = e.attrs.get("start"), e.attrs.get("duration"), e.attrs.get("stream")
        if not (isinstance(start, (int, float)) and isinstance(duration, (int, float)) and isinstance(stream, str)):
            raise ScheduleError(
                f"pair_schedule @{op.name}: entry @{e.ref} needs numeric 'start' and 'duration' and a 'stream'",
                "placed-once",
                [e.ref],
            )
        out.append(ScheduleEntry(e.ref, float(start), float(duration), stream))
    return out


def check_plan_schedules(module: Module) -> int:
    """z3-check every ``pair_schedule`` op of ``module`` against its first pair's DAG.

    Durations are recomputed from the IR (``PlanView.duration`` on the module's target
    hardware), so an edited duration is caught. Returns the number of schedules checked;
    raises :class:`ScheduleError` on the first bad one.
    """
    view = PlanView(module)
    checked = 0
    kind_of = entity_kinds(module)
    for sched in module.plan_ops("pair_schedule"):
        first = PairScheduleOp.read(module, sched, kind_of).pairs[0]  # declared: a non-empty list of pairs
        dag = view.pair_dag(view.pair(first))
        check_schedule(dag, plan_entries(sched), where=f"pair_schedule @{sched.name}")
        checked += 1
    return checked


@dataclass(frozen=True)
class OverlapSchedulePass(ModulePass):
    name = "overlap-schedule"
    summary = "Schedule every forward/backward pair on the compute and comm streams (backbone-first gap fit)."
    requires = ("pair",)
    produces = ("pair_schedule",)

    method: Method = option("gap-fit", "scheduler: backbone-first gap fit, the two baselines, or the exact solver")
    verify: bool | Literal["new", "sample"] = option(
        "new",
        "exact check of every schedule, z3 proof of each schedule not proven before (new), of a sample of them "
        "(sample), of every schedule (true); false: no check",
    )
    prove_beside: bool = option(
        True,
        "with worker processes, z3 proves the new schedules in a process of its own beside the later passes "
        "(the pass manager waits for it after the last pass); false: inside this pass",
    )
    cache: bool = option(True, "reuse schedules from the on-disk schedule cache and add new ones to it")
    cache_dir: str | None = option(None, "schedule cache folder's parent (unset: $TESSERA_CACHE_DIR or ~/.cache/tessera)")
    cache_max_mb: float = option(256.0, "cap on the schedule cache's size; least recently used entries go first")
    time_limit: float = option(10.0, "method=exact: seconds per pair")
    solver: ExactSolver = option("cpsat", "method=exact: CP-SAT (deterministic), or a MILP solver as a cross-check")
    # Each DAG's schedule is a pure function of the DAG and the options (the exact method aside,
    # whose time limit makes it depend on the machine), so the result does not depend on it.
    jobs: int | None = option(None, "worker processes for the distinct DAGs (unset: one per CPU core)")

    def check(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise PassError(f"overlap-schedule: jobs must be a positive count (leave it unset for one per core), got {self.jobs}")
        if self.time_limit <= 0:
            raise PassError(f"overlap-schedule: time-limit must be positive, got {self.time_limit}")
        if not self.cache_max_mb > 0:
            raise PassError(f"overlap-schedule: cache-max-mb must be a positive size in MiB, got {self.cache_max_mb}")

    def apply(self, module: Module) -> bool:
        pairs = module.plan_ops("pair")
        if not pairs and not module.plan_ops("pair_schedule"):
            return False
        # Re-running the pass replaces earlier schedules instead of piling up new ones; the
        # view is built after, so the pairs' old ``schedule`` references are not followed.
        module.plan = [op for op in module.plan if op.op != "pair_schedule"]
        for op in pairs:
            op.attrs.pop("schedule", None)
        t0 = time.perf_counter()
        view = PlanView(module)
        # Pairs are grouped by (forward side's signature, backward side's signature). That
        # is the same grouping as by whole-DAG signature: the DAG is the forward side
        # followed by the backward side with its dependencies shifted by the forward
        # side's length, and each signature entry records its side, so two DAG signatures
        # are equal exactly when both side signatures are. The DAG itself is built only
        # for the first pair of each group, which is scheduled.
        groups: dict[tuple[int, int], tuple[PairDAG, list[str]]] = {}
        failed: Exception | None = None
        for op in pairs:
            try:
                pair = view.pair(op.name)
                fwd, bwd = view.pair_sides(pair)
            except TesseraError as err:  # raised below, after the pairs before it are scheduled
                failed = err
                break
            key = (view.side_id(fwd), view.side_id(bwd))
            if key not in groups:
                groups[key] = (join_sides(fwd, bwd, op.name), [])
            groups[key][1].append(op.name)
        dags = [dag for dag, _ in groups.values()]
        note_time("build pair DAGs", time.perf_counter() - t0)
        solved = self._schedules(dags, failed)
        if failed is not None:
            raise failed
        t0 = time.perf_counter()
        ops = {op.name: op for op in pairs}
        for k, (sched, (_, members)) in enumerate(zip(solved, groups.values())):
            name = f"sched.{k}"
            op = schedule_op(sched, name, members, self.verify is not False)
            module.plan.append(op)
            for pair_name in members:
                attrs = ops[pair_name].attrs
                attrs["schedule"] = SymbolRef(name)
                attrs["makespan"] = op.attrs["makespan"]
                attrs["lower_bound"] = op.attrs["lower_bound"]
        note_time("write schedule ops", time.perf_counter() - t0)
        return True

    def _cacheable(self) -> bool:
        # A wall-clock limited MILP's answer depends on the machine; everything else is a pure
        # function of the DAG and the options.
        return self.cache and not (self.method == "exact" and self.solver != "cpsat")

    def _schedules(self, dags: list[PairDAG], failed: Exception | None) -> list[PairSchedule]:
        """A checked schedule of every DAG: from the cache when it holds one that passes the
        exact check, else scheduled (and cached). Errors as a run without the cache raises them."""
        t0 = time.perf_counter()
        options: dict[str, object] = {"method": self.method}
        if self.method == "exact":
            options.update(solver=self.solver, time_limit=self.time_limit)
        keys = [schedule_key(dag, SCHEDULER_VERSION, options) for dag in dags]
        cache = ScheduleCache(self.cache_dir, int(self.cache_max_mb * 2**20)) if self._cacheable() else None
        found = [cache.get(key, dag) if cache is not None else None for key, dag in zip(keys, dags)]
        note_time("schedule cache lookup", time.perf_counter() - t0)

        def wants_proof(k: int) -> bool:
            if self.verify is True:
                return True  # every schedule, cached or not
            entry = found[k]
            if self.verify is False or (entry is not None and entry.proven):
                return False
            return self.verify == "new" or sampled(keys[k])

        todo = [k for k, entry in enumerate(found) if entry is None]
        workers = worker_count(self.jobs, len(todo))
        # With workers, the new schedules' z3 proofs run in a process of their own while the
        # passes after this one go on (they change nothing in the IR); the pass manager waits
        # for them after the last pass, and a schedule z3 refutes fails the compile then.
        background = self.prove_beside and proofs_can_run_in_background(workers) and failed is None
        fresh = schedule_all(
            [dags[k] for k in todo], self.method, self.time_limit, self.solver,
            [wants_proof(k) and not background for k in todo], workers,
        )
        note_time("schedule (cpu seconds, all workers)", fresh.schedule_seconds)
        if fresh.prove_seconds and not background:
            note_time("z3 proof in workers (cpu seconds)", fresh.prove_seconds)
        schedules: list[PairSchedule] = []
        proven: list[bool] = []
        fresh_of = dict(zip(todo, range(len(todo))))
        for k, entry in enumerate(found):
            if entry is not None:
                schedules.append(entry.schedule)
                proven.append(entry.proven and self.verify is not True)
            else:
                schedules.append(fresh.schedules[fresh_of[k]])
                proven.append(fresh.proven[fresh_of[k]])
        if failed is not None:
            return schedules  # the caller raises the error of the pair that could not be built
        check_s = prove_s = 0.0
        later: list[int] = []  # new schedules whose z3 proof runs in the background
        now: list[int] = []  # schedules whose z3 proof runs here, after every exact check
        for k in range(len(schedules)) if self.verify is not False else ():
            where = f"pair_schedule @sched.{k}"
            prove = wants_proof(k) and not proven[k]
            if prove and found[k] is None:
                (later if background else now).append(k)
                prove = False
            t1 = time.perf_counter()
            try:
                check_schedule(dags[k], entries_of(schedules[k]), where, prove=prove)
            except ScheduleError as err:
                if found[k] is None:
                    raise
                # Never trusted: a cached schedule that fails is dropped and the pair scheduled again.
                cache.ignore_invalid(keys[k], err)  # type: ignore[union-attr]
                found[k] = None
                schedules[k] = schedule_dag(dags[k], self.method, self.time_limit, self.solver)
                prove = wants_proof(k)
                check_schedule(dags[k], entries_of(schedules[k]), where, prove=prove)
            proven[k] = proven[k] or prove
            if prove:
                prove_s += time.perf_counter() - t1
            else:
                check_s += time.perf_counter() - t1
        note_time("exact check", check_s)
        # A batch at a time as one z3 problem; a batch that fails is proven schedule by schedule,
        # which raises at the first schedule z3 refutes, with the constraint it found violated.
        t1 = time.perf_counter()
        for i in range(0, len(now), PROOF_BATCH):
            batch = now[i:i + PROOF_BATCH]
            if not prove_all([schedules[k] for k in batch]):
                for k in batch:
                    check_schedule(dags[k], entries_of(schedules[k]), f"pair_schedule @sched.{k}", prove=True)
            for k in batch:
                proven[k] = True
        prove_s += time.perf_counter() - t1 if now else 0.0
        if prove_s:
            note_time("z3 proof", prove_s)

        kept: set[int] = set()  # new schedules already written, by the process that proved them

        def write_cache() -> None:
            if cache is None:
                return
            t1 = time.perf_counter()
            for k, sched in enumerate(schedules):
                entry = found[k]
                if k not in kept and (entry is None or (proven[k] and not entry.proven)):
                    cache.put(keys[k], sched, proven[k])
            if cache.written or kept:
                cache.trim()
            note_time("schedule cache write", time.perf_counter() - t1)

        if not later:
            write_cache()
            return schedules

        def keep(i: int) -> bool:
            """Write the ``i``-th background-proven schedule to the cache, where it was proven (most
            often in the background process, off the compile's path). One that cannot be written
            (OSError) is not kept, and write_cache tries again, warning if it fails again."""
            assert cache is not None
            k = later[i]
            cache.write(keys[k], schedules[k], True)
            return True

        proofs = BackgroundProofs([schedules[k] for k in later], keep if cache is not None else None)
        note_time(f"z3 proofs of {len(later)} new schedules: left running beside the later passes", 0.0)

        def finish() -> None:
            for k, ok in zip(later, proofs.wait()):
                if not ok:  # proven again here, which raises with the constraint z3 found violated
                    check_schedule(dags[k], entries_of(schedules[k]), f"pair_schedule @sched.{k}", prove=True)
                proven[k] = True
            kept.update(k for k, was_kept in zip(later, proofs.kept()) if was_kept)
            write_cache()

        finish_later("z3 proofs of the new schedules", finish, proofs.cancel)
        return schedules
