"""Perfetto/Chrome trace JSON and PNG timeline of a simulated iteration."""

from __future__ import annotations

import json

import numpy as np
import pytest

from passes.simulation.engine import LANES, DboSettings, simulate
from passes.simulation.trace import timeline_png, trace_json

from sim_builders import moe_input


def _result(record: bool = True):  # noqa: ANN202
    inp = moe_input(2, 2, 4)
    return simulate(inp, 1.0 + np.random.default_rng(0).exponential(0.3, (inp.decoder_layers, 4)),
                    dbo=DboSettings(10**6), record=record)


def test_trace_has_one_lane_per_rank_and_stream_and_every_event() -> None:
    result = _result()
    doc = json.loads(trace_json(result, "t"))
    names = {(e["pid"], e["args"]["name"]) for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {(r, lane) for r in range(2) for lane in LANES}
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == len(result.events)
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(result.iteration_us, abs=1e-2)
    assert {e["cat"] for e in spans} >= {"fwd", "bwd", "dispatch", "combine", "p2p", "grad_reduce"}


def test_outputs_are_deterministic() -> None:
    assert trace_json(_result()) == trace_json(_result())
    png = timeline_png(_result())
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert png == timeline_png(_result())


def test_unrecorded_results_are_refused() -> None:
    with pytest.raises(ValueError, match="record=True"):
        trace_json(_result(record=False))
