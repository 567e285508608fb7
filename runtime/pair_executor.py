"""Execute one pair schedule for real and time it.

A *pair* is the forward of one model chunk overlapped with the backward of
another on one device. Its schedule puts every task on one of two streams
(compute, comm) in a fixed order, with dependencies that may cross streams.
This module runs such a schedule with real kernels and reports how long it
took, so a planner can replace an analytic estimate by a measurement.

The description is plain data (``ExecTask``), so the runtime stays free of the
compiler: whoever builds the description decides how IR tasks map to work.

How a task is executed:

- compute task: a matrix multiply ``(m, k) @ (k, n)`` given by ``shapes``
  (or a cube sized from ``flops`` when no shapes are given); when ``bytes``
  exceeds the bytes the multiply itself reads and writes, the excess is moved
  by a tensor copy (half read, half written), so memory-bound tasks keep their
  memory traffic.
- comm task: ``torch.distributed.all_to_all_single`` of ``bytes`` bytes per
  rank, split equally between the ranks.

On CPU, ``world_size`` local processes (gloo) each run the same schedule: the
compute stream is the process's main thread, the comm stream a second thread;
a cross-stream dependency is a ``threading.Event``. The processes are started
once per ``PairExecutor`` and then run many pairs, because starting them costs
seconds. On CUDA the two streams are CUDA streams, dependencies are CUDA
events, and the collectives are NCCL (one process per GPU).

A pair's time for one repeat is the wall time from a barrier to the end of both
streams, taken as the maximum over ranks (the slowest rank decides when the
pipeline can move on).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from support.processes import die_with_parent

COMPUTE = "compute"
COMM = "comm"

DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
}

# Bumped whenever the way a task is executed changes, so cached measurements
# taken by an older executor are not reused.
EXECUTOR_VERSION = 2


class PairExecutionError(RuntimeError):
    """A pair description that cannot be executed, or an execution that failed."""


@dataclass(frozen=True)
class ExecTask:
    """One task of a pair schedule, as the executor runs it.

    ``order`` is the task's position on its stream; ``deps`` name tasks of the
    same pair (on either stream) that must finish first. ``flops``/``bytes``
    are the work actually executed (already scaled by the caller).
    """

    name: str
    kind: str
    resource: str  # COMPUTE or COMM
    order: int
    deps: tuple[str, ...] = ()
    flops: int = 0
    bytes: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()
    dtype: str = "fp32"


@dataclass(frozen=True)
class PairMeasurement:
    """Times of one pair, microseconds. ``samples_us`` holds one value per repeat."""

    samples_us: tuple[float, ...]
    task_us: dict[str, float] = field(default_factory=dict)  # median duration of each task on its stream
    task_min_us: dict[str, float] = field(default_factory=dict)  # shortest duration of each task
    # Mean duration of each task: the expectation, for delays that are sometimes paid and
    # sometimes not (a thread waiting for a core), which a sum of many tasks adds up.
    task_mean_us: dict[str, float] = field(default_factory=dict)
    # Mean time from the pair's start (the barrier) to each task's end: includes the
    # waits before a task runs (a thread waking up, getting a core), which its own
    # duration does not.
    task_end_mean_us: dict[str, float] = field(default_factory=dict)
    device: str = ""
    method: str = ""
    # With a reference chain (``PairExecutor.measure(reference=...)``): its time right before
    # the first repeat and right after every repeat (``repeats + 1`` readings, max over ranks).
    reference_us: tuple[float, ...] = ()
    # Each task's duration read as the pair's time is: per repeat the longest over the ranks (the
    # slowest rank decides), then the median (``task_slowest_us``) or the shortest
    # (``task_slowest_min_us``) over repeats. ``task_min_us`` pools the ranks and so reads the
    # fastest rank, which a loaded machine can make far faster than the slowest.
    task_slowest_us: dict[str, float] = field(default_factory=dict)
    task_slowest_min_us: dict[str, float] = field(default_factory=dict)

    @property
    def median_us(self) -> float:
        return statistics.median(self.samples_us)

    @property
    def min_us(self) -> float:
        """Fastest repeat: on a shared machine, the reading least disturbed by other work."""
        return min(self.samples_us)

    @property
    def spread_us(self) -> float:
        """Max minus min over repeats: how far one run may be from another."""
        return max(self.samples_us) - min(self.samples_us)

    @property
    def repeats(self) -> int:
        return len(self.samples_us)


def gemm_dims(task: ExecTask) -> tuple[int, int, int] | None:
    """The ``(m, k, n)`` of a compute task's multiply, or None when it only moves memory."""
    if len(task.shapes) >= 2 and len(task.shapes[0]) == 2 and len(task.shapes[1]) == 2:
        (m, k), (k2, n) = task.shapes[0], task.shapes[1]
        if k != k2:
            raise PairExecutionError(
                f"task '{task.name}': GEMM operand shapes {list(task.shapes[0])} and {list(task.shapes[1])} "
                "do not agree on the inner dimension"
            )
        return int(m), int(k), int(n)
    if task.flops <= 0:
        return None
    side = max(1, round((task.flops / 2) ** (1 / 3)))
    return side, side, side


def executed_work(task: ExecTask, world_size: int = 2) -> tuple[int, int]:
    """``(flops, bytes)`` the executor really performs for ``task`` (after rounding dimensions)."""
    esize = torch.empty((), dtype=DTYPES[task.dtype]).element_size()
    if task.resource == COMM:
        return 0, _a2a_numel(task.bytes, esize, world_size) * esize
    dims = gemm_dims(task)
    flops, gemm_bytes = 0, 0
    if dims is not None:
        m, k, n = dims
        flops, gemm_bytes = 2 * m * k * n, (m * k + k * n + m * n) * esize
    copy = _copy_numel(task.bytes - gemm_bytes, esize)
    return flops, gemm_bytes + 2 * copy * esize


def _copy_numel(excess_bytes: int, esize: int) -> int:
    # A copy reads and writes each element once: excess / 2 bytes per side.
    return max(0, excess_bytes // (2 * esize))


def _a2a_numel(nbytes: int, esize: int, world: int) -> int:
    # all_to_all_single with equal splits needs a multiple of the world size.
    n = nbytes // esize
    return (n // world) * world


def validate_pair(tasks: Sequence[ExecTask]) -> None:
    """Refuse descriptions that would fail or deadlock once running on several processes."""
    names = [t.name for t in tasks]
    if len(set(names)) != len(names):
        dup = sorted({n for n in names if names.count(n) > 1})
        raise PairExecutionError(f"task names repeat in the pair: {', '.join(dup)}")
    by_name = {t.name: t for t in tasks}
    for t in tasks:
        if t.resource not in (COMPUTE, COMM):
            raise PairExecutionError(f"task '{t.name}' has resource '{t.resource}'; use 'compute' or 'comm'")
        if t.dtype not in DTYPES:
            raise PairExecutionError(f"task '{t.name}' has dtype '{t.dtype}'; use one of {', '.join(DTYPES)}")
        if t.flops < 0 or t.bytes < 0:
            raise PairExecutionError(f"task '{t.name}' has negative work (flops={t.flops}, bytes={t.bytes})")
        for d in t.deps:
            if d not in by_name:
                raise PairExecutionError(f"task '{t.name}' depends on '{d}', which is not in the pair")
        gemm_dims(t)
    for resource in (COMPUTE, COMM):
        orders = [t.order for t in tasks if t.resource == resource]
        if len(set(orders)) != len(orders):
            raise PairExecutionError(f"two {resource} tasks share a stream order; orders must be distinct")
    # Streams run their tasks in order and wait on cross-stream events: the
    # schedule deadlocks unless (stream order + deps) is acyclic.
    streams = {r: sorted((t for t in tasks if t.resource == r), key=lambda t: t.order) for r in (COMPUTE, COMM)}
    pos = {r: 0 for r in streams}
    done: set[str] = set()
    while any(pos[r] < len(streams[r]) for r in streams):
        progressed = False
        for r, seq in streams.items():
            while pos[r] < len(seq) and all(d in done for d in seq[pos[r]].deps):
                done.add(seq[pos[r]].name)
                pos[r] += 1
                progressed = True
        if not progressed:
            stuck = [streams[r][pos[r]].name for r in streams if pos[r] < len(streams[r])]
            raise PairExecutionError(
                f"the stream order deadlocks: {', '.join(stuck)} wait on tasks that come later on their streams"
            )


def topological_issue_order(tasks: Sequence[ExecTask]) -> list[ExecTask]:
    """Tasks in an order that respects both stream order and deps (host issue order on CUDA)."""
    streams = {r: sorted((t for t in tasks if t.resource == r), key=lambda t: t.order) for r in (COMPUTE, COMM)}
    pos = {r: 0 for r in streams}
    done: set[str] = set()
    out: list[ExecTask] = []
    while len(out) < len(tasks):
        for r, seq in streams.items():
            while pos[r] < len(seq) and all(d in done for d in seq[pos[r]].deps):
                out.append(seq[pos[r]])
                done.add(seq[pos[r]].name)
                pos[r] += 1
    return out


# ---------------------------------------------------------------------------
# Work inside one rank


class _Prepared:
    """Buffers of one task, allocated before timing starts."""

    def __init__(self, task: ExecTask, world: int, device: torch.device):
        self.task = task
        dtype = DTYPES[task.dtype]
        esize = torch.empty((), dtype=dtype).element_size()
        self.a = self.b = self.c = self.src = self.dst = None
        if task.resource == COMM:
            n = _a2a_numel(task.bytes, esize, world)
            if n > 0:
                self.src = torch.ones(n, dtype=dtype, device=device)
                self.dst = torch.empty(n, dtype=dtype, device=device)
            return
        dims = gemm_dims(task)
        gemm_bytes = 0
        if dims is not None:
            m, k, n = dims
            self.a = torch.randn(m, k, device=device).to(dtype)
            self.b = torch.randn(k, n, device=device).to(dtype)
            self.c = torch.empty(m, n, dtype=dtype, device=device)
            gemm_bytes = (m * k + k * n + m * n) * esize
        copy = _copy_numel(task.bytes - gemm_bytes, esize)
        if copy > 0:
            self.src = torch.ones(copy, dtype=dtype, device=device)
            self.dst = torch.empty(copy, dtype=dtype, device=device)

    def run(self) -> None:
        if self.task.resource == COMM:
            if self.src is not None:
                dist.all_to_all_single(self.dst, self.src)
            return
        if self.a is not None and self.b is not None:
            torch.mm(self.a, self.b, out=self.c)
        if self.src is not None and self.dst is not None:
            self.dst.copy_(self.src)


def _run_once_cpu(
    prepared: dict[str, _Prepared], streams: dict[str, list[ExecTask]]
) -> tuple[float, dict[str, float], dict[str, float]]:
    events = {name: threading.Event() for name in prepared}
    task_s: dict[str, float] = {}
    end_s: dict[str, float] = {}
    origin = [0.0]
    failure: list[BaseException] = []
    go = threading.Event()

    def run_stream(seq: list[ExecTask]) -> None:
        try:
            for t in seq:
                for d in t.deps:
                    events[d].wait()
                    if failure:
                        return
                start = time.perf_counter()
                prepared[t.name].run()
                end = time.perf_counter()
                task_s[t.name] = end - start
                end_s[t.name] = end - origin[0]
                events[t.name].set()
        except BaseException as err:  # noqa: BLE001 - reported to the parent with its traceback
            failure.append(err)
            for e in events.values():  # wake the other stream so it does not wait forever
                e.set()

    def comm_stream() -> None:
        go.wait()
        run_stream(streams[COMM])

    thread = threading.Thread(target=comm_stream, daemon=True)
    thread.start()
    dist.barrier()
    start = origin[0] = time.perf_counter()
    go.set()
    run_stream(streams[COMPUTE])
    thread.join()
    elapsed = time.perf_counter() - start
    if failure:
        raise failure[0]
    return elapsed, task_s, end_s


def _run_once_cuda(
    prepared: dict[str, _Prepared], tasks: list[ExecTask], cuda_streams: dict[str, torch.cuda.Stream]
) -> tuple[float, dict[str, float], dict[str, float]]:
    # Work is enqueued from one host thread in an order that respects stream
    # order and deps, because waiting on a CUDA event that is not yet recorded
    # is a no-op rather than a wait.
    begin = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    done: dict[str, torch.cuda.Event] = {}
    starts: dict[str, torch.cuda.Event] = {}
    compute_stream, comm_stream = cuda_streams[COMPUTE], cuda_streams[COMM]
    torch.cuda.synchronize()
    dist.barrier()
    begin.record(compute_stream)
    comm_stream.wait_event(begin)
    last: dict[str, torch.cuda.Event] = {}
    for t in topological_issue_order(tasks):
        stream = cuda_streams[t.resource]
        for d in t.deps:
            stream.wait_event(done[d])
        with torch.cuda.stream(stream):
            starts[t.name] = torch.cuda.Event(enable_timing=True)
            starts[t.name].record(stream)
            prepared[t.name].run()
            done[t.name] = torch.cuda.Event(enable_timing=True)
            done[t.name].record(stream)
        last[t.resource] = done[t.name]
    if COMM in last:
        compute_stream.wait_event(last[COMM])
    end.record(compute_stream)
    torch.cuda.synchronize()
    task_s = {n: starts[n].elapsed_time(done[n]) / 1e3 for n in done}
    end_s = {n: begin.elapsed_time(done[n]) / 1e3 for n in done}
    return begin.elapsed_time(end) / 1e3, task_s, end_s


class _Schedule:
    """A pair with its buffers allocated, ready to run any number of times."""

    def __init__(self, tasks: list[ExecTask], world: int, device: torch.device):
        self.tasks = tasks
        self.prepared = {t.name: _Prepared(t, world, device) for t in tasks}
        self.streams = {r: sorted((t for t in tasks if t.resource == r), key=lambda t: t.order) for r in (COMPUTE, COMM)}
        self.cuda_streams = None
        if device.type == "cuda":
            self.cuda_streams = {COMPUTE: torch.cuda.Stream(device), COMM: torch.cuda.Stream(device)}

    def run(self) -> tuple[float, dict[str, float], dict[str, float]]:
        if self.cuda_streams is not None:
            return _run_once_cuda(self.prepared, self.tasks, self.cuda_streams)
        return _run_once_cpu(self.prepared, self.streams)


def _measure_in_rank(
    tasks: list[ExecTask], repeats: int, warmup: int, world: int, device: torch.device,
    reference: list[ExecTask] | None = None, reference_runs: int = 1,
) -> tuple[list[float], dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Warm-up runs, then ``repeats`` timed runs, all on buffers allocated once: a timed run never
    pays for first touching its memory (page faults on fresh allocations cost more than a
    memory-bound task itself on CPU), as a training step reusing its allocator's memory does not.
    With ``reference``, its chain runs (on its own buffers) in every warm-up, before the first
    repeat and after every repeat, so each repeat lies between two readings of it; a reading is
    the mean of ``reference_runs`` runs back to back (a reading as long as the pair meets the
    same share of other work's interruptions as the pair does)."""
    pair = _Schedule(tasks, world, device)
    ref = _Schedule(reference, world, device) if reference else None
    samples: list[float] = []
    per_task: dict[str, list[float]] = {t.name: [] for t in tasks}
    per_end: dict[str, list[float]] = {t.name: [] for t in tasks}
    readings: list[float] = []

    def read_reference() -> None:
        if ref is not None:
            readings.append(sum(ref.run()[0] for _ in range(reference_runs)) / reference_runs * 1e6)

    for _ in range(warmup):
        if ref is not None:
            ref.run()
        pair.run()
    read_reference()
    for _ in range(repeats):
        elapsed, task_s, end_s = pair.run()
        samples.append(elapsed * 1e6)
        for name, s in task_s.items():
            per_task[name].append(s * 1e6)
            per_end[name].append(end_s[name] * 1e6)
        read_reference()
    return samples, per_task, per_end, readings


def _worker(
    rank: int, parent: int, world: int, init_file: str, conns: list, threads: int, device_kind: str, timeout_s: float
) -> None:
    die_with_parent(parent)  # a measuring run killed meanwhile leaves no worker holding its device
    conn = conns[rank]
    try:
        torch.set_num_threads(threads)
        backend = "nccl" if device_kind == "cuda" else "gloo"
        if device_kind == "cuda":
            torch.cuda.set_device(rank)
            device = torch.device("cuda", rank)
        else:
            device = torch.device("cpu")
        dist.init_process_group(
            backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
            timeout=timedelta(seconds=timeout_s),
        )
        conn.send(("ready", None))
    except BaseException:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
        return
    try:
        while True:
            message = conn.recv()
            if message[0] == "stop":
                break
            try:
                _, tasks, repeats, warmup, reference, reference_runs = message
                conn.send(("ok", _measure_in_rank(tasks, repeats, warmup, world, device, reference, reference_runs)))
            except BaseException:  # noqa: BLE001 - the parent reports it
                conn.send(("error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


def default_threads_per_rank(world_size: int) -> int:
    """Share the machine's cores equally between the ranks (at least one thread each)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // world_size)


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def cpu_device_description(world_size: int, threads_per_rank: int | None = None) -> str:
    """The description of a CPU executor with ``world_size`` ranks (``threads_per_rank`` by
    default shared out by ``default_threads_per_rank``), as measurements record it."""
    threads = threads_per_rank or default_threads_per_rank(world_size)
    return f"cpu:{cpu_model_name()}:world={world_size}:threads={threads}:gloo"


class PairExecutor:
    """Processes that execute pair schedules on request; start once, measure many pairs.

    Use as a context manager::

        with PairExecutor(world_size=2) as ex:
            m = ex.measure(tasks, repeats=5)
            m.median_us, m.spread_us
    """

    def __init__(self, world_size: int = 2, device: str = "cpu", threads_per_rank: int | None = None, timeout_s: float = 300.0):
        if world_size < 1:
            raise PairExecutionError(f"world_size must be at least 1, got {world_size}")
        if device not in ("cpu", "cuda"):
            raise PairExecutionError(f"device must be 'cpu' or 'cuda', got '{device}'")
        if device == "cuda":
            if not torch.cuda.is_available():
                raise PairExecutionError("device 'cuda' was asked for but torch sees no CUDA device; use device 'cpu'")
            if torch.cuda.device_count() < world_size:
                raise PairExecutionError(
                    f"device 'cuda' with world_size {world_size} needs {world_size} GPUs; "
                    f"torch sees {torch.cuda.device_count()}"
                )
        self.world_size = world_size
        self.device = device
        self.threads_per_rank = threads_per_rank or default_threads_per_rank(world_size)
        self.timeout_s = timeout_s
        self._context = None
        self._conns: list = []
        self._tmpdir: tempfile.TemporaryDirectory | None = None

    @property
    def description(self) -> str:
        """What measurements taken here are valid for (part of every cache key)."""
        if self.device == "cuda":
            name = torch.cuda.get_device_name(0)
            return f"cuda:{name}:world={self.world_size}:nccl"
        return cpu_device_description(self.world_size, self.threads_per_rank)

    @property
    def method(self) -> str:
        streams = "two CUDA streams with events" if self.device == "cuda" else "compute thread + comm thread"
        backend = "nccl" if self.device == "cuda" else "gloo"
        return (
            f"executed on {self.world_size} {backend} processes ({streams}); "
            f"pair time = max over ranks of wall time from a barrier; executor v{EXECUTOR_VERSION}"
        )

    def start(self) -> PairExecutor:
        if self._context is not None:
            return self
        self._tmpdir = tempfile.TemporaryDirectory(prefix="tessera-pair-")
        init_file = os.path.join(self._tmpdir.name, "rendezvous")
        ctx = mp.get_context("spawn")
        pairs = [ctx.Pipe() for _ in range(self.world_size)]
        parent_ends = [p[0] for p in pairs]
        child_ends = [p[1] for p in pairs]
        self._context = mp.start_processes(
            _worker,
            args=(os.getpid(), self.world_size, init_file, child_ends, self.threads_per_rank, self.device, self.timeout_s),
            nprocs=self.world_size,
            join=False,
            start_method="spawn",
        )
        self._conns = parent_ends
        for rank in range(self.world_size):
            self._receive(rank, "starting the worker processes")
        return self

    def _receive(self, rank: int, what: str) -> Any:
        """The payload rank ``rank`` sends next (what it is depends on the request)."""
        conn = self._conns[rank]
        assert self._context is not None, "the worker processes are not running"
        deadline = time.monotonic() + self.timeout_s
        # Poll in short steps so a worker that died (e.g. could not even start) is
        # reported at once rather than after the whole timeout.
        while not conn.poll(0.2):
            dead = [i for i, p in enumerate(self._context.processes) if not p.is_alive()]
            if dead and not conn.poll(0):
                self.close()
                raise PairExecutionError(
                    f"rank(s) {', '.join(map(str, dead))} exited while {what}; when running from a script, "
                    "create the executor under `if __name__ == '__main__':` (worker processes are spawned)"
                )
            if time.monotonic() > deadline:
                self.close()
                raise PairExecutionError(f"rank {rank} gave no answer within {self.timeout_s:.0f} s while {what}")
        try:
            status, payload = conn.recv()
        except EOFError:
            self.close()
            raise PairExecutionError(f"rank {rank} exited while {what}") from None
        if status == "error":
            self.close()
            raise PairExecutionError(f"rank {rank} failed while {what}:\n{payload}")
        return payload

    def measure(
        self, tasks: Sequence[ExecTask], repeats: int = 5, warmup: int = 1, reference: Sequence[ExecTask] | None = None,
        reference_runs: int = 1,
    ) -> PairMeasurement:
        """Run the pair ``warmup + repeats`` times on every rank; return the timed repeats.

        ``reference``: a second chain (say a calibration's reference kernel) run before the first
        repeat and after each one, on its own warm buffers; its times are ``reference_us``, each
        the mean of ``reference_runs`` runs back to back.
        """
        if repeats < 1:
            raise PairExecutionError(f"repeats must be at least 1, got {repeats}")
        if reference_runs < 1:
            raise PairExecutionError(f"reference_runs must be at least 1, got {reference_runs}")
        tasks = list(tasks)
        validate_pair(tasks)
        ref = list(reference) if reference else None
        if ref is not None:
            validate_pair(ref)
        if self._context is None:
            self.start()
        for conn in self._conns:
            conn.send(("run", tasks, repeats, warmup, ref, reference_runs))
        results = [self._receive(rank, f"executing a pair of {len(tasks)} tasks") for rank in range(self.world_size)]
        samples = tuple(max(per_rank[0][i] for per_rank in results) for i in range(repeats))
        readings = tuple(max(per_rank[3][i] for per_rank in results) for i in range(len(results[0][3])))
        task_us, task_min_us, task_mean_us, task_end_mean_us = {}, {}, {}, {}
        task_slowest_us, task_slowest_min_us = {}, {}
        for t in tasks:
            values = [v for per_rank in results for v in per_rank[1][t.name]]
            task_us[t.name] = statistics.median(values) if values else 0.0
            task_min_us[t.name] = min(values) if values else 0.0
            task_mean_us[t.name] = statistics.fmean(values) if values else 0.0
            ends = [v for per_rank in results for v in per_rank[2][t.name]]
            task_end_mean_us[t.name] = statistics.fmean(ends) if ends else 0.0
            slowest = [max(per_rank[1][t.name][i] for per_rank in results) for i in range(repeats)]
            task_slowest_us[t.name] = statistics.median(slowest)
            task_slowest_min_us[t.name] = min(slowest)
        if any(not math.isfinite(s) or s <= 0 for s in samples):
            raise PairExecutionError(f"measured non-positive pair times {samples}")
        return PairMeasurement(
            samples, task_us, task_min_us, device=self.description, method=self.method, task_mean_us=task_mean_us,
            task_end_mean_us=task_end_mean_us, reference_us=readings, task_slowest_us=task_slowest_us,
            task_slowest_min_us=task_slowest_min_us,
        )

    def close(self) -> None:
        if self._context is None:
            return
        for conn in self._conns:
            try:
                conn.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 30
        for p in self._context.processes:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)
        self._context = None
        self._conns = []
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None

    def __enter__(self) -> PairExecutor:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
