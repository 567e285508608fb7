"""Capture of real transformers MoE families (built on the meta device) into the IR."""

from __future__ import annotations

from collections import Counter

import pytest
from capture_cache import captured, hf_model

from tessera_ir import FfnKind, MixerKind
from tessera_ir.verifier import collect_errors


def _kinds(module):
    return [(layer.mixer, layer.ffn) for layer in module.decoder_layers()]


def _param_count(model) -> int:
    return sum(p.numel() for p in model.parameters())


def test_qwen3_next_layers_follow_the_traced_graph():
    module = captured("hf:qwen3_next")
    kinds = _kinds(module)
    assert len(kinds) == 48
    assert Counter(m for m, _ in kinds) == {MixerKind.LINEAR_ATTENTION: 36, MixerKind.ATTENTION: 12}
    assert all(f is FfnKind.MOE for _, f in kinds)
    # The capture never reads layer_types; it must agree with it anyway.
    config = hf_model("qwen3_next").config
    expected = [MixerKind.ATTENTION if t == "full_attention" else MixerKind.LINEAR_ATTENTION for t in config.layer_types]
    assert [m for m, _ in kinds] == expected
    assert module.attrs["parameters"] == _param_count(hf_model("qwen3_next"))
    assert (module.attrs["num_experts"], module.attrs["top_k"], module.attrs["hidden_size"]) == (512, 10, 2048)
    # hf:qwen3_next's defaults are the 80B workload: its suggested parallel settings apply.
    assert (module.attrs["pp"], module.attrs["vpp"], module.attrs["ep"]) == (8, 2, 32)
    assert collect_errors(module) == []


def test_qwen3_next_layer_has_shared_expert_chain():
    module = captured("hf:qwen3_next")
    layer = module.layers[1]
    names = [t.name for t in layer.tasks]
    assert names[:6] == ["l0.linear_attention.fwd", "l0.router.fwd", "l0.dispatch.fwd", "l0.expert_gemm.fwd",
                         "l0.combine.fwd", "l0.shared_expert.fwd"]
    assert layer.task("l0.linear_attention.fwd").deps == ["embed.embedding.fwd"]
    assert module.layers[2].task("l1.linear_attention.fwd").deps == ["l0.combine.fwd", "l0.shared_expert.fwd"]


def test_qwen3_moe_defaults():
    module = captured("hf:qwen3_moe")
    assert _kinds(module) == [(MixerKind.ATTENTION, FfnKind.MOE)] * 24
    assert module.attrs["parameters"] == _param_count(hf_model("qwen3_moe"))
    assert not any(t.op.value == "shared_expert" for t in module.tasks())


def test_deepseek_v3_mla_dense_prefix_and_shared_expert():
    module = captured("hf:deepseek_v3")
    kinds = _kinds(module)
    assert len(kinds) == 61
    assert all(m is MixerKind.MLA for m, _ in kinds)
    assert [f for _, f in kinds[:3]] == [FfnKind.DENSE] * 3
    assert [f for _, f in kinds[3:]] == [FfnKind.MOE] * 58
    assert module.attrs["parameters"] == _param_count(hf_model("deepseek_v3"))
    assert module.attrs["num_experts"] == 256 and module.attrs["top_k"] == 8
    layer = module.decoder_layers()[3]
    assert layer.task("l3.shared_expert.fwd").deps == ["l3.mla.fwd"]
    assert collect_errors(module) == []


def test_mixtral():
    module = captured("hf:mixtral")
    assert _kinds(module) == [(MixerKind.ATTENTION, FfnKind.MOE)] * 32
    assert module.attrs["parameters"] == _param_count(hf_model("mixtral"))
    assert module.attrs["num_experts"] == 8 and module.attrs["top_k"] == 2


@pytest.mark.parametrize(
    ("model_type", "expected"),
    [
        ("olmoe", {(MixerKind.ATTENTION, FfnKind.MOE): 16}),
        ("qwen2_moe", {(MixerKind.ATTENTION, FfnKind.MOE): 24}),
        ("jamba", {(MixerKind.SSM, FfnKind.MOE): 16, (MixerKind.SSM, FfnKind.DENSE): 12,
                   (MixerKind.ATTENTION, FfnKind.DENSE): 4}),
        ("mamba", {(MixerKind.SSM, FfnKind.NONE): 32}),
    ],
)
def test_other_families_need_no_special_case(model_type, expected):
    module = captured(f"hf:{model_type}")
    assert Counter(_kinds(module)) == expected
    assert module.attrs["parameters"] == _param_count(hf_model(model_type))
    assert collect_errors(module) == []


@pytest.mark.slow
def test_gpt_oss_sliding_attention():
    module = captured("hf:gpt_oss")
    mixers = [m for m, _ in _kinds(module)]
    assert mixers[:2] == [MixerKind.SLIDING_ATTENTION, MixerKind.ATTENTION]
    assert Counter(mixers) == {MixerKind.SLIDING_ATTENTION: 18, MixerKind.ATTENTION: 18}
    # A 128-token window costs less attention than the full causal context at 4096 tokens.
    sliding = module.decoder_layers()[0].tasks[0]
    full = module.decoder_layers()[1].tasks[0]
    assert sliding.flops < full.flops
