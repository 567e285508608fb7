"""The text form of the bytecode: round trips both ways, and tessera-dis on good and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from codegen.disassembler import assemble, disassemble
from runtime import PlanError
from runtime.bytecode import reseal
from tessera.cli import dis_main

from program_gen import generate_bytes


@pytest.mark.parametrize("seed", range(16))
def test_bytes_text_bytes_and_text_bytes_text_are_identical(seed: int) -> None:
    data = generate_bytes(seed)
    text = disassemble(data)
    assert assemble(text) == data
    assert disassemble(assemble(text)) == text


def test_comments_and_blank_lines_are_ignored_and_names_with_slashes_survive() -> None:
    text = disassemble(generate_bytes(3))
    noisy = "// a plan\n\n" + text.replace("\n", "  // note\n", 3)
    assert assemble(noisy) == generate_bytes(3)
    renamed = text.replace('model="generated3"', 'model="a//b \\"quoted\\""')
    assert 'model="a//b \\"quoted\\""' in disassemble(assemble(renamed))


def test_text_that_is_not_a_plan_is_refused_naming_the_line() -> None:
    text = disassemble(generate_bytes(2))
    with pytest.raises(PlanError, match="line 1: expected 'tsb version N signature HEX'"):
        assemble("hello\n" + text)
    bad_op = text.replace(" run ", " jump ", 1)
    with pytest.raises(PlanError, match=r"line \d+: unknown instruction 'jump'"):
        assemble(bad_op)
    # Text that parses but breaks a loader rule is refused by the same checks as a .tsb.
    lines = text.splitlines()
    end = next(i for i, line in enumerate(lines) if line.strip().endswith(" end"))
    lines[end] = lines[end].replace(" end", " run 0 mb=0")
    with pytest.raises(PlanError, match="END must be the last instruction"):
        assemble("\n".join(lines))


def test_tessera_dis_round_trips_through_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.tsb"
    plan.write_bytes(generate_bytes(5))
    assert dis_main([str(plan), "-o", str(tmp_path / "plan.txt")]) == 0
    assert dis_main([str(tmp_path / "plan.txt"), "--assemble", "-o", str(tmp_path / "again.tsb")]) == 0
    assert (tmp_path / "again.tsb").read_bytes() == plan.read_bytes()
    assert dis_main([str(plan)]) == 0
    assert capsys.readouterr().out == (tmp_path / "plan.txt").read_text()


def test_tessera_dis_refuses_a_corrupt_plan_in_one_line_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = bytearray(generate_bytes(5))
    data[8] = 9  # format version 9
    plan = tmp_path / "plan.tsb"
    plan.write_bytes(reseal(data))
    assert dis_main([str(plan), "-o", str(tmp_path / "out.txt")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "format version 9 is not known" in err and "Traceback" not in err
    assert not (tmp_path / "out.txt").exists()
