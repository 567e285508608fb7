"""Baseline pair schedules: no overlap at all, and Megatron-Core's fixed combined-1F1B order.

``serial``
    No overlap at all: the forward chunk's tasks one after another, then the
    backward chunk's, one stream busy at a time. Its makespan is the sum of all
    durations — the cost of a pair when nothing hides anything.

``fixed_template``
    The hand-written order Megatron-Core uses when it overlaps the expert
    All-to-All of one micro-batch's forward with another's backward ("combined
    1F1B"). The two chunks are walked layer by layer: forward layer k (in
    forward order) is matched with backward layer k (in backward order, i.e.
    the chunk's last layer first). Inside one matched layer pair the streams
    run a fixed sequence of slots:

    - comm stream: backward combine, then forward dispatch, then backward
      dispatch, then forward combine;
    - compute stream: forward work before the dispatch (mixer, router), then
      backward expert work (dgrad, then its wgrad), then forward expert work,
      then backward work before the dispatch (router and mixer dgrad, then
      their wgrad).

    Each stream keeps that order and a task starts as soon as its stream is
    free and its inputs are ready. Layers of the longer chunk that have no
    partner run afterwards with no overlap (one task at a time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from passes.scheduling.pair_dag import BWD, FWD, PairDAG
from passes.scheduling.schedule import RESOURCES, PairSchedule, SchedulingError
from tessera_ir.kinds import Resource


def serial(dag: PairDAG) -> PairSchedule:
    """No overlap: forward tasks in order, then backward tasks, one at a time."""
    t0 = time.perf_counter()
    start = [0.0] * len(dag.tasks)
    t = 0.0
    # The DAG stores each side in topological order, forward side first.
    order = [i for i, task in enumerate(dag.tasks) if task.side == FWD] + [
        i for i, task in enumerate(dag.tasks) if task.side == BWD
    ]
    for i in order:
        start[i] = t
        t += dag.tasks[i].duration
    return PairSchedule(dag, start, "serial", solve_seconds=time.perf_counter() - t0)


# Slots of the fixed template, by operation (the part of the task kind before the phase).
_MLP_OPS = frozenset({"expert_gemm", "shared_expert", "dense_mlp", "lm_head"})
_COMM_OPS = frozenset({"dispatch", "combine"})


def _op_phase(kind: str) -> tuple[str, str]:
    op, _, phase = kind.rpartition(".")
    return op, phase


def _layer_sequence(dag: PairDAG, side: str) -> list[str]:
    """Layers of one side in execution order (first appearance in the DAG's topological order)."""
    seen: list[str] = []
    for t in dag.tasks:
        if t.side == side and t.layer not in seen:
            seen.append(t.layer)
    return seen


def fixed_template(dag: PairDAG) -> PairSchedule:
    """Megatron-Core's combined-1F1B slot order (see the module docstring), run as soon as possible."""
    t0 = time.perf_counter()
    n = len(dag.tasks)
    by_layer: dict[tuple[str, str], list[int]] = {}
    for i, t in enumerate(dag.tasks):
        by_layer.setdefault((t.side, t.layer), []).append(i)
    fwd_layers = _layer_sequence(dag, FWD)
    bwd_layers = _layer_sequence(dag, BWD)
    op_phase = [_op_phase(t.kind) for t in dag.tasks]

    def pick(side: str, layer: str | None, ops: Callable[[str], bool], phases: Sequence[str]) -> list[int]:
        if layer is None:
            return []
        out = []
        for phase in phases:  # dgrad before wgrad, each in the DAG's (topological) order
            out += [i for i in by_layer[(side, layer)] if op_phase[i][1] == phase and ops(op_phase[i][0])]
        return out

    def is_pre(op: str) -> bool:
        return op not in _MLP_OPS and op not in _COMM_OPS

    compute_seq: list[int] = []
    comm_seq: list[int] = []
    paired = min(len(fwd_layers), len(bwd_layers))
    for k in range(paired):
        f, b = fwd_layers[k], bwd_layers[k]
        comm_seq += pick(BWD, b, lambda op: op == "combine", ["dgrad"])
        comm_seq += pick(FWD, f, lambda op: op == "dispatch", ["fwd"])
        comm_seq += pick(BWD, b, lambda op: op == "dispatch", ["dgrad"])
        comm_seq += pick(FWD, f, lambda op: op == "combine", ["fwd"])
        compute_seq += pick(FWD, f, is_pre, ["fwd"])
        compute_seq += pick(BWD, b, lambda op: op in _MLP_OPS, ["dgrad", "wgrad"])
        compute_seq += pick(FWD, f, lambda op: op in _MLP_OPS, ["fwd"])
        compute_seq += pick(BWD, b, is_pre, ["dgrad", "wgrad"])
    # Unmatched layers of the longer chunk: no overlap, one task at a time, in DAG order.
    rest_layers = [(FWD, lay) for lay in fwd_layers[paired:]] + [(BWD, lay) for lay in bwd_layers[paired:]]
    rest = [i for side, lay in rest_layers for i in by_layer[(side, lay)]]
    covered = set(compute_seq) | set(comm_seq) | set(rest)
    if len(covered) != n:
        odd = sorted(dag.tasks[i].name for i in range(n) if i not in covered)
        raise SchedulingError(
            f"the fixed template has no slot for tasks {odd[:4]} of pair '{dag.name}': it expects forward tasks "
            "of kind <op>.fwd and backward tasks of kind <op>.dgrad or <op>.wgrad"
        )

    start = [0.0] * n
    finish = [0.0] * n
    done = [False] * n
    queues = {Resource.COMPUTE: list(compute_seq), Resource.COMM: list(comm_seq)}
    free = {r: 0.0 for r in RESOURCES}
    # Run both queues as soon as possible; each stream keeps its order.
    while any(queues.values()):
        progressed = False
        for r in RESOURCES:
            q = queues[r]
            while q and all(done[d] for d in dag.tasks[q[0]].deps):
                i = q.pop(0)
                s = max([free[r]] + [finish[d] for d in dag.tasks[i].deps])
                start[i], finish[i], done[i] = s, s + dag.tasks[i].duration, True
                free[r] = finish[i]
                progressed = True
        if not progressed:
            heads = [dag.tasks[q[0]].name for q in queues.values() if q]
            raise SchedulingError(
                f"the fixed template deadlocks on pair '{dag.name}': stream heads {heads} wait on each other; "
                "the pair's task dependencies do not follow the forward/backward layer structure the template assumes"
            )
    clock = max([finish[i] for i in range(n) if done[i]], default=0.0)
    # Layer by layer is not always a topological order (a hand-written DAG may make a task
    # depend on a task of a later layer): take the first task in that order whose
    # predecessors have all run, which keeps the layer order whenever it is topological.
    pending = list(rest)
    while pending:
        k = next(k for k, i in enumerate(pending) if all(done[d] for d in dag.tasks[i].deps))
        i = pending.pop(k)
        s = max([clock] + [finish[d] for d in dag.tasks[i].deps])
        start[i], finish[i], done[i] = s, s + dag.tasks[i].duration, True
        clock = finish[i]
    return PairSchedule(dag, start, "fixed-template", solve_seconds=time.perf_counter() - t0)
