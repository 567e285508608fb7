"""Bindings of transformers' sparse-MoE causal LMs: Qwen3-MoE and Mixtral.

Both lay the model out the same way: ``model.model.embed_tokens``,
``model.model.layers[i]`` (``input_layernorm``, ``self_attn``,
``post_attention_layernorm``, ``mlp`` with a router module ``gate`` and fused
experts ``experts.gate_up_proj``/``down_proj`` with their ``act_fn``),
``model.model.norm``, ``model.model.rotary_emb`` and ``model.lm_head``. Every
forward calls the model's own modules the way its decoder layer does:

- the mixer: the attention module with the rotary embedding of the model
  (``rotary_emb(x, position_ids)``) and the causal mask transformers builds
  for the model's config (``create_causal_mask``, or the sliding-window one
  when the config sets ``sliding_window``), positions ``0..seq-1``;
- the router: the model's router module, so the scoring function and
  ``norm_topk_prob`` (Qwen3-MoE trains unnormalised top-k weights by default)
  are the model's, never re-implemented here;
- the experts: each local expert's ``gate_up_proj``/``down_proj`` with the
  experts' own ``act_fn``.

What these bindings do not reproduce is refused when the session starts,
naming the setting: the load-balancing auxiliary loss
(``output_router_logits=True``), Mixtral's router jitter, Qwen3-MoE's dense
MLP layers (``mlp_only_layers``, ``decoder_sparse_step`` > 1) and tied
input/output embeddings. Token ids are a full causal sequence: no padding
mask, no packed ``position_ids``.

transformers is imported only when one of these models is bound (the runtime
itself needs only torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from runtime.bindings.base import BindingError, DecoderParts, ModelBinding, ModelParts, TaskFn, child, register_binding


class HFSparseMoeBinding(ModelBinding):
    """The layout shared by transformers' Qwen3-MoE and Mixtral causal LMs (see the module docstring)."""

    causal_lm_classes: tuple[str, ...] = ()
    model_type = ""

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        config = getattr(model, "config", None)
        return type(model).__name__ in cls.causal_lm_classes and getattr(config, "model_type", None) == cls.model_type

    @classmethod
    def locate(cls, model: nn.Module) -> ModelParts:
        inner = child(model, ("model",), f"the {type(model).__name__}")
        layers = getattr(inner, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise BindingError(f"the {type(model).__name__} has no 'model.layers' ModuleList of decoder layers")
        return ModelParts(
            child(inner, ("embed_tokens",), "model.model"), layers,
            child(inner, ("norm",), "model.model"), child(model, ("lm_head",), f"the {type(model).__name__}"),
        )

    @classmethod
    def decoder_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DecoderParts:
        where = f"decoder layer {index} (model.model.layers.{index})"
        mlp = child(block, ("mlp",), where)
        router = getattr(mlp, "gate", None)
        experts = getattr(mlp, "experts", None)
        if not isinstance(router, nn.Module) or not isinstance(experts, nn.Module):
            raise BindingError(
                f"{where} has a dense MLP ({type(mlp).__name__}) where this binding needs a sparse MoE block "
                "with a router 'gate' and 'experts'; dense layers are not supported yet"
            )
        top_k = getattr(router, "top_k", None)
        if not isinstance(top_k, int):
            raise BindingError(f"{where}'s router ({type(router).__name__}) has no integer 'top_k'")
        parts = DecoderParts(
            index, block,
            child(block, ("input_layernorm",), where),
            child(block, ("self_attn",), where),
            child(block, ("post_attention_layernorm",), where),
            mlp, router, experts, top_k,
        )
        parts.expert_weights()
        return parts

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        config: Any = model.config
        if getattr(config, "output_router_logits", False):
            raise BindingError(
                f"{type(model).__name__}: config.output_router_logits=True adds the load-balancing auxiliary loss "
                f"(router_aux_loss_coef={getattr(config, 'router_aux_loss_coef', None)}), which this binding does not "
                "train yet; set config.output_router_logits=False"
            )
        if getattr(config, "tie_word_embeddings", False):
            raise BindingError(
                f"{type(model).__name__}: config.tie_word_embeddings=True ties lm_head to the embedding across pipeline "
                "stages, which this binding does not train yet; untie them (tie_word_embeddings=False)"
            )
        super().check_model(model)

    @classmethod
    def describe_layer(cls, model: nn.Module, index: int, block: nn.Module) -> tuple[str | None, str]:
        cls.decoder_parts(model, index, block)
        # As the mixer forward below: a sliding-window mask on every layer when the config sets a window.
        sliding = getattr(getattr(model, "config", None), "sliding_window", None) is not None
        return ("sliding_attention" if sliding else "attention"), "moe"

    # ------------------------------------------------------------ forwards

    def _positions(self, x: torch.Tensor) -> tuple[torch.Tensor, Any, Any]:
        """(position ids, rotary (cos, sin), causal mask) of a full sequence, as the model's own forward builds them."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        config: Any = self.model.config
        inner: Any = self.model.model
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask_function = create_causal_mask if getattr(config, "sliding_window", None) is None else create_sliding_window_causal_mask
        mask = mask_function(config=config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids)
        return position_ids, inner.rotary_emb(x, position_ids=position_ids), mask

    def mixer_fn(self, layer: str) -> TaskFn:
        d = self.decoder(layer)
        positions = self._positions

        def mixer_forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            position_ids, position_embeddings, mask = positions(x)
            attended, _ = d.mixer(
                hidden_states=d.input_norm(x), position_embeddings=position_embeddings, attention_mask=mask,
                position_ids=position_ids,
            )
            h = x + attended
            return h, d.post_norm(h)

        return mixer_forward

    def gate_fn(self, layer: str) -> TaskFn:
        router = self.decoder(layer).router
        hidden = self.hidden

        def route(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            _, weights, expert_index = router(n.reshape(-1, hidden))
            order, counts = self.sort_slots(expert_index)
            return weights, order, counts

        return route

    def expert_activation(self, layer: str) -> Callable[[torch.Tensor], torch.Tensor]:
        act = getattr(self.decoder(layer).experts, "act_fn", None)
        if not callable(act):
            raise BindingError(f"the experts of {layer} have no 'act_fn'")
        return act  # type: ignore[no-any-return]


@register_binding
class Qwen3MoeBinding(HFSparseMoeBinding):
    """transformers' ``Qwen3MoeForCausalLM`` (every layer sparse)."""

    family = "qwen3_moe"
    causal_lm_classes = ("Qwen3MoeForCausalLM",)
    model_type = "qwen3_moe"

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        config: Any = model.config
        dense = list(getattr(config, "mlp_only_layers", None) or [])
        step = int(getattr(config, "decoder_sparse_step", 1) or 1)
        if step != 1:
            dense += [i for i in range(config.num_hidden_layers) if (i + 1) % step]
        if dense:
            raise BindingError(
                f"Qwen3MoeForCausalLM: layers {sorted(set(dense))} are dense MLP layers (mlp_only_layers, "
                f"decoder_sparse_step={step}); this binding trains only all-sparse models yet"
            )
        super().check_model(model)


@register_binding
class MixtralBinding(HFSparseMoeBinding):
    """transformers' ``MixtralForCausalLM``."""

    family = "mixtral"
    causal_lm_classes = ("MixtralForCausalLM",)
    model_type = "mixtral"

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        jitter = float(getattr(model.config, "router_jitter_noise", 0.0) or 0.0)
        if jitter > 0:
            raise BindingError(
                f"MixtralForCausalLM: config.router_jitter_noise={jitter} multiplies the router input by random noise "
                "in training, which this binding does not reproduce; set it to 0"
            )
        super().check_model(model)
