"""The shipped reference workloads: each captures with its suggested parallel settings."""

from __future__ import annotations

import json

import pytest

from frontend import WORKLOADS_DIR, capture, workload_configs
from tessera_ir import FfnKind
from tessera_ir.verifier import collect_errors

TABLE = json.loads((WORKLOADS_DIR / "parallel.json").read_text())


def test_every_workload_has_parallel_settings():
    assert set(workload_configs()) == set(TABLE)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_workload_captures_with_its_suggested_settings(name):
    config = workload_configs()[name]
    module = capture(str(WORKLOADS_DIR / f"{name}.json"))
    layers = module.decoder_layers()
    assert len(layers) == config["num_hidden_layers"]
    for key, value in TABLE[name]["parallel"].items():
        assert module.attrs[key] == value
    assert module.attrs["hidden_size"] == config["hidden_size"]
    expected_experts = config.get("num_experts") or config.get("n_routed_experts")
    assert module.attrs["num_experts"] == expected_experts
    dense = config.get("first_k_dense_replace", 0)
    assert [layer.ffn for layer in layers] == [FfnKind.DENSE] * dense + [FfnKind.MOE] * (len(layers) - dense)
    assert collect_errors(module) == []


def test_overrides_beat_suggested_settings_and_none_is_ignored():
    module = capture(str(WORKLOADS_DIR / "qwen3_30b_a3b.json"), overrides={"ep": 16, "pp": None})
    assert module.attrs["ep"] == 16
    assert module.attrs["pp"] == TABLE["qwen3_30b_a3b"]["parallel"]["pp"]
