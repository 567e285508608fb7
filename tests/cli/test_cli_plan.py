"""`tessera-compile -o plan.tsb`: the per-rank programs as bytecode that every interpreter runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import runtime
from codegen.disassembler import assemble, disassemble
from codegen.emit import plan_bytes
from codegen.signature import cost_source, plan_signature
from runtime.bytecode import decode
from tessera.api import load_ir
from tessera.cli import compile_main, opt_main
from tessera_ir import print_module
from tessera_ir.model import Module

from cluster_run import run_cluster
from compiled_plans import compiled_plan, planned_module

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_qwen3_next.py")


@pytest.mark.slow
def test_compile_writes_a_plan_every_rank_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tsb, tir = tmp_path / "plan.tsb", tmp_path / "plan.tir"
    assert compile_main([TINY, "-o", str(tsb)]) == 0
    assert compile_main([TINY, "-o", str(tir)]) == 0
    capsys.readouterr()
    data = tsb.read_bytes()
    module = load_ir(tir)
    # The bytes are a function of the planned module: codegen on the IR text gives the same file.
    assert plan_bytes(module) == data
    signature = plan_signature(module)
    image = decode(data, signature=signature)
    assert sorted(image.programs) == list(range(image.plan.pp)) and image.plan.model == "tiny_qwen3_next"
    for rank in range(image.plan.pp):
        program = runtime.load_plan(tsb, rank=rank, signature=signature)
        assert len(program) == len(image.programs[rank])
    # tessera-dis on a real plan: bytes -> text -> bytes -> text, identical.
    text = disassemble(data)
    assert assemble(text) == data and disassemble(assemble(text)) == text
    for seed in range(2):
        run_cluster(data, module, seed)


def test_a_compile_that_fails_writes_no_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tsb = tmp_path / "plan.tsb"
    assert compile_main([TINY, "--passes", "candidates", "-o", str(tsb)]) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err
    assert "holds no per-rank programs; run the pipeline pass" in lines[0]
    assert not tsb.exists() and not list(tmp_path.iterdir())


def test_opt_writes_the_bytecode_of_a_planned_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    planned = planned_module(2, 2, 4, dbo=True)
    del planned.plan[next(k for k, op in enumerate(planned.plan) if op.op == "pipeline"):]  # drop pipeline and programs
    tir, tsb = tmp_path / "planned.tir", tmp_path / "plan.tsb"
    tir.write_text(print_module(planned))
    assert opt_main([str(tir), "--passes", "pipeline", "-o", str(tsb)]) == 0
    assert capsys.readouterr().err == ""
    assert tsb.read_bytes() == compiled_plan(2, 2, 4, dbo=True)


def test_the_cost_source_is_the_hardware_the_profile_priced_on() -> None:
    module = Module("m", attrs={"hardware": "h100", "profile_mode": "measured", "profile_hardware": "cpu"})
    assert cost_source(module) == ("measured", "cpu")
    before = plan_signature(module)
    module.attrs["profile_hardware"] = "h100"
    assert cost_source(module) == ("measured", "h100") and plan_signature(module) != before
    assert cost_source(Module("m", attrs={"hardware": "h200"})) == ("none", "h200")
