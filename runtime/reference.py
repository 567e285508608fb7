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

Dynamic bubble optimisation (DBO): a DEFER puts a movable task (a weight
gradient) into a pool instead of running it, unless the memory it keeps alive
would exceed the budget. At a SLOT, the compute stream is about to wait for an
All-to-All that is still running: the FSM predicts the idle time from the
token counts reported for that All-to-All and fills it greedily with pooled
tasks, largest first among those that fit. A pooled task whose deadline is
reached, or that an instruction waits on, returns to the main stream. So every
movable task runs exactly once, and collectives keep their program order.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum

from runtime.bytecode import Instr, Op, PlanImage, PlanInfo, SlotInfo, Stream, TaskInfo, decode

NEW, ISSUED, DONE, POOLED = 0, 1, 2, 3


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
    fallback: bool = False  # a movable task run at its deadline (or because something waits on it)
    wait_for: int = -1  # WAIT: the action that must complete first


COUNTER_NAMES = (
    "tasks_run",
    "deferred",
    "filled",
    "fallen_back",
    "inline",
    "slots",
    "idle_predicted_us",
    "idle_observed_us",
    "peak_pool_bytes",
)


@dataclass
class _Pooled:
    id: int
    task: int
    mb: int
    deadline: int
    memory_bytes: int
    duration_us: float
    seq: int


@dataclass
class _Slot:
    instr: int
    collective: int
    budget_us: float
    open_ns: int


@dataclass
class Counters:
    tasks_run: int = 0
    deferred: int = 0
    filled: int = 0
    fallen_back: int = 0
    inline: int = 0
    slots: int = 0
    idle_predicted_us: float = 0.0
    idle_observed_us: float = 0.0
    peak_pool_bytes: int = 0

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in COUNTER_NAMES}


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


def load_plan(source: bytes | str, rank: int, signature: bytes | None = None) -> Program:
    """The program of ``rank`` from a path or the bytes of a plan; refusals raise PlanError."""
    data = source if isinstance(source, (bytes, bytearray, memoryview)) else open(source, "rb").read()  # noqa: SIM115
    return Program(decode(data, rank=rank, signature=signature), rank)


class ReferenceFSM:
    """The per-rank state machine. See the module docstring for the contract."""

    def __init__(
        self,
        program: Program,
        *,
        dbo: bool = True,
        ep_rank: int = 0,
        memory_budget_bytes: int | None = None,
        max_registered: int = 4096,
    ):
        plan = program.image.plan
        if not 0 <= ep_rank < plan.ep:
            raise ValueError(f"ep_rank {ep_rank} is not in the plan's EP group of {plan.ep}")
        self.program = program
        self.code = program.instructions
        self.tasks = program.image.tasks
        self.slots = program.image.slots or []
        self.dbo = dbo
        self.ep_rank = ep_rank
        self.budget = plan.memory_budget_bytes if memory_budget_bytes is None else memory_budget_bytes
        n = len(self.code)
        self.end = n - 1
        self.capacity = n + max_registered
        self.state = [NEW] * n
        self.done_ns = [0] * n
        self.registered = 0
        self.pc = 0
        self.pool: list[_Pooled] = []
        self.pool_bytes = 0
        self.seq = 0
        self.inline: list[_Pooled] = []
        self.slot: _Slot | None = None
        self.pending_observations: list[tuple[int, int]] = []
        self.stats = Counters()
        # SLOT instructions by (All-to-All task, micro-batch), for report_tokens.
        self.slot_of: dict[tuple[int, int], int] = {}
        self.predicted: dict[int, float] = {}
        for i, ins in enumerate(self.code):
            if ins.op == Op.SLOT:
                self.slot_of[(self.code[ins.b].a, ins.mb)] = i

    # ------------------------------------------------------------ any thread

    def complete(self, action_id: int) -> None:
        if not 0 <= action_id < len(self.state) or self.state[action_id] != ISSUED:
            raise ValueError(f"action {action_id} is not in flight (never issued, or already completed)")
        self.done_ns[action_id] = time.perf_counter_ns()
        self.state[action_id] = DONE

    def report_tokens(self, task: int, mb: int, tokens_per_rank: Sequence[int]) -> bool:
        """Tokens each EP rank receives in All-to-All ``task`` of micro-batch ``mb``; False if no slot waits on it."""
        if len(tokens_per_rank) != self.program.image.plan.ep:
            raise ValueError(f"expected {self.program.image.plan.ep} token counts (one per EP rank), got {len(tokens_per_rank)}")
        instr = self.slot_of.get((task, mb))
        if instr is None:
            return False
        slot = self.slots[self.code[instr].a]
        excess = max(tokens_per_rank) - tokens_per_rank[self.ep_rank]
        self.predicted[instr] = slot.static_idle_us + slot.us_per_token * excess
        return True

    # ------------------------------------------------------------ training thread

    def register_task(self, task: int, mb: int, deadline: int, memory_bytes: int | None = None) -> int:
        """Add movable work at run time; returns its action id. It runs exactly once, by ``deadline``."""
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
        self.registered += 1
        mem = self.tasks[task].memory_bytes if memory_bytes is None else memory_bytes
        self._defer(action_id, task, mb, deadline, mem)
        return action_id

    def advance(self) -> Action:
        self._observe()
        if self.inline:
            return self._issue_pooled(self.inline.pop(0))
        while True:
            if self.slot is not None:
                action = self._fill()
                if action is not None:
                    return action
                continue
            due = self._due()
            if due is not None:
                self.stats.fallen_back += 1
                return self._issue_pooled(due, fallback=True)
            ins = self.code[self.pc]
            op = ins.op
            if op == Op.RUN:
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
                self._defer(i, ins.a, ins.mb, ins.b, self.tasks[ins.a].memory_bytes)
                if self.inline:
                    return self._issue_pooled(self.inline.pop(0))
                continue
            if op == Op.WAIT:
                target = ins.a
                if self.state[target] == DONE:
                    self.pc += 1
                    continue
                if self.state[target] == POOLED:  # waited on before its deadline: run it now
                    entry = next(p for p in self.pool if p.id == target)
                    self.stats.fallen_back += 1
                    return self._issue_pooled(entry, fallback=True)
                return Action(ActionKind.WAIT, wait_for=target)
            if op == Op.SLOT:
                self._open_slot(ins)
                continue
            # END: everything issued must finish before the iteration is done.
            for i, s in enumerate(self.state):
                if s == ISSUED:
                    return Action(ActionKind.WAIT, wait_for=i)
            self._observe()
            return Action(ActionKind.DONE)

    @property
    def counters(self) -> dict[str, float]:
        return self.stats.as_dict()

    # ------------------------------------------------------------ internals

    def _issue(self, kind: ActionKind, ins: Instr, **fields: int) -> Action:
        i = self.pc
        self.state[i] = ISSUED
        self.pc += 1
        if kind == ActionKind.RUN:
            self.stats.tasks_run += 1
        return Action(kind, id=i, stream=int(ins.stream), mb=ins.mb, **fields)

    def _issue_pooled(self, entry: _Pooled, filled: bool = False, fallback: bool = False) -> Action:
        if entry in self.pool:
            self.pool.remove(entry)
            self.pool_bytes -= entry.memory_bytes
        self.state[entry.id] = ISSUED
        self.stats.tasks_run += 1
        return Action(
            ActionKind.RUN, id=entry.id, stream=int(Stream.COMPUTE), task=entry.task, mb=entry.mb,
            filled=filled, fallback=fallback,
        )

    def _defer(self, action_id: int, task: int, mb: int, deadline: int, memory_bytes: int) -> None:
        entry = _Pooled(action_id, task, mb, deadline, memory_bytes, self.tasks[task].duration_us, self.seq)
        self.seq += 1
        if not self.dbo or self.pool_bytes + memory_bytes > self.budget:
            self.stats.inline += 1
            self.inline.append(entry)
            return
        self.state[action_id] = POOLED
        self.pool.append(entry)
        self.pool_bytes += memory_bytes
        self.stats.deferred += 1
        self.stats.peak_pool_bytes = max(self.stats.peak_pool_bytes, self.pool_bytes)

    def _due(self) -> _Pooled | None:
        best = None
        for p in self.pool:
            if p.deadline <= self.pc and (best is None or (p.deadline, p.seq) < (best.deadline, best.seq)):
                best = p
        return best

    def _open_slot(self, ins: Instr) -> None:
        i = self.pc
        self.pc += 1
        if not self.dbo or self.state[ins.b] == DONE:
            return
        predicted = self.predicted.get(i, self.slots[ins.a].static_idle_us)
        self.stats.slots += 1
        self.stats.idle_predicted_us += predicted
        now = time.perf_counter_ns()
        self.slot = _Slot(i, ins.b, predicted, now)
        self.pending_observations.append((ins.b, now))

    def _fill(self) -> Action | None:
        slot = self.slot
        assert slot is not None
        if self.state[slot.collective] != DONE:
            best = None
            for p in self.pool:
                if p.duration_us <= slot.budget_us and (
                    best is None or (-p.duration_us, p.deadline, p.seq) < (-best.duration_us, best.deadline, best.seq)
                ):
                    best = p
            if best is not None:
                slot.budget_us -= best.duration_us
                self.stats.filled += 1
                return self._issue_pooled(best, filled=True)
        self.slot = None
        return None

    def _observe(self) -> None:
        if not self.pending_observations:
            return
        keep = []
        for collective, open_ns in self.pending_observations:
            if self.state[collective] == DONE:
                self.stats.idle_observed_us += max(0, self.done_ns[collective] - open_ns) / 1000.0
            else:
                keep.append((collective, open_ns))
        self.pending_observations = keep
