"""examples/train_hf.py end to end: a tiny Qwen3-MoE under a PP=2 x EP=2 plan on four gloo ranks against plain transformers.

One slow test runs the example four times: ``--steps 0 --save-plan`` (compile only),
torchrun compiling its own plan and saving the trained model, ``--reference``
(plain transformers, one process) saving its model, and torchrun with the saved
4-layer plan for a 2-layer model, which every rank refuses naming the field.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_hf.py"
STEPS = 3
STEP_LINE = re.compile(r"^step (\d+) loss (\d+\.\d{6,})$", re.M)


def launch(args: list[str], *, torchrun: bool) -> subprocess.CompletedProcess[str]:
    prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"] if torchrun else [sys.executable]
    return subprocess.run([*prefix, str(EXAMPLE), "--model-type", "qwen3_moe", *args], cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=400)


def losses(proc: subprocess.CompletedProcess[str]) -> list[float]:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = [(int(k), float(v)) for k, v in STEP_LINE.findall(proc.stdout)]
    assert [k for k, _ in found] == list(range(STEPS)), proc.stdout
    return [v for _, v in found]


def test_train_hf_matches_plain_transformers_and_saves_a_checkpoint_from_pretrained_loads(tmp_path):
    from transformers import AutoModelForCausalLM

    plan = tmp_path / "plan.tsb"
    compiled = launch(["--steps", "0", "--save-plan", str(plan)], torchrun=False)
    assert compiled.returncode == 0 and plan.stat().st_size > 0, compiled.stdout[-3000:] + compiled.stderr[-3000:]

    tessera = losses(launch(["--steps", str(STEPS), "--save-checkpoint", str(tmp_path / "tessera")], torchrun=True))
    reference = losses(launch(["--steps", str(STEPS), "--reference", "--save-checkpoint", str(tmp_path / "ref")],
                              torchrun=False))
    for step, (got, want) in enumerate(zip(tessera, reference)):
        assert abs(got - want) <= 1e-5 * abs(want), f"step {step}: {got} vs plain transformers {want}"

    # The gathered checkpoint is the trained model: from_pretrained gives transformers' trained logits.
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        trained = AutoModelForCausalLM.from_pretrained(tmp_path / "tessera")(ids).logits
        want = AutoModelForCausalLM.from_pretrained(tmp_path / "ref")(ids).logits
        torch.manual_seed(0)
        untrained = AutoModelForCausalLM.from_config(AutoModelForCausalLM.from_pretrained(tmp_path / "ref").config)(ids).logits
    assert torch.allclose(trained, want, rtol=0, atol=1e-4), float((trained - want).abs().max())
    assert float((untrained - want).abs().max()) > 1e-2  # three steps moved the weights well past the tolerance

    refused = launch(["--plan", str(plan), "--layers", "2", "--steps", "1"], torchrun=True)
    assert refused.returncode != 0
    output = refused.stdout + refused.stderr
    # Every rank refuses it naming the field: its own refusal, or the first rank's through the health watch.
    refusal = re.compile(r"rank \d: (ModelMismatch: )?layers: the plan runs 4 decoder layers but the Qwen3MoeForCausalLM has 2")
    for rank in range(4):
        lines = [line for line in output.splitlines() if line.startswith(f"[rank {rank}] error: ")]
        assert lines and refusal.search(lines[0]), output[-3000:]
