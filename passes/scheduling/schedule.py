"""A pair schedule, and the lower bounds every scheduler and the exact solver compare against.

A pair is the forward of one model chunk beside the backward of another
(:mod:`passes.scheduling.pair_dag`). A schedule gives every task a start time on the one
stream its resource names; a stream runs one task at a time, a task starts
after all its predecessors finished, and a movable (wgrad) task finishes by its
deadline (default: the end of the pair). The cost of the pair is the makespan.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from passes.scheduling.pair_dag import PairDAG
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import PlanEntry, PlanOp, SymbolRef

# Floating-point slack when comparing times: 1e-9 µs is far below any duration
# the cost model produces, and far above the rounding error of summed floats.
EPS = 1e-9

RESOURCES = (Resource.COMPUTE, Resource.COMM)


class SchedulingError(TesseraError):
    """A pair cannot be scheduled as asked (e.g. a movable task's deadline is unreachable)."""


@dataclass
class PairSchedule:
    """Start times for every task of ``dag`` (index-aligned with ``dag.tasks``)."""

    dag: PairDAG
    start: list[float]
    method: str
    status: str = "heuristic"  # "heuristic", or for the exact method "optimal" / "feasible" / "timeout"
    solve_seconds: float = 0.0
    bound: float | None = None  # best proven lower bound (exact method), else None
    stats: dict[str, object] = field(default_factory=dict)

    def duration(self, i: int) -> float:
        return self.dag.tasks[i].duration

    def finish(self, i: int) -> float:
        return self.start[i] + self.dag.tasks[i].duration

    @property
    def makespan(self) -> float:
        return max((self.finish(i) for i in range(len(self.dag.tasks))), default=0.0)

    def stream_order(self, resource: Resource) -> list[int]:
        """Task indices on one stream in execution order (by start, then finish, then name)."""
        idx = [i for i, t in enumerate(self.dag.tasks) if t.resource is resource]
        return sorted(idx, key=lambda i: (self.start[i], self.finish(i), self.dag.tasks[i].name))

    def order_of(self) -> list[int]:
        """Position of every task within its stream (0-based)."""
        order = [0] * len(self.dag.tasks)
        for r in RESOURCES:
            for k, i in enumerate(self.stream_order(r)):
                order[i] = k
        return order

    def ratio_to_bound(self) -> float:
        lb = self.dag.lower_bound()
        return self.makespan / lb if lb > 0 else 1.0


def bottom_levels(dag: PairDAG, weight: Callable[[int], float] | None = None) -> list[float]:
    """Longest path from each task to the end of the DAG, the task's own weight included.

    Tasks are stored in topological order, so one reverse sweep suffices.
    """
    w = weight or (lambda i: dag.tasks[i].duration)
    succ = dag.successors()
    bl = [0.0] * len(dag.tasks)
    for i in range(len(dag.tasks) - 1, -1, -1):
        bl[i] = w(i) + max((bl[s] for s in succ[i]), default=0.0)
    return bl


def heads(dag: PairDAG) -> list[float]:
    """Earliest possible start of each task: the longest path into it."""
    head = [0.0] * len(dag.tasks)
    for i, t in enumerate(dag.tasks):
        head[i] = max((head[d] + dag.tasks[d].duration for d in t.deps), default=0.0)
    return head


def left_shift(dag: PairDAG, values: Sequence[float], durations: Sequence[float] | None = None) -> list[float]:
    """Start times that keep each stream's order in ``values`` (say, a solver's start times)
    and start every task as early as that order and its dependencies allow, with
    ``durations`` (default: the tasks' own). Never later than ``values`` when those are a
    valid schedule with the same durations."""
    n = len(dag.tasks)
    dur = [t.duration for t in dag.tasks] if durations is None else list(durations)
    # By start, then finish: a dependency starts strictly earlier, or at the same time with
    # zero duration, which the finish orders correctly; so this is a topological order.
    order = sorted(range(n), key=lambda i: (values[i], values[i] + dur[i], dag.tasks[i].name))
    free = {r: 0.0 for r in RESOURCES}
    start = [0.0] * n
    placed = [False] * n
    for i in order:
        task = dag.tasks[i]
        if not all(placed[d] for d in task.deps):
            raise SchedulingError(f"the start times given for pair '{dag.name}' order tasks against their dependencies")
        start[i] = max([free[task.resource]] + [start[d] + dur[d] for d in task.deps])
        free[task.resource] = start[i] + dur[i]
        placed[i] = True
    return start


def priority_order(names: Sequence[str], key: Sequence[float], preds: Sequence[Sequence[int]]) -> list[int]:
    """A topological order of tasks ``0 .. len(names) - 1`` under ``preds`` that always takes the
    ready task of highest ``key`` (ties: name). Tasks on a cycle are left out."""
    n = len(names)
    succ: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for p in preds[i]:
            succ[p].append(i)
    missing = [len(preds[i]) for i in range(n)]
    heap = [(-key[i], names[i], i) for i in range(n) if missing[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, _, i = heapq.heappop(heap)
        out.append(i)
        for s in succ[i]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(heap, (-key[s], names[s], s))
    return out


def schedule_op(schedule: PairSchedule, name: str, pairs: list[str], verified: bool) -> PlanOp:
    """The ``pair_schedule`` plan op of a schedule; entries in DAG order."""
    dag = schedule.dag
    makespan, lower_bound = schedule.makespan, dag.lower_bound()  # each read once: a compile writes ~1,000 ops
    attrs: dict = {
        "method": schedule.method,
        "makespan": makespan,
        "lower_bound": lower_bound,
        # makespan / lower bound: 1.0 means provably optimal, more says how far it may be from it
        "bound_ratio": makespan / lower_bound if lower_bound > 0 else 1.0,
        "serial": dag.serial_time(),
        "tasks": len(dag.tasks),
        "pairs": [SymbolRef(p) for p in pairs],
        "verified": verified,
    }
    if schedule.method == "exact":
        attrs["status"] = schedule.status
        if schedule.bound is not None:
            attrs["proven_bound"] = schedule.bound  # what the solver proved no schedule beats
    order = schedule.order_of()
    entries = [
        PlanEntry(
            t.name,
            {"start": schedule.start[i], "duration": t.duration, "stream": t.resource.value, "order": order[i]},
        )
        for i, t in enumerate(dag.tasks)
    ]
    return PlanOp("pair_schedule", name, attrs, entries)
