"""The ``partition`` pass: choose one candidate per virtual stage by a MILP over post-overlap pair costs.

Before: ``candidate`` and ``pair`` ops (with ``cost_us`` from ``profile``). After::

    plan partition @partition {bottleneck_us = 812.5, megatron_layout = "Et*3|t*3|t*2|t*3L", search = "window",
                               stages = [@cand.s0.c4, @cand.s1.c2, ...], total_us = ..., ...}

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
- Memory, per device and per Pareto-maximal in-flight vector n (``memory_model``):
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

Profile-guided pruning (``prune``), before the MILP: an incumbent plan (the serially balanced
partition, costed with the same pair costs, when it fits in memory) bounds the optimum's
bottleneck from above. Any pair dearer than the incumbent cannot be in a better plan, so it
is dropped; a candidate left without a partner in some meeting, whose memory alone cannot
fit, or that is no longer part of a contiguous cover is dropped; repeat to a fixed point.
The optimum survives: all its pairs cost at most its bottleneck ≤ the incumbent.

Pair costs: a pair op's ``cost_us`` (from ``profile``), else its ``makespan`` (from
``overlap-schedule``), else the serial sum of its tasks' isolated durations; a meeting with
no pair op at all is costed serially too (hand-written IR may list only some pairs).

``search=global`` searches every contiguous partition the candidates allow (run
``candidates{search=global}``): all ranges are pruned against the window optimum, then the
same MILP runs (the exact DP of ``partition_dp`` when vpp ≤ 2, where its state stays small). The partition op then
reports both bottlenecks, so the price of the local window is known.
"""

from __future__ import annotations

import json
import re
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

from passes.candidates import check_decoder_order, serially_balanced, stage_layers
from passes.cost_model import load_hardware, task_duration_us
from passes.manager import ModulePass, PassError
from passes.memory_model import (
    GIB,
    MemoryAssumptions,
    inflight_vectors,
    layer_activation_bytes,
    layer_static_bytes,
)
from passes.partition_dp import (
    REL_TOL,
    MemorySpec,
    PartitionError,
    PartitionProblem,
    PartitionSolution,
    Range,
    all_candidates,
    check_cover,
    meeting_stages,
    reachable,
    solve_dp,
)
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import LayerRole, Phase
from tessera_ir.model import Module, PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig

Combo = tuple[int, int]  # (forward stage, backward stage)


class MemoryInfeasibleError(PartitionError):
    """No partition fits the devices' memory."""


# ---------------------------------------------------------------------------------------------
# Pruning and problem size


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


@dataclass
class Pruned:
    candidates: list[list[Range]]
    # (f, g) with f != g -> {(a, b): cost}; (f, f) -> {(a, a): cost}
    pairs: dict[Combo, dict[tuple[Range, Range], float]]
    incumbent: float | None


def _combos(problem: PartitionProblem) -> list[Combo]:
    return [c for d in range(problem.pp) for c in problem.meets[d]]


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
    combos = _combos(problem)
    sizes = {}
    for f, g in combos:
        if f != g and (g, f) not in sizes:
            sizes[(f, g)] = len(problem.candidates[f]) * len(problem.candidates[g])
    return milp_size(problem, problem.candidates, sizes, len(combos))


def pruned_size(problem: PartitionProblem, pruned: Pruned) -> MilpSize:
    sizes = {k: len(v) for k, v in pair_groups(pruned.pairs).items()}
    return milp_size(problem, pruned.candidates, sizes, len(pruned.pairs))


def _memory_floor(problem: PartitionProblem, cands: list[set[Range]]) -> list[set[Range]]:
    """Drop candidates that cannot fit even with the lightest choices for the device's other chunks."""
    mem = problem.memory
    if mem is None:
        return cands
    pp, vpp = problem.pp, problem.vpp
    out = [set(c) for c in cands]
    for d in range(pp):
        stages = [d + c * pp for c in range(vpp)]
        min_static = {s: min((mem.static(s, r) for r in cands[s]), default=0) for s in stages}
        top = [max(v[c] for v in mem.vectors[d]) if mem.vectors[d] else 0 for c in range(vpp)]
        for c, s in enumerate(stages):
            others = sum(min_static[t] for t in stages if t != s)
            for r in cands[s]:
                act = mem.activation(s, r)
                need = others + mem.static(s, r) + top[c] * act + (act if mem.wgrad_headroom else 0)
                if need > mem.capacity:
                    out[s].discard(r)
    return out


def prune(problem: PartitionProblem, incumbent: float | None) -> Pruned:
    """Profile-guided pruning to a fixed point (see the module docstring). ``incumbent=None``: cover only."""
    limit = float("inf") if incumbent is None else incumbent * (1 + REL_TOL) + 1e-9
    combos = _combos(problem)
    cands = [set(c) for c in reachable(problem.candidates, problem.num_layers)]
    cands = _memory_floor(problem, cands)
    pairs: dict[Combo, dict[tuple[Range, Range], float]] = {}

    def settle() -> None:
        # Cover only; pairs are filtered after.
        nonlocal cands
        cands = [set(c) for c in reachable([sorted(c) for c in cands], problem.num_layers)]

    # Diagonal meetings first: cheap (one cost per candidate) and they shrink the off-diagonal products.
    settle()
    for f, g in combos:
        if f == g:
            keep = {}
            for a in cands[f]:
                c = problem.pair_cost(f, a, f, a)
                if c <= limit:
                    keep[(a, a)] = c
            pairs[(f, g)] = keep
            cands[f] &= {a for a, _ in keep}
    settle()
    bound = problem.side_bound
    if bound is not None and incumbent is not None:
        # Candidates whose own side bound plus the cheapest partner's already exceeds the incumbent.
        changed = True
        while changed:
            changed = False
            for f, g in combos:
                if f == g or not cands[f] or not cands[g]:
                    continue
                min_b = min(bound(g, b, "bwd") for b in cands[g])
                min_a = min(bound(f, a, "fwd") for a in cands[f])
                keep_f = {a for a in cands[f] if bound(f, a, "fwd") + min_b <= limit}
                keep_g = {b for b in cands[g] if bound(g, b, "bwd") + min_a <= limit}
                if keep_f != cands[f] or keep_g != cands[g]:
                    cands[f], cands[g] = keep_f, keep_g
                    changed = True
            before = sum(len(c) for c in cands)
            settle()
            changed = changed or sum(len(c) for c in cands) != before
    for f, g in combos:
        if f != g:
            keep = {}
            if bound is not None and incumbent is not None:
                partners = sorted((bound(g, b, "bwd"), b) for b in cands[g])
                for a in cands[f]:
                    room = limit - bound(f, a, "fwd")
                    for lb, b in partners:
                        if lb > room:
                            break  # sorted: every later partner's bound is larger
                        c = problem.pair_cost(f, a, g, b)
                        if c <= limit:
                            keep[(a, b)] = c
            else:
                for a in cands[f]:
                    for b in cands[g]:
                        c = problem.pair_cost(f, a, g, b)
                        if c <= limit:
                            keep[(a, b)] = c
            pairs[(f, g)] = keep
    changed = True
    while changed:
        changed = False
        for (f, g), table in pairs.items():
            alive = {k: v for k, v in table.items() if k[0] in cands[f] and k[1] in cands[g]}
            pairs[(f, g)] = alive
            rows, cols = {a for a, _ in alive}, {b for _, b in alive}
            if not cands[f] <= rows or not cands[g] <= cols:
                cands[f] &= rows
                cands[g] &= cols
                changed = True
        before = sum(len(c) for c in cands)
        settle()
        cands = _memory_floor(problem, cands)
        if sum(len(c) for c in cands) != before:
            changed = True
    for (f, g), table in pairs.items():
        pairs[(f, g)] = {k: v for k, v in table.items() if k[0] in cands[f] and k[1] in cands[g]}
    return Pruned([sorted(c) for c in cands], pairs, incumbent)


def best_incumbent(problem: PartitionProblem, plans: Sequence[Sequence[Range]]) -> tuple[float, list[Range]] | None:
    """The cheapest memory-feasible plan among ``plans`` whose ranges are all candidates."""
    best = None
    for plan in plans:
        if any(r not in set(problem.candidates[s]) for s, r in enumerate(plan)):
            continue
        if not problem.memory_ok(plan):
            continue
        value = problem.evaluate(plan)[0]
        if best is None or value < best[0]:
            best = (value, list(plan))
    return best


# ---------------------------------------------------------------------------------------------
# The MILP


def _solver(name: str, time_limit: float, warm: bool = False):  # noqa: ANN202 (a pulp solver)
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
            rows = [
                (v_index, vector)
                for v_index, vector in enumerate(mem.vectors[d])
                if top_static + sum(n * a for n, a in zip(vector, top_act)) + headroom > mem.capacity
            ]
            if not rows:
                continue
            # Deferred-wgrad headroom: h ≥ every chunk's activations, i.e. the largest one.
            h = 0
            if mem.wgrad_headroom:
                h = prob.add_variable(f"h_{d}", lowBound=0)
                for c, act in enumerate(acts):
                    prob += h >= act, f"headroom_{d}_{c}"
            for v_index, vector in rows:
                held = pulp.lpSum(n * act for n, act in zip(vector, acts) if n)
                prob += static + held + h <= mem.capacity, f"mem_{d}_{v_index}"
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
        chosen = [r for r in cands[s] if (x[(s, r)].value() or 0) > 0.5]
        if len(chosen) != 1:
            raise PartitionError(
                f"the MILP solver ({solver}) returned no integral solution within {time_limit} s "
                f"(status {pulp.LpStatus[status]}); raise time-limit"
            )
        ranges.append(chosen[0])
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
    stats: dict[str, object] = {"before": before.as_dict(), "after": after.as_dict(), "incumbent": inc[0] if inc else None}
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


def prune_by_total(problem: PartitionProblem, pruned: Pruned, limit: float, total_ub: float) -> Pruned:
    """Phase-2 pruning against a known plan's total ``total_ub`` (exact, like reduced-cost fixing).

    Every meeting contributes at least its cheapest surviving pair, so ``LB = Σ_k min_k``
    bounds the total from below; a pair dearer than ``min_k + (total_ub − LB)`` would push any
    plan using it above the known plan and cannot be in the optimum. Dropping pairs can
    remove candidates, which raises the minima: repeat to a fixed point.
    """
    tol = 1e-9 * max(1.0, abs(total_ub))
    while True:
        if any(not table for table in pruned.pairs.values()):
            return pruned
        mins = {k: min(table.values()) for k, table in pruned.pairs.items()}
        slack = total_ub - sum(mins.values()) + tol
        tables = {k: {p: c for p, c in table.items() if c <= mins[k] + slack} for k, table in pruned.pairs.items()}
        if all(len(tables[k]) == len(pruned.pairs[k]) for k in tables):
            return pruned
        pruned = prune_from(problem, Pruned(pruned.candidates, tables, pruned.incumbent), limit)


def _first_true(pred, lo: int, hi: int) -> int:  # noqa: ANN001 (a monotone predicate over indices)
    """Smallest i in [lo, hi] with pred(i), given pred(hi) and monotonicity."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def prune_from(problem: PartitionProblem, pruned: Pruned, limit: float) -> Pruned:
    """Re-prune an already pruned problem against a lower limit (no new pair costs are needed)."""
    sub = PartitionProblem(
        problem.num_layers, problem.pp, problem.vpp, pruned.candidates, problem.meets, problem.cost,
        problem.memory, None, problem._cache,
    )
    tables = pruned.pairs
    # Costs of pairs pruned earlier are above the old limit, hence above the new one: the
    # side-bound shortcut is not needed, and pairs missing from the old tables must stay out.
    sub.cost = lambda f, a, g, b: tables.get((f, g), {}).get((a, b), float("inf"))
    sub._cache = {}
    return prune(sub, limit)


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
    free = PartitionProblem(problem.num_layers, problem.pp, problem.vpp, problem.candidates, problem.meets, problem.cost)
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
        "raise --pp, shard the optimizer (distributed optimizer), lower the micro-batch size, or widen the "
        "candidate window"
    )


def global_problem(problem: PartitionProblem) -> PartitionProblem:
    """The same problem over every range a stage could hold (the oracle must cost any pair)."""
    return PartitionProblem(
        problem.num_layers,
        problem.pp,
        problem.vpp,
        all_candidates(problem.num_layers, problem.stages),
        problem.meets,
        problem.cost,
        problem.memory,
        problem.side_bound,
        problem._cache,
    )


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
    sub = PartitionProblem(
        problem.num_layers, problem.pp, problem.vpp, pruned.candidates, problem.meets, problem.cost,
        problem.memory, problem.side_bound, problem._cache,
    )
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


# ---------------------------------------------------------------------------------------------
# Megatron-LM layout strings


def megatron_layout(ranges: Sequence[Range]) -> str:
    """``--pipeline-model-parallel-layout`` for a partition (virtual stage order, embedding first, loss last).

    Megatron lists stages in forward order — all pp stages of chunk 0, then chunk 1, ... —
    which is our virtual-stage order (stage s on device s mod pp). A stage is spelled
    ``E`` (embedding), ``t`` per decoder layer (``t*k`` for k > 1), ``L`` (loss, with the head);
    stages are separated by ``|``; consecutive identical stages are grouped as ``(x|)*r``
    (the group carries its separator, so a run that ends the layout writes its last stage bare).
    """
    last = len(ranges) - 1
    words = []
    for s, (first, end) in enumerate(ranges):
        count = end - first + 1
        body = "t" if count == 1 else (f"t*{count}" if count > 1 else "")
        words.append(("E" if s == 0 else "") + body + ("L" if s == last else ""))
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j + 1 < len(words) and words[j + 1] == words[i]:
            j += 1
        run = j - i + 1
        at_end = j == len(words) - 1
        if run == 1:
            out.append(words[i] + ("" if at_end else "|"))
        elif at_end:
            out.append(f"({words[i]}|)*{run - 1}" + words[i] if run > 2 else f"{words[i]}|{words[i]}")
        else:
            out.append(f"({words[i]}|)*{run}")
        i = j + 1
    return "".join(out)


_TOKEN = re.compile(r"\s*(\(|\)|\*\s*\d+|[EtmL|])")


def expand_megatron_layout(text: str) -> list[str]:
    """Expand a layout string into its stages, each a string over ``E t m L`` (commas ignored)."""
    source = text.replace(",", "")
    pos = 0

    def error(msg: str) -> PartitionError:
        return PartitionError(f"pipeline layout {text!r}: {msg} at character {pos + 1}")

    def sequence() -> str:
        nonlocal pos
        out = []
        while pos < len(source) and source[pos] != ")":
            if source[pos].isspace():
                pos += 1
                continue
            if source[pos] == "(":
                pos += 1
                inner = sequence()
                if pos >= len(source) or source[pos] != ")":
                    raise error("unclosed '('")
                pos += 1
                out.append(inner * repeat())
            elif source[pos] in "EtmL|":
                ch = source[pos]
                pos += 1
                out.append(ch * repeat())
            else:
                raise error(f"unexpected {source[pos]!r}")
        return "".join(out)

    def repeat() -> int:
        nonlocal pos
        m = re.match(r"\s*\*\s*(\d+)", source[pos:])
        if not m:
            return 1
        pos += m.end()
        return int(m.group(1))

    flat = sequence()
    if pos != len(source):
        raise error("unmatched ')'")
    return flat.split("|")


def parse_megatron_layout(text: str, num_layers: int | None = None) -> list[Range]:
    """Decoder ranges per stage of a layout string; embedding must open the first stage, loss close the last.

    Empty decoder stages are legal in Megatron but have no range in Tessera's partition; they are refused.
    """
    stages = expand_megatron_layout(text)
    ranges: list[Range] = []
    next_layer = 0
    for s, word in enumerate(stages):
        if "E" in word and (s != 0 or not word.startswith("E")):
            raise PartitionError(f"pipeline layout {text!r}: 'E' must open the first stage, found in stage {s}")
        if "L" in word and (s != len(stages) - 1 or not word.endswith("L")):
            raise PartitionError(f"pipeline layout {text!r}: 'L' must close the last stage, found in stage {s}")
        count = word.count("t")
        if count == 0:
            raise PartitionError(f"pipeline layout {text!r}: stage {s} holds no decoder layer")
        ranges.append((next_layer, next_layer + count - 1))
        next_layer += count
    if num_layers is not None and next_layer != num_layers:
        raise PartitionError(f"pipeline layout {text!r} holds {next_layer} decoder layers, the model {num_layers}")
    return ranges


# ---------------------------------------------------------------------------------------------
# The pass


def _layer_key(refs: Sequence[SymbolRef]) -> tuple[str, ...]:
    return tuple(r.name for r in refs)


def pair_cost_table(module: Module) -> dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[float, str]]:
    """(fwd layer names, bwd layer names) → (cost µs, where it came from) for every pair op with a cost."""
    table = {}
    for op in module.plan_ops("pair"):
        fwd, bwd = op.attrs.get("fwd", []), op.attrs.get("bwd", [])
        assert isinstance(fwd, list) and isinstance(bwd, list)
        for attr in ("cost_us", "makespan"):
            value = op.attrs.get(attr)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                table[(_layer_key(fwd), _layer_key(bwd))] = (float(value), attr)  # type: ignore[arg-type]
                break
    return table


@dataclass(frozen=True)
class PartitionPass(ModulePass):
    name = "partition"
    summary = "Pick one candidate per virtual stage minimising the worst post-overlap pair cost (MILP)."

    search: str = "window"
    solver: str = "cbc"
    time_limit: float = 60.0
    memory_gib: float = 0.0  # 0: the hardware's capacity
    hardware: str = "h100"
    distributed_optimizer: bool = False
    dp: int = 1
    wgrad_headroom: bool = True

    def apply(self, module: Module) -> bool:
        if self.search not in ("window", "global"):
            raise PassError(f"partition: search must be 'window' or 'global', got '{self.search}'")
        if self.solver not in ("cbc", "highs"):
            raise PassError(f"partition: solver must be 'cbc' or 'highs', got '{self.solver}'")
        if module.plan_ops("partition"):
            raise PassError("partition: the module already holds a partition op")
        check_decoder_order(module)
        problem, names, window_cands, sources = self.build_problem(module)
        parallel = ParallelConfig.from_attrs(module.attrs)
        hw = load_hardware(self.hardware)
        balanced = serially_balanced(module, hw, parallel)
        window_problem = PartitionProblem(
            problem.num_layers, problem.pp, problem.vpp, window_cands, problem.meets, problem.cost, problem.memory,
            problem.side_bound, problem._cache,
        )
        try:
            window = solve(window_problem, self.solver, self.time_limit, [balanced])
            chosen = window
            global_sol = None
            if self.search == "global":
                global_sol = solve_global(problem, self.solver, self.time_limit, [window.ranges, balanced])
                chosen = global_sol
        except TesseraError as err:
            raise PassError(f"partition: {err}") from None
        ranges = chosen.ranges
        attrs: dict = {
            "stages": [SymbolRef(names[(s, r)]) for s, r in enumerate(ranges)],
            "layers_per_stage": [r[1] - r[0] + 1 for r in ranges],
            "bottleneck_us": chosen.bottleneck,
            "total_us": chosen.total,
            "megatron_layout": megatron_layout(ranges),
            "search": self.search,
            "solver": self.solver,
            "solve_seconds": round(chosen.seconds, 6),
            "window_bottleneck_us": window.bottleneck,
            "cost_sources": sorted(sources),
        }
        if all(r in window_cands[s] for s, r in enumerate(balanced)):
            attrs["balanced_bottleneck_us"] = problem.evaluate(balanced)[0]
            attrs["balanced_megatron_layout"] = megatron_layout(balanced)
        if global_sol is not None:
            attrs["global_bottleneck_us"] = global_sol.bottleneck
        for when in ("before", "after"):
            size = window.stats.get(when)
            if isinstance(size, dict):
                attrs[f"milp_variables_{when}"] = size["variables"]
                attrs[f"milp_constraints_{when}"] = size["constraints"]
        if problem.memory is not None:
            attrs["memory_capacity_bytes"] = problem.memory.capacity
            attrs["memory_peak_bytes"] = [
                problem.memory.device_bytes(
                    problem.pp, problem.vpp, d, [ranges[d + c * problem.pp] for c in range(problem.vpp)]
                )
                for d in range(problem.pp)
            ]
        module.plan.append(PlanOp("partition", "partition", attrs))
        return True

    def build_problem(
        self, module: Module
    ) -> tuple[PartitionProblem, dict[tuple[int, Range], str], list[list[Range]], set[str]]:
        """The problem the module's candidates and pairs describe, plus names and the window subset."""
        parallel = ParallelConfig.from_attrs(module.attrs)
        hw = load_hardware(self.hardware)
        stages = parallel.virtual_stages
        n = len(module.decoder_layers())
        cand_ops = module.plan_ops("candidate")
        if not cand_ops:
            raise PassError("partition: the module holds no candidate ops; run the 'candidates' pass first")
        cands: list[list[Range]] = [[] for _ in range(stages)]
        window: list[list[Range]] = [[] for _ in range(stages)]
        names: dict[tuple[int, Range], str] = {}
        for op in cand_ops:
            s = op.attrs.get("stage")
            if not isinstance(s, int) or not 0 <= s < stages:
                raise PassError(f"partition: candidate '@{op.name}' has stage {s!r}; expected 0..{stages - 1}")
            first, last = op.attrs.get("first"), op.attrs.get("last")
            if not isinstance(first, int) or not isinstance(last, int) or not 0 <= first <= last < n:
                raise PassError(f"partition: candidate '@{op.name}' has range {first!r}..{last!r}, outside 0..{n - 1}")
            rng = (first, last)
            names.setdefault((s, rng), op.name)
            if rng not in cands[s]:
                cands[s].append(rng)
                if op.attrs.get("in_window", True):
                    window[s].append(rng)
        table = pair_cost_table(module)
        sources: set[str] = set()
        serial_cache: dict[tuple[int, Range, int, Range], float] = {}

        def duration(task) -> float:  # noqa: ANN001
            return task_duration_us(task, hw, parallel)

        def cost(sf: int, rf: Range, sb: int, rb: Range) -> float:
            fwd = stage_layers(module, sf, stages, rf)
            bwd = stage_layers(module, sb, stages, rb)
            key = (tuple(layer.name for layer in fwd), tuple(layer.name for layer in bwd))
            if key in table:
                value, source = table[key]
                sources.add(source)
                return value
            sources.add("serial")
            ck = (sf, rf, sb, rb)
            if ck not in serial_cache:
                serial_cache[ck] = sum(duration(t) for layer in fwd for t in layer.tasks if t.phase is Phase.FWD) + sum(
                    duration(t) for layer in bwd for t in layer.tasks if t.phase is not Phase.FWD
                )
            return serial_cache[ck]

        memory = build_memory_spec(module, parallel, hw_capacity_gib=self.memory_gib or hw.memory_gib, assumptions=MemoryAssumptions(
            dp=self.dp, distributed_optimizer=self.distributed_optimizer, wgrad_headroom=self.wgrad_headroom
        ))
        meets = meeting_stages(parallel.pp, parallel.vpp, parallel.microbatches)
        problem = PartitionProblem(n, parallel.pp, parallel.vpp, [sorted(c) for c in cands], meets, cost, memory)
        return problem, names, [sorted(w) for w in window], sources


def build_memory_spec(
    module: Module, parallel: ParallelConfig, hw_capacity_gib: float, assumptions: MemoryAssumptions
) -> MemorySpec:
    """Memory data of a module: per-layer static and activation bytes summed over a stage's layers."""
    stages = parallel.virtual_stages
    decoder = module.decoder_layers()
    static_prefix, act_prefix = [0], [0]
    for layer in decoder:
        static_prefix.append(static_prefix[-1] + layer_static_bytes(layer, parallel, assumptions))
        act_prefix.append(act_prefix[-1] + layer_activation_bytes(layer))
    ends = {
        "first": [layer for layer in module.layers if layer.role is LayerRole.EMBEDDING],
        "last": [layer for layer in module.layers if layer.role is LayerRole.HEAD],
    }
    end_static = {k: sum(layer_static_bytes(x, parallel, assumptions) for x in v) for k, v in ends.items()}
    end_act = {k: sum(layer_activation_bytes(x) for x in v) for k, v in ends.items()}

    def extra(s: int, table: dict[str, int]) -> int:
        return (table["first"] if s == 0 else 0) + (table["last"] if s == stages - 1 else 0)

    def static(s: int, r: Range) -> int:
        return static_prefix[r[1] + 1] - static_prefix[r[0]] + extra(s, end_static)

    def activation(s: int, r: Range) -> int:
        return act_prefix[r[1] + 1] - act_prefix[r[0]] + extra(s, end_act)

    vectors = {d: inflight_vectors(parallel.pp, parallel.vpp, parallel.microbatches, d) for d in range(parallel.pp)}
    return MemorySpec(static, activation, vectors, int(hw_capacity_gib * GIB), assumptions.wgrad_headroom)


def partition_to_json(module: Module) -> dict:
    """The chosen partition as JSON-ready data (the CLI writes it)."""
    ops = module.plan_ops("partition")
    if not ops:
        raise PassError("no partition op in the module; run the 'partition' pass first")
    op = ops[0]
    parallel = ParallelConfig.from_attrs(module.attrs)
    cands = {c.name: c for c in module.plan_ops("candidate")}
    stages_attr = op.attrs.get("stages", [])
    assert isinstance(stages_attr, list)
    stages = []
    for s, ref in enumerate(stages_attr):
        assert isinstance(ref, SymbolRef)
        cand = cands[ref.name]
        layers = cand.attrs.get("layers", [])
        assert isinstance(layers, list)
        stages.append(
            {
                "stage": s,
                "device": s % parallel.pp,
                "chunk": s // parallel.pp,
                "candidate": ref.name,
                "first": cand.attrs["first"],
                "last": cand.attrs["last"],
                "layers": [x.name for x in layers if isinstance(x, SymbolRef)],
            }
        )
    out = {
        "model": module.name,
        "pp": parallel.pp,
        "vpp": parallel.vpp,
        "stages": stages,
    }
    for key, value in sorted(op.attrs.items()):
        if key != "stages":
            out[key] = value.name if isinstance(value, SymbolRef) else value
    json.dumps(out)  # fail here, not in the writer, if something is not JSON
    return out
