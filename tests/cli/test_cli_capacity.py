"""tessera-compile's capacity report: printed after planning, written as JSON, trace and timeline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli import compile_main

TINY = str(Path(__file__).parents[2] / "examples" / "tiny_qwen3_next.py")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = compile_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_report_json_trace_and_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    files = {name: tmp_path / name for name in ("plan.tir", "report.json", "trace.json", "timeline.png")}
    code, out, err = _run(
        capsys, TINY, "-o", str(files["plan.tir"]), "--report-json", str(files["report.json"]),
        "--trace", str(files["trace.json"]), "--timeline", str(files["timeline.png"]),
        "--routing", "zipf", "--iterations", "3",
    )
    assert code == 0, err
    assert "Capacity report: tiny_qwen3_next" in out and "exposed dispatch" in out and "DBO:" in out
    report = json.loads(files["report.json"].read_text())
    assert report["static"]["iterations"] == 3 and "dbo" in report and report["routing"].startswith("zipf")
    trace = json.loads(files["trace.json"].read_text())
    assert any(e.get("cat") == "dispatch" for e in trace["traceEvents"])
    assert files["timeline.png"].read_bytes().startswith(b"\x89PNG")
    assert "plan dbo_slot" in files["plan.tir"].read_text()


def test_outputs_that_need_a_plan_are_refused_without_partial_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_ir, trace = tmp_path / "x.tir", tmp_path / "t.json"
    code, _, err = _run(capsys, TINY, "--passes", "none", "-o", str(out_ir), "--trace", str(trace))
    assert code == 1
    assert err.strip().count("\n") == 0 and "--trace needs a planned module" in err
    assert not out_ir.exists() and not trace.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (("--routing", "trace"), "needs a trace file"),
        (("--iterations", "0"), "--iterations must be at least 1"),
        (("--dp", "0"), "--dp must be a positive integer"),
        (("--routing", "trace", "--routing-trace", "no/such/trace.json"), "no such file"),
    ],
)
def test_bad_simulation_settings_fail_before_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str) -> None:
    out_ir = tmp_path / "x.tir"
    code, _, err = _run(capsys, "no/such/model.py", "-o", str(out_ir), *argv)
    assert code == 1 and message in err and not out_ir.exists()
