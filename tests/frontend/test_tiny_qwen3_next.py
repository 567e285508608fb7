"""The tiny Qwen3-Next example: capture, golden IR, task contract, and real CPU training."""

from __future__ import annotations

import pytest
import torch
import torch.fx
from capture_cache import ROOT, TINY, captured, tiny_example

from tessera_ir import FfnKind, MixerKind, Phase, print_module
from tessera_ir.kinds import WEIGHTED_OPS
from tessera_ir.verifier import collect_errors

from golden import check_golden

GOLDEN = ROOT / "tests" / "frontend" / "golden" / "tiny_qwen3_next.tir"


def test_layer_kinds_and_header():
    module = captured(str(TINY))
    kinds = [(layer.mixer, layer.ffn) for layer in module.decoder_layers()]
    pattern = [MixerKind.LINEAR_ATTENTION] * 3 + [MixerKind.ATTENTION]
    assert kinds == [(m, FfnKind.MOE) for m in pattern * 2]
    tiny = tiny_example()
    assert module.name == "tiny_qwen3_next" and module.attrs["model"] == tiny.NAME
    for key, value in tiny.PARALLEL.items():
        assert module.attrs[key] == value
    assert module.attrs["parameters"] == sum(p.numel() for p in tiny.build_model().parameters())
    assert collect_errors(module) == []


def test_golden_ir():
    check_golden(GOLDEN, print_module(captured(str(TINY))))


def test_backward_mirrors_forward_in_reverse():
    module = captured(str(TINY))
    tasks = module.task_map()
    last = module.decoder_layers()[-1].name
    assert tasks[f"{last}.combine.dgrad"].deps == ["head.lm_head.dgrad"]
    assert tasks[f"{last}.shared_expert.dgrad"].deps == ["head.lm_head.dgrad"]
    assert tasks["l6.combine.dgrad"].deps == ["l7.attention.dgrad"]
    assert tasks["l0.expert_gemm.dgrad"].deps == ["l0.combine.dgrad"]
    assert tasks["l0.dispatch.dgrad"].deps == ["l0.expert_gemm.dgrad"]
    assert tasks["l0.router.dgrad"].deps == ["l0.dispatch.dgrad"]
    assert tasks["l0.linear_attention.dgrad"].deps == ["l0.router.dgrad", "l0.shared_expert.dgrad"]
    assert tasks["embed.embedding.wgrad"].deps == ["l0.linear_attention.dgrad"]
    assert tasks["head.lm_head.fwd"].deps == [f"{last}.combine.fwd", f"{last}.shared_expert.fwd"]
    for task in module.tasks():
        if task.phase is Phase.WGRAD:
            assert task.op in WEIGHTED_OPS and task.movable
            assert task.name.startswith("embed.") or task.deps == [task.name.replace(".wgrad", ".dgrad")]
            assert task.param_bytes == 0
        else:
            assert not task.movable
    assert not any(t.name == "embed.embedding.dgrad" for t in module.tasks())


def test_moe_block_traces_with_wrapped_dispatch_and_combine():
    tiny = tiny_example()
    block = tiny.build_model().layers[0].moe
    graph = torch.fx.symbolic_trace(block).graph
    called = {getattr(n.target, "__name__", str(n.target)) for n in graph.nodes if n.op == "call_function"}
    assert {"moe_dispatch", "grouped_swiglu", "moe_combine"} <= called


def test_tiny_model_trains_on_cpu():
    tiny = tiny_example()
    torch.manual_seed(0)
    # One linear-attention and one attention layer: both mixers and the MoE path train.
    model = tiny.TinyQwen3Next(tiny.TinyConfig(num_layers=2, full_attention_interval=2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, model.config.vocab_size, (2, 13))
    losses = []
    threads = torch.get_num_threads()
    # Tiny per-token ops: one thread is several times faster than two contending ones.
    torch.set_num_threads(1)
    try:
        for _ in range(20):
            loss = model(ids[:, :-1], labels=ids[:, 1:])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("layer", [0, 3])
def test_gradients_reach_every_weight(layer):
    tiny = tiny_example()
    model = tiny.TinyQwen3Next(tiny.TinyConfig(num_layers=4))
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    model(ids[:, :-1], labels=ids[:, 1:]).backward()
    missing = [n for n, p in model.layers[layer].named_parameters() if p.grad is None]
    assert missing == []
