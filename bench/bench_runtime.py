"""Runtime speed on real plans: advance() per action (C++ natively, C++ through Python, the Python
reference), plan load time (C++ vs the Python reference loader) and bytecode size per rank.

The plans are compiled by the real pipeline: each workload is captured at its parallel settings
and planned with tessera-compile's default passes (candidates, overlap-schedule, profile,
partition, dbo-slots, pipeline; the verifier's program checks run unless --no-verify), then
written as bytecode by codegen. ``--plan-dir`` keeps the compiled plans, so later runs time the runtime only.

    python bench/bench_runtime.py                        # qwen3_235b_a22b PP8 VPP4, 1T synthetic PP16 VPP2
    python bench/bench_runtime.py --workload qwen3_235b_a22b --pp 4 --vpp 2 --microbatches 32
    python bench/bench_runtime.py --plan-dir /tmp/plans  # compile once, time many times

Per workload and rank: instructions, program bytes, load time; per workload: advance()+complete()
per action, each the best of --repeats runs through a whole program (rank 0 and the last rank),
in thread CPU time (what the work costs, which a busy machine does not inflate) and in
wall-clock time (what it took here, load included); the Python figures also as the median
run. Marks (issue 13): <= 200 ns natively, <= 2 us through Python. DBO runs with the plan's
memory budget; --budget-gib gives the pool a budget of its own (every weight gradient pooled
and run at its deadline, the FSM's most expensive path).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runtime  # noqa: E402
from runtime import reference  # noqa: E402
from runtime.bytecode import INSTRUCTION, PROGRAM_HEAD, read_header  # noqa: E402

WORKLOADS = ROOT / "frontend" / "workloads"
DEFAULTS = {
    "qwen3_235b_a22b": {"pp": 8, "vpp": 4, "ep": 32, "tp": 2, "microbatches": 64},
    "qwen3_next_1t_synthetic": {"pp": 16, "vpp": 2, "ep": 64, "tp": 2, "microbatches": 256},
}
MARK_NATIVE_NS = 200
MARK_PYTHON_NS = 2000


def compile_plan(name: str, settings: dict[str, int], verify: bool) -> tuple[bytes, dict[str, float], str]:
    """The workload's plan bytes from the real pipeline, how long each part took (s), and a note.

    A workload whose every partition exceeds the target's memory at these settings (the 1T
    synthetic at PP16 on h100) is partitioned without the memory limit, as bench_partition does,
    and the note says so: the runtime's speed does not depend on it.
    """
    from codegen.emit import plan_bytes
    from passes.manager import PassError
    from tessera.api import DEFAULT_PIPELINE, capture, run_passes
    from tessera_ir.verifier import verify as verify_module

    times: dict[str, float] = {}
    note = ""
    start = time.perf_counter()
    module = capture(str(WORKLOADS / f"{name}.json"), **settings)
    module.attrs["hardware"] = "h100"
    times["capture_s"] = time.perf_counter() - start
    if verify:
        verify_module(module)
    before, after = DEFAULT_PIPELINE.split("partition")
    managers = [run_passes(module, before.strip(","), verify=verify)]
    try:
        managers.append(run_passes(module, "partition", verify=verify))
    except PassError as err:
        if "no partition fits in device memory" not in str(err):
            raise
        note = "no partition fits h100 memory at these settings; partitioned without the memory limit"
        module.attrs["memory_gib"] = 1e6  # a run-wide setting, in the header
        managers.append(run_passes(module, "partition", verify=verify))
    managers.append(run_passes(module, after.strip(","), verify=verify))
    for manager in managers:
        for t in manager.timings:
            times[f"{t.name}_s"] = t.seconds
    start = time.perf_counter()
    data = plan_bytes(module)
    times["codegen_s"] = time.perf_counter() - start
    return data, times, note


def best_of(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def python_ns_per_action(make_fsm: Any, repeats: int) -> dict[str, float]:
    """advance()+complete() through Python per action: best and median run, CPU and wall-clock."""
    cpu, wall = [], []
    for _ in range(repeats):
        fsm = make_fsm()
        advance, complete = fsm.advance, fsm.complete
        n = 0
        w, c = time.perf_counter_ns(), time.thread_time_ns()
        while (a := advance()).kind != 5:
            complete(a.id)
            n += 1
        cpu.append((time.thread_time_ns() - c) / n)
        wall.append((time.perf_counter_ns() - w) / n)
    return {"cpu_min": min(cpu), "cpu_median": statistics.median(cpu), "wall_min": min(wall),
            "wall_median": statistics.median(wall)}


def program_bytes(program: Any) -> int:
    return PROGRAM_HEAD.size + INSTRUCTION.size * len(program)


def measure(name: str, settings: dict[str, int], data: bytes, compile_times: dict[str, float], args: argparse.Namespace,
            budget: int | None) -> dict[str, Any]:
    """Time one plan's loading and stepping; print and return its row."""
    pp = settings["pp"]
    programs = [runtime.load_plan(data, rank=r) for r in range(pp)]
    sizes = [program_bytes(p) for p in programs]
    lengths = [len(p) for p in programs]
    load_cpp = [best_of(lambda r=r: runtime.load_plan(data, rank=r), args.repeats) for r in range(pp)]
    load_py = best_of(lambda: reference.load_plan(data, rank=0), max(1, args.repeats // 3))
    first = programs[0]
    timed = sorted({0, pp - 1})
    native = [runtime._core.native_ns_per_action(programs[r], args.dbo, budget, args.repeats) for r in timed]
    through_python = [
        python_ns_per_action(lambda r=r: runtime.FSM(programs[r], dbo=args.dbo, memory_budget_bytes=budget), args.repeats)
        for r in timed
    ]
    ref_program = reference.load_plan(data, rank=0)
    ref = python_ns_per_action(lambda: reference.ReferenceFSM(ref_program, dbo=args.dbo, memory_budget_bytes=budget),
                               max(1, args.repeats // 3))
    counters_fsm = runtime.FSM(first, dbo=args.dbo, memory_budget_bytes=budget)
    while (a := counters_fsm.advance()).kind != 5:
        counters_fsm.complete(a.id)
    counters = counters_fsm.counters
    native_cpu = max(n[1] for n in native)
    python_cpu = max(t["cpu_min"] for t in through_python)
    row = {
        "workload": name, **{k: settings[k] for k in ("pp", "vpp", "ep", "microbatches")},
        "signature": read_header(data)[2].hex()[:16], "tasks": len(first.tasks), "slots": len(first.slots or []),
        "instructions_per_rank_min": min(lengths), "instructions_per_rank_max": max(lengths),
        "plan_bytes": len(data), "program_bytes_per_rank_min": min(sizes), "program_bytes_per_rank_max": max(sizes),
        "program_bytes_per_rank": sizes, "load_cpp_ms_per_rank": [round(t * 1e3, 3) for t in load_cpp],
        "load_cpp_ms_rank0": round(load_cpp[0] * 1e3, 3), "load_cpp_ms_max": round(max(load_cpp) * 1e3, 3),
        "load_python_ms_rank0": round(load_py * 1e3, 2), "load_speedup": round(load_py / load_cpp[0], 1),
        "advance_native_cpu_ns": round(native_cpu, 1), "advance_native_wall_ns": round(max(n[0] for n in native), 1),
        "advance_python_cpu_ns": round(python_cpu, 1),
        "advance_python_cpu_median_ns": round(max(t["cpu_median"] for t in through_python), 1),
        "advance_python_wall_ns": round(max(t["wall_min"] for t in through_python), 1),
        "advance_python_wall_median_ns": round(max(t["wall_median"] for t in through_python), 1),
        "advance_reference_cpu_ns": round(ref["cpu_min"], 1),
        "reference_over_cpp": round(ref["cpu_min"] / through_python[0]["cpu_min"], 1),
        "deferred": counters["deferred"], "offered": counters["offered"], "fallbacks": counters["fallbacks"],
        "native_mark_met": native_cpu <= MARK_NATIVE_NS, "python_mark_met": python_cpu <= MARK_PYTHON_NS,
        **{k: round(v, 2) for k, v in compile_times.items()},
    }
    print(f"{name} PP{row['pp']} VPP{row['vpp']} EP{row['ep']} m={row['microbatches']}: {row['tasks']} tasks, "
          f"{min(lengths)}-{max(lengths)} instructions per rank, {row['slots']} DBO slots"
          + (f" (compiled in {sum(compile_times.values()):.0f} s)" if compile_times else " (cached plan)"))
    print(f"  plan {len(data) / 1e6:.2f} MB; per-rank program {min(sizes) / 1e3:.0f}-{max(sizes) / 1e3:.0f} kB")
    print(f"  load: C++ {row['load_cpp_ms_rank0']} ms (rank 0; slowest rank {row['load_cpp_ms_max']} ms), "
          f"Python reference {row['load_python_ms_rank0']} ms ({row['load_speedup']}x)")
    print(f"  advance()+complete() per action, CPU time (wall-clock here): native {native_cpu:.0f} ns "
          f"({row['advance_native_wall_ns']:.0f}) mark {MARK_NATIVE_NS}: {'met' if row['native_mark_met'] else 'MISSED'}; "
          f"through Python {python_cpu:.0f} ns, median run {row['advance_python_cpu_median_ns']:.0f} "
          f"({row['advance_python_wall_ns']:.0f}, median {row['advance_python_wall_median_ns']:.0f}) mark "
          f"{MARK_PYTHON_NS}: {'met' if row['python_mark_met'] else 'MISSED'}; Python reference "
          f"{row['advance_reference_cpu_ns']:.0f} ns ({row['reference_over_cpp']}x)")
    print(f"  DBO on rank 0: {counters['offered']:.0f} weight gradients offered, {counters['deferred']:.0f} pooled, "
          f"{counters['fallbacks']:.0f} run at their deadline")
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--workload", choices=sorted(DEFAULTS), action="append", help="default: all")
    for flag in ("pp", "vpp", "ep", "microbatches"):
        ap.add_argument(f"--{flag}", type=int, help=f"override the workload's {flag}")
    ap.add_argument("--repeats", type=int, default=7, help="runs through a program per figure (the best is kept)")
    ap.add_argument("--no-dbo", dest="dbo", action="store_false", help="run the FSMs without DBO")
    ap.add_argument("--budget-gib", type=float, help="the DBO pool's memory budget (default: the plan's)")
    ap.add_argument("--no-verify", dest="verify", action="store_false", help="skip the verifier while compiling")
    ap.add_argument("--plan-dir", help="keep compiled plans here and reuse them")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime"))
    args = ap.parse_args(argv)
    budget = None if args.budget_gib is None else int(args.budget_gib * (1 << 30))
    rows = []
    for name in args.workload or sorted(DEFAULTS):
        settings = dict(DEFAULTS[name])
        settings.update({k: getattr(args, k) for k in ("pp", "vpp", "ep", "microbatches") if getattr(args, k)})
        tag = "-".join(f"{k}{settings[k]}" for k in ("pp", "vpp", "ep", "tp", "microbatches"))
        cached = Path(args.plan_dir) / f"{name}-{tag}.tsb" if args.plan_dir else None
        compile_times: dict[str, float] = {}
        note = ""
        if cached is not None and cached.exists():
            data = cached.read_bytes()
        else:
            data, compile_times, note = compile_plan(name, settings, args.verify)
            if note:
                print(f"{name}: {note}")
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(data)
        rows.append({**measure(name, settings, data, compile_times, args, budget), "note": note})
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as fh:
        fields = list(dict.fromkeys(k for row in rows for k in row))
        writer = csv.DictWriter(fh, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
