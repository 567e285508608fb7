"""Pair DAGs from real plans on which gap-fit used to stay above the best exact schedule.

Each case (``data/real_pair_cases.json``) is a distinct pair DAG the candidates pass produced
for Qwen3-235B-A22B at EP16 (and, the last, for the 1T synthetic model), from the real-plan suite's seeded sample, with the makespan
CP-SAT reached (proven optimal or not) and the one gap-fit reached before. Both chunks hold
the LM head's backward or a long attention core, and the compute stream is the bottleneck:
the optimum keeps that stream busy (a long weight gradient started while a short wait for an
All-to-All would leave it idle; the forward's transfer first on the comm stream), which the
look-ahead by bound and the merges led by either side now find. In the last case the comm
stream waits for the LM head's dgrad unless the forward's first transfer is fed first (the
forward-feed-first starts, searched where no transfer starts at time 0). In the 1T case the
backward's long first transfer must wait behind the forward's, which takes two moves of the
transfer order at once (the merge search's paired moves, where no single move passes its bound).
The last, compute-bound, needs the fit around a transfer order to start a long weight gradient
in a wait rather than idle (the final local search of a compute-bound pair, fitting with
look-ahead by bound too). In the EP32 case the optimum's transfer order swaps two pairs of
neighbouring transfers of different sides at once (the search's last phase, swap_pairs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from passes.scheduling.check import check_pair_schedule
from passes.scheduling.gap_fit import gap_fit, strong_lower_bound
from passes.scheduling.pair_dag import PairDAG, PairTask
from tessera_ir.kinds import Resource

CASES = json.loads((Path(__file__).parent / "data" / "real_pair_cases.json").read_text())["cases"]


def dag_of(case: dict) -> PairDAG:
    tasks = [
        PairTask(name, kind, Resource(resource), float.fromhex(duration), tuple(deps), side, layer, movable,
                 None if deadline is None else float.fromhex(deadline))
        for name, kind, resource, duration, deps, side, layer, movable, deadline in case["tasks"]
    ]
    return PairDAG(case["name"], tasks)


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_gap_fit_reaches_the_best_exact_schedule(case: dict) -> None:
    dag = dag_of(case)
    found = gap_fit(dag)
    check_pair_schedule(found, prove=True)
    best = float.fromhex(case["best_exact_us"])
    assert found.makespan < float.fromhex(case["earlier_gap_fit_us"])
    assert found.makespan <= best * (1 + 1e-9), f"{found.makespan} us against the exact {best} us"
    if case["optimum_proven"]:
        assert found.makespan >= best * (1 - 1e-9)  # nothing beats a proven optimum
    assert found.makespan >= strong_lower_bound(dag) * (1 - 1e-12)


def test_a_case_is_deterministic() -> None:
    dag = dag_of(CASES[0])
    assert gap_fit(dag).start == gap_fit(dag).start
