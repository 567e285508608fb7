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


def one_stream_bound(
    dag: PairDAG, resource: Resource, head: Sequence[float] | None = None, bl: Sequence[float] | None = None
) -> float:
    """Lower bound from one stream alone, with heads and tails (Jackson's preemptive schedule).

    Relax everything except the stream: each of its tasks becomes available at
    its head (longest path into it) and, once finished, still needs its tail
    (longest path out of it). Preemptively running the available task with the
    longest tail is optimal for that relaxation (Jackson's rule), so
    max(completion + tail) over its tasks bounds every real schedule. It is at
    least the stream's total plus the smallest head, and often much more.
    """
    head = heads(dag) if head is None else head
    bl = bottom_levels(dag) if bl is None else bl
    members = sorted(
        (i for i, t in enumerate(dag.tasks) if t.resource is resource), key=lambda i: (head[i], dag.tasks[i].name)
    )
    remaining = {i: dag.tasks[i].duration for i in members}
    heap: list[tuple[float, int]] = []
    t = 0.0
    bound = 0.0
    k = 0
    while k < len(members) or heap:
        if not heap:
            t = max(t, head[members[k]])
        while k < len(members) and head[members[k]] <= t + EPS:
            i = members[k]
            heapq.heappush(heap, (-(bl[i] - dag.tasks[i].duration), i))
            k += 1
        neg_tail, i = heapq.heappop(heap)
        next_release = head[members[k]] if k < len(members) else float("inf")
        run = min(remaining[i], max(0.0, next_release - t))
        t += run
        remaining[i] -= run
        if remaining[i] > EPS:
            heapq.heappush(heap, (neg_tail, i))
        else:
            bound = max(bound, t - neg_tail)
    return bound


def strong_lower_bound(dag: PairDAG) -> float:
    """The reported lower bound, tightened by the one-stream bounds of both streams.

    The reported bound (max of stream totals and critical path) is what every
    schedule is compared with; this tighter one lets the heuristic stop as
    soon as it has provably found an optimum.
    """
    head, bl = heads(dag), bottom_levels(dag)
    return max([dag.lower_bound()] + [one_stream_bound(dag, r, head, bl) for r in RESOURCES])
