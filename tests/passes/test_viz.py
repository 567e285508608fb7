"""Drawings of pair schedules: DOT sources, Perfetto traces, and the tessera-viz command."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from passes.manager import PassManager, parse_pipeline
from passes.plan_view import PlanView
from tessera import viz
from tessera_ir.model import Module, PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig
from tessera_ir.printer import print_module

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

HAS_DOT = shutil.which("dot") is not None and shutil.which("neato") is not None


def scheduled_module() -> Module:
    module = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(ep=8))
    module.plan.append(PlanOp("pair", "pair.0", {"fwd": [SymbolRef("l0"), SymbolRef("l1")], "bwd": [SymbolRef("l3")]}))
    module.plan.append(PlanOp("pair", "pair.1", {"fwd": [SymbolRef("l2")], "bwd": [SymbolRef("l3")]}))
    PassManager(parse_pipeline("overlap-schedule")).run(module)
    return module


def test_schedule_dot_has_two_lanes_boxes_and_edges() -> None:
    sched = PlanView(scheduled_module()).schedule("pair.0")
    src = viz.schedule_dot(sched, "pair.0")
    assert src.startswith('digraph "schedule pair.0" {') and src.rstrip().endswith("}")
    assert "lane_compute" in src and "lane_comm" in src
    # one box per task, with a fixed position; one edge per dependency
    boxes = re.findall(r"^  t(\d+) \[.*pos=\"([-\d.]+),([-\d.]+)!\"", src, re.M)
    assert len(boxes) == len(sched.dag.tasks)
    edges = re.findall(r"^  t(\d+) -> t(\d+);", src, re.M)
    assert len(edges) == sum(len(t.deps) for t in sched.dag.tasks)
    # boxes sit in their stream's lane and left-to-right in start order
    ys = {float(y) for _, _, y in boxes}
    assert len(ys) == 2
    xs = {int(i): float(x) for i, x, _ in boxes}
    order = sched.stream_order(sched.dag.tasks[0].resource)
    assert [xs[i] for i in order] == sorted(xs[i] for i in order)
    # labels carry kind, layer and duration
    assert "expert_gemm.fwd\\nl0 · " in src


def test_dag_dot_has_both_sides() -> None:
    sched = PlanView(scheduled_module()).schedule("pair.0")
    src = viz.dag_dot(sched.dag, "pair.0")
    assert "cluster_fwd" in src and "cluster_bwd" in src and "nslimit" in src
    assert src.count(" -> ") == sum(len(t.deps) for t in sched.dag.tasks)


def test_trace_json_is_well_formed() -> None:
    sched = PlanView(scheduled_module()).schedule("pair.0")
    trace = json.loads(json.dumps(viz.trace_json(sched)))
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(events) == len(sched.dag.tasks)
    assert {e["tid"] for e in events} == {0, 1}
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"compute stream", "comm stream"}
    for e in events:
        assert e["ts"] >= 0 and e["dur"] >= 0
    # events on one thread never overlap
    for tid in (0, 1):
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["tid"] == tid)
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert trace["metadata"]["makespan_us"] == pytest.approx(sched.makespan)


def test_cli_writes_dot_and_json_without_graphviz(tmp_path: Path) -> None:
    plan = tmp_path / "plan.tir"
    plan.write_text(print_module(scheduled_module()))
    assert viz.main([str(plan), "--pair", "pair.1", "--format", "dot,json", "-o", str(tmp_path / "out")]) == 0
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["pair.1.dag.dot", "pair.1.schedule.dot", "pair.1.trace.json"]
    assert json.loads((out / "pair.1.trace.json").read_text())["traceEvents"]


@pytest.mark.skipif(not HAS_DOT, reason="graphviz dot/neato is not installed")
def test_cli_renders_svg_and_png_for_every_schedule(tmp_path: Path) -> None:
    plan = tmp_path / "plan.tir"
    plan.write_text(print_module(scheduled_module()))
    assert viz.main([str(plan), "--format", "svg,png", "-o", str(tmp_path)]) == 0
    svg = (tmp_path / "sched.0.schedule.svg").read_text()
    assert "<svg" in svg and "expert_gemm.fwd" in svg
    assert (tmp_path / "sched.1.dag.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.tir"
    plan.write_text(print_module(scheduled_module()))
    assert viz.main([str(plan), "--pair", "nope", "--format", "json", "-o", str(tmp_path)]) == 1
    assert "tessera-viz: error: module @synthetic has no plan op @nope" in capsys.readouterr().err
    assert viz.main([str(plan), "--format", "gif", "-o", str(tmp_path)]) == 1
    assert "unknown format(s) gif" in capsys.readouterr().err


def test_missing_graphviz_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(viz.shutil, "which", lambda name: None)
    with pytest.raises(viz.VizError, match="graphviz 'dot' was not found"):
        viz.render("digraph {}", "svg")
