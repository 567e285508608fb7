"""Exact pair scheduling by mixed-integer programming (pulp; HiGHS or CBC).

Used to measure how far the gap-fit heuristic is from the optimum on small
pairs (up to ~40 tasks; the problem is NP-hard and the solve time grows fast).

Formulation (disjunctive, continuous time). For tasks i with duration d_i:

- ``S_i`` start time, ``C`` makespan; minimise ``C``.
- ``C >= S_i + d_i`` for every task without successors.
- precedence: ``S_j >= S_i + d_i`` for every dependency i -> j.
- one task at a time per stream: for every pair i, j on the same stream that no
  dependency path already orders, a binary ``y_ij`` chooses the order:
  ``S_i + d_i <= S_j + M (1 - y_ij)`` and ``S_j + d_j <= S_i + M y_ij``, with
  ``M`` the makespan of a known schedule (the heuristic's), since no start in a
  schedule at least as good lies beyond it.
- deadline: ``S_i + d_i <= deadline_i`` for movable tasks that have one.

Valid cuts, without which the big-M relaxation is so weak that the solver
cannot prove optimality even at ~30 tasks:

- ``C >= sum of durations on each stream`` and ``C >= critical path``;
- per stream, ``C >= min head + total + min tail``: nothing on the stream can
  start before the earliest possible start (head, longest path into a task)
  of its tasks, and after the stream's last task ends the shortest remaining
  chain (tail, longest path out of a task, own duration excluded) still runs;
- variable bounds ``head_i <= S_i <= UB - tail_i - d_i``.

The solver's start times are turned into an exactly consistent schedule by
keeping its order on each stream and starting every task as early as that
order and its dependencies allow (this never lengthens the solution).

Status: HiGHS and CBC both report "Optimal" as the *problem* status when a
time limit stops them with a feasible incumbent; the *solution* status
(``prob.sol_status``) says whether optimality was proven. This module reports
``optimal`` only when it was.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any

from passes.scheduling.gap_fit import gap_fit
from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import EPS, RESOURCES, PairSchedule, SchedulingError, bottom_levels, heads
from tessera_ir.kinds import Resource

SOLVERS = ("highs", "cbc")


def _reachability(dag: PairDAG) -> list[int]:
    """Bitset of ancestors of each task (tasks are in topological order)."""
    anc = [0] * len(dag.tasks)
    for i, t in enumerate(dag.tasks):
        for d in t.deps:
            anc[i] |= anc[d] | (1 << d)
    return anc


def _make_solver(solver: str, time_limit_s: float) -> Any:  # pulp's solvers share no public base type
    import pulp

    if solver == "highs":
        if "HiGHS" in pulp.listSolvers(onlyAvailable=True):
            return pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=1)
        if "HiGHS_CMD" in pulp.listSolvers(onlyAvailable=True):
            return pulp.HiGHS_CMD(msg=False, timeLimit=time_limit_s, threads=1)
        raise SchedulingError("solver 'highs' is not available to pulp; install highspy or use solver=cbc")
    if solver == "cbc":
        # The CBC binary bundled with pulp; pulp marks this class for removal in 4.0.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=1)
    raise SchedulingError(f"unknown ILP solver '{solver}'; use one of {', '.join(SOLVERS)}")


def exact(
    dag: PairDAG,
    time_limit_s: float = 10.0,
    solver: str = "highs",
    upper_bound: PairSchedule | None = None,
    shortcut: bool = True,
) -> PairSchedule:
    """Optimal (or best found within ``time_limit_s``) schedule of ``dag``.

    ``upper_bound`` is a known valid schedule (default: the gap-fit
    heuristic's); it sets the big-M and is returned when the solver finds
    nothing better in time. With ``shortcut``, a known schedule that already
    meets the lower bound is returned as optimal without building the model
    (benchmarks turn it off to time the solver itself).
    """
    import pulp

    t0 = time.perf_counter()
    n = len(dag.tasks)
    incumbent = upper_bound if upper_bound is not None else gap_fit(dag)
    ub = incumbent.makespan
    lb = dag.lower_bound()
    if ub < lb - EPS * max(1.0, lb):
        raise SchedulingError(
            f"the starting schedule of pair '{dag.name}' is shorter ({ub}) than the lower bound ({lb}), so it is "
            "invalid; check it with passes.scheduling.check first"
        )
    if n == 0 or (shortcut and ub <= lb + EPS * max(1.0, lb)):
        # The known schedule already meets the lower bound: it is optimal, no solve needed.
        return PairSchedule(
            dag, list(incumbent.start), "exact", status="optimal", solve_seconds=time.perf_counter() - t0, bound=lb
        )
    head = heads(dag)
    bl = bottom_levels(dag)
    tail = [bl[i] - dag.tasks[i].duration for i in range(n)]  # path after the task ends
    succ = dag.successors()
    anc = _reachability(dag)

    prob = pulp.LpProblem("pair", pulp.LpMinimize)

    def var(name: str, low: float | None = None, up: float | None = None, cat: str = "Continuous") -> pulp.LpVariable:
        # Newer pulp attaches variables to the problem; older pulp only has the constructor.
        if hasattr(prob, "add_variable"):
            return prob.add_variable(name, low, up, cat=cat)
        return pulp.LpVariable(name, lowBound=low, upBound=up, cat=cat)

    big_m = ub
    c = var("makespan", lb, ub)
    s = [var(f"s{i}", head[i], max(head[i], ub - tail[i] - dag.tasks[i].duration)) for i in range(n)]
    prob += c
    for i, t in enumerate(dag.tasks):
        if not succ[i]:
            prob += c >= s[i] + t.duration
        for d in t.deps:
            prob += s[i] >= s[d] + dag.tasks[d].duration
        if t.movable and t.deadline is not None:
            prob += s[i] + t.duration <= t.deadline
    for r in RESOURCES:
        members = [i for i, t in enumerate(dag.tasks) if t.resource is r]
        if not members:
            continue
        total = sum(dag.tasks[i].duration for i in members)
        prob += c >= min(head[i] for i in members) + total + min(tail[i] for i in members)
        for a_pos, i in enumerate(members):
            for j in members[a_pos + 1 :]:
                if (anc[j] >> i) & 1 or (anc[i] >> j) & 1:
                    continue  # a dependency path already orders them
                y = var(f"y{i}_{j}", 0, 1, cat="Binary")
                prob += s[i] + dag.tasks[i].duration <= s[j] + big_m * (1 - y)
                prob += s[j] + dag.tasks[j].duration <= s[i] + big_m * y
    prob += c >= dag.critical_path()

    with _stdout_silenced():
        prob.solve(_make_solver(solver, time_limit_s))
    seconds = time.perf_counter() - t0
    bound = _solver_bound(prob, lb)
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible) or s[0].varValue is None:
        return PairSchedule(dag, list(incumbent.start), "exact", status="timeout", solve_seconds=seconds, bound=bound)
    values = [float(v.varValue or 0.0) for v in s]
    start = _left_shift(dag, values)
    status = "optimal" if prob.sol_status == pulp.LpSolutionOptimal else "feasible"
    ms = max(start[i] + dag.tasks[i].duration for i in range(n))
    if ms > ub + EPS * max(1.0, ub):
        start, ms = list(incumbent.start), ub  # numerical noise: keep the better known schedule
    if status == "optimal":
        bound = ms
    return PairSchedule(dag, start, "exact", status=status, solve_seconds=seconds, bound=bound)


@contextlib.contextmanager
def _stdout_silenced() -> Iterator[None]:
    """Silence the solver library's own printing (HiGHS prints a banner from C on first
    use, past Python's sys.stdout), so tools that write IR to stdout stay clean."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        yield  # stdout is not a real file (captured in a test): nothing to protect
        return
    saved = os.dup(fd)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), fd)
            yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)


def _solver_bound(prob: object, fallback: float) -> float:
    """The solver's proven lower bound on the makespan, when its API exposes one."""
    model = getattr(prob, "solverModel", None)
    try:
        info = model.getInfo()  # type: ignore[union-attr]
        value = float(info.mip_dual_bound)
        if value == value and abs(value) != float("inf"):
            return max(fallback, value)
    except Exception:  # noqa: BLE001 (CBC through the command line has no model object)
        pass
    return fallback


def _left_shift(dag: PairDAG, values: list[float]) -> list[float]:
    """Keep the per-stream order of ``values`` and start each task as early as allowed."""
    n = len(dag.tasks)
    order = sorted(range(n), key=lambda i: (values[i], values[i] + dag.tasks[i].duration, dag.tasks[i].name))
    prev: dict[Resource, int | None] = {r: None for r in RESOURCES}
    pred_on_stream: list[int | None] = [None] * n
    for i in order:
        r = dag.tasks[i].resource
        pred_on_stream[i] = prev[r]
        prev[r] = i
    start = [0.0] * n
    # Tasks sorted by solver start form a topological order of deps + stream order
    # (a dependency's start is strictly smaller, or equal with zero duration, which the
    # secondary key on finish time orders correctly).
    placed = [False] * n
    pending = list(order)
    while pending:
        rest = []
        for i in pending:
            p = pred_on_stream[i]
            if all(placed[d] for d in dag.tasks[i].deps) and (p is None or placed[p]):
                ready = max((start[d] + dag.tasks[d].duration for d in dag.tasks[i].deps), default=0.0)
                if p is not None:
                    ready = max(ready, start[p] + dag.tasks[p].duration)
                start[i] = ready
                placed[i] = True
            else:
                rest.append(i)
        if len(rest) == len(pending):
            raise SchedulingError(f"ILP solution of pair '{dag.name}' orders tasks inconsistently with their dependencies")
        pending = rest
    return start
