"""Configs and settings whose sizes no plan can hold: each is one clear error naming the field,
before transformers builds anything (a stack of 10^9 layers would fill memory first)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from frontend.errors import ConfigFileError, SourceError
from frontend.sources import MAX_DECODER_LAYERS, load_source
from tessera_ir.parallel import MAX_CHUNK_RUNS, MAX_SETTING, ParallelConfig, ParallelConfigError


def write_config(folder: Path, **fields: object) -> str:
    path = folder / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_moe", **fields}))
    return str(path)


@pytest.fixture
def never_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test should transformers be asked for the config at all."""
    import frontend.sources as sources

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("the config reached transformers")

    monkeypatch.setattr(sources, "_hf_config", refuse)


@pytest.mark.parametrize(("value", "spelled"), [
    (0, "got 0"), (-4, "got -4"), ("many", 'got "many"'), (True, "got true"), (2.5, "got 2.5"), ([4], "got list"),
])
def test_a_layer_count_that_is_not_a_positive_integer(tmp_path: Path, never_built: None, value: object, spelled: str) -> None:
    path = write_config(tmp_path, num_hidden_layers=value)
    with pytest.raises(ConfigFileError, match=f'"num_hidden_layers" must be a positive integer, {spelled}'):
        load_source(path)


@pytest.mark.parametrize("layer_types", [None, ["full_attention"]])
def test_a_stack_too_deep_to_plan_is_refused_before_transformers_lists_its_layers(
    tmp_path: Path, never_built: None, layer_types: object
) -> None:
    path = write_config(tmp_path, num_hidden_layers=10**9, layer_types=layer_types)
    with pytest.raises(ConfigFileError, match=f"is 1000000000, more decoder layers than Tessera plans \\(at most {MAX_DECODER_LAYERS}\\)"):
        load_source(path)


@pytest.mark.parametrize("field", ["hidden_size", "vocab_size", "num_attention_heads"])
def test_other_sizes_must_be_positive(tmp_path: Path, never_built: None, field: str) -> None:
    with pytest.raises(ConfigFileError, match=f'"{field}" must be a positive integer, got -1'):
        load_source(write_config(tmp_path, **{field: -1}))


def test_the_text_config_of_a_multimodal_config_is_checked_too(tmp_path: Path, never_built: None) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 0}}))
    with pytest.raises(ConfigFileError, match='"num_hidden_layers" must be a positive integer, got 0'):
        load_source(str(path))


def test_a_value_transformers_refuses_names_its_field(tmp_path: Path) -> None:
    path = write_config(tmp_path, num_hidden_layers=2, rms_norm_eps="tiny")
    with pytest.raises(SourceError, match="rms_norm_eps") as info:
        load_source(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("suffix", [".py", ".json", ""])
def test_a_source_path_too_long_for_the_system(suffix: str) -> None:
    with pytest.raises(ConfigFileError, match="file name too long") as info:
        load_source("m" * 100_000 + suffix)
    assert len(str(info.value)) < 500  # the path is shortened in the message


@pytest.mark.parametrize(("settings", "words"), [
    ({"microbatches": 10**12}, "--microbatches 1000000000000 is too large"),
    ({"seq_len": 10**14}, "--seq-len 100000000000000 is too large"),
    ({"ep": MAX_SETTING + 1}, f"at most {MAX_SETTING}"),
    ({"microbatches": MAX_CHUNK_RUNS // 2, "pp": 4}, f"more than a plan can list (at most {MAX_CHUNK_RUNS})"),
])
def test_settings_a_plan_cannot_hold(settings: dict[str, int], words: str) -> None:
    with pytest.raises(ParallelConfigError) as info:
        ParallelConfig(**settings)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_the_largest_settings_a_plan_holds_are_accepted() -> None:
    assert ParallelConfig(microbatches=MAX_CHUNK_RUNS).microbatches == MAX_CHUNK_RUNS
    assert ParallelConfig(seq_len=MAX_SETTING).seq_len == MAX_SETTING
