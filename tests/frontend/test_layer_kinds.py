"""Config-declared layer types as a cross-check, and the user's override of a layer's mixer kind."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest
from hybrids import SEQ, Declared, LightningBlock, SdpaAttention, build

from frontend import capture
from frontend.errors import CaptureWarning, LayerKindError
from frontend.layer_kinds import declared_layer_types, layer_kinds_table, parse_layer_kind_flags
from tessera.cli import compile_main
from tessera_ir import MixerKind
from tessera_ir.summary import summarize

SETTINGS = {"seq_len": SEQ, "micro_batch_size": 2, "dtype": "fp32"}


def _capture(source, **kw):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        module = capture(source, overrides=SETTINGS, **kw)
    return module, [str(w.message) for w in caught if issubclass(w.category, CaptureWarning)]


def _disagreeing():
    """Layer 1 runs a lightning recurrence, but the config declares it full attention."""
    config = Declared(["full_attention", "full_attention", "linear_attention"])
    return build(SdpaAttention, LightningBlock, LightningBlock, config=config)


def test_config_that_contradicts_a_block_is_named_in_a_warning():
    module, caught = _capture(_disagreeing())
    assert [layer.mixer for layer in module.decoder_layers()] == [
        MixerKind.ATTENTION, MixerKind.LINEAR_ATTENTION, MixerKind.LINEAR_ATTENTION]
    assert len(caught) == 1
    message = caught[0]
    assert message.startswith("layer 1: the config declares layer_types[1] = 'full_attention', but "
                              "'layers.1.mixer' (LightningBlock) updates a [4, 8, 8] state every 16 tokens")
    assert "so it is linear_attention (from what it does); counted as linear_attention" in message
    assert message.endswith("if the config is right, set --layer-kind 1=attention")
    summary = summarize(module)
    assert summary["warnings"] == [message] and summary["layers"][1]["warnings"] == [message]
    assert "warnings" not in summary["layers"][0]


def test_an_override_settles_the_disagreement():
    module, caught = _capture(_disagreeing(), layer_kinds={1: "attention"})
    assert caught == []
    layer = module.decoder_layers()[1]
    assert layer.mixer is MixerKind.ATTENTION and layer.attrs["mixer_source"] == "override"
    assert layer.task("l1.attention.fwd").flops > 0
    # Command-line style strings work the same way.
    again, _ = _capture(_disagreeing(), layer_kinds=["1=attention"])
    assert [la.mixer for la in again.decoder_layers()] == [la.mixer for la in module.decoder_layers()]


def test_an_override_can_make_softmax_attention_linear():
    module, caught = _capture(build(SdpaAttention, SdpaAttention), layer_kinds=["0=linear_attention"])
    assert [layer.mixer for layer in module.decoder_layers()] == [MixerKind.LINEAR_ATTENTION, MixerKind.ATTENTION]
    assert caught == []


def test_layer_kinds_table_in_model_py(tmp_path: Path):
    path = tmp_path / "model.py"
    path.write_text(
        "from hybrids import Declared, LightningBlock, SdpaAttention, build\n"
        "PARALLEL = {'seq_len': 48, 'micro_batch_size': 2}\n"
        "LAYER_KINDS = {1: 'attention'}\n"
        "def build_model():\n"
        "    config = Declared(['full_attention', 'full_attention', 'linear_attention'])\n"
        "    return build(SdpaAttention, LightningBlock, LightningBlock, config=config)\n")
    module, caught = _capture(str(path))
    assert caught == []
    assert module.decoder_layers()[1].mixer is MixerKind.ATTENTION
    # The command line wins over the table.
    module, _ = _capture(str(path), layer_kinds=["1=linear_attention"])
    assert module.decoder_layers()[1].mixer is MixerKind.LINEAR_ATTENTION


@pytest.mark.parametrize(
    ("specs", "pattern"),
    [
        (["3"], r"--layer-kind 3: expected INDEX=KIND"),
        (["x=attention"], r"--layer-kind x=attention: 'x' is not a layer index"),
        (["3=lin"], r"unknown layer kind 'lin'; use one of attention, sliding_attention, linear_attention, mla, ssm"),
        (["5-3=ssm"], r"the range 5-3 is empty"),
    ],
)
def test_bad_layer_kind_flags(specs, pattern):
    with pytest.raises(LayerKindError, match=pattern):
        parse_layer_kind_flags(specs)


def test_layer_kind_flags_take_lists_and_ranges():
    assert parse_layer_kind_flags(["0-2,5=ssm", "1=attention"]) == {
        0: MixerKind.SSM, 1: MixerKind.ATTENTION, 2: MixerKind.SSM, 5: MixerKind.SSM}
    assert layer_kinds_table([None, "mla"], "m.py") == {1: MixerKind.MLA}
    with pytest.raises(LayerKindError, match=r"m.py: LAYER_KINDS must be a dict"):
        layer_kinds_table("attention", "m.py")


def test_overrides_that_cannot_apply_are_errors():
    with pytest.raises(LayerKindError, match=r"layer kind set for layer 7, but the model has 2 decoder layers \(0-1\)"):
        _capture(build(SdpaAttention, SdpaAttention), layer_kinds=["7=attention"])


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (SimpleNamespace(layer_types=["linear_attention", "full_attention"]),
         [("linear_attention", "layer_types[0]"), ("full_attention", "layer_types[1]")]),
        (SimpleNamespace(attn_type_list=[0, 1]),
         [("linear_attention", "attn_type_list[0]"), ("full_attention", "attn_type_list[1]")]),
        (SimpleNamespace(hybrid_override_pattern="M*"),
         [("M", "hybrid_override_pattern[0]"), ("*", "hybrid_override_pattern[1]")]),
        (SimpleNamespace(layers_block_type=["mamba", "attention"]),
         [("mamba", "layers_block_type[0]"), ("attention", "layers_block_type[1]")]),
        (SimpleNamespace(text_config=SimpleNamespace(block_types=["recurrent"])),
         [("recurrent", "block_types[0]"), ("recurrent", "block_types[1]")]),
    ],
)
def test_declared_layer_types_under_their_spellings(config, expected):
    declared = declared_layer_types(config, 2)
    assert [(d.text, d.field) for d in declared if d is not None] == expected
    recurrent = {MixerKind.LINEAR_ATTENTION, MixerKind.SSM}
    assert declared[0] is not None and declared[0].kinds == recurrent
    assert declared[1] is not None and (declared[1].kinds == recurrent or MixerKind.ATTENTION in declared[1].kinds)


def test_declared_types_that_say_nothing_are_not_checked():
    declared = declared_layer_types(SimpleNamespace(layer_types=["hybrid", "moe", "basic"]), 3)
    assert declared[0] is None and declared[2] is None
    assert declared[1] is not None and declared[1].kinds == {MixerKind.NONE}
    assert declared_layer_types(SimpleNamespace(layer_types=["full_attention"]), 2) == [None, None]


def _model_py(tmp_path: Path) -> Path:
    path = tmp_path / "model.py"
    path.write_text(
        "from hybrids import Declared, LightningBlock, SdpaAttention, build\n"
        "PARALLEL = {'seq_len': 48, 'micro_batch_size': 2, 'pp': 1, 'ep': 1}\n"
        "def build_model():\n"
        "    config = Declared(['full_attention', 'full_attention', 'linear_attention'])\n"
        "    return build(SdpaAttention, LightningBlock, LightningBlock, config=config)\n")
    return path


def test_cli_prints_the_warning_on_one_line_and_marks_the_summary(tmp_path: Path, capsys):
    summary = tmp_path / "s.json"
    code = compile_main([str(_model_py(tmp_path)), "--passes", "none", "--summary-json", str(summary)])
    err = capsys.readouterr().err
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("tessera-compile: warning: layer 1: the config declares")
    data = json.loads(summary.read_text())
    assert [layer["mixer"] for layer in data["layers"]] == ["attention", "linear_attention", "linear_attention"]
    assert len(data["warnings"]) == 1


def test_cli_layer_kind_flag(tmp_path: Path, capsys):
    summary = tmp_path / "s.json"
    code = compile_main([str(_model_py(tmp_path)), "--passes", "none", "--summary-json", str(summary),
                         "--layer-kind", "1=attention"])
    err = capsys.readouterr().err
    assert code == 0 and err == ""
    data = json.loads(summary.read_text())
    assert data["layers"][1]["mixer"] == "attention" and data["layers"][1]["mixer_source"] == "override"
    assert data["warnings"] == []


def test_cli_bad_layer_kind_is_one_line_and_writes_nothing(tmp_path: Path, capsys):
    summary = tmp_path / "s.json"
    code = compile_main([str(_model_py(tmp_path)), "--passes", "none", "--summary-json", str(summary),
                         "--layer-kind", "1=softmax"])
    err = capsys.readouterr().err
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "unknown layer kind 'softmax'" in lines[0] and "Traceback" not in err
    assert not summary.exists()
