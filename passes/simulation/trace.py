"""A simulated iteration as a Perfetto / Chrome trace (JSON) and as a PNG timeline.

Both draw one lane per pipeline rank and stream: ``compute`` (forward, backward, weight
gradients, work the DBO placed in slots, deadline fallbacks), ``a2a`` (dispatch and combine),
``send_next`` / ``send_prev`` (point-to-point activations and gradients) and ``grad_reduce``
(the data-parallel gradient reduction). Times are microseconds from the iteration's start.
The trace loads in https://ui.perfetto.dev or chrome://tracing.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict

from passes.simulation.engine import LANES, SimulationResult

# Fill colours per event category (the PNG's legend).
CATEGORY_COLOURS = {
    "fwd": "#4c72b0",
    "bwd": "#dd8452",
    "wgrad": "#c44e52",
    "dbo": "#55a868",
    "fallback": "#8172b3",
    "dispatch": "#937860",
    "combine": "#da8bc3",
    "p2p": "#8c8c8c",
    "grad_reduce": "#ccb974",
}


def trace_json(result: SimulationResult, title: str = "") -> str:
    """The Chrome trace-event JSON of a recorded simulation (deterministic: same result, same text)."""
    if not result.events and result.iteration_us > 0:
        raise ValueError("the simulation was run without record=True; it kept no events to trace")
    events: list[dict] = []
    for rank in range(result.inp.pp):
        events.append({"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"pipeline rank {rank}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}})
        for tid, lane in enumerate(LANES):
            events.append({"name": "thread_name", "ph": "M", "pid": rank, "tid": tid, "args": {"name": lane}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    lane_index = {lane: i for i, lane in enumerate(LANES)}
    for e in sorted(result.events, key=lambda e: (e.rank, lane_index[e.lane], e.start_us, e.name)):
        events.append({
            "name": e.name, "cat": e.category, "ph": "X", "pid": e.rank, "tid": lane_index[e.lane],
            "ts": round(e.start_us, 3), "dur": round(e.end_us - e.start_us, 3),
        })
    doc = {
        "displayTimeUnit": "ms",
        "otherData": {"title": title, "iteration_us": round(result.iteration_us, 3)},
        "traceEvents": events,
    }
    return json.dumps(doc, separators=(",", ":")) + "\n"


def timeline_png(result: SimulationResult, title: str = "", width_in: float = 16.0) -> bytes:
    """A PNG timeline (matplotlib): one row per rank and lane, coloured by event category."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    if not result.events and result.iteration_us > 0:
        raise ValueError("the simulation was run without record=True; it kept no events to draw")
    rows = [(rank, lane) for rank in range(result.inp.pp) for lane in LANES]
    row_of = {key: i for i, key in enumerate(rows)}
    bars: dict[tuple[int, str], list[tuple[float, float]]] = defaultdict(list)
    for e in result.events:
        bars[(row_of[(e.rank, e.lane)], e.category)].append((e.start_us / 1e3, (e.end_us - e.start_us) / 1e3))
    height = max(3.0, 0.18 * len(rows) + 1.5)
    fig, ax = plt.subplots(figsize=(width_in, height), dpi=100)
    try:
        for (row, category), spans in sorted(bars.items()):
            ax.broken_barh(spans, (row - 0.4, 0.8), facecolors=CATEGORY_COLOURS.get(category, "#333333"), linewidth=0)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels([f"r{rank} {lane}" for rank, lane in rows], fontsize=6)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set_xlim(0, result.iteration_us / 1e3 if result.iteration_us > 0 else 1.0)
        ax.set_xlabel("time (ms)")
        ax.set_title(title or f"simulated iteration: {result.iteration_us / 1e3:.2f} ms", fontsize=10)
        used = sorted({category for _, category in bars})
        ax.legend(
            handles=[Patch(color=CATEGORY_COLOURS.get(c, "#333333"), label=c) for c in used],
            loc="upper center", bbox_to_anchor=(0.5, -0.08 * 12 / height), fontsize=7, ncol=len(used), frameon=False,
        )
        fig.tight_layout()
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", metadata={"Software": None})
        return buffer.getvalue()
    finally:
        plt.close(fig)

