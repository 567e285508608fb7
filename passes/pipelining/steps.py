"""One step of a rank's pipeline schedule as a single issue order: what the per-rank program runs.

A step is a chunk's forward alone (warm-up), its backward alone (cool-down), or a steady-state
pair: the forward of one chunk beside the backward of another, as interleaved 1F1B overlaps
them. The plan fixes each stream's order (the pair's ``pair_schedule``; lone chunks and
combinations the plan never paired are scheduled by gap-fit: ``PlanView.chunk_schedule``), but a
rank's program is one sequence of instructions in which a wait holds everything after it. So
the two streams are merged by when the static schedule starts each task: tasks are timed as
soon as their stream and their dependencies allow (isolated durations), and issued in that
order, comm before compute at the same instant (issuing a collective never blocks). A wait
placed before a task then holds back only tasks that the schedule starts no earlier.

A step also marks where each side's output can leave for the neighbouring stage: once the
side's *exit tasks* (those the neighbouring stage's tasks depend on) have finished.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from passes.costs.pair_costs import ScheduledTask
from passes.scheduling.pair_dag import BWD, FWD
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Phase
from tessera_ir.model import Layer, Task

COMM_FIRST = {"comm": 0, "compute": 1}


class StepError(TesseraError):
    """A step the plan's schedules cannot order (a stream order that contradicts a dependency)."""


@dataclass(frozen=True)
class StepItem:
    """A task of the step on its stream, or (``task`` None) the point where ``side``'s output can be sent."""

    side: str  # FWD or BWD
    task: Task | None
    stream: str = "compute"
    exits: tuple[str, ...] = ()  # a send point: the tasks whose results the send carries


@dataclass(frozen=True)
class Step:
    """A step's items in issue order, and where its stream order came from."""

    items: tuple[StepItem, ...]
    schedule: str


def side_of(task: Task) -> str:
    return FWD if task.phase is Phase.FWD else BWD


# (forward layers, backward layers) -> the step's tasks in a stream order, and where it came from
ChunkSchedule = Callable[[Sequence[Layer], Sequence[Layer]], tuple[list[ScheduledTask], str]]


def build_step(
    scheduled: list[ScheduledTask],
    source: str,
    duration_us: Callable[[Task], float],
    exits: dict[str, tuple[str, ...]],
) -> Step:
    """The issue order of a step's ``scheduled`` tasks (a stream order, ``source`` says whose).

    ``exits`` gives, per side present, the names of the tasks its send waits for (empty: the
    side sends nothing, as the last stage's forward and the first stage's backward).
    """
    n = len(scheduled)
    index = {s.task.name: k for k, s in enumerate(scheduled)}
    duration = [duration_us(s.task) for s in scheduled]
    succ: list[list[int]] = [[] for _ in range(n)]
    indegree = [0] * n
    for k, s in enumerate(scheduled):
        for d in s.deps:
            succ[index[d]].append(k)
            indegree[k] += 1
    for stream in ("compute", "comm"):
        chain = sorted((k for k in range(n) if scheduled[k].stream == stream), key=lambda k: scheduled[k].order)
        for a, b in zip(chain, chain[1:]):
            succ[a].append(b)
            indegree[b] += 1
    # As-soon-as-possible times under the stream orders, in a topological order.
    start = [0.0] * n
    finish = [0.0] * n
    ready = [k for k in range(n) if indegree[k] == 0]
    topo: list[int] = []
    while ready:
        k = ready.pop()
        topo.append(k)
        finish[k] = start[k] + duration[k]
        for j in succ[k]:
            start[j] = max(start[j], finish[k])
            indegree[j] -= 1
            if indegree[j] == 0:
                ready.append(j)
    if len(topo) != n:
        raise StepError(f"the stream order of {source} contradicts the dependencies of its tasks; rerun overlap-schedule")
    # Issue order: a topological order (dependencies, stream orders, a send after its exit
    # tasks) that takes the earliest start first, comm before compute at the same instant.
    items = [StepItem(side_of(s.task), s.task, s.stream) for s in scheduled]
    keys = [(start[k], COMM_FIRST[s.stream], s.order) for k, s in enumerate(scheduled)]
    indegree = [0] * n
    for k in range(n):
        for j in succ[k]:
            indegree[j] += 1
    for side, names in exits.items():
        if names:
            marker = len(items)
            items.append(StepItem(side, None, "comm", names))
            # After every task that starts when the exit tasks are done: issuing those first costs nothing.
            keys.append((max(finish[index[name]] for name in names), 2, 0))
            succ.append([])
            indegree.append(len(names))
            for name in names:
                succ[index[name]].append(marker)
    heap = [(keys[k], k) for k in range(len(items)) if indegree[k] == 0]
    heapq.heapify(heap)
    order: list[StepItem] = []
    while heap:
        _, k = heapq.heappop(heap)
        order.append(items[k])
        for j in succ[k]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(heap, (keys[j], j))
    return Step(tuple(order), source)
