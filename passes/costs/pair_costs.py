"""The analytic post-overlap cost of a scheduled pair: its schedule re-timed by the contention model.

A scheduled pair is the list of its IR tasks, each with the stream its schedule puts it on,
its position on that stream and its dependencies inside the pair (``ScheduledTask``;
``plan_view.PlanView.scheduled_tasks`` reads it from the IR). Re-timing keeps every stream's
order and every dependency and lets overlapped tasks slow each other down
(``contention.retime``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from passes.costs.contention import ContendedTask, ContentionParams, RetimedPair, retime
from tessera_ir.model import Task


@dataclass(frozen=True)
class ScheduledTask:
    """An IR task of a pair with its place in the pair's schedule."""

    task: Task
    stream: str
    order: int
    deps: tuple[str, ...]  # predecessors inside the pair


def transfer_gbps(nbytes: float, duration_us: float) -> float:
    """GB/s a transfer of ``nbytes`` moves at over its isolated ``duration_us`` (what
    ``contention.comm_gbps_beside_compute`` caps); 0 for a transfer of no duration."""
    return nbytes / (duration_us * 1e3) if duration_us > 0 else 0.0


def contended_tasks(
    items: list[ScheduledTask],
    duration: Callable[[Task], float],
    utilisation: Callable[[Task], tuple[float, float]],
    bandwidth_share: Callable[[Task], float] | None = None,
) -> list[ContendedTask]:
    """The contention model's view of a scheduled pair: isolated durations and utilisations, each
    comm task's rate alone (its bytes over its duration, which a hardware's cap beside compute
    reads), and with ``bandwidth_share`` each comm task's share of its duration spent moving bytes."""
    out = []
    for s in items:
        sm, mem = utilisation(s.task)
        d = duration(s.task)
        comm = s.stream == "comm"
        share = bandwidth_share(s.task) if bandwidth_share is not None and comm else 1.0
        gbps = transfer_gbps(s.task.bytes, d) if comm else 0.0
        out.append(ContendedTask(s.task.name, s.stream, d, s.order, s.deps, sm, mem, share, gbps))
    return out


def retime_key(tasks: list[ContendedTask]) -> tuple | None:
    """Everything :func:`passes.costs.contention.retime` reads, without task names: per task (in
    list order) its stream, duration, stream position, utilisations and the list positions
    of its dependencies. Re-timing is name-blind (streams run in ``order``; no tie is
    broken by name), so lists with equal keys have equal makespans and equal sums of
    isolated durations (summed in the same order). None when names repeat or a
    dependency is missing: such a list is re-timed on its own (and refused there)."""
    position = {t.name: k for k, t in enumerate(tasks)}
    if len(position) != len(tasks) or any(d not in position for t in tasks for d in t.deps):
        return None
    return tuple(
        (t.resource, t.duration, t.order, t.sm_util, t.mem_util, t.bandwidth_share, t.gbps, tuple(position[d] for d in t.deps))
        for t in tasks
    )


def analytic_cost(tasks: list[ContendedTask], contention: ContentionParams) -> tuple[RetimedPair, RetimedPair]:
    """(contended re-timing, contention-free re-timing) of a scheduled pair."""
    return retime(tasks, contention), retime(tasks, ContentionParams.none())
