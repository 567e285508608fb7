"""Drawings of pair schedules: graphviz lanes, the pair DAG, and Perfetto/Chrome traces.

``tessera-viz plan.tir --pair pair.0 --format svg,png,json -o outdir`` writes, per pair:

- ``<pair>.schedule.<fmt>``: the schedule as two stream lanes (compute above, comm
  below); each task is a box whose position and width are its start and duration
  (same scale for both lanes), labelled with its kind, layer and duration, and the
  dependency edges between boxes. Laid out by ``neato -n2`` (positions are fixed,
  so the layout costs nothing however many tasks there are).
- ``<pair>.dag.<fmt>``: the pair DAG (forward side and backward side as clusters),
  laid out by ``dot``. ``dot`` slows sharply past a few hundred nodes, so it runs
  with ``nslimit``/``mclimit`` and a timeout, one pair per drawing.
- ``<pair>.trace.json`` (format ``json``): a Chrome/Perfetto trace, one complete
  event (``ph = "X"``, ``ts``/``dur`` in µs) per task, one thread per stream.
- format ``dot`` writes the DOT sources themselves (no graphviz needed).

Without ``--pair`` every ``pair_schedule`` of the plan is drawn. A pair that has
no schedule yet is scheduled in memory with the gap-fit heuristic.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from passes.scheduling.pair_dag import FWD, PairDAG
from passes.scheduling.schedule import PairSchedule
from tessera.driver import Run, run_tool, tool_parser
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import Module

FORMATS = ("svg", "png", "pdf", "json", "dot")
LANES = (Resource.COMPUTE, Resource.COMM)
LANE_HEIGHT_PT = 54.0
TIMELINE_WIDTH_PT = 1400.0
CHAR_WIDTH_PT = 5.0  # about one character of 9-point Helvetica; decides which labels fit a box

# Fill colours by phase, and for communication (which has no wgrad).
COLOURS = {"fwd": "#9ecae1", "dgrad": "#fdae6b", "wgrad": "#a1d99b", "comm": "#bcbddc"}


class VizError(TesseraError):
    """A drawing that cannot be made (graphviz missing or too slow, unknown pair or format)."""


def _q(text: str) -> str:
    # Backslashes stay: labels use DOT's own escapes (\n for a line break).
    return '"' + text.replace('"', '\\"') + '"'


def _phase(kind: str) -> str:
    return kind.rpartition(".")[2]


def _fill(task_kind: str, resource: Resource) -> str:
    return COLOURS["comm"] if resource is Resource.COMM else COLOURS.get(_phase(task_kind), "#dddddd")


def _short_kind(kind: str) -> str:
    op, _, phase = kind.rpartition(".")
    return f"{op}.{phase}"


def task_label(dag: PairDAG, i: int) -> str:
    """The label of a task box: kind, then layer and duration."""
    t = dag.tasks[i]
    return f"{_short_kind(t.kind)}\\n{t.layer} · {t.duration:.1f} µs"


def _fitting_label(dag: PairDAG, i: int, width_pt: float) -> str:
    """The full label if it fits the box, else the kind alone, else nothing (the tooltip has it all)."""
    full = task_label(dag, i)
    for label in (full, _short_kind(dag.tasks[i].kind)):
        if max(len(line) for line in label.split("\\n")) * CHAR_WIDTH_PT <= width_pt:
            return label
    return ""


def schedule_dot(schedule: PairSchedule, title: str | None = None, width_pt: float = TIMELINE_WIDTH_PT) -> str:
    """DOT source of a schedule drawn as two stream lanes (render with ``neato -n2``)."""
    dag = schedule.dag
    makespan = schedule.makespan or 1.0
    scale = width_pt / makespan  # points per microsecond, shared by both lanes
    lines = [
        f"digraph {_q('schedule ' + (title or dag.name))} {{",
        '  graph [splines=line, outputorder=edgesfirst, fontname="Helvetica", '
        + f"label={_q(f'{title or dag.name}: makespan {schedule.makespan:.1f} µs, lower bound {dag.lower_bound():.1f} µs, {schedule.method}')}, labelloc=t];",
        '  node [shape=box, style="filled", fixedsize=true, fontname="Helvetica", fontsize=9, penwidth=0.6];',
        '  edge [color="#55555588", arrowsize=0.5, penwidth=0.7];',
    ]
    lane_y = {r: -k * LANE_HEIGHT_PT * 1.6 for k, r in enumerate(LANES)}
    for r in LANES:
        busy = sum(t.duration for t in dag.tasks if t.resource is r)
        label = f"{r.value}\\n{busy:.0f} µs busy"
        lines.append(
            f"  lane_{r.value} [shape=plaintext, style=\"\", fixedsize=false, fontsize=11, "
            f"label={_q(label)}, pos=\"{-80:.1f},{lane_y[r]:.1f}!\"];"
        )
    for i, t in enumerate(dag.tasks):
        w = max(t.duration * scale, 1.0)
        x = schedule.start[i] * scale + w / 2
        label = _fitting_label(dag, i, w)
        style = '"filled,dashed"' if t.movable else '"filled"'
        lines.append(
            f"  t{i} [label={_q(label)}, tooltip={_q(task_label(dag, i).replace(chr(92) + 'n', ' '))}, "
            f"width={w / 72:.4f}, height={LANE_HEIGHT_PT / 72:.4f}, pos=\"{x:.2f},{lane_y[t.resource]:.2f}!\", "
            f"fillcolor={_q(_fill(t.kind, t.resource))}, style={style}];"
        )
    # Time axis below the lanes: ticks at round steps.
    step = _nice_step(makespan / 8)
    axis_y = lane_y[LANES[-1]] - LANE_HEIGHT_PT
    tick = 0.0
    k = 0
    while tick <= makespan + 1e-9 and k <= 10:  # a step is at least an eighth of the makespan
        lines.append(
            f"  tick{k} [shape=plaintext, style=\"\", fixedsize=false, fontsize=8, label={_q(f'{tick:g} µs')}, "
            f"pos=\"{tick * scale:.2f},{axis_y:.2f}!\"];"
        )
        tick += step
        k += 1
    for j, t in enumerate(dag.tasks):
        for d in t.deps:
            lines.append(f"  t{d} -> t{j};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _nice_step(raw: float) -> float:
    """1, 2 or 5 times a power of ten, at least ``raw`` (in floats: times may be as large as floats go)."""
    if raw <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(raw))
    if power <= 0.0:  # below the smallest float's power of ten
        return raw
    for m in (1.0, 2.0, 5.0):
        if m * power >= raw:
            return m * power
    return 10.0 * power


def dag_dot(dag: PairDAG, title: str | None = None) -> str:
    """DOT source of the pair DAG, forward and backward sides as clusters (render with ``dot``)."""
    lines = [
        f"digraph {_q('dag ' + (title or dag.name))} {{",
        f'  graph [rankdir=LR, fontname="Helvetica", label={_q(f"pair DAG {title or dag.name}: {len(dag.tasks)} tasks, critical path {dag.critical_path():.1f} µs")}, labelloc=t, nslimit=2, mclimit=2];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=9];',
        '  edge [arrowsize=0.6];',
    ]
    for side, name in ((FWD, "forward"), ("bwd", "backward")):
        members = [i for i, t in enumerate(dag.tasks) if t.side == side]
        if not members:
            continue
        lines.append(f"  subgraph cluster_{side} {{")
        lines.append(f'    label={_q(name)}; style="dashed"; color="#888888";')
        for i in members:
            t = dag.tasks[i]
            shape = ', shape=hexagon' if t.resource is Resource.COMM else ""
            style = ', style="rounded,filled,dashed"' if t.movable else ""
            lines.append(f"    t{i} [label={_q(task_label(dag, i))}, fillcolor={_q(_fill(t.kind, t.resource))}{shape}{style}];")
        lines.append("  }")
    for j, t in enumerate(dag.tasks):
        for d in t.deps:
            lines.append(f"  t{d} -> t{j};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def trace_json(schedule: PairSchedule, pid: int = 0, process_name: str | None = None) -> dict:
    """A Chrome/Perfetto trace of a schedule: complete events, one thread per stream."""
    dag = schedule.dag
    tid = {r: k for k, r in enumerate(LANES)}
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": process_name or f"pair {dag.name}"}}
    ]
    for r in LANES:
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid[r], "args": {"name": f"{r.value} stream"}})
    order = schedule.order_of()
    for i, t in enumerate(dag.tasks):
        events.append(
            {
                "name": t.name,
                "cat": _short_kind(t.kind),
                "ph": "X",
                "ts": schedule.start[i],
                "dur": t.duration,
                "pid": pid,
                "tid": tid[t.resource],
                "args": {"layer": t.layer, "side": t.side, "movable": t.movable, "order": order[i]},
            }
        )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "metadata": {
            "pair": dag.name,
            "method": schedule.method,
            "makespan_us": schedule.makespan,
            "lower_bound_us": dag.lower_bound(),
        },
    }


def render(dot_source: str, fmt: str, engine: str = "dot", timeout_s: float = 60.0) -> bytes:
    """Run graphviz on DOT source; a clear error when it is missing or too slow."""
    exe = shutil.which(engine)
    if exe is None:
        raise VizError(
            f"graphviz '{engine}' was not found on PATH; install graphviz (e.g. apt-get install graphviz) "
            "or ask for --format dot,json, which need no graphviz"
        )
    args = [exe, f"-T{fmt}"]
    if engine == "neato":
        args.append("-n2")  # node positions are given; do not move them
    try:
        done = subprocess.run(args, input=dot_source.encode(), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise VizError(
            f"graphviz '{engine}' did not finish within {timeout_s:g} s; draw fewer pairs at a time (--pair NAME) "
            "or raise --timeout"
        ) from None
    if done.returncode != 0:
        raise VizError(f"graphviz '{engine}' failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def _parse_formats(text: str) -> list[str]:
    formats = [f.strip().lower() for f in text.split(",") if f.strip()]
    bad = [f for f in formats if f not in FORMATS]
    if bad or not formats:
        raise VizError(f"unknown format(s) {', '.join(bad) or '(none)'}; use a comma-separated list of {', '.join(FORMATS)}")
    return formats


def render_pair(schedule: PairSchedule, name: str, formats: Sequence[str], timeout_s: float = 60.0) -> list[tuple[str, bytes]]:
    """The drawings of one scheduled pair, as (file name, contents), rendered but not written."""
    files: list[tuple[str, bytes]] = []
    sources = {"schedule": (schedule_dot(schedule, name), "neato"), "dag": (dag_dot(schedule.dag, name), "dot")}
    for fmt in formats:
        if fmt == "json":
            trace = json.dumps(trace_json(schedule, process_name=f"pair {name}"), indent=1) + "\n"
            files.append((f"{name}.trace.json", trace.encode()))
            continue
        for what, (source, engine) in sources.items():
            data = source.encode() if fmt == "dot" else render(source, fmt, engine, timeout_s)
            files.append((f"{name}.{what}.{fmt}", data))
    return files


def _schedules_to_draw(module: Module, pair: str | None) -> list[tuple[str, PairSchedule]]:
    from passes.plan_view import PlanView

    view = PlanView(module)
    if pair is not None:
        op = view.ops.get(pair)
        if op is not None and op.op == "pair" and "schedule" not in op.attrs:
            print(
                f"tessera-viz: pair @{pair} has no schedule; scheduling it now with gap-fit for {view.hardware_name}",
                file=sys.stderr,
            )
            from passes.scheduling.gap_fit import gap_fit

            return [(pair, gap_fit(view.pair_dag(view.pair(pair))))]
        return [(pair, view.schedule(pair))]
    scheds = [op.name for op in module.plan if op.op == "pair_schedule"]
    if not scheds:
        raise VizError("the plan has no pair_schedule ops; run tessera-opt --passes=overlap-schedule first, or name a --pair")
    return [(name, view.schedule(name)) for name in scheds]


def _viz_parser() -> argparse.ArgumentParser:
    ap = tool_parser("tessera-viz", "Draw pair schedules of a Tessera plan.")
    ap.add_argument("plan", help="a textual IR file (.tir) holding pairs and their schedules")
    ap.add_argument("--pair", help="pair or pair_schedule op to draw (default: every pair_schedule)")
    ap.add_argument("--format", default="svg,json", help=f"comma-separated: {', '.join(FORMATS)} (default svg,json)")
    ap.add_argument("-o", "--output", default=".", help="output folder (default: current folder)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds graphviz may take per drawing")
    return ap


def _viz(args: argparse.Namespace, run: Run) -> int:
    from tessera_ir.verifier import verify

    formats = _parse_formats(args.format)
    run.keep_apart({"plan": args.plan}, {"-o": args.output})
    folder = run.output_folder(args.output, "-o")
    module = run.parse_ir(args.plan)
    verify(module)  # a schedule is drawn only once the verifier has checked it
    drawn: list[Path] = []
    for name, schedule in _schedules_to_draw(module, args.pair):
        if not math.isfinite(schedule.makespan):
            raise VizError(f"schedule @{name} ends past the largest float; its times cannot be drawn")
        for file_name, data in render_pair(schedule, name, formats, args.timeout):
            path = folder / file_name
            run.add(path, data)
            drawn.append(path)
    run.commit()
    for path in drawn:
        print(path)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-viz", _viz_parser(), _viz, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
