"""Each way a user can make a tool fail is one line on stderr, exit status 1, and no file
left behind or changed. The tools run as fresh processes, as a user runs them, except
where a test needs to reach inside (tessera-compile in-process saves importing torch)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from passes.manager import PASS_REGISTRY, ModulePass
from tessera.cli import compile_main
from tessera_ir.model import Module

from .test_cli_errors import TINY, assert_one_clean_error

TESTS = Path(__file__).resolve().parents[1]
PLAN = TESTS / "passes" / "golden" / "overlap_schedule.tir"
MAINS = {"tessera-compile": "compile_main", "tessera-opt": "opt_main", "tessera-viz": "viz_main"}


def tool(name: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run a tool in a fresh interpreter; returns (exit status, stdout, stderr)."""
    code = f"import sys; from tessera.cli import {MAINS[name]} as main; sys.exit(main(sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )
    return done.returncode, done.stdout, done.stderr


def listing(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its contents, to compare before and after a run."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def fails_cleanly(name: str, args: list[str], folder: Path, *fragments: str, env: dict[str, str] | None = None) -> str:
    before = listing(folder)
    code, _, err = tool(name, *args, cwd=folder, env=env)
    assert code == 1, err
    assert_one_clean_error(err, f"{name}: error:", *fragments)
    assert listing(folder) == before, "a failed run must leave no file behind and change none"
    return err


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "plan.tir").write_bytes(PLAN.read_bytes())
    (tmp_path / "existing.tir").write_text("an earlier output\n")
    return tmp_path


# --- inputs ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["tessera-opt", "tessera-viz"])
def test_input_that_is_a_folder(work: Path, name: str) -> None:
    (work / "folder.tir").mkdir()
    fails_cleanly(name, ["folder.tir", "-o", "out"], work, "'folder.tir' is a folder")


@pytest.mark.parametrize("name", ["tessera-opt", "tessera-viz"])
def test_input_that_is_missing(work: Path, name: str) -> None:
    fails_cleanly(name, ["missing.tir", "-o", "out"], work, "'missing.tir' does not exist")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs file permissions that bind (not root)")
@pytest.mark.parametrize("name", ["tessera-opt", "tessera-viz"])
def test_input_that_cannot_be_read(work: Path, name: str) -> None:
    locked = work / "locked.tir"
    locked.write_bytes(PLAN.read_bytes())
    locked.chmod(0)
    try:
        fails_cleanly(name, ["locked.tir", "-o", "out"], work, "cannot read input file 'locked.tir'", "ermission")
    finally:
        locked.chmod(stat.S_IRUSR | stat.S_IWUSR)


def test_input_that_cannot_be_read_in_process(work: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The same as above where permissions do not bind (as root): the read itself is refused."""
    from tessera.cli import opt_main

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(Path, "read_bytes", refuse)
    assert opt_main([str(work / "plan.tir"), "-o", str(work / "out.tir")]) == 1
    assert_one_clean_error(capsys.readouterr().err, "cannot read input file", "Permission denied")
    assert not (work / "out.tir").exists()


@pytest.mark.parametrize("name", ["tessera-opt", "tessera-viz"])
def test_input_that_is_not_utf8(work: Path, name: str) -> None:
    text = PLAN.read_bytes().replace(b'"bf16"', b'"bf\xff16"')
    (work / "latin.tir").write_bytes(text)
    line = text[: text.index(b"\xff")].count(b"\n") + 1
    fails_cleanly(name, ["latin.tir", "-o", "out"], work, f"latin.tir:{line}:", "not UTF-8", "0xff")


# --- outputs --------------------------------------------------------------------------------------


def test_opt_output_that_is_a_folder(work: Path) -> None:
    (work / "outdir").mkdir()
    fails_cleanly("tessera-opt", ["plan.tir", "--passes=verify", "-o", "outdir"], work, "-o outdir", "is a folder")


def test_opt_output_in_a_missing_folder_is_refused(work: Path) -> None:
    fails_cleanly("tessera-opt", ["plan.tir", "-o", "no/such/out.tir"], work, "folder 'no/such' does not exist")


def test_opt_writes_no_bytecode_for_ir_without_programs(work: Path) -> None:
    fails_cleanly("tessera-opt", ["plan.tir", "-o", "plan.tsb"], work, "holds no per-rank programs; run the pipeline pass")


def test_opt_refuses_bytecode_from_split_input(work: Path) -> None:
    fails_cleanly("tessera-opt", ["plan.tir", "--split-input-file", "-o", "plan.tsb"], work, "-o plan.tsb",
                  "textual IR only")


def test_compile_refuses_text_into_a_bytecode_file(work: Path) -> None:
    fails_cleanly("tessera-compile", [TINY, "--emit", "ir", "-o", "plan.tsb"], work, "-o plan.tsb", "textual IR only")


def _with_module_hardware(work: Path, name: str) -> None:
    text = (work / "plan.tir").read_text()
    (work / "plan.tir").write_text(text.replace('dtype = "bf16"', f'dtype = "bf16", hardware = "{name}"', 1))


def test_opt_over_long_hardware_in_the_ir(work: Path) -> None:
    _with_module_hardware(work, "x" * 100_000)
    err = fails_cleanly("tessera-opt", ["plan.tir", "--passes=overlap-schedule", "-o", "existing.tir"], work, "unknown hardware")
    assert len(err) < 5_000


def test_hardware_in_the_ir_is_never_a_path(work: Path) -> None:
    _with_module_hardware(work, "../../../etc/passwd")
    fails_cleanly("tessera-opt", ["plan.tir", "--passes=overlap-schedule"], work, "unknown hardware")


def test_viz_output_that_is_a_file(work: Path) -> None:
    fails_cleanly("tessera-viz", ["plan.tir", "--format", "json", "-o", "existing.tir"], work, "is a file", "names a folder")


def test_viz_output_folder_under_a_missing_folder_is_refused(work: Path) -> None:
    fails_cleanly("tessera-viz", ["plan.tir", "--format", "json", "-o", "no/such"], work, "folder 'no' does not exist")


def test_viz_creates_only_its_own_output_folder_and_says_so(work: Path) -> None:
    code, out, err = tool("tessera-viz", "plan.tir", "--format", "json", "-o", "drawings", cwd=work)
    assert code == 0, err
    assert err.strip() == "tessera-viz: created folder drawings"
    assert out.split() == ["drawings/sched.0.trace.json"]


def test_viz_leaves_nothing_when_graphviz_times_out(work: Path) -> None:
    bin_dir = work / "slow-graphviz"
    bin_dir.mkdir()
    for engine in ("dot", "neato"):
        script = bin_dir / engine
        script.write_text("#!/bin/sh\nexec sleep 30\n")  # exec: the timeout kills the sleep itself
        script.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    (work / "drawings").mkdir()
    fails_cleanly(
        "tessera-viz", ["plan.tir", "--format", "json,svg", "--timeout", "0.5", "-o", "drawings"], work,
        "did not finish within 0.5 s", env=env,
    )


def overlapping_plan() -> str:
    """The golden plan with two compute tasks at the same time: z3 and the verifier both refuse it."""
    text = PLAN.read_text()
    entry = "@l1.expert_gemm.wgrad {duration = 24.0, order = 4, start = "
    assert entry + "77.0" in text
    return text.replace(entry + "77.0", entry + "70.0")  # beside @l1.shared_expert.dgrad, 66..75


def test_viz_refuses_a_schedule_the_verifier_refuses(work: Path) -> None:
    text = PLAN.read_text()
    (work / "bad.tir").write_text(overlapping_plan())
    fails_cleanly("tessera-viz", ["bad.tir", "--format", "json", "-o", "."], work, "[schedules-valid]", "at once")
    (work / "nostart.tir").write_text(text.replace("order = 0, start = 0.0, ", "order = 0, ", 1))
    fails_cleanly("tessera-viz", ["nostart.tir", "--format", "json", "-o", "."], work, "has no 'start'")


def test_opt_verify_refuses_two_compute_tasks_at_once(work: Path) -> None:
    (work / "bad.tir").write_text(overlapping_plan())
    fails_cleanly("tessera-opt", ["bad.tir", "--passes=verify", "-o", "existing.tir"], work, "bad.tir:", "at once")


def test_a_bad_command_line_is_one_line_too(work: Path) -> None:
    fails_cleanly("tessera-opt", ["plan.tir", "--no-such-flag"], work, "unrecognized arguments: --no-such-flag", "--help")


# --- tessera-compile ------------------------------------------------------------------------------


def run_compile(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = compile_main(list(argv))
    return code, capsys.readouterr().err


def write_model(folder: Path, body: str) -> str:
    path = folder / "model.py"
    path.write_text(body)
    return str(path)


def test_compile_reports_the_users_exception_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = write_model(tmp_path, "import torch\n\n\ndef helper():\n    raise ValueError('no weights here')\n\n\ndef build_model():\n    return helper()\n")
    code, err = run_compile(capsys, model, "-o", str(tmp_path / "out.tir"))
    assert code == 1
    assert_one_clean_error(err, f"{model}:5:", "build_model() raised ValueError: no weights here")
    assert not (tmp_path / "out.tir").exists()


def test_compile_refuses_parallel_that_is_not_a_dict(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = Path(TINY).read_text().replace('PARALLEL = {"pp": 2,', 'PARALLEL = [{"pp": 2,').replace('"dtype": "fp32"}', '"dtype": "fp32"}]')
    model = write_model(tmp_path, body)
    code, err = run_compile(capsys, model, "--passes", "none", "-o", str(tmp_path / "out.tir"))
    assert code == 1
    assert_one_clean_error(err, "PARALLEL must be a dict", "not a list")


def test_compile_output_that_is_a_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_compile(capsys, TINY, "--passes", "none", "-o", str(tmp_path))
    assert code == 1
    assert_one_clean_error(err, "is a folder")


def test_compile_checks_every_output_before_writing_any(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary").mkdir()
    out = tmp_path / "out.tir"
    code, err = run_compile(capsys, TINY, "--passes", "none", "-o", str(out), "--summary-json", str(tmp_path / "summary"))
    assert code == 1
    assert_one_clean_error(err, "--summary-json", "is a folder")
    assert not out.exists()


def test_compile_output_in_a_missing_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run_compile(capsys, TINY, "--passes", "none", "-o", str(tmp_path / "new" / "out.tir"))
    assert code == 1
    assert_one_clean_error(err, "does not exist; create it first")
    assert not (tmp_path / "new").exists()


def test_compile_two_outputs_to_one_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "x.json")
    code, err = run_compile(capsys, TINY, "--passes", "none", "--summary-json", out, "--partition-json", out)
    assert code == 1
    assert_one_clean_error(err, "same file")


@pytest.mark.slow
def test_compile_user_exception_in_a_fresh_process(tmp_path: Path) -> None:
    write_model(tmp_path, "def build_model():\n    return 1 / 0\n")
    fails_cleanly("tessera-compile", ["model.py", "-o", "out.tir"], tmp_path, "model.py:2:", "ZeroDivisionError")


def test_outputs_written_together_are_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tessera import io

    first, second = tmp_path / "a.tir", tmp_path / "b.tir"
    first.write_text("old a\n")
    real_replace = os.replace
    calls = []

    def fail_second(src: str, dst: str) -> None:
        calls.append(dst)
        if Path(dst) == second:
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(io.os, "replace", fail_second)
    with pytest.raises(io.OutputError, match="cannot write .*b.tir: No space left on device; no output was written"):
        io.write_files([(first, b"new a\n"), (second, b"new b\n")])
    monkeypatch.setattr(io.os, "replace", real_replace)
    assert first.read_text() == "old a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.tir"]


def test_viz_draws_a_valid_schedule_whose_times_approach_the_largest_float(work: Path) -> None:
    import json

    entry = "@l1.attention.wgrad {duration = 25.0, order = 11, start = "
    text = PLAN.read_text()
    assert entry + "179.5" in text
    # Moved further along at the end of the compute stream, where nothing waits for it: still valid.
    (work / "far.tir").write_text(text.replace(entry + "179.5", entry + "1.7e+308"))
    code, out, err = tool("tessera-viz", "far.tir", "--format", "json,dot", "-o", ".", cwd=work)
    assert code == 0, err
    trace = json.loads((work / "sched.0.trace.json").read_text())
    assert max(e["ts"] for e in trace["traceEvents"] if e["ph"] == "X") == 1.7e308
    assert "tick" in (work / "sched.0.schedule.dot").read_text()


@dataclass(frozen=True)
class _BreaksTheModule(ModulePass):
    """Test pass: leaves a dependency on a task that does not exist."""

    name = "test-break"
    summary = "test only"

    def apply(self, module: Module) -> bool:
        module.layers[1].tasks[0].deps.append("no.such.task")
        return True


@pytest.mark.parametrize("each", [False, True])
def test_compile_of_an_invalid_plan_writes_nothing_and_says_which_pass(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, each: bool
) -> None:
    # By default the planned module is verified once, beside printing it; --verify-each checks
    # after every pass and so names the one that broke it.
    monkeypatch.setitem(PASS_REGISTRY, "test-break", f"{__name__}:_BreaksTheModule")
    out = tmp_path / "out.tir"
    argv = [TINY, "--passes", "test-break,candidates", "--no-cache", "-o", str(out), "--summary-json", str(tmp_path / "s.json")]
    code, err = run_compile(capsys, *argv, *(["--verify-each"] if each else []))
    assert code == 1
    if each:
        assert_one_clean_error(err, "pass 'test-break' failed", "left an invalid module", "no.such.task")
    else:
        assert_one_clean_error(err, "invalid after passes test-break,candidates", "no.such.task", "rerun with --verify-each")
    assert list(tmp_path.iterdir()) == []
