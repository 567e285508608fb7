"""The ``wgrad-deadlines`` pass: intra-pair deadlines of weight gradients where device memory sets one.

Before (from ``candidates``): movable ``*.wgrad`` tasks without a ``deadline``. After, where a
limit exists::

    task @l5.expert_gemm.wgrad = expert_gemm.wgrad on compute after(@l6.attention.dgrad) {..., deadline = 812.5}

Why a weight gradient has an intra-pair limit at all. A wgrad needs its forward's saved inputs and
its output gradient. The memory model (``partitioning.memory``) keeps a chunk's saved activations
alive until its backward step ends, so running a wgrad late inside its pair costs no activation
memory; but the output gradient is a temporary of the backward that lives exactly as long as the
dgrad or wgrad still to consume it. The backward's output gradients of wgrads not yet run are
memory the plan reserves only through the partition's deferred-wgrad headroom (``wgrad-headroom``:
one more micro-batch of the device's largest chunk) and what the device has left besides. The
*budget* of a device is a lower bound of that memory valid for every partition the candidates
allow and the partition pass accepts (which keeps the headroom within capacity): the larger of
the capacity less the reserve (``reserved-gib``), weights, gradients, optimizer state and
in-flight activations with every stage at its largest candidate, and the headroom at its
smallest (one micro-batch of the smallest candidate of the device's largest stage).

The rule: walking a backward chunk's wgrads in the order their output gradients appear at the
earliest (each task's earliest start on its side, ``scheduling.schedule.heads``), a wgrad must
finish before the earliest moment the wgrads from it up to a later one would hold more than the
budget, i.e. before that later one's output gradient can exist. Since no task starts before its
earliest start, meeting these deadlines keeps the output gradients held at once within the
budget in every schedule. A deadline never falls before the wgrad's own earliest finish. A task
held in several backward candidates (chunks starting at different layers) gets the smallest of
its deadlines, which is safe for all of them. Where the budget covers all of a chunk's output
gradients, nothing binds and no ``deadline`` is written. The budget is a bound for *any*
partition, so it is conservative: on the shipped workloads at their own settings on the h100
it is 0.1-1.2 GiB on the tightest device (38 GiB for Qwen3-30B-A3B, which gets no deadline),
against 160 MiB for one expert GEMM's output gradient of Qwen3-Next at EP8, and most wgrads of
the other four workloads get a deadline. The pass is therefore not in the default pipeline.

How it relates to the DBO's deadlines: ``deadline`` (µs from the pair's start) holds a task
inside its pair, for ``overlap-schedule``, the exact solver and the verifier; ``dbo-slots``
gives the tasks it may defer *beyond* the pair their iteration-level rule (``deadline_rule =
"grad_reduce"``: before the chunk's gradients are reduced, i.e. before the optimizer step). A
deferred task leaves its pair, and its budget is then the DBO pool's (``memory_budget_bytes``).

Runs after ``candidates`` and before ``overlap-schedule``; a second run replaces the deadlines
of the first. Options mirror the ``partition`` pass's memory settings.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from passes.manager import ModulePass, PassError
from passes.partitioning.memory import GIB, MemoryAssumptions, build_memory_spec, output_gradient_bytes
from passes.plan_view import PlanView
from passes.scheduling.pair_dag import BWD, PairDAG, side_tasks
from passes.scheduling.schedule import heads, left_shift
from tessera_ir.kinds import Phase
from tessera_ir.model import Module
from tessera_ir.run_settings import RunSettings

# Deadlines are written rounded *up* to this many µs, so rounding never makes one unreachable.
RESOLUTION_US = 1e-3


@dataclass(frozen=True)
class WgradDeadlinesPass(ModulePass):
    name = "wgrad-deadlines"
    summary = "Give weight gradients an intra-pair deadline where the device's memory cannot hold their output gradients."
    requires = ("candidate",)

    def apply(self, module: Module) -> bool:
        view = PlanView(module)
        if not view.candidates:
            raise PassError("wgrad-deadlines: the module holds no candidate ops; run the 'candidates' pass first")
        if module.plan_ops("pair_schedule"):
            raise PassError(
                "wgrad-deadlines: the module already holds pair schedules, which the deadlines would invalidate; "
                "run it between candidates and overlap-schedule"
            )
        for task in module.tasks():
            if task.phase is Phase.WGRAD:
                task.attrs.pop("deadline", None)
        budgets = self._budgets(view)
        dtype_bytes = view.parallel.dtype_bytes
        memory: dict[str, float] = {}  # the earliest memory limit over the chunks holding the task
        feasible: dict[str, float] = {}  # the latest reference finish over those chunks
        seen: set[tuple[str, ...]] = set()
        for cand in view.candidates:
            if cand.chunk in seen:
                continue
            seen.add(cand.chunk)
            side = PairDAG(cand.name, side_tasks(cand.layers, BWD, view.duration, cand.name))
            limits = chunk_deadlines(
                side, lambda t: output_gradient_bytes(view.tasks, t, dtype_bytes), budgets[cand.stage % view.parallel.pp]
            )
            for name, limit in limits.items():
                memory[name] = min(limit, memory.get(name, limit))
            reference = backward_first(side)
            for i, t in enumerate(side.tasks):
                if t.movable:
                    feasible[t.name] = max(reference[i] + t.duration, feasible.get(t.name, 0.0))
        for name, limit in memory.items():
            # Never before the task finishes in some schedule of every pair that holds it.
            deadline = max(limit, feasible[name])
            view.tasks[name].attrs["deadline"] = RESOLUTION_US * math.ceil(deadline / RESOLUTION_US - 1e-9)
        return True

    def _budgets(self, view: PlanView) -> list[int]:
        """Per device, bytes that hold output gradients in every partition the candidates allow and
        the partition pass accepts: the larger of what the device has left with every stage at its
        largest candidate, and (with ``wgrad-headroom``) the headroom the partition reserves at
        least: one micro-batch of the activations of the device's smallest choice of chunks."""
        p = view.parallel
        run = RunSettings.from_attrs(view.module.attrs)  # the memory the partition will plan with
        capacity = run.memory_gib if run.memory_gib is not None else view.hardware.memory_gib
        spec = build_memory_spec(
            view.module, p, capacity, MemoryAssumptions(wgrad_headroom=False, reserved_gib=run.reserved_gib)
        )
        ranges: dict[int, list[tuple[int, int]]] = {}
        for cand in view.candidates:
            ranges.setdefault(cand.stage, []).append(cand.range)
        out = []
        for device in range(p.pp):
            stages = [s for s in (device + c * p.pp for c in range(p.vpp)) if ranges.get(s)]
            static = sum(max(spec.static(s, r) for r in ranges[s]) for s in stages)
            act = [max(spec.activation(s, r) for r in ranges[s]) for s in stages]
            held = max((sum(n * a for n, a in zip(v, act)) for v in spec.vectors[device]), default=0)
            left = int(capacity * GIB) - int(run.reserved_gib * GIB) - static - held
            headroom = max((min(spec.activation(s, r) for r in ranges[s]) for s in stages), default=0)
            out.append(max(left, headroom if run.wgrad_headroom else 0))
        return out


def chunk_deadlines(side: PairDAG, holds: Callable[[str], int], budget: int) -> dict[str, float]:
    """Deadlines (µs from the pair's start) of the movable tasks of one backward ``side`` whose output
    gradients (``holds(name)`` bytes each) would otherwise exceed ``budget`` bytes held at once."""
    head = heads(side)
    movable = sorted((head[i], i) for i, t in enumerate(side.tasks) if t.movable)
    sizes = [holds(side.tasks[i].name) for _, i in movable]
    out: dict[str, float] = {}
    for k, (_, i) in enumerate(movable):
        if sizes[k] <= 0:
            continue  # holds nothing: running it late costs no memory
        held = 0
        for j in range(k, len(movable)):
            held += sizes[j]
            if held > budget and j > k and sizes[j] > 0:  # a new output gradient would overflow
                t = side.tasks[i]
                out[t.name] = max(movable[j][0], head[i] + t.duration)
                break
    return out


def backward_first(side: PairDAG) -> list[float]:
    """Start times of a backward side run alone, each stream in the side's (topological) order as
    early as it can: every pair holding the side has a schedule that runs it exactly so, with
    the forward tasks in its gaps, so deadlines no earlier than these finishes are always met."""
    return left_shift(side, [float(i) for i in range(len(side.tasks))])
