"""The pass manager: pipeline spelling, options, verification between passes, error context."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from passes.manager import PASS_REGISTRY, ModulePass, PassError, PassManager, parse_pipeline
from tessera_ir.model import Module

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


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


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("nope", "unknown pass 'nope'"),
        ("test-tag{bogus=1}", "has no option 'bogus'"),
        ("test-tag{value=abc}", "expects int"),
        ("test-tag{enabled=maybe}", "expects bool"),
        ("test-tag{value=1", "unclosed"),
        ("test-tag{value}", "key=value"),
        ("verify,,verify", "empty pass name"),
        ("test-tag{value=1}x", "expected ','"),
    ],
)
def test_bad_pipelines_are_rejected_with_a_reason(spec: str, fragment: str) -> None:
    with pytest.raises(PassError, match=None) as info:
        parse_pipeline(spec)
    assert fragment in str(info.value)


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
