"""FLOP and byte formulas checked against hand computations."""

from __future__ import annotations

import pytest
import torch
from capture_cache import TINY, captured
from torch import nn

from frontend import capture, costs


class Mlp(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(torch.relu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.mlp = Mlp(hidden, inter)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class DenseOnly(nn.Module):
    """A model whose layers are GEMM-only (no mixer): every FLOP is a hand-countable GEMM."""

    def __init__(self, vocab=32, hidden=16, inter=40, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, inter) for _ in range(layers))
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(x)


def test_dense_block_flops_and_bytes_by_hand():
    with torch.device("meta"):
        model = DenseOnly()
    module = capture(model, overrides={"seq_len": 8, "micro_batch_size": 3, "tp": 2, "dtype": "fp32"})
    layer = module.decoder_layers()[0]
    assert (layer.mixer.value, layer.ffn.value) == ("none", "dense")
    fwd = layer.task("l0.dense_mlp.fwd")
    t, h, i, tp, d = 3 * 8, 16, 40, 2, 4
    # gate and up: T x (I/TP) x H each; down: T x H x (I/TP) with our output-dimension split -> T x (H/TP) x I.
    gemms = [(t, i // tp, h), (t, i // tp, h), (t, h // tp, i)]
    assert fwd.flops == sum(2 * m * n * k for m, n, k in gemms)
    assert layer.task("l0.dense_mlp.dgrad").flops == fwd.flops
    assert layer.task("l0.dense_mlp.wgrad").flops == fwd.flops
    assert fwd.bytes == d * sum(m * k + k * n + m * n for m, n, k in gemms)
    # Saved for backward: the norm's input and output (sequence-parallel shards, T/TP x H each), the
    # gate and up outputs (T x I/TP each) and the down projection's input (T x I/TP).
    assert fwd.act_bytes == d * (2 * (t // tp) * h + 2 * t * (i // tp) + t * (i // tp))
    # The layer's weights (MLP + its LayerNorm), split over TP.
    assert fwd.param_bytes == d * (-(-(3 * h * i) // tp) + 2 * h)
    assert fwd.shapes == [[3, 8, h], [3, 8, h]]
    assert layer.attrs["parameters"] == 3 * h * i + 2 * h


def test_dispatch_and_combine_bytes():
    module = captured(str(TINY), ep=4, tp=2, seq_len=64, micro_batch_size=2, dtype="bf16")
    tokens_per_rank = 2 * 64 // 2
    hidden, top_k, d, ep = 64, 2, 2, 4
    expected = tokens_per_rank * hidden * top_k * d * (ep - 1) // ep
    tasks = module.task_map()
    for name in ("l0.dispatch.fwd", "l0.combine.fwd", "l0.dispatch.dgrad", "l0.combine.dgrad"):
        assert tasks[name].bytes == expected
        assert tasks[name].flops == 0 and tasks[name].resource.value == "comm"
    assert tasks["l0.dispatch.fwd"].shapes == [[tokens_per_rank, hidden], [tokens_per_rank * top_k, hidden]]
    # Balanced routing: every rank runs tokens_per_rank * top_k rows through each per-expert weight.
    experts = tasks["l0.expert_gemm.fwd"]
    inter = 32
    assert experts.flops == 2 * tokens_per_rank * top_k * (2 * inter * hidden + hidden * inter)
    assert experts.param_bytes == (8 // ep) * 3 * inter * hidden * d
    # The grouped GEMMs read every local expert's weights; each local expert gets its share of the rows.
    rows = tokens_per_rank * top_k
    local = 8 // ep
    # fused gate/up: rows x H in, local x (2I x H) weights, rows x 2I out; down: rows x I in, local x (H x I), rows x H out.
    assert experts.bytes == d * (rows * hidden + local * 2 * inter * hidden + rows * 2 * inter
                                 + rows * inter + local * hidden * inter + rows * hidden)
    assert experts.attrs["rows_per_expert"] == rows * ep // 8
    assert tasks["l0.dispatch.fwd"].attrs["top_k"] == top_k


def test_single_rank_sends_nothing():
    assert costs.all_to_all_bytes(100, 64, 2, 2, 1) == 0


@pytest.mark.parametrize(("seq", "window", "pairs"), [(4, None, 10), (4, 2, 7), (4, 8, 10), (1, None, 1)])
def test_causal_pairs(seq, window, pairs):
    assert costs.causal_pairs(seq, window) == pairs


def test_attention_core_by_hand():
    work = costs.attention_core(batch=2, seq=4, heads=8, d_qk=16, d_v=8, window=None, tp=2)
    assert work.fwd_flops == 2 * 2 * 4 * 10 * (16 + 8)
    # Flash attention's backward recomputes the scores: 5 matrix products against the forward's 2.
    assert work.dgrad_flops == 5 * work.fwd_flops // 2 and work.wgrad_flops == 0
    # Saved: Q (8/2 heads x 16), K and V (per key-value head, here all 8/2) and fp32 softmax statistics.
    assert work.saved == 2 * 4 * (4 * 16 + 4 * (16 + 8)) + 2 * 4 * 4 * 2
    # Context parallelism: each of cp ranks computes an equal share of the pairs on its share of the tokens.
    cp2 = costs.attention_core(batch=2, seq=4, heads=8, d_qk=16, d_v=8, window=None, tp=2, cp=2)
    assert cp2.core_flops * 2 == work.core_flops and cp2.saved * 2 == work.saved


def test_delta_rule_chunks_round_up():
    one = costs.delta_rule_core(1, 64, 1, 16, 16, chunk=64)
    two = costs.delta_rule_core(1, 65, 1, 16, 16, chunk=64)
    assert two.core_flops == 2 * one.core_flops
    c, dk, dv = 64, 16, 16
    assert one.core_flops == 2 * c * c * (3 * dk + 2 * dv) + 2 * c**3 // 3 + 6 * c * dk * dv


def test_tensor_parallel_divides_mixer_work():
    one = captured(str(TINY), tp=1, seq_len=64)
    two = captured(str(TINY), tp=2, seq_len=64)
    a1 = one.task_map()["l3.attention.fwd"].flops
    a2 = two.task_map()["l3.attention.fwd"].flops
    assert a2 * 2 == pytest.approx(a1, rel=0.01)


class ListMoe(nn.Module):
    """MoE with a ModuleList of expert MLPs (longer than the decoder stack) and a separate router."""

    def __init__(self, hidden: int, inter: int, experts: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.router = nn.Linear(hidden, experts, bias=False)
        self.experts = nn.ModuleList(Mlp(hidden, inter) for _ in range(experts))

    def forward(self, x):
        weights, index = torch.topk(self.router(x).softmax(-1), self.top_k)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):  # data-dependent: only ever run, never traced
            mask = (index == e).any(-1, keepdim=True)
            out = out + mask * expert(x)
        return out


class ListMoeModel(nn.Module):
    def __init__(self, layers=2, hidden=16, inter=24, experts=8, top_k=2):
        super().__init__()
        self.embed = nn.Embedding(50, hidden)
        self.layers = nn.ModuleList(ListMoe(hidden, inter, experts, top_k) for _ in range(layers))

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = x + layer(x)
        return x


def test_modulelist_experts_and_outermost_stack():
    with torch.device("meta"):
        model = ListMoeModel()
    module = capture(model, overrides={"seq_len": 10, "ep": 4})
    assert [layer.ffn.value for layer in module.decoder_layers()] == ["moe", "moe"]
    assert module.attrs["num_experts"] == 8 and module.attrs["top_k"] == 2
    experts = module.task_map()["l0.expert_gemm.fwd"]
    assert experts.flops == 2 * 10 * 2 * (3 * 16 * 24)
    assert experts.param_bytes == 2 * (8 // 4) * 3 * 16 * 24


def test_mixer_tasks_record_their_core_share():
    module = captured(str(TINY), seq_len=64)
    tasks = module.task_map()
    attention = tasks["l3.attention.fwd"]
    core = attention.attrs["core_flops"]
    assert 0 < core < attention.flops  # projections are the rest
    dgrad = tasks["l3.attention.dgrad"]
    # dgrad: the same projection GEMMs plus 2.5x the core.
    assert dgrad.attrs["core_flops"] == 5 * core // 2
    assert dgrad.flops - dgrad.attrs["core_flops"] == attention.flops - core
    assert "core_flops" not in tasks["l3.attention.wgrad"].attrs
    assert tasks["l0.linear_attention.fwd"].attrs["core_flops"] > 0


def test_selective_recomputation_trades_activations_for_backward_work():
    plain = captured(str(TINY), seq_len=64).task_map()
    again = captured(str(TINY), seq_len=64, recompute=("layernorm", "moe_act")).task_map()
    t, h = 64, 64
    # layernorm drops each norm's output (T x H): once in the mixer, once in the router.
    assert plain["l3.attention.fwd"].act_bytes - again["l3.attention.fwd"].act_bytes == t * h * 4
    assert plain["l3.router.fwd"].act_bytes - again["l3.router.fwd"].act_bytes == t * h * 4
    # moe_act drops the experts' activation output: rows x intermediate.
    rows, inter = t * 2, 32
    assert plain["l3.expert_gemm.fwd"].act_bytes - again["l3.expert_gemm.fwd"].act_bytes == rows * inter * 4
    moe = captured(str(TINY), seq_len=64, recompute=("moe",)).task_map()
    # moe recomputation keeps nothing inside the block and reruns its forward in the backward,
    # both All-to-Alls included (on combine.dgrad).
    assert moe["l3.expert_gemm.fwd"].act_bytes == 0 and moe["l3.shared_expert.fwd"].act_bytes == 0
    assert moe["l3.expert_gemm.dgrad"].flops == plain["l3.expert_gemm.dgrad"].flops + plain["l3.expert_gemm.fwd"].flops
    assert moe["l3.combine.dgrad"].bytes == 3 * plain["l3.combine.dgrad"].bytes


def test_context_parallelism_splits_the_tokens():
    # 256 tokens: every context-parallel rank still holds whole 64-token delta-rule chunks.
    one = captured(str(TINY), seq_len=256).task_map()
    two = captured(str(TINY), seq_len=256, cp=2).task_map()
    for name in ("l0.linear_attention.fwd", "l3.attention.fwd", "l3.expert_gemm.fwd", "l3.shared_expert.fwd"):
        assert two[name].flops * 2 == pytest.approx(one[name].flops, rel=0.02), name
    assert two["l3.dispatch.fwd"].bytes * 2 == one["l3.dispatch.fwd"].bytes
