"""Stage layout and rank grid from a plan; the prediction ledger on hand-written programs."""

from __future__ import annotations

import hashlib
import json

import pytest

import runtime
from runtime.bytecode import Collective, Group, Instr, Op, PlanImage, PlanInfo, Stream, TaskInfo, encode
from runtime.errors import PlanError
from runtime.executor import ActionRecord, IterationResult
from runtime.layout import RankGrid, StageLayout
from runtime.ledger import PredictionLedger, program_pairs, program_units, read_ledger, static_timeline, summarize

C, M = Stream.COMPUTE, Stream.COMM
LAYERS = ["embed", "l0", "l1", "l2", "head"]


def tasks() -> list[TaskInfo]:
    out = []
    for layer in LAYERS:
        op = {"embed": "embedding", "head": "lm_head"}.get(layer, "attention")
        for phase in ("fwd", "dgrad"):
            out.append(TaskInfo(f"{layer}.{op}.{phase}", f"{op}.{phase}", layer, C, False, 10.0, 0))
    out.append(TaskInfo("l1.dispatch.fwd", "dispatch.fwd", "l1", M, False, 30.0, 0))
    return out


TASKS = tasks()
INDEX = {t.name: i for i, t in enumerate(TASKS)}


def run(name: str, mb: int = 0) -> Instr:
    return Instr(Op.RUN, C, mb=mb, a=INDEX[name])


def plan_bytes(programs: dict[int, list[Instr]], pp: int = 2, vpp: int = 1) -> bytes:
    info = PlanInfo(pp, vpp, 1, 1, 1, 1, 16, "fp32", "hand", "analytic", "cpu", 0)
    return encode(PlanImage(hashlib.sha256(b"hand").digest(), info, TASKS, None, programs))


def two_stage_programs() -> dict[int, list[Instr]]:
    # rank 0: embed, l0, l1 (forward then backward); rank 1: l2, head
    r0 = [run("embed.embedding.fwd"), run("l0.attention.fwd"), run("l1.attention.fwd"),
          Instr(Op.COLLECTIVE, M, Collective.ALL_TO_ALL, 0, INDEX["l1.dispatch.fwd"], Group.EP),
          Instr(Op.WAIT, C, a=3), run("l1.attention.dgrad"), run("l0.attention.dgrad"), Instr(Op.END)]
    r1 = [run("l2.attention.fwd"), run("head.lm_head.fwd"), run("head.lm_head.dgrad"), run("l2.attention.dgrad"), Instr(Op.END)]
    return {0: r0, 1: r1}


def load_all(data: bytes, pp: int) -> list:
    return [runtime.load_plan(data, rank=r) for r in range(pp)]


def test_stage_layout_from_the_programs_of_every_rank():
    layout = StageLayout.from_programs(load_all(plan_bytes(two_stage_programs()), 2))
    assert layout.stage_layers == (("embed", "l0", "l1"), ("l2", "head"))
    assert layout.stage_of("l2") == 1 and layout.previous("l2") == "l1" and layout.next("l2") == "head"
    assert layout.stages_of_rank(1) == [1]


def test_a_layer_that_runs_on_two_ranks_is_refused():
    programs = two_stage_programs()
    programs[1].insert(0, run("l1.attention.fwd"))
    with pytest.raises(PlanError, match="layer 'l1' runs forward on ranks 0 and 1"):
        StageLayout.from_programs(load_all(plan_bytes(programs), 2))


def test_stages_must_match_the_plans_virtual_stages():
    with pytest.raises(PlanError, match="2 contiguous groups, but the plan has 4 virtual stages"):
        StageLayout.from_programs(load_all(plan_bytes(two_stage_programs(), pp=2, vpp=2), 2))


def test_rank_grid_layout():
    grid = RankGrid.for_world(8, pp=2, ep=2)
    assert grid.dp == 2
    assert [grid.coords(r) for r in range(4)] == [(0, 0, 0), (0, 1, 0), (1, 0, 0), (1, 1, 0)]
    assert all(grid.rank(*grid.coords(r)) == r for r in range(8))
    assert grid.ep_group(1, 1) == [6, 7]
    assert grid.dense_group(0) == [0, 1, 4, 5]
    assert grid.expert_group(1, 0) == [2, 6]
    assert grid.pp_group(1, 0) == [1, 3]
    assert [grid.shard(r) for r in (0, 1, 4, 5)] == [0, 1, 2, 3]
    with pytest.raises(PlanError, match="needs pp 2 x ep 2 = 4 ranks per data-parallel replica, but the job has 6"):
        RankGrid.for_world(6, pp=2, ep=2)


def test_static_timeline_and_chunks():
    program = runtime.load_plan(plan_bytes(two_stage_programs()), rank=0)
    span = static_timeline(program)
    assert span[0] == (0.0, 10.0) and span[2] == (20.0, 30.0)
    assert span[3] == (30.0, 60.0)  # the All-to-All starts when issued, after the compute before it
    assert span[5] == (60.0, 70.0)  # the compute stream waited for it
    stage_of = {"embed": 0, "l0": 0, "l1": 0, "l2": 1, "head": 1}
    units = program_units(program, stage_of)
    assert [(u.direction, u.stage, u.mb, u.instrs) for u in units] == [("fwd", 0, 0, [0, 1, 2]), ("bwd", 0, 0, [5, 6])]
    assert [(f.direction, b.direction) for f, b in program_pairs(units)] == [("fwd", "bwd")]


def result_with(records: list[ActionRecord]) -> IterationResult:
    return IterationResult([], [], {}, records, 0, 0, 0, 0)


def test_ledger_rows_errors_and_replanning(tmp_path):
    program = runtime.load_plan(plan_bytes(two_stage_programs()), rank=0)
    ledger = PredictionLedger(program, [["embed", "l0", "l1"], ["l2", "head"]], 0, threshold=0.5, window=2)
    us = 1000  # ns per µs

    span = static_timeline(program)

    def records(scale: float) -> list[ActionRecord]:
        """Everything observed as the plan predicts it, ``scale`` times slower."""
        out = [ActionRecord("run", i, program.instructions[i].a, 0, 0, int(span[i][0] * us * scale), int(span[i][1] * us * scale))
               for i in (0, 1, 2, 5, 6)]
        a2a = span[3]
        out.append(ActionRecord("all_to_all", 3, INDEX["l1.dispatch.fwd"], 0, 0, int(a2a[0] * us * scale),
                                int(a2a[1] * us * scale), int(5 * us)))
        return out

    first = ledger.record(0, result_with(records(1.0)))
    assert first.mean_abs_error == pytest.approx(0.0, abs=1e-9) and not first.replan
    kinds = {row["kind"] for row in ledger.rows}
    assert kinds == {"task", "collective", "stage", "pair", "summary"}
    pair = next(row for row in ledger.rows if row["kind"] == "pair")
    assert pair["fwd_layers"] == ["embed", "l0", "l1"] and pair["predicted_us"] == pytest.approx(80.0)
    assert ledger.record(1, result_with(records(3.0))).replan is False  # above the threshold once
    assert ledger.record(2, result_with(records(3.0))).replan is True  # ... and again: the profile is stale
    path = tmp_path / "run.jsonl"
    PredictionLedger.write(path, ledger.rows)
    rows = read_ledger(path)
    assert rows == json.loads(json.dumps(ledger.rows))
    summary = summarize(rows)
    assert summary["replan"] is True and summary["kinds"]["collective"]["rows"] == 3


def test_ledger_records_what_the_backward_split_cost(tmp_path):
    program = runtime.load_plan(plan_bytes(two_stage_programs()), rank=0)
    ledger = PredictionLedger(program, [["embed", "l0", "l1"], ["l2", "head"]], 0)
    cpu = {"fwd": 3_000_000, "dgrad": 4_000_000, "wgrad": 1_500_000, "other": 500_000, "total": 9_000_000}
    counters = {"split_dedicated_ops": 40, "split_general_ops": 2, "wgrad_run": 5}
    ledger.record(0, IterationResult([], [], counters, [], 0, 0, 0, 0, cpu))
    (row,) = [r for r in ledger.rows if r["kind"] == "split"]
    assert row["cpu_us"] == {"fwd": 3000.0, "dgrad": 4000.0, "wgrad": 1500.0, "other": 500.0, "total": 9000.0}
    assert (row["dedicated_ops"], row["general_ops"], row["wgrad_tasks"]) == (40, 2, 5)
    assert row["iteration"] == 0 and row["rank"] == 0 and row["hardware"] == str(program.plan.hardware)
    path = tmp_path / "run.jsonl"
    PredictionLedger.write(path, ledger.rows)
    rows = read_ledger(path)
    assert [r for r in rows if r["kind"] == "split"] == [row]
    assert "split" not in summarize(rows)["kinds"]  # no prediction, so no error to summarise


def test_read_ledger_names_the_bad_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"format": "tessera-ledger/1", "kind": "summary"}\nnot json\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not JSON"):
        read_ledger(path)
    path.write_text('{"kind": "pair"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: not a row of a Tessera ledger"):
        read_ledger(path)
