"""The exact pair scheduler: a constraint-programming model solved by CP-SAT (OR-tools).

Model, in integer time (durations in ``1 / TICKS_PER_US`` µs, i.e. nanoseconds):

- one fixed-size interval per task, its start within ``[head, UB - tail - duration]``
  (head: longest path into the task; tail: longest path out of it; UB: the makespan of a
  known schedule, the heuristic's);
- ``AddNoOverlap`` per stream (compute, comm);
- precedence ``start_j >= start_i + d_i`` for every dependency ``i -> j``;
- ``start_i + d_i <= deadline_i`` for a movable task with a deadline;
- minimise the makespan, ``>= end`` of every task without successors.

CP-SAT's no-overlap propagation (edge finding, energetic reasoning) gives the bounds the
MILP needs explicit cuts for, so this model proves optimality on pairs where the MILP's
big-M relaxation times out. The known schedule is passed as a solution hint.

Durations in the model are rounded *up* to whole nanoseconds. The solver's stream orders
are then re-timed with the exact float durations (:func:`passes.scheduling.schedule.left_shift`),
which can only make the schedule shorter than the model says; and no real schedule beats
the model's optimum by more than the rounding of its tasks (under one nanosecond each). So
``optimal`` means optimal to within that rounding (below 1e-5 of any real pair, nothing when
the durations are whole nanoseconds), and the reported ``bound`` is the solver's proven
bound less it.

Determinism: one search worker and a *deterministic* time limit (CP-SAT counts work, not
wall-clock seconds), so the same DAG and limit give the same schedule on every machine
and under any load. ``time_limit_s`` is that deterministic limit; on an idle core one unit
takes about a second.
"""

from __future__ import annotations

import math
import time

from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import EPS, RESOURCES, PairSchedule, SchedulingError, bottom_levels, heads, left_shift

TICKS_PER_US = 1000


def _meets_deadlines(schedule: PairSchedule) -> bool:
    return all(
        schedule.finish(i) <= t.deadline + EPS * max(1.0, t.deadline)
        for i, t in enumerate(schedule.dag.tasks)
        if t.movable and t.deadline is not None
    )


def cpsat(
    dag: PairDAG,
    time_limit_s: float = 10.0,
    upper_bound: PairSchedule | None = None,
    workers: int = 1,
) -> PairSchedule:
    """Optimal (or best found within the limit) schedule of ``dag`` by CP-SAT.

    ``upper_bound`` is a known valid schedule (default: the gap-fit heuristic's); it bounds
    the horizon, is the solution hint, and is returned when the solver finds nothing better.
    ``workers`` > 1 runs CP-SAT's parallel portfolio, which is faster on hard pairs but not
    deterministic. The result's ``status`` is ``optimal`` (proven), ``feasible`` (a schedule,
    optimality not proven within the limit) or ``timeout`` (nothing better than
    ``upper_bound`` found; still a valid schedule); ``bound`` is the proven lower bound.
    """
    from ortools.sat.python import cp_model

    t0 = time.perf_counter()
    if upper_bound is None:
        from passes.scheduling.gap_fit import gap_fit

        upper_bound = gap_fit(dag)
    n = len(dag.tasks)
    ub = upper_bound.makespan
    lb = dag.lower_bound()
    if n == 0 or ub <= lb + EPS * max(1.0, lb):
        # The known schedule meets the lower bound: it is optimal, no search needed.
        return PairSchedule(dag, list(upper_bound.start), "exact", "optimal", time.perf_counter() - t0, bound=lb)
    dur = [math.ceil(t.duration * TICKS_PER_US - 1e-6) for t in dag.tasks]
    # What rounding every duration up can add on one path: at most the rounding of all tasks
    # (nothing when the durations are whole nanoseconds).
    slack_us = sum(max(0.0, d / TICKS_PER_US - t.duration) for d, t in zip(dur, dag.tasks))
    head = heads(dag)
    tail = [b - t.duration for b, t in zip(bottom_levels(dag), dag.tasks)]
    # The known schedule re-timed with the rounded durations: the hint, inside the horizon.
    hint = [round(x) for x in left_shift(dag, upper_bound.start, dur)]
    horizon = max(s + d for s, d in zip(hint, dur))

    model = cp_model.CpModel()
    start = []
    for i in range(n):
        low = int(head[i] * TICKS_PER_US)  # rounding up only lengthens paths
        high = max(low, horizon - int(tail[i] * TICKS_PER_US) - dur[i])
        start.append(model.new_int_var(low, high, f"s{i}"))
    intervals = [model.new_fixed_size_interval_var(start[i], dur[i], f"t{i}") for i in range(n)]
    makespan = model.new_int_var(int(lb * TICKS_PER_US), horizon, "makespan")
    successors = dag.successors()
    for i, task in enumerate(dag.tasks):
        for d in task.deps:
            model.add(start[i] >= start[d] + dur[d])
        if not successors[i]:
            model.add(makespan >= start[i] + dur[i])
        if task.movable and task.deadline is not None:
            model.add(start[i] + dur[i] <= int(task.deadline * TICKS_PER_US))
    for r in RESOURCES:
        model.add_no_overlap([intervals[i] for i, t in enumerate(dag.tasks) if t.resource is r])
    model.minimize(makespan)
    for i in range(n):
        model.add_hint(start[i], hint[i])

    solver = cp_model.CpSolver()
    solver.parameters.num_workers = workers
    if workers == 1:
        solver.parameters.max_deterministic_time = time_limit_s
    else:
        solver.parameters.max_time_in_seconds = time_limit_s
    status = solver.solve(model)
    seconds = time.perf_counter() - t0
    if status == cp_model.INFEASIBLE and not _meets_deadlines(upper_bound):
        raise SchedulingError(
            f"pair '{dag.name}' has no schedule that meets the deadlines of its movable tasks; "
            "relax the deadlines (they are microseconds from the start of the pair)"
        )
    bound = max(lb, solver.best_objective_bound / TICKS_PER_US - slack_us)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        # Nothing found in time (or a deadline that only holds to within the rounding):
        # the known schedule stands, unproven.
        proven = lb if status == cp_model.INFEASIBLE else bound
        return PairSchedule(dag, list(upper_bound.start), "exact", "timeout", seconds, bound=proven)
    found = left_shift(dag, [solver.value(s) / TICKS_PER_US for s in start])
    if max(found[i] + dag.tasks[i].duration for i in range(n)) > ub + EPS * max(1.0, ub):
        found = list(upper_bound.start)  # rounding made it no better: keep the known schedule
    status_name = "optimal" if status == cp_model.OPTIMAL else "feasible"
    return PairSchedule(dag, found, "exact", status_name, seconds, bound=bound)
