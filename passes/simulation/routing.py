"""Stochastic expert routing: per-iteration, per-layer, per-micro-batch expert token counts.

Every micro-batch routes ``T_r * top_k`` token slots from each of the ``EP`` ranks of its
expert-parallel group (``T_r`` = tokens one rank routes), so ``n = EP * T_r * top_k`` slots
land on experts per layer. Expert popularity ``p`` (one distribution per layer and iteration)
comes from the chosen model:

``balanced``
    Every expert equally likely. What remains is sampling noise: even a perfectly trained router
    leaves the most loaded rank a few percent above the mean.
``zipf``
    Popularity ``p_j ∝ 1 / (j + 1)^s`` over the experts, shuffled per layer (which experts are
    popular differs between layers; placement is contiguous, so a rank's share is the sum over
    its experts). ``s = 0`` is balanced.
``drift``
    Zipf at iteration 0, then the log-popularity of every expert takes a Gaussian step of
    standard deviation ``drift`` per iteration (the router's preferences wander while training).
``trace``
    Real counts from a JSON file: ``{"num_experts": E, "counts": [[[c_0 .. c_{E-1}] per MoE layer]
    per iteration]}``; each iteration's counts (normalised) are that iteration's popularity;
    iterations past the end of the trace wrap around.

Counts are multinomial draws (``n`` slots over the experts; top-k's rule that one token picks
k *distinct* experts is ignored — with hundreds of experts it changes nothing measurable).
Per-rank loads are drawn first, over ranks with the summed popularity of their experts, and
per-expert counts inside a rank afterwards, on demand: the two-level draw is the same
multinomial, and a rank's expert counts always sum to the load the simulator used. Draws are
seeded per (seed, iteration, ...), so results do not depend on the order of calls.

The simulator needs one number per layer and micro-batch, the load imbalance: the most loaded
rank's tokens over the mean (``runtime.dbo.load_imbalance`` of the expert counts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from tessera_ir.errors import TesseraError

RoutingKind = Literal["balanced", "zipf", "drift", "trace"]
ROUTING_KINDS: tuple[str, ...] = ("balanced", "zipf", "drift", "trace")
# The default skew: a moderate exponent (docs/simulation.md, Routing, says what it models).
DEFAULT_ZIPF_S = 0.3


class RoutingError(TesseraError):
    """A routing model that cannot be built (bad parameters, unreadable trace)."""


@dataclass(frozen=True)
class RoutingSpec:
    """Which routing model, and its parameters."""

    kind: RoutingKind = "balanced"
    seed: int = 0
    zipf_s: float = DEFAULT_ZIPF_S  # zipf and drift: the popularity exponent
    drift: float = 0.05  # drift: standard deviation of the per-iteration log-popularity step
    trace: str | None = None  # trace: path of the JSON trace

    def __post_init__(self) -> None:
        if self.kind not in ROUTING_KINDS:
            raise RoutingError(f"unknown routing '{self.kind}'; use one of {', '.join(ROUTING_KINDS)}")
        if self.zipf_s < 0 or self.drift < 0:
            raise RoutingError("zipf exponent and drift must be >= 0")
        if self.kind == "trace" and not self.trace:
            raise RoutingError("routing 'trace' needs a trace file (--routing-trace PATH)")

    def describe(self) -> str:
        if self.kind == "zipf":
            return f"zipf(s={self.zipf_s:g}, seed={self.seed})"
        if self.kind == "drift":
            return f"drift(s={self.zipf_s:g}, step={self.drift:g}, seed={self.seed})"
        if self.kind == "trace":
            return f"trace({Path(self.trace or '').name})"
        return f"balanced(seed={self.seed})"


def _load_trace(path: str, num_experts: int, moe_layers: int) -> np.ndarray:
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise RoutingError(f"routing trace '{path}' does not exist") from None
    except json.JSONDecodeError as err:
        raise RoutingError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(data, dict) or "counts" not in data or "num_experts" not in data:
        raise RoutingError(f"{path}: a routing trace is an object with 'num_experts' and 'counts' [iteration][layer][expert]")
    if data["num_experts"] != num_experts:
        raise RoutingError(f"{path}: the trace has {data['num_experts']} experts, the model {num_experts}")
    try:
        counts = np.asarray(data["counts"], dtype=np.float64)
    except (TypeError, ValueError):
        raise RoutingError(f"{path}: 'counts' must be a rectangular [iteration][layer][expert] array of numbers") from None
    if counts.ndim != 3 or counts.shape[0] < 1 or counts.shape[2] != num_experts:
        raise RoutingError(f"{path}: 'counts' has shape {list(counts.shape)}; expected [iterations, {moe_layers}, {num_experts}]")
    if counts.shape[1] != moe_layers:
        raise RoutingError(f"{path}: the trace has {counts.shape[1]} MoE layers, the model {moe_layers}")
    if (counts < 0).any() or (counts.sum(axis=2) <= 0).any():
        raise RoutingError(f"{path}: counts must be >= 0 with at least one token per layer and iteration")
    return counts


class RoutingModel:
    """Draws expert loads for one pipeline's micro-batches, iteration by iteration."""

    def __init__(
        self,
        spec: RoutingSpec,
        *,
        num_experts: int,
        top_k: int,
        ep: int,
        tokens_per_rank: int,
        moe_layers: list[int],
        decoder_layers: int,
        microbatches: int,
    ):
        if ep < 1 or num_experts < ep or num_experts % ep:
            raise RoutingError(f"{num_experts} experts cannot be split evenly over EP={ep} ranks")
        self.spec = spec
        self.num_experts = num_experts
        self.top_k = top_k
        self.ep = ep
        self.tokens_per_rank = tokens_per_rank
        self.moe_layers = list(moe_layers)
        self.decoder_layers = decoder_layers
        self.microbatches = microbatches
        self.slots = ep * tokens_per_rank * top_k  # token slots one layer routes per micro-batch
        self._trace = _load_trace(spec.trace, num_experts, len(self.moe_layers)) if spec.kind == "trace" and spec.trace else None
        self._drift_state: tuple[int, np.ndarray] | None = None
        self._loads: tuple[int, np.ndarray] | None = None

    def _zipf(self) -> np.ndarray:
        """Shuffled Zipf popularity per MoE layer, [layers, experts]."""
        ranks = np.arange(1, self.num_experts + 1, dtype=np.float64)
        base = ranks ** (-self.spec.zipf_s)
        base /= base.sum()
        out = np.empty((len(self.moe_layers), self.num_experts))
        for i, layer in enumerate(self.moe_layers):
            out[i] = np.random.default_rng([self.spec.seed, 1, layer]).permutation(base)
        return out

    def expert_probabilities(self, iteration: int) -> np.ndarray:
        """Expert popularity per MoE layer at ``iteration``: [moe layers, experts], rows sum to 1."""
        kind = self.spec.kind
        if kind == "balanced":
            return np.full((len(self.moe_layers), self.num_experts), 1.0 / self.num_experts)
        if kind == "zipf":
            return self._zipf()
        if kind == "trace":
            assert self._trace is not None
            counts = self._trace[iteration % self._trace.shape[0]]
            return counts / counts.sum(axis=1, keepdims=True)
        # drift: a random walk of log-popularity, advanced from the last state asked for.
        if self._drift_state is None or self._drift_state[0] > iteration:
            self._drift_state = (0, np.log(self._zipf()))
        step, logits = self._drift_state
        while step < iteration:
            step += 1
            logits = logits + np.random.default_rng([self.spec.seed, 2, step]).normal(0.0, self.spec.drift, logits.shape)
        self._drift_state = (step, logits)
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        return p / p.sum(axis=1, keepdims=True)

    def rank_loads(self, iteration: int) -> np.ndarray:
        """Token slots landing on each expert-parallel rank: [moe layers, micro-batches, EP]."""
        if self._loads is not None and self._loads[0] == iteration:
            return self._loads[1]
        p = self.expert_probabilities(iteration).reshape(len(self.moe_layers), self.ep, -1).sum(axis=2)
        p = p / p.sum(axis=1, keepdims=True)
        rng = np.random.default_rng([self.spec.seed, 3, iteration])
        pvals = np.broadcast_to(p[:, None, :], (len(self.moe_layers), self.microbatches, self.ep))
        loads = rng.multinomial(self.slots, pvals)
        self._loads = (iteration, loads)
        return loads

    def imbalance(self, iteration: int) -> np.ndarray:
        """Most loaded rank over the mean, per decoder layer and micro-batch (1.0 for layers without experts)."""
        out = np.ones((self.decoder_layers, self.microbatches))
        if self.moe_layers:
            loads = self.rank_loads(iteration)
            mean = loads.sum(axis=2) / self.ep
            out[self.moe_layers] = np.where(mean > 0, loads.max(axis=2) / np.maximum(mean, 1e-300), 1.0)
        return out

    def expert_counts(self, iteration: int, layer: int, microbatch: int) -> np.ndarray:
        """Per-expert token counts of one MoE decoder layer and micro-batch (they sum, per rank, to ``rank_loads``)."""
        if layer not in self.moe_layers:
            raise RoutingError(f"decoder layer {layer} has no experts")
        i = self.moe_layers.index(layer)
        loads = self.rank_loads(iteration)[i, microbatch]
        p = self.expert_probabilities(iteration)[i].reshape(self.ep, -1)
        rng = np.random.default_rng([self.spec.seed, 4, iteration, layer, microbatch])
        per_rank = p / p.sum(axis=1, keepdims=True)
        return np.concatenate([rng.multinomial(int(n), row) for n, row in zip(loads, per_rank)])
