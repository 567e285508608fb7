"""How far exact refinement of the bottleneck pairs moves the plan's bottleneck.

For each setting (a workload at one EP and sequence length) the plan is made as the default
pipeline makes it (``candidates, overlap-schedule, profile, partition``: gap-fit schedules,
analytic post-overlap costs), then ``refine-bottleneck`` re-schedules with CP-SAT the pairs that
set each device's worst cost (``--time-limit`` deterministic seconds each, ``--near``) and
re-partitions if a cost changed. Printed per setting: the bottleneck before and after (µs and
relative move), the schedules refined, how many CP-SAT proved optimal, how many it shortened,
how far above CP-SAT's proven lower bound the kept schedules are at worst (over all refined
schedules, and over those not proven optimal: a certified bound on their gap to the optimum),
and the time refinement took beside the time planning took. A move of 0 means gap-fit's
schedules of the bottleneck pairs were already optimal (where proven) or not beaten.

    .venv/bin/python bench/bench_refine_bottleneck.py                       # Qwen3-Next, EP8 and EP32, seq 4K
    .venv/bin/python bench/bench_refine_bottleneck.py --workloads all --time-limit 5 --csv bench/results/refine_bottleneck.csv
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from frontend.sources import WORKLOADS_DIR, workload_configs  # noqa: E402
from tessera.api import capture, run_passes  # noqa: E402
from tessera_ir.errors import TesseraError  # noqa: E402


def one_setting(
    args: argparse.Namespace, label: str, source: str, ep: int | None, seq_len: int | None
) -> dict[str, object] | None:
    try:
        module = capture(source, ep=ep, seq_len=seq_len, pp=args.pp, vpp=args.vpp)
        module.attrs["hardware"] = "h100"
        t0 = time.perf_counter()
        run_passes(module, "candidates,overlap-schedule{cache=false},profile,partition", verify=False)
        plan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        run_passes(module, f"refine-bottleneck{{time-limit={args.time_limit} near={args.near}}}", verify=True)
        refine_s = time.perf_counter() - t0
    except TesseraError as exc:
        print(f"{label} EP{ep} seq {seq_len}: skipped ({exc})")
        return None
    part = module.plan_ops("partition")[0].attrs
    refined = [op.attrs for op in module.plan_ops("pair_schedule") if "refined" in op.attrs]
    changed = sum(1 for a in refined if a.get("method") == "exact")
    # What CP-SAT's proof certifies about each schedule the plan keeps for a bottleneck pair:
    # its makespan over the proven lower bound (0 up to the rounding of durations where proven
    # optimal; otherwise the most it can be above the optimum).
    gaps = [(float(a["makespan"]) / float(a["proven_bound"]) - 1.0, a["refined"] == "optimal")  # type: ignore[arg-type]
            for a in refined if float(a.get("proven_bound", 0.0)) > 0]  # type: ignore[arg-type]
    worst_gap = max((g for g, _ in gaps), default=0.0)
    worst_unproven = max((g for g, proven in gaps if not proven), default=0.0)
    before, after = float(part["refined_from_us"]), float(part["bottleneck_us"])  # type: ignore[arg-type]
    moved = 1 - after / before
    row: dict[str, object] = {
        "workload": label, "ep": module.attrs.get("ep"), "seq_len": module.attrs.get("seq_len"),
        "bottleneck_before_us": before, "bottleneck_after_us": after, "moved": moved,
        "refined": part["refined_pairs"], "proven": part["refined_proven"], "shortened": changed,
        "rounds": part["refined_rounds"], "worst_certified_gap": worst_gap, "worst_unproven_gap": worst_unproven,
        "plan_s": plan_s, "refine_s": refine_s,
    }
    print(f"{label} EP{row['ep']} seq {row['seq_len']}: bottleneck {before:.1f} -> {after:.1f} us "
          f"({100 * moved:.3f}% lower); {row['refined']} schedules refined, {row['proven']} proven optimal, "
          f"{changed} shortened, {row['rounds']} round(s); kept schedules at most {100 * worst_gap:.4f}% above "
          f"CP-SAT's proven bound ({100 * worst_unproven:.4f}% on the unproven); planning {plan_s:.0f} s, "
          f"refinement {refine_s:.0f} s", flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="hf:qwen3_next")
    p.add_argument("--workloads", nargs="+", default=None, help="shipped reference workloads or 'all' (their own settings)")
    p.add_argument("--ep", type=int, nargs="+", default=None, help="default: 8 and 32 for --source, each workload's own")
    p.add_argument("--seq-len", type=int, nargs="+", default=None, help="default: 4096 for --source, each workload's own")
    p.add_argument("--pp", type=int, default=None)
    p.add_argument("--vpp", type=int, default=None)
    p.add_argument("--time-limit", type=float, default=5.0, help="CP-SAT deterministic seconds per refined pair")
    p.add_argument("--near", type=float, default=0.0, help="also refine pairs within this fraction of a device's worst")
    p.add_argument("--csv", type=Path, default=None)
    args = p.parse_args(argv)
    if args.workloads:
        known = sorted(workload_configs())
        names = known if args.workloads == ["all"] else args.workloads
        unknown = [w for w in names if w not in known]
        if unknown:
            print(f"error: unknown workload(s) {', '.join(unknown)}; use 'all' or any of {', '.join(known)}", file=sys.stderr)
            return 1
        sources = [(w, str(WORKLOADS_DIR / f"{w}.json")) for w in names]
        eps, seqs = args.ep or [None], args.seq_len or [None]
    else:
        sources = [(args.source, args.source)]
        eps, seqs = args.ep or [8, 32], args.seq_len or [4096]
        if args.source == "hf:qwen3_next":
            args.pp, args.vpp = args.pp or 8, args.vpp or 2
    rows = [r for label, source in sources for ep in eps for seq in seqs
            if (r := one_setting(args, label, source, ep, seq)) is not None]
    if args.csv is not None and rows:
        args.csv.parent.mkdir(parents=True, exist_ok=True)
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            for row in rows:
                writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        print(f"wrote {args.csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
