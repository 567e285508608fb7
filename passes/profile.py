"""The ``profile`` pass: attach a post-overlap cost to every ``pair`` op.

Before (from ``candidates`` and ``overlap-schedule``)::

    plan pair @pair.0 {bwd = [@l2, @l3], fwd = [@l0, @l1], makespan = 812.5, schedule = @sched.0}
    plan pair_schedule @sched.0 {...} { @l0.linear_attention.fwd {order = 0, start = 0.0, stream = "compute"} ... }

After ``profile{mode=analytic hardware=h100}``::

    plan pair @pair.0 {..., cost_source = "analytic", cost_us = 840.2, serial_us = 1310.0,
                       overlap_us = 812.5, profile_hardware = "h100"}

Modes:

``analytic``
    The pair's schedule (its ``schedule`` op; a pair without one is scheduled
    here with the overlap scheduler's ``gap_fit``) re-timed on the described
    hardware by the contention model (``passes/contention.py``): tasks keep
    their stream order and dependencies, and overlapped tasks slow each other
    down. ``overlap_us`` is the same re-timing without contention (the naive
    schedule of isolated durations), ``serial_us`` the sum of isolated durations.
    Pairs sharing a schedule usually re-time identically: each distinct
    re-timing input (everything but task names, see ``retime_key``) is re-timed
    once and its figures copied to every pair that has it.

``measured``
    The schedule is executed for real (``runtime/pair_executor.py``): on CPU by
    two local gloo processes, a compute task as the kernel that bounds it on
    the device (a GEMM with the task's FLOPs and aspect ratio, or a copy of its
    bytes; see ``exec_tasks``), comm tasks as real All-to-All; on CUDA on two
    streams with NCCL. Work is scaled by one factor ``s`` per run (``scale``;
    ``auto`` picks ``s`` so the largest pair's predicted serial time is about
    ``target-ms``), and times are divided by ``s`` to report full-size
    microseconds (a linear extrapolation: fixed latencies are scaled up too,
    which the spread and the predicted/measured error make visible). Every
    measured pair also gets ``predicted_us``: the analytic model for the
    *measured device* (the calibrated ``cpu`` hardware on CPU, ``hardware`` on
    CUDA) on the executed work, plus the device's ``pair_overhead_us`` (the
    executor's fixed cost per pair), so ``predicted_error`` compares like with like;
    the module gets ``profile_error_mean`` and ``profile_error_p95`` (mean and
    95th percentile of ``|predicted - measured| / measured``). Pair attributes:
    ``cost_us`` (= ``measured_us``, the ``statistic`` of the repeats: median or
    min), ``predicted_us``, ``overlap_us``, ``serial_us``, ``spread_us`` (max -
    min over repeats), ``predicted_error`` (signed), ``profile_scale``,
    ``profile_repeats``. Measurements are cached (``passes/profile_cache.py``); a cached pair is
    not executed again (``cost_source = "cache"``).

``cache-only``
    Like ``measured`` but never executes: a pair whose measurement is not
    cached is an error naming the pair and how to fill the cache.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

from passes.contention import ContendedTask, ContentionParams, RetimedPair, retime
from passes.cost_model import Hardware, load_hardware, task_duration_us, task_utilisation
from passes.manager import ModulePass, PassError
from passes.pair_dag import BWD, FWD, PairDAG, PairTask, build_pair_dag, join_sides, pair_side_layers, side_tasks
from passes.profile_cache import CacheEntry, ProfileCache, cache_key, resolve_cache_dir, software_versions
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import Layer, Module, PlanOp, SymbolRef, Task
from tessera_ir.parallel import ParallelConfig

MODES = ("analytic", "measured", "cache-only")
# Attributes this pass owns (cleared before every run).
PAIR_ATTRS = (
    "cost_us", "cost_source", "serial_us", "overlap_us", "profile_hardware", "measured_us", "predicted_us",
    "spread_us", "predicted_error", "profile_scale", "profile_repeats",
)
MODULE_ATTRS = (
    "profile_mode", "profile_hardware", "profile_pairs", "profile_scale", "profile_device", "profile_statistic",
    "profile_error_mean", "profile_error_p95",
)


class ProfileError(TesseraError):
    """A pair that cannot be profiled as asked."""


@dataclass(frozen=True)
class ScheduledTask:
    """An IR task of a pair with its place in the pair's schedule."""

    task: Task
    stream: str
    order: int
    deps: tuple[str, ...]  # predecessors inside the pair


# ---------------------------------------------------------------------------
# Reading pairs and their schedules


class PairIndex:
    """What reading many pairs of one module needs, built once: layers, tasks and
    schedules by name, per-task durations on ``hw``, and each pair side (a list of
    layers) built once however many pairs share it. The module must not change while
    an index is in use."""

    def __init__(self, module: Module, hw: Hardware, parallel: ParallelConfig):
        self.module = module
        self.hw = hw
        self.parallel = parallel
        self.layers = {layer.name: layer for layer in module.layers}
        self.tasks = module.task_map()
        self.schedules: dict[str, PlanOp] = {}
        for p in module.plan_ops("pair_schedule"):
            self.schedules.setdefault(p.name, p)  # the first of a repeated name, as a scan would find
        self._durations: dict[str, float] = {}
        self._utilisation: dict[str, tuple[float, float]] = {}
        self._sides: dict[tuple[str, tuple[str, ...]], list[PairTask]] = {}
        self._joined: dict[tuple[tuple[str, tuple[str, ...]], int], list[PairTask]] = {}

    def duration(self, task: Task) -> float:
        """``task_duration_us`` on ``hw``, computed once per task of the module."""
        if self.tasks.get(task.name) is not task:  # not the module's own task object: no caching
            return task_duration_us(task, self.hw, self.parallel)
        got = self._durations.get(task.name)
        if got is None:
            got = self._durations[task.name] = task_duration_us(task, self.hw, self.parallel)
        return got

    def utilisation(self, task: Task) -> tuple[float, float]:
        """``task_utilisation`` on ``hw``, computed once per task of the module."""
        if self.tasks.get(task.name) is not task:
            return task_utilisation(task, self.hw, self.parallel)
        got = self._utilisation.get(task.name)
        if got is None:
            got = self._utilisation[task.name] = task_utilisation(task, self.hw, self.parallel)
        return got

    def layers_of(self, op: PlanOp, key: str) -> list[Layer]:
        refs = op.attrs.get(key, [])
        if not isinstance(refs, list):
            raise ProfileError(f"pair @{op.name}: '{key}' must be a list of layer references, got {refs!r}")
        out = []
        for ref in refs:
            name = ref.name if isinstance(ref, SymbolRef) else str(ref)
            if name not in self.layers:
                raise ProfileError(f"pair @{op.name}: '{key}' names @{name}, which is not a layer of the module")
            out.append(self.layers[name])
        return out

    def dag(self, op: PlanOp) -> PairDAG:
        """The pair's DAG with isolated durations on ``hw`` (as :func:`pair_dag` builds it)."""
        keys = []
        for key, side in (("fwd", FWD), ("bwd", BWD)):
            layers = self.layers_of(op, key)
            cache_key = (key, tuple(layer.name for layer in layers))
            if cache_key not in self._sides:
                self._sides[cache_key] = side_tasks(layers, side, self.duration, op.name)
            keys.append(cache_key)
        fwd = self._sides[keys[0]]
        # The backward side shifted past the forward one, kept per (side, shift): the
        # same backward chunk meets forward chunks of only a few lengths.
        joined_key = (keys[1], len(fwd))
        if joined_key not in self._joined:
            self._joined[joined_key] = join_sides(fwd, self._sides[keys[1]]).tasks[len(fwd):]
        return PairDAG(op.name, fwd + self._joined[joined_key])


def pair_dag(module: Module, op: PlanOp, hw: Hardware, parallel: ParallelConfig) -> PairDAG:
    return build_pair_dag(
        pair_side_layers(module, op, "fwd"), pair_side_layers(module, op, "bwd"),
        lambda t: task_duration_us(t, hw, parallel), name=op.name,
    )


def scheduled_tasks(
    module: Module, op: PlanOp, hw: Hardware, parallel: ParallelConfig, index: PairIndex | None = None
) -> list[ScheduledTask]:
    """The pair's tasks in its schedule's stream order, with their in-pair dependencies.

    The order comes from the ``pair_schedule`` op the pair's ``schedule`` attribute
    names; a pair without one is scheduled now with ``pair_schedulers.gap_fit``.
    ``index`` (a :class:`PairIndex` of the same module, hardware and parallel
    settings) saves rebuilding the module's maps when many pairs are read.
    """
    if index is None:
        index = PairIndex(module, hw, parallel)
    dag = index.dag(op)
    tasks = index.tasks
    deps = {t.name: tuple(dag.tasks[d].name for d in t.deps) for t in dag.tasks}
    ref = op.attrs.get("schedule")
    if ref is None:
        from passes.pair_schedulers import gap_fit

        sched = gap_fit(dag)
        order = sched.order_of()
        return [
            ScheduledTask(tasks[t.name], t.resource.value, order[i], deps[t.name]) for i, t in enumerate(dag.tasks)
        ]
    name = ref.name if isinstance(ref, SymbolRef) else str(ref)
    found = index.schedules.get(name)
    if found is None:
        raise ProfileError(f"pair @{op.name} names schedule @{name}, but the module has no pair_schedule @{name}")
    entries = {e.ref: e for e in found.entries}
    missing = [t.name for t in dag.tasks if t.name not in entries]
    extra = sorted(set(entries) - set(deps))
    if missing or extra:
        # Schedules are shared between pairs with the same DAG signature; the entries
        # name the tasks of the first such pair, so match by position in that case.
        if len(entries) != len(dag.tasks):
            raise ProfileError(
                f"pair_schedule @{name} does not fit pair @{op.name}: it has {len(entries)} entries for "
                f"{len(dag.tasks)} tasks (e.g. no entry for {missing[:1] or extra[:1]}); rerun overlap-schedule"
            )
        return _by_position(module, op, dag, found, tasks, deps)
    out = []
    for t in dag.tasks:
        e = entries[t.name]
        stream = str(e.attrs.get("stream", t.resource.value))
        if stream != t.resource.value:
            raise ProfileError(f"pair_schedule @{name} puts {t.resource.value} task @{t.name} on stream '{stream}'")
        out.append(ScheduledTask(tasks[t.name], stream, 0, deps[t.name]))
    return _with_orders(out, {t.task.name: entries[t.task.name].attrs for t in out})


def _by_position(module: Module, op: PlanOp, dag: PairDAG, sched: PlanOp, tasks: dict[str, Task], deps: dict[str, tuple[str, ...]]) -> list[ScheduledTask]:
    entries = sched.entries
    out, attrs = [], {}
    for t, e in zip(dag.tasks, entries):
        other = tasks.get(e.ref)
        if other is None or other.kind != t.kind:
            raise ProfileError(
                f"pair_schedule @{sched.name} does not fit pair @{op.name}: entry @{e.ref} is not a "
                f"{t.kind} task; rerun overlap-schedule"
            )
        out.append(ScheduledTask(tasks[t.name], t.resource.value, 0, deps[t.name]))
        attrs[t.name] = e.attrs
    return _with_orders(out, attrs)


def _with_orders(items: list[ScheduledTask], attrs: dict[str, dict]) -> list[ScheduledTask]:
    order: dict[str, int] = {}
    for r in (Resource.COMPUTE.value, Resource.COMM.value):
        on_stream = [s for s in items if s.stream == r]

        def key(s: ScheduledTask) -> tuple[float, float, str]:
            a = attrs[s.task.name]
            return (float(a.get("order", math.inf)), float(a.get("start", 0.0)), s.task.name)

        for k, s in enumerate(sorted(on_stream, key=key)):
            order[s.task.name] = k
    # Items keep their own order; each gets its position on its stream.
    return [ScheduledTask(s.task, s.stream, order[s.task.name], s.deps) for s in items if s.task.name in order]


# ---------------------------------------------------------------------------
# Analytic cost


def contended_tasks(
    items: list[ScheduledTask], hw: Hardware, parallel: ParallelConfig, index: PairIndex | None = None
) -> list[ContendedTask]:
    out = []
    for s in items:
        if index is None:
            sm, mem = task_utilisation(s.task, hw, parallel)
            duration = task_duration_us(s.task, hw, parallel)
        else:
            (sm, mem), duration = index.utilisation(s.task), index.duration(s.task)
        out.append(ContendedTask(s.task.name, s.stream, duration, s.order, s.deps, sm, mem))
    return out


def retime_key(tasks: list[ContendedTask]) -> tuple | None:
    """Everything :func:`passes.contention.retime` reads, without task names: per task (in
    list order) its stream, duration, stream position, utilisations and the list positions
    of its dependencies. Re-timing is name-blind (streams run in ``order``; no tie is
    broken by name), so lists with equal keys have equal makespans and equal sums of
    isolated durations (summed in the same order). None when names repeat or a
    dependency is missing: such a list is re-timed on its own (and refused there)."""
    position = {t.name: k for k, t in enumerate(tasks)}
    if len(position) != len(tasks) or any(d not in position for t in tasks for d in t.deps):
        return None
    return tuple(
        (t.resource, t.duration, t.order, t.sm_util, t.mem_util, tuple(position[d] for d in t.deps)) for t in tasks
    )


def analytic_cost(items: list[ScheduledTask], hw: Hardware, parallel: ParallelConfig) -> tuple[RetimedPair, RetimedPair]:
    """(contended re-timing, contention-free re-timing) of a scheduled pair."""
    tasks = contended_tasks(items, hw, parallel)
    return retime(tasks, ContentionParams.from_hardware(hw, parallel.ep)), retime(tasks, ContentionParams.none())


# ---------------------------------------------------------------------------
# Measured cost


def _gemm_shape(task: Task, flops: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """Operands ``(m, k) @ (k, n)`` with ``2mkn ≈ flops`` and the aspect ratio of the task's shapes.

    The frontend records ``[input, output]`` shapes: ``m`` = tokens (all leading
    dimensions of the input), ``k`` = its last dimension, ``n`` = the output's
    last dimension. All three are scaled by one factor, so the executed GEMM
    has the task's FLOPs (after scaling) and its shape, only smaller.
    """
    m0, k0, n0 = 1.0, 1.0, 1.0
    if len(task.shapes) >= 2 and task.shapes[0] and task.shapes[1]:
        m0 = float(math.prod(task.shapes[0][:-1]) or 1)
        k0, n0 = float(task.shapes[0][-1]), float(task.shapes[1][-1])
    c = (flops / (2.0 * m0 * k0 * n0)) ** (1.0 / 3.0)
    m, k, n = (max(1, round(d * c)) for d in (m0, k0, n0))
    return (m, k), (k, n)


def exec_tasks(items: list[ScheduledTask], scale: float, dtype: str, hw: Hardware | None = None,
               parallel: ParallelConfig | None = None) -> list:
    """The executor's description of a scheduled pair with its work scaled by ``scale``.

    With ``hw``, a compute task runs as the kernel that bounds it on that device
    (its roofline side): a GEMM of its FLOPs when compute-bound, a copy of its
    bytes when memory-bound. A GPU kernel overlaps its arithmetic with its memory
    traffic, so its time is the larger of the two; one CPU thread running a GEMM
    and then a copy would take their sum instead, which no GPU kernel does.
    Without ``hw`` both are run (GEMM, then a copy of the bytes it does not move).
    """
    from runtime.pair_executor import ExecTask

    out = []
    for s in items:
        flops = s.task.flops * scale
        nbytes = int(round(s.task.bytes * scale))
        shapes: tuple = ()
        if s.stream == Resource.COMPUTE.value:
            compute_bound = True
            if hw is not None and parallel is not None:
                compute_bound = task_utilisation(s.task, hw, parallel)[0] >= 1.0
            if compute_bound and flops >= 2:
                shapes = _gemm_shape(s.task, flops)
                if hw is not None:
                    nbytes = 0  # the GEMM's own operand traffic is all it moves
            elif hw is not None:
                flops = 0.0
        out.append(ExecTask(
            name=s.task.name, kind=s.task.kind, resource=s.stream, order=s.order, deps=s.deps,
            flops=2 * shapes[0][0] * shapes[0][1] * shapes[1][1] if shapes else 0, bytes=nbytes,
            shapes=shapes, dtype=dtype,
        ))
    return out


def predicted_exec(items: list[ScheduledTask], execs: list, hw: Hardware, parallel: ParallelConfig, world: int) -> tuple[RetimedPair, RetimedPair]:
    """Analytic cost (contended, contention-free) of the work the executor really runs."""
    from runtime.pair_executor import executed_work

    scaled = []
    for s, e in zip(items, execs):
        flops, nbytes = executed_work(e, world)
        scaled.append(replace(s, task=replace(s.task, flops=flops, bytes=nbytes)))
    return analytic_cost(scaled, hw, replace(parallel, dtype=execs[0].dtype if execs else parallel.dtype))


def signature(execs: list, world: int) -> list:
    """What a measurement depends on in the pair: kinds, work, shapes and order — not task names."""
    ordered = sorted(execs, key=lambda e: (e.resource, e.order))
    index = {e.name: i for i, e in enumerate(ordered)}
    return [world] + [
        [e.kind, e.resource, e.order, e.flops, e.bytes, [list(s) for s in e.shapes], e.dtype, sorted(index[d] for d in e.deps)]
        for e in ordered
    ]


def _percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    v = sorted(values)
    if not v:
        return 0.0
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


@dataclass(frozen=True)
class ProfilePass(ModulePass):
    name = "profile"
    summary = "attach a post-overlap cost (analytic with contention, measured, or cached) to every pair"

    mode: str = "analytic"
    hardware: str = "h100"
    repeats: int = 5
    scale: str = "auto"  # measured: work scale factor, or "auto"
    target_ms: float = 20.0  # measured, scale=auto: predicted serial time of the largest pair
    cache_dir: str = ""  # default: $TESSERA_CACHE_DIR or ~/.cache/tessera
    device: str = "cpu"  # measured: "cpu" (gloo processes) or "cuda"
    progress: bool = False  # show a progress bar even when stderr is not a terminal
    # measured: dtype of the executed kernels; "" = fp32 on CPU (CPU bf16/fp16 GEMMs switch
    # between very fast and very slow kernels with the shape, which no roofline describes)
    # and the module's dtype on CUDA; "auto" = the module's dtype everywhere.
    exec_dtype: str = ""
    # measured: which reading of the repeats is the pair's cost: "median", or "min" (the
    # fastest repeat, least disturbed when other work shares the machine). The CPU is
    # calibrated with the same statistic, so predictions and measurements compare alike.
    statistic: str = "median"

    def apply(self, module: Module) -> bool:
        if self.mode not in MODES:
            raise PassError(f"profile: mode '{self.mode}' is not one of {', '.join(MODES)}")
        if self.statistic not in ("median", "min"):
            raise PassError(f"profile: statistic '{self.statistic}' is not 'median' or 'min'")
        if self.repeats < 1:
            raise PassError(f"profile: repeats must be at least 1, got {self.repeats}")
        pairs = module.plan_ops("pair")
        if not pairs:
            return False
        parallel = ParallelConfig.from_attrs(module.attrs)
        # A rerun (say analytic after measured) must not leave the other mode's figures behind.
        for op in pairs:
            for key in PAIR_ATTRS:
                op.attrs.pop(key, None)
        for key in MODULE_ATTRS:
            module.attrs.pop(key, None)
        if self.mode == "analytic":
            from passes.overlap_schedule import frozen_heap

            with frozen_heap():  # many small objects: keep the collector off the big heap
                self._analytic(module, pairs, parallel)
        else:
            self._measured(module, pairs, parallel)
        return True

    def _analytic(self, module: Module, pairs: list[PlanOp], parallel: ParallelConfig) -> None:
        hw = load_hardware(self.hardware)
        index = PairIndex(module, hw, parallel)
        contention, free_params = ContentionParams.from_hardware(hw, parallel.ep), ContentionParams.none()
        # Pairs that share a schedule usually have identical re-timing inputs up to task
        # names; each distinct input is re-timed once (see retime_key).
        costs: dict[tuple, tuple[float, float, float]] = {}
        for op in pairs:
            tasks = contended_tasks(scheduled_tasks(module, op, hw, parallel, index), hw, parallel, index)
            key = retime_key(tasks)
            cost = costs.get(key) if key is not None else None
            if cost is None:
                contended, free = retime(tasks, contention), retime(tasks, free_params)
                cost = (contended.makespan, contended.isolated_sum, free.makespan)
                if key is not None:
                    costs[key] = cost
            op.attrs.update(
                cost_us=cost[0], cost_source="analytic", serial_us=cost[1], overlap_us=cost[2], profile_hardware=hw.name,
            )
        module.attrs.update(profile_mode="analytic", profile_hardware=hw.name, profile_pairs=len(pairs))

    def _measured(self, module: Module, pairs: list[PlanOp], parallel: ParallelConfig) -> None:
        from runtime.pair_executor import DTYPES, PairExecutionError, PairExecutor

        cache_root = resolve_cache_dir(self.cache_dir or None)
        cache = ProfileCache(cache_root)
        if self.device == "cuda":
            import torch

            world = max(1, min(2, torch.cuda.device_count()))
        elif self.device == "cpu":
            world = 2
        else:
            raise PassError(f"profile: device '{self.device}' is not 'cpu' or 'cuda'")
        try:
            executor = PairExecutor(world_size=world, device=self.device)
        except PairExecutionError as err:
            raise ProfileError(f"profile: {err}") from None
        try:
            hw = self._device_hardware(executor, cache_root)
            dtype = self.exec_dtype or ("fp32" if self.device == "cpu" else "auto")
            dtype = parallel.dtype if dtype == "auto" else dtype
            if dtype not in DTYPES or dtype not in hw.peak_tflops:
                raise PassError(
                    f"profile: cannot execute in dtype '{dtype}' on {hw.name} (executable: "
                    f"{', '.join(d for d in DTYPES if d in hw.peak_tflops)}); set exec-dtype"
                )
            dev_parallel = replace(parallel, dtype=dtype, ep=world)
            # Full-size schedules on the device's hardware: durations for the auto scale.
            index = PairIndex(module, hw, dev_parallel)
            items = {op.name: scheduled_tasks(module, op, hw, dev_parallel, index) for op in pairs}
            scale = self._scale(items, hw, dev_parallel)
            versions = software_versions()
            plans = []
            for op in pairs:
                execs = exec_tasks(items[op.name], scale, dtype, hw, dev_parallel)
                predicted, free = predicted_exec(items[op.name], execs, hw, dev_parallel, world)
                key = cache_key(signature(execs, world), executor.description, versions)
                plans.append((op, execs, (predicted, free), key))
            fresh = self._fill(plans, cache, executor, versions, module)
        except PairExecutionError as err:
            raise ProfileError(f"profile: executing a pair failed: {err}") from None
        finally:
            executor.close()

        errors = []
        for op, _, (predicted, free), key in plans:
            entry = cache.get(key)
            assert entry is not None  # _fill measured or refused every miss
            measured = ((entry.min_us or min(entry.samples_us)) if self.statistic == "min" else entry.measured_us) / scale
            # The executor's fixed cost per pair (calibrated on CPU; absent for GPUs).
            overhead = float(hw.extra.get("pair_overhead_us", 0.0))  # type: ignore[arg-type]
            pred = (predicted.makespan + overhead) / scale
            err = (pred - measured) / measured
            errors.append(abs(err))
            op.attrs.update(
                cost_us=measured, cost_source="measured" if key in fresh else "cache", serial_us=predicted.isolated_sum / scale,
                measured_us=measured, predicted_us=pred, overlap_us=(free.makespan + overhead) / scale, spread_us=entry.spread_us / scale,
                predicted_error=err, profile_scale=scale, profile_repeats=entry.repeats, profile_hardware=hw.name,
            )
        module.attrs.update(
            profile_mode=self.mode, profile_hardware=hw.name, profile_pairs=len(pairs), profile_scale=scale,
            profile_device=executor.description, profile_statistic=self.statistic,
            profile_error_mean=sum(errors) / len(errors), profile_error_p95=_percentile(errors, 95.0),
        )

    def _device_hardware(self, executor, cache_root) -> Hardware:  # noqa: ANN001
        if self.device == "cuda":
            return load_hardware(self.hardware)
        from passes.calibrate_cpu import calibration_path, cpu_hardware

        path = calibration_path(cache_root, executor.world_size, executor.threads_per_rank, self.statistic)
        if self.mode == "cache-only" and not path.is_file():
            raise ProfileError(
                f"profile{{mode=cache-only}}: the local CPU has not been calibrated yet (no {path}); "
                f"run profile{{mode=measured cache-dir={cache_root}}} once to calibrate it and fill the cache"
            )
        return cpu_hardware(cache_root, executor=executor, statistic=self.statistic)

    def _scale(self, items: dict[str, list[ScheduledTask]], hw: Hardware, parallel: ParallelConfig) -> float:
        if self.scale != "auto":
            try:
                scale = float(self.scale)
            except ValueError:
                raise PassError(f"profile: scale must be a number or 'auto', got '{self.scale}'") from None
            if not 0 < scale <= 1:
                raise PassError(f"profile: scale must lie in (0, 1], got {scale}")
            return scale
        if self.target_ms <= 0:
            raise PassError(f"profile: target-ms must be positive, got {self.target_ms}")
        # Work (not fixed latency) of the largest pair: the scale shrinks work only.
        largest = max(
            (sum(task_duration_us(s.task, hw, parallel) for s in v) for v in items.values()), default=0.0
        )
        if largest <= 0:
            return 1.0
        return min(1.0, self.target_ms * 1e3 / largest)

    def _fill(self, plans: list, cache: ProfileCache, executor, versions: dict[str, str], module: Module) -> set[str]:  # noqa: ANN001
        """Measure every pair whose key misses the cache; return the keys measured now."""
        todo: dict[str, tuple[PlanOp, list]] = {}
        for op, execs, _, key in plans:
            if cache.get(key) is None:
                todo.setdefault(key, (op, execs))
        if not todo:
            return set()
        if self.mode == "cache-only":
            op, _ = next(iter(todo.values()))
            raise ProfileError(
                f"profile{{mode=cache-only}}: pair @{op.name} has no cached measurement for device "
                f"'{executor.description}' (key {next(iter(todo))[:12]}, {len(todo)} of {len(plans)} pairs missing) "
                f"in {cache.dir}; fill the cache with profile{{mode=measured cache-dir={cache.root}}} "
                "(same scale, repeats may differ), then rerun"
            )
        from tqdm import tqdm

        bar = tqdm(
            total=len(todo), desc="profile", unit="pair", file=sys.stderr,
            disable=not (self.progress or sys.stderr.isatty()),
        )
        try:
            for key, (op, execs) in todo.items():
                bar.set_postfix_str(op.name)
                m = executor.measure(execs, repeats=self.repeats)
                cache.put(CacheEntry(
                    key=key, measured_us=m.median_us, min_us=m.min_us, samples_us=list(m.samples_us), spread_us=m.spread_us,
                    repeats=m.repeats, device=m.device, versions=versions, signature=signature(execs, executor.world_size),
                    method=m.method, extra={"pair": op.name, "module": module.name, "task_us": m.task_us},
                ))
                bar.update(1)
        finally:
            bar.close()
        return set(todo)
