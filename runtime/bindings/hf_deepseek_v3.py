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

GLM-4-MoE (``Glm4MoeForCausalLM``) has the same MoE, dense first layers and
router under softmax attention (``self_attn``, partial rotary and optional q/k
norms inside the module): its class derives from DeepSeek-V3's, and so does
ERNIE-4.5-MoE's (``Ernie4_5_MoeForCausalLM``: dense layers wherever its config
puts them, its own softmax router with the ``moe_statics`` correction, shared
experts optional).
"""

from __future__ import annotations

from torch import nn

from runtime.bindings.base import child, register_binding
from runtime.bindings.hf_moe import HFSparseMoeBinding


@register_binding
class DeepseekV3Binding(HFSparseMoeBinding):
    """transformers' ``DeepseekV3ForCausalLM``."""

    family = "deepseek_v3"
    causal_lm_classes = ("DeepseekV3ForCausalLM",)
    model_type = "deepseek_v3"
    mask_rule = "causal"
    mixer_kind = "mla"

    @classmethod
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        return child(mlp, ("shared_experts",), where + "'s MoE block"), None


@register_binding
class Glm4MoeBinding(DeepseekV3Binding):
    """transformers' ``Glm4MoeForCausalLM``: DeepSeek-V3's MoE (dense first layers, grouped sigmoid routing with bias
    correction, ungated shared experts) behind grouped-query softmax attention."""

    family = "glm4_moe"
    causal_lm_classes = ("Glm4MoeForCausalLM",)
    model_type = "glm4_moe"
    mixer_kind = "attention"


@register_binding
class Ernie45MoeBinding(DeepseekV3Binding):
    """transformers' ``Ernie4_5_MoeForCausalLM``: dense layers where ``moe_layer_start_index``/``moe_layer_end_index``/
    ``moe_layer_interval`` put them, a softmax router whose choice its ``moe_statics`` bias corrects, ungated shared
    experts where ``n_shared_experts`` > 0, softmax attention."""

    family = "ernie4_5_moe"
    causal_lm_classes = ("Ernie4_5_MoeForCausalLM",)
    model_type = "ernie4_5_moe"
    mixer_kind = "attention"

    @classmethod
    def shared_expert_of(cls, mlp: nn.Module, where: str) -> tuple[nn.Module | None, nn.Module | None]:
        shared = getattr(mlp, "shared_experts", None)
        return (shared if isinstance(shared, nn.Module) else None), None

