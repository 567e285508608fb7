"""Pair scheduling quality and speed: gap-fit heuristic vs the exact ILP and two baselines.

Suite: pair DAGs from real model shapes (Qwen3-Next-80B at EP8 and EP32 on
H100, and EP32 on H200; Qwen3-235B; DeepSeek-V3; every distinct contiguous
chunk of 1-4 layers of each model's layer pattern, forward chunk x backward
chunk) plus seeded random heterogeneous DAGs. Task shapes, FLOPs and bytes come
from ``frontend.capture`` of the shipped workload configs (``--source
frontend``, the default when the frontend is installed) or from this file's own
formulas (``--source formulas``, ``size_task``; they agree with the frontend
within a few percent); ``passes.costs.durations.task_duration_us`` turns them into
durations.

For every pair: the lower bound, the gap-fit makespan and solve time, the
serial and fixed-template (Megatron-Core combined-1F1B order) makespans, and,
for pairs of at most ``--ilp-max-tasks`` tasks, the ILP optimum and solve time.
Prints the table and a summary, writes ``bench/results/pair_schedule.{csv,json}``.

    .venv/bin/python bench/bench_pair_schedule.py            # full suite (~5 min on an idle 2-core machine)
    .venv/bin/python bench/bench_pair_schedule.py --quick    # a small subset
    .venv/bin/python bench/bench_pair_schedule.py --seq-len 32768 --ep 8,32   # other axes
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from passes.costs.durations import task_duration_us  # noqa: E402
from passes.costs.hardware import load_hardware  # noqa: E402
from passes.scheduling.baselines import fixed_template, serial  # noqa: E402
from passes.scheduling.check import check_pair_schedule  # noqa: E402
from passes.scheduling.exact import exact  # noqa: E402
from passes.scheduling.gap_fit import gap_fit  # noqa: E402
from passes.scheduling.pair_dag import PairDAG, build_pair_dag  # noqa: E402
from tessera_ir.kinds import Phase, TaskOp  # noqa: E402
from tessera_ir.model import Layer, Module, Task  # noqa: E402
from tessera_ir.parallel import ParallelConfig  # noqa: E402

from synthetic_ir import synthetic_module  # noqa: E402

WORKLOADS = ROOT / "frontend" / "workloads"
RESULTS = ROOT / "bench" / "results"

SHORT = {"linear_attention": "LA", "attention": "A", "mla": "MLA", "moe": "M", "dense": "D"}


@dataclass
class ModelSpec:
    label: str
    config: str
    parallel: ParallelConfig
    hardware: str
    layers: int = 8  # decoder layers of the real pattern to take chunks from


def layer_kinds(cfg: dict, count: int) -> list[tuple[str, str]]:
    """(mixer, ffn) of the first ``count`` decoder layers, as the model defines them."""
    kinds = []
    for i in range(count):
        if cfg.get("model_type") == "qwen3_next":
            mixer = "attention" if cfg["layer_types"][i] == "full_attention" else "linear_attention"
        elif cfg.get("model_type") == "deepseek_v3":
            mixer = "mla"
        else:
            mixer = "attention"
        if cfg.get("model_type") == "deepseek_v3":
            ffn = "dense" if i < cfg.get("first_k_dense_replace", 0) else "moe"
        else:
            ffn = "dense" if i in cfg.get("mlp_only_layers", []) else "moe"
        kinds.append((mixer, ffn))
    return kinds


def _fwd_flops_and_weights(cfg: dict, op: TaskOp, parallel: ParallelConfig) -> tuple[float, float]:
    """(forward FLOPs, FLOPs of weight GEMMs) of one task for one micro-batch on one rank.

    A GEMM of m x k by k x n costs 2mkn. T tokens per micro-batch; tensor
    parallelism splits attention and dense MLPs; sequence parallelism splits the
    tokens entering the MoE block; expert parallelism leaves each rank, on
    average, T * top_k routed tokens.
    """
    t = parallel.tokens
    h = cfg["hidden_size"]
    tp = parallel.tp
    if op is TaskOp.ATTENTION:
        nq, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg.get("head_dim", h // cfg["num_attention_heads"])
        proj = 2 * t * h * (nq * hd + 2 * nkv * hd) + 2 * t * nq * hd * h
        if cfg.get("model_type") == "qwen3_next":
            proj += 2 * t * h * nq * hd  # output gate
        core = 2 * t * t * nq * hd  # QK^T and PV, causal half of 2 * 2 * T^2 * nq * hd
        return (proj + core) / tp, proj / tp
    if op is TaskOp.LINEAR_ATTENTION:
        nk, dk = cfg["linear_num_key_heads"], cfg["linear_key_head_dim"]
        nv, dv = cfg["linear_num_value_heads"], cfg["linear_value_head_dim"]
        proj = 2 * t * h * (2 * nk * dk + 2 * nv * dv + 2 * nv) + 2 * t * nv * dv * h
        core = 8 * t * nv * dk * dv  # chunked gated delta rule: state update and readout
        return (proj + core) / tp, proj / tp
    if op is TaskOp.MLA:
        nq, ql, kl = cfg["num_attention_heads"], cfg["q_lora_rank"], cfg["kv_lora_rank"]
        qk, rope, v = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        proj = 2 * t * (h * ql + ql * nq * qk + h * (kl + rope) + kl * nq * (cfg["qk_nope_head_dim"] + v) + nq * v * h)
        core = t * t * nq * (qk + v)
        return (proj + core) / tp, proj / tp
    experts = cfg.get("num_experts", cfg.get("n_routed_experts", 1))
    topk = cfg.get("num_experts_per_tok", 1)
    moe_t = t / tp
    if op is TaskOp.ROUTER:
        f = 2 * moe_t * h * experts
        return f, f
    if op is TaskOp.EXPERT_GEMM:
        f = 2 * 3 * moe_t * topk * h * cfg["moe_intermediate_size"]  # SwiGLU: gate, up, down
        return f, f
    if op is TaskOp.SHARED_EXPERT:
        inter = cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts", 0) * cfg["moe_intermediate_size"]
        f = 2 * 3 * moe_t * h * inter
        return f, f
    if op is TaskOp.DENSE_MLP:
        f = 2 * 3 * t * h * cfg["intermediate_size"] / tp
        return f, f
    return 0.0, 0.0


def size_task(cfg: dict, task, parallel: ParallelConfig) -> None:  # noqa: ANN001
    """Set FLOPs and bytes of one synthetic task from the model config."""
    b = parallel.dtype_bytes
    h = cfg["hidden_size"]
    t = parallel.tokens
    if task.op in (TaskOp.DISPATCH, TaskOp.COMBINE):
        topk = cfg.get("num_experts_per_tok", 1)
        # Each rank sends its tokens' hidden states to top_k experts, all but 1/ep of them off-rank.
        task.bytes = int(t / parallel.tp * topk * h * b * (parallel.ep - 1) / parallel.ep)
        task.flops = 0
        return
    fwd, weights = _fwd_flops_and_weights(cfg, task.op, parallel)
    if task.phase is Phase.FWD:
        flops = fwd
    elif task.phase is Phase.DGRAD:
        flops = fwd + (fwd - weights)  # input gradients; attention cores cost twice their forward
    else:
        flops = weights
    task.flops = int(flops)
    task.bytes = int(3 * t * h * b)  # activations read and written around the kernel


_CAPTURED: dict[tuple[str, int, int, int], Module] = {}


def captured_module(spec: ModelSpec) -> Module:
    """The frontend's capture of the workload (real task shapes, FLOPs and bytes), cached per run."""
    from frontend import WORKLOADS_DIR, capture

    key = (spec.config, spec.parallel.ep, spec.parallel.tp, spec.parallel.seq_len)
    if key not in _CAPTURED:
        overrides = {"ep": spec.parallel.ep, "tp": spec.parallel.tp, "seq_len": spec.parallel.seq_len, "pp": 1, "vpp": 1,
                     "microbatches": 1, "dp": 1}
        _CAPTURED[key] = capture(str(Path(WORKLOADS_DIR) / spec.config), overrides=overrides)
    return _CAPTURED[key]


def model_module(spec: ModelSpec, source: str = "formulas") -> tuple[Module, dict]:
    """The module to take chunks from: the frontend's capture, or synthetic layers sized by ``size_task``."""
    cfg = json.loads((WORKLOADS / spec.config).read_text())
    if source == "frontend":
        return captured_module(spec), cfg
    kinds = layer_kinds(cfg, spec.layers)
    shared = bool(cfg.get("shared_expert_intermediate_size") or cfg.get("n_shared_experts"))
    module = synthetic_module(kinds, shared_expert=shared, parallel=spec.parallel, name=spec.config.split(".")[0])
    for layer in module.decoder_layers():
        for task in layer.tasks:
            size_task(cfg, task, spec.parallel)
    return module, cfg


def chunk_label(layers: list[Layer]) -> str:
    return ",".join(f"{SHORT[lay.mixer.value]}-{SHORT[lay.ffn.value]}" for lay in layers)


@dataclass
class Case:
    suite: str
    fwd: str
    bwd: str
    dag: PairDAG


def model_cases(spec: ModelSpec, sizes: list[tuple[int, int]], source: str = "formulas") -> list[Case]:
    module, _ = model_module(spec, source)
    hw = load_hardware(spec.hardware)
    parallel = ParallelConfig.from_attrs(module.attrs)
    decoder = module.decoder_layers()[: spec.layers]
    cases = []
    for nf, nb in sizes:
        # Every distinct contiguous chunk (by layer-kind sequence) of each size.
        windows: dict[int, dict[str, list[Layer]]] = {}
        for size in {nf, nb}:
            windows[size] = {}
            for i in range(len(decoder) - size + 1):
                chunk = decoder[i : i + size]
                windows[size].setdefault(chunk_label(chunk), chunk)
        for flabel, fl in sorted(windows[nf].items()):
            for blabel, bl in sorted(windows[nb].items()):
                dag = build_pair_dag(fl, bl, lambda t: task_duration_us(t, hw, parallel), f"{flabel}|{blabel}")
                cases.append(Case(spec.label, flabel, blabel, dag))
    return cases


def random_cases(count: int, seed: int) -> list[Case]:
    """Heterogeneous pairs: random layer kinds, random FLOP/byte scales, per-task noise."""
    rng = random.Random(seed)
    kinds = [("linear_attention", "moe"), ("attention", "moe"), ("attention", "dense"), ("mla", "moe"), ("mla", "dense")]
    hw = load_hardware("h100")
    cases = []
    for k in range(count):
        nf, nb = rng.choice([(1, 1), (1, 2), (2, 1), (2, 2), (2, 2), (3, 1)])
        layer_kinds_ = [rng.choice(kinds) for _ in range(nf + nb)]
        parallel = ParallelConfig(ep=rng.choice([8, 16, 32]))
        module = synthetic_module(
            layer_kinds_,
            gemm_flops=int(10 ** rng.uniform(11.0, 12.3)),
            mixer_flops=int(10 ** rng.uniform(11.0, 12.3)),
            a2a_bytes=int(10 ** rng.uniform(7.3, 8.3)),
            shared_expert=rng.random() < 0.6,
            parallel=parallel,
            name=f"random{k}",
        )
        noise = {t.name: rng.lognormvariate(0.0, 0.35) for t in module.tasks()}
        decoder = module.decoder_layers()
        fl, bl = decoder[:nf], decoder[nf:]
        def noisy(t: Task, p: ParallelConfig = parallel, z: dict[str, float] = noise) -> float:
            return task_duration_us(t, hw, p) * z[t.name]

        dag = build_pair_dag(fl, bl, noisy, f"random{k}")
        cases.append(Case("random", chunk_label(fl), chunk_label(bl), dag))
    return cases


def run_heuristics(case: Case) -> dict:
    """Gap-fit and both baselines on one pair (all checked by z3)."""
    dag = case.dag
    heur = gap_fit(dag)
    ser = serial(dag)
    tmpl = fixed_template(dag)
    for sched in (heur, ser, tmpl):
        check_pair_schedule(sched)
    return {
        "suite": case.suite,
        "fwd": case.fwd,
        "bwd": case.bwd,
        "tasks": len(dag.tasks),
        "lower_bound_us": round(dag.lower_bound(), 3),
        "gap_fit_us": round(heur.makespan, 3),
        "gap_fit_ms": round(heur.solve_seconds * 1e3, 3),
        "gap_fit_rule": heur.stats.get("rule", ""),
        "serial_us": round(ser.makespan, 3),
        "fixed_template_us": round(tmpl.makespan, 3),
        "reduction_vs_serial_pct": round(100 * (1 - heur.makespan / ser.makespan), 2),
        "reduction_vs_template_pct": round(100 * (1 - heur.makespan / tmpl.makespan), 2),
        "template_reduction_vs_serial_pct": round(100 * (1 - tmpl.makespan / ser.makespan), 2),
        "ratio_to_bound": round(heur.makespan / dag.lower_bound(), 4),
        "ilp_us": None,
        "ilp_status": "skipped",
        "ilp_ms": None,
        "gap_to_ilp_pct": None,
        "_start": min((tmpl, ser), key=lambda s: s.makespan),
        "_heur": heur.makespan,
    }


def run_ilp(case: Case, row: dict, ilp_max_tasks: int, ilp_time_limit: float, solver: str) -> None:
    """The exact optimum of one pair, when it is small enough; fills the row's ILP columns."""
    start, heur = row.pop("_start"), row.pop("_heur")
    if len(case.dag.tasks) > ilp_max_tasks:
        return
    # The ILP starts from the better baseline, not from the heuristic, so its time and
    # result do not depend on the method it is measuring.
    ilp = exact(case.dag, time_limit_s=ilp_time_limit, solver=solver, upper_bound=start, shortcut=False)
    check_pair_schedule(ilp)
    row.update(
        ilp_us=round(ilp.makespan, 3),
        ilp_status=ilp.status,
        ilp_ms=round(ilp.solve_seconds * 1e3, 2),
        gap_to_ilp_pct=round(100 * (heur / ilp.makespan - 1), 3),
    )


def summarize(rows: list[dict]) -> dict:
    solved = [r for r in rows if r["ilp_status"] == "optimal"]
    gaps = [r["gap_to_ilp_pct"] for r in solved]
    t_h = sum(r["gap_fit_ms"] for r in solved)
    t_i = sum(r["ilp_ms"] for r in solved)
    per_pair = [r["ilp_ms"] / max(r["gap_fit_ms"], 1e-3) for r in solved]
    out: dict = {
        "pairs": len(rows),
        "ilp_pairs": sum(1 for r in rows if r["ilp_status"] != "skipped"),
        "ilp_optimal": len(solved),
        "ilp_not_proven": sum(1 for r in rows if r["ilp_status"] in ("feasible", "timeout")),
        "mean_gap_pct": round(statistics.fmean(gaps), 3) if gaps else None,
        "worst_gap_pct": round(max(gaps), 3) if gaps else None,
        "pairs_at_optimum": sum(1 for g in gaps if g <= 1e-6),
        "gap_fit_total_ms": round(t_h, 1),
        "ilp_total_ms": round(t_i, 1),
        "speedup_total": round(t_i / t_h, 1) if t_h else None,
        "speedup_median_per_pair": round(statistics.median(per_pair), 1) if per_pair else None,
        "mean_ratio_to_bound_all": round(statistics.fmean(r["ratio_to_bound"] for r in rows), 4),
    }
    by_suite = {}
    for suite in dict.fromkeys(r["suite"] for r in rows):
        rs = [r for r in rows if r["suite"] == suite]
        sg = [r["gap_to_ilp_pct"] for r in rs if r["ilp_status"] == "optimal"]
        vs_s = [r["reduction_vs_serial_pct"] for r in rs]
        vs_t = [r["reduction_vs_template_pct"] for r in rs]
        by_suite[suite] = {
            "pairs": len(rs),
            "mean_gap_pct": round(statistics.fmean(sg), 3) if sg else None,
            "worst_gap_pct": round(max(sg), 3) if sg else None,
            "reduction_vs_serial_pct": [round(min(vs_s), 1), round(statistics.median(vs_s), 1), round(max(vs_s), 1)],
            "reduction_vs_template_pct": [round(min(vs_t), 1), round(statistics.median(vs_t), 1), round(max(vs_t), 1)],
        }
    out["by_suite"] = by_suite
    return out


HEADER = (
    f"{'suite':<26} {'fwd chunk':<20} {'bwd chunk':<20} {'n':>3} {'LB':>9} {'gap-fit':>9} {'ILP':>9} "
    f"{'status':>8} {'gap%':>6} {'t_h ms':>7} {'t_ilp ms':>9} {'serial':>9} {'template':>9} {'-ser%':>6} {'-tpl%':>6}"
)


def format_row(r: dict) -> str:
    ilp = f"{r['ilp_us']:.0f}" if r["ilp_us"] is not None else "-"
    gap = f"{r['gap_to_ilp_pct']:.2f}" if r["gap_to_ilp_pct"] is not None else "-"
    tilp = f"{r['ilp_ms']:.1f}" if r["ilp_ms"] is not None else "-"
    return (
        f"{r['suite']:<26} {r['fwd']:<20} {r['bwd']:<20} {r['tasks']:>3} {r['lower_bound_us']:>9.0f} "
        f"{r['gap_fit_us']:>9.0f} {ilp:>9} {r['ilp_status']:>8} {gap:>6} {r['gap_fit_ms']:>7.1f} {tilp:>9} "
        f"{r['serial_us']:>9.0f} {r['fixed_template_us']:>9.0f} {r['reduction_vs_serial_pct']:>6.1f} "
        f"{r['reduction_vs_template_pct']:>6.1f}"
    )


def combination_table(rows: list[dict]) -> list[dict]:
    """Latency reduction per layer combination of one-layer chunks (forward kind x backward kind)."""
    out = []
    for r in rows:
        if r["suite"] != "random" and "," not in r["fwd"] and "," not in r["bwd"]:
            out.append(
                {
                    "suite": r["suite"],
                    "combination": f"{r['fwd']} | {r['bwd']}",
                    "vs_serial_pct": r["reduction_vs_serial_pct"],
                    "vs_template_pct": r["reduction_vs_template_pct"],
                    "template_vs_serial_pct": r["template_reduction_vs_serial_pct"],
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a small subset (chunks of 1-2 layers, few random pairs)")
    ap.add_argument("--ilp-max-tasks", type=int, default=40)
    ap.add_argument("--ilp-time-limit", type=float, default=10.0)
    ap.add_argument("--solver", default="cpsat", choices=["cpsat", "highs", "cbc"], help="exact solver (cpsat: the reference)")
    ap.add_argument("--random", type=int, default=24, help="number of random heterogeneous pairs")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--seq-len", type=int, default=4096, help="sequence length of every model suite")
    ap.add_argument("--ep", default=None, help="comma list of EP sizes: every model suite at each (default: each suite's own)")
    ap.add_argument(
        "--source",
        choices=["frontend", "formulas"],
        default=None,
        help="task shapes from frontend.capture (default when the frontend is installed) or from this file's formulas",
    )
    args = ap.parse_args(argv)

    one_two = [(1, 1), (1, 2), (2, 1), (2, 2)]
    big = [(3, 3), (4, 4), (3, 4)]
    specs = [
        (ModelSpec("qwen3-next-80b EP8", "qwen3_next_80b_a3b.json", ParallelConfig(ep=8), "h100"), one_two + [(3, 1), (3, 2)] + big),
        (ModelSpec("qwen3-next-80b EP32", "qwen3_next_80b_a3b.json", ParallelConfig(ep=32), "h100"), one_two + [(3, 1), (3, 2)] + big),
        (ModelSpec("qwen3-next-80b EP32 h200", "qwen3_next_80b_a3b.json", ParallelConfig(ep=32), "h200"), one_two),
        (ModelSpec("qwen3-235b EP32 TP2", "qwen3_235b_a22b.json", ParallelConfig(ep=32, tp=2), "h100"), one_two + [(3, 2)] + big),
        (ModelSpec("deepseek-v3 EP64 TP2", "deepseek_v3_671b.json", ParallelConfig(ep=64, tp=2), "h100", layers=6), one_two + [(3, 2)] + big),
    ]
    if args.ep:
        # Every model once per asked EP size (the h200 suite only differs by hardware: kept as is).
        by_model = {(spec.config, spec.hardware): (spec, sizes) for spec, sizes in specs}
        specs = [
            (ModelSpec(f"{spec.label.split(' EP')[0]} EP{ep}" + (f" TP{spec.parallel.tp}" if spec.parallel.tp > 1 else "")
                       + ("" if spec.hardware == "h100" else f" {spec.hardware}"),
                       spec.config, spec.parallel.replace(ep=ep), spec.hardware, spec.layers), sizes)
            for spec, sizes in by_model.values()
            for ep in [int(x) for x in args.ep.split(",")]
        ]
    specs = [(ModelSpec(s.label + (f" {args.seq_len // 1024}K" if args.seq_len != 4096 else ""), s.config,
                        s.parallel.replace(seq_len=args.seq_len), s.hardware, s.layers), sizes) for s, sizes in specs]
    if args.quick:
        specs = [(s, [(1, 1), (2, 2)]) for s, _ in specs[:2]]
        args.random = min(args.random, 6)
    if args.source is None:
        try:
            import frontend  # noqa: F401

            args.source = "frontend"
        except ImportError:
            args.source = "formulas"
    t_build = time.perf_counter()
    cases: list[Case] = []
    for spec, sizes in specs:
        cases += model_cases(spec, sizes, args.source)
    cases += random_cases(args.random, seed=2026)

    t0 = time.perf_counter()
    # All heuristic runs first, then all ILP solves: each is timed without the other
    # running beside it (the solver library keeps worker threads around after a solve).
    rows = [run_heuristics(case) for case in cases]
    print(HEADER)
    print("-" * len(HEADER))
    for case, row in zip(cases, rows):
        run_ilp(case, row, args.ilp_max_tasks, args.ilp_time_limit, args.solver)
        print(format_row(row), flush=True)
    wall = time.perf_counter() - t0
    summary = summarize(rows)
    summary["wall_s"] = round(wall, 1)
    summary["build_s"] = round(t0 - t_build, 1)
    summary["source"] = args.source
    summary["solver"] = args.solver
    summary["ilp_time_limit_s"] = args.ilp_time_limit
    print()
    print(
        f"pairs {summary['pairs']}, ILP on {summary['ilp_pairs']} (proven optimal {summary['ilp_optimal']}, "
        f"not proven {summary['ilp_not_proven']}); gap-fit vs optimum: mean {summary['mean_gap_pct']}%, "
        f"worst {summary['worst_gap_pct']}%, at optimum {summary['pairs_at_optimum']}/{summary['ilp_optimal']}"
    )
    print(
        f"solve time on the ILP pairs: gap-fit {summary['gap_fit_total_ms']} ms, ILP {summary['ilp_total_ms']} ms "
        f"({summary['speedup_total']}x in total, median {summary['speedup_median_per_pair']}x per pair); "
        f"mean makespan / lower bound over all pairs {summary['mean_ratio_to_bound_all']}"
    )
    print(f"\n{'suite':<26} {'pairs':>5} {'mean gap%':>9} {'worst%':>7}   reduction vs serial % (min/med/max)   vs template %")
    for suite, s in summary["by_suite"].items():
        print(
            f"{suite:<26} {s['pairs']:>5} {str(s['mean_gap_pct']):>9} {str(s['worst_gap_pct']):>7}   "
            f"{'/'.join(str(x) for x in s['reduction_vs_serial_pct']):<36} {'/'.join(str(x) for x in s['reduction_vs_template_pct'])}"
        )
    combos = combination_table(rows)
    summary["combinations"] = combos
    print(f"\n{'one-layer chunks':<26} {'fwd | bwd':<16} {'gap-fit vs serial %':>20} {'vs template %':>14} {'template vs serial %':>21}")
    for c in combos:
        print(
            f"{c['suite']:<26} {c['combination']:<16} {c['vs_serial_pct']:>20.1f} {c['vs_template_pct']:>14.1f} "
            f"{c['template_vs_serial_pct']:>21.1f}"
        )
    print(f"\nshapes from {args.source}; building the suite took {t0 - t_build:.1f} s, scheduling {wall:.1f} s")
    if not args.quick:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "pair_schedule.csv", "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        (args.out / "pair_schedule.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1) + "\n")
        print(f"wrote {args.out / 'pair_schedule.csv'} and {args.out / 'pair_schedule.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
