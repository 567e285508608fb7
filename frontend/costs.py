"""FLOP and byte counts of the tasks of one decoder layer, per micro-batch per GPU.

Pure arithmetic on the numbers a recogniser read off the module (weight
shapes, head counts) and the activation shape the meta-tensor propagation
produced. Notation used in every formula below:

- ``B`` micro-batch size, ``S`` sequence length, ``T = B*S`` tokens of a micro-batch;
- ``TP``, ``EP`` tensor- and expert-parallel sizes, ``d`` bytes per element of the dtype;
- a GEMM ``(m, n, k)`` multiplies an ``m x k`` activation by a ``k x n`` weight.

Conventions (the same for every block):

- GEMM FLOPs are ``2*m*n*k``. Forward, input-gradient (dgrad) and
  weight-gradient (wgrad) GEMMs each cost the forward GEMM FLOPs.
- Weightless "core" work (attention scores/values, the delta-rule recurrence,
  the selective scan, the depthwise convolution) has no wgrad; its backward
  costs about twice its forward and is charged to dgrad.
- Tensor parallelism splits every mixer, dense-MLP and shared-expert weight
  ``TP`` ways (we split each weight's output dimension, and heads ``TP``
  ways), so those tasks do ``1/TP`` of the work on all ``T`` tokens.
- MoE with tensor parallelism runs sequence-parallel: each TP rank routes
  ``T_r = T / TP`` tokens (Megatron's choice with sequence parallelism and
  EP). With balanced routing each EP rank receives ``T_r * top_k`` token
  slots in total, whatever ``EP`` is, so expert GEMM FLOPs per rank are
  ``T_r * top_k * 2 * (per-expert weight elements)``, and a rank holds
  ``num_experts / EP`` experts' weights.
- HBM bytes of a compute task (the roofline's memory side): every GEMM reads
  its activation ``m*k`` and weight ``k*n`` and writes ``m*n``; the same
  traffic in dgrad (reads weight and output gradient, writes input gradient)
  and wgrad (reads activation and output gradient, writes weight gradient).
  Core work adds its own reads/writes, doubled in backward.
- ``act_bytes`` of a forward task: the GEMM inputs it saves (``m*k`` each)
  plus the tensors its core saves for backward.
- All-to-All bytes (dispatch and combine, each direction): every rank sends
  the token slots bound for other ranks,
  ``T_r * hidden * top_k * d * (EP - 1) / EP``.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gemm:
    m: int  # rows of the activation (tokens)
    n: int  # output features
    k: int  # input features (the reduction)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def elements(self) -> int:
        """Elements read and written: activation, weight, output."""
        return self.m * self.k + self.k * self.n + self.m * self.n


@dataclass
class Work:
    """The cost of one forward task and its backward mirrors."""

    gemms: list[Gemm] = field(default_factory=list)
    core_flops: int = 0
    core_elements: int = 0  # elements the core reads and writes in forward
    core_saved: int = 0  # elements the core keeps for backward
    weight_elements: int = 0  # weights this rank holds for the task
    shapes: list[list[int]] = field(default_factory=list)

    def merge(self, other: Work) -> Work:
        return Work(
            self.gemms + other.gemms,
            self.core_flops + other.core_flops,
            self.core_elements + other.core_elements,
            self.core_saved + other.core_saved,
            self.weight_elements + other.weight_elements,
            self.shapes or other.shapes,
        )

    @property
    def gemm_flops(self) -> int:
        return sum(g.flops for g in self.gemms)

    @property
    def fwd_flops(self) -> int:
        return self.gemm_flops + self.core_flops

    @property
    def dgrad_flops(self) -> int:
        return self.gemm_flops + 2 * self.core_flops

    @property
    def wgrad_flops(self) -> int:
        return self.gemm_flops

    def fwd_bytes(self, d: int) -> int:
        return d * (sum(g.elements for g in self.gemms) + self.core_elements)

    def dgrad_bytes(self, d: int) -> int:
        return d * (sum(g.elements for g in self.gemms) + 2 * self.core_elements)

    def wgrad_bytes(self, d: int) -> int:
        return d * sum(g.elements for g in self.gemms)

    def act_bytes(self, d: int) -> int:
        return d * (sum(g.m * g.k for g in self.gemms) + self.core_saved)


def _split(n: int, parts: int) -> int:
    return -(-n // parts)


def linear_gemms(tokens: int, linears: list[tuple[int, int]], tp: int = 1) -> list[Gemm]:
    """One GEMM per nn.Linear (in, out) over ``tokens`` rows, output dimension split TP ways."""
    return [Gemm(tokens, _split(out, tp), fan_in) for fan_in, out in linears]


def causal_pairs(seq: int, window: int | None = None) -> int:
    """Query-key pairs a causal mask keeps: sum over queries i = 1..S of min(i, W).

    Full causal: S(S+1)/2 (about half of S^2). Sliding window W < S:
    W(W+1)/2 + (S - W) * W.
    """
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


def attention_core(batch: int, seq: int, heads: int, d_qk: int, d_v: int, window: int | None, tp: int = 1) -> Work:
    """Scores Q K^T (2 * d_qk per pair) and the weighted sum of V (2 * d_v per pair) per head.

    ``FLOPs = 2 * B * (heads/TP) * pairs * (d_qk + d_v)`` with ``pairs`` from
    ``causal_pairs``. A fused (flash) kernel reads Q, K, V and writes O once:
    ``B*S*(heads/TP)*(2*d_qk + 2*d_v)`` elements (K/V counted per query head,
    an upper bound for grouped-query attention), and saves the same tensors
    for backward. Used for softmax, sliding-window and MLA attention.
    """
    h = _split(heads, tp)
    pairs = causal_pairs(seq, window)
    elements = batch * seq * h * (2 * d_qk + 2 * d_v)
    return Work(core_flops=2 * batch * h * pairs * (d_qk + d_v), core_elements=elements, core_saved=elements)


def delta_rule_core(batch: int, seq: int, v_heads: int, d_k: int, d_v: int, chunk: int, tp: int = 1) -> Work:
    """Chunked gated delta rule (Gated DeltaNet), per head and per chunk of C tokens.

    With the state S (d_k x d_v) carried between chunks, one chunk costs
    ``K K^T`` (2C^2 d_k), the WY transform ``W = T (beta K)`` (2C^2 d_k) and
    ``U = T (beta V)`` (2C^2 d_v) with ``T`` the inverse of a unit lower
    triangular C x C matrix (2C^3/3 by forward substitution), intra-chunk
    ``Q K^T`` (2C^2 d_k) and its product with the corrected values (2C^2 d_v),
    and three state products ``W S``, ``Q S``, ``K^T (U - W S)`` (2C d_k d_v
    each). Per chunk: ``2C^2(3 d_k + 2 d_v) + 2C^3/3 + 6 C d_k d_v``; there are
    ``ceil(S/C)`` chunks per sequence and ``B * v_heads/TP`` head instances
    (key heads are repeated to value heads). Elements read and written:
    q, k, v, gates and output per token, ``(2 d_k + 2 d_v + 2)`` per head;
    backward also keeps one state per chunk.
    """
    h = _split(v_heads, tp)
    chunks = -(-seq // chunk)
    per_chunk = 2 * chunk * chunk * (3 * d_k + 2 * d_v) + (2 * chunk**3) // 3 + 6 * chunk * d_k * d_v
    elements = batch * seq * h * (2 * d_k + 2 * d_v + 2)
    saved = elements + batch * h * chunks * d_k * d_v
    return Work(core_flops=batch * h * chunks * per_chunk, core_elements=elements, core_saved=saved)


def linear_attention_core(batch: int, seq: int, heads: int, d_k: int, d_v: int, chunk: int, tp: int = 1) -> Work:
    """Chunked linear attention with a decayed ``d_k x d_v`` state (lightning attention, retention, GLA).

    Per head and chunk of C tokens: intra-chunk ``Q K^T`` (2C^2 d_k) and its
    product with V (2C^2 d_v), the inter-chunk read ``Q S`` (2C d_k d_v) and
    the state update ``K^T V`` (2C d_k d_v); decays are elementwise and not
    counted. Per chunk ``2C^2(d_k + d_v) + 4C d_k d_v``, ``ceil(S/C)`` chunks
    and ``B * heads/TP`` head instances; ``C = 1`` is the token-by-token
    recurrence, ``C = S`` the parallel (quadratic) form. Elements read and
    written: q, k, v and output per token and head ``(2 d_k + 2 d_v)``;
    backward also keeps one state per chunk.
    """
    h = _split(heads, tp)
    chunks = -(-seq // chunk)
    per_chunk = 2 * chunk * chunk * (d_k + d_v) + 4 * chunk * d_k * d_v
    elements = batch * seq * h * (2 * d_k + 2 * d_v)
    saved = elements + batch * h * chunks * d_k * d_v
    return Work(core_flops=batch * h * chunks * per_chunk, core_elements=elements, core_saved=saved)


def selective_scan_core(tokens: int, d_inner: int, d_state: int, tp: int = 1) -> Work:
    """Mamba selective scan: about 9 FLOPs per token, channel and state element.

    (Discretise A and B, update the state, read it out with C: ``9 * T *
    (d_inner/TP) * N``, the count the Mamba paper gives.) It reads x, dt and
    writes y per channel and reads B, C per state element:
    ``T * (3*d_inner/TP + 2*N)`` elements, all saved for backward.
    """
    di = _split(d_inner, tp)
    elements = tokens * (3 * di + 2 * d_state)
    return Work(core_flops=9 * tokens * di * d_state, core_elements=elements, core_saved=elements)


def depthwise_conv_core(tokens: int, channels: int, kernel: int, tp: int = 1) -> Work:
    """Causal depthwise conv1d: ``2 * T * (channels/TP) * kernel``; reads and writes ``2*T*channels`` elements."""
    c = _split(channels, tp)
    return Work(core_flops=2 * tokens * c * kernel, core_elements=2 * tokens * c, core_saved=tokens * c)


def all_to_all_bytes(tokens_per_rank: int, hidden: int, top_k: int, dtype_bytes: int, ep: int) -> int:
    """Bytes one rank sends in one dispatch (or combine): ``T_r * hidden * top_k * d * (EP-1)/EP``."""
    return tokens_per_rank * hidden * top_k * dtype_bytes * (ep - 1) // ep


def moe_tokens_per_rank(tokens: int, tp: int) -> int:
    """Tokens one rank routes: the micro-batch's tokens, sequence-sharded over TP."""
    return _split(tokens, tp)


def expert_work(tokens_per_rank: int, top_k: int, matrices: list[tuple[int, int]], expert_params: int,
                num_experts: int, ep: int) -> Work:
    """Expert GEMMs under balanced routing: ``T_r * top_k`` rows through each per-expert weight.

    ``matrices`` are the (rows, cols) of one expert's weights; the FLOPs do not
    depend on their layout (2 FLOPs per weight element per routed token).
    The rank holds ``expert_params * (num_experts/EP) / num_experts`` weights.
    """
    rows = tokens_per_rank * top_k
    gemms = [Gemm(rows, a, b) for a, b in matrices]
    return Work(gemms=gemms, weight_elements=expert_params * _split(num_experts, ep) // num_experts)


def embedding_work(tokens: int, hidden: int) -> Work:
    """Embedding lookup: no FLOPs; reads and writes ``T * hidden`` elements each way.

    Its wgrad is a scatter-add of the output gradient (``T * hidden`` FLOPs).
    """
    return Work(core_elements=2 * tokens * hidden)


def head_work(tokens: int, hidden: int, vocab: int, tp: int = 1) -> Work:
    """Final norm + output projection + softmax cross-entropy.

    The projection is a GEMM (T, vocab/TP, hidden). The loss costs about 5
    FLOPs per logit (max, subtract, exp, sum, log); it reads and writes the
    logits once (``2 * T * vocab/TP`` elements).
    """
    v = _split(vocab, tp)
    return Work(gemms=[Gemm(tokens, v, hidden)], core_flops=5 * tokens * v, core_elements=2 * tokens * v)
