"""Pass infrastructure: the pass base class, the registry, pipeline parsing and the pass manager.

A pass is a frozen dataclass whose fields are its options; ``name`` is its
kebab-case command-line name. A pipeline is spelled ``a,b{opt=v other=w}``.
The manager verifies the module after every pass and, on failure, names the
pass that failed and the ones that ran before it.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, get_type_hints

from tessera_ir.errors import TesseraError
from tessera_ir.model import Module


class PassError(TesseraError):
    """A pass could not run, or left an invalid module."""


class ModulePass(ABC):
    """Base class of every pass. Subclasses are frozen dataclasses; their fields are options."""

    name: ClassVar[str]
    summary: ClassVar[str]

    @abstractmethod
    def apply(self, module: Module) -> bool:
        """Rewrite ``module`` in place; return whether anything changed."""

    def spelling(self) -> str:
        """The pipeline text that recreates this pass with its options."""
        opts = []
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value != f.default:
                text = str(value).lower() if isinstance(value, bool) else str(value)
                opts.append(f"{f.name.replace('_', '-')}={text}")
        return self.name + ("{" + " ".join(opts) + "}" if opts else "")


# name -> "module:Class". Lazy, so that listing passes imports no solver.
PASS_REGISTRY: dict[str, str] = {
    "verify": "passes.verify_pass:VerifyPass",
    "overlap-schedule": "passes.overlap_schedule:OverlapSchedulePass",
    "profile": "passes.profile:ProfilePass",
    "candidates": "passes.candidates:CandidatesPass",
    "partition": "passes.partition:PartitionPass",
    "dbo-slots": "passes.dbo_slots:DboSlotsPass",
}


def register_pass(name: str, target: str) -> None:
    PASS_REGISTRY[name] = target


def get_pass_class(name: str) -> type[ModulePass]:
    if name not in PASS_REGISTRY:
        known = ", ".join(sorted(PASS_REGISTRY))
        raise PassError(f"unknown pass '{name}'; known passes: {known}")
    module_name, class_name = PASS_REGISTRY[name].split(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    assert issubclass(cls, ModulePass)
    return cls


def _convert_option(pass_name: str, option: str, text: str, typ: Any) -> Any:
    try:
        if typ is bool:
            if text.lower() in ("true", "1", "yes", "on"):
                return True
            if text.lower() in ("false", "0", "no", "off"):
                return False
            raise ValueError(text)
        if typ in (int, float, str):
            return typ(text)
    except ValueError:
        raise PassError(
            f"option '{option}' of pass '{pass_name}' expects {getattr(typ, '__name__', typ)}, got '{text}'"
        ) from None
    # Optional/other annotated types: pass the text through.
    return text


def instantiate_pass(name: str, options: dict[str, str]) -> ModulePass:
    cls = get_pass_class(name)
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    kwargs = {}
    for raw_key, text in options.items():
        key = raw_key.replace("-", "_")
        if key not in fields:
            known = ", ".join(k.replace("_", "-") for k in fields) or "none"
            raise PassError(f"pass '{name}' has no option '{raw_key}'; its options: {known}")
        kwargs[key] = _convert_option(name, raw_key, text, hints.get(key, str))
    return cls(**kwargs)


def parse_pipeline(spec: str) -> list[ModulePass]:
    """Parse ``a,b{opt=v other=w},c`` into pass instances."""
    passes: list[ModulePass] = []
    i = 0
    spec = spec.strip()
    while i < len(spec):
        j = i
        while j < len(spec) and spec[j] not in ",{":
            j += 1
        name = spec[i:j].strip()
        if not name:
            raise PassError(f"empty pass name at position {i} of pipeline '{spec}'")
        options: dict[str, str] = {}
        if j < len(spec) and spec[j] == "{":
            close = spec.find("}", j)
            if close < 0:
                raise PassError(f"unclosed '{{' after pass '{name}' in pipeline '{spec}'")
            for item in spec[j + 1 : close].replace(",", " ").split():
                if "=" not in item:
                    raise PassError(f"option '{item}' of pass '{name}' must be written key=value")
                key, value = item.split("=", 1)
                options[key.strip()] = value.strip()
            j = close + 1
        passes.append(instantiate_pass(name, options))
        if j < len(spec) and spec[j] != ",":
            raise PassError(f"expected ',' after pass '{name}' at position {j} of pipeline '{spec}'")
        i = j + 1
    return passes


@dataclass
class PassTiming:
    name: str
    seconds: float
    modified: bool


@dataclass
class PassManager:
    passes: list[ModulePass]
    verify_each: bool = True
    dump_after: Callable[[ModulePass, Module], None] | None = None
    timings: list[PassTiming] = field(default_factory=list)

    def run(self, module: Module) -> Module:
        from tessera_ir.verifier import verify

        ran: list[str] = []
        for p in self.passes:
            start = time.perf_counter()
            try:
                modified = p.apply(module)
            except TesseraError as err:
                raise PassError(self._context(p, ran) + str(err)) from err
            seconds = time.perf_counter() - start
            self.timings.append(PassTiming(p.name, seconds, bool(modified)))
            if self.verify_each and modified:
                try:
                    verify(module)
                except TesseraError as err:
                    raise PassError(self._context(p, ran) + "left an invalid module: " + str(err)) from err
            ran.append(p.spelling())
            if self.dump_after is not None:
                self.dump_after(p, module)
        return module

    @staticmethod
    def _context(p: ModulePass, ran: list[str]) -> str:
        before = ",".join(ran) if ran else "(none)"
        return f"pass '{p.spelling()}' failed (passes run before it: {before}): "
