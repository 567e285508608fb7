"""The capacity report: what a plan does to whole training iterations, with and without the DBO.

A :class:`RunSummary` condenses simulated iterations of one configuration (means over
iterations unless said otherwise):

- ``iteration_us``, ``tokens_per_s`` (all data-parallel replicas), ``mfu``: model FLOPs over
  peak FLOPs of the pipeline's devices for the mean iteration time. Model FLOPs are the IR's
  FLOPs summed over every task (forward, dgrad, wgrad) of every layer for every micro-batch —
  for the GEMMs exactly ``6 × active parameters × tokens``, plus the attention/recurrence core
  terms (forward once, backward twice) — per device after tensor and expert sharding.
- ``stage_us``: per pipeline rank, time spent inside its actions (its post-overlap work, the
  waits for inputs excluded); ``stage_imbalance`` = largest over mean.
- ``exposed``: per collective kind (dispatch, combine, point-to-point, gradient reduction),
  the fraction of its time no computation hid (see ``engine``).
- ``idle_us``: compute-stream idle summed over ranks; ``pipeline_wait_us`` the part between
  actions (warm-up, receives, cool-down), ``in_step_idle_us`` the part inside actions
  (waiting for All-to-All, longer under skewed routing).
- ``peak_bytes``: per rank, weights + gradients + optimizer state + the most in-flight
  activations (and DBO pool) at once, worst over iterations.
- ``dbo``: the policy's counters summed over ranks and iterations (None without DBO).

The DBO's gain is reported beside what earns it (:class:`DboAttribution`): its bound, the static
plan with every weight gradient at zero cost (no placement of deferred weight gradients can beat
it), and the same policy over Megatron-Core's fixed-template pairs on the same partition, whose
schedules leave the weight gradients exposed where gap-fit already hides most of them — so a
small DBO gain over gap-fit pairs reads as "little left to take", not as a weak policy.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from passes.simulation.engine import COMM_KINDS, DboSettings, SimulationResult, simulate
from passes.simulation.program import SimulationInput
from passes.simulation.routing import RoutingError, RoutingModel, RoutingSpec
from passes.simulation.slots import without_weight_gradients
from runtime.dbo import DboCounters
from support.processes import beside, cpu_cores

if TYPE_CHECKING:
    from passes.costs.ledger_file import LedgerFold
    from passes.simulation.build import PlanReader

GIB = 2**30
KIND_LABELS = {"dispatch": "dispatch", "combine": "combine", "p2p": "pipeline send/recv", "grad_reduce": "gradient reduction"}


@dataclass
class RunSummary:
    label: str
    iterations: int
    iteration_us: float
    iteration_min_us: float
    iteration_max_us: float
    tokens_per_s: float
    mfu: float
    stage_us: list[float]
    stage_imbalance: float
    exposed: dict[str, float]
    idle_us: float
    pipeline_wait_us: float
    in_step_idle_us: float
    peak_bytes: list[int]
    comm_us: dict[str, tuple[float, float]] = field(default_factory=dict)  # kind -> (total, exposed) per iteration
    dbo: DboCounters | None = None

    def exposed_of(self, *kinds: str) -> float:
        """The exposed fraction of several collective kinds together (e.g. dispatch and combine)."""
        total = sum(self.comm_us[k][0] for k in kinds)
        return sum(self.comm_us[k][1] for k in kinds) / total if total > 0 else 0.0

    def as_dict(self) -> dict:
        out = {
            "label": self.label,
            "iterations": self.iterations,
            "iteration_ms": _r(self.iteration_us / 1e3),
            "iteration_min_ms": _r(self.iteration_min_us / 1e3),
            "iteration_max_ms": _r(self.iteration_max_us / 1e3),
            "tokens_per_s": _r(self.tokens_per_s),
            "mfu": _r(self.mfu),
            "stage_ms": [_r(x / 1e3) for x in self.stage_us],
            "stage_imbalance": _r(self.stage_imbalance),
            "exposed_fraction": {k: _r(v) for k, v in self.exposed.items()},
            "compute_idle_ms": _r(self.idle_us / 1e3),
            "pipeline_wait_ms": _r(self.pipeline_wait_us / 1e3),
            "in_step_idle_ms": _r(self.in_step_idle_us / 1e3),
            "peak_memory_gib": [_r(b / GIB) for b in self.peak_bytes],
        }
        if self.dbo is not None:
            out["dbo"] = {k: _r(v) if isinstance(v, float) else v for k, v in self.dbo.as_dict().items()}
        return out


def _r(x: float) -> float:
    """Rounded for reports: stable text across platforms, precise enough for every figure shown."""
    return float(f"{x:.6g}") if math.isfinite(x) else x


def summarize(label: str, results: Sequence[SimulationResult]) -> RunSummary:
    """Means (and worsts) over simulated iterations of one configuration."""
    if not results:
        raise ValueError("summarize needs at least one simulated iteration")
    n = len(results)
    inp = results[0].inp
    times = [r.iteration_us for r in results]
    mean_t = sum(times) / n
    pp = inp.pp
    stage = [sum(r.ranks[k].action_us for r in results) / n for k in range(pp)]
    mean_stage = sum(stage) / pp
    comm_us = {
        kind: (sum(r.comm[kind].total_us for r in results) / n, sum(r.comm[kind].exposed_us for r in results) / n)
        for kind in COMM_KINDS
    }
    exposed = {kind: exposed / total if total > 0 else 0.0 for kind, (total, exposed) in comm_us.items()}
    counters = [r.dbo for r in results if r.dbo is not None]
    dbo = None
    if counters:
        dbo = DboCounters()
        for c in counters:
            dbo = dbo.merge(c)
    capacity = pp * inp.peak_flops_per_rank * mean_t * 1e-6
    return RunSummary(
        label=label,
        iterations=n,
        iteration_us=mean_t,
        iteration_min_us=min(times),
        iteration_max_us=max(times),
        tokens_per_s=inp.tokens_per_iteration / (mean_t * 1e-6) if mean_t > 0 else 0.0,
        mfu=inp.flops_per_iteration / capacity if capacity > 0 else 0.0,
        stage_us=stage,
        stage_imbalance=max(stage) / mean_stage if mean_stage > 0 else 1.0,
        exposed=exposed,
        idle_us=sum(r.pipeline_idle_us for r in results) / n,
        pipeline_wait_us=sum(rank.pipeline_wait_us for r in results for rank in r.ranks) / n,
        in_step_idle_us=sum(rank.in_action_idle_us for r in results for rank in r.ranks) / n,
        peak_bytes=[max(r.ranks[k].peak_bytes for r in results) for k in range(pp)],
        comm_us=comm_us,
        dbo=dbo,
    )


def run_iterations(
    inp: SimulationInput,
    routing: RoutingModel | None,
    iterations: int,
    dbo: DboSettings | None = None,
    record_first: bool = False,
) -> list[SimulationResult]:
    """Simulate ``iterations`` iterations, drawing routing per iteration (None: perfectly balanced)."""
    out = []
    for it in range(iterations):
        imbalance = routing.imbalance(it) if routing is not None else None
        out.append(simulate(inp, imbalance, dbo=dbo, record=record_first and it == 0))
    return out


@dataclass
class DboAttribution:
    """The DBO's bound and the policy over fixed-template pairs, simulated under the same routing draws."""

    bound: RunSummary  # the static plan, every weight gradient free
    fixed: RunSummary  # fixed-template pairs on the same partition, static
    fixed_dbo: RunSummary  # ... with the DBO (its own slots, pool and headroom budget)
    fixed_bound: RunSummary  # ... every weight gradient free

    def as_dict(self, static: RunSummary, dynamic: RunSummary) -> dict:
        return {
            "gap_fit": {"dbo_reduction": _r(_reduction(static, dynamic)), "bound_reduction": _r(_reduction(static, self.bound))},
            "fixed_template": {
                "iteration_ms": _r(self.fixed.iteration_us / 1e3),
                "dbo_reduction": _r(_reduction(self.fixed, self.fixed_dbo)),
                "bound_reduction": _r(_reduction(self.fixed, self.fixed_bound)),
            },
        }

    def render(self, static: RunSummary, dynamic: RunSummary) -> list[str]:
        rows = [
            ("gap-fit pairs (the plan)", static, dynamic, self.bound),
            ("fixed-template pairs", self.fixed, self.fixed_dbo, self.fixed_bound),
        ]
        lines = ["DBO attributed (iteration-time reduction over the same pairs without it; bound: every weight "
                 "gradient free):"]
        for name, base, with_dbo, bound in rows:
            gain, limit = _reduction(base, with_dbo), _reduction(base, bound)
            share = f", {100 * gain / limit:.0f}% of the bound" if limit > 0 else ""
            lines.append(f"  {name:26} static {base.iteration_us / 1e3:10.3f} ms   DBO {100 * gain:+.2f}%   bound "
                         f"{100 * limit:.2f}%{share}")
        return lines


def _reduction(base: RunSummary, other: RunSummary) -> float:
    return 1.0 - other.iteration_us / base.iteration_us if base.iteration_us > 0 else 0.0


@dataclass
class CapacityReport:
    """The static plan and the plan with DBO, simulated under the same routing draws."""

    title: str
    hardware: str
    routing: str
    mean_imbalance: float  # mean over MoE layers, micro-batches and iterations of the load imbalance
    static: RunSummary
    dynamic: RunSummary | None
    notes: list[str] = field(default_factory=list)
    ledger: LedgerFold | None = None  # a training run's ledger folded into the plan (tessera-compile --ledger)
    attribution: DboAttribution | None = None

    def as_dict(self) -> dict:
        out: dict = {
            "title": self.title,
            "hardware": self.hardware,
            "routing": self.routing,
            "mean_load_imbalance": _r(self.mean_imbalance),
            "static": self.static.as_dict(),
        }
        if self.dynamic is not None:
            out["dbo"] = self.dynamic.as_dict()
            out["dbo_iteration_reduction"] = _r(1.0 - self.dynamic.iteration_us / self.static.iteration_us)
            out["dbo_memory_added_gib"] = _r(self.memory_added_bytes / GIB)
            if self.attribution is not None:
                out["dbo_attribution"] = self.attribution.as_dict(self.static, self.dynamic)
        if self.notes:
            out["notes"] = list(self.notes)
        if self.ledger is not None:
            out["ledger"] = self.ledger.as_dict()
        return out

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, sort_keys=True) + "\n"

    @property
    def memory_added_bytes(self) -> int:
        if self.dynamic is None:
            return 0
        return max(d - s for d, s in zip(self.dynamic.peak_bytes, self.static.peak_bytes))

    def render(self) -> str:
        s, d = self.static, self.dynamic
        lines = [
            f"Capacity report: {self.title} — simulated on {self.hardware}, {s.iterations} iteration(s), routing "
            f"{self.routing} (mean load imbalance {self.mean_imbalance:.3f}: most loaded EP rank over the mean)",
        ]
        rows = [
            ("iteration time (ms)", f"{s.iteration_us / 1e3:.3f}", d and f"{d.iteration_us / 1e3:.3f}"),
            ("tokens/s", f"{s.tokens_per_s:,.0f}", d and f"{d.tokens_per_s:,.0f}"),
            ("MFU", f"{100 * s.mfu:.1f}%", d and f"{100 * d.mfu:.1f}%"),
            ("compute idle, all ranks (ms)", f"{s.idle_us / 1e3:.3f}", d and f"{d.idle_us / 1e3:.3f}"),
            ("  between steps (pipeline)", f"{s.pipeline_wait_us / 1e3:.3f}", d and f"{d.pipeline_wait_us / 1e3:.3f}"),
            ("  inside steps (A2A waits)", f"{s.in_step_idle_us / 1e3:.3f}", d and f"{d.in_step_idle_us / 1e3:.3f}"),
            ("stage imbalance (max/mean)", f"{s.stage_imbalance:.3f}", d and f"{d.stage_imbalance:.3f}"),
        ]
        rows += [(f"exposed {KIND_LABELS[k]}", f"{100 * s.exposed[k]:.1f}%", d and f"{100 * d.exposed[k]:.1f}%") for k in COMM_KINDS]
        width = max(len(r[0]) for r in rows)
        header = f"{'':{width}}  {'static plan':>12}" + (f"  {'+ DBO':>12}" if d else "")
        lines.append(header)
        for name, a, b in rows:
            lines.append(f"{name:{width}}  {a:>12}" + (f"  {b:>12}" if d else ""))
        if d is not None:
            change = 1.0 - d.iteration_us / s.iteration_us
            lines.append(f"DBO changes the iteration time by {-100 * change:+.2f}%.")
            if self.attribution is not None:
                lines += self.attribution.render(s, d)
        lines.append("")
        lines.append("Per stage (pipeline rank): post-overlap work per iteration, peak memory" + (" (static / + DBO)" if d else ""))
        for k, work in enumerate(s.stage_us):
            mem = f"{s.peak_bytes[k] / GIB:.2f} GiB" + (f" / {d.peak_bytes[k] / GIB:.2f} GiB" if d else "")
            lines.append(f"  rank {k:2d}: {work / 1e3:10.3f} ms   {mem}")
        if d is not None and d.dbo is not None:
            c = d.dbo
            error = c.abs_error_us / c.observed_us if c.observed_us > 0 else 0.0
            lines += [
                "",
                f"DBO: {c.slots} slots ({c.slots_filled} filled); predicted {c.predicted_us / 1e3:.3f} ms vs observed "
                f"{c.observed_us / 1e3:.3f} ms of idle (mean absolute error {100 * error:.1f}% of observed)",
                f"     {c.offered} movable tasks offered, {c.deferred} deferred ({c.refused_memory} refused by the memory "
                f"budget, {c.refused_deadline} because no slot before their deadline could take them), {c.placed} placed "
                f"in slots, {c.fallbacks} fell back at their deadline",
                f"     idle recovered {c.recovered_us / 1e3:.3f} ms (overrun {c.overrun_us / 1e3:.3f} ms); memory added "
                f"{self.memory_added_bytes / GIB:.2f} GiB at the worst stage",
            ]
        for note in self.notes:
            lines.append(note)
        if self.ledger is not None:
            lines += ["", *self.ledger.render()]
        return "\n".join(lines)


@dataclass
class PlanCapacity:
    """The capacity report of a planned module, and the DBO run's recorded first iteration (for traces)."""

    report: CapacityReport
    dynamic_first: SimulationResult


# Below this many simulated task steps (tasks of every action, times iterations) a second process
# costs more than it saves (make demo's plan simulates about 495,000 per configuration).
_FORK_ABOVE_TASK_STEPS = 200_000


def _task_steps(inp: SimulationInput, iterations: int) -> int:
    return iterations * sum(len(action.program.tasks) for actions in inp.ranks for action in actions)


def _other_core() -> bool:
    return hasattr(os, "fork") and cpu_cores() > 1


def plan_capacity(
    view: PlanReader, routing: RoutingSpec, iterations: int = 10, dp: int | None = None, record: bool = False,
    second_process: bool = False, attribution: bool = True,
) -> PlanCapacity:
    """Simulate the plan ``view`` reads (a ``PlanView``) with and without the DBO under the same routing draws.

    The configurations are independent: with ``second_process``, a second core and a large plan,
    those without the DBO run in a forked process beside those with it (same draws, same numbers).
    Off by default, since forking is only safe where the caller knows which threads its process
    runs (the command-line compile does; a trainer embedding the API may not). ``attribution``
    adds the DBO's bound and the fixed-template pairs with and without it (:class:`DboAttribution`).
    """
    from passes.simulation.build import BuildOptions, SimulationBuilder

    if iterations < 1:
        raise RoutingError(f"the capacity report needs at least one iteration, got {iterations}")
    static_builder = SimulationBuilder(view, BuildOptions(dp=dp))
    static_inp = static_builder.build()
    model = static_builder.routing(routing)

    fixed_builder = SimulationBuilder(view, BuildOptions(dp=dp, method="fixed-template")) if attribution else None

    def static_side() -> tuple[RunSummary, list[RunSummary]]:
        """The runs without the DBO: the static plan, and for the attribution its bound and the
        fixed-template pairs with their bound."""
        static = summarize("static plan", run_iterations(static_inp, model, iterations))
        if fixed_builder is None:
            return static, []
        fixed_inp = fixed_builder.build()
        return static, [
            summarize("static plan, weight gradients free", run_iterations(without_weight_gradients(static_inp), model, iterations)),
            summarize("fixed-template pairs", run_iterations(fixed_inp, model, iterations)),
            summarize("fixed-template pairs, weight gradients free",
                      run_iterations(without_weight_gradients(fixed_inp), model, iterations)),
        ]

    static_wait = (
        beside(static_side)
        if second_process and _task_steps(static_inp, iterations) >= _FORK_ABOVE_TASK_STEPS and _other_core()
        else None
    )
    dbo_builder = SimulationBuilder(view, BuildOptions(dp=dp, dbo=True))
    dbo_inp = dbo_builder.build()
    settings = dbo_builder.dbo_settings(dbo_inp)
    dynamic = run_iterations(dbo_inp, model, iterations, settings, record_first=record)
    fixed_dbo = None
    if attribution:
        fixed_dbo_builder = SimulationBuilder(view, BuildOptions(dp=dp, method="fixed-template", dbo=True))
        fixed_dbo_inp = fixed_dbo_builder.build()
        fixed_dbo = summarize("fixed-template pairs + DBO", run_iterations(
            fixed_dbo_inp, model, iterations, fixed_dbo_builder.dbo_settings(fixed_dbo_inp)))
    static, others = static_wait() if static_wait is not None else static_side()
    moe = model.moe_layers
    mean = (sum(float(model.imbalance(i)[moe].mean()) for i in range(iterations)) / iterations) if moe else 1.0
    p = static_builder.parallel
    steps = static_builder.steps
    order = ("combined " if steps.combined else "") + ("interleaved 1F1B" if p.vpp > 1 else "1F1B")
    title = (
        f"{view.module.attrs.get('model', view.module.name)} PP={p.pp} VPP={p.vpp} EP={p.ep} TP={p.tp}, {p.microbatches} micro-batches, "
        f"DP={static_builder.dp}, {order}" + (" (the per-rank programs' steps)" if steps.from_programs else "")
    )
    report = CapacityReport(title, static_builder.hw.name, routing.describe(), mean, static,
                            summarize("static plan + DBO", dynamic))
    if fixed_dbo is not None:
        bound, fixed, fixed_bound = others
        report.attribution = DboAttribution(bound=bound, fixed=fixed, fixed_dbo=fixed_dbo, fixed_bound=fixed_bound)
    return PlanCapacity(report, dynamic[0])
