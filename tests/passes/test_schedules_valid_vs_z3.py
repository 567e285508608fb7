"""The verifier's schedules-valid check and the z3 schedule checker judge alike.

The verifier is the fast exact check that runs after every pass; z3 stays the
independent proof inside overlap-schedule. Over seeded edits of the golden plan's
schedule entries (starts and durations moved, copied from other entries, nudged by
less and more than the tolerance; streams swapped; entries dropped or repeated) both
accept exactly the same schedules.
"""

from __future__ import annotations

import random
from pathlib import Path

from passes.overlap_schedule import check_plan_schedules
from passes.scheduling.check import ScheduleError
from tessera_ir import Module, parse_module
from tessera_ir.model import PlanEntry
from tessera_ir.verifier import collect_errors

GOLDEN = Path(__file__).parent / "golden" / "overlap_schedule.tir"


def z3_accepts(module: Module) -> bool:
    try:
        check_plan_schedules(module)
    except ScheduleError:
        return False
    return True


def verifier_accepts(module: Module) -> bool:
    return collect_errors(module, ["schedules-valid"]) == []


def edit(rng: random.Random, module: Module) -> None:
    sched = module.plan_ops("pair_schedule")[0]
    entries = sched.entries
    entry = rng.choice(entries)
    kind = rng.choice(["start", "start", "duration", "nudge", "stream", "drop", "repeat"])
    if kind == "start":
        entry.attrs["start"] = rng.choice([0.0, rng.choice(entries).attrs["start"], rng.uniform(0, 250)])
    elif kind == "duration":
        entry.attrs["duration"] = rng.choice([0.0, entry.attrs["duration"] * 2, entry.attrs["duration"] + 1e-7])  # type: ignore[operator]
    elif kind == "nudge":  # just inside and just outside the tolerance, never below zero
        delta = rng.choice([-1.5e-6, -0.5e-6, 0.5e-6, 1.5e-6])
        entry.attrs["start"] = max(0.0, entry.attrs["start"] + delta)  # type: ignore[operator]
    elif kind == "stream":
        entry.attrs["stream"] = "comm" if entry.attrs["stream"] == "compute" else "compute"
    elif kind == "drop":
        entries.remove(entry)
    else:
        entries.append(PlanEntry(entry.ref, dict(entry.attrs)))


def test_the_golden_schedule_is_valid_for_both() -> None:
    module = parse_module(GOLDEN.read_text())
    assert verifier_accepts(module) and z3_accepts(module)


def test_verifier_and_z3_agree_on_edited_schedules() -> None:
    text = GOLDEN.read_text()
    rng = random.Random(10)
    verdicts = {True: 0, False: 0}
    for k in range(150):
        module = parse_module(text)
        for _ in range(rng.choice([1, 1, 2])):
            edit(rng, module)
        verdict = z3_accepts(module)
        assert verifier_accepts(module) == verdict, (k, collect_errors(module, ["schedules-valid"]))
        verdicts[verdict] += 1
    assert min(verdicts.values()) >= 10, verdicts  # both verdicts are exercised
