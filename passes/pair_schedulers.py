"""Scheduling algorithms for one pair DAG on two resources (compute stream, comm stream).

A pair is the forward of one model chunk beside the backward of another
(:mod:`passes.pair_dag`). A schedule gives every task a start time on the one
stream its resource names; a stream runs one task at a time, a task starts
after all its predecessors finished, and a movable (wgrad) task finishes by its
deadline (default: the end of the pair). The cost of the pair is the makespan.

Three schedulers live here, all deterministic (ties broken by task name):

``gap_fit``
    Backbone first, gap fit. The *backbone* is every task that is not movable:
    the forward chain and the dgrad chain, which decide the makespan. It is
    list-scheduled event by event: whenever a stream can start something, the
    ready backbone task with the longest remaining path (bottom level) goes
    first; with look-ahead, a stream about to start a task while a more urgent
    one becomes ready shortly fills that window instead, with the most urgent
    task that fits it. Movable tasks are then back-filled: each goes into the
    earliest idle gap of its stream, after its dgrad, that holds it entirely and
    ends before its deadline; only a task no gap holds is appended at the end of
    its stream (the only way a movable task can stretch the pair). A movable task
    that would miss an explicit deadline joins the backbone, ahead of all else.
    Several priority rules are tried (bottom level, bottleneck-stream work left,
    backward first, forward first); then the order of the stream with fewer
    tasks (usually the All-to-All stream, a merge of the forward and backward
    transfer chains) is fixed in each possible way and the other stream fitted
    around it; then tabu search swaps adjacent tasks on the critical path.
    Candidates close to the best are compacted by forward-backward
    justification. The search stops as soon as a schedule reaches a lower bound
    (the simple one, or Jackson's preemptive one-stream bound with heads and
    tails), which proves it optimal.

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

Every function returns a :class:`PairSchedule`; none of them checks its own
result (that is :mod:`passes.schedule_check`'s job), but all of them only
produce schedules that respect the constraints by construction.
"""

from __future__ import annotations

import bisect
import heapq
import operator
import random
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from passes.pair_dag import BWD, FWD, PairDAG
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource

# Floating-point slack when comparing times: 1e-9 µs is far below any duration
# the cost model produces, and far above the rounding error of summed floats.
EPS = 1e-9

RESOURCES = (Resource.COMPUTE, Resource.COMM)


class SchedulingError(TesseraError):
    """A pair cannot be scheduled as asked (e.g. a movable task's deadline is unreachable)."""


@dataclass
class PairSchedule:
    """Start times for every task of ``dag`` (index-aligned with ``dag.tasks``)."""

    dag: PairDAG
    start: list[float]
    method: str
    status: str = "heuristic"  # "heuristic", or for the exact method "optimal" / "feasible" / "timeout"
    solve_seconds: float = 0.0
    bound: float | None = None  # best proven lower bound (exact method), else None
    stats: dict[str, object] = field(default_factory=dict)

    def duration(self, i: int) -> float:
        return self.dag.tasks[i].duration

    def finish(self, i: int) -> float:
        return self.start[i] + self.dag.tasks[i].duration

    @property
    def makespan(self) -> float:
        return max((self.finish(i) for i in range(len(self.dag.tasks))), default=0.0)

    def stream_order(self, resource: Resource) -> list[int]:
        """Task indices on one stream in execution order (by start, then finish, then name)."""
        idx = [i for i, t in enumerate(self.dag.tasks) if t.resource is resource]
        return sorted(idx, key=lambda i: (self.start[i], self.finish(i), self.dag.tasks[i].name))

    def order_of(self) -> list[int]:
        """Position of every task within its stream (0-based)."""
        order = [0] * len(self.dag.tasks)
        for r in RESOURCES:
            for k, i in enumerate(self.stream_order(r)):
                order[i] = k
        return order

    def ratio_to_bound(self) -> float:
        lb = self.dag.lower_bound()
        return self.makespan / lb if lb > 0 else 1.0


# ---------------------------------------------------------------------------
# Shared helpers


def bottom_levels(dag: PairDAG, weight: Callable[[int], float] | None = None) -> list[float]:
    """Longest path from each task to the end of the DAG, the task's own weight included.

    Tasks are stored in topological order, so one reverse sweep suffices.
    """
    w = weight or (lambda i: dag.tasks[i].duration)
    succ = dag.successors()
    bl = [0.0] * len(dag.tasks)
    for i in range(len(dag.tasks) - 1, -1, -1):
        bl[i] = w(i) + max((bl[s] for s in succ[i]), default=0.0)
    return bl


def heads(dag: PairDAG) -> list[float]:
    """Earliest possible start of each task: the longest path into it."""
    head = [0.0] * len(dag.tasks)
    for i, t in enumerate(dag.tasks):
        head[i] = max((head[d] + dag.tasks[d].duration for d in t.deps), default=0.0)
    return head


def one_stream_bound(
    dag: PairDAG, resource: Resource, head: Sequence[float] | None = None, bl: Sequence[float] | None = None
) -> float:
    """Lower bound from one stream alone, with heads and tails (Jackson's preemptive schedule).

    Relax everything except the stream: each of its tasks becomes available at
    its head (longest path into it) and, once finished, still needs its tail
    (longest path out of it). Preemptively running the available task with the
    longest tail is optimal for that relaxation (Jackson's rule), so
    max(completion + tail) over its tasks bounds every real schedule. It is at
    least the stream's total plus the smallest head, and often much more.
    """
    head = heads(dag) if head is None else head
    bl = bottom_levels(dag) if bl is None else bl
    members = sorted(
        (i for i, t in enumerate(dag.tasks) if t.resource is resource), key=lambda i: (head[i], dag.tasks[i].name)
    )
    remaining = {i: dag.tasks[i].duration for i in members}
    heap: list[tuple[float, int]] = []
    t = 0.0
    bound = 0.0
    k = 0
    while k < len(members) or heap:
        if not heap:
            t = max(t, head[members[k]])
        while k < len(members) and head[members[k]] <= t + EPS:
            i = members[k]
            heapq.heappush(heap, (-(bl[i] - dag.tasks[i].duration), i))
            k += 1
        neg_tail, i = heapq.heappop(heap)
        next_release = head[members[k]] if k < len(members) else float("inf")
        run = min(remaining[i], max(0.0, next_release - t))
        t += run
        remaining[i] -= run
        if remaining[i] > EPS:
            heapq.heappush(heap, (neg_tail, i))
        else:
            bound = max(bound, t - neg_tail)
    return bound


def strong_lower_bound(dag: PairDAG) -> float:
    """The reported lower bound, tightened by the one-stream bounds of both streams.

    The reported bound (max of stream totals and critical path) is what every
    schedule is compared with; this tighter one lets the heuristic stop as
    soon as it has provably found an optimum.
    """
    head, bl = heads(dag), bottom_levels(dag)
    return max([dag.lower_bound()] + [one_stream_bound(dag, r, head, bl) for r in RESOURCES])


class _Ctx:
    """The DAG as flat lists (durations, stream index, predecessors, successors), built
    once per call so the inner loops below touch no objects."""

    __slots__ = ("dag", "n", "dur", "res", "preds", "succ", "names", "movable", "deadline")

    def __init__(self, dag: PairDAG):
        self.dag = dag
        self.n = len(dag.tasks)
        self.dur = [t.duration for t in dag.tasks]
        self.res = [RESOURCES.index(t.resource) for t in dag.tasks]
        self.preds = [t.deps for t in dag.tasks]
        self.succ = dag.successors()
        self.names = [t.name for t in dag.tasks]
        self.movable = [t.movable for t in dag.tasks]
        self.deadline = [t.deadline if t.movable else None for t in dag.tasks]

    def makespan(self, start: Sequence[float]) -> float:
        return max(map(operator.add, start, self.dur), default=0.0)

    def meets_deadlines(self, start: Sequence[float]) -> bool:
        for i, dl in enumerate(self.deadline):
            if dl is not None and start[i] + self.dur[i] > dl + EPS:
                return False
        return True

    def time_order(self, start: Sequence[float]) -> list[int]:
        dur, names = self.dur, self.names
        return sorted(range(self.n), key=lambda i: (start[i], start[i] + dur[i], names[i]))


def _earliest_fit(busy: list[tuple[float, float]], ready: float, duration: float) -> float:
    """Earliest start >= ready at which [start, start + duration) overlaps no busy interval
    (``busy`` sorted, non-overlapping)."""
    # Fast path: everything ends by ``ready`` (the common case: tasks come roughly in time order).
    if not busy or busy[-1][1] <= ready + EPS:
        return ready
    t = ready
    for s, e in busy:
        if e <= t + EPS:
            continue
        if t + duration <= s + EPS:
            return t
        if e > t:
            t = e
    return t


def _occupy(busy: list[tuple[float, float]], start: float, duration: float) -> None:
    iv = (start, start + duration)
    if not busy or busy[-1] <= iv:
        busy.append(iv)
    else:
        bisect.insort(busy, iv)


def _sgs(ctx: _Ctx, order: Sequence[int], preds: Sequence[Sequence[int]] | None = None) -> list[float]:
    """Serial schedule generation with insertion: place tasks in ``order`` (a topological
    order of ``preds``), each at the earliest time after its predecessors where its stream
    has a gap."""
    preds = ctx.preds if preds is None else preds
    dur, res = ctx.dur, ctx.res
    start = [0.0] * ctx.n
    finish = [0.0] * ctx.n
    lines: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    for i in order:
        ready = 0.0
        for p in preds[i]:
            if finish[p] > ready:
                ready = finish[p]
        busy = lines[res[i]]
        d = dur[i]
        # _earliest_fit and _occupy, inlined (this loop is the hottest of the search).
        s = ready if not busy or busy[-1][1] <= ready + EPS else _earliest_fit(busy, ready, d)
        iv = (s, s + d)
        if not busy or busy[-1] <= iv:
            busy.append(iv)
        else:
            bisect.insort(busy, iv)
        start[i] = s
        finish[i] = s + d
    return start


def _priority_order(ctx: _Ctx, key: Sequence[float], preds: Sequence[Sequence[int]] | None = None) -> list[int]:
    """A topological order that always takes the ready task of highest ``key`` (ties: name)."""
    preds = ctx.preds if preds is None else preds
    succ: list[list[int]] = [[] for _ in range(ctx.n)]
    for i in range(ctx.n):
        for p in preds[i]:
            succ[p].append(i)
    missing = [len(preds[i]) for i in range(ctx.n)]
    heap = [(-key[i], ctx.names[i], i) for i in range(ctx.n) if missing[i] == 0]
    heapq.heapify(heap)
    out: list[int] = []
    while heap:
        _, _, i = heapq.heappop(heap)
        out.append(i)
        for s in succ[i]:
            missing[s] -= 1
            if missing[s] == 0:
                heapq.heappush(heap, (-key[s], ctx.names[s], s))
    return out


# ---------------------------------------------------------------------------
# Backbone-first gap-fit


def _list_schedule(ctx: _Ctx, backbone: Sequence[bool], priority: Sequence[float], lookahead: str) -> list[float]:
    """List scheduling of the backbone tasks, event by event.

    Time advances from event to event; at each event the stream that can start
    earliest takes its highest-priority ready task. A backbone task's
    predecessors outside the backbone are movable tasks placed later, so they
    are ignored here (the caller makes sure no backbone task waits for one).

    ``lookahead`` ("none", "fit" or "best-fit"): with "fit", a stream that would
    start a task while a more urgent one (higher priority) becomes ready shortly
    fills that window instead: with the most urgent ready task that fits in it
    entirely, else with the task that overruns it least when the overrun is
    shorter than the window (a small delay of the urgent task buys a busy
    stream), else it waits for the urgent task and leaves the window to the
    back-fill. "best-fit" takes the task whose duration is closest to the
    window, counting idle time left and overrun alike (one long task that just
    overruns can beat a short one that leaves most of the window idle).
    """
    n, dur, res, names, succ = ctx.n, ctx.dur, ctx.res, ctx.names, ctx.succ
    start = [0.0] * n
    finish = [0.0] * n
    free = [0.0, 0.0]
    missing = [sum(1 for d in ctx.preds[i] if backbone[d]) if backbone[i] else -1 for i in range(n)]
    ready_at = [0.0] * n
    pools: tuple[list[int], list[int]] = ([], [])  # per stream: backbone tasks whose predecessors are placed
    for i in range(n):
        if missing[i] == 0:
            pools[res[i]].append(i)
    left = sum(1 for b in backbone if b)

    rank = [(-priority[i], names[i]) for i in range(n)].__getitem__  # best first under min()

    while left:
        best = None
        for r in (0, 1):
            cands = pools[r]
            if not cands:
                continue
            t = max(free[r], min(ready_at[i] for i in cands))
            now = [i for i in cands if ready_at[i] <= t + EPS]
            chosen = min(now, key=rank)
            begin = t
            if lookahead != "none":
                p_chosen = priority[chosen]
                later = [i for i in cands if ready_at[i] > t + EPS and priority[i] > p_chosen]
                if later:
                    u = min(later, key=lambda i: (-priority[i], ready_at[i], names[i]))
                    window = ready_at[u] - t
                    fits = [i for i in now if dur[i] <= window + EPS]
                    if lookahead == "best-fit":
                        close = min(now, key=lambda i: (abs(window - dur[i]), -priority[i], names[i]))
                        if abs(window - dur[close]) < window:
                            chosen = close
                        else:
                            chosen, begin = u, ready_at[u]
                    elif fits:
                        chosen = min(fits, key=rank)
                    else:
                        over = min(now, key=lambda i: (dur[i], names[i]))
                        if dur[over] - window < window:
                            chosen = over
                        else:
                            chosen, begin = u, ready_at[u]
            key = (begin, r, -priority[chosen], names[chosen], chosen)
            if best is None or key < best:
                best = key
        assert best is not None
        t, r, _, _, i = best
        start[i] = t
        finish[i] = t + dur[i]
        free[r] = finish[i]
        pools[r].remove(i)
        left -= 1
        for s in succ[i]:
            if missing[s] > 0:
                missing[s] -= 1
                if finish[i] > ready_at[s]:
                    ready_at[s] = finish[i]
                if missing[s] == 0:
                    pools[res[s]].append(s)
    return start


def _backfill(ctx: _Ctx, start: list[float], backbone: Sequence[bool], priority: Sequence[float]) -> None:
    """Place the movable (non-backbone) tasks into idle gaps of their stream: each into
    the earliest gap after its predecessors that holds it entirely, appended at the end
    of the stream only when no gap does. Earliest-ready tasks go first."""
    dur, res = ctx.dur, ctx.res
    lines: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    placed = list(backbone)
    for i in range(ctx.n):
        if placed[i]:
            _occupy(lines[res[i]], start[i], dur[i])
    pending = [i for i in range(ctx.n) if not placed[i]]
    while pending:
        best = None
        for i in pending:
            if all(placed[d] for d in ctx.preds[i]):
                ready = max((start[d] + dur[d] for d in ctx.preds[i]), default=0.0)
                key = (ready, -priority[i], ctx.names[i], i)
                if best is None or key < best:
                    best = key
        assert best is not None, "movable tasks form a cycle"
        ready, _, _, i = best
        s = _earliest_fit(lines[res[i]], ready, dur[i])
        start[i] = s
        _occupy(lines[res[i]], s, dur[i])
        placed[i] = True
        pending.remove(i)


def _backbone_gap_fit(ctx: _Ctx, priority: Sequence[float], promoted: set[int], lookahead: str, integrated: bool) -> list[float]:
    """One backbone-first gap-fit pass.

    The backbone is every task that is not movable, plus movable tasks promoted
    because they missed their deadline when back-filled, plus (``integrated``)
    all movable tasks, which then fill windows during list scheduling.
    """
    n = ctx.n
    backbone = [integrated or not ctx.movable[i] or i in promoted for i in range(n)]
    # A backbone task that depends on a movable one (possible in a hand-written DAG)
    # pulls it into the backbone; tasks are in topological order, so sweep backwards.
    for i in range(n - 1, -1, -1):
        if backbone[i]:
            for d in ctx.preds[i]:
                backbone[d] = True
    if promoted:
        # Promoted tasks are late: they go before everything else that is ready.
        boost = max(priority) + 1.0
        priority = [p + boost if i in promoted else p for i, p in enumerate(priority)]
    start = _list_schedule(ctx, backbone, priority, lookahead)
    if not all(backbone):
        _backfill(ctx, start, backbone, priority)
    return start


def _late_tasks(ctx: _Ctx, start: Sequence[float]) -> list[int]:
    return [i for i, dl in enumerate(ctx.deadline) if dl is not None and start[i] + ctx.dur[i] > dl + EPS]


def _justify(ctx: _Ctx, start: list[float], rounds: int = 3) -> list[float]:
    """Forward-backward improvement (double justification).

    Right-justify: schedule the reversed DAG, taking tasks by latest finish first,
    which pushes every task as late as the current makespan allows; then
    left-justify by re-scheduling forward in order of the right-justified starts.
    Neither step can lengthen the schedule, and together they often close gaps.
    """
    n, dur = ctx.n, ctx.dur
    best = start
    best_ms = ctx.makespan(best)
    for _ in range(rounds):
        rorder = sorted(range(n), key=lambda i: (-(best[i] + dur[i]), -best[i], ctx.names[i]))
        rstart = _sgs(ctx, rorder, ctx.succ)
        rms = max(rstart[i] + dur[i] for i in range(n))
        # A task running [a, a+d) in reversed time runs [M-a-d, M-a) forward.
        back = [rms - rstart[i] - dur[i] for i in range(n)]
        fstart = _sgs(ctx, ctx.time_order(back))
        ms = ctx.makespan(fstart)
        if ms < best_ms - EPS and ctx.meets_deadlines(fstart):
            best, best_ms = fstart, ms
        else:
            break
    return best


def _evaluate_orders(ctx: _Ctx, orders: Sequence[Sequence[int]]) -> tuple[list[float], list[float]] | None:
    """Earliest starts when each stream runs its tasks in the given order, and each
    task's tail (longest path from its end to the end of the schedule); None when
    the stream orders contradict the dependencies (a cycle)."""
    n, dur, succ = ctx.n, ctx.dur, ctx.succ
    stream_next = [-1] * n
    indeg = [len(p) for p in ctx.preds]
    for order in orders:
        for a, b in zip(order, order[1:]):
            stream_next[a] = b
            indeg[b] += 1
    stack = [i for i in range(n) if indeg[i] == 0]
    topo: list[int] = []
    start = [0.0] * n
    while stack:
        i = stack.pop()
        topo.append(i)
        f = start[i] + dur[i]
        for j in succ[i]:
            if f > start[j]:
                start[j] = f
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
        j = stream_next[i]
        if j >= 0:
            if f > start[j]:
                start[j] = f
            indeg[j] -= 1
            if indeg[j] == 0:
                stack.append(j)
    if len(topo) != n:
        return None
    tail = [0.0] * n
    for i in reversed(topo):
        t = 0.0
        for j in succ[i]:
            if dur[j] + tail[j] > t:
                t = dur[j] + tail[j]
        j = stream_next[i]
        if j >= 0 and dur[j] + tail[j] > t:
            t = dur[j] + tail[j]
        tail[i] = t
    return start, tail


def _tabu_orders(ctx: _Ctx, start: list[float], iterations: int, target: float) -> list[float]:
    """Improve a schedule by swapping adjacent tasks on its critical path.

    The schedule is held as one task order per stream. Only a swap of two
    tasks that follow each other on the same stream *and* on a critical path
    can shorten the makespan (the job-shop neighbourhood of van Laarhoven et
    al.), so each step evaluates just those swaps, takes the best one that is
    not tabu (recently undone), and remembers the best schedule seen.
    """
    dur, names = ctx.dur, ctx.names
    succsets = [set(x) for x in ctx.succ]
    by_time = ctx.time_order(start)
    orders = [[i for i in by_time if ctx.res[i] == r] for r in (0, 1)]
    cur = _evaluate_orders(ctx, orders)
    assert cur is not None
    best_start = cur[0]
    best_ms = ctx.makespan(best_start)
    tabu: dict[tuple[int, int], int] = {}
    for it in range(iterations):
        if best_ms <= target:
            break
        st, tail = cur
        ms = ctx.makespan(st)
        tol = EPS * max(1.0, ms)
        moves = []
        for r_index, order in enumerate(orders):
            for k in range(len(order) - 1):
                a, b = order[k], order[k + 1]
                # a and b are adjacent on a critical path: both critical, b starts when a ends.
                if (
                    abs(st[a] + dur[a] + tail[a] - ms) <= tol
                    and abs(st[b] + dur[b] + tail[b] - ms) <= tol
                    and abs(st[a] + dur[a] - st[b]) <= tol
                    and b not in succsets[a]
                ):
                    moves.append((r_index, k))
        best_move = None
        for r_index, k in moves:
            order = orders[r_index]
            a, b = order[k], order[k + 1]
            order[k], order[k + 1] = b, a
            ev = _evaluate_orders(ctx, orders)
            order[k], order[k + 1] = a, b
            if ev is None:
                continue
            ms2 = ctx.makespan(ev[0])
            if tabu.get((b, a), -1) >= it and ms2 >= best_ms - EPS:
                continue  # tabu, and not good enough to override it
            key = (ms2, names[a], names[b])
            if best_move is None or key < best_move[0]:
                best_move = (key, r_index, k, ev)
        if best_move is None:
            break
        (ms2, _, _), r_index, k, ev = best_move
        order = orders[r_index]
        a, b = order[k], order[k + 1]
        order[k], order[k + 1] = b, a
        tabu[(a, b)] = it + 8  # forbid putting a back before b for a few steps
        cur = ev
        if ms2 < best_ms - EPS and ctx.meets_deadlines(ev[0]):
            best_ms, best_start = ms2, ev[0]
    return best_start


def _linear_extensions(ctx: _Ctx, members: list[int], limit: int, rng: random.Random, bl: Sequence[float]) -> list[list[int]]:
    """Orders of ``members`` (the tasks of one stream) that agree with the dependencies.

    All of them when there are at most ``limit`` (or ``limit + 1``), in
    depth-first order; otherwise ``limit`` drawn at random (seeded), the first
    always the bottom-level order.
    """
    anc = [0] * ctx.n
    for i in range(ctx.n):
        for d in ctx.preds[i]:
            anc[i] |= anc[d] | (1 << d)
    mask = {i: sum(1 << j for j in members if (anc[i] >> j) & 1) for i in members}
    if _count_extensions(members, mask, limit + 2) <= limit + 1:
        return _all_extensions(members, mask)
    # Sampling: a random order is built by repeatedly taking one of the available members
    # (all member ancestors placed), kept sorted by (-bottom level, name) so that the k-th
    # draw of the seeded generator picks the same task on every run. The available list is
    # updated incrementally: placing ``i`` only frees members that have ``i`` as ancestor.
    # Members are handled by rank in that order, so the available list is a plain sorted
    # list of ints.
    pref = sorted(members, key=lambda i: (-bl[i], ctx.names[i]))
    need = [bin(mask[i]).count("1") for i in pref]
    freed = [[r for r, j in enumerate(pref) if (mask[j] >> i) & 1] for i in pref]
    first = [r for r in range(len(pref)) if need[r] == 0]
    draws = _Draws(rng)
    # Bits to drop from a 32-bit word for a draw below n (see _Draws.below, inlined here).
    shifts = [32 - n.bit_length() for n in range(len(pref) + 1)]
    words, pos = draws.words, 0
    samples: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    insort = bisect.insort
    for k in range(limit * 3):
        missing = list(need)
        avail = list(first)
        ranks: list[int] = []
        while avail:
            if k == 0:
                r = avail.pop(0)
            else:
                n, shift = len(avail), shifts[len(avail)]
                while True:
                    if pos == len(words):
                        words, pos = draws.refill(), 0
                    v = words[pos] >> shift
                    pos += 1
                    if v < n:
                        break
                r = avail.pop(v)
            ranks.append(r)
            for j in freed[r]:
                missing[j] -= 1
                if missing[j] == 0:
                    insort(avail, j)
        key = tuple(ranks)
        if key not in seen:
            seen.add(key)
            samples.append([pref[r] for r in ranks])
            if len(samples) >= limit:
                break
    draws.pos = pos
    draws.sync()
    return samples


class _Draws:
    """``rng.randrange(n)`` draws, bit for bit, from 32-bit words generated in bulk.

    ``randrange(n)`` takes ``k = n.bit_length()`` bits from one fresh 32-bit word of the
    Mersenne Twister (the word's top ``k`` bits) and retries while the value is not
    below ``n``. Calling it costs a microsecond or so in Python, which dominated the
    stream-order sampling; here the words come from a copy of ``rng`` in chunks
    (``getrandbits(32 * m)`` holds the next ``m`` words, the first in the lowest bits)
    and :meth:`sync` finally advances ``rng`` by exactly the words used, so the caller
    sees the generator as if it had called ``randrange`` itself. A test compares the
    two draw for draw.
    """

    CHUNK = 2048

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.state = rng.getstate()
        self.copy = random.Random()
        self.copy.setstate(self.state)
        self.words: tuple[int, ...] = ()
        self.pos = 0  # next word of ``words``
        self.done = 0  # words of earlier chunks

    def refill(self) -> tuple[int, ...]:
        """The next chunk of words (the current one is used up)."""
        self.done += len(self.words)
        raw = self.copy.getrandbits(32 * self.CHUNK).to_bytes(4 * self.CHUNK, "little")
        self.words = struct.unpack(f"<{self.CHUNK}I", raw)
        self.pos = 0
        return self.words

    def below(self, n: int) -> int:
        """Like ``rng.randrange(n)`` for ``n >= 1``."""
        shift = 32 - n.bit_length()
        while True:
            if self.pos == len(self.words):
                self.refill()
            r = self.words[self.pos] >> shift
            self.pos += 1
            if r < n:
                return r

    def sync(self) -> None:
        """Leave ``rng`` where ``randrange`` would have: as many words further as were used."""
        used = self.done + self.pos
        self.rng.setstate(self.state)
        if used:
            self.rng.getrandbits(32 * used)


def _count_extensions(members: list[int], mask: dict[int, int], cap: int) -> int:
    """Number of linear extensions of ``members`` under ``mask`` (member ancestors), or
    ``cap`` when there are at least that many. Counted over down-sets (the placed
    members), each once: count(placed) = sum of count(placed + i) over available i."""
    full = sum(1 << i for i in members)
    memo: dict[int, int] = {full: 1}

    def count(placed: int) -> int:
        got = memo.get(placed)
        if got is not None:
            return got
        total = 0
        for i in members:
            if not (placed >> i) & 1 and mask[i] & ~placed == 0:
                total += count(placed | (1 << i))
                if total >= cap:
                    total = cap
                    break
        memo[placed] = total
        return total

    return count(0)


def _all_extensions(members: list[int], mask: dict[int, int]) -> list[list[int]]:
    """Every linear extension of ``members``, depth first with members in list order."""
    out: list[list[int]] = []
    prefix: list[int] = []

    def dfs(placed: int) -> None:
        if len(prefix) == len(members):
            out.append(list(prefix))
            return
        for i in members:
            if not (placed >> i) & 1 and mask[i] & ~placed == 0:
                prefix.append(i)
                dfs(placed | (1 << i))
                prefix.pop()

    dfs(0)
    return out


def _chain_bound(chain: Sequence[int], head: Sequence[float], tail: Sequence[float], dur: Sequence[float]) -> float:
    """Lower bound of every schedule whose stream runs ``chain`` in this order: the stream
    alone, each task starting no earlier than its head, each followed by its tail."""
    t = 0.0
    bound = 0.0
    for i in chain:
        t = max(t, head[i]) + dur[i]
        bound = max(bound, t + tail[i])
    return bound


def _fixed_stream_schedules(ctx: _Ctx, chain: list[int]) -> list[list[float]]:
    """Schedules with one stream's order fixed to ``chain``.

    The chain becomes extra dependencies; every task's priority is its bottom level
    in that augmented DAG (so compute that feeds the next transfer goes first); the
    tasks are then placed by insertion. The result is valid for the real DAG, which
    has fewer constraints. (Event-driven list scheduling of the augmented DAG was
    tried too: twice the time for no measurable gain on the benchmark suite.)
    """
    n, dur = ctx.n, ctx.dur
    aug = _Ctx.__new__(_Ctx)
    for slot in _Ctx.__slots__:
        setattr(aug, slot, getattr(ctx, slot))
    aug.preds = [tuple(p) for p in ctx.preds]
    aug.succ = [list(x) for x in ctx.succ]
    for a, b in zip(chain, chain[1:]):
        aug.preds[b] = aug.preds[b] + (a,)
        aug.succ[a].append(b)
    indeg = [len(aug.preds[i]) for i in range(n)]
    topo = [i for i in range(n) if indeg[i] == 0]
    k = 0
    while k < len(topo):
        for j in aug.succ[topo[k]]:
            indeg[j] -= 1
            if indeg[j] == 0:
                topo.append(j)
        k += 1
    bl = [0.0] * n
    for i in reversed(topo):
        bl[i] = dur[i] + max((bl[j] for j in aug.succ[i]), default=0.0)
    return [_sgs(aug, _priority_order(aug, bl))]


# How each priority rule is run: (name suffix, look-ahead mode, movable tasks in the backbone).
VARIANTS = (
    ("", "none", False),
    ("/lookahead", "fit", False),
    ("/integrated", "fit", True),
    ("/best-fit", "best-fit", True),
)


def gap_fit(
    dag: PairDAG,
    stream_orders: int = 256,
    tabu_steps: int = 10,
    perturbations: int = 0,
    local_search: int = 0,
    justify_window: float = 0.01,
    insertion: bool = False,
    patience: int | None = 30,
    seed: int = 0,
    time_budget_s: float | None = None,
) -> PairSchedule:
    """Backbone-first gap-fit schedule of ``dag`` (see the module docstring).

    Phases, each skipped once a schedule reaches the lower bound:

    1. priority rules (bottom level, bottleneck work left, backward first,
       forward first, and ``perturbations`` seeded random perturbations of the
       bottom level), each run three ways (backbone then back-fill; the same
       with look-ahead window filling; all tasks together with look-ahead) and
       once through insertion-based serial generation;
    2. up to ``stream_orders`` orders of the stream with fewer tasks (all of
       them when there are that few), the other stream fitted around each;
    3. ``tabu_steps`` steps of critical-path swaps on the best schedule;
    4. ``local_search`` seeded random moves of one task in the best schedule's
       order, kept when not longer.

    Candidates within ``justify_window`` of the best are improved by
    forward-backward justification. The search also stops after ``patience``
    candidates in a row that did not improve the best (None: never); on the
    benchmark suite 30 loses nothing against an unlimited search and saves a
    third of the time, 12 cuts the search before the stream-order phase and
    loses a lot. ``insertion`` adds each rule's insertion-based serial
    generation as a candidate (it rarely wins). ``seed`` makes the random parts
    reproducible, so the result is a pure function of the DAG and the options
    (unless ``time_budget_s`` is set: a budget in seconds makes the search
    stop earlier on a slower machine, trading determinism for bounded time).
    """
    t0 = time.perf_counter()
    ctx = _Ctx(dag)
    n = ctx.n
    if n == 0:
        return PairSchedule(dag, [], "gap-fit", stats={"candidates": 0, "rule": ""})
    lb = strong_lower_bound(dag)
    target = lb + EPS * max(1.0, lb)
    bl = bottom_levels(dag)
    comp_total, comm_total = dag.total(Resource.COMPUTE), dag.total(Resource.COMM)
    bottleneck = 0 if comp_total >= comm_total else 1
    # Work left on the bottleneck stream along the longest path through each task.
    bl_bottleneck = bottom_levels(dag, lambda i: ctx.dur[i] if ctx.res[i] == bottleneck else 0.0)
    scale = max(bl, default=1.0) or 1.0
    rules: list[tuple[str, list[float]]] = [
        ("bottom-level", bl),
        ("bottleneck-work", [bl[i] + bl_bottleneck[i] for i in range(n)]),
        ("backward-first", [bl[i] + (scale if dag.tasks[i].side == BWD else 0.0) for i in range(n)]),
        ("forward-first", [bl[i] + (scale if dag.tasks[i].side == FWD else 0.0) for i in range(n)]),
    ]
    rng = random.Random(seed)
    for k in range(perturbations):
        amp = 0.15 + 0.35 * (k % 4) / 3  # perturbation amplitudes from 15% to 50%
        rules.append((f"perturbed-{k}", [bl[i] * (1.0 + amp * (2 * rng.random() - 1)) for i in range(n)]))

    best: list[float] = []
    best_ms = float("inf")
    best_rule = ""
    tried = 0
    promoted: set[int] = set()

    stale = 0  # candidates since the best last improved

    def done() -> bool:
        if best_ms <= target:
            return True
        if patience is not None and stale >= patience and best:
            return True
        return time_budget_s is not None and time.perf_counter() - t0 > time_budget_s

    def consider(cand: list[float], rule: str) -> None:
        nonlocal best, best_ms, best_rule, tried, stale
        tried += 1
        stale += 1
        ms = ctx.makespan(cand)
        if ms <= best_ms * (1.0 + justify_window):
            # Justification costs two more schedule builds per round: spend it only on
            # candidates close to the best (it rarely gains more than a few percent).
            cand = _justify(ctx, cand)
            ms = ctx.makespan(cand)
        if ms < best_ms - EPS and ctx.meets_deadlines(cand):
            best, best_ms, best_rule = cand, ms, rule
            stale = 0

    for rule, prio in rules:
        for variant, lookahead, integrated in VARIANTS:
            start = _backbone_gap_fit(ctx, prio, promoted, lookahead, integrated)
            # A movable task that missed its deadline joins the backbone and the pass is
            # retried; each retry promotes at least one more task, so this ends.
            late = _late_tasks(ctx, start)
            while late and not integrated and not set(late) <= promoted:
                promoted |= set(late)
                start = _backbone_gap_fit(ctx, prio, promoted, lookahead, integrated)
                late = _late_tasks(ctx, start)
            consider(start, rule + variant)
            if done():
                break
        if done():
            break
        if insertion:
            # The same priorities through insertion-based serial generation (movable
            # tasks compete at their own bottom level) give another schedule.
            consider(_sgs(ctx, _priority_order(ctx, prio)), rule + "/insertion")
            if done():
                break

    # The hand-written template is one more candidate, so gap-fit is never worse than it.
    if not done():
        try:
            consider(list(fixed_template(dag).start), "fixed-template")
        except SchedulingError:
            pass  # the DAG lacks the layer structure the template assumes

    # Backbone by stream order: fix the order of the stream with fewer tasks (usually the
    # All-to-All stream, a merge of the forward and backward transfer chains), try every
    # such order (or a seeded sample), and fit the other stream's work around it.
    if not done() and stream_orders > 0:
        counts = [ctx.res.count(0), ctx.res.count(1)]
        fixed = 0 if counts[0] < counts[1] else 1
        members = [i for i in range(n) if ctx.res[i] == fixed]
        head = heads(dag)
        tail = [bl[i] - ctx.dur[i] for i in range(n)]
        chains = _linear_extensions(ctx, members, stream_orders, rng, bl)
        # Most stream orders are hopeless: run only those whose own bound (the fixed stream
        # alone, each task no earlier than its head, followed by its tail) can still beat
        # the best schedule, most promising first.
        bounded = sorted((_chain_bound(chain, head, tail, ctx.dur), k) for k, chain in enumerate(chains))
        for bound, k in bounded:
            if bound >= best_ms - EPS or done():
                break
            for cand in _fixed_stream_schedules(ctx, chains[k]):
                consider(cand, "stream-order")

    if not best:
        raise SchedulingError(
            f"no schedule of pair '{dag.name}' meets the deadlines of its movable tasks; "
            "relax the deadlines (they are microseconds from the start of the pair)"
        )

    # Critical-path improvement of the best schedule's stream orders.
    if not done() and tabu_steps > 0:
        consider(_tabu_orders(ctx, best, tabu_steps, target), "critical-swap")

    # Local improvement: take the best schedule's task order (by start time), move one
    # task to another place that keeps every dependency before it, rebuild by insertion,
    # and keep the result when it is not longer (sideways moves cross plateaus).
    current = ctx.time_order(best)
    current_ms = best_ms
    for _ in range(local_search):
        if done():
            break
        pos = {t: k for k, t in enumerate(current)}
        task = current[rng.randrange(n)]
        lo = max((pos[p] for p in ctx.preds[task]), default=-1) + 1
        hi = min((pos[s] for s in ctx.succ[task]), default=n) - 1
        if hi <= lo:
            continue
        rest = [t for t in current if t != task]
        new_pos = rng.randint(lo, hi)
        cand = _justify(ctx, _sgs(ctx, rest[:new_pos] + [task] + rest[new_pos:]))
        tried += 1
        ms = ctx.makespan(cand)
        if ms <= current_ms + EPS and ctx.meets_deadlines(cand):
            current, current_ms = ctx.time_order(cand), ms
            if ms < best_ms - EPS:
                best, best_ms, best_rule = cand, ms, "local-search"
    return PairSchedule(
        dag,
        best,
        "gap-fit",
        solve_seconds=time.perf_counter() - t0,
        stats={"rule": best_rule, "candidates": tried, "bound": lb},
    )


# ---------------------------------------------------------------------------
# Baselines


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

    def pick(side: str, layer: str | None, ops: Callable[[str], bool], phases: Sequence[str]) -> list[int]:
        if layer is None:
            return []
        out = []
        for phase in phases:  # dgrad before wgrad, each in the DAG's (topological) order
            out += [i for i in by_layer[(side, layer)] if _op_phase(dag.tasks[i].kind)[1] == phase and ops(_op_phase(dag.tasks[i].kind)[0])]
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
    t = max([finish[i] for i in range(n) if done[i]], default=0.0)
    # Layer by layer is not always a topological order (a hand-written DAG may make a task
    # depend on a task of a later layer): take the first task in that order whose
    # predecessors have all run, which keeps the layer order whenever it is topological.
    pending = list(rest)
    while pending:
        k = next(k for k, i in enumerate(pending) if all(done[d] for d in dag.tasks[i].deps))
        i = pending.pop(k)
        s = max([t] + [finish[d] for d in dag.tasks[i].deps])
        start[i], finish[i], done[i] = s, s + dag.tasks[i].duration, True
        t = finish[i]
    return PairSchedule(dag, start, "fixed-template", solve_seconds=time.perf_counter() - t0)


SCHEDULERS: dict[str, Callable[[PairDAG], PairSchedule]] = {
    "gap-fit": gap_fit,
    "serial": serial,
    "fixed-template": fixed_template,
}
