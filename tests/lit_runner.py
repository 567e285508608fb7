"""A small lit-like runner for FileCheck test files: each ``// RUN:`` line is a shell pipeline.

A test file (``*.tir`` under ``tests/passes/filecheck/``, ``*.check`` under
``tests/frontend/filecheck/``) starts with one or more ``// RUN:`` lines, e.g.::

    // RUN: tessera-opt %s --split-input-file --passes=candidates | filecheck %s
    // RUN: not tessera-opt %s --passes='partition{search=nope}' 2>&1 | filecheck %s --check-prefix=BADOPT

As in LLVM's lit: ``%s`` is the file's path, a line ending in ``\\`` continues on the next
RUN line, pipelines fail when any command fails (``pipefail``), and ``not CMD`` succeeds
exactly when CMD fails with a user error (exit status 1; a crash, status 2, still fails).
The commands run from the repository root with the environment's ``bin`` folder (the
project's console scripts and ``filecheck``) first on PATH.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUN_MARKER = "// RUN:"
PRELUDE = 'set -o pipefail\nnot() { "$@"; [ $? -eq 1 ]; }\n'


def run_lines(path: Path) -> list[str]:
    """The commands of ``path``'s RUN lines, continuations joined."""
    commands: list[str] = []
    pending = ""
    for line in path.read_text().splitlines():
        if RUN_MARKER not in line:
            continue
        text = line.split(RUN_MARKER, 1)[1].strip()
        if text.endswith("\\"):
            pending += text[:-1] + " "
            continue
        commands.append(pending + text)
        pending = ""
    if pending:
        raise ValueError(f"{path}: the last RUN line continues with '\\' but no RUN line follows")
    return commands


def run(command: str, path: Path, timeout_s: float = 600.0) -> subprocess.CompletedProcess[str]:
    """Run one RUN command for ``path`` under bash; stdout and stderr come back in the result."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    script = PRELUDE + command.replace("%s", shlex.quote(str(path)))
    return subprocess.run(
        ["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
