"""The on-disk schedule cache: hits give byte-identical plans, only changed DAGs are scheduled
again, and nothing damaged or foreign is trusted."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from passes.overlap_schedule import OverlapSchedulePass
from passes.scheduling import methods
from passes.scheduling.cache import ScheduleCache, ScheduleCacheWarning, dag_signature, sampled, schedule_key
from passes.scheduling.gap_fit import SCHEDULER_VERSION
from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import PairSchedule
from tessera_ir.model import Module, PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig
from tessera_ir.printer import print_module

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


def body(path: Path) -> dict:  # type: ignore[type-arg]
    """A schedule entry's body (after the cache protocol's header line)."""
    return json.loads(path.read_text().split("\n", 1)[1])  # type: ignore[no-any-return]


def many_pairs_module() -> Module:
    module = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(ep=8))
    pairs = [([f"l{i}"], [f"l{j}"]) for i in range(4) for j in range(4)] + [(["l0", "l1"], ["l2", "l3"])]
    for k, (f, b) in enumerate(pairs):
        module.plan.append(PlanOp("pair", f"pair.{k}", {"fwd": [SymbolRef(x) for x in f], "bwd": [SymbolRef(x) for x in b]}))
    return module


def counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the DAG of every schedule actually computed."""
    seen: list[str] = []
    real = methods.SCHEDULERS["gap-fit"]

    def spy(dag: PairDAG) -> PairSchedule:
        seen.append(dag.name)
        return real(dag)

    monkeypatch.setitem(methods.SCHEDULERS, "gap-fit", spy)
    return seen


def test_warm_run_reuses_every_schedule_and_prints_the_same_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting(monkeypatch)
    cold, warm, uncached = many_pairs_module(), many_pairs_module(), many_pairs_module()
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(cold)
    scheduled = len(seen)
    assert scheduled == len(cold.plan_ops("pair_schedule")) >= 4
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(warm)
    assert len(seen) == scheduled  # nothing scheduled again
    OverlapSchedulePass(cache=False, jobs=1).apply(uncached)
    assert print_module(warm) == print_module(cold) == print_module(uncached)
    entries = list((tmp_path / "schedules").glob("*.json"))
    assert len(entries) == scheduled
    assert all(body(p)["proven"] is True for p in entries)  # verify=new proved each once


def test_changing_one_layer_cost_reschedules_only_its_dags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = counting(monkeypatch)
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(many_pairs_module())
    first = len(seen)
    changed = many_pairs_module()
    layer = changed.decoder_layers()[0]
    for t in layer.tasks:
        t.attrs["duration_us"] = 7.0
    seen.clear()
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(changed)
    holders = [
        op for op in changed.plan_ops("pair_schedule") if any(e.ref.startswith(f"{layer.name}.") for e in op.entries)
    ]
    # Exactly the DAGs that hold the changed layer were scheduled again.
    assert 0 < len(seen) == len(holders) < len(changed.plan_ops("pair_schedule"))
    assert first > 0


def test_damaged_or_foreign_entries_are_ignored_with_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(many_pairs_module())
    clean = many_pairs_module()
    OverlapSchedulePass(cache=False, jobs=1).apply(clean)
    entries = sorted((tmp_path / "schedules").glob("*.json"))
    entries[0].write_text("{not json")
    # Another entry's file in this one's place: it names the other key.
    entries[1].write_bytes(entries[3].read_bytes())
    # A well-formed entry whose schedule is wrong: every task at time 0.
    bad = body(entries[2])
    bad["start"] = [0.0] * len(bad["start"])
    key = entries[2].stem
    ScheduleCache(tmp_path).disk.write(key, json.dumps(bad))
    seen = counting(monkeypatch)
    module = many_pairs_module()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(module)
    messages = [str(w.message) for w in caught if issubclass(w.category, ScheduleCacheWarning)]
    assert len(messages) == 3 and len(seen) == 3
    assert any("is damaged" in m for m in messages)
    assert any("another key" in m for m in messages)
    assert any("invalid schedule" in m and "violates" in m for m in messages)
    assert print_module(module) == print_module(clean)  # what was ignored was scheduled again
    # ... and overwritten: the next run hits every entry without a warning.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(many_pairs_module())
    assert not [w for w in caught if issubclass(w.category, ScheduleCacheWarning)]


def test_the_key_follows_durations_deadlines_and_the_scheduler(tmp_path: Path) -> None:
    module = many_pairs_module()
    OverlapSchedulePass(cache=False, jobs=1).apply(module)
    from passes.plan_view import PlanView

    view = PlanView(module)
    dag = view.pair_dag(view.pair(module.plan_ops("pair")[0].name))
    key = schedule_key(dag, SCHEDULER_VERSION, {"method": "gap-fit"})
    renamed = PairDAG("other", [t.__class__(**{**t.__dict__, "name": "x" + t.name, "layer": "y"}) for t in dag.tasks])
    assert schedule_key(renamed, SCHEDULER_VERSION, {"method": "gap-fit"}) == key  # names do not matter
    longer = PairDAG("d", [t.__class__(**{**t.__dict__, "duration": t.duration + 1e-9 * (i == 0)}) for i, t in enumerate(dag.tasks)])
    assert dag_signature(longer) != dag_signature(dag)
    assert schedule_key(longer, SCHEDULER_VERSION, {"method": "gap-fit"}) != key
    assert schedule_key(dag, SCHEDULER_VERSION + "x", {"method": "gap-fit"}) != key
    assert schedule_key(dag, SCHEDULER_VERSION, {"method": "serial"}) != key
    assert isinstance(sampled(key), bool)


def test_size_cap_removes_least_recently_used_entries(tmp_path: Path) -> None:
    import os

    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1).apply(many_pairs_module())
    files = sorted((tmp_path / "schedules").glob("*.json"))
    assert len(files) >= 3
    for age, p in enumerate(files):  # files[-1] was used last
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    cap = files[-1].stat().st_size + files[-2].stat().st_size
    removed = ScheduleCache(tmp_path, max_bytes=cap).trim()
    assert removed == len(files) - 2
    assert sorted((tmp_path / "schedules").glob("*.json")) == files[-2:]
    with pytest.raises(Exception, match="cache-max-mb must be a positive"):
        OverlapSchedulePass(cache_max_mb=0)


def test_no_cache_turns_off_only_passes_that_have_a_cache() -> None:
    from passes.manager import parse_pipeline, without_cache

    overlap, profile = parse_pipeline("overlap-schedule{verify=sample},profile")
    off = without_cache(overlap)
    assert isinstance(off, OverlapSchedulePass) and off.cache is False and off.verify == "sample"
    assert without_cache(profile) is profile


def test_verify_sample_proves_exactly_the_sampled_dags(tmp_path: Path) -> None:
    OverlapSchedulePass(cache_dir=str(tmp_path), jobs=1, verify="sample").apply(many_pairs_module())
    entries = {p.stem: body(p) for p in (tmp_path / "schedules").glob("*.json")}
    assert entries and all(e["proven"] is sampled(key) for key, e in entries.items())
