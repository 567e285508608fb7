"""Lowering a planned module into one program per pipeline rank (the ``pipeline`` pass's machinery).

Each rank runs its steps in the interleaved-1F1B order (``pipelining.order.rank_steps``): warm-up
forwards, steady-state pairs (combined order) or forwards and backwards in turn (plain order),
cool-down backwards. A step's tasks come in the issue order of
``pipelining.steps`` and become instructions (``tessera_ir.programs``):

- a compute task is a ``run``; a weight gradient (movable, nothing depends on it) a ``defer``
  whose deadline is its stage's gradient reduction; a dispatch or combine an ``all_to_all``;
- before a task, a ``wait`` for each dependency the streams do not already order: one on the
  other stream, a deferred task, a received tensor. A wait is left out when an earlier wait
  already covers it (a stream runs in order, so waiting for a later task of that stream is
  waiting for this one too);
- a DBO ``slot`` before a compute wait on an All-to-All where the plan's ``dbo_slot`` ops
  predict idle time (written by the ``dbo-slots`` pass);
- where a side's exit tasks are done, a ``send`` of its activation (forward) or gradient
  (backward) to the rank of the neighbouring stage; the receiving rank posts the ``recv`` one
  step before the step that needs it (the transfer overlaps that step), in the order the sender
  sends them (transfers between two ranks match in order), and waits for it where needed;
- after a stage's last backward on the rank, a wait for each of its deferred weight gradients
  (their deadline) and its ``grad_reduce``; then ``end``.

The steps are ``order.rank_steps``: in the combined order a steady-state step is a pair whose
forward and backward tasks interleave; in the plain order the forward and the backward are two
steps, one after the other, as a plain 1F1B runtime issues them.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from passes.pipelining.order import RankStep, rank_steps
from passes.pipelining.steps import ChunkSchedule, Step, StepItem, build_step
from passes.scheduling.pair_dag import BWD, FWD
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Layer, Module, Task
from tessera_ir.parallel import ParallelConfig
from tessera_ir.programs import (
    ACTIVATION,
    ALL_TO_ALL,
    COLLECTIVES,
    COMM,
    COMPUTE,
    DEFER,
    END,
    GRAD_REDUCE,
    GRADIENT,
    RECV,
    RUN,
    SEND,
    SLOT,
    WAIT,
    Instruction,
)

TransferKey = tuple[str, int, int]  # (payload, producing stage, micro-batch)


class LoweringError(TesseraError):
    """A planned module the pipeline pass cannot lower (an unsupported dependency, a missing partition)."""


@dataclass(frozen=True)
class SlotFigures:
    """A DBO slot before a compute task that waits for an All-to-All (a ``dbo_slot`` entry)."""

    waits_on: str
    base_us: float
    a2a_us: float
    gemm_us: float


# Per step kind (forward layers, backward layers): per compute task, its slot.
SlotTable = dict[tuple[tuple[str, ...], tuple[str, ...]], dict[str, SlotFigures]]


class _Node:
    """An instruction being built; targets are nodes until positions are final."""

    __slots__ = ("op", "ref", "mb", "peer", "payload", "target", "deadline", "stream", "slot", "fifo", "index")

    def __init__(
        self,
        op: str,
        ref: str,
        mb: int = 0,
        stream: str = COMPUTE,
        *,
        peer: int = -1,
        payload: str = "",
        target: _Node | None = None,
        slot: SlotFigures | None = None,
    ):
        self.op, self.ref, self.mb, self.stream = op, ref, mb, stream
        self.peer, self.payload, self.target, self.slot = peer, payload, target, slot
        self.deadline: _Node | None = None
        self.fifo = -1  # position on its stream for work that runs in issue order (run, collectives)
        self.index = -1

    def instruction(self) -> Instruction:
        if self.op == WAIT:
            assert self.target is not None
            return Instruction(WAIT, self.ref, on=self.target.index, wait_stream=self.stream)
        if self.op == SLOT:
            assert self.target is not None and self.slot is not None
            s = self.slot
            return Instruction(SLOT, self.ref, self.mb, on=self.target.index, base_us=s.base_us, a2a_us=s.a2a_us,
                               gemm_us=s.gemm_us)
        if self.op == DEFER:
            assert self.deadline is not None
            return Instruction(DEFER, self.ref, self.mb, deadline=self.deadline.index)
        if self.op in (SEND, RECV):
            return Instruction(self.op, self.ref, self.mb, peer=self.peer, payload=self.payload)
        if self.op in (GRAD_REDUCE, END):
            return Instruction(self.op, self.ref)
        return Instruction(self.op, self.ref, self.mb)


@dataclass
class _RankCode:
    """A rank's instructions before receives are placed (phase 1)."""

    rank: int
    nodes: list[_Node] = field(default_factory=list)
    step_starts: list[int] = field(default_factory=list)  # node position where each step begins
    recvs: dict[TransferKey, _Node] = field(default_factory=dict)
    need_step: dict[TransferKey, int] = field(default_factory=dict)  # first step that waits for a receive
    sends: dict[int, list[TransferKey]] = field(default_factory=lambda: defaultdict(list))  # peer -> in order


@dataclass(frozen=True)
class Stage:
    """A virtual stage of the partition: the candidate op standing for it, and its layers."""

    name: str
    layers: Sequence[Layer]


class Lowering:
    """Per-rank programs of a planned module (see the module docstring).

    ``stages`` is the partition, one per virtual stage; ``chunk_schedule`` gives a step's tasks
    in a stream order (``PlanView.chunk_schedule``), ``duration_us`` a task's isolated duration.
    """

    def __init__(
        self,
        module: Module,
        stages: Sequence[Stage],
        chunk_schedule: ChunkSchedule,
        duration_us: Callable[[Task], float],
        combined: bool = False,
        slots: SlotTable | None = None,
    ):
        self.module = module
        self.parallel = ParallelConfig.from_attrs(module.attrs)
        if len(stages) != self.parallel.virtual_stages:
            raise LoweringError(f"{len(stages)} stages for pp x vpp = {self.parallel.virtual_stages} virtual stages")
        self.chunk_schedule = chunk_schedule
        self.duration_us = duration_us
        self.combined = combined
        self.slots = slots or {}
        self.stages = tuple(stages)
        self.tasks = module.task_map()
        self.stage_of: dict[str, int] = {}
        for s, stage in enumerate(self.stages):
            for layer in stage.layers:
                for t in layer.tasks:
                    if t.name in self.stage_of:
                        raise LoweringError(
                            f"layer @{layer.name} is in stage {self.stage_of[t.name]} and stage {s} of the partition; "
                            "each layer belongs to one stage"
                        )
                    self.stage_of[t.name] = s
        missing = [t.name for t in module.tasks() if t.name not in self.stage_of]
        if missing:
            raise LoweringError(f"task @{missing[0]} is in no stage of the partition ({len(missing)} such tasks)")
        self.dependents: dict[str, list[str]] = defaultdict(list)
        for t in module.tasks():
            for d in t.deps:
                self.dependents[d].append(t.name)
        self._steps: dict[tuple[int | None, int | None], Step] = {}

    # ------------------------------------------------------------------ what a step runs

    def _layers(self, stage: int | None) -> Sequence[Layer]:
        return () if stage is None else self.stages[stage].layers

    def _exits(self, stage: int, side: str) -> tuple[str, ...]:
        """Tasks of ``stage``'s ``side`` that the neighbouring stage's tasks depend on (what its send carries)."""
        pp, stages = self.parallel.pp, self.parallel.virtual_stages
        neighbour = stage + 1 if side == FWD else stage - 1
        if pp == 1 or not 0 <= neighbour < stages:
            return ()
        out = []
        for layer in self.stages[stage].layers:
            for t in layer.tasks:
                if (t.phase is Phase.FWD) == (side == FWD) and any(
                    self.stage_of[u] == neighbour for u in self.dependents.get(t.name, ())
                ):
                    out.append(t.name)
        return tuple(out)

    def step(self, fwd: int | None, bwd: int | None) -> Step:
        got = self._steps.get((fwd, bwd))
        if got is None:
            exits = {}
            if fwd is not None:
                exits[FWD] = self._exits(fwd, FWD)
            if bwd is not None:
                exits[BWD] = self._exits(bwd, BWD)
            scheduled, source = self.chunk_schedule(self._layers(fwd), self._layers(bwd))
            got = self._steps[(fwd, bwd)] = build_step(scheduled, source, self.duration_us, exits)
        return got

    def slot_key(self, fwd: int | None, bwd: int | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return tuple(x.name for x in self._layers(fwd)), tuple(x.name for x in self._layers(bwd))

    # ------------------------------------------------------------------ the programs

    def programs(self) -> dict[int, list[Instruction]]:
        """Every rank's instructions, receives placed, indices resolved."""
        p = self.parallel
        code = {r: self._emit(r) for r in range(p.pp)}
        for r in range(p.pp):
            self._place_receives(code, r)
        out = {}
        for r, rc in code.items():
            for k, node in enumerate(rc.nodes):
                node.index = k
            out[r] = [node.instruction() for node in rc.nodes]
        return out

    def _emit(self, rank: int) -> _RankCode:
        p = self.parallel
        steps = rank_steps(p.pp, p.vpp, p.microbatches, rank, self.combined)
        last_backward: dict[int, int] = {}
        for k, st in enumerate(steps):
            if st.bwd is not None:
                last_backward[st.bwd[0]] = k
        emitter = _Emitter(self, rank)
        for k, st in enumerate(steps):
            emitter.code.step_starts.append(len(emitter.code.nodes))
            emitter.run_step(k, st)
            for stage, at in sorted(last_backward.items()):
                if at == k:
                    emitter.grad_reduce(stage)
        emitter.emit(_Node(END, f"program.r{rank}"))
        return emitter.code

    def _place_receives(self, code: dict[int, _RankCode], rank: int) -> None:
        """Insert ``rank``'s receives: one step before the first step that waits for each, in the
        order each sender sends them."""
        rc = code[rank]
        placements: list[tuple[int, int, int, _Node]] = []  # (position, peer, order, node)
        expected = set(rc.recvs)
        for peer in range(self.parallel.pp):
            if peer == rank:
                continue
            sent = code[peer].sends.get(rank, [])
            keys = [key for key in sent if key in rc.recvs]
            unused = [key for key in sent if key not in rc.recvs]
            if unused:
                payload, stage, mb = unused[0]
                raise LoweringError(f"rank {peer} sends the {payload} of stage {stage}, micro-batch {mb} to rank {rank}, "
                                    "which never uses it")
            posts = [rc.step_starts[max(rc.need_step[key] - 1, 0)] for key in keys]
            for k in range(len(posts) - 2, -1, -1):  # in the sender's order: never after a later one
                posts[k] = min(posts[k], posts[k + 1])
            for order, (key, at) in enumerate(zip(keys, posts)):
                placements.append((at, peer, order, rc.recvs[key]))
                expected.discard(key)
        if expected:
            payload, stage, mb = sorted(expected)[0]
            raise LoweringError(f"rank {rank} needs the {payload} of stage {stage}, micro-batch {mb}, which no rank sends")
        placements.sort(key=lambda x: x[:3])
        merged: list[_Node] = []
        k = 0
        for position, node in enumerate(rc.nodes):
            while k < len(placements) and placements[k][0] == position:
                merged.append(placements[k][3])
                k += 1
            merged.append(node)
        rc.nodes = merged


class _Emitter:
    """Phase 1 for one rank: instructions in order, waits only where nothing else orders the work."""

    def __init__(self, lowering: Lowering, rank: int):
        self.low = lowering
        self.rank = rank
        self.code = _RankCode(rank)
        self.instance: dict[tuple[str, int], _Node] = {}
        self.fifo_count = {COMPUTE: 0, COMM: 0}
        self.fifo_done = {COMPUTE: -1, COMM: -1}  # stream positions known finished
        self.done: set[int] = set()  # ids of other work known finished
        self.defers: dict[int, list[_Node]] = defaultdict(list)
        self.last_run: dict[int, _Node] = {}  # per stage, its last compute instruction
        self.step_index = 0
        self.slot_table: dict[str, SlotFigures] = {}

    def emit(self, node: _Node) -> _Node:
        if node.op == RUN or node.op in COLLECTIVES:
            node.fifo = self.fifo_count[node.stream]
            self.fifo_count[node.stream] += 1
        self.code.nodes.append(node)
        return node

    # ------------------------------------------------------------------ waits

    def _known_done(self, node: _Node) -> bool:
        if node.fifo >= 0:
            return node.fifo <= self.fifo_done[node.stream]
        return id(node) in self.done

    def _mark_done(self, node: _Node) -> None:
        if node.fifo >= 0:
            self.fifo_done[node.stream] = max(self.fifo_done[node.stream], node.fifo)
        else:
            self.done.add(id(node))

    def ensure(self, node: _Node, consumer_op: str, stream: str, consumer_task: str = "") -> None:
        """Make the work of ``node`` finish before a ``consumer_op`` on ``stream``."""
        if node.op == RUN and consumer_op in (RUN, DEFER):
            return  # the compute stream runs in issue order (a deferred task runs later still)
        if node.op in COLLECTIVES and consumer_op in COLLECTIVES:
            return  # so do the comm stream's collectives
        if node.op == DEFER:
            raise LoweringError(f"@{consumer_task or node.ref} depends on the weight gradient @{node.ref}; "
                                "weight gradients are deferred, so nothing may depend on them")
        if self._known_done(node):
            return
        if node.op == ALL_TO_ALL and stream == COMPUTE and consumer_task:
            figures = self.slot_table.get(consumer_task)
            if figures is not None and figures.waits_on == node.ref:
                self.emit(_Node(SLOT, node.ref, node.mb, target=node, slot=figures))
        self.emit(_Node(WAIT, node.ref, stream=stream, target=node))
        self._mark_done(node)

    # ------------------------------------------------------------------ steps

    def run_step(self, k: int, st: RankStep) -> None:
        low = self.low
        fwd_stage = st.fwd[0] if st.fwd else None
        bwd_stage = st.bwd[0] if st.bwd else None
        self.step_index = k
        self.slot_table = low.slots.get(low.slot_key(fwd_stage, bwd_stage), {})
        # Work that needs a tensor still in flight from another rank, and everything behind it
        # (on its stream, or depending on it), goes after the rest of the step: the other side's
        # work runs while the tensor arrives.
        held: list[StepItem] = []
        held_streams: set[str] = set()
        held_tasks: set[str] = set()
        for item in low.step(fwd_stage, bwd_stage).items:
            stage, mb = st.fwd if item.side == FWD else st.bwd  # type: ignore[misc]
            if item.task is None:
                if held_tasks.intersection(item.exits):
                    held.append(item)
                else:
                    self.send(stage, mb, item.side, item.exits)
            elif item.stream in held_streams or held_tasks.intersection(item.task.deps) or self._awaits_transfer(item.task, mb):
                held.append(item)
                held_streams.add(item.stream)
                held_tasks.add(item.task.name)
            else:
                self.task(item.task, stage, mb)
        for item in held:
            stage, mb = st.fwd if item.side == FWD else st.bwd  # type: ignore[misc]
            if item.task is None:
                self.send(stage, mb, item.side, item.exits)
            else:
                self.task(item.task, stage, mb)

    def _awaits_transfer(self, task: Task, mb: int) -> bool:
        """Whether ``task`` needs a tensor from another rank that is not known to have arrived."""
        pp = self.low.parallel.pp
        for dep in task.deps:
            dep_stage = self.low.stage_of[dep]
            if dep_stage % pp != self.rank:
                key = (ACTIVATION if self.low.tasks[dep].phase is Phase.FWD else GRADIENT, dep_stage, mb)
                node = self.code.recvs.get(key)
                if node is None or not self._known_done(node):
                    return True
        return False

    def task(self, task: Task, stage: int, mb: int) -> None:
        low = self.low
        pp = low.parallel.pp
        if task.resource is Resource.COMM:
            op = ALL_TO_ALL
        elif task.movable and not low.dependents.get(task.name):
            op = DEFER
        else:
            op = RUN
        stream = COMM if op == ALL_TO_ALL else COMPUTE
        for dep in task.deps:
            dep_stage = low.stage_of[dep]
            if dep_stage % pp == self.rank:
                node = self.instance.get((dep, mb))
                if node is None:
                    raise LoweringError(f"@{task.name} (micro-batch {mb}) would run on rank {self.rank} before @{dep}, "
                                        "which it depends on")
                self.ensure(node, op, stream, task.name)
            else:
                self.ensure(self.receive(task, stage, dep, dep_stage, mb), op, stream, task.name)
        node = self.emit(_Node(op, task.name, mb, stream))
        self.instance[(task.name, mb)] = node
        if op == DEFER:
            self.defers[stage].append(node)
        elif op == RUN:
            self.last_run[stage] = node

    def receive(self, task: Task, stage: int, dep: str, dep_stage: int, mb: int) -> _Node:
        dep_task = self.low.tasks[dep]
        forward = dep_task.phase is Phase.FWD
        if forward != (task.phase is Phase.FWD) or dep_stage != (stage - 1 if forward else stage + 1):
            raise LoweringError(
                f"@{task.name} (stage {stage}) depends on @{dep} (stage {dep_stage}, on another rank); only a forward "
                "task's dependency on the previous stage and a backward task's on the next stage cross ranks"
            )
        key = (ACTIVATION if forward else GRADIENT, dep_stage, mb)
        node = self.code.recvs.get(key)
        if node is None:
            pp = self.low.parallel.pp
            node = _Node(RECV, self.low.stages[dep_stage].name, mb, COMM, peer=dep_stage % pp, payload=key[0])
            self.code.recvs[key] = node
            self.code.need_step[key] = self.step_index
        return node

    def send(self, stage: int, mb: int, side: str, exits: tuple[str, ...]) -> None:
        low = self.low
        for name in exits:
            self.ensure(self.instance[(name, mb)], SEND, COMM, name)
        target = stage + 1 if side == FWD else stage - 1
        payload = ACTIVATION if side == FWD else GRADIENT
        peer = target % low.parallel.pp
        self.emit(_Node(SEND, low.stages[stage].name, mb, COMM, peer=peer, payload=payload))
        self.code.sends[peer].append((payload, stage, mb))

    def grad_reduce(self, stage: int) -> None:
        """The stage's last backward ran: wait for its weight gradients (their deadline), then reduce."""
        last = self.last_run.get(stage)
        if last is not None:
            self.ensure(last, GRAD_REDUCE, COMM)
        deadline: _Node | None = None
        defers = self.defers.pop(stage, [])
        for node in defers:
            wait = self.emit(_Node(WAIT, node.ref, stream=COMM, target=node))
            self._mark_done(node)
            deadline = deadline or wait
        for node in defers:
            node.deadline = deadline
        self.emit(_Node(GRAD_REDUCE, self.low.stages[stage].name, stream=COMM))


def deferral_bytes(task: Task, layer: Layer, dtype_bytes: int) -> int:
    """What deferring a weight gradient keeps alive: its forward's saved activations and its output gradient."""
    fwd = next((t for t in layer.tasks if t.op is task.op and t.phase is Phase.FWD), None)
    if fwd is None:
        return 0
    output = math.prod(fwd.shapes[-1]) * dtype_bytes if fwd.shapes else 0
    return fwd.act_bytes + output
