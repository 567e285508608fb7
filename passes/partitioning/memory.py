"""Device memory of a pipeline stage under interleaved 1F1B: static state plus in-flight activations.

Assumptions (the partition pass documents and reports them):

- ``Task.param_bytes`` is the weight memory *one device* holds for the task, already
  sharded by tensor and expert parallelism, stored in the training dtype
  (``ParallelConfig.dtype``). Parameters per device = ``param_bytes / dtype_bytes``. The
  ``expert_gemm`` tasks hold the experts' weights; every other task holds dense weights.
- Mixed-precision Adam, per parameter element (Megatron-Core's accounting):
  - weights in the training dtype: ``dtype_bytes`` (counted by ``param_bytes`` itself);
  - gradients accumulated in fp32 (``grad_bytes`` = 4, the main-grad buffer);
  - optimizer state: fp32 master weights + first and second moments,
    ``optimizer_bytes`` = 4 + 4 + 4 = 12. The distributed optimizer
    (``ParallelConfig.distributed_optimizer``, on by default as in public recipes) shards
    it over the replicas of the weights: dense weights over the ``dp · cp``
    data-and-context-parallel ranks, expert weights over the expert-data-parallel ranks
    ``expert_dp = dp · cp · tp / ep``.
  So bf16 costs 2 + 4 + 12 = 18 bytes per parameter unsharded, 6 + 12/d sharded d ways.
- ``Task.act_bytes`` is what one micro-batch of a forward task keeps alive until its
  backward (``frontend/costs.py``: norms, GEMM inputs, cores, selective recomputation);
  a chunk's activation footprint is the sum over its forward tasks.
- In-flight micro-batches follow the pipeline's order (``pipelining.order``; combined 1F1B
  with its extra warm-up forward when expert parallelism is on): device ``d`` runs ``W(d)``
  warm-up forwards, then alternates one forward and one backward, so device 0 holds the
  most micro-batches in flight: ``W(0) + 1``. Which chunks those micro-batches belong to
  changes along the steady state, so we keep every distinct per-chunk in-flight vector
  (its Pareto-maximal ones): the memory bound is linear in each, which the MILP uses as
  one constraint per vector.
- Deferred wgrad: a weight gradient that runs later than its dgrad keeps its inputs and
  output gradient alive; we reserve the activations of one more micro-batch of the chunk
  (any chunk of the device: one constraint per chunk, i.e. the largest one binds).
- A fixed reserve per device (``reserved_gib``, 4 GiB): the CUDA context, NCCL and
  All-to-All (DeepEP) communication buffers and the caching allocator's slack, which no
  tensor of the model accounts for.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from passes.partitioning.ranges import Range
from passes.pipelining.order import rank_order
from tessera_ir.kinds import LayerRole, Phase, TaskOp
from tessera_ir.model import Layer, Module, Task
from tessera_ir.parallel import ParallelConfig

GIB = 2**30


@dataclass(frozen=True)
class MemoryAssumptions:
    grad_bytes: int = 4  # fp32 main gradients per parameter element
    optimizer_bytes: int = 12  # fp32 master weights + Adam's two fp32 moments
    wgrad_headroom: bool = True  # reserve one extra micro-batch of activations for deferred wgrad
    reserved_gib: float = 4.0  # per device: CUDA context, communication buffers, allocator slack

    def static_bytes_per_param(self, dtype_bytes: int, shards: int) -> float:
        """Bytes per parameter element of weights + gradients + optimizer state sharded ``shards`` ways."""
        return dtype_bytes + self.grad_bytes + self.optimizer_bytes / shards


def optimizer_shards(parallel: ParallelConfig) -> tuple[int, int]:
    """(dense, expert) ways the optimizer state is sharded: ``(dp·cp, expert_dp)`` with the
    distributed optimizer, ``(1, 1)`` without."""
    if not parallel.distributed_optimizer:
        return 1, 1
    return parallel.dp * parallel.cp, parallel.expert_dp


def layer_param_bytes(layer: Layer) -> tuple[int, int]:
    """(dense, expert) weight bytes one device holds for ``layer`` (forward tasks own the weights)."""
    fwd = [t for t in layer.tasks if t.phase is Phase.FWD]
    expert = sum(t.param_bytes for t in fwd if t.op is TaskOp.EXPERT_GEMM)
    return sum(t.param_bytes for t in fwd) - expert, expert


def layer_static_bytes(layer: Layer, parallel: ParallelConfig, assumptions: MemoryAssumptions) -> int:
    """Weights + gradients + optimizer state of ``layer`` on one device, in bytes."""
    dense, expert = layer_param_bytes(layer)
    dense_shards, expert_shards = optimizer_shards(parallel)
    d = parallel.dtype_bytes
    return int(round(
        dense / d * assumptions.static_bytes_per_param(d, dense_shards)
        + expert / d * assumptions.static_bytes_per_param(d, expert_shards)
    ))


def layer_activation_bytes(layer: Layer) -> int:
    """Activation bytes one micro-batch of ``layer``'s forward keeps alive for its backward."""
    return sum(t.act_bytes for t in layer.tasks if t.phase is Phase.FWD)


def output_gradient_bytes(tasks: Mapping[str, Task], wgrad: str, dtype_bytes: int) -> int:
    """Bytes of the output gradient the weight gradient ``wgrad`` (a task name) consumes: its forward
    task's output (the last of its ``shapes``) in the training dtype; 0 when it has no forward task."""
    fwd = tasks.get(wgrad.rsplit(".", 1)[0] + ".fwd")
    if fwd is None or not fwd.shapes:
        return 0
    return math.prod(fwd.shapes[-1]) * dtype_bytes


def inflight_vectors(pp: int, vpp: int, microbatches: int, device: int, combined: bool = False) -> list[tuple[int, ...]]:
    """Per-chunk counts of in-flight micro-batches at every steady-state step of ``device``.

    Walks the device's interleaved-1F1B order (``pipelining.order.rank_order``): a forward
    adds a micro-batch to its chunk, a backward frees one; the counts are read right after
    each steady-state forward, before its paired backward (the most the step holds). Without
    a steady state every forward is in flight before the first backward. Only
    Pareto-maximal vectors are returned: any other is dominated and can never bind a
    memory constraint.
    """
    held = [0] * vpp
    vectors: set[tuple[int, ...]] = set()
    for action in rank_order(pp, vpp, microbatches, device, combined):
        if action.direction == "fwd":
            held[action.chunk] += 1
            if action.phase == "steady":
                vectors.add(tuple(held))
        else:
            if not vectors:  # the first backward of a rank with no steady state: every forward is held
                vectors.add(tuple(held))
            held[action.chunk] -= 1
    return _pareto_max(vectors)


def _pareto_max(vectors: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    def dominated(v: tuple[int, ...]) -> bool:
        return any(w != v and all(a >= b for a, b in zip(w, v)) for w in vectors)

    return sorted(v for v in vectors if not dominated(v))


def device_peak_bytes(
    static: Sequence[int], activations: Sequence[int], vectors: Sequence[tuple[int, ...]], wgrad_headroom: bool,
    reserved: int = 0,
) -> int:
    """Peak memory of one device given its chunks' static and per-micro-batch activation bytes.

    ``peak = reserved + Σ_c static_c + max_vectors Σ_c n_c·act_c + (max_c act_c if wgrad headroom)``.
    """
    held = max((sum(n * a for n, a in zip(v, activations)) for v in vectors), default=0)
    headroom = max(activations, default=0) if wgrad_headroom else 0
    return int(reserved + sum(static) + held + headroom)


@dataclass
class MemorySpec:
    """Memory data for the problem: per-stage static/activation bytes of a range and the device capacity."""

    static: Callable[[int, Range], int]  # weights + grads + optimizer state of a stage holding the range
    activation: Callable[[int, Range], int]  # activations one micro-batch of the range keeps alive
    vectors: dict[int, list[tuple[int, ...]]]  # per device, Pareto-maximal per-chunk in-flight counts
    capacity: int  # bytes per device
    wgrad_headroom: bool = True
    reserved: int = 0  # bytes per device no model tensor accounts for

    @property
    def budget(self) -> int:
        """Bytes per device left for weights, optimizer state and activations: capacity minus the reserve."""
        return self.capacity - self.reserved

    def device_bytes(self, pp: int, vpp: int, device: int, ranges: Sequence[Range]) -> int:
        """Peak bytes of ``device`` when its chunks hold ``ranges`` (chunk order)."""
        stages = [device + c * pp for c in range(vpp)]
        static = [self.static(s, r) for s, r in zip(stages, ranges)]
        act = [self.activation(s, r) for s, r in zip(stages, ranges)]
        return device_peak_bytes(static, act, self.vectors[device], self.wgrad_headroom, self.reserved)


def build_memory_spec(
    module: Module, parallel: ParallelConfig, capacity_gib: float, assumptions: MemoryAssumptions
) -> MemorySpec:
    """Memory data of a module: per-layer static and activation bytes summed over a stage's layers
    (the embedding's on the first stage, the head's on the last)."""
    stages = parallel.virtual_stages
    decoder = module.decoder_layers()
    static_prefix, act_prefix = [0], [0]
    for layer in decoder:
        static_prefix.append(static_prefix[-1] + layer_static_bytes(layer, parallel, assumptions))
        act_prefix.append(act_prefix[-1] + layer_activation_bytes(layer))
    ends = {
        "first": [layer for layer in module.layers if layer.role is LayerRole.EMBEDDING],
        "last": [layer for layer in module.layers if layer.role is LayerRole.HEAD],
    }
    end_static = {k: sum(layer_static_bytes(x, parallel, assumptions) for x in v) for k, v in ends.items()}
    end_act = {k: sum(layer_activation_bytes(x) for x in v) for k, v in ends.items()}

    def extra(s: int, table: dict[str, int]) -> int:
        return (table["first"] if s == 0 else 0) + (table["last"] if s == stages - 1 else 0)

    def static(s: int, r: Range) -> int:
        return static_prefix[r[1] + 1] - static_prefix[r[0]] + extra(s, end_static)

    def activation(s: int, r: Range) -> int:
        return act_prefix[r[1] + 1] - act_prefix[r[0]] + extra(s, end_act)

    vectors = {
        d: inflight_vectors(parallel.pp, parallel.vpp, parallel.microbatches, d, parallel.combined_1f1b)
        for d in range(parallel.pp)
    }
    return MemorySpec(
        static, activation, vectors, int(capacity_gib * GIB), assumptions.wgrad_headroom,
        int(assumptions.reserved_gib * GIB),
    )
