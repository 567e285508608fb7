"""Contention model: what a pair schedule costs when its two streams really overlap.

Summing isolated durations is wrong in both directions: overlap hides
communication, but the kernels that run side by side also slow each other
down. On a GPU an All-to-All kernel occupies ``comm_sms`` of the ``total_sms``
streaming multiprocessors and streams its buffers through HBM, so a GEMM
beside it has fewer SMs and less bandwidth; a memory-bound kernel in turn
slows the All-to-All, which also needs HBM. (On CPU the compute thread and the
communication thread compete for cores and memory in the same way.)

Model (parameters in the hardware JSON under ``"contention"``; defaults below):

Each compute task has an isolated roofline duration ``d = launch + max(c, m)``
with ``c = flops / (peak * eff)`` and ``m = bytes / hbm``, and two utilisations
of the resources it needs while running alone:

    u_sm  = c / max(c, m)      (1 for compute-bound kernels)
    u_mem = m / max(c, m)      (1 for memory-bound kernels)

(``durations.task_utilisation`` computes both from the same roofline terms.)

While a communication task runs beside it, the compute task keeps only
``a_sm = 1 - sm_share_lost`` of the SMs and ``a_mem = 1 - comm_hbm_share`` of
the bandwidth, and progresses at the roofline rate under those reduced
resources:

    rate_compute = min(1, a_sm / u_sm, a_mem / u_mem)

    sm_share_lost  = comm_sms / total_sms               (unless given)
    comm_hbm_share = comm_hbm_bytes_per_byte * a2a_gbps / hbm_gbps

While a compute task runs beside it, a communication task progresses at

    rate_comm = 1 / (1 + comm_slowdown_per_compute * u_sm + comm_slowdown_per_memory * u_mem)

— its kernels wait for memory behind a memory-bound neighbour (and, on CPU,
for a core behind a compute-bound one). A task running alone progresses at
rate 1, so without overlap the model gives the isolated durations exactly.

A communication task that finds the compute stream busy may first have to wait
for a processor: ``comm_wait_beside_compute_us`` (0 on GPUs, whose comm kernels
own their SMs). On a CPU with as many busy compute threads as cores, the comm
thread is runnable but not running until the scheduler preempts a compute
thread (about one time slice, milliseconds) — an additive delay, not a
stretch, so it dominates small All-to-Alls and barely matters for large ones.
The comm task makes no progress (and takes nothing from its neighbour) during
that wait, which is spent only while a compute task runs: when the compute
stream idles the comm thread gets a core at once and the wait is over.

A *latency-bound* comm task (``latency_bound_comm``, set by the CPU calibration; off for GPUs) is
priced by the share ``b`` of its isolated duration spent moving bytes (``durations.comm_bandwidth_share``;
the rest is latency). On CPU such a task is a thread that mostly sleeps between messages: beside it a
compute task keeps ``1 - sm_share_lost * b`` of the cores (and ``1 - comm_hbm_share * b`` of the
bandwidth), and the comm task itself progresses at
``1 / (1 + (b * comm_slowdown_per_compute + (1 - b) * comm_latency_slowdown_per_compute) * u_sm +
comm_slowdown_per_memory * u_mem)``: its messages wait for a core at every wake-up. (Executed task by
task, the tiny model's pairs showed exactly that: their 32-96 kB All-to-Alls took 1.0-4.6x their
lone time inside a pair while the GEMMs beside them kept their lone speed, where the 16 MB readings
the other figures come from said the opposite.) Its wait for a processor is not over when
the compute stream idles: the thread sleeps again on its next message, and once compute resumes it
waits for a core again, so it stalls whenever compute runs until it has waited
``(1 - b) * comm_wait_beside_compute_us`` in all (the latency part's share of the slice; the first
stall, before it ever ran, may take the whole wait). Timed beside one GEMM of 0.3-20 ms, a 32 kB
All-to-All's median duration was the GEMM's length plus its own up to about a time slice (3-9 ms),
and beside a chain of 60 µs GEMMs about the chain's length: it does not get a core between the
chain's tasks. At ``b = 1`` the rates and the wait are the ones above.

On a GPU a transfer kernel shares the SMs with the compute kernels beside it, and there it moves
at most ``comm_gbps_beside_compute`` GB/s (0: no such cap): a comm task whose bytes move faster
than that alone (``ContendedTask.gbps``, its bytes over its isolated duration) progresses at no
more than ``comm_gbps_beside_compute / gbps`` while compute runs. Measured on an H200 with a
transfer kernel of 20 blocks (``bench/bench_cost_model_gpu.py``): inside the pairs of an EP8 plan
a 320 GB/s transfer took 1.6x its lone time whatever the compute kernel beside it, a 56 GB/s one
(EP32) 1.00x; on their tasks' own measured times the model without the cap predicted the EP8 4K
pairs 16-20% short (mean over two runs' pairs), with it 4.1-4.4% off (the cap read from one run's
pairs, checked on another's).

A dependency that crosses streams costs ``cross_stream_sync_us`` before the
waiting task may start (a CUDA stream waiting on an event: a few µs, left at 0
for GPUs; a CPU thread woken by another: tens to hundreds of µs, calibrated).

Re-timing is event driven and exact for piecewise-constant rates: each stream
runs its tasks in schedule order, a task starts when its stream is free and
its dependencies have finished (that is how streams with cross-stream events
execute), each running task has ``remaining`` isolated microseconds of work,
and time advances to the next task completion at the current rates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from passes.costs.hardware import Hardware
from support.extensions import load_extension
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource

# TESSERA_RETIME_EXTENSION names another build of the event loop (the sanitizer build `make test`
# runs the contention tests against); normally the package's own.
if TYPE_CHECKING:
    from passes.costs import _retime
else:
    _retime = load_extension("passes.costs._retime", "TESSERA_RETIME_EXTENSION")

COMPUTE = Resource.COMPUTE.value
COMM = Resource.COMM.value

# Defaults for hardware files without a "contention" block. An All-to-All
# reads its send buffer and writes its receive buffer: two HBM bytes per byte
# sent. The slowdown of comm beside a memory-bound kernel is a moderate 25%
# (NCCL-style kernels are latency- and NIC-bound, HBM is rarely their limit).
DEFAULT_COMM_HBM_BYTES_PER_BYTE = 2.0
DEFAULT_COMM_SLOWDOWN_PER_MEMORY = 0.25
DEFAULT_COMM_SLOWDOWN_PER_COMPUTE = 0.0


class ContentionError(TesseraError):
    """A schedule the contention model cannot re-time."""


@dataclass(frozen=True)
class ContentionParams:
    sm_share_lost: float  # fraction of compute throughput a running comm kernel takes away
    comm_hbm_share: float  # fraction of memory bandwidth a running comm kernel takes away
    comm_slowdown_per_compute: float  # comm stretch per unit of neighbour SM utilisation
    comm_slowdown_per_memory: float  # comm stretch per unit of neighbour memory utilisation
    cross_stream_sync_us: float = 0.0  # delay before a task whose dependency ran on the other stream may start
    comm_wait_beside_compute_us: float = 0.0  # a comm task's wait for a processor while compute runs
    # Latency-bound comm (on CPU: a thread that sleeps between messages): the compute slowdown a comm
    # task causes scales with its bandwidth share, and its own latency part stretches at this rate.
    latency_bound_comm: bool = False
    comm_latency_slowdown_per_compute: float = 0.0
    # GB/s a transfer keeps while a compute kernel runs beside it (GPUs; 0: no cap)
    comm_gbps_beside_compute: float = 0.0

    def __post_init__(self) -> None:
        for name in ("sm_share_lost", "comm_hbm_share"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ContentionError(f"contention parameter {name} = {value} must lie in [0, 1)")
        for name in (
            "comm_slowdown_per_compute", "comm_slowdown_per_memory", "cross_stream_sync_us", "comm_wait_beside_compute_us",
            "comm_latency_slowdown_per_compute", "comm_gbps_beside_compute",
        ):
            if getattr(self, name) < 0.0:
                raise ContentionError(f"contention parameter {name} = {getattr(self, name)} must be >= 0")

    @classmethod
    def none(cls) -> ContentionParams:
        """No interference: overlapped tasks keep their isolated speed."""
        return cls(0.0, 0.0, 0.0, 0.0)

    @classmethod
    def from_hardware(cls, hw: Hardware, ep: int = 1) -> ContentionParams:
        block = hw.extra.get("contention", {})
        if not isinstance(block, dict):
            raise ContentionError(f"hardware '{hw.name}': 'contention' must be a JSON object")
        sm_lost = block.get("sm_share_lost")
        if sm_lost is None:
            sm_lost = hw.comm_sms / hw.total_sms if hw.total_sms else 0.0
        hbm_share = block.get("comm_hbm_share")
        if hbm_share is None:
            per_byte = float(block.get("comm_hbm_bytes_per_byte", DEFAULT_COMM_HBM_BYTES_PER_BYTE))
            hbm_share = min(0.95, per_byte * hw.a2a_gbps(ep) / hw.hbm_gbps) if hw.hbm_gbps > 0 else 0.0
        return cls(
            sm_share_lost=float(sm_lost),
            comm_hbm_share=float(hbm_share),
            comm_slowdown_per_compute=float(block.get("comm_slowdown_per_compute", DEFAULT_COMM_SLOWDOWN_PER_COMPUTE)),
            comm_slowdown_per_memory=float(block.get("comm_slowdown_per_memory", DEFAULT_COMM_SLOWDOWN_PER_MEMORY)),
            cross_stream_sync_us=float(block.get("cross_stream_sync_us", 0.0)),
            comm_wait_beside_compute_us=float(block.get("comm_wait_beside_compute_us", 0.0)),
            latency_bound_comm=bool(block.get("latency_bound_comm", False)),
            comm_latency_slowdown_per_compute=float(block.get("comm_latency_slowdown_per_compute", 0.0)),
            comm_gbps_beside_compute=float(block.get("comm_gbps_beside_compute", 0.0)),
        )


@dataclass(frozen=True)
class ContendedTask:
    """One task of a pair schedule as the contention model sees it."""

    name: str
    resource: str  # "compute" or "comm"
    duration: float  # isolated microseconds
    order: int  # position on its stream
    deps: tuple[str, ...] = ()
    sm_util: float = 1.0  # compute tasks: SM utilisation when alone
    mem_util: float = 0.0  # compute tasks: memory-bandwidth utilisation when alone
    bandwidth_share: float = 1.0  # comm tasks: the share of the isolated duration spent moving bytes
    gbps: float = 0.0  # comm tasks: GB/s its bytes move at alone (bytes over the isolated duration)


@dataclass(frozen=True)
class RetimedPair:
    start: dict[str, float]
    finish: dict[str, float]
    makespan: float
    isolated_sum: float  # sum of isolated durations (fully serial execution)

    def stretch(self, tasks: Sequence[ContendedTask]) -> dict[str, float]:
        """Contended over isolated duration, per task (1.0: not slowed)."""
        return {t.name: (self.finish[t.name] - self.start[t.name]) / t.duration if t.duration > 0 else 1.0 for t in tasks}


def compute_rate(task: ContendedTask, params: ContentionParams, share: float = 1.0) -> float:
    """Progress rate of a compute task while a comm task runs beside it, one that moves bytes for
    ``share`` of its time (below 1 only for latency-bound comm; see the module docstring)."""
    rate = 1.0
    if task.sm_util > 0:
        rate = min(rate, (1.0 - params.sm_share_lost * share) / task.sm_util)
    if task.mem_util > 0:
        rate = min(rate, (1.0 - params.comm_hbm_share * share) / task.mem_util)
    return rate


def capped(rate: float, task: ContendedTask, params: ContentionParams) -> float:
    """A comm task's ``rate`` beside compute, held to ``comm_gbps_beside_compute`` (module docstring)."""
    cap = params.comm_gbps_beside_compute
    if cap > 0.0 and task.gbps > cap:
        return min(rate, cap / task.gbps)
    return rate


def comm_rate(neighbour: ContendedTask, params: ContentionParams, share: float = 1.0) -> float:
    """Progress rate of a comm task, moving bytes for ``share`` of its time, while compute task
    ``neighbour`` runs beside it (its latency part stretches at the latency rate)."""
    per_compute = params.comm_slowdown_per_compute
    if share < 1.0:
        per_compute = share * per_compute + (1.0 - share) * params.comm_latency_slowdown_per_compute
    return 1.0 / (1.0 + per_compute * neighbour.sm_util + params.comm_slowdown_per_memory * neighbour.mem_util)


def _checked_index(tasks: Sequence[ContendedTask]) -> dict[str, int]:
    """Each task's position in ``tasks``, after refusing what cannot be re-timed."""
    index = {t.name: i for i, t in enumerate(tasks)}
    if len(index) != len(tasks):
        raise ContentionError("task names repeat in the schedule")
    for t in tasks:
        if t.resource not in (COMPUTE, COMM):
            raise ContentionError(f"task '{t.name}' has resource '{t.resource}'; use 'compute' or 'comm'")
        if t.duration < 0:
            raise ContentionError(f"task '{t.name}' has negative duration {t.duration}")
        for d in t.deps:
            if d not in index:
                raise ContentionError(f"task '{t.name}' depends on '{d}', which is not in the schedule")
    return index


def _deadlock(names: Sequence[str]) -> ContentionError:
    return ContentionError(f"the stream order deadlocks: {', '.join(names)} wait on later tasks of their streams")


def retime(tasks: Sequence[ContendedTask], params: ContentionParams) -> RetimedPair:
    """Execute the schedule event by event under the contention model (see the module docstring).

    The event loop runs in C++ (``passes/costs/csrc/retime.cpp``, the extension
    :mod:`passes.costs._retime`): the loop of :func:`retime_reference` statement for statement, on
    the same doubles in the same order, so the two give bitwise-identical times (the tests compare
    them on thousands of random schedules). The profile pass re-times every distinct pair twice
    and the simulator every program, so this loop is hot: in Python it was about a twentieth of a
    cold compile of make demo's model.
    """
    index = _checked_index(tasks)
    start, finish, started, finished, stuck = _retime.retime(
        [t.duration for t in tasks], [0 if t.resource == COMPUTE else 1 for t in tasks], [t.order for t in tasks],
        [[index[d] for d in t.deps] for t in tasks], [t.sm_util for t in tasks], [t.mem_util for t in tasks],
        [t.bandwidth_share for t in tasks], [t.gbps for t in tasks], params.sm_share_lost, params.comm_hbm_share,
        params.comm_slowdown_per_compute, params.comm_slowdown_per_memory, params.cross_stream_sync_us,
        params.comm_wait_beside_compute_us, params.latency_bound_comm, params.comm_latency_slowdown_per_compute,
        params.comm_gbps_beside_compute,
    )
    if stuck:
        raise _deadlock([tasks[i].name for i in stuck])
    start_of = {tasks[i].name: start[i] for i in started}
    finish_of = {tasks[i].name: finish[i] for i in finished}
    return RetimedPair(start_of, finish_of, max(finish_of.values(), default=0.0), sum(t.duration for t in tasks))


def retime_reference(tasks: Sequence[ContendedTask], params: ContentionParams) -> RetimedPair:
    """:func:`retime` in Python: the definition the C++ loop follows and is tested against.

    Tasks are held by their index in ``tasks``; every time is computed by the same operations in
    the same order as written in the docstring's terms, so the result does not depend on how the
    loop is written.
    """
    index = _checked_index(tasks)
    names = [t.name for t in tasks]
    n = len(tasks)
    duration = [t.duration for t in tasks]
    # Stream 0 computes, stream 1 communicates; each runs its tasks in schedule order.
    stream_of = [0 if t.resource == COMPUTE else 1 for t in tasks]
    streams = [sorted((i for i in range(n) if stream_of[i] == r), key=lambda i: tasks[i].order) for r in (0, 1)]
    sync = params.cross_stream_sync_us
    # Per dependency, the hand-off delay it adds (the other stream's) to its finish time.
    deps = [[(index[d], sync if stream_of[index[d]] != stream_of[i] else 0.0) for d in t.deps] for i, t in enumerate(tasks)]
    # Rates while both streams run: a compute task's own, and that of the comm task beside it.
    compute_rates = [compute_rate(t, params) if stream_of[i] == 0 else 1.0 for i, t in enumerate(tasks)]
    comm_rates = [comm_rate(t, params) if stream_of[i] == 0 else 1.0 for i, t in enumerate(tasks)]
    comm_wait = params.comm_wait_beside_compute_us
    latency_bound = params.latency_bound_comm
    # What a comm task keeps of its wait once it has a core (compute idle): nothing, or for a
    # latency-bound one up to its latency share of the whole (see the module docstring).
    wait_kept = [(1.0 - t.bandwidth_share) * comm_wait if latency_bound else 0.0 for t in tasks]
    pos = [0, 0]
    running = [-1, -1]
    remaining = [0.0] * n
    # Comm tasks' outstanding wait for a processor (see the module docstring).
    wait = [0.0] * n
    start = [0.0] * n
    finish = [0.0] * n
    ended = [False] * n
    started: list[int] = []  # in the order the tasks started, and finished
    finished: list[int] = []
    release: list[float | None] = [None] * n  # once a task's deps have all finished, when it may start
    now = 0.0
    # Completions are processed in the same loop iteration they happen in, so
    # zero-duration tasks and chains of them cost no time.

    def released(i: int) -> float | None:
        """When task ``i`` may start: its deps' finish, plus the hand-off delay for deps on the other stream."""
        at = release[i]
        if at is not None:
            return at
        ends = []
        for d, delay in deps[i]:
            if not ended[d]:
                return None
            ends.append(finish[d] + delay)
        at = release[i] = max(ends, default=0.0)
        return at

    while len(finished) < n:
        waiting: list[float] = []  # release times of stream heads held only by a hand-off delay
        for r in (0, 1):
            if running[r] < 0 and pos[r] < len(streams[r]):
                nxt = streams[r][pos[r]]
                at = released(nxt)
                if at is not None and at <= now + 1e-12 * max(1.0, now):
                    running[r] = nxt
                    start[nxt] = now
                    started.append(nxt)
                    remaining[nxt] = duration[nxt]
                    if r == 1 and duration[nxt] > 0:
                        wait[nxt] = comm_wait
                    pos[r] += 1
                elif at is not None:
                    waiting.append(at)
        comp, comm = running
        if comp < 0 and comm < 0:
            if waiting:
                now = min(waiting)
                continue
            raise _deadlock([names[streams[r][pos[r]]] for r in (0, 1) if pos[r] < len(streams[r])])
        rate_compute = rate_comm = 1.0
        stalled = -1  # the comm task waiting for a processor, if any
        if comp >= 0 and comm >= 0:
            if wait[comm] > 0.0:
                stalled = comm
                rate_comm = 0.0  # not running yet, so it slows nothing either
            elif latency_bound:  # the rates depend on the comm task too
                share = tasks[comm].bandwidth_share
                rate_compute, rate_comm = compute_rate(tasks[comp], params, share), comm_rate(tasks[comp], params, share)
                rate_comm = capped(rate_comm, tasks[comm], params)
            else:
                rate_compute = compute_rates[comp]
                rate_comm = capped(comm_rates[comp], tasks[comm], params)
        elif comm >= 0:
            wait[comm] = min(wait[comm], wait_kept[comm])  # alone: the comm thread has a core now
        if comp >= 0:
            dt = remaining[comp] / rate_compute
            if comm >= 0 and rate_comm > 0:
                dt = min(dt, remaining[comm] / rate_comm)
        else:
            dt = remaining[comm] / rate_comm
        if stalled >= 0:
            dt = min(dt, wait[stalled])
        if waiting:
            dt = min(dt, min(waiting) - now)
        now += dt
        if stalled >= 0:
            wait[stalled] = max(0.0, wait[stalled] - dt)
            if wait[stalled] <= 1e-9 * max(1.0, comm_wait):
                wait[stalled] = 0.0
        for r, i, rate in ((0, comp, rate_compute), (1, comm, rate_comm)):
            if i < 0 or rate == 0.0:
                continue
            remaining[i] -= dt * rate
            # Relative tolerance: the task that defined dt ends exactly; others
            # within rounding of zero end too.
            if remaining[i] <= 1e-9 * max(1.0, duration[i]):
                finish[i] = now
                ended[i] = True
                finished.append(i)
                running[r] = -1
    start_of = {names[i]: start[i] for i in started}
    finish_of = {names[i]: finish[i] for i in finished}
    return RetimedPair(start_of, finish_of, max(finish_of.values(), default=0.0), sum(t.duration for t in tasks))
