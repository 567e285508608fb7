"""What measured profiling executes for a task: a GEMM of the task's work and aspect ratio, scaled
down, with every dimension a multiple of GEMM_ALIGN (the models' own dimensions are aligned;
odd ones scaled down run slower kernels than the task would)."""

from __future__ import annotations

import pytest

from passes.costs.execution import GEMM_ALIGN, _gemm_shape, align_dim
from tessera_ir.kinds import Phase, Resource, TaskOp
from tessera_ir.model import Task


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
