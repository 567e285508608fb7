"""Device memory of a pipeline stage under interleaved 1F1B: static state plus in-flight activations.

Assumptions (the partition pass documents and reports them):

- ``Task.param_bytes`` is the weight memory *one device* holds for the task, already
  sharded by tensor and expert parallelism, stored in the training dtype
  (``ParallelConfig.dtype``). Parameters per device = ``param_bytes / dtype_bytes``.
- Mixed-precision Adam, per parameter element:
  - weights in the training dtype: ``dtype_bytes`` (counted by ``param_bytes`` itself);
  - gradients accumulated in fp32 (``grad_bytes`` = 4, Megatron's main-grad buffer);
  - optimizer state: fp32 master weights + first and second moments,
    ``optimizer_bytes`` = 4 + 4 + 4 = 12. With the distributed optimizer
    (ZeRO-1 style) this part is sharded across ``dp`` data-parallel ranks: 12 / dp.
  So bf16 without the distributed optimizer costs 2 + 4 + 12 = 18 bytes per parameter.
- ``Task.act_bytes`` is what one micro-batch of a forward task keeps alive until its
  backward; a chunk's activation footprint is the sum over its forward tasks.
- In-flight micro-batches follow Megatron-LM's interleaved 1F1B: device ``d`` runs
  ``W(d) = 2·(pp − d − 1) + (vpp − 1)·pp`` warm-up forwards (``pp − d − 1`` without
  interleaving), then alternates one forward and one backward; forwards visit chunks in
  groups of ``pp`` micro-batches (chunk ``(k // pp) mod vpp`` for the k-th forward),
  backwards in reverse chunk order. So device 0 holds the most micro-batches in flight:
  ``W(0) + 1``. Which chunks those micro-batches belong to changes along the steady
  state, so we keep every distinct per-chunk in-flight vector (its Pareto-maximal ones):
  the memory bound is linear in each, which the MILP uses as one constraint per vector.
- Deferred wgrad: a weight gradient that runs later than its dgrad keeps its inputs and
  output gradient alive; we reserve the activations of one more micro-batch of the chunk
  (any chunk of the device: one constraint per chunk, i.e. the largest one binds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tessera_ir.kinds import Phase
from tessera_ir.model import Layer
from tessera_ir.parallel import ParallelConfig

GIB = 2**30


@dataclass(frozen=True)
class MemoryAssumptions:
    grad_bytes: int = 4  # fp32 main gradients per parameter element
    optimizer_bytes: int = 12  # fp32 master weights + Adam's two fp32 moments
    dp: int = 1  # data-parallel ranks that share the optimizer state when distributed
    distributed_optimizer: bool = False
    wgrad_headroom: bool = True  # reserve one extra micro-batch of activations for deferred wgrad

    def static_bytes_per_param(self, dtype_bytes: int) -> float:
        """Bytes per parameter element of weights + gradients + optimizer state."""
        optimizer = self.optimizer_bytes / (self.dp if self.distributed_optimizer else 1)
        return dtype_bytes + self.grad_bytes + optimizer

    def describe(self) -> str:
        sharding = f"sharded over dp={self.dp}" if self.distributed_optimizer else "not sharded"
        return (
            f"weights in training dtype, fp32 grads ({self.grad_bytes} B/param), Adam state "
            f"({self.optimizer_bytes} B/param, {sharding}), interleaved-1F1B in-flight activations"
            + (", +1 micro-batch of activations for deferred wgrad" if self.wgrad_headroom else "")
        )


def layer_param_bytes(layer: Layer) -> int:
    """Weight bytes one device holds for ``layer`` (forward tasks own the weights)."""
    return sum(t.param_bytes for t in layer.tasks if t.phase is Phase.FWD)


def layer_static_bytes(layer: Layer, parallel: ParallelConfig, assumptions: MemoryAssumptions) -> int:
    """Weights + gradients + optimizer state of ``layer`` on one device, in bytes."""
    params = layer_param_bytes(layer) / parallel.dtype_bytes
    return int(round(params * assumptions.static_bytes_per_param(parallel.dtype_bytes)))


def layer_activation_bytes(layer: Layer) -> int:
    """Activation bytes one micro-batch of ``layer``'s forward keeps alive for its backward."""
    return sum(t.act_bytes for t in layer.tasks if t.phase is Phase.FWD)


def warmup_forwards(pp: int, vpp: int, microbatches: int, device: int) -> int:
    """Forwards device ``device`` runs before its first backward (Megatron-LM's interleaved 1F1B)."""
    total = microbatches * vpp
    if vpp == 1:
        return min(total, pp - device - 1)
    return min(total, 2 * (pp - device - 1) + (vpp - 1) * pp)


def forward_chunk(k: int, pp: int, vpp: int) -> int:
    """Chunk of the k-th forward on a device: micro-batches go through a chunk in groups of ``pp``."""
    return (k // pp) % vpp


def backward_chunk(k: int, pp: int, vpp: int) -> int:
    """Chunk of the k-th backward on a device: the same groups, last chunk first."""
    return vpp - 1 - (k // pp) % vpp


def inflight_total(pp: int, vpp: int, microbatches: int, device: int) -> int:
    """Micro-batch chunks whose activations device ``device`` holds at its peak (warm-up + the steady one)."""
    return min(microbatches * vpp, warmup_forwards(pp, vpp, microbatches, device) + 1)


def inflight_vectors(pp: int, vpp: int, microbatches: int, device: int) -> list[tuple[int, ...]]:
    """Per-chunk counts of in-flight micro-batches at every steady-state step of ``device``.

    Step k of the steady state has issued forwards 0..k+W and finished backwards
    0..k−1. Only Pareto-maximal vectors are returned: any other is dominated and
    can never bind a memory constraint.
    """
    total = microbatches * vpp
    warm = warmup_forwards(pp, vpp, microbatches, device)
    vectors: set[tuple[int, ...]] = set()
    fwd_counts = [0] * vpp
    bwd_counts = [0] * vpp
    for i in range(warm):
        fwd_counts[forward_chunk(i, pp, vpp)] += 1
    steps = total - warm
    if steps == 0:  # no steady state: every forward is in flight before the first backward
        vectors.add(tuple(fwd_counts))
    for k in range(steps):
        fwd_counts[forward_chunk(k + warm, pp, vpp)] += 1
        vectors.add(tuple(f - b for f, b in zip(fwd_counts, bwd_counts)))
        bwd_counts[backward_chunk(k, pp, vpp)] += 1
    return _pareto_max(vectors)


def _pareto_max(vectors: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    def dominated(v: tuple[int, ...]) -> bool:
        return any(w != v and all(a >= b for a, b in zip(w, v)) for w in vectors)

    return sorted(v for v in vectors if not dominated(v))


def device_peak_bytes(
    static: Sequence[int], activations: Sequence[int], vectors: Sequence[tuple[int, ...]], wgrad_headroom: bool
) -> int:
    """Peak memory of one device given its chunks' static and per-micro-batch activation bytes.

    ``peak = Σ_c static_c + max_vectors Σ_c n_c·act_c + (max_c act_c if wgrad headroom)``.
    """
    held = max((sum(n * a for n, a in zip(v, activations)) for v in vectors), default=0)
    headroom = max(activations, default=0) if wgrad_headroom else 0
    return int(sum(static) + held + headroom)
