"""Capture in a forked child (tessera.child_capture): the compiling process gets the child's
answer, or its user error with the same message, prints nothing twice, and captures again
itself when the child ends any other way; a compile through it writes the bytes a compile
without it writes, and its own process never imports torch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tessera.child_capture as child_capture
from tessera_ir.errors import TesseraError

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = ["--pp", "2", "--vpp", "2", "--ep", "4", "--microbatches", "8", "--seq-len", "512"]


@pytest.fixture
def forking(monkeypatch: pytest.MonkeyPatch) -> None:
    if not hasattr(os, "fork"):
        pytest.skip("this platform does not fork")
    monkeypatch.setattr(child_capture, "worth_a_child", lambda: True)  # pytest's process has torch loaded


def runs_logged(log: Path) -> list[str]:
    return log.read_text().split() if log.exists() else []


def test_the_answer_comes_back_from_another_process(forking: None) -> None:
    here = os.getpid()
    pid, value = child_capture.in_child(lambda: (os.getpid(), {"layers": [1, 2.5, "x"]}))
    assert pid != here
    assert value == {"layers": [1, 2.5, "x"]}


def failing(log: Path, error: Exception) -> Callable[[], None]:
    """Work that notes which process ran it in ``log``, then raises ``error``."""

    def work() -> None:
        with log.open("a") as out:
            out.write(f"{os.getpid()}\n")
        raise error

    return work


def test_a_user_error_keeps_its_message_and_runs_once(forking: None, tmp_path: Path) -> None:
    log = tmp_path / "runs"
    with pytest.raises(TesseraError) as caught:
        child_capture.in_child(failing(log, TesseraError("model.py:3: build_model() raised ValueError('no'); fix the file")))
    assert str(caught.value) == "model.py:3: build_model() raised ValueError('no'); fix the file"
    notes = getattr(caught.value, "__notes__", [])
    assert len(notes) == 1 and "raised in the capture's child process" in notes[0] and "in work" in notes[0], notes
    assert len(runs_logged(log)) == 1 and runs_logged(log) != [str(os.getpid())]


def test_any_other_failure_is_captured_again_here(forking: None, tmp_path: Path) -> None:
    log = tmp_path / "runs"
    with pytest.raises(ValueError, match="a bug in the frontend"):
        child_capture.in_child(failing(log, ValueError("a bug in the frontend")))
    runs = runs_logged(log)
    assert len(runs) == 2 and runs[0] != str(os.getpid()) and runs[1] == str(os.getpid())


def test_an_answer_that_does_not_pickle_is_captured_again_here(forking: None) -> None:
    pids: list[int] = []

    def work() -> object:
        pids.append(os.getpid())  # only this process's list keeps what this process appends
        return lambda: None  # a lambda does not pickle

    answer = child_capture.in_child(work)
    assert callable(answer) and pids == [os.getpid()]


PRINTS = """
import sys
import tessera.child_capture as child_capture
child_capture.worth_a_child = lambda: True
print("before the fork", end=" ")  # still in this process's buffer when it forks

def work():
    print("from the capture", end=" ")
    print("a warning", end=" ", file=sys.stderr)
    return 7

print(child_capture.in_child(work))
"""


def test_what_each_side_prints_is_printed_once(forking: None) -> None:
    # A fresh process whose streams are pipes, so both are buffered as a compile's are.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    done = subprocess.run([sys.executable, "-c", PRINTS], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before the fork from the capture 7\n"
    assert done.stderr == "a warning "


def test_without_fork_or_with_torch_loaded_the_capture_runs_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_capture, "worth_a_child", lambda: False)
    assert child_capture.in_child(os.getpid) == os.getpid()
    import torch  # noqa: F401 - loaded, as in any process that captured before

    monkeypatch.undo()
    assert not child_capture.worth_a_child()


PROBE = """
import sys
import tessera.child_capture as child_capture
if sys.argv[1] == "here":
    child_capture.worth_a_child = lambda: False
from tessera.cli import compile_main
rc = compile_main(sys.argv[2:])
print(rc, sorted(m for m in ("torch", "transformers", "frontend") if m in sys.modules))
"""


def compile_in_fresh_process(cache: Path, mode: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE, mode, *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env=dict(os.environ, TESSERA_CACHE_DIR=str(cache)))


@pytest.mark.slow
def test_a_compile_through_the_child_writes_the_same_bytes_and_never_imports_torch(tmp_path: Path) -> None:
    from cli.test_compile_cache import small_config

    config = small_config(tmp_path)
    outputs = {}
    for mode in ("child", "here"):
        out = tmp_path / mode
        out.mkdir()
        done = compile_in_fresh_process(
            tmp_path / "cache", mode, str(config), "-o", str(out / "plan.tir"), "--summary-json", str(out / "summary.json"),
            "--partition-json", str(out / "partition.json"), "--report", "--no-cache", *SETTINGS,
        )
        assert done.returncode == 0, done.stderr
        *printed, last = done.stdout.splitlines()
        imported = last.split(" ", 1)[1]
        assert imported == ("[]" if mode == "child" else "['frontend', 'torch', 'transformers']"), last
        outputs[mode] = ({p.name: p.read_bytes() for p in sorted(out.iterdir())}, printed, done.stderr)
    assert outputs["child"] == outputs["here"]


@pytest.mark.slow
def test_a_model_file_that_raises_reads_the_same_through_the_child(tmp_path: Path) -> None:
    model = tmp_path / "model.py"
    model.write_text("print('building')\n\ndef build_model():\n    raise ValueError('no weights today')\n")
    said = {}
    for mode in ("child", "here"):
        done = compile_in_fresh_process(tmp_path / "cache", mode, str(model), "-o", str(tmp_path / f"{mode}.tir"), "--no-cache")
        assert not (tmp_path / f"{mode}.tir").exists()
        said[mode] = (done.stdout.splitlines()[:-1], done.stderr, done.stdout.splitlines()[-1].split(" ", 1)[0])
    assert said["child"] == said["here"]
    printed, stderr, rc = said["child"]
    assert rc == "1" and printed == ["building"]
    assert "no weights today" in stderr and len(stderr.strip().splitlines()) == 1
