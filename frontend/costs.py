"""FLOP, byte and activation counts of the tasks of one decoder layer, per micro-batch per GPU.

Pure arithmetic on the numbers a recogniser read off the module (weight
shapes, head counts) and the activation shape the meta-tensor propagation
produced. Notation used in every formula below:

- ``B`` micro-batch size, ``S`` sequence length, ``T = B*S/CP`` tokens of a micro-batch
  on one context-parallel rank (``CP`` splits the sequence evenly);
- ``TP``, ``EP`` tensor- and expert-parallel sizes, ``d`` bytes per element of the dtype;
- a GEMM ``(m, n, k)`` multiplies an ``m x k`` activation by a ``k x n`` weight
  (``groups`` weight matrices of that shape: the local experts of a grouped GEMM).

Conventions (the same for every block):

- GEMM FLOPs are ``2*m*n*k``. Forward, input-gradient (dgrad) and
  weight-gradient (wgrad) GEMMs each cost the forward GEMM FLOPs.
- Weightless "core" work (attention scores/values, the delta-rule recurrence,
  the selective scan, the depthwise convolution, the loss) has no wgrad; its
  backward is charged to dgrad and costs ``core_bwd_flops``: 2.5x the forward
  for flash attention (the backward recomputes the scores ``Q K^T`` and runs four
  more products: 5 matrix products against the forward's 2), 2x for the others.
  A task records its core share separately (``core_flops``/``core_bytes`` task
  attributes), so the cost model prices projection GEMMs and core kernels each
  with their own efficiency.
- Tensor parallelism splits every mixer, dense-MLP and shared-expert weight
  ``TP`` ways (we split each weight's output dimension, and heads ``TP``
  ways), so those tasks do ``1/TP`` of the work on all ``T`` tokens.
- MoE with tensor parallelism runs sequence-parallel: each TP rank routes
  ``T_r = T / TP`` tokens (Megatron's choice with sequence parallelism and
  EP; expert tensor parallelism 1). With balanced routing each EP rank
  receives ``T_r * top_k`` token slots in total, whatever ``EP`` is, so expert
  GEMM FLOPs per rank are ``T_r * top_k * 2 * (per-expert weight elements)``;
  a rank holds ``num_experts / EP`` experts, each receiving
  ``rows_per_expert = T_r * top_k * EP / num_experts`` rows.
- HBM bytes of a compute task (the roofline's memory side): every GEMM reads
  its activation ``m*k`` and weights ``groups*k*n`` and writes ``m*n``; the same
  traffic in dgrad (reads weight and output gradient, writes input gradient)
  and wgrad (reads activation and output gradient, writes weight gradient).
  A grouped expert GEMM reads every local expert's weights. Core work adds its
  own reads/writes, doubled in backward.
- All-to-All bytes (dispatch and combine, each direction): every rank sends
  the token slots bound for other ranks,
  ``T_r * hidden * top_k * d * (EP - 1) / EP``.

Activations a forward task keeps for its backward (``act_bytes``), as Megatron-Core
saves them with sequence parallelism and flash attention:

- each of the two norms of a layer keeps its input and its output, ``T/TP * hidden``
  each (sequence-parallel shards); the mixer task holds the first, the router (or the
  dense MLP) the second;
- a block's GEMMs keep their inputs: the normed block input (counted with the norm) and
  every inner input ``T * fan_in / TP``;
- cores keep what their backward reads (attention: Q, K, V per head shard and the
  softmax statistics; the delta rule: its inputs, gates and one state per chunk);
- experts keep their dispatched input ``rows * hidden``, the first GEMMs' outputs and the
  activation output; the router its probabilities (fp32); the LM head its logits.

Selective recomputation (``ParallelConfig.recompute``, Megatron-Core's module names)
drops what a module recomputes, and adds its recomputed forward work to the backward:
``layernorm`` drops the norms' outputs; ``moe_act`` the experts' activation output;
``mla_up_proj`` MLA's up-projected Q, K, V (its backward reruns the two up-projection
GEMMs); ``core_attn`` the attention output and statistics (the backward reruns the core);
``shared_experts`` and ``mlp`` everything inside those blocks but their input (the
backward reruns their GEMMs); ``moe`` everything inside the MoE block but its input (the
backward reruns the router, the experts and both All-to-Alls before its own work).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Gemm:
    m: int  # rows of the activation (tokens)
    n: int  # output features
    k: int  # input features (the reduction)
    groups: int = 1  # weight matrices of this shape the rows are spread over (grouped expert GEMM)

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    @property
    def elements(self) -> int:
        """Elements read and written: activation, every group's weight, output."""
        return self.m * self.k + self.groups * self.k * self.n + self.m * self.n


@dataclass
class Work:
    """The cost of one forward task and its backward mirrors."""

    gemms: list[Gemm] = field(default_factory=list)
    core_flops: int = 0  # forward FLOPs of the core kernel(s)
    core_bwd_flops: int = 0  # backward FLOPs of the core kernel(s)
    core_elements: int = 0  # elements the core reads and writes in forward
    saved: int = 0  # elements the forward keeps for backward (after recomputation drops some)
    recompute_flops: int = 0  # forward FLOPs the backward reruns (selective recomputation)
    recompute_core_flops: int = 0  # the core's share of recompute_flops
    recompute_elements: int = 0  # elements the rerun forward reads and writes
    weight_elements: int = 0  # weights this rank holds for the task
    shapes: list[list[int]] = field(default_factory=list)
    rows_per_expert: int = 0  # grouped expert GEMMs: rows each local expert receives

    def merge(self, other: Work) -> Work:
        return Work(
            self.gemms + other.gemms,
            self.core_flops + other.core_flops,
            self.core_bwd_flops + other.core_bwd_flops,
            self.core_elements + other.core_elements,
            self.saved + other.saved,
            self.recompute_flops + other.recompute_flops,
            self.recompute_core_flops + other.recompute_core_flops,
            self.recompute_elements + other.recompute_elements,
            self.weight_elements + other.weight_elements,
            self.shapes or other.shapes,
            self.rows_per_expert or other.rows_per_expert,
        )

    @property
    def gemm_flops(self) -> int:
        return sum(g.flops for g in self.gemms)

    @property
    def gemm_elements(self) -> int:
        return sum(g.elements for g in self.gemms)

    @property
    def fwd_flops(self) -> int:
        return self.gemm_flops + self.core_flops

    @property
    def dgrad_flops(self) -> int:
        return self.gemm_flops + self.core_bwd_flops + self.recompute_flops

    @property
    def dgrad_core_flops(self) -> int:
        return self.core_bwd_flops + self.recompute_core_flops

    @property
    def wgrad_flops(self) -> int:
        return self.gemm_flops

    def fwd_bytes(self, d: int) -> int:
        return d * (self.gemm_elements + self.core_elements)

    def dgrad_bytes(self, d: int) -> int:
        return d * (self.gemm_elements + 2 * self.core_elements + self.recompute_elements)

    def wgrad_bytes(self, d: int) -> int:
        return d * self.gemm_elements

    def act_bytes(self, d: int) -> int:
        return d * self.saved

    def rerun_in_backward(self, core_too: bool = True) -> None:
        """Selective recomputation of this whole block: its backward reruns its forward."""
        self.recompute_flops += self.gemm_flops + (self.core_flops if core_too else 0)
        self.recompute_core_flops += self.core_flops if core_too else 0
        self.recompute_elements += self.gemm_elements + (self.core_elements if core_too else 0)


def _split(n: int, parts: int) -> int:
    return -(-n // parts)


# fp32 tensors saved beside bf16 ones, counted in elements of two bytes.
FP32_ELEMENTS = 2


def linear_gemms(tokens: int, linears: list[tuple[int, int]], tp: int = 1) -> list[Gemm]:
    """One GEMM per nn.Linear (in, out) over ``tokens`` rows, output dimension split TP ways."""
    return [Gemm(tokens, _split(out, tp), fan_in) for fan_in, out in linears]


def norm_saved(tokens: int, hidden: int, tp: int, recompute_norm: bool) -> int:
    """A norm keeps its input and output (sequence-parallel shards); recomputation drops the output."""
    return _split(tokens, tp) * hidden * (1 if recompute_norm else 2)


def inner_inputs(tokens: int, linears: list[tuple[int, int]], hidden: int, tp: int) -> int:
    """Inputs the block's GEMMs keep besides the normed block input: ``T * fan_in / TP`` each."""
    return sum(tokens * _split(fan_in, tp) for fan_in, _ in linears if fan_in != hidden)


def causal_pairs(seq: int, window: int | None = None, chunk: int | None = None) -> int:
    """Query-key pairs a causal mask keeps: sum over queries i = 1..S of min(i, W).

    Full causal: S(S+1)/2 (about half of S^2). Sliding window W < S:
    W(W+1)/2 + (S - W) * W. Chunked attention (chunks of C tokens, each query attending causally
    within its own chunk; S = qC + r): q C(C+1)/2 + r(r+1)/2, about S C / 2 -- at S = 4C a
    quarter of full causal attention.
    """
    if chunk is not None and chunk < seq:
        whole, rest = divmod(seq, chunk)
        return whole * chunk * (chunk + 1) // 2 + rest * (rest + 1) // 2
    if window is None or window >= seq:
        return seq * (seq + 1) // 2
    return window * (window + 1) // 2 + (seq - window) * window


def attention_core(batch: int, seq: int, heads: int, d_qk: int, d_v: int, window: int | None, tp: int = 1,
                   kv_heads: int | None = None, cp: int = 1, chunk: int | None = None) -> Work:
    """Scores Q K^T (2 * d_qk per pair) and the weighted sum of V (2 * d_v per pair) per head.

    ``FLOPs = 2 * B * (heads/TP) * pairs * (d_qk + d_v) / CP`` with ``pairs`` from
    ``causal_pairs`` (context parallelism with load-balanced causal chunks gives every
    rank an equal share of the pairs). Backward: 2.5x (flash attention recomputes the
    scores). A fused (flash) kernel reads Q, K, V and writes O once:
    ``T*(heads/TP)*(2*d_qk + 2*d_v)`` elements (K/V counted per query head, an upper
    bound for grouped-query attention). It saves Q, K, V (K/V per key-value head) and
    the softmax statistics (one fp32 per query head and token); O is the output
    projection's saved input. Used for softmax, sliding-window and MLA attention.
    """
    h = _split(heads, tp)
    kv = _split(kv_heads or heads, tp)
    tokens = batch * seq // cp
    pairs = causal_pairs(seq, window, chunk)
    flops = 2 * batch * h * pairs * (d_qk + d_v) // cp
    elements = tokens * h * (2 * d_qk + 2 * d_v)
    saved = tokens * (h * d_qk + kv * (d_qk + d_v)) + tokens * h * FP32_ELEMENTS
    return Work(core_flops=flops, core_bwd_flops=5 * flops // 2, core_elements=elements, saved=saved)


def delta_rule_core(batch: int, seq: int, v_heads: int, d_k: int, d_v: int, chunk: int, tp: int = 1,
                    cp: int = 1) -> Work:
    """Chunked gated delta rule (Gated DeltaNet), per head and per chunk of C tokens.

    With the state S (d_k x d_v) carried between chunks, one chunk costs
    ``K K^T`` (2C^2 d_k), the WY transform ``W = T (beta K)`` (2C^2 d_k) and
    ``U = T (beta V)`` (2C^2 d_v) with ``T`` the inverse of a unit lower
    triangular C x C matrix (2C^3/3 by forward substitution), intra-chunk
    ``Q K^T`` (2C^2 d_k) and its product with the corrected values (2C^2 d_v),
    and three state products ``W S``, ``Q S``, ``K^T (U - W S)`` (2C d_k d_v
    each). Per chunk: ``2C^2(3 d_k + 2 d_v) + 2C^3/3 + 6 C d_k d_v``; there are
    ``ceil(S/(C*CP))`` chunks per sequence and context-parallel rank (one shorter chunk when a
    rank holds fewer than C tokens) and
    ``B * v_heads/TP`` head instances (key heads are repeated to value heads).
    Elements read and written: q, k, v, gates and output per token,
    ``(2 d_k + 2 d_v + 2)`` per head; backward (2x) also keeps one state per chunk.
    """
    h = _split(v_heads, tp)
    local = -(-seq // cp)  # tokens of a sequence on one context-parallel rank
    chunk = min(chunk, local)  # a sequence shorter than a chunk is one short chunk
    chunks = -(-local // chunk)
    per_chunk = 2 * chunk * chunk * (3 * d_k + 2 * d_v) + (2 * chunk**3) // 3 + 6 * chunk * d_k * d_v
    elements = batch * seq // cp * h * (2 * d_k + 2 * d_v + 2)
    saved = elements + batch * h * chunks * d_k * d_v
    flops = batch * h * chunks * per_chunk
    return Work(core_flops=flops, core_bwd_flops=2 * flops, core_elements=elements, saved=saved)


def linear_attention_core(batch: int, seq: int, heads: int, d_k: int, d_v: int, chunk: int, tp: int = 1,
                          cp: int = 1) -> Work:
    """Chunked linear attention with a decayed ``d_k x d_v`` state (lightning attention, retention, GLA).

    Per head and chunk of C tokens: intra-chunk ``Q K^T`` (2C^2 d_k) and its
    product with V (2C^2 d_v), the inter-chunk read ``Q S`` (2C d_k d_v) and
    the state update ``K^T V`` (2C d_k d_v); decays are elementwise and not
    counted. Per chunk ``2C^2(d_k + d_v) + 4C d_k d_v``, ``ceil(S/(C*CP))`` chunks per
    sequence and context-parallel rank and ``B * heads/TP`` head instances; ``C = 1`` is
    the token-by-token recurrence, ``C = S`` the parallel (quadratic) form. Elements read
    and written: q, k, v and output per token and head ``(2 d_k + 2 d_v)``; backward (2x)
    also keeps one state per chunk.
    """
    h = _split(heads, tp)
    local = -(-seq // cp)  # tokens of a sequence on one context-parallel rank
    chunk = min(chunk, local)
    chunks = -(-local // chunk)
    per_chunk = 2 * chunk * chunk * (d_k + d_v) + 4 * chunk * d_k * d_v
    elements = batch * seq // cp * h * (2 * d_k + 2 * d_v)
    saved = elements + batch * h * chunks * d_k * d_v
    flops = batch * h * chunks * per_chunk
    return Work(core_flops=flops, core_bwd_flops=2 * flops, core_elements=elements, saved=saved)


def selective_scan_core(tokens: int, d_inner: int, d_state: int, tp: int = 1) -> Work:
    """Mamba selective scan: about 9 FLOPs per token, channel and state element.

    (Discretise A and B, update the state, read it out with C: ``9 * T *
    (d_inner/TP) * N``, the count the Mamba paper gives.) It reads x, dt and
    writes y per channel and reads B, C per state element:
    ``T * (3*d_inner/TP + 2*N)`` elements, all saved for backward.
    """
    di = _split(d_inner, tp)
    elements = tokens * (3 * di + 2 * d_state)
    flops = 9 * tokens * di * d_state
    return Work(core_flops=flops, core_bwd_flops=2 * flops, core_elements=elements, saved=elements)


def depthwise_conv_core(tokens: int, channels: int, kernel: int, tp: int = 1) -> Work:
    """Causal depthwise conv1d: ``2 * T * (channels/TP) * kernel``; reads and writes ``2*T*channels`` elements."""
    c = _split(channels, tp)
    flops = 2 * tokens * c * kernel
    return Work(core_flops=flops, core_bwd_flops=2 * flops, core_elements=2 * tokens * c, saved=tokens * c)


def all_to_all_bytes(tokens_per_rank: int, hidden: int, top_k: int, dtype_bytes: int, ep: int) -> int:
    """Bytes one rank sends in one dispatch (or combine): ``T_r * hidden * top_k * d * (EP-1)/EP``."""
    return tokens_per_rank * hidden * top_k * dtype_bytes * (ep - 1) // ep


def moe_tokens_per_rank(tokens: int, tp: int) -> int:
    """Tokens one rank routes: the micro-batch's tokens (on this context-parallel rank), sequence-sharded over TP."""
    return _split(tokens, tp)


def rows_per_expert(tokens_per_rank: int, top_k: int, num_experts: int, ep: int) -> int:
    """Rows each local expert receives under balanced routing: ``T_r * top_k * EP / num_experts``."""
    return max(1, tokens_per_rank * top_k * ep // num_experts)


def _ffn_split(matrices: list[tuple[int, int]], hidden: int) -> tuple[list[int], int]:
    """(outputs of the first GEMMs, input of the last one) of an expert whose matrices are given as
    (rows, cols) in either orientation: the dimension that is not ``hidden`` is the intermediate
    side; the matrix with the smallest intermediate side reads the activation (the down
    projection: gate and up are fused or equal to it)."""
    inner = [a if b == hidden else b for a, b in matrices]
    last = min(range(len(inner)), key=lambda i: inner[i])
    return [x for i, x in enumerate(inner) if i != last], inner[last]


def expert_work(tokens_per_rank: int, top_k: int, matrices: list[tuple[int, int]], expert_params: int,
                num_experts: int, ep: int, hidden: int = 0, recompute_act: bool = False) -> Work:
    """Expert GEMMs under balanced routing: ``T_r * top_k`` rows through each per-expert weight.

    ``matrices`` are the (rows, cols) of one expert's weights; the FLOPs do not
    depend on their layout (2 FLOPs per weight element per routed token). The
    rank holds ``expert_params * (num_experts/EP) / num_experts`` weights and each
    grouped GEMM reads all ``num_experts/EP`` local experts' matrices. Saved for
    backward: the dispatched rows, the first GEMMs' outputs and the activation
    output (dropped by ``moe_act`` recomputation).
    """
    rows = tokens_per_rank * top_k
    local = _split(num_experts, ep)
    gemms = [Gemm(rows, a, b, groups=local) for a, b in matrices]
    saved = 0
    if hidden:
        firsts, last_in = _ffn_split(matrices, hidden)
        saved = rows * hidden + rows * sum(firsts) + (0 if recompute_act else rows * last_in)
    return Work(gemms=gemms, weight_elements=expert_params * local // num_experts, saved=saved,
                rows_per_expert=rows_per_expert(tokens_per_rank, top_k, num_experts, ep))


def mlp_saved(tokens: int, linears: list[tuple[int, int]], hidden: int, tp: int) -> int:
    """A (dense or shared-expert) MLP's saved inner tensors: first GEMMs' outputs and the activation output."""
    firsts = sum(_split(out, tp) for fan_in, out in linears if fan_in == hidden)
    return tokens * firsts + inner_inputs(tokens, linears, hidden, tp)


def embedding_work(tokens: int, hidden: int) -> Work:
    """Embedding lookup: no FLOPs; reads and writes ``T * hidden`` elements each way.

    Its wgrad is a scatter-add of the output gradient (``T * hidden`` FLOPs).
    """
    return Work(core_elements=2 * tokens * hidden)


def head_work(tokens: int, hidden: int, vocab: int, tp: int = 1, recompute_norm: bool = False) -> Work:
    """Final norm + output projection + softmax cross-entropy.

    The projection is a GEMM (T, vocab/TP, hidden). The loss costs about 5
    FLOPs per logit (max, subtract, exp, sum, log); it reads and writes the
    logits once (``2 * T * vocab/TP`` elements) and is the task's core. Saved: the
    final norm's input and output and the logits (the loss backward reads them).
    """
    v = _split(vocab, tp)
    loss = 5 * tokens * v
    saved = norm_saved(tokens, hidden, tp, recompute_norm) + tokens * v
    return Work(gemms=[Gemm(tokens, v, hidden)], core_flops=loss, core_bwd_flops=2 * loss,
                core_elements=2 * tokens * v, saved=saved)
