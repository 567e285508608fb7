"""Hardware names from the IR and pass options resolve only to the shipped descriptions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from passes.costs import hardware
from passes.costs.hardware import HARDWARE_DIR, HardwareError, allow_hardware_file, check_hardware_name, load_hardware


@pytest.mark.parametrize("name", ["h100", "h200", "cpu"])
def test_shipped_names_resolve(name: str) -> None:
    assert check_hardware_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["../../etc/passwd", "h100.json", str(HARDWARE_DIR / "h100.json"), "x" * 100_000, "", "H100", 7, ["h100"]],
    ids=["dot-dot", "with suffix", "absolute path", "100k characters", "empty", "wrong case", "a number", "a list"],
)
def test_anything_else_is_refused_without_touching_the_file_system(name: object) -> None:
    with pytest.raises(HardwareError, match="unknown hardware") as info:
        load_hardware(name)  # type: ignore[arg-type]
    assert len(str(info.value)) < 300
    assert "cpu, h100, h200" in str(info.value)


def test_a_file_given_on_the_command_line_is_allowed_by_the_text_that_named_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hardware, "_ALLOWED_FILES", {})
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    data["name"] = "my-gpu"
    path = tmp_path / "my-gpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HardwareError):
        load_hardware(str(path))
    allow_hardware_file(str(path))
    assert load_hardware(str(path)).name == "my-gpu"
    assert load_hardware(path).name == "my-gpu"  # a Path is always a file the program chose


def test_a_broken_description_file_is_a_clear_error(tmp_path: Path) -> None:
    for content, message in [(b"[1, 2]", "is a JSON object"), (b"{", "invalid JSON"), (b"\xff", "cannot read")]:
        path = tmp_path / "hw.json"
        path.write_bytes(content)
        with pytest.raises(HardwareError, match=message):
            load_hardware(path)
    with pytest.raises(HardwareError, match="cannot read"):
        load_hardware(tmp_path)
