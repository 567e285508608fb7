"""Pair schedules on the pairs real plans contain: the heuristic against the CP-SAT optimum.

For each setting (a workload at one EP and sequence length), the model is captured, the
``candidates`` pass enumerates its pairs (multi-layer chunks, chunks holding the embedding or
the LM head) and the distinct pair DAGs among them are collected exactly as
``overlap-schedule`` groups them. A seeded sample of ``--sample`` distinct DAGs is then
scheduled by

- ``gap-fit`` (the default heuristic) and ``fixed-template`` (Megatron-Core's combined-1F1B
  order), and
- ``exact`` (CP-SAT, one deterministic worker, ``--time-limit`` deterministic seconds),

and every schedule is checked. Printed per setting: DAG sizes, how many optima were proven,
the heuristic's gap to the best exact schedule (mean, worst, how many pairs above it; over the
pairs whose optimum was proven, and over all), makespan / lower bound (mean, max) of the
heuristic beside the optimum's own ratio (the real floor), and the speed ratio CP-SAT time /
heuristic time. Marks (issue 15): mean gap <= 0.1%, worst <= 1%; makespan / lower bound mean
<= 1.02 where the optimum allows it.

Pipeline transfers: every sampled DAG is also scheduled by gap-fit with the chunk's pipeline
send/receive inside it (``with_pipeline_transfers``: on each side, the receive of its input —
the activation for the forward, the output gradient for the backward — before the side's
first tasks and the send of its output after its last, on the comm stream, one micro-batch's
hidden state at the hardware file's ``p2p_gbps`` after ``p2p_latency_us``), and the change of
makespan is reported beside the transfers' own time.

``--workloads all`` runs every shipped reference workload (``frontend/workloads``) at its own
PP and VPP (unless ``--pp``/``--vpp`` are given) for each ``--ep`` and ``--seq-len``; a setting
the frontend refuses is reported and skipped. ``--csv`` writes one row per setting (and
``<name>_pairs.csv`` one row per sampled pair).

    .venv/bin/python bench/bench_real_pairs.py                              # Qwen3-Next, EP8 and EP32, seq 4K
    .venv/bin/python bench/bench_real_pairs.py --source hf:qwen3_next --ep 8 16 32 --seq-len 4096 32768
    .venv/bin/python bench/bench_real_pairs.py --bottleneck --time-limit 30   # each device's worst pair
    .venv/bin/python bench/bench_real_pairs.py --workloads all --ep 8 16 32 64 --seq-len 4096 32768 \
        --sample 40 --time-limit 2 --csv bench/results/real_pairs.csv          # the real-plan suite
"""

from __future__ import annotations

import argparse
import csv
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from frontend.sources import WORKLOADS_DIR, workload_configs  # noqa: E402
from passes.costs.hardware import load_hardware  # noqa: E402
from passes.plan_view import PlanView  # noqa: E402
from passes.scheduling.baselines import fixed_template  # noqa: E402
from passes.scheduling.check import check_pair_schedule  # noqa: E402
from passes.scheduling.exact import exact  # noqa: E402
from passes.scheduling.gap_fit import gap_fit  # noqa: E402
from passes.scheduling.pair_dag import BWD, FWD, PairDAG, PairTask, join_sides  # noqa: E402
from passes.scheduling.schedule import SchedulingError  # noqa: E402
from tessera.api import capture, run_passes  # noqa: E402
from tessera_ir.errors import TesseraError  # noqa: E402
from tessera_ir.kinds import Resource  # noqa: E402
from tessera_ir.model import Module  # noqa: E402
from tessera_ir.parallel import ParallelConfig  # noqa: E402

EPS = 1e-9
HARDWARE = "h100"


def pipeline_transfer_us(module: Module) -> float:
    """One pipeline send or receive: one micro-batch's hidden state (sequence-parallel under TP)
    at the hardware's ``p2p_gbps`` after ``p2p_latency_us`` (the NIC's figures when absent), as
    the iteration simulation charges it."""
    hw = load_hardware(HARDWARE)
    p = ParallelConfig.from_attrs(module.attrs)
    hidden = module.attrs.get("hidden_size")
    if not isinstance(hidden, int):
        return 0.0
    nbytes = p.micro_batch_size * p.seq_len * hidden * p.dtype_bytes // p.tp
    gbps, latency = hw.extra.get("p2p_gbps", hw.nic_gbps), hw.extra.get("p2p_latency_us", hw.a2a_latency_us)
    if not isinstance(gbps, (int, float)) or not isinstance(latency, (int, float)):
        raise TesseraError(f"hardware '{HARDWARE}': p2p_gbps and p2p_latency_us must be numbers")
    return latency + nbytes / (gbps * 1e3)


def with_pipeline_transfers(dag: PairDAG, transfer_us: float, receive_ahead: bool = False) -> PairDAG:
    """``dag`` with each side's pipeline receive (before the side's tasks without a predecessor)
    and send (after its tasks without a successor) as comm tasks of ``transfer_us``. With
    ``receive_ahead`` the receive is the *next* pair's input, which no task here waits for."""
    succ = dag.successors()
    out: list[PairTask] = []
    for side in (FWD, BWD):
        members = [i for i, t in enumerate(dag.tasks) if t.side == side]
        if not members:
            continue
        recv = len(out)
        out.append(PairTask(f"{side}.pipeline_recv", "p2p.recv", Resource.COMM, transfer_us, (), side, "pipeline"))
        index = {}
        for i in members:
            t = dag.tasks[i]
            index[i] = len(out)
            out.append(PairTask(t.name, t.kind, t.resource, t.duration, tuple(index[d] for d in t.deps) or ((), (recv,))[not receive_ahead],
                                side, t.layer, t.movable, t.deadline))
        # The output leaves once the side's sinks are done; wgrad sinks produce no output to send.
        sinks = tuple(index[i] for i in members if not succ[i] and not dag.tasks[i].movable)
        out.append(PairTask(f"{side}.pipeline_send", "p2p.send", Resource.COMM, transfer_us, sinks, side, "pipeline"))
    return PairDAG(dag.name, out)


def distinct_dags(source: str, ep: int, seq_len: int, pp: int | None, vpp: int | None,
                  bottleneck: bool) -> tuple[list[PairDAG], Module]:
    """The distinct pair DAGs of the plan's candidates (and the captured module); with
    ``bottleneck``, only those of the pairs that set each device's worst post-overlap cost
    under the planned partition."""
    module = capture(source, ep=ep, seq_len=seq_len, pp=pp, vpp=vpp)
    module.attrs["hardware"] = HARDWARE
    if bottleneck:
        run_passes(module, "candidates,overlap-schedule{cache=false},profile,partition", verify=False)
        view = PlanView(module)
        worst: dict[tuple[int, int], PairDAG] = {}
        for meetings in view.meetings().values():
            paired = [m.pair for m in meetings if m.pair is not None and m.pair.cost() is not None]
            top = max(paired, key=lambda pair: pair.cost()[0])  # type: ignore[index]
            fwd, bwd = view.pair_sides(top)
            worst.setdefault((view.side_id(fwd), view.side_id(bwd)), join_sides(fwd, bwd, top.name))
        return list(worst.values()), module
    run_passes(module, "candidates", verify=False)
    return PlanView(module).distinct_pair_dags(), module


def pct(x: float) -> str:
    return f"{100 * x:.3f}%"


def one_setting(args: argparse.Namespace, label: str, source: str, ep: int, seq_len: int) -> dict[str, Any] | None:
    """Bench one setting; print its figures and return its summary row (None: setting refused)."""
    t0 = time.perf_counter()
    try:
        dags, module = distinct_dags(source, ep, seq_len, args.pp, args.vpp, args.bottleneck)
    except TesseraError as exc:
        print(f"\n{label} EP{ep} seq {seq_len}: not a valid setting, skipped ({exc})")
        return None
    parallel = ParallelConfig.from_attrs(module.attrs)
    sample = random.Random(args.seed).sample(dags, min(args.sample, len(dags)))
    transfer = pipeline_transfer_us(module)
    what = "pairs setting a device's worst cost" if args.bottleneck else "pair DAGs"
    print(f"\n{label} EP{ep} seq {seq_len} PP{parallel.pp} VPP{parallel.vpp} TP{parallel.tp}: {len(dags)} distinct "
          f"{what}, {len(sample)} sampled (seed {args.seed}); planning {time.perf_counter() - t0:.1f} s", flush=True)
    rows: list[dict[str, Any]] = []
    for dag in sample:
        t1 = time.perf_counter()
        heur = gap_fit(dag)
        heur_s = time.perf_counter() - t1
        check_pair_schedule(heur, prove=False)
        try:
            template = fixed_template(dag).makespan
        except SchedulingError:
            template = float("nan")
        with_p2p = gap_fit(with_pipeline_transfers(dag, transfer))
        check_pair_schedule(with_p2p, prove=False)
        ahead = gap_fit(with_pipeline_transfers(dag, transfer, receive_ahead=True))
        check_pair_schedule(ahead, prove=False)
        t1 = time.perf_counter()
        opt = exact(dag, time_limit_s=args.time_limit, solver="cpsat", upper_bound=heur)
        exact_s = time.perf_counter() - t1
        check_pair_schedule(opt, prove=False)
        lb = dag.lower_bound()
        rows.append(
            {
                "pair": dag.name,
                "tasks": len(dag.tasks),
                "heur": heur.makespan,
                "template": template,
                "best": min(opt.makespan, heur.makespan),
                "proven": opt.status == "optimal",
                "bound": opt.bound if opt.bound is not None else lb,
                "lb": lb,
                "heur_s": heur_s,
                "exact_s": exact_s,
                "heur_p2p": with_p2p.makespan,
                "heur_p2p_ahead": ahead.makespan,
                # CP-SAT was handed the heuristic's schedule; only a search it could not skip counts
                "searched": opt.makespan < heur.makespan - EPS or opt.status != "optimal" or heur.makespan > lb + EPS,
            }
        )
    proven = [r for r in rows if r["proven"]]
    gaps = [r["heur"] / r["best"] - 1 for r in rows]
    gaps_proven = [r["heur"] / r["best"] - 1 for r in proven]
    templ = [r["template"] / r["best"] - 1 for r in rows if r["template"] == r["template"]]
    sizes = [r["tasks"] for r in rows]
    print(f"  tasks per DAG: min {min(sizes)}, median {statistics.median(sizes):.0f}, max {max(sizes)}; "
          f"optimum proven on {len(proven)} / {len(rows)} (time limit {args.time_limit} deterministic s)")
    if gaps_proven:
        print(f"  gap-fit vs proven optimum:  mean {pct(statistics.mean(gaps_proven))}, worst {pct(max(gaps_proven))}, "
              f"above optimum on {sum(g > 1e-9 for g in gaps_proven)} / {len(gaps_proven)}")
    print(f"  gap-fit vs best exact (all): mean {pct(statistics.mean(gaps))}, worst {pct(max(gaps))}, "
          f"above it on {sum(g > 1e-9 for g in gaps)} / {len(gaps)}")
    if templ:
        print(f"  fixed-template vs best exact: mean {pct(statistics.mean(templ))}, worst {pct(max(templ))}")
    ratio_h = [r["heur"] / r["lb"] for r in rows]
    ratio_o = [r["best"] / r["lb"] for r in rows]
    print(f"  makespan / lower bound: gap-fit mean {statistics.mean(ratio_h):.4f} max {max(ratio_h):.4f}; "
          f"optimum's own mean {statistics.mean(ratio_o):.4f} max {max(ratio_o):.4f}")
    searched = [r for r in rows if r["searched"]]
    heur_total, exact_total = sum(r["heur_s"] for r in rows), sum(r["exact_s"] for r in searched)
    per_heur, per_exact = heur_total / len(rows), exact_total / max(1, len(searched))
    ratio = f"{per_exact / per_heur:.0f}x" if searched else "n/a (the heuristic met the bound on every DAG)"
    print(f"  time: gap-fit {1000 * per_heur:.1f} ms per DAG; CP-SAT {per_exact:.2f} s "
          f"per DAG it had to search ({len(searched)}); speed ratio CP-SAT / gap-fit {ratio}")
    p2p = [r["heur_p2p"] / r["heur"] - 1 for r in rows]
    p2p_ahead = [r["heur_p2p_ahead"] / r["heur"] - 1 for r in rows]
    print(f"  pipeline send/recv inside the pair ({transfer:.1f} us each, one of each per side), gap-fit makespan: "
          f"receive before the side +{pct(statistics.mean(p2p))} mean, +{pct(max(p2p))} max; "
          f"next pair's receive ahead +{pct(statistics.mean(p2p_ahead))} mean, +{pct(max(p2p_ahead))} max", flush=True)
    for r in rows:
        r.update(workload=label, ep=ep, seq_len=seq_len, p2p_us=transfer)
    summary = {
        "workload": label, "ep": ep, "seq_len": seq_len, "pp": parallel.pp, "vpp": parallel.vpp, "tp": parallel.tp,
        "distinct_dags": len(dags), "sampled": len(rows), "tasks_min": min(sizes), "tasks_max": max(sizes),
        "proven": len(proven), "time_limit_s": args.time_limit,
        "gap_mean": statistics.mean(gaps), "gap_worst": max(gaps), "above_best": sum(g > 1e-9 for g in gaps),
        "gap_proven_mean": statistics.mean(gaps_proven) if gaps_proven else float("nan"),
        "gap_proven_worst": max(gaps_proven) if gaps_proven else float("nan"),
        "template_gap_mean": statistics.mean(templ) if templ else float("nan"),
        "ratio_lb_heur_mean": statistics.mean(ratio_h), "ratio_lb_heur_max": max(ratio_h),
        "ratio_lb_opt_mean": statistics.mean(ratio_o), "ratio_lb_opt_max": max(ratio_o),
        "heur_ms_per_dag": 1000 * per_heur, "cpsat_s_per_searched_dag": per_exact, "searched": len(searched),
        "speed_ratio": per_exact / per_heur if searched else float("nan"),
        "p2p_us": transfer, "p2p_makespan_change_mean": statistics.mean(p2p), "p2p_makespan_change_max": max(p2p),
        "p2p_ahead_change_mean": statistics.mean(p2p_ahead), "p2p_ahead_change_max": max(p2p_ahead),
    }
    return {"summary": summary, "rows": rows}


def write_csv(path: Path, rows: list[dict[str, Any]], exact: bool = False) -> None:
    """Rows as CSV; floats to 6 significant digits, or with ``exact`` as Python spells them
    (round-trip exact: the per-pair makespans, whose gaps are read at 1e-9)."""
    if not rows:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ((repr(v) if exact else f"{v:.6g}") if isinstance(v, float) else v) for k, v in row.items()})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="hf:qwen3_next")
    p.add_argument("--workloads", nargs="+", default=None,
                   help="shipped reference workloads (names of frontend/workloads) or 'all'; replaces --source")
    p.add_argument("--ep", type=int, nargs="+", default=[8, 32])
    p.add_argument("--seq-len", type=int, nargs="+", default=[4096])
    p.add_argument("--pp", type=int, default=None, help="default: the source's own (8 for hf:qwen3_next)")
    p.add_argument("--vpp", type=int, default=None, help="default: the source's own (2 for hf:qwen3_next)")
    p.add_argument("--sample", type=int, default=20, help="distinct pair DAGs per setting")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT deterministic seconds per pair")
    p.add_argument("--bottleneck", action="store_true",
                   help="only the pairs that set each device's worst cost under the planned partition")
    p.add_argument("--csv", type=Path, default=None,
                   help="write one row per setting here and one per sampled pair to <stem>_pairs.csv")
    args = p.parse_args(argv)
    if args.workloads:
        known = sorted(workload_configs())
        names = known if args.workloads == ["all"] else args.workloads
        unknown = [w for w in names if w not in known]
        if unknown:
            print(f"error: unknown workload(s) {', '.join(unknown)}; use 'all' or any of {', '.join(known)}",
                  file=sys.stderr)
            return 1
        sources = [(w, str(WORKLOADS_DIR / f"{w}.json")) for w in names]
    else:
        if args.source == "hf:qwen3_next":
            args.pp, args.vpp = args.pp or 8, args.vpp or 2
        sources = [(args.source, args.source)]
    summaries, pairs = [], []
    for label, source in sources:
        for ep in args.ep:
            for seq_len in args.seq_len:
                got = one_setting(args, label, source, ep, seq_len)
                if got is not None:
                    summaries.append(got["summary"])
                    pairs.extend(got["rows"])
    if args.csv is not None:
        write_csv(args.csv, summaries)
        write_csv(args.csv.with_name(f"{args.csv.stem}_pairs.csv"), pairs, exact=True)
        print(f"\nwrote {args.csv} and {args.csv.with_name(args.csv.stem + '_pairs.csv')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
