"""The capacity report: summaries over iterations, JSON and text."""

from __future__ import annotations

import json

import pytest

from passes.simulation.capacity import CapacityReport, run_iterations, summarize
from passes.simulation.engine import DboSettings
from passes.simulation.routing import RoutingModel, RoutingSpec

from sim_builders import moe_input


def _report() -> CapacityReport:
    inp = moe_input(4, 2, 8)
    routing = RoutingModel(RoutingSpec("zipf", zipf_s=0.6, seed=2), num_experts=16, top_k=2, ep=4, tokens_per_rank=512,
                           moe_layers=list(range(inp.decoder_layers)), decoder_layers=inp.decoder_layers, microbatches=8)
    static = summarize("static", run_iterations(inp, routing, 3))
    dynamic = summarize("dbo", run_iterations(inp, routing, 3, DboSettings(4000)))
    mean = float(sum(routing.imbalance(i).mean() for i in range(3)) / 3)
    return CapacityReport("moe", "test-hw", routing.spec.describe(), mean, static, dynamic)


def test_summary_figures_are_consistent() -> None:
    report = _report()
    s = report.static
    assert s.iterations == 3
    assert s.iteration_min_us <= s.iteration_us <= s.iteration_max_us
    assert len(s.stage_us) == 4 and len(s.peak_bytes) == 4
    assert s.stage_imbalance >= 1.0
    assert s.idle_us == pytest.approx(s.pipeline_wait_us + s.in_step_idle_us)
    assert all(0.0 <= v <= 1.0 for v in s.exposed.values())
    assert s.dbo is None and report.dynamic is not None and report.dynamic.dbo is not None
    assert report.dynamic.dbo.offered > 0
    assert report.memory_added_bytes >= 0


def test_json_is_deterministic_and_complete() -> None:
    a, b = _report().to_json(), _report().to_json()
    assert a == b
    doc = json.loads(a)
    assert set(doc) >= {"static", "dbo", "dbo_iteration_reduction", "dbo_memory_added_gib", "mean_load_imbalance"}
    assert set(doc["static"]["exposed_fraction"]) == {"dispatch", "combine", "p2p", "grad_reduce"}
    assert "placed" in doc["dbo"]["dbo"]


def test_text_names_every_quantity() -> None:
    text = _report().render()
    for needle in ("iteration time", "tokens/s", "MFU", "between steps", "inside steps", "exposed dispatch",
                   "exposed pipeline send/recv", "exposed gradient reduction", "stage imbalance", "rank  3", "DBO:",
                   "idle recovered", "memory added"):
        assert needle in text, needle


def test_summarize_refuses_nothing() -> None:
    with pytest.raises(ValueError):
        summarize("x", [])


def _plan_report(monkeypatch: pytest.MonkeyPatch, forked: bool) -> str:
    from passes.plan_view import PlanView
    from passes.simulation import capacity

    from planned_modules import planned

    monkeypatch.setattr(capacity, "_FORK_ABOVE_TASK_STEPS", 0 if forked else 10**12)
    forks = []
    real_beside = capacity.beside

    def counted(work):
        forks.append(work)
        return real_beside(work)

    monkeypatch.setattr(capacity, "beside", counted)
    result = capacity.plan_capacity(PlanView(planned(dbo=True)), RoutingSpec("zipf", zipf_s=0.8, seed=3), iterations=3,
                                    second_process=True)
    assert len(forks) == (1 if forked and capacity._other_core() else 0)
    return result.report.to_json() + result.report.render()


def test_the_static_run_in_a_second_process_reports_the_same_numbers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _plan_report(monkeypatch, forked=True) == _plan_report(monkeypatch, forked=False)


def test_the_dbo_gain_is_reported_beside_its_bound_and_over_fixed_template_pairs() -> None:
    from passes.plan_view import PlanView
    from passes.simulation import capacity

    from planned_modules import planned

    result = capacity.plan_capacity(PlanView(planned(dbo=True)), RoutingSpec("zipf", zipf_s=0.8, seed=3), iterations=2)
    report = result.report
    a = report.attribution
    assert a is not None and report.dynamic is not None
    # Free weight gradients bound any placement of them, on either pairing.
    assert a.bound.iteration_us < report.static.iteration_us
    assert a.fixed_bound.iteration_us < a.fixed.iteration_us
    # The fixed-template pairs are the same partition's layers, scheduled the other way.
    assert a.fixed.iteration_us != report.static.iteration_us
    assert a.fixed_dbo.dbo is not None and a.fixed_dbo.dbo.offered > 0
    figures = report.as_dict()["dbo_attribution"]
    assert figures["gap_fit"]["bound_reduction"] == pytest.approx(1 - a.bound.iteration_us / report.static.iteration_us, rel=1e-5)
    assert set(figures["fixed_template"]) == {"iteration_ms", "dbo_reduction", "bound_reduction"}
    text = report.render()
    assert "DBO attributed" in text and "fixed-template pairs" in text and "of the bound" in text
    without = capacity.plan_capacity(PlanView(planned(dbo=True)), RoutingSpec("zipf", zipf_s=0.8, seed=3), iterations=2,
                                     attribution=False).report
    assert without.attribution is None and "DBO attributed" not in without.render()
