"""tessera.compile runs on the one compile driver tessera-compile runs on: the compile cache, the
verification of the planned module beside the caller, and the same results as the command line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import tessera.api
import tessera.child_capture
from passes.manager import PASS_REGISTRY, ModulePass
from tessera.cli import compile_main
from tessera.compiling import CompileRequest, start_compile
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module
from tessera_ir.printer import print_module

from .test_compile_cache import PIPELINE, small_config

PARALLEL: dict[str, Any] = {"pp": 2, "vpp": 2, "ep": 4, "microbatches": 8, "seq_len": 512}


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "cache"
    monkeypatch.setenv("TESSERA_CACHE_DIR", str(folder))
    return folder


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    monkeypatch.setattr(tessera.child_capture, "worth_a_child", lambda: False)  # pytest's process has torch
    calls = {"capture": 0, "passes": 0}
    capture, run_passes = tessera.api.capture, tessera.api.run_passes

    def counting_capture(*args: object, **kwargs: object) -> object:
        calls["capture"] += 1
        return capture(*args, **kwargs)  # type: ignore[arg-type]

    def counting_passes(*args: object, **kwargs: object) -> object:
        calls["passes"] += 1
        return run_passes(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(tessera.api, "capture", counting_capture)
    monkeypatch.setattr(tessera.api, "run_passes", counting_passes)
    return calls


@pytest.mark.slow
def test_the_api_reads_and_writes_the_compile_cache_the_command_line_uses(
    tmp_path: Path, cache: Path, counted: dict[str, int]
) -> None:
    config = small_config(tmp_path)
    first = tessera.api.compile(str(config), PIPELINE, **PARALLEL)
    assert counted == {"capture": 1, "passes": 1}
    assert len(list((cache / "plans").glob("*.tir"))) == 1
    again = tessera.api.compile(str(config), PIPELINE, **PARALLEL)
    assert counted == {"capture": 1, "passes": 1}, "the second compile captured or planned again"
    assert print_module(again) == print_module(first)
    uncached = tessera.api.compile(str(config), PIPELINE, cache=False, **PARALLEL)
    assert counted == {"capture": 2, "passes": 2}
    assert print_module(uncached) == print_module(first)
    # The command line is served by the entry the API wrote, and prints the same plan.
    out = tmp_path / "plan.tir"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in PARALLEL.items()]
    assert compile_main([str(config), "--passes", PIPELINE, "-o", str(out), "--no-capacity", *flags]) == 0
    assert counted == {"capture": 2, "passes": 2}
    assert out.read_text() == print_module(first)


@dataclass(frozen=True)
class _BreaksTheModule(ModulePass):
    """Test pass: leaves a dependency on a task that does not exist."""

    name = "test-break"
    summary = "test only"

    def apply(self, module: Module) -> bool:
        module.layers[1].tasks[0].deps.append("no.such.task")
        return True


@pytest.mark.parametrize("forks", [True, False])
def test_a_plan_that_fails_verification_is_refused_and_never_cached(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, forks: bool
) -> None:
    monkeypatch.setitem(PASS_REGISTRY, "test-break", f"{__name__}:_BreaksTheModule")
    config = small_config(tmp_path)
    request = CompileRequest.make(str(config), "test-break,candidates", **PARALLEL)
    compilation = start_compile(request, forks=forks)  # verified beside (forks) or at the wait
    assert compilation.cacheable and not compilation.from_cache
    with pytest.raises(TesseraError, match="invalid after passes test-break,candidates.*no.such.task"):
        compilation.finish()
    assert not list((cache / "plans").glob("*.tir"))
    with pytest.raises(TesseraError, match="invalid after passes test-break,candidates"):
        tessera.api.compile(str(config), "test-break,candidates", **PARALLEL)
    with pytest.raises(TesseraError, match="pass 'test-break' failed .*left an invalid module"):
        tessera.api.compile(str(config), "test-break,candidates", verify_each=True, **PARALLEL)


def test_a_pipeline_needing_ops_nothing_makes_is_refused_before_the_capture(counted: dict[str, int]) -> None:
    with pytest.raises(TesseraError, match="pass 'partition' needs the plan's 'candidate' ops"):
        tessera.api.compile("hf:no_such_model_type", "partition,candidates")
    assert counted == {"capture": 0, "passes": 0}
