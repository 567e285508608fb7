"""The CPU calibration reads every figure as a pair's time is read (the slowest rank's), and its cache
key changes with what it measures. A fake executor stands in for the gloo processes: its ranks run
GEMMs at known, different speeds, so the test checks which rank the calibrated figures follow."""

from __future__ import annotations

from dataclasses import replace

import pytest

import passes.costs.calibration_cache as calibration_cache
from passes.costs.calibrate_cpu import (
    REFERENCE,
    _AtReferenceSpeed,
    _chain_time,
    _copy,
    _gemm_fit,
    _maker,
    calibrate,
    reference_tasks,
    slowest_rank_time,
)
from runtime.pair_executor import ExecTask, PairMeasurement, executed_work

FAST_GFLOPS, SLOW_GFLOPS = 80.0, 40.0  # the two ranks' GEMM throughput
LAUNCH_US = 10.0
COPY_GBPS = 10.0


def _own_us(task: ExecTask, gflops: float) -> float:
    flops, nbytes = executed_work(task)
    if task.resource == "comm":
        return 50.0 + nbytes / 2e3
    if flops:
        return LAUNCH_US + flops / (gflops * 1e3)
    return nbytes / (COPY_GBPS * 1e3)


class TwoSpeedExecutor:
    """Rank 0 runs GEMMs at ``FAST_GFLOPS``, rank 1 at ``SLOW_GFLOPS``; tasks run one after another;
    the reference reads the same time whenever it runs (a machine at constant speed)."""

    world_size = 2
    threads_per_rank = 1
    description = "cpu:fake:world=2:threads=1:gloo"

    def own_us(self, task: ExecTask, gflops: float) -> float:
        return _own_us(task, gflops)

    def measure(self, tasks, repeats=5, warmup=1, reference=None, reference_runs=1):  # noqa: ANN001, ANN201
        tasks = list(tasks)
        fast = {t.name: self.own_us(t, FAST_GFLOPS) for t in tasks}
        slow = {t.name: self.own_us(t, SLOW_GFLOPS) for t in tasks}
        wall = sum(slow.values())
        return PairMeasurement(
            (wall,) * repeats, task_us=fast, task_min_us=fast, task_mean_us=fast, task_end_mean_us=slow,
            reference_us=(sum(self.own_us(t, SLOW_GFLOPS) for t in reference),) * (repeats + 1) if reference else (),
            task_slowest_us=slow, task_slowest_min_us=slow,
        )


@pytest.mark.parametrize("statistic", ["min", "median"])
def test_gemm_figures_follow_the_slowest_rank(statistic: str) -> None:
    data = calibrate(TwoSpeedExecutor(), quick=True, statistic=statistic)  # type: ignore[arg-type]
    peak_gflops = data["peak_tflops"]["fp32"] * 1e3  # type: ignore[index]
    # A pair waits for its slowest rank, so the calibrated GEMM speed is that rank's, not the
    # faster one's (which pooling the ranks' durations would read).
    assert peak_gflops == pytest.approx(SLOW_GFLOPS, rel=0.02)
    assert data["kernel_launch_us"] == pytest.approx(LAUNCH_US, rel=0.05)
    # Its GEMMs take launch + flops / peak exactly: no packing term is fitted.
    assert "fp32" not in data["gemm_packing_gbps"]  # type: ignore[operator]
    # The executor's fixed cost per pair: the chain's wall time over its tasks' (slowest-rank) times.
    assert data["pair_overhead_us"] == pytest.approx(0.0, abs=1e-6)
    # Every All-to-All size read on its own (the slowest rank's duration) on the line it lies on.
    assert data["a2a_latency_us"] == pytest.approx(50.0)
    assert data["nvlink_gbps"] == pytest.approx(2.0)
    # The latency-bound regime: the fake runs tasks one after another, so a small All-to-All beside
    # a GEMM lasts what it lasts alone.
    contention = data["contention"]
    assert contention["latency_bound_comm"] is True  # type: ignore[index]
    assert contention["comm_latency_slowdown_per_compute"] == pytest.approx(0.0)  # type: ignore[index]


def test_slowest_rank_time_reads_the_statistic_asked_for() -> None:
    m = PairMeasurement(
        (1.0,), task_min_us={"t": 1.0}, task_us={"t": 2.0}, task_slowest_us={"t": 4.0}, task_slowest_min_us={"t": 3.0}
    )
    assert slowest_rank_time(m, "t", "min") == 3.0
    assert slowest_rank_time(m, "t", "median") == 4.0


def test_calibration_cache_key_changes_with_the_calibration_version(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    before = calibration_cache.calibration_path(tmp_path)
    monkeypatch.setattr(calibration_cache, "CALIBRATION_VERSION", calibration_cache.CALIBRATION_VERSION + 1)
    assert calibration_cache.calibration_path(tmp_path) != before


class LongRunsSlower(TwoSpeedExecutor):
    """A machine whose tasks run 1.5x slower inside runs longer than 10 ms (others' work interrupts
    long runs, while a lone short task often runs untouched); records the chains it ran."""

    def __init__(self) -> None:
        self.lengths: list[int] = []

    def measure(self, tasks, repeats=5, warmup=1, reference=None, reference_runs=1):  # noqa: ANN001, ANN201
        tasks = list(tasks)
        self.lengths.append(len(tasks))
        m = super().measure(tasks, repeats, warmup, reference, reference_runs)
        if m.samples_us[0] <= 10_000.0:
            return m
        return replace(m, samples_us=tuple(1.5 * x for x in m.samples_us))


def test_throughput_is_read_in_pair_length_chains() -> None:
    ex = LongRunsSlower()
    reference_us = sum(_own_us(t, SLOW_GFLOPS) for t in reference_tasks(REFERENCE))  # what the fake reads
    at_reference = _AtReferenceSpeed(ex, reference_us, "min")  # type: ignore[arg-type]
    task = _maker(_copy, 8 << 20)
    alone = _own_us(task("c0", 0), SLOW_GFLOPS)  # 1.68 ms at 10 GB/s (read and written once)
    per_task = _chain_time(at_reference, task, 3, "min", window_us=20_000.0)
    # About 20 ms of distinct copies back to back: the time a copy takes inside a pair-length run.
    assert max(ex.lengths) == round(20_000.0 / alone)
    assert per_task == pytest.approx(1.5 * alone)
    # A short window reads the lone task's time.
    assert _chain_time(at_reference, task, 3, "min", window_us=2_000.0) == pytest.approx(alone)


class PackingExecutor(TwoSpeedExecutor):
    """GEMMs that also pack their operands and result (3 n^2 elements of a square) at 4 GB/s on
    top of launch + flops / peak, as CPU GEMMs do, on both ranks alike (the reference's GEMM too)."""

    def own_us(self, task: ExecTask, gflops: float) -> float:
        return _own_us(task, gflops) + (executed_work(task)[1] / 4e3 if task.shapes else 0.0)


def test_gemm_operand_packing_is_fitted_beside_peak_and_launch() -> None:
    data = calibrate(PackingExecutor(), statistic="min")  # type: ignore[arg-type]
    assert data["gemm_packing_gbps"]["fp32"] == pytest.approx(4.0, rel=0.02)  # type: ignore[index]
    assert data["peak_tflops"]["fp32"] * 1e3 == pytest.approx(SLOW_GFLOPS, rel=0.02)  # type: ignore[index]
    assert data["kernel_launch_us"] == pytest.approx(LAUNCH_US, rel=0.05)
    # Each size's times are kept beside its sides, so the fit can be checked against them.
    calibration = data["calibration"]
    assert len(calibration["gemm_us"]["fp32"]) == len(calibration["gemm_n"]["fp32"])  # type: ignore[index]
    # A quick calibration (a smoke run: few, short readings) fits the line only.
    quick = calibrate(PackingExecutor(), quick=True, statistic="min")  # type: ignore[arg-type]
    assert quick["gemm_packing_gbps"] == {}


def test_the_gemm_fit_falls_back_to_a_line_without_a_packing_term() -> None:
    sizes = [16, 24, 40, 64, 104, 168, 272]
    launch, per_us, packing = _gemm_fit(sizes, [8.0 + 2 * n**3 / 90e3 for n in sizes], 4)
    assert (launch, per_us, packing) == (pytest.approx(8.0), pytest.approx(90e3), None)
    # Too few sizes for three terms: the line.
    assert _gemm_fit(sizes[:3], [8.0 + 2 * n**3 / 90e3 + 12 * n * n / 5e3 for n in sizes[:3]], 4)[2] is None
