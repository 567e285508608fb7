"""The ``dbo-slots`` pass: where idle time can appear at run time, and what may fill it.

Before: a planned module (``partition`` and the pair schedules). After::

    plan dbo_slot @dbo.slots.3 {bwd = [@l9, @l10, @l11], fwd = [@l0, @l1, @l2], kind = "a2a_wait",
                                schedule = @sched.41} {
      @l0.expert_gemm.fwd {a2a_us = 4215.8, base_us = 0.0, gemm_us = 0.0, waits_on = @l0.dispatch.fwd}
      ...
    }
    plan dbo_pool @dbo.pool.3 {bwd = [@l9, @l10, @l11], fwd = [@l0, @l1, @l2]} {
      @l9.linear_attention.wgrad {deadline_rule = "grad_reduce", duration_us = 812.4, memory_bytes = 50331648}
    }
    plan dbo_slot @dbo.recv.d0 {device = 0, kind = "recv_wait", memory_budget_bytes = 2576980377,
                                predicted_us = [0.0, 0.0, 1250.3, ...]}

One ``dbo_slot``/``dbo_pool`` pair per *program* a pipeline rank runs (a steady-state pair of
chunks, or a chunk's forward or backward alone in warm-up and cool-down), named by its layers;
``schedule`` names the plan's pair schedule the program follows, when it has one. Read off the
program's post-overlap timeline (``passes.simulation.slots``):

- ``a2a_wait`` slots: every compute task that depends on an All-to-All, with the wait the static
  plan predicts (``base_us``) and the routed work it depends on (``a2a_us`` of transfer,
  ``gemm_us`` of expert GEMM), from which the run-time policy (``runtime.dbo``) predicts the
  slot under the routing it sees before dispatch.
- the pool: weight gradients the static schedule runs after the program's last All-to-All,
  where they only lengthen the step, with their duration, the bytes deferring them keeps alive,
  and their deadline (``grad_reduce``: by the end of the chunk's last backward step).
- ``recv_wait`` slots, one op per device: the wait before each of its steps in a simulated
  iteration of the static plan under balanced routing (``passes.simulation``), the idle after
  its last step and gradient reduction until the iteration ends (``tail_us``), and the pool's
  memory budget: by default the device's headroom, device memory less the stage's static peak
  less the margin × device memory (the run-wide setting ``dbo_memory_margin``, 5% by default:
  allocator fragmentation and communication buffers the memory model does not count); the
  run-wide setting ``dbo_memory_budget`` (``--dbo-memory-budget``, in the module header) set to a
  share of device memory overrides it, within what the static plan leaves free.

The steps follow the combined-1F1B order (``passes.pipelining.order``) the simulator and the
per-rank programs use.
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.manager import ModulePass, PassError
from passes.plan_view import PlanView
from passes.simulation.build import BuildError, BuildOptions, SimulationBuilder, dbo_budgets, static_tails
from passes.simulation.engine import simulate
from passes.simulation.program import Program
from tessera_ir.errors import TesseraError
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef, Value
from tessera_ir.run_settings import RunSettings

OPS = ("dbo_slot", "dbo_pool")


@dataclass(frozen=True)
class DboSlotsPass(ModulePass):
    name = "dbo-slots"
    summary = "Annotate the plan with DBO slots (where compute can wait) and the pool of deferrable weight gradients."
    requires = ("partition",)
    produces = ("dbo_slot", "dbo_pool")

    def apply(self, module: Module) -> bool:
        if any(op.op in OPS for op in module.plan):
            raise PassError("dbo-slots: the module already holds dbo_slot/dbo_pool ops; run the pass once")
        if not module.plan_ops("partition"):
            raise PassError("dbo-slots: the module holds no partition; run the planning passes (… ,partition) first")
        settings = RunSettings.from_attrs(module.attrs)  # run-wide, in the module header
        share = None if settings.dbo_memory_budget == "headroom" else float(settings.dbo_memory_budget)
        options = BuildOptions(dbo=True, dbo_memory_fraction=share)
        try:
            builder = SimulationBuilder(PlanView(module), options)
            inp = builder.build()
            static = simulate(inp)
            budgets = dbo_budgets(static, builder.hw.memory_bytes, share, settings.dbo_memory_margin)
            tails = static_tails(static)
        except (BuildError, TesseraError) as err:
            raise PassError(f"dbo-slots: {err}") from None
        keys = {id(p): k for k, p in builder.programs.items()}
        seen: set[int] = set()
        for actions in inp.ranks:
            for action in actions:
                program = action.program
                if id(program) in seen:
                    continue
                seen.add(id(program))
                key = keys[id(program)]
                module.plan.extend(self._program_ops(len(seen) - 1, key, builder.sources.get(key), program))
        for device, predicted in enumerate(inp.recv_predicted_us):
            module.plan.append(PlanOp("dbo_slot", f"dbo.recv.d{device}", {
                "device": device,
                "kind": "recv_wait",
                "memory_budget_bytes": budgets[device],
                "predicted_us": [round(x, 3) for x in predicted],
                "tail_us": round(tails[device], 3),
            }))
        return True

    @staticmethod
    def _program_ops(count: int, key: tuple[tuple[str, ...], tuple[str, ...]], schedule: str | None, program: Program) -> list[PlanOp]:
        layers: dict[str, Value] = {"bwd": [SymbolRef(x) for x in key[1]], "fwd": [SymbolRef(x) for x in key[0]]}
        slot_attrs: dict[str, Value] = {**layers, "kind": "a2a_wait"}
        if schedule is not None:
            slot_attrs["schedule"] = SymbolRef(schedule)
        slots = []
        for s in program.slots:
            slots.append(PlanEntry(program.tasks[s.task].name, {
                "a2a_us": round(s.a2a_us, 3), "base_us": round(s.base_us, 3), "gemm_us": round(s.gemm_us, 3),
                "waits_on": SymbolRef(program.tasks[s.waits_on].name),
            }))
        pool = [
            PlanEntry(t.name, {"deadline_rule": "grad_reduce", "duration_us": round(t.duration_us, 3), "memory_bytes": t.memory_bytes})
            for t in program.tasks if t.deferrable
        ]
        out = []
        if slots:
            out.append(PlanOp("dbo_slot", f"dbo.slots.{count}", slot_attrs, slots))
        if pool:
            out.append(PlanOp("dbo_pool", f"dbo.pool.{count}", dict(layers), pool))
        return out
