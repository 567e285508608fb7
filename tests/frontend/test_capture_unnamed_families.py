"""transformers families found by probing the installed model types (issue 38's campaign), captured
exactly: each layer's kinds, and every parameter counted once (the IR's embedding, layers and head
against what transformers builds from the same default config).

- AFMoE: the router is a module holding its scoring Linear (``router.gate``), kept in fp32.
- Inkling: a top-k router scoring the routed and the two shared experts together ([E + 2, hidden]),
  shared experts as fused 3-D weights, and a short convolution whose forward hands ``self.conv1d`` to a
  helper through a wrapper fx cannot name (``path_of_module`` raised NameError: an internal error).
- ZAYA: a router that projects the hidden state down and scores experts through a small MLP.
- NanoChat: a weightless norm between the embedding and the first layer (the embedding was taken for
  that norm: an internal AttributeError).
"""

from __future__ import annotations

import warnings

import pytest
from capture_cache import hf_model

from frontend import capture
from frontend.errors import CaptureWarning
from tessera_ir import FfnKind
from tessera_ir.verifier import collect_errors

pytestmark = pytest.mark.slow


def _parameters_ir(module) -> int:
    d = 4 if module.attrs["dtype"] == "fp32" else 2
    embed = module.task_map()["embed.embedding.fwd"].param_bytes // d
    head = module.task_map()["head.lm_head.fwd"].param_bytes // d
    return embed + head + sum(int(layer.attrs["parameters"]) for layer in module.decoder_layers())


def _parameters_model(model_type: str) -> int:
    model = hf_model(model_type)
    total = sum(p.numel() for p in model.parameters())
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is model.get_input_embeddings().weight
    return total + (head.weight.numel() if tied else 0)  # a tied head: the first and last stage each hold it


@pytest.mark.parametrize(("model_type", "moe_layers"), [("afmoe", 31), ("inkling_text", 66), ("zaya", 40)])
def test_moe_routers_held_a_level_down_are_recognised_exactly(model_type: str, moe_layers: int) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        module = capture(f"hf:{model_type}", overrides={"seq_len": 512, "tp": 1})
    assert not [w for w in caught if issubclass(w.category, CaptureWarning)]
    assert collect_errors(module) == []
    layers = module.decoder_layers()
    assert sum(layer.ffn is FfnKind.MOE for layer in layers) == moe_layers
    assert _parameters_ir(module) == _parameters_model(model_type)
    router = module.task_map()[f"{layers[-1].name}.router.fwd"]
    assert router.flops > 0


def test_chunked_attention_counts_the_chunks_not_the_whole_causal_context() -> None:
    """Llama 4's local layers attend within 8192-token chunks: at 32K tokens their core is a quarter
    of full causal attention (it was counted as full, 4x too high). They are local attention with
    the chunk as their window, and the layer records its chunk."""
    from frontend import costs
    from tessera_ir import MixerKind

    seq = 32768
    module = capture("hf:llama4_text", overrides={"seq_len": seq, "tp": 1})
    config = hf_model("llama4_text").config
    declared = list(config.layer_types)
    layers = module.decoder_layers()
    assert [layer.mixer for layer in layers] == [
        MixerKind.SLIDING_ATTENTION if t == "chunked_attention" else MixerKind.ATTENTION for t in declared]
    assert {layer.attrs.get("attention_chunk") for layer in layers if layer.mixer is MixerKind.SLIDING_ATTENTION} == {8192}
    assert costs.causal_pairs(seq, 8192, 8192) == 4 * costs.causal_pairs(8192)
    tasks = module.task_map()
    chunked = tasks[f"{layers[declared.index('chunked_attention')].name}.sliding_attention.fwd"].flops
    full = tasks[f"{layers[declared.index('full_attention')].name}.attention.fwd"].flops
    heads, head_dim = config.num_attention_heads, config.head_dim
    core = [costs.attention_core(1, seq, heads, head_dim, head_dim, w, chunk=c).core_flops
            for w, c in ((None, None), (8192, 8192))]
    assert 3.9 < core[0] / core[1] < 4.1  # a quarter, less the diagonal's share
    assert full - chunked == core[0] - core[1]


def test_a_bare_language_model_holds_the_head_it_is_planned_with() -> None:
    """A model transformers builds without its causal-LM head (``*TextModel``): the head's
    projection, whose compute the plan counts, is counted in the last stage's weights too, with a
    warning saying so."""
    import torch
    from transformers import AutoConfig, Qwen3MoeForCausalLM, Qwen3MoeModel

    config = AutoConfig.for_model("qwen3_moe", num_hidden_layers=2, hidden_size=256, intermediate_size=512,
                                  moe_intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                                  num_experts=8, num_experts_per_tok=2, vocab_size=1000, tie_word_embeddings=False)
    with torch.device("meta"):
        bare, causal = Qwen3MoeModel(config), Qwen3MoeForCausalLM(config)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        planned = capture(bare, overrides={"seq_len": 64, "tp": 1})
    said = [str(w.message) for w in caught if issubclass(w.category, CaptureWarning)]
    assert len(said) == 1 and "Qwen3MoeModel has no output projection" in said[0] and "[1000, 256]" in said[0]
    reference = capture(causal, overrides={"seq_len": 64, "tp": 1})
    head, head_ref = planned.task_map()["head.lm_head.fwd"], reference.task_map()["head.lm_head.fwd"]
    assert head.param_bytes == head_ref.param_bytes and head.flops == head_ref.flops


def test_a_layer_running_mamba_beside_attention_is_summarised_as_both() -> None:
    from tessera_ir.summary import summarize

    module = capture("hf:falcon_h1", overrides={"seq_len": 512, "tp": 1})
    layers = summarize(module)["layers"]
    assert all(layer["mixers"] == ["ssm", "attention"] and layer["mixer"] == "ssm" for layer in layers)


@pytest.mark.parametrize(("model_type", "words"), [
    ("gemma4_text", "reads the config's 'head_dim' once for the whole stack, but this config sets it per layer"),
    ("dots3_note", "sets it per layer (per_layer_config)"),
    ("gemma3n_text", "KVSharingDict (state shared across layers)"),
    ("mistral_large4", "KVSharingDict (state shared across layers)"),
])
def test_stacks_that_cannot_be_planned_are_one_clear_refusal(model_type: str, words: str) -> None:
    from frontend.errors import CaptureError

    with pytest.raises(CaptureError) as info:
        capture(f"hf:{model_type}", overrides={"seq_len": 512, "tp": 1})
    assert words in str(info.value) and "\n" not in str(info.value)


# The model types issue 38's probe tried beyond the families bench/bench_families.py selects by their
# default config (a campaign over every installed type is `bench/bench_families.py --families ...`).
PROBED = ["lfm2", "falcon_h1", "zamba", "zamba2", "bamba", "granitemoehybrid", "llama4_text", "dots3_note",
          "mistral_large4", "afmoe", "inkling_text", "zaya", "lfm3", "nemotron_h", "xlstm", "mamba2", "falcon_mamba",
          "gemma3n_text", "gemma4_text", "hunyuan_v1_moe", "dbrx",
          # a second round, over causal-LM types neither MoE nor hybrid by their default config
          "nanochat", "blt", "dory", "hrm_text", "mllama", "kolibri1_1", "rwkv", "inkling2_loop_text", "dots1",
          "cohere_compass_text", "minicpm5_moe", "param2moe", "ergo"]


@pytest.mark.parametrize("model_type", PROBED)
def test_every_probed_family_is_captured_or_refused_as_a_user_error(model_type: str) -> None:
    from tessera_ir.errors import TesseraError

    try:
        module = capture(f"hf:{model_type}", overrides={"seq_len": 4096, "tp": 1})
    except TesseraError as err:
        assert "\n" not in str(err)
        return
    assert collect_errors(module) == []


def test_a_norm_between_the_embedding_and_the_first_layer() -> None:
    module = capture("hf:nanochat", overrides={"seq_len": 512, "tp": 1})
    assert module.layers[0].path == "model.embed_tokens"
    assert _parameters_ir(module) == _parameters_model("nanochat")
