"""The scheduling methods by name: what ``overlap-schedule{method=...}`` and the benchmarks call."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, get_args

from passes.scheduling.baselines import fixed_template, serial
from passes.scheduling.gap_fit import gap_fit
from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import PairSchedule

Method = Literal["gap-fit", "serial", "fixed-template", "exact"]
METHODS: tuple[str, ...] = get_args(Method)
IlpSolver = Literal["highs", "cbc"]

SCHEDULERS: dict[str, Callable[[PairDAG], PairSchedule]] = {
    "gap-fit": gap_fit,
    "serial": serial,
    "fixed-template": fixed_template,
}


def schedule_dag(dag: PairDAG, method: Method = "gap-fit", time_limit: float = 10.0, solver: IlpSolver = "highs") -> PairSchedule:
    """Schedule one pair DAG with the named method (``exact``: ILP with ``time_limit`` s per pair)."""
    if method == "exact":
        from passes.scheduling.exact import exact

        return exact(dag, time_limit_s=time_limit, solver=solver)
    return SCHEDULERS[method](dag)
