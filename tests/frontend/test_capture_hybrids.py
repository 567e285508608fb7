"""Real transformers hybrid families the recognisers were never written for.

MiniMax (lightning attention), Kimi Linear and Bailing (KDA delta rule beside MLA), OLMo Hybrid
(Gated DeltaNet with separate q/k/v projections), Qwen3.5 (a decoder stack that branches on the
rank of its multimodal position ids), EXAONE-MoE (a window kept on full-attention layers), LFM2
(gated short convolutions) and GLM-5-Next (sparse MLA that cannot run on meta: warned best guesses).
Each layer's mixer must match the config's own layer_types; every parameter must be counted once.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from capture_cache import hf_model
from transformers import AutoConfig

from frontend import capture
from frontend.errors import CaptureWarning
from tessera_ir import MixerKind
from tessera_ir.summary import summarize
from tessera_ir.verifier import collect_errors

pytestmark = pytest.mark.slow

_DECLARED = {"linear_attention": MixerKind.LINEAR_ATTENTION, "conv": MixerKind.LINEAR_ATTENTION,
             "sliding_attention": MixerKind.SLIDING_ATTENTION, "full_attention": MixerKind.ATTENTION}


def _capture(source: str):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        module = capture(source)
    return module, [str(w.message) for w in caught if issubclass(w.category, CaptureWarning)]


def _expected(model_type: str, full: MixerKind = MixerKind.ATTENTION) -> list[MixerKind]:
    config = hf_model(model_type).config
    config = getattr(config, "text_config", None) or config
    return [full if t == "full_attention" else _DECLARED[t] for t in config.layer_types]


def _check_parameters(module, model) -> None:
    """The model's parameters, counted once: per decoder layer, plus embedding, final norm and head."""
    total = sum(p.numel() for p in model.parameters())
    assert module.attrs["parameters"] == total
    layers = sum(int(layer.attrs["parameters"]) for layer in module.decoder_layers())
    outside = sum(p.numel() for name, p in model.named_parameters() if ".layers." not in f".{name}")
    assert layers + outside == total


@pytest.mark.parametrize(
    ("model_type", "full"),
    [
        ("minimax", MixerKind.ATTENTION),
        ("kimi_linear", MixerKind.MLA),
        ("bailing_hybrid", MixerKind.MLA),
        ("olmo_hybrid", MixerKind.ATTENTION),
        ("qwen3_5", MixerKind.ATTENTION),
        ("qwen3_5_moe", MixerKind.ATTENTION),
        ("exaone_moe", MixerKind.ATTENTION),
    ],
)
def test_hybrid_families_match_their_declared_layer_types(model_type, full):
    module, caught = _capture(f"hf:{model_type}")
    assert [layer.mixer for layer in module.decoder_layers()] == _expected(model_type, full)
    assert caught == []
    assert summarize(module)["warnings"] == []
    _check_parameters(module, hf_model(model_type))
    assert collect_errors(module) == []


def test_minimax_lightning_layers_grow_linearly_with_the_sequence():
    def mixer_flops(seq_len: int) -> tuple[int, int]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", CaptureWarning)
            module = capture("hf:minimax", overrides={"seq_len": seq_len})
        layers = module.decoder_layers()
        return layers[0].task("l0.attention.fwd").flops, layers[1].task("l1.linear_attention.fwd").flops

    (softmax_4k, lightning_4k), (softmax_32k, lightning_32k) = mixer_flops(4096), mixer_flops(32768)
    assert lightning_32k == pytest.approx(8 * lightning_4k, rel=0.01)  # linear in the sequence
    assert softmax_32k > 20 * softmax_4k  # the quadratic core takes over
    assert softmax_32k > 2 * lightning_32k


def test_lfm2_short_convolutions(tmp_path: Path):
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "lfm2", "num_hidden_layers": 6, "full_attn_idxs": [2, 5]}')
    module, caught = _capture(str(config))
    assert [layer.mixer for layer in module.decoder_layers()] == [
        MixerKind.LINEAR_ATTENTION, MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION] * 2
    assert caught == []


def test_glm5_next_sparse_mla_is_a_warned_best_guess(tmp_path: Path):
    # 8 of its 45 layers: each layer's hyper-connection glue runs on meta, which takes a while.
    path = tmp_path / "config.json"
    path.write_text('{"model_type": "glm5_next", "text_config": {"num_hidden_layers": 8}}')
    module, caught = _capture(str(path))
    declared = list(AutoConfig.for_model("glm5_next", text_config={"num_hidden_layers": 8}).text_config.layer_types)
    kinds = [layer.mixer for layer in module.decoder_layers()]
    assert kinds == [MixerKind.LINEAR_ATTENTION if t == "linear_attention" else MixerKind.MLA for t in declared]
    unconfirmed = [i for i, t in enumerate(declared) if t != "linear_attention"]
    assert unconfirmed == [3, 7]
    # transformers builds it as the bare model (no causal-LM head): the head's projection is planned anyway.
    bare = [w for w in caught if "has no output projection" in w]
    assert len(bare) == 1 and "[154880, 4096] vocabulary projection" in bare[0]
    caught = [w for w in caught if w not in bare]
    # One warning for the layers it holds for; the summary marks each of them.
    assert len(caught) == 1 and caught[0].startswith("layers 3, 7 (2 layers): cannot confirm what "
                                                     "'language_model.layers.N.self_attn' (Glm5NextTextAttention)")
    assert "counted as mla from its structure alone" in caught[0] and "--layer-kind N=KIND" in caught[0]
    summary = summarize(module)
    assert [layer["index"] for layer in summary["layers"] if layer.get("mixer_source") == "structure"] == unconfirmed
    assert len(summary["warnings"]) == 2 and summary["warnings"][0].startswith("layer 3: cannot confirm")
