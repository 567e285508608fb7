"""The backbone-first gap-fit scheduler of one pair DAG on two streams (compute, comm).

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
around it; then tabu search swaps adjacent tasks on the critical path
(:mod:`passes.scheduling.improvement`). Candidates close to the best are compacted by
forward-backward justification. The search stops as soon as a schedule reaches a lower bound
(the simple one, or Jackson's preemptive one-stream bound with heads and
tails), which proves it optimal.

Deterministic (ties broken by task name); the result is not checked here (that is
:mod:`passes.scheduling.check`'s job) but respects the constraints by construction.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence

from passes.scheduling.baselines import fixed_template
from passes.scheduling.generation import FlatDag, earliest_fit, occupy, priority_order, serial_generation
from passes.scheduling.improvement import (
    chain_bound,
    fixed_stream_schedules,
    justify,
    linear_extensions,
    tabu_orders,
)
from passes.scheduling.pair_dag import BWD, FWD, PairDAG
from passes.scheduling.schedule import EPS, PairSchedule, SchedulingError, bottom_levels, heads, strong_lower_bound
from tessera_ir.kinds import Resource


def _list_schedule(ctx: FlatDag, backbone: Sequence[bool], priority: Sequence[float], lookahead: str) -> list[float]:
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


def _backfill(ctx: FlatDag, start: list[float], backbone: Sequence[bool], priority: Sequence[float]) -> None:
    """Place the movable (non-backbone) tasks into idle gaps of their stream: each into
    the earliest gap after its predecessors that holds it entirely, appended at the end
    of the stream only when no gap does. Earliest-ready tasks go first."""
    dur, res = ctx.dur, ctx.res
    lines: tuple[list[tuple[float, float]], list[tuple[float, float]]] = ([], [])
    placed = list(backbone)
    for i in range(ctx.n):
        if placed[i]:
            occupy(lines[res[i]], start[i], dur[i])
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
        s = earliest_fit(lines[res[i]], ready, dur[i])
        start[i] = s
        occupy(lines[res[i]], s, dur[i])
        placed[i] = True
        pending.remove(i)


def _backbone_gap_fit(ctx: FlatDag, priority: Sequence[float], promoted: set[int], lookahead: str, integrated: bool) -> list[float]:
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


def _late_tasks(ctx: FlatDag, start: Sequence[float]) -> list[int]:
    return [i for i, dl in enumerate(ctx.deadline) if dl is not None and start[i] + ctx.dur[i] > dl + EPS]



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
    ctx = FlatDag(dag)
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
            cand = justify(ctx, cand)
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
            consider(serial_generation(ctx, priority_order(ctx, prio)), rule + "/insertion")
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
        chains = linear_extensions(ctx, members, stream_orders, rng, bl)
        # Most stream orders are hopeless: run only those whose own bound (the fixed stream
        # alone, each task no earlier than its head, followed by its tail) can still beat
        # the best schedule, most promising first.
        bounded = sorted((chain_bound(chain, head, tail, ctx.dur), k) for k, chain in enumerate(chains))
        for bound, k in bounded:
            if bound >= best_ms - EPS or done():
                break
            for cand in fixed_stream_schedules(ctx, chains[k]):
                consider(cand, "stream-order")

    if not best:
        raise SchedulingError(
            f"no schedule of pair '{dag.name}' meets the deadlines of its movable tasks; "
            "relax the deadlines (they are microseconds from the start of the pair)"
        )

    # Critical-path improvement of the best schedule's stream orders.
    if not done() and tabu_steps > 0:
        consider(tabu_orders(ctx, best, tabu_steps, target), "critical-swap")

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
        cand = justify(ctx, serial_generation(ctx, rest[:new_pos] + [task] + rest[new_pos:]))
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
