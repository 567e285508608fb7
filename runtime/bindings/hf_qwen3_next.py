"""The binding of transformers' ``Qwen3NextForCausalLM``: hybrid linear/full attention, MoE with a gated shared expert.

The layout is that of ``hf_moe`` (``model.model.layers[i]`` with
``input_layernorm``, ``post_attention_layernorm`` and a sparse MoE block
``mlp``), with two differences the forwards follow:

- the mixer of layer ``i`` is ``config.layer_types[i]``: ``linear_attention``
  is the model's Gated DeltaNet (``linear_attn``, its torch path where the
  fused kernels are not installed) called with the recurrent (padding) mask
  the model builds, ``None`` for a full causal sequence; ``full_attention`` is
  the gated softmax attention (``self_attn``) with the model's rotary
  embedding and causal mask, as its decoder layer calls them;
- the MoE block has a ``shared_expert`` MLP scaled by
  ``sigmoid(shared_expert_gate(x))``, added to the routed experts' sum (the
  base binding's ``shared_fn`` and ``assemble_fn``).

The router is the model's own ``Qwen3NextTopKRouter`` (softmax, top-k,
``norm_topk_prob``). Dense MLP layers (``mlp_only_layers``,
``decoder_sparse_step`` > 1) run as the plan's ``dense_mlp`` tasks. Refused:
the auxiliary loss, attention dropout and tied embeddings.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from runtime.bindings.base import BindingError, TaskFn, child, register_binding
from runtime.bindings.hf_moe import HFSparseMoeBinding

LINEAR, FULL = "linear_attention", "full_attention"


@register_binding
class Qwen3NextBinding(HFSparseMoeBinding):
    """transformers' ``Qwen3NextForCausalLM`` (sparse layers with a shared expert, dense ones where the config says)."""

    family = "qwen3_next"
    causal_lm_classes = ("Qwen3NextForCausalLM",)
    model_type = "qwen3_next"
    mask_rule = "causal"  # its full-attention layers get create_causal_mask

    @classmethod
    def mixer_of(cls, block: nn.Module, where: str) -> nn.Module:
        kind = getattr(block, "block_type", None)
        if kind not in (LINEAR, FULL):
            raise BindingError(f"{where} has block_type {kind!r}; this binding knows '{LINEAR}' and '{FULL}'")
        return child(block, ("linear_attn",) if kind == LINEAR else ("self_attn",), where)

    @classmethod
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        return child(mlp, ("shared_expert",), where + "'s MoE block"), child(mlp, ("shared_expert_gate",), where + "'s MoE block")

    @classmethod
    def mixer_kind_of(cls, block: nn.Module) -> str:
        return "linear_attention" if getattr(block, "block_type", None) == LINEAR else "attention"

    def mixer_fn(self, layer: str) -> TaskFn:
        d = self.layer_parts(layer)
        if getattr(d.block, "block_type", None) == FULL:
            return super().mixer_fn(layer)
        from transformers.masking_utils import create_recurrent_attention_mask

        config: Any = self.model.config

        def linear_mixer_forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            # What the model passes its linear-attention layers for a batch without a padding mask (None today).
            mask = create_recurrent_attention_mask(config=config, inputs_embeds=x, attention_mask=None, cache=None)
            h = x + d.mixer(hidden_states=d.input_norm(x), cache=None, attention_mask=mask)
            return h, d.post_norm(h)

        return linear_mixer_forward
