"""The ``profile`` pass: attach a post-overlap cost to every ``pair`` op.

Before (from ``candidates`` and ``overlap-schedule``)::

    plan pair @pair.0 {bwd_candidate = @cand.s1.c0, fwd_candidate = @cand.s0.c0, makespan = 812.5, schedule = @sched.0}
    plan pair_schedule @sched.0 {...} { @l0.linear_attention.fwd {order = 0, start = 0.0, stream = "compute"} ... }

After ``profile{mode=analytic}``::

    plan pair @pair.0 {..., cost_source = "analytic", overlap_us = 812.5, post_overlap_us = 840.2, serial_us = 1310.0}
    module @m {..., profile_hardware = "h100", profile_mode = "analytic", profile_pairs = 1, ...}

Modes:

``analytic``
    The pair's schedule (its ``schedule`` op; a pair without one is scheduled here with
    the gap-fit heuristic) re-timed on the module's target hardware by the contention
    model (``passes/costs/contention.py``): tasks keep their stream order and dependencies,
    and overlapped tasks slow each other down. ``overlap_us`` is the same re-timing
    without contention (the naive schedule of isolated durations), ``serial_us`` the sum
    of isolated durations. Pairs sharing a schedule usually re-time identically: each
    distinct re-timing input (everything but task names, see ``pair_costs.retime_key``) is
    re-timed once and its figures copied to every pair that has it.

``measured``
    The schedule is executed for real (``runtime/pair_executor.py``) on the *measured
    device* (option ``device``): on CPU by two local gloo processes, a compute task as the
    kernel that bounds it on the device (a GEMM with the task's FLOPs and aspect ratio, or
    a copy of its bytes; see ``costs.execution.exec_tasks``), comm tasks as real
    All-to-All; on CUDA on two streams with NCCL. The measured device's hardware is the
    calibrated ``cpu`` on CPU (calibrated now when it is not cached yet: measuring is what
    this mode is for) and the module's target on CUDA; its figures replace the target's
    for this study, and the module's ``profile_hardware`` names it. Work is scaled by one
    factor ``s`` per run (``scale``; ``auto`` picks ``s`` so the largest pair's predicted
    serial time is about ``target-ms``), and times are divided by ``s`` to report
    full-size microseconds (a linear extrapolation: fixed latencies are scaled up too,
    which the spread and the predicted/measured error make visible). Every measured pair
    also gets ``predicted_us``: the analytic model for the measured device on the executed
    work, plus the device's ``pair_overhead_us`` (the executor's fixed cost per pair), so
    ``predicted_error`` compares like with like; the module gets ``profile_error_mean``
    and ``profile_error_p95`` (mean and 95th percentile of ``|predicted - measured| /
    measured``). Pair attributes: ``post_overlap_us`` (= ``measured_us``, the
    ``statistic`` of the repeats: median or min), ``predicted_us``, ``overlap_us``,
    ``serial_us``, ``spread_us`` (max - min over repeats), ``predicted_error`` (signed),
    ``profile_scale``, ``profile_repeats``. Measurements are cached
    (``passes/costs/profile_cache.py``); a cached pair is not executed again
    (``cost_source = "cache"``).

    On CPU (``normalise``, on by default) every repeat runs between two readings of the
    calibration's reference kernel (``calibrate_cpu.reference_tasks``; each reading as many
    runs of it back to back as make the pair's predicted length), pair and reference each on
    buffers allocated and warmed once, and the pair's cost is the ``statistic`` of the
    raw repeats times the reference's calibrated time over the same statistic of the readings:
    a shared machine's speed drifts by up to 2x over seconds, and the prediction is priced at
    the calibrated speed. ``raw_measured_us`` is the unscaled reading, ``speed_ratio`` the
    median of reference now / reference at calibration, and ``spread_us`` is over the repeats
    each scaled by its own two readings.

``cache-only``
    Like ``measured`` but never executes: a pair whose measurement is not cached (or a
    CPU not calibrated yet) is an error naming the pair and how to fill the cache.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from passes.costs.contention import ContentionParams, retime
from passes.costs.hardware import Hardware
from passes.costs.pair_costs import ScheduledTask, contended_tasks, retime_key
from passes.costs.profile_cache import CacheEntry, ProfileCache, cache_key, software_versions
from passes.manager import ModulePass, PassError, option
from passes.plan_view import Pair, PlanView
from support.disk_cache import resolve_cache_dir
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module

if TYPE_CHECKING:
    from passes.costs.contention import RetimedPair
    from runtime.pair_executor import ExecTask, PairExecutor

# Attributes this pass owns (cleared before every run).
PAIR_ATTRS = (
    "post_overlap_us", "cost_source", "serial_us", "overlap_us", "measured_us", "predicted_us",
    "spread_us", "predicted_error", "profile_scale", "profile_repeats", "raw_measured_us", "speed_ratio",
)
MODULE_ATTRS = (
    "profile_mode", "profile_hardware", "profile_pairs", "profile_scale", "profile_device", "profile_statistic",
    "profile_error_mean", "profile_error_p95", "profile_normalised",
)


class ProfileError(TesseraError):
    """A pair that cannot be profiled as asked."""


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
    summary = "Attach a post-overlap cost (analytic with contention, measured, or cached) to every pair."
    requires = ("pair",)

    mode: Literal["analytic", "measured", "cache-only"] = option("analytic", "how pairs are costed")
    repeats: int = option(5, "measured: timed repeats per pair")
    scale: float | Literal["auto"] = option("auto", "measured: work scale factor in (0, 1], or auto (see target-ms)")
    target_ms: float = option(20.0, "measured, scale=auto: predicted serial time of the largest pair, ms")
    cache_dir: str | None = option(None, "measured: cache folder (unset: $TESSERA_CACHE_DIR or ~/.cache/tessera)")
    device: Literal["cpu", "cuda"] = option("cpu", "measured: the device pairs run on (gloo processes, or CUDA streams)")
    progress: bool = option(False, "measured: show a progress bar even when stderr is not a terminal")
    # CPU bf16/fp16 GEMMs switch between very fast and very slow kernels with the shape,
    # which no roofline describes: fp32 is the CPU default.
    exec_dtype: Literal["fp32", "bf16", "fp16", "module"] | None = option(
        None, "measured: dtype of the executed kernels (unset: fp32 on CPU, the module's on CUDA; module: the module's)"
    )
    # The fastest repeat is least disturbed when other work shares the machine. The CPU is
    # calibrated with the same statistic, so predictions and measurements compare alike.
    statistic: Literal["median", "min"] = option("median", "measured: which reading of the repeats is the pair's cost")
    normalise: bool = option(
        True, "measured on CPU: scale each repeat by the calibrated reference kernel's time over its time around it"
    )

    def check(self) -> None:
        if self.repeats < 1:
            raise PassError(f"profile: repeats must be at least 1, got {self.repeats}")
        if self.scale != "auto" and not 0 < self.scale <= 1:
            raise PassError(f"profile: scale must lie in (0, 1] or be auto, got {self.scale}")
        if self.target_ms <= 0:
            raise PassError(f"profile: target-ms must be positive, got {self.target_ms}")

    def apply(self, module: Module) -> bool:
        pairs = module.plan_ops("pair")
        if not pairs:
            return False
        # A rerun (say analytic after measured) must not leave the other mode's figures behind.
        for op in pairs:
            for key in PAIR_ATTRS:
                op.attrs.pop(key, None)
        for key in MODULE_ATTRS:
            module.attrs.pop(key, None)
        view = PlanView(module)
        if self.mode == "analytic":
            self._analytic(module, view)
        else:
            self._measured(module, view)
        return True

    def _analytic(self, module: Module, view: PlanView) -> None:
        contention, free_params = ContentionParams.from_hardware(view.hardware, view.parallel.ep), ContentionParams.none()
        # Pairs that share a schedule usually have identical re-timing inputs up to task
        # names; each distinct input is re-timed once (see retime_key).
        costs: dict[tuple, tuple[float, float, float]] = {}
        # Cheaper still: pairs with the same schedule, the same side signatures (kinds,
        # durations, dependencies) and the same utilisations have the same re-timing input
        # up to names, so only the first of them is turned into one.
        by_sides: dict[tuple, tuple[float, float, float]] = {}
        utilisations: dict[int, int] = {}
        utilisation_ids: dict[tuple, int] = {}

        def utilisation_id(side: list) -> int:
            got = utilisations.get(id(side))
            if got is None:
                signature = tuple(view.utilisation(view.tasks[t.name]) for t in side)
                got = utilisations[id(side)] = utilisation_ids.setdefault(signature, len(utilisation_ids))
            return got

        for pair in view.pairs:
            sides_key = None
            if pair.schedule is not None:
                fwd, bwd = view.pair_sides(pair)
                sides_key = (
                    pair.schedule.name, view.side_id(fwd), utilisation_id(fwd), view.side_id(bwd), utilisation_id(bwd)
                )
                known = by_sides.get(sides_key)
                if known is not None:
                    pair.op.attrs.update(
                        post_overlap_us=known[0], cost_source="analytic", serial_us=known[1], overlap_us=known[2]
                    )
                    continue
            tasks = contended_tasks(view.scheduled_tasks(pair), view.duration, view.utilisation)
            key = retime_key(tasks)
            cost = costs.get(key) if key is not None else None
            if cost is None:
                contended, free = retime(tasks, contention), retime(tasks, free_params)
                cost = (contended.makespan, contended.isolated_sum, free.makespan)
                if key is not None:
                    costs[key] = cost
            if sides_key is not None:
                by_sides[sides_key] = cost
            pair.op.attrs.update(post_overlap_us=cost[0], cost_source="analytic", serial_us=cost[1], overlap_us=cost[2])
        module.attrs.update(profile_mode="analytic", profile_hardware=view.hardware_name, profile_pairs=len(view.pairs))

    def _measured(self, module: Module, target: PlanView) -> None:
        from passes.costs.execution import exec_tasks, predicted_exec, signature
        from runtime.pair_executor import DTYPES, PairExecutionError, PairExecutor

        cache_root = resolve_cache_dir(self.cache_dir)
        cache = ProfileCache(cache_root)
        if self.device == "cuda":
            import torch

            world = max(1, min(2, torch.cuda.device_count()))
        else:
            world = 2
        try:
            executor = PairExecutor(world_size=world, device=self.device)
        except PairExecutionError as err:
            raise ProfileError(f"profile: {err}") from None
        try:
            hw = self._device_hardware(target, executor, cache_root)
            choice = self.exec_dtype or ("fp32" if self.device == "cpu" else "module")
            dtype = target.parallel.dtype if choice == "module" else choice
            if dtype not in DTYPES or dtype not in hw.peak_tflops:
                raise PassError(
                    f"profile: cannot execute in dtype '{dtype}' on {hw.name} (executable: "
                    f"{', '.join(d for d in DTYPES if d in hw.peak_tflops)}); set exec-dtype"
                )
            # The pairs as the measured device runs them: full-size schedules, durations analytic on it.
            view = PlanView(module, device=hw, parallel=replace(target.parallel, dtype=dtype, ep=world))
            items = {pair.name: view.scheduled_tasks(pair) for pair in view.pairs}
            scale = self._scale(items, view)
            versions = software_versions()
            reference = self._reference(hw)
            if reference is not None:
                # Normalised readings are relative to this calibration's reference time.
                versions = dict(versions, normalised=f"reference {float(reference['us']):.3f} us")  # type: ignore[arg-type]
            plans = []
            for pair in view.pairs:
                execs = exec_tasks(items[pair.name], scale, dtype, hw, view.parallel)
                predicted, free = predicted_exec(items[pair.name], execs, hw, view.parallel, world)
                key = cache_key(signature(execs, world), executor.description, versions)
                plans.append((pair, execs, (predicted, free), key))
            fresh = self._fill(plans, cache, executor, versions, module, reference)
        except PairExecutionError as err:
            raise ProfileError(f"profile: executing a pair failed: {err}") from None
        finally:
            executor.close()

        errors: list[float] = []
        for pair, _, (predicted, free), key in plans:
            entry = cache.get(key)
            assert entry is not None  # _fill measured or refused every miss
            measured = ((entry.min_us or min(entry.samples_us)) if self.statistic == "min" else entry.measured_us) / scale
            # The executor's fixed cost per pair (calibrated on CPU; absent for GPUs).
            overhead = float(hw.extra.get("pair_overhead_us", 0.0))  # type: ignore[arg-type]
            pred = (predicted.makespan + overhead) / scale
            error = (pred - measured) / measured
            errors.append(abs(error))
            pair.op.attrs.update(
                post_overlap_us=measured, cost_source="measured" if key in fresh else "cache",
                serial_us=predicted.isolated_sum / scale, measured_us=measured, predicted_us=pred,
                overlap_us=(free.makespan + overhead) / scale, spread_us=entry.spread_us / scale,
                predicted_error=error, profile_scale=scale, profile_repeats=entry.repeats,
            )
            raw, ratios = entry.extra.get("raw_samples_us"), entry.extra.get("speed_ratios")
            if isinstance(raw, list) and raw and isinstance(ratios, list) and ratios:
                pick = min if self.statistic == "min" else statistics.median
                pair.op.attrs.update(raw_measured_us=float(pick(raw)) / scale, speed_ratio=float(statistics.median(ratios)))
        module.attrs.update(
            profile_mode=self.mode, profile_hardware=hw.name, profile_pairs=len(plans), profile_scale=scale,
            profile_device=executor.description, profile_statistic=self.statistic,
            profile_error_mean=sum(errors) / len(errors), profile_error_p95=_percentile(errors, 95.0),
            profile_normalised=reference is not None,
        )

    def _reference(self, hw: Hardware) -> dict[str, object] | None:
        """The calibration's reference kernel when readings are to be normalised (CPU), else None."""
        if not self.normalise or self.device != "cpu":
            return None
        reference = hw.extra.get("reference")
        if not isinstance(reference, dict) or not isinstance(reference.get("us"), (int, float)):
            raise ProfileError(
                f"profile: the calibration of '{hw.name}' has no reference kernel to normalise by; calibrate again "
                "(tessera-calibrate --refresh) or set normalise=false"
            )
        return reference

    def _device_hardware(self, target: PlanView, executor: PairExecutor, cache_root: Path) -> Hardware:
        """The measured device's hardware: the target on CUDA, the calibrated CPU on CPU."""
        if self.device == "cuda":
            return target.hardware
        from passes.costs.calibrate_cpu import cpu_hardware
        from passes.costs.calibration_cache import calibration_path, read_calibration

        cached = read_calibration(cache_root, executor.world_size, executor.threads_per_rank, self.statistic)
        if cached is not None:
            return cached
        path = calibration_path(cache_root, executor.world_size, executor.threads_per_rank, self.statistic)
        if self.mode == "cache-only":
            raise ProfileError(
                f"profile{{mode=cache-only}}: the local CPU has not been calibrated yet (no {path}); "
                f"run profile{{mode=measured cache-dir={cache_root}}} once to calibrate it and fill the cache"
            )

        def announce(where: Path) -> None:
            print(f"profile: calibrating the local CPU (a minute or two; cached in {where})", file=sys.stderr)

        return cpu_hardware(cache_root, executor=executor, statistic=self.statistic, announce=announce)

    def _scale(self, items: dict[str, list[ScheduledTask]], view: PlanView) -> float:
        if self.scale != "auto":
            return float(self.scale)
        # Work (not fixed latency) of the largest pair: the scale shrinks work only.
        largest = max((sum(view.duration(s.task) for s in v) for v in items.values()), default=0.0)
        if largest <= 0:
            return 1.0
        return min(1.0, self.target_ms * 1e3 / largest)

    def _fill(
        self, plans: Sequence[tuple[Pair, list[ExecTask], tuple[RetimedPair, RetimedPair], str]], cache: ProfileCache,
        executor: PairExecutor,
        versions: dict[str, str], module: Module, reference: dict[str, object] | None = None,
    ) -> set[str]:
        """Measure every pair whose key misses the cache (between reference readings when
        ``reference`` is given); return the keys measured now."""
        from passes.costs.calibrate_cpu import reference_tasks
        from passes.costs.execution import measure_normalised, signature

        todo: dict[str, tuple[Pair, list[ExecTask], float]] = {}
        for pair, execs, costs, key in plans:
            if cache.get(key) is None:
                todo.setdefault(key, (pair, execs, costs[0].makespan))
        if not todo:
            return set()
        if self.mode == "cache-only":
            pair, _, _ = next(iter(todo.values()))
            raise ProfileError(
                f"profile{{mode=cache-only}}: pair @{pair.name} has no cached measurement for device "
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
            for key, (pair, execs, predicted_us) in todo.items():
                bar.set_postfix_str(pair.name)
                extra: dict[str, object] = {"pair": pair.name, "module": module.name}
                if reference is not None:
                    n = measure_normalised(
                        executor, execs, self.repeats, reference_tasks(reference), float(reference["us"]),  # type: ignore[arg-type]
                        predicted_us,
                    )
                    m = n.measurement
                    median_us, min_us = n.at_reference_speed("median"), n.at_reference_speed("min")
                    extra.update(
                        raw_samples_us=list(n.raw_us), speed_ratios=list(n.ratios),
                        reference_readings_us=list(n.reference_readings_us),
                    )
                else:
                    m = executor.measure(execs, repeats=self.repeats)
                    median_us, min_us = m.median_us, m.min_us
                    extra["task_us"] = m.task_us
                cache.put(CacheEntry(
                    key=key, measured_us=median_us, min_us=min_us, samples_us=list(m.samples_us), spread_us=m.spread_us,
                    repeats=m.repeats, device=executor.description, versions=versions,
                    signature=signature(execs, executor.world_size), method=m.method, extra=extra,
                ))
                bar.update(1)
        finally:
            bar.close()
        return set(todo)
