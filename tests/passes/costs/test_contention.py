"""The contention model: overlapped tasks slow each other down, event by event."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.costs.contention import (
    ContendedTask,
    ContentionError,
    ContentionParams,
    compute_rate,
    retime,
)
from passes.costs.hardware import HARDWARE_DIR, load_hardware

H100 = load_hardware("h100")
PARAMS = ContentionParams.from_hardware(H100, ep=8)


def compute(name: str, duration: float, order: int, deps: tuple[str, ...] = (), sm: float = 1.0, mem: float = 0.0) -> ContendedTask:
    return ContendedTask(name, "compute", duration, order, deps, sm, mem)


def comm(name: str, duration: float, order: int, deps: tuple[str, ...] = ()) -> ContendedTask:
    return ContendedTask(name, "comm", duration, order, deps, 0.0, 0.0)


def test_h100_parameters_come_from_the_hardware_file():
    # The SM share is the hardware's comm_sms / total_sms (20 of 132).
    assert PARAMS.sm_share_lost == pytest.approx(20 / 132)
    # comm_hbm_share = bytes-per-byte (2) * A2A bandwidth / HBM bandwidth.
    assert PARAMS.comm_hbm_share == pytest.approx(2 * H100.a2a_gbps(8) / H100.hbm_gbps)
    assert PARAMS.comm_slowdown_per_memory > 0


def test_contention_block_overrides_defaults(tmp_path):
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    data["contention"] = {
        "sm_share_lost": 0.3, "comm_hbm_share": 0.2, "comm_slowdown_per_compute": 0.5, "comm_slowdown_per_memory": 0.1,
        "comm_wait_beside_compute_us": 250.0,
    }
    path = tmp_path / "custom.json"
    path.write_text(json.dumps(data))
    p = ContentionParams.from_hardware(load_hardware(path))
    assert (p.sm_share_lost, p.comm_hbm_share, p.comm_slowdown_per_compute, p.comm_slowdown_per_memory) == (0.3, 0.2, 0.5, 0.1)
    assert p.comm_wait_beside_compute_us == 250.0


def test_comm_beside_compute_stretches_compute_by_the_sm_share():
    # A compute-bound GEMM fully covered by a longer All-to-All runs on the SMs left over.
    tasks = [compute("gemm", 100.0, 0), comm("a2a", 1000.0, 0)]
    r = retime(tasks, PARAMS)
    assert r.finish["gemm"] == pytest.approx(100.0 / (1 - 20 / 132))
    # The comm kernel beside a compute-bound kernel is not slowed on a GPU (own SMs)...
    assert r.finish["a2a"] == pytest.approx(1000.0)
    assert r.makespan == pytest.approx(1000.0)


def test_a_transfer_beside_compute_keeps_at_most_the_hardwares_bandwidth():
    # A GPU transfer shares the SMs with the compute kernel beside it and there moves at most
    # comm_gbps_beside_compute (h200: measured 150 GB/s with a 20-block transfer kernel).
    h200 = ContentionParams.from_hardware(load_hardware("h200"), ep=8)
    assert h200.comm_gbps_beside_compute == 150.0 and PARAMS.comm_gbps_beside_compute == 0.0
    params = ContentionParams(0.0, 0.0, 0.0, 0.0, comm_gbps_beside_compute=150.0)
    fast = ContendedTask("a", "comm", 100.0, 0, (), 0.0, 0.0, 1.0, 300.0)  # 300 GB/s alone: half speed beside compute
    slow = ContendedTask("b", "comm", 100.0, 0, (), 0.0, 0.0, 1.0, 100.0)  # below the cap: unchanged
    long_compute = compute("c", 1000.0, 0)
    assert retime([long_compute, fast], params).finish["a"] == pytest.approx(200.0)
    assert retime([long_compute, slow], params).finish["b"] == pytest.approx(100.0)
    # Once compute ends the transfer runs at its own rate again: 50 us at half speed, then 75 alone.
    short = compute("c", 50.0, 0)
    assert retime([short, fast], params).finish["a"] == pytest.approx(50.0 + 75.0)
    # Alone, or with no cap, a transfer takes its isolated time.
    assert retime([fast], params).finish["a"] == pytest.approx(100.0)
    assert retime([long_compute, fast], ContentionParams(0.0, 0.0, 0.0, 0.0)).finish["a"] == pytest.approx(100.0)
    with pytest.raises(ContentionError, match="comm_gbps_beside_compute"):
        ContentionParams(0.0, 0.0, 0.0, 0.0, comm_gbps_beside_compute=-1.0)


def test_a_comm_tasks_rate_alone_is_its_bytes_over_its_duration():
    from passes.costs.pair_costs import ScheduledTask, contended_tasks
    from tessera_ir.kinds import Phase, Resource, TaskOp
    from tessera_ir.model import Task

    dispatch = Task("l0.dispatch.fwd", TaskOp.DISPATCH, Phase.FWD, Resource.COMM, bytes=146_800_640)
    gemm = Task("l0.expert_gemm.fwd", TaskOp.EXPERT_GEMM, Phase.FWD, Resource.COMPUTE, flops=10**12, bytes=10**9)
    items = [ScheduledTask(dispatch, "comm", 0, ()), ScheduledTask(gemm, "compute", 0, ())]
    got = contended_tasks(items, lambda t: 460.0 if t is dispatch else 500.0, lambda t: (1.0, 0.0))
    assert got[0].gbps == pytest.approx(146_800_640 / 460e3) and got[1].gbps == 0.0


def test_memory_bound_neighbour_slows_comm_and_loses_bandwidth():
    tasks = [compute("copy", 100.0, 0, sm=0.1, mem=1.0), comm("a2a", 1000.0, 0)]
    r = retime(tasks, PARAMS)
    copy_rate = 1 - PARAMS.comm_hbm_share
    assert r.finish["copy"] == pytest.approx(100.0 / copy_rate)
    comm_rate = 1 / (1 + PARAMS.comm_slowdown_per_memory * 1.0)
    # While the copy ran, the All-to-All progressed at comm_rate; afterwards at full speed.
    done_during_copy = r.finish["copy"] * comm_rate
    assert r.finish["a2a"] == pytest.approx(r.finish["copy"] + (1000.0 - done_during_copy))


def test_rates_change_at_every_event():
    # Compute (100) beside a shorter comm (50): slowed for 50 µs, then full speed.
    r = retime([compute("gemm", 100.0, 0), comm("a2a", 50.0, 0)], PARAMS)
    rate = compute_rate(compute("g", 1.0, 0), PARAMS)
    assert r.finish["a2a"] == pytest.approx(50.0)
    assert r.finish["gemm"] == pytest.approx(50.0 + (100.0 - 50.0 * rate))


def test_without_overlap_the_cost_is_the_isolated_sum():
    # A dependency chain alternating streams: nothing ever runs side by side.
    tasks = [
        compute("a", 30.0, 0),
        comm("b", 20.0, 0, ("a",)),
        compute("c", 50.0, 1, ("b",)),
        comm("d", 10.0, 1, ("c",)),
        compute("e", 0.0, 2, ("d",)),
    ]
    r = retime(tasks, PARAMS)
    assert r.makespan == pytest.approx(110.0)
    assert r.makespan == pytest.approx(r.isolated_sum)
    assert all(v == pytest.approx(1.0) for v in r.stretch(tasks).values())


def test_no_contention_parameters_give_the_plain_list_schedule():
    tasks = [compute("gemm", 100.0, 0), comm("a2a", 60.0, 0), compute("g2", 10.0, 1, ("a2a",))]
    r = retime(tasks, ContentionParams.none())
    assert r.finish["gemm"] == 100.0 and r.finish["a2a"] == 60.0 and r.finish["g2"] == 110.0


def test_stream_order_is_kept_even_when_a_later_task_is_ready():
    # g1 waits for the comm task; g2 (ready at 0) is later on the stream, so it waits too.
    tasks = [comm("a2a", 40.0, 0), compute("g1", 10.0, 0, ("a2a",)), compute("g2", 10.0, 1)]
    r = retime(tasks, ContentionParams.none())
    assert r.start["g1"] == pytest.approx(40.0) and r.start["g2"] == pytest.approx(50.0)


def test_dependencies_across_streams_pay_the_hand_off_delay():
    params = ContentionParams(0.0, 0.0, 0.0, 0.0, cross_stream_sync_us=5.0)
    tasks = [compute("a", 10.0, 0), comm("b", 10.0, 0, ("a",)), compute("c", 10.0, 1, ("b",)), compute("d", 10.0, 2, ("c",))]
    r = retime(tasks, params)
    # a -> b and b -> c cross streams (+5 each); c -> d stays on one stream.
    assert r.start["b"] == pytest.approx(15.0) and r.start["c"] == pytest.approx(30.0)
    assert r.start["d"] == pytest.approx(40.0) and r.makespan == pytest.approx(50.0)
    # An independent task on the other stream is not delayed.
    r2 = retime([compute("a", 10.0, 0), comm("x", 3.0, 0)], params)
    assert r2.start["x"] == 0.0


def test_comm_waits_for_a_processor_only_while_compute_runs():
    params = ContentionParams(0.0, 0.0, 0.0, 0.0, comm_wait_beside_compute_us=30.0)
    # Beside a long GEMM the All-to-All first waits 30 µs (taking nothing from the GEMM), then runs.
    r = retime([compute("gemm", 100.0, 0), comm("a2a", 20.0, 0)], params)
    assert r.finish["a2a"] == pytest.approx(50.0) and r.finish["gemm"] == pytest.approx(100.0)
    # Beside a GEMM shorter than the wait, the wait ends with the GEMM (a core is free then).
    r = retime([compute("gemm", 10.0, 0), comm("a2a", 20.0, 0)], params)
    assert r.finish["a2a"] == pytest.approx(30.0)
    # Alone it starts at once; once running alone it is not stalled by compute starting later.
    r = retime([comm("a2a", 20.0, 0), compute("gemm", 100.0, 0, ("a2a",)), comm("a2b", 20.0, 1)], params)
    assert r.finish["a2a"] == pytest.approx(20.0) and r.finish["a2b"] == pytest.approx(70.0)
    r = retime([comm("a2a", 20.0, 0), compute("g0", 5.0, 0), compute("g1", 100.0, 1, ("a2a",))], params)
    assert r.finish["a2a"] == pytest.approx(25.0)
    # GPUs leave it at 0: the model gives the same answer as before.
    assert PARAMS.comm_wait_beside_compute_us == 0.0
    with pytest.raises(ContentionError, match="comm_wait_beside_compute_us"):
        ContentionParams(0.0, 0.0, 0.0, 0.0, comm_wait_beside_compute_us=-1.0)


def test_deadlocking_order_and_unknown_dependencies_are_refused():
    with pytest.raises(ContentionError, match="deadlocks"):
        retime([compute("g1", 1.0, 0, ("g2",)), compute("g2", 1.0, 1)], PARAMS)
    with pytest.raises(ContentionError, match="not in the schedule"):
        retime([compute("g1", 1.0, 0, ("ghost",))], PARAMS)
    with pytest.raises(ContentionError, match=r"\[0, 1\)"):
        ContentionParams(1.0, 0.0, 0.0, 0.0)


@st.composite
def schedules(draw):
    n = draw(st.integers(1, 8))
    tasks = []
    orders = {"compute": 0, "comm": 0}
    for i in range(n):
        resource = draw(st.sampled_from(["compute", "comm"]))
        # Dependencies only on earlier tasks, so the list order is topological and the
        # per-stream order (list order) can never deadlock.
        deps = tuple(f"t{j}" for j in range(i) if draw(st.booleans()))
        duration = draw(st.floats(0.0, 100.0))
        tasks.append(ContendedTask(f"t{i}", resource, duration, orders[resource], deps, 1.0, 0.0))
        orders[resource] += 1
    return tasks


@settings(max_examples=60, deadline=None)
@given(schedules(), st.floats(0.0, 0.45), st.floats(0.0, 0.45))
def test_more_contention_never_makes_a_pair_faster(tasks, low, extra):
    # Compute-bound kernels only, so only the SM share varies.
    def params(share: float) -> ContentionParams:
        return ContentionParams(share, 0.0, 0.0, 0.0)

    free = retime(tasks, ContentionParams.none())
    less = retime(tasks, params(low))
    more = retime(tasks, params(low + extra))
    assert free.makespan <= less.makespan + 1e-6
    assert less.makespan <= more.makespan + 1e-6
    # Never slower than running everything one after another at the most contended rate.
    assert more.makespan <= free.isolated_sum / (1 - (low + extra)) + 1e-6
    # Never faster than the busier stream alone.
    for resource in ("compute", "comm"):
        assert sum(t.duration for t in tasks if t.resource == resource) <= free.makespan + 1e-6


@settings(max_examples=80, deadline=None)
@given(schedules(), st.floats(0.0, 50.0), st.floats(0.0, 50.0), st.floats(0.0, 0.9), st.floats(0.0, 1.0))
def test_every_retimed_schedule_keeps_its_orders_and_dependencies(tasks, sync, wait, share, slowdown):
    params = ContentionParams(share, 0.0, slowdown, 0.0, cross_stream_sync_us=sync, comm_wait_beside_compute_us=wait)
    got = retime(tasks, params)
    by_name = {t.name: t for t in tasks}
    assert set(got.start) == set(got.finish) == set(by_name)
    tol = 1e-6
    for t in tasks:
        # Never faster than alone; a task starts after its dependencies, plus the hand-off delay across streams.
        assert got.finish[t.name] - got.start[t.name] >= t.duration - tol
        for d in t.deps:
            delay = sync if by_name[d].resource != t.resource else 0.0
            assert got.start[t.name] >= got.finish[d] + delay - tol
    for resource in ("compute", "comm"):
        stream = sorted((t for t in tasks if t.resource == resource), key=lambda t: t.order)
        for a, b in zip(stream, stream[1:]):  # one task at a time, in schedule order
            assert got.start[b.name] >= got.finish[a.name] - tol
    # Start and finish are recorded in the order the events happened.
    assert list(got.start.values()) == sorted(got.start.values())
    assert list(got.finish.values()) == sorted(got.finish.values())
    assert got.makespan == max(got.finish.values(), default=0.0)


def test_a_latency_bound_comm_task_takes_its_bandwidth_share_and_stretches_its_latency():
    # The CPU regime: a comm thread that mostly sleeps between messages slows the GEMM beside it only
    # for the share of its time it moves bytes, and its latency part stretches at its own rate.
    params = ContentionParams(
        sm_share_lost=0.5, comm_hbm_share=0.0, comm_slowdown_per_compute=0.2, comm_slowdown_per_memory=0.0,
        latency_bound_comm=True, comm_latency_slowdown_per_compute=1.0,
    )
    latency_only = ContendedTask("a2a", "comm", 100.0, 0, (), 0.0, 0.0, bandwidth_share=0.0)
    r = retime([compute("gemm", 1000.0, 0), latency_only], params)
    assert r.finish["a2a"] == pytest.approx(200.0)  # 100 µs at rate 1 / (1 + 1.0)
    assert r.finish["gemm"] == pytest.approx(1000.0)  # not slowed at all
    half = ContendedTask("a2a", "comm", 100.0, 0, (), 0.0, 0.0, bandwidth_share=0.5)
    r = retime([compute("gemm", 1000.0, 0), half], params)
    assert r.finish["a2a"] == pytest.approx(100.0 * (1 + 0.5 * 0.2 + 0.5 * 1.0))
    # While the All-to-All runs the GEMM keeps 1 - 0.5 * 0.5 of its speed.
    assert r.finish["gemm"] == pytest.approx(1000.0 + r.finish["a2a"] * 0.25)
    # A bandwidth-bound task (share 1) is priced as without the regime.
    full = ContendedTask("a2a", "comm", 100.0, 0, (), 0.0, 0.0, bandwidth_share=1.0)
    regime = retime([compute("gemm", 1000.0, 0), full], params)
    plain = retime([compute("gemm", 1000.0, 0), full], ContentionParams(0.5, 0.0, 0.2, 0.0))
    assert regime.finish == pytest.approx(plain.finish)


def test_a_latency_bound_comm_task_waits_for_a_core_again_whenever_compute_resumes():
    # On CPU a latency-bound transfer's thread sleeps on each message: started while the compute
    # stream idles, it still stalls once compute resumes, until it has waited its latency share of
    # the wait in all. Here the All-to-All runs alone for 10 µs (the GEMM waits on a hand-off), then
    # beside a 100 µs GEMM.
    def run(share: float, latency_bound: bool = True) -> float:
        params = ContentionParams(
            0.0, 0.0, 0.0, 0.0, cross_stream_sync_us=10.0, comm_wait_beside_compute_us=50.0,
            latency_bound_comm=latency_bound,
        )
        tasks = [
            comm("t", 0.0, 0),
            ContendedTask("a2a", "comm", 40.0, 1, (), 0.0, 0.0, bandwidth_share=share),
            compute("gemm", 100.0, 0, ("t",)),
        ]
        r = retime(tasks, params)
        assert r.start["a2a"] == 0.0 and r.start["gemm"] == pytest.approx(10.0)
        assert r.finish["gemm"] == pytest.approx(110.0)  # a stalled comm task takes nothing from it
        return r.finish["a2a"]

    assert run(0.0, latency_bound=False) == pytest.approx(40.0)  # GPU-style: a core once, kept
    assert run(0.0) == pytest.approx(10.0 + 50.0 + 30.0)  # stalls the whole wait, then the rest
    assert run(0.5) == pytest.approx(10.0 + 25.0 + 30.0)  # half of it latency: half the wait
    assert run(1.0) == pytest.approx(40.0)  # bandwidth-bound: priced as without the regime
