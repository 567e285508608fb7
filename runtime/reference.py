"""The pure-Python reference interpreter of a rank's program: the C++ FSM's semantics, readable.

``runtime.FSM`` (C++) and ``ReferenceFSM`` give the same actions for the same
calls; the differential tests drive both with generated programs and
token-count traces and compare every action and counter. docs/bytecode.md
("Execution") states the rules; this file is their executable form.

How a trainer drives it: ``advance()`` returns the next action. RUN, SEND,
RECV and COLLECTIVE are work to issue; the trainer reports each one's end with
``complete(action.id)``. WAIT means nothing can be issued until action
``wait_for`` completes. DONE ends the iteration. ``advance`` and
``register_task`` belong to the training thread; ``complete`` and
``report_tokens`` may be called from a monitor thread.

Dynamic bubble optimisation (DBO), with the policy of the simulator's DBO
(issue 12's ``runtime/dbo.py``), steps being instruction indices: a DEFER
offers a movable task (a weight gradient) to a pool, which takes it unless the
memory it keeps alive would exceed the budget, or — unless it is due at the
instruction after its offer — the SLOTs between the offer and its deadline (each counted at its ``base_us``, 0 below ``min_slot_us``)
could not absorb it beside the tasks already pooled: no single one is long
enough, or the earliest-deadline-first sums do not fit (``runtime/dbo.py``,
"Admission"); then it runs in place. At a
SLOT the compute stream is about to wait for an All-to-All that is still
running: the slot's size is predicted from the load imbalance of the
per-expert token counts reported for that All-to-All, ``base + (a2a + gemm) *
(imbalance - 1)``, and filled greedily, best fit first (largest duration, then
earliest deadline, then smallest id). Before each instruction, the pooled tasks
whose deadline has come run on the main stream (fallbacks, by id). So every
movable task runs exactly once, by its deadline, and collectives keep their
program order. A task deferred at instruction ``i`` with deadline ``d`` (an
instruction index) has deadline step ``d - 1``: it must have been issued
before instruction ``d``.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from runtime.bytecode import (
    Instr,
    Op,
    PlanImage,
    PlanInfo,
    SlotInfo,
    Stream,
    TaskInfo,
    check_rank,
    check_signature,
    decode,
    plan_bytes,
)

NEW, ISSUED, DONE, POOLED = 0, 1, 2, 3
FIT_EPS_US = 1e-9  # the fit test's tolerance: duration <= remaining + FIT_EPS_US


class ActionKind(IntEnum):
    RUN = 0
    SEND = 1
    RECV = 2
    COLLECTIVE = 3
    WAIT = 4
    DONE = 5


@dataclass(frozen=True)
class Action:
    """What the trainer does next. Fields that do not apply to the kind are -1 (or False)."""

    kind: ActionKind
    id: int = -1  # report completion with this id
    stream: int = -1  # 0 compute, 1 comm
    task: int = -1  # index into the plan's task table
    mb: int = -1
    peer: int = -1  # SEND/RECV: the other pipeline rank
    vstage: int = -1  # SEND/RECV: the virtual stage that produced the tensor; GRAD_REDUCE: whose gradients
    payload: int = -1  # SEND/RECV: 0 activation, 1 gradient
    collective: int = -1  # COLLECTIVE: 0 all-to-all, 1 gradient reduction
    group: int = -1  # COLLECTIVE: 0 EP, 1 DP
    filled: bool = False  # a movable task placed in a DBO slot
    fallback: bool = False  # a movable task run on the main stream because its deadline came
    wait_for: int = -1  # WAIT: the action that must complete first


# Counters every interpreter keeps; the DBO ones carry the policy's names. The
# observed, error, recovered and overrun times come from the clock.
COUNTER_NAMES = (
    "tasks_run",  # RUN actions issued, deferred tasks included
    "offered",  # movable tasks offered to the pool (DEFER or register_task)
    "deferred",  # ... that the pool took
    "refused_memory",  # ... that the memory budget turned away (run in place)
    "refused_deadline",  # ... that no SLOT before the deadline could absorb (run in place)
    "placed",  # deferred tasks run in a slot
    "fallbacks",  # deferred tasks run on the main stream at their deadline
    "slots",  # slots where the compute stream had to wait and the policy was asked
    "slots_filled",  # ... into which it put at least one task
    "predicted_us",  # sum of predicted slot sizes
    "observed_us",  # sum of observed waits at those slots (slot opened to All-to-All finished)
    "abs_error_us",  # sum of |predicted - observed|
    "placed_us",  # predicted duration of the work put into slots
    "recovered_us",  # idle time the placed work absorbed: min(placed, observed)
    "overrun_us",  # placed work beyond the observed wait
    "fallback_us",  # predicted duration of the fallbacks
    "peak_pool_bytes",  # the most bytes the pool held at once
)
CLOCK_COUNTERS = frozenset({"observed_us", "abs_error_us", "recovered_us", "overrun_us"})


def load_imbalance(expert_tokens: Sequence[int], ep: int) -> float:
    """Largest per-rank token load over the mean; rank r owns experts r*E/ep .. (r+1)*E/ep - 1."""
    n = len(expert_tokens)
    if n == 0 or n % ep:
        raise ValueError(f"{n} per-expert token counts cannot be split evenly over {ep} expert-parallel ranks")
    per_rank = n // ep
    loads = [sum(expert_tokens[r * per_rank : (r + 1) * per_rank]) for r in range(ep)]
    total = sum(loads)
    return 1.0 if total <= 0 else max(loads) * ep / total


@dataclass
class _Pooled:
    id: int
    task: int
    mb: int
    deadline_step: int
    memory_bytes: int
    duration_us: float


@dataclass
class _Observation:
    collective: int
    open_ns: int
    predicted_us: float
    placed_us: float


@dataclass
class Program:
    """One rank's program with the plan's tables, as ``load_plan`` returns it."""

    image: PlanImage
    rank: int
    instructions: list[Instr] = field(init=False)

    def __post_init__(self) -> None:
        self.instructions = self.image.programs[self.rank]

    @property
    def signature(self) -> bytes:
        return self.image.signature

    @property
    def plan(self) -> PlanInfo:
        return self.image.plan

    @property
    def tasks(self) -> list[TaskInfo]:
        return self.image.tasks

    @property
    def slots(self) -> list[SlotInfo] | None:
        return self.image.slots

    def task_index(self, name: str) -> int:
        for i, t in enumerate(self.image.tasks):
            if t.name == name:
                return i
        raise KeyError(f"no task named '{name}' in the plan")

    def __len__(self) -> int:
        return len(self.instructions)


def load_plan(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview, rank: int, signature: bytes | None = None
) -> Program:
    """The program of ``rank`` from a path or the bytes of a plan, as ``runtime.load_plan``.

    Refusals raise PlanError; a ``rank`` or ``signature`` of the wrong type or size raises
    TypeError or ValueError, the same as the C++ loader.
    """
    data = plan_bytes(source)
    rank = check_rank(rank)
    return Program(decode(data, rank=rank, signature=check_signature(signature)), rank)


class ReferenceFSM:
    """The per-rank state machine. See the module docstring for the contract."""

    def __init__(
        self,
        program: Program,
        *,
        dbo: bool = True,
        memory_budget_bytes: int | None = None,
        min_slot_us: float = 0.0,
        max_registered: int = 4096,
        admission: bool = True,
    ):
        plan = program.image.plan
        self.program = program
        self.code = program.instructions
        self.tasks = program.image.tasks
        self.slots = program.image.slots or []
        self.ep = plan.ep
        self.dbo = dbo
        self.budget = plan.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes
        self.min_slot_us = min_slot_us
        self.admission = admission  # off: the pool takes whatever the memory budget allows
        n = len(self.code)
        self.end = n - 1
        self.capacity = n + max_registered
        self.state = [NEW] * n
        self.done_ns = [0] * n
        self.pc = 0
        self.pool: dict[int, _Pooled] = {}
        self.pool_bytes = 0
        self.ready: deque[tuple[_Pooled, bool, bool]] = deque()  # (task, filled, fallback), issued first
        self.pending: list[_Observation] = []
        self.c: dict[str, float] = dict.fromkeys(COUNTER_NAMES, 0)
        for key in ("predicted_us", "observed_us", "abs_error_us", "placed_us", "recovered_us", "overrun_us", "fallback_us"):
            self.c[key] = 0.0
        # SLOT instructions by (All-to-All task, micro-batch), for report_tokens; the last one wins.
        self.slot_of: dict[tuple[int, int], int] = {}
        self.predicted: dict[int, float] = {}
        # The admission's forecast: every SLOT's instruction index and balanced-routing size, and
        # the prefix sums of those sizes (cum[j]: the first j SLOTs), as the C++ FSM sums them.
        self.slot_steps: list[int] = []
        self.slot_size: list[float] = []
        self.slot_cum: list[float] = [0.0]
        for i, ins in enumerate(self.code):
            if ins.op == Op.SLOT:
                self.slot_of[(self.code[ins.b].a, ins.mb)] = i
                base = self.slots[ins.a].base_us
                self.slot_steps.append(i)
                self.slot_size.append(base if base >= min_slot_us and base > 0 else 0.0)
                self.slot_cum.append(self.slot_cum[-1] + self.slot_size[-1])

    @property
    def counters(self) -> dict[str, float]:
        return dict(self.c)

    # ------------------------------------------------------------ any thread

    def complete(self, action_id: int) -> None:
        if not 0 <= action_id < len(self.state) or self.state[action_id] != ISSUED:
            raise ValueError(f"action {action_id} is not in flight (never issued, or already completed)")
        self.done_ns[action_id] = time.perf_counter_ns()
        self.state[action_id] = DONE

    def report_tokens(self, task: int, mb: int, expert_tokens: Sequence[int]) -> bool:
        """Per-expert token counts of All-to-All ``task`` in micro-batch ``mb``; False if no slot waits on it."""
        imbalance = load_imbalance(expert_tokens, self.ep)
        instr = self.slot_of.get((task, mb))
        if instr is None:
            return False
        slot = self.slots[self.code[instr].a]
        self.predicted[instr] = max(0.0, slot.base_us + (slot.a2a_us + slot.gemm_us) * (imbalance - 1.0))
        return True

    # ------------------------------------------------------------ training thread

    def register_task(self, task: int, mb: int, deadline: int, memory_bytes: int | None = None) -> int:
        """Offer movable work at run time; returns its action id. It runs exactly once, before ``deadline``."""
        if not 0 <= task < len(self.tasks) or not self.tasks[task].movable:
            raise ValueError(f"task {task} is not a movable task of the plan")
        if not 0 <= mb < self.program.image.plan.microbatches:
            raise ValueError(f"micro-batch {mb} is not in the plan")
        if not self.pc < deadline <= self.end:
            raise ValueError(f"deadline {deadline} is not after the current instruction {self.pc} and at or before END")
        if len(self.state) >= self.capacity:
            raise ValueError(f"more than {self.capacity - len(self.code)} tasks registered in one iteration")
        action_id = len(self.state)
        self.state.append(NEW)
        self.done_ns.append(0)
        mem = self.tasks[task].memory_bytes if memory_bytes is None else memory_bytes
        self._offer(action_id, task, mb, deadline, mem)
        return action_id

    def advance(self) -> Action:
        self._observe()
        while True:
            if self.ready:
                return self._issue_ready()
            if self.pool:
                self._due()
                if self.ready:
                    continue
            ins = self.code[self.pc]
            op = ins.op
            if op == Op.RUN:
                self.c["tasks_run"] += 1
                return self._issue(ActionKind.RUN, ins, task=ins.a)
            if op == Op.SEND or op == Op.RECV:
                kind = ActionKind.SEND if op == Op.SEND else ActionKind.RECV
                return self._issue(kind, ins, peer=ins.a, vstage=ins.b, payload=ins.aux)
            if op == Op.COLLECTIVE:
                if ins.aux == 0:
                    return self._issue(ActionKind.COLLECTIVE, ins, task=ins.a, collective=0, group=ins.b)
                return self._issue(ActionKind.COLLECTIVE, ins, vstage=ins.a, collective=ins.aux, group=ins.b)
            if op == Op.DEFER:
                i = self.pc
                self.pc += 1
                self._offer(i, ins.a, ins.mb, ins.b, self.tasks[ins.a].memory_bytes)
                continue
            if op == Op.WAIT:
                # The loader guarantees a waited-on DEFER's deadline is at or before the wait, so it has run.
                if self.state[ins.a] == DONE:
                    self.pc += 1
                    continue
                return Action(ActionKind.WAIT, wait_for=ins.a)
            if op == Op.SLOT:
                self._slot(ins)
                continue
            # END: everything issued must finish before the iteration is done.
            for i, s in enumerate(self.state):
                if s == ISSUED:
                    return Action(ActionKind.WAIT, wait_for=i)
            self._observe()
            return Action(ActionKind.DONE)

    # ------------------------------------------------------------ internals

    def _issue(self, kind: ActionKind, ins: Instr, **fields: Any) -> Action:
        i = self.pc
        self.state[i] = ISSUED
        self.pc += 1
        return Action(kind, id=i, stream=int(ins.stream), mb=ins.mb, **fields)

    def _issue_ready(self) -> Action:
        entry, filled, fallback = self.ready.popleft()
        self.state[entry.id] = ISSUED
        self.c["tasks_run"] += 1
        return Action(
            ActionKind.RUN, id=entry.id, stream=int(Stream.COMPUTE), task=entry.task, mb=entry.mb,
            filled=filled, fallback=fallback,
        )

    def _offer(self, action_id: int, task: int, mb: int, deadline: int, memory_bytes: int) -> None:
        entry = _Pooled(action_id, task, mb, deadline - 1, memory_bytes, self.tasks[task].duration_us)
        if not self.dbo:
            self.ready.append((entry, False, False))
            return
        self.c["offered"] += 1
        if self.pool_bytes + memory_bytes > self.budget:
            self.c["refused_memory"] += 1
            self.ready.append((entry, False, False))
            return
        # A DEFER offers at its own instruction, a registered task at the current one.
        if self.admission and not self._admissible(entry, action_id if action_id < len(self.code) else self.pc):
            self.c["refused_deadline"] += 1
            self.ready.append((entry, False, False))
            return
        self.state[action_id] = POOLED
        self.pool[action_id] = entry
        self.pool_bytes += memory_bytes
        self.c["deferred"] += 1
        self.c["peak_pool_bytes"] = max(self.c["peak_pool_bytes"], self.pool_bytes)

    def _slots_through(self, step: int) -> int:
        """How many SLOTs lie at instruction indices ``<= step``."""
        n = 0
        while n < len(self.slot_steps) and self.slot_steps[n] <= step:
            n += 1
        return n

    def _admissible(self, entry: _Pooled, step: int) -> bool:
        if entry.deadline_step == step:  # due at once: it moves past nothing
            return True
        lo, hi = self._slots_through(step), self._slots_through(entry.deadline_step)
        largest = max(self.slot_size[lo:hi], default=0.0)
        if largest + FIT_EPS_US < entry.duration_us:
            return False
        waiting = sorted(
            [e for e in self.pool.values() if e.deadline_step > step] + [entry], key=lambda e: (e.deadline_step, e.id)
        )
        demand = 0.0
        for e in waiting:
            demand += e.duration_us
            capacity = self.slot_cum[self._slots_through(e.deadline_step)] - self.slot_cum[lo]
            if e.deadline_step >= entry.deadline_step and demand > capacity + FIT_EPS_US:
                return False
        return True

    def _take(self, entry: _Pooled) -> None:
        del self.pool[entry.id]
        self.pool_bytes -= entry.memory_bytes

    def _due(self) -> None:
        step = self.pc - 1  # the end of the step before this instruction
        due = [self.pool[k] for k in sorted(self.pool) if self.pool[k].deadline_step <= step]
        for entry in due:
            self._take(entry)
            self.ready.append((entry, False, True))
        self.c["fallbacks"] += len(due)
        self.c["fallback_us"] += sum(entry.duration_us for entry in due)  # summed first, as the policy does

    def _slot(self, ins: Instr) -> None:
        step = self.pc
        self.pc += 1
        if not self.dbo or self.state[ins.b] == DONE:
            return
        predicted = self.predicted.get(step, self.slots[ins.a].base_us)
        self.c["slots"] += 1
        self.c["predicted_us"] += predicted
        placed, count = 0.0, 0
        if predicted >= self.min_slot_us and predicted > 0:
            remaining = predicted
            while True:
                best = None
                for entry in self.pool.values():
                    if entry.deadline_step >= step and entry.duration_us <= remaining + FIT_EPS_US and (
                        best is None
                        or (-entry.duration_us, entry.deadline_step, entry.id) < (-best.duration_us, best.deadline_step, best.id)
                    ):
                        best = entry
                if best is None:
                    break
                remaining -= best.duration_us
                placed += best.duration_us
                count += 1
                self._take(best)
                self.c["placed"] += 1
                self.ready.append((best, True, False))
        if count:
            self.c["slots_filled"] += 1
            self.c["placed_us"] += placed
        self.pending.append(_Observation(ins.b, time.perf_counter_ns(), predicted, placed))

    def _observe(self) -> None:
        if not self.pending:
            return
        keep = []
        for obs in self.pending:
            if self.state[obs.collective] != DONE:
                keep.append(obs)
                continue
            observed = max(0.0, (self.done_ns[obs.collective] - obs.open_ns) / 1000.0)
            self.c["observed_us"] += observed
            self.c["abs_error_us"] += abs(obs.predicted_us - observed)
            self.c["recovered_us"] += min(obs.placed_us, observed)
            self.c["overrun_us"] += max(0.0, obs.placed_us - observed)
        self.pending = keep
