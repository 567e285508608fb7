"""The shipped reference workloads: each captures with its suggested parallel settings."""

from __future__ import annotations

import json

import pytest

from frontend import WORKLOADS_DIR, capture, workload_configs
from passes.plan_view import PlanView
from tessera.api import run_passes
from tessera_ir import FfnKind
from tessera_ir.parallel import ParallelConfig
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


@pytest.mark.parametrize("name", sorted(TABLE))
def test_suggested_setting_names_its_recipe_and_its_gpus(name):
    entry = TABLE[name]
    assert len(entry["recipe"]) > 40, "every suggested setting says which public recipe it follows"
    parallel = ParallelConfig().replace(**entry["parallel"])
    assert parallel.world_size == entry["gpus"]
    assert parallel.dp * parallel.cp * parallel.tp % parallel.ep == 0


@pytest.mark.parametrize("name", sorted(TABLE))
def test_suggested_setting_plans_within_80_gib(name):
    # The planning passes (serial pair costs: no schedules needed to test memory) find a partition
    # whose every device fits an 80 GiB H100 at the workload's suggested setting.
    module = capture(str(WORKLOADS_DIR / f"{name}.json"))
    module.attrs["hardware"] = "h100"
    run_passes(module, "candidates,partition", verify=False)
    part = PlanView(module).partition
    assert part is not None
    assert part.op.attrs["memory_capacity_bytes"] == 80 * 2**30
    peaks = part.op.attrs["memory_peak_bytes"]
    assert isinstance(peaks, list) and len(peaks) == module.attrs["pp"]
    assert 0 < max(peaks) <= 80 * 2**30
