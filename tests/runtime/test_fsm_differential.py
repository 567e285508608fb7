"""Differential tests: the C++ FSM and the Python reference take the same actions on generated plans and traces.

Each example generates a plan (ranks, virtual stages, micro-batches, EP size,
DBO slots and budget drawn by the seed) and drives both interpreters with the
same seeded trainer: completions in random order, token counts reported for
random All-to-Alls, movable tasks registered at run time. Every action and
every counter must agree (the observed idle time is wall-clock and differs).
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

import runtime
from runtime import reference
from runtime.reference import CLOCK_COUNTERS

from program_gen import drive, generate_bytes


def run_both(data: bytes, rank: int, seed: int, **options: Any) -> tuple[list, dict]:
    native = runtime.load_plan(data, rank=rank)
    ref = reference.load_plan(data, rank=rank)
    a, ca = drive(runtime.FSM(native, **options), native, seed)
    b, cb = drive(reference.ReferenceFSM(ref, **options), ref, seed)
    for key in CLOCK_COUNTERS:
        ca.pop(key)
        cb.pop(key)
    assert a == b
    assert ca == cb
    return a, ca


@settings(max_examples=150, deadline=None)
@given(
    plan_seed=st.integers(0, 10_000),
    drive_seed=st.integers(0, 10_000),
    dbo=st.booleans(),
    budget=st.sampled_from([None, 0, 1 << 20, 1 << 26]),
    min_slot_us=st.sampled_from([0.0, 10.0, 60.0]),
    admission=st.booleans(),
)
def test_cpp_and_python_interpreters_agree(
    plan_seed: int, drive_seed: int, dbo: bool, budget: int | None, min_slot_us: float, admission: bool
) -> None:
    data = generate_bytes(plan_seed)
    image = runtime.bytecode.decode(data)
    rank = drive_seed % image.plan.pp
    actions, counters = run_both(
        data, rank, drive_seed, dbo=dbo, memory_budget_bytes=budget, min_slot_us=min_slot_us, admission=admission
    )
    assert actions[-1][0] == runtime.ActionKind.DONE
    if not dbo:
        assert counters["offered"] == counters["placed"] == counters["slots"] == 0


def test_a_long_trace_agrees_and_exercises_every_dbo_path() -> None:
    totals: dict[str, float] = {}
    for seed in range(40):
        data = generate_bytes(seed, max_pp=2, max_mb=4)
        for rank in range(runtime.bytecode.decode(data).plan.pp):
            _, counters = run_both(data, rank, seed, admission=seed % 4 != 0)
            for k, v in counters.items():
                totals[k] = totals.get(k, 0) + v
    # The generated traces reach every path the counters name, so the agreement above covers them.
    for key in ("deferred", "placed", "fallbacks", "refused_memory", "refused_deadline", "slots", "slots_filled"):
        assert totals[key] > 0, key
