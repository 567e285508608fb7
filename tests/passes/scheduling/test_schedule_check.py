"""The z3 schedule checker: valid schedules pass, each broken constraint is named with its tasks."""

from __future__ import annotations

import dataclasses

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


def test_prove_all_decides_a_batch_as_each_schedule_alone() -> None:
    """One z3 problem for many schedules: sat exactly when every schedule is valid. The same DAG
    twice in a batch keeps its constants apart (a clash would be a z3 error, read as unproven)."""
    from passes.scheduling.check import prove_all

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
