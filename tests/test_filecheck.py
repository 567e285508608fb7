"""Every FileCheck test file's RUN lines, run as lit would (``tests/lit_runner.py``).

One golden ``.tir`` file per pass under ``tests/passes/filecheck/`` (``// -----``-separated
cases, a one-line comment per case, ``CHECK-LABEL`` per case, named captures, negative
cases), and the captured IR of real models under ``tests/frontend/filecheck/``. A RUN line
that captures a model with ``tessera-compile`` is marked slow.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_runner import ROOT, run, run_lines

FILES = sorted(
    p for folder in ("tests/passes/filecheck", "tests/frontend/filecheck")
    for p in (ROOT / folder).iterdir() if p.suffix in (".tir", ".check")
)
CASES = [
    pytest.param(path, command, id=f"{path.name}:{k}", marks=[pytest.mark.slow] if "tessera-compile" in command else [])
    for path in FILES
    for k, command in enumerate(run_lines(path), start=1)
]


def test_every_pass_has_a_filecheck_file() -> None:
    from passes.manager import PASS_REGISTRY

    names = {p.stem for p in FILES if p.suffix == ".tir"}
    assert set(PASS_REGISTRY) <= names, f"passes without a FileCheck file: {sorted(set(PASS_REGISTRY) - names)}"
    for path in FILES:
        assert run_lines(path), f"{path.relative_to(ROOT)} has no RUN line"


@pytest.mark.parametrize(("path", "command"), CASES)
def test_run_line(path: Path, command: str) -> None:
    result = run(command, path)
    assert result.returncode == 0, f"RUN: {command}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"
