"""The shared driver: how a tool's body ends becomes an exit status and at most one line."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import pytest

from tessera.driver import MAX_MESSAGE_CHARS, Run, run_tool, tool_parser
from tessera_ir.errors import TesseraError

from .test_cli_errors import assert_one_clean_error

GOLDEN = Path(__file__).resolve().parents[1] / "ir" / "golden" / "tiny.tir"


def run_body(body, argv: list[str] | None = None) -> int:  # type: ignore[no-untyped-def]
    return run_tool("tessera-test", tool_parser("tessera-test", "a tool for tests"), body, argv or [])


def test_user_error_is_one_line_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    def body(args: argparse.Namespace, run: Run) -> int:
        raise TesseraError("what went wrong\nand a second line")

    assert run_body(body) == 1
    assert_one_clean_error(capsys.readouterr().err, "tessera-test: error: what went wrong and a second line")


def test_a_long_message_is_cut_in_the_middle(capsys: pytest.CaptureFixture[str]) -> None:
    def body(args: argparse.Namespace, run: Run) -> int:
        raise TesseraError("start " + "x" * 100_000 + " end")

    assert run_body(body) == 1
    err = capsys.readouterr().err
    assert_one_clean_error(err, "tessera-test: error: start", "characters]", "end")
    assert len(err) < MAX_MESSAGE_CHARS + 100


def test_a_bug_is_an_internal_error_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def body(args: argparse.Namespace, run: Run) -> int:
        empty: dict[str, int] = {}
        return empty["missing"]

    assert run_body(body) == 2
    assert_one_clean_error(capsys.readouterr().err, "tessera-test: internal error: KeyError", "test_driver.py:", "--debug")
    with pytest.raises(KeyError):
        run_body(body, ["--debug"])


def test_a_bad_command_line_is_a_user_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_body(lambda args, run: 0, ["--nope"]) == 1
    assert_one_clean_error(capsys.readouterr().err, "unrecognized arguments: --nope", "see tessera-test --help")


def test_parse_ir_pauses_the_collector_and_restores_it(tmp_path: Path) -> None:
    seen = []

    def body(args: argparse.Namespace, run: Run) -> int:
        real = gc.disable

        def spy() -> None:
            seen.append("disabled")
            real()

        gc.disable = spy  # type: ignore[assignment]
        try:
            module = run.parse_ir(str(GOLDEN))
        finally:
            gc.disable = real  # type: ignore[assignment]
        assert module.name == "tiny" and module.source == str(GOLDEN)
        return 0

    assert gc.isenabled()
    assert run_body(body) == 0
    assert seen == ["disabled"] and gc.isenabled()
    gc.disable()
    try:
        assert run_body(body) == 0
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()
