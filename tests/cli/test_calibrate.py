"""CPU calibration runs only when asked for: loading ``cpu`` never measures, ``--hardware cpu`` and
``tessera-calibrate`` measure once (with a message) and then read the cache."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import passes.costs.calibrate_cpu as calibrate_cpu
from passes.costs.hardware import HARDWARE_DIR, HardwareError, load_hardware
from tessera.calibrate import main as calibrate_main
from tessera.cli import compile_main

TINY = str(Path(__file__).resolve().parents[2] / "examples" / "tiny_qwen3_next.py")


class NoProcesses:
    """Stands in for the pair executor: the fake calibration below measures nothing."""

    def __init__(self, world_size: int = 2) -> None:
        self.world_size = world_size

    def __enter__(self) -> NoProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """An empty cache folder, and a calibration that records its calls instead of measuring."""
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(tmp_path))
    calls: list[str] = []

    def fake_calibrate(executor: object, quick: bool = False, statistic: str = "median") -> dict[str, object]:
        calls.append(statistic)
        data = json.loads((HARDWARE_DIR / "h100.json").read_text())
        return dict(data, name="cpu", description="a pretend CPU")

    monkeypatch.setattr(calibrate_cpu, "calibrate", fake_calibrate)
    monkeypatch.setattr(calibrate_cpu, "PairExecutor", NoProcesses)
    return calls


def test_loading_cpu_never_measures(cache: list[str]) -> None:
    with pytest.raises(HardwareError, match="not been calibrated yet; run `tessera-calibrate`"):
        load_hardware("cpu")
    assert cache == []


def test_hardware_cpu_calibrates_once_with_a_visible_message(
    cache: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tiny.tir"
    assert compile_main([TINY, "--passes", "none", "--hardware", "cpu", "-o", str(out)]) == 0
    assert "calibrating the local CPU for --hardware cpu" in capsys.readouterr().err
    assert cache == ["median"]
    assert 'hardware = "cpu"' in out.read_text().splitlines()[0]
    assert load_hardware("cpu").description == "a pretend CPU"
    assert compile_main([TINY, "--passes", "none", "--hardware", "cpu", "-o", str(out)]) == 0
    assert "calibrating" not in capsys.readouterr().err and cache == ["median"]  # read from the cache


def test_tessera_calibrate_measures_then_reports_the_cache(cache: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert calibrate_main([]) == 0
    first = capsys.readouterr()
    assert first.out.startswith("calibrated: ") and "measuring the local CPU" in first.err
    assert calibrate_main([]) == 0
    assert capsys.readouterr().out.startswith("already calibrated")
    assert calibrate_main(["--refresh", "--statistic", "min"]) == 0
    assert cache == ["median", "min"]
