"""Golden IR of a real HF model checked with FileCheck patterns (one ``.check`` file per model).

Each check file's RUN line documents the command; the test runs the same
capture in-process (sharing the session's capture cache) and pipes the printed
IR through the ``filecheck`` tool against the file's CHECK lines.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from capture_cache import captured

from tessera_ir import print_module

CHECK_DIR = Path(__file__).parent / "filecheck"
FILECHECK = shutil.which("filecheck", path=str(Path(sys.executable).parent)) or shutil.which("filecheck")


@pytest.mark.skipif(FILECHECK is None, reason="the filecheck tool is not installed (pip install filecheck)")
@pytest.mark.parametrize("check_file", sorted(CHECK_DIR.glob("*.check")), ids=lambda p: p.stem)
def test_ir_matches_filecheck_patterns(check_file: Path) -> None:
    run_line = next(line for line in check_file.read_text().splitlines() if "RUN:" in line)
    source = run_line.split("tessera-compile", 1)[1].split()[0]
    text = print_module(captured(source))
    result = subprocess.run([FILECHECK, str(check_file)], input=text, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_filecheck_rejects_a_wrong_structure(tmp_path: Path) -> None:
    """The patterns can fail: the same check file rejects IR with a layer kind swapped."""
    if FILECHECK is None:
        pytest.skip("the filecheck tool is not installed")
    text = print_module(captured("hf:qwen3_next"))
    broken = text.replace('"model.layers.3" mixer = attention', '"model.layers.3" mixer = linear_attention', 1)
    result = subprocess.run(
        [FILECHECK, str(CHECK_DIR / "qwen3_next.check")], input=broken, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
