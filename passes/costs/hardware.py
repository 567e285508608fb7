"""Hardware descriptions: what a device computes and moves per second, read from JSON files.

A description is a JSON file (``passes/costs/hardware_specs/<name>.json`` for the shipped
``h100`` and ``h200``, or any path): peak dense throughput per dtype, HBM bandwidth, memory,
All-to-All bandwidth inside and across nodes, the streaming multiprocessors communication
kernels occupy, per-kind kernel efficiency, and optionally a ``contention`` block
(``passes/costs/contention.py``). Fields not listed in ``_REQUIRED`` are kept in
``Hardware.extra`` (e.g. ``nvlink_gbps``, ``nic_gbps``: descriptive, read by no model yet).

The local CPU, ``cpu``, has no shipped file: ``tessera-calibrate`` (or
``tessera-compile --hardware cpu``) measures it once and caches the description
(``passes/costs/calibrate_cpu.py``). Loading ``cpu`` reads that cache and never measures.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tessera_ir.errors import TesseraError

HARDWARE_DIR = Path(__file__).parent / "hardware_specs"
# The target of a module that names none: the hardware `tessera-compile` plans for by default.
DEFAULT_HARDWARE = "h100"
CPU = "cpu"


class HardwareError(TesseraError):
    """A hardware description that is missing or malformed."""


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: dict[str, float]
    hbm_gbps: float
    memory_gib: float
    gpus_per_node: int
    a2a_gbps_intra_node: float
    a2a_gbps_inter_node: float
    a2a_latency_us: float
    total_sms: int
    comm_sms: int
    kernel_launch_us: float
    efficiency: dict[str, float]
    description: str = ""
    source: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def a2a_gbps(self, ep: int) -> float:
        """All-to-All bandwidth per GPU (GB/s) for an expert-parallel group of ``ep`` ranks."""
        return self.a2a_gbps_intra_node if ep <= self.gpus_per_node else self.a2a_gbps_inter_node

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise HardwareError(f"hardware '{self.name}' gives no peak throughput for dtype '{dtype}'")
        return self.peak_tflops[dtype] * 1e12

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


_REQUIRED = [
    "name", "peak_tflops", "hbm_gbps", "memory_gib", "gpus_per_node", "a2a_gbps_intra_node",
    "a2a_gbps_inter_node", "a2a_latency_us", "total_sms", "comm_sms", "kernel_launch_us", "efficiency",
]


def shipped_hardware() -> list[str]:
    """Names ``--hardware`` accepts besides a path: the shipped files and ``cpu``."""
    return sorted({p.stem for p in HARDWARE_DIR.glob("*.json")} | {CPU})


def is_shipped_name(name_or_path: str | Path) -> bool:
    """Whether ``name_or_path`` is a short name (``h100``, ``cpu``) rather than a path to a file."""
    return not Path(name_or_path).suffix and "/" not in str(name_or_path)


# Description files given explicitly on a command line, by the text that named them.
_ALLOWED_FILES: dict[str, Path] = {}


def allow_hardware_file(path_text: str) -> None:
    """Let ``path_text``, a hardware file the user gave explicitly on the command line, be used
    as a hardware name for the rest of this process (the IR then records it as the target)."""
    _ALLOWED_FILES[path_text] = Path(path_text)


def check_hardware_name(name: object) -> str:
    """``name`` if it is a shipped description, ``cpu``, or a file allowed by
    :func:`allow_hardware_file`; else a :class:`HardwareError`.

    Hardware names come from the IR and from pass options, which anyone can write; they
    never reach the file system as paths of their own (no ``../``, no over-long names).
    """
    if isinstance(name, str) and (name in _ALLOWED_FILES or (is_shipped_name(name) and name in shipped_hardware())):
        return name
    spelled = repr(name) if len(repr(name)) <= 40 else repr(name)[:37] + "..."
    raise HardwareError(
        f"unknown hardware {spelled}; a hardware name in the IR or a pass option is one of "
        f"{', '.join(shipped_hardware())} (a description file elsewhere is read only when given on the "
        "command line, e.g. --hardware path/to/gpu.json)"
    )


def load_hardware(name_or_file: str | Path) -> Hardware:
    """Load a hardware description: a name (``h100``, ``cpu``, or a file the command line gave;
    see :func:`check_hardware_name`) or a :class:`~pathlib.Path` the program chose itself
    (a calibration cache, a test's file).

    ``cpu`` is the cached calibration of this machine; when there is none this raises,
    naming the command that measures it (loading never benchmarks).
    """
    if isinstance(name_or_file, Path):
        path = name_or_file
    else:
        name = check_hardware_name(name_or_file)
        if name in _ALLOWED_FILES:
            path = _ALLOWED_FILES[name]
        elif name == CPU:
            from passes.costs.calibration_cache import cached_cpu_calibration

            cached = cached_cpu_calibration()
            if cached is None:
                raise HardwareError(
                    "the local CPU has not been calibrated yet; run `tessera-calibrate` once "
                    "(or `tessera-compile --hardware cpu`, which calibrates it first)"
                )
            path = cached
        else:
            path = HARDWARE_DIR / f"{name}.json"
    if not path.exists():
        raise HardwareError(
            f"no hardware description file {str(path)[:200]}; use one of {', '.join(shipped_hardware())} "
            "or a path to a JSON file with the same fields"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise HardwareError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise HardwareError(f"cannot read the hardware description {str(path)[:200]}: {reason}") from None
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: a hardware description is a JSON object with the fields of h100.json")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise HardwareError(f"{path}: hardware description lacks {', '.join(missing)}")
    known = {k: data[k] for k in _REQUIRED}
    extra = {k: v for k, v in data.items() if k not in _REQUIRED and k not in ("description", "source")}
    return Hardware(**known, description=data.get("description", ""), source=data.get("source", ""), extra=extra)
