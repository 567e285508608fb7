"""The ``partition`` pass: choose one candidate per virtual stage by a MILP over post-overlap pair costs.

Before: ``candidate`` and ``pair`` ops (with ``post_overlap_us`` from ``profile``). After::

    plan partition @partition {bottleneck_us = 812.5, megatron_layout = "Et*3|t*3|t*2|t*3L", search = "window",
                               stages = [@cand.s0.c4, @cand.s1.c2, ...], total_us = ..., ...}

The problem (``partitioning.problem``): one candidate range per virtual stage, contiguous and
covering all decoder layers, each device's memory within capacity (``partitioning.memory``);
minimise the worst post-overlap cost of the pairs that meet on a device in the steady state
(the bottleneck), then their total. Profile-guided pruning first (``partitioning.pruning``),
then the MILP (``partitioning.milp``).

Pair costs, for the forward of one chosen candidate beside the backward of another
(``PlanView.pair_for``): the pair op's ``post_overlap_us`` (from ``profile``), else its
``makespan`` (from ``overlap-schedule``), else the serial sum of its tasks' isolated
durations; a meeting with no pair op at all is costed serially too (hand-written IR may
list only some pairs). The op's ``cost_sources`` lists which of these were used.

``search=global`` searches every contiguous partition the candidates allow (run
``candidates{search=global}``): all ranges are pruned against the window optimum, then the
same MILP runs (the exact DP when vpp ≤ 2, where its state stays small). The partition op
then reports both bottlenecks, so the price of the local window is known. How long the
solvers took goes to ``--timing``, not into the IR.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Literal

from passes.manager import ModulePass, PassError, note_time, option
from passes.partitioning.megatron import megatron_layout
from passes.partitioning.memory import MemoryAssumptions, build_memory_spec
from passes.partitioning.problem import PartitionProblem
from passes.partitioning.ranges import Range
from passes.partitioning.search import solve, solve_global
from passes.partitioning.stages import check_decoder_order, serially_balanced
from passes.plan_view import Candidate, PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanOp, SymbolRef


@dataclass(frozen=True)
class PartitionPass(ModulePass):
    name = "partition"
    summary = "Pick one candidate per virtual stage minimising the worst post-overlap pair cost (MILP)."

    search: Literal["window", "global"] = option("window", "window: the candidates marked in_window; global: all of them")
    solver: Literal["cbc", "highs"] = option("cbc", "the MILP solver")
    time_limit: float = option(60.0, "seconds per MILP solve")
    memory_gib: float | None = option(None, "device memory capacity in GiB (unset: the target hardware's)")
    wgrad_headroom: bool = option(True, "reserve one more micro-batch of activations for deferred wgrad")
    reserved_gib: float = option(4.0, "memory per device no model tensor uses (CUDA context, comm buffers)")

    def check(self) -> None:
        if self.time_limit <= 0:
            raise PassError(f"partition: time-limit must be positive, got {self.time_limit}")
        if self.memory_gib is not None and self.memory_gib <= 0:
            raise PassError(f"partition: memory-gib must be positive, got {self.memory_gib}")
        if self.reserved_gib < 0:
            raise PassError(f"partition: reserved-gib must be >= 0, got {self.reserved_gib}")

    def apply(self, module: Module) -> bool:
        if module.plan_ops("partition"):
            raise PassError("partition: the module already holds a partition op")
        check_decoder_order(module)
        view = PlanView(module)
        problem, names, window_cands, sources = self.build_problem(view)
        balanced = serially_balanced(module, view.duration, view.parallel.virtual_stages)
        window_problem = replace(problem, candidates=window_cands)
        try:
            window = solve(window_problem, self.solver, self.time_limit, [balanced])
            note_time("window search", window.seconds)
            chosen = window
            global_sol = None
            if self.search == "global":
                global_sol = solve_global(problem, self.solver, self.time_limit, [window.ranges, balanced])
                note_time("global search", global_sol.seconds)
                chosen = global_sol
        except TesseraError as err:
            raise PassError(f"partition: {err}") from None
        ranges = chosen.ranges
        attrs: dict = {
            "stages": [SymbolRef(names[(s, r)]) for s, r in enumerate(ranges)],
            "layers_per_stage": [r[1] - r[0] + 1 for r in ranges],
            "bottleneck_us": chosen.bottleneck,
            "total_us": chosen.total,
            "megatron_layout": megatron_layout(ranges),
            "search": self.search,
            "solver": self.solver,
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
        module.plan.append(PlanOp("partition", "partition", attrs))
        return True

    def build_problem(
        self, view: PlanView
    ) -> tuple[PartitionProblem, dict[tuple[int, Range], str], list[list[Range]], set[str]]:
        """The problem the module's candidates and pairs describe, plus names and the window subset."""
        parallel = view.parallel
        stages = parallel.virtual_stages
        if not view.candidates:
            raise PassError("partition: the module holds no candidate ops; run the 'candidates' pass first")
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

        capacity = self.memory_gib if self.memory_gib is not None else view.hardware.memory_gib
        # Data parallelism, the distributed optimizer and recomputation are the run's parallel
        # settings (the module header), not options of this pass.
        memory = build_memory_spec(view.module, parallel, capacity, MemoryAssumptions(
            wgrad_headroom=self.wgrad_headroom, reserved_gib=self.reserved_gib
        ))
        problem = PartitionProblem(
            len(view.module.decoder_layers()), parallel.pp, parallel.vpp, [sorted(c) for c in cands],
            view.meeting_stages(), cost, memory,
        )
        names = {key: cand.name for key, cand in by_range.items()}
        return problem, names, [sorted(w) for w in window], sources


def partition_to_json(module: Module) -> dict:
    """The chosen partition as JSON-ready data (the CLI writes it)."""
    view = PlanView(module)
    part = view.partition
    if part is None:
        raise PassError("no partition op in the module; run the 'partition' pass first")
    pp = view.parallel.pp
    stages = [
        {
            "stage": s,
            "device": s % pp,
            "chunk": s // pp,
            "candidate": cand.name,
            "first": cand.range[0],
            "last": cand.range[1],
            "layers": list(cand.chunk),
        }
        for s, cand in enumerate(part.stages)
    ]
    out = {"model": module.name, "pp": pp, "vpp": view.parallel.vpp, "hardware": view.hardware_name, "stages": stages}
    for key, value in sorted(part.op.attrs.items()):
        if key != "stages":
            out[key] = value.name if isinstance(value, SymbolRef) else value
    json.dumps(out)  # fail here, not in the writer, if something is not JSON
    return out
