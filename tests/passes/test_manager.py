"""The pass manager: pipeline spelling, options, verification between passes, error context."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytest

from passes.manager import (
    PASS_REGISTRY,
    ModulePass,
    PassError,
    PassManager,
    describe_options,
    finish_later,
    get_pass_class,
    note_time,
    option,
    parse_pipeline,
)
from tessera_ir.model import Module

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class TagPass(ModulePass):
    """Test pass: sets a module attribute, optionally breaking the module afterwards."""

    name = "test-tag"
    summary = "test only"
    value: int = 1
    label: str = "x"
    enabled: bool = True
    scale: float = 1.0
    corrupt: bool = False
    mode: Literal["fast", "slow"] = "fast"
    size: float | Literal["auto"] = "auto"
    limit: int | None = option(None, "an optional count")

    def check(self) -> None:
        if self.value < 0:
            raise PassError(f"test-tag: value must be >= 0, got {self.value}")

    def apply(self, module: Module) -> bool:
        module.attrs[f"tag_{self.label}"] = self.value
        if self.corrupt:
            first = module.layers[1].tasks[0]
            first.deps.append("no.such.task")
        return True


@pytest.fixture(autouse=True)
def _register_test_pass() -> object:
    PASS_REGISTRY["test-tag"] = f"{__name__}:TagPass"
    yield
    PASS_REGISTRY.pop("test-tag", None)


def test_parse_pipeline_options_and_types() -> None:
    passes = parse_pipeline("verify,test-tag{value=3 label=y enabled=false scale=0.5},test-tag")
    assert [p.name for p in passes] == ["verify", "test-tag", "test-tag"]
    tag = passes[1]
    assert isinstance(tag, TagPass)
    assert (tag.value, tag.label, tag.enabled, tag.scale) == (3, "y", False, 0.5)
    assert tag.spelling() == "test-tag{value=3 label=y enabled=false scale=0.5}"
    assert passes[2].spelling() == "test-tag"


def test_literal_union_and_optional_options() -> None:
    (tag,) = parse_pipeline('test-tag{mode=slow, size=0.25 limit=4 label="a b"}')
    assert isinstance(tag, TagPass)
    assert (tag.mode, tag.size, tag.limit, tag.label) == ("slow", 0.25, 4, "a b")
    assert parse_pipeline(tag.spelling()) == [tag]  # the spelling reads back, quotes and all
    (auto,) = parse_pipeline("test-tag{size=auto}")
    assert isinstance(auto, TagPass) and auto.size == "auto" and auto.limit is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nope", "unknown pass 'nope'; known passes: candidates, dbo-slots, measured-durations, measured-pairs, overlap-schedule"),
        ("test-tag{bogus=1}", "has no option 'bogus'; its options: value, label"),
        ("test-tag{value=abc}", "option 'value' of pass 'test-tag' takes int, got 'abc'"),
        ("test-tag{value=1.5}", "takes int, got '1.5'"),
        ("test-tag{enabled=maybe}", "option 'enabled' of pass 'test-tag' takes bool, got 'maybe'"),
        ("test-tag{mode=medium}", "option 'mode' of pass 'test-tag' takes fast|slow, got 'medium'"),
        ("test-tag{size=big}", "option 'size' of pass 'test-tag' takes float or auto, got 'big'"),
        ("test-tag{limit=lots}", "takes int (optional), got 'lots'"),
        ("test-tag{value=-1}", "test-tag: value must be >= 0, got -1"),
        ("test-tag{value=1 value=2}", "sets option 'value' twice"),
        ("test-tag{value=1", "found the end at column 17, expected ',' or '}' or an option name"),
        ("test-tag{value}", "found '}' at column 15, expected '='"),
        ("verify,,verify", "found ',' at column 8, expected a pass name"),
        ("test-tag{value=1}x", "found 'x' at column 18, expected ','"),
    ],
)
def test_bad_pipelines_are_rejected_with_a_reason(spec: str, fragment: str) -> None:
    with pytest.raises(PassError) as info:
        parse_pipeline(spec)
    assert fragment in str(info.value)


def test_options_are_checked_when_a_pass_is_built_in_python_too() -> None:
    with pytest.raises(PassError, match="option 'mode' of pass 'test-tag' is 'medium'; it takes fast|slow"):
        TagPass(mode="medium")  # type: ignore[arg-type]
    with pytest.raises(PassError, match="option 'limit' of pass 'test-tag' is 'x'; it takes int \\(optional\\)"):
        TagPass(limit="x")  # type: ignore[arg-type]


def test_every_registered_pass_describes_its_options() -> None:
    for name in PASS_REGISTRY:
        cls = get_pass_class(name)
        assert cls.summary
        for info in describe_options(cls):
            assert info.type and info.default
            assert info.help or name == "test-tag", f"option {info.name} of {name} has no help text"
    shown = {o.name: o for o in describe_options(get_pass_class("partition"))}
    assert (shown["search"].type, shown["search"].default) == ("window|global", "window")
    assert (shown["time-limit"].type, shown["time-limit"].default) == ("float", "60.0")
    jobs = {o.name: o for o in describe_options(get_pass_class("overlap-schedule"))}["jobs"]
    assert (jobs.type, jobs.default) == ("int (optional)", "unset")


def test_a_bad_option_fails_before_anything_heavy_is_imported() -> None:
    # The check runs at parse time and pass modules load no solver, torch or z3 at import.
    code = (
        "import sys\n"
        "from passes.manager import parse_pipeline, PassError\n"
        "try:\n"
        "    parse_pipeline('candidates,overlap-schedule,profile,partition{search=nope}')\n"
        "except PassError as err:\n"
        "    print(err)\n"
        "print(sorted(m for m in ('torch', 'pulp', 'z3', 'frontend') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    first, second = done.stdout.splitlines()
    assert "option 'search' of pass 'partition' takes window|global, got 'nope'" in first
    assert second == "[]"


def test_manager_runs_passes_records_timing_and_dumps() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN)
    dumped: list[str] = []
    manager = PassManager(parse_pipeline("test-tag{value=7},verify"), dump_after=lambda p, m: dumped.append(p.name))
    manager.run(module)
    assert module.attrs["tag_x"] == 7
    assert [t.name for t in manager.timings] == ["test-tag", "verify"]
    assert [t.modified for t in manager.timings] == [True, False]
    assert dumped == ["test-tag", "verify"]


def test_invalid_result_names_the_pass_and_its_predecessors() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN)
    manager = PassManager(parse_pipeline("verify,test-tag{corrupt=true}"))
    with pytest.raises(PassError) as info:
        manager.run(module)
    message = str(info.value)
    assert "test-tag{corrupt=true}" in message
    assert "passes run before it: verify" in message
    assert "no.such.task" in message


def test_verification_can_be_turned_off() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN)
    PassManager(parse_pipeline("test-tag{corrupt=true}"), verify_each=False).run(module)
    assert "no.such.task" in module.layers[1].tasks[0].deps


def test_parts_a_pass_times_go_to_the_timings_not_the_module() -> None:
    @dataclass(frozen=True)
    class Timed(ModulePass):
        name = "timed"
        summary = "test only"

        def apply(self, module: Module) -> bool:
            note_time("inner work", 0.25)
            return False

    module = synthetic_module(QWEN3_NEXT_PATTERN)
    manager = PassManager([Timed()])
    manager.run(module)
    assert manager.timings[0].parts == [("inner work", 0.25)]
    note_time("outside any pass", 1.0)  # ignored, not an error


def test_verify_at_the_end_only_checks_the_result_and_says_how_to_find_the_pass() -> None:
    module = synthetic_module(QWEN3_NEXT_PATTERN)
    manager = PassManager(parse_pipeline("test-tag{corrupt=true},test-tag{label=y}"), verify_each=False, verify_end=True)
    with pytest.raises(PassError) as info:
        manager.run(module)
    message = str(info.value)
    assert "after passes test-tag{corrupt=true},test-tag{label=y} is invalid" in message
    assert "--verify-each" in message and "no.such.task" in message
    assert [t.verify_seconds for t in manager.timings] == [0.0, 0.0]  # nothing verified between passes
    good = synthetic_module(QWEN3_NEXT_PATTERN)
    checked = PassManager(parse_pipeline("test-tag"), verify_each=False, verify_end=True)
    checked.run(good)
    assert checked.verify_end_seconds > 0


def test_work_left_running_finishes_after_the_last_pass_or_is_cancelled() -> None:
    events: list[str] = []

    @dataclass(frozen=True)
    class Leaves(ModulePass):
        name = "leaves"
        summary = "test only"
        fail: bool = False

        def apply(self, module: Module) -> bool:
            def finish() -> None:
                events.append("finish")
                if self.fail:
                    raise PassError("what the background check found")

            finish_later("a background check", finish, lambda: events.append("cancel"))
            events.append("applied")
            return False

    @dataclass(frozen=True)
    class Breaks(ModulePass):
        name = "breaks"
        summary = "test only"

        def apply(self, module: Module) -> bool:
            raise PassError("breaks: broken")

    module = synthetic_module(QWEN3_NEXT_PATTERN)
    manager = PassManager([Leaves(), TagPass()])
    manager.run(module)
    assert events == ["applied", "finish"]  # after test-tag ran, not inside leaves
    events.clear()
    with pytest.raises(PassError) as info:
        PassManager([Leaves(fail=True), TagPass()]).run(module)
    assert str(info.value).startswith("pass 'leaves{fail=true}' failed (passes run before it: (none)): what the")
    assert events == ["applied", "finish"]
    events.clear()
    with pytest.raises(PassError, match="breaks: broken"):
        PassManager([Leaves(), Breaks()]).run(module)
    assert events == ["applied", "cancel"]  # a failed pipeline stops the work, never waits for it
    events.clear()
    Leaves().apply(module)  # outside a pass manager the work finishes at once
    assert events == ["finish", "applied"]


# ---------------------------------------------------------------- plan ops a pass needs and makes


def test_a_pass_needing_ops_no_earlier_pass_makes_is_refused_when_the_pipeline_is_parsed() -> None:
    """For a module just captured (no plan ops), the pipeline is checked as it is parsed."""
    with pytest.raises(PassError, match=r"pass 'partition' needs the plan's 'candidate' ops.*'candidates' makes them, "
                                        r"but runs after it here: move 'candidates' before 'partition'"):
        parse_pipeline("partition,candidates", available=())
    with pytest.raises(PassError, match=r"pass 'pipeline' needs the plan's 'partition' ops.*run 'partition' before it"):
        parse_pipeline("candidates,overlap-schedule,pipeline", available=())
    with pytest.raises(PassError, match=r"pass 'refine-bottleneck' needs the plan's 'pair_schedule' ops.*"
                                        r"run 'overlap-schedule' before it"):
        parse_pipeline("candidates,partition,refine-bottleneck", available=())
    full = "candidates,wgrad-deadlines,overlap-schedule,profile,partition,refine-bottleneck,dbo-slots,pipeline"
    assert [p.name for p in parse_pipeline(full, available=())] == full.split(",")
    assert parse_pipeline("partition,candidates")  # the module is not known yet: the manager checks it


def test_the_manager_checks_the_pipeline_against_the_module_before_any_pass_runs() -> None:
    from tessera_ir.printer import print_module

    module = synthetic_module(QWEN3_NEXT_PATTERN)
    before = print_module(module)
    with pytest.raises(PassError, match=r"pass 'partition' needs the plan's 'candidate' ops, but the module holds no "
                                        r"candidate op"):
        PassManager(parse_pipeline("partition,candidates")).run(module)
    assert print_module(module) == before  # not even candidates ran
    PassManager(parse_pipeline("candidates")).run(module)
    PassManager(parse_pipeline("partition")).run(module)  # the module holds what partition needs now
    assert module.plan_ops("partition")


def test_every_registered_pass_declares_only_plan_op_kinds() -> None:
    kinds = {"candidate", "pair", "pair_schedule", "partition", "dbo_slot", "dbo_pool", "pipeline", "program"}
    for name in PASS_REGISTRY:
        cls = get_pass_class(name)
        assert set(cls.requires) <= kinds and set(cls.produces) <= kinds, name
