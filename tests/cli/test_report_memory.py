"""``--report`` prints each device's peak memory from the partition's memory model, no simulation needed."""

from __future__ import annotations

from passes.manager import PassManager, parse_pipeline
from tessera.report import render_report

from planned_modules import planned


def test_the_report_prints_every_devices_peak_memory() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8)
    part = next(op for op in module.plan if op.op == "partition")
    peaks = part.attrs["memory_peak_bytes"]
    text = render_report(module)
    assert "Peak memory per device" in text and "combined 1F1B order" in text
    rows = text[text.index("Peak memory per device"):].splitlines()[3:5]
    for device, (row, peak) in enumerate(zip(rows, peaks)):
        assert row.split()[:3] == [str(device), f"{device},{device + 2}", f"{peak / 2**30:.2f}"]
    assert "programs run the" not in text


def test_the_report_says_when_the_programs_run_another_order_than_the_memory_figures() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8)
    PassManager(parse_pipeline("pipeline{combined=false}")).run(module)
    assert "the programs run the plain order, which holds fewer micro-batches in flight" in render_report(module)
