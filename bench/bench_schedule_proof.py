"""Where the z3 proof of a pair schedule spends its time, and the proof as it was vs as it is.

The distinct pair DAGs of a compile (``candidates`` on the captured model, then the DAGs
``overlap-schedule`` schedules), a seeded sample of them scheduled by gap-fit; for each, in
one run and interleaved so that machine load hits both alike:

- ``script``: writing the SMT-LIB2 text in Python (:func:`passes.scheduling.check.proof_script`);
- ``before``: ``z3.Solver`` with every assertion named for unsat cores (what every proof did);
- ``after``: ``z3.SimpleSolver`` with plain assertions (what a valid schedule costs alone; a
  failing one is decided again with named assertions to find the core);

each split into parsing (``from_string``) and deciding (``check``). Then, batch by batch
(``passes.scheduling.batch.PROOF_BATCH`` schedules, the background proofs' unit), in rotating
order: the lone proofs of a batch by text (script included), ``prove_all`` deciding the batch
as one problem by text (``through_text``), and ``prove_all`` as the compiler runs it, the facts
handed to z3 as terms through its C API (``passes.scheduling._proof``); and each schedule
proven alone through the C API. Prints milliseconds per DAG and the ratios. Every way must
answer sat on every schedule.

    .venv/bin/python bench/bench_schedule_proof.py                       # make demo's model
    .venv/bin/python bench/bench_schedule_proof.py --source frontend/workloads/qwen3_next_1t_synthetic.json
    .venv/bin/python bench/bench_schedule_proof.py --ep 8 --seq-len 8192 --hardware h200 --sample 100
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import z3  # noqa: E402

from passes.plan_view import PlanView  # noqa: E402
from passes.scheduling.batch import PROOF_BATCH  # noqa: E402
from passes.scheduling.check import entries_of, native_facts, native_prover, proof_script, prove_all  # noqa: E402
from passes.scheduling.gap_fit import gap_fit  # noqa: E402
from passes.scheduling.pair_dag import PairDAG  # noqa: E402
from tessera.api import capture, run_passes  # noqa: E402


def distinct_dags(args: argparse.Namespace) -> list[PairDAG]:
    parallel = {k: getattr(args, k) for k in ("pp", "vpp", "ep", "tp", "seq_len", "microbatches")}
    module = capture(args.source, **parallel)
    module.attrs["hardware"] = args.hardware
    run_passes(module, "candidates")
    return PlanView(module).distinct_pair_dags()


def decide(make: Callable[[], z3.Solver], text: str, named: bool) -> tuple[float, float, bool]:
    """Seconds parsing, seconds deciding, and whether it was sat."""
    solver = make()
    if named:
        solver.set(unsat_core=True)
    t0 = time.perf_counter()
    solver.from_string(text)
    t1 = time.perf_counter()
    sat = solver.check() == z3.sat
    return t1 - t0, time.perf_counter() - t1, sat


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="hf:qwen3_next")
    for flag in ("--pp", "--vpp", "--ep", "--tp", "--seq-len", "--microbatches"):
        p.add_argument(flag, type=int, default=None)
    p.add_argument("--hardware", default="h100")
    p.add_argument("--sample", type=int, default=60, help="DAGs proven (a seeded sample of the distinct ones)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    dags = distinct_dags(args)
    sample = random.Random(args.seed).sample(dags, min(args.sample, len(dags)))
    schedules = [gap_fit(dag) for dag in sample]
    times: dict[str, list[float]] = {k: [] for k in ("script", "before parse", "before check", "after parse", "after check")}
    all_sat = True
    for sched in schedules:
        entries = entries_of(sched)
        t0 = time.perf_counter()
        script = proof_script(sched.dag, dict(enumerate(entries)), [1] * len(entries))
        plain, named = script.plain(), script.named()
        times["script"].append(time.perf_counter() - t0)
        parse, check, sat_before = decide(z3.Solver, named, named=True)
        times["before parse"].append(parse)
        times["before check"].append(check)
        parse, check, sat_after = decide(z3.SimpleSolver, plain, named=False)
        times["after parse"].append(parse)
        times["after check"].append(check)
        all_sat = all_sat and sat_before and sat_after
    tasks = statistics.mean(len(d.tasks) for d in sample)
    print(f"{args.source}: {len(dags)} distinct pair DAGs, {len(sample)} proven ({tasks:.0f} tasks each on average)")
    ms = {k: 1e3 * statistics.mean(v) for k, v in times.items()}
    before = ms["script"] + ms["before parse"] + ms["before check"]
    after = ms["script"] + ms["after parse"] + ms["after check"]
    print(f"{'ms per DAG':24s}{'script':>9s}{'parse':>9s}{'check':>9s}{'total':>9s}")
    print(f"{'before (Solver, named)':24s}{ms['script']:9.2f}{ms['before parse']:9.2f}{ms['before check']:9.2f}{before:9.2f}")
    print(f"{'after (SimpleSolver)':24s}{ms['script']:9.2f}{ms['after parse']:9.2f}{ms['after check']:9.2f}{after:9.2f}")
    print(f"after/before: parse {ms['after parse'] / ms['before parse']:.3f}, check {ms['after check'] / ms['before check']:.3f}, "
          f"whole proof {after / before:.3f}; every schedule proven by both: {'yes' if all_sat else 'NO'}")

    def lone(batch: list) -> bool:
        ok = True
        for sched in batch:
            entries = entries_of(sched)
            plain = proof_script(sched.dag, dict(enumerate(entries)), [1] * len(entries)).plain()
            ok = decide(z3.SimpleSolver, plain, named=False)[2] and ok
        return ok

    native = native_prover()
    if native is None:
        print("the C API prover (passes.scheduling._proof) did not load: build the package (make setup)")
        return 1

    def c_api_lone(batch: list) -> bool:
        return all([native.prove([native_facts(s.dag, s.start)]) for s in batch])

    ways: list[tuple[str, Callable[[list], bool]]] = [
        ("lone, text", lone),
        ("batched, text", lambda batch: prove_all(batch, through_text=True)),
        ("batched, C API", prove_all),
        ("lone, C API", c_api_lone),
    ]
    spent = {name: 0.0 for name, _ in ways}
    for i, start in enumerate(range(0, len(schedules), PROOF_BATCH)):
        batch = schedules[start:start + PROOF_BATCH]
        for name, prove in ways[i % len(ways):] + ways[:i % len(ways)]:
            t0 = time.perf_counter()
            all_sat = prove(batch) and all_sat
            spent[name] += time.perf_counter() - t0
    ms = {name: 1e3 * spent[name] / len(schedules) for name in spent}
    print(f"ms per DAG, script or terms included ({PROOF_BATCH} at a time as one problem when batched):")
    for name, _ in ways:
        print(f"  {name:16s}{ms[name]:8.2f}   /lone, text {ms[name] / ms['lone, text']:.3f}")
    print(f"batched: C API / text {ms['batched, C API'] / ms['batched, text']:.3f}; lone: C API / text "
          f"{ms['lone, C API'] / ms['lone, text']:.3f}; every schedule proven: {'yes' if all_sat else 'NO'}")
    return 0 if all_sat else 1


if __name__ == "__main__":
    sys.exit(main())
