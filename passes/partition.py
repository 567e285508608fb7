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
from dataclasses import dataclass
from typing import Literal

from passes.manager import ModulePass, PassError, note_time, option
from passes.partitioning.plan import PartitionSettings, choose_partition
from passes.partitioning.stages import check_decoder_order
from passes.plan_view import PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, SymbolRef
from tessera_ir.run_settings import RunSettings


@dataclass(frozen=True)
class PartitionPass(ModulePass):
    name = "partition"
    summary = "Pick one candidate per virtual stage minimising the worst post-overlap pair cost (MILP)."
    requires = ("candidate",)
    produces = ("partition",)

    search: Literal["window", "global"] = option("window", "window: the candidates marked in_window; global: all of them")
    solver: Literal["cbc", "highs"] = option("cbc", "the MILP solver")
    time_limit: float = option(60.0, "seconds per MILP solve")

    def check(self) -> None:
        if self.time_limit <= 0:
            raise PassError(f"partition: time-limit must be positive, got {self.time_limit}")

    def settings(self, run: RunSettings) -> PartitionSettings:
        """The search settings, with the memory reservations the module header sets (``run``)."""
        return PartitionSettings(self.search, self.solver, self.time_limit, run.wgrad_headroom, run.reserved_gib)

    def apply(self, module: Module) -> bool:
        if module.plan_ops("partition"):
            raise PassError("partition: the module already holds a partition op")
        check_decoder_order(module)
        view = PlanView(module)
        run = RunSettings.from_attrs(module.attrs)  # memory capacity and reservations: run-wide, in the header
        capacity = run.memory_gib if run.memory_gib is not None else view.hardware.memory_gib
        try:
            op = choose_partition(
                module, view.parallel, view.candidate_table(), view.duration, capacity, self.settings(run), note_time
            )
        except TesseraError as err:
            raise PassError(f"partition: {err}") from None
        module.plan.append(op)
        return True


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
