"""What measured profiling executes for a task: a GEMM of the task's work and aspect ratio, scaled
down, with every dimension a multiple of GEMM_ALIGN (the models' own dimensions are aligned;
odd ones scaled down run slower kernels than the task would)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from passes.costs.durations import analytic_duration_us
from passes.costs.execution import GEMM_ALIGN, _gemm_shape, align_dim, exec_tasks, predicted_exec
from passes.costs.hardware import load_hardware
from passes.costs.pair_costs import ScheduledTask
from runtime.pair_executor import executed_work
from tessera_ir.kinds import Phase, Resource, TaskOp
from tessera_ir.model import Task
from tessera_ir.parallel import ParallelConfig


def gemm_task(tokens: int, k: int, n: int) -> Task:
    return Task(
        "l0.expert_gemm.fwd", TaskOp.EXPERT_GEMM, Phase.FWD, Resource.COMPUTE, flops=2 * tokens * k * n,
        shapes=[[1, tokens, k], [1, tokens, n]],
    )


def test_align_dim_rounds_to_the_nearest_multiple_and_never_to_zero() -> None:
    assert align_dim(283) == 280 and align_dim(285) == 288
    assert align_dim(1) == GEMM_ALIGN and align_dim(0) == GEMM_ALIGN
    assert align_dim(64) == 64


@pytest.mark.parametrize(("tokens", "k", "n", "scale"), [(8192, 4096, 4096, 1e-3), (8192, 2048, 512, 1e-3), (4096, 2048, 151936, 1e-4), (37, 11, 5, 1.0)])
def test_executed_gemms_are_aligned_and_keep_the_work_and_shape(tokens: int, k: int, n: int, scale: float) -> None:
    task = gemm_task(tokens, k, n)
    flops = task.flops * scale
    (m, k2), (k3, n2) = _gemm_shape(task, flops)
    assert k2 == k3
    assert all(d % GEMM_ALIGN == 0 and d >= GEMM_ALIGN for d in (m, k2, n2))
    if min(m, k2, n2) >= 32 * GEMM_ALIGN:  # large enough that rounding moves little
        assert 2 * m * k2 * n2 == pytest.approx(flops, rel=0.03)
        # The aspect ratio of the task's own operands, within rounding.
        assert k2 / n2 == pytest.approx(k / n, rel=0.03)
        assert m / k2 == pytest.approx(tokens / k, rel=0.03)
    # The row count absorbs the rounding of the others: the work is off by less than half an
    # aligned block of rows (or the rows are at their smallest).
    assert abs(m - flops / (2 * k2 * n2)) <= GEMM_ALIGN / 2 or m == GEMM_ALIGN


def test_given_durations_replace_the_analytic_ones_and_nothing_else() -> None:
    hw, parallel = load_hardware("h100"), ParallelConfig(ep=2, dtype="fp32")
    gemm = gemm_task(4096, 1024, 1024)
    a2a = Task("l0.dispatch.fwd", TaskOp.DISPATCH, Phase.FWD, Resource.COMM, bytes=1 << 24)
    items = [ScheduledTask(a2a, "comm", 0, ()), ScheduledTask(gemm, "compute", 0, (a2a.name,))]
    execs = exec_tasks(items, 1e-2, "fp32", hw, parallel)
    analytic, _ = predicted_exec(items, execs, hw, parallel, 2)

    def same_as_analytic(e):  # noqa: ANN001, ANN202
        flops, nbytes = executed_work(e, 2)
        task = next(s.task for s in items if s.task.name == e.name)
        return analytic_duration_us(replace(task, flops=flops, bytes=nbytes, attrs={}), hw, parallel)

    again, _ = predicted_exec(items, execs, hw, parallel, 2, same_as_analytic)
    assert again.makespan == analytic.makespan
    fixed, free = predicted_exec(items, execs, hw, parallel, 2, lambda e: 100.0)
    # Serial (the GEMM waits for the transfer): 200 µs plus the hand-off, whatever the work.
    assert fixed.isolated_sum == free.isolated_sum == 200.0
    assert fixed.makespan >= free.makespan >= 200.0
