"""Run-wide settings live in the module header: one default each, printed and parsed with the
module, set by driver flags, and read by every pass that needs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from passes.manager import PassManager, parse_pipeline
from passes.plan_view import PlanView
from passes.refine_bottleneck import RefineBottleneckPass
from tessera.cli import opt_main
from tessera_ir.parallel import ParallelConfig, ParallelConfigError
from tessera_ir.parser import parse_module
from tessera_ir.printer import print_module
from tessera_ir.run_settings import RunSettings, RunSettingsError, set_run_settings

from compiled_plans import PLANNING, planned_module
from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


def test_a_header_without_settings_has_the_one_set_of_defaults() -> None:
    assert RunSettings.from_attrs({}) == RunSettings()
    assert RunSettings().memory_gib is None  # the target hardware's
    got = RunSettings.from_attrs({"reserved_gib": 8, "wgrad_headroom": False, "model": "m"})
    assert (got.reserved_gib, got.wgrad_headroom) == (8.0, False)


@pytest.mark.parametrize(
    ("attrs", "says"),
    [
        ({"reserved_gib": -1.0}, "'reserved_gib': reserved memory must be >= 0"),
        ({"memory_gib": 0.0}, "'memory_gib': device memory must be positive"),
        ({"memory_gib": "lots"}, "'memory_gib': must be a finite number, got 'lots'"),
        ({"wgrad_headroom": 1}, "'wgrad_headroom': must be true or false"),
        ({"dbo_memory_budget": 1.5}, "'dbo_memory_budget': the DBO pool's budget is 'headroom' or a share of device memory in"),
    ],
)
def test_a_bad_header_value_is_refused_naming_the_attribute(attrs: dict[str, object], says: str) -> None:
    with pytest.raises(RunSettingsError, match=f"module header attribute {says}"):
        RunSettings.from_attrs(attrs)


def test_settings_are_recorded_in_the_header_and_round_trip_through_the_text() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(ep=2))
    set_run_settings(module.attrs, reserved_gib=8, memory_gib=None, combined=False)
    assert module.attrs["reserved_gib"] == 8.0 and module.attrs["combined"] is False and "memory_gib" not in module.attrs
    text = print_module(module)
    assert "combined = false" in text and "reserved_gib = 8.0" in text
    parsed = parse_module(text)
    assert print_module(parsed) == text
    assert RunSettings.from_attrs(parsed.attrs).reserved_gib == 8.0
    assert not ParallelConfig.from_attrs(parsed.attrs).combined_1f1b  # the order variant, though ep > 1
    with pytest.raises(RunSettingsError, match="unknown run-wide setting"):
        set_run_settings(module.attrs, reserved=8)
    with pytest.raises(ParallelConfigError, match="combined .* must be true or false"):
        set_run_settings(module.attrs, combined="yes")


def test_refine_bottleneck_re_partitions_with_the_reservation_the_partition_planned_with() -> None:
    """``partition{reserved-gib=8},refine-bottleneck`` used to re-partition with 4 GiB reserved: the
    reservation is now one header setting both read."""
    module = planned_module(2, 1, 4)
    module.attrs["reserved_gib"] = 8.0
    module.attrs["wgrad_headroom"] = False
    (op,) = module.plan_ops("partition")
    settings, _ = RefineBottleneckPass()._settings(op, PlanView(module))
    assert (settings.reserved_gib, settings.wgrad_headroom) == (8.0, False)


def test_the_pipeline_pass_lowers_in_the_header_s_order() -> None:
    def lowered(combined: bool | None) -> object:
        parallel = ParallelConfig(pp=2, ep=2, microbatches=4, seq_len=512)  # ep > 1: combined unless set
        module = synthetic_module(QWEN3_NEXT_PATTERN, gemm_flops=10**10, mixer_flops=10**10, a2a_bytes=10**6,
                                  param_bytes=10**6, parallel=parallel)
        set_run_settings(module.attrs, combined=combined)
        PassManager(parse_pipeline(PLANNING + ",pipeline")).run(module)
        return module.plan_ops("pipeline")[0].attrs["combined"]

    assert lowered(None) is True
    assert lowered(False) is False


def test_tessera_opt_flags_set_the_header(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = tmp_path / "in.tir"
    source.write_text(print_module(synthetic_module(QWEN3_NEXT_PATTERN)))
    assert opt_main([str(source), "--reserved-gib", "6", "--no-wgrad-headroom", "--dbo-memory-budget", "0.1"]) == 0
    out = capsys.readouterr().out
    header = parse_module(out).attrs
    assert (header["reserved_gib"], header["wgrad_headroom"], header["dbo_memory_budget"]) == (6.0, False, 0.1)
    assert opt_main([str(source), "--memory-gib", "-3"]) == 1
    assert "--memory-gib: device memory must be positive, got -3.0 GiB" in capsys.readouterr().err
