"""Analytic post-overlap cost against measurement on this CPU, per layer combination.

For the tiny example model and for Qwen3-Next-80B shapes (scaled down by one
factor per model), pairs of every forward x backward layer-kind combination
(Gated DeltaNet = LA, softmax attention = ATT; one and two layers per chunk)
are profiled with ``profile{mode=measured}``: each pair's schedule runs for
real on two gloo processes, beside the analytic prediction for the calibrated
``cpu`` hardware on the same work. Every repeat of a pair runs between two
readings of the calibration's reference kernel (each reading the reference back to
back for about the pair's length, on warm buffers), and the pair's time is scaled by
the reference's calibrated time over the same statistic of those readings (the
machine's speed drifts by up to 2x over seconds when others share it). Compared in
the same run:

- ``naive``: the schedule of isolated durations (no contention), against the
  normalised measurement;
- ``contention``: the same schedule re-timed by the contention model, against the
  normalised measurement (the cost model as profiling uses it) and against the raw one
  (what measuring without the reference kernel would report).

Then every distinct task of the pairs runs on its own (at the pairs' scale, as a pair-length
chain of copies of it, between reference readings) against its analytic isolated duration, by
kernel class, so a pair's error can be traced to its tasks or to how they overlap; and the reference kernel is read on warm buffers
beside single runs on fresh ones (first-touch page faults, which once biased every reading).
With ``--pair-tasks`` every pair runs once more and is printed task by task: each task's time
inside the pair beside its time alone and the contention model's start, end and duration on
those times, and the streams' busy time measured against modelled (which tasks the error sits in).

The mark on this CPU: at most 10% mean and 25% p95 absolute error of the contention
model over the bench's pairs in one run (published on H100/H200: ~5% mean, 15% tail).

    .venv/bin/python bench/bench_cost_model.py            # fresh calibration and measurements
    .venv/bin/python bench/bench_cost_model.py --quick    # fewer repeats, quick calibration
    .venv/bin/python bench/bench_cost_model.py --rounds 3 --statistic min --pair-tasks

Writes ``bench/results/cost_model.csv`` (one row per pair) and
``bench/results/cost_model.json`` (rows, summary, the calibrated hardware).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.pair_executor import ExecTask as ExecTaskType
    from tessera_ir.model import PlanOp as PlanOpType

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "bench" / "results"
SHORT = {"linear_attention": "LA", "attention": "ATT"}


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    pos = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def add_pairs(module, prefix: str) -> list[tuple[str, PlanOpType]]:  # noqa: ANN001
    """Pairs for every forward x backward combination of layer kinds, 1 and 2 layers per chunk."""
    from tessera_ir.model import PlanOp, SymbolRef

    by_kind: dict[str, list[str]] = {}
    for layer in module.decoder_layers():
        by_kind.setdefault(layer.mixer.value, []).append(layer.name)
    la, att = by_kind["linear_attention"], by_kind["attention"]
    combos = [
        ([la[0]], [la[1]]),
        ([la[0]], [att[0]]),
        ([att[0]], [la[0]]),
        ([att[0]], [att[1] if len(att) > 1 else att[0]]),
        ([la[0], la[1]], [la[2], att[0]]),
        ([la[2], att[0]], [la[0], la[1]]),
    ]
    out = []
    for i, (fwd, bwd) in enumerate(combos):
        label = "+".join(SHORT[module.layers[[x.name for x in module.layers].index(n)].mixer.value] for n in fwd)
        label += " | " + "+".join(SHORT[module.layers[[x.name for x in module.layers].index(n)].mixer.value] for n in bwd)
        op = PlanOp("pair", f"{prefix}.{i}", {"fwd": [SymbolRef(n) for n in fwd], "bwd": [SymbolRef(n) for n in bwd]})
        module.plan.append(op)
        out.append((label, op))
    return out


def print_table(header: str, lines: list[str]) -> None:
    print(header)
    print("-" * len(header))
    for line in lines:
        print(line)


def task_label(e: ExecTaskType) -> str:
    """What the executor runs for a task: a GEMM's dimensions, a copy's or an All-to-All's bytes."""
    if e.resource == "comm":
        return f"all_to_all {e.bytes / 1e3:.1f} kB"
    if e.shapes:
        (m, k), (_, n) = e.shapes
        return f"gemm {m}x{k}x{n}"
    return f"copy {e.bytes / 1e3:.1f} kB"


def task_key(e: ExecTaskType) -> tuple:
    """What a task's time on its own depends on: its stream and its executed work."""
    return (e.resource, e.flops, e.bytes, tuple(e.shapes))


def executed_view(module, hw, world: int, statistic: str):  # noqa: ANN001, ANN201
    """What re-executing a profiled module's pairs needs: the plan seen on the measured device
    (fp32, ``world`` EP ranks), the pairs' scale, the calibration's reference chain and its
    calibrated time, and the statistic's reading of repeats."""
    from dataclasses import replace

    from passes.costs.calibrate_cpu import reference_tasks
    from passes.plan_view import PlanView

    target = PlanView(module)
    view = PlanView(module, device=hw, parallel=replace(target.parallel, dtype="fp32", ep=world))
    spec = hw.extra["reference"]
    assert isinstance(spec, dict)
    pick = min if statistic == "min" else statistics.median
    return view, float(module.attrs["profile_scale"]), reference_tasks(spec), float(spec["us"]), pick


def per_task_rows(
    source: str, module, hw, executor, repeats: int, statistic: str,  # noqa: ANN001
) -> list[dict]:
    """Every distinct task of the module's profiled pairs, run alone on the executor (at the scale the
    pairs ran at, between reference-kernel readings), against its analytic isolated duration.

    A task is read as the calibration reads it: a compute task as distinct copies of it back to
    back for about a pair's length (``CHAIN_WINDOW_US``), the chain's time (the ``statistic`` of
    the repeats, each the slowest rank's wall time) over its length; an All-to-All on its own, its
    own duration (the slowest rank's); either times the reference's calibrated time over the same
    statistic of the readings around it (each as long as the chain)."""
    from dataclasses import replace

    from passes.costs.calibrate_cpu import CHAIN_WINDOW_US, MAX_CHAIN, slowest_rank_time
    from passes.costs.durations import analytic_duration_us
    from passes.costs.execution import MAX_REFERENCE_RUNS, exec_tasks
    from runtime.pair_executor import executed_work

    view, scale, reference, reference_us, pick = executed_view(module, hw, executor.world_size, statistic)
    seen: dict[tuple, dict] = {}
    for pair in view.pairs:
        items = view.scheduled_tasks(pair)
        for e, item in zip(exec_tasks(items, scale, "fp32", hw, view.parallel), items):
            key = task_key(e)
            kind = item.task.kind
            if key in seen:
                if kind not in seen[key]["kinds"]:
                    seen[key]["kinds"].append(kind)
                continue
            flops, nbytes = executed_work(e, executor.world_size)
            executed = replace(item.task, flops=flops, bytes=nbytes, attrs={})
            predicted = analytic_duration_us(executed, hw, replace(view.parallel, dtype="fp32"))
            # Copies back to back for about a pair's length, as the calibration times compute
            # throughput; an All-to-All on its own, as the calibration times it.
            count = 1 if e.resource == "comm" else max(1, min(MAX_CHAIN, round(CHAIN_WINDOW_US / max(predicted, 1.0))))
            chain = [replace(e, name=f"{e.name}#{i}", deps=(), order=i) for i in range(count)]
            runs = max(1, min(MAX_REFERENCE_RUNS, round(count * predicted / reference_us)))  # as long as the chain
            m = executor.measure(chain, repeats=repeats, warmup=1, reference=reference, reference_runs=runs)
            if count == 1:
                # The task's own duration, as the calibration reads a lone All-to-All: the pair's wall
                # time would add the executor's fixed cost per pair, which no task pays.
                own = slowest_rank_time(m, chain[0].name, statistic)
            else:
                own = (m.min_us if statistic == "min" else m.median_us) / count
            measured = own * reference_us / pick(m.reference_us)
            seen[key] = {
                "source": source, "task": task_label(e), "key": key, "kinds": [kind], "resource": e.resource,
                "predicted_us": predicted, "measured_us": measured, "error": (predicted - measured) / measured,
                "gflops": flops / measured / 1e3 if flops else 0.0,
            }
    return list(seen.values())


def with_measured_tasks(module, hw, world: int, measured: dict[tuple, float]) -> dict[str, float]:  # noqa: ANN001
    """Each pair's contention-model makespan (µs at the executed size, with the executor's fixed cost
    per pair, as profiling predicts it) when every task lasts what it measured on its own
    (``measured``, by :func:`task_key`) instead of its analytic duration: what is left of a pair's
    error is the overlap model's, not the isolated durations'."""
    from dataclasses import replace

    from passes.costs.execution import exec_tasks, predicted_exec
    from passes.plan_view import PlanView

    target = PlanView(module)
    view = PlanView(module, device=hw, parallel=replace(target.parallel, dtype="fp32", ep=world))
    scale = float(module.attrs["profile_scale"])
    overhead = float(hw.extra.get("pair_overhead_us", 0.0))
    out = {}
    for pair in view.pairs:
        items = view.scheduled_tasks(pair)
        execs = exec_tasks(items, scale, "fp32", hw, view.parallel)
        contended, _ = predicted_exec(items, execs, hw, view.parallel, world, lambda e: measured[task_key(e)])
        out[pair.name] = contended.makespan + overhead
    return out


def pair_task_rows(
    source: str, pairs: list, module, hw, executor, measured: dict[tuple, float], repeats: int, statistic: str,  # noqa: ANN001
) -> list[dict]:
    """Each pair executed once more, task by task: every task's duration inside the pair (the slowest
    rank's, the ``statistic`` of the repeats, at the reference speed) and its mean end from the
    pair's start, beside the task alone (``measured``, by :func:`task_key`) and the contention
    model's start, end and duration on those measured durations. Says which tasks a pair's error
    sits in: the isolated durations are the same on both sides, so what differs is overlap."""
    from passes.costs.calibrate_cpu import slowest_rank_time
    from passes.costs.execution import MAX_REFERENCE_RUNS, exec_tasks, predicted_exec

    view, scale, reference, reference_us, pick = executed_view(module, hw, executor.world_size, statistic)
    by_name = {p.name: p for p in view.pairs}
    out = []
    for label, op in pairs:
        items = view.scheduled_tasks(by_name[op.name])
        execs = exec_tasks(items, scale, "fp32", hw, view.parallel)
        model, _ = predicted_exec(items, execs, hw, view.parallel, executor.world_size, lambda e: measured[task_key(e)])
        runs = max(1, min(MAX_REFERENCE_RUNS, round(model.makespan / reference_us)))
        m = executor.measure(execs, repeats=repeats, warmup=1, reference=reference, reference_runs=runs)
        speed = reference_us / pick(m.reference_us)
        for e in sorted(execs, key=lambda e: (model.start[e.name], e.resource)):
            out.append({
                "source": source, "combination": label, "task": e.name, "stream": e.resource,
                "alone_us": measured[task_key(e)], "in_pair_us": slowest_rank_time(m, e.name, statistic) * speed,
                "end_mean_us": m.task_end_mean_us[e.name] * speed,
                "model_us": model.finish[e.name] - model.start[e.name], "model_start_us": model.start[e.name],
                "model_end_us": model.finish[e.name], "pair_us": pick(m.samples_us) * speed,
                "model_pair_us": model.makespan,
            })
    return out


def print_pair_tasks(rows: list[dict]) -> None:
    """Per pair: the streams' busy time in the pair against the model's, then every task."""
    for (source, label) in dict.fromkeys((r["source"], r["combination"]) for r in rows):
        sel = [r for r in rows if r["source"] == source and r["combination"] == label]
        busy = {
            stream: (sum(r["in_pair_us"] for r in sel if r["stream"] == stream), sum(r["model_us"] for r in sel if r["stream"] == stream))
            for stream in ("compute", "comm")
        }
        print(
            f"\n{source} {label}: pair {sel[0]['pair_us']:.0f} µs measured, {sel[0]['model_pair_us']:.0f} modelled on the "
            f"tasks' own times; busy in the pair / modelled: compute {busy['compute'][0]:.0f} / {busy['compute'][1]:.0f}, "
            f"comm {busy['comm'][0]:.0f} / {busy['comm'][1]:.0f} µs"
        )
        print_table(f"{'task':30} {'stream':7} {'alone':>7} {'in pair':>8} {'model':>7} {'model start':>11} {'model end':>9} {'end (mean)':>10}", [
            f"{r['task'][:30]:30} {r['stream']:7} {r['alone_us']:7.0f} {r['in_pair_us']:8.0f} {r['model_us']:7.0f} "
            f"{r['model_start_us']:11.0f} {r['model_end_us']:9.0f} {r['end_mean_us']:10.0f}"
            for r in sel
        ])


def reference_first_touch(hw, executor, runs: int) -> dict[str, float]:  # noqa: ANN001
    """The reference kernel read as the normalisation reads it (warm buffers, several runs in one
    call) and as it once read it (one run on freshly allocated buffers per call), side by side."""
    from passes.costs.calibrate_cpu import reference_tasks

    spec = hw.extra["reference"]
    assert isinstance(spec, dict)
    reference = reference_tasks(spec)
    warm = executor.measure(reference, repeats=runs, warmup=1).samples_us
    cold = [executor.measure(reference, repeats=1, warmup=0).samples_us[0] for _ in range(runs)]
    return {
        "calibrated_us": float(spec["us"]), "warm_min_us": min(warm), "warm_median_us": statistics.median(warm),
        "cold_min_us": min(cold), "cold_median_us": statistics.median(cold),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="quick calibration and 3 repeats (a smoke run)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--target-ms", type=float, default=30.0, help="predicted serial time of each model's largest pair")
    ap.add_argument("--cache-dir", default=None, help="reuse a profile cache (default: a fresh temporary one)")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--no-tasks", action="store_true", help="skip timing every distinct task of the pairs alone")
    ap.add_argument(
        "--pair-tasks", action="store_true",
        help="execute every pair once more and print it task by task (in the pair, alone, and as modelled)",
    )
    ap.add_argument("--rounds", type=int, default=1, help="times every pair is executed afresh (each with its repeats)")
    ap.add_argument(
        "--statistic", choices=["min", "median"], default="median",
        help="reading of the repeats (calibration and pairs alike): median, or min (least disturbed)",
    )
    args = ap.parse_args()
    if args.pair_tasks and args.no_tasks:
        ap.error("--pair-tasks needs every task timed alone; drop --no-tasks")
    repeats = args.repeats or (3 if args.quick else 7)

    import frontend
    from passes.costs.calibrate_cpu import cpu_hardware
    from passes.manager import PassManager, parse_pipeline

    t0 = time.perf_counter()
    load_before = os.getloadavg()[0]
    tmp = None
    if args.cache_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tessera-bench-")
        cache_dir = tmp.name
    else:
        cache_dir = args.cache_dir
    print(f"calibrating the local CPU (cache {cache_dir}) ...", file=sys.stderr)
    hw = cpu_hardware(cache_dir, quick=args.quick, statistic=args.statistic)
    t_cal = time.perf_counter() - t0
    cont = hw.extra.get("contention", {})
    assert isinstance(cont, dict)
    print(
        f"calibrated: fp32 {hw.peak_tflops['fp32'] * 1e3:.0f} GFLOP/s, GEMM operand packing "
        f"{hw.gemm_packing_gbps.get('fp32', 0.0):.1f} GB/s, task overhead {hw.kernel_launch_us:.0f} µs, "
        f"copy {hw.hbm_gbps:.1f} GB/s, a2a {hw.a2a_latency_us:.0f} µs + {hw.a2a_gbps(2):.2f} GB/s, "
        f"pair overhead {hw.extra.get('pair_overhead_us', 0.0):.0f} µs; contention: "
        + ", ".join(f"{k} {v:.3g}" for k, v in cont.items() if not isinstance(v, bool)),
        file=sys.stderr,
    )

    sources = [
        ("tiny", "examples/tiny_qwen3_next.py", None),
        ("qwen3_next_80b", "hf:qwen3_next", {"ep": 8, "pp": 8, "vpp": 2}),
    ]
    rows = []
    task_rows: list[dict] = []
    pair_tasks: list[dict] = []
    first_touch: dict[str, float] | None = None
    captured: list[tuple[str, Any, list[tuple[str, PlanOpType]], list[dict[str, dict]]]] = []
    for source, spec, overrides in sources:
        module = frontend.capture(str(ROOT / spec) if spec.endswith(".py") else spec, overrides=overrides)
        captured.append((source, module, add_pairs(module, f"pair.{source}"), []))
    # Several rounds, each in its own cache (sharing the one calibration), so every pair is executed
    # again; a burst of other work on the machine then only spoils one round's reading. The rounds
    # alternate between the sources, so one source's rounds lie minutes apart: run one after the
    # other, all of them could fall in the same slow minute (one run read every pair of both models
    # 7-30% over its prediction).
    for round_no in range(args.rounds):
        round_dir = Path(cache_dir) / f"round{round_no}"
        if not (round_dir / "hardware").is_dir():
            shutil.copytree(Path(cache_dir) / "hardware", round_dir / "hardware")
        pipeline = (
            f"profile{{mode=measured repeats={repeats} target-ms={args.target_ms} cache-dir={round_dir} "
            f"statistic={args.statistic}}}"
        )
        for _, module, pairs, per_round in captured:
            PassManager(parse_pipeline(pipeline)).run(module)
            per_round.append({op.name: dict(op.attrs) for _, op in pairs})
    for source, module, pairs, per_round in captured:
        hybrid: dict[str, float] = {}
        if not args.no_tasks:
            from runtime.pair_executor import PairExecutor

            print(f"timing every distinct task of the {source} pairs alone ...", file=sys.stderr)
            with PairExecutor(world_size=2) as executor:
                if first_touch is None:
                    first_touch = reference_first_touch(hw, executor, 2 * repeats + 1)
                task_rows += per_task_rows(source, module, hw, executor, repeats, args.statistic)
                alone = {t["key"]: t["measured_us"] for t in task_rows if t["source"] == source}
                if args.pair_tasks:
                    pair_tasks += pair_task_rows(source, pairs, module, hw, executor, alone, repeats, args.statistic)
            hybrid = with_measured_tasks(module, hw, 2, alone)
        for label, op in pairs:
            readings = [rd[op.name] for rd in per_round]
            a = readings[0]
            combine = min if args.statistic == "min" else statistics.median
            measured = combine([x["measured_us"] for x in readings])
            raw = combine([x["raw_measured_us"] for x in readings])
            scale = a["profile_scale"]
            rows.append({
                "source": source,
                "combination": label,
                "pair": op.name,
                "fwd": " ".join(r.name for r in a["fwd"]),
                "bwd": " ".join(r.name for r in a["bwd"]),
                "scale": scale,
                # Times at the executed (scaled) size, as measured on this CPU.
                "serial_us": a["serial_us"] * scale,
                "naive_us": a["overlap_us"] * scale,
                "predicted_us": a["predicted_us"] * scale,
                "measured_us": measured * scale,
                "raw_measured_us": raw * scale,
                "speed_ratio": statistics.median(x["speed_ratio"] for x in readings),
                "spread_us": max(x["spread_us"] for x in readings) * scale,
                "naive_error": (a["overlap_us"] - measured) / measured,
                "contention_error": (a["predicted_us"] - measured) / measured,
                "raw_contention_error": (a["predicted_us"] - raw) / raw,
                # The contention model on the tasks' measured durations (None with --no-tasks).
                "measured_tasks_us": hybrid[op.name] if hybrid else None,
                "measured_tasks_error": (hybrid[op.name] - measured * scale) / (measured * scale) if hybrid else None,
                "repeats": a["profile_repeats"],
                "rounds": args.rounds,
            })

    def summary(sel: list[dict]) -> dict[str, float]:
        naive = [abs(r["naive_error"]) for r in sel]
        cont = [abs(r["contention_error"]) for r in sel]
        raw = [abs(r["raw_contention_error"]) for r in sel]
        hyb = [abs(r["measured_tasks_error"]) for r in sel if r["measured_tasks_error"] is not None]
        return {
            "pairs": len(sel),
            "measured_tasks_mean_error": statistics.mean(hyb) if hyb else None,
            "measured_tasks_p95_error": pct(hyb, 95) if hyb else None,
            "naive_mean_error": statistics.mean(naive), "naive_p95_error": pct(naive, 95),
            "contention_mean_error": statistics.mean(cont), "contention_p95_error": pct(cont, 95),
            "raw_contention_mean_error": statistics.mean(raw), "raw_contention_p95_error": pct(raw, 95),
        }

    header = (
        f"{'source':15} {'fwd | bwd':14} {'serial':>9} {'naive':>9} {'contention':>10} {'measured':>9} {'raw':>9} "
        f"{'speed':>6} {'spread':>8} {'err naive':>9} {'err cont':>9} {'err raw':>9}"
    )
    print(
        f"\nanalytic vs measured post-overlap cost on {hw.description}\n"
        f"(µs at the executed size; measured = {args.statistic} of {args.rounds} round(s) x {repeats} repeats, each "
        "repeat between two reference-kernel readings and scaled to the calibrated speed; raw = the same repeats "
        "unscaled; speed = reference now / at calibration; spread = max - min of the scaled repeats)"
    )
    print_table(header, [
        f"{r['source']:15} {r['combination']:14} {r['serial_us']:9.0f} {r['naive_us']:9.0f} {r['predicted_us']:10.0f} "
        f"{r['measured_us']:9.0f} {r['raw_measured_us']:9.0f} {r['speed_ratio']:6.2f} {r['spread_us']:8.0f} "
        f"{r['naive_error']:+9.1%} {r['contention_error']:+9.1%} {r['raw_contention_error']:+9.1%}"
        for r in rows
    ])
    summaries = {"all": summary(rows)}
    for source, _, _ in sources:
        summaries[source] = summary([r for r in rows if r["source"] == source])
    print("\nabsolute error of the analytic model against measurement")
    print(
        f"{'set':15} {'pairs':>5} {'naive mean':>10} {'naive p95':>10} {'cont. mean':>10} {'cont. p95':>10} "
        f"{'raw mean':>9} {'raw p95':>9}"
    )
    for name, s in summaries.items():
        print(
            f"{name:15} {s['pairs']:5d} {s['naive_mean_error']:10.1%} {s['naive_p95_error']:10.1%} "
            f"{s['contention_mean_error']:10.1%} {s['contention_p95_error']:10.1%} "
            f"{s['raw_contention_mean_error']:9.1%} {s['raw_contention_p95_error']:9.1%}"
        )
    if task_rows:
        print(
            "\nthe contention model on each task's measured duration on its own (the table below) instead of its "
            "analytic one: the error left is the overlap model's"
        )
        print(f"{'source':15} {'fwd | bwd':14} {'predicted':>9} {'measured':>9} {'error':>7}")
        for r in rows:
            print(
                f"{r['source']:15} {r['combination']:14} {r['measured_tasks_us']:9.0f} {r['measured_us']:9.0f} "
                f"{r['measured_tasks_error']:+7.1%}"
            )
        for name, s in summaries.items():
            print(f"{name:15} mean {s['measured_tasks_mean_error']:6.1%}  p95 {s['measured_tasks_p95_error']:6.1%}")
    if first_touch is not None:
        ft = first_touch
        print(
            f"\nreference kernel (calibrated {ft['calibrated_us']:.0f} µs): on warm buffers min {ft['warm_min_us']:.0f}, "
            f"median {ft['warm_median_us']:.0f} µs; one run on fresh buffers per call min {ft['cold_min_us']:.0f}, "
            f"median {ft['cold_median_us']:.0f} µs (x{ft['cold_median_us'] / ft['warm_median_us']:.2f}: first-touch page "
            "faults, what single cold readings once divided every measurement by)"
        )
    if task_rows:
        print(
            f"\nevery distinct task of the pairs on its own (µs at the executed size per task of a pair-length chain of "
            f"copies, {args.statistic} of {repeats} repeats, scaled to the calibrated speed) against its analytic "
            "isolated duration"
        )
        print_table(f"{'source':15} {'executed as':26} {'predicted':>9} {'measured':>9} {'error':>7} {'GFLOP/s':>7}  IR tasks", [
            f"{t['source']:15} {t['task']:26} {t['predicted_us']:9.0f} {t['measured_us']:9.0f} {t['error']:+7.1%} "
            f"{t['gflops']:7.1f}  {', '.join(t['kinds'])}"
            for t in task_rows
        ])
        print("\nby kernel class: sum of predicted / sum of measured, mean absolute error")
        for source, _, _ in sources:
            for cls in ("gemm", "copy", "all_to_all"):
                sel = [t for t in task_rows if t["source"] == source and t["task"].startswith(cls)]
                if sel:
                    ratio = sum(t["predicted_us"] for t in sel) / sum(t["measured_us"] for t in sel)
                    err = statistics.mean(abs(t["error"]) for t in sel)
                    print(f"{source:15} {cls:10} {len(sel):3d} tasks  predicted/measured {ratio:5.2f}  mean |error| {err:6.1%}")
    if pair_tasks:
        print("\nevery pair task by task (µs at the executed size and the reference speed; in pair: the slowest rank's, "
              f"{args.statistic} of {repeats} repeats; alone: the table above; model: the contention model on those times)")
        print_pair_tasks(pair_tasks)
    overall = summaries["all"]
    met = overall["contention_mean_error"] <= 0.10 and overall["contention_p95_error"] <= 0.25
    print(
        f"mark on this CPU (contention, normalised): <= 10% mean, <= 25% p95 -> "
        f"{'met' if met else 'NOT met'} ({overall['contention_mean_error']:.1%}, {overall['contention_p95_error']:.1%})"
    )
    print("(published on H100/H200: ~5% mean, up to 15% tail; bench/bench_cost_model_gpu.py measures that on a GPU)")
    load_after = os.getloadavg()[0]
    print(f"machine load (1-min average) {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} cores")
    elapsed = time.perf_counter() - t0
    print(f"calibration {t_cal:.0f} s, total {elapsed:.0f} s", file=sys.stderr)

    if not args.no_save:
        RESULTS.mkdir(parents=True, exist_ok=True)
        with open(RESULTS / "cost_model.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        hw_json = asdict(hw)
        (RESULTS / "cost_model.json").write_text(json.dumps({
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": {
                "platform": platform.platform(), "python": platform.python_version(), "cores": os.cpu_count(),
                "load_before": load_before, "load_after": load_after,
            },
            "command": " ".join(["bench/bench_cost_model.py", *sys.argv[1:]]),
            "repeats": repeats,
            "rounds": args.rounds,
            "statistic": args.statistic,
            "target_ms": args.target_ms,
            "seconds": elapsed,
            "summary": summaries,
            "rows": rows,
            "tasks": task_rows,
            "reference_first_touch": first_touch,
            "cpu_hardware": hw_json,
            "pair_tasks": pair_tasks,
        }, indent=1, default=str) + "\n")
        print(f"wrote {RESULTS / 'cost_model.csv'} and {RESULTS / 'cost_model.json'}", file=sys.stderr)
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
