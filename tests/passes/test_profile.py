"""The profile pass (analytic, measured, cache-only), its cache, and the CPU calibration."""

from __future__ import annotations

import json
import os
import statistics
from typing import Any

import pytest

import runtime.pair_executor as pair_executor
from passes.costs.calibrate_cpu import cpu_hardware, reference_tasks
from passes.costs.calibration_cache import calibration_path, write_calibration
from passes.costs.contention import ContentionParams, retime
from passes.costs.durations import task_duration_us
from passes.costs.execution import signature
from passes.costs.hardware import HARDWARE_DIR, load_hardware
from passes.costs.pair_costs import analytic_cost, contended_tasks, retime_key
from passes.costs.profile_cache import CacheEntry, ProfileCache, ProfileCacheWarning, cache_key, software_versions
from passes.manager import PassError, PassManager, parse_pipeline
from passes.plan_view import PlanError, PlanView
from passes.profile import ProfileError, ProfilePass
from passes.scheduling.pair_dag import PairDAG
from runtime.pair_executor import ExecTask, PairMeasurement
from tessera_ir.kinds import Resource
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef, Value
from tessera_ir.parallel import ParallelConfig
from tessera_ir.plan_ops import PlanOpError

from synthetic_ir import synthetic_module

KINDS = [("linear_attention", "moe"), ("attention", "moe"), ("linear_attention", "moe"), ("attention", "moe")]
H100 = load_hardware("h100")


def refs(*names: str) -> list[Value]:
    return [SymbolRef(n) for n in names]


def list_schedule(dag: PairDAG) -> list[float]:
    """Start times from a plain list schedule (tasks in DAG order, each as early as its stream allows)."""
    free = {Resource.COMPUTE: 0.0, Resource.COMM: 0.0}
    finish: list[float] = []
    starts: list[float] = []
    for t in dag.tasks:
        start = max([free[t.resource]] + [finish[d] for d in t.deps])
        starts.append(start)
        finish.append(start + t.duration)
        free[t.resource] = start + t.duration
    return starts


def pair_dag(module: Module, op: PlanOp) -> PairDAG:
    """The DAG of pair ``op`` with isolated durations on the module's target (h100 unless set)."""
    view = PlanView(module)
    return view.pair_dag(view.pair(op.name))


def add_pair(module: Module, name: str, fwd: list[str], bwd: list[str], with_schedule: bool = True) -> PlanOp:
    op = PlanOp("pair", name, {"fwd": refs(*fwd), "bwd": refs(*bwd)})
    if with_schedule:
        module.plan.append(op)
        dag = pair_dag(module, op)
        module.plan.remove(op)
        starts = list_schedule(dag)
        sched = PlanOp("pair_schedule", f"sched.{name}", {"method": "list", "pairs": [SymbolRef(name)]})
        orders = {Resource.COMPUTE: 0, Resource.COMM: 0}
        for t, s in sorted(zip(dag.tasks, starts), key=lambda p: p[1]):
            sched.entries.append(PlanEntry(t.name, {
                "start": s, "duration": t.duration, "stream": t.resource.value, "order": orders[t.resource],
            }))
            orders[t.resource] += 1
        op.attrs["schedule"] = SymbolRef(sched.name)
        module.plan.append(sched)
    module.plan.append(op)
    return op


def module_with_pairs(with_schedule: bool = True) -> Module:
    m = synthetic_module(KINDS, gemm_flops=10**12, a2a_bytes=2 * 10**8, parallel=ParallelConfig(ep=8))
    add_pair(m, "pair.0", ["l0"], ["l1"], with_schedule)
    add_pair(m, "pair.1", ["l2", "l3"], ["l0"], with_schedule)
    return m


# ---------------------------------------------------------------------------
# Analytic


def test_analytic_cost_is_the_schedule_retimed_under_contention():
    m = module_with_pairs()
    PassManager(parse_pipeline("profile{mode=analytic}")).run(m)
    parallel = ParallelConfig.from_attrs(m.attrs)
    tasks = m.task_map()
    for op in m.plan_ops("pair"):
        assert op.attrs["cost_source"] == "analytic"
        dag = pair_dag(m, op)
        assert op.attrs["serial_us"] == pytest.approx(sum(task_duration_us(tasks[t.name], H100, parallel) for t in dag.tasks))
        # The hand-written list schedule re-timed without contention is that schedule's makespan.
        sched = next(p for p in m.plan_ops("pair_schedule") if p.name == op.attrs["schedule"].name)
        assert op.attrs["overlap_us"] == pytest.approx(max(e.attrs["start"] + e.attrs["duration"] for e in sched.entries))
        # Contention costs something, overlap still saves something.
        assert op.attrs["overlap_us"] < op.attrs["post_overlap_us"] < op.attrs["serial_us"]
        assert op.attrs["post_overlap_us"] >= dag.lower_bound()
    assert m.attrs["profile_mode"] == "analytic" and m.attrs["profile_pairs"] == 2


def test_schedules_from_the_overlap_schedule_pass_are_costed_pair_by_pair():
    # pair.2 has the same DAG as pair.0 (layers alike), so it shares pair.0's schedule,
    # whose entries name pair.0's tasks: the profile pass matches them by position.
    m = module_with_pairs(with_schedule=False)
    add_pair(m, "pair.2", ["l2"], ["l3"], with_schedule=False)
    run(m, "overlap-schedule,profile")
    ops = {op.name: op for op in m.plan_ops("pair")}
    assert ops["pair.0"].attrs["schedule"] == ops["pair.2"].attrs["schedule"]
    assert ops["pair.0"].attrs["post_overlap_us"] == pytest.approx(ops["pair.2"].attrs["post_overlap_us"])
    for op in ops.values():
        # Without contention the re-timed schedule is at most the scheduler's makespan
        # (streams start every task as early as order and dependencies allow).
        assert op.attrs["overlap_us"] <= op.attrs["makespan"] + 1e-6
        assert op.attrs["overlap_us"] <= op.attrs["post_overlap_us"] <= op.attrs["serial_us"]


def test_a_pair_that_cannot_overlap_costs_its_serial_time():
    # One forward layer without shared expert is a pure chain: nothing runs side by side,
    # so the contention model must give exactly the isolated sum.
    m = synthetic_module([("attention", "moe")], shared_expert=False, parallel=ParallelConfig(ep=8))
    add_pair(m, "pair.0", ["l0"], [])
    ProfilePass().apply(m)
    op = m.plan_ops("pair")[0]
    assert op.attrs["post_overlap_us"] == pytest.approx(op.attrs["serial_us"])


def test_faster_memory_never_costs_more():
    a, b = module_with_pairs(), module_with_pairs()
    b.attrs["hardware"] = "h200"  # the target, as tessera-compile --hardware h200 writes it
    ProfilePass().apply(a)
    ProfilePass().apply(b)
    for pa, pb in zip(a.plan_ops("pair"), b.plan_ops("pair")):
        assert pb.attrs["post_overlap_us"] <= pa.attrs["post_overlap_us"]
    assert a.attrs["profile_hardware"] == "h100" and b.attrs["profile_hardware"] == "h200"


def test_pairs_without_a_schedule_are_scheduled_with_gap_fit():
    m = module_with_pairs(with_schedule=False)
    ProfilePass().apply(m)
    for op in m.plan_ops("pair"):
        assert op.attrs["post_overlap_us"] >= pair_dag(m, op).lower_bound() - 1e-6
        assert op.attrs["overlap_us"] <= op.attrs["post_overlap_us"] <= op.attrs["serial_us"]


def test_stream_order_from_the_schedule_is_what_gets_costed():
    m = module_with_pairs()
    op = m.plan_ops("pair")[1]
    view = PlanView(m)
    items = view.scheduled_tasks(view.pair(op.name))
    sched = next(p for p in m.plan_ops("pair_schedule") if p.name == op.attrs["schedule"].name)
    want = {e.ref: e.attrs["order"] for e in sched.entries}
    assert {s.task.name: s.order for s in items} == want
    contended = contended_tasks(items, view.duration, view.utilisation)
    assert retime(contended, ContentionParams.none()).makespan <= sum(t.duration for t in contended)


def test_a_schedule_that_does_not_fit_its_pair_is_an_error():
    m = module_with_pairs()
    sched = m.plan_ops("pair_schedule")[0]
    sched.entries.pop()
    with pytest.raises(PlanError, match="does not fit pair @pair.0"):
        ProfilePass().apply(m)
    m.plan_ops("pair")[1].attrs["schedule"] = SymbolRef("nowhere")
    m.plan = [p for p in m.plan if p.name != sched.name and p.name != "pair.0"]
    with pytest.raises(PlanOpError, match="has 'schedule' naming '@nowhere', which names nothing; it must name a pair_schedule"):
        ProfilePass().apply(m)


def test_bad_options_are_refused_when_the_pipeline_is_parsed():
    with pytest.raises(PassError, match="option 'mode' of pass 'profile' takes analytic|measured|cache-only, got 'fast'"):
        parse_pipeline("profile{mode=fast}")
    with pytest.raises(PassError, match="option 'scale' of pass 'profile' takes float or auto, got 'huge'"):
        parse_pipeline("profile{scale=huge}")
    with pytest.raises(PassError, match=r"scale must lie in \(0, 1\]"):
        parse_pipeline("profile{scale=2}")
    with pytest.raises(PassError, match="repeats must be at least 1"):
        ProfilePass(repeats=0)
    assert parse_pipeline("profile{scale=0.5 exec-dtype=module}")[0] == ProfilePass(scale=0.5, exec_dtype="module")


# ---------------------------------------------------------------------------
# The cache


def entry(key: str, **kw: object) -> CacheEntry:
    data: dict[str, Any] = dict(key=key, measured_us=100.0, samples_us=[90.0, 100.0, 130.0], spread_us=40.0, repeats=3,
                device="cpu:test", versions={"torch": "x"}, signature=[1], method="by hand")
    data.update(kw)
    return CacheEntry(**data)


def test_cache_hit_miss_and_provenance(tmp_path):
    cache = ProfileCache(tmp_path)
    key = cache_key([2, ["expert_gemm.fwd", "compute", 0, 10, 20, [], "fp32", []]], "cpu:test", {"torch": "2.13"})
    assert cache.get(key) is None
    cache.put(entry(key))
    got = cache.get(key)
    assert got is not None and got.measured_us == 100.0 and got.spread_us == 40.0 and got.repeats == 3
    assert got.when and got.host and got.method == "by hand"
    assert cache.get(key.replace(key[0], "0" if key[0] != "0" else "1", 1)) is None
    assert [e.key for e in cache.entries()] == [key]


def test_cache_key_follows_versions_device_and_shapes():
    sig = [2, ["expert_gemm.fwd", "compute", 0, 10, 20, [[4, 8], [8, 2]], "fp32", []]]
    base = cache_key(sig, "cpu:a", {"torch": "2.13", "tessera": "0.1.0"})
    assert base == cache_key(sig, "cpu:a", {"tessera": "0.1.0", "torch": "2.13"})  # order does not matter
    assert base != cache_key(sig, "cpu:a", {"torch": "2.14", "tessera": "0.1.0"})
    assert base != cache_key(sig, "cpu:a", {"torch": "2.13", "tessera": "0.2.0"})
    assert base != cache_key(sig, "cpu:b", {"torch": "2.13", "tessera": "0.1.0"})
    other = [2, ["expert_gemm.fwd", "compute", 0, 10, 20, [[8, 4], [4, 2]], "fp32", []]]
    assert base != cache_key(other, "cpu:a", {"torch": "2.13", "tessera": "0.1.0"})
    versions = software_versions()
    assert set(versions) == {"torch", "tessera", "executor"}


def test_signature_ignores_names_but_not_order():
    a = [ExecTask("l0.x", "k.fwd", "compute", 0, flops=8), ExecTask("l0.y", "d.fwd", "comm", 0, ("l0.x",), bytes=64)]
    b = [ExecTask("l9.x", "k.fwd", "compute", 0, flops=8), ExecTask("l9.y", "d.fwd", "comm", 0, ("l9.x",), bytes=64)]
    assert signature(a, 2) == signature(b, 2)
    c = [ExecTask("l0.x", "k.fwd", "compute", 1, flops=8), ExecTask("l0.z", "k.fwd", "compute", 0, flops=8)]
    d = [ExecTask("l0.x", "k.fwd", "compute", 0, flops=8), ExecTask("l0.z", "k.fwd", "compute", 1, flops=16)]
    assert signature(c, 2) != signature(d, 2)


def test_damaged_entries_are_misses_and_writes_are_atomic(tmp_path):
    cache = ProfileCache(tmp_path)
    path = cache.put(entry("k1"))
    path.write_text(path.read_text()[:-20])  # truncated, as if written non-atomically and killed
    with pytest.warns(ProfileCacheWarning, match="does not match its checksum; ignoring it and measuring the pair again"):
        assert cache.get("k1") is None
    path.write_text(path.read_text().split("\n", 1)[1])  # a bare measurement, without the cache's header
    with pytest.warns(ProfileCacheWarning, match="is damaged"):
        assert cache.get("k1") is None
    cache.put(entry("k1", measured_us=7.0))
    assert cache.get("k1").measured_us == 7.0
    # No temporary files are left behind by completed writes.
    assert sorted(p.name for p in cache.dir.iterdir()) == ["k1.json"]


# ---------------------------------------------------------------------------
# Measured and cache-only, with a deterministic stand-in for the executor


class CountingExecutor:
    """Executor with the real interface whose 'measurement' is a fixed function of the work.

    ``calls`` records every pair executed (a pair's first, warmed-up, measurement; the
    reference kernel's readings are not pairs); ``slowdown`` makes the machine that much slower.
    """

    calls: list[list[ExecTask]] = []
    slowdown = 1.0

    def __init__(self, world_size: int = 2, device: str = "cpu", threads_per_rank: int | None = None, timeout_s: float = 300.0):
        self.world_size = world_size
        self.threads_per_rank = threads_per_rank or pair_executor.default_threads_per_rank(world_size)
        self.description = f"cpu:counting:world={world_size}"
        self.method = "counted"

    @staticmethod
    def _time(tasks) -> float:  # noqa: ANN001
        return (10.0 + sum(t.flops for t in tasks) / 1e6 + sum(t.bytes for t in tasks) / 1e6) * CountingExecutor.slowdown

    def measure(self, tasks, repeats: int = 5, warmup: int = 1, reference=None, reference_runs: int = 1) -> PairMeasurement:  # noqa: ANN001, E501
        if warmup and not all(t.name.startswith("ref.") for t in tasks):
            CountingExecutor.calls.append(list(tasks))
        base = self._time(tasks)
        samples = tuple(base * (1 + 0.01 * i) for i in range(repeats))
        readings = tuple(self._time(reference) for _ in range(repeats + 1)) if reference else ()
        return PairMeasurement(samples, device=self.description, method=self.method, reference_us=readings)

    def close(self) -> None:
        pass


@pytest.fixture
def counting(monkeypatch, tmp_path):
    CountingExecutor.calls = []
    CountingExecutor.slowdown = 1.0
    monkeypatch.setattr(pair_executor, "PairExecutor", CountingExecutor)
    # A hardware description where calibration would put it, so nothing is calibrated; its
    # reference kernel took what the counting executor says for it at slowdown 1.
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    data["name"] = "cpu"
    data["peak_tflops"]["fp32"] = 0.1
    reference: dict[str, Any] = {"gemm_n": 16, "copy_bytes": 65536}
    tasks = reference_tasks(reference)
    reference["us"] = 10.0 + sum(t.flops for t in tasks) / 1e6 + sum(t.bytes for t in tasks) / 1e6
    data["reference"] = reference
    write_calibration(data, tmp_path, 2, pair_executor.default_threads_per_rank(2))
    return tmp_path


def run(module: Module, spec: str) -> Module:
    return PassManager(parse_pipeline(spec)).run(module)


def test_measured_pairs_record_prediction_error_and_summary(counting):
    m = module_with_pairs()
    run(m, f"profile{{mode=measured repeats=3 cache-dir={counting} target-ms=5}}")
    assert len(CountingExecutor.calls) == 2
    errors = []
    for op in m.plan_ops("pair"):
        a = op.attrs
        assert a["cost_source"] == "measured" and a["post_overlap_us"] == a["measured_us"] > 0
        assert a["predicted_us"] > 0 and a["spread_us"] >= 0 and a["profile_repeats"] == 3
        assert a["predicted_error"] == pytest.approx((a["predicted_us"] - a["measured_us"]) / a["measured_us"])
        errors.append(abs(a["predicted_error"]))
    assert m.attrs["profile_error_mean"] == pytest.approx(statistics.mean(errors))
    assert min(errors) <= m.attrs["profile_error_p95"] <= max(errors)
    assert 0 < m.attrs["profile_scale"] <= 1


def test_repeats_are_scaled_to_the_calibrated_speed(counting):
    # The machine runs 2.5x slower than when it was calibrated: the reference kernel read beside
    # every repeat says so, and the measured cost is the raw time scaled back.
    spec = f"profile{{mode=measured repeats=3 cache-dir={counting} scale=0.001}}"

    def forget() -> None:
        for entry in ProfileCache(counting).dir.glob("*.json"):
            entry.unlink()

    calm = run(module_with_pairs(), spec)
    forget()
    CountingExecutor.slowdown = 2.5
    busy = run(module_with_pairs(), spec)
    for a, b in zip(calm.plan_ops("pair"), busy.plan_ops("pair")):
        assert a.attrs["speed_ratio"] == pytest.approx(1.0) and b.attrs["speed_ratio"] == pytest.approx(2.5)
        assert b.attrs["raw_measured_us"] == pytest.approx(2.5 * a.attrs["raw_measured_us"])
        assert b.attrs["measured_us"] == pytest.approx(a.attrs["measured_us"])
    assert busy.attrs["profile_normalised"] is True
    # Without normalisation the readings are the raw ones.
    forget()
    plain = run(module_with_pairs(), spec.replace("}", " normalise=false}"))
    assert plain.attrs["profile_normalised"] is False and "raw_measured_us" not in plain.plan_ops("pair")[0].attrs
    for a, b in zip(busy.plan_ops("pair"), plain.plan_ops("pair")):
        assert b.attrs["measured_us"] == pytest.approx(a.attrs["raw_measured_us"], rel=0.02)


def test_second_run_uses_the_cache_and_a_killed_run_resumes(counting):
    spec = f"profile{{mode=measured repeats=2 cache-dir={counting} scale=0.001}}"
    first = run(module_with_pairs(), spec)
    assert len(CountingExecutor.calls) == 2
    second = run(module_with_pairs(), spec)
    assert len(CountingExecutor.calls) == 2  # nothing executed again
    assert [op.attrs["cost_source"] for op in second.plan_ops("pair")] == ["cache", "cache"]
    assert [op.attrs["post_overlap_us"] for op in second.plan_ops("pair")] == [op.attrs["post_overlap_us"] for op in first.plan_ops("pair")]
    # Simulate a run killed while writing its second entry: one entry gone, a stray
    # temporary file left. The rerun measures only the missing pair.
    cache = ProfileCache(counting)
    files = sorted(cache.dir.glob("*.json"), key=os.path.getmtime)
    files[-1].unlink()
    (cache.dir / ".deadbeef.partial.tmp").write_text("{")
    third = run(module_with_pairs(), spec)
    assert len(CountingExecutor.calls) == 3
    assert sorted(op.attrs["cost_source"] for op in third.plan_ops("pair")) == ["cache", "measured"]
    stored = cache.entries()
    assert len(stored) == 2 and all(e.repeats == 2 and e.method.startswith("counted") and e.when for e in stored)


def test_identical_pairs_are_measured_once(counting):
    m = module_with_pairs()
    add_pair(m, "pair.2", ["l2"], ["l1"])  # same kinds and work as pair.0 (l0/l2, l1/l3 alike)
    run(m, f"profile{{mode=measured repeats=1 cache-dir={counting} scale=0.001}}")
    assert len(CountingExecutor.calls) == 2
    costs = {op.name: op.attrs["post_overlap_us"] for op in m.plan_ops("pair")}
    assert costs["pair.0"] == costs["pair.2"]


def test_cache_only_miss_names_the_pair_and_the_fix(counting):
    run(module_with_pairs(), f"profile{{mode=measured repeats=1 cache-dir={counting} scale=0.001}}")
    m = module_with_pairs()
    add_pair(m, "pair.9", ["l3"], ["l2"])
    with pytest.raises(PassError, match=r"pair @pair.9 has no cached measurement.*mode=measured"):
        run(m, f"profile{{mode=cache-only cache-dir={counting} scale=0.001}}")
    hit = run(module_with_pairs(), f"profile{{mode=cache-only cache-dir={counting} scale=0.001}}")
    assert {op.attrs["cost_source"] for op in hit.plan_ops("pair")} == {"cache"}
    assert len(CountingExecutor.calls) == 2


def test_calibrations_by_median_and_by_min_are_kept_apart(counting):
    # The fixture calibrated by median only; comparing by min needs its own calibration.
    with pytest.raises(PassError, match="not been calibrated"):
        run(module_with_pairs(), f"profile{{mode=cache-only statistic=min cache-dir={counting} scale=0.001}}")
    assert calibration_path(counting, statistic="min") != calibration_path(counting, statistic="median")


def test_cache_only_without_calibration_says_how_to_calibrate(tmp_path, monkeypatch):
    monkeypatch.setattr(pair_executor, "PairExecutor", CountingExecutor)
    with pytest.raises(ProfileError, match="not been calibrated.*mode=measured"):
        ProfilePass(mode="cache-only", cache_dir=str(tmp_path)).apply(module_with_pairs())


# ---------------------------------------------------------------------------
# Real processes: calibration and a measured pair


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory):
    root = tmp_path_factory.mktemp("tessera-cache")
    return root, cpu_hardware(root, quick=True)


@pytest.mark.slow
def test_cpu_calibration_gives_sane_positive_figures(calibrated, monkeypatch):
    root, hw = calibrated
    assert hw.name == "cpu"
    assert hw.peak_tflops["fp32"] > 0 and all(v > 0 for v in hw.peak_tflops.values())
    assert hw.hbm_gbps > 0 and hw.a2a_gbps(2) > 0 and hw.a2a_latency_us > 0 and hw.kernel_launch_us > 0
    params = ContentionParams.from_hardware(hw, 2)
    assert 0 <= params.sm_share_lost < 1 and 0 <= params.comm_hbm_share < 1
    assert params.comm_slowdown_per_compute >= 0 and params.comm_slowdown_per_memory >= 0
    assert params.cross_stream_sync_us >= 0 and hw.extra["pair_overhead_us"] >= 0
    assert params.comm_wait_beside_compute_us >= 0
    provenance = hw.extra["calibration"]
    assert provenance["quick"] is True and provenance["host"] and provenance["versions"]["torch"]
    # Cached: asking again reads the file instead of measuring.
    from passes.costs import calibrate_cpu

    monkeypatch.setattr(calibrate_cpu, "calibrate", lambda *args, **kwargs: pytest.fail("measured again"))
    assert calibration_path(root).is_file() and cpu_hardware(root) == hw


@pytest.mark.slow
def test_measured_profile_executes_pairs_for_real(calibrated):
    root, _ = calibrated
    m = synthetic_module(KINDS[:2], gemm_flops=10**9, mixer_flops=10**9, a2a_bytes=2 * 10**6, parallel=ParallelConfig(ep=2))
    add_pair(m, "pair.0", ["l0"], ["l1"])
    run(m, f"profile{{mode=measured repeats=2 cache-dir={root} target-ms=3}}")
    op = m.plan_ops("pair")[0]
    assert op.attrs["cost_source"] == "measured" and op.attrs["measured_us"] > 0 and op.attrs["spread_us"] >= 0
    assert m.attrs["profile_hardware"] == "cpu" and "gloo" in m.attrs["profile_device"]
    again = synthetic_module(KINDS[:2], gemm_flops=10**9, mixer_flops=10**9, a2a_bytes=2 * 10**6, parallel=ParallelConfig(ep=2))
    add_pair(again, "pair.0", ["l0"], ["l1"])
    run(again, f"profile{{mode=cache-only cache-dir={root} target-ms=3}}")
    assert again.plan_ops("pair")[0].attrs["post_overlap_us"] == op.attrs["post_overlap_us"]


def test_a_rerun_replaces_the_other_modes_figures_and_the_ir_round_trips(counting):
    from tessera_ir import print_module
    from tessera_ir.parser import parse_module

    m = module_with_pairs()
    run(m, f"profile{{mode=measured repeats=1 cache-dir={counting} scale=0.001}}")
    text = print_module(m)
    assert parse_module(text) == m  # negative errors, floats and strings all print and parse back
    assert "measured_us" in m.plan_ops("pair")[0].attrs and "profile_error_mean" in m.attrs
    run(m, "profile{mode=analytic}")
    assert "measured_us" not in m.plan_ops("pair")[0].attrs and "profile_error_mean" not in m.attrs
    assert m.plan_ops("pair")[0].attrs["cost_source"] == "analytic"


def test_pairs_sharing_a_retiming_get_exactly_their_own_figures():
    # The pass re-times each distinct (name-free) input once and copies the result; every
    # pair must get exactly what re-timing it alone gives.
    m = synthetic_module(KINDS * 2, gemm_flops=10**12, a2a_bytes=2 * 10**8, parallel=ParallelConfig(ep=8))
    for k, (f, b) in enumerate([(["l0"], ["l1"]), (["l2"], ["l3"]), (["l4"], ["l5"]), (["l0", "l1"], ["l6"]),
                                (["l4", "l5"], ["l2"]), (["embed", "l0"], ["l7", "head"]), ([], ["l3"])]):
        m.plan.append(PlanOp("pair", f"pair.{k}", {"fwd": refs(*f), "bwd": refs(*b)}))
    run(m, "overlap-schedule,profile")
    view = PlanView(m)
    contention = ContentionParams.from_hardware(H100, view.parallel.ep)
    keys = set()
    for op in m.plan_ops("pair"):
        tasks = contended_tasks(view.scheduled_tasks(view.pair(op.name)), view.duration, view.utilisation)
        contended, free = analytic_cost(tasks, contention)
        assert op.attrs["post_overlap_us"] == contended.makespan
        assert op.attrs["serial_us"] == contended.isolated_sum
        assert op.attrs["overlap_us"] == free.makespan
        keys.add(retime_key(tasks))
    assert len(keys) < len(m.plan_ops("pair"))  # some pairs did share


def test_retime_key_ignores_names_but_not_order_or_work():
    from dataclasses import replace

    from passes.costs.contention import ContendedTask

    tasks = [ContendedTask("a", "compute", 5.0, 0), ContendedTask("b", "comm", 3.0, 0, ("a",)),
             ContendedTask("c", "compute", 2.0, 1, ("b",), 0.5, 1.0)]
    renamed = [replace(t, name=t.name.upper(), deps=tuple(d.upper() for d in t.deps)) for t in tasks]
    assert retime_key(renamed) == retime_key(tasks)
    assert retime_key([tasks[0], tasks[1], replace(tasks[2], deps=("a",))]) != retime_key(tasks)
    assert retime_key([tasks[0], tasks[1], replace(tasks[2], mem_util=0.9)]) != retime_key(tasks)
    assert retime_key([tasks[0], replace(tasks[1], bandwidth_share=0.1), tasks[2]]) != retime_key(tasks)
    swapped = [replace(tasks[0], order=1), tasks[1], replace(tasks[2], order=0, deps=())]
    assert retime_key(swapped) != retime_key(tasks)


def test_retime_key_refuses_lists_that_retime_refuses():
    from passes.costs.contention import ContendedTask

    assert retime_key([ContendedTask("a", "compute", 1.0, 0), ContendedTask("a", "comm", 1.0, 0)]) is None
    assert retime_key([ContendedTask("a", "compute", 1.0, 0, ("ghost",))]) is None
