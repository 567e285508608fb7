"""Layer ranges: the serially balanced partition, candidate windows, and which ranges can form a cover.

Vocabulary:

- A *range* ``(first, last)`` is a contiguous, inclusive run of decoder layers.
- There are ``S = pp·vpp`` virtual stages; interleaved placement puts virtual stage ``s``
  on device ``s mod pp`` as its chunk ``s // pp``. A *cover* gives every stage one
  non-empty range, in order, contiguous, from the first decoder layer to the last.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera_ir.errors import TesseraError

Range = tuple[int, int]

# Relative slack used when comparing float objectives between solvers.
REL_TOL = 1e-9


class PartitionError(TesseraError):
    """The partition problem is malformed or has no solution."""


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
