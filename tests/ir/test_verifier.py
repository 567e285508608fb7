"""Verifier checks: one invalid file per check, plus unit cases built in Python."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tessera_ir import parse_module, print_module, verify
from tessera_ir.errors import VerifyError
from tessera_ir.kinds import FfnKind, MixerKind, Phase, Resource, TaskOp
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef, Task
from tessera_ir.verifier import CHECKS, collect_errors

from .builders import DecoderSpec, add_pair_schedule, build_module, qwen3_next_like

INVALID = sorted((Path(__file__).parent / "invalid").glob("*_invalid.tir"))
CHECK_LINE = re.compile(r"// CHECK-ERROR: ([a-z-]+): (.+)")


def test_every_check_has_an_invalid_file() -> None:
    covered = {path.name.removesuffix("_invalid.tir") for path in INVALID}
    assert covered == set(CHECKS)


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_invalid_file_fires_its_check(path: Path) -> None:
    text = path.read_text()
    first_line = text.splitlines()[0]
    match = CHECK_LINE.fullmatch(first_line)
    assert match, f"{path.name} must start with '// CHECK-ERROR: <check>: <message>'"
    check_name, expected = match.groups()
    assert path.name == f"{check_name}_invalid.tir"
    module = parse_module(text, source=str(path))
    errors = [e for e in collect_errors(module) if e.check == check_name]
    assert errors, f"check '{check_name}' did not fire on {path.name}"
    matching = [e for e in errors if expected in e.message]
    assert matching, f"no '{check_name}' error contains {expected!r}: {[e.message for e in errors]}"
    err = matching[0]
    assert err.line is not None and err.line > 2  # past the two comment lines, on the entity
    assert err.column is not None and err.source == str(path)
    assert str(err).startswith(f"{path}:{err.line}:{err.column}: [{check_name}]")
    # verify() raises; and only this file's edit is wrong, so the base it came from is clean.
    with pytest.raises(VerifyError):
        verify(module)


def _module() -> Module:
    return build_module(
        "m",
        [
            DecoderSpec(MixerKind.LINEAR_ATTENTION, FfnKind.MOE, shared_expert=True),
            DecoderSpec(MixerKind.ATTENTION, FfnKind.DENSE),
        ],
    )


def _errors(module: Module, check: str) -> list[str]:
    # VerifyError.message starts with "[check] "; the tests compare what follows.
    return [e.message.removeprefix(f"[{e.check}] ") for e in collect_errors(module, [check])]


def test_built_module_is_clean_and_verify_returns() -> None:
    module = _module()
    assert collect_errors(module) == []
    verify(module)


def test_verify_raises_the_first_error_with_its_check() -> None:
    module = _module()
    module.layers[1].index = 7
    module.task_map()["l0.router.fwd"].resource = Resource.COMM
    with pytest.raises(VerifyError) as info:
        verify(module)
    assert info.value.check == "resource-matches-kind"  # registered before layer-order
    assert len(collect_errors(module)) == 2


def test_unknown_check_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown verifier check 'no-such'"):
        collect_errors(_module(), ["no-such"])


def test_errors_without_locations_have_no_line() -> None:
    module = _module()
    module.task_map()["l1.dense_mlp.fwd"].flops = -1
    (err,) = collect_errors(module, ["attributes-legal"])
    assert err.line is None and "l1.dense_mlp.fwd" in err.message


def test_duplicate_task_points_at_second_definition() -> None:
    module = _module()
    clone = Task("l0.router.fwd", TaskOp.ROUTER, Phase.FWD, Resource.COMPUTE, shapes=[[1]])
    module.layers[2].tasks.append(clone)
    text = print_module(module)
    parsed = parse_module(text)
    (err,) = collect_errors(parsed, ["unique-names"])
    assert "task name '@l0.router.fwd' is already used by a task" in err.message
    second = [i for i, line in enumerate(text.splitlines(), 1) if "task @l0.router.fwd " in line][1]
    assert err.line == second


def test_symbol_refs_in_nested_attributes_must_resolve() -> None:
    module = _module()
    module.attrs["stages"] = [[SymbolRef("l0")], [SymbolRef("nowhere")]]
    module.plan.append(PlanOp("partition", "p", {}, [PlanEntry("ghost")]))
    messages = _errors(module, "references-resolve")
    assert any("refers to '@nowhere'" in m for m in messages)
    assert any("entry for '@ghost'" in m for m in messages)
    module.task_map()["l0.router.fwd"].deps.append("l0")  # a layer is not a task
    assert any("it names a layer or plan op, not a task" in m for m in _errors(module, "references-resolve"))


def test_cycle_lists_its_tasks() -> None:
    module = _module()
    tasks = module.task_map()
    tasks["l0.linear_attention.fwd"].deps.append("l0.combine.fwd")
    (message,) = _errors(module, "acyclic-dependencies")
    for name in ("l0.linear_attention.fwd", "l0.router.fwd", "l0.dispatch.fwd", "l0.expert_gemm.fwd", "l0.combine.fwd"):
        assert f"@{name}" in message


def test_self_dependency_is_a_cycle() -> None:
    module = _module()
    module.task_map()["l1.attention.fwd"].deps.append("l1.attention.fwd")
    (message,) = _errors(module, "acyclic-dependencies")
    assert "@l1.attention.fwd -> @l1.attention.fwd" in message


def test_comm_task_with_flops_and_bad_pass_attributes() -> None:
    module = _module()
    tasks = module.task_map()
    tasks["l0.dispatch.fwd"].flops = 10
    tasks["l0.router.fwd"].attrs.update(duration_us=-1.0, stream="gpu", start=True, deadline=-3)
    tasks["l0.router.fwd"].shapes = [[4, 0]]
    tasks["l0.router.dgrad"].attrs["weird"] = [1.0, float("nan")]
    module.plan.append(PlanOp("pair_schedule", "p", {}, [PlanEntry("l0.router.fwd", {"start": -2})]))
    messages = _errors(module, "attributes-legal")
    expected = [
        "comm tasks compute nothing",
        "'duration_us' of task '@l0.router.fwd' is -1.0",
        "'stream' of task '@l0.router.fwd' is \"gpu\"",
        "'start' of task '@l0.router.fwd' is true",
        "'deadline' of task '@l0.router.fwd' is -3",
        "shapes = [[4, 0]]",
        "attribute 'weird' of task '@l0.router.dgrad' is nan",
        "'start' of entry '@l0.router.fwd' of plan pair_schedule '@p' is -2",
    ]
    for text in expected:
        assert any(text in m for m in messages), (text, messages)
    assert len(messages) == len(expected)


def test_phase_and_mirror_rules() -> None:
    module = _module()
    layer = module.layers[1]  # l0: moe
    layer.tasks = [t for t in layer.tasks if t.name != "l0.dispatch.dgrad"]
    messages = _errors(module, "backward-mirrors-forward")
    assert messages == ["task '@l0.dispatch.fwd' has no dispatch.dgrad task in layer '@l0'"]
    # The embedding needs no dgrad, and a missing dgrad is no wgrad-after-gradient error.
    assert _errors(module, "wgrad-after-gradient") == []


def test_embedding_wgrad_must_wait_for_some_dgrad() -> None:
    module = _module()
    module.task_map()["embed.embedding.wgrad"].deps = ["embed.embedding.fwd"]
    (message,) = _errors(module, "wgrad-after-gradient")
    assert "embed.embedding.wgrad" in message and "depends on no dgrad task" in message


def test_transitive_dgrad_dependency_is_enough() -> None:
    module = _module()
    wgrad = module.task_map()["l0.expert_gemm.wgrad"]
    wgrad.deps = ["l0.dispatch.dgrad"]  # dispatch.dgrad follows expert_gemm.dgrad
    assert _errors(module, "wgrad-after-gradient") == []


def test_layer_order_rules() -> None:
    module = _module()
    module.layers.append(module.layers.pop(0))  # embedding last
    module.layers[0].index = None
    messages = _errors(module, "layer-order")
    assert any("embedding layer at position 3" in m for m in messages)
    assert any("head layer at position 2" in m for m in messages)
    assert any("has decoder index None, expected 0" in m for m in messages)
    module = _module()
    module.layers[0].index = 0
    assert _errors(module, "layer-order") == [
        "layer '@embed' is a embedding layer with index 0; only decoder layers have an index"
    ]


def test_layer_kind_rules() -> None:
    module = _module()
    module.layers[1].ffn = FfnKind.DENSE
    module.layers[2].ffn = FfnKind.NONE
    module.layers[2].mixer = MixerKind.NONE
    messages = _errors(module, "layer-kinds-match-tasks")
    assert "layer '@l0' has ffn = dense but no dense_mlp task" in messages
    assert any("has ffn = dense but holds MoE tasks (combine, dispatch, expert_gemm, router, shared_expert)" in m for m in messages)
    assert "layer '@l1' has ffn = none but holds feed-forward tasks (dense_mlp)" in messages
    assert "layer '@l1' has mixer = none but holds attention tasks" in messages


def test_large_module_is_clean_and_a_late_error_is_found() -> None:
    module = qwen3_next_like(94)
    assert sum(1 for _ in module.tasks()) > 1500
    assert collect_errors(module) == []
    # A wgrad whose only dependency is its forward: the search walks back through
    # the whole forward chain and must still report it.
    wgrad = module.task_map()["l93.expert_gemm.wgrad"]
    wgrad.deps = ["l93.expert_gemm.fwd"]
    (message,) = _errors(module, "wgrad-after-gradient")
    assert "'@l93.expert_gemm.dgrad'" in message


# --- schedules-valid ------------------------------------------------------------------------------


def _scheduled() -> tuple[Module, PlanOp]:
    """A module whose layer l0 (MoE with a shared expert) has its forward beside its backward,
    scheduled validly; each test breaks one rule of the schedule."""
    module = _module()
    sched = add_pair_schedule(module, "sched.0", [module.layers[1]], [module.layers[1]])
    assert collect_errors(module) == []
    return module, sched


def _entry(sched: PlanOp, ref: str) -> dict:
    return next(e.attrs for e in sched.entries if e.ref == ref)


def _schedule_errors(module: Module) -> list[str]:
    return _errors(module, "schedules-valid")


def test_schedule_dependency_must_finish_first() -> None:
    module, sched = _scheduled()
    _entry(sched, "l0.dispatch.fwd")["start"] = 2.0  # alone on the comm stream still
    (message,) = _schedule_errors(module)
    assert "starts '@l0.dispatch.fwd' at 2.0 us, before its dependency '@l0.router.fwd' finishes at 3.0 us" in message
    assert message.endswith("rerun the overlap-schedule pass to rebuild the schedule")


def test_schedule_streams_are_exclusive_and_match_the_resource() -> None:
    module, sched = _scheduled()
    # After its own dgrad still, but beside another compute task.
    _entry(sched, "l0.shared_expert.wgrad")["start"] = _entry(sched, "l0.expert_gemm.dgrad")["start"]
    (message,) = _schedule_errors(module)
    assert "runs '@l0.expert_gemm.dgrad' [13.5, 15.0) and '@l0.shared_expert.wgrad' [13.5, 15.0) us on the compute stream at once" in message
    module, sched = _scheduled()
    _entry(sched, "l0.dispatch.fwd")["stream"] = "compute"
    assert any('has stream = "compute", but the task runs on "comm"' in m for m in _schedule_errors(module))


def test_schedule_places_every_task_once() -> None:
    module, sched = _scheduled()
    dropped = sched.entries.pop(3)
    assert _schedule_errors(module) == [
        f"plan pair_schedule '@sched.0' has no entry for @{dropped.ref} of pair '@sched.0.pair'; every task of the "
        "pair is placed once; rerun the overlap-schedule pass to rebuild the schedule"
    ]
    module, sched = _scheduled()
    sched.entries.append(PlanEntry(sched.entries[0].ref, dict(sched.entries[0].attrs)))
    assert any("places task '@l0.linear_attention.fwd' more than once" in m for m in _schedule_errors(module))
    module, sched = _scheduled()
    sched.entries.append(PlanEntry("embed.embedding.fwd", {"start": 0.0, "duration": 1.5, "stream": "compute"}))
    assert any("'@embed.embedding.fwd', which is not a task of pair '@sched.0.pair'" in m for m in _schedule_errors(module))


def test_schedule_times_are_finite_non_negative_numbers() -> None:
    for field, value, expected in [
        ("start", -1.0, "has start = -1.0"),
        ("duration", float("inf"), "has duration = inf"),
        ("start", "0", 'has start = "0"'),
        ("start", True, "has start = true"),
        ("duration", None, "has no 'duration'"),
    ]:
        module, sched = _scheduled()
        if value is None:
            del _entry(sched, "l0.router.fwd")[field]
        else:
            _entry(sched, "l0.router.fwd")[field] = value
        assert any(expected in m for m in _schedule_errors(module)), (field, value, _schedule_errors(module))


def test_schedule_durations_follow_duration_us_and_deadlines_hold() -> None:
    module, sched = _scheduled()
    module.task_map()["l0.router.fwd"].attrs["duration_us"] = 2.5  # the schedule still says 1.5
    assert any("lasts 1.5 us, but the task's duration_us is 2.5 us" in m for m in _schedule_errors(module))
    module, sched = _scheduled()
    wgrad = module.task_map()["l0.expert_gemm.wgrad"]
    end = _entry(sched, wgrad.name)["start"] + _entry(sched, wgrad.name)["duration"]
    wgrad.attrs["deadline"] = end  # finishing exactly at the deadline is on time
    assert _schedule_errors(module) == []
    wgrad.attrs["deadline"] = end - 0.5
    assert any(f"finishes movable task '@{wgrad.name}' at {end} us, after its deadline" in m for m in _schedule_errors(module))


def test_schedule_tolerance_is_the_z3_checkers() -> None:
    module, sched = _scheduled()
    dispatch = _entry(sched, "l0.dispatch.fwd")
    dispatch["start"] -= 0.9e-6  # rounding of sums of floats: within 1e-6 us, accepted
    assert _schedule_errors(module) == []
    dispatch["start"] -= 0.2e-6
    (message,) = _schedule_errors(module)
    assert "before its dependency '@l0.router.fwd'" in message


def test_schedule_must_name_pairs_that_list_layers() -> None:
    module, sched = _scheduled()
    sched.attrs["pairs"] = []
    assert _schedule_errors(module) == [
        "plan pair_schedule '@sched.0' names no pair; a pair_schedule lists the pairs it schedules as pairs = [@pair.0, ...]"
    ]
    module, sched = _scheduled()
    sched.attrs["pairs"] = [SymbolRef("l0")]
    assert _schedule_errors(module) == ["plan pair_schedule '@sched.0' lists @l0 under 'pairs', which is no pair op"]
    module, sched = _scheduled()
    pair = module.plan[-2]
    pair.attrs["fwd"] = [SymbolRef("l0"), SymbolRef("l0")]
    assert _schedule_errors(module) == [
        "plan pair_schedule '@sched.0' cannot be checked: pair '@sched.0.pair' lists layer '@l0' twice under 'fwd'"
    ]


def test_a_shared_schedule_fits_every_pair_it_names() -> None:
    module, sched = _scheduled()
    other = PlanOp("pair", "other", {"fwd": [SymbolRef("l1")], "bwd": [SymbolRef("l1")]})
    module.plan.append(other)
    sched.attrs["pairs"] = [SymbolRef("sched.0.pair"), SymbolRef("other")]
    (message,) = _schedule_errors(module)
    assert "is shared by pairs that differ: pair '@other' has" in message


def test_verify_beside_raises_what_verify_raises_after_the_wait() -> None:
    from tessera_ir.verifier import verify_beside

    good = qwen3_next_like()
    verify_beside(good)()  # nothing to raise
    bad = qwen3_next_like()
    bad.layers[1].tasks[0].deps.append("no.such.task")
    with pytest.raises(VerifyError) as beside:
        verify_beside(bad)()
    with pytest.raises(VerifyError) as direct:
        verify(bad)
    assert str(beside.value) == str(direct.value)
