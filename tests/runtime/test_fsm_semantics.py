"""What the FSM does, case by case, on hand-written programs; each case runs on both interpreters."""

from __future__ import annotations

import hashlib

import pytest

import runtime
from runtime import ActionKind, reference
from runtime.bytecode import (
    Collective,
    Group,
    Instr,
    Op,
    PlanImage,
    PlanInfo,
    SlotInfo,
    Stream,
    TaskInfo,
    encode,
)

C, M = Stream.COMPUTE, Stream.COMM
TASKS = [
    TaskInfo("l0.router.fwd", "router.fwd", "l0", C, False, 5.0, 0),  # 0
    TaskInfo("l0.dispatch.fwd", "dispatch.fwd", "l0", M, False, 40.0, 0),  # 1
    TaskInfo("l0.expert_gemm.fwd", "expert_gemm.fwd", "l0", C, False, 20.0, 0),  # 2
    TaskInfo("l1.expert_gemm.wgrad", "expert_gemm.wgrad", "l1", C, True, 50.0, 100),  # 3
    TaskInfo("l1.router.wgrad", "router.wgrad", "l1", C, True, 10.0, 100),  # 4
    TaskInfo("l1.mixer.wgrad", "mixer.wgrad", "l1", C, True, 30.0, 100),  # 5
]


def program(code: list[Instr], *, budget: int = 1000, slots: list[SlotInfo] | None = None, ep: int = 2) -> bytes:
    plan = PlanInfo(1, 1, ep, 1, 2, 1, 128, "bf16", "hand", "analytic", "h100", budget)
    sig = hashlib.sha256(b"hand").digest()
    return encode(PlanImage(sig, plan, TASKS, slots, {0: code}))


def defer(task: int, deadline: int) -> Instr:
    return Instr(Op.DEFER, C, a=task, b=deadline)


def a2a(task: int = 1) -> Instr:
    return Instr(Op.COLLECTIVE, M, Collective.ALL_TO_ALL, 0, task, Group.EP)


# Three wgrads deferred, then a dispatch with a slot before the compute stream waits on it.
SLOT_CODE = [
    defer(3, 7),  # 0
    defer(4, 7),  # 1
    defer(5, 7),  # 2
    Instr(Op.RUN, C, a=0),  # 3
    a2a(),  # 4
    Instr(Op.SLOT, C, a=0, b=4),  # 5
    Instr(Op.WAIT, C, a=4),  # 6
    Instr(Op.RUN, C, a=2),  # 7
    Instr(Op.END),  # 8
]
SLOTS = [SlotInfo(1, 45.0, 30.0, 15.0)]  # 45 us with balanced routing; 45 us more of All-to-All and GEMM


@pytest.fixture(params=["cpp", "python"])
def make(request):  # noqa: ANN001, ANN201
    def build(data: bytes, **options):  # noqa: ANN003, ANN202
        if request.param == "cpp":
            return runtime.FSM(runtime.load_plan(data, rank=0), **options)
        return reference.ReferenceFSM(reference.load_plan(data, rank=0), **options)

    return build


def kinds(actions: list) -> list[tuple[int, int]]:
    return [(int(a.kind), a.id) for a in actions]


# The cases up to the admission's own test the pool's mechanics (best fit, predictions, budget,
# fallbacks) with ``admission=False``: the deadline-aware admission would refuse their deferrals
# that no slot can take, which is the point of it and is tested on its own below.


def test_slot_is_filled_best_fit_from_the_static_prediction(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, slots=SLOTS), admission=False)
    router = fsm.advance()
    assert (router.kind, router.task) == (ActionKind.RUN, 0)
    dispatch = fsm.advance()
    assert (dispatch.kind, dispatch.collective, dispatch.group) == (ActionKind.COLLECTIVE, 0, 0)
    # 45 us predicted: the 30 us task fits best, then the 10 us one (5 us left); the 50 us one waits.
    first, second = fsm.advance(), fsm.advance()
    assert (first.task, first.filled, second.task, second.filled) == (5, True, 4, True)
    wait = fsm.advance()
    assert (wait.kind, wait.wait_for) == (ActionKind.WAIT, 4)
    fsm.complete(dispatch.id)
    # The 50 us task is due at instruction 7, before the expert GEMM.
    due = fsm.advance()
    assert (due.task, due.fallback, due.filled) == (3, True, False)
    gemm = fsm.advance()
    assert gemm.task == 2
    for a in (router, first, second, due, gemm):
        fsm.complete(a.id)
    assert fsm.advance().kind == ActionKind.DONE
    c = fsm.counters
    assert (c["tasks_run"], c["offered"], c["deferred"], c["placed"], c["fallbacks"], c["slots"]) == (5, 3, 3, 2, 1, 1)
    assert (c["predicted_us"], c["placed_us"], c["fallback_us"], c["slots_filled"]) == (45.0, 40.0, 50.0, 1)
    assert c["peak_pool_bytes"] == 300
    assert c["observed_us"] > 0 and c["recovered_us"] <= c["observed_us"]


def test_token_counts_change_the_prediction(make) -> None:  # noqa: ANN001
    # Four experts on two EP ranks: rank 0 gets 60 + 40 tokens, rank 1 gets 0: imbalance 2.0,
    # so 45 + (30 + 15) * (2 - 1) = 90 us, and all three tasks fit (50 + 30 + 10).
    fsm = make(program(SLOT_CODE, slots=SLOTS), admission=False)
    assert fsm.report_tokens(1, 0, [60, 40, 0, 0]) is True
    assert fsm.report_tokens(1, 1, [60, 40, 0, 0]) is False  # no slot waits on micro-batch 1's dispatch
    fsm.advance(), fsm.advance()
    filled = [fsm.advance() for _ in range(3)]
    assert [(a.task, a.filled) for a in filled] == [(3, True), (5, True), (4, True)]
    assert fsm.counters["predicted_us"] == 90.0
    with pytest.raises(ValueError, match="split evenly"):
        fsm.report_tokens(1, 0, [1, 2, 3])


def test_load_imbalance_matches_the_reference() -> None:
    for tokens, ep in (([60, 40, 0, 0], 2), ([5, 5, 5, 5], 4), ([0, 0], 2), ([1, 2, 3, 4, 5, 6], 3)):
        assert runtime._core.load_imbalance(tokens, ep) == reference.load_imbalance(tokens, ep)
    assert reference.load_imbalance([60, 40, 0, 0], 2) == 2.0


def test_a_slot_below_the_minimum_is_left_empty(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, slots=SLOTS), min_slot_us=50.0, admission=False)
    fsm.advance(), fsm.advance()
    assert fsm.advance().kind == ActionKind.WAIT
    assert (fsm.counters["slots"], fsm.counters["slots_filled"], fsm.counters["placed"]) == (1, 0, 0)


def test_no_fill_when_the_all_to_all_already_finished(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, slots=SLOTS), admission=False)
    fsm.advance()
    fsm.complete(fsm.advance().id)  # the dispatch is done before the slot is reached
    assert fsm.advance().kind == ActionKind.RUN  # no wait, so no slot: straight on
    assert fsm.counters["slots"] == 0 and fsm.counters["placed"] == 0


def test_memory_budget_runs_a_task_at_once_instead_of_deferring(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, budget=150, slots=SLOTS), admission=False)
    inline = fsm.advance()  # the second DEFER would hold 200 bytes > 150
    assert (inline.kind, inline.id, inline.task, inline.filled, inline.fallback) == (ActionKind.RUN, 1, 4, False, False)
    c = fsm.counters
    assert (c["offered"], c["deferred"], c["refused_memory"]) == (2, 1, 1)


def test_admission_runs_in_place_a_task_longer_than_every_slot_before_its_deadline(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, slots=SLOTS))
    # The 50 us task: the only slot before its deadline is 45 us, so it runs at once, in place.
    inline = fsm.advance()
    assert (inline.id, inline.task, inline.filled, inline.fallback) == (0, 3, False, False)
    router, dispatch = fsm.advance(), fsm.advance()
    assert (router.task, dispatch.kind) == (0, ActionKind.COLLECTIVE)
    first, second = fsm.advance(), fsm.advance()
    assert (first.task, first.filled, second.task, second.filled) == (5, True, 4, True)
    c = fsm.counters
    assert (c["offered"], c["deferred"], c["refused_deadline"], c["refused_memory"]) == (3, 2, 1, 0)


def test_admission_counts_the_pool_already_waiting_for_the_slots(make) -> None:  # noqa: ANN001
    # Two 30 us tasks for one 45 us slot: the first is admitted, the second would not fit beside it.
    code = [Instr(Op.DEFER, C, a=5, b=7), Instr(Op.DEFER, C, a=5, b=7, mb=1), Instr(Op.RUN, C, a=0, mb=1), *SLOT_CODE[3:]]
    fsm = make(program(code, slots=SLOTS))
    inline = fsm.advance()
    assert (inline.id, inline.task, inline.mb, inline.filled) == (1, 5, 1, False)
    assert fsm.counters["deferred"] == 1 and fsm.counters["refused_deadline"] == 1


def test_admission_refuses_registered_work_with_no_slot_before_its_deadline(make) -> None:  # noqa: ANN001
    code = [Instr(Op.RUN, C, a=0), Instr(Op.RUN, C, a=2), Instr(Op.RUN, C, a=0, mb=1), Instr(Op.END)]
    fsm = make(program(code))
    fsm.advance()
    reg = fsm.register_task(4, 1, deadline=3)  # no SLOT before instruction 3
    now = fsm.advance()
    assert (now.id, now.filled, now.fallback) == (reg, False, False)
    assert fsm.counters["refused_deadline"] == 1 and fsm.counters["deferred"] == 0


def test_admission_takes_work_due_at_the_next_instruction(make) -> None:  # noqa: ANN001
    # Due by instruction 2, offered at instruction 1: deferred past that one instruction only.
    code = [Instr(Op.RUN, C, a=0), Instr(Op.RUN, C, a=2), Instr(Op.END)]
    fsm = make(program(code))
    fsm.advance()
    reg = fsm.register_task(4, 1, deadline=2)
    current, due = fsm.advance(), fsm.advance()
    assert (current.id, due.id, due.fallback) == (1, reg, True)
    assert fsm.counters["deferred"] == 1 and fsm.counters["refused_deadline"] == 0


def test_without_dbo_every_deferred_task_runs_in_place_and_slots_are_skipped(make) -> None:  # noqa: ANN001
    fsm = make(program(SLOT_CODE, slots=SLOTS), dbo=False)
    seen = []
    while (a := fsm.advance()).kind != ActionKind.DONE:
        assert a.kind != ActionKind.WAIT or a.wait_for in seen
        if a.kind != ActionKind.WAIT:
            seen.append(a.id)
        fsm.complete(a.wait_for if a.kind == ActionKind.WAIT else a.id)
    assert seen == [0, 1, 2, 3, 4, 7]
    assert fsm.counters["offered"] == 0 and fsm.counters["slots"] == 0


def test_fallbacks_due_together_run_in_id_order(make) -> None:  # noqa: ANN001
    code = [defer(3, 3), defer(4, 2), Instr(Op.RUN, C, a=0), Instr(Op.RUN, C, a=2), Instr(Op.END)]
    fsm = make(program(code), admission=False)
    assert [(a.id, a.fallback) for a in (fsm.advance(), fsm.advance())] == [(1, True), (2, False)]
    assert [(a.id, a.fallback) for a in (fsm.advance(), fsm.advance())] == [(0, True), (3, False)]


def test_a_wait_on_a_deferred_task_before_its_deadline_is_refused_at_load() -> None:
    code = [defer(3, 3), Instr(Op.WAIT, M, a=0), Instr(Op.RUN, C, a=0), Instr(Op.END)]
    with pytest.raises(runtime.PlanError, match="whose deadline comes after the wait"):
        runtime.load_plan(program(code), rank=0)
    with pytest.raises(runtime.PlanError, match="whose deadline comes after the wait"):
        reference.load_plan(program(code), rank=0)


def test_registered_work_runs_once_by_its_deadline(make) -> None:  # noqa: ANN001
    code = [Instr(Op.RUN, C, a=0), Instr(Op.RUN, C, a=2), Instr(Op.RUN, C, a=0, mb=1), Instr(Op.END)]
    fsm = make(program(code), admission=False)
    first = fsm.advance()
    reg = fsm.register_task(4, 1, deadline=2)
    assert reg == len(code)  # registered work gets ids after the program's
    second = fsm.advance()
    assert second.task == 2
    due = fsm.advance()
    assert (due.id, due.task, due.mb, due.fallback) == (reg, 4, 1, True)
    with pytest.raises(ValueError, match="not a movable task"):
        fsm.register_task(0, 0, deadline=3)
    with pytest.raises(ValueError, match="deadline"):
        fsm.register_task(4, 0, deadline=1)
    last = fsm.advance()
    for a in (first, second, due, last):
        fsm.complete(a.id)
    assert fsm.advance().kind == ActionKind.DONE


def test_end_waits_for_everything_in_flight_and_misuse_is_an_error(make) -> None:  # noqa: ANN001
    code = [a2a(), Instr(Op.RUN, C, a=0), Instr(Op.END)]
    fsm = make(program(code))
    coll, run = fsm.advance(), fsm.advance()
    fsm.complete(run.id)
    end_wait = fsm.advance()
    assert (end_wait.kind, end_wait.wait_for) == (ActionKind.WAIT, coll.id)
    fsm.complete(coll.id)
    assert fsm.advance().kind == ActionKind.DONE
    with pytest.raises(ValueError, match="not in flight"):
        fsm.complete(coll.id)
    with pytest.raises(ValueError, match="not in flight"):
        fsm.complete(99)
