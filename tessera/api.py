"""The Python API: the one place that wires the frontend, the passes and the IR text together."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from passes.manager import ModulePass, PassManager, parse_pipeline
from tessera.io import write_atomic
from tessera_ir import Module, print_module

# The planning pipeline `tessera-compile` runs after capture, in the order of
# DESIGN.md (the per-rank programs come later).
DEFAULT_PIPELINE = "candidates,overlap-schedule,profile,partition,dbo-slots"


def capture(source: Any, **parallel: Any) -> Module:
    """Capture a model (``hf:<type>``, a config.json path, a model.py path or an nn.Module) into IR."""
    import frontend

    overrides = {k: v for k, v in parallel.items() if v is not None}
    return frontend.capture(source, overrides=overrides)


def run_passes(
    module: Module,
    pipeline: str,
    verify: bool = True,
    dump_after: Callable[[ModulePass, Module], None] | None = None,
) -> PassManager:
    manager = PassManager(parse_pipeline(pipeline) if pipeline.strip() else [], verify_each=verify, dump_after=dump_after)
    manager.run(module)
    return manager


def compile(source: Any, pipeline: str | None = None, verify: bool = True, **parallel: Any) -> Module:  # noqa: A001
    """Capture ``source`` and run the planning pipeline (``DEFAULT_PIPELINE`` unless given)."""
    from tessera_ir.verifier import verify as verify_module

    module = capture(source, **parallel)
    if verify:
        verify_module(module)
    run_passes(module, DEFAULT_PIPELINE if pipeline is None else pipeline, verify=verify)
    return module


def load_ir(path: str | Path) -> Module:
    from tessera_ir.parser import parse_module

    text = Path(path).read_text()
    return parse_module(text, source=str(path))


def save_ir(module: Module, path: str | Path) -> None:
    write_atomic(path, print_module(module))


def report(module: Module) -> str:
    from tessera.report import render_report

    return render_report(module)


def capacity(
    module: Module, routing: str = "balanced", iterations: int = 10, dp: int | None = None, **routing_options: Any
) -> Any:
    """Simulate a planned module's training iterations, with and without the DBO.

    Returns a :class:`passes.simulation.capacity.CapacityReport` (``.render()`` for text,
    ``.to_json()``); ``routing`` is balanced, zipf, drift or trace, ``routing_options`` the
    :class:`passes.simulation.routing.RoutingSpec` fields (``zipf_s``, ``drift``, ``trace``, ``seed``).
    """
    from passes.simulation.capacity import plan_capacity
    from passes.simulation.routing import RoutingSpec

    return plan_capacity(module, RoutingSpec(routing, **routing_options), iterations=iterations, dp=dp).report
