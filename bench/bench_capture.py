"""Capture + IR print time for the big reference models, on this machine's CPUs.

    .venv/bin/python bench/bench_capture.py [--repeat N]

For each source: the time to build the model on the meta device, to trace
and cost it (capture), and to print the IR; then the same trace with layer
traces reused (the default) against tracing every decoder layer afresh, as a
side-by-side ratio. The first capture in a process also pays one-time imports
(transformers' model modules, torch's meta kernels), reported separately as
"cold".
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["hf:qwen3_next", "hf:deepseek_v3", str(ROOT / "frontend" / "workloads" / "qwen3_235b_a22b.json")]


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="warm repetitions per source (best is reported)")
    args = parser.parse_args()

    (_, import_s) = _timed(lambda: __import__("frontend"))
    from frontend import capture
    from frontend.sources import load_source
    from frontend.trace import capture_stack
    from tessera_ir import print_module

    print(f"import frontend: {import_s:.2f} s")
    header = f"{'source':<28} {'layers':>6} {'cold':>7} {'build':>7} {'capture':>8} {'print':>7} {'total':>7} " \
             f"{'traces':>7} {'no-reuse':>9} {'reuse':>7} {'ratio':>6}"
    print(header)
    for source in SOURCES:
        label = Path(source).stem if source.endswith(".json") else source
        module, cold = _timed(lambda s=source: capture(s))
        best_capture = best_print = best_build = float("inf")
        for _ in range(args.repeat):
            _, build_s = _timed(lambda s=source: load_source(s))
            module, capture_s = _timed(lambda s=source: capture(s))
            _, print_s = _timed(lambda m=module: print_module(m))
            best_build, best_capture, best_print = min(best_build, build_s), min(best_capture, capture_s), \
                min(best_print, print_s)
        loaded = load_source(source)
        seq = int(module.attrs["seq_len"])
        fresh, fresh_s = _timed(lambda m=loaded, n=seq: capture_stack(m.model, 1, n, m.config, reuse=False))
        reused, reuse_s = _timed(lambda m=loaded, n=seq: capture_stack(m.model, 1, n, m.config, reuse=True))
        layers = len(module.decoder_layers())
        print(f"{label:<28} {layers:>6} {cold:>6.2f}s {best_build:>6.2f}s {best_capture:>7.2f}s {best_print:>6.3f}s "
              f"{best_capture + best_print:>6.2f}s {reused.level2_traces:>3}/{layers:<3} {fresh_s:>8.2f}s "
              f"{reuse_s:>6.2f}s {fresh_s / reuse_s:>5.1f}x")
    print("capture includes building the model on meta; target: capture + print under 10 s per model")


if __name__ == "__main__":
    main()
