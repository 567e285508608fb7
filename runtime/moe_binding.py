"""The names the runtime's task binding had before it became a registry of families (``runtime.bindings``).

``MoEBinding`` is the binding of the tiny Qwen3-Next layout
(``runtime.bindings.tiny.TinyMoEBinding``); ``shard_experts`` shards any model
a registered family binds. New code imports from ``runtime.bindings``.
"""

from __future__ import annotations

from torch import nn

from runtime.bindings.base import (
    DECODER_OPS,
    MIXER_KINDS,
    WEIGHTED_OPS,
    BindingError,
    Routing,
    binding_for,
    loss_fn,
    task_boundary,
    task_op,
)
from runtime.bindings.tiny import TinyMoEBinding

MoEBinding = TinyMoEBinding


def shard_experts(model: nn.Module, ep_rank: int, ep: int) -> None:
    """Keep only EP rank ``ep_rank``'s experts in every MoE block, as new parameters (in place)."""
    binding_for(model).shard_experts(model, ep_rank, ep)


__all__ = [
    "DECODER_OPS", "MIXER_KINDS", "WEIGHTED_OPS", "BindingError", "MoEBinding", "Routing", "loss_fn", "shard_experts",
    "task_boundary", "task_op",
]
