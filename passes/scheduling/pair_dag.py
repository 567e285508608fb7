"""The pair DAG: the forward of one model chunk overlapped with the backward of another.

In the steady state of interleaved 1F1B every device runs the forward of chunk
A (micro-batch i) beside the backward of chunk B (micro-batch j). The two sides
are independent of each other; inside each side tasks follow their IR
dependencies. Dependencies that leave the chunk (the previous chunk's output,
the next chunk's input gradient) are inputs that are ready when the pair starts.

Every scheduler (heuristic, baselines, exact ILP) and the z3 checker work on
this one structure, so comparisons are made on identical DAGs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Layer, Task

FWD = "fwd"
BWD = "bwd"


class PairDagError(TesseraError):
    """Tasks of a pair side that no order can run (a dependency cycle)."""


@dataclass(frozen=True)
class PairTask:
    name: str  # the IR task name; unique in a pair (one side holds fwd tasks, the other dgrad/wgrad)
    kind: str  # IR task kind, e.g. "expert_gemm.wgrad"
    resource: Resource
    duration: float  # microseconds
    deps: tuple[int, ...]  # indices of predecessors in PairDAG.tasks
    side: str  # FWD or BWD
    layer: str  # IR layer name
    movable: bool = False
    deadline: float | None = None  # latest allowed finish time of a movable task; None: end of the pair


@dataclass
class PairDAG:
    name: str
    tasks: list[PairTask] = field(default_factory=list)

    def successors(self) -> list[list[int]]:
        succ: list[list[int]] = [[] for _ in self.tasks]
        for i, t in enumerate(self.tasks):
            for d in t.deps:
                succ[d].append(i)
        return succ

    def total(self, resource: Resource) -> float:
        return sum(t.duration for t in self.tasks if t.resource is resource)

    def critical_path(self) -> float:
        """Longest duration-weighted path; tasks are stored in a topological order."""
        finish: list[float] = []
        for t in self.tasks:
            deps = t.deps
            # max() over the dependencies' finishes, written out (this runs for every DAG a compile
            # schedules): the first of equal values wins, as in max().
            ready = finish[deps[0]] if deps else 0.0
            for d in deps:
                if finish[d] > ready:
                    ready = finish[d]
            finish.append(ready + t.duration)
        return max(finish, default=0.0)

    def lower_bound(self) -> float:
        """No schedule beats the busier resource or the longest dependency chain."""
        return max(self.total(Resource.COMPUTE), self.total(Resource.COMM), self.critical_path())

    def serial_time(self) -> float:
        return sum(t.duration for t in self.tasks)


def _deadline(task: Task) -> float | None:
    """A movable task's ``deadline`` attribute (µs from the start of the pair), if it has one."""
    value = task.attrs.get("deadline")
    if task.movable and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _sweep_order(tasks: Sequence[Task]) -> list[int] | None:
    """Positions of ``tasks`` in the order of repeated sweeps; None on a dependency cycle.

    The order is defined by sweeps: go through the unplaced tasks in list order
    and place each one whose dependencies (inside the list) are all placed, the
    ones placed earlier in the same sweep included; repeat until all are placed.
    Sweeping literally costs a pass over the list per sweep. Instead each task's
    sweep number is computed directly: a task can go in the sweep of a
    dependency listed before it, but only in the next sweep after a dependency
    listed after it, so

        sweep(x) = max(1, max over deps d of sweep(d) + [pos(d) > pos(x)])

    and the placement order is by (sweep, position). Dependencies are resolved
    depth first; meeting a task still on the stack means a cycle.
    """
    pos = {t.name: k for k, t in enumerate(tasks)}
    deps = [[pos[d] for d in t.deps if d in pos] for t in tasks]
    sweep = [0] * len(tasks)  # 0: not computed yet
    on_stack = [False] * len(tasks)
    for root in range(len(tasks)):
        if sweep[root]:
            continue
        stack = [root]
        on_stack[root] = True
        while stack:
            x = stack[-1]
            d = next((d for d in deps[x] if not sweep[d]), -1)
            if d >= 0:  # resolve one dependency at a time, so the stack is a path
                if on_stack[d]:
                    return None
                on_stack[d] = True
                stack.append(d)
                continue
            stack.pop()
            on_stack[x] = False
            level = 1
            for d in deps[x]:
                v = sweep[d] + (d > x)
                if v > level:
                    level = v
            sweep[x] = level
    return sorted(range(len(tasks)), key=lambda k: (sweep[k], k))


def _blocked(tasks: Sequence[Task]) -> set[str]:
    """Names of the tasks no sweep can place: those on a dependency cycle or after one."""
    in_list = {t.name for t in tasks}
    done: set[str] = set()
    pending = {t.name: t for t in tasks}
    progressed = True
    while progressed:
        progressed = False
        for name, t in list(pending.items()):
            if all(d in done or d not in in_list for d in t.deps):
                done.add(name)
                del pending[name]
                progressed = True
    return set(pending)


def side_tasks(layers: Sequence[Layer], side: str, duration: Callable[[Task], float], name: str = "pair") -> list[PairTask]:
    """One side of a pair: the forward tasks (``side`` FWD) or the dgrad/wgrad tasks (BWD) of
    ``layers``, in topological order, each task's ``deps`` indexing this list. ``name`` is the
    pair's, for the error message."""
    phases = {Phase.FWD} if side == FWD else {Phase.DGRAD, Phase.WGRAD}
    tasks = [(layer, t) for layer in layers for t in layer.tasks if t.phase in phases]
    in_side = {t.name for _, t in tasks}
    # Topological order inside the side: IR order is topological for the forward,
    # and for the backward the frontend lists tasks in dependency order per layer,
    # but backward layers run last-to-first, so sort explicitly.
    order = _sweep_order([t for _, t in tasks])
    if order is None:
        pending = _blocked([t for _, t in tasks])
        raise PairDagError(f"dependency cycle among tasks {sorted(pending)} of pair '{name}'; the verifier's acyclic-dependencies check names the edges")
    out: list[PairTask] = []
    index: dict[str, int] = {}
    for k in order:
        layer, t = tasks[k]
        index[t.name] = len(out)
        out.append(
            PairTask(
                name=t.name,
                kind=t.kind,
                resource=t.resource,
                duration=float(duration(t)),
                deps=tuple(index[d] for d in t.deps if d in in_side),
                side=side,
                layer=layer.name,
                movable=t.movable,
                deadline=_deadline(t),
            )
        )
    return out


def join_sides(fwd: Sequence[PairTask], bwd: Sequence[PairTask], name: str = "pair") -> PairDAG:
    """The pair DAG of two sides made by :func:`side_tasks`: forward tasks first, then the
    backward ones with their ``deps`` shifted past the forward tasks."""
    off = len(fwd)
    if not off:
        return PairDAG(name, list(fwd) + list(bwd))
    # Built field by field rather than by ``dataclasses.replace``, which inspects the fields on
    # every call and so costs more per task, and a cold compile joins tens of thousands of tasks
    # (docs/records/2026-12-04-compile-time.md). The test of join_sides compares every field, so
    # a new PairTask field cannot be dropped here.
    shifted = [
        PairTask(t.name, t.kind, t.resource, t.duration, tuple(d + off for d in t.deps), t.side, t.layer, t.movable, t.deadline)
        if t.deps
        else t
        for t in bwd
    ]
    return PairDAG(name, list(fwd) + shifted)


def build_pair_dag(
    fwd_layers: Sequence[Layer],
    bwd_layers: Sequence[Layer],
    duration: Callable[[Task], float],
    name: str = "pair",
) -> PairDAG:
    """Build the DAG of ``fwd_layers``' forward tasks beside ``bwd_layers``' backward tasks.

    Either side may be empty (the warm-up and cool-down phases of the pipeline
    run a forward or a backward alone).
    """
    fwd = side_tasks(fwd_layers, FWD, duration, name)
    return join_sides(fwd, side_tasks(bwd_layers, BWD, duration, name), name)
