"""The executables (``tessera-compile``, ``tessera-opt``) run through ``tessera.driver.run_executable``:
the collector at the executables' thresholds, the same exit status, every byte of their output,
the exit handlers run, and no interpreter teardown (which freed a large compile's heap object by
object)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
PLAN = TESTS / "passes" / "golden" / "overlap_schedule.tir"


def executable(command: str, *args: str, before: str = "pass") -> subprocess.CompletedProcess[str]:
    """Run the entry point ``tessera.cli.<command>`` as its console script does (arguments from
    ``sys.argv``), after the statement ``before``."""
    code = f"{before}; from tessera.cli import {command}; {command}()"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_the_whole_output_reaches_a_pipe_and_the_status_is_zero() -> None:
    done = executable("opt_command", str(PLAN))
    assert done.returncode == 0, done.stderr
    assert done.stdout == PLAN.read_text()  # verified and printed back unchanged, to the last byte


def test_exit_handlers_run_after_the_output() -> None:
    done = executable("opt_command", str(PLAN), before="import atexit; atexit.register(lambda: print('handler ran'))")
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith("handler ran\n")
    assert done.stdout.removesuffix("handler ran\n") == PLAN.read_text()


def test_a_user_error_keeps_its_status_and_message(tmp_path: Path) -> None:
    done = executable("opt_command", str(tmp_path / "missing.tir"))
    assert done.returncode == 1
    assert done.stderr.startswith("tessera-opt: error: ") and "missing.tir" in done.stderr
    done = executable("compile_command", "--no-such-flag")
    assert done.returncode == 1
    assert "tessera-compile: error: " in done.stderr


def test_the_console_scripts_are_the_commands() -> None:
    import tomllib

    scripts = tomllib.loads((TESTS.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tessera-compile"] == "tessera.cli:compile_command"
    assert scripts["tessera-opt"] == "tessera.cli:opt_command"


def test_the_executables_collect_young_objects_only_and_in_process_callers_keep_theirs(capsys) -> None:
    import gc

    from support.collector import EXECUTABLE_GC_THRESHOLDS
    from tessera.cli import opt_main

    seen = "import atexit, gc; atexit.register(lambda: print('thresholds', gc.get_threshold()))"
    done = executable("opt_command", str(PLAN), before=seen)
    assert done.returncode == 0, done.stderr
    assert done.stdout.endswith(f"thresholds {EXECUTABLE_GC_THRESHOLDS}\n")
    assert EXECUTABLE_GC_THRESHOLDS[0] > gc.get_threshold()[0]  # a real change from the defaults
    before = gc.get_threshold()
    assert opt_main([str(PLAN)]) == 0  # what a test or an embedding caller does
    assert capsys.readouterr().out == PLAN.read_text()
    assert gc.get_threshold() == before
