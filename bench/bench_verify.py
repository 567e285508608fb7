"""The verifier on a fully planned module: each check timed, and a run as it was vs as it is.

A compile's verifier runs after every pass; after ``pipeline`` it checks the per-rank programs
with five checks that each need them parsed from the plan. Before, each check read them again;
now one verifier run reads them once and its checks share them
(``tessera_ir.verifier.shared_in_run``). In one run, interleaved, best of ``--repeats``:

- ``before``: every check run on its own (no shared run: the programs read per check);
- ``after``: ``verify(module)``;

and each check's own time within the ``after`` run's order. The module: ``--ir PATH`` (a planned
``.tir``), else the model compiled through the default pipeline in this process.

    .venv/bin/python bench/bench_verify.py                                  # make demo's model
    .venv/bin/python bench/bench_verify.py --ir out/qwen3_next.tir
    .venv/bin/python bench/bench_verify.py --source frontend/workloads/qwen3_next_1t_synthetic.json --hardware h200
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tessera.api import DEFAULT_PIPELINE, capture, run_passes  # noqa: E402
from tessera_ir import verifier  # noqa: E402
from tessera_ir.model import Module  # noqa: E402
from tessera_ir.parser import parse_module  # noqa: E402


def planned(args: argparse.Namespace) -> Module:
    if args.ir:
        gc.disable()
        try:
            return parse_module(Path(args.ir).read_text(), source=args.ir)
        finally:
            gc.enable()
    module = capture(args.source, **{k: getattr(args, k) for k in ("pp", "vpp", "ep", "tp", "seq_len", "microbatches")})
    module.attrs["hardware"] = args.hardware
    run_passes(module, DEFAULT_PIPELINE.replace("overlap-schedule", "overlap-schedule{cache=false}"), verify=False)
    return module


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ir", help="a planned .tir (default: compile --source)")
    p.add_argument("--source", default="hf:qwen3_next")
    for flag in ("--pp", "--vpp", "--ep", "--tp", "--seq-len", "--microbatches"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--hardware", default="h100")
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    module = planned(args)
    gc.freeze()  # the module is live throughout: keep the collector's passes out of the timings
    before = after = float("inf")
    per_check: dict[str, float] = {}
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        for c in verifier.CHECKS.values():
            for error in c.run(module):
                raise error
        before = min(before, time.perf_counter() - t0)
        t0 = time.perf_counter()
        verifier.verify(module)
        after = min(after, time.perf_counter() - t0)
        with verifier._one_run():
            for name, c in verifier.CHECKS.items():
                t1 = time.perf_counter()
                list(c.run(module))
                per_check[name] = min(per_check.get(name, float("inf")), time.perf_counter() - t1)
    programs = len(module.plan_ops("program"))
    print(f"{module.name}: {len(module.plan)} plan ops, {programs} programs; best of {args.repeats}")
    print(f"verify, each check reading what it needs (before): {before:7.3f} s")
    print(f"verify, one run sharing the programs (after):     {after:7.3f} s   after/before {after / before:.3f}")
    print("the slowest checks within one run:")
    for name, seconds in sorted(per_check.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {seconds:7.3f} s  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
