"""Mixer kinds from what blocks do: linear attention written several ways, softmax attention, short convs.

Nothing here registers a recogniser: the blocks in ``hybrids`` use softmax-attention names or
names no recogniser reads, so only running them on meta tensors can tell what they are.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from hybrids import (
    CHUNK,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    SEQ,
    ChunkedDeltaRule,
    CumsumLinearAttention,
    DataDependentAttention,
    DataDependentMixer,
    LightningBlock,
    PerTokenBlock,
    Retention,
    RotaryStack,
    SdpaAttention,
    ShortConvMixer,
    SoftmaxAttention,
    VisionLanguage,
    build,
)

from frontend import CaptureError, UnrecognisedLayerError, capture
from frontend.behaviour import observe
from frontend.errors import CaptureWarning, LayerKindError
from frontend.trace import capture_stack
from tessera_ir import MixerKind
from tessera_ir.summary import summarize
from tessera_ir.verifier import collect_errors


def _capture(model, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        module = capture(model, overrides={"seq_len": SEQ, "micro_batch_size": 2, "dtype": "fp32"}, **kw)
    return module, [str(w.message) for w in caught if issubclass(w.category, CaptureWarning)]


def _observe(block_type):
    with torch.device("meta"):
        block = block_type()
    return observe(block, (torch.empty(2, SEQ, HIDDEN, device="meta"),), {}, batch=2, seq_len=SEQ)


@pytest.mark.parametrize("block_type", [CumsumLinearAttention, ChunkedDeltaRule, Retention, LightningBlock])
def test_linear_attention_written_four_ways_is_linear_attention(block_type):
    module, caught = _capture(build(SdpaAttention, block_type, SoftmaxAttention, block_type))
    kinds = [layer.mixer for layer in module.decoder_layers()]
    assert kinds == [MixerKind.ATTENTION, MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION, MixerKind.LINEAR_ATTENTION]
    assert caught == []
    assert collect_errors(module) == []
    # Linear attention is named by its own task, and costs less than softmax attention at this length.
    linear = module.task_map()["l1.linear_attention.fwd"]
    softmax = module.task_map()["l0.attention.fwd"]
    assert linear.flops > 0 and softmax.flops > 0


def test_each_form_shows_its_own_evidence():
    cumsum = _observe(CumsumLinearAttention)
    assert cumsum.prefix_sum_over_sequence and not cumsum.softmax
    assert cumsum.prefix_sum_shape == (2, SEQ, HEADS, HEAD_DIM, HEAD_DIM)

    delta = _observe(ChunkedDeltaRule)
    assert delta.state_shape == (2, HEADS, HEAD_DIM, HEAD_DIM) and delta.delta_rule
    assert delta.state_chunk == CHUNK and delta.state_updates == SEQ // CHUNK

    retention = _observe(Retention)
    assert retention.scores_without_softmax and not retention.softmax and retention.state_shape is None

    lightning = _observe(LightningBlock)
    assert lightning.state_shape == (2, HEADS, HEAD_DIM, HEAD_DIM) and not lightning.delta_rule
    assert lightning.state_chunk == CHUNK

    conv = _observe(ShortConvMixer)
    assert (conv.conv_channels, conv.conv_kernel) == (HIDDEN, 3) and not conv.softmax

    for softmax in (_observe(SoftmaxAttention), _observe(SdpaAttention)):
        assert softmax.softmax and not softmax.linear
        assert softmax.attention is not None and softmax.attention.query == (2, HEADS, SEQ, HEAD_DIM)

    per_token = _observe(PerTokenBlock)
    assert not per_token.mixes_tokens and per_token.stopped == ""


def test_linear_attention_is_sized_from_its_state():
    module, _ = _capture(build(LightningBlock, ChunkedDeltaRule, CumsumLinearAttention))
    by_layer = {layer.index: layer.task(f"l{layer.index}.linear_attention.fwd") for layer in module.decoder_layers()}
    b, s, h, d = 2, SEQ, HEADS, HEAD_DIM
    projections = 2 * b * s * (HIDDEN * 3 * h * d + h * d * HIDDEN)
    chunks = s // CHUNK
    lightning_core = b * h * chunks * (2 * CHUNK * CHUNK * (d + d) + 4 * CHUNK * d * d)
    assert by_layer[0].flops == projections + lightning_core
    # The delta rule is costed by the chunked delta-rule formula, the prefix-sum form token by token.
    delta_core = b * h * chunks * (2 * CHUNK * CHUNK * (3 * d + 2 * d) + (2 * CHUNK**3) // 3 + 6 * CHUNK * d * d)
    delta_projections = 2 * b * s * (HIDDEN * 3 * h * d + HIDDEN * h + h * d * HIDDEN)
    assert by_layer[1].flops == delta_projections + delta_core
    assert by_layer[2].flops == projections + b * h * s * (2 * (d + d) + 4 * d * d)


def test_short_conv_mixer_is_linear_attention_costed_by_its_conv():
    module, caught = _capture(build(ShortConvMixer, SdpaAttention))
    assert [layer.mixer for layer in module.decoder_layers()] == [MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION]
    assert caught == []
    task = module.task_map()["l0.linear_attention.fwd"]
    tokens = 2 * SEQ
    assert task.flops == 2 * tokens * (HIDDEN * 3 * HIDDEN + HIDDEN * HIDDEN) + 2 * tokens * HIDDEN * 3


def test_a_block_that_cannot_run_on_meta_is_a_warned_best_guess():
    module, caught = _capture(build(DataDependentAttention, SdpaAttention))
    assert [layer.mixer for layer in module.decoder_layers()] == [MixerKind.ATTENTION, MixerKind.ATTENTION]
    assert len(caught) == 1
    message = caught[0]
    assert message.startswith("layer 0: cannot confirm what 'layers.0.mixer' (DataDependentAttention) does")
    assert "counted as attention from its structure alone" in message and "--layer-kind 0=KIND" in message
    summary = summarize(module)
    assert summary["layers"][0]["mixer_source"] == "structure"
    assert summary["layers"][0]["warnings"] == [message] and summary["warnings"] == [message]
    assert "mixer_source" not in summary["layers"][1]


def test_the_same_doubt_about_several_layers_is_one_warning():
    module, caught = _capture(build(DataDependentAttention, SdpaAttention, DataDependentAttention,
                                    DataDependentAttention))
    assert len(caught) == 1
    assert caught[0].startswith("layers 0, 2-3 (3 layers): cannot confirm what 'layers.N.mixer' "
                                "(DataDependentAttention) does")
    assert caught[0].endswith("set --layer-kind N=KIND (or LAYER_KINDS in model.py)")
    assert [len(layer["warnings"]) for layer in summarize(module)["layers"] if "warnings" in layer] == [1, 1, 1]


def test_the_language_model_wins_over_a_deeper_vision_tower():
    with torch.device("meta"):
        model = VisionLanguage([SdpaAttention(), LightningBlock()])
    module, _ = _capture(model)
    assert [layer.path for layer in module.decoder_layers()] == ["language_model.layers.0", "language_model.layers.1"]


def test_an_unknown_block_nothing_can_classify_is_an_error_naming_path_class_and_fixes():
    with pytest.raises(UnrecognisedLayerError) as info:
        _capture(build(SdpaAttention, DataDependentMixer))
    message = str(info.value)
    assert "'layers.1.mixer'" in message and "hybrids.DataDependentMixer" in message
    assert "register_recognizer" in message and "--layer-kind 1=KIND" in message


def test_an_override_classifies_the_block_nothing_else_can():
    module, caught = _capture(build(SdpaAttention, DataDependentMixer), layer_kinds=["1=attention"])
    assert [layer.mixer for layer in module.decoder_layers()] == [MixerKind.ATTENTION, MixerKind.ATTENTION]
    assert caught == []
    assert module.decoder_layers()[1].attrs["mixer_source"] == "override"


def test_an_override_needs_sizes_for_the_kind_it_sets():
    with pytest.raises(LayerKindError, match=r"layer 1: cannot size 'layers.1.mixer' \(PerTokenBlock\) as attention: "
                                             r"on meta tensors it mixes no positions of the sequence"):
        _capture(build(SdpaAttention, PerTokenBlock), layer_kinds=["1=attention"])


def test_a_weighted_block_that_mixes_nothing_is_still_unrecognised():
    with pytest.raises(UnrecognisedLayerError) as info:
        _capture(build(SdpaAttention, PerTokenBlock))
    message = str(info.value)
    assert "'layers.1.mixer.inner'" in message and "mixes no positions of the sequence" in message


def test_a_stack_that_branches_on_shapes_and_dtypes_captures():
    module, caught = _capture(build(LightningBlock, SdpaAttention, LightningBlock, stack=RotaryStack))
    assert [layer.mixer for layer in module.decoder_layers()] == [
        MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION, MixerKind.LINEAR_ATTENTION]
    assert caught == [] and collect_errors(module) == []
    assert module.decoder_layers()[0].task("l0.linear_attention.fwd").deps == ["embed.embedding.fwd"]


def test_a_stack_that_branches_on_tensor_data_is_a_clear_error():
    class DataBranchStack(RotaryStack):
        def forward(self, input_ids):
            x = self.embed(input_ids)
            if x.sum() > 0:  # depends on values, not shapes
                x = -x
            for layer in self.layers:
                x = layer(x)
            return self.lm_head(self.norm(x))

    with pytest.raises(CaptureError, match=r"cannot trace the decoder stack in .*DataBranchStack\.forward: .*"
                                           r"depends on tensor data.*a branch on tensor data belongs inside a layer"):
        _capture(build(SdpaAttention, stack=DataBranchStack))


def test_observation_is_shared_by_blocks_of_the_same_shape():
    model = build(LightningBlock, SdpaAttention, LightningBlock, LightningBlock)
    stack = capture_stack(model, 2, SEQ)
    blocks = [call.block for layer in stack.layers for call in layer.blocks if call.block.role == "mixer"]
    assert [b.source for b in blocks] == ["behaviour"] * 4
    assert blocks[0].evidence == blocks[2].evidence == blocks[3].evidence
