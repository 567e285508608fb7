"""Schedule generation primitives shared by the heuristic's phases: the DAG as flat lists,
gap-aware placement on a stream, serial generation with insertion, and priority orders.

The inner loops of the gap-fit search live here; they touch only lists of numbers.
"""

from __future__ import annotations

import bisect
import heapq
import operator
from collections.abc import Sequence

from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import EPS, RESOURCES


class FlatDag:
    """The DAG as flat lists (durations, stream index, predecessors, successors), built
    once per call so the inner loops below touch no objects."""

    __slots__ = ("dag", "n", "dur", "res", "preds", "succ", "names", "movable", "deadline")

    def __init__(self, dag: PairDAG):
        self.dag = dag
        self.n = len(dag.tasks)
        self.dur = [t.duration for t in dag.tasks]
        self.res = [RESOURCES.index(t.resource) for t in dag.tasks]
        self.preds = [t.deps for t in dag.tasks]
        self.succ = dag.successors()
        self.names = [t.name for t in dag.tasks]
        self.movable = [t.movable for t in dag.tasks]
        self.deadline = [t.deadline if t.movable else None for t in dag.tasks]

    def makespan(self, start: Sequence[float]) -> float:
        return max(map(operator.add, start, self.dur), default=0.0)

    def meets_deadlines(self, start: Sequence[float]) -> bool:
        for i, dl in enumerate(self.deadline):
            if dl is not None and start[i] + self.dur[i] > dl + EPS:
                return False
        return True

    def time_order(self, start: Sequence[float]) -> list[int]:
        dur, names = self.dur, self.names
        return sorted(range(self.n), key=lambda i: (start[i], start[i] + dur[i], names[i]))


def earliest_fit(busy: list[tuple[float, float]], ready: float, duration: float) -> float:
    """Earliest start >= ready at which [start, start + duration) overlaps no busy interval
    (``busy`` sorted, non-overlapping)."""
    # Fast path: everything ends by ``ready`` (the common case: tasks come roughly in time order).
    if not busy or busy[-1][1] <= ready + EPS:
        return ready
    t = ready
    for s, e in busy:
        if e <= t + EPS:
            continue
        if t + duration <= s + EPS:
            return t
        if e > t:
            t = e
    return t


def occupy(busy: list[tuple[float, float]], start: float, duration: float) -> None:
    iv = (start, start + duration)
    if not busy or busy[-1] <= iv:
        busy.append(iv)
    else:
        bisect.insort(busy, iv)


def serial_generation(ctx: FlatDag, order: Sequence[int], preds: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Serial schedule generation with insertion: place tasks in ``order`` (a topological
    order of ``preds``), each at the earliest time after its predecessors where its stream
    has a gap."""
    preds = ctx.preds if preds is None else preds
    dur, res = ctx.dur, ctx.res
    start = [0.0] * ctx.n
    finish = [0.0] * ctx.n
    lines: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    for i in order:
        ready = 0.0
        for p in preds[i]:
            if finish[p] > ready:
                ready = finish[p]
        busy = lines[res[i]]
        d = dur[i]
        # earliest_fit and occupy, inlined (this loop is the hottest of the search).
        s = ready if not busy or busy[-1][1] <= ready + EPS else earliest_fit(busy, ready, d)
        iv = (s, s + d)
        if not busy or busy[-1] <= iv:
            busy.append(iv)
        else:
            bisect.insort(busy, iv)
        start[i] = s
        finish[i] = s + d
    return start


def priority_order(ctx: FlatDag, key: Sequence[float], preds: Sequence[Sequence[int]] | None = None) -> list[int]:
    """A topological order that always takes the ready task of highest ``key`` (ties: name)."""
    preds = ctx.preds if preds is None else preds
    succ: list[list[int]] = [[] for _ in range(ctx.n)]
    for i in range(ctx.n):
        for p in preds[i]:
            succ[p].append(i)
    missing = [len(preds[i]) for i in range(ctx.n)]
    heap = [(-key[i], ctx.names[i], i) for i in range(ctx.n) if missing[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, _, i = heapq.heappop(heap)
        out.append(i)
        for s in succ[i]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(heap, (-key[s], ctx.names[s], s))
    return out
