"""Hardware descriptions: what a device computes and moves per second, read from JSON files.

A description is a JSON file (``passes/costs/hardware_specs/<name>.json`` for the shipped
``h100`` and ``h200``, or any path) with these fields:

- ``peak_tflops`` per dtype, ``hbm_gbps``, ``memory_gib``, ``kernel_launch_us``;
- the node and its links: ``gpus_per_node``, ``nvlink_gbps`` (per GPU and direction, inside a
  node), ``nic_gbps`` (per GPU and direction, between nodes), ``a2a_latency_us``, and an
  optional ``all_to_all`` block: the achieved fraction of each link an All-to-All kernel
  reaches (``nvlink_efficiency``, ``nic_efficiency``) and ``dedup_per_node`` (DeepEP-style
  dispatch that sends a token once per remote node and fans it out over NVLink there);
  ``durations.all_to_all_us`` uses them;
- compute efficiency: ``efficiency`` per task op is the achieved fraction of peak of the op's
  GEMM kernels (its projections, or the whole task when it records no core share);
  ``core_efficiency`` per op that of its core kernel (attention, the delta rule, the scan, the
  loss; default: the op's ``efficiency``); ``core_backward_efficiency`` per op that of the core's
  backward kernels, priced on the data-gradient task's core FLOPs (measured backward kernels
  reach less of peak than their forwards: FlashAttention's and the chunked delta rule's
  recompute and run more, smaller products; default: ``core_efficiency``); ``expert_gemm_efficiency`` the grouped expert GEMMs'
  efficiency as a function of the rows each local expert receives (points
  ``rows_per_expert`` → ``efficiency``, interpolated in log2 of the rows, held flat beyond the
  last point and falling in proportion to the rows below the first);
- ``gemm_packing_gbps`` per dtype (optional; the CPU calibration measures it, GPU files have
  none): a CPU GEMM copies its operands into cache-sized panels before computing on them, a
  phase that runs on the core beside none of the arithmetic, so a kernel with arithmetic adds
  its bytes at this rate to its arithmetic time (``durations.roofline_parts``);
- ``total_sms``, ``comm_sms`` and an optional ``contention`` block
  (``passes/costs/contention.py``); ``description``, ``source`` and ``sources`` (where each
  figure comes from). Other fields are kept in ``Hardware.extra``.

The local CPU, ``cpu``, has no shipped file: ``tessera-calibrate`` (or
``tessera-compile --hardware cpu``) measures it once and caches the description
(``passes/costs/calibrate_cpu.py``). Loading ``cpu`` reads that cache and never measures.
"""

from __future__ import annotations

import json
import math
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
class AllToAll:
    """How an expert-parallel All-to-All uses the links (the ``all_to_all`` block of a description)."""

    nvlink_efficiency: float = 1.0  # achieved / nominal NVLink bandwidth of the All-to-All kernel
    nic_efficiency: float = 1.0  # achieved / nominal NIC bandwidth of the All-to-All kernel
    dedup_per_node: bool = False  # a token crosses the NIC once per remote node, then fans out over NVLink


@dataclass(frozen=True)
class Hardware:
    name: str
    peak_tflops: dict[str, float]
    hbm_gbps: float
    memory_gib: float
    gpus_per_node: int
    nvlink_gbps: float
    nic_gbps: float
    a2a_latency_us: float
    total_sms: int
    comm_sms: int
    kernel_launch_us: float
    efficiency: dict[str, float]
    core_efficiency: dict[str, float] = field(default_factory=dict)
    # The core's backward kernels, per op (on the dgrad task's core share); empty: core_efficiency
    core_backward_efficiency: dict[str, float] = field(default_factory=dict)
    # (rows per local expert, efficiency), rows increasing; empty: efficiency["expert_gemm"]
    expert_gemm_curve: tuple[tuple[float, float], ...] = ()
    # GB/s at which a GEMM packs its operands, per dtype; empty: packing overlaps the arithmetic
    gemm_packing_gbps: dict[str, float] = field(default_factory=dict)
    all_to_all: AllToAll = AllToAll()
    description: str = ""
    source: str = ""
    extra: dict[str, object] = field(default_factory=dict)

    def a2a_gbps(self, ep: int) -> float:
        """Effective All-to-All bandwidth per GPU (GB/s) of a large transfer in a group of ``ep``
        ranks: bytes sent over the time they take (``durations.all_to_all_us``, latency aside)."""
        seconds = a2a_transfer_s(1e9, ep, self, top_k=1)
        return 1.0 / seconds if seconds > 0 else self.nvlink_gbps * self.all_to_all.nvlink_efficiency

    def peak_flops(self, dtype: str) -> float:
        if dtype not in self.peak_tflops:
            raise HardwareError(f"hardware '{self.name}' gives no peak throughput for dtype '{dtype}'")
        return self.peak_tflops[dtype] * 1e12

    def packing_seconds(self, nbytes: float, dtype: str) -> float:
        """Seconds a GEMM of ``dtype`` spends packing ``nbytes`` of operands before its arithmetic
        (0 where the description gives no packing rate: the traffic overlaps the arithmetic)."""
        rate = self.gemm_packing_gbps.get(dtype)
        return nbytes / (rate * 1e9) if rate else 0.0

    def expert_efficiency(self, rows: float) -> float:
        """Efficiency of a grouped expert GEMM whose local experts receive ``rows`` rows each."""
        curve = self.expert_gemm_curve
        if not curve:
            return self.efficiency.get("expert_gemm", 0.5)
        if rows <= curve[0][0]:
            return curve[0][1] * max(rows, 1.0) / curve[0][0]
        for (r0, e0), (r1, e1) in zip(curve, curve[1:]):
            if rows <= r1:
                w = (math.log2(rows) - math.log2(r0)) / (math.log2(r1) - math.log2(r0))
                return e0 + w * (e1 - e0)
        return curve[-1][1]

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 2**30)


def a2a_transfer_s(nbytes: float, ep: int, hw: Hardware, top_k: int = 1) -> float:
    """Seconds the links take to move one rank's All-to-All of ``nbytes`` (the bytes bound for
    other ranks) in a group of ``ep`` ranks, latency excluded. ``durations`` documents the model."""
    on_node, off_node = a2a_link_bytes(nbytes, ep, hw, top_k)
    a2a = hw.all_to_all
    nvlink = on_node / (hw.nvlink_gbps * a2a.nvlink_efficiency * 1e9) if on_node else 0.0
    nic = off_node / (hw.nic_gbps * a2a.nic_efficiency * 1e9) if off_node else 0.0
    return max(nvlink, nic)


def a2a_link_bytes(nbytes: float, ep: int, hw: Hardware, top_k: int = 1) -> tuple[float, float]:
    """(bytes over NVLink, bytes over the NIC) of one rank's All-to-All of ``nbytes``.

    Routing is balanced: of a rank's token slots a share ``1/ep`` stays on the rank (not in
    ``nbytes``), ``(G-1)/ep`` goes to the other ``G-1`` GPUs of its node (``G`` =
    ``gpus_per_node``) and ``(ep-G)/ep`` to other nodes. An EP group within a node uses NVLink
    only. With ``dedup_per_node`` a token with ``top_k`` experts crosses the NIC once for each
    remote node holding at least one of them, ``(N-1)·(1-(1-1/N)^k)`` times in expectation with
    ``N = ep/G`` nodes, and every slot not bound for the GPU it arrives at moves once over
    NVLink (a share ``(G-1)/G``).
    """
    g = hw.gpus_per_node
    if ep <= 1 or nbytes <= 0:
        return 0.0, 0.0
    if ep <= g:
        return float(nbytes), 0.0
    slots = nbytes * ep / (ep - 1)  # every slot of the rank, its own share included
    if not hw.all_to_all.dedup_per_node or top_k <= 1:
        return slots * (g - 1) / ep, slots * (ep - g) / ep
    nodes = ep / g
    token_bytes = slots / top_k
    off = token_bytes * (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** top_k)
    return slots * (g - 1) / g, off


_REQUIRED = [
    "name", "peak_tflops", "hbm_gbps", "memory_gib", "gpus_per_node", "nvlink_gbps", "nic_gbps",
    "a2a_latency_us", "total_sms", "comm_sms", "kernel_launch_us", "efficiency",
]
_OPTIONAL = (
    "description", "source", "core_efficiency", "core_backward_efficiency", "expert_gemm_efficiency", "all_to_all",
    "gemm_packing_gbps",
)


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
            return cached
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
    return hardware_from_data(data, path)


def hardware_from_data(data: object, path: Path) -> Hardware:
    """The hardware description ``data`` (a JSON object read from ``path``, which errors name)."""
    if not isinstance(data, dict):
        raise HardwareError(f"{path}: a hardware description is a JSON object with the fields of h100.json")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise HardwareError(f"{path}: hardware description lacks {', '.join(missing)}")
    known = {k: data[k] for k in _REQUIRED}
    extra = {k: v for k, v in data.items() if k not in _REQUIRED and k not in _OPTIONAL}
    return Hardware(
        **known,
        core_efficiency=_number_map(data.get("core_efficiency", {}), path, "core_efficiency"),
        core_backward_efficiency=_number_map(data.get("core_backward_efficiency", {}), path, "core_backward_efficiency"),
        expert_gemm_curve=_curve(data.get("expert_gemm_efficiency"), path),
        gemm_packing_gbps=_number_map(data.get("gemm_packing_gbps", {}), path, "gemm_packing_gbps", "dtypes"),
        all_to_all=_all_to_all(data.get("all_to_all", {}), path),
        description=data.get("description", ""),
        source=data.get("source", ""),
        extra=extra,
    )


def _number_map(value: object, path: Path, key: str, what: str = "task ops") -> dict[str, float]:
    if not isinstance(value, dict) or not all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for k, v in value.items() if k != "source"
    ):
        raise HardwareError(f"{path}: '{key}' must map {what} to positive numbers")
    return {k: float(v) for k, v in value.items() if k != "source"}


def _curve(value: object, path: Path) -> tuple[tuple[float, float], ...]:
    if value is None:
        return ()
    where = f"{path}: 'expert_gemm_efficiency'"
    if not isinstance(value, dict) or not isinstance(value.get("rows_per_expert"), list) or not isinstance(
        value.get("efficiency"), list
    ):
        raise HardwareError(f"{where} must give lists 'rows_per_expert' and 'efficiency'")
    rows, eff = value["rows_per_expert"], value["efficiency"]
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in rows + eff)
    if len(rows) != len(eff) or not rows or not numbers or any(b <= a for a, b in zip(rows, rows[1:])):
        raise HardwareError(f"{where}: give as many positive efficiencies as rows, rows strictly increasing")
    return tuple((float(r), float(e)) for r, e in zip(rows, eff))


def _all_to_all(value: object, path: Path) -> AllToAll:
    if not isinstance(value, dict):
        raise HardwareError(f"{path}: 'all_to_all' must be a JSON object")
    out = AllToAll()
    for key in ("nvlink_efficiency", "nic_efficiency"):
        x = value.get(key, getattr(out, key))
        if not isinstance(x, (int, float)) or isinstance(x, bool) or not 0 < x <= 1:
            raise HardwareError(f"{path}: all_to_all.{key} must lie in (0, 1], got {x!r}")
    dedup = value.get("dedup_per_node", False)
    if not isinstance(dedup, bool):
        raise HardwareError(f"{path}: all_to_all.dedup_per_node must be true or false")
    return AllToAll(
        float(value.get("nvlink_efficiency", 1.0)), float(value.get("nic_efficiency", 1.0)), dedup
    )
