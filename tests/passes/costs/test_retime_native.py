"""The contention model's C++ event loop against its Python reference: bitwise the same times.

``contention.retime`` runs the loop in C++ (``passes/costs/csrc/retime.cpp``) and
``contention.retime_reference`` is the Python definition it follows statement for statement;
every start, finish and makespan must be the same double, in the same event order, and a
deadlocking stream order must be refused with the same message."""

from __future__ import annotations

import random

import pytest

from passes.costs.contention import (
    ContendedTask,
    ContentionError,
    ContentionParams,
    RetimedPair,
    retime,
    retime_reference,
)
from passes.costs.hardware import load_hardware


def random_params(rng: random.Random) -> ContentionParams:
    if rng.random() < 0.15:
        return ContentionParams.none()
    return ContentionParams(
        rng.choice([0.0, rng.uniform(0.0, 0.9)]), rng.choice([0.0, rng.uniform(0.0, 0.9)]),
        rng.uniform(0.0, 2.0), rng.uniform(0.0, 2.0),
        cross_stream_sync_us=rng.choice([0.0, rng.uniform(0.0, 30.0)]),
        comm_wait_beside_compute_us=rng.choice([0.0, rng.uniform(0.0, 500.0)]),
        latency_bound_comm=rng.random() < 0.5, comm_latency_slowdown_per_compute=rng.uniform(0.0, 4.0),
        comm_gbps_beside_compute=rng.choice([0.0, rng.uniform(1.0, 400.0)]),
    )


def random_tasks(rng: random.Random, acyclic: bool) -> list[ContendedTask]:
    """Up to 40 tasks; with ``acyclic`` the dependencies point to earlier tasks and each stream runs
    in list order (never a deadlock), otherwise to any task in any order (deadlocks happen)."""
    n = rng.randint(1, 40)
    resources = [rng.choice(["compute", "comm"]) for _ in range(n)]
    orders = list(range(n)) if acyclic else [rng.randint(0, n // 2) for _ in range(n)]  # ties too
    tasks = []
    for i in range(n):
        pool = range(i) if acyclic else [j for j in range(n) if j != i]
        deps = tuple(f"t{j}" for j in pool if rng.random() < 3.0 / max(1, len(pool)))
        duration = rng.choice([0.0, float(rng.randint(1, 50)), rng.uniform(0.0, 5000.0), rng.expovariate(0.01)])
        sm = rng.choice([1.0, rng.uniform(0.0, 1.0), 0.0])
        mem = rng.choice([0.0, 1.0 - sm, rng.uniform(0.0, 1.0)])
        gbps = rng.choice([0.0, rng.uniform(0.0, 600.0)]) if resources[i] == "comm" else 0.0
        tasks.append(ContendedTask(f"t{i}", resources[i], duration, orders[i], deps, sm, mem, rng.uniform(0.0, 1.0), gbps))
    return tasks


def outcome(fn, tasks: list[ContendedTask], params: ContentionParams) -> RetimedPair | str:  # noqa: ANN001
    try:
        return fn(tasks, params)
    except ContentionError as err:
        return str(err)


def assert_same(native: RetimedPair | str, reference: RetimedPair | str) -> None:
    if isinstance(reference, str) or isinstance(native, str):
        assert native == reference
        return
    # Bitwise: the same doubles, recorded in the same event order.
    assert list(native.start.items()) == list(reference.start.items())
    assert list(native.finish.items()) == list(reference.finish.items())
    assert native.makespan == reference.makespan and native.isolated_sum == reference.isolated_sum


@pytest.mark.parametrize("acyclic", [True, False])
def test_native_loop_gives_the_reference_times_on_random_schedules(acyclic: bool) -> None:
    rng = random.Random(20261202 + acyclic)
    refused = 0
    for _ in range(1500):
        tasks, params = random_tasks(rng, acyclic), random_params(rng)
        reference = outcome(retime_reference, tasks, params)
        refused += isinstance(reference, str)
        assert_same(outcome(retime, tasks, params), reference)
    if acyclic:
        assert refused == 0
    else:
        assert 0 < refused < 1500  # both kinds of outcome were compared


def test_native_loop_gives_the_reference_times_on_planned_pairs() -> None:
    """Every pair of a planned module, re-timed with a GPU's and a calibrated CPU's parameters."""
    from passes.costs.pair_costs import contended_tasks
    from passes.manager import PassManager, parse_pipeline
    from passes.plan_view import PlanView
    from tessera_ir.parallel import ParallelConfig

    from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

    module = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=ParallelConfig(pp=2, vpp=2, ep=8, microbatches=8))
    PassManager(parse_pipeline("candidates,overlap-schedule{cache=false}")).run(module)
    view = PlanView(module)
    cpu_like = ContentionParams(
        0.0, 0.34, 0.6, 0.9, cross_stream_sync_us=16.4, comm_wait_beside_compute_us=5020.0, latency_bound_comm=True,
        comm_latency_slowdown_per_compute=3.67,
    )
    params = [ContentionParams.from_hardware(load_hardware("h100"), 8), cpu_like, ContentionParams.none()]
    pairs = [p for p in view.pairs if p.schedule is not None]
    assert pairs
    for pair in pairs:
        tasks = contended_tasks(view.scheduled_tasks(pair), view.duration, view.utilisation)
        for p in params:
            assert_same(retime(tasks, p), retime_reference(tasks, p))


def test_refusals_name_the_same_tasks() -> None:
    deadlock = [ContendedTask("g1", "compute", 1.0, 0, ("g2",)), ContendedTask("g2", "compute", 1.0, 1)]
    for fn in (retime, retime_reference):
        with pytest.raises(ContentionError, match="g1 wait on later tasks"):
            fn(deadlock, ContentionParams.none())
        with pytest.raises(ContentionError, match="'ghost', which is not in the schedule"):
            fn([ContendedTask("g1", "compute", 1.0, 0, ("ghost",))], ContentionParams.none())
        with pytest.raises(ContentionError, match="names repeat"):
            fn([ContendedTask("g", "compute", 1.0, 0), ContendedTask("g", "comm", 1.0, 0)], ContentionParams.none())
