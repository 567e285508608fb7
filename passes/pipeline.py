"""The ``pipeline`` pass: lower the planned module into one program per pipeline rank.

Before: the partition (``partition``) and the pair schedules (``overlap-schedule``); DBO slots
when ``dbo-slots`` ran. After (``docs/ir.md``, "Per-rank programs")::

    plan pipeline @pipeline {combined = false, dbo = false, memory_budget_bytes = 0, order = "interleaved-1f1b",
                             programs = [@program.r0, @program.r1]} {
      @l0.attention.fwd {duration_us = 812.4}
      @l0.attention.wgrad {duration_us = 401.2, memory_bytes = 4194304}
      ...
    }
    plan program @program.r0 {rank = 0} {
      @embed.embedding.fwd {mb = 0, op = "run"}
      ...
      @cand.s0.c1 {mb = 0, op = "send", payload = "activation", peer = 1}
      ...
      @program.r0 {op = "end"}
    }

Each rank's program runs its steps (``pipelining.order.rank_steps``) in the interleaved-1F1B
order (plain 1F1B at vpp = 1): warm-up forwards; in the combined order steady-state pairs
expanded into their scheduled tasks on the compute and comm streams, in the plain order each
steady forward and backward a step of its own; cool-down backwards; with point-to-point transfers between stages, All-to-All
collectives over the EP group, the waits between streams, weight gradients registered with
their deadline, DBO slots, and each stage's gradient reduction (``pipelining.lowering``). The
EP ranks of a pipeline rank share its program (the static plan gives them the same work).

The ``pipeline`` op lists what the runtime needs of every task: its isolated duration on the
target (what DBO fits into slots, and what a trainer's ledger compares against) and, for a
weight gradient, the bytes deferring it keeps alive. The verifier's program checks
(``tessera_ir.program_checks``) then prove the programs match their transfers, order their
collectives alike and cannot deadlock; ``tessera-compile -o plan.tsb`` writes them as bytecode.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.manager import ModulePass, PassError
from passes.pipelining.lowering import Lowering, SlotFigures, SlotTable, Stage, deferral_bytes
from passes.plan_view import PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import Attrs, Module, PlanEntry, PlanOp, SymbolRef, Value
from tessera_ir.plan_ops import DBO_SLOT, DboSlotOp, entity_kinds, slot_entry
from tessera_ir.programs import PIPELINE_OP, PROGRAM_OP, program_op


@dataclass(frozen=True)
class PipelinePass(ModulePass):
    name = "pipeline"
    summary = "Lower the planned module into one program per pipeline rank (interleaved 1F1B), checked for deadlock."
    requires = ("partition",)
    produces = ("pipeline", "program")

    def apply(self, module: Module) -> bool:
        if any(op.op in (PIPELINE_OP, PROGRAM_OP) for op in module.plan):
            raise PassError("pipeline: the module already holds per-rank programs; run the pass once")
        view = PlanView(module)
        slots = dbo_slot_table(module)
        try:
            partition = view.partition
            if partition is None:
                raise PassError("the module holds no partition; run the planning passes (..., partition) first")
            stages = [Stage(cand.name, cand.layers) for cand in partition.stages]
            # The pairs were planned in the module's order (a run-wide setting in its header): lower in it.
            combined = view.parallel.combined_1f1b
            programs = Lowering(module, stages, view.chunk_schedule, view.duration, combined, slots).programs()
        except TesseraError as err:
            raise PassError(f"pipeline: {err}") from None
        p = view.parallel
        layer_of = module.layer_of_task()
        entries = []
        for task in module.tasks():
            attrs: Attrs = {"duration_us": round(view.duration(task), 3)}
            if task.movable:
                attrs["memory_bytes"] = deferral_bytes(task, layer_of[task.name], p.dtype_bytes)
            entries.append(PlanEntry(task.name, attrs))
        names: list[Value] = [SymbolRef(f"program.r{r}") for r in range(p.pp)]
        module.plan.append(PlanOp(PIPELINE_OP, "pipeline", {
            "order": "interleaved-1f1b" if p.vpp > 1 else "1f1b",
            "combined": combined,
            "dbo": bool(slots),
            "memory_budget_bytes": memory_budget(module),
            "programs": names,
        }, entries))
        module.plan.extend(program_op(rank, code) for rank, code in sorted(programs.items()))
        return True


def dbo_slot_table(module: Module) -> SlotTable:
    """The ``dbo_slot`` ops of kind ``a2a_wait`` (from ``dbo-slots``): per step kind, per compute task, its slot.

    Each op is read through its declaration (``tessera_ir.plan_ops``), which refuses a malformed one
    as the verifier does."""
    table: SlotTable = {}
    kind_of = None
    for op in module.plan:
        if op.op != DBO_SLOT.kind:
            continue
        kind_of = kind_of or entity_kinds(module)
        slot = DboSlotOp.read(module, op, kind_of, entries=True)
        if slot.kind != "a2a_wait":
            continue
        per_task = table.setdefault((slot.fwd, slot.bwd), {})
        for entry in op.entries:
            figures = slot_entry(entry)
            per_task[entry.ref] = SlotFigures(figures.waits_on, figures.base_us, figures.a2a_us, figures.gemm_us)
    return table


def memory_budget(module: Module) -> int:
    """The DBO pool's budget: the smallest device's (``dbo_slot`` ops of kind ``recv_wait``); 0 without DBO.

    The bytecode carries one budget for every rank, so the tightest one is taken; a trainer may
    pass its own device's to ``runtime.FSM(memory_budget_bytes=...)``.
    """
    budgets = []
    for op in module.plan:
        if op.op == DBO_SLOT.kind:
            slot = DboSlotOp.read(module, op)
            if slot.kind == "recv_wait" and slot.memory_budget_bytes is not None:
                budgets.append(slot.memory_budget_bytes)
    return min(budgets) if budgets else 0
