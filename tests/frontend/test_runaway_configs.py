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


@pytest.mark.parametrize("nesting", [
    {"model_type": "qwen3_vl_moe", "text_config": {"num_hidden_layers": 0}},
    {"model_type": "qwen3_omni_moe", "thinker_config": {"text_config": {"num_hidden_layers": 0}}},
])
def test_the_text_config_of_a_multimodal_config_is_checked_too(
    tmp_path: Path, never_built: None, nesting: dict[str, object]
) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(nesting))
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


# A seeded campaign over hostile config values: each case sets one or two size fields of a small
# Qwen3-MoE config to a value drawn from HOSTILE and captures it; the capture either succeeds or
# raises a one-line TesseraError, never another exception. The suite runs FUZZ_CASES cases; a long
# campaign runs more, e.g. TESSERA_FUZZ_CONFIGS=400 .venv/bin/pytest tests/frontend/test_runaway_configs.py -k campaign
# (seed 38; each case names its fields and values, so a failure reproduces on its own). The first
# 400-case run found torch's C++ stack quoted in a build error (test below).
FUZZ_FIELDS = ["num_hidden_layers", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_attention_heads",
               "num_key_value_heads", "head_dim", "vocab_size", "num_experts", "num_experts_per_tok", "max_position_embeddings",
               "layer_types", "mlp_only_layers", "decoder_sparse_step"]
HOSTILE: list[object] = [0, -1, 1, 3, 7, 10**9, 2**63, "many", "", None, True, 1.5, -0.0, [], [1], {"a": 1}]
SMALL = {"model_type": "qwen3_moe", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
         "moe_intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 128, "num_experts": 4, "num_experts_per_tok": 2}


def _fuzz_cases(count: int, seed: int = 38) -> list[dict[str, object]]:
    import random

    rng = random.Random(seed)
    cases = []
    for _ in range(count):
        fields = rng.sample(FUZZ_FIELDS, rng.choice([1, 1, 2]))
        cases.append({name: rng.choice(HOSTILE) for name in fields})
    return cases


FUZZ_CASES = int(__import__("os").environ.get("TESSERA_FUZZ_CONFIGS", "40"))


@pytest.mark.parametrize("mutation", _fuzz_cases(FUZZ_CASES), ids=lambda m: ",".join(f"{k}={v!r}"[:40] for k, v in m.items()))
def test_campaign_of_hostile_config_values(tmp_path: Path, mutation: dict[str, object]) -> None:
    from frontend import capture
    from tessera_ir.errors import TesseraError

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**SMALL, **mutation}))
    try:
        capture(str(path), overrides={"seq_len": 64, "tp": 1, "ep": 1})
    except TesseraError as err:
        assert "\n" not in str(err).strip()


def test_a_size_torch_cannot_hold_is_one_line_naming_the_failure(tmp_path: Path) -> None:
    path = write_config(tmp_path, num_hidden_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=2**63)
    with pytest.raises(SourceError, match="transformers cannot build a 'qwen3_moe' model") as info:
        load_source(path)
    assert "\n" not in str(info.value) and "frame #" not in str(info.value)
