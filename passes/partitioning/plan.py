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

from passes.partitioning.candidate_table import CandidateTable
from passes.partitioning.megatron import megatron_layout
from passes.partitioning.memory import MemoryAssumptions, build_memory_spec
from passes.partitioning.problem import PartitionProblem
from passes.partitioning.search import solve, solve_global
from passes.partitioning.stages import serially_balanced
from passes.pipelining.order import meeting_stages
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanOp, SymbolRef, Task
from tessera_ir.parallel import ParallelConfig


class PartitionPlanError(TesseraError):
    """No partition can be chosen from the module as it is (no candidates, nothing fits)."""


@dataclass(frozen=True)
class PartitionSettings:
    """How the partition is searched and what memory it reserves (the ``partition`` pass's options;
    the capacity itself is an argument of :func:`choose_partition`)."""

    search: str = "window"  # window: the candidates marked in_window; global: all of them
    solver: str = "cbc"
    time_limit: float = 60.0  # seconds per MILP solve
    wgrad_headroom: bool = True  # reserve one more micro-batch of activations for deferred wgrad
    reserved_gib: float = 4.0  # per device: CUDA context, communication buffers


def build_problem(
    module: Module, parallel: ParallelConfig, table: CandidateTable, capacity_gib: float, settings: PartitionSettings
) -> PartitionProblem:
    """The problem the module's candidates and pair costs (``table``, ``PlanView.candidate_table``)
    describe, with each device's memory within ``capacity_gib``."""
    if not any(table.ranges):
        raise PartitionPlanError("the module holds no candidate ops; run the 'candidates' pass first")
    # Data parallelism, the distributed optimizer and recomputation are the run's parallel
    # settings (the module header), not options of the search.
    memory = build_memory_spec(module, parallel, capacity_gib, MemoryAssumptions(
        wgrad_headroom=settings.wgrad_headroom, reserved_gib=settings.reserved_gib
    ))
    meets = meeting_stages(parallel.pp, parallel.vpp, parallel.microbatches, parallel.combined_1f1b)
    return PartitionProblem(
        len(module.decoder_layers()), parallel.pp, parallel.vpp, table.ranges, meets, table.cost, memory
    )


def choose_partition(
    module: Module, parallel: ParallelConfig, table: CandidateTable, duration: Callable[[Task], float],
    capacity_gib: float, settings: PartitionSettings, note_time: Callable[[str, float], None] | None = None,
) -> PlanOp:
    """The ``partition`` op (not appended) for ``module``'s candidates and pair costs (``table``);
    ``duration`` prices tasks for the serially balanced reference; ``note_time`` receives each
    solver's seconds (they go to ``--timing``, never into the IR)."""
    problem = build_problem(module, parallel, table, capacity_gib, settings)
    names, window_cands = table.names, table.window
    balanced = serially_balanced(module, duration, parallel.virtual_stages)
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
        "cost_sources": sorted(table.sources),
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
