"""The one compile driver: capture a model and plan it, for ``tessera.compile`` and ``tessera-compile`` alike.

A compile (:func:`start_compile`, finished by :meth:`Compilation.finish`):

- is served from the compile cache when it can be (``tessera.compile_cache``): a planned IR
  cached under the capture, the hardware, the pipeline and the versions replaces capture and the
  passes, and is parsed only when something needs the module; a cached capture replaces the
  capture;
- otherwise captures the model in a forked child (``tessera.child_capture``), so that this
  process never imports torch or transformers, runs the passes, and verifies the planned module
  once, in a forked process beside whatever the caller does next (printing it, rendering
  reports), unless the verifier runs after every pass;
- writes the planned IR to the cache only once it verified (:meth:`Compilation.finish`).

Forking is safe only where no other thread of the process may hold a lock the child needs:
``forks=None`` (the library's default) forks only while the process runs one Python thread;
the command-line compile, which knows it starts none, asks for it (``forks=True``). Without
forking the same work runs in this process, with the same results.

Warnings the capture gave (kept with cache entries and given again on a hit) reach ``note``;
by default they are issued as :class:`CompileWarning`.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from passes.manager import ModulePass, PassManager, parse_pipeline, without_cache
from support import collector
from support.processes import can_fork
from tessera.compile_cache import CompileCache, capture_key, pipeline_cacheable, plan_key
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import LayerRole
from tessera_ir.model import Module
from tessera_ir.parallel import PLACEMENT_SETTINGS, ParallelConfig, ParallelConfigError
from tessera_ir.parser import parse_module
from tessera_ir.printer import print_module
from tessera_ir.run_settings import set_run_settings

Timings = list[tuple[str, float]]


class CompileWarning(UserWarning):
    """A warning a compile gave: capture's, carried from the capture's child or the compile cache."""


def _warn(message: str) -> None:
    warnings.warn(message, CompileWarning, stacklevel=3)


@dataclass
class CompileRequest:
    """What to compile, checked before any work starts (:meth:`make`)."""

    source: Any
    pipeline: str  # as given ("" for none), for messages
    passes: list[ModulePass]
    hardware: str
    hardware_fields: object  # the resolved description, part of the plan's cache key
    parallel: dict[str, Any] = field(default_factory=dict)
    layer_kinds: Any = None  # as capture takes them
    verify: bool = True
    verify_each: bool = False
    cache: bool = True
    ledger: str | None = None
    dump_after: Callable[[ModulePass, Module], None] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # run-wide settings for the header

    @classmethod
    def make(
        cls, source: Any, pipeline: str | None = None, *, hardware: str | None = None, layer_kinds: Any = None,
        ledger: str | None = None, verify: bool = True, verify_each: bool = False, cache: bool = True,
        dump_after: Callable[[ModulePass, Module], None] | None = None, settings: dict[str, Any] | None = None,
        **parallel: Any,
    ) -> CompileRequest:
        """Parse the pipeline (``DEFAULT_PIPELINE`` when None), resolve the hardware and check the
        run-wide ``settings`` (``tessera_ir.run_settings``), so a bad one fails before the capture;
        ``cache=False`` turns the passes' own caches off too."""
        from passes.costs.hardware import DEFAULT_HARDWARE
        from tessera.api import DEFAULT_PIPELINE, resolve_hardware, with_ledger

        text = DEFAULT_PIPELINE if pipeline is None else pipeline
        passes = parse_pipeline(text, available=()) if text.strip() else []
        if not cache:
            passes = [without_cache(p) for p in passes]
        if ledger is not None:
            passes = with_ledger(passes, ledger)
        target = DEFAULT_HARDWARE if hardware is None else hardware
        fields = resolve_hardware(target)  # cpu is calibrated here if it never was
        given = {k: v for k, v in (settings or {}).items() if v is not None}
        set_run_settings({}, **given)  # checks them
        return cls(
            source, text, passes, target, fields, parallel, layer_kinds, verify, verify_each, cache, ledger, dump_after,
            given,
        )

    def kinds_key(self) -> list[str]:
        """The layer kinds as the cache keys spell them (``INDEX=KIND``, in the order given)."""
        kinds = self.layer_kinds
        if kinds is None:
            return []
        if isinstance(kinds, dict):
            return [f"{k}={v}" for k, v in kinds.items()]
        if isinstance(kinds, str):
            return [kinds]
        return [str(k) for k in kinds]


@dataclass
class Compilation:
    """A compile under way: the planned module, where it came from, and what is left to do."""

    request: CompileRequest
    text: str | None  # the planned IR as printed (None when not asked for and not cacheable)
    plan_key: str  # its key in the compile cache ("" when the compile is not cacheable)
    manager: PassManager | None  # None when served from the cache
    timings: Timings  # capture (or the cache) and checking the input; parsing a cached plan when done
    after: Timings  # printing the planned IR, waiting for its verification, writing the cache
    notes: list[str]
    _module: list[Module]
    _verified: Callable[[], None] | None = None
    _to_cache: tuple[CompileCache, str, str, list[str]] | None = None

    @property
    def from_cache(self) -> bool:
        return self.manager is None

    @property
    def cacheable(self) -> bool:
        return bool(self.plan_key)

    def module(self) -> Module:
        """The planned module (a cached plan is parsed the first time this is asked)."""
        if not self._module:
            assert self.text is not None
            start = time.perf_counter()
            with collector.paused():  # an acyclic tree of a million objects: the collector finds nothing
                self._module.append(
                    parse_module(self.text, source=f"<planned {self.request.source}, from the compile cache>")
                )
            self.timings.append(("parse the cached plan", time.perf_counter() - start))
        return self._module[0]

    def finish(self) -> None:
        """Wait for the planned module's verification (raising what it found) and cache the plan."""
        if self._verified is not None:
            start = time.perf_counter()
            verified, self._verified = self._verified, None
            try:
                verified()
            except TesseraError as err:
                self._to_cache = None
                raise TesseraError(
                    f"the planned module is invalid after passes {self.request.pipeline}: {err}; "
                    "rerun with --verify-each to find the pass that broke it"
                ) from err
            self.after.append(("verify the planned module (what is left after rendering)", time.perf_counter() - start))
        if self._to_cache is not None:
            start = time.perf_counter()
            cache, key, text, notes = self._to_cache
            self._to_cache = None
            cache.put(key, text, notes)
            self.after.append(("compile cache write", time.perf_counter() - start))


def forking_is_safe() -> bool:
    """Whether this process may fork helpers now: it can, and runs no other Python thread."""
    return can_fork() and threading.active_count() == 1


def start_compile(
    request: CompileRequest, *, want_text: bool = False, forks: bool | None = None,
    note: Callable[[str], None] | None = None,
) -> Compilation:
    """Capture and plan ``request`` (or take it from the compile cache); the caller renders what
    it needs from the result meanwhile and then calls :meth:`Compilation.finish`.

    ``want_text``: print the planned IR (:attr:`Compilation.text`) even when it is not cached.
    """
    from tessera import api
    from tessera_ir.verifier import verify, verify_beside

    say = note or _warn
    fork = forking_is_safe() if forks is None else forks and can_fork()
    r = request
    timings: Timings = []
    after: Timings = []
    key = capture_key(r.source, r.parallel, r.kinds_key()) if r.cache else None
    plans = (
        CompileCache("plans")
        if key is not None and r.passes and r.dump_after is None and pipeline_cacheable(r.passes) else None
    )
    plan = plan_key(key, r.hardware, r.hardware_fields, r.passes, r.verify, r.settings) if plans is not None and key else ""
    start = time.perf_counter()
    hit = plans.get(plan) if plans is not None else None
    if hit is not None:
        timings.append(("compile cache hit (read the planned IR)", time.perf_counter() - start))
        for message in hit.warnings:
            say(message)
        return Compilation(r, hit.text, plan, None, timings, after, list(hit.warnings), [])
    entry = capture_key(r.source, r.parallel, r.kinds_key(), placement_blind=True) if key is not None else None
    captured, notes = _captured(r, entry, fork, timings)
    for message in notes:
        say(message)
    captured.attrs["hardware"] = r.hardware  # the target every pass, the report and viz read
    set_run_settings(captured.attrs, **r.settings)  # and the run-wide settings every pass reads
    start = time.perf_counter()
    if r.verify:
        verify(captured)
    timings.append(("verify input", time.perf_counter() - start))
    # Without verify_each the planned module is verified once, beside what the caller does next;
    # nothing is cached unless it checks out.
    manager = api.run_passes(captured, r.passes, verify=r.verify and r.verify_each, dump_after=r.dump_after)
    verified = None
    if r.verify and not r.verify_each and r.passes:
        verified = verify_beside(captured) if fork else _verified_now(captured)
    start = time.perf_counter()
    text = print_module(captured) if want_text or plans is not None else None
    after.append(("print the IR", time.perf_counter() - start))
    to_cache = (plans, plan, text, notes) if plans is not None and text is not None else None
    return Compilation(r, text, plan, manager, timings, after, notes, [captured], verified, to_cache)


def _verified_now(module: Module) -> Callable[[], None]:
    """The verification done at the wait, in this process (where no helper may be forked)."""
    from tessera_ir.verifier import verify

    return lambda: verify(module)


def _with_placement(module: Module, parallel: dict[str, Any]) -> None:
    """Set the placement settings given (``PLACEMENT_SETTINGS``) on a cached capture's header,
    which holds the source's own suggestion for them, and check the whole setting as capture
    checks it: the capture this compile would have made."""
    given = {k: v for k, v in parallel.items() if k in PLACEMENT_SETTINGS and v is not None}
    p = ParallelConfig.from_attrs({**module.attrs, **given})  # raises what capture would
    problem = p.stages_problem(sum(1 for layer in module.layers if layer.role == LayerRole.DECODER))
    if problem is not None:
        raise ParallelConfigError(problem)
    module.attrs.update(p.to_attrs())


def _suggested_header(module: Module, suggested: dict[str, Any]) -> str:
    """``module`` printed with the placement settings the source suggests (ParallelConfig's
    defaults where it suggests none), as the capture cache keeps it."""
    defaults = ParallelConfig().to_attrs()
    header = {**module.attrs, **{k: suggested.get(k, defaults[k]) for k in PLACEMENT_SETTINGS}}
    return print_module(dataclasses.replace(module, attrs=header))


def _capture_here(r: CompileRequest) -> tuple[Module, dict[str, Any], list[str]]:
    """Capture ``r.source`` in this process: the module, the settings the source suggests, and
    capture's warnings (other warnings are shown as they come)."""
    from frontend.errors import CaptureWarning
    from tessera.api import capture

    suggested: dict[str, Any] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureWarning)
        module = capture(r.source, layer_kinds=r.layer_kinds, suggested=suggested, **r.parallel)
    notes = []
    for warning in caught:
        if issubclass(warning.category, CaptureWarning):
            notes.append(str(warning.message))
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
    return module, suggested, notes


def _captured(r: CompileRequest, key: str | None, fork: bool, timings: Timings) -> tuple[Module, list[str]]:
    """The captured module, from the capture cache when it holds ``key`` (a placement-blind
    capture key); and capture's warnings."""
    start = time.perf_counter()
    cache = CompileCache("captures") if key is not None else None
    hit = cache.get(key) if cache is not None and key is not None else None
    if hit is not None:
        module = parse_module(hit.text, source=f"<captured {r.source}, from the compile cache>")
        _with_placement(module, r.parallel)
        timings.append(("capture (from the compile cache)", time.perf_counter() - start))
        return module, hit.warnings
    if fork:
        from tessera.child_capture import in_child

        module, suggested, notes = in_child(lambda: _capture_here(r))
    else:
        module, suggested, notes = _capture_here(r)
    timings.append(("capture", time.perf_counter() - start))
    if cache is not None and key is not None:
        start = time.perf_counter()
        cache.put(key, _suggested_header(module, suggested), notes)
        timings.append(("capture cache write", time.perf_counter() - start))
    return module, notes
