"""Where a program's compute stream can wait, and which of its tasks the DBO may defer.

Both are read off the program's static timeline (balanced routing, run alone from time 0):

*Slots.* A compute task that depends on an All-to-All may have to wait for it. Its slot's
``base_us`` is the wait the static timeline already shows (the gap since the compute stream's
previous task ended); under skewed routing the wait grows with the routed work it depends on:
the All-to-All's transfer time (``a2a_us``: duration minus its fixed latency) and, when that
All-to-All carries an expert GEMM's output, the GEMM's routed time (``gemm_us``). The DBO
policy predicts ``base + (a2a + gemm) * (imbalance - 1)`` from the routing of that layer.

*The pool.* A weight-gradient task that the static timeline runs after the program's last
All-to-All has ended has nothing left to hide behind: it only lengthens the step. Those
*tail* tasks are deferrable; the DBO takes them out of the step and runs them in a later slot,
or as a fallback by their deadline. Weight gradients placed in gaps of the schedule already
fill idle time where they are and stay.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from passes.simulation.program import COMM, COMPUTE, Program, SimTask, SlotAnnotation


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
            gemm_us = sum(
                tasks[g].duration_us - tasks[g].fixed_us
                for g in a2a.deps
                if tasks[g].stream == COMPUTE and tasks[g].routed >= 0
            )
            slots.append(SlotAnnotation(
                task=i,
                slot_id=f"{program_name}.{t.name}",
                base_us=max(0.0, timeline.start[i] - previous_compute_end),
                a2a_us=a2a.duration_us - a2a.fixed_us if a2a.routed >= 0 else 0.0,
                gemm_us=gemm_us,
                routed=a2a.routed,
            ))
        previous_compute_end = timeline.end[i]
    return slots


def tail_tasks(tasks: tuple[SimTask, ...] | list[SimTask], movable: set[int]) -> set[int]:
    """Indices of the ``movable`` tasks the static timeline starts after the last All-to-All ends."""
    timeline = static_timeline(tasks)
    last_comm = max((timeline.end[i] for i, t in enumerate(tasks) if t.stream == COMM), default=0.0)
    dependents = {d for t in tasks for d in t.deps}
    return {i for i in movable if timeline.start[i] >= last_comm - 1e-9 and i not in dependents}


def annotate(program: Program) -> Program:
    """The program with its slots found and its tail weight gradients marked deferrable."""
    movable = {i for i, t in enumerate(program.tasks) if t.kind == "wgrad"}
    tail = tail_tasks(program.tasks, movable)
    tasks = tuple(replace(t, deferrable=i in tail) for i, t in enumerate(program.tasks))
    return Program(program.name, tasks, program.routed_layers, tuple(find_slots(program.name, tasks)))
