"""Choose a partition from a module's candidates and pair costs, and write it as the ``partition`` op.

Shared by the ``partition`` pass and by ``refine-bottleneck``, which re-runs it when a refined
pair changes a cost. The problem (``partitioning.problem``): one candidate range per virtual
stage, contiguous and covering all decoder layers, each device's memory within capacity
(``partitioning.memory``); minimise the worst post-overlap cost of the pairs that meet on a
device in the steady state (the bottleneck), then their total.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from passes.partitioning.megatron import megatron_layout
from passes.partitioning.memory import MemoryAssumptions, build_memory_spec
from passes.partitioning.problem import PartitionProblem
from passes.partitioning.ranges import Range
from passes.partitioning.search import solve, solve_global
from passes.partitioning.stages import serially_balanced
from passes.plan_view import Candidate, PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import PlanOp, SymbolRef


class PartitionPlanError(TesseraError):
    """No partition can be chosen from the module as it is (no candidates, nothing fits)."""


@dataclass(frozen=True)
class PartitionSettings:
    """How the partition is searched and what memory it must fit (the ``partition`` pass's options)."""

    search: str = "window"  # window: the candidates marked in_window; global: all of them
    solver: str = "cbc"
    time_limit: float = 60.0  # seconds per MILP solve
    memory_gib: float | None = None  # device capacity (None: the target hardware's)
    wgrad_headroom: bool = True  # reserve one more micro-batch of activations for deferred wgrad
    reserved_gib: float = 4.0  # per device: CUDA context, communication buffers


def build_problem(
    view: PlanView, settings: PartitionSettings
) -> tuple[PartitionProblem, dict[tuple[int, Range], str], list[list[Range]], set[str]]:
    """The problem the module's candidates and pairs describe, plus candidate names, the window
    subset and which cost attributes were used."""
    parallel = view.parallel
    stages = parallel.virtual_stages
    if not view.candidates:
        raise PartitionPlanError("the module holds no candidate ops; run the 'candidates' pass first")
    cands: list[list[Range]] = [[] for _ in range(stages)]
    window: list[list[Range]] = [[] for _ in range(stages)]
    by_range: dict[tuple[int, Range], Candidate] = {}
    for cand in view.candidates:
        key = (cand.stage, cand.range)
        if key not in by_range:
            by_range[key] = cand
            cands[cand.stage].append(cand.range)
            if cand.in_window:
                window[cand.stage].append(cand.range)
    sources: set[str] = set()
    serial_cache: dict[tuple[int, Range, int, Range], float] = {}

    def cost(sf: int, rf: Range, sb: int, rb: Range) -> float:
        fwd, bwd = by_range[(sf, rf)], by_range[(sb, rb)]
        pair = view.pair_for(fwd, bwd)
        found = pair.cost() if pair is not None else None
        if found is not None:
            sources.add(found[1])
            return found[0]
        sources.add("serial")
        key = (sf, rf, sb, rb)
        if key not in serial_cache:
            serial_cache[key] = view.serial_us(fwd.layers, bwd.layers)
        return serial_cache[key]

    capacity = settings.memory_gib if settings.memory_gib is not None else view.hardware.memory_gib
    # Data parallelism, the distributed optimizer and recomputation are the run's parallel
    # settings (the module header), not options of the search.
    memory = build_memory_spec(view.module, parallel, capacity, MemoryAssumptions(
        wgrad_headroom=settings.wgrad_headroom, reserved_gib=settings.reserved_gib
    ))
    problem = PartitionProblem(
        len(view.module.decoder_layers()), parallel.pp, parallel.vpp, [sorted(c) for c in cands],
        view.meeting_stages(), cost, memory,
    )
    names = {key: cand.name for key, cand in by_range.items()}
    return problem, names, [sorted(w) for w in window], sources


def choose_partition(
    view: PlanView, settings: PartitionSettings, note_time: Callable[[str, float], None] | None = None
) -> PlanOp:
    """The ``partition`` op for the module ``view`` reads (not appended); ``note_time`` receives
    each solver's seconds (they go to ``--timing``, never into the IR)."""
    problem, names, window_cands, sources = build_problem(view, settings)
    balanced = serially_balanced(view.module, view.duration, view.parallel.virtual_stages)
    window = solve(replace(problem, candidates=window_cands), settings.solver, settings.time_limit, [balanced])
    if note_time is not None:
        note_time("window search", window.seconds)
    chosen, global_sol = window, None
    if settings.search == "global":
        global_sol = solve_global(problem, settings.solver, settings.time_limit, [window.ranges, balanced])
        if note_time is not None:
            note_time("global search", global_sol.seconds)
        chosen = global_sol
    ranges = chosen.ranges
    attrs: dict = {
        "stages": [SymbolRef(names[(s, r)]) for s, r in enumerate(ranges)],
        "layers_per_stage": [r[1] - r[0] + 1 for r in ranges],
        "bottleneck_us": chosen.bottleneck,
        "total_us": chosen.total,
        "megatron_layout": megatron_layout(ranges),
        "search": settings.search,
        "solver": settings.solver,
        "window_bottleneck_us": window.bottleneck,
        "cost_sources": sorted(sources),
    }
    if all(r in window_cands[s] for s, r in enumerate(balanced)):
        attrs["balanced_bottleneck_us"] = problem.evaluate(balanced)[0]
        attrs["balanced_megatron_layout"] = megatron_layout(balanced)
    if global_sol is not None:
        attrs["global_bottleneck_us"] = global_sol.bottleneck
    for when in ("before", "after"):
        size = window.stats.get(when)
        if isinstance(size, dict):
            attrs[f"milp_variables_{when}"] = size["variables"]
            attrs[f"milp_constraints_{when}"] = size["constraints"]
    if problem.memory is not None:
        attrs["memory_capacity_bytes"] = problem.memory.capacity
        attrs["memory_peak_bytes"] = [
            problem.memory.device_bytes(
                problem.pp, problem.vpp, d, [ranges[d + c * problem.pp] for c in range(problem.vpp)]
            )
            for d in range(problem.pp)
        ]
    return PlanOp("partition", "partition", attrs)
