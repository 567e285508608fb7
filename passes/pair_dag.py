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

from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Layer, Task

FWD = "fwd"
BWD = "bwd"


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
        finish = [0.0] * len(self.tasks)
        for i, t in enumerate(self.tasks):
            finish[i] = max((finish[d] for d in t.deps), default=0.0) + t.duration
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
    dag = PairDAG(name)
    index: dict[str, int] = {}

    def add_side(layers: Sequence[Layer], side: str, phases: set[Phase]) -> None:
        tasks = [(layer, t) for layer in layers for t in layer.tasks if t.phase in phases]
        in_side = {t.name for _, t in tasks}
        # Topological order inside the side: IR order is topological for the forward,
        # and for the backward the frontend lists tasks in dependency order per layer,
        # but backward layers run last-to-first, so sort explicitly.
        pending = {t.name: (layer, t) for layer, t in tasks}
        placed: list[tuple[Layer, Task]] = []
        done: set[str] = set()
        while pending:
            progressed = False
            for tname in list(pending):
                layer, t = pending[tname]
                if all(d in done or d not in in_side for d in t.deps):
                    placed.append((layer, t))
                    done.add(tname)
                    del pending[tname]
                    progressed = True
            if not progressed:
                raise ValueError(f"dependency cycle among tasks {sorted(pending)} of pair '{name}'")
        for layer, t in placed:
            index[t.name] = len(dag.tasks)
            dag.tasks.append(
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

    add_side(fwd_layers, FWD, {Phase.FWD})
    add_side(bwd_layers, BWD, {Phase.DGRAD, Phase.WGRAD})
    return dag
