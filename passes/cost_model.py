"""Analytic durations of IR tasks on a described device (roofline with per-kind efficiency).

A hardware description is a JSON file (``passes/hardware/<name>.json`` or any
path): peak dense throughput per dtype, HBM bandwidth, interconnect figures,
measured All-to-All bandwidth inside and across nodes, and the streaming
multiprocessors that communication kernels occupy.

Isolated duration of a task, in microseconds:

- compute: ``launch + max(flops / (peak[dtype] * efficiency[op]), bytes / hbm)``
  — the roofline: a kernel is bound either by arithmetic or by memory traffic;
  ``efficiency`` captures how far each kind of kernel falls short of peak
  (GEMMs get close, recurrent scans and small routers do not).
- comm (All-to-All): ``a2a_latency + bytes / a2a_bandwidth(ep)`` — within a
  node (EP ≤ gpus_per_node) tokens travel over NVLink, beyond it the NIC is the
  bottleneck, hence two measured bandwidths.

These are *isolated* durations. What a pair costs when communication and
computation overlap is decided by the pair schedule and the contention model.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import Task
from tessera_ir.parallel import ParallelConfig

HARDWARE_DIR = Path(__file__).parent / "hardware"


class HardwareError(TesseraError):
    """A hardware description that is missing or malformed."""


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: dict[str, float]
    hbm_gbps: float
    memory_gib: float
    nvlink_gbps: float
    nic_gbps: float
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
    "name", "peak_tflops", "hbm_gbps", "memory_gib", "nvlink_gbps", "nic_gbps", "gpus_per_node",
    "a2a_gbps_intra_node", "a2a_gbps_inter_node", "a2a_latency_us", "total_sms", "comm_sms",
    "kernel_launch_us", "efficiency",
]


def available_hardware() -> list[str]:
    return sorted({p.stem for p in HARDWARE_DIR.glob("*.json")} | {"cpu"})


# Files given explicitly on a command line, by the text that named them (see allow_hardware_file).
_ALLOWED_FILES: dict[str, Path] = {}


def allow_hardware_file(path_text: str) -> None:
    """Let ``path_text``, a hardware file given explicitly on the command line, be used as a
    hardware name for the rest of this process (for example when the IR records it)."""
    _ALLOWED_FILES[path_text] = Path(path_text)


def check_hardware_name(name: object) -> str:
    """``name`` if it names a shipped description (``passes/hardware/*.json``), ``cpu`` or a
    file allowed by :func:`allow_hardware_file`; else a :class:`HardwareError`.

    Hardware names come from the IR and from pass options, which anyone can write; they
    never reach the file system as paths (no ``../``, no over-long names)."""
    if isinstance(name, str) and (name in _ALLOWED_FILES or name in available_hardware()):
        return name
    spelled = repr(name) if len(repr(name)) <= 40 else repr(name)[:37] + "..."
    raise HardwareError(
        f"unknown hardware {spelled}; hardware named in the IR or a pass option is one of "
        f"{', '.join(available_hardware())} (a description file elsewhere is read only when given on the command line)"
    )


def load_hardware(name_or_file: str | Path) -> Hardware:
    """Load a hardware description: a name (``h100``, ``cpu``; see :func:`check_hardware_name`)
    or a :class:`~pathlib.Path` the program chose itself (a calibration cache, a file the
    command line gave)."""
    if isinstance(name_or_file, Path):
        return _load_file(name_or_file)
    name = check_hardware_name(name_or_file)
    if name in _ALLOWED_FILES:
        return _load_file(_ALLOWED_FILES[name])
    path = HARDWARE_DIR / f"{name}.json"
    if name == "cpu" and not path.is_file():
        # The local CPU has no shipped file: it is described by running
        # micro-benchmarks once and caching the result.
        from passes.calibrate_cpu import cpu_hardware

        return cpu_hardware()
    return _load_file(path)


def _load_file(path: Path) -> Hardware:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise HardwareError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise HardwareError(f"cannot read the hardware description {str(path)[:200]}: {reason}") from None
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: a hardware description is a JSON object with the fields {', '.join(_REQUIRED)}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise HardwareError(f"{path}: hardware description lacks {', '.join(missing)}")
    known = {k: data[k] for k in _REQUIRED}
    extra = {k: v for k, v in data.items() if k not in _REQUIRED and k not in ("description", "source")}
    return Hardware(**known, description=data.get("description", ""), source=data.get("source", ""), extra=extra)


def task_duration_us(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """Isolated duration of one task in microseconds (see the module docstring)."""
    if task.resource is Resource.COMM:
        if task.bytes == 0:
            return 0.0
        return hw.a2a_latency_us + task.bytes / (hw.a2a_gbps(parallel.ep) * 1e9) * 1e6
    efficiency = hw.efficiency.get(task.op.value, 0.5)
    compute_s = task.flops / (hw.peak_flops(parallel.dtype) * efficiency)
    memory_s = task.bytes / (hw.hbm_gbps * 1e9)
    return hw.kernel_launch_us + max(compute_s, memory_s) * 1e6


def task_utilisation(task: Task, hw: Hardware, parallel: ParallelConfig) -> tuple[float, float]:
    """``(sm_util, mem_util)`` of a compute task running alone: the share of peak arithmetic and of
    memory bandwidth its roofline says it uses (the contention model's inputs). Comm tasks: (0, 0)."""
    if task.resource is Resource.COMM:
        return 0.0, 0.0
    efficiency = hw.efficiency.get(task.op.value, 0.5)
    compute_s = task.flops / (hw.peak_flops(parallel.dtype) * efficiency)
    memory_s = task.bytes / (hw.hbm_gbps * 1e9)
    bound = max(compute_s, memory_s)
    if bound <= 0:
        return 0.0, 0.0
    return compute_s / bound, memory_s / bound
