"""The Dynamic Bubble Optimizer (DBO): the run-time policy that fills idle slots with deferred work.

Mixture-of-Experts routing changes every iteration. When one expert-parallel rank receives more
tokens than the others, the All-to-All that carries them and the expert GEMMs that process them
take longer, and every rank of the group waits: an idle *slot* opens on the compute stream that
no static plan predicted. Weight-gradient (wgrad) work does not have to run where the static plan
put it: nothing downstream needs it before the chunk's gradients are reduced. The DBO keeps a
*pool* of such deferred tasks and, at every slot, puts the best-fitting ones into it.

This module is the one definition of the policy. The simulator (``passes/simulation``) drives it
now; the C++ runtime implements the same semantics (see "Contract for other implementations").
It imports nothing but the standard library.

Vocabulary
----------

*step*
    The index of an action in one rank's program (a warm-up forward, a steady-state
    forward/backward pair, a cool-down backward), counted from 0 each iteration.
*movable task* (:class:`MovableTask`)
    A unit of deferrable work (a wgrad) offered to the pool when the rank's compute stream
    reaches it in program order. It carries its expected duration, the step by whose end it
    must have run (``deadline_step``, e.g. the chunk's last backward, after which its gradients
    are reduced), and the bytes deferring it keeps alive (``memory_bytes``: the saved inputs
    and the output gradient the wgrad reads).
*slot* (:class:`SlotSpec`)
    A place in the program where the compute stream can wait: before a compute task that needs
    an All-to-All's result, or before a step that needs a pipeline receive. The plan annotates
    each slot with what the static plan predicts under balanced routing (``base_us``) and the
    routing-dependent work it waits on (``a2a_us`` of All-to-All transfer, ``gemm_us`` of expert
    GEMM), which the load imbalance of the step's routing scales.

Semantics
---------

1. ``offer(task, step)``: defer ``task`` into the pool if the pool's bytes plus
   ``task.memory_bytes`` stay within ``memory_budget_bytes`` and (with a slot forecast, see
   *Admission*) the slots predicted before its deadline can absorb it; return True. Otherwise
   return False and the caller runs the task where it stands (the main stream). The budget is
   never exceeded. A task whose ``deadline_step < step`` is refused with :class:`DboError`, and
   so is a ``task_id`` seen before in this iteration.
2. ``predict(slot, imbalance)``: the slot's size from routing known before dispatch,
   ``base_us + (a2a_us + gemm_us) * (imbalance - 1)`` clamped at 0, where ``imbalance`` is the
   largest per-rank token load over the mean (:func:`load_imbalance` computes it from the
   per-expert token counts; 1.0 is perfectly balanced).
3. ``fill(step, predicted_us)``: greedy best fit. Repeatedly take, among pooled tasks with
   ``deadline_step >= step`` and ``duration_us <= remaining``, the one with the largest
   ``duration_us`` (ties: the earliest ``deadline_step``, then the smallest ``task_id``);
   subtract its duration from ``remaining`` (starting at ``predicted_us``) until no task fits.
   Chosen tasks leave the pool (their bytes are released) and are returned in the order they
   run. A slot predicted below ``min_slot_us`` is left empty (too short to be worth a launch).
4. ``settle(decision, observed_us)``: record what really happened in the slot: the observed
   idle time, and how much of the placed work it absorbed (``min(placed, observed)``, the idle
   recovered) or overran (``max(0, placed - observed)``, a delay the misprediction caused).
5. ``due(step)``: at the end of every step, every pooled task whose ``deadline_step <= step``
   leaves the pool and is returned (ordered by ``task_id``) to run on the main stream now: a
   *fallback*. So every offered task runs exactly once — in place (refused), in a slot, or as
   a fallback — and never after its deadline step.
6. ``drain()``: at the end of the iteration, the tasks still pooled (possible only when a
   caller's deadlines lie past its last step) run as fallbacks, ordered by ``task_id``.

Admission
---------

A task deferred where no slot can take it is not saved work: it runs as a fallback at its
deadline step — for a weight gradient, the chunk's last backward, in the cool-down where the
pipeline's critical path runs — and a larger pool only defers more such tasks. So with a
:class:`SlotForecast` (the slots the plan predicts on this rank: their positions and their sizes
under balanced routing, ``base_us``), a task offered at ``step`` and due at that same step is
admitted (it waits only for the end of its own step, after the step's sends: the input gradient
goes on before the weight gradient runs, the reorder zero-bubble schedules make); any other
task only if

- some single forecast slot at a position in ``(step, deadline_step + 1/2]`` is at least its
  duration (tasks are not split across slots), and
- for every deadline ``d >= task.deadline_step`` of the pooled tasks and the task itself, the
  work of the pooled tasks with ``step < deadline_step <= d`` plus the task's is at most the
  forecast capacity of the slots at positions in ``(step, d + 1/2]`` (the earliest-deadline-first
  test of whether the pool, with the task, still fits the slots to come).

Positions: a slot inside step ``k`` is at ``k``; the pipeline wait before step ``k`` (a caller
that has such slots) at ``k - 1/2``, between the steps. That wait is where the fallbacks due at
step ``k - 1`` run, after the step's sends and before the next step could start anyway — the
cool-down bubbles zero-bubble schedules fill with weight gradients — so it counts for tasks due
at ``k - 1``; likewise the idle after a rank's last step (at ``last + 1/2``). A slot's forecast is its ``base_us`` (0 when below ``min_slot_us``): a prediction
grows with the load imbalance, which is never below 1, so ``base_us`` is what any routing
delivers; the admission never counts on idle time the routing might not open. Counted as
``refused_deadline``. Without a forecast the admission is by memory alone.

The policy only ever places compute work into compute-stream idle time. It never issues,
moves or reorders a collective: the order of collectives on every rank is the plan's
(reordering collectives across ranks deadlocks real jobs).

Contract for other implementations
----------------------------------

The C++ runtime must match, decision for decision, on the same inputs: the budget test
``pool_bytes + memory_bytes <= memory_budget_bytes`` in integers; then the admission test (a
task due at its own step passes; positions there are integers, so ``(step, d + 1/2]`` is
``(step, d]``; capacities are prefix sums ``cum`` of the forecast in position order, the
capacity of ``(a, b]`` being ``cum(b) - cum(a)``; the demand is summed over the pooled tasks in
``(deadline_step, task_id)`` order, the offered task in its place, each partial sum compared
with ``<= capacity + 1e-9``); the prediction formula in IEEE double arithmetic, evaluated as
written above; the best-fit order (largest duration, then earliest deadline, then smallest id)
with the fit test ``duration_us <= remaining + 1e-9``; the fallback order by ``task_id``; and
the counters of :class:`DboCounters`. The differential tests replay the same
offer/fill/settle/due sequence through both and compare every decision.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

# Tolerance of the fit test, in microseconds: far below any task's duration, far above the
# rounding of a few summed doubles.
FIT_EPS_US = 1e-9


class DboError(ValueError):
    """The policy was driven outside its contract (a task offered twice, after its deadline, ...)."""


@dataclass(frozen=True)
class MovableTask:
    """A deferrable unit of work, as the runtime registers it."""

    task_id: int  # unique within the iteration
    name: str  # the IR task it runs, for reports
    duration_us: float  # expected duration on the compute stream
    deadline_step: int  # must have run by the end of this step
    memory_bytes: int  # bytes kept alive while it waits in the pool


@dataclass(frozen=True)
class SlotSpec:
    """What the plan says about one place where the compute stream may wait."""

    slot_id: str
    base_us: float  # idle time the static plan predicts with balanced routing
    a2a_us: float = 0.0  # routing-dependent All-to-All transfer time the slot waits on
    gemm_us: float = 0.0  # routing-dependent expert GEMM time the slot waits on


@dataclass(frozen=True)
class SlotDecision:
    """The policy's answer for one slot: its predicted size and the tasks put into it, in run order."""

    step: int
    predicted_us: float
    tasks: tuple[MovableTask, ...]

    @property
    def placed_us(self) -> float:
        return sum(t.duration_us for t in self.tasks)


@dataclass
class DboCounters:
    """What the policy did over one iteration."""

    offered: int = 0  # tasks offered to the pool
    deferred: int = 0  # ... of which the pool took
    refused_memory: int = 0  # ... of which the memory budget turned away (they ran in place)
    refused_deadline: int = 0  # ... of which no predicted slot before the deadline could take (ran in place)
    placed: int = 0  # deferred tasks run inside a slot
    fallbacks: int = 0  # deferred tasks run on the main stream at their deadline
    slots: int = 0  # slots the policy was asked about
    slots_filled: int = 0  # ... into which it put at least one task
    predicted_us: float = 0.0  # sum of predicted slot sizes
    observed_us: float = 0.0  # sum of observed slot sizes (settled slots)
    abs_error_us: float = 0.0  # sum of |predicted - observed| over settled slots
    placed_us: float = 0.0  # work put into slots
    recovered_us: float = 0.0  # idle time the placed work absorbed
    overrun_us: float = 0.0  # placed work that ran past the observed slot
    fallback_us: float = 0.0  # work run as fallbacks
    peak_pool_bytes: int = 0  # the most bytes the pool held at once

    def merge(self, other: DboCounters) -> DboCounters:
        """Field-wise sum (the peak: maximum), e.g. over ranks or iterations."""
        out = DboCounters()
        for name in self.__dataclass_fields__:
            a, b = getattr(self, name), getattr(other, name)
            setattr(out, name, max(a, b) if name == "peak_pool_bytes" else a + b)
        return out

    def as_dict(self) -> dict[str, float | int]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def load_imbalance(expert_tokens: Sequence[int], ep: int) -> float:
    """Largest per-rank token load over the mean, from per-expert token counts known before dispatch.

    Experts are placed contiguously: with ``E`` experts, rank ``r`` owns experts
    ``r*E/ep .. (r+1)*E/ep - 1``. (A per-rank vector with ``len == ep`` is its own grouping.)
    An iteration with no tokens is balanced (1.0).
    """
    n = len(expert_tokens)
    if ep < 1 or n % ep:
        raise DboError(f"{n} experts cannot be split evenly over {ep} expert-parallel ranks")
    per_rank = n // ep
    loads = [sum(expert_tokens[r * per_rank : (r + 1) * per_rank]) for r in range(ep)]
    total = sum(loads)
    if total <= 0:
        return 1.0
    return max(loads) * ep / total


class SlotForecast:
    """The slots a rank's program will offer, as admission sees them: positions (steps, see
    "Admission") and balanced-routing sizes.

    Built once per rank and iteration; capacities are prefix sums in position order (ties in the
    given order) and a sparse table answers "the largest single slot in a range of positions".
    """

    __slots__ = ("steps", "_cum", "_table")

    def __init__(self, slots: Sequence[tuple[float, float]], min_slot_us: float = 0.0):
        ordered = sorted(enumerate(slots), key=lambda e: (e[1][0], e[0]))
        self.steps = [step for _, (step, _) in ordered]
        capacity = [size if size >= min_slot_us and size > 0 else 0.0 for _, (_, size) in ordered]
        cum = [0.0]
        for c in capacity:
            cum.append(cum[-1] + c)
        self._cum = cum
        table = [capacity]
        width = 1
        while 2 * width <= len(capacity):
            previous = table[-1]
            table.append(list(map(max, previous[: len(previous) - width], previous[width:])))
            width *= 2
        self._table = table

    def __len__(self) -> int:
        return len(self.steps)

    def through(self, step: float) -> int:
        """How many forecast slots lie at positions ``<= step``."""
        return bisect.bisect_right(self.steps, step)

    def capacity(self, after: float, through: float) -> float:
        """Summed capacity of the slots at positions in ``(after, through]`` (0 when empty)."""
        return self._cum[self.through(through)] - self._cum[self.through(after)]

    def cum_through(self, step: float) -> float:
        return self._cum[self.through(step)]

    def largest(self, after: float, through: float) -> float:
        """The largest single slot at a position in ``(after, through]`` (0 when there is none)."""
        lo, hi = self.through(after), self.through(through)
        if hi <= lo:
            return 0.0
        level = (hi - lo).bit_length() - 1
        row = self._table[level]
        return max(row[lo], row[hi - (1 << level)])


@dataclass
class DboPolicy:
    """The per-rank DBO policy for one iteration (see the module docstring for its semantics).

    Single-threaded: the caller serialises ``offer``/``fill``/``settle``/``due`` (the C++
    runtime hands events from its monitor thread to the training thread for that).
    """

    memory_budget_bytes: int
    min_slot_us: float = 0.0
    forecast: SlotForecast | None = None  # None: admission by memory alone
    counters: DboCounters = field(default_factory=DboCounters)
    _pool: dict[int, MovableTask] = field(default_factory=dict, repr=False)
    _seen: set[int] = field(default_factory=set, repr=False)
    _order: list[tuple[float, int, int]] = field(default_factory=list, repr=False)  # (-duration, deadline, id)
    _by_deadline: list[tuple[int, int, float]] = field(default_factory=list, repr=False)  # (deadline, id, duration)
    _pool_bytes: int = 0

    def __post_init__(self) -> None:
        if self.memory_budget_bytes < 0:
            raise DboError(f"memory budget must be >= 0 bytes, got {self.memory_budget_bytes}")

    @property
    def pool_bytes(self) -> int:
        return self._pool_bytes

    @property
    def pool_size(self) -> int:
        return len(self._pool)

    @property
    def pooled(self) -> tuple[MovableTask, ...]:
        """The tasks waiting in the pool, by ``task_id``."""
        return tuple(self._pool[k] for k in sorted(self._pool))

    def offer(self, task: MovableTask, step: int) -> bool:
        """Defer ``task`` if the memory budget allows (True); else the caller runs it in place (False)."""
        if task.task_id in self._seen:
            raise DboError(f"movable task {task.task_id} ({task.name}) offered twice in one iteration")
        if task.deadline_step < step:
            raise DboError(
                f"movable task {task.task_id} ({task.name}) offered at step {step}, after its deadline step "
                f"{task.deadline_step}"
            )
        if task.duration_us < 0 or task.memory_bytes < 0:
            raise DboError(f"movable task {task.task_id} ({task.name}) has a negative duration or memory cost")
        self._seen.add(task.task_id)
        self.counters.offered += 1
        if self._pool_bytes + task.memory_bytes > self.memory_budget_bytes:
            self.counters.refused_memory += 1
            return False
        if self.forecast is not None and not self._admissible(task, step):
            self.counters.refused_deadline += 1
            return False
        self._pool[task.task_id] = task
        bisect.insort(self._order, (-task.duration_us, task.deadline_step, task.task_id))
        bisect.insort(self._by_deadline, (task.deadline_step, task.task_id, task.duration_us))
        self._pool_bytes += task.memory_bytes
        self.counters.deferred += 1
        self.counters.peak_pool_bytes = max(self.counters.peak_pool_bytes, self._pool_bytes)
        return True

    def _admissible(self, task: MovableTask, step: int) -> bool:
        """The admission test of the module docstring: the slots to come can take the pool and ``task``."""
        forecast = self.forecast
        assert forecast is not None
        if task.deadline_step == step:  # it only moves to the end of its own step
            return True
        if forecast.largest(step, task.deadline_step + 0.5) + FIT_EPS_US < task.duration_us:
            return False
        base = forecast.cum_through(step)
        mine = (task.deadline_step, task.task_id, task.duration_us)
        demand = 0.0
        # Pooled tasks due at ``step`` or before are settled in this step (placed or fallen back).
        start = bisect.bisect_right(self._by_deadline, (step, 2**63, 0.0))
        entries = self._by_deadline[start:]
        position = bisect.bisect_left(entries, mine)
        for deadline, _, duration in (*entries[:position], mine, *entries[position:]):
            demand += duration
            if deadline >= task.deadline_step and demand > forecast.cum_through(deadline + 0.5) - base + FIT_EPS_US:
                return False
        return True

    @staticmethod
    def predict(slot: SlotSpec, imbalance: float) -> float:
        """Predicted idle time of ``slot`` under a routing whose load imbalance is ``imbalance``."""
        return max(0.0, slot.base_us + (slot.a2a_us + slot.gemm_us) * (imbalance - 1.0))

    def fill(self, step: int, predicted_us: float) -> SlotDecision:
        """Greedy best fit of pooled tasks into a slot predicted at ``predicted_us`` (see the docstring)."""
        self.counters.slots += 1
        self.counters.predicted_us += predicted_us
        chosen: list[MovableTask] = []
        if predicted_us >= self.min_slot_us and predicted_us > 0 and self._order:
            remaining = predicted_us
            # ``_order`` is the pool in best-fit order (largest duration first): the first entry at or
            # after the position of ``remaining`` is the best task that fits.
            position = 0
            while position < len(self._order):
                position = bisect.bisect_left(self._order, (-(remaining + FIT_EPS_US), -(2**63), -(2**63)), position)
                while position < len(self._order) and self._pool[self._order[position][2]].deadline_step < step:
                    position += 1
                if position >= len(self._order):
                    break
                task = self._pool[self._order[position][2]]
                chosen.append(task)
                remaining -= task.duration_us
                self._take(task)
        if chosen:
            self.counters.slots_filled += 1
            self.counters.placed += len(chosen)
            decision = SlotDecision(step, predicted_us, tuple(chosen))
            self.counters.placed_us += decision.placed_us
            return decision
        return SlotDecision(step, predicted_us, ())

    def settle(self, decision: SlotDecision, observed_us: float) -> None:
        """Record the idle time the slot really had (measured as if nothing had been placed in it)."""
        observed = max(0.0, observed_us)
        placed = decision.placed_us if decision.tasks else 0.0
        self.counters.observed_us += observed
        self.counters.abs_error_us += abs(decision.predicted_us - observed)
        self.counters.recovered_us += min(placed, observed)
        self.counters.overrun_us += max(0.0, placed - observed)

    def due(self, step: int) -> list[MovableTask]:
        """Tasks whose deadline step has come: they leave the pool and run on the main stream now."""
        out = [self._pool[k] for k in sorted(self._pool) if self._pool[k].deadline_step <= step]
        for t in out:
            self._take(t)
        self.counters.fallbacks += len(out)
        self.counters.fallback_us += sum(t.duration_us for t in out)
        return out

    def drain(self) -> list[MovableTask]:
        """End of the iteration: everything still pooled runs now, as fallbacks."""
        out = [self._pool[k] for k in sorted(self._pool)]
        for t in out:
            self._take(t)
        self.counters.fallbacks += len(out)
        self.counters.fallback_us += sum(t.duration_us for t in out)
        return out

    def _take(self, task: MovableTask) -> None:
        del self._pool[task.task_id]
        del self._order[bisect.bisect_left(self._order, (-task.duration_us, task.deadline_step, task.task_id))]
        del self._by_deadline[bisect.bisect_left(self._by_deadline, (task.deadline_step, task.task_id, task.duration_us))]
        self._pool_bytes -= task.memory_bytes
