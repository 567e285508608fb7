"""Hostile sizes on the command line: each is one line naming the setting or field, exit status 1,
no output written, never an internal error and never a run that grows without bound."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tessera.cli import compile_main

from .test_cli_errors import TINY, assert_one_clean_error


def refused(capsys: pytest.CaptureFixture[str], tmp_path: Path, *argv: str) -> str:
    out = tmp_path / "out.tir"
    assert compile_main([*argv, "-o", str(out)]) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err
    assert not out.exists()
    return err


@pytest.mark.parametrize(("flag", "value", "words"), [
    ("--microbatches", "1000000000000", "--microbatches 1000000000000 is too large"),
    ("--microbatches", "100000", "micro-batch runs of a virtual stage per iteration, more than a plan can list"),
    ("--seq-len", "100000000000000", "--seq-len 100000000000000 is too large"),
])
def test_sizes_a_plan_cannot_hold(capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str, value: str, words: str) -> None:
    err = refused(capsys, tmp_path, TINY, "--passes", "none", "--no-cache", flag, value)
    assert_one_clean_error(err, "tessera-compile: error:", words)


@pytest.mark.parametrize("suffix", [".py", ".json", ""])
def test_a_source_path_of_100000_characters(capsys: pytest.CaptureFixture[str], tmp_path: Path, suffix: str) -> None:
    err = refused(capsys, tmp_path, "m" * 100_000 + suffix, "--passes", "none")
    assert_one_clean_error(err, "tessera-compile: error: model source", "file name too long")
    assert len(err) < 500


@pytest.mark.parametrize(("value", "words"), [
    ("many", 'got "many"'),
    # tests/frontend/test_runaway_configs.py checks each in-process; here through the capture's child
    pytest.param(0, "got 0", marks=pytest.mark.slow),
    pytest.param(-4, "got -4", marks=pytest.mark.slow),
    pytest.param(10**9, "more decoder layers than Tessera plans", marks=pytest.mark.slow),
])
def test_a_config_with_a_runaway_layer_count(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, value: object, words: str
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "qwen3_moe", "num_hidden_layers": value, "layer_types": None}))
    err = refused(capsys, tmp_path, str(config), "--passes", "none", "--no-cache")
    assert_one_clean_error(err, "tessera-compile: error:", '"num_hidden_layers"', words)
