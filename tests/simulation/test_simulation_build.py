"""From a planned module to the simulator's input: orders, programs, transfers, reductions."""

from __future__ import annotations

import pytest

from passes.pipelining.order import rank_order
from passes.plan_view import PlanView
from passes.simulation.build import BuildError, BuildOptions, SimulationBuilder, even_ranges, partition_ranges
from passes.simulation.engine import simulate
from passes.simulation.program import BWD, COMM
from passes.simulation.slots import static_timeline

from planned_modules import planned


def test_every_rank_runs_the_combined_1f1b_order() -> None:
    module = planned()
    builder = SimulationBuilder(PlanView(module))
    inp = builder.build()
    p = builder.parallel
    for r, actions in enumerate(inp.ranks):
        expected = [(a.direction, a.stage(r, p.pp), a.microbatch) for a in rank_order(p.pp, p.vpp, p.microbatches, r, combined=True)]
        got = []
        for action in actions:
            if action.fwd is not None:
                got.append(("fwd", *action.fwd))
            if action.bwd is not None:
                got.append(("bwd", *action.bwd))
        assert got == expected
        # Steady-state steps are pairs: one action runs a forward beside a backward.
        assert any(a.fwd is not None and a.bwd is not None for a in actions)


def test_a_scheduled_pair_runs_alone_in_its_post_overlap_cost() -> None:
    module = planned()
    builder = SimulationBuilder(PlanView(module))
    builder.build()
    costs = {pair.chunks: pair.post_overlap_us for pair in PlanView(module).pairs}
    checked = 0
    for key, program in builder.programs.items():
        if builder.sources.get(key) is not None:
            assert static_timeline(program.tasks).makespan == pytest.approx(costs[key], rel=1e-9)
            checked += 1
    assert checked > 0


def test_routed_tasks_are_the_moe_all_to_alls_and_expert_gemms() -> None:
    builder = SimulationBuilder(PlanView(planned()))
    builder.build()
    for program in builder.programs.values():
        for t in program.tasks:
            op = t.name.split(".")[1]
            assert (t.routed >= 0) == (op in ("dispatch", "combine", "expert_gemm")), t.name
            if t.stream == COMM:
                assert t.kind in ("dispatch", "combine")
            if t.routed >= 0:
                side, layer = program.routed_layers[t.routed]
                assert t.name.startswith(f"l{layer}.") and (side == BWD) == (not t.name.endswith(".fwd"))


def test_transfers_reductions_memory_and_flops() -> None:
    module = planned()
    one = SimulationBuilder(PlanView(module), BuildOptions(dp=1)).build()
    many = SimulationBuilder(PlanView(module), BuildOptions(dp=8)).build()
    assert one.activation_bytes == 4096 * 1024 * 2  # seq_len × hidden × bf16
    assert all(x == 0.0 for row in one.grad_reduce_us for x in row)  # nothing to reduce without data parallelism
    assert all(x > 0.0 for row in many.grad_reduce_us for x in row)
    assert many.tokens_per_iteration == 8 * one.tokens_per_iteration
    assert all(m < o for m, o in zip(many.static_bytes, one.static_bytes))  # optimizer state sharded over dp
    assert one.flops_per_iteration == sum(t.flops for t in module.tasks()) * 4
    assert simulate(many).iteration_us >= simulate(one).iteration_us


def test_other_partitions_and_schedulers() -> None:
    module = planned(groups=2, pp=2, vpp=2)
    assert even_ranges(module, 4) == ((0, 1), (2, 3), (4, 5), (6, 7))
    plan = simulate(SimulationBuilder(PlanView(module)).build()).iteration_us
    for method in ("gap-fit", "fixed-template", "serial"):
        builder = SimulationBuilder(PlanView(module), BuildOptions(method=method, ranges=even_ranges(module, 4)))
        assert simulate(builder.build()).iteration_us > 0
    serial = simulate(SimulationBuilder(PlanView(module), BuildOptions(method="serial")).build()).iteration_us
    assert serial > plan
    with pytest.raises(BuildError, match="unknown schedule method"):
        SimulationBuilder(PlanView(module), BuildOptions(method="magic"))
    with pytest.raises(BuildError, match="3 stage ranges"):
        SimulationBuilder(PlanView(module)).build(((0, 1), (2, 3), (4, 7)))


def test_a_module_without_partition_is_refused() -> None:
    module = planned()
    module.plan = [op for op in module.plan if op.op != "partition"]
    with pytest.raises(BuildError, match="no partition"):
        partition_ranges(PlanView(module))
