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


def load_hardware(name_or_path: str | Path) -> Hardware:
    """Load a hardware description by short name (``h100``) or by path to a JSON file."""
    path = Path(name_or_path)
    if not path.suffix:
        path = HARDWARE_DIR / f"{name_or_path}.json"
        if str(name_or_path) == "cpu" and not path.is_file():
            # The local CPU has no shipped file: it is described by running
            # micro-benchmarks once and caching the result.
            from passes.calibrate_cpu import cpu_hardware

            return cpu_hardware()
    if not path.is_file():
        raise HardwareError(
            f"no hardware description '{name_or_path}'; use one of {', '.join(available_hardware())} "
            "or a path to a JSON file with the same fields"
        )
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise HardwareError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
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
