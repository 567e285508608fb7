"""Profile-guided pruning of the partition problem, before any solver runs.

An incumbent plan (the serially balanced partition, costed with the same pair costs, when it
fits in memory) bounds the optimum's bottleneck from above. Any pair dearer than the
incumbent cannot be in a better plan, so it is dropped; a candidate left without a partner
in some meeting, whose memory alone cannot fit, or that is no longer part of a contiguous
cover is dropped; repeat to a fixed point. The optimum survives: all its pairs cost at most
its bottleneck ≤ the incumbent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from passes.partitioning.problem import PartitionProblem
from passes.partitioning.ranges import REL_TOL, Range, reachable

Combo = tuple[int, int]  # (forward stage, backward stage)


@dataclass
class Pruned:
    candidates: list[list[Range]]
    # (f, g) with f != g -> {(a, b): cost}; (f, f) -> {(a, a): cost}
    pairs: dict[Combo, dict[tuple[Range, Range], float]]
    incumbent: float | None


def meetings(problem: PartitionProblem) -> list[Combo]:
    return [c for d in range(problem.pp) for c in problem.meets[d]]




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
                if need > mem.budget:
                    out[s].discard(r)
    return out


def prune(problem: PartitionProblem, incumbent: float | None) -> Pruned:
    """Profile-guided pruning to a fixed point (see the module docstring). ``incumbent=None``: cover only."""
    limit = float("inf") if incumbent is None else incumbent * (1 + REL_TOL) + 1e-9
    combos = meetings(problem)
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



def prune_from(problem: PartitionProblem, pruned: Pruned, limit: float) -> Pruned:
    """Re-prune an already pruned problem against a lower limit (no new pair costs are needed)."""
    tables = pruned.pairs
    # Costs of pairs pruned earlier are above the old limit, hence above the new one: the
    # side-bound shortcut is not needed, and pairs missing from the old tables must stay out.
    sub = replace(
        problem,
        candidates=pruned.candidates,
        cost=lambda f, a, g, b: tables.get((f, g), {}).get((a, b), float("inf")),
        side_bound=None,
        cost_cache={},
    )
    return prune(sub, limit)

