"""The partition MILP (pulp; CBC or HiGHS): one candidate per stage, min bottleneck, then min total.

The model (``solve_milp``):

- ``x[s,a] ∈ {0,1}``: stage ``s`` takes candidate range ``a``; ``Σ_a x[s,a] = 1``.
- Contiguity and cover: stage 0's ranges start at layer 0 and the last stage's end at the
  last layer (candidates are filtered so); for every boundary s|s+1 and layer p,
  ``Σ_{a∈s, last=p−1} x[s,a] = Σ_{b∈s+1, first=p} x[s+1,b]`` — the range after a boundary
  starts exactly where the range before it ended, so ranges are contiguous, disjoint and cover.
- Pair costs in flow form. For a meeting (forward stage f, backward stage g ≠ f) the
  continuous ``y[a,b] ≥ 0`` have row sums ``Σ_b y[a,b] = x[f,a]`` and column sums
  ``Σ_a y[a,b] = x[g,b]``. With integral x exactly one row and one column are 1, so
  ``y[a*,b*] = 1`` and every other y is 0: ``Σ c[a,b]·y[a,b]`` *is* the selected pair's
  cost. ``z ≥`` that sum for every meeting (or, in a threshold step, only pairs ≤ T exist);
  a stage meeting itself needs no y: its cost is ``Σ_a c[a,a]·x[f,a]``. (The naive ``z ≥ c·(x_a + x_b − 1)`` form has a weak LP
  relaxation and was orders of magnitude slower to prove optimal.)
- Memory, per device and per Pareto-maximal in-flight vector n (``memory``):
  ``Σ_c static(chunk c) + Σ_c n_c·act(chunk c) + h_d ≤ capacity`` with ``h_d ≥ act(chunk c)``
  for every chunk (``h_d``: the deferred-wgrad headroom, the device's largest chunk's
  activations). Rows that no choice of the surviving candidates can violate are left out.
- Objective, lexicographic: first the bottleneck, then the total of the selected meeting
  pairs' costs. The bottleneck can only be one of the pair costs, so we find the smallest
  cost T for which a plan using only pairs ≤ T exists (binary search; each step first runs
  the pruning fixpoint against T, which refuses most thresholds without a solver call, then
  a feasibility MILP), and then minimise the total over the pairs ≤ T. This is exact and
  preserves the min-max by construction. The single min-max MILP (``z ≥`` every meeting's
  cost, minimise z, then fix it and minimise the total) is kept as ``method="minmax"``:
  it gives the same optimum but branch and bound struggles to close the gap when many
  plans tie (uniform layers).

Before the MILP, profile-guided pruning (``pruning``) removes pairs and candidates no better
plan can use.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from passes.partitioning.problem import MemoryInfeasibleError, PartitionProblem, PartitionSolution
from passes.partitioning.pruning import Combo, Pruned, best_incumbent, meetings, prune, prune_by_total, prune_from
from passes.partitioning.ranges import REL_TOL, PartitionError, Range, check_cover


@dataclass
class MilpSize:
    variables: int
    constraints: int
    candidates: int
    pair_variables: int

    def as_dict(self) -> dict[str, int]:
        return {
            "variables": self.variables,
            "constraints": self.constraints,
            "candidates": self.candidates,
            "pair_variables": self.pair_variables,
        }



def _memory_rows(problem: PartitionProblem) -> int:
    """Memory rows as formulated: one per in-flight vector, plus vpp headroom rows per device."""
    if problem.memory is None:
        return 0
    headroom = problem.vpp if problem.memory.wgrad_headroom else 0
    return sum(len(problem.memory.vectors[d]) + headroom for d in range(problem.pp))


def pair_groups(pairs: dict[Combo, dict[tuple[Range, Range], float]]) -> dict[Combo, set[tuple[Range, Range]]]:
    """The y-variable sets of the MILP: one per meeting (f, g), f != g, merged with its mirror (g, f).

    When stage f's forward meets stage g's backward and g's forward meets f's backward (the
    usual case), both meetings are decided by the same two choices, so one ``y[a,b]`` serves
    both, with cost ``c_fg(a,b)`` in one bottleneck row and ``c_gf(b,a)`` in the other. A pair
    is allowed only if both directions survived pruning. This halves the pair variables.
    """
    groups: dict[Combo, set[tuple[Range, Range]]] = {}
    for (f, g), table in pairs.items():
        if f == g or (g, f) in groups:
            continue
        keys = set(table)
        if (g, f) in pairs:
            mirror = pairs[(g, f)]
            keys = {(a, b) for a, b in keys if (b, a) in mirror}
        groups[(f, g)] = keys
    return groups


def milp_size(
    problem: PartitionProblem, candidates: Sequence[Sequence[Range]], group_sizes: dict[Combo, int], meetings: int
) -> MilpSize:
    """Variables and constraints of the flow-form MILP for the given candidates and merged pair sets."""
    stages = problem.stages
    n_cand = sum(len(c) for c in candidates)
    n_pairs = sum(group_sizes.values())
    contiguity = 0
    for s in range(stages - 1):
        positions = {r[1] + 1 for r in candidates[s]} | {r[0] for r in candidates[s + 1]}
        contiguity += len(positions)
    flow_rows = sum(len(candidates[f]) + len(candidates[g]) for f, g in group_sizes)
    constraints = stages + contiguity + flow_rows + meetings + _memory_rows(problem)
    headroom_vars = problem.pp if problem.memory is not None and problem.memory.wgrad_headroom else 0
    return MilpSize(n_cand + n_pairs + 1 + headroom_vars, constraints, n_cand, n_pairs)


def unpruned_size(problem: PartitionProblem) -> MilpSize:
    combos = meetings(problem)
    sizes = {}
    for f, g in combos:
        if f != g and (g, f) not in sizes:
            sizes[(f, g)] = len(problem.candidates[f]) * len(problem.candidates[g])
    return milp_size(problem, problem.candidates, sizes, len(combos))


def pruned_size(problem: PartitionProblem, pruned: Pruned) -> MilpSize:
    sizes = {k: len(v) for k, v in pair_groups(pruned.pairs).items()}
    return milp_size(problem, pruned.candidates, sizes, len(pruned.pairs))



def _solver(name: str, time_limit: float, warm: bool = False) -> Any:  # pulp's solvers share no public base type
    import pulp

    if name == "cbc":
        # The bundled CBC binary is what every install has; PuLP 3 flags the class as due for a rename.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit, warmStart=warm)
    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit)
    raise PartitionError(f"unknown solver '{name}'; use 'cbc' or 'highs'")


def _solve_phase(
    problem: PartitionProblem,
    pruned: Pruned,
    phase: int,
    solver: str,
    time_limit: float,
    start: Sequence[Range] | None = None,
) -> tuple[list[Range], bool] | None:
    """One MILP over the pruned problem. phase 0: feasibility; 1: min z (bottleneck); 2: min total.

    Returns (ranges, proven optimal), or None when the MILP is infeasible. ``start``: a known
    feasible plan handed to the solver as its first incumbent (CBC warm start).
    """
    import pulp

    stages = problem.stages
    cands = pruned.candidates
    if any(not c for c in cands):
        return None
    prob = pulp.LpProblem("partition", pulp.LpMinimize)
    x = {
        (s, r): prob.add_variable(f"x_{s}_{r[0]}_{r[1]}", cat="Binary") for s in range(stages) for r in cands[s]
    }
    for s in range(stages):
        prob += pulp.lpSum(x[(s, r)] for r in cands[s]) == 1, f"one_{s}"
    for s in range(stages - 1):
        positions = {r[1] + 1 for r in cands[s]} | {r[0] for r in cands[s + 1]}
        for p in sorted(positions):
            ends = [x[(s, r)] for r in cands[s] if r[1] + 1 == p]
            starts = [x[(s + 1, r)] for r in cands[s + 1] if r[0] == p]
            prob += pulp.lpSum(ends) == pulp.lpSum(starts), f"chain_{s}_{p}"
    z = prob.add_variable("z", lowBound=0)
    meeting_cost = []
    ys: dict[Combo, dict] = {}
    groups = pair_groups(pruned.pairs)
    for (f, g), table in pruned.pairs.items():
        if f == g:
            expr = pulp.lpSum(c * x[(f, a)] for (a, _), c in table.items())
        else:
            owner = (f, g) if (f, g) in groups else (g, f)
            if owner not in ys:
                keys = groups[owner]
                y = {k: prob.add_variable(f"y_{owner[0]}_{owner[1]}_{k[0][0]}_{k[0][1]}_{k[1][0]}_{k[1][1]}", lowBound=0)
                     for k in keys}
                ys[owner] = y
                rows: dict[Range, list] = {a: [] for a in cands[owner[0]]}
                cols: dict[Range, list] = {b: [] for b in cands[owner[1]]}
                for k, var in y.items():
                    rows[k[0]].append(var)
                    cols[k[1]].append(var)
                for a, terms in rows.items():
                    prob += pulp.lpSum(terms) == x[(owner[0], a)], f"row_{owner[0]}_{owner[1]}_{a[0]}_{a[1]}"
                for b, terms in cols.items():
                    prob += pulp.lpSum(terms) == x[(owner[1], b)], f"col_{owner[0]}_{owner[1]}_{b[0]}_{b[1]}"
            y = ys[owner]
            if owner == (f, g):
                expr = pulp.lpSum(table[k] * var for k, var in y.items())
            else:  # the mirror meeting (forward of g, backward of f): y[a,b] selects forward b, backward a
                expr = pulp.lpSum(table[(k[1], k[0])] * var for k, var in y.items())
        meeting_cost.append(expr)
        if phase == 1:
            prob += z >= expr, f"bottleneck_{f}_{g}"
    mem = problem.memory
    if mem is not None:
        for d in range(problem.pp):
            dstages = [d + c * problem.pp for c in range(problem.vpp)]
            static = pulp.lpSum(mem.static(s, r) * x[(s, r)] for s in dstages for r in cands[s])
            acts = [pulp.lpSum(mem.activation(s, r) * x[(s, r)] for r in cands[s]) for s in dstages]
            # A row that no choice of the surviving candidates can violate is left out: memory rows
            # are knapsack-like and make branch and bound far slower when they are only decoration.
            top_static = sum(max(mem.static(s, r) for r in cands[s]) for s in dstages)
            top_act = [max(mem.activation(s, r) for r in cands[s]) for s in dstages]
            headroom = max(top_act) if mem.wgrad_headroom else 0
            binding = [
                (v_index, vector)
                for v_index, vector in enumerate(mem.vectors[d])
                if top_static + sum(n * a for n, a in zip(vector, top_act)) + headroom > mem.budget
            ]
            if not binding:
                continue
            # Deferred-wgrad headroom: h ≥ every chunk's activations, i.e. the largest one.
            h = 0
            if mem.wgrad_headroom:
                h = prob.add_variable(f"h_{d}", lowBound=0)
                for c, act in enumerate(acts):
                    prob += h >= act, f"headroom_{d}_{c}"
            for v_index, vector in binding:
                held = pulp.lpSum(n * act for n, act in zip(vector, acts) if n)
                prob += static + held + h <= mem.budget, f"mem_{d}_{v_index}"
    prob += z if phase == 1 else (pulp.lpSum(meeting_cost) if phase == 2 else 0 * z)
    warm = False
    if start is not None and solver == "cbc" and all(r in set(cands[s]) for s, r in enumerate(start)):
        chosen = dict(enumerate(start))
        for (s, r), var in x.items():
            var.setInitialValue(1 if chosen[s] == r else 0)
        for (f, g), y in ys.items():
            for k, var in y.items():
                var.setInitialValue(1 if k == (chosen[f], chosen[g]) else 0)
        z.setInitialValue(problem.evaluate(start)[0])
        warm = True
    status = prob.solve(_solver(solver, time_limit, warm))
    if pulp.LpStatus[status] == "Infeasible":
        return None
    ranges: list[Range] = []
    for s in range(stages):
        picked = [r for r in cands[s] if (x[(s, r)].value() or 0) > 0.5]
        if len(picked) != 1:
            raise PartitionError(
                f"the MILP solver ({solver}) returned no integral solution within {time_limit} s "
                f"(status {pulp.LpStatus[status]}); raise time-limit"
            )
        ranges.append(picked[0])
    optimal = pulp.LpStatus[status] == "Optimal"
    return ranges, optimal


def solve_milp(
    problem: PartitionProblem,
    solver: str = "cbc",
    time_limit: float = 60.0,
    incumbent_plans: Sequence[Sequence[Range]] = (),
    use_pruning: bool = True,
    method: str = "threshold",
) -> PartitionSolution:
    """Lexicographic optimum (min bottleneck, then min total) by MILP, after profile-guided pruning.

    ``method="threshold"`` (default): the bottleneck can only take one of the finitely many
    pair costs, so the smallest cost T at which a plan using only pairs ≤ T exists is the
    optimum. Binary search over the sorted costs: a threshold is refused at once when
    pruning against it empties a stage (arc consistency), otherwise a feasibility MILP
    decides. Then one MILP minimises the total at T. Exact, and far faster than the
    single min-max MILP on degenerate instances (uniform layers make thousands of
    equally good plans, and branch and bound cannot close the min-max gap among them).
    ``method="minmax"``: the single MILP minimising z, then the total (kept for cross-checks).
    """
    start = time.perf_counter()
    before = unpruned_size(problem)
    inc = best_incumbent(problem, incumbent_plans) if use_pruning else None
    pruned = prune(problem, inc[0] if inc else None)
    after = pruned_size(problem, pruned)
    if any(not c for c in pruned.candidates):
        raise MemoryInfeasibleError("infeasible")
    stats: dict[str, Any] = {"before": before.as_dict(), "after": after.as_dict(), "incumbent": inc[0] if inc else None}
    best_plan: list[Range] | None = None
    if method == "minmax":
        first = _solve_phase(problem, pruned, 1, solver, time_limit)
        if first is None:
            raise MemoryInfeasibleError("infeasible")
        optimum = problem.evaluate(first[0])[0]
        optimal = first[1]
        best_plan = first[0]
        stats["milp_solves"] = 2
    elif method == "threshold":
        values = sorted({c for table in pruned.pairs.values() for c in table.values()})
        if not values:
            raise MemoryInfeasibleError("infeasible")
        solves = 0
        plans: dict[int, list[Range]] = {}

        def arc_ok(i: int) -> bool:
            return all(prune_from(problem, pruned, values[i]).candidates)

        def milp_ok(i: int) -> bool:
            nonlocal solves
            if inc is not None and inc[0] <= values[i] * (1 + REL_TOL) + 1e-9:
                return True  # the incumbent is a plan within this threshold
            solves += 1
            found = _solve_phase(problem, prune_from(problem, pruned, values[i]), 0, solver, time_limit)
            if found is not None:
                plans[i] = found[0]
            return found is not None

        # Smallest index passing arc consistency, then the smallest passing the MILP above it.
        lo, hi = 0, len(values) - 1
        # With an incumbent, values[hi] is its bottleneck: feasible by construction.
        if inc is None and (not arc_ok(hi) or not milp_ok(hi)):
            raise MemoryInfeasibleError("infeasible")
        lo = _first_true(arc_ok, lo, hi)
        lo = _first_true(milp_ok, lo, hi)
        optimum = values[lo]
        optimal = True
        best_plan = plans.get(lo)
        stats["milp_solves"] = solves + 1
        stats["thresholds"] = len(values)
    else:
        raise PartitionError(f"unknown partition method '{method}'; use 'threshold' or 'minmax'")
    # Phase 2: pairs dearer than the optimum bottleneck can no longer be selected; minimise the total.
    pruned2 = prune_from(problem, pruned, optimum)
    known = best_plan
    if known is None and inc is not None and inc[0] <= optimum * (1 + REL_TOL) + 1e-9:
        known = inc[1]
    if known is not None:
        pruned2 = prune_by_total(problem, pruned2, optimum, problem.evaluate(known)[1])
    second = _solve_phase(problem, pruned2, 2, solver, time_limit, known)
    if second is None:
        raise PartitionError(f"the {solver} solver found no plan at the optimal bottleneck {optimum} (numerical trouble)")
    ranges = second[0]
    check_cover(ranges, problem.num_layers)
    bottleneck, total = problem.evaluate(ranges)
    stats["phase2"] = pruned_size(problem, pruned2).as_dict()
    stats["optimal"] = optimal and second[1]
    return PartitionSolution(
        ranges, bottleneck, total, method=f"milp-{solver}", seconds=time.perf_counter() - start, stats=stats
    )



def _first_true(pred: Callable[[int], bool], lo: int, hi: int) -> int:
    """Smallest i in [lo, hi] with pred(i), given pred(hi) and monotonicity."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo

