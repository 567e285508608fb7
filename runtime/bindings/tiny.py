"""The binding of models laid out like ``examples/tiny_qwen3_next.py``.

By module structure: ``embed_tokens`` (layer ``embed``), ``norm`` + ``lm_head``
(layer ``head``, with the cross-entropy loss), decoder layers ``layers[i]``
(layer ``l<i>``) at the top of the model, each with an input norm
(``input_norm`` or ``input_layernorm``), a mixer (``mixer``, ``self_attn`` or
``linear_attn``, called on the normed input alone: softmax or linear attention
alike), a post-mixer norm (``post_mixer_norm`` or ``post_attention_layernorm``)
and a sparse MoE block (``moe`` or ``mlp``) with a Linear router ``gate``
(softmax, top-k, the top-k weights renormalised), an integer ``top_k``, fused
SwiGLU experts (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj``
[E, H, I]), a ``shared_expert`` MLP and its sigmoid ``shared_expert_gate``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from runtime.bindings.base import BindingError, DecoderParts, ModelBinding, ModelParts, TaskFn, child, register_binding


@register_binding
class TinyMoEBinding(ModelBinding):
    """Qwen3-Next-like models with the stack at the top (``model.layers``) and a Linear router."""

    family = "tiny_qwen3_next"

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        layers = getattr(model, "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            return False
        moe = getattr(layers[0], "moe", None) or getattr(layers[0], "mlp", None)
        return isinstance(getattr(moe, "gate", None), nn.Linear) and hasattr(moe, "shared_expert")

    @classmethod
    def locate(cls, model: nn.Module) -> ModelParts:
        layers = getattr(model, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise BindingError("the model has no 'layers' ModuleList of decoder layers")
        return ModelParts(
            child(model, ("embed_tokens",), "the model"), layers,
            child(model, ("norm",), "the model"), child(model, ("lm_head",), "the model"),
        )

    @classmethod
    def decoder_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DecoderParts:
        where = f"decoder layer {index}"
        moe = child(block, ("moe", "mlp"), where)
        gate = getattr(moe, "gate", None)
        if not isinstance(gate, nn.Linear):
            raise BindingError(f"{where}'s MoE block has no Linear router 'gate'")
        top_k = getattr(moe, "top_k", None)
        if not isinstance(top_k, int):
            raise BindingError(f"{where}'s MoE block has no integer 'top_k'")
        parts = DecoderParts(
            index, block,
            child(block, ("input_norm", "input_layernorm"), where),
            child(block, ("mixer", "self_attn", "linear_attn"), where),
            child(block, ("post_mixer_norm", "post_attention_layernorm"), where),
            moe, gate,
            child(moe, ("experts",), where + "'s MoE block"),
            top_k,
            child(moe, ("shared_expert",), where + "'s MoE block"),
            child(moe, ("shared_expert_gate",), where + "'s MoE block"),
        )
        parts.expert_weights()
        return parts

    @classmethod
    def model_name(cls, model: nn.Module) -> str | None:
        return None  # the tiny example's plans are named by whoever compiles them

    @classmethod
    def describe_layer(cls, model: nn.Module, index: int, block: nn.Module) -> tuple[str | None, str]:
        _, ffn = super().describe_layer(model, index, block)
        mixer = {"full_attention": "attention", "linear_attention": "linear_attention"}.get(getattr(block, "layer_type", None) or "")
        return mixer, ffn

    def gate_fn(self, layer: str) -> TaskFn:
        gate = self.decoder(layer).router
        top_k, hidden = self.top_k, self.hidden

        def route(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            probs = F.softmax(gate(n.reshape(-1, hidden)), dim=-1)
            weights, expert_index = torch.topk(probs, top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            order, counts = self.sort_slots(expert_index)
            return weights, order, counts

        return route
