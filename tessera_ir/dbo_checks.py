"""Verifier check of the Dynamic Bubble Optimizer's plan ops (written by the ``dbo-slots`` pass).

``dbo_slot`` with ``kind = "a2a_wait"``: per program (a steady-state pair or a lone chunk), one
entry per compute task that may wait for an All-to-All, naming the comm task it waits on
(``waits_on``, one of its dependencies) and the non-negative ``base_us``, ``a2a_us``, ``gemm_us``
of its prediction.

``dbo_slot`` with ``kind = "recv_wait"``: per pipeline device, no entries; ``device``, the
predicted wait before each of its steps (``predicted_us``, non-negative), optionally the idle after
its last step (``tail_us``, non-negative) and the pool's ``memory_budget_bytes``.

``dbo_pool``: per program, one entry per deferrable task: a movable task, with a non-negative
``duration_us`` and integer ``memory_bytes``, and ``deadline_rule = "grad_reduce"`` (it must run
by the end of its chunk's last backward step, before the chunk's gradients are reduced).
"""

from __future__ import annotations

from collections.abc import Iterator

from tessera_ir.errors import VerifyError
from tessera_ir.kinds import Resource
from tessera_ir.model import Module, PlanOp, Task
from tessera_ir.plan_ops import DBO_POOL, DBO_SLOT, DboSlotOp, slot_entry
from tessera_ir.verifier import _Reporter, check

# The legal values, as the ops' declarations (tessera_ir/plan_ops.py) give them.
SLOT_KINDS = ("a2a_wait", "recv_wait")
DEADLINE_RULES = ("grad_reduce",)


@check("dbo-ops-legal", "dbo_slot and dbo_pool ops name compute waits, movable tasks and devices of the pipeline")
def _dbo_ops_legal(module: Module) -> Iterator[VerifyError]:
    # The attributes' presence and types are the declarations' (plan-ops-declared); this check holds
    # what they cannot state alone: the tasks named, and the device against the pipeline.
    r = _Reporter("dbo-ops-legal", module)
    tasks = module.task_map()
    pp = module.attrs.get("pp", 1)
    for op in module.plan:
        if op.op == DBO_SLOT.kind:
            yield from _slot_op(r, op, tasks, pp if type(pp) is int else 1)
        elif op.op == DBO_POOL.kind:
            for entry in op.entries:
                task = tasks.get(entry.ref)
                if task is None:
                    continue  # references-resolve reports it
                if task.movable is not True:
                    yield r.plan(op, f"lists '@{entry.ref}', which is not a movable task; only movable work can be deferred")


def _slot_op(r: _Reporter, op: PlanOp, tasks: dict[str, Task], pp: int) -> Iterator[VerifyError]:
    slot = DboSlotOp(op)
    if slot.kind not in SLOT_KINDS:
        return  # plan-ops-declared reports it
    if slot.kind == "recv_wait":
        device = slot.device
        if device is not None and device >= pp:
            yield r.plan(op, f"has device = {device!r}; it must be a pipeline device 0..{pp - 1}")
        if op.entries:
            yield r.plan(op, "is a recv_wait slot list and takes no entries")
        return
    for entry in op.entries:
        task = tasks.get(entry.ref)
        if task is None:
            continue
        if task.resource != Resource.COMPUTE:
            yield r.plan(op, f"puts a slot before '@{entry.ref}', which is not a compute task")
        waits_on = slot_entry(entry).waits_on
        other = tasks.get(waits_on)
        if waits_on and (other is None or other.resource != Resource.COMM or other.name not in task.deps):
            yield r.plan(op, f"says '@{entry.ref}' waits on @{waits_on}; it must name a comm task '@{entry.ref}' depends on")
