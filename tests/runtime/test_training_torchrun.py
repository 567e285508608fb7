"""Training under a plan with torchrun (PP=2 x EP=2, four gloo processes) against the one-process reference.

The plan is the tiny model's, compiled by the planning pipeline down to per-rank programs (the
pipeline pass) and written as bytecode, as `tessera-compile -o plan.tsb` writes it.

Deterministic CPU mode (runtime.local_reference): float32, deterministic algorithms, one intra-op thread
per process. Every case runs examples/train_tiny_qwen3_next.py, which dumps each step's losses and
reduced gradients; the comparisons are on the bits.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from codegen.emit import plan_bytes
from runtime.bytecode import decode, encode
from runtime.ledger import read_ledger
from tessera.api import compile

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_tiny_qwen3_next.py"
SEQ, STEPS = 16, 3
STEP_LINE = re.compile(r"^step \d+ loss \S+$", re.M)


def launch(args: list[str], *, nproc: int = 4, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if nproc:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(EXAMPLE), *args]
    else:
        cmd = [sys.executable, str(EXAMPLE), *args]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def compare_dumps(run: Path, ref: Path, steps: int) -> int:
    """Assert bitwise-equal losses and gradients for ``steps`` steps; returns how many gradients were compared."""
    compared = 0
    for step in range(steps):
        got, want = torch.load(run / f"losses{step}.pt"), torch.load(ref / f"losses{step}.pt")
        assert torch.equal(bits(got), bits(want)), f"step {step} losses {got} != {want}"
        for path in sorted(run.glob(f"grads{step}_rank*_shard*.pt")):
            shard = int(path.stem.rpartition("shard")[2])
            reference = torch.load(ref / f"grads{step}_shard{shard}.pt")
            for key, grad in torch.load(path).items():
                assert grad is not None and reference[key] is not None, key
                assert torch.equal(bits(grad), bits(reference[key])), f"step {step} shard {shard} {key}"
                compared += 1
    return compared


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "tiny.tsb"
    module = compile(str(ROOT / "examples" / "tiny_qwen3_next.py"), hardware="h100", pp=2, vpp=2, ep=2, microbatches=4,
                     seq_len=SEQ)
    path.write_bytes(plan_bytes(module))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("reference")
    stdout = ok(launch(["--reference", "--steps", str(STEPS), "--seq-len", str(SEQ), "--dump", str(out)], nproc=0))
    return out, stdout


def test_losses_and_gradients_are_bitwise_those_of_one_process(plan, reference, tmp_path):
    ref_dir, ref_out = reference
    ledger = tmp_path / "run.jsonl"
    out = ok(launch(["--plan", str(plan), "--steps", str(STEPS), "--seq-len", str(SEQ), "--dump", str(tmp_path),
                     "--ledger", str(ledger)]))
    assert STEP_LINE.findall(out) == STEP_LINE.findall(ref_out) and len(STEP_LINE.findall(out)) == STEPS
    # every parameter of the model is trained by some rank and compared
    assert compare_dumps(tmp_path, ref_dir, STEPS) == STEPS * 2 * len(torch.load(ref_dir / "grads0_shard0.pt"))
    assert '"deferred": ' in out and '"deferred": 0,' not in out  # DBO held weight gradients back
    # The run's ledger re-plans the model: every task it ran is re-timed, the pairs it measured re-priced.
    rows = read_ledger(ledger)
    assert {r["kind"] for r in rows} == {"task", "collective", "stage", "pair", "summary", "split"}
    assert {r["rank"] for r in rows} == set(range(4))
    # ... with what the backward split cost on each rank: every weight operation split by a dedicated rule
    splits = [r for r in rows if r["kind"] == "split"]
    assert len(splits) == 4 * STEPS and all(r["general_ops"] == 0 and r["dedicated_ops"] > 0 for r in splits)
    assert all(r["cpu_us"]["dgrad"] > 0 and r["cpu_us"]["wgrad"] > 0 for r in splits)
    replanned = compile(str(ROOT / "examples" / "tiny_qwen3_next.py"), hardware="h100", pp=2, vpp=2, ep=2,
                        microbatches=4, seq_len=SEQ, ledger=str(ledger))
    ran = {r["name"] for r in rows if r["kind"] == "task"}
    assert replanned.attrs["ledger_tasks"] == len(ran) > 0 and replanned.attrs["ledger_pairs"] > 0


def test_dbo_under_skewed_routing_runs_every_weight_gradient_once(plan, tmp_path):
    ref_dir = tmp_path / "reference"
    ok(launch(["--reference", "--steps", "2", "--seq-len", str(SEQ), "--skew", "3", "--dump", str(ref_dir)], nproc=0))
    run_dir = tmp_path / "run"
    out = ok(launch(["--plan", str(plan), "--steps", "2", "--seq-len", str(SEQ), "--skew", "3", "--dump", str(run_dir)]))
    imbalance = [float(x) for x in re.findall(r'"max_imbalance": ([0-9.]+)', out)]
    assert imbalance and min(imbalance) >= 1.3, f"routing was not skewed: {imbalance}"
    placed = sum(int(x) for x in re.findall(r'"placed": (\d+)', out))
    fallbacks = sum(int(x) for x in re.findall(r'"fallbacks": (\d+)', out))
    assert placed > 0 and fallbacks > 0  # some filled slots, some waited for their deadline
    for step in range(2):
        for path in run_dir.glob(f"wgrad_runs{step}_rank*.pt"):
            runs = torch.load(path)
            assert runs and set(runs.values()) == {1}, path.name  # none lost (the executor checks), none twice
    compare_dumps(run_dir, ref_dir, 2)


def test_pipelining_runtime_with_the_exported_schedule_matches_one_process(plan, reference, tmp_path):
    ref_dir, ref_out = reference
    out = ok(launch(["--plan", str(plan), "--steps", "2", "--seq-len", str(SEQ), "--driver", "pipelining",
                     "--dump", str(tmp_path)]))
    assert STEP_LINE.findall(out) == STEP_LINE.findall(ref_out)[:2]
    compare_dumps(tmp_path, ref_dir, 2)


@pytest.mark.parametrize("mode", ["raise", "exit"])
def test_a_failing_rank_is_named_by_every_other_rank(plan, mode):
    proc = launch(["--plan", str(plan), "--steps", "3", "--seq-len", str(SEQ), "--fail-rank", "2", "--fail-step", "1",
                   "--fail-at-action", "40", "--fail-mode", mode], timeout=150)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    for rank in (0, 1, 3):
        # Searched anywhere, not only at line starts: other output (the launcher's) may share the line.
        said = re.findall(rf"\[rank {rank}\] error: ([^\n]*)", text)
        assert said and "rank 2:" in said[0], f"rank {rank} did not name rank 2:\n{text[-4000:]}"
    if mode == "raise":
        assert "[rank 2] error: rank 2: RuntimeError: injected failure" in text


def named_by_every_rank(text: str, failed: int, reason: str, ranks: range | tuple[int, ...] = range(4)) -> None:
    """Every rank's first error line names rank ``failed`` and ``reason``, never the transport's complaint."""
    for rank in ranks:
        said = re.findall(rf"\[rank {rank}\] error: ([^\n]*)", text)
        assert said, f"rank {rank} said nothing:\n{text[-4000:]}"
        assert f"rank {failed}: " in said[0] and reason in said[0], f"rank {rank}: {said[0]}\n{text[-4000:]}"
        assert "Connection closed" not in said[0]


@pytest.mark.parametrize(("point", "reason"), [("start", "ended without reporting an error"),
                                               ("launch", "ended before its health watch started")])
def test_a_rank_killed_at_start_up_is_named_by_every_other_rank(plan, point, reason):
    proc = launch(["--plan", str(plan), "--steps", "1", "--seq-len", str(SEQ), "--fail-rank", "1", "--fail-at", point,
                   "--fail-mode", "exit"], timeout=150)
    assert proc.returncode != 0
    named_by_every_rank(proc.stdout + proc.stderr, 1, reason, ranks=(0, 2, 3))


def test_a_plan_refused_on_rank_0_is_named_by_every_rank(plan, tmp_path):
    damaged = tmp_path / "damaged.tsb"
    data = bytearray(plan.read_bytes())
    data[200] ^= 0xFF
    damaged.write_bytes(bytes(data))
    proc = launch(["--plan", str(damaged), "--steps", "1", "--seq-len", str(SEQ)], timeout=150)
    assert proc.returncode != 0
    named_by_every_rank(proc.stdout + proc.stderr, 0, "checksum mismatch")


def test_a_plan_for_another_model_and_settings_is_refused_as_such(plan, tmp_path):
    image = decode(plan.read_bytes())
    other = tmp_path / "other.tsb"
    other.write_bytes(encode(replace(image, plan=replace(image.plan, model="another_model", microbatches=8))))
    proc = launch(["--plan", str(other), "--steps", "1", "--seq-len", str(SEQ)], timeout=150)
    assert proc.returncode != 0
    named_by_every_rank(proc.stdout + proc.stderr, 0, "the plan was compiled for another model: model=another_model "
                        "(this run: tiny_qwen3_next), microbatches=8 (this run: 4); recompile it")


def test_a_plan_for_other_settings_is_refused_at_load(plan):
    proc = launch(["--plan", str(plan), "--steps", "1", "--seq-len", "8"], timeout=150)
    assert proc.returncode != 0
    named_by_every_rank(proc.stderr, 0, f"the plan was compiled for other settings: seq_len={SEQ} (this run: 8)")
