"""The z3 schedule checker: valid schedules pass, each broken constraint is named with its tasks."""

from __future__ import annotations

import dataclasses
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from passes.manager import PassManager, parse_pipeline
from passes.overlap_schedule import check_plan_schedules
from passes.scheduling.check import ScheduleEntry, ScheduleError, check_pair_schedule, check_schedule, entries_of
from passes.scheduling.gap_fit import gap_fit
from passes.scheduling.pair_dag import BWD, FWD, PairDAG, PairTask
from passes.scheduling.schedule import PairSchedule
from tessera_ir.kinds import Resource
from tessera_ir.model import PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

C, M = Resource.COMPUTE, Resource.COMM


def small_dag() -> PairDAG:
    """fwd: a(c,2) -> b(m,3) -> c(c,2); bwd: d(m,2) -> e(c,4) -> w(c,1, movable, deadline 9)."""
    return PairDAG(
        "small",
        [
            PairTask("a", "x.fwd", C, 2.0, (), FWD, "l0"),
            PairTask("b", "dispatch.fwd", M, 3.0, (0,), FWD, "l0"),
            PairTask("c", "x.fwd", C, 2.0, (1,), FWD, "l0"),
            PairTask("d", "combine.dgrad", M, 2.0, (), BWD, "l1"),
            PairTask("e", "x.dgrad", C, 4.0, (3,), BWD, "l1"),
            PairTask("w", "x.wgrad", C, 1.0, (4,), BWD, "l1", movable=True, deadline=9.0),
        ],
    )


# A valid schedule by hand. compute: a [0,2], e [2,6], c [6,8], w [8,9]; comm: d [0,2], b [2,5].
VALID = {"a": 0.0, "b": 2.0, "c": 6.0, "d": 0.0, "e": 2.0, "w": 8.0}


def entries(starts: dict[str, float], dag: PairDAG | None = None) -> list[ScheduleEntry]:
    dag = dag or small_dag()
    return [ScheduleEntry(t.name, starts[t.name], t.duration, t.resource.value) for t in dag.tasks if t.name in starts]


def expect(ents: list[ScheduleEntry], constraint: str, tasks: list[str]) -> ScheduleError:
    with pytest.raises(ScheduleError) as info:
        check_schedule(small_dag(), ents, where="pair_schedule @sched.0")
    err = info.value
    assert err.constraint == constraint, str(err)
    assert sorted(err.tasks) == sorted(tasks), str(err)
    text = str(err)
    assert f"violates {constraint}" in text and "pair_schedule @sched.0" in text
    for t in tasks:
        assert t in text
    return err


def test_valid_schedule_passes() -> None:
    check_schedule(small_dag(), entries(VALID))


def test_dependency_violation_names_both_tasks() -> None:
    # d moves to [1,3] (b after it on comm), but e still starts at 2, before d finishes.
    bad = dict(VALID, d=1.0, b=3.0)
    err = expect(entries(bad), "dependency", ["d", "e"])
    assert "'e' starts at 2.0 us before 'd' finishes at 3.0 us" in str(err)


def test_overlap_on_a_stream_is_exclusive_violation() -> None:
    bad = dict(VALID, c=5.0)  # c [5,7] overlaps e [2,6] on compute
    expect(entries(bad), "exclusive", ["e", "c"])


def test_wrong_duration_is_rejected() -> None:
    ents = [dataclasses.replace(e, duration=1.0) if e.task == "e" else e for e in entries(VALID)]
    expect(ents, "duration", ["e"])


def test_wrong_stream_is_rejected() -> None:
    ents = [dataclasses.replace(e, stream="comm") if e.task == "a" else e for e in entries(VALID)]
    expect(ents, "stream", ["a"])


def test_missing_task_is_placed_once_violation() -> None:
    ents = [e for e in entries(VALID) if e.task != "w"]
    err = expect(ents, "placed-once", ["w"])
    assert "0 entries" in str(err)


def test_duplicate_task_is_placed_once_violation() -> None:
    ents = entries(VALID) + [ScheduleEntry("a", 20.0, 2.0, "compute")]
    err = expect(ents, "placed-once", ["a"])
    assert "2 entries" in str(err)


def test_unknown_task_is_placed_once_violation() -> None:
    ents = entries(VALID) + [ScheduleEntry("ghost", 20.0, 2.0, "compute")]
    expect(ents, "placed-once", ["ghost"])


def test_late_movable_task_is_deadline_violation() -> None:
    bad = dict(VALID, w=9.5)  # w finishes at 10.5 > deadline 9
    err = expect(entries(bad), "deadline", ["w"])
    assert "deadline 9.0" in str(err)


def test_negative_start_is_rejected() -> None:
    bad = dict(VALID, d=-2.0)
    expect(entries(bad), "non-negative", ["d"])


def test_float_rounding_is_tolerated() -> None:
    # Starts computed as float sums may exceed the exact sum by an ulp; that is no violation.
    dag = PairDAG(
        "ulp",
        [
            PairTask("p", "x.fwd", C, 0.1, (), FWD, "l0"),
            PairTask("q", "x.fwd", C, 0.2, (0,), FWD, "l0"),
            PairTask("r", "x.fwd", C, 0.3, (1,), FWD, "l0"),
        ],
    )
    check_schedule(dag, [ScheduleEntry("p", 0.0, 0.1, "compute"), ScheduleEntry("q", 0.1, 0.2, "compute"),
                         ScheduleEntry("r", 0.1 + 0.2, 0.3, "compute")])


def test_heuristic_schedule_of_a_large_pair_checks_quickly() -> None:
    # Linear encoding: a 4+4-layer pair (100+ tasks) is checked constraint by neighbour.
    module = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=ParallelConfig(ep=8))
    layers = module.decoder_layers()
    from passes.costs.durations import task_duration_us
    from passes.costs.hardware import load_hardware
    from passes.scheduling.pair_dag import build_pair_dag

    hw = load_hardware("h100")
    dag = build_pair_dag(layers[:4], layers[4:], lambda t: task_duration_us(t, hw, ParallelConfig(ep=8)), "big")
    sched = gap_fit(dag)
    check_pair_schedule(sched)
    # Swap two compute tasks' start times: now they break something, and the checker says so.
    order = sched.stream_order(Resource.COMPUTE)
    start = list(sched.start)
    i, j = order[3], order[4]
    start[i], start[j] = start[j], start[i]
    with pytest.raises(ScheduleError):
        check_schedule(dag, entries_of(PairSchedule(dag, start, "edited")))


def test_edited_ir_schedule_is_rejected() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN[:2], parallel=ParallelConfig(ep=8))
    module.plan.append(PlanOp("pair", "pair.0", {"fwd": [SymbolRef("l0")], "bwd": [SymbolRef("l1")]}))
    PassManager(parse_pipeline("overlap-schedule")).run(module)
    assert check_plan_schedules(module) == 1
    sched = module.plan_ops("pair_schedule")[0]
    entry = next(e for e in sched.entries if e.ref == "l0.expert_gemm.fwd")
    entry.attrs["start"] = 0.0  # before its dispatch
    with pytest.raises(ScheduleError) as info:
        check_plan_schedules(module)
    assert "l0.expert_gemm.fwd" in info.value.tasks
    assert info.value.constraint in ("dependency", "exclusive")


@pytest.mark.parametrize(
    "value", [0.0, 1.0, -2.0, 0.1, 1e-6, -1e-9, 12345.678901, 2.0**-40, 3.0e12, 5e-324, -(2.0**60) + 0.5]
)
def test_smt_literals_are_the_floats_exact_values(value: float) -> None:
    # Times reach z3 as SMT-LIB2 text; the literal must be the float's exact binary value.
    from fractions import Fraction

    import z3

    from passes.scheduling.check import _real

    parsed = z3.simplify(z3.parse_smt2_string(f"(declare-fun x () Real) (assert (= x {_real(Fraction(value))}))")[0].arg(1))
    assert z3.is_rational_value(parsed)
    assert Fraction(parsed.as_fraction()) == Fraction(value)


def big_schedule() -> tuple[PairDAG, PairSchedule]:
    module = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=ParallelConfig(ep=8))
    layers = module.decoder_layers()
    from passes.costs.durations import task_duration_us
    from passes.costs.hardware import load_hardware
    from passes.scheduling.pair_dag import build_pair_dag

    hw = load_hardware("h100")
    dag = build_pair_dag(layers[:4], layers[4:], lambda t: task_duration_us(t, hw, ParallelConfig(ep=8)), "big")
    due = {i: 0.9 * dag.serial_time() for i, t in enumerate(dag.tasks) if t.movable}
    dag = PairDAG(dag.name, [dataclasses.replace(t, deadline=due.get(i)) for i, t in enumerate(dag.tasks)])
    return dag, gap_fit(dag)


def test_each_corruption_of_a_large_schedule_names_its_constraint() -> None:
    # The SMT-LIB encoding of a 100+-task pair: every kind of damage is reported as that
    # constraint, with the task(s) it concerns.
    dag, sched = big_schedule()
    good = entries_of(sched)
    check_schedule(dag, good)
    by_name = {e.task: k for k, e in enumerate(good)}
    compute = sched.stream_order(Resource.COMPUTE)
    first = dag.tasks[compute[0]].name
    # A task with a predecessor on the other stream, moved to start before that predecessor ends.
    j = next(j for j, t in enumerate(dag.tasks) if t.deps and dag.tasks[t.deps[0]].resource is not t.resource)
    pred, late = dag.tasks[dag.tasks[j].deps[0]].name, dag.tasks[j].name
    movable = next(i for i, t in enumerate(dag.tasks) if t.movable)

    def edit(name: str, **changes: object) -> list[ScheduleEntry]:
        out = list(good)
        out[by_name[name]] = dataclasses.replace(out[by_name[name]], **changes)  # type: ignore[arg-type]
        return out

    cases = [
        (edit(first, stream="comm"), "stream", {first}),
        (edit(first, duration=good[by_name[first]].duration + 1.0), "duration", {first}),
        (edit(first, start=-1.0), "non-negative", {first}),
        ([e for e in good if e.task != first], "placed-once", {first}),
        (good + [good[by_name[first]]], "placed-once", {first}),
        (edit(dag.tasks[movable].name, start=dag.serial_time()), "deadline", {dag.tasks[movable].name}),
    ]
    for ents, constraint, tasks in cases:
        with pytest.raises(ScheduleError) as info:
            check_schedule(dag, ents, where="pair_schedule @sched.3")
        assert info.value.constraint == constraint, str(info.value)
        assert set(info.value.tasks) == tasks, str(info.value)
        assert "pair_schedule @sched.3" in str(info.value) and f"violates {constraint}" in str(info.value)
    # Starting a task while its predecessor still runs breaks that dependency (and possibly
    # exclusivity on its stream, which sorts after it).
    with pytest.raises(ScheduleError) as info:
        check_schedule(dag, edit(late, start=good[by_name[pred]].start))
    assert info.value.constraint == "dependency" and pred in info.value.tasks and late in info.value.tasks
    # Two neighbours on a stream made to overlap.
    a, b = compute[5], compute[6]
    with pytest.raises(ScheduleError) as info:
        check_schedule(dag, edit(dag.tasks[b].name, start=good[a].start + 0.5 * dag.tasks[a].duration))
    assert info.value.constraint in ("dependency", "exclusive") and dag.tasks[b].name in info.value.tasks


def test_background_proofs_answer_in_order_whoever_proves_them() -> None:
    """The forked process and the waiting caller take schedules from one counter; the answers come
    back in the schedules' order, a refuted one as False (the caller then explains it)."""
    from passes.scheduling.batch import BackgroundProofs

    dag = small_dag()
    order = [t.name for t in dag.tasks]
    valid = PairSchedule(dag, [VALID[n] for n in order], "manual")
    broken = PairSchedule(dag, [dict(VALID, c=5.0)[n] for n in order], "manual")  # c overlaps e
    schedules = [valid] * 40 + [broken] + [valid] * 40 + [broken]
    proofs = BackgroundProofs(schedules)
    assert proofs.wait() == [True] * 40 + [False] + [True] * 40 + [False]


def test_background_proofs_keep_each_proven_schedule_once_and_no_refuted_one(tmp_path: Path) -> None:
    """``keep`` runs for every proven schedule, in whichever process proved it, and never for a
    refuted one; what it did not keep (it returned False or raised) is not reported kept."""
    from passes.scheduling.batch import BackgroundProofs

    dag = small_dag()
    order = [t.name for t in dag.tasks]
    valid = PairSchedule(dag, [VALID[n] for n in order], "manual")
    broken = PairSchedule(dag, [dict(VALID, c=5.0)[n] for n in order], "manual")
    schedules = [valid] * 30 + [broken] + [valid] * 30

    def keep(k: int) -> bool:
        if k == 7:
            return False
        if k == 8:
            raise OSError("disk full")
        (tmp_path / str(k)).touch()
        return True

    proofs = BackgroundProofs(schedules, keep)
    assert proofs.wait() == [True] * 30 + [False] + [True] * 30
    expected = [k not in (7, 8, 30) for k in range(len(schedules))]
    assert proofs.kept() == expected
    assert sorted(int(p.name) for p in tmp_path.iterdir()) == [k for k, was in enumerate(expected) if was]


def test_background_proofs_cancelled_leave_no_process() -> None:
    from passes.scheduling.batch import BackgroundProofs

    dag = small_dag()
    schedules = [PairSchedule(dag, [VALID[t.name] for t in dag.tasks], "manual")] * 200
    proofs = BackgroundProofs(schedules)
    proofs.cancel()
    assert not proofs._process.is_alive()


def test_z3_alone_decides_a_duration_unless_it_is_stated_exactly() -> None:
    """The proof writes an entry's duration into the script only when it differs from its task's;
    z3 then accepts it within the tolerance and refutes it beyond, naming the constraint."""
    from passes.scheduling.check import _prove, proof_script

    dag = small_dag()
    exact = {i: e for i, e in enumerate(entries(VALID))}
    count = [1] * len(dag.tasks)
    assert "(<= (- d" not in proof_script(dag, exact, count).plain()
    _prove(dag, exact, count, "", "")
    e = dag.tasks.index(next(t for t in dag.tasks if t.name == "e"))
    close = dict(exact)
    close[e] = dataclasses.replace(exact[e], duration=4.0 + 2.0**-30)  # within 1e-6 us
    assert f"(<= (- d{e} " in proof_script(dag, close, count).plain()
    _prove(dag, close, count, "", "")
    # Shorter by 1e-3 us: e then ends earlier, so only the duration fact breaks, and z3 (no
    # Python check before it here) names it.
    far = dict(exact)
    far[e] = dataclasses.replace(exact[e], duration=4.0 - 1e-3)
    with pytest.raises(ScheduleError) as info:
        _prove(dag, far, count, "", "")
    assert info.value.constraint == "duration" and info.value.tasks == ["e"]


ENGINES = pytest.mark.parametrize("through_text", [False, True], ids=["c-api", "smt-lib-text"])


@ENGINES
def test_prove_all_decides_a_batch_as_each_schedule_alone(through_text: bool) -> None:
    """One z3 problem for many schedules: sat exactly when every schedule is valid. The same DAG
    twice in a batch keeps its constants apart (a clash would be a z3 error, read as unproven)."""
    from functools import partial

    from passes.scheduling import check

    prove_all = partial(check.prove_all, through_text=through_text)

    dag = small_dag()
    order = [t.name for t in dag.tasks]
    valid = PairSchedule(dag, [VALID[n] for n in order], "manual")
    later = PairSchedule(dag, [dict(VALID, b=2.5)[n] for n in order], "manual")  # b starts later, still before c
    broken = PairSchedule(dag, [dict(VALID, c=5.0)[n] for n in order], "manual")  # c overlaps e
    late = PairSchedule(dag, [dict(VALID, w=8.5)[n] for n in order], "manual")  # w ends at 9.5, past 9
    endless = PairSchedule(dag, [dict(VALID, w=float("inf"))[n] for n in order], "manual")
    assert prove_all([valid, later, valid])
    assert prove_all([])
    for bad in (broken, late, endless):
        assert not prove_all([valid, bad, later])
        assert not prove_all([bad])


def test_overlap_schedule_proves_in_batches_in_the_pass() -> None:
    """Without the background process, the new schedules' proofs run in the pass a batch at a time:
    every schedule is recorded proven, and a refuted batch is proven schedule by schedule, raising
    at the schedule z3 refutes."""
    from unittest import mock

    import passes.overlap_schedule as overlap

    pipeline = "candidates,overlap-schedule{cache=false,jobs=1}"
    parallel = ParallelConfig(pp=2, vpp=2, ep=4, microbatches=8)
    module = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=parallel)
    proofs: list[int] = []
    real_prove_all = overlap.prove_all
    def counting(batch: list) -> bool:
        proofs.append(len(batch))
        return real_prove_all(batch)

    with mock.patch.object(overlap, "prove_all", counting):
        PassManager(parse_pipeline(pipeline)).run(module)
    scheduled = [op for op in module.plan if op.op == "pair_schedule"]
    assert scheduled and proofs and max(proofs) <= overlap.PROOF_BATCH

    refuted: list[str] = []

    def prove_none(schedules: list) -> bool:
        refuted.extend(s.dag.name for s in schedules)
        return False

    proved_alone: list[str] = []
    real_check = overlap.check_schedule

    def check(dag: PairDAG, entries: list, where: str = "", prove: bool = True) -> None:
        if prove:
            proved_alone.append(dag.name)
        real_check(dag, entries, where, prove)

    module = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=parallel)
    with mock.patch.object(overlap, "prove_all", prove_none), mock.patch.object(overlap, "check_schedule", check):
        PassManager(parse_pipeline(pipeline)).run(module)
    assert len(refuted) == sum(proofs) and sorted(proved_alone) == sorted(refuted)


def two_task_dag(duration: float, deadline: float | None = None) -> PairDAG:
    """a (compute, ``duration``) -> b (comm, 1 us); b movable with ``deadline`` when given."""
    return PairDAG(
        "two",
        [
            PairTask("a", "x.fwd", C, duration, (), FWD, "l0"),
            PairTask("b", "dispatch.fwd", M, 1.0, (0,), FWD, "l0", movable=deadline is not None, deadline=deadline),
        ],
    )


NEEDS_DLOPEN = pytest.mark.skipif(sys.platform == "win32", reason="the C API prover is built only where dlopen exists")


@NEEDS_DLOPEN
def test_the_c_api_prover_is_built_and_opens_libz3() -> None:
    from passes.scheduling.check import native_prover

    assert native_prover() is not None


def test_both_ways_to_z3_agree_with_the_exact_check_at_the_tolerance_and_far_from_one() -> None:
    """Values on either side of the 1e-6 us tolerance, and values whose exact ratio needs more
    than 64 bits (a denominator of 2^72, a numerator of 3e12): the terms built through the C API,
    the SMT-LIB text and the exact Python check give the same answer on each."""
    import math

    from passes.scheduling.check import prove_all

    tol = math.nextafter(1e-6, 1.0)  # the float above 10^-6 (float(1e-6) lies below it)
    inside = 1e-6
    assert Fraction(inside) < Fraction(1, 10**6) < Fraction(tol)
    cases = [
        # (a's duration, a's start, b's start, b's deadline, valid)
        (2.0, 0.0, 2.0, None, True),
        (2.0, -inside, 2.0, None, True),  # starts before the pair by less than the tolerance
        (2.0, -tol, 2.0, None, False),  # by just more (both denominators are 2^72)
        (2.0, 0.0, 2.0 - 2.0**-21, None, True),  # b starts 4.8e-7 us before a ends
        (2.0, 0.0, 2.0 - 2.0**-19, None, False),  # 1.9e-6 us before
        (3.0e12, 0.0, 3.0e12, None, True),  # 3e12 = 732421875 * 2^12
        # At 3e12 us the tolerance is 2^8 ulps (0.125 us): one ulp (4.9e-4 us) early is the
        # rounding of a sum, a microsecond early is not.
        (3.0e12, 0.0, math.nextafter(3.0e12, 0.0), None, True),
        (3.0e12, 0.0, 3.0e12 - 1.0, None, False),
        (1.0, 3.0e12, 3.0e12 + 1.0, None, True),
        (2.0**-70, 0.0, 2.0**-70, None, True),
        (2.0, 0.0, 2.0, 3.0, True),  # b ends at its deadline
        (2.0, 0.0, 2.0 + 2 * tol, 3.0, False),  # b ends 2e-6 us after its deadline
        (2.0, 0.0, 2.0 + 2.0**-21, 3.0, True),  # 4.8e-7 us after, within the tolerance
        (2.0, -(2.0**60) + 0.5, 2.0, None, False),
    ]
    for duration, start_a, start_b, deadline, valid in cases:
        dag = two_task_dag(duration, deadline)
        sched = PairSchedule(dag, [start_a, start_b], "manual")
        where = (duration, start_a, start_b, deadline)
        assert prove_all([sched]) is valid, where
        assert prove_all([sched], through_text=True) is valid, where
        if valid:
            check_schedule(dag, entries_of(sched))
        else:
            with pytest.raises(ScheduleError):
                check_schedule(dag, entries_of(sched))


def test_the_tolerance_scales_with_the_schedule_past_a_picosecond_of_rounding() -> None:
    """A schedule 5.8e10 us long (a vocabulary of 10^12 makes one): a task that starts where the
    float sum of its predecessor's start and duration rounds to, which is below the exact sum by
    more than 1e-6 us, is valid for every checker; one that starts a microsecond early is not."""
    import math

    from passes.scheduling.check import prove_all
    from tessera_ir.schedule_rules import schedule_tolerance

    start_a, duration = 58249544229.86616, 1.0 + 3 * 2.0**-20  # 3/8 of an ulp of start_a past 1 us
    start_b = start_a + duration  # rounded down: 2.9e-6 us below the exact sum
    assert Fraction(start_a) + Fraction(duration) - Fraction(start_b) > Fraction(1, 10**6)
    tolerance = schedule_tolerance([start_a, start_b], [duration, 1.0])
    assert tolerance == Fraction(math.ulp(start_a)) * 256 and float(tolerance) < 1e-2
    assert schedule_tolerance([2.0, 1e6], [None]) == Fraction(1, 10**6)  # under ~34 s: a picosecond
    for start, valid in ((start_b, True), (start_b - 1.0, False)):
        dag = PairDAG(
            "long",
            [PairTask("a", "x.fwd", C, duration, (), FWD, "l0"), PairTask("b", "dispatch.fwd", M, 1.0, (0,), FWD, "l0")],
        )
        sched = PairSchedule(dag, [start_a, start], "manual")
        assert prove_all([sched]) is valid
        assert prove_all([sched], through_text=True) is valid
        if valid:
            check_schedule(dag, entries_of(sched))
        else:
            with pytest.raises(ScheduleError, match="violates dependency"):
                check_schedule(dag, entries_of(sched))


def test_both_ways_to_z3_agree_on_every_small_shift_of_a_large_schedule() -> None:
    """Each of forty tasks of a 100+-task schedule moved by less than the tolerance, by more, and
    far: the C API and the text answer alike on each, and both kinds of answer occur."""
    import random

    from passes.scheduling.check import prove_all

    dag, sched = big_schedule()
    answers = []
    for k in random.Random(0).sample(range(len(dag.tasks)), 40):
        for delta in (-5e-7, -2e-6, -1.0, 0.5):
            moved = PairSchedule(dag, [x + delta if i == k else x for i, x in enumerate(sched.start)], "manual")
            by_terms, by_text = prove_all([moved]), prove_all([moved], through_text=True)
            assert by_terms == by_text, (dag.tasks[k].name, delta)
            answers.append(by_terms)
    assert True in answers and False in answers
    assert prove_all([sched] * 20) and prove_all([sched] * 20, through_text=True)


def test_a_broken_well_formed_schedule_is_named_after_the_c_api_refutes_it() -> None:
    """The C API answers only sat or not; what broke comes from the named script after it."""
    from passes.scheduling.check import _prove

    dag = small_dag()
    broken = {i: e for i, e in enumerate(entries(dict(VALID, c=5.0)))}  # c overlaps e, starts before b ends
    with pytest.raises(ScheduleError) as info:
        _prove(dag, broken, [1] * len(dag.tasks), "", "")
    assert info.value.constraint in ("dependency", "exclusive") and "c" in info.value.tasks


def test_without_the_c_api_the_scripts_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    from passes.scheduling import check

    monkeypatch.setattr(check, "native_prover", lambda: None)
    dag = small_dag()
    order = [t.name for t in dag.tasks]
    valid = PairSchedule(dag, [VALID[n] for n in order], "manual")
    broken = PairSchedule(dag, [dict(VALID, c=5.0)[n] for n in order], "manual")
    assert check.prove_all([valid, valid]) and not check.prove_all([valid, broken])
    check._prove(dag, dict(enumerate(entries(VALID))), [1] * len(dag.tasks), "", "")
    with pytest.raises(ScheduleError):
        check._prove(dag, dict(enumerate(entries(dict(VALID, c=5.0)))), [1] * len(dag.tasks), "", "")


def test_a_forked_process_proves_in_a_z3_context_of_its_own() -> None:
    """The parent's context (kept between proofs) is never used across a fork: after the parent
    proved, the background process proves and refutes as the parent does."""
    from passes.scheduling.batch import BackgroundProofs
    from passes.scheduling.check import prove_all

    dag = small_dag()
    order = [t.name for t in dag.tasks]
    valid = PairSchedule(dag, [VALID[n] for n in order], "manual")
    broken = PairSchedule(dag, [dict(VALID, c=5.0)[n] for n in order], "manual")
    assert prove_all([valid]) and not prove_all([broken])
    schedules = [valid] * 300 + [broken] + [valid] * 300  # past the context's recycling, both sides
    assert BackgroundProofs(schedules).wait() == [True] * 300 + [False] + [True] * 300
    assert prove_all([valid] * 20)


@NEEDS_DLOPEN
def test_the_c_api_extension_without_libz3_proves_nothing() -> None:
    """A library that cannot be opened loads nothing ('' instead of a version), and a proof asked
    of the extension then is an error, not an answer."""
    import subprocess

    script = (
        "from passes.scheduling import _proof\n"
        "print(repr(_proof.load('/nonexistent/libz3.so')))\n"
        "try:\n    _proof.prove([])\nexcept RuntimeError as err:\n    print('refused:', err)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["''", "refused: libz3 is not loaded: call load(path) first"]
