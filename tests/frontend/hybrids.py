"""Small hybrid decoder stacks written for the tests, with token mixers the frontend has never seen.

Every linear-attention block here uses the projection names of softmax attention (``q_proj``,
``k_proj``, ...) or names no recogniser knows, so only what the block *does* can tell them apart.
Sizes: hidden 32, 4 heads of 8; tests run them at 48 tokens (three chunks of 16).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

HIDDEN, HEADS, HEAD_DIM, CHUNK, VOCAB = 32, 4, 8, 16, 64
SEQ = 48


class RMSNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MLP(nn.Module):
    def __init__(self, hidden: int = HIDDEN, inner: int = 64):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _projections() -> tuple[nn.Linear, nn.Linear, nn.Linear, nn.Linear]:
    """Query, key and value projections (HIDDEN -> HEADS*HEAD_DIM) and an output projection."""
    q, k, v = (nn.Linear(HIDDEN, HEADS * HEAD_DIM, bias=False) for _ in range(3))
    return q, k, v, nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)


def _heads(x: torch.Tensor) -> torch.Tensor:
    """[B, S, H*D] -> [B, H, S, D]."""
    b, s, _ = x.shape
    return x.view(b, s, HEADS, HEAD_DIM).transpose(1, 2)


def _merge(x: torch.Tensor) -> torch.Tensor:
    """[B, H, S, D] -> [B, S, H*D]."""
    b, h, s, d = x.shape
    return x.transpose(1, 2).reshape(b, s, h * d)


class SoftmaxAttention(nn.Module):
    """Causal softmax attention written out by hand (no SDPA), under names no recogniser reads."""

    def __init__(self) -> None:
        super().__init__()
        self.to_q, self.to_k, self.to_v, self.to_out = _projections()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _heads(self.to_q(x)), _heads(self.to_k(x)), _heads(self.to_v(x))
        s = x.shape[1]
        scores = q @ k.transpose(-1, -2) / HEAD_DIM**0.5
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(causal, float("-inf")).softmax(dim=-1)
        return self.to_out(_merge(weights @ v))


class SdpaAttention(nn.Module):
    """Softmax attention through SDPA with the usual projection names."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, HEAD_DIM
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = _projections()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = _heads(self.q_proj(x)), _heads(self.k_proj(x)), _heads(self.v_proj(x))
        return self.o_proj(_merge(F.scaled_dot_product_attention(q, k, v, is_causal=True)))


class CumsumLinearAttention(nn.Module):
    """Kernelised linear attention by prefix sums: elu+1 feature map, running sums of k v^T and of k.

    Named like softmax attention (q/k/v/o projections, num_heads, head_dim).
    """

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, HEAD_DIM
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = _projections()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = F.elu(self.q_proj(x).view(b, s, HEADS, HEAD_DIM)) + 1
        k = F.elu(self.k_proj(x).view(b, s, HEADS, HEAD_DIM)) + 1
        v = self.v_proj(x).view(b, s, HEADS, HEAD_DIM)
        kv = torch.cumsum(torch.einsum("bshd,bshe->bshde", k, v), dim=1)
        normaliser = torch.cumsum(k, dim=1)
        numerator = torch.einsum("bshd,bshde->bshe", q, kv)
        denominator = torch.einsum("bshd,bshd->bsh", q, normaliser).unsqueeze(-1)
        return self.o_proj((numerator / denominator).reshape(b, s, -1))


class ChunkedDeltaRule(nn.Module):
    """The delta rule over chunks: each chunk corrects its values by the state's prediction, then updates it."""

    def __init__(self) -> None:
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = _projections()
        self.w_beta = nn.Linear(HIDDEN, HEADS, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, v = _heads(self.wq(x)), _heads(self.wv(x))
        k = F.normalize(_heads(self.wk(x)), dim=-1)
        beta = torch.sigmoid(self.w_beta(x)).transpose(1, 2).unsqueeze(-1)
        state = x.new_zeros(x.shape[0], HEADS, HEAD_DIM, HEAD_DIM)
        outputs = []
        for start in range(0, x.shape[1], CHUNK):
            qc, kc, vc, bc = (t[:, :, start:start + CHUNK] for t in (q, k, v, beta))
            corrected = (vc - kc @ state) * bc
            outputs.append(qc @ state + torch.tril(qc @ kc.transpose(-1, -2)) @ corrected)
            state = state + kc.transpose(-1, -2) @ corrected
        return self.wo(_merge(torch.cat(outputs, dim=2)))


class Retention(nn.Module):
    """Retention in its parallel form: query-key products weighted by a per-head decay mask, no softmax."""

    log_decay: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out_proj = _projections()
        self.register_buffer("log_decay", torch.log(1 - 2.0 ** (-5 - torch.arange(HEADS, dtype=torch.float32))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.shape[1]
        q, k, v = _heads(self.query(x)), _heads(self.key(x)), _heads(self.value(x))
        position = torch.arange(s, device=x.device, dtype=torch.float32)
        distance = position[:, None] - position[None, :]
        decay = torch.exp(self.log_decay[:, None, None] * distance).masked_fill(distance < 0, 0.0)
        return self.out_proj(_merge(((q @ k.transpose(-1, -2)) * decay) @ v))


class LightningBlock(nn.Module):
    """Lightning-attention style: fused qkv, blocks with a decayed intra-block product and a decayed kv state."""

    slope: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.num_attention_heads, self.head_dim = HEADS, HEAD_DIM
        self.qkv_proj = nn.Linear(HIDDEN, 3 * HEADS * HEAD_DIM, bias=False)
        self.out_proj = nn.Linear(HEADS * HEAD_DIM, HIDDEN, bias=False)
        self.register_buffer("slope", 2.0 ** (-1 - torch.arange(HEADS, dtype=torch.float32)).view(1, HEADS, 1, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (_heads(t) for t in F.silu(self.qkv_proj(x)).chunk(3, dim=-1))
        steps = torch.arange(CHUNK, device=x.device, dtype=torch.float32)
        query_decay = torch.exp(-self.slope * (steps[:, None] + 1))
        key_decay = torch.exp(-self.slope * (CHUNK - 1 - steps[:, None]))
        diagonal = torch.exp(-self.slope * (steps[:, None] - steps[None, :]).clamp(min=0))
        block_decay = torch.exp(-self.slope * CHUNK)
        kv = x.new_zeros(x.shape[0], HEADS, HEAD_DIM, HEAD_DIM)
        outputs = []
        for start in range(0, x.shape[1], CHUNK):
            qb, kb, vb = (t[:, :, start:start + CHUNK] for t in (q, k, v))
            intra = (qb @ kb.transpose(-1, -2) * diagonal).tril() @ vb
            outputs.append(intra + (qb * query_decay) @ kv)
            kv = kv * block_decay + (kb * key_decay).transpose(-1, -2) @ vb
        return self.out_proj(_merge(torch.cat(outputs, dim=2)))


class ShortConvMixer(nn.Module):
    """A gated short causal convolution: the only sequence mixing is a depthwise conv over 3 tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.in_proj = nn.Linear(HIDDEN, 3 * HIDDEN, bias=False)
        self.conv = nn.Conv1d(HIDDEN, HIDDEN, kernel_size=3, groups=HIDDEN, padding=2, bias=False)
        self.out_proj = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h = self.in_proj(x).transpose(1, 2).chunk(3, dim=1)
        mixed = self.conv(b * h)[..., : x.shape[1]]
        return self.out_proj((c * mixed).transpose(1, 2))


class PerTokenBlock(nn.Module):
    """Weights under unknown names that never mix positions: not a mixer, and no recogniser knows it."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(HIDDEN, HIDDEN, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.inner(x))


class DataDependentAttention(SdpaAttention):
    """Named like attention, but its forward reads tensor data first: it cannot run on meta tensors."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e4:  # a data-dependent guard
            x = x / x.abs().max()
        return super().forward(x)


class DataDependentMixer(SoftmaxAttention):
    """The same data-dependent guard under names no recogniser reads (it does say its head sizes)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = HEADS, HEAD_DIM

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max().item() > 1e4:
            x = x / x.abs().max()
        return super().forward(x)


class Layer(nn.Module):
    def __init__(self, mixer: nn.Module):
        super().__init__()
        self.norm1 = RMSNorm(HIDDEN)
        self.mixer = mixer
        self.norm2 = RMSNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Stack(nn.Module):
    """Embedding, one Layer per mixer, final norm, LM head; ``config`` is what a model's config would declare."""

    def __init__(self, mixers: list[nn.Module], config: Any = None):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Layer(m) for m in mixers)
        self.norm = RMSNorm(HIDDEN)
        self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class RotaryStack(Stack):
    """A stack whose forward branches on shapes, dtypes and ranks, as multimodal-rotary decoders do.

    It builds 4-row position ids (text, temporal, height, width), tests their rank and first
    dimension, unpacks a shape into a view, loops over a shape-derived count and checks a dtype.
    """

    inv_freq: torch.Tensor
    normaliser: torch.Tensor

    def __init__(self, mixers: list[nn.Module], config: Any = None):
        super().__init__(mixers, config)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, HIDDEN, 2, dtype=torch.float32) / HIDDEN))
        self.register_buffer("normaliser", torch.tensor(HIDDEN**0.5))

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed(input_ids)
        if position_ids is None:
            position_ids = torch.arange(x.shape[1], device=x.device).view(1, 1, -1).expand(4, x.shape[0], -1)
        elif position_ids.ndim == 2:
            position_ids = position_ids[None, ...].expand(4, position_ids.shape[0], -1)
        if position_ids.ndim == 3 and position_ids.shape[0] == 4:
            position_ids = position_ids[1:]
        if x.dtype != torch.float32:
            x = x.float()
        x = x * self.normaliser.type(x.dtype)  # a buffer cast to the activations' dtype
        batch, length, width = x.shape
        if len(x.shape) != 3:  # a rank test through len()
            raise ValueError("expected [batch, sequence, hidden]")
        angles = position_ids[0, :, :, None].float() * self.inv_freq
        x = x + torch.cat((angles.cos(), angles.sin()), dim=-1).view(batch, length, width)
        for group in range(x.shape[1] // SEQ):  # shape-derived trip count: one group of SEQ tokens
            x = x * (group + 1)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))


class VisionLanguage(nn.Module):
    """A deeper vision tower (with a small position table) beside a language model."""

    def __init__(self, mixers: list[nn.Module]):
        super().__init__()
        self.vision = nn.Module()
        self.vision.pos_embed = nn.Embedding(16, HIDDEN)
        self.vision.blocks = nn.ModuleList(MLP() for _ in range(len(mixers) + 4))
        self.language_model = Stack(mixers)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.language_model(input_ids)


class Declared:
    """A config that declares each layer's type, as hybrid families do."""

    def __init__(self, layer_types: list[str]):
        self.layer_types = layer_types
        self.num_hidden_layers = len(layer_types)


def build(*mixers: type[nn.Module], stack: type[Stack] = Stack, config: Any = None) -> Stack:
    with torch.device("meta"):
        return stack([m() for m in mixers], config)
