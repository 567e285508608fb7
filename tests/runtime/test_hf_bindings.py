"""Bindings of transformers' Qwen3-MoE and Mixtral: the registry, the model's own function, refusals, torchrun.

The one-process reference (``runtime.local_reference``) runs every task forward of
the binding on two EP replicas; it must train what ``model(input_ids, labels=...)``
trains, including Qwen3-MoE's unnormalised top-k weights (``norm_topk_prob=False``,
its default). Under a PP=2 x EP=2 plan on four gloo ranks the losses must be
bitwise those of the reference in the deterministic CPU mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hf_training import PARALLEL, build, compile_plan, make_batch, optimizer, tiny_config
from torch import nn

from runtime import load_plan
from runtime.bindings import (
    BindingError,
    MixtralBinding,
    ModelBinding,
    Qwen3MoeBinding,
    TinyMoEBinding,
    binding_for,
    register_binding,
    registered_bindings,
    unregister_binding,
)
from runtime.local_reference import LocalReference
from runtime.session import TrainingSession

from tiny_plan import tiny_example

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "hf_training.py"
CASES = [("qwen3_moe", {"norm_topk_prob": False}), ("qwen3_moe", {"norm_topk_prob": True}), ("mixtral", {})]
IDS = ["qwen3_moe-unnormalised", "qwen3_moe-normalised", "mixtral"]


@pytest.fixture
def deterministic():
    threads = torch.get_num_threads()
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    yield
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(threads)


def transformers_losses(config: Any, steps: int, shards: int, microbatches: int, seq_len: int) -> list[float]:
    """Plain transformers training on the same batches: ``model(ids, labels=ids)`` shifts inside."""
    model = build(config)
    opt = optimizer(list(model.parameters()))
    out = []
    for step in range(steps):
        ids = make_batch(step, shards, microbatches, seq_len).reshape(shards * microbatches, seq_len + 1)
        loss = model(ids, labels=ids).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        out.append(float(loss.detach()))
    return out


def reference_losses(config: Any, steps: int, microbatches: int, seq_len: int) -> list[torch.Tensor]:
    """Per step, the [shard][micro-batch] losses of the one-process reference with EP=2."""
    ref = LocalReference(lambda: build(config), ep=2, microbatches=microbatches, optimizer=optimizer)
    out = []
    for step in range(steps):
        ids = make_batch(step, ref.shards, microbatches, seq_len)
        losses = ref.step(ids[..., :-1], ids[..., 1:])
        ref.optimizer_step()
        out.append(torch.stack([torch.stack(row) for row in losses]))
    return out


# ---------------------------------------------------------------- the registry


def test_the_registry_picks_the_family_of_the_model():
    assert {"tiny_qwen3_next", "qwen3_moe", "mixtral"} <= set(registered_bindings())
    assert binding_for(build(tiny_config("qwen3_moe"))) is Qwen3MoeBinding
    assert binding_for(build(tiny_config("mixtral"))) is MixtralBinding
    assert binding_for(tiny_example().TinyQwen3Next(tiny_example().TinyConfig(num_layers=2))) is TinyMoEBinding
    with pytest.raises(BindingError, match="no registered binding trains a Linear .* pass binding="):
        binding_for(nn.Linear(2, 2))


def test_a_family_registered_first_overrides_the_built_in_one():
    class MyQwen3Moe(Qwen3MoeBinding):
        family = "my_qwen3_moe"

    register_binding(MyQwen3Moe, first=True)
    try:
        assert binding_for(build(tiny_config("qwen3_moe"))) is MyQwen3Moe
    finally:
        unregister_binding(MyQwen3Moe)
    assert binding_for(build(tiny_config("qwen3_moe"))) is Qwen3MoeBinding
    with pytest.raises(BindingError, match="has no 'family' name"):
        register_binding(type("Nameless", (ModelBinding,), {}))


def test_hf_parameters_keep_their_names_and_experts_are_sharded():
    model = build(tiny_config("qwen3_moe"))
    full = model.model.layers[1].mlp.experts.down_proj.detach().clone()
    Qwen3MoeBinding.shard_experts(model, 1, 2)
    assert torch.equal(model.model.layers[1].mlp.experts.down_proj, full[2:])
    b = Qwen3MoeBinding(model, ep=2, ep_rank=1)
    assert not b.has_shared_expert and b.num_experts == 4 and b.local_experts == 2 and b.top_k == 2
    assert list(b.layer_params("l1")) == ["mixer", "router", "expert_gemm"]
    assert [s.key for s in b.slots("l1", "router")] == ["model.layers.1.mlp.gate.weight"]
    assert {s.key for s in b.slots("head", "lm_head")} == {"model.norm.weight", "lm_head.weight"}
    names = dict(model.named_parameters())
    assert all(names[s.key] is s.param for op in b.layer_params("l1").values() for s in op)
    with pytest.raises(BindingError, match="no shared expert"):
        b.shared_fn("l1")


# ---------------------------------------------------------------- the model's own function


@pytest.mark.parametrize(("model_type", "settings"), CASES, ids=IDS)
def test_the_reference_trains_what_transformers_trains(model_type, settings):
    config = tiny_config(model_type, **settings)
    microbatches, seq_len, steps = 2, 8, 3
    want = transformers_losses(config, steps, 2, microbatches, seq_len)
    got = [float(t.mean()) for t in reference_losses(config, steps, microbatches, seq_len)]
    for step, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= 1e-5 * abs(w), f"step {step}: {g} vs transformers {w}"


def test_qwen3_moe_norm_topk_prob_is_the_models():
    """The router weights are the model's router's: unnormalised unless the config says otherwise."""
    for norm in (False, True):
        model = build(tiny_config("qwen3_moe", norm_topk_prob=norm))
        route = Qwen3MoeBinding(model).gate_fn("l0")
        weights, _, counts = route(torch.randn(1, 5, 64))
        sums = weights.sum(-1)
        assert torch.allclose(sums, torch.ones_like(sums)) == norm
        assert int(counts.sum()) == 5 * 2


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(("model_type", "settings", "message"), [
    ("qwen3_moe", {"output_router_logits": True}, "output_router_logits=True adds the load-balancing auxiliary loss"),
    ("mixtral", {"output_router_logits": True}, "set config.output_router_logits=False"),
    ("mixtral", {"router_jitter_noise": 0.1}, "router_jitter_noise=0.1"),
    ("qwen3_moe", {"mlp_only_layers": [1]}, r"layers \[1\] are dense MLP layers"),
    ("qwen3_moe", {"decoder_sparse_step": 2}, r"layers \[0, 2\] are dense MLP layers"),
    ("qwen3_moe", {"tie_word_embeddings": True}, "tie_word_embeddings=True"),
])
def test_what_the_binding_does_not_reproduce_is_refused(model_type, settings, message):
    model = build(tiny_config(model_type, **settings))
    with pytest.raises(BindingError, match=message):
        binding_for(model).check_model(model)


@pytest.fixture(scope="module")
def qwen3_plan() -> bytes:
    return compile_plan(tiny_config("qwen3_moe"))[0]


def test_start_refuses_an_unsupported_model_before_any_process_group(tmp_path, qwen3_plan):
    # One process, a plan for four: a model check after the groups would fail on the world size instead.
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with pytest.raises(BindingError, match="no registered binding trains a Sequential"):
            TrainingSession.start(qwen3_plan, nn.Sequential(nn.Linear(2, 2)), health=False)
        with pytest.raises(BindingError, match="output_router_logits"):
            TrainingSession.start(qwen3_plan, build(tiny_config("qwen3_moe", output_router_logits=True)), health=False)
    finally:
        dist.destroy_process_group()


def test_a_plan_compiled_from_a_config_json_loads_with_the_signature_of_the_model_in_memory(tmp_path):
    """``tessera-compile config.json`` and a capture of the trainer's model (on meta) agree on the signature."""
    from transformers import AutoModelForCausalLM

    from codegen.emit import plan_bytes
    from codegen.signature import plan_signature
    from tessera.api import capture, compile

    config = tiny_config("mixtral")
    path = tmp_path / "config.json"
    path.write_text(config.to_json_string())
    data = plan_bytes(compile(str(path), hardware="h100", **PARALLEL))
    info = load_plan(data, rank=0).plan
    assert info.model == "mixtral"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    module = capture(model, **PARALLEL)
    module.attrs["profile_mode"], module.attrs["hardware"] = info.cost_source, info.hardware
    load_plan(data, rank=0, signature=plan_signature(module))


# ---------------------------------------------------------------- under a plan, four ranks


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "settings"), CASES, ids=IDS)
def test_torchrun_pp2_ep2_matches_the_reference_bitwise_and_transformers(tmp_path, deterministic, model_type, settings):
    config = tiny_config(model_type, **settings)
    data, signature = compile_plan(config)
    (tmp_path / "plan.tsb").write_bytes(data)
    (tmp_path / "plan.sig").write_bytes(signature)
    steps, microbatches, seq_len = 3, PARALLEL["microbatches"], PARALLEL["seq_len"]
    args = ["--model-type", model_type, "--plan", str(tmp_path / "plan.tsb"), "--signature", str(tmp_path / "plan.sig"),
            "--expect-model", model_type, "--steps", str(steps), "--out", str(tmp_path / "out")]
    if "norm_topk_prob" in settings:
        args += ["--norm-topk-prob", str(settings["norm_topk_prob"]).lower()]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4", str(WORKER), *args]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [torch.load(tmp_path / "out" / f"losses{step}.pt") for step in range(steps)]
    for step, (got, want) in enumerate(zip(runs, reference_losses(config, steps, microbatches, seq_len))):
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"step {step}: {got} != reference {want}"
    for step, (got, want) in enumerate(zip(runs, transformers_losses(config, steps, 2, microbatches, seq_len))):
        assert abs(float(got.mean()) - want) <= 1e-5 * abs(want), f"step {step}: {float(got.mean())} vs transformers {want}"
