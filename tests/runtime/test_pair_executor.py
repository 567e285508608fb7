"""The pair executor: validation without processes, and a real run on two gloo processes."""

from __future__ import annotations

import pytest
import torch

from runtime.pair_executor import (
    ExecTask,
    PairExecutionError,
    PairExecutor,
    executed_work,
    gemm_dims,
    topological_issue_order,
    validate_pair,
)


def gemm(name: str, order: int, deps: tuple[str, ...] = (), n: int = 64) -> ExecTask:
    return ExecTask(name, "expert_gemm.fwd", "compute", order, deps, flops=2 * n**3, shapes=((n, n), (n, n)))


def a2a(name: str, order: int, deps: tuple[str, ...] = (), nbytes: int = 1 << 16) -> ExecTask:
    return ExecTask(name, "dispatch.fwd", "comm", order, deps, bytes=nbytes)


def test_descriptions_that_would_fail_or_deadlock_are_refused():
    with pytest.raises(PairExecutionError, match="repeat"):
        validate_pair([gemm("a", 0), gemm("a", 1)])
    with pytest.raises(PairExecutionError, match="not in the pair"):
        validate_pair([gemm("a", 0, ("ghost",))])
    with pytest.raises(PairExecutionError, match="share a stream order"):
        validate_pair([gemm("a", 0), gemm("b", 0)])
    # a2a waits for g2, which comes after g1 on compute, and g1 waits for a2a: a cycle.
    with pytest.raises(PairExecutionError, match="deadlocks"):
        validate_pair([gemm("g1", 0, ("x",)), gemm("g2", 1), a2a("x", 0, ("g2",))])
    with pytest.raises(PairExecutionError, match="inner dimension"):
        validate_pair([ExecTask("g", "k", "compute", 0, shapes=((4, 5), (6, 7)))])
    with pytest.raises(PairExecutionError, match="dtype"):
        validate_pair([ExecTask("g", "k", "compute", 0, flops=16, dtype="int4")])


def test_issue_order_respects_streams_and_dependencies():
    tasks = [gemm("g1", 0), a2a("x", 0, ("g1",)), gemm("g2", 1), gemm("g3", 2, ("x",))]
    order = [t.name for t in topological_issue_order(tasks)]
    assert order.index("g1") < order.index("x") < order.index("g3")
    assert order.index("g2") < order.index("g3")


def test_executed_work_accounts_for_rounding_and_extra_memory_traffic():
    # No shapes: a cube with the task's FLOPs.
    cube = ExecTask("g", "k", "compute", 0, flops=2 * 10**3)
    assert gemm_dims(cube) == (10, 10, 10)
    assert executed_work(cube) == (2000, 3 * 100 * 4)
    # A memory-bound task moves its bytes with a copy beyond the GEMM's own traffic.
    mem = ExecTask("m", "k", "compute", 0, flops=0, bytes=1 << 20)
    assert executed_work(mem) == (0, 1 << 20)
    # All-to-All bytes are rounded to a multiple of (world size x element size).
    assert executed_work(a2a("x", 0, nbytes=4 * 7), world_size=2) == (0, 4 * 6)


def test_cuda_is_refused_cleanly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(PairExecutionError, match="no CUDA device"):
        PairExecutor(world_size=1, device="cuda")


@pytest.mark.slow
def test_a_small_pair_really_runs_on_two_gloo_processes():
    tasks = [
        gemm("l0.attention.fwd", 0),
        a2a("l0.dispatch.fwd", 0, ("l0.attention.fwd",)),
        gemm("l1.expert_gemm.dgrad", 1),
        gemm("l0.expert_gemm.fwd", 2, ("l0.dispatch.fwd",)),
        a2a("l0.combine.fwd", 1, ("l0.expert_gemm.fwd",)),
        ExecTask("l1.router.dgrad", "router.dgrad", "compute", 3, flops=0, bytes=1 << 18),
    ]
    with PairExecutor(world_size=2, threads_per_rank=1, timeout_s=120) as ex:
        first = ex.measure(tasks, repeats=3)
        # The same processes serve a second pair (started once per profiling run).
        second = ex.measure(tasks[:1], repeats=2)
        # A reference chain read before the first repeat and after each, on its own buffers.
        reference = [gemm("ref.gemm", 0), ExecTask("ref.copy", "copy", "compute", 1, ("ref.gemm",), bytes=1 << 16)]
        beside = ex.measure(tasks[:1], repeats=3, reference=reference, reference_runs=2)
        # A request the workers cannot run comes back as an error naming the rank,
        # instead of hanging the caller.
        for conn in ex._conns:
            conn.send(("run", "not a task list", 1, 0, None, 1))
        with pytest.raises(PairExecutionError, match="rank 0 failed"):
            ex._receive(0, "executing a broken request")
    assert first.repeats == 3 and len(first.samples_us) == 3
    assert first.reference_us == () and second.reference_us == ()
    assert beside.repeats == 3 and len(beside.reference_us) == 4 and all(r > 0 for r in beside.reference_us)
    assert set(beside.task_us) == {tasks[0].name}
    assert all(s > 0 for s in first.samples_us)
    assert first.median_us > 0 and first.spread_us >= 0
    assert first.spread_us == max(first.samples_us) - min(first.samples_us)
    assert set(first.task_us) == {t.name for t in tasks}
    assert all(v > 0 for v in first.task_us.values())
    assert set(first.task_mean_us) == set(first.task_end_mean_us) == set(first.task_us)
    assert all(first.task_min_us[n] <= first.task_mean_us[n] for n in first.task_us)
    # Read as the pair's time is (per repeat the slowest rank's): never faster than the pooled
    # fastest reading, and the shortest over repeats no longer than the median.
    assert set(first.task_slowest_us) == set(first.task_slowest_min_us) == set(first.task_us)
    assert all(first.task_min_us[n] <= first.task_slowest_min_us[n] <= first.task_slowest_us[n] for n in first.task_us)
    # End times count from the pair's start: each task ends after its own duration, and a
    # task ends after the tasks it depends on (which ran to completion first, on every rank).
    assert all(first.task_end_mean_us[n] >= first.task_min_us[n] for n in first.task_us)
    for t in tasks:
        for d in t.deps:
            assert first.task_end_mean_us[t.name] > first.task_end_mean_us[d]
    assert second.repeats == 2 and second.median_us > 0
    assert "gloo" in first.device and "gloo" in first.method


def test_the_executor_imports_without_the_runtime_extension():
    # A GPU host that only measures pairs need not build runtime._core: importing the executor
    # loads no extension; the FSM names load it when first used.
    import subprocess
    import sys

    code = (
        "import sys, runtime.pair_executor\n"
        "assert 'runtime._core' not in sys.modules, 'the executor loaded the extension'\n"
        "import runtime\n"
        "assert runtime.FSM is runtime._core.FSM and 'runtime._core' in sys.modules\n"
        "assert runtime.Program is runtime._core.Program\n"
        "try:\n"
        "    runtime.no_such_name\n"
        "except AttributeError as err:\n"
        "    assert 'no_such_name' in str(err)\n"
        "else:\n"
        "    raise AssertionError('an unknown name resolved')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
