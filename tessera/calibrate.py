"""``tessera-calibrate``: measure this machine's CPU once and cache it as the ``cpu`` hardware.

Planning with ``--hardware cpu`` (and measured profiling on CPU) reads the cached
description; loading it never measures. Run this once per machine and software version
(the cache key includes the CPU model, thread counts and torch version), or let
``tessera-compile --hardware cpu`` run it on first use.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from tessera.driver import Run, run_tool, tool_parser


def _parser() -> argparse.ArgumentParser:
    p = tool_parser(
        "tessera-calibrate", "Measure the local CPU with micro-benchmarks and cache it as the 'cpu' hardware description."
    )
    p.add_argument("--refresh", action="store_true", help="measure again even when a calibration is cached")
    p.add_argument("--quick", action="store_true", help="fewer, smaller micro-benchmarks (a smoke run)")
    p.add_argument("--statistic", choices=["median", "min"], default="median",
                   help="reading of each micro-benchmark's repeats (match profile{statistic=...})")
    p.add_argument("--cache-dir", metavar="DIR", help="cache folder (default: $TESSERA_CACHE_DIR or ~/.cache/tessera)")
    return p


def _calibrate(args: argparse.Namespace, run: Run) -> int:
    from passes.costs.calibrate_cpu import cpu_hardware
    from passes.costs.calibration_cache import calibration_path

    path = calibration_path(args.cache_dir, statistic=args.statistic)
    measured = []

    def announce(where: Path) -> None:
        measured.append(where)
        run.note(f"measuring the local CPU (a minute or two) into {where}")

    hw = cpu_hardware(args.cache_dir, refresh=args.refresh, quick=args.quick, statistic=args.statistic, announce=announce)
    state = "calibrated" if measured else "already calibrated (--refresh measures again)"
    print(f"{state}: {path}")
    packing = hw.gemm_packing_gbps.get("fp32")
    print(
        f"  {hw.description}\n  fp32 {hw.peak_tflops['fp32'] * 1e3:.0f} GFLOP/s"
        + (f" (operands packed at {packing:.1f} GB/s)" if packing else "")
        + f", memory {hw.hbm_gbps:.1f} GB/s, "
        f"All-to-All {hw.a2a_gbps(hw.gpus_per_node):.2f} GB/s + {hw.a2a_latency_us:.0f} us, task overhead {hw.kernel_launch_us:.0f} us"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_tool("tessera-calibrate", _parser(), _calibrate, argv)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
