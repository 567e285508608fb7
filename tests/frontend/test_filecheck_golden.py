"""The FileCheck patterns of a real model's captured IR can fail (their RUN lines run in
``tests/test_filecheck.py``): the same check file rejects IR with one layer kind swapped."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from capture_cache import captured

from tessera_ir import print_module

CHECK_DIR = Path(__file__).parent / "filecheck"


def test_filecheck_rejects_a_wrong_structure() -> None:
    filecheck = shutil.which("filecheck", path=str(Path(sys.executable).parent))
    assert filecheck is not None, "filecheck is a dev dependency: `make setup` installs it"
    text = print_module(captured("hf:qwen3_next"))
    broken = text.replace('"model.layers.3" mixer = attention', '"model.layers.3" mixer = linear_attention', 1)
    assert broken != text
    result = subprocess.run(
        [filecheck, str(CHECK_DIR / "qwen3_next.check")], input=broken, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
