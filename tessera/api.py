"""The Python API: the one place that wires the frontend, the passes and the IR text together."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from passes.costs.hardware import CPU, DEFAULT_HARDWARE, Hardware, allow_hardware_file, is_shipped_name, load_hardware
from passes.manager import ModulePass, PassManager, parse_pipeline
from tessera.io import read_text, write_atomic
from tessera_ir import Module, print_module

if TYPE_CHECKING:
    from passes.simulation.capacity import CapacityReport
    from passes.simulation.routing import RoutingKind

# The planning pipeline `tessera-compile` runs after capture, in the order of docs/architecture.md:
# it ends with the per-rank programs (with the DBO slots `dbo-slots` placed), which
# `-o plan.tsb` writes as bytecode.
DEFAULT_PIPELINE = "candidates,overlap-schedule,profile,partition,dbo-slots,pipeline"


def capture(source: Any, layer_kinds: Any = None, suggested: Any = None, **parallel: Any) -> Module:
    """Capture a model (``hf:<type>``, a config.json path, a model.py path or an nn.Module) into IR.

    ``layer_kinds`` sets mixer kinds by layer: ``{3: "linear_attention"}`` or ``["3=linear_attention"]``;
    ``suggested``, when given, receives the source's own parallel settings (below ``parallel``).
    """
    import frontend

    overrides = {k: v for k, v in parallel.items() if v is not None}
    return frontend.capture(source, overrides=overrides, layer_kinds=layer_kinds, suggested=suggested)


def _announce_calibration(path: Path) -> None:
    print(
        f"calibrating the local CPU for --hardware cpu (a minute or two, once; cached in {path})",
        file=sys.stderr, flush=True,
    )


def resolve_hardware(hardware: str) -> Hardware:
    """Load the target ``hardware`` (a shipped name or a path the caller gives, which is then
    allowed as a target for the rest of the process); ``cpu`` is calibrated first if it
    never was, with a message on stderr (calibration runs only when ``cpu`` is asked for)."""
    if hardware == CPU:
        from passes.costs.calibrate_cpu import cpu_hardware

        return cpu_hardware(announce=_announce_calibration)
    if not is_shipped_name(hardware):
        allow_hardware_file(hardware)
    return load_hardware(hardware)


def run_passes(
    module: Module,
    pipeline: str | list[ModulePass],
    verify: bool = True,
    dump_after: Callable[[ModulePass, Module], None] | None = None,
    verify_each: bool = True,
) -> PassManager:
    """Run a pipeline (its text, or passes already parsed) on ``module`` in place.

    ``verify``: the verifier checks the passes' work, after every pass (``verify_each``, which
    names the pass that broke an invariant) or once on the result (faster: what a compile from
    the command line does unless given ``--verify-each``).
    """
    passes = pipeline if isinstance(pipeline, list) else (parse_pipeline(pipeline) if pipeline.strip() else [])
    manager = PassManager(passes, verify_each=verify and verify_each, dump_after=dump_after, verify_end=verify)
    manager.run(module)
    return manager


def compile(  # noqa: A001
    source: Any, pipeline: str | None = None, verify: bool = True, hardware: str = DEFAULT_HARDWARE,
    layer_kinds: Any = None, ledger: str | None = None, cache: bool = True, verify_each: bool = False,
    forks: bool | None = None, settings: dict[str, Any] | None = None, **parallel: Any
) -> Module:
    """Capture ``source`` and plan it for ``hardware`` (``DEFAULT_PIPELINE`` unless given).

    ``layer_kinds`` sets mixer kinds by layer, as in ``capture``; ``ledger``: a training
    run's prediction ledger whose measurements replace the estimates (``with_ledger``).
    The compile runs on the one driver ``tessera-compile`` runs on (``tessera.compiling``): it
    reads and writes the compile cache unless ``cache=False``, captures in a forked child and
    verifies the planned module in a forked process where that is safe (``forks``: None, while
    this process runs one Python thread), and verifies after every pass with ``verify_each``.
    Capture's warnings are issued as ``tessera.compiling.CompileWarning``. ``settings``: the
    run-wide settings the passes read from the module header (``tessera_ir.run_settings``:
    ``memory_gib``, ``reserved_gib``, ``wgrad_headroom``, ``dbo_memory_budget``, ``dbo_memory_margin``, ``combined``).
    """
    from tessera.compiling import CompileRequest, start_compile

    request = CompileRequest.make(
        source, pipeline, hardware=hardware, layer_kinds=layer_kinds, ledger=ledger, verify=verify,
        verify_each=verify_each, cache=cache, settings=settings, **parallel,
    )
    compilation = start_compile(request, forks=forks)
    compilation.finish()
    return compilation.module()


def with_ledger(passes: list[ModulePass], ledger: str) -> list[ModulePass]:
    """``passes`` with a run's ledger folded in: measured task durations first, measured pairs after profile."""
    from passes.costs.ledger_file import read_observations
    from passes.measured_durations import MeasuredDurationsPass
    from passes.measured_pairs import MeasuredPairsPass

    read_observations(ledger, None)  # an unreadable ledger fails before the capture
    out: list[ModulePass] = [MeasuredDurationsPass(ledger=ledger)]
    for p in passes:
        out.append(p)
        if p.name == "profile":
            out.append(MeasuredPairsPass(ledger=ledger))
    return out


def load_ir(path: str | Path) -> Module:
    from tessera_ir.parser import parse_module

    return parse_module(read_text(path), source=str(path))


def save_ir(module: Module, path: str | Path) -> None:
    write_atomic(path, print_module(module))


def save_plan(module: Module, path: str | Path) -> None:
    """Write ``module``'s per-rank programs as plan bytecode (``.tsb``), atomically."""
    from codegen.emit import plan_bytes

    write_atomic(path, plan_bytes(module))


def report(module: Module) -> str:
    from tessera.report import render_report

    return render_report(module)


def capacity(
    module: Module, routing: RoutingKind = "balanced", iterations: int = 10, dp: int | None = None,
    ledger: str | None = None, **routing_options: Any
) -> CapacityReport:
    """Simulate a planned module's training iterations, with and without the DBO.

    Returns a :class:`passes.simulation.capacity.CapacityReport` (``.render()`` for text,
    ``.to_json()``); ``routing`` is balanced, zipf, drift or trace, ``routing_options`` the
    :class:`passes.simulation.routing.RoutingSpec` fields (``zipf_s``, ``drift``, ``trace``, ``seed``);
    ``ledger``: a training run's prediction ledger, shown in the report (fold it into the plan
    with ``compile(..., ledger=)``).
    """
    from passes.costs.ledger_file import ledger_fold
    from passes.plan_view import PlanView
    from passes.simulation.capacity import plan_capacity
    from passes.simulation.routing import RoutingSpec

    report = plan_capacity(PlanView(module), RoutingSpec(routing, **routing_options), iterations=iterations, dp=dp).report
    if ledger is not None:
        report.ledger = ledger_fold(module, ledger)
    return report
