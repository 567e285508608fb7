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
from tessera_ir.model import Module, PlanOp, SymbolRef, Value
from tessera_ir.verifier import _Reporter, check

SLOT_KINDS = ("a2a_wait", "recv_wait")
DEADLINE_RULES = ("grad_reduce",)


def _non_negative(value: Value | None) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _count(value: Value | None) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@check("dbo-ops-legal", "dbo_slot and dbo_pool ops name compute waits, movable tasks and legal figures")
def _dbo_ops_legal(module: Module) -> Iterator[VerifyError]:
    r = _Reporter("dbo-ops-legal", module)
    tasks = module.task_map()
    pp = module.attrs.get("pp", 1)
    for op in module.plan:
        if op.op == "dbo_slot":
            yield from _slot_op(r, op, tasks, pp if isinstance(pp, int) else 1)
        elif op.op == "dbo_pool":
            for entry in op.entries:
                task = tasks.get(entry.ref)
                if task is None:
                    continue  # references-resolve reports it
                if task.movable is not True:
                    yield r.plan(op, f"lists '@{entry.ref}', which is not a movable task; only movable work can be deferred")
                if not _non_negative(entry.attrs.get("duration_us")):
                    yield r.plan(op, f"gives '@{entry.ref}' duration_us = {entry.attrs.get('duration_us')!r}; it must be >= 0")
                if not _count(entry.attrs.get("memory_bytes")):
                    yield r.plan(op, f"gives '@{entry.ref}' memory_bytes = {entry.attrs.get('memory_bytes')!r}; it must be an integer >= 0")
                if entry.attrs.get("deadline_rule") not in DEADLINE_RULES:
                    yield r.plan(
                        op, f"gives '@{entry.ref}' deadline_rule = {entry.attrs.get('deadline_rule')!r}; use one of "
                        f"{', '.join(repr(x) for x in DEADLINE_RULES)}"
                    )


def _slot_op(r: _Reporter, op: PlanOp, tasks: dict, pp: int) -> Iterator[VerifyError]:
    kind = op.attrs.get("kind")
    if kind not in SLOT_KINDS:
        yield r.plan(op, f"has kind = {kind!r}; a dbo_slot is one of {', '.join(repr(k) for k in SLOT_KINDS)}")
        return
    if kind == "recv_wait":
        device = op.attrs.get("device")
        if not _count(device) or device >= pp:  # type: ignore[operator]
            yield r.plan(op, f"has device = {device!r}; it must be a pipeline device 0..{pp - 1}")
        predicted = op.attrs.get("predicted_us")
        if not isinstance(predicted, list) or not all(_non_negative(v) for v in predicted):
            yield r.plan(op, "needs predicted_us, a list of non-negative waits (µs), one per step of the device")
        if "tail_us" in op.attrs and not _non_negative(op.attrs["tail_us"]):
            yield r.plan(op, f"has tail_us = {op.attrs['tail_us']!r}; it must be a number >= 0")
        if not _count(op.attrs.get("memory_budget_bytes")):
            yield r.plan(op, f"has memory_budget_bytes = {op.attrs.get('memory_budget_bytes')!r}; it must be an integer >= 0")
        if op.entries:
            yield r.plan(op, "is a recv_wait slot list and takes no entries")
        return
    for entry in op.entries:
        task = tasks.get(entry.ref)
        if task is None:
            continue
        if task.resource != Resource.COMPUTE:
            yield r.plan(op, f"puts a slot before '@{entry.ref}', which is not a compute task")
        waits_on = entry.attrs.get("waits_on")
        other = tasks.get(waits_on.name) if isinstance(waits_on, SymbolRef) else None
        if other is None or other.resource != Resource.COMM or other.name not in task.deps:
            yield r.plan(op, f"says '@{entry.ref}' waits on {waits_on!r}; it must name a comm task '@{entry.ref}' depends on")
        for attr in ("base_us", "a2a_us", "gemm_us"):
            if not _non_negative(entry.attrs.get(attr)):
                yield r.plan(op, f"gives '@{entry.ref}' {attr} = {entry.attrs.get(attr)!r}; it must be a number >= 0")
