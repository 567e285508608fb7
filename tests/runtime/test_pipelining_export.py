"""The pipelining bridge's export: a compiled plan's per-rank order as torch.distributed.pipelining actions."""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import pytest
import torch

import runtime
from codegen.emit import plan_bytes
from runtime import pipelining_bridge
from runtime.layout import StageLayout
from runtime.pipelining_bridge import BridgeUnavailable, export_actions, write_csv
from tessera.api import compile

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny_qwen3_next.py"
PP, VPP, MICROBATCHES = 2, 2, 4


@pytest.fixture(scope="module")
def exported() -> tuple[dict[int, list], StageLayout]:
    module = compile(str(TINY), hardware="h100", pp=PP, vpp=VPP, ep=2, microbatches=MICROBATCHES, seq_len=16)
    data = plan_bytes(module)
    programs = [runtime.load_plan(data, rank=r) for r in range(PP)]
    layout = StageLayout.from_programs(programs)
    return export_actions(programs, layout.stage_layers), layout


def _chunks(actions: list) -> list[tuple[int, str, int]]:
    out = []
    for a in actions:
        for sub in a.sub_actions or (a,):
            out.append((sub.stage_index, sub.computation_type.value, sub.microbatch_index))
    return out


def test_every_chunk_once_and_steady_pairs_as_overlap_f_b(exported) -> None:
    actions, layout = exported
    assert sorted(actions) == list(range(PP))
    for rank, row in actions.items():
        chunks = _chunks(row)
        stages = range(rank, PP * VPP, PP)
        expected = {(s, kind, m) for s in stages for kind in ("F", "B") for m in range(MICROBATCHES)}
        assert Counter(chunks) == Counter(expected), f"rank {rank}"  # each forward and backward exactly once
        pairs = [a for a in row if a.computation_type.value == "OVERLAP_F_B"]
        assert pairs, f"rank {rank} has no steady-state pairs"
        for pair in pairs:
            fwd, bwd = pair.sub_actions
            assert (fwd.computation_type.value, bwd.computation_type.value) == ("F", "B")
            assert (fwd.stage_index, fwd.microbatch_index) != (bwd.stage_index, bwd.microbatch_index)
        # a chunk's backward never comes before its forward
        position = {c: i for i, c in enumerate(chunks)}
        assert all(position[(s, "F", m)] < position[(s, "B", m)] for s, _, m in expected)


def test_a_plain_1f1b_plan_exports_no_overlapped_pairs() -> None:
    # Without expert parallelism the plan runs plain 1F1B: each steady forward and backward is a
    # step of its own, so pipelining must not wait for both inputs of a fused OVERLAP_F_B.
    module = compile(str(TINY), hardware="h100", pp=PP, vpp=VPP, ep=1, microbatches=MICROBATCHES, seq_len=16)
    programs = [runtime.load_plan(plan_bytes(module), rank=r) for r in range(PP)]
    actions = export_actions(programs, StageLayout.from_programs(programs).stage_layers)
    for rank, row in actions.items():
        assert {a.computation_type.value for a in row} == {"F", "B"}, f"rank {rank}"
        assert len(row) == 2 * VPP * MICROBATCHES


def test_the_csv_is_what_pipelinings_loader_reads_back(exported, tmp_path: Path) -> None:
    from torch.distributed.pipelining.schedules import _Action

    actions, _ = exported
    path = tmp_path / "schedule.csv"
    write_csv(path, actions)
    with path.open(newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == PP
    for rank, row in enumerate(rows):
        parsed = [_Action.from_str(cell) for cell in row]
        assert [str(a) for a in parsed] == [str(a) for a in actions[rank]]
        assert any(cell.endswith("OVERLAP_F_B") and cell.startswith("(") for cell in row)


def test_an_older_torch_is_refused_naming_its_version(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.8.1")
    with pytest.raises(BridgeUnavailable, match=r"needs torch >= 2\.9 .*this is torch 2\.8\.1"):
        pipelining_bridge.check_pipelining_api()
