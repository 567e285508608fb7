"""Where a program's compute stream can wait, and which of its tasks the DBO may defer.

Both are read off the program's static timeline (balanced routing, run alone from time 0):

*Slots.* A compute task that depends on an All-to-All may have to wait for it. Its slot's
``base_us`` is the wait the static timeline already shows (the gap since the compute stream's
previous task ended); under skewed routing the wait grows with the routed work it depends on:
the All-to-All's transfer time (``a2a_us``: duration minus its fixed latency) and, when that
All-to-All carries an expert GEMM's output, the GEMM's routed time (``gemm_us``). The DBO
policy predicts ``base + (a2a + gemm) * (imbalance - 1)`` from the routing of that layer.

*The pool.* A weight gradient is worth deferring only where it lengthens the step: when it
sits on the step's critical path, which it does when the compute stream is the last to finish
and no idle gap separates the task from the end (in a compute-bound pair, most of them; in an
All-to-All-bound pair, only those the schedule appended after the last transfer). Removing such
a task shortens the step by up to its duration. The pool is chosen greedily from the end: each
movable task, latest first, whose removal (with the ones already chosen) shortens the static
timeline. Weight gradients placed in gaps the schedule could not otherwise fill stay where
they are: moving them would only move idle time. The DBO takes the pool's tasks out of the
step and runs them in a later slot, or as a fallback by their deadline.

*The pool's budget.* The memory the pool may keep alive on a rank is what the rank's static
peak leaves free on the device, less a margin (:data:`POOL_MARGIN`, 5% of device memory: the
allocator's fragmentation and the communication libraries' buffers, which the memory model does
not count) — not a fixed share, which starves the pool on a stage with room to spare and says
nothing about a full one. A share of device memory may still be given (capped by the headroom).

*The bound.* :func:`without_weight_gradients` is the same input with every weight gradient at
zero cost: no placement of deferred weight gradients can beat it, so the DBO's gain is reported
beside it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from passes.simulation.program import COMM, COMPUTE, Program, SimTask, SimulationInput, SlotAnnotation
from tessera_ir.run_settings import RunSettings

# Share of device memory the pool's budget leaves free beside the static peak (see the docstring).
POOL_MARGIN = RunSettings().dbo_memory_margin


@dataclass(frozen=True)
class Timeline:
    start: tuple[float, ...]
    end: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.end, default=0.0)


def static_timeline(tasks: tuple[SimTask, ...] | list[SimTask]) -> Timeline:
    """Start and end of every task run alone from 0 with balanced routing (stream order = list order)."""
    start: list[float] = []
    end: list[float] = []
    free = [0.0, 0.0]
    for t in tasks:
        ready = max((end[d] for d in t.deps), default=0.0)
        s = max(ready, free[t.stream])
        start.append(s)
        end.append(s + t.duration_us)
        free[t.stream] = s + t.duration_us
    return Timeline(tuple(start), tuple(end))


def find_slots(program_name: str, tasks: tuple[SimTask, ...] | list[SimTask]) -> list[SlotAnnotation]:
    """A slot before every compute task that depends on an All-to-All (see the module docstring)."""
    timeline = static_timeline(tasks)
    slots = []
    previous_compute_end = 0.0
    for i, t in enumerate(tasks):
        if t.stream != COMPUTE:
            continue
        comm_deps = [d for d in t.deps if tasks[d].stream == COMM]
        if comm_deps:
            waited_on = max(comm_deps, key=lambda d: (timeline.end[d], d))
            a2a = tasks[waited_on]
            gemm_us = 0.0
            for g in a2a.deps:
                if tasks[g].stream == COMPUTE and tasks[g].routed >= 0:
                    gemm_us += tasks[g].duration_us - tasks[g].fixed_us
            slots.append(SlotAnnotation(
                task=i,
                slot_id=f"{program_name}.{t.name}",
                base_us=max(0.0, timeline.start[i] - previous_compute_end),
                a2a_us=a2a.duration_us - a2a.fixed_us if a2a.routed >= 0 else 0.0,
                gemm_us=gemm_us,
                routed=a2a.routed,
                waits_on=waited_on,
            ))
        previous_compute_end = timeline.end[i]
    return slots


def static_timeline_without(tasks: tuple[SimTask, ...] | list[SimTask], removed: set[int]) -> float:
    """Makespan of the static timeline with the ``removed`` tasks taken out (they finish when ready)."""
    end: list[float] = []
    free = [0.0, 0.0]
    makespan = 0.0
    for i, t in enumerate(tasks):
        ready = max((end[d] for d in t.deps), default=0.0)
        if i in removed:
            end.append(ready)
            continue
        s = max(ready, free[t.stream])
        end.append(s + t.duration_us)
        free[t.stream] = s + t.duration_us
        makespan = max(makespan, s + t.duration_us)
    return makespan


def critical_movable(tasks: tuple[SimTask, ...] | list[SimTask], movable: set[int]) -> set[int]:
    """The ``movable`` tasks whose removal shortens the step, chosen greedily latest first (see the docstring)."""
    dependents = {d for t in tasks for d in t.deps}
    timeline = static_timeline(tasks)
    chosen: set[int] = set()
    makespan = timeline.makespan
    for i in sorted(movable - dependents, key=lambda i: (-timeline.start[i], -i)):
        shorter = static_timeline_without(tasks, chosen | {i})
        if shorter < makespan - 1e-9 * max(1.0, makespan):
            chosen.add(i)
            makespan = shorter
    return chosen


def annotate(program: Program) -> Program:
    """The program with its slots found and the weight gradients on its critical path marked deferrable."""
    movable = {i for i, t in enumerate(program.tasks) if t.kind == "wgrad"}
    pool = critical_movable(program.tasks, movable)
    tasks = tuple(replace(t, deferrable=i in pool) for i, t in enumerate(program.tasks))
    return Program(program.name, tasks, program.routed_layers, tuple(find_slots(program.name, tasks)))


def pool_budgets(
    peak_bytes: Sequence[int], capacity_bytes: int, share: float | None = None, margin: float = POOL_MARGIN
) -> tuple[int, ...]:
    """Per rank, the bytes the DBO pool may hold, from each rank's static peak (see the docstring).

    ``share`` None: the headroom, ``capacity - peak - margin * capacity`` (0 when negative).
    Else ``share`` of device memory, within what the static plan leaves free (the user's override).
    """
    if share is None:
        reserve = int(margin * capacity_bytes)
        return tuple(max(0, capacity_bytes - peak - reserve) for peak in peak_bytes)
    return tuple(max(0, min(int(share * capacity_bytes), capacity_bytes - peak)) for peak in peak_bytes)


def without_weight_gradients(inp: SimulationInput) -> SimulationInput:
    """``inp`` with every weight gradient at zero cost and nothing deferrable: the DBO's bound."""
    programs: dict[int, Program] = {}

    def zeroed(program: Program) -> Program:
        out = programs.get(id(program))
        if out is None:
            tasks = tuple(
                replace(t, duration_us=0.0, fixed_us=0.0, deferrable=False) if t.kind == "wgrad" else replace(t, deferrable=False)
                for t in program.tasks
            )
            out = programs[id(program)] = Program(program.name, tasks, program.routed_layers)
        return out

    ranks = tuple(tuple(replace(a, program=zeroed(a.program)) for a in actions) for actions in inp.ranks)
    return replace(inp, ranks=ranks, recv_predicted_us=())
