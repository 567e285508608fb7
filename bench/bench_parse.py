"""Parse speed of large IR modules: the grammar parser (lark LALR) against the line-layout
fast path that ``parse_module`` now tries first, side by side on the same text.

Modules are Qwen3-Next-shaped (three linear-attention layers per attention layer, all
MoE, 16 tasks per layer, each with pass attributes) with every layer's forward and
backward in a pair schedule, built by ``tests/ir/builders.py`` at the sizes asked for.
Each measurement runs in a fresh process that only reads the file and parses it, so
peak memory and the garbage collector's work belong to that parse alone. The line
parser is measured twice: as the library's ``parse_module`` runs it (the cyclic garbage
collector left on) and as the command-line tools run it (collector paused for the parse,
``tessera.driver.Run.parse_ir``). Speeds are given by wall-clock time and by the process's
CPU time, which other work on a shared machine moves less; speed-ups are by CPU time.

    .venv/bin/python bench/bench_parse.py                       # 2, 10 and 50 MB
    .venv/bin/python bench/bench_parse.py --mb 5 --mb 100 --grammar-max-mb 10

Target: at least 5 MB/s on a 50 MB module on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

# One parse in a fresh interpreter: prints seconds and the process's peak RSS in MiB (the
# text, the module and whatever the parse needed on the way) as JSON.
CHILD = """
import gc, json, resource, sys, time
from tessera_ir import parse_module
from tessera_ir.parser import parse_with_grammar
from tessera_ir.line_parser import parse_lines
text = open(sys.argv[1], encoding="utf-8").read()
parser, collector = sys.argv[2], sys.argv[3]
if collector == "off":
    gc.disable()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start, cpu_start = time.perf_counter(), time.process_time()
if parser == "lines":
    module = parse_lines(text)
    assert module is not None, "the printed module must take the fast path"
else:
    module = parse_with_grammar(text)
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tasks = sum(len(layer.tasks) for layer in module.layers)
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_mib": peak / 1024, "before_parse_mib": before / 1024, "tasks": tasks}))
"""

def layers_for(mb: float) -> int:
    """Decoder layers of the builder's module that print to about ``mb`` megabytes."""
    from ir.builders import qwen3_next_like

    from tessera_ir import print_module

    per_layer = len(print_module(qwen3_next_like(100))) / 100
    return max(1, round(mb * 1e6 / per_layer))


def write_module(mb: float, folder: Path) -> tuple[Path, int]:
    from ir.builders import qwen3_next_like

    from tessera_ir import print_module

    layers = layers_for(mb)
    path = folder / f"module_{mb:g}mb.tir"
    path.write_text(print_module(qwen3_next_like(layers)), encoding="utf-8")
    return path, layers


def measure(path: Path, parser: str, collector: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(path), parser, collector], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, action="append", help="module sizes in MB (repeatable; default 2, 10, 50)")
    ap.add_argument("--grammar-max-mb", type=float, default=50.0,
                    help="largest module the grammar parser also reads (it takes about 2 s per MB)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "parse"))
    args = ap.parse_args()
    sizes = args.mb or [2.0, 10.0, 50.0]

    rows = []
    print(f"{'':15} | {'grammar':^16} | {'line parser, collector on':^27} | {'collector paused':^16} |")
    print(f"{'MB':>6} {'tasks':>8} | {'wall s':>7} {'MB/s':>8} | {'wall s':>6} {'MB/s':>5} {'cpu s':>6} {'MB/s':>6} | "
          f"{'wall s':>6} {'cpu MB/s':>9} | {'speed-up':>8} {'peak MiB':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        for mb in sizes:
            path, layers = write_module(mb, Path(tmp))
            size_mb = path.stat().st_size / 1e6
            lines = measure(path, "lines", "on")
            paused = measure(path, "lines", "off")
            grammar = measure(path, "grammar", "on") if mb <= args.grammar_max_mb else None
            row = {
                "mb": round(size_mb, 2),
                "layers": layers,
                "tasks": lines["tasks"],
                "grammar_s": round(grammar["seconds"], 3) if grammar else None,
                "grammar_cpu_s": round(grammar["cpu_seconds"], 3) if grammar else None,
                "grammar_mb_per_s": round(size_mb / grammar["seconds"], 2) if grammar else None,
                "grammar_peak_mib": round(grammar["peak_mib"]) if grammar else None,
                "lines_s": round(lines["seconds"], 3),
                "lines_cpu_s": round(lines["cpu_seconds"], 3),
                "lines_mb_per_s": round(size_mb / lines["seconds"], 2),
                "lines_cpu_mb_per_s": round(size_mb / lines["cpu_seconds"], 2),
                "lines_peak_mib": round(lines["peak_mib"]),
                "paused_s": round(paused["seconds"], 3),
                "paused_cpu_s": round(paused["cpu_seconds"], 3),
                "paused_cpu_mb_per_s": round(size_mb / paused["cpu_seconds"], 2),
                "speed_up": round(grammar["cpu_seconds"] / lines["cpu_seconds"], 1) if grammar else None,
                "collector_share": round(1 - paused["cpu_seconds"] / lines["cpu_seconds"], 2),
            }
            rows.append(row)
            grammar_cols = f"{row['grammar_s']:>7.2f} {row['grammar_mb_per_s']:>8.2f}" if grammar else f"{'-':>7} {'-':>8}"
            speed_up = f"{row['speed_up']:>7.1f}x" if grammar else f"{'-':>8}"
            print(f"{row['mb']:>6.1f} {row['tasks']:>8} | {grammar_cols} | {row['lines_s']:>6.2f} "
                  f"{row['lines_mb_per_s']:>5.2f} {row['lines_cpu_s']:>6.2f} {row['lines_cpu_mb_per_s']:>6.2f} | "
                  f"{row['paused_s']:>6.2f} {row['paused_cpu_mb_per_s']:>9.2f} | {speed_up} {row['lines_peak_mib']:>8}",
                  flush=True)
    out = Path(args.out)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
