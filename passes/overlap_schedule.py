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

Methods (option ``method``): ``gap-fit`` (default; backbone first, gap fit,
:mod:`passes.scheduling.gap_fit`), ``serial`` and ``fixed-template`` (baselines,
:mod:`passes.scheduling.baselines`), ``exact`` (the ILP of :mod:`passes.scheduling.exact`,
for small pairs; ``time-limit`` seconds per pair and ``solver`` highs|cbc; the schedule op
records ``status`` = optimal/feasible/timeout).

With ``verify=true`` (default) every schedule is checked by z3 (:mod:`passes.scheduling.check`)
before it is written; a schedule that breaks a constraint stops the pass with a
:class:`~passes.scheduling.check.ScheduleError`.

Speed: each distinct side of a pair (a list of forward or backward layers) is built once
by the view, and pairs are grouped by their two side signatures, so a DAG is built only
per distinct signature. The distinct DAGs are scheduled and checked by ``jobs`` worker
processes (default: one per CPU core; small modules always stay in-process,
:mod:`passes.scheduling.batch`). Scheduling and checking are deterministic, so the output
and the first error reported are the same for every ``jobs``.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.manager import ModulePass, PassError, option
from passes.plan_view import PlanView
from passes.scheduling.batch import schedule_all, worker_count
from passes.scheduling.check import ScheduleEntry, ScheduleError, check_schedule, entries_of
from passes.scheduling.methods import IlpSolver, Method
from passes.scheduling.pair_dag import PairDAG, join_sides
from passes.scheduling.schedule import PairSchedule
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef


def schedule_op(schedule: PairSchedule, name: str, pairs: list[str], verified: bool) -> PlanOp:
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
    for sched in module.plan_ops("pair_schedule"):
        pairs = sched.attrs.get("pairs", [])
        first = pairs[0] if isinstance(pairs, list) and pairs else None
        if not isinstance(first, SymbolRef) or first.name not in view.ops:
            raise ScheduleError(f"pair_schedule @{sched.name} names no existing pair in 'pairs'; rerun overlap-schedule")
        dag = view.pair_dag(view.pair(first.name))
        check_schedule(dag, plan_entries(sched), where=f"pair_schedule @{sched.name}")
        checked += 1
    return checked


@dataclass(frozen=True)
class OverlapSchedulePass(ModulePass):
    name = "overlap-schedule"
    summary = "Schedule every forward/backward pair on the compute and comm streams (backbone-first gap fit)."

    method: Method = option("gap-fit", "scheduler: backbone-first gap fit, the two baselines, or the exact ILP")
    verify: bool = option(True, "z3-check every schedule before writing it")
    time_limit: float = option(10.0, "method=exact: seconds per pair")
    solver: IlpSolver = option("highs", "method=exact: the ILP solver")
    # Each DAG's schedule is a pure function of the DAG and the options (the exact method aside,
    # whose time limit makes it depend on the machine), so the result does not depend on it.
    jobs: int | None = option(None, "worker processes for the distinct DAGs (unset: one per CPU core)")

    def check(self) -> None:
        if self.jobs is not None and self.jobs < 1:
            raise PassError(f"overlap-schedule: jobs must be a positive count (leave it unset for one per core), got {self.jobs}")
        if self.time_limit <= 0:
            raise PassError(f"overlap-schedule: time-limit must be positive, got {self.time_limit}")

    def apply(self, module: Module) -> bool:
        pairs = module.plan_ops("pair")
        if not pairs and not module.plan_ops("pair_schedule"):
            return False
        # Re-running the pass replaces earlier schedules instead of piling up new ones; the
        # view is built after, so the pairs' old ``schedule`` references are not followed.
        module.plan = [op for op in module.plan if op.op != "pair_schedule"]
        for op in pairs:
            op.attrs.pop("schedule", None)
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
        # Errors come in the order of a pair-by-pair run: scheduling the DAGs met before a
        # pair that cannot be built, then that pair, then the checks in schedule order.
        solved, valid = schedule_all(
            dags, self.method, self.time_limit, self.solver, self.verify, worker_count(self.jobs, len(dags))
        )
        if failed is not None:
            raise failed
        if self.verify:
            for k, sched in enumerate(solved):
                if not valid[k]:
                    check_schedule(sched.dag, entries_of(sched), where=f"pair_schedule @sched.{k}")
        ops = {op.name: op for op in pairs}
        for k, (sched, (_, members)) in enumerate(zip(solved, groups.values())):
            name = f"sched.{k}"
            module.plan.append(schedule_op(sched, name, members, self.verify))
            for pair_name in members:
                attrs = ops[pair_name].attrs
                attrs["schedule"] = SymbolRef(name)
                attrs["makespan"] = sched.makespan
                attrs["lower_bound"] = sched.dag.lower_bound()
        return True
