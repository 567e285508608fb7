"""Discrete-event simulation of one training iteration of one pipeline.

Model (the input is a :class:`~passes.simulation.program.SimulationInput`):

- Each pipeline rank runs its actions in program order. An action starts when the previous one
  has ended and its inputs have arrived: the forward of virtual stage ``s`` needs stage
  ``s-1``'s activation of the same micro-batch, the backward of ``s`` needs stage ``s+1``'s
  gradient (the last stage's backward needs its own forward). An action ends when all its
  tasks have.
- Inside an action the program's tasks run on two streams, compute and the expert-parallel
  All-to-All stream, each in the order the plan fixed: a task starts when its stream is free
  and its dependencies have finished (how CUDA streams with cross-stream events execute).
  Durations are post-overlap (contention included) under balanced routing; a routed task
  (expert GEMM, dispatch, combine) is stretched by the load imbalance of its layer and
  micro-batch: ``fixed + (duration - fixed) * imbalance``, since the most loaded expert-parallel
  rank sets the pace of a collective and the others wait for it. One simulated rank stands for
  its expert-parallel group on that critical path.
- Point-to-point transfers: when an action's forward side finishes, its activation goes to the
  next stage's rank; its backward side's gradient to the previous one. Each direction of each
  link carries one transfer at a time: ``bytes / bandwidth`` on the link, plus latency to arrive.
- Gradient reduction: when a rank's chunk has run its last backward (and all its weight
  gradients), the chunk's reduction starts on the rank's data-parallel stream (one at a time),
  overlapping the backward of the other chunks, as Megatron does with overlapped gradient
  reduction. The iteration ends when every rank's actions and reductions are done.
- Dynamic Bubble Optimizer (optional, one :class:`runtime.dbo.DboPolicy` per rank): a deferrable
  task is offered to the pool when the compute stream reaches it; a slot (a compute task that
  waits for the All-to-All, annotated in the program, or a step that waits for a pipeline
  receive) is filled with pooled tasks by the policy's prediction (the policy is asked only while
  its pool holds work: with nothing to place there is no decision); at the end of every step the
  tasks whose deadline has come run on the compute stream. Deadlines: the step of the chunk's
  last backward, so every deferred weight gradient is done before its reduction starts.
  Admission (``DboSettings.admission``, on by default) is the policy's deadline-aware one, over
  the rank's forecast slots (:func:`slot_forecast`): every annotated slot with its ``base_us``
  (what the runtime's SLOT instructions carry), and the predicted receive wait before every
  step and idle tail after the last one (which only the simulator's model of the runtime has).

Accounting: for every rank and lane (compute, a2a, send_next, send_prev, grad_reduce) busy time
and idle time are summed independently (idle = every gap between busy intervals, from 0 to the
iteration's end), so ``busy + idle == iteration time`` is a check, not a definition.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from passes.simulation.program import BWD, COMM, COMPUTE, FWD, Action, Program, SimulationInput, SimulationInputError
from runtime.dbo import DboCounters, DboPolicy, MovableTask, SlotForecast, SlotSpec
from support.extensions import load_extension

# TESSERA_ACTION_EXTENSION names another build of the action loop (the sanitizer build `make test`
# runs the simulator's tests against); normally the package's own.
if TYPE_CHECKING:
    import numpy as np

    from passes.simulation import _action
else:
    _action = load_extension("passes.simulation._action", "TESSERA_ACTION_EXTENSION")

LANES = ("compute", "a2a", "send_next", "send_prev", "grad_reduce")
COMM_KINDS = ("dispatch", "combine", "p2p", "grad_reduce")
# Kind codes of comm tasks for the exposure sweep.
_KIND_CODE = {"dispatch": 0, "combine": 1}


@dataclass
class LaneStats:
    busy_us: float = 0.0
    idle_us: float = 0.0
    free_us: float = 0.0  # end of the last busy interval (internal bookkeeping)

    def occupy(self, start: float, end: float) -> None:
        if start < self.free_us - 1e-6 * max(1.0, abs(start)):
            raise AssertionError(f"lane overlap: interval starts at {start} before the lane is free at {self.free_us}")
        if start > self.free_us:
            self.idle_us += start - self.free_us
        self.busy_us += end - start
        self.free_us = max(self.free_us, end)

    def occupy_all(self, intervals: Sequence[tuple[float, ...]]) -> None:
        """``occupy`` for intervals in time order (``(start, end, ...)``), in one loop."""
        free, busy, idle = self.free_us, self.busy_us, self.idle_us
        for interval in intervals:
            start, end = interval[0], interval[1]
            if start < free - 1e-6 * (start if start > 1.0 else 1.0):
                raise AssertionError(f"lane overlap: interval starts at {start} before the lane is free at {free}")
            if start > free:
                idle += start - free
            busy += end - start
            if end > free:
                free = end
        self.free_us, self.busy_us, self.idle_us = free, busy, idle


@dataclass
class CommStats:
    total_us: float = 0.0
    exposed_us: float = 0.0

    @property
    def exposed_fraction(self) -> float:
        return self.exposed_us / self.total_us if self.total_us > 0 else 0.0


@dataclass
class RankStats:
    rank: int
    lanes: dict[str, LaneStats] = field(default_factory=lambda: {name: LaneStats() for name in LANES})
    pipeline_wait_us: float = 0.0  # compute idle between actions: warm-up, receives, cool-down, the tail
    action_us: float = 0.0  # time spent inside actions (start to end), i.e. the stage's post-overlap work
    end_us: float = 0.0  # when the rank's last action ended
    peak_activation_bytes: int = 0  # in-flight activations + DBO pool at the worst moment
    static_bytes: int = 0
    dbo: DboCounters | None = None

    @property
    def compute_idle_us(self) -> float:
        return self.lanes["compute"].idle_us

    @property
    def in_action_idle_us(self) -> float:
        """Compute idle inside actions: waits for the All-to-All (and for a skewed one)."""
        return self.compute_idle_us - self.pipeline_wait_us

    @property
    def peak_bytes(self) -> int:
        return self.static_bytes + self.peak_activation_bytes


@dataclass(frozen=True)
class Event:
    """One busy interval, for traces and timelines."""

    rank: int
    lane: str
    name: str
    start_us: float
    end_us: float
    category: str  # fwd | bwd | wgrad | dbo | fallback | dispatch | combine | p2p | grad_reduce


@dataclass
class SimulationResult:
    iteration_us: float
    ranks: list[RankStats]
    comm: dict[str, CommStats]
    inp: SimulationInput
    events: list[Event] = field(default_factory=list)
    recv_waits: list[list[float]] = field(default_factory=list)  # [rank][step]: compute wait before the step

    @property
    def tokens_per_s(self) -> float:
        return self.inp.tokens_per_iteration / (self.iteration_us * 1e-6) if self.iteration_us > 0 else 0.0

    @property
    def mfu(self) -> float:
        """Model FLOPs of the iteration over what the pipeline's devices could do in that time."""
        capacity = self.inp.pp * self.inp.peak_flops_per_rank * self.iteration_us * 1e-6
        return self.inp.flops_per_iteration / capacity if capacity > 0 else 0.0

    @property
    def stage_imbalance(self) -> float:
        """Largest per-rank action time over the mean (1.0: perfectly balanced stages)."""
        work = [r.action_us for r in self.ranks]
        mean = sum(work) / len(work) if work else 0.0
        return max(work) / mean if mean > 0 else 1.0

    @property
    def pipeline_idle_us(self) -> float:
        """Compute idle summed over ranks (between and inside actions)."""
        return sum(r.compute_idle_us for r in self.ranks)

    @property
    def dbo(self) -> DboCounters | None:
        counters = [r.dbo for r in self.ranks if r.dbo is not None]
        if not counters:
            return None
        out = DboCounters()
        for c in counters:
            out = out.merge(c)
        return out


@dataclass(frozen=True)
class DboSettings:
    """How the simulator drives the DBO policy: the pool's memory budget (one for every rank, or one
    per rank), the shortest slot worth filling, and whether a task is admitted only when the slots
    forecast before its deadline can take it (``admission``; off: by memory alone, the policy
    before deadline-aware admission, kept to measure what admission earns)."""

    memory_budget_bytes: int | tuple[int, ...]
    min_slot_us: float = 0.0
    admission: bool = True

    def budget(self, rank: int) -> int:
        b = self.memory_budget_bytes
        return b if isinstance(b, int) else b[rank]


class _Compiled:
    """A program flattened into tuples for the Python loop, and handed to the C++ action loop."""

    __slots__ = ("rows", "slot_at", "n", "has_fwd", "has_bwd", "routed_layers", "names", "loop")

    def __init__(self, program: Program):
        self.n = len(program.tasks)
        slot_at: dict[int, SlotSpec] = {}
        slot_routed: dict[int, int] = {}
        for s in program.slots:
            slot_at[s.task] = SlotSpec(s.slot_id, s.base_us, s.a2a_us, s.gemm_us)
            slot_routed[s.task] = s.routed
        self.slot_at = slot_at
        self.rows = tuple(
            (
                t.stream,
                t.fixed_us,
                t.duration_us - t.fixed_us,
                t.deps,
                t.routed,
                _KIND_CODE.get(t.kind, -1) if t.stream == COMM else -1,
                t.side,
                t.deferrable,
                t.memory_bytes,
                slot_at.get(i),
                slot_routed.get(i, -1),
                t.kind == "wgrad",
            )
            for i, t in enumerate(program.tasks)
        )
        self.has_fwd, self.has_bwd = program.sides
        self.routed_layers = program.routed_layers
        self.names = tuple(t.name for t in program.tasks)
        rows = self.rows
        self.loop = _action.ActionLoop(
            [row[0] for row in rows], [row[1] for row in rows], [row[2] for row in rows], [list(row[3]) for row in rows],
            [row[4] for row in rows], [row[5] for row in rows], [row[6] for row in rows], [row[7] for row in rows],
            [row[9] is not None for row in rows], len(self.routed_layers),
        )


# Forecasts by input (while it lives), rank and shortest slot: a capacity report simulates one input
# for many iterations, and a forecast depends on nothing else.
_FORECASTS: dict[int, dict[tuple[int, float], SlotForecast]] = {}


def slot_forecast(inp: SimulationInput, rank: int, min_slot_us: float = 0.0) -> SlotForecast:
    """The slots rank ``rank``'s program offers the DBO, as its admission test sees them: every
    annotated slot of step ``k``'s program at position ``k`` with its balanced-routing wait
    ``base_us``, and (when the input predicts them) the receive wait before step ``k`` at
    ``k - 1/2``, where the fallbacks due at step ``k - 1`` run (``runtime.dbo``, "Admission"),
    and after the last step the predicted idle to the iteration's end."""
    known = _FORECASTS.get(id(inp))
    if known is None:
        known = _FORECASTS[id(inp)] = {}
        weakref.finalize(inp, _FORECASTS.pop, id(inp), None)
    cached = known.get((rank, min_slot_us))
    if cached is not None:
        return cached
    slots: list[tuple[float, float]] = []
    recv = inp.recv_predicted_us[rank] if inp.recv_predicted_us else None
    for k, action in enumerate(inp.ranks[rank]):
        if recv is not None:
            slots.append((k - 0.5, recv[k]))
        slots.extend((k, s.base_us) for s in action.program.slots)
    if inp.tail_predicted_us:
        slots.append((len(inp.ranks[rank]) - 0.5, inp.tail_predicted_us[rank]))
    forecast = known[(rank, min_slot_us)] = SlotForecast(slots, min_slot_us)
    return forecast


def _overlap_sweep(comm: list[tuple[float, float, int]], compute: list[tuple[float, float]]) -> list[float]:
    """Per comm kind code, the comm time not covered by compute busy intervals (both lists in time order)."""
    exposed = [0.0, 0.0]
    j = 0
    n = len(compute)
    for cs, ce, code in comm:
        covered = 0.0
        while j < n and compute[j][1] <= cs:
            j += 1
        k = j
        while k < n and compute[k][0] < ce:
            lo = compute[k][0] if compute[k][0] > cs else cs
            hi = compute[k][1] if compute[k][1] < ce else ce
            if hi > lo:
                covered += hi - lo
            k += 1
        if code >= 0:
            exposed[code] += (ce - cs) - covered
    return exposed


def _run_native(
    prog: _Compiled, a: Action, k: int, r: int, t0: float, factors: list[float], policy: DboPolicy | None,
    compute_lane: LaneStats, comm_lane: LaneStats, comm_total: list[float], comm: dict[str, CommStats],
    task_ids: list[int], last_bwd: list[dict[int, int]], steps: int, live: list[int], peak_live: int,
) -> tuple[float, float, float, float, int]:
    """Step ``k`` of rank ``r``'s tasks by the C++ loop, asking ``policy`` where the Python loop
    does; updates the lanes, the dispatch/combine totals and exposure. Returns (forward end,
    backward end, compute free, comm free, peak live bytes)."""
    loop = prog.loop
    loop.start(t0, compute_lane.free_us, comm_lane.free_us, factors)
    if policy is None:
        loop.advance(False, False)
        due: list[float] = []
    else:
        while True:
            i, ready_t, dur, free_c = loop.advance(True, policy.pool_size > 0)
            if i < 0:
                break
            row = prog.rows[i]
            if row[7]:  # deferrable
                bstage = a.bwd[0] if row[6] == BWD else a.fwd[0]  # type: ignore[index]
                task = MovableTask(task_ids[r], prog.names[i], dur, last_bwd[r].get(bstage, steps - 1), row[8])
                task_ids[r] += 1
                if policy.offer(task, k):
                    loop.defer()
                    peak_live = max(peak_live, live[r] + policy.pool_bytes)
                    continue
            fills: list[float] = []
            slot, slot_routed = row[9], row[10]
            if slot is not None and ready_t > free_c and policy.pool_size:
                decision = policy.fill(k, policy.predict(slot, factors[slot_routed] if slot_routed >= 0 else 1.0))
                policy.settle(decision, ready_t - free_c)
                fills = [task.duration_us for task in decision.tasks]
            loop.run_stopped(fills)
        due = [task.duration_us for task in policy.due(k)]
    (free_c, free_m, fwd_end, bwd_end, compute_lane.free_us, compute_lane.busy_us, compute_lane.idle_us,
     comm_lane.free_us, comm_lane.busy_us, comm_lane.idle_us, comm_total[0], comm_total[1], exposed_dispatch,
     exposed_combine) = loop.finish(due, compute_lane.free_us, compute_lane.busy_us, compute_lane.idle_us,
                                    comm_lane.free_us, comm_lane.busy_us, comm_lane.idle_us, comm_total[0], comm_total[1])
    comm["dispatch"].exposed_us += exposed_dispatch
    comm["combine"].exposed_us += exposed_combine
    return fwd_end, bwd_end, free_c, free_m, peak_live


def simulate(
    inp: SimulationInput,
    imbalance: Sequence[Sequence[float]] | np.ndarray | None = None,
    dbo: DboSettings | None = None,
    record: bool = False,
    policy_factory: Callable[[int], DboPolicy] | None = None,
    *,
    python_loop: bool = False,
) -> SimulationResult:
    """Simulate one iteration.

    ``imbalance[layer][microbatch]``: the load imbalance (most loaded expert-parallel rank over
    the mean) of each decoder layer and micro-batch; None means perfectly balanced. ``dbo``
    turns the Dynamic Bubble Optimizer on (``policy_factory(rank)`` may supply the policies,
    e.g. to inspect them). ``record`` keeps every busy interval for traces and timelines.

    Each action's tasks run in C++ (``passes/simulation/csrc/action.cpp``): the Python task loop
    below on the same doubles in the same order, stopping before every task the DBO policy
    decides on, so the two give bitwise-identical results (the tests compare them). The Python
    loop runs with ``python_loop`` (the definition the C++ one follows) and for a recorded
    iteration, whose intervals it names.
    """
    native = not (python_loop or record)
    pp, stages = inp.pp, inp.stages
    if imbalance is not None and (len(imbalance) < inp.decoder_layers or any(len(row) < inp.microbatches for row in imbalance)):
        raise SimulationInputError(
            f"routing gives imbalance for {len(imbalance)} layers; the input needs {inp.decoder_layers} layers × "
            f"{inp.microbatches} micro-batches"
        )
    imb = [[float(x) for x in row] for row in imbalance] if imbalance is not None else None
    compiled: dict[int, _Compiled] = {}
    ranks = [RankStats(r, static_bytes=inp.static_bytes[r] if inp.static_bytes else 0) for r in range(pp)]
    policies: list[DboPolicy | None] = [None] * pp
    if dbo is not None:
        for r in range(pp):
            policies[r] = (
                policy_factory(r) if policy_factory is not None
                else DboPolicy(dbo.budget(r), dbo.min_slot_us,
                               slot_forecast(inp, r, dbo.min_slot_us) if dbo.admission else None)
            )
            ranks[r].dbo = policies[r].counters  # type: ignore[union-attr]
    comm = {kind: CommStats() for kind in COMM_KINDS}
    comm_total = [0.0, 0.0]  # dispatch, combine: summed here, stored in ``comm`` at the end
    events: list[Event] = []
    recv_waits: list[list[float]] = [[] for _ in range(pp)]

    # Where each stage's chunk has its last backward on its rank (the DBO deadline, the reduction trigger).
    last_bwd: list[dict[int, int]] = [{} for _ in range(pp)]
    for r, actions in enumerate(inp.ranks):
        for k, a in enumerate(actions):
            if a.bwd is not None:
                last_bwd[r][a.bwd[0]] = k

    # Arrivals of inputs: (stage, mb) -> time the input of that stage's forward / backward is on its rank.
    fwd_in: dict[tuple[int, int], tuple[float, float, float]] = {}  # -> (arrival, produced, transfer busy)
    bwd_in: dict[tuple[int, int], tuple[float, float, float]] = {}
    fwd_done: dict[tuple[int, int], float] = {}
    ptr = [0] * pp
    prev_end = [0.0] * pp
    live = [0] * pp
    task_ids = [0] * pp
    act_bytes = inp.stage_activation_bytes
    transfer_us = inp.activation_bytes / inp.p2p_bytes_per_us if inp.p2p_bytes_per_us > 0 else 0.0
    latency = inp.p2p_latency_us

    def send(rank: int, lane_name: str, ready: float) -> tuple[float, float, float]:
        lane = ranks[rank].lanes[lane_name]
        start = max(ready, lane.free_us)
        lane.occupy(start, start + transfer_us)
        comm["p2p"].total_us += transfer_us + latency
        if record and transfer_us > 0:
            events.append(Event(rank, lane_name, "p2p", start, start + transfer_us, "p2p"))
        return start + transfer_us + latency, ready, transfer_us + latency

    def inputs(r: int, a: Action) -> tuple[float, list[tuple[float, float, float]]] | None:
        t = prev_end[r]
        got = []
        if a.fwd is not None and a.fwd[0] > 0:
            key = (a.fwd[0] - 1, a.fwd[1])
            if key not in fwd_in:
                return None
            got.append(fwd_in[key])
        if a.bwd is not None:
            if a.bwd[0] < stages - 1:
                key = (a.bwd[0] + 1, a.bwd[1])
                if key not in bwd_in:
                    return None
                got.append(bwd_in[key])
            elif a.bwd not in fwd_done:
                return None
        for arrival, _, _ in got:
            t = max(t, arrival)
        return t, got

    def _outputs(a: Action, k: int, r: int, fwd_end: float, bwd_end: float, end_t: float) -> None:
        """What an action ending at ``end_t`` sends on: activations forward, gradients backward, and
        its chunk's gradient reduction after its last backward."""
        if a.fwd is not None:
            s, mb = a.fwd
            fwd_done[a.fwd] = fwd_end
            if s < stages - 1:
                if pp == 1:
                    fwd_in[(s, mb)] = (fwd_end, fwd_end, 0.0)
                else:
                    fwd_in[(s, mb)] = send(r, "send_next", fwd_end)
        if a.bwd is not None:
            s, mb = a.bwd
            if act_bytes:
                live[r] -= act_bytes[s]
            if s > 0:
                if pp == 1:
                    bwd_in[(s, mb)] = (bwd_end, bwd_end, 0.0)
                else:
                    bwd_in[(s, mb)] = send(r, "send_prev", bwd_end)
            if last_bwd[r].get(s) == k and inp.grad_reduce_us:
                lane = ranks[r].lanes["grad_reduce"]
                duration = inp.grad_reduce_us[r][s // pp]
                start = max(end_t, lane.free_us)
                lane.occupy(start, start + duration)
                comm["grad_reduce"].total_us += duration
                if record and duration > 0:
                    events.append(Event(r, "grad_reduce", f"grad_reduce.chunk{s // pp}", start, start + duration, "grad_reduce"))

    progress = True
    while progress:
        progress = False
        for r in range(pp):
            actions = inp.ranks[r]
            rs = ranks[r]
            lanes = rs.lanes
            compute_lane, comm_lane = lanes["compute"], lanes["a2a"]
            policy = policies[r]
            while ptr[r] < len(actions):
                k = ptr[r]
                a = actions[k]
                ready = inputs(r, a)
                if ready is None:
                    break
                t0, got = ready
                progress = True
                ptr[r] += 1
                prog = compiled.get(id(a.program))
                if prog is None:
                    prog = compiled[id(a.program)] = _Compiled(a.program)
                # p2p exposure: the part of each transfer this rank spent waiting for.
                for arrival, produced, total in got:
                    waited = arrival - max(prev_end[r], produced)
                    if waited > 0:
                        comm["p2p"].exposed_us += min(total, waited)
                wait = t0 - prev_end[r]
                recv_waits[r].append(wait)
                cursor = prev_end[r]
                if policy is not None and wait > 0 and policy.pool_size:
                    predicted = inp.recv_predicted_us[r][k] if inp.recv_predicted_us else 0.0
                    decision = policy.fill(k, predicted)
                    policy.settle(decision, wait)
                    for task in decision.tasks:
                        start = max(cursor, compute_lane.free_us)
                        compute_lane.occupy(start, start + task.duration_us)
                        if record:
                            events.append(Event(r, "compute", task.name, start, start + task.duration_us, "dbo"))
                        cursor = start + task.duration_us
                rs.pipeline_wait_us += max(0.0, t0 - cursor)
                t0 = max(t0, cursor)
                # In-flight activations: the forward allocates, the backward frees.
                if a.fwd is not None and act_bytes:
                    live[r] += act_bytes[a.fwd[0]]
                peak_live = live[r] + (policy.pool_bytes if policy is not None else 0)
                # Routing factors of this action's routed layers.
                factors = []
                for side, layer in prog.routed_layers:
                    mb = a.fwd[1] if side == FWD else a.bwd[1]  # type: ignore[index]
                    factors.append(imb[layer][mb] if imb is not None else 1.0)
                if native:
                    fwd_end, bwd_end, free_c, free_m, peak_live = _run_native(
                        prog, a, k, r, t0, factors, policy, compute_lane, comm_lane, comm_total, comm, task_ids, last_bwd,
                        len(actions), live, peak_live,
                    )
                    end_t = max(t0, free_c, free_m)
                    rs.action_us += end_t - t0
                    prev_end[r] = end_t
                    rs.peak_activation_bytes = max(rs.peak_activation_bytes, peak_live)
                    _outputs(a, k, r, fwd_end, bwd_end, end_t)
                    continue
                fin = [0.0] * prog.n
                free_c = max(compute_lane.free_us, t0)
                free_m = max(comm_lane.free_us, t0)
                fwd_end = bwd_end = t0
                comp_iv: list[tuple[float, float]] = []
                comm_iv: list[tuple[float, float, int]] = []
                for i, (stream, fixed, var, deps, routed, code, side, deferrable, mem, slot, slot_routed, wg) in enumerate(prog.rows):
                    ready_t = t0
                    for d in deps:
                        if fin[d] > ready_t:
                            ready_t = fin[d]
                    dur = fixed + var * factors[routed] if routed >= 0 else fixed + var
                    if stream == COMPUTE:
                        if deferrable and policy is not None:
                            bstage = a.bwd[0] if side == BWD else a.fwd[0]  # type: ignore[index]
                            task = MovableTask(task_ids[r], prog.names[i], dur, last_bwd[r].get(bstage, len(actions) - 1), mem)
                            task_ids[r] += 1
                            if policy.offer(task, k):
                                fin[i] = ready_t
                                peak_live = max(peak_live, live[r] + policy.pool_bytes)
                                continue
                        if slot is not None and policy is not None and ready_t > free_c and policy.pool_size:
                            decision = policy.fill(k, policy.predict(slot, factors[slot_routed] if slot_routed >= 0 else 1.0))
                            policy.settle(decision, ready_t - free_c)
                            for task in decision.tasks:
                                comp_iv.append((free_c, free_c + task.duration_us))
                                if record:
                                    events.append(Event(r, "compute", task.name, free_c, free_c + task.duration_us, "dbo"))
                                free_c += task.duration_us
                        start = free_c if free_c > ready_t else ready_t
                        end = start + dur
                        free_c = end
                        comp_iv.append((start, end))
                        if record:
                            cat = "wgrad" if wg else ("fwd" if side == FWD else "bwd")
                            events.append(Event(r, "compute", prog.names[i], start, end, cat))
                    else:
                        start = free_m if free_m > ready_t else ready_t
                        end = start + dur
                        free_m = end
                        comm_iv.append((start, end, code))
                        if record:
                            events.append(Event(r, "a2a", prog.names[i], start, end, "dispatch" if code == 0 else "combine"))
                    fin[i] = end
                    if side == FWD:
                        if end > fwd_end:
                            fwd_end = end
                    elif end > bwd_end:
                        bwd_end = end
                # Deadline fallbacks run on the compute stream at the end of the step.
                if policy is not None:
                    for task in policy.due(k):
                        comp_iv.append((free_c, free_c + task.duration_us))
                        if record:
                            events.append(Event(r, "compute", task.name, free_c, free_c + task.duration_us, "fallback"))
                        free_c += task.duration_us
                compute_lane.occupy_all(comp_iv)
                comm_lane.occupy_all(comm_iv)
                for start, end, code in comm_iv:
                    if code >= 0:
                        comm_total[code] += end - start
                exposed = _overlap_sweep(comm_iv, comp_iv)
                comm["dispatch"].exposed_us += exposed[0]
                comm["combine"].exposed_us += exposed[1]
                end_t = max(t0, free_c, free_m)
                rs.action_us += end_t - t0
                prev_end[r] = end_t
                rs.peak_activation_bytes = max(rs.peak_activation_bytes, peak_live)
                _outputs(a, k, r, fwd_end, bwd_end, end_t)
    stuck = [(r, ptr[r]) for r in range(pp) if ptr[r] < len(inp.ranks[r])]
    if stuck:
        r, k = stuck[0]
        a = inp.ranks[r][k]
        raise SimulationInputError(
            f"the rank programs deadlock: rank {r} waits at step {k} (forward {a.fwd}, backward {a.bwd}) for an input "
            "no rank produces first"
        )
    for r in range(pp):
        policy = policies[r]
        if policy is not None:
            leftover = policy.drain()
            lane = ranks[r].lanes["compute"]
            for task in leftover:
                start = lane.free_us
                lane.occupy(start, start + task.duration_us)
                prev_end[r] = max(prev_end[r], start + task.duration_us)
        ranks[r].end_us = prev_end[r]
    comm["dispatch"].total_us, comm["combine"].total_us = comm_total
    iteration = max(max(rs.end_us, rs.lanes["grad_reduce"].free_us) for rs in ranks) if ranks else 0.0
    for rs in ranks:
        tail = rs.lanes["grad_reduce"].free_us - rs.end_us
        if tail > 0:
            comm["grad_reduce"].exposed_us += tail
        for lane in rs.lanes.values():
            if iteration > lane.free_us:
                lane.idle_us += iteration - lane.free_us
        # The compute tail after the rank's last action counts as pipeline wait (cool-down, other ranks).
        rs.pipeline_wait_us += max(0.0, iteration - rs.end_us)
    return SimulationResult(iteration, ranks, comm, inp, events, recv_waits)
