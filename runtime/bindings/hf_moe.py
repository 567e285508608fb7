"""Bindings of transformers' sparse-MoE causal LMs: Qwen3-MoE and Mixtral.

Both lay the model out the same way: ``model.model.embed_tokens``,
``model.model.layers[i]`` (``input_layernorm``, ``self_attn``,
``post_attention_layernorm``, ``mlp`` with a router module ``gate`` and fused
experts ``experts.gate_up_proj``/``down_proj`` with their ``act_fn``),
``model.model.norm``, ``model.model.rotary_emb`` and ``model.lm_head``. Every
forward calls the model's own modules the way its decoder layer does:

- the mixer: the attention module with the rotary embedding of the model
  (``rotary_emb(x, position_ids)``) and the causal mask its model's forward
  builds for that layer (``mask_rule``: ``create_causal_mask``, or the
  sliding-window one when the config sets ``sliding_window`` (Qwen3-MoE,
  Mixtral) or the layer's ``layer_types`` entry says ``sliding_attention``
  (Qwen2-MoE)), positions ``0..seq-1``;
- the router: the model's router module, so the scoring function and
  ``norm_topk_prob`` (Qwen3-MoE trains unnormalised top-k weights by default)
  are the model's, never re-implemented here;
- the experts: each local expert's ``gate_up_proj``/``down_proj`` with the
  experts' own ``act_fn``.

The same layout serves OLMoE (``OlmoeForCausalLM``, its attention's q/k
norms inside the module), Qwen2-MoE (``Qwen2MoeForCausalLM``, with a
``shared_expert`` scaled by ``sigmoid(shared_expert_gate(x))``) and
MiniMax-M2 (``MiniMaxM2ForCausalLM``, whose router takes the block's
``e_score_correction_bias``).

What these bindings do not reproduce is refused when the session starts,
naming the setting: the load-balancing auxiliary loss
(``output_router_logits=True``), router jitter, attention dropout and tied
input/output embeddings. Dense MLP layers (an ``mlp`` without experts:
``mlp_only_layers``, ``decoder_sparse_step`` > 1) run as the plan's
``dense_mlp`` tasks. Token ids are a full causal sequence: no padding
mask, no packed ``position_ids``.

transformers is imported only when one of these models is bound (the runtime
itself needs only torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from runtime.bindings.base import (
    BindingError,
    DecoderParts,
    DenseParts,
    ModelBinding,
    ModelParts,
    TaskFn,
    child,
    register_binding,
)


class HFSparseMoeBinding(ModelBinding):
    """The layout shared by transformers' Qwen3-MoE and Mixtral causal LMs (see the module docstring)."""

    causal_lm_classes: tuple[str, ...] = ()
    model_type = ""
    # Which causal mask the model's forward gives a layer's attention: 'sliding_window' (the sliding-window
    # mask where config.sliding_window is set), 'layer_types' (per config.layer_types[i]) or 'causal' (always).
    mask_rule = "sliding_window"
    mixer_kind = "attention"  # the plan's name for the mixer tasks of this family's layers

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
            cls.mixer_of(block, where),
            child(block, ("post_attention_layernorm",), where),
            mlp, router, experts, top_k,
            *cls.shared_expert_of(mlp, where),
        )
        parts.expert_weights()
        return parts

    @classmethod
    def dense_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DenseParts | None:
        """A layer whose ``mlp`` has no experts is dense (``mlp_only_layers``, ``decoder_sparse_step``,
        ``first_k_dense_replace``, ...): its MLP's own gate/up/down projections and activation."""
        where = f"decoder layer {index} (model.model.layers.{index})"
        mlp = child(block, ("mlp",), where)
        if isinstance(getattr(mlp, "experts", None), nn.Module):
            return None
        for name in ("gate_proj", "up_proj", "down_proj"):
            child(mlp, (name,), f"{where}'s dense MLP")
        return DenseParts(
            index, block, child(block, ("input_layernorm",), where), cls.mixer_of(block, where),
            child(block, ("post_attention_layernorm",), where), mlp,
        )

    @classmethod
    def mixer_kind_of(cls, block: nn.Module) -> str:
        """The plan's name for the mixer of decoder layer ``block`` (``mixer_kind``)."""
        return cls.mixer_kind

    @classmethod
    def describe_layer(cls, model: nn.Module, index: int, block: nn.Module) -> tuple[str | None, str]:
        """(mixer kind, feed-forward) of decoder layer ``index`` in a plan's words: ``dense``, ``moe`` or ``moe+shared``."""
        kind = cls.mixer_kind_of(block)
        if kind == "attention" and cls.sliding_layer(model, index):
            kind = "sliding_attention"  # as the mixer forward runs it: the sliding-window causal mask
        if cls.dense_parts(model, index, block) is not None:
            return kind, "dense"
        parts = cls.decoder_parts(model, index, block)
        return kind, ("moe+shared" if parts.shared_expert is not None else "moe")

    @classmethod
    def mixer_of(cls, block: nn.Module, where: str) -> nn.Module:
        """The decoder layer's token mixer (its softmax attention ``self_attn`` here)."""
        return child(block, ("self_attn",), where)

    @classmethod
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        """(shared expert, its sigmoid gate) of the MoE block; (None, None) in families without one."""
        return None, None

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        config: Any = model.config
        if getattr(config, "output_router_logits", False):
            raise BindingError(
                f"{type(model).__name__}: config.output_router_logits=True adds the load-balancing auxiliary loss "
                f"(router_aux_loss_coef={getattr(config, 'router_aux_loss_coef', None)}), which this binding does not "
                "train yet; set config.output_router_logits=False"
            )
        dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
        if dropout > 0:
            raise BindingError(
                f"{type(model).__name__}: config.attention_dropout={dropout} drops attention weights at random in "
                "training, which this binding does not reproduce (its draws differ across the plan's ranks); set it to 0"
            )
        if getattr(config, "tie_word_embeddings", False):
            raise BindingError(
                f"{type(model).__name__}: config.tie_word_embeddings=True ties lm_head to the embedding across pipeline "
                "stages, which this binding does not train yet; untie them (tie_word_embeddings=False)"
            )
        super().check_model(model)

    # ------------------------------------------------------------ forwards

    @classmethod
    def sliding_layer(cls, model: nn.Module, index: int) -> bool:
        """Whether the model's forward gives decoder layer ``index`` the sliding-window causal mask (``mask_rule``)."""
        config: Any = model.config
        if cls.mask_rule == "causal":
            return False
        if cls.mask_rule == "layer_types":
            return list(config.layer_types)[index] == "sliding_attention"
        return getattr(config, "sliding_window", None) is not None

    def _positions(self, x: torch.Tensor, index: int) -> tuple[torch.Tensor, Any, Any]:
        """(position ids, rotary (cos, sin), causal mask) of a full sequence for decoder layer ``index``, as the model's forward builds them."""
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        config: Any = self.model.config
        inner: Any = self.model.model
        position_ids = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        mask_function = create_sliding_window_causal_mask if self.sliding_layer(self.model, index) else create_causal_mask
        mask = mask_function(config=config, inputs_embeds=x, attention_mask=None, cache=None, position_ids=position_ids)
        return position_ids, inner.rotary_emb(x, position_ids=position_ids), mask

    def mixer_fn(self, layer: str) -> TaskFn:
        d = self.layer_parts(layer)
        positions = self._positions

        def mixer_forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            position_ids, position_embeddings, mask = positions(x, d.index)
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
    """transformers' ``Qwen3MoeForCausalLM`` (dense layers where ``mlp_only_layers``/``decoder_sparse_step`` put them)."""

    family = "qwen3_moe"
    causal_lm_classes = ("Qwen3MoeForCausalLM",)
    model_type = "qwen3_moe"


@register_binding
class MixtralBinding(HFSparseMoeBinding):
    """transformers' ``MixtralForCausalLM``."""

    family = "mixtral"
    causal_lm_classes = ("MixtralForCausalLM",)
    model_type = "mixtral"

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        cls.check_model_jitter(model)
        super().check_model(model)

    @staticmethod
    def check_model_jitter(model: nn.Module) -> None:
        """Refuse ``router_jitter_noise`` > 0 (random noise on the router input in training)."""
        jitter = float(getattr(getattr(model, "config", None), "router_jitter_noise", 0.0) or 0.0)
        if jitter > 0:
            raise BindingError(
                f"{type(model).__name__}: config.router_jitter_noise={jitter} multiplies the router input by random noise "
                "in training, which this binding does not reproduce; set it to 0"
            )


@register_binding
class Qwen2MoeBinding(Qwen3MoeBinding):
    """transformers' ``Qwen2MoeForCausalLM``: Qwen3-MoE's layout with a sigmoid-gated shared expert, masks per layer type."""

    family = "qwen2_moe"
    causal_lm_classes = ("Qwen2MoeForCausalLM",)
    model_type = "qwen2_moe"
    mask_rule = "layer_types"

    @classmethod
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        return child(mlp, ("shared_expert",), where + "'s MoE block"), child(mlp, ("shared_expert_gate",), where + "'s MoE block")


@register_binding
class OlmoeBinding(HFSparseMoeBinding):
    """transformers' ``OlmoeForCausalLM`` (every layer sparse; the model's forward always gives the full causal mask)."""

    family = "olmoe"
    causal_lm_classes = ("OlmoeForCausalLM",)
    model_type = "olmoe"
    mask_rule = "causal"


@register_binding
class MiniMaxM2Binding(HFSparseMoeBinding):
    """transformers' ``MiniMaxM2ForCausalLM``: sigmoid routing whose choice the MoE block's ``e_score_correction_bias``
    biases (the router is called with it, as the block calls it); the full causal mask."""

    family = "minimax_m2"
    causal_lm_classes = ("MiniMaxM2ForCausalLM",)
    model_type = "minimax_m2"
    mask_rule = "causal"

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        MixtralBinding.check_model_jitter(model)
        super().check_model(model)

    def gate_fn(self, layer: str) -> TaskFn:
        d = self.decoder(layer)
        router, moe = d.router, d.moe
        hidden = self.hidden

        def route(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            bias = getattr(moe, "e_score_correction_bias", None)
            if not isinstance(bias, torch.Tensor):
                raise BindingError(f"the MoE block of {layer} has no 'e_score_correction_bias' for its router")
            _, weights, expert_index = router(n.reshape(-1, hidden), bias)
            order, counts = self.sort_slots(expert_index)
            return weights, order, counts

        return route
