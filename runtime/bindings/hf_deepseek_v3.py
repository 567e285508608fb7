"""The binding of transformers' ``DeepseekV3ForCausalLM``: MLA, dense first layers, grouped sigmoid routing, shared experts.

The layout is that of ``hf_moe`` (``model.model.layers[i]`` with
``input_layernorm``, ``self_attn``, ``post_attention_layernorm``, ``mlp``), and
every forward calls the model's own modules:

- the mixer: the multi-head latent attention (``self_attn``, its low-rank
  query/key-value projections and their norms inside it) with the model's
  rotary embedding and causal mask, as its decoder layer calls it;
- the first ``first_k_dense_replace`` layers are dense: their ``mlp`` is one
  MLP (the plan's ``dense_mlp`` task), ``h + mlp(n)``;
- the other layers' router is the model's ``DeepseekV3TopkRouter``: sigmoid
  scores, the choice biased by ``e_score_correction_bias`` within the
  ``topk_group`` best of ``n_group`` groups, the top-k weights taken from the
  unbiased scores, ``norm_topk_prob`` and ``routed_scaling_factor`` applied;
- the ``shared_experts`` MLP is added to the routed sum ungated.

``e_score_correction_bias`` is a buffer, used as the model has it: transformers
trains no update rule for it, and neither does this binding. Refused: tied
embeddings and attention dropout (random in training, its draws not
reproducible across the plan's ranks).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from runtime.bindings.base import BindingError, DenseParts, child, register_binding
from runtime.bindings.hf_moe import HFSparseMoeBinding


@register_binding
class DeepseekV3Binding(HFSparseMoeBinding):
    """transformers' ``DeepseekV3ForCausalLM``."""

    family = "deepseek_v3"
    causal_lm_classes = ("DeepseekV3ForCausalLM",)
    model_type = "deepseek_v3"

    @classmethod
    def dense_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DenseParts | None:
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
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        return child(mlp, ("shared_experts",), where + "'s MoE block"), None

    @classmethod
    def describe_layer(cls, model: nn.Module, index: int, block: nn.Module) -> tuple[str | None, str]:
        """(mixer kind, feed-forward) of decoder layer ``index`` in a plan's words: MLA, dense or MoE with shared experts."""
        if cls.dense_parts(model, index, block) is not None:
            return "mla", "dense"
        cls.decoder_parts(model, index, block)
        return "mla", "moe+shared"

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        config: Any = model.config
        dropout = float(getattr(config, "attention_dropout", 0.0) or 0.0)
        if dropout > 0:
            raise BindingError(
                f"DeepseekV3ForCausalLM: config.attention_dropout={dropout} drops attention weights at random in "
                "training, which this binding does not reproduce; set it to 0"
            )
        super().check_model(model)
