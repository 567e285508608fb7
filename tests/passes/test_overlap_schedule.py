"""The overlap-schedule pass and its schedulers: gap-fit, serial, fixed-template."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from passes.costs.durations import task_duration_us
from passes.costs.hardware import load_hardware
from passes.manager import ModulePass, PassError, PassManager, parse_pipeline
from passes.overlap_schedule import OverlapSchedulePass, check_plan_schedules
from passes.plan_view import PlanView
from passes.scheduling.baselines import fixed_template, serial
from passes.scheduling.check import ScheduleError, check_pair_schedule
from passes.scheduling.gap_fit import gap_fit, strong_lower_bound
from passes.scheduling.methods import SCHEDULERS
from passes.scheduling.pair_dag import BWD, FWD, PairDAG, PairDagError, PairTask, build_pair_dag
from passes.scheduling.schedule import PairSchedule, SchedulingError
from tessera_ir.kinds import Resource
from tessera_ir.model import Module, PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig
from tessera_ir.parser import parse_module
from tessera_ir.plan_ops import PlanOpError
from tessera_ir.printer import print_module

from golden import check_golden
from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

C, M = Resource.COMPUTE, Resource.COMM


def number(value: object) -> float:
    """An IR attribute that must be a number, as a float."""
    assert isinstance(value, (int, float)) and not isinstance(value, bool), value
    return float(value)
GOLDEN = Path(__file__).parent / "golden"
KINDS = [("linear_attention", "moe"), ("attention", "moe"), ("attention", "dense"), ("mla", "moe"), ("mla", "dense")]


# --- random DAGs -----------------------------------------------------------------------------


@st.composite
def pair_dags(draw: st.DrawFn, max_tasks: int = 24) -> PairDAG:
    """Two independent sides; each task depends on some earlier tasks of its side; wgrad-like
    movable tasks hang off a task of the backward side; durations include zeros."""
    n = draw(st.integers(1, max_tasks))
    tasks: list[PairTask] = []
    side_of: list[str] = []
    for i in range(n):
        side = draw(st.sampled_from([FWD, BWD]))
        same = [j for j in range(i) if side_of[j] == side and not tasks[j].movable]
        deps = tuple(sorted(draw(st.sets(st.sampled_from(same), max_size=2)))) if same else ()
        movable = side == BWD and bool(deps) and draw(st.booleans())
        resource = C if movable else draw(st.sampled_from([C, M]))
        duration = draw(st.sampled_from([0.0, 1.0, 2.5, 3.0, 7.0, 10.0, 12.25]))
        kind = f"t{i}." + ("wgrad" if movable else ("fwd" if side == FWD else "dgrad"))
        tasks.append(PairTask(f"t{i:02d}", kind, resource, duration, deps, side, f"l{i % 3}", movable=movable))
        side_of.append(side)
    return PairDAG("random", tasks)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair_dags())
def test_gap_fit_is_always_valid_and_above_the_lower_bound(dag: PairDAG) -> None:
    sched = gap_fit(dag)
    check_pair_schedule(sched)
    assert sched.makespan >= dag.lower_bound() - 1e-9
    assert sched.makespan >= strong_lower_bound(dag) - 1e-9
    assert sched.makespan <= dag.serial_time() + 1e-9  # never worse than running everything in a row


def with_deadlines(dag: PairDAG, fraction: float) -> PairDAG:
    """The same DAG with every movable task due at ``fraction`` of the serial time."""
    due = fraction * dag.serial_time()
    return PairDAG(dag.name, [dataclasses.replace(t, deadline=due) if t.movable else t for t in dag.tasks])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pair_dags(), st.sampled_from([0.3, 0.6, 1.0]))
def test_gap_fit_meets_deadlines_or_says_it_cannot(dag: PairDAG, fraction: float) -> None:
    dated = with_deadlines(dag, fraction)
    try:
        sched = gap_fit(dated)
    except SchedulingError:
        # Running everything in a row meets a deadline of the full serial time, so
        # the heuristic must never give up on those.
        assert fraction < 1.0
        return
    check_pair_schedule(sched)  # includes each movable task's deadline


@settings(max_examples=25, deadline=None)
@given(pair_dags(max_tasks=16))
def test_gap_fit_is_deterministic(dag: PairDAG) -> None:
    assert gap_fit(dag).start == gap_fit(dag).start


@settings(max_examples=40, deadline=None)
@given(pair_dags())
def test_serial_baseline_is_valid_and_sums_durations(dag: PairDAG) -> None:
    sched = serial(dag)
    check_pair_schedule(sched)
    assert sched.makespan == pytest.approx(dag.serial_time())


@settings(max_examples=40, deadline=None)
@given(pair_dags())
def test_fixed_template_is_valid_or_refuses(dag: PairDAG) -> None:
    # Random DAGs lack the layer structure the template expects; it must say so, not
    # leave tasks unplaced.
    try:
        sched = fixed_template(dag)
    except SchedulingError as err:
        assert "fixed template" in str(err)
        return
    check_pair_schedule(sched)


# --- hand-made cases -------------------------------------------------------------------------


def test_movable_task_is_back_filled_into_a_gap() -> None:
    # Compute idles while the dispatch runs (10..20); the dgrad (5) and its wgrad (5) fill it.
    dag = PairDAG(
        "gap",
        [
            PairTask("f1", "mixer.fwd", C, 10.0, (), FWD, "l0"),
            PairTask("disp", "dispatch.fwd", M, 10.0, (0,), FWD, "l0"),
            PairTask("f2", "expert_gemm.fwd", C, 10.0, (1,), FWD, "l0"),
            PairTask("d1", "mixer.dgrad", C, 5.0, (), BWD, "l1"),
            PairTask("w1", "mixer.wgrad", C, 5.0, (3,), BWD, "l1", movable=True),
        ],
    )
    sched = gap_fit(dag)
    check_pair_schedule(sched)
    assert sched.makespan == pytest.approx(30.0)  # = compute total, the lower bound
    assert sched.finish(4) <= sched.start[2] + 1e-9  # the wgrad ran in the gap, before f2


def test_deadline_pulls_a_movable_task_forward() -> None:
    # Without a deadline the wgrad may run last; with deadline 12 it must run right after its dgrad.
    base = [
        PairTask("d", "mixer.dgrad", C, 4.0, (), BWD, "l1"),
        PairTask("w", "mixer.wgrad", C, 8.0, (0,), BWD, "l1", movable=True, deadline=12.0),
        PairTask("f1", "mixer.fwd", C, 6.0, (), FWD, "l0"),
        PairTask("f2", "mixer.fwd", C, 6.0, (2,), FWD, "l0"),
    ]
    sched = gap_fit(PairDAG("deadline", base))
    check_pair_schedule(sched)
    assert sched.finish(1) <= 12.0 + 1e-9


def test_unreachable_deadline_is_an_error() -> None:
    dag = PairDAG(
        "late",
        [
            PairTask("d", "mixer.dgrad", C, 4.0, (), BWD, "l1"),
            PairTask("w", "mixer.wgrad", C, 8.0, (0,), BWD, "l1", movable=True, deadline=5.0),
        ],
    )
    with pytest.raises(SchedulingError, match="deadline"):
        gap_fit(dag)


def test_empty_pair_has_zero_makespan() -> None:
    assert gap_fit(PairDAG("empty")).makespan == 0.0


# --- schedules of real layer structures -------------------------------------------------------


def module_dag(kinds: list[tuple[str, str]], nf: int, ep: int = 8) -> PairDAG:
    parallel = ParallelConfig(ep=ep)
    module = synthetic_module(kinds, gemm_flops=2 * 10**11, mixer_flops=3 * 10**11, a2a_bytes=10**8, parallel=parallel)
    hw = load_hardware("h100")
    layers = module.decoder_layers()
    return build_pair_dag(layers[:nf], layers[nf:], lambda t: task_duration_us(t, hw, parallel), "m")


@pytest.mark.parametrize("fwd", KINDS)
@pytest.mark.parametrize("bwd", KINDS)
def test_all_methods_valid_on_every_layer_combination(fwd: tuple[str, str], bwd: tuple[str, str]) -> None:
    dag = module_dag([fwd, bwd], 1)
    results = {}
    for method in ("gap-fit", "serial", "fixed-template"):
        sched = SCHEDULERS[method](dag)
        check_pair_schedule(sched)
        results[method] = sched.makespan
    assert results["gap-fit"] <= results["fixed-template"] + 1e-6
    assert results["fixed-template"] <= results["serial"] + 1e-6


@pytest.mark.parametrize("nf,nb", [(1, 1), (2, 1), (1, 3), (4, 2), (0, 2), (2, 0)])
def test_fixed_template_on_uneven_chunks(nf: int, nb: int) -> None:
    dag = module_dag(QWEN3_NEXT_PATTERN[: max(nf + nb, 1)] * 2, nf) if nf + nb else PairDAG("e")
    layers = synthetic_module(QWEN3_NEXT_PATTERN * 2).decoder_layers()
    dag = build_pair_dag(layers[:nf], layers[nf : nf + nb], lambda t: 1.0 + len(t.name) % 5, "uneven")
    sched = fixed_template(dag)
    check_pair_schedule(sched)


def test_fixed_template_comm_order_matches_megatron() -> None:
    dag = module_dag([("linear_attention", "moe"), ("attention", "moe")], 1)
    sched = fixed_template(dag)
    comm = [dag.tasks[i].name for i in sched.stream_order(M)]
    assert comm == ["l1.combine.dgrad", "l0.dispatch.fwd", "l1.dispatch.dgrad", "l0.combine.fwd"]
    compute = [dag.tasks[i].name for i in sched.stream_order(C)]
    # forward pre-dispatch work, then backward expert work (dgrad, then wgrad), then forward experts
    assert compute.index("l0.router.fwd") < compute.index("l1.expert_gemm.dgrad") < compute.index("l1.expert_gemm.wgrad")
    assert compute.index("l1.expert_gemm.wgrad") < compute.index("l0.expert_gemm.fwd") < compute.index("l1.attention.dgrad")


def test_gap_fit_beats_serial_on_moe_pairs() -> None:
    dag = module_dag(QWEN3_NEXT_PATTERN, 2)
    assert gap_fit(dag).makespan < 0.8 * serial(dag).makespan


# --- the pass ----------------------------------------------------------------------------------


def paired_module(pairs: list[tuple[list[str], list[str]]], **kw: object) -> Module:
    module = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(ep=8), **kw)  # type: ignore[arg-type]
    for k, (f, b) in enumerate(pairs):
        module.plan.append(PlanOp("pair", f"pair.{k}", {"fwd": [SymbolRef(x) for x in f], "bwd": [SymbolRef(x) for x in b]}))
    return module


def test_pass_schedules_every_pair_and_shares_identical_dags() -> None:
    module = paired_module([(["l0"], ["l1"]), (["l1"], ["l2"]), (["l0", "l1"], ["l3"]), (["embed", "l0"], ["l3", "head"])])
    assert OverlapSchedulePass().apply(module)
    scheds = module.plan_ops("pair_schedule")
    # l0 and l1, l1 and l2 are all linear-attention MoE layers of identical size: one schedule.
    assert len(scheds) == 3
    pairs = {op.name: op for op in module.plan_ops("pair")}
    assert pairs["pair.0"].attrs["schedule"] == pairs["pair.1"].attrs["schedule"] == SymbolRef("sched.0")
    assert scheds[0].attrs["pairs"] == [SymbolRef("pair.0"), SymbolRef("pair.1")]
    for op in pairs.values():
        assert number(op.attrs["makespan"]) >= number(op.attrs["lower_bound"]) - 1e-9
    for sched in scheds:
        assert sched.attrs["verified"] is True and sched.attrs["method"] == "gap-fit"
        assert number(sched.attrs["makespan"]) <= number(sched.attrs["serial"])
        orders: dict[object, list[int]] = {}
        for e in sched.entries:
            orders.setdefault(e.attrs["stream"], []).append(int(number(e.attrs["order"])))
        for values in orders.values():
            assert sorted(values) == list(range(len(values)))
    assert check_plan_schedules(module) == 3


def test_pass_rerun_replaces_schedules() -> None:
    module = paired_module([(["l0"], ["l1"])])
    PassManager(parse_pipeline("overlap-schedule")).run(module)
    first = print_module(module)
    PassManager(parse_pipeline("overlap-schedule")).run(module)
    assert print_module(module) == first


@pytest.mark.parametrize("method", ["serial", "fixed-template", "exact"])
def test_pass_methods(method: str) -> None:
    module = paired_module([(["l0"], ["l3"])])
    PassManager(parse_pipeline(f"overlap-schedule{{method={method}}}")).run(module)
    sched = module.plan_ops("pair_schedule")[0]
    assert sched.attrs["method"] == method
    if method == "exact":
        assert sched.attrs["status"] == "optimal"
    gap = paired_module([(["l0"], ["l3"])])
    OverlapSchedulePass().apply(gap)
    if method == "serial":
        assert sched.attrs["makespan"] == pytest.approx(sched.attrs["serial"])
    assert number(gap.plan_ops("pair_schedule")[0].attrs["makespan"]) <= number(sched.attrs["makespan"]) + 1e-6


def test_pass_uses_duration_us_when_present() -> None:
    module = paired_module([(["l0"], ["l1"])])
    for t in module.tasks():
        t.attrs["duration_us"] = 10.0
    OverlapSchedulePass().apply(module)
    sched = module.plan_ops("pair_schedule")[0]
    assert {e.attrs["duration"] for e in sched.entries} == {10.0}


def test_pass_rejects_a_corrupted_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(dag: PairDAG) -> PairSchedule:
        return PairSchedule(dag, [0.0] * len(dag.tasks), "gap-fit")  # everything at time 0

    monkeypatch.setitem(SCHEDULERS, "gap-fit", broken)
    with pytest.raises(ScheduleError, match="violates"):
        OverlapSchedulePass(cache=False).apply(paired_module([(["l0"], ["l1"])]))
    # verify=false writes it anyway and says so
    module = paired_module([(["l0"], ["l1"])])
    OverlapSchedulePass(verify=False, cache=False).apply(module)
    assert module.plan_ops("pair_schedule")[0].attrs["verified"] is False


def test_pass_errors_name_the_pair() -> None:
    module = paired_module([(["l0"], ["nope"])])
    # Refused by the pair's declaration (tessera_ir/plan_ops.py), with the verifier's message.
    with pytest.raises(PlanOpError, match="plan pair '@pair.0' has 'bwd' naming '@nope', which names nothing; it must name a layer"):
        OverlapSchedulePass().apply(module)
    with pytest.raises(PassError, match="option 'method' of pass 'overlap-schedule' is 'magic'; it takes gap-fit|serial"):
        OverlapSchedulePass(method="magic")  # type: ignore[arg-type]


def test_plan_view_rebuilds_the_schedule_from_the_ir() -> None:
    module = paired_module([(["l0", "l1"], ["l2", "l3"])])
    OverlapSchedulePass().apply(module)
    sched = PlanView(module).schedule("pair.0")
    check_pair_schedule(sched)
    assert sched.makespan == pytest.approx(module.plan_ops("pair")[0].attrs["makespan"])


# --- golden IR -----------------------------------------------------------------------------------


def golden_module() -> Module:
    """Two Qwen3-Next layers with round measured costs, so the schedule prints exactly."""
    module = synthetic_module(QWEN3_NEXT_PATTERN[2:], parallel=ParallelConfig(ep=8), name="golden")
    costs = {"linear_attention": 30.0, "attention": 25.0, "router": 2.0, "dispatch": 20.0, "expert_gemm": 24.0,
             "combine": 20.0, "shared_expert": 6.0, "embedding": 1.0, "lm_head": 12.0}
    for t in module.tasks():
        t.attrs["duration_us"] = costs[t.op.value] * (1.5 if t.phase.value == "dgrad" else 1.0)
    module.plan.append(PlanOp("pair", "pair.0", {"fwd": [SymbolRef("l0")], "bwd": [SymbolRef("l1")]}))
    return module


def test_golden_scheduled_pair() -> None:
    module = golden_module()
    PassManager(parse_pipeline("overlap-schedule")).run(module)
    check_golden(GOLDEN / "overlap_schedule.tir", print_module(module))


def test_golden_round_trips_through_the_parser() -> None:
    text = (GOLDEN / "overlap_schedule.tir").read_text()
    module = parse_module(text)
    assert print_module(module) == text
    assert check_plan_schedules(module) == 1
    sched = PlanView(module).schedule("sched.0")
    check_pair_schedule(sched)


# --- speed-ups that must not change results --------------------------------------------------


def sweep_reference(tasks: list) -> list[int] | None:
    """The sweep order spelled out literally: pass over the unplaced tasks in list order,
    placing each whose in-list dependencies are placed, until none is left (None: stuck)."""
    names = {t.name for t in tasks}
    done: set[str] = set()
    pending = list(range(len(tasks)))
    out: list[int] = []
    while pending:
        placed_any = False
        for k in list(pending):
            if all(d in done or d not in names for d in tasks[k].deps):
                out.append(k)
                done.add(tasks[k].name)
                pending.remove(k)
                placed_any = True
        if not placed_any:
            return None
    return out


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_sweep_order_matches_literal_sweeps(data: st.DataObject) -> None:
    from passes.scheduling.pair_dag import _sweep_order
    from tessera_ir.kinds import Phase, TaskOp
    from tessera_ir.model import Task

    n = data.draw(st.integers(0, 14))
    perm = data.draw(st.permutations(range(n)))  # list order; dependencies follow a hidden order
    cyclic = n > 1 and data.draw(st.booleans())
    tasks = []
    for pos in range(n):
        rank = perm[pos]
        earlier = [f"t{perm[q]}" for q in range(n) if perm[q] < rank]
        deps = data.draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        if cyclic and rank == 0:
            deps = [f"t{n - 1}"]  # the first task waits for the last one: a cycle
        deps.append("outside")  # dependencies outside the list are ready inputs
        tasks.append(Task(f"t{rank}", TaskOp.ROUTER, Phase.FWD, Resource.COMPUTE, deps=deps))
    assert _sweep_order(tasks) == sweep_reference(tasks)


def test_dependency_cycle_is_still_reported() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN[:2], parallel=ParallelConfig(ep=8))
    layer = module.decoder_layers()[0]
    fwd = [t for t in layer.tasks if t.phase.value == "fwd"]
    fwd[0].deps = [fwd[-1].name]
    hw = load_hardware("h100")
    with pytest.raises(PairDagError, match="dependency cycle among tasks .* of pair 'p'"):
        build_pair_dag([layer], [], lambda t: task_duration_us(t, hw, ParallelConfig(ep=8)), "p")


def test_fixed_template_runs_leftover_layers_in_dependency_order() -> None:
    # A forward-only pair whose first-listed layer waits for a task of the second one:
    # the leftover layers (no backward partner) must still respect that dependency.
    dag = PairDAG(
        "odd",
        [
            PairTask("a0", "x.fwd", C, 2.0, (), FWD, "la"),
            PairTask("b0", "y.fwd", M, 1.0, (), FWD, "lb"),
            PairTask("a1", "z.fwd", C, 1.0, (1,), FWD, "la"),  # layer la waits for layer lb
        ],
    )
    sched = fixed_template(dag)
    check_pair_schedule(sched)
    assert sched.start[2] >= sched.finish(1)


def many_pairs_module() -> Module:
    pairs = [([f"l{i}"], [f"l{j}"]) for i in range(4) for j in range(4)]
    pairs += [(["l0", "l1"], ["l2", "l3"]), (["embed", "l0"], ["l3", "head"]), ([], ["l1", "l2"]), (["l2"], [])]
    return paired_module(pairs)


def test_worker_processes_give_identical_results(monkeypatch: pytest.MonkeyPatch) -> None:
    import passes.scheduling.batch as batch

    monkeypatch.setattr(batch, "MIN_DAGS_PER_WORKER", 1)
    alone, spread = many_pairs_module(), many_pairs_module()
    OverlapSchedulePass(jobs=1, cache=False).apply(alone)
    OverlapSchedulePass(jobs=2, cache=False).apply(spread)
    assert len(alone.plan_ops("pair_schedule")) >= 4
    assert print_module(spread) == print_module(alone)
    with pytest.raises(PassError, match="jobs must be"):
        OverlapSchedulePass(jobs=-1)


def test_worker_processes_report_a_corrupted_schedule_like_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    import passes.scheduling.batch as batch

    def broken(dag: PairDAG) -> PairSchedule:
        return PairSchedule(dag, [0.0] * len(dag.tasks), "gap-fit")

    monkeypatch.setattr(batch, "MIN_DAGS_PER_WORKER", 1)
    monkeypatch.setitem(SCHEDULERS, "gap-fit", broken)
    messages = []
    for jobs in (1, 2):
        with pytest.raises(ScheduleError) as info:
            OverlapSchedulePass(jobs=jobs, cache=False).apply(many_pairs_module())
        messages.append(str(info.value))
    assert messages[0] == messages[1] and "pair_schedule @sched.0" in messages[0]


def test_grouping_by_side_signatures_is_grouping_by_dag_signature() -> None:
    from passes.plan_view import side_signature

    module = many_pairs_module()
    OverlapSchedulePass().apply(module)
    by_signature: dict = {}
    for pair in PlanView(module).pairs:
        dag = build_pair_dag(pair.fwd_layers, pair.bwd_layers, PlanView(module).duration)
        by_signature.setdefault(side_signature(dag.tasks), []).append(pair.name)
    groups = [[ref.name for ref in s.attrs["pairs"] if isinstance(ref, SymbolRef)] for s in module.plan_ops("pair_schedule")]  # type: ignore[union-attr]
    assert groups == list(by_signature.values())


def test_ir_deadlines_bind_in_the_pass_and_the_exact_solver() -> None:
    from passes.scheduling.exact import exact
    from passes.scheduling.schedule import heads

    free = paired_module([(["l0", "l1"], ["l2", "l3"])])
    OverlapSchedulePass(cache=False).apply(free)
    view = PlanView(free)
    dag = view.pair_dag(view.pair("pair.0"))
    entries = {e.ref: e.attrs for e in free.plan_ops("pair_schedule")[0].entries}
    movable = [i for i, t in enumerate(dag.tasks) if t.movable]
    last = max(movable, key=lambda i: float(entries[dag.tasks[i].name]["start"]))  # type: ignore[arg-type]
    finish = float(entries[dag.tasks[last].name]["start"]) + dag.tasks[last].duration  # type: ignore[arg-type]
    earliest = heads(dag)[last] + dag.tasks[last].duration
    assert earliest < finish  # without a deadline it runs later than it could
    deadline = earliest + (finish - earliest) / 4

    bound = paired_module([(["l0", "l1"], ["l2", "l3"])])
    bound.task_map()[dag.tasks[last].name].attrs["deadline"] = deadline
    OverlapSchedulePass(cache=False).apply(bound)
    got = {e.ref: e.attrs for e in bound.plan_ops("pair_schedule")[0].entries}
    assert float(got[dag.tasks[last].name]["start"]) + dag.tasks[last].duration <= deadline + 1e-6  # type: ignore[arg-type]
    view = PlanView(bound)
    tight = view.pair_dag(view.pair("pair.0"))
    assert tight.tasks[last].deadline == deadline
    optimum = exact(tight, time_limit_s=5)
    check_pair_schedule(optimum)
    assert optimum.finish(last) <= deadline + 1e-6


def test_proofs_left_running_are_waited_for_after_the_last_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    # With workers, z3 proves the new schedules in a process of its own while later passes run;
    # a schedule it refutes fails the pipeline at the end, named like a proof done in the pass.
    import passes.scheduling.batch as batch
    import passes.scheduling.check as check

    monkeypatch.setattr(batch, "MIN_DAGS_PER_WORKER", 1)
    # Batches of two, and the later pass held until the background process has taken its first
    # one: otherwise the main process may reach its wait first and take every batch itself.
    monkeypatch.setattr(batch, "PROOF_BATCH", 2)
    child_took = multiprocessing.get_context("fork").Event()
    main_pid, real_take = os.getpid(), batch._take

    def take(next_index, count: int) -> range:  # type: ignore[no-untyped-def]
        taken = real_take(next_index, count)
        if taken and os.getpid() != main_pid:
            child_took.set()
        return taken

    monkeypatch.setattr(batch, "_take", take)
    monkeypatch.setattr(LaterPass, "background_started", child_took)
    planned = many_pairs_module()
    OverlapSchedulePass(jobs=1, cache=False).apply(planned)
    refuted = planned.plan_ops("pair_schedule")[2]
    first_pair = refuted.attrs["pairs"][0].name  # type: ignore[index,union-attr]
    proven: list[str] = []  # lone proofs in this process
    batched: list[str] = []  # schedules this process proved a batch at a time
    real_prove, real_prove_all = check._prove, batch.prove_all

    def refuting(dag: PairDAG, entry_of, count, prefix: str, fix: str) -> None:  # type: ignore[no-untyped-def]
        proven.append(dag.name)
        if dag.name == first_pair:
            raise ScheduleError(f"{prefix}schedule of pair '{dag.name}' violates exclusive for a, b: made up; {fix}")
        real_prove(dag, entry_of, count, prefix, fix)

    def refuting_all(schedules: list) -> bool:  # type: ignore[type-arg]
        batched.extend(s.dag.name for s in schedules)
        return first_pair not in {s.dag.name for s in schedules} and real_prove_all(schedules)

    monkeypatch.setattr(check, "_prove", refuting)
    monkeypatch.setattr(batch, "prove_all", refuting_all)
    manager = PassManager(parse_pipeline("overlap-schedule{jobs=2 cache=false},test-later"), verify_each=False)
    with pytest.raises(PassError) as info:
        manager.run(many_pairs_module())
    message = str(info.value)
    assert message.startswith("pass 'overlap-schedule{cache=false jobs=2}' failed")
    assert f"pair_schedule @{refuted.name}" in message and "violates exclusive" in message
    # The main process proved, while waiting, the batches the child had not taken yet (each once:
    # both take from one counter), then proved the refuted one again on its own to name the violation.
    assert proven and proven[-1] == first_pair
    assert len(set(batched)) == len(batched) < len(planned.plan_ops("pair_schedule"))
    assert manager.timings[0].finish_seconds > 0
    # Every proof passing: the same IR as proving inside the pass, one process.
    monkeypatch.setattr(LaterPass, "background_started", None)
    monkeypatch.setattr(check, "_prove", real_prove)
    monkeypatch.setattr(batch, "prove_all", real_prove_all)
    waited, alone = many_pairs_module(), many_pairs_module()
    PassManager(parse_pipeline("overlap-schedule{jobs=2 cache=false}")).run(waited)
    OverlapSchedulePass(jobs=1, cache=False).apply(alone)
    assert print_module(waited) == print_module(alone)


def test_background_proofs_write_each_new_schedule_where_it_is_proven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With workers and the cache on, a new schedule proven in the background is written to the
    schedule cache by the background process itself (the compile does not wait for the files); the
    ones the main process proves while waiting, it writes. A write that fails in the background is
    made again by the main process, and one that fails there too is a warning; nothing unproven
    is written, and no temporary file is left behind."""
    import warnings

    import passes.scheduling.batch as batch
    from passes.scheduling.cache import ScheduleCache, ScheduleCacheWarning

    monkeypatch.setattr(batch, "MIN_DAGS_PER_WORKER", 1)
    monkeypatch.setattr(batch, "PROOF_BATCH", 2)
    child_took = multiprocessing.get_context("fork").Event()
    main_pid, real_take, real_write = os.getpid(), batch._take, ScheduleCache.write

    def take(next_index, count: int) -> range:  # type: ignore[no-untyped-def]
        taken = real_take(next_index, count)
        if taken and os.getpid() != main_pid:
            child_took.set()
        return taken

    writers = tmp_path / "writers"
    writers.mkdir()

    def recording(self: ScheduleCache, key: str, schedule: PairSchedule, proven: bool) -> None:
        real_write(self, key, schedule, proven)
        (writers / f"{os.getpid()}.{key}").touch()

    monkeypatch.setattr(batch, "_take", take)
    monkeypatch.setattr(LaterPass, "background_started", child_took)
    monkeypatch.setattr(ScheduleCache, "write", recording)
    folder = tmp_path / "cache"
    pipeline = f"overlap-schedule{{jobs=2 cache-dir={folder}}},test-later"
    cached, alone = many_pairs_module(), many_pairs_module()
    PassManager(parse_pipeline(pipeline), verify_each=False).run(cached)
    OverlapSchedulePass(jobs=1, cache=False).apply(alone)
    assert print_module(cached) == print_module(alone)
    count = len(cached.plan_ops("pair_schedule"))
    entries = sorted((folder / "schedules").glob("*.json"))
    assert len(entries) == count
    assert all(json.loads(p.read_text().split("\n", 1)[1])["proven"] is True for p in entries)  # past the header
    assert not list((folder / "schedules").glob("*.tmp")) and not list((folder / "schedules").glob(".*"))
    pids = {int(p.name.split(".")[0]) for p in writers.iterdir()}
    assert len(list(writers.iterdir())) == count  # each schedule written once
    assert pids - {main_pid}, "the background process wrote none of the schedules it proved"

    # Writes that fail in the background process only: the main process writes them all.
    def failing_in_children(self: ScheduleCache, key: str, schedule: PairSchedule, proven: bool) -> None:
        if os.getpid() != main_pid:
            raise OSError("no space left on device")
        real_write(self, key, schedule, proven)

    monkeypatch.setattr(ScheduleCache, "write", failing_in_children)
    child_took.clear()
    again = tmp_path / "again"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ScheduleCacheWarning)
        PassManager(parse_pipeline(f"overlap-schedule{{jobs=2 cache-dir={again}}},test-later"), verify_each=False).run(
            many_pairs_module()
        )
    assert len(list((again / "schedules").glob("*.json"))) == count

    # Writes that fail everywhere: a warning, and no entry.
    def failing(self: ScheduleCache, key: str, schedule: PairSchedule, proven: bool) -> None:
        raise OSError("read-only file system")

    monkeypatch.setattr(ScheduleCache, "write", failing)
    child_took.clear()
    nowhere = tmp_path / "nowhere"
    with pytest.warns(ScheduleCacheWarning, match="read-only file system"):
        PassManager(parse_pipeline(f"overlap-schedule{{jobs=2 cache-dir={nowhere}}},test-later"), verify_each=False).run(
            many_pairs_module()
        )
    assert not list(nowhere.glob("schedules/*.json"))


@pytest.fixture(autouse=True)
def _later_pass() -> object:
    from passes.manager import PASS_REGISTRY

    PASS_REGISTRY["test-later"] = f"{__name__}:LaterPass"
    yield
    PASS_REGISTRY.pop("test-later", None)


@dataclasses.dataclass(frozen=True)
class LaterPass(ModulePass):
    """A pass after overlap-schedule that changes nothing (the proofs run beside it)."""

    name = "test-later"
    summary = "test only"
    # Set by a test: an event the background proof process sets when it takes its first batch.
    background_started: ClassVar[Any] = None

    def apply(self, module: Module) -> bool:
        if LaterPass.background_started is not None:
            assert LaterPass.background_started.wait(60), "the background proofs took no batch in 60 s"
        return False
