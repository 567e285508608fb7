"""Bad input to the command-line tools: one clear message, non-zero exit, no output file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli import compile_main, opt_main

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_qwen3_next.py")


def run_compile(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = compile_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_opt(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = opt_main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_clean_error(err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected exactly one error line, got:\n{err}"
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"


def test_model_py_without_build_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_py = tmp_path / "model.py"
    model_py.write_text("import torch\nPARALLEL = {'pp': 1}\n")
    out = tmp_path / "plan.tir"
    code, _, err = run_compile(capsys, str(model_py), "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "build_model")
    assert not out.exists()


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.tir"
    code, _, err = run_compile(capsys, str(tmp_path / "nope" / "config.json"), "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "config.json")
    assert not out.exists()


def test_unknown_hf_model_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_compile(capsys, "hf:not_a_model_type", "-o", str(tmp_path / "x.tir"))
    assert code == 1
    assert_one_clean_error(err, "not_a_model_type")


def test_ep_not_dividing_experts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.tir"
    code, _, err = run_compile(capsys, TINY, "--ep", "3", "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "3")
    assert "expert" in err.lower()
    assert not out.exists()


def test_pp_larger_than_layers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tiny.tir"
    code, _, err = run_compile(capsys, TINY, "--pp", "64", "--vpp", "1", "--microbatches", "64", "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "64")
    assert not out.exists()


def test_nonpositive_parallel_setting(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_compile(capsys, TINY, "--tp", "0", "-o", str(tmp_path / "x.tir"))
    assert code == 1
    assert_one_clean_error(err, "--tp")


def test_unknown_pass_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.tir"
    src.write_text("module @m {\n}\n")
    out = tmp_path / "out.tir"
    code, _, err = run_opt(capsys, str(src), "--passes=verify,no-such-pass", "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "no-such-pass", "known passes")
    assert not out.exists()


def test_malformed_ir_names_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "bad.tir"
    src.write_text('module @m {\n  layer @l0 decoder 0 "x" mixer = nonsense ffn = moe {\n  }\n}\n')
    out = tmp_path / "out.tir"
    code, _, err = run_opt(capsys, str(src), "--passes=verify", "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, f"{src}:2:")
    assert not out.exists()


def test_failed_compile_keeps_previous_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.tir"
    out.write_text("previous contents\n")
    code, _, _ = run_compile(capsys, TINY, "--ep", "3", "-o", str(out))
    assert code == 1
    assert out.read_text() == "previous contents\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.tir"]  # no temporary file left behind


def test_debug_shows_traceback(tmp_path: Path) -> None:
    from tessera_ir.errors import TesseraError

    with pytest.raises(TesseraError):
        compile_main([str(tmp_path / "missing.json"), "-o", str(tmp_path / "x.tir"), "--debug"])


def test_compile_then_opt_roundtrip_is_identical(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tir = tmp_path / "tiny.tir"
    summary = tmp_path / "summary.json"
    code, _, err = run_compile(capsys, TINY, "--emit", "ir", "-o", str(tir), "--summary-json", str(summary), "--passes", "none")
    assert code == 0, err
    again = tmp_path / "again.tir"
    code, _, err = run_opt(capsys, str(tir), "--passes=verify", "-o", str(again))
    assert code == 0, err
    assert again.read_bytes() == tir.read_bytes()
    data = json.loads(summary.read_text())
    assert set(data) == {"model", "parameters", "layers", "tasks", "warnings"}
    assert data["tasks"] == tir.read_text().count("\n    task @")


def test_opt_dump_after_and_timing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tir = tmp_path / "tiny.tir"
    assert run_compile(capsys, TINY, "-o", str(tir), "--passes", "none")[0] == 0
    dumps = tmp_path / "dumps"
    code, out, err = run_opt(capsys, str(tir), "--passes=verify", "--dump-after=all", "--dump-dir", str(dumps), "--timing")
    assert code == 0, err
    assert [p.name for p in dumps.iterdir()] == ["01-verify.tir"]
    assert "pass verify" in err and "parse" in err
    assert out == tir.read_text()


def test_outputs_get_ordinary_file_permissions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    out = tmp_path / "tiny.tir"
    code, _, err = run_compile(capsys, TINY, "--passes", "none", "-o", str(out))
    assert code == 0, err
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.slow
def test_default_pipeline_plans_the_tiny_model_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Capture, candidates, overlap-schedule, profile, partition: a plan that prints, reports and round-trips."""
    plan, partition = tmp_path / "plan.tir", tmp_path / "partition.json"
    code, out, err = run_compile(capsys, TINY, "-o", str(plan), "--partition-json", str(partition), "--report")
    assert code == 0, err
    data = json.loads(partition.read_text())
    assert [s["stage"] for s in data["stages"]] == [0, 1, 2, 3]  # PARALLEL: pp=2, vpp=2
    covered = [layer for s in data["stages"] for layer in s["layers"] if layer.startswith("l")]
    assert covered == [f"l{i}" for i in range(8)]
    assert "Bottleneck:" in out and "--pipeline-model-parallel-layout" in out
    text = plan.read_text()
    assert "plan pair_schedule @sched.0" in text and "verified = true" in text
    again = tmp_path / "again.tir"
    code, _, err = run_opt(capsys, str(plan), "--passes=verify", "-o", str(again))
    assert code == 0, err
    assert again.read_bytes() == plan.read_bytes()


def test_a_bad_pass_option_fails_before_the_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The source does not even exist: the pipeline is checked first, so that is not what fails.
    out = tmp_path / "plan.tir"
    code, _, err = run_compile(capsys, str(tmp_path / "missing.py"), "--passes", "partition{search=nope}", "-o", str(out))
    assert code == 1
    assert_one_clean_error(err, "option 'search' of pass 'partition' takes window|global, got 'nope'")
    assert not out.exists()


def test_hardware_flag_is_checked_first_and_written_on_the_module(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_compile(capsys, str(tmp_path / "missing.py"), "--hardware", "h900", "-o", str(tmp_path / "x.tir"))
    assert code == 1
    assert_one_clean_error(err, "unknown hardware 'h900'", "h100, h200")
    out = tmp_path / "tiny.tir"
    code, _, err = run_compile(capsys, TINY, "--passes", "none", "--hardware", "h200", "-o", str(out))
    assert code == 0, err
    assert 'hardware = "h200"' in out.read_text().splitlines()[0]
    # tessera-opt --hardware overrides the module's target.
    code, printed, err = run_opt(capsys, str(out), "--passes=verify", "--hardware", "h100")
    assert code == 0, err
    assert 'hardware = "h100"' in printed.splitlines()[0]


@pytest.mark.parametrize(("hardware", "says"), [("h100", "not measured by Tessera"), ("h200", "measured on one H200")])
def test_the_report_says_where_the_target_figures_come_from(
    hardware: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_compile(capsys, TINY, "--passes", "none", "--hardware", hardware, "--report")
    assert code == 0, err
    figures = out.split("\nFigures: ", 1)[1].splitlines()[0]
    assert says in figures and "'sources'" in figures


def test_a_hardware_file_given_by_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from passes.costs.hardware import HARDWARE_DIR

    spec = json.loads((HARDWARE_DIR / "h100.json").read_text())
    spec.update(name="slow-h100", hbm_gbps=spec["hbm_gbps"] / 10)
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(spec))
    code, out, err = run_compile(capsys, TINY, "--passes", "none", "--hardware", str(path), "--report")
    assert code == 0, err
    assert f"Target hardware: {path}" in out and f"isolated kernels on {path}" in out
    assert f"\nFigures: {spec['source']}\n" in out  # where the file's figures come from, as it says
    spec["source"] = ""
    path.write_text(json.dumps(spec))
    code, out, err = run_compile(capsys, TINY, "--passes", "none", "--hardware", str(path), "--report")
    assert code == 0, err
    assert "Figures:" not in out  # a file that does not say is not given a line
    del spec["efficiency"]
    path.write_text(json.dumps(spec))
    code, _, err = run_compile(capsys, TINY, "--passes", "none", "--hardware", str(path), "--report")
    assert code == 1
    assert_one_clean_error(err, "hardware description lacks efficiency")


def test_list_passes_shows_options_with_types_and_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_opt(capsys, "--list-passes")
    assert code == 0
    assert "partition: Pick one candidate per virtual stage" in out
    assert "  search: window|global = window  -- " in out
    assert "  memory-budget" not in out and "  memory-gib" not in out  # run-wide settings, not pass options
    assert "  scale: float or auto = auto  -- " in out
    assert "  jobs: int (optional) = unset  -- " in out


def test_split_input_file_runs_each_part_and_reports_failures_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tir = tmp_path / "tiny.tir"
    assert run_compile(capsys, TINY, "-o", str(tir), "--passes", "none")[0] == 0
    good = tir.read_text()
    bad = good.replace("module @tiny_qwen3_next", "module @broken", 1).replace("after(@embed.embedding.fwd)", "after(@nowhere)", 1)
    both = tmp_path / "both.tir"
    both.write_text(good + "// -----\n" + bad + "// -----\n" + good)
    code, out, err = run_opt(capsys, str(both), "--split-input-file", "--passes=verify")
    assert code == 1
    assert out == good + "// -----\n" + "// -----\n" + good
    assert_one_clean_error(err, f"part at line {good.count(chr(10)) + 2}", "@nowhere")
    written = tmp_path / "out.tir"
    assert run_opt(capsys, str(both), "--split-input-file", "-o", str(written))[0] == 1
    assert not written.exists()  # a failed run writes no output file
