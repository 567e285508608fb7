"""Describe the local CPU as a ``Hardware`` by running micro-benchmarks (once, then cached).

The analytic cost model needs the same figures for the CPU that the H100/H200
files give for GPUs. They are measured here with the pair executor itself —
the same processes, threads and collectives that measured profiling uses — so
the analytic model and the measurements it is compared against share one
reference. Every reading is the median (or, on request, the fastest) of several repeats,
matching the statistic the measured pairs are compared by (the comm thread's wait for a
core is the exception: a mean, see below), and each repeat is read as a pair's time is: the
slowest rank's.

- matrix-multiply throughput, operand packing and per-task overhead per dtype (fp32, bf16,
  fp16), fitted as ``t = launch + flops / peak + bytes / packing`` over square GEMMs from tiny
  to a few milliseconds (``bytes``: the operands and the result), every side a multiple of 8
  like every executed GEMM's (``execution.GEMM_ALIGN``) → ``peak_tflops``, ``gemm_packing_gbps``
  and ``kernel_launch_us`` (fp32, the executed dtype). The packing term is what the squares'
  times say beyond ``launch + flops / peak``: without it the fitted line priced the pairs'
  small and skinny GEMMs (a few to a few tens of MFLOP, or 3328x160x160) 10-30% short, a
  throughput that depends on FLOPs alone priced the skinny ones worse, and the squares
  themselves run at 50-55 GFLOP/s near 2 MFLOP, 65-75 near 13 and 85-97 from 40 MFLOP up (a
  quick calibration fits the line only, and the fp32 sizes are read in ``GEMM_ROUNDS`` sweeps). This
  and the copy below time each size as a pair-length chain of distinct copies of the task
  (``CHAIN_WINDOW_US``), not one task on its own;
- memory bandwidth from a large tensor copy (bytes read + written per second)
  → ``hbm_gbps``;
- gloo All-to-All between the local processes at nine sizes, each on its own (Theil-Sen fit) →
  ``a2a_latency_us`` and ``nvlink_gbps`` (``t = latency + bytes / bandwidth``; the ranks share one
  "node", so every byte takes that link);
- a fully serial ping-pong chain at two lengths → the cross-stream hand-off
  delay (``contention.cross_stream_sync_us``) and the executor's fixed cost per
  pair (``pair_overhead_us``);
- contention (see ``passes/costs/contention.py``): a GEMM and a copy each timed
  beside a longer All-to-All, a small All-to-All beside a much longer GEMM (the
  comm thread's wait for a core, ``comm_wait_beside_compute_us``), and a large
  All-to-All beside a longer GEMM and a longer copy → ``sm_share_lost``,
  ``comm_hbm_share``, ``comm_slowdown_per_compute``, ``comm_slowdown_per_memory``; the small
  All-to-All's own duration beside the GEMM over alone → ``comm_latency_slowdown_per_compute``
  (how a latency-bound transfer stretches beside busy cores; ``latency_bound_comm`` is set);
- first of all, the *reference kernel* (``reference_tasks``: a GEMM and a copy in a chain,
  a few ms) and its median time → ``reference``. A shared machine's speed
  drifts (other work, clock changes) by up to 2x over seconds, so the reference is read
  before every micro-benchmark's first repeat and after each repeat, and its times are scaled
  by ``reference.us / reference then`` (the same statistic of the readings as of the
  calibrated time): all figures describe the machine at one speed. Measured profiling does
  the same around every repeat of a pair, so measurements taken at any moment compare with
  the calibrated figures. Every reading is taken on buffers allocated and warmed once: a
  reference read on fresh buffers pays first-touch page faults (4-13x its warm time on a
  2-core virtual machine), which once scaled every figure down by that much and put the
  fitted GEMM peak at 3x what one core can do.

The result is written as a hardware JSON file (``calibration_cache.calibration_path``) and
loaded with ``load_hardware``. Calibrating takes a minute or two and runs only when asked:
``tessera-calibrate``, ``tessera-compile --hardware cpu`` on a machine not yet calibrated,
measured profiling, and the cost-model benchmark.
"""

from __future__ import annotations

import os
import socket
import statistics
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from passes.costs.calibration_cache import STATISTICS, WORLD_SIZE, calibration_path, read_calibration, write_calibration
from passes.costs.execution import MAX_REFERENCE_RUNS, align_dim
from passes.costs.hardware import Hardware, hardware_from_data
from passes.costs.profile_cache import software_versions
from runtime.pair_executor import ExecTask, PairExecutor, PairMeasurement, cpu_model_name, executed_work
from tessera_ir.kinds import TaskOp

# Length of the GEMM a small All-to-All is timed beside to read the comm thread's wait
# for a processor: several scheduler time slices (a few ms each), doubled while too short.
WAIT_COVER_US = 20_000.0
# Sweeps over the fp32 GEMM sizes (the executed dtype; see calibrate).
GEMM_ROUNDS = 3
# Bytes per element of each calibrated dtype: a square GEMM of side n packs 3 n^2 of them.
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _gemm(name: str, n: int, dtype: str, order: int = 0) -> ExecTask:
    return ExecTask(name, "gemm", "compute", order, shapes=((n, n), (n, n)), flops=2 * n**3, dtype=dtype)


def _copy(name: str, nbytes: int, order: int = 0) -> ExecTask:
    return ExecTask(name, "copy", "compute", order, bytes=nbytes)


def _a2a(name: str, nbytes: int, order: int = 0) -> ExecTask:
    return ExecTask(name, "all_to_all", "comm", order, bytes=nbytes)


# The reference kernel's sizes: fixed, so every calibration of a machine times the same chain.
REFERENCE: dict[str, object] = {"gemm_n": 256, "copy_bytes": 8 << 20}


class _AtReferenceSpeed:
    """The executor as calibration uses it: the reference kernel is read before a measurement's
    first repeat and after every repeat (on warm buffers, as its calibrated time was read; each
    reading as many runs back to back as make one repeat's length), and
    all the measurement's times are scaled by the reference's calibrated time over the
    ``statistic`` of those readings (the machine's speed at that moment, read as the calibrated
    time was)."""

    def __init__(self, executor: PairExecutor, reference_us: float, statistic: str):
        self.executor = executor
        self.reference = reference_tasks(REFERENCE)
        self.reference_us = reference_us
        self.pick = min if statistic == "min" else statistics.median

    def measure(self, tasks: list[ExecTask], repeats: int = 5, warmup: int = 1) -> PairMeasurement:
        # Each reading as long as one repeat (the reference back to back): a reading much shorter
        # than the benchmark often runs untouched by other work where the benchmark does not.
        length = self.executor.measure(tasks, repeats=1, warmup=1).samples_us[0]
        runs = max(1, min(MAX_REFERENCE_RUNS, round(length / self.reference_us)))
        m = self.executor.measure(tasks, repeats=repeats, warmup=warmup, reference=self.reference, reference_runs=runs)
        factor = self.reference_us / self.pick(m.reference_us)

        def scaled(times: dict[str, float]) -> dict[str, float]:
            return {k: v * factor for k, v in times.items()}

        return PairMeasurement(
            tuple(x * factor for x in m.samples_us), scaled(m.task_us), scaled(m.task_min_us), scaled(m.task_mean_us),
            scaled(m.task_end_mean_us), m.device, m.method, task_slowest_us=scaled(m.task_slowest_us),
            task_slowest_min_us=scaled(m.task_slowest_min_us),
        )


def reference_tasks(spec: dict[str, object]) -> list[ExecTask]:
    """The reference kernel a calibration names in its ``reference`` block: a GEMM, then a copy,
    on the compute thread of every rank. It reads the share of the processors the ranks get at
    that moment; an All-to-All in it would mostly read how long the ranks wait to meet, a
    delay that varies on its own under load and would make the reading noisy."""
    n, copy_bytes = int(spec["gemm_n"]), int(spec["copy_bytes"])  # type: ignore[call-overload]
    gemm = _gemm("ref.gemm", n, "fp32")
    copy = ExecTask("ref.copy", "copy", "compute", 1, (gemm.name,), bytes=copy_bytes)
    return [gemm, copy]


def slowest_rank_time(m: PairMeasurement, name: str, statistic: str) -> float:
    """Task ``name``'s duration in ``m`` as a pair's time is read: per repeat the slowest rank's,
    then the ``statistic`` over repeats.

    A pair's time, and every reading of the reference kernel, is the slowest rank's: the ranks
    meet at each All-to-All, so a rank that lost its core for a moment holds up both. Pooling the
    ranks' durations instead (``task_min_us``) reads the fastest rank, which on a machine shared
    with other work can be far faster than the slower one, and GEMM figures calibrated that way
    price every pair's GEMMs short (docs/records/2026-12-04-cost-model-cpu.md)."""
    return (m.task_slowest_min_us if statistic == "min" else m.task_slowest_us)[name]


def _task_time(ex: _AtReferenceSpeed, tasks: list[ExecTask], name: str, repeats: int, statistic: str) -> float:
    return slowest_rank_time(ex.measure(tasks, repeats=repeats, warmup=1), name, statistic)


# How long a throughput micro-benchmark runs per repeat: the task back to back, on distinct
# buffers, for about this long (at most MAX_CHAIN copies), read as the chain's time over its
# length. Pairs run for milliseconds to tens of milliseconds, and on a shared machine a task timed
# on its own in a window of a few ms reads far faster than the same task inside a pair-length run,
# even scaled by reference readings of the same lengths; calibrated on such short readings, the
# compute of the pairs is priced well short of what it takes (the readings:
# docs/records/2026-12-04-cost-model-cpu.md).
CHAIN_WINDOW_US = 20_000.0
MAX_CHAIN = 1000


def _maker(kind: Callable[..., ExecTask], *args: object) -> Callable[[str, int], ExecTask]:
    """``make(name, order)`` for :func:`_chain_time`: ``kind(name, *args, order)``."""
    return lambda name, order: kind(name, *args, order)


def _chain_time(
    ex: _AtReferenceSpeed, make: Callable[[str, int], ExecTask], repeats: int, statistic: str, window_us: float,
) -> float:
    """Time of one task ``make(name, order)`` as it runs inside a pair-length run: a chain of
    distinct copies lasting about ``window_us``, its time (the ``statistic`` of the repeats, each the
    slowest rank's wall time, at the reference speed) over its length. The executor's fixed cost per
    pair (``pair_overhead_us``, a few hundred µs at most) is shared by the chain's tasks."""
    probe = ex.executor.measure([make("c0", 0)], repeats=1, warmup=1).samples_us[0]
    count = max(1, min(MAX_CHAIN, round(window_us / max(probe, 1.0))))
    m = ex.measure([make(f"c{i}", i) for i in range(count)], repeats=repeats, warmup=1)
    return (m.min_us if statistic == "min" else m.median_us) / count


def _weighted_fit(x: list[float], y: list[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x`` with weights 1/y^2 (relative errors); returns ``(a, b)``."""
    w = [1.0 / max(v, 1e-9) ** 2 for v in y]
    sw = sum(w)
    mx = sum(wi * xi for wi, xi in zip(w, x)) / sw
    my = sum(wi * yi for wi, yi in zip(w, y)) / sw
    sxx = sum(wi * (xi - mx) ** 2 for wi, xi in zip(w, x))
    if sxx <= 0:
        return 0.0, my / mx if mx > 0 else 0.0
    b = sum(wi * (xi - mx) * (yi - my) for wi, xi, yi in zip(w, x, y)) / sxx
    if b <= 0:  # noise made larger GEMMs look no slower: fall back to the largest one
        return 0.0, y[-1] / x[-1]
    return my - b * mx, b


def _gemm_fit(
    sizes: list[int], times: list[float], esize: int, packing: bool = True,
) -> tuple[float, float, float | None]:
    """``(launch µs, peak FLOP/µs, packing bytes/µs or None)`` of ``t = launch + flops / peak +
    bytes / packing`` over square GEMMs of sides ``sizes`` taking ``times`` µs, least squares with
    weights 1/t^2 (relative errors, so small and large sizes count alike). Without ``packing``, or
    where the three-term fit gives no positive throughput or packing rate (too few sizes, noise),
    the two-term line ``launch + flops / peak`` of :func:`_weighted_fit` and no packing term."""
    flops = [2.0 * n**3 for n in sizes]
    nbytes = [3.0 * n * n * esize for n in sizes]
    if packing and len(sizes) >= 4:
        # Weights 1/t^2 on the squared residuals: each row divided by its time. Columns scaled to
        # unit size first (the unknowns differ by twelve orders of magnitude).
        design = np.array([[1.0, f, b] for f, b in zip(flops, nbytes)]) / np.array(times)[:, None]
        scale = np.abs(design).max(axis=0)
        x = np.linalg.lstsq(design / scale, np.ones(len(times)), rcond=None)[0] / scale
        # Kept only where packing is a measurable part of some size's time (above 1%): a term
        # fitted to rounding noise would write an absurd rate into the description.
        if x[1] > 0 and x[2] > 0 and max(x[2] * b / t for b, t in zip(nbytes, times)) > 0.01:
            return max(0.1, float(x[0])), 1.0 / float(x[1]), 1.0 / float(x[2])
    intercept, slope = _weighted_fit(flops, times)
    return max(0.1, intercept), 1.0 / max(slope, 1e-12), None


def _theil_sen(x: list[float], y: list[float]) -> tuple[float, float]:
    """Robust line ``y = a + b x``: b = median of pairwise slopes, a = median of ``y - b x``."""
    slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(len(x)) for j in range(i + 1, len(x)) if x[j] != x[i]]
    b = statistics.median(slopes)
    return statistics.median(yi - b * xi for xi, yi in zip(x, y)), b


def calibrate(executor: PairExecutor, quick: bool = False, statistic: str = "median") -> dict[str, object]:
    """Run the micro-benchmarks on ``executor`` and return a hardware description (JSON-ready).

    ``statistic`` picks the reading of each micro-benchmark's repeats: ``median`` (the
    typical time, comparable with median pair measurements) or ``min`` (the fastest,
    comparable with min pair measurements).
    """
    if statistic not in STATISTICS:
        raise ValueError(f"statistic must be one of {STATISTICS}, got '{statistic}'")
    repeats = 3 if quick else 7
    # The reference speed: the reference kernel's typical (or fastest) time, read first.
    first = executor.measure(reference_tasks(REFERENCE), repeats=4 * repeats + 1, warmup=1)
    reference: dict[str, object] = dict(REFERENCE, us=first.min_us if statistic == "min" else first.median_us)
    at_reference = _AtReferenceSpeed(executor, float(reference["us"]), statistic)  # type: ignore[arg-type]

    def task_time(tasks: list[ExecTask], name: str, n: int) -> float:
        return _task_time(at_reference, tasks, name, n, statistic)

    window_us = CHAIN_WINDOW_US / 4 if quick else CHAIN_WINDOW_US

    def chain_time(make: Callable[[str, int], ExecTask], n: int) -> float:
        return _chain_time(at_reference, make, n, statistic, window_us)

    target_us = 800.0 if quick else 4000.0  # long enough for a stable reading, short enough to stay cheap
    max_n = 384 if quick else 1536

    # Throughput, packing and per-task overhead per dtype: t = launch + flops / peak + bytes /
    # packing fitted over square GEMMs from tiny to a few milliseconds (the executed tasks span
    # that whole range; see the module docstring).
    peak: dict[str, float] = {}
    packing: dict[str, float] = {}
    launch: dict[str, float] = {}
    gemm_n: dict[str, list[int]] = {}
    gemm_us: dict[str, list[float]] = {}
    for dtype in ("fp32", "bf16", "fp16"):
        sizes, times = [], []
        n = 16
        while True:
            t = chain_time(_maker(_gemm, n, dtype), repeats)
            sizes.append(n)
            times.append(t)
            if t >= target_us or n >= max_n:
                break
            n = min(max_n, align_dim(n * 1.6))  # aligned, as every executed GEMM is
        if dtype == "fp32" and not quick:
            # The executed dtype: every size read in GEMM_ROUNDS sweeps and the sweeps' statistic
            # taken per size. One sweep can read a larger GEMM slower per FLOP than a smaller one,
            # and three terms fitted on it then put the peak well above what the pairs' GEMMs reach.
            sweeps = [times] + [[chain_time(_maker(_gemm, k, dtype), repeats) for k in sizes] for _ in range(GEMM_ROUNDS - 1)]
            combine = min if statistic == "min" else statistics.median
            times = [combine(col) for col in zip(*sweeps)]
        # A quick calibration's few, short readings fit the line only: three terms on them put the
        # peak at twice what one core does.
        launch[dtype], per_us, pack_per_us = _gemm_fit(sizes, times, DTYPE_BYTES[dtype], packing=not quick)
        peak[dtype] = per_us / 1e6  # FLOP per µs -> TFLOP/s
        if pack_per_us is not None:
            packing[dtype] = pack_per_us / 1e3  # bytes per µs -> GB/s
        gemm_n[dtype] = sizes
        gemm_us[dtype] = times
    launch_us = launch["fp32"]

    copy_bytes = (8 if quick else 64) << 20
    copy_us = chain_time(_maker(_copy, copy_bytes), repeats)
    hbm_gbps = copy_bytes / (copy_us * 1e-6) / 1e9

    # t = latency + bytes / bandwidth over the sizes, fitted by Theil-Sen (median of the
    # pairwise slopes, then the median intercept): one disturbed reading cannot tilt it.
    small, large = 8 << 10, (2 if quick else 16) << 20
    # Dense where pairs' transfers lie (a few to a few hundred kB at the executed scale): there a
    # lone All-to-All is latency-bound, with no step, and single readings scatter widely, so the
    # robust line through nine sizes prices them better than any one reading.
    sizes = [4 << 10, small, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10, large // 4, large]  # bytes
    # Each size on its own, not as a chain: back-to-back All-to-Alls make the ranks meet again and
    # again, and a chain of them reads a latency far from what the comm-heavy pairs then take.
    times = [task_time([_a2a("a", b)], "a", 3 * repeats if b < (1 << 20) else repeats) for b in sizes]
    sent = [executed_work(_a2a("a", b), executor.world_size)[1] for b in sizes]  # as durations will read them
    latency_us, slope = _theil_sen([float(b) for b in sent], times)
    slope = max(slope, 1e-6)  # µs per byte; guards against a noisy non-increasing fit
    a2a_gbps = 1.0 / slope / 1e3
    latency_us = max(1.0, latency_us)

    # Cross-stream hand-off and the executor's fixed cost per pair: a ping-pong chain
    # (tiny GEMM -> small All-to-All -> tiny GEMM ...) is fully serial, so its wall time
    # minus its tasks' own times is overhead = fixed + handoffs * sync; two chain lengths
    # separate the two terms.
    def excess(links: int) -> tuple[float, int]:
        chain: list[ExecTask] = []
        for i in range(links):
            prev = (chain[-1].name,) if chain else ()
            chain.append(ExecTask(f"c{i}", "tiny", "compute", i, prev, shapes=((1, 1), (1, 1)), flops=2))
            chain.append(ExecTask(f"a{i}", "all_to_all", "comm", i, (f"c{i}",), bytes=small))
        m = at_reference.measure(chain, repeats=2 * repeats)
        tasks_us = sum(slowest_rank_time(m, t.name, statistic) for t in chain)
        return max(0.0, (m.min_us if statistic == "min" else m.median_us) - tasks_us), 2 * links - 1

    (e1, h1), (e2, h2) = excess(1), excess(6)
    sync_us = max(0.0, (e2 - e1) / (h2 - h1))
    pair_overhead_us = max(0.0, e1 - sync_us * h1)

    # Contention: the task of interest must be fully covered by a longer neighbour.
    dtype = "fp32"
    n_gemm = gemm_n[dtype][-1]
    gemm_alone = task_time([_gemm("g", n_gemm, dtype)], "g", repeats)
    a2a_cover = int(min(256 << 20, 3 * gemm_alone * 1e-6 * a2a_gbps * 1e9))
    beside = task_time([_gemm("g", n_gemm, dtype), _a2a("a", a2a_cover)], "g", repeats)
    sm_share_lost = min(0.9, max(0.0, 1.0 - gemm_alone / beside))

    copy_alone = copy_us
    a2a_cover = int(min(256 << 20, 3 * copy_alone * 1e-6 * a2a_gbps * 1e9))
    beside = task_time([_copy("c", copy_bytes), _a2a("a", a2a_cover)], "c", repeats)
    comm_hbm_share = min(0.9, max(0.0, 1.0 - copy_alone / beside))

    # A comm thread beside a busy compute thread (on every rank: as many busy threads as
    # cores) first waits for a processor, then runs somewhat slower. The wait is additive
    # (about one scheduler time slice), so it is read from a small, latency-bound
    # All-to-All beside a much longer GEMM: t_beside = t_alone + wait. The stretch is read
    # from the large one, after taking the same wait off: t_beside = wait + t_alone (1 + s).
    def cover_n(us: float) -> int:  # a GEMM of about ``us`` microseconds (time ~ n^3)
        return max(n_gemm, align_dim(n_gemm * (us / gemm_alone) ** (1 / 3)))

    # The reading is the All-to-All's end time from the pair's start, not its duration:
    # the comm thread's own wake-up waits for a core too, before its timer starts. The
    # wait is paid by some All-to-Alls and not by others (whether the scheduler lets the
    # comm thread preempt at once), so it is read as a mean, the expectation that a
    # pair's many comm tasks add up, whatever the statistic of the other readings.
    def wait_reading(tasks: list[ExecTask], n: int) -> float:
        return at_reference.measure(tasks, repeats=n, warmup=1).task_end_mean_us["a"]

    wait_bytes = 64 << 10  # small enough to be latency-bound
    small_alone = wait_reading([_a2a("a", wait_bytes)], 3 * repeats)
    cover_us = WAIT_COVER_US
    for _ in range(3):
        beside = wait_reading([_a2a("a", wait_bytes), _gemm("g", cover_n(cover_us), dtype)], 3 * repeats)
        if beside < 0.5 * cover_us:  # the GEMM outlasted the wait: a clean reading
            break
        cover_us *= 2  # the wait ran into the end of the GEMM: measure again beside a longer one
    comm_wait_us = max(0.0, beside - small_alone)
    # The same small, latency-bound All-to-All's own duration (from when its thread runs) beside
    # that GEMM over alone: how much its latency stretches beside busy cores.
    latency_alone = task_time([_a2a("a", wait_bytes)], "a", 3 * repeats)
    latency_beside = task_time([_a2a("a", wait_bytes), _gemm("g", cover_n(cover_us), dtype)], "a", 3 * repeats)
    comm_latency_slowdown = max(0.0, latency_beside / latency_alone - 1.0)

    # Read by end times as well, so that the wait taken off is the one that was measured.
    a2a_bytes = large
    a2a_alone = wait_reading([_a2a("a", a2a_bytes)], repeats)
    # A GEMM about three times longer than the All-to-All and its wait.
    beside = wait_reading([_a2a("a", a2a_bytes), _gemm("g", cover_n(3 * (a2a_alone + comm_wait_us)), dtype)], repeats)
    comm_slowdown_per_compute = max(0.0, (beside - comm_wait_us) / a2a_alone - 1.0)
    copy_cover = int(min(512 << 20, copy_bytes * 3 * (a2a_alone + comm_wait_us) / copy_alone))
    beside = wait_reading([_a2a("a", a2a_bytes), _copy("c", copy_cover)], repeats)
    comm_slowdown_per_memory = max(0.0, (beside - comm_wait_us) / a2a_alone - 1.0)

    try:
        memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError, AttributeError):
        memory_gib = 0.0
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return {
        "name": "cpu",
        "description": (
            f"local CPU ({cpu_model_name()}): {executor.world_size} gloo processes x "
            f"{executor.threads_per_rank} thread(s), comm on a second thread"
        ),
        "source": f"calibrated by micro-benchmarks on {socket.gethostname()} at {now}",
        "peak_tflops": peak,
        "hbm_gbps": hbm_gbps,
        "memory_gib": memory_gib,
        # The ranks are local processes: one "node", its links the measured gloo All-to-All.
        "nvlink_gbps": a2a_gbps,
        "nic_gbps": a2a_gbps,
        "gpus_per_node": executor.world_size,
        "a2a_latency_us": latency_us,
        # Compute units: the rank's threads. Communication runs on its own thread,
        # so it takes no unit outright; its interference is the measured contention.
        "total_sms": executor.threads_per_rank,
        "comm_sms": 0,
        "kernel_launch_us": launch_us,
        "gemm_packing_gbps": packing,
        # Fixed cost of starting a pair in the executor (thread wake-up, barrier exit skew);
        # the profile pass adds it to the predicted cost of every pair on this device.
        "pair_overhead_us": pair_overhead_us,
        # The chain measured profiling times beside every pair to follow the machine's speed.
        "reference": reference,
        # The executor runs every compute task as a GEMM (plus copies), so every
        # kind reaches the measured GEMM throughput.
        "efficiency": {op.value: 1.0 for op in TaskOp},
        "contention": {
            "sm_share_lost": sm_share_lost,
            "comm_hbm_share": comm_hbm_share,
            "comm_slowdown_per_compute": comm_slowdown_per_compute,
            "comm_slowdown_per_memory": comm_slowdown_per_memory,
            "cross_stream_sync_us": sync_us,
            "comm_wait_beside_compute_us": comm_wait_us,
            "latency_bound_comm": True,
            "comm_latency_slowdown_per_compute": comm_latency_slowdown,
            "calibrated": True,
        },
        "calibration": {
            "device": executor.description,
            "versions": software_versions(),
            "quick": quick,
            "statistic": statistic,
            "repeats": repeats,
            "gemm_n": gemm_n,
            "gemm_us": gemm_us,
            "launch_us": launch,
            "copy_bytes": copy_bytes,
            "a2a_bytes": sent,
            "a2a_us": times,
            "when": now,
            "host": socket.gethostname(),
        },
    }


def cpu_hardware(
    cache_dir: str | Path | None = None,
    refresh: bool = False,
    executor: PairExecutor | None = None,
    quick: bool = False,
    statistic: str = "median",
    announce: Callable[[Path], None] | None = None,
) -> Hardware:
    """The calibrated ``cpu`` hardware: from the cache, or measured now (and cached).

    ``executor`` reuses running worker processes (a profiling run passes its own,
    so processes start once); otherwise a temporary one is started. Calibrations
    by ``median`` and by ``min`` are cached separately. ``announce`` is called with
    the cache path just before a measurement starts (a progress message for the user).
    """
    threads = executor.threads_per_rank if executor else None
    cached = None if refresh else read_calibration(cache_dir, WORLD_SIZE, threads, statistic)
    if cached is not None:
        return cached
    if announce is not None:
        announce(calibration_path(cache_dir, WORLD_SIZE, threads, statistic))
    if executor is not None:
        data = calibrate(executor, quick=quick, statistic=statistic)
    else:
        with PairExecutor(world_size=WORLD_SIZE) as ex:
            data = calibrate(ex, quick=quick, statistic=statistic)
    return hardware_from_data(data, write_calibration(data, cache_dir, WORLD_SIZE, threads, statistic))
