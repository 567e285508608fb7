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


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a hardware description by short name (``h100``, ``cpu``) or by path to a JSON file.

    ``cpu`` is the cached calibration of this machine; when there is none this raises,
    naming the command that measures it (loading never benchmarks).
    """
    if is_shipped_name(name_or_path):
        if str(name_or_path) == CPU:
            from passes.costs.calibration_cache import cached_cpu_calibration

            path = cached_cpu_calibration()
            if path is None:
                raise HardwareError(
                    "the local CPU has not been calibrated yet; run `tessera-calibrate` once "
                    "(or `tessera-compile --hardware cpu`, which calibrates it first)"
                )
        else:
            path = HARDWARE_DIR / f"{name_or_path}.json"
    else:
        path = Path(name_or_path)
    if not path.is_file():
        raise HardwareError(
            f"no hardware description '{name_or_path}'; use one of {', '.join(shipped_hardware())} "
            "or a path to a JSON file with the same fields"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HardwareError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: a hardware description is a JSON object with the fields of h100.json")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise HardwareError(f"{path}: hardware description lacks {', '.join(missing)}")
    known = {k: data[k] for k in _REQUIRED}
    extra = {k: v for k, v in data.items() if k not in _REQUIRED and k not in ("description", "source")}
    return Hardware(**known, description=data.get("description", ""), source=data.get("source", ""), extra=extra)
