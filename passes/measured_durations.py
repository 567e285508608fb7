"""The ``measured-durations`` pass: a training run's observed task durations become the tasks' isolated durations.

Before::

    task @l0.linear_attention.fwd = linear_attention.fwd on compute {flops = 12997968, ...}

After ``measured-durations{ledger=run.jsonl}`` (the run observed 10.4 ms for it)::

    task @l0.linear_attention.fwd = linear_attention.fwd on compute {duration_us = 10412.0, flops = 12997968, ...}
    module @m {..., ledger_tasks = 112, ...}

Every pass after it (overlap-schedule, profile, partition) prices pairs from these
durations, so pairs the run never executed are priced from what it measured too: a
layer kind the roofline estimate gets wrong on this machine (a recurrence that runs
step by step, say) is corrected everywhere at once. Tasks the ledger does not name
keep their estimate. The ledger must come from a plan for the module's target.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.costs.durations import GIVEN_DURATION
from passes.costs.ledger_file import module_settings, read_observations
from passes.manager import ModulePass, PassError, option
from tessera_ir.model import Module


@dataclass(frozen=True)
class MeasuredDurationsPass(ModulePass):
    name = "measured-durations"
    summary = "Take the task durations a training run observed (its prediction ledger) as the tasks' isolated durations."

    ledger: str | None = option(None, "the run's prediction ledger (JSON lines, runtime.ledger)")

    def check(self) -> None:
        if not self.ledger:
            raise PassError("measured-durations needs ledger=PATH (the JSON lines a training run wrote with --ledger)")

    def apply(self, module: Module) -> bool:
        assert self.ledger is not None  # check() refused a missing ledger
        obs = read_observations(self.ledger, module.attrs.get("hardware"), module_settings(module))  # type: ignore[arg-type]
        applied = 0
        for layer in module.layers:
            for task in layer.tasks:
                observed = obs.task_us.get(task.name)
                if observed is not None:
                    task.attrs[GIVEN_DURATION] = round(observed, 3)
                    applied += 1
        module.attrs["ledger_tasks"] = applied
        return True
