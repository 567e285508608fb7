"""The ``overlap-schedule`` pass: a schedule for every forward/backward pair.

Before (from ``candidates``, or written by hand)::

    plan pair @pair.0 {bwd = [@l2, @l3], fwd = [@l0, @l1]}

After (``overlap-schedule``)::

    plan pair @pair.0 {bwd = [@l2, @l3], fwd = [@l0, @l1], lower_bound = 790.0, makespan = 812.5,
                       schedule = @sched.0}
    plan pair_schedule @sched.0 {bound_ratio = 1.028, hardware = "h100", lower_bound = 790.0, makespan = 812.5,
                                 method = "gap-fit", pairs = [@pair.0], serial = 1403.2, tasks = 32,
                                 verified = true} {
      @l0.linear_attention.fwd {duration = 120.0, order = 0, start = 0.0, stream = "compute"}
      ...
    }

For each ``pair`` op the pass builds the pair DAG (:mod:`passes.pair_dag`):
the forward tasks of the ``fwd`` layers beside the dgrad/wgrad tasks of the
``bwd`` layers. A task's duration is its ``cost_us`` attribute when it has one
(a measured or calibrated cost), else the analytic isolated duration on the
``hardware`` option's device (``cost_model.task_duration_us``). A movable task
with a ``deadline`` attribute (µs from the start of the pair) must finish by
then; without one it only has to finish within the pair.

Pairs whose DAGs are identical up to task names (same kinds, durations,
dependencies, in the same order) share one schedule: it is computed once,
emitted once, and its entries name the tasks of the first such pair; the other
pairs match it position by position (entries are listed in DAG order).

Methods (option ``method``): ``gap-fit`` (default; backbone first, gap fit,
see :mod:`passes.pair_schedulers`), ``serial`` and ``fixed-template``
(baselines), ``exact`` (the ILP of :mod:`passes.exact_schedule`, for small
pairs; ``time-limit`` seconds per pair and ``solver`` highs|cbc; the schedule
op records ``status`` = optimal/feasible/timeout).

With ``verify=true`` (default) every schedule is checked by z3
(:mod:`passes.schedule_check`) before it is written; a schedule that breaks a
constraint stops the pass with a :class:`~passes.schedule_check.ScheduleError`.

Speed: each distinct side of a pair (a list of forward or backward layers) is
built once, and pairs are grouped by their two side signatures, so a DAG is
built only per distinct signature. The distinct DAGs are scheduled and checked
by ``jobs`` worker processes (0, the default: one per CPU core; 1: in this
process; small modules always stay in-process). Scheduling and checking are
deterministic, so the output and the first error reported are the same for
every ``jobs``.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from passes.cost_model import load_hardware, task_duration_us
from passes.manager import ModulePass, PassError
from passes.pair_dag import BWD, FWD, PairDAG, PairTask, build_pair_dag, join_sides, pair_side_layers, side_tasks
from passes.pair_schedulers import SCHEDULERS, PairSchedule
from passes.schedule_check import ScheduleEntry, ScheduleError, check_schedule, entries_of
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef, Task
from tessera_ir.parallel import ParallelConfig

METHODS = ("gap-fit", "serial", "fixed-template", "exact")

Signature = tuple[tuple[str, str, float, tuple[int, ...], bool, float | None, str], ...]


def duration_fn(module: Module, hardware: str) -> Callable[[Task], float]:
    """Task duration in µs: ``cost_us`` when present, else the analytic isolated duration."""
    hw = load_hardware(hardware)
    parallel = ParallelConfig.from_attrs(module.attrs)

    def duration(task: Task) -> float:
        cost = task.attrs.get("cost_us")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            return float(cost)
        return task_duration_us(task, hw, parallel)

    return duration


def pair_dag(module: Module, op: PlanOp, duration: Callable[[Task], float]) -> PairDAG:
    """The DAG of one ``pair`` op."""
    if "fwd" not in op.attrs and "bwd" not in op.attrs:
        raise PassError(f"pair @{op.name} has neither 'fwd' nor 'bwd'; a pair lists its forward and backward layers")
    return build_pair_dag(pair_side_layers(module, op, "fwd"), pair_side_layers(module, op, "bwd"), duration, name=op.name)


def dag_signature(dag: PairDAG) -> Signature:
    """What a schedule depends on: everything about the tasks except their names."""
    return _tasks_signature(dag.tasks)


def _tasks_signature(tasks: Sequence[PairTask]) -> Signature:
    return tuple((t.kind, t.resource.value, t.duration, t.deps, t.movable, t.deadline, t.side) for t in tasks)


def schedule_dag(dag: PairDAG, method: str = "gap-fit", time_limit: float = 10.0, solver: str = "highs") -> PairSchedule:
    """Schedule one pair DAG with the named method."""
    if method == "exact":
        from passes.exact_schedule import exact

        return exact(dag, time_limit_s=time_limit, solver=solver)
    if method not in SCHEDULERS:
        raise PassError(f"unknown scheduling method '{method}'; use one of {', '.join(METHODS)}")
    return SCHEDULERS[method](dag)


def schedule_op(schedule: PairSchedule, name: str, pairs: list[str], hardware: str, verified: bool) -> PlanOp:
    """The ``pair_schedule`` plan op of a schedule; entries in DAG order."""
    dag = schedule.dag
    attrs: dict = {
        "method": schedule.method,
        "makespan": schedule.makespan,
        "lower_bound": dag.lower_bound(),
        # makespan / lower bound: 1.0 means provably optimal, more says how far it may be from it
        "bound_ratio": schedule.makespan / dag.lower_bound() if dag.lower_bound() > 0 else 1.0,
        "serial": dag.serial_time(),
        "tasks": len(dag.tasks),
        "hardware": hardware,
        "pairs": [SymbolRef(p) for p in pairs],
        "verified": verified,
    }
    if schedule.method == "exact":
        attrs["status"] = schedule.status
    order = schedule.order_of()
    entries = [
        PlanEntry(
            t.name,
            {"start": schedule.start[i], "duration": t.duration, "stream": t.resource.value, "order": order[i]},
        )
        for i, t in enumerate(dag.tasks)
    ]
    return PlanOp("pair_schedule", name, attrs, entries)


def plan_entries(op: PlanOp) -> list[ScheduleEntry]:
    """The schedule entries of a ``pair_schedule`` op, as the z3 checker reads them."""
    out = []
    for e in op.entries:
        try:
            out.append(
                ScheduleEntry(e.ref, float(e.attrs["start"]), float(e.attrs["duration"]), str(e.attrs["stream"]))  # type: ignore[arg-type]
            )
        except (KeyError, TypeError, ValueError):
            raise ScheduleError(
                f"pair_schedule @{op.name}: entry @{e.ref} needs numeric 'start' and 'duration' and a 'stream'",
                "placed-once",
                [e.ref],
            ) from None
    return out


def schedule_from_plan(module: Module, name: str, hardware: str | None = None) -> PairSchedule:
    """Rebuild a :class:`PairSchedule` from the IR: ``name`` is a pair op or a pair_schedule op.

    The DAG is rebuilt from the pair the schedule's entries name (its first
    pair); durations come from the entries themselves, so drawing a plan needs
    no hardware description.
    """
    ops = {op.name: op for op in module.plan}
    if name not in ops:
        known = ", ".join(sorted(o.name for o in module.plan if o.op in ("pair", "pair_schedule"))) or "none"
        raise PassError(f"module @{module.name} has no plan op @{name}; pairs and schedules: {known}")
    op = ops[name]
    if op.op == "pair":
        ref = op.attrs.get("schedule")
        if not isinstance(ref, SymbolRef) or ref.name not in ops:
            raise PassError(f"pair @{name} has no schedule; run the overlap-schedule pass first")
        sched = ops[ref.name]
    elif op.op == "pair_schedule":
        sched = op
    else:
        raise PassError(f"plan op @{name} is a '{op.op}', not a pair or a pair_schedule")
    pairs = sched.attrs.get("pairs", [])
    first = pairs[0].name if isinstance(pairs, list) and pairs and isinstance(pairs[0], SymbolRef) else None
    if first is None or first not in ops:
        raise PassError(f"pair_schedule @{sched.name} names no pair in 'pairs'; rerun overlap-schedule")
    by_ref = {e.ref: e for e in sched.entries}

    def duration(task: Task) -> float:
        entry = by_ref.get(task.name)
        value = entry.attrs.get("duration") if entry else None
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise PassError(f"pair_schedule @{sched.name} has no duration for task @{task.name}")
        return float(value)

    dag = pair_dag(module, ops[first], duration)
    start = [float(by_ref[t.name].attrs["start"]) for t in dag.tasks]  # type: ignore[arg-type]
    return PairSchedule(dag, start, str(sched.attrs.get("method", "gap-fit")), status=str(sched.attrs.get("status", "")))


def check_plan_schedules(module: Module, hardware: str | None = None) -> int:
    """z3-check every ``pair_schedule`` op of ``module`` against its first pair's DAG.

    Durations are recomputed from the IR (``cost_us`` or the cost model on the
    schedule's recorded hardware), so an edited duration is caught. Returns the
    number of schedules checked; raises :class:`ScheduleError` on the first bad one.
    """
    ops = {op.name: op for op in module.plan}
    checked = 0
    for sched in module.plan_ops("pair_schedule"):
        pairs = sched.attrs.get("pairs", [])
        if not (isinstance(pairs, list) and pairs and isinstance(pairs[0], SymbolRef) and pairs[0].name in ops):
            raise ScheduleError(f"pair_schedule @{sched.name} names no existing pair in 'pairs'; rerun overlap-schedule")
        hw = hardware or str(sched.attrs.get("hardware", "h100"))
        dag = pair_dag(module, ops[pairs[0].name], duration_fn(module, hw))
        check_schedule(dag, plan_entries(sched), where=f"pair_schedule @{sched.name}")
        checked += 1
    return checked


@dataclass(frozen=True)
class OverlapSchedulePass(ModulePass):
    name = "overlap-schedule"
    summary = "Schedule every forward/backward pair on the compute and comm streams (backbone-first gap fit)."

    method: str = "gap-fit"
    hardware: str = "h100"
    verify: bool = True
    time_limit: float = 10.0
    solver: str = "highs"
    # Worker processes for the distinct DAGs: 0 = one per CPU core, 1 = none. Each DAG's
    # schedule is a pure function of the DAG and the options (the exact method aside,
    # whose time limit makes it depend on the machine), so the result does not depend on it.
    jobs: int = 0

    def _workers(self, tasks: int) -> int:
        jobs = self.jobs or _cpu_cores()
        # A worker process costs a fork and some copying; small modules stay in-process.
        return min(jobs, tasks // MIN_TASKS_PER_WORKER) if tasks >= 2 * MIN_TASKS_PER_WORKER else 1

    def apply(self, module: Module) -> bool:
        if self.method not in METHODS:
            raise PassError(f"unknown method '{self.method}' for overlap-schedule; use one of {', '.join(METHODS)}")
        if self.jobs < 0:
            raise PassError(f"overlap-schedule: jobs must be 0 (one per CPU core) or a positive count, got {self.jobs}")
        pairs = module.plan_ops("pair")
        old = [op for op in module.plan if op.op == "pair_schedule"]
        if not pairs and not old:
            return False
        duration = duration_fn(module, self.hardware)
        # Re-running the pass replaces earlier schedules instead of piling up new ones.
        module.plan = [op for op in module.plan if op.op != "pair_schedule"]
        sides = _SideCache(module, duration)
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
                key, fwd, bwd = sides.pair(op)
            except Exception as err:  # noqa: BLE001 - raised below, after the pairs before it are scheduled
                failed = err
                break
            if key not in groups:
                groups[key] = (join_sides(fwd, bwd, op.name), [])
            groups[key][1].append(op.name)
        dags = [dag for dag, _ in groups.values()]
        # Errors come in the order of a pair-by-pair run: scheduling the DAGs met before a
        # pair that cannot be built, then that pair, then the checks in schedule order.
        with frozen_heap():
            solved, valid = _schedule_all(
                dags, self.method, self.time_limit, self.solver, self.verify, self._workers(len(dags))
            )
            if failed is not None:
                raise failed
            if self.verify:
                for k, sched in enumerate(solved):
                    if not valid[k]:
                        check_schedule(sched.dag, entries_of(sched), where=f"pair_schedule @sched.{k}")
        by_signature = {key: (sched, members) for (key, (_, members)), sched in zip(groups.items(), solved)}
        names = []
        for k, (sched, members) in enumerate(by_signature.values()):
            name = f"sched.{k}"
            module.plan.append(schedule_op(sched, name, members, self.hardware, self.verify))
            names.append(name)
        ops = {op.name: op for op in pairs}
        for name, (sched, members) in zip(names, by_signature.values()):
            for pair_name in members:
                attrs = ops[pair_name].attrs
                attrs["schedule"] = SymbolRef(name)
                attrs["makespan"] = sched.makespan
                attrs["lower_bound"] = sched.dag.lower_bound()
        return True


# Fewer distinct DAGs per worker than this are not worth a process.
MIN_TASKS_PER_WORKER = 16


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the objects that exist now out of the garbage collector's way meanwhile.

    Scheduling and costing allocate many small objects, so the collector runs
    often, and each full collection walks the whole heap: with a captured model
    (and torch) loaded that made scheduling a third slower in-process, and in
    forked workers it also copies every inherited page. Frozen objects (the
    permanent generation) are skipped; they are live anyway. Does nothing when
    the caller froze objects already, so as not to unfreeze theirs.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _cpu_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# The DAGs and options a worker process reads: set before the pool forks, so the
# workers inherit them instead of receiving them pickled.
_WORK: tuple[list[PairDAG], str, float, str, bool] | None = None


def _solve_in_worker(k: int) -> tuple[list[float], str, str, float | None, dict, bool] | None:
    """Schedule DAG ``k`` of ``_WORK`` and, when asked, z3-check it: (start times, method,
    status, bound, stats, checked and valid), or None when scheduling failed. Failures
    are redone in the main process, which raises them exactly as a run without workers."""
    assert _WORK is not None
    dags, method, time_limit, solver, verify = _WORK
    try:
        sched = schedule_dag(dags[k], method, time_limit, solver)
    except Exception:  # noqa: BLE001 - any failure is redone in the main process
        return None
    valid = False
    if verify:
        try:
            check_schedule(sched.dag, entries_of(sched))
            valid = True
        except Exception:  # noqa: BLE001 - likewise
            pass
    return sched.start, sched.method, sched.status, sched.bound, sched.stats, valid


def _schedule_all(
    dags: list[PairDAG], method: str, time_limit: float, solver: str, verify: bool, workers: int
) -> tuple[list[PairSchedule], list[bool]]:
    """Schedules of ``dags`` in order, and for each whether it was already z3-checked and valid.

    Without workers nothing is checked here, and the first DAG that cannot be
    scheduled raises. With several, the DAGs are spread over forked processes that
    also run the check (the slower half of the work); a DAG whose scheduling failed
    there is redone here, in order, so the error raised is the one a run without
    workers raises (scheduling is deterministic).
    """
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return [schedule_dag(dag, method, time_limit, solver) for dag in dags], [False] * len(dags)
    global _WORK
    _WORK = (dags, method, time_limit, solver, verify)
    try:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            # Small chunks keep both workers busy to the end (DAG sizes vary a lot).
            results = pool.map(_solve_in_worker, range(len(dags)), chunksize=4)
    finally:
        _WORK = None
    scheds, valid = [], []
    for dag, res in zip(dags, results):
        if res is None:
            scheds.append(schedule_dag(dag, method, time_limit, solver))
            valid.append(False)
        else:
            start, used, status, bound, stats, ok = res
            scheds.append(PairSchedule(dag, start, used, status=status, bound=bound, stats=stats))
            valid.append(ok)
    return scheds, valid


class _SideCache:
    """Each distinct side (forward or backward, a list of layers) of the module's pairs is
    built once; pairs reuse it. Sides with equal signatures share an id."""

    def __init__(self, module: Module, duration: Callable[[Task], float]):
        self.module = module
        self.duration = duration
        self.sides: dict[tuple[str, tuple[str, ...]], tuple[list[PairTask], int]] = {}
        self.ids: dict[Signature, int] = {}

    def side(self, op: PlanOp, key: str) -> tuple[list[PairTask], int]:
        layers = pair_side_layers(self.module, op, key)
        cache_key = (key, tuple(layer.name for layer in layers))
        hit = self.sides.get(cache_key)
        if hit is None:
            tasks = side_tasks(layers, FWD if key == "fwd" else BWD, self.duration, op.name)
            hit = (tasks, self.ids.setdefault(_tasks_signature(tasks), len(self.ids)))
            self.sides[cache_key] = hit
        return hit

    def pair(self, op: PlanOp) -> tuple[tuple[int, int], list[PairTask], list[PairTask]]:
        """(signature key, forward side, backward side) of a pair op."""
        if "fwd" not in op.attrs and "bwd" not in op.attrs:
            raise PassError(f"pair @{op.name} has neither 'fwd' nor 'bwd'; a pair lists its forward and backward layers")
        fwd, fwd_id = self.side(op, "fwd")
        bwd, bwd_id = self.side(op, "bwd")
        return (fwd_id, bwd_id), fwd, bwd
