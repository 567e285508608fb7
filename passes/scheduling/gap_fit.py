"""The pair scheduler: backbone-first gap-fit schedules, improved by local search on stream orders.

The search runs in C++ (``passes/scheduling/csrc/pair_search.cpp``, the extension
:mod:`passes.scheduling._search`); this module hands it a pair DAG and turns its start times
into a :class:`~passes.scheduling.schedule.PairSchedule`.

1. Constructive schedules. *Backbone first, gap fit*: the backbone (every task that is not
   movable: the forward chain and the dgrad chain) is list-scheduled event by event, the
   ready task with the longest remaining path first; with look-ahead, a stream about to
   start a task while a more urgent one becomes ready shortly fills that window instead.
   Movable tasks (wgrad) are then back-filled into the earliest idle gap of their stream
   that holds them, before their deadline. Four priority rules (bottom level, bottleneck
   work left, backward first, forward first), each with and without look-ahead and with all
   tasks in one list, plus serial generation with insertion and Megatron-Core's fixed
   combined-1F1B template (:func:`~passes.scheduling.baselines.fixed_template`), so the
   result is never worse than the template. Each is compacted by forward-backward
   justification. Then each rule once more with *look-ahead by bound*: when the most urgent
   task is not ready yet, the stream starts the ready task whose start now gives the lowest
   lower bound on the makespan (the stream's work left, the task's and the urgent task's
   paths to the end) if that is below the bound of waiting. The greedy look-ahead waits
   rather than start a task much longer than the window, which is wrong where the stream is
   the bottleneck: its idle time adds to its end, while a long weight gradient started now
   (the LM head's, in a chunk holding the head) delays only tasks whose paths have room.
2. Local search, from each of the best few constructive schedules, on the schedule's two
   stream orders (a schedule is the earliest start of every task given the dependencies and
   one task order per stream):

   - *critical reinsertion*: a task on the critical path is taken out of its stream's order
     and put back where the makespan drops most, until no such move is left (a place whose
     lower bound -- the schedule without the task on its stream, and the path through the task
     between its new neighbours -- cannot beat the best move so far is not evaluated);
   - *merge search*: the stream with fewer tasks (the All-to-All stream, a merge of the
     forward and the backward transfer chains) gets a new order (a task moved, or the two
     chains spread evenly into each other at several phases, each side's chain into the
     other's, so either side may lead), and the other stream is re-fitted around it by list
     scheduling with look-ahead, the task with the longest tail first. This is where the
     pairs that balance computation and communication are won: their optimum keeps the
     All-to-All stream busy with one side's transfer while the other side computes, which a
     greedy order rarely finds. On a short transfer stream (at most 12 tasks), when every
     single move is cut by the bound (none can beat the current schedule), the step tries two
     moves at once: a long transfer of one side may have to wait behind several of the other
     side's while a later one of its own moves the other way, and either move alone delays the
     critical chain.

   The two alternate while they improve. The look-ahead-by-bound schedules are kept apart:
   the local search runs from the best few other starting points as before and then once
   more from the best of them when it beats every other start, so adding them never makes a
   result worse.
3. *Forward feed first*, only where the best schedule so far starts no transfer at time 0
   (the backward opens with a long computation, the LM head's dgrad, before its first
   transfer): the rule that puts the forward's tasks up to its first transfer ahead of
   everything else, under each look-ahead variant, and the local search from each of those
   schedules. The optimum of such a pair starts the forward's transfer while the head
   computes; every priority rule above starts the head first, and no single move of the
   local search gets from there to it. Searched last, so no result gets worse.
4. *Delayed weight gradient*, unless at the lower bound, where the best schedule's longest
   movable compute task (the LM head's weight gradient, in a chunk holding the head) holds up
   the next task on its stream (that task's dependencies were done before it ends): the local
   search from the best schedule with that task moved one to four places later in the compute
   order. The constructive rules start it in the first idle window, which it overruns, so the
   next layer's dgrad -- and the transfer chain behind it -- waits; moved alone it only moves
   the wait, and the optimum also moves the short tasks around it, which the search from there
   does. Only the best schedule can change, and only for the better.
5. For a pair whose compute stream has the more work, unless already at the lower bound: the
   local search once more from the best schedule, each merge-search fit list-scheduling the
   compute stream both with the greedy look-ahead and with look-ahead by bound and keeping the
   shorter. The greedy fit leaves the compute stream idle rather than start a long weight
   gradient in a wait, which in a compute-bound pair adds straight to the makespan. Only the
   best schedule can change, and only for the better; other pairs pay nothing.
6. Last, unless at the lower bound, on a transfer stream of at most 32 tasks: every order of the
   best schedule's transfer stream with two swaps of neighbouring tasks at once (at two places),
   the compute stream re-fitted around
   each; the shortest that beats the best schedule replaces it, and the local search runs again
   from there. Where a transfer of each side must overtake one of the other side's at two places
   (the backward's combine ahead of the forward's, and its dispatch ahead of the forward's next),
   each swap alone holds up a chain the other frees, so no single move helps. Only the best
   schedule can change, and only for the better.

The merge search and the phases after it ask for the fit around the same transfer order again
and again (about seven asks in eight on make demo's pairs); each order is fitted once per search
and the answer kept, and a critical reinsertion from orders already searched from is replayed,
which changes no schedule.

The search stops as soon as the makespan reaches the lower bound (the busier stream, the
critical path, Jackson's preemptive bound of each stream with heads and tails), which proves
it optimal. It is deterministic: ties go to the lower task number (the DAG's order), there
is no randomness and no time budget, and the extension is built without floating-point
contraction, so the same DAG gives the same schedule on every machine.
:data:`SCHEDULER_VERSION` names this exact search (its sources and its effort); cached
schedules are keyed by it.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from passes.scheduling.baselines import fixed_template
from passes.scheduling.check import ScheduleError, check_pair_schedule
from passes.scheduling.pair_dag import BWD, PairDAG
from passes.scheduling.schedule import RESOURCES, PairSchedule, SchedulingError, left_shift, priority_order
from support.extensions import load_extension

# TESSERA_SEARCH_EXTENSION names another build of the extension (the sanitizer build `make test`
# runs the scheduling tests against); normally the package's own.
if TYPE_CHECKING:
    from passes.scheduling import _search
else:
    _search = load_extension("passes.scheduling._search", "TESSERA_SEARCH_EXTENSION")


@dataclass(frozen=True)
class SearchEffort:
    """How hard the local search tries; every limit counts steps, not time."""

    starts: int = 4  # constructive schedules the local search starts from
    rounds: int = 3  # alternations of critical reinsertion and merge search per start
    merge_iterations: int = 15  # steps of one merge search
    merge_patience: int = 8  # merge steps without a better schedule before giving up
    merge_phases: int = 4  # evenly spread merges tried as starting points
    merge_span: int = 0  # how far one merge step may move a task (0: anywhere)
    reinsert_rounds: int = 200  # improving moves of one critical reinsertion


DEFAULT_EFFORT = SearchEffort()


# The Python modules whose code decides a schedule: this driver, the template it starts from,
# the exact solvers, the schedule helpers and the DAG itself (their whole sources, helpers
# included, so no change to them can leave a cached schedule stale).
_VERSIONED_SOURCES = ("gap_fit.py", "baselines.py", "schedule.py", "pair_dag.py", "exact.py", "cpsat.py")


def _version() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(_search.SOURCE_SHA256.encode())
    for name in _VERSIONED_SOURCES:
        digest.update(name.encode() + b"\0" + (here / name).read_bytes())
    digest.update(repr(asdict(DEFAULT_EFFORT)).encode())
    return digest.hexdigest()[:16]


def native_arrays(dag: PairDAG) -> tuple[list[float], list[int], list[list[int]]]:
    """The DAG as the extension reads it: durations, stream numbers (0 compute, 1 comm), dependencies."""
    return (
        [t.duration for t in dag.tasks],
        [RESOURCES.index(t.resource) for t in dag.tasks],
        [list(t.deps) for t in dag.tasks],
    )


def strong_lower_bound(dag: PairDAG) -> float:
    """No schedule of ``dag`` is shorter: the busier stream, the critical path, and each stream's
    Jackson preemptive bound with heads and tails (at least ``dag.lower_bound()``)."""
    if not dag.tasks:
        return 0.0
    return max(dag.lower_bound(), float(_search.lower_bound(*native_arrays(dag))))


def gap_fit(dag: PairDAG, effort: SearchEffort = DEFAULT_EFFORT) -> PairSchedule:
    """The best schedule of ``dag`` the search finds (see the module docstring).

    Raises :class:`SchedulingError` when no schedule meets the deadlines of the movable tasks.
    """
    t0 = time.perf_counter()
    if not dag.tasks:
        return PairSchedule(dag, [], "gap-fit", stats={"rule": "", "candidates": 0})
    initial: list[list[float]] = []
    try:
        initial.append(fixed_template(dag).start)
    except SchedulingError:
        pass  # the DAG lacks the layer structure the template assumes
    if any(t.movable and t.deadline is not None for t in dag.tasks):
        # The backward side alone, each stream in DAG order, the forward after it: it meets every
        # deadline no earlier than that side's own finishes (what wgrad-deadlines guarantees), so
        # the search starts from a schedule that meets them where its greedy rules may not.
        # Only where that order is topological (no backward task waits for a forward one, as in
        # every pair a plan builds), the result checks out, and no task takes no time: the search
        # reads a given schedule back as one order per stream, sorted by start, which ties between
        # zero-length tasks could scramble.
        order = sorted(range(len(dag.tasks)), key=lambda i: (dag.tasks[i].side != BWD, i))
        rank = {i: k for k, i in enumerate(order)}
        if all(t.duration > 0 for t in dag.tasks) and all(
            rank[d] < rank[i] for i, t in enumerate(dag.tasks) for d in t.deps
        ):
            start = left_shift(dag, [float(rank[i]) for i in range(len(dag.tasks))])
            try:
                check_pair_schedule(PairSchedule(dag, start, "backward-first"), prove=False)
                initial.append(start)
            except ScheduleError:
                pass
    durations, streams, deps = native_arrays(dag)
    try:
        start, stats = _search.search(
            durations, streams, deps,
            [1 if t.side == BWD else 0 for t in dag.tasks],
            [t.movable for t in dag.tasks],
            [t.deadline if t.movable else None for t in dag.tasks],
            initial,
            effort.merge_iterations, effort.merge_patience, effort.merge_phases, effort.rounds,
            effort.reinsert_rounds, effort.starts, effort.merge_span,
        )
    except RuntimeError as err:
        raise SchedulingError(
            f"no schedule of pair '{dag.name}' meets the deadlines of its movable tasks ({err}); "
            "relax the deadlines (they are microseconds from the start of the pair)"
        ) from None
    found = PairSchedule(dag, list(start), "gap-fit", solve_seconds=time.perf_counter() - t0, stats=dict(stats))
    try:
        check_pair_schedule(found, prove=False)
    except ScheduleError:
        # Tasks that take no time can tie with their dependencies in the search's stream orders
        # (it orders by start); re-time the schedule in a dependency order that follows it.
        found.start = _retimed_in_dependency_order(dag, found.start)
        check_pair_schedule(found, prove=False)
    return found


def _retimed_in_dependency_order(dag: PairDAG, start: list[float]) -> list[float]:
    """Each task as early as its dependencies and its stream allow, taken in the dependency order
    that picks the ready task the given ``start`` times run first."""
    order = priority_order(
        [t.name for t in dag.tasks], [-x for x in start], [t.deps for t in dag.tasks]
    )
    free = {r: 0.0 for r in RESOURCES}
    out = [0.0] * len(dag.tasks)
    for i in order:
        task = dag.tasks[i]
        out[i] = max([free[task.resource]] + [out[d] + dag.tasks[d].duration for d in task.deps])
        free[task.resource] = out[i] + task.duration
    return out


SCHEDULER_VERSION = _version()
