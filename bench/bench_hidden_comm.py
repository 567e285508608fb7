"""How much expert-parallel communication overlap hides: Qwen3-30B-A3B (medium) vs Qwen3-235B-A22B (large).

For each model and setting, a one-layer pair (the forward of one decoder layer beside the
backward of another) is scheduled by ``overlap-schedule`` and re-timed by the contention
model on the target hardware (what ``profile{mode=analytic}`` costs); the *hidden* share of
the All-to-All is the part of the comm tasks' running time during which the compute stream
is busy. Printed per setting with what decides it: the rows each local expert receives, the
expert GEMMs' efficiency at that size, and the layer's compute over its All-to-All time
(isolated durations). Published: the large model hides 73% of its EP communication, the
medium one 26% ("dense expert GEMMs hide more").

Settings: each model's suggested one (``frontend/workloads/parallel.json``), then both at
every ``--eps`` x ``--tps`` x ``--seq-lens`` point, so the comparison at equal parallelism is
in the same table.

    .venv/bin/python bench/bench_hidden_comm.py
    .venv/bin/python bench/bench_hidden_comm.py --eps 8,32 --tps 1,2 --seq-lens 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from frontend import WORKLOADS_DIR, capture  # noqa: E402
from passes.costs.contention import ContentionParams, retime  # noqa: E402
from passes.costs.pair_costs import contended_tasks  # noqa: E402
from passes.plan_view import PlanView  # noqa: E402
from tessera.api import run_passes  # noqa: E402
from tessera_ir.kinds import Phase, Resource, TaskOp  # noqa: E402
from tessera_ir.model import Module, PlanOp, SymbolRef  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MODELS = ["qwen3_30b_a3b", "qwen3_235b_a22b"]
PUBLISHED = "published: the large model hides 73% of its EP communication, the medium one 26%"


def hidden_share(module: Module) -> dict[str, float]:
    """Schedule and re-time one one-layer pair (layers 1 | 2); the comm time overlapped by compute."""
    a, b = module.decoder_layers()[1:3]
    module.plan.append(PlanOp("pair", "pair.hidden", {"fwd": [SymbolRef(a.name)], "bwd": [SymbolRef(b.name)]}))
    run_passes(module, "overlap-schedule{jobs=1}", verify=False)
    view = PlanView(module)
    pair = view.pair("pair.hidden")
    tasks = contended_tasks(view.scheduled_tasks(pair), view.duration, view.utilisation)
    timed = retime(tasks, ContentionParams.from_hardware(view.hardware, view.parallel.ep))
    busy = sorted((timed.start[t.name], timed.finish[t.name]) for t in tasks if t.resource == Resource.COMPUTE.value)
    comm = exposed = 0.0
    for t in tasks:
        if t.resource != Resource.COMM.value:
            continue
        start, end = timed.start[t.name], timed.finish[t.name]
        covered = sum(max(0.0, min(end, e) - max(start, s)) for s, e in busy if s < end and e > start)
        comm += end - start
        exposed += end - start - covered
    layer = module.decoder_layers()[1]
    compute_us = sum(view.duration(t) for t in layer.tasks if t.resource is Resource.COMPUTE)
    comm_us = sum(view.duration(t) for t in layer.tasks if t.resource is Resource.COMM)
    experts = layer.task(f"{layer.name}.expert_gemm.{Phase.FWD.value}")
    rows = experts.attrs.get("rows_per_expert", 0)
    return {
        "hidden_pct": 100.0 * (1.0 - exposed / comm) if comm else 100.0,
        "compute_over_a2a": compute_us / comm_us if comm_us else float("inf"),
        "rows_per_expert": float(rows) if isinstance(rows, int) else 0.0,
        "expert_efficiency": view.hardware.expert_efficiency(float(rows)) if isinstance(rows, int) and rows else 0.0,
        "expert_fwd_us": view.duration(experts),
        "a2a_fwd_us": view.duration(layer.task(f"{layer.name}.{TaskOp.DISPATCH.value}.fwd")),
        "pair_makespan_us": timed.makespan,
    }


def setting(model: str, overrides: dict[str, object], hardware: str) -> dict[str, object]:
    module = capture(str(WORKLOADS_DIR / f"{model}.json"), overrides=dict(overrides, pp=1, vpp=1, microbatches=1, dp=1))
    module.attrs["hardware"] = hardware
    p = PlanView(module).parallel
    row: dict[str, object] = {"model": model, "seq_len": p.seq_len, "ep": p.ep, "tp": p.tp, "hardware": hardware,
                              "setting": "suggested" if not overrides else "sweep"}
    row.update({k: round(v, 3) for k, v in hidden_share(module).items()})
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eps", default="8,32")
    ap.add_argument("--tps", default="1,2")
    ap.add_argument("--seq-lens", default="4096")
    ap.add_argument("--hardware", default="h100")
    ap.add_argument("--out", type=Path, default=RESULTS / "hidden_comm.json")
    args = ap.parse_args(argv)
    table = json.loads((WORKLOADS_DIR / "parallel.json").read_text())
    rows = []
    for model in MODELS:
        suggested = {k: v for k, v in table[model]["parallel"].items() if k in ("ep", "tp", "seq_len", "recompute")}
        row = setting(model, {}, args.hardware)
        row["setting"] = f"suggested (EP{suggested['ep']} TP{suggested['tp']})"
        rows.append(row)
    for seq in [int(x) for x in args.seq_lens.split(",")]:
        for ep in [int(x) for x in args.eps.split(",")]:
            for tp in [int(x) for x in args.tps.split(",")]:
                for model in MODELS:
                    rows.append(setting(model, {"ep": ep, "tp": tp, "seq_len": seq}, args.hardware))
    head = (f"{'model':<18} {'setting':<22} {'seq':>6} {'EP':>3} {'TP':>3} {'rows/expert':>11} {'expert eff':>10} "
            f"{'expert fwd us':>13} {'a2a fwd us':>10} {'compute/a2a':>11} {'hidden %':>8}")
    print(f"EP All-to-All hidden behind computation in a one-layer pair (gap fit, contention model, {args.hardware})")
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['model']:<18} {r['setting']:<22} {r['seq_len']:>6} {r['ep']:>3} {r['tp']:>3} {r['rows_per_expert']:>11.0f} "
              f"{r['expert_efficiency']:>10.3f} {r['expert_fwd_us']:>13.0f} {r['a2a_fwd_us']:>10.0f} "
              f"{r['compute_over_a2a']:>11.2f} {r['hidden_pct']:>8.1f}")
    print(PUBLISHED)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
