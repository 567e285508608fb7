"""Overlap-aware partition vs the serially balanced one, and the MILP's speed and size, side by side.

For every reference workload at its suggested parallel settings (plus Qwen3-Next-80B at PP4):

- ``balanced``: the serially balanced partition (per-layer serial cost, embedding on the first
  stage, LM head and loss on the last), costed with post-overlap pair costs;
- ``window``: the partition MILP over candidates within ±window layers of it (the published search);
- ``global``: the optimum over every contiguous partition (pruned against the window optimum;
  the exact DP for vpp ≤ 2, the MILP beyond — minutes for Qwen3-235B at VPP4);
- the bottleneck (worst steady-state meeting pair) of each and their ratios; the MILP's solve
  time and its size before and after profile-guided pruning; the exact DP as a cross-check
  where its state space is small (vpp ≤ 2).

Pair costs (``--costs``):

- ``standin`` (default, labelled STAND-IN in the output): a closed form written for this bench —
  ``max(C + s·min(C, M), M, P)`` with C the pair's compute total, M its All-to-All total, P the
  longer side's critical path, and ``s = comm_sms / (total_sms − comm_sms)`` the slowdown of
  compute while All-to-All kernels hold SMs (overlapped compute runs on fewer SMs).
- ``gapfit``: the overlap scheduler's gap-fit heuristic with its search turned down (one
  schedule per distinct pair signature; slow on the largest models).
- ``passes``: the real pipeline ``candidates → overlap-schedule → profile{mode=analytic}``
  when those passes are installed (window search only: the IR holds window pairs).

Modules come from ``frontend.capture`` on the workload configs (``--source frontend``) or, when
the frontend is missing, from ``tests/synthetic_ir.synthetic_module`` with FLOPs and bytes
computed from the configs (``--source synthetic``).

Run: ``.venv/bin/python bench/bench_partition.py`` (``--quick`` for the two MILP-speed cases only;
``--seq-len`` and ``--ep`` set those axes for every case).
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from passes.costs.durations import task_duration_us  # noqa: E402
from passes.costs.hardware import load_hardware  # noqa: E402
from passes.partitioning.dp import solve_dp  # noqa: E402
from passes.partitioning.megatron import megatron_layout  # noqa: E402
from passes.partitioning.memory import MemoryAssumptions, build_memory_spec  # noqa: E402
from passes.partitioning.problem import PartitionProblem  # noqa: E402
from passes.partitioning.pruning import prune  # noqa: E402
from passes.partitioning.ranges import PartitionError, window_candidates  # noqa: E402
from passes.partitioning.search import global_problem, solve, solve_global  # noqa: E402
from passes.partitioning.stages import serially_balanced, stage_layers  # noqa: E402
from passes.pipelining.order import meeting_stages  # noqa: E402
from passes.scheduling.pair_dag import build_pair_dag  # noqa: E402
from tessera_ir.kinds import Phase, Resource  # noqa: E402
from tessera_ir.model import Module  # noqa: E402
from tessera_ir.parallel import ParallelConfig  # noqa: E402

WORKLOADS_DIR = ROOT / "frontend" / "workloads"
CASES = [
    ("qwen3_next_80b_a3b", dict(pp=4, vpp=2, ep=32, tp=1, microbatches=64)),
    ("qwen3_next_80b_a3b", dict(pp=8, vpp=2, ep=32, tp=1, microbatches=64)),
    # EP8 keeps the All-to-All inside a node (NVLink): communication no longer dwarfs compute,
    # so which layer kinds meet in a pair starts to decide the bottleneck.
    ("qwen3_next_80b_a3b", dict(pp=8, vpp=2, ep=8, tp=1, microbatches=64)),
    ("qwen3_30b_a3b", dict(pp=4, vpp=2, ep=8, tp=1, microbatches=32)),
    ("qwen3_235b_a22b", dict(pp=8, vpp=4, ep=32, tp=2, microbatches=64)),
    ("deepseek_v3_671b", dict(pp=8, vpp=4, ep=64, tp=2, microbatches=128)),
    ("qwen3_next_1t_synthetic", dict(pp=16, vpp=2, ep=64, tp=2, microbatches=256)),
]
QUICK = {("qwen3_235b_a22b", 8, 4), ("qwen3_next_1t_synthetic", 16, 2)}


# ---------------------------------------------------------------------------------------------
# Modules


def workload_path(name: str) -> Path:
    local = ROOT / "frontend" / "workloads" / f"{name}.json"
    return local if local.is_file() else WORKLOADS_DIR / f"{name}.json"


def load_module(name: str, settings: dict, source: str) -> tuple[Module, str]:
    if source == "frontend":
        try:
            import frontend

            return frontend.capture(str(workload_path(name)), overrides=settings), "frontend.capture"
        except ImportError:
            source = "synthetic"
    return synthetic_from_config(name, ParallelConfig(**settings)), "synthetic_ir + config FLOPs"


def synthetic_from_config(name: str, p: ParallelConfig) -> Module:
    """A synthetic module with per-layer FLOPs/bytes from the HF config (fallback when the frontend is absent)."""
    from synthetic_ir import synthetic_module

    cfg = json.loads(workload_path(name).read_text())
    n, h = cfg["num_hidden_layers"], cfg["hidden_size"]
    t, d = p.tokens, p.dtype_bytes
    kinds = []
    for i in range(n):
        if cfg.get("model_type") == "qwen3_next":
            mixer = "attention" if (i + 1) % cfg.get("full_attention_interval", 4) == 0 else "linear_attention"
        elif cfg.get("model_type") == "deepseek_v3":
            mixer = "mla"
        else:
            mixer = "attention"
        ffn = "dense" if i < cfg.get("first_k_dense_replace", 0) else "moe"
        kinds.append((mixer, ffn))
    topk, inter = cfg["num_experts_per_tok"], cfg["moe_intermediate_size"]
    experts = cfg.get("num_experts", cfg.get("n_routed_experts", 1))
    heads = cfg["num_attention_heads"] * cfg.get("head_dim", 128)
    mixer_params = 4 * h * heads // p.tp
    m = synthetic_module(
        kinds,
        gemm_flops=2 * 3 * t * topk * h * inter,
        mixer_flops=2 * t * mixer_params + 2 * t * t * heads // p.tp,
        a2a_bytes=t * topk * h * d * (p.ep - 1) // p.ep,
        param_bytes=mixer_params * d,
        parallel=p,
        name=name,
    )
    expert_bytes = experts // p.ep * 3 * h * inter * d
    for layer in m.decoder_layers():
        for task in layer.tasks:
            if task.phase is Phase.FWD:
                task.act_bytes = t * h * d * (4 if task.resource is Resource.COMPUTE else 0)
                if task.op.value == "expert_gemm":
                    task.param_bytes = expert_bytes
    return m


# ---------------------------------------------------------------------------------------------
# Pair costs


class StandInCosts:
    """STAND-IN pair cost (see the module docstring), cached by layer-kind signature."""

    def __init__(self, module: Module, p: ParallelConfig, hw_name: str = "h100", method: str = "standin"):
        self.module, self.p, self.hw = module, p, load_hardware(hw_name)
        self.stages = p.virtual_stages
        self.slowdown = self.hw.comm_sms / (self.hw.total_sms - self.hw.comm_sms)
        self.method = method
        self.kind: dict[str, tuple] = {}
        for layer in module.layers:
            self.kind[layer.name] = (layer.role.value, layer.mixer.value, layer.ffn.value) + tuple(
                (t.kind, t.flops, t.bytes) for t in layer.tasks
            )
        self.side_cache: dict[tuple, tuple[float, float, float]] = {}
        self.pair_cache: dict[tuple, float] = {}
        self.range_cache: dict[tuple, tuple[float, float, float]] = {}

    def duration(self, task) -> float:  # noqa: ANN001
        return task_duration_us(task, self.hw, self.p)

    def side(self, stage: int, rng: tuple[int, int], which: str) -> tuple[float, float, float]:
        fast = (stage == 0, stage == self.stages - 1, rng, which)
        if fast in self.range_cache:
            return self.range_cache[fast]
        self.range_cache[fast] = self._side(stage, rng, which)
        return self.range_cache[fast]

    def _side(self, stage: int, rng: tuple[int, int], which: str) -> tuple[float, float, float]:
        layers = stage_layers(self.module, stage, self.stages, rng)
        key = (which, tuple(self.kind[x.name] for x in layers))
        if key not in self.side_cache:
            dag = build_pair_dag(layers, [], self.duration) if which == "fwd" else build_pair_dag([], layers, self.duration)
            self.side_cache[key] = (dag.total(Resource.COMPUTE), dag.total(Resource.COMM), dag.critical_path())
        return self.side_cache[key]

    def cost(self, sf: int, rf: tuple[int, int], sb: int, rb: tuple[int, int]) -> float:
        if self.method == "gapfit":
            return self._gapfit(sf, rf, sb, rb)
        cf, mf, pf = self.side(sf, rf, "fwd")
        cb, mb, pb = self.side(sb, rb, "bwd")
        compute, comm = cf + cb, mf + mb
        return max(compute + self.slowdown * min(compute, comm), comm, pf, pb)

    def _gapfit(self, sf: int, rf: tuple[int, int], sb: int, rb: tuple[int, int]) -> float:
        from passes.scheduling.gap_fit import SearchEffort, gap_fit

        fwd = stage_layers(self.module, sf, self.stages, rf)
        bwd = stage_layers(self.module, sb, self.stages, rb)
        key = (tuple(self.kind[x.name] for x in fwd), tuple(self.kind[x.name] for x in bwd))
        if key not in self.pair_cache:
            dag = build_pair_dag(fwd, bwd, self.duration)
            self.pair_cache[key] = gap_fit(dag, SearchEffort(starts=1, rounds=0)).makespan
        return self.pair_cache[key]

    def side_bound(self, stage: int, rng: tuple[int, int], which: str) -> float:
        # A pair cannot finish before its compute stream has run both sides' compute.
        return self.side(stage, rng, which)[0]


# ---------------------------------------------------------------------------------------------
# One case


def axis_overrides(name: str, settings: dict, args: argparse.Namespace) -> dict:
    """The case's settings with the command line's axes (--seq-len, --ep) applied; data parallelism
    grows to the least multiple of the suggested one into which the EP size folds."""
    out = dict(settings)
    if args.seq_len:
        out["seq_len"] = args.seq_len
    if args.ep:
        out["ep"] = args.ep
    table = json.loads((ROOT / "frontend" / "workloads" / "parallel.json").read_text())
    suggested = table.get(name, {}).get("parallel", {})
    dp, tp, cp = suggested.get("dp", 1), out.get("tp", suggested.get("tp", 1)), suggested.get("cp", 1)
    while (dp * tp * cp) % out.get("ep", 1):
        dp *= 2
    out["dp"] = dp
    return out


def run_case(name: str, settings: dict, args: argparse.Namespace) -> dict:
    settings = axis_overrides(name, settings, args)
    p = ParallelConfig(**settings)
    t0 = time.perf_counter()
    module, source = load_module(name, settings, args.source)
    capture_s = time.perf_counter() - t0
    p = ParallelConfig.from_attrs(module.attrs)
    hw = load_hardware(args.hardware)
    module.attrs["hardware"] = args.hardware
    n = len(module.decoder_layers())
    costs = StandInCosts(module, p, args.hardware, method=args.costs if args.costs != "passes" else "standin")
    balanced = serially_balanced(module, costs.duration, p.virtual_stages)
    memory = build_memory_spec(module, p, hw.memory_gib, MemoryAssumptions())
    meets = meeting_stages(p.pp, p.vpp, p.microbatches, p.combined_1f1b)
    cands = window_candidates([r[0] for r in balanced], n, args.window)
    problem = PartitionProblem(n, p.pp, p.vpp, cands, meets, costs.cost, memory, costs.side_bound)
    row: dict = {
        "workload": name,
        "pp": p.pp,
        "vpp": p.vpp,
        "ep": p.ep,
        "tp": p.tp,
        "seq_len": p.seq_len,
        "layers": n,
        "module_source": source,
        "costs": "STAND-IN closed form" if args.costs == "standin" else args.costs,
        "capture_s": round(capture_s, 2),
    }
    memory_note = f"{args.hardware} {hw.memory_gib:g} GiB"
    if not problem.memory_ok(balanced):
        memory_note = f"balanced plan exceeds {hw.memory_gib:g} GiB; memory limit dropped for this row"
        problem.memory = None
    row["memory"] = memory_note
    if args.costs == "passes":
        row.update(pass_costs(module, memory_limited=problem.memory is not None))
    bal_bottleneck, bal_total = problem.evaluate(balanced)
    # Cost every window pair once up front (in the pass these come from the profiled pair ops),
    # so the solve time below is the partitioner's own work.
    t = time.perf_counter()
    prune(problem, None)
    row["pair_costing_s"] = round(time.perf_counter() - t, 3)
    try:
        window = solve(problem, args.solver, args.time_limit, [balanced])
    except PartitionError as err:
        row["error"] = str(err)
        return row
    row.update(
        balanced_us=round(bal_bottleneck, 1),
        window_us=round(window.bottleneck, 1),
        ratio_balanced_over_window=round(bal_bottleneck / window.bottleneck, 4),
        window_solve_s=round(window.seconds, 3),
        window_optimal=window.stats.get("optimal"),
        vars_before=window.stats["before"]["variables"],
        cons_before=window.stats["before"]["constraints"],
        vars_after=window.stats["after"]["variables"],
        cons_after=window.stats["after"]["constraints"],
        pairs_before=window.stats["before"]["pair_variables"],
        pairs_after=window.stats["after"]["pair_variables"],
        balanced_layout=megatron_layout(balanced),
        window_layout=megatron_layout(window.ranges),
    )
    row["size_reduction_vars"] = round(row["vars_before"] / max(1, row["vars_after"]), 1)
    if p.vpp <= 2 and not args.no_dp:
        t = time.perf_counter()
        dp = solve_dp(problem)
        row["dp_s"] = round(time.perf_counter() - t, 3)
        row["dp_agrees"] = abs(dp.bottleneck - window.bottleneck) <= 1e-6 * window.bottleneck
    if args.unpruned:
        from passes.partitioning.milp import solve_milp

        t = time.perf_counter()
        # The single min-max MILP on the whole window: no incumbent, no pruning, no threshold search.
        full = solve_milp(problem, args.solver, args.time_limit, use_pruning=False, method="minmax")
        row["unpruned_solve_s"] = round(time.perf_counter() - t, 3)
        row["unpruned_agrees"] = abs(full.bottleneck - window.bottleneck) <= 1e-6 * window.bottleneck
    if not args.no_global and p.vpp > args.global_max_vpp:
        row["global_error"] = (
            f"global search skipped for vpp={p.vpp} > --global-max-vpp={args.global_max_vpp} "
            "(the exact DP's state grows as positions^vpp; run with a larger value to try the MILP)"
        )
    elif not args.no_global:
        gp = global_problem(problem)
        try:
            glob = solve_global(gp, args.solver, args.global_time_limit, [window.ranges, balanced])
            row.update(
                global_us=round(glob.bottleneck, 1),
                ratio_balanced_over_global=round(bal_bottleneck / glob.bottleneck, 4),
                ratio_window_over_global=round(window.bottleneck / glob.bottleneck, 4),
                global_solve_s=round(glob.seconds, 3),
                global_vars_after=glob.stats.get("after", {}).get("variables"),
                global_optimal=glob.stats.get("optimal", True),
                global_layout=megatron_layout(glob.ranges),
            )
        except PartitionError as err:
            row["global_error"] = str(err)
    return row


def pass_costs(module: Module, memory_limited: bool = True) -> dict:
    """Window bottleneck with the real pipeline's post-overlap costs (gap-fit schedules re-timed
    by the contention model); without ``memory_limited`` the partition ignores device memory,
    like the stand-in rows whose balanced plan does not fit."""
    from passes.manager import PassManager, parse_pipeline
    from passes.partition import partition_to_json

    try:
        pipeline = parse_pipeline("candidates,overlap-schedule,profile{mode=analytic},partition")
    except Exception as err:  # noqa: BLE001 (report any missing pass)
        return {"passes_error": f"pipeline unavailable: {err}"}
    if not memory_limited:
        module.attrs["memory_gib"] = 1e6  # a run-wide setting, in the header
    t = time.perf_counter()
    PassManager(pipeline, verify_each=False).run(module)
    out = partition_to_json(module)
    balanced = out.get("balanced_bottleneck_us")
    return {
        "passes_window_us": round(out["bottleneck_us"], 1),
        "passes_balanced_us": balanced,
        "passes_ratio_balanced_over_window": round(balanced / out["bottleneck_us"], 4) if balanced else None,
        "passes_s": round(time.perf_counter() - t, 2),
    }


COLUMNS = [
    ("workload", "workload", 24),
    ("pp", "PP", 3),
    ("vpp", "VPP", 4),
    ("ep", "EP", 3),
    ("layers", "L", 3),
    ("balanced_us", "balanced µs", 12),
    ("window_us", "window µs", 12),
    ("global_us", "global µs", 12),
    ("ratio_balanced_over_window", "bal/win", 8),
    ("ratio_balanced_over_global", "bal/glob", 9),
    ("ratio_window_over_global", "win/glob", 9),
    ("vars_before", "vars pre", 9),
    ("vars_after", "vars post", 9),
    ("cons_before", "cons pre", 9),
    ("cons_after", "cons post", 9),
    ("window_solve_s", "MILP s", 7),
    ("global_solve_s", "global s", 8),
    ("dp_agrees", "DP=MILP", 7),
    ("passes_window_us", "post-overlap µs", 15),
    ("passes_ratio_balanced_over_window", "bal/win post-overlap", 20),
]


def print_table(rows: list[dict]) -> None:
    print(" ".join(f"{title:>{w}}" for _, title, w in COLUMNS))
    for row in rows:
        print(" ".join(f"{str(row.get(key, '-')):>{w}}" for key, _, w in COLUMNS))
    for row in rows:
        tag = f"{row['workload']} PP{row['pp']} VPP{row['vpp']}"
        for key in ("balanced_layout", "window_layout", "global_layout", "error", "global_error", "memory"):
            if key in row:
                print(f"  {tag} {key}: {row[key]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", choices=["frontend", "synthetic"], default="frontend")
    ap.add_argument("--costs", choices=["standin", "gapfit", "passes"], default="standin")
    ap.add_argument("--solver", choices=["cbc", "highs"], default="cbc")
    ap.add_argument("--window", type=int, default=2)
    ap.add_argument("--hardware", default="h100", help="target hardware: h100, h200, cpu or a path to a JSON file")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--global-time-limit", type=float, default=120.0)
    ap.add_argument("--quick", action="store_true", help="only the two MILP-speed cases")
    ap.add_argument("--only", default=None, help="run workloads whose name contains this text")
    ap.add_argument("--no-global", action="store_true")
    ap.add_argument("--no-dp", action="store_true")
    ap.add_argument("--global-max-vpp", type=int, default=4)
    ap.add_argument("--unpruned", action="store_true", help="also time the MILP without pruning")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "partition"))
    ap.add_argument("--seq-len", type=int, default=None, help="sequence length of every case (default: each case's)")
    ap.add_argument("--ep", type=int, default=None, help="EP size of every case (default: each case's)")
    args = ap.parse_args()
    rows = []
    for name, settings in CASES:
        if args.quick and (name, settings["pp"], settings["vpp"]) not in QUICK:
            continue
        if args.only and args.only not in name:
            continue
        row = run_case(name, settings, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print_table(rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    keys = sorted({k for r in rows for k in r})
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
