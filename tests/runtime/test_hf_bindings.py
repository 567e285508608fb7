"""Bindings of transformers' MoE families: the registry, the model's own function, refusals, torchrun.

Families: Qwen3-MoE, Mixtral, Qwen3-Next, DeepSeek-V3, Qwen2-MoE, OLMoE,
GLM-4-MoE, MiniMax-M2, ERNIE-4.5-MoE. The one-process reference
(``runtime.local_reference``) runs every task forward of the binding on two EP
replicas; it must train what ``model(input_ids, labels=...)`` trains, including
Qwen3-MoE's unnormalised top-k weights (``norm_topk_prob=False``, its default),
dense layers and each family's own router. Under a PP=2 x EP=2 plan on four
gloo ranks the losses must be bitwise those of the reference in the
deterministic CPU mode (one slow torchrun test per family).
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
from hf_training import LR, PARALLEL, build, compile_plan, make_batch, optimizer, tiny_config
from torch import nn

from runtime import load_plan
from runtime.bindings import (
    BindingError,
    DeepseekV3Binding,
    Ernie45MoeBinding,
    Glm4MoeBinding,
    MiniMaxM2Binding,
    MixtralBinding,
    ModelBinding,
    OlmoeBinding,
    Qwen2MoeBinding,
    Qwen3MoeBinding,
    Qwen3NextBinding,
    Routing,
    TinyMoEBinding,
    binding_for,
    register_binding,
    registered_bindings,
    unregister_binding,
)
from runtime.layout import StageLayout
from runtime.local_reference import LocalReference
from runtime.session import TrainingSession

from tiny_plan import tiny_example

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "hf_training.py"
CASES: list[tuple[str, dict[str, object]]] = [("qwen3_moe", {"norm_topk_prob": False}), ("qwen3_moe", {"norm_topk_prob": True}), ("mixtral", {}), ("qwen3_next", {}),
         ("deepseek_v3", {}), ("qwen2_moe", {}), ("olmoe", {}), ("glm4_moe", {}), ("minimax_m2", {}), ("ernie4_5_moe", {})]
IDS = ["qwen3_moe-unnormalised", "qwen3_moe-normalised", "mixtral", "qwen3_next", "deepseek_v3", "qwen2_moe", "olmoe", "glm4_moe",
       "minimax_m2", "ernie4_5_moe"]
# Families whose dense MLP layers are set by config options (DeepSeek-V3, GLM-4-MoE and ERNIE have theirs in CASES).
DENSE_VARIANTS: list[tuple[str, dict[str, object]]] = [("qwen3_moe", {"mlp_only_layers": [1]}), ("qwen3_moe", {"decoder_sparse_step": 2}),
                  ("qwen3_next", {"mlp_only_layers": [0, 3]}), ("qwen2_moe", {"mlp_only_layers": [2]})]
DENSE_IDS = [f"{t}-dense-{'-'.join(f'{k}{v}' for k, v in s.items())}" for t, s in DENSE_VARIANTS]


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
    assert binding_for(build(tiny_config("qwen3_next"))) is Qwen3NextBinding
    assert binding_for(build(tiny_config("deepseek_v3"))) is DeepseekV3Binding
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


@pytest.mark.parametrize(("model_type", "settings"), CASES + DENSE_VARIANTS, ids=IDS + DENSE_IDS)
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
    ("qwen3_moe", {"tie_word_embeddings": True}, "tie_word_embeddings=True"),
    ("qwen3_next", {"output_router_logits": True}, "output_router_logits=True adds the load-balancing auxiliary loss"),
    ("qwen3_next", {"tie_word_embeddings": True}, "tie_word_embeddings=True"),
    ("deepseek_v3", {"tie_word_embeddings": True}, "tie_word_embeddings=True"),
    ("deepseek_v3", {"attention_dropout": 0.1}, "attention_dropout=0.1"),
    ("olmoe", {"output_router_logits": True}, "output_router_logits=True"),
    ("minimax_m2", {"router_jitter_noise": 0.2}, "MiniMaxM2ForCausalLM: config.router_jitter_noise=0.2"),
    ("glm4_moe", {"tie_word_embeddings": True}, "tie_word_embeddings=True"),
    ("ernie4_5_moe", {"output_router_logits": True}, "output_router_logits=True"),
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


def decoder_layer_through_tasks(b: ModelBinding, layer: str, x: torch.Tensor) -> torch.Tensor:
    """Decoder layer ``layer`` on ``x`` by the binding's task forwards, in one process (EP=1)."""
    h, n = b.mixer_fn(layer)(x)
    if b.is_dense(layer):
        return b.dense_fn(layer)(h, n)[0]
    weights, order, counts = b.gate_fn(layer)(n)
    index, inverse, per_expert = Routing(((*(int(c) for c in counts),),), 1, 0).regroup()
    (permuted,) = b.permute_fn()(n, order)
    (expert_out,) = b.experts_fn(layer)(permuted, index, inverse, per_expert)
    shared = (b.shared_fn(layer)(n)[0],) if b.has_shared_expert else ()
    return b.assemble_fn()(h, expert_out, weights, *shared, order)[0]


def models_decoder_layer(model: Any, i: int, x: torch.Tensor) -> torch.Tensor:
    """The model's own decoder layer ``i`` on ``x``, called as its decoder stack calls it for a full causal sequence."""
    from transformers.masking_utils import create_causal_mask

    position_ids = torch.arange(x.shape[1]).unsqueeze(0)
    mask = create_causal_mask(config=model.config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids)
    block = model.model.layers[i]
    linear = getattr(block, "block_type", None) == "linear_attention"
    out = block(x, position_embeddings=model.model.rotary_emb(x, position_ids), attention_mask=None if linear else mask,
                position_ids=position_ids)
    return out[0] if isinstance(out, tuple) else out


def test_qwen3_next_binds_each_layer_type_and_the_gated_shared_expert():
    model = build(tiny_config("qwen3_next"))
    b = Qwen3NextBinding(model)
    assert b.has_shared_expert and b.num_experts == 4 and b.top_k == 2
    assert b.decoder("l0").mixer is model.model.layers[0].linear_attn
    assert b.decoder("l1").mixer is model.model.layers[1].self_attn
    assert list(b.layer_params("l0")) == ["mixer", "router", "expert_gemm", "shared_expert"]
    assert {s.key for s in b.slots("l0", "shared_expert")} == {
        "model.layers.0.mlp.shared_expert_gate.weight", *(f"model.layers.0.mlp.shared_expert.{p}_proj.weight" for p in ("gate", "up", "down"))
    }
    x = torch.randn(1, 6, 64)
    for i in range(2):
        got, want = decoder_layer_through_tasks(b, f"l{i}", x), models_decoder_layer(model, i, x)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), f"layer {i}: {(got - want).abs().max()}"


def test_deepseek_v3_binds_dense_layers_mla_grouped_routing_and_ungated_shared_experts():
    model = build(tiny_config("deepseek_v3"))
    full = model.model.layers[1].mlp.experts.gate_up_proj.detach().clone()
    DeepseekV3Binding.shard_experts(model, 1, 2)  # the dense layer 0 has no experts to shard
    assert torch.equal(model.model.layers[1].mlp.experts.gate_up_proj, full[2:])
    b = DeepseekV3Binding(model, ep=2, ep_rank=1)
    assert b.is_dense("l0") and not b.is_dense("l1") and b.num_layers == 4 and b.num_experts == 4 and b.has_shared_expert
    assert list(b.layer_params("l0")) == ["mixer", "dense_mlp"]
    assert {s.key for s in b.slots("l0", "dense_mlp")} == {f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert {s.key for s in b.slots("l1", "shared_expert")} == {f"model.layers.1.mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert [s.key for s in b.slots("l1", "router")] == ["model.layers.1.mlp.gate.weight"]  # the bias is a buffer, not trained
    with pytest.raises(BindingError, match="layer l0 of the model is a dense MLP layer"):
        b.gate_fn("l0")
    with pytest.raises(BindingError, match="layer l1 of the model is a sparse MoE layer"):
        b.dense_fn("l1")
    assert DeepseekV3Binding.describe_layer(model, 0, model.model.layers[0]) == ("mla", "dense")
    assert DeepseekV3Binding.describe_layer(model, 1, model.model.layers[1]) == ("mla", "moe+shared")


def test_deepseek_v3_layers_through_the_tasks_are_the_models_and_the_router_is_its_own():
    model = build(tiny_config("deepseek_v3"))
    router = model.model.layers[1].mlp.gate
    with torch.no_grad():  # a bias that changes the choice of experts (not their weights): the model's router applies it
        router.e_score_correction_bias.copy_(torch.tensor([0.0, 0.5, -0.5, 0.25]))
    b = DeepseekV3Binding(model)
    x = torch.randn(1, 6, 64)
    for i in range(2):
        got, want = decoder_layer_through_tasks(b, f"l{i}", x), models_decoder_layer(model, i, x)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), f"layer {i}: {(got - want).abs().max()}"
    n = torch.randn(1, 6, 64)
    weights, _, counts = b.gate_fn("l1")(n)
    _, want_weights, want_index = router(n.reshape(-1, 64))
    assert torch.equal(weights, want_weights) and torch.equal(counts, torch.bincount(want_index.reshape(-1), minlength=4))
    # norm_topk_prob (the config's default) then routed_scaling_factor: each token's weights sum to the factor.
    assert torch.allclose(weights.sum(-1), torch.full((6,), 2.5))


@pytest.mark.parametrize(("model_type", "settings", "dense"), [("deepseek_v3", {}, "l0"), ("qwen3_moe", {"mlp_only_layers": [2]}, "l2")],
                         ids=["deepseek_v3", "qwen3_moe-mlp_only_layers"])
def test_one_rank_trains_dense_and_sparse_layers_like_the_reference(tmp_path, deterministic, model_type, settings, dense):
    """The executor's dense-MLP tasks (forward, dgrad, wgrad) in one process: bitwise the reference, close to transformers."""
    from runtime.executor import StageExecutor, create_groups
    from runtime.layout import RankGrid
    from runtime.session import load_programs

    config = tiny_config(model_type, **settings)
    data, signature = compile_plan(config, pp=1, ep=1)
    seq_len, microbatches, steps = PARALLEL["seq_len"], PARALLEL["microbatches"], 2
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        session = TrainingSession.start(data, build(config), signature=signature, health=False)
        assert {t.kind for t in session.executor.tasks if t.layer == dense} >= {"dense_mlp.fwd", "dense_mlp.dgrad", "dense_mlp.wgrad"}
        opt = optimizer(session.parameters())
        ref = LocalReference(lambda: build(config), ep=1, microbatches=microbatches, optimizer=optimizer)
        want = transformers_losses(config, steps, 1, microbatches, seq_len)
        for step in range(steps):
            ids = make_batch(step, 1, microbatches, seq_len)
            got = torch.stack(session.step(ids[0, ..., :-1], ids[0, ..., 1:], labels_shifted=True).loss_tensors[0])
            expected = torch.stack(ref.step(ids[..., :-1], ids[..., 1:])[0])
            assert torch.equal(got, expected), f"step {step}: {got} != reference {expected}"
            assert abs(float(got.mean()) - want[step]) <= 1e-5 * abs(want[step])
            opt.step()
            opt.zero_grad(set_to_none=True)
            ref.optimizer_step()

        if model_type != "deepseek_v3":
            return
        # A plan whose layer 1 is sparse, a model whose layer 1 is dense: the executor names the task and the layer.
        deeper_dense = build(tiny_config("deepseek_v3", first_k_dense_replace=2))
        programs = load_programs(data, signature, {})
        with pytest.raises(BindingError, match=r"plan task 'l1\.\w+\.\w+' is a MoE layer's, but layer l1 of the model is a dense MLP"):
            StageExecutor(programs[0], StageLayout.from_programs(programs), DeepseekV3Binding(deeper_dense),
                          create_groups(RankGrid(1, 1, 1), 0))
    finally:
        dist.destroy_process_group()


FAMILIES = {
    "qwen3_moe": Qwen3MoeBinding, "mixtral": MixtralBinding, "qwen3_next": Qwen3NextBinding, "deepseek_v3": DeepseekV3Binding,
    "qwen2_moe": Qwen2MoeBinding, "olmoe": OlmoeBinding, "glm4_moe": Glm4MoeBinding, "minimax_m2": MiniMaxM2Binding,
    "ernie4_5_moe": Ernie45MoeBinding,
}


@pytest.mark.parametrize(("model_type", "settings"), [(t, dict[str, object]()) for t in sorted(FAMILIES)] + DENSE_VARIANTS,
                         ids=sorted(FAMILIES) + DENSE_IDS)
def test_every_decoder_layer_through_the_tasks_is_the_models_own(model_type, settings):
    """Each family's binding picks its model and computes each decoder layer (dense or sparse) as the model does."""
    model = build(tiny_config(model_type, **settings))
    assert binding_for(model) is FAMILIES[model_type]
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():  # routing-choice corrections that change which experts are chosen: the model's own are used
        for name, t in [*model.named_parameters(), *model.named_buffers()]:
            if "e_score_correction_bias" in name:
                t.copy_(0.5 * torch.randn(t.shape, generator=g))
    b = binding_for(model)(model)
    x = torch.randn(1, 6, 64, generator=g)
    for i in range(b.num_layers):
        got, want = decoder_layer_through_tasks(b, f"l{i}", x), models_decoder_layer(model, i, x)
        assert torch.allclose(got, want, atol=1e-6, rtol=1e-5), f"layer {i}: {(got - want).abs().max()}"


def test_a_family_the_compiler_plans_but_no_binding_trains_is_refused_by_name():
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gpt_oss", num_hidden_layers=2, hidden_size=64, vocab_size=128, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                                  intermediate_size=32, tie_word_embeddings=False)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(BindingError, match=r"no registered binding trains a GptOssForCausalLM \(model type 'gpt_oss'"):
        binding_for(model)


def test_a_frozen_parameter_is_not_trained():
    """ERNIE-4.5's moe_statics bias is a parameter with requires_grad=False: no task trains it, no optimizer decays it."""
    config = tiny_config("ernie4_5_moe")

    def biased() -> nn.Module:
        model = build(config)
        with torch.no_grad():
            for name, t in model.named_parameters():
                if "e_score_correction_bias" in name:
                    assert not t.requires_grad
                    t.fill_(0.25)
        return model

    b = Ernie45MoeBinding(biased())
    assert [s.key for s in b.slots("l1", "router")] == ["model.layers.1.mlp.gate.weight"]
    ref = LocalReference(biased, ep=2, microbatches=2, optimizer=lambda ps: torch.optim.AdamW(ps, lr=LR, weight_decay=0.1))
    ids = make_batch(0, ref.shards, 2, 8)
    ref.step(ids[..., :-1], ids[..., 1:])
    ref.optimizer_step()
    bias = ref.replicas[0].model.layers[1].mlp.gate.moe_statics.e_score_correction_bias
    assert bias.grad is None and torch.equal(bias, torch.full_like(bias, 0.25))
