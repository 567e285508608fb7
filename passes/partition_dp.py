"""The partition problem as plain data, the serially balanced partition, and an exact dynamic program.

Vocabulary:

- A *range* ``(first, last)`` is a contiguous, inclusive run of decoder layers.
- There are ``S = pp·vpp`` virtual stages; interleaved placement puts virtual stage ``s``
  on device ``s mod pp`` as its chunk ``s // pp``.
- A *meeting* ``(sf, sb)`` on device ``d``: in interleaved 1F1B's steady state the
  forward of stage ``sf`` runs beside the backward of stage ``sb`` (both on ``d``). The
  post-overlap cost of that pair is what the device spends per steady-state step, so a
  plan's *bottleneck* is its worst meeting pair, and its *total* the sum over meetings.

Which stage pairs meet (``meeting_stages``): device ``d`` runs ``W`` warm-up forwards,
then step ``k`` pairs forward number ``k+W`` with backward number ``k``. Forwards visit
chunks in groups of ``pp`` micro-batches (chunk ``(i // pp) mod vpp``), backwards the same
groups in reverse chunk order. Whether the forward and backward groups are in phase
depends on ``W mod pp``: device 0 with pp=4, vpp=2 has W=10, so steps 0-1 pair chunk 0
with chunk 1, steps 2-3 chunk 1 with 1, 4-5 chunk 1 with 0, 6-7 chunk 0 with 0 — every
combination, a chunk with itself included; device 1 has W=8 = 2·pp, exactly out of
phase, so chunk 0 only meets chunk 1 and back; the last device has W=(vpp−1)·pp, in
phase, so with vpp=2 each chunk only ever meets itself. We simulate the schedule for the
configured micro-batch count, so each device gets exactly the combinations it runs.

The exact DP (``solve_dp``): the objective is ``max_d g_d`` where ``g_d`` depends only
on the ranges of device ``d``'s chunks. Walk the devices in order; the state is the
vector of start layers of the current device's chunks (``vpp`` numbers). The chain
constraint links chunk c of device pp−1 to chunk c+1 of device 0, so the start layers
of stages pp, 2pp, ... are fixed in an outer loop. Phase 1 minimises the max, phase 2
the total among plans whose every device stays within the phase-1 optimum; both are
exact because max and sum decompose over devices. The state space is exponential in
vpp: the DP is meant for vpp=1 (a plain chain), window searches and test-sized problems;
the MILP in ``passes.partition`` scales.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from passes.memory_model import backward_chunk, device_peak_bytes, forward_chunk, warmup_forwards
from tessera_ir.errors import TesseraError

Range = tuple[int, int]
CostFn = Callable[[int, Range, int, Range], float]  # (fwd stage, fwd range, bwd stage, bwd range) -> µs

# Relative slack used when comparing float objectives between solvers.
REL_TOL = 1e-9


class PartitionError(TesseraError):
    """The partition problem is malformed or has no solution."""


def meeting_chunks(pp: int, vpp: int, microbatches: int, device: int) -> list[tuple[int, int]]:
    """(forward chunk, backward chunk) combinations that meet in ``device``'s steady state."""
    total = microbatches * vpp
    warm = warmup_forwards(pp, vpp, microbatches, device)
    seen: set[tuple[int, int]] = set()
    for k in range(total - warm):
        seen.add((forward_chunk(k + warm, pp, vpp), backward_chunk(k, pp, vpp)))
    if not seen:
        # No steady state (fewer micro-batches than warm-up slots): every chunk still runs its
        # forward and backward back to back at the turn of the schedule; cost each chunk alone.
        seen = {(c, c) for c in range(vpp)}
    return sorted(seen)


def meeting_stages(pp: int, vpp: int, microbatches: int) -> dict[int, list[tuple[int, int]]]:
    """Per device, the (forward stage, backward stage) pairs that meet in the steady state."""
    return {
        d: [(d + cf * pp, d + cb * pp) for cf, cb in meeting_chunks(pp, vpp, microbatches, d)] for d in range(pp)
    }


@dataclass
class MemorySpec:
    """Memory data for the problem: per-stage static/activation bytes of a range and the device capacity."""

    static: Callable[[int, Range], int]  # weights + grads + optimizer state of a stage holding the range
    activation: Callable[[int, Range], int]  # activations one micro-batch of the range keeps alive
    vectors: dict[int, list[tuple[int, ...]]]  # per device, Pareto-maximal per-chunk in-flight counts
    capacity: int  # bytes per device
    wgrad_headroom: bool = True

    def device_bytes(self, pp: int, vpp: int, device: int, ranges: Sequence[Range]) -> int:
        """Peak bytes of ``device`` when its chunks hold ``ranges`` (chunk order)."""
        stages = [device + c * pp for c in range(vpp)]
        static = [self.static(s, r) for s, r in zip(stages, ranges)]
        act = [self.activation(s, r) for s, r in zip(stages, ranges)]
        return device_peak_bytes(static, act, self.vectors[device], self.wgrad_headroom)


@dataclass
class PartitionProblem:
    num_layers: int
    pp: int
    vpp: int
    candidates: list[list[Range]]  # per virtual stage
    meets: dict[int, list[tuple[int, int]]]  # per device: (fwd stage, bwd stage)
    cost: CostFn
    memory: MemorySpec | None = None
    # Optional decomposable lower bound: cost(f, a, g, b) >= side_bound(f, a, "fwd") + side_bound(g, b, "bwd")
    # for every pair (e.g. the two sides' compute totals: a pair cannot finish before its compute stream has
    # run everything). Pruning uses it to skip pairs without costing them; a global search needs it.
    side_bound: Callable[[int, Range, str], float] | None = None
    _cache: dict[tuple[int, Range, int, Range], float] = field(default_factory=dict, repr=False)

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

    def pair_cost(self, sf: int, rf: Range, sb: int, rb: Range) -> float:
        key = (sf, rf, sb, rb)
        if key not in self._cache:
            self._cache[key] = float(self.cost(sf, rf, sb, rb))
        return self._cache[key]

    def device_cost(self, device: int, chosen: dict[int, Range]) -> tuple[float, float]:
        """(worst, sum) of the device's meeting pair costs for the chosen ranges."""
        costs = [self.pair_cost(sf, chosen[sf], sb, chosen[sb]) for sf, sb in self.meets[device]]
        return max(costs, default=0.0), sum(costs)

    def evaluate(self, ranges: Sequence[Range]) -> tuple[float, float]:
        """(bottleneck, total) of a full partition, one range per stage."""
        chosen = dict(enumerate(ranges))
        worst, total = 0.0, 0.0
        for d in range(self.pp):
            w, t = self.device_cost(d, chosen)
            worst, total = max(worst, w), total + t
        return worst, total

    def memory_ok(self, ranges: Sequence[Range]) -> bool:
        if self.memory is None:
            return True
        return all(
            self.memory.device_bytes(self.pp, self.vpp, d, [ranges[d + c * self.pp] for c in range(self.vpp)])
            <= self.memory.capacity
            for d in range(self.pp)
        )


@dataclass
class PartitionSolution:
    ranges: list[Range]
    bottleneck: float
    total: float
    method: str
    seconds: float = 0.0
    stats: dict[str, object] = field(default_factory=dict)


def check_cover(ranges: Sequence[Range], num_layers: int) -> None:
    """Raise unless ``ranges`` are non-empty, contiguous, in order and cover 0..num_layers-1."""
    expected = 0
    for s, (first, last) in enumerate(ranges):
        if first != expected or last < first:
            raise PartitionError(f"stage {s} holds layers {first}..{last}; expected a non-empty range starting at {expected}")
        expected = last + 1
    if expected != num_layers:
        raise PartitionError(f"the stages cover layers 0..{expected - 1}, the model has {num_layers} decoder layers")


def balanced_partition(costs: Sequence[float], stages: int, first_extra: float = 0.0, last_extra: float = 0.0) -> list[Range]:
    """The serially balanced partition: contiguous, non-empty ranges minimising the largest stage cost.

    Stage cost = sum of its layers' serial costs, plus ``first_extra`` (embedding) on the first
    stage and ``last_extra`` (LM head and loss) on the last. Among min-max optima we take
    the one with the smallest sum of squared stage costs (the most even one), found by a
    second DP restricted to stages within the optimum — so the result is well defined.
    """
    n = len(costs)
    if n < stages:
        raise PartitionError(
            f"{n} decoder layers cannot fill {stages} virtual stages (pp×vpp); lower --pp or --vpp"
        )
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def stage_cost(s: int, i: int, j: int) -> float:  # layers i..j-1
        extra = (first_extra if s == 0 else 0.0) + (last_extra if s == stages - 1 else 0.0)
        return prefix[j] - prefix[i] + extra

    inf = float("inf")

    def run(limit: float | None) -> tuple[list[list[float]], list[list[int]]]:
        # best[s][j]: best objective covering layers 0..j-1 with stages 0..s; arg: where stage s starts.
        best = [[inf] * (n + 1) for _ in range(stages)]
        arg = [[-1] * (n + 1) for _ in range(stages)]
        for j in range(1, n - stages + 2):
            c = stage_cost(0, 0, j)
            if limit is None:
                best[0][j] = c
            elif c <= limit:
                best[0][j] = c * c
        for s in range(1, stages):
            for j in range(s + 1, n - stages + s + 2):
                for i in range(s, j):
                    prev = best[s - 1][i]
                    if prev == inf:
                        continue
                    c = stage_cost(s, i, j)
                    if limit is None:
                        value = max(prev, c)
                    elif c <= limit:
                        value = prev + c * c
                    else:
                        continue
                    if value < best[s][j]:
                        best[s][j], arg[s][j] = value, i
        return best, arg

    best, _ = run(None)
    optimum = best[stages - 1][n]
    best, arg = run(optimum * (1 + REL_TOL) + 1e-12)
    ranges: list[Range] = []
    j = n
    for s in range(stages - 1, 0, -1):
        i = arg[s][j]
        ranges.append((i, j - 1))
        j = i
    ranges.append((0, j - 1))
    return ranges[::-1]


def solve_dp(problem: PartitionProblem) -> PartitionSolution:
    """Exact lexicographic optimum (min bottleneck, then min total) by the device-by-device DP."""
    pp, vpp, n = problem.pp, problem.vpp, problem.num_layers
    by_first: list[dict[int, list[Range]]] = []
    for cands in problem.candidates:
        table: dict[int, list[Range]] = {}
        for r in cands:
            table.setdefault(r[0], []).append(r)
        by_first.append(table)

    # Device tuples are evaluated once per (device, tuple) and reused by both phases.
    tuple_cost: dict[tuple[int, tuple[Range, ...]], tuple[float, float] | None] = {}

    def device_eval(d: int, ranges: tuple[Range, ...]) -> tuple[float, float] | None:
        key = (d, ranges)
        if key not in tuple_cost:
            chosen = {d + c * pp: r for c, r in enumerate(ranges)}
            ok = problem.memory is None or problem.memory.device_bytes(pp, vpp, d, ranges) <= problem.memory.capacity
            tuple_cost[key] = problem.device_cost(d, chosen) if ok else None
        return tuple_cost[key]

    def run(fixed: tuple[int, ...], limit: float | None) -> tuple[float, list[Range]] | None:
        start = (0, *fixed)
        goal = (*fixed, n)
        layer: dict[tuple[int, ...], tuple[float, list[tuple[Range, ...]]]] = {start: (0.0, [])}
        for d in range(pp):
            nxt: dict[tuple[int, ...], tuple[float, list[tuple[Range, ...]]]] = {}
            for state, (value, path) in layer.items():
                options = [by_first[d + c * pp].get(state[c], []) for c in range(vpp)]
                for combo in itertools.product(*options):
                    ev = device_eval(d, combo)
                    if ev is None:
                        continue
                    worst, total = ev
                    if limit is None:
                        new_value = max(value, worst)
                    elif worst <= limit:
                        new_value = value + total
                    else:
                        continue
                    new_state = tuple(r[1] + 1 for r in combo)
                    if new_state not in nxt or new_value < nxt[new_state][0]:
                        nxt[new_state] = (new_value, [*path, combo])
            layer = nxt
        if goal not in layer:
            return None
        value, path = layer[goal]
        ranges = [path[s % pp][s // pp] for s in range(pp * vpp)]
        return value, ranges

    fixed_options = [sorted(by_first[c * pp]) for c in range(1, vpp)]
    best: tuple[float, list[Range]] | None = None
    feasible_fixed = []
    for fixed in itertools.product(*fixed_options):
        if list(fixed) != sorted(fixed):
            continue
        result = run(fixed, None)
        if result is not None:
            feasible_fixed.append(fixed)
            if best is None or result[0] < best[0]:
                best = result
    if best is None:
        raise PartitionError("no contiguous cover of the layers by the candidates satisfies the memory limits")
    limit = best[0] * (1 + REL_TOL) + 1e-12
    best_total: tuple[float, list[Range]] | None = None
    for fixed in feasible_fixed:
        result = run(fixed, limit)
        if result is not None and (best_total is None or result[0] < best_total[0]):
            best_total = result
    assert best_total is not None  # the phase-1 optimum itself satisfies the limit
    ranges = best_total[1]
    check_cover(ranges, n)
    bottleneck, total = problem.evaluate(ranges)
    return PartitionSolution(ranges, bottleneck, total, method="dp")


def window_candidates(boundaries: Sequence[int], num_layers: int, window: int) -> list[list[Range]]:
    """Ranges per stage whose start and end boundaries lie within ``window`` layers of the given ones.

    ``boundaries[s]`` is the first layer of stage s (``boundaries[0] == 0``). The first stage
    always starts at 0 and the last always ends at the last layer. Ranges that cannot be part
    of any contiguous cover are dropped (see ``reachable``).
    """
    stages = len(boundaries)
    ends = [*boundaries[1:], num_layers]
    out: list[list[Range]] = []
    for s in range(stages):
        firsts = [0] if s == 0 else range(boundaries[s] - window, boundaries[s] + window + 1)
        stops = [num_layers] if s == stages - 1 else range(ends[s] - window, ends[s] + window + 1)
        ranges = [(i, j - 1) for i in firsts for j in stops if 0 <= i < j <= num_layers]
        out.append(sorted(set(ranges)))
    return reachable(out, num_layers)


def all_candidates(num_layers: int, stages: int, max_len: int | None = None) -> list[list[Range]]:
    """Every range each stage could hold in a cover with at least one layer per stage."""
    out = []
    for s in range(stages):
        lo, hi = s, num_layers - stages + s  # earlier stages need >= s layers, later ones the rest
        out.append(
            [(i, j) for i in range(lo, hi + 1) for j in range(i, hi + 1) if max_len is None or j - i + 1 <= max_len]
        )
    return reachable(out, num_layers)


def reachable(candidates: Sequence[Sequence[Range]], num_layers: int) -> list[list[Range]]:
    """Keep the ranges that belong to at least one contiguous cover of 0..num_layers-1.

    Forward pass: the ends reachable from layer 0; backward pass: the starts from which the
    remaining stages can reach the last layer. A range survives when its start is reachable
    from the left and its end continues to the right.
    """
    stages = len(candidates)
    left_ok: list[set[Range]] = []
    frontier = {0}
    for s in range(stages):
        keep = {r for r in candidates[s] if r[0] in frontier}
        left_ok.append(keep)
        frontier = {r[1] + 1 for r in keep}
    result: list[list[Range]] = [[] for _ in range(stages)]
    needed = {num_layers}
    for s in range(stages - 1, -1, -1):
        keep = {r for r in left_ok[s] if r[1] + 1 in needed}
        result[s] = sorted(keep)
        needed = {r[0] for r in keep}
    return result
