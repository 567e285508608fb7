"""Would a comm reference help? Whether one lone All-to-All reading predicts the next one on this CPU.

The cost-model bench normalises every pair by a compute reference kernel read around it (a GEMM
and a copy), which follows the share of the processors the ranks get. Its remaining error sits
in the All-to-All: on this machine a small gloo All-to-All's latency varies by 2x and more from
one reading to the next. A second, comm reference (a lone All-to-All timed beside each pair,
scaling the pair's transfers) helps only if the All-to-All's latency drifts slowly enough that a
reading taken right before another predicts it.

Each round reads, back to back on the same processes: the compute reference (as the
normalisation reads it), a lone All-to-All of ``--small`` bytes, one of ``--large`` bytes, and the
large one beside a GEMM on the compute thread (its duration inside a pair-like run) -- each the
``--statistic`` of ``--repeats`` repeats, the slowest rank's. Printed: each series' spread, the
correlation of the series within a round (and of their changes from one round to the next), and
the test itself, side by side: predicting each large reading (alone and beside the GEMM) from the
small reading of the same round, scaled by the ratio of their medians, against predicting it by
the large series' median alone (what no comm reference does). A comm reference pays only where
the first error is clearly below the second.

    .venv/bin/python bench/bench_comm_drift.py
    .venv/bin/python bench/bench_comm_drift.py --rounds 80 --small 8192 --large 1048576 --statistic median
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import numpy as np  # noqa: E402

from passes.costs.calibrate_cpu import REFERENCE, reference_tasks, slowest_rank_time  # noqa: E402
from runtime.pair_executor import ExecTask, PairExecutor  # noqa: E402

SERIES = ("reference", "a2a small", "a2a large", "large beside GEMM")


def a2a(name: str, nbytes: int) -> ExecTask:
    return ExecTask(name, "all_to_all", "comm", 0, bytes=nbytes)


def gemm(name: str, n: int) -> ExecTask:
    return ExecTask(name, "gemm", "compute", 0, shapes=((n, n), (n, n)), flops=2 * n**3)


def read_rounds(args: argparse.Namespace) -> np.ndarray:
    """``rounds x 4`` readings in µs, in the order of ``SERIES``."""
    pick = min if args.statistic == "min" else statistics.median
    reference = reference_tasks(REFERENCE)
    rows = []
    with PairExecutor(world_size=args.world) as ex:
        ex.measure(reference, repeats=3, warmup=1)  # warm the processes and buffers
        for _ in range(args.rounds):
            ref = pick(ex.measure(reference, repeats=args.repeats, warmup=1).samples_us)
            small = slowest_rank_time(ex.measure([a2a("a", args.small)], repeats=args.repeats, warmup=1), "a", args.statistic)
            large = slowest_rank_time(ex.measure([a2a("a", args.large)], repeats=args.repeats, warmup=1), "a", args.statistic)
            pair = ex.measure([gemm("g", args.gemm_n), a2a("a", args.large)], repeats=args.repeats, warmup=1)
            rows.append((ref, small, large, slowest_rank_time(pair, "a", args.statistic)))
    return np.array(rows)


def mean_abs_rel(predicted: np.ndarray, actual: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - actual) / actual))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--repeats", type=int, default=7, help="repeats per reading")
    p.add_argument("--statistic", choices=["min", "median"], default="min", help="of each reading's repeats")
    p.add_argument("--small", type=int, default=32 << 10, help="bytes of the small (latency-bound) All-to-All")
    p.add_argument("--large", type=int, default=128 << 10, help="bytes of the large one")
    p.add_argument("--gemm-n", type=int, default=256, help="side of the GEMM beside the large All-to-All")
    p.add_argument("--world", type=int, default=2, help="gloo processes")
    args = p.parse_args(argv)
    if args.rounds < 4 or args.repeats < 1:
        p.error("--rounds must be at least 4 and --repeats at least 1")
    t0 = time.perf_counter()
    data = read_rounds(args)
    seconds = time.perf_counter() - t0
    print(
        f"{args.rounds} rounds in {seconds:.0f} s, each reading the {args.statistic} of {args.repeats} repeats "
        f"(slowest rank), {args.world} gloo processes; All-to-Alls of {args.small} and {args.large} bytes"
    )
    print(f"\n{'µs':20s}{'min':>9s}{'median':>9s}{'max':>9s}{'max/min':>9s}")
    for name, col in zip(SERIES, data.T):
        print(f"{name:20s}{col.min():9.0f}{np.median(col):9.0f}{col.max():9.0f}{col.max() / col.min():9.2f}")
    for title, values in (("within a round", data), ("of the changes from one round to the next", np.diff(data, axis=0))):
        corr = np.corrcoef(values.T)
        print(f"\ncorrelation {title}")
        print(f"{'':20s}" + "".join(f"{name[:12]:>13s}" for name in SERIES))
        for name, row in zip(SERIES, corr):
            print(f"{name:20s}" + "".join(f"{v:13.2f}" for v in row))
    small = data[:, 1]
    print("\npredicting each large reading; mean absolute error relative to the reading")
    print(f"{'target':20s}{'comm reference':>16s}{'median alone':>14s}{'ratio':>8s}")
    for k in (2, 3):
        target = data[:, k]
        with_ref = small * (np.median(target) / np.median(small))
        alone = np.full_like(target, np.median(target))
        a, b = mean_abs_rel(with_ref, target), mean_abs_rel(alone, target)
        print(f"{SERIES[k]:20s}{100 * a:15.1f}%{100 * b:13.1f}%{a / b:8.2f}")
    print("(ratio < 1: a lone All-to-All read just before predicts the next one better than its typical time does)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
