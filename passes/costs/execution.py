"""From a scheduled pair to what the runtime's pair executor runs, and what the model predicts for it.

Measured profiling executes each pair for real (``runtime/pair_executor.py``) with its work
shrunk by one factor, and compares the time with the analytic cost of the *executed* work on
the *measured* device. This module turns a scheduled pair (``pair_costs.ScheduledTask``) into
the executor's plain-data description (``exec_tasks``), prices that description
(``predicted_exec``), names what a measurement depends on (``signature``, the cache key), and
times a pair between readings of the calibration's reference kernel (``measure_normalised``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from passes.costs.contention import ContentionParams, RetimedPair
from passes.costs.durations import analytic_duration_us, comm_bandwidth_share, task_utilisation
from passes.costs.hardware import Hardware
from passes.costs.pair_costs import ScheduledTask, analytic_cost, contended_tasks
from runtime.pair_executor import ExecTask, PairExecutor, PairMeasurement, executed_work
from tessera_ir.kinds import Resource
from tessera_ir.model import Task
from tessera_ir.parallel import ParallelConfig

# Every dimension of an executed GEMM is a multiple of this. The models' own dimensions are
# multiples of 64 or more; scaled down by an arbitrary factor they become odd (565x283x283), and
# on a CPU odd GEMMs run slower (likely the vector kernels' remainder loops) — a slowdown no real
# kernel of the task pays, and one a calibration on aligned sizes does not see (measured:
# docs/records/2026-12-04-cost-model-cpu.md).
GEMM_ALIGN = 8


def align_dim(x: float) -> int:
    """``x`` rounded to the nearest multiple of :data:`GEMM_ALIGN`, at least one multiple."""
    return max(GEMM_ALIGN, GEMM_ALIGN * round(x / GEMM_ALIGN))


def _gemm_shape(task: Task, flops: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """Operands ``(m, k) @ (k, n)`` with ``2mkn ≈ flops`` and the aspect ratio of the task's shapes.

    The frontend records ``[input, output]`` shapes: ``m`` = tokens (all leading
    dimensions of the input), ``k`` = its last dimension, ``n`` = the output's
    last dimension. All three are scaled by one factor, so the executed GEMM
    has the task's FLOPs (after scaling) and its shape, only smaller; then ``k`` and ``n``
    are aligned (:data:`GEMM_ALIGN`) and ``m`` is the aligned row count closest to the FLOPs.
    """
    m0, k0, n0 = 1.0, 1.0, 1.0
    if len(task.shapes) >= 2 and task.shapes[0] and task.shapes[1]:
        m0 = float(math.prod(task.shapes[0][:-1]) or 1)
        k0, n0 = float(task.shapes[0][-1]), float(task.shapes[1][-1])
    c = (flops / (2.0 * m0 * k0 * n0)) ** (1.0 / 3.0)
    k, n = align_dim(k0 * c), align_dim(n0 * c)
    m = align_dim(flops / (2.0 * k * n))
    return (m, k), (k, n)


def exec_tasks(
    items: list[ScheduledTask], scale: float, dtype: str, hw: Hardware, parallel: ParallelConfig
) -> list[ExecTask]:
    """The executor's description of a scheduled pair with its work scaled by ``scale``.

    A compute task runs as the kernel that bounds it on the measured device ``hw`` (its
    roofline side): a GEMM of its FLOPs when compute-bound, a copy of its bytes when
    memory-bound. A GPU kernel overlaps its arithmetic with its memory traffic, so its
    time is the larger of the two; one CPU thread running a GEMM and then a copy would
    take their sum instead, which no GPU kernel does.
    """
    out = []
    for s in items:
        flops = s.task.flops * scale
        nbytes = int(round(s.task.bytes * scale))
        shapes: tuple = ()
        if s.stream == Resource.COMPUTE.value:
            sm_util, mem_util = task_utilisation(s.task, hw, parallel)
            compute_bound = sm_util >= mem_util  # the kernel group that dominates its time
            if compute_bound and flops >= 2:
                shapes = _gemm_shape(s.task, flops)
                nbytes = 0  # the GEMM's own operand traffic is all it moves
            else:
                flops = 0.0
        out.append(ExecTask(
            name=s.task.name, kind=s.task.kind, resource=s.stream, order=s.order, deps=s.deps,
            flops=2 * shapes[0][0] * shapes[0][1] * shapes[1][1] if shapes else 0, bytes=nbytes,
            shapes=shapes, dtype=dtype,
        ))
    return out


def predicted_exec(
    items: list[ScheduledTask],
    execs: list[ExecTask],
    hw: Hardware,
    parallel: ParallelConfig,
    world: int,
    duration: Callable[[ExecTask], float] | None = None,
) -> tuple[RetimedPair, RetimedPair]:
    """Analytic cost (contended, contention-free) of the work the executor really runs on ``hw``.

    Durations are analytic on the measured device: a task's ``duration_us`` is a figure for
    the module's target hardware and the full-size task, so it says nothing about this work.
    ``duration`` replaces them (e.g. each task's measured time on its own), leaving only the
    contention model analytic.
    """
    scaled, given = [], {}
    for s, e in zip(items, execs):
        flops, nbytes = executed_work(e, world)
        # The executed kernel is one plain GEMM or copy: no core share, no per-expert rows.
        scaled.append(replace(s, task=replace(s.task, flops=flops, bytes=nbytes, attrs={})))
        if duration is not None:
            given[s.task.name] = duration(e)
    run = replace(parallel, dtype=execs[0].dtype if execs else parallel.dtype)
    tasks = contended_tasks(
        scaled,
        (lambda t: given[t.name]) if duration is not None else (lambda t: analytic_duration_us(t, hw, run)),
        lambda t: task_utilisation(t, hw, run),
        lambda t: comm_bandwidth_share(t, hw, run),
    )
    return analytic_cost(tasks, ContentionParams.from_hardware(hw, run.ep))


def signature(execs: list[ExecTask], world: int) -> list:
    """What a measurement depends on in the pair: kinds, work, shapes and order — not task names."""
    ordered = sorted(execs, key=lambda e: (e.resource, e.order))
    index = {e.name: i for i, e in enumerate(ordered)}
    return [world] + [
        [e.kind, e.resource, e.order, e.flops, e.bytes, [list(s) for s in e.shapes], e.dtype, sorted(index[d] for d in e.deps)]
        for e in ordered
    ]


@dataclass(frozen=True)
class NormalisedMeasurement:
    """A pair timed between reference-kernel readings: the repeats scaled to the calibrated speed
    (``measurement``: raw time x reference at calibration / reference around that repeat), the
    raw repeats, each repeat's speed ratio (reference around it / at calibration; > 1: slower),
    and the reference readings themselves (one before the first repeat, one after each)."""

    measurement: PairMeasurement
    raw_us: tuple[float, ...]
    ratios: tuple[float, ...]
    reference_readings_us: tuple[float, ...] = ()
    reference_us: float = 0.0

    def at_reference_speed(self, statistic: str) -> float:
        """The pair's time at the calibrated speed: the ``statistic`` (min or median) of the raw
        repeats times the calibrated reference over the same statistic of the readings.

        Both sides take the same statistic, as the calibration did: the fastest repeat over the
        fastest reading (each the least disturbed), or the typical over the typical. The
        fastest of the per-repeat scaled times would instead pick the repeat whose readings
        happened to be disturbed most, a reading biased low."""
        pick = min if statistic == "min" else statistics.median
        return pick(self.raw_us) * self.reference_us / pick(self.reference_readings_us)


# The most reference runs one reading takes (a reading as long as a pair of ~100 references).
MAX_REFERENCE_RUNS = 100


def measure_normalised(
    executor: PairExecutor, tasks: list[ExecTask], repeats: int, reference: list[ExecTask], reference_us: float,
    predicted_us: float = 0.0,
) -> NormalisedMeasurement:
    """Time ``tasks`` ``repeats`` times, each repeat right between two readings of the reference
    kernel, and scale each repeat by ``reference_us`` over the mean of its two readings.

    The machine's speed drifts over seconds (other work sharing it, clock changes); a pair
    measured in a slow second would otherwise be compared with figures calibrated in a fast
    one. Interleaving puts every repeat within milliseconds of its own readings. The pair and
    the reference run on buffers allocated and warmed once, as the calibration reads the
    reference: a reading on fresh buffers pays first-touch page faults (several times the
    reference's warm time on this kind of machine), which would bias every ratio.

    A reading runs the reference back to back until it lasts about the pair's ``predicted_us``:
    other work interrupts a process every few milliseconds, so a 1 ms reference often runs
    untouched where a 30 ms pair never does, and its fastest reading would say the machine is
    faster than the pair could find it.
    """
    runs = max(1, min(MAX_REFERENCE_RUNS, round(predicted_us / reference_us))) if reference_us > 0 else 1
    m = executor.measure(tasks, repeats=repeats, warmup=1, reference=reference, reference_runs=runs)
    refs = m.reference_us
    raw = m.samples_us
    ratios = [(refs[i] + refs[i + 1]) / 2.0 / reference_us for i in range(repeats)]
    scaled = PairMeasurement(
        tuple(r / q for r, q in zip(raw, ratios)), device=executor.description,
        method=f"{executor.method}; each repeat between two reference-kernel readings, scaled to the calibrated speed",
    )
    return NormalisedMeasurement(scaled, tuple(raw), tuple(ratios), tuple(refs), reference_us)
