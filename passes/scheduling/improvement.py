"""Improving a pair schedule: forward-backward justification, critical-path swaps (tabu),
and schedules with one stream's order fixed (every order of the smaller stream, or a seeded sample).

These are the later phases of the gap-fit search (:mod:`passes.scheduling.gap_fit`).
"""

from __future__ import annotations

import bisect
import random
import struct
from collections.abc import Sequence

from passes.scheduling.generation import FlatDag, priority_order, serial_generation
from passes.scheduling.schedule import EPS


def justify(ctx: FlatDag, start: list[float], rounds: int = 3) -> list[float]:
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
        rstart = serial_generation(ctx, rorder, ctx.succ)
        rms = max(rstart[i] + dur[i] for i in range(n))
        # A task running [a, a+d) in reversed time runs [M-a-d, M-a) forward.
        back = [rms - rstart[i] - dur[i] for i in range(n)]
        fstart = serial_generation(ctx, ctx.time_order(back))
        ms = ctx.makespan(fstart)
        if ms < best_ms - EPS and ctx.meets_deadlines(fstart):
            best, best_ms = fstart, ms
        else:
            break
    return best


def _evaluate_orders(ctx: FlatDag, orders: Sequence[Sequence[int]]) -> tuple[list[float], list[float]] | None:
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


def tabu_orders(ctx: FlatDag, start: list[float], iterations: int, target: float) -> list[float]:
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


def linear_extensions(ctx: FlatDag, members: list[int], limit: int, rng: random.Random, bl: Sequence[float]) -> list[list[int]]:
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


def chain_bound(chain: Sequence[int], head: Sequence[float], tail: Sequence[float], dur: Sequence[float]) -> float:
    """Lower bound of every schedule whose stream runs ``chain`` in this order: the stream
    alone, each task starting no earlier than its head, each followed by its tail."""
    t = 0.0
    bound = 0.0
    for i in chain:
        t = max(t, head[i]) + dur[i]
        bound = max(bound, t + tail[i])
    return bound


def fixed_stream_schedules(ctx: FlatDag, chain: list[int]) -> list[list[float]]:
    """Schedules with one stream's order fixed to ``chain``.

    The chain becomes extra dependencies; every task's priority is its bottom level
    in that augmented DAG (so compute that feeds the next transfer goes first); the
    tasks are then placed by insertion. The result is valid for the real DAG, which
    has fewer constraints. (Event-driven list scheduling of the augmented DAG was
    tried too: twice the time for no measurable gain on the benchmark suite.)
    """
    n, dur = ctx.n, ctx.dur
    aug = FlatDag.__new__(FlatDag)
    for slot in FlatDag.__slots__:
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
    return [serial_generation(aug, priority_order(aug, bl))]

