"""Golden-file comparison shared by the tests that print IR exactly.

``TESSERA_UPDATE_GOLDEN=1 .venv/bin/pytest ...`` rewrites the golden files from the current
output instead of comparing (then review the diff with git before committing it).
"""

from __future__ import annotations

import os
from pathlib import Path

UPDATE_VARIABLE = "TESSERA_UPDATE_GOLDEN"


def check_golden(path: Path, text: str) -> None:
    """Assert ``text`` equals the golden file ``path`` (or rewrite it when asked to)."""
    if os.environ.get(UPDATE_VARIABLE) == "1":
        path.write_text(text)
    assert path.exists(), f"golden file {path} missing: rerun with {UPDATE_VARIABLE}=1"
    assert text == path.read_text(), f"output differs from {path}; if the change is intended, rerun with {UPDATE_VARIABLE}=1"
