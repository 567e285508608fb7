"""The same compile gives the same bytes: IR, partition JSON and report, run after run.

Two separate processes with different hash seeds (so set and dict orders that depend on
string hashing differ), the default planning pipeline, outputs compared byte for byte.
Timings go to --timing only, never into these outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_qwen3_next.py"


def compile_once(out: Path, seed: str) -> tuple[bytes, bytes, bytes]:
    out.mkdir()
    env = dict(os.environ, PYTHONHASHSEED=seed)
    tool = Path(sys.executable).parent / "tessera-compile"
    done = subprocess.run(
        [str(tool), str(TINY), "-o", str(out / "plan.tir"), "--partition-json", str(out / "partition.json"), "--report"],
        capture_output=True, env=env, check=True, timeout=600,
    )
    return (out / "plan.tir").read_bytes(), (out / "partition.json").read_bytes(), done.stdout


@pytest.mark.slow
def test_the_same_compile_twice_is_byte_identical(tmp_path: Path) -> None:
    first = compile_once(tmp_path / "a", "1")
    second = compile_once(tmp_path / "b", "2")
    for name, a, b in zip(("IR", "partition JSON", "report"), first, second):
        assert a == b, f"the {name} differs between two runs of the same compile"
    assert b"solve_seconds" not in first[0] and b"seconds" not in first[1]
