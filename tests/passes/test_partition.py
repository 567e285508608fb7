"""Partition: MILP vs exact DP, pruning safety, global vs window, memory errors, Megatron layouts, the pass."""

from __future__ import annotations

import random

import pytest

from passes.candidates import CandidatesPass
from passes.partition import PartitionPass, partition_to_json
from passes.partitioning.dp import solve_dp
from passes.partitioning.megatron import expand_megatron_layout, megatron_layout, parse_megatron_layout
from passes.partitioning.memory import MemorySpec, inflight_vectors
from passes.partitioning.milp import solve_milp
from passes.partitioning.problem import MemoryInfeasibleError, PartitionProblem
from passes.partitioning.pruning import prune
from passes.partitioning.ranges import all_candidates, balanced_partition, check_cover, window_candidates
from passes.partitioning.search import global_problem, solve, solve_global
from passes.pipelining.order import meeting_stages
from passes.plan_view import PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import SymbolRef
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


def random_problem(seed: int, window: int | None = None, bounded: bool = False) -> PartitionProblem:
    """A random instance: per-layer work, pair cost = both sides' work scaled by a per-pair random overlap factor."""
    rng = random.Random(seed)
    pp = rng.choice([1, 2, 3])
    vpp = rng.choice([1, 2])
    stages = pp * vpp
    n = rng.randint(stages, stages + 5)
    work = [rng.uniform(1.0, 3.0) for _ in range(n)]

    def cost(sf, rf, sb, rb):
        overlap = random.Random(hash((seed, sf, rf, sb, rb))).uniform(0.6, 1.0)
        return round((sum(work[rf[0] : rf[1] + 1]) + 2 * sum(work[rb[0] : rb[1] + 1])) * overlap, 3)

    if window is None:
        cands = all_candidates(n, stages)
    else:
        bal = balanced_partition(work, stages)
        cands = window_candidates([r[0] for r in bal], n, window)
    def side_bound(s, r, side):
        # The overlap factor is at least 0.6, so 0.6 x each side's work is a valid decomposable bound.
        return 0.6 * (1 if side == "fwd" else 2) * sum(work[r[0] : r[1] + 1])

    problem = PartitionProblem(n, pp, vpp, cands, meeting_stages(pp, vpp, 4 * pp), cost)
    if bounded:
        problem.side_bound = side_bound
    return problem


def same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(a), abs(b))


@pytest.mark.parametrize("seed", range(12))
def test_milp_optimum_equals_dp_optimum(seed):
    problem = random_problem(seed)
    dp = solve_dp(problem)
    milp = solve_milp(problem)
    check_cover(milp.ranges, problem.num_layers)
    assert same(milp.bottleneck, dp.bottleneck), (milp.ranges, dp.ranges)
    assert same(milp.total, dp.total), (milp.ranges, dp.ranges)
    # The single min-max MILP (no threshold search) reaches the same optimum.
    direct = solve_milp(problem, method="minmax")
    assert same(direct.bottleneck, dp.bottleneck) and same(direct.total, dp.total)
    # The DP's answer really is optimal: no cover in the candidates does better (brute force on tiny ones).
    if problem.stages <= 3:
        best = min(problem.evaluate(p)[0] for p in _covers(problem))
        assert same(best, dp.bottleneck)


def _covers(problem):
    def rec(s, start):
        if s == problem.stages:
            if start == problem.num_layers:
                yield []
            return
        for r in problem.candidates[s]:
            if r[0] == start:
                for rest in rec(s + 1, r[1] + 1):
                    yield [r, *rest]

    return list(rec(0, 0))


@pytest.mark.parametrize("seed", range(100, 112))
def test_pruning_never_removes_the_optimum(seed):
    problem = random_problem(seed, window=2, bounded=seed % 2 == 0)
    bal = balanced_partition([1.0] * problem.num_layers, problem.stages)
    plans = [bal] + _covers(problem)[:3]
    pruned = solve_milp(problem, incumbent_plans=plans, use_pruning=True)
    full = solve_milp(problem, use_pruning=False)
    assert same(pruned.bottleneck, full.bottleneck)
    assert same(pruned.total, full.total)
    before, after = pruned.stats["before"], pruned.stats["after"]
    assert after["variables"] <= before["variables"]
    assert after["constraints"] <= before["constraints"]


def test_pruning_shrinks_the_problem_and_keeps_only_pairs_within_the_incumbent():
    problem = random_problem(7, window=2)
    bal = [c for c in _covers(problem)][0]
    incumbent = problem.evaluate(bal)[0]
    pruned = prune(problem, incumbent)
    for (f, g), table in pruned.pairs.items():
        for (a, b), c in table.items():
            assert c <= incumbent * (1 + 1e-9) + 1e-9
            assert a in pruned.candidates[f] and b in pruned.candidates[g]
    # The incumbent itself survives pruning.
    assert all(r in pruned.candidates[s] for s, r in enumerate(bal))


@pytest.mark.parametrize("seed", range(200, 206))
def test_global_is_never_worse_than_window(seed):
    problem = random_problem(seed, window=1)
    window = solve_milp(problem)
    full = global_problem(problem)
    glob = solve_global(full, incumbent_plans=[window.ranges])
    bounded = global_problem(random_problem(seed, window=1, bounded=True))
    assert same(solve_global(bounded, incumbent_plans=[window.ranges]).bottleneck, glob.bottleneck)
    assert glob.bottleneck <= window.bottleneck * (1 + 1e-9)
    assert same(glob.bottleneck, solve_dp(full).bottleneck)


def test_highs_agrees_with_cbc():
    problem = random_problem(3)
    assert same(solve_milp(problem, solver="highs").bottleneck, solve_milp(problem, solver="cbc").bottleneck)


def _memory_problem(capacity: int) -> PartitionProblem:
    n, pp, vpp = 8, 2, 1

    def cost(sf, rf, sb, rb):
        return float(rf[1] - rf[0] + 1 + rb[1] - rb[0] + 1)

    memory = MemorySpec(
        static=lambda s, r: 100 * (r[1] - r[0] + 1),
        activation=lambda s, r: 100 * (r[1] - r[0] + 1),
        vectors={d: inflight_vectors(pp, vpp, 4, d) for d in range(pp)},
        capacity=capacity,
    )
    return PartitionProblem(n, pp, vpp, all_candidates(n, pp * vpp), meeting_stages(pp, vpp, 4), cost, memory)


def test_memory_limit_moves_layers_off_the_first_device():
    # Device 0 holds 2 micro-batches in flight, device 1 one; with k layers on device 0:
    # device 0 needs 100k + 2*100k + 100k (wgrad headroom) = 400k, device 1 needs 300(8 - k).
    free = solve_milp(_memory_problem(10**9))
    assert free.ranges == [(0, 3), (4, 7)]  # 1600 and 1200 bytes
    tight = solve(_memory_problem(1500))
    assert tight.ranges == [(0, 2), (3, 7)]  # 1200 and 1500 bytes: k=4 would need 1600 on device 0


def test_memory_infeasible_error_names_device_needed_and_available():
    # 1000 bytes: device 0 allows k <= 2, device 1 needs 8 - k <= 3: nothing fits.
    with pytest.raises(MemoryInfeasibleError) as err:
        solve(_memory_problem(1000))
    text = str(err.value)
    assert "device 0 needs 1600 bytes" in text
    assert "1000 bytes" in text and "available" in text
    assert isinstance(err.value, TesseraError)


def test_megatron_layout_known_partitions():
    assert megatron_layout([(0, 2), (3, 5), (6, 8), (9, 11)]) == "Et*3|(t*3|)*2t*3L"
    assert megatron_layout([(0, 0), (1, 1)]) == "Et|tL"
    assert megatron_layout([(0, 1), (2, 3), (4, 5)]) == "Et*2|t*2|t*2L"
    assert megatron_layout([(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]) == "Et*2|(t*2|)*3t*2L"
    assert megatron_layout([(0, 3), (4, 5), (6, 7), (8, 9)]) == "Et*4|(t*2|)*2t*2L"
    assert megatron_layout([(0, 3), (4, 5), (6, 7), (8, 9), (10, 12)]) == "Et*4|(t*2|)*3t*3L"
    assert megatron_layout([(0, 1)]) == "Et*2L"


def test_megatron_layout_parser_follows_megatron_syntax():
    # Megatron's documented DeepSeek-V3 example: 32 stages, the 31st an MTP layer, the last only the loss.
    stages = expand_megatron_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32
    assert stages[0] == "Ettt" and stages[1:30] == ["tt"] * 29 and stages[30:] == ["m", "L"]
    assert expand_megatron_layout("E||t|L") == ["E", "", "t", "L"]
    assert expand_megatron_layout("E(t*2|)*2tL") == ["Ett", "tt", "tL"]
    with pytest.raises(TesseraError, match="unclosed"):
        expand_megatron_layout("E(tt|*2")
    with pytest.raises(TesseraError, match="no decoder layer"):
        parse_megatron_layout("E||t|L")


@pytest.mark.parametrize("seed", range(20))
def test_megatron_layout_round_trips(seed):
    rng = random.Random(seed)
    stages = rng.randint(1, 12)
    sizes = [rng.choice([1, 2, 2, 3, 3, 3, 4]) for _ in range(stages)]
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size - 1))
        start += size
    text = megatron_layout(ranges)
    assert parse_megatron_layout(text, num_layers=start) == ranges
    words = expand_megatron_layout(text)
    assert words[0].startswith("E") and words[-1].endswith("L") and len(words) == stages


def _module(n_groups=4, pp=2, vpp=2):
    parallel = ParallelConfig(pp=pp, vpp=vpp, ep=8, microbatches=4 * pp)
    return synthetic_module(QWEN3_NEXT_PATTERN * n_groups, parallel=parallel)


def test_partition_pass_end_to_end_and_json():
    m = _module()
    assert CandidatesPass(window=1).apply(m)
    assert PartitionPass().apply(m)
    (op,) = m.plan_ops("partition")
    cands = {c.name: c for c in m.plan_ops("candidate")}
    ranges = [(cands[r.name].attrs["first"], cands[r.name].attrs["last"]) for r in op.attrs["stages"]]
    check_cover(ranges, 16)
    assert parse_megatron_layout(op.attrs["megatron_layout"], 16) == ranges
    assert op.attrs["bottleneck_us"] <= op.attrs["balanced_bottleneck_us"] * (1 + 1e-9)
    assert op.attrs["milp_variables_after"] <= op.attrs["milp_variables_before"]
    assert op.attrs["cost_sources"] == ["serial"]
    data = partition_to_json(m)
    assert [s["first"] for s in data["stages"]] == [r[0] for r in ranges]
    assert data["stages"][0]["layers"][0] == "embed" and data["stages"][-1]["layers"][-1] == "head"
    assert [s["device"] for s in data["stages"]] == [0, 1, 0, 1]


def test_partition_pass_follows_profiled_pair_costs():
    # Make every pair cheap except those that hold the balanced stage 0: the optimum must move off it.
    m = _module()
    CandidatesPass(window=1).apply(m)
    balanced = [c for c in m.plan_ops("candidate") if c.attrs["stage"] == 0 and c.attrs["last"] == 3]
    assert balanced, "the balanced first stage holds layers 0..3"
    bad = {SymbolRef(balanced[0].name)}
    for pair in PlanView(m).pairs:
        size = len(pair.fwd_layers) + len(pair.bwd_layers)
        refs = {pair.op.attrs["fwd_candidate"], pair.op.attrs["bwd_candidate"]}
        pair.op.attrs["post_overlap_us"] = 1000.0 * size + (10**6 if refs & bad else 0)
    PartitionPass().apply(m)
    (op,) = m.plan_ops("partition")
    assert op.attrs["stages"][0] != SymbolRef(balanced[0].name)
    assert op.attrs["bottleneck_us"] < 10**6
    assert op.attrs["cost_sources"] == ["post_overlap_us"]


def test_partition_pass_global_reports_both_bottlenecks():
    m = _module(n_groups=3, pp=2, vpp=2)
    CandidatesPass(window=1, search="global", global_slack=3.0).apply(m)
    PartitionPass(search="global").apply(m)
    (op,) = m.plan_ops("partition")
    assert op.attrs["global_bottleneck_us"] <= op.attrs["window_bottleneck_us"] * (1 + 1e-9)
    assert op.attrs["bottleneck_us"] == op.attrs["global_bottleneck_us"]


def test_partition_pass_memory_error_is_clear():
    m = _module()
    CandidatesPass(window=1).apply(m)
    with pytest.raises(TesseraError, match=r"device \d+ needs \d+ bytes .* available"):
        m.attrs["memory_gib"] = 0.5
        PartitionPass().apply(m)


def test_partition_pass_refuses_missing_candidates():
    with pytest.raises(TesseraError, match="run the 'candidates' pass first"):
        PartitionPass().apply(_module())


@pytest.mark.slow
def test_pipeline_with_overlap_schedule_and_profile():
    # The real costing passes feed the partition: every pair gets post_overlap_us and the partition reads it.
    from passes.manager import PassManager, parse_pipeline

    m = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=ParallelConfig(pp=2, vpp=1, ep=8, microbatches=4))
    PassManager(parse_pipeline("candidates{window=1},overlap-schedule,profile{mode=analytic},partition")).run(m)
    (op,) = m.plan_ops("partition")
    assert op.attrs["cost_sources"] == ["post_overlap_us"]
    assert op.attrs["bottleneck_us"] <= op.attrs["balanced_bottleneck_us"] * (1 + 1e-9)
    costs = {p.chunks: p.post_overlap_us for p in PlanView(m).pairs}
    cands = {c.name: c for c in m.plan_ops("candidate")}
    chosen = [cands[r.name].attrs["layers"] for r in op.attrs["stages"]]
    worst = max(costs[(tuple(x.name for x in c), tuple(x.name for x in c))] for c in chosen)
    assert worst == pytest.approx(op.attrs["bottleneck_us"])
