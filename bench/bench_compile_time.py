"""Compile time with and without the schedule cache, side by side in one run.

Three compiles of the same model and setting (``tessera-compile ... --timing --no-capacity``,
each a fresh process):

- ``baseline``: every schedule computed and z3-proven, no cache (``overlap-schedule{verify=true,
  cache=false}``: what every compile did before the cache);
- ``cold``: the default pipeline with an empty cache folder (schedules computed, each distinct
  DAG proven once, then cached);
- ``warm``: the same command again (every schedule from the cache).

Printed per run: wall time of the whole command, capture, the passes, overlap-schedule and
profile (from ``--timing``); the ratios to the baseline; and whether the three IR files are
byte-identical (they must be). Marks (issue 11): Qwen3-Next-80B (``make demo``'s compile) under
10 s cold and 3 s warm; the trillion-scale synthetic model at its suggested setting
(``frontend/workloads/parallel.json``: TP2 PP16 VPP2 EP64, 256 micro-batches) through partition
under 30 s cold.

    .venv/bin/python bench/bench_compile_time.py                       # make demo's compile
    .venv/bin/python bench/bench_compile_time.py --source frontend/workloads/qwen3_next_1t_synthetic.json \\
        --tp 2 --pp 16 --vpp 2 --ep 64 --microbatches 256 --through partition
"""

from __future__ import annotations

import argparse
import filecmp
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMPILE = ROOT / ".venv" / "bin" / "tessera-compile"
PIPELINE = ["candidates", "overlap-schedule", "profile", "partition", "dbo-slots"]
LINE = re.compile(r"^\s*([0-9.]+) s\s+(?:\(\s*[0-9.]+%\))?\s*(.+?)\s*$")


def pipeline(through: str, baseline: bool) -> str:
    names = PIPELINE[: PIPELINE.index(through) + 1]
    return ",".join("overlap-schedule{verify=true,cache=false}" if baseline and n == "overlap-schedule" else n for n in names)


def run(label: str, args: argparse.Namespace, cache: Path, out: Path, baseline: bool) -> dict[str, float]:
    cmd = [str(COMPILE), args.source, "--emit", "ir", "-o", str(out), "--timing", "--no-capacity"]
    cmd += ["--passes", pipeline(args.through, baseline)]
    for flag in ("pp", "vpp", "ep", "tp", "seq_len", "microbatches"):
        value = getattr(args, flag)
        if value is not None:
            cmd += [f"--{flag.replace('_', '-')}", str(value)]
    env = {**os.environ, "TESSERA_CACHE_DIR": str(cache)}
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        sys.exit(f"{label}: tessera-compile failed:\n{done.stderr}")
    times: dict[str, float] = {"wall": wall}
    for line in (done.stdout + done.stderr).splitlines():
        m = LINE.match(line)
        if m:
            times.setdefault(m.group(2), float(m.group(1)))
    times["passes"] = sum(v for k, v in times.items() if k.startswith("pass "))
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="hf:qwen3_next")
    p.add_argument("--through", default="dbo-slots", choices=PIPELINE, help="last pass of the pipeline")
    for flag in ("--pp", "--vpp", "--ep", "--tp", "--seq-len", "--microbatches"):
        p.add_argument(flag, type=int, default=None)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tessera-bench-cache-") as tmp:
        folder = Path(tmp)
        results = {}
        outs = {}
        for label, baseline in (("baseline", True), ("cold", False), ("warm", False)):
            outs[label] = folder / f"{label}.tir"
            cache = folder / ("baseline-cache" if baseline else "cache")
            results[label] = run(label, args, cache, outs[label], baseline)
        identical = all(filecmp.cmp(outs["baseline"], outs[k], shallow=False) for k in ("cold", "warm"))
    rows = ["wall", "capture", "passes", "pass overlap-schedule", "pass profile", "pass partition"]
    rows += [k for k in results["cold"] if k not in rows and not k.startswith(("pass ", "verify", "total"))]
    print(f"{args.source} through {args.through} ({' '.join(a for a in (argv or sys.argv[1:]))})")
    print(f"{'seconds':24s}" + "".join(f"{k:>11s}" for k in results) + f"{'cold/base':>11s}{'warm/base':>11s}")
    for row in rows:
        base = results["baseline"].get(row, float("nan"))
        values = [results[k].get(row, float("nan")) for k in results]
        ratios = [v / base if base else float("nan") for v in values[1:]]
        print(f"{row:24s}" + "".join(f"{v:11.2f}" for v in values) + "".join(f"{r:11.3f}" for r in ratios))
    print(f"IR byte-identical across the three runs: {'yes' if identical else 'NO'}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
