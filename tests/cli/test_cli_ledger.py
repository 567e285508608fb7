"""A training run's prediction ledger folded into the next plan: tessera-compile --ledger.

The ledgers here are written row by row in the runtime's format (``runtime.ledger``) for the
tiny model's own tasks and pairs, so what the plan must take from them is known exactly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from passes.costs.ledger_file import module_settings
from passes.plan_view import PlanView
from runtime.ledger import FORMAT, PredictionLedger
from tessera.api import DEFAULT_PIPELINE, compile
from tessera.cli import compile_main
from tessera_ir.model import Module

TINY = str(Path(__file__).parents[2] / "examples" / "tiny_qwen3_next.py")
PLANNING = ",".join(p for p in DEFAULT_PIPELINE.split(",") if p != "pipeline")  # the plan without per-rank programs


@pytest.fixture(scope="module")
def planned() -> Module:
    return compile(TINY, pipeline=PLANNING)


def _ledger_rows(module: Module, *, hardware: str | None = None, scale: float = 2.0, replan: bool = True,
                 **settings: Any) -> tuple[list[dict[str, Any]], dict[str, float], tuple[Any, Any]]:
    """Rows of a two-iteration run that observed every task ``scale`` times its estimate and the first pair at 3 ms."""
    view = PlanView(module)
    base: dict[str, Any] = {"format": FORMAT, "hardware": hardware or module.attrs["hardware"], "rank": 0,
            "settings": {**module_settings(module), **settings}}
    tasks = {t.name: float(view.duration(t)) for layer in module.layers for t in layer.tasks}
    pair = view.pairs[0]
    rows: list[dict[str, Any]] = []
    for iteration in range(2):
        for name, predicted in tasks.items():
            rows.append({**base, "kind": "task", "iteration": iteration, "name": name, "predicted_us": predicted,
                         "observed_us": scale * predicted, "error": abs(scale - 1.0)})
        predicted_pair = pair.post_overlap_us
        assert predicted_pair is not None
        rows.append({**base, "kind": "pair", "iteration": iteration, "name": "pair fwd 0 / bwd 1",
                     "fwd_layers": list(pair.chunks[0]), "bwd_layers": list(pair.chunks[1]),
                     "predicted_us": predicted_pair, "observed_us": 3000.0, "error": abs(3000.0 / predicted_pair - 1)})
        rows.append({**base, "kind": "summary", "iteration": iteration, "rows": len(tasks) + 1, "replan": replan})
    return rows, {name: scale * us for name, us in tasks.items()}, pair.chunks


def _write(tmp_path: Path, rows: list[dict[str, Any]], name: str = "run.jsonl") -> Path:
    path = tmp_path / name
    PredictionLedger.write(path, rows)
    return path


def test_the_ledgers_durations_and_pairs_replace_the_estimates(planned: Module, tmp_path: Path) -> None:
    rows, observed, chunks = _ledger_rows(planned)
    ledger = _write(tmp_path, rows)
    module = compile(TINY, pipeline=PLANNING, ledger=str(ledger))
    tasks = {t.name: t for layer in module.layers for t in layer.tasks}
    assert {name: tasks[name].attrs["duration_us"] for name in observed} == pytest.approx(observed, abs=1e-3)
    assert module.attrs["ledger_tasks"] == len(observed)
    repriced = [p for p in PlanView(module).pairs if p.op.attrs.get("cost_source") == "ledger"]
    assert module.attrs["ledger_pairs"] == len(repriced) >= 1
    assert all(p.chunks == chunks and p.op.attrs["post_overlap_us"] == 3000.0 for p in repriced)
    assert module.attrs["ledger_replan"] is True
    # every other pair is priced from the measured durations: twice the tasks, never cheaper than before
    before = {p.name: p.post_overlap_us for p in PlanView(planned).pairs}
    after = {p.name: p.post_overlap_us for p in PlanView(module).pairs if p not in repriced}
    assert after and all(after[name] > before[name] for name in after if name in before)  # type: ignore[operator]


@pytest.mark.slow
def test_the_capacity_report_shows_the_ledger(planned: Module, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows, observed, chunks = _ledger_rows(planned, replan=False)
    ledger = _write(tmp_path, rows)
    report = tmp_path / "report.json"
    code = compile_main([TINY, "--passes", PLANNING, "--ledger", str(ledger), "--iterations", "2",
                         "--report-json", str(report), "-o", str(tmp_path / "plan.tir")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Prediction ledger" in out and "re-planning flagged by the run: no" in out
    section = json.loads(report.read_text())["ledger"]
    assert section["tasks_folded"] == len(observed) and section["pairs_repriced"] >= 1
    assert section["error"]["task"] == {"rows": 2 * len(observed), "mean": 1.0, "p95": 1.0}
    assert section["pairs"][0]["pair"] == f"{'+'.join(chunks[0])} / {'+'.join(chunks[1])}"
    assert section["pairs"][0]["observed_ms"] == 3.0 and section["replan"] is False


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hardware": "h200"}, "was measured running a plan for 'h200', but this module targets 'h100'"),
        ({"seq_len": 7}, "was measured with other settings: seq_len=7"),
    ],
)
def test_a_ledger_of_another_target_or_settings_is_refused(planned: Module, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str], change: dict[str, Any],
                                                           message: str) -> None:
    rows, *_ = _ledger_rows(planned, **change)
    ledger, out_ir = _write(tmp_path, rows), tmp_path / "plan.tir"
    code = compile_main([TINY, "--passes", PLANNING, "--ledger", str(ledger), "-o", str(out_ir)])
    _, err = capsys.readouterr()
    assert code == 1 and message in err and err.strip().count("\n") == 0
    assert not out_ir.exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "does not exist; write one with --ledger on a training run"),
        ("", "has no rows"),
        ("{not json\n", ":1: not JSON"),
        ('{"format": "something-else", "kind": "task"}\n', ":1: not a row of a Tessera ledger"),
    ],
)
def test_an_unreadable_ledger_fails_before_the_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       content: str | None, message: str) -> None:
    ledger, out_ir = tmp_path / "run.jsonl", tmp_path / "plan.tir"
    if content is not None:
        ledger.write_text(content)
    code = compile_main(["no/such/model.py", "--ledger", str(ledger), "-o", str(out_ir)])
    _, err = capsys.readouterr()
    assert code == 1 and message in err and err.strip().count("\n") == 0
    assert not out_ir.exists()
