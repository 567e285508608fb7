"""``--report`` prints each device's peak memory from the partition's memory model, no simulation needed."""

from __future__ import annotations

from passes.manager import PassManager, parse_pipeline
from tessera.report import render_report

from planned_modules import planned


def test_the_report_prints_every_devices_peak_memory() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8)
    part = next(op for op in module.plan if op.op == "partition")
    peaks = [int(x) for x in part.attrs["memory_peak_bytes"]]  # type: ignore[arg-type, union-attr]
    text = render_report(module)
    assert "Peak memory per device" in text and "combined 1F1B order" in text
    rows = text[text.index("Peak memory per device"):].splitlines()[3:5]
    for device, (row, peak) in enumerate(zip(rows, peaks)):
        assert row.split()[:3] == [str(device), f"{device},{device + 2}", f"{peak / 2**30:.2f}"]
    assert "programs run the" not in text


def test_the_memory_figures_and_the_programs_follow_the_order_the_header_sets() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8, combined=False)
    PassManager(parse_pipeline("pipeline")).run(module)
    text = render_report(module)
    assert "its interleaved 1F1B order holds in flight" in text and "programs run the" not in text
    assert next(op for op in module.plan if op.op == "pipeline").attrs["combined"] is False
