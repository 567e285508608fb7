"""The partition searches the pass runs: the window search and the global one, and memory errors that
name the device that cannot fit.

``solve`` solves a problem (its candidates: usually a window around the serially balanced
partition) by MILP. ``solve_global`` searches every contiguous partition the candidates
allow: all ranges are pruned against an incumbent (typically the window optimum), then the
exact DP runs when vpp ≤ 2 (its state stays small), the MILP otherwise.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from passes.partitioning.dp import solve_dp
from passes.partitioning.memory import GIB
from passes.partitioning.milp import pruned_size, solve_milp
from passes.partitioning.problem import MemoryInfeasibleError, PartitionProblem, PartitionSolution
from passes.partitioning.pruning import best_incumbent, prune
from passes.partitioning.ranges import PartitionError, Range, all_candidates


def solve(
    problem: PartitionProblem,
    solver: str = "cbc",
    time_limit: float = 60.0,
    incumbent_plans: Sequence[Sequence[Range]] = (),
) -> PartitionSolution:
    """Solve, turning memory infeasibility into an error that names the device and the bytes."""
    try:
        return solve_milp(problem, solver, time_limit, incumbent_plans)
    except MemoryInfeasibleError:
        raise memory_error(problem, solver, time_limit) from None
    except PartitionError as err:
        if problem.memory is not None and "memory" in str(err):
            raise memory_error(problem, solver, time_limit) from None
        raise


def memory_error(problem: PartitionProblem, solver: str, time_limit: float) -> MemoryInfeasibleError:
    """Explain which device cannot fit: the best plan without the memory limit, its worst device."""
    mem = problem.memory
    assert mem is not None
    free = replace(problem, memory=None, side_bound=None)
    try:
        plan = solve_milp(free, solver if solver != "dp" else "cbc", time_limit).ranges
    except PartitionError:
        return MemoryInfeasibleError("no contiguous cover of the layers exists among the candidates")
    worst = None
    for d in range(problem.pp):
        need = mem.device_bytes(problem.pp, problem.vpp, d, [plan[d + c * problem.pp] for c in range(problem.vpp)])
        if worst is None or need - mem.capacity > worst[1] - mem.capacity:
            worst = (d, need)
    assert worst is not None
    d, need = worst
    return MemoryInfeasibleError(
        f"no partition fits in device memory: device {d} needs {need} bytes ({need / GIB:.2f} GiB) in the best "
        f"partition without the limit, but {mem.capacity} bytes ({mem.capacity / GIB:.2f} GiB) are available; "
        "raise --pp, --dp (the distributed optimizer shards over it) or --cp, recompute more (--recompute), "
        "lower the micro-batch size, or widen the candidate window"
    )


def global_problem(problem: PartitionProblem) -> PartitionProblem:
    """The same problem over every range a stage could hold (the oracle must cost any pair)."""
    return replace(problem, candidates=all_candidates(problem.num_layers, problem.stages))


def solve_global(
    problem: PartitionProblem,
    solver: str = "cbc",
    time_limit: float = 60.0,
    incumbent_plans: Sequence[Sequence[Range]] = (),
) -> PartitionSolution:
    """Optimum over every contiguous partition in ``problem.candidates`` (use ``global_problem`` for all).

    The incumbent (typically the window optimum) prunes the huge range set first. With
    vpp ≤ 2 the exact DP's state (the start layers of a device's chunks) stays small and it
    is the faster exact method; with more chunks per device the MILP runs.
    """
    start = time.perf_counter()
    inc = best_incumbent(problem, incumbent_plans)
    pruned = prune(problem, inc[0] if inc else None)
    sub = replace(problem, candidates=pruned.candidates)
    if any(not c for c in pruned.candidates):
        raise MemoryInfeasibleError("infeasible")
    if problem.vpp <= 2:
        sol = solve_dp(sub)
        sol.method = "global-dp"
        sol.stats = {"after": pruned_size(problem, pruned).as_dict(), "incumbent": inc[0] if inc else None,
                     "optimal": True}
    else:
        sol = solve_milp(sub, solver, time_limit, [inc[1]] if inc else ())
        sol.method = f"global-{sol.method}"
    sol.seconds = time.perf_counter() - start
    return sol

