"""Run-wide settings: what several passes must agree on, kept in the module header.

Memory capacity and reservations (read by ``wgrad-deadlines``, ``partition`` and
``refine-bottleneck``) and the DBO pool's budget (``dbo-slots``) are header attributes, set by the
driver flags (``tessera-compile``/``tessera-opt`` ``--memory-gib``, ``--reserved-gib``,
``--no-wgrad-headroom``, ``--dbo-memory-budget``; ``tessera.compile(settings=...)``) or written in
the IR text, printed and parsed with the module like the target ``hardware``. A setting absent
from the header has its default here, the only place that holds one: no pass keeps its own. The
pipeline order variant is a parallel setting (``ParallelConfig.combined``, header attribute
``combined``; unset: combined 1F1B whenever ``ep > 1``), set by ``--combined-1f1b`` /
``--no-combined-1f1b``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

from tessera_ir.errors import TesseraError


class RunSettingsError(TesseraError):
    """A run-wide setting with a value no run can have."""


@dataclass(frozen=True)
class RunSettings:
    # Device memory capacity in GiB; None: the target hardware's.
    memory_gib: float | None = None
    # Memory per device no model tensor uses (CUDA context, communication buffers), in GiB.
    reserved_gib: float = 4.0
    # Whether one more micro-batch of activations is reserved for deferred weight gradients.
    wgrad_headroom: bool = True
    # What the DBO's pool of deferred weight gradients may hold: "headroom" (device memory less the
    # stage's static peak and the margin below) or a share of device memory in [0, 1].
    dbo_memory_budget: float | str = "headroom"
    # The share of device memory the headroom budget leaves free beside the static peak: allocator
    # fragmentation and communication buffers the memory model does not count.
    dbo_memory_margin: float = 0.05

    def __post_init__(self) -> None:
        for f in fields(self):
            problem = _problem(f.name, getattr(self, f.name))
            if problem is not None:
                raise RunSettingsError(f"{_flag(f.name)}: {problem}")

    @classmethod
    def from_attrs(cls, attrs: dict[str, Any]) -> RunSettings:
        """The settings a module header records (defaults for those it does not); a bad value
        raises, naming the header attribute."""
        given: dict[str, Any] = {}
        for f in fields(cls):
            if f.name in attrs:
                value = attrs[f.name]
                problem = _problem(f.name, value)
                if problem is not None:
                    raise RunSettingsError(f"module header attribute '{f.name}': {problem}")
                given[f.name] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        return cls(**given)

    def to_attrs(self) -> dict[str, Any]:
        """The header attributes of the settings that differ from the defaults (set ones only)."""
        defaults = RunSettings()
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != getattr(defaults, f.name)}


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def _problem(name: str, value: object) -> str | None:
    if name == "wgrad_headroom":
        return None if isinstance(value, bool) else f"must be true or false, got {value!r}"
    if name == "memory_gib" and value is None:
        return None
    if name == "dbo_memory_budget" and value == "headroom":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        if name == "dbo_memory_budget":
            return f"must be 'headroom' or a share of device memory in [0, 1], got {value!r}"
        return f"must be a finite number, got {value!r}"
    if name == "memory_gib" and value <= 0:
        return f"device memory must be positive, got {value} GiB"
    if name == "reserved_gib" and value < 0:
        return f"reserved memory must be >= 0, got {value} GiB"
    if name == "dbo_memory_budget" and not 0.0 <= value <= 1.0:
        return f"the DBO pool's budget is 'headroom' or a share of device memory in [0, 1], got {value}"
    if name == "dbo_memory_margin" and not 0.0 <= value < 1.0:
        return f"the DBO pool's margin is a share of device memory in [0, 1), got {value}"
    return None


# Every run-wide setting a driver may set: RunSettings' fields and the pipeline order variant.
SETTING_NAMES = (*(f.name for f in fields(RunSettings)), "combined")


def set_run_settings(attrs: dict[str, Any], **values: Any) -> None:
    """Record the settings given (None: left as the header has it) in the header ``attrs``."""
    from tessera_ir.parallel import ParallelConfig

    current = RunSettings.from_attrs(attrs)
    given = {k: v for k, v in values.items() if v is not None}
    unknown = set(given) - set(SETTING_NAMES)
    if unknown:
        raise RunSettingsError(
            f"unknown run-wide setting(s) {', '.join(sorted(unknown))}; the settings are {', '.join(SETTING_NAMES)}"
        )
    if "combined" in given:
        ParallelConfig.from_attrs({**attrs, "combined": given["combined"]})  # checks it
        attrs["combined"] = given.pop("combined")
    RunSettings(**{**{f.name: getattr(current, f.name) for f in fields(RunSettings)}, **given})  # checks them
    for name, value in given.items():
        attrs[name] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
