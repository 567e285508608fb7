"""No tool overwrites what it reads, nor one of its outputs with another: an output path that
names an input (however spelled: ``./m.py``, a symbolic link, a hard link) or another output
is refused before any work, with one line and exit status 1, and every file is left as it was.

The refusal comes before any capture or parsing, so the tools run in this process."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from tessera.cli import compile_main, dis_main, opt_main, viz_main

from .test_cli_errors import TINY, assert_one_clean_error
from .test_cli_failures import PLAN, listing

Main = Callable[[Sequence[str] | None], int]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "m.py").write_bytes(Path(TINY).read_bytes())
    (tmp_path / "plan.tir").write_bytes(PLAN.read_bytes())
    (tmp_path / "plan.tsb").write_bytes(b"TSB\x00 not parsed: the refusal comes first")
    (tmp_path / "ledger.jsonl").write_text("{}\n")
    (tmp_path / "hw.json").write_text("{}\n")
    (tmp_path / "routing.json").write_text("{}\n")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text('{"model_type": "qwen3_moe"}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def refused(capsys: pytest.CaptureFixture[str], work: Path, main: Main, argv: list[str], *fragments: str) -> str:
    before = listing(work)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert_one_clean_error(err, *fragments)
    assert listing(work) == before, "a refused run must leave every file as it was"
    return err


# --- tessera-compile: every output flag against the model source -----------------------------------

OUTPUT_FLAGS = [
    ["-o"], ["--emit", "tsb", "-o"], ["--emit", "ir", "-o"], ["--summary-json"], ["--partition-json"],
    ["--report-json"], ["--trace"], ["--timeline"], ["--report", "--dump-after", "all", "--dump-dir"],
]


@pytest.mark.parametrize("flag", OUTPUT_FLAGS, ids=lambda f: " ".join(f))
@pytest.mark.parametrize("spelling", ["m.py", "./m.py", "{work}/m.py", "sub/../m.py"])
def test_compile_never_writes_its_model_source(
    capsys: pytest.CaptureFixture[str], work: Path, flag: list[str], spelling: str
) -> None:
    (work / "sub").mkdir()
    target = spelling.format(work=work)
    refused(capsys, work, compile_main, ["m.py", *flag, target], f"{flag[-1]} {target}", "model source",
            "destroy the input")


def test_compile_refuses_a_symbolic_link_to_its_source(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    (work / "link.tir").symlink_to(work / "m.py")
    refused(capsys, work, compile_main, ["m.py", "-o", "link.tir"], "-o link.tir", "model source (m.py)")


def test_compile_refuses_a_hard_link_to_its_source(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    os.link(work / "m.py", work / "same.tir")
    refused(capsys, work, compile_main, ["m.py", "--summary-json", "same.tir"], "--summary-json same.tir", "model source")


def test_compile_refuses_a_dangling_link_to_its_source_through_a_linked_folder(
    capsys: pytest.CaptureFixture[str], work: Path
) -> None:
    (work / "alias").symlink_to(work, target_is_directory=True)
    refused(capsys, work, compile_main, ["alias/m.py", "-o", "m.py"], "-o m.py", "model source (alias/m.py)")


def test_compile_never_writes_the_config_of_a_config_folder(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    refused(capsys, work, compile_main, ["cfg", "-o", "cfg/config.json"], "-o cfg/config.json", "model config")


@pytest.mark.parametrize("flag,path,role", [
    ("--ledger", "ledger.jsonl", "--ledger"),
    ("--hardware", "hw.json", "--hardware file"),
    ("--routing-trace", "routing.json", "--routing-trace"),
])
def test_compile_never_writes_its_other_inputs(
    capsys: pytest.CaptureFixture[str], work: Path, flag: str, path: str, role: str
) -> None:
    refused(capsys, work, compile_main, ["hf:qwen3_moe", flag, path, "--report-json", f"./{path}"],
            f"--report-json ./{path}", f"that is the {role}")


def test_compile_refuses_two_outputs_through_a_link(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    (work / "b.json").symlink_to(work / "a.json")  # dangling: a.json is yet to be written
    refused(capsys, work, compile_main, ["m.py", "--summary-json", "a.json", "--partition-json", "b.json"],
            "--partition-json b.json", "--summary-json goes to the same file (a.json)")


def test_compile_refuses_an_output_inside_the_dump_folder_named_as_another(
    capsys: pytest.CaptureFixture[str], work: Path
) -> None:
    (work / "dumps").mkdir()
    refused(capsys, work, compile_main, ["m.py", "-o", "dumps", "--dump-after", "all", "--dump-dir", "./dumps"],
            "--dump-dir ./dumps", "-o goes to the same file")


# --- tessera-opt, tessera-dis, tessera-viz -----------------------------------------------------------


@pytest.mark.parametrize("argv", [
    ["plan.tir", "-o", "plan.tir"],
    ["plan.tir", "-o", "./plan.tir"],
    ["plan.tir", "--passes", "pipeline", "-o", "plan.tir"],
    ["plan.tir", "--split-input-file", "-o", "plan.tir"],
    ["plan.tir", "--hardware", "hw.json", "-o", "hw.json"],
    ["plan.tir", "--dump-after", "all", "--dump-dir", "plan.tir"],
], ids=lambda a: " ".join(a))
def test_opt_never_writes_its_input(capsys: pytest.CaptureFixture[str], work: Path, argv: list[str]) -> None:
    refused(capsys, work, opt_main, argv, "that is the", "destroy the input")


def test_opt_never_dumps_over_its_input(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    # The first dump after `verify` is dumps/01-verify.tir: the input itself.
    (work / "dumps").mkdir()
    (work / "dumps" / "01-verify.tir").write_bytes(PLAN.read_bytes())
    refused(capsys, work, opt_main, ["dumps/01-verify.tir", "--passes", "verify", "--dump-after", "all",
                                     "--dump-dir", "dumps", "-o", "out.tir"], "dumps/01-verify.tir", "destroy the input")


@pytest.mark.parametrize("argv", [
    ["plan.tsb", "-o", "plan.tsb"],
    ["./plan.tsb", "-o", "plan.tsb"],
    ["plan.tir", "--assemble", "-o", "plan.tir"],
], ids=lambda a: " ".join(a))
def test_dis_never_writes_its_input(capsys: pytest.CaptureFixture[str], work: Path, argv: list[str]) -> None:
    refused(capsys, work, dis_main, argv, "-o plan.t", "that is the input", "destroy the input")


def test_viz_never_writes_its_plan(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    refused(capsys, work, viz_main, ["plan.tir", "-o", "./plan.tir"], "-o ./plan.tir", "that is the plan")


def test_viz_never_draws_over_its_plan(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    # The plan lies in the output folder under the name of the trace viz writes for its pair.
    (work / "drawings").mkdir()
    (work / "drawings" / "sched.0.trace.json").write_bytes(PLAN.read_bytes())
    refused(capsys, work, viz_main, ["drawings/sched.0.trace.json", "--format", "json", "-o", "drawings"],
            "sched.0.trace.json", "that is the plan", "destroy the input")


def test_distinct_outputs_still_work(capsys: pytest.CaptureFixture[str], work: Path) -> None:
    assert opt_main(["plan.tir", "--passes", "verify", "-o", "out.tir"]) == 0
    assert (work / "out.tir").read_bytes() == PLAN.read_bytes()
    assert "destroy" not in capsys.readouterr().err


def test_standard_streams_and_missing_paths_take_no_part() -> None:
    from tessera.io import check_outputs_apart

    check_outputs_apart({"input": "-", "--ledger": None}, {"-o": "-", "--summary-json": None})
    check_outputs_apart({"input": "x" * 100_000}, {"-o": "y" * 100_000})  # names too long to stat are compared as names


def test_the_command_line_of_the_issue_in_a_fresh_process(work: Path) -> None:
    """`tessera-compile m.py -o m.py` as a user types it: refused, the model source unchanged."""
    from .test_cli_failures import fails_cleanly

    fails_cleanly("tessera-compile", ["m.py", "-o", "m.py"], work, "-o m.py: that is the model source",
                  "destroy the input")
