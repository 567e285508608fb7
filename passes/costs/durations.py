"""How long one IR task takes on its own: the one definition every pass, the report and viz use.

A task's isolated duration (µs) is its ``duration_us`` attribute when it has one (a given or
measured figure for the module's target hardware), else the analytic roofline estimate on the
target hardware (``analytic_duration_us``). ``plan_view.PlanView.duration`` caches it per task.

The roofline, per task kind:

- compute: ``launch + max(flops / (peak[dtype] * efficiency[op]), bytes / hbm)``
  — a kernel is bound either by arithmetic or by memory traffic; ``efficiency``
  captures how far each kind of kernel falls short of peak (GEMMs get close,
  recurrent scans and small routers do not).
- comm (All-to-All): ``a2a_latency + bytes / a2a_bandwidth(ep)`` — within a
  node (EP ≤ gpus_per_node) tokens travel over NVLink, beyond it the NIC is the
  bottleneck, hence two measured bandwidths.

These are *isolated* durations. What a pair costs when communication and
computation overlap is decided by the pair schedule and the contention model.
"""

from __future__ import annotations

from passes.costs.hardware import Hardware
from tessera_ir.kinds import Resource
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


def _roofline_s(task: Task, hw: Hardware, parallel: ParallelConfig) -> tuple[float, float]:
    """(arithmetic seconds, memory seconds) of a compute task at its kind's efficiency."""
    efficiency = hw.efficiency.get(task.op.value, DEFAULT_EFFICIENCY)
    return task.flops / (hw.peak_flops(parallel.dtype) * efficiency), task.bytes / (hw.hbm_gbps * 1e9)


def analytic_duration_us(task: Task, hw: Hardware, parallel: ParallelConfig) -> float:
    """The roofline estimate of the module docstring, ignoring any given ``duration_us``.

    Called directly only where a given duration cannot apply: on a device other than the
    target (measured profiling prices the executed work on the measured device).
    """
    if task.resource is Resource.COMM:
        if task.bytes == 0:
            return 0.0
        return hw.a2a_latency_us + task.bytes / (hw.a2a_gbps(parallel.ep) * 1e9) * 1e6
    compute_s, memory_s = _roofline_s(task, hw, parallel)
    return hw.kernel_launch_us + max(compute_s, memory_s) * 1e6


def task_utilisation(task: Task, hw: Hardware, parallel: ParallelConfig) -> tuple[float, float]:
    """``(sm_util, mem_util)`` of a compute task running alone: the share of peak arithmetic and of
    memory bandwidth its roofline says it uses (the contention model's inputs). Comm tasks: (0, 0)."""
    if task.resource is Resource.COMM:
        return 0.0, 0.0
    compute_s, memory_s = _roofline_s(task, hw, parallel)
    bound = max(compute_s, memory_s)
    if bound <= 0:
        return 0.0, 0.0
    return compute_s / bound, memory_s / bound
