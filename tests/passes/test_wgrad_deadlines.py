"""The wgrad-deadlines pass: deadlines where memory binds them, schedules that meet them, none otherwise."""

from __future__ import annotations

import copy
from pathlib import Path

from passes.overlap_schedule import check_plan_schedules
from passes.plan_view import PlanView
from passes.scheduling.pair_dag import BWD, PairDAG, PairTask
from passes.wgrad_deadlines import backward_first, chunk_deadlines
from tessera.api import run_passes
from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Module
from tessera_ir.parser import parse_module

# A 4-layer MoE model on PP=2 whose expert GEMMs' output gradients are 16 MiB each.
INPUT = Path(__file__).parent / "filecheck" / "wgrad-deadlines.tir"


def _module() -> Module:
    module = parse_module(INPUT.read_text())
    run_passes(module, "candidates{window=1}")
    return module


def _deadlines(module: Module) -> dict[str, float]:
    return {t.name: float(t.attrs["deadline"]) for t in module.tasks() if "deadline" in t.attrs}  # type: ignore[arg-type]


def _finishes(module: Module) -> list[dict[str, float]]:
    """Per pair, every task's finish time in its schedule."""
    view = PlanView(module)
    out = []
    for pair in view.pairs:
        sched = view.schedule(pair.name)
        names = [t.name for t in view.pair_dag(pair).tasks]
        out.append({name: sched.finish(i) for i, name in enumerate(names)})
    return out


def test_deadlines_bind_and_the_schedules_meet_them():
    serial, bound = _module(), _module()
    bound.attrs["memory_gib"] = 12.0  # a run-wide setting, in the header
    run_passes(bound, "wgrad-deadlines")
    deadlines = _deadlines(bound)
    assert set(deadlines) == {"l1.expert_gemm.wgrad", "l2.expert_gemm.wgrad", "l3.expert_gemm.wgrad"}
    # They bind: a valid schedule that ignores them (every task back to back, the wgrads last)
    # finishes expert wgrads after them. (gap-fit's own schedules of this model meet them unasked;
    # tests/passes/scheduling covers deadlines that move the heuristic's and CP-SAT's schedules.)
    run_passes(serial, "overlap-schedule{method=serial cache=false}")
    late = [
        (name, at) for pair in _finishes(serial) for name, at in pair.items() if name in deadlines and at > deadlines[name]
    ]
    assert late, "a schedule that ignores the deadlines meets them everywhere: the test binds nothing"
    run_passes(bound, "overlap-schedule{cache=false}")
    assert check_plan_schedules(bound) == len(bound.plan_ops("pair_schedule"))  # valid, z3 included
    for pair in _finishes(bound):
        for name, at in pair.items():
            if name in deadlines:
                assert at <= deadlines[name] + 1e-9, (name, at, deadlines[name])


def test_no_deadline_where_the_device_holds_every_output_gradient():
    module = _module()
    run_passes(module, "wgrad-deadlines")  # the h100's 80 GiB
    assert _deadlines(module) == {}


def test_a_second_run_replaces_the_first_runs_deadlines():
    module = _module()
    module.attrs["memory_gib"] = 12.0  # a run-wide setting, in the header
    run_passes(module, "wgrad-deadlines")
    assert _deadlines(module)
    del module.attrs["memory_gib"]  # the target hardware's memory: room for every output gradient
    run_passes(module, "wgrad-deadlines")
    assert _deadlines(module) == {}


def _side(sizes: list[int]) -> tuple[PairDAG, dict[str, int]]:
    """A backward chain: per layer a dgrad (100 µs) and a wgrad (50 µs) after it, the next dgrad after the dgrad."""
    tasks: list[PairTask] = []
    holds = {}
    for k, size in enumerate(sizes):
        prev = (len(tasks) - 2,) if tasks else ()
        tasks.append(PairTask(f"d{k}", "expert_gemm.dgrad", Resource.COMPUTE, 100.0, prev, BWD, f"l{k}"))
        tasks.append(PairTask(f"w{k}", "expert_gemm.wgrad", Resource.COMPUTE, 50.0, (len(tasks) - 1,), BWD, f"l{k}", True))
        holds[f"w{k}"] = size
    return PairDAG("side", tasks), holds


def test_the_rule_keeps_held_output_gradients_within_the_budget():
    side, holds = _side([10, 10, 10, 0, 10])
    # Budget 25: two gradients fit, a third does not: w0 must finish before w2's gradient appears (at 300 µs,
    # the end of d2), w1 before w4's (w3 holds nothing); w2 and w4 have no later gradient to make room for.
    assert chunk_deadlines(side, holds.__getitem__, 25) == {"w0": 300.0, "w1": 500.0}
    # Budget 5: even one gradient overflows: each must finish before the next one appears.
    assert chunk_deadlines(side, holds.__getitem__, 5) == {"w0": 200.0, "w1": 300.0, "w2": 500.0}
    # Enough memory for all: nothing binds.
    assert chunk_deadlines(side, holds.__getitem__, 40) == {}


def test_a_deadline_is_never_before_the_task_can_finish():
    side, holds = _side([10, 10])
    # w0 cannot finish before 150 µs, although w1's gradient appears at 200 µs at the earliest: 200.
    assert chunk_deadlines(side, holds.__getitem__, 0) == {"w0": 200.0}
    # The reference backward-first schedule runs every task in DAG order as early as it can.
    start = backward_first(side)
    assert start == [0.0, 100.0, 150.0, 250.0]


def test_the_pass_leaves_forward_tasks_alone():
    module = _module()
    before = copy.deepcopy([t.attrs for t in module.tasks() if t.phase is Phase.FWD])
    module.attrs["memory_gib"] = 12.0  # a run-wide setting, in the header
    run_passes(module, "wgrad-deadlines")
    assert [t.attrs for t in module.tasks() if t.phase is Phase.FWD] == before
