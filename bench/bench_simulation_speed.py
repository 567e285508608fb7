"""How fast the whole-iteration simulator runs, against its marks.

Marks: one iteration of the trillion-scale synthetic workload at PP16 VPP2, 64 micro-batches,
EP32 in under 2 s on this 2-core machine; 100 iterations with the DBO (for its statistics) in
under a minute. The module is captured from ``frontend/workloads/qwen3_next_1t_synthetic.json``
and the simulator built on the serially balanced partition with gap-fit pair schedules (the
simulation's speed does not depend on which partition it runs; planning is not timed here).

Printed per configuration (static plan, with the DBO): the one-off build time (scheduling and
re-timing every distinct program), the time of one iteration (median of ``--repeats``) beside
the same iteration with every action's tasks run by the Python reference loop
(``engine.simulate(..., python_loop=True)``, which the C++ action loop follows bitwise; the bench checks the
two iterations' figures are equal), and the time of ``--iterations`` iterations including the
routing draws, with the ratio to the mark.

Run: ``.venv/bin/python bench/bench_simulation_speed.py`` (``--pp/--vpp/--ep/--microbatches``
change the setting).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from passes.plan_view import PlanView  # noqa: E402
from passes.simulation.build import BuildOptions, SimulationBuilder, balanced_ranges  # noqa: E402
from passes.simulation.capacity import run_iterations  # noqa: E402
from passes.simulation.engine import simulate  # noqa: E402
from passes.simulation.routing import RoutingSpec  # noqa: E402

MARK_ONE_S = 2.0
MARK_MANY_S = 60.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", default="qwen3_next_1t_synthetic")
    p.add_argument("--pp", type=int, default=16)
    p.add_argument("--vpp", type=int, default=2)
    p.add_argument("--ep", type=int, default=32)
    p.add_argument("--microbatches", type=int, default=64)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "simulation_speed.json"))
    args = p.parse_args(argv)
    import frontend

    t = time.perf_counter()
    module = frontend.capture(
        str(ROOT / "frontend" / "workloads" / f"{args.workload}.json"),
        overrides={"pp": args.pp, "vpp": args.vpp, "ep": args.ep, "microbatches": args.microbatches},
    )
    capture_s = time.perf_counter() - t
    rows = []
    print(f"{args.workload} PP{args.pp} VPP{args.vpp} EP{args.ep} m{args.microbatches} (captured in {capture_s:.1f} s)")
    print(f"{'config':12} {'build s':>8} {'tasks':>8} {'1 iteration s':>14} {'vs 2 s':>7} {'Python loop s':>14} {'ratio':>6} "
          f"{f'{args.iterations} iterations s':>17} {'vs 60 s':>8} {'cpu s':>7}")
    for label, dbo in (("static", False), ("with DBO", True)):
        t = time.perf_counter()
        builder = SimulationBuilder(PlanView(module), BuildOptions(method="gap-fit", dbo=dbo))
        inp = builder.build(balanced_ranges(builder.view))
        settings = builder.dbo_settings(inp) if dbo else None
        build_s = time.perf_counter() - t
        routing = builder.routing(RoutingSpec("zipf"))
        imbalance = routing.imbalance(0)
        one: list[float] = []
        reference: list[float] = []
        for _ in range(args.repeats):  # alternating, so drifts in the machine's speed hit both
            for python_loop, times in ((False, one), (True, reference)):
                t = time.perf_counter()
                result = simulate(inp, imbalance, dbo=settings, python_loop=python_loop)
                times.append(time.perf_counter() - t)
                if not python_loop:
                    native_us = result.iteration_us
                elif result.iteration_us != native_us:
                    raise SystemExit(f"{label}: the C++ action loop gives {native_us} µs, the Python loop {result.iteration_us}")
        t, cpu = time.perf_counter(), time.process_time()
        run_iterations(inp, routing, args.iterations, settings)
        many, many_cpu = time.perf_counter() - t, time.process_time() - cpu
        tasks = sum(len(a.program.tasks) for actions in inp.ranks for a in actions)
        one_s, reference_s = statistics.median(one), statistics.median(reference)
        print(f"{label:12} {build_s:8.2f} {tasks:8d} {one_s:14.3f} {one_s / MARK_ONE_S:6.2f}x {reference_s:14.3f} {one_s / reference_s:6.3f} "
              f"{many:17.1f} {many / MARK_MANY_S:7.2f}x {many_cpu:7.1f}")
        rows.append({"config": label, "build_s": round(build_s, 3), "tasks_per_iteration": tasks,
                     "one_iteration_s": round(one_s, 4), "one_iteration_python_loop_s": round(reference_s, 4),
                     "iterations": args.iterations, "iterations_s": round(many, 2), "iterations_cpu_s": round(many_cpu, 2)})
    # The machine may be shared: wall time above CPU time means the run waited for a core.
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": args.workload, "pp": args.pp, "vpp": args.vpp, "ep": args.ep,
                               "microbatches": args.microbatches, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
