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
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from passes.cost_model import load_hardware, task_duration_us
from passes.manager import ModulePass, PassError
from passes.pair_dag import PairDAG, build_pair_dag
from passes.pair_schedulers import SCHEDULERS, PairSchedule
from passes.schedule_check import ScheduleEntry, ScheduleError, check_schedule, entries_of
from tessera_ir.model import Layer, Module, PlanEntry, PlanOp, SymbolRef, Task
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


def _pair_layers(module: Module, op: PlanOp, side: str) -> list[Layer]:
    layers = {layer.name: layer for layer in module.layers}
    value = op.attrs.get(side, [])
    if not isinstance(value, list):
        raise PassError(f"pair @{op.name}: attribute '{side}' must be a list of layer references like [@l0, @l1]")
    out = []
    for ref in value:
        name = ref.name if isinstance(ref, SymbolRef) else None
        if name is None or name not in layers:
            raise PassError(
                f"pair @{op.name}: '{side}' names {ref!r}, which is no layer of module @{module.name}; "
                "list layers as @name (e.g. @l0)"
            )
        out.append(layers[name])
    return out


def pair_dag(module: Module, op: PlanOp, duration: Callable[[Task], float]) -> PairDAG:
    """The DAG of one ``pair`` op."""
    if "fwd" not in op.attrs and "bwd" not in op.attrs:
        raise PassError(f"pair @{op.name} has neither 'fwd' nor 'bwd'; a pair lists its forward and backward layers")
    return build_pair_dag(_pair_layers(module, op, "fwd"), _pair_layers(module, op, "bwd"), duration, name=op.name)


def dag_signature(dag: PairDAG) -> Signature:
    """What a schedule depends on: everything about the tasks except their names."""
    return tuple((t.kind, t.resource.value, t.duration, t.deps, t.movable, t.deadline, t.side) for t in dag.tasks)


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

    def apply(self, module: Module) -> bool:
        if self.method not in METHODS:
            raise PassError(f"unknown method '{self.method}' for overlap-schedule; use one of {', '.join(METHODS)}")
        pairs = module.plan_ops("pair")
        old = [op for op in module.plan if op.op == "pair_schedule"]
        if not pairs and not old:
            return False
        duration = duration_fn(module, self.hardware)
        # Re-running the pass replaces earlier schedules instead of piling up new ones.
        module.plan = [op for op in module.plan if op.op != "pair_schedule"]
        by_signature: dict[Signature, tuple[PairSchedule, list[str]]] = {}
        for op in pairs:
            dag = pair_dag(module, op, duration)
            sig = dag_signature(dag)
            if sig not in by_signature:
                sched = schedule_dag(dag, self.method, self.time_limit, self.solver)
                by_signature[sig] = (sched, [])
            sched, members = by_signature[sig]
            members.append(op.name)
        emitted: dict[Signature, str] = {}
        for k, (sig, (sched, members)) in enumerate(by_signature.items()):
            name = f"sched.{k}"
            if self.verify:
                check_schedule(sched.dag, entries_of(sched), where=f"pair_schedule @{name}")
            module.plan.append(schedule_op(sched, name, members, self.hardware, self.verify))
            emitted[sig] = name
        ops = {op.name: op for op in pairs}
        for sched, members in by_signature.values():
            sig = dag_signature(sched.dag)
            for pair_name in members:
                attrs = ops[pair_name].attrs
                attrs["schedule"] = SymbolRef(emitted[sig])
                attrs["makespan"] = sched.makespan
                attrs["lower_bound"] = sched.dag.lower_bound()
        return True
