"""A tiny Qwen3-Next-like model that really trains on a CPU.

Same layer kinds as Qwen3-Next: three Gated DeltaNet (linear attention) layers
for every softmax-attention layer, and a sparse MoE block (router, routed
experts, a gated shared expert) after every mixer. Small enough to run
forward and backward in milliseconds; later work drives it with the
pipeline runtime.

    tessera-compile examples/tiny_qwen3_next.py --emit ir

The MoE block routes through module-level ``torch.fx.wrap`` functions
(``moe_dispatch``, ``grouped_swiglu``, ``moe_combine``): their data-dependent
sorting and per-expert loops stay opaque to torch.fx, so the block itself
traces cleanly, and the runtime can bind those calls to All-to-All.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

NAME = "tiny_qwen3_next"
PARALLEL = {"pp": 2, "vpp": 2, "ep": 2, "microbatches": 4, "seq_len": 128, "micro_batch_size": 1, "dtype": "fp32"}


@dataclass
class TinyConfig:
    vocab_size: int = 256
    hidden_size: int = 64
    num_layers: int = 8
    full_attention_interval: int = 4  # every 4th layer is softmax attention, the others linear attention
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 16
    linear_num_heads: int = 4
    linear_head_dim: int = 16
    conv_kernel: int = 4
    num_experts: int = 8
    top_k: int = 2
    moe_intermediate_size: int = 32
    shared_expert_intermediate_size: int = 32
    eps: float = 1e-6


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal grouped-query softmax attention."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.num_key_value_heads, self.head_dim).transpose(1, 2)
        groups = self.num_heads // self.num_key_value_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, -1))


class GatedDeltaNet(nn.Module):
    """Gated delta rule linear attention, as a plain recurrence over time.

    Per head, with state S (d_v x d_k), decay a_t in (0, 1) and write strength b_t:
    S_t = a_t * S_{t-1} + b_t * (v_t - a_t * S_{t-1} k_t) k_t^T, output o_t = S_t q_t,
    then a gated RMS norm and the output projection. q, k, v pass a causal
    depthwise conv first, as in Qwen3-Next.
    """

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        h, d = cfg.linear_num_heads, cfg.linear_head_dim
        self.num_k_heads = self.num_v_heads = h
        self.head_k_dim = self.head_v_dim = d
        self.conv_dim = 3 * h * d
        self.in_proj_qkvz = nn.Linear(cfg.hidden_size, 4 * h * d, bias=False)
        self.in_proj_ba = nn.Linear(cfg.hidden_size, 2 * h, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim,
                                padding=cfg.conv_kernel - 1, bias=False)
        self.A_log = nn.Parameter(torch.zeros(h))
        self.dt_bias = nn.Parameter(torch.ones(h))
        self.norm = RMSNorm(d, cfg.eps)
        self.out_proj = nn.Linear(h * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        h, d = self.num_v_heads, self.head_v_dim
        qkv, z = self.in_proj_qkvz(x).split([self.conv_dim, h * d], dim=-1)
        qkv = F.silu(self.conv1d(qkv.transpose(1, 2))[..., :s]).transpose(1, 2)
        q, k, v = (t.reshape(b, s, h, d) for t in qkv.split(h * d, dim=-1))
        q, k = F.normalize(q, dim=-1) * d**-0.5, F.normalize(k, dim=-1)
        beta_logits, a_logits = self.in_proj_ba(x).split(h, dim=-1)
        beta = torch.sigmoid(beta_logits)  # [b, s, h]
        decay = torch.exp(-self.A_log.exp() * F.softplus(a_logits + self.dt_bias))  # [b, s, h]
        state = x.new_zeros(b, h, d, d)
        outputs = []
        for t in range(s):
            state = state * decay[:, t, :, None, None]
            recalled = torch.einsum("bhvk,bhk->bhv", state, k[:, t])
            delta = (v[:, t] - recalled) * beta[:, t, :, None]
            state = state + torch.einsum("bhv,bhk->bhvk", delta, k[:, t])
            outputs.append(torch.einsum("bhvk,bhk->bhv", state, q[:, t]))
        out = torch.stack(outputs, dim=1)  # [b, s, h, d]
        out = self.norm(out) * F.silu(z.reshape(b, s, h, d))
        return self.out_proj(out.reshape(b, s, h * d))


@torch.fx.wrap
def moe_dispatch(tokens: torch.Tensor, expert_index: torch.Tensor, num_experts: int):
    """Sort the (token, choice) slots by expert: the tokens each expert receives, contiguous.

    Returns the permuted tokens, the slot order (to undo it) and tokens per expert.
    """
    top_k = expert_index.shape[-1]
    flat = expert_index.reshape(-1)
    order = torch.argsort(flat, stable=True)
    permuted = tokens[order // top_k]
    counts = torch.bincount(flat, minlength=num_experts)
    return permuted, order, counts


@torch.fx.wrap
def grouped_swiglu(permuted: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor,
                   down: torch.Tensor) -> torch.Tensor:
    """Each expert's SwiGLU MLP on its contiguous run of tokens."""
    outputs = []
    start = 0
    for expert, count in enumerate(counts.tolist()):
        chunk = permuted[start:start + count]
        gate, up = (chunk @ gate_up[expert].t()).chunk(2, dim=-1)
        outputs.append((F.silu(gate) * up) @ down[expert].t())
        start += count
    return torch.cat(outputs, dim=0)


@torch.fx.wrap
def moe_combine(expert_out: torch.Tensor, order: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Undo the dispatch permutation and sum each token's top-k expert outputs by router weight."""
    slots = torch.empty_like(expert_out)
    slots[order] = expert_out
    num_tokens, top_k = weights.shape
    return (slots.view(num_tokens, top_k, -1) * weights.unsqueeze(-1)).sum(dim=1)


class Experts(nn.Module):
    def __init__(self, cfg: TinyConfig):
        super().__init__()
        e, i, hdim = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
        self.num_experts = e
        self.gate_up_proj = nn.Parameter(torch.randn(e, 2 * i, hdim) * hdim**-0.5)
        self.down_proj = nn.Parameter(torch.randn(e, hdim, i) * i**-0.5)

    def forward(self, permuted: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        return grouped_swiglu(permuted, counts, self.gate_up_proj, self.down_proj)


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoe(nn.Module):
    """Top-k routed experts plus a sigmoid-gated shared expert."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.top_k = cfg.top_k
        self.num_experts = cfg.num_experts
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg)
        self.shared_expert = MLP(cfg.hidden_size, cfg.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(cfg.hidden_size, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        probs = F.softmax(self.gate(tokens), dim=-1)
        weights, expert_index = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        permuted, order, counts = moe_dispatch(tokens, expert_index, self.num_experts)
        routed = moe_combine(self.experts(permuted, counts), order, weights)
        shared = torch.sigmoid(self.shared_expert_gate(tokens)) * self.shared_expert(tokens)
        return (routed + shared).reshape(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TinyConfig, layer_type: str):
        super().__init__()
        self.layer_type = layer_type
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.mixer = Attention(cfg) if layer_type == "full_attention" else GatedDeltaNet(cfg)
        self.post_mixer_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.moe = SparseMoe(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.input_norm(x))
        return x + self.moe(self.post_mixer_norm(x))


class TinyQwen3Next(nn.Module):
    def __init__(self, cfg: TinyConfig | None = None):
        super().__init__()
        cfg = cfg or TinyConfig()
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, "full_attention" if (i + 1) % cfg.full_attention_interval == 0 else "linear_attention")
            for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def build_model() -> nn.Module:
    torch.manual_seed(0)
    return TinyQwen3Next(TinyConfig())


if __name__ == "__main__":
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(0, TinyConfig().vocab_size, (4, 33))
    for step in range(20):
        loss = model(ids[:, :-1], labels=ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step:2d} loss {loss.item():.4f}")
