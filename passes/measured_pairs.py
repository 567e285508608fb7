"""The ``measured-pairs`` pass: re-price the pairs a training run measured with what it observed.

Runs after ``profile`` and before ``partition``. A pair whose two chunks (forward
and backward layer lists) a run's ledger observed gets the observed time as its
post-overlap cost; the cost it had becomes ``predicted_us``::

    plan pair @pair.3 {..., cost_source = "ledger", post_overlap_us = 41230.5, predicted_us = 11254.2}
    module @m {..., ledger_pairs = 4, ledger_pair_error_mean = 2.66, ledger_pair_error_p95 = 3.1, ...}

The module also records the ledger's mean and p95 relative error of pairs, and
whether the run flagged re-planning (``ledger_replan``). The ledger must come from
a plan for the module's target.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.costs.ledger_file import module_settings, read_observations
from passes.manager import ModulePass, PassError, option
from passes.plan_view import PlanView
from tessera_ir.model import Module


@dataclass(frozen=True)
class MeasuredPairsPass(ModulePass):
    name = "measured-pairs"
    summary = "Re-price the forward/backward pairs a training run measured (its prediction ledger) with their observed cost."
    requires = ("pair",)

    ledger: str | None = option(None, "the run's prediction ledger (JSON lines, runtime.ledger)")

    def check(self) -> None:
        if not self.ledger:
            raise PassError("measured-pairs needs ledger=PATH (the JSON lines a training run wrote with --ledger)")

    def apply(self, module: Module) -> bool:
        assert self.ledger is not None  # check() refused a missing ledger
        obs = read_observations(self.ledger, module.attrs.get("hardware"), module_settings(module))  # type: ignore[arg-type]
        repriced = 0
        for pair in PlanView(module).pairs:
            observed = obs.pair_us.get(pair.chunks)
            if observed is None:
                continue
            attrs = pair.op.attrs
            if "post_overlap_us" in attrs:
                attrs["predicted_us"] = attrs["post_overlap_us"]
            attrs["post_overlap_us"] = round(observed, 3)
            attrs["cost_source"] = "ledger"
            repriced += 1
        pairs = obs.summary["kinds"].get("pair", {})
        module.attrs["ledger_pairs"] = repriced
        module.attrs["ledger_pair_error_mean"] = round(float(pairs.get("mean_abs_error", 0.0)), 4)
        module.attrs["ledger_pair_error_p95"] = round(float(pairs.get("p95_abs_error", 0.0)), 4)
        module.attrs["ledger_replan"] = bool(obs.summary["replan"])
        return True
