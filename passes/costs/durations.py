"""How long one IR task takes on its own: the one definition every pass, the report and viz use.

A task's isolated duration (µs) is its ``duration_us`` attribute when it has one (a given or
measured figure for the module's target hardware), else the analytic estimate on the target
hardware (``analytic_duration_us``). ``plan_view.PlanView.duration`` caches it per task.

Compute tasks: ``launch + Σ_parts max(flops / (peak[dtype] · efficiency) + packing, bytes / hbm)``, a
roofline per kernel group of the task — each kernel is bound either by arithmetic or by
memory traffic. ``packing`` is ``bytes / gemm_packing_gbps[dtype]`` for a group with arithmetic
on hardware that gives that rate (the calibrated CPU: a GEMM there first copies its operands
into cache-sized panels on the core, which adds to its arithmetic rather than overlapping it;
with it the cost-model bench's tiny-model GEMMs read 0.84-1.04 of their measured time per kernel
class over five runs, against 0.76-0.94 with the line ``launch + flops / peak``), 0 elsewhere. A task has one or two parts:

- its GEMMs: the task's FLOPs and bytes minus its core share, at ``efficiency[op]`` — for
  grouped expert GEMMs the efficiency the hardware's curve gives for the task's
  ``rows_per_expert`` (small groups run far below peak);
- its core kernel, when the frontend recorded one (``core_flops``, ``core_bytes``
  attributes: attention, the delta-rule recurrence, the scan, the loss), at
  ``core_efficiency[op]``, or in a data-gradient task at ``core_backward_efficiency[op]`` where the
  hardware gives one (a recomputed forward core inside the dgrad is priced at that rate too).

A task without a core share is one part at ``efficiency[op]`` (hand-written IR).

Comm tasks (the expert-parallel All-to-All): ``a2a_latency + max(on-node bytes / (NVLink ·
efficiency), off-node bytes / (NIC · efficiency))`` — on 8-GPU nodes only the off-node share
of a large EP group crosses the NIC while the rest moves over NVLink at the same time
(``hardware.a2a_link_bytes`` splits the bytes; with the hardware's ``dedup_per_node`` a token
crosses the NIC once per remote node, which reads the task's ``top_k``).

These are *isolated* durations. What a pair costs when communication and
computation overlap is decided by the pair schedule and the contention model.
"""

from __future__ import annotations

from passes.costs.hardware import Hardware, a2a_transfer_s
from tessera_ir.kinds import Phase, Resource, TaskOp
from tessera_ir.model import Task
from tessera_ir.parallel import ParallelConfig

# The task attribute that gives a task's isolated duration in µs, overriding the analytic one.
GIVEN_DURATION = "duration_us"
# Efficiency of a kind the hardware file does not list.
DEFAULT_EFFICIENCY = 0.5


def given_duration_us(task: Task) -> float | None:
    """The task's ``duration_us`` attribute, or None when it has none."""
    value = task.attrs.get(GIVEN_DURATION)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def task_duration_us(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """Isolated duration of ``task`` in µs on the module's target ``hw``: ``duration_us`` if given."""
    given = given_duration_us(task)
    return given if given is not None else analytic_duration_us(task, hw, parallel)


def _int_attr(task: Task, key: str) -> int:
    value = task.attrs.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def roofline_parts(task: Task, hw: Hardware, parallel: ParallelConfig) -> list[tuple[float, float]]:
    """(arithmetic seconds, memory seconds) of each kernel group of a compute task (module docstring)."""
    peak = hw.peak_flops(parallel.dtype)
    core_flops, core_bytes = _int_attr(task, "core_flops"), _int_attr(task, "core_bytes")
    op = task.op.value
    if task.op is TaskOp.EXPERT_GEMM and _int_attr(task, "rows_per_expert") and hw.expert_gemm_curve:
        gemm_eff = hw.expert_efficiency(_int_attr(task, "rows_per_expert"))
    else:
        gemm_eff = hw.efficiency.get(op, DEFAULT_EFFICIENCY)
    gemm_flops, gemm_bytes = max(0, task.flops - core_flops), max(0, task.bytes - core_bytes)
    groups = [(gemm_flops, gemm_eff, gemm_bytes)]
    if core_flops or core_bytes:
        core_eff = hw.core_efficiency.get(op, hw.efficiency.get(op, DEFAULT_EFFICIENCY))
        if task.phase is Phase.DGRAD:
            core_eff = hw.core_backward_efficiency.get(op, core_eff)
        groups.append((core_flops, core_eff, core_bytes))
    parts = []
    for flops, eff, nbytes in groups:
        arithmetic = flops / (peak * eff)
        if flops > 0:  # a CPU GEMM packs its operands on the core first (0 s where the hardware gives no rate)
            arithmetic += hw.packing_seconds(nbytes, parallel.dtype)
        parts.append((arithmetic, nbytes / (hw.hbm_gbps * 1e9)))
    return parts


def all_to_all_us(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """Isolated duration of a comm task: latency plus the slower of its NVLink and NIC shares."""
    if task.bytes == 0:
        return 0.0
    top_k = _int_attr(task, "top_k") or 1
    return hw.a2a_latency_us + a2a_transfer_s(task.bytes, parallel.ep, hw, top_k) * 1e6


def comm_bandwidth_share(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """The share of a comm task's isolated duration spent moving bytes (the rest is latency)."""
    total = all_to_all_us(task, hw, parallel)
    return (total - hw.a2a_latency_us) / total if total > 0 else 0.0


def analytic_duration_us(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """The estimate of the module docstring, ignoring any given ``duration_us``.

    Called directly only where a given duration cannot apply: on a device other than the
    target (measured profiling prices the executed work on the measured device).
    """
    if task.resource is Resource.COMM:
        return all_to_all_us(task, hw, parallel)
    return hw.kernel_launch_us + sum(max(c, m) for c, m in roofline_parts(task, hw, parallel)) * 1e6


def task_utilisation(task: Task, hw: Hardware, parallel: ParallelConfig) -> tuple[float, float]:
    """``(sm_util, mem_util)`` of a compute task running alone: the share of peak arithmetic and of
    memory bandwidth its roofline says it uses, averaged over its kernel groups by time (the
    contention model's inputs). Comm tasks: (0, 0)."""
    if task.resource is Resource.COMM:
        return 0.0, 0.0
    parts = roofline_parts(task, hw, parallel)
    bound = sum(max(c, m) for c, m in parts)
    if bound <= 0:
        return 0.0, 0.0
    return sum(c for c, _ in parts) / bound, sum(m for _, m in parts) / bound
