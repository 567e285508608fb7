"""Exact pair scheduling: CP-SAT, the reference, or the MILP that cross-checks it.

``exact(dag, solver="cpsat")`` is what ``overlap-schedule{method=exact}``, the bottleneck
refinement and the benchmarks call. ``solver`` is ``cpsat`` (:mod:`passes.scheduling.cpsat`,
deterministic) or a MILP solver, ``highs`` or ``cbc`` (:mod:`passes.scheduling.milp`,
wall-clock limited). Both start from a known schedule (the gap-fit heuristic's unless given)
and return it unchanged when it already meets the lower bound (``shortcut``).
"""

from __future__ import annotations

from typing import Literal, get_args

from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import PairSchedule, SchedulingError

ExactSolver = Literal["cpsat", "highs", "cbc"]
EXACT_SOLVERS: tuple[str, ...] = get_args(ExactSolver)


def exact(
    dag: PairDAG,
    time_limit_s: float = 10.0,
    solver: str = "cpsat",
    upper_bound: PairSchedule | None = None,
    shortcut: bool = True,
) -> PairSchedule:
    """Optimal (or best found within ``time_limit_s``) schedule of ``dag`` with ``solver``.

    ``status`` says ``optimal`` only when proven; ``bound`` is the proven lower bound.
    Without ``shortcut`` the MILP builds and solves its model even when the known schedule
    meets the lower bound (benchmarks time the solver itself that way); CP-SAT always
    skips the search then, since nothing is left to prove.
    """
    if solver == "cpsat":
        from passes.scheduling.cpsat import cpsat

        return cpsat(dag, time_limit_s, upper_bound)
    if solver in ("highs", "cbc"):
        from passes.scheduling.milp import milp

        return milp(dag, time_limit_s, solver, upper_bound, shortcut)
    raise SchedulingError(f"unknown exact solver '{solver}'; use one of {', '.join(EXACT_SOLVERS)}")
