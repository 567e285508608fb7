"""A training run's prediction ledger (``runtime/ledger.py``) as the planner reads it.

The runtime writes one JSON line per observation; this module keeps what
re-planning needs: the median observed duration of every task and the median
observed cost of every forward/backward pair (keyed by the layer names of its
two chunks, which is how ``PlanView`` names a pair's chunks), plus the
ledger's own error summary for the report. A ledger belongs to the hardware its
plan was costed for; folding it into a plan for another target is refused.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from runtime.ledger import read_ledger, summarize
from tessera_ir.errors import TesseraError

ChunkKey = tuple[str, ...]


class LedgerError(TesseraError):
    """A ledger that cannot be read, or that was measured for another target."""


@dataclass(frozen=True)
class LedgerObservations:
    path: str
    hardware: str
    settings: dict[str, Any]  # model, ep, tp, micro_batch_size, seq_len, dtype of the run's plan
    iterations: int
    task_us: dict[str, float]  # median observed isolated duration per task name
    pair_us: dict[tuple[ChunkKey, ChunkKey], float]  # median observed post-overlap cost per (fwd chunk, bwd chunk)
    pair_predicted_us: dict[tuple[ChunkKey, ChunkKey], float]  # what the plan predicted for those pairs
    summary: dict[str, Any]  # runtime.ledger.summarize: per kind rows / mean / p95 error, re-plan flag


@cache
def _read(path: str, mtime_ns: int) -> LedgerObservations:
    try:
        rows = read_ledger(path)
    except (OSError, ValueError) as err:
        raise LedgerError(f"cannot read the ledger: {err}") from None
    if not rows:
        raise LedgerError(f"ledger '{path}' has no rows; write one with --ledger on a training run")
    hardware = {str(r.get("hardware")) for r in rows}
    if len(hardware) != 1:
        raise LedgerError(f"ledger '{path}' mixes runs of plans for {', '.join(sorted(hardware))}")
    settings = {json.dumps(r.get("settings"), sort_keys=True) for r in rows}
    if len(settings) != 1:
        raise LedgerError(f"ledger '{path}' mixes runs of plans with different settings")
    tasks: dict[str, list[float]] = {}
    pairs: dict[tuple[ChunkKey, ChunkKey], list[float]] = {}
    predicted: dict[tuple[ChunkKey, ChunkKey], list[float]] = {}
    for r in rows:
        if r["kind"] == "task":
            tasks.setdefault(r["name"], []).append(float(r["observed_us"]))
        elif r["kind"] == "pair":
            key = (tuple(r["fwd_layers"]), tuple(r["bwd_layers"]))
            pairs.setdefault(key, []).append(float(r["observed_us"]))
            predicted.setdefault(key, []).append(float(r["predicted_us"]))
    return LedgerObservations(
        path, hardware.pop(), json.loads(settings.pop()) or {}, len({r["iteration"] for r in rows}),
        {k: statistics.median(v) for k, v in tasks.items()},
        {k: statistics.median(v) for k, v in pairs.items()},
        {k: statistics.median(v) for k, v in predicted.items()},
        summarize(rows),
    )


def read_observations(path: str, hardware: str | None, settings: dict[str, Any] | None = None) -> LedgerObservations:
    """The ledger at ``path``, checked against the module's target ``hardware`` and ``settings``
    (those of ``model, ep, tp, micro_batch_size, seq_len, dtype`` that the module has)."""
    file = Path(path)
    if not file.is_file():
        raise LedgerError(f"ledger '{path}' does not exist; write one with --ledger on a training run")
    obs = _read(str(file), file.stat().st_mtime_ns)
    if hardware is not None and obs.hardware != str(hardware):
        raise LedgerError(
            f"ledger '{path}' was measured running a plan for '{obs.hardware}', but this module targets "
            f"'{hardware}'; measure on the target, or plan with --hardware {obs.hardware}"
        )
    diffs = [f"{k}={obs.settings[k]} (this module: {v})" for k, v in (settings or {}).items()
             if k in obs.settings and str(obs.settings[k]) != str(v)]
    if diffs:
        raise LedgerError(f"ledger '{path}' was measured with other settings: {', '.join(diffs)}; its times do not apply")
    return obs


def module_settings(module: Any) -> dict[str, Any]:
    """The settings of ``module`` that a ledger's observed times depend on."""
    attrs = module.attrs
    out = {"model": attrs.get("model", module.name)}
    for name in ("ep", "tp", "micro_batch_size", "seq_len", "dtype"):
        if name in attrs:
            out[name] = attrs[name]
    return out


@dataclass(frozen=True)
class LedgerFold:
    """What a run's ledger says about the plan it was folded into: the capacity report's ledger section."""

    path: str
    hardware: str
    iterations: int
    kinds: dict[str, dict[str, float]]  # task / stage / pair / collective: rows, mean and p95 relative error
    pairs: list[tuple[str, float, float]]  # (forward chunk / backward chunk, predicted µs, observed µs), costliest first
    tasks_folded: int | None  # task durations taken from the run (measured-durations), None: not folded
    pairs_repriced: int | None  # pairs re-priced with their observed cost (measured-pairs), None: not folded
    replan: bool  # some rank's error stayed above its threshold for its window

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "hardware": self.hardware,
            "iterations": self.iterations,
            "error": {k: {"rows": int(v["rows"]), "mean": round(v["mean_abs_error"], 4), "p95": round(v["p95_abs_error"], 4)}
                      for k, v in self.kinds.items()},
            "pairs": [{"pair": name, "predicted_ms": round(pred / 1e3, 4), "observed_ms": round(obs / 1e3, 4)}
                      for name, pred, obs in self.pairs],
            "tasks_folded": self.tasks_folded,
            "pairs_repriced": self.pairs_repriced,
            "replan": self.replan,
        }

    def render(self) -> list[str]:
        lines = [f"Prediction ledger ({self.path}: {self.iterations} iterations on {self.hardware}): observed against predicted"]
        for kind, k in self.kinds.items():
            lines.append(f"  {kind:<11} {int(k['rows']):6d} rows   mean |error| {100 * k['mean_abs_error']:6.1f}%   "
                         f"p95 |error| {100 * k['p95_abs_error']:6.1f}%")
        if self.pairs:
            lines.append("  pairs the run measured (forward chunk / backward chunk): predicted -> observed ms")
            for name, pred, obs in self.pairs:
                ratio = f" ({obs / pred:.2f}x)" if pred > 0 else ""
                lines.append(f"    {name}: {pred / 1e3:.3f} -> {obs / 1e3:.3f}{ratio}")
        folded = []
        if self.tasks_folded is not None:
            folded.append(f"{self.tasks_folded} task durations taken from the run")
        if self.pairs_repriced is not None:
            folded.append(f"{self.pairs_repriced} pair(s) re-priced with their observed cost")
        if folded:
            lines.append("  folded into this plan: " + "; ".join(folded))
        lines.append("  re-planning flagged by the run: " + ("yes (the error stayed above its threshold)" if self.replan else "no"))
        return lines


def ledger_fold(module: Any, path: str) -> LedgerFold:
    """The ledger at ``path`` as the capacity report of ``module`` (a plan it was folded into) shows it."""
    obs = read_observations(path, module.attrs.get("hardware"), module_settings(module))
    pairs = sorted(obs.pair_us.items(), key=lambda kv: (-kv[1], kv[0]))
    attrs = module.attrs
    return LedgerFold(
        path, obs.hardware, obs.iterations, obs.summary["kinds"],
        [(f"{'+'.join(f)} / {'+'.join(b)}", obs.pair_predicted_us[(f, b)], us) for (f, b), us in pairs],
        int(attrs["ledger_tasks"]) if "ledger_tasks" in attrs else None,
        int(attrs["ledger_pairs"]) if "ledger_pairs" in attrs else None,
        bool(obs.summary["replan"]),
    )
