"""What each plan task computes on a model: the binding interface, its registry, the built-in families.

``runtime.bindings.base`` defines the interface (``ModelBinding``) and the
registry (``register_binding``, ``binding_for``); one module per family
registers its binding class when imported here, in this order:

- ``tiny``: models laid out like ``examples/tiny_qwen3_next.py``;
- ``hf_moe``: transformers' ``Qwen3MoeForCausalLM``, ``MixtralForCausalLM``, ``Qwen2MoeForCausalLM``,
  ``OlmoeForCausalLM`` and ``MiniMaxM2ForCausalLM``;
- ``hf_qwen3_next``: transformers' ``Qwen3NextForCausalLM``;
- ``hf_deepseek_v3``: transformers' ``DeepseekV3ForCausalLM``, ``Glm4MoeForCausalLM`` and
  ``Ernie4_5_MoeForCausalLM``.
"""

from __future__ import annotations

from runtime.bindings import hf_deepseek_v3, hf_moe, hf_qwen3_next, tiny
from runtime.bindings.base import (
    DECODER_OPS,
    MIXER_KINDS,
    MOE_OPS,
    WEIGHTED_OPS,
    BindingError,
    DecoderParts,
    DenseParts,
    ModelBinding,
    ModelParts,
    Routing,
    TaskFn,
    binding_for,
    loss_fn,
    register_binding,
    registered_bindings,
    task_boundary,
    task_op,
    unregister_binding,
)
from runtime.bindings.hf_deepseek_v3 import DeepseekV3Binding, Ernie45MoeBinding, Glm4MoeBinding
from runtime.bindings.hf_moe import (
    HFSparseMoeBinding,
    MiniMaxM2Binding,
    MixtralBinding,
    OlmoeBinding,
    Qwen2MoeBinding,
    Qwen3MoeBinding,
)
from runtime.bindings.hf_qwen3_next import Qwen3NextBinding
from runtime.bindings.tiny import TinyMoEBinding

__all__ = [
    "DECODER_OPS", "DeepseekV3Binding", "Ernie45MoeBinding", "Glm4MoeBinding", "MiniMaxM2Binding", "OlmoeBinding", "Qwen2MoeBinding", "MIXER_KINDS", "MOE_OPS", "WEIGHTED_OPS", "BindingError", "DecoderParts", "DenseParts", "HFSparseMoeBinding", "MixtralBinding",
    "ModelBinding", "ModelParts", "Qwen3MoeBinding", "Qwen3NextBinding", "Routing", "TaskFn", "TinyMoEBinding", "binding_for", "hf_deepseek_v3", "hf_moe", "hf_qwen3_next",
    "loss_fn", "register_binding", "registered_bindings", "task_boundary", "task_op", "tiny", "unregister_binding",
]
