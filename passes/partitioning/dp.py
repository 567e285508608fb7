"""An exact dynamic program for the partition problem (min bottleneck, then min total).

The objective is ``max_d g_d`` where ``g_d`` depends only on the ranges of device ``d``'s
chunks. Walk the devices in order; the state is the vector of start layers of the current
device's chunks (``vpp`` numbers). The chain constraint links chunk c of device pp−1 to
chunk c+1 of device 0, so the start layers of stages pp, 2pp, ... are fixed in an outer
loop. Phase 1 minimises the max, phase 2 the total among plans whose every device stays
within the phase-1 optimum; both are exact because max and sum decompose over devices.
The state space is exponential in vpp: the DP is meant for vpp=1 (a plain chain), window
searches and test-sized problems; the MILP (``milp``) scales.
"""

from __future__ import annotations

import itertools

from passes.partitioning.problem import PartitionProblem, PartitionSolution
from passes.partitioning.ranges import REL_TOL, PartitionError, Range, check_cover


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
