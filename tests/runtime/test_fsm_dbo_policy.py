"""The C++ FSM against the DBO policy itself (``runtime/dbo.py``, the simulator's one definition).

``PolicyFSM`` is the reference interpreter with its pool decisions delegated
to ``runtime.dbo.DboPolicy``: offers at DEFER (step = the instruction index,
deadline step = deadline - 1), ``predict`` from the reported per-expert token
counts and ``fill`` at a SLOT, ``due`` before every instruction. The C++ FSM
must take the same actions and count the same as the policy does.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import runtime
from runtime import reference
from runtime.reference import CLOCK_COUNTERS, ReferenceFSM, _Pooled

from program_gen import drive, generate_bytes

dbo = pytest.importorskip("runtime.dbo", reason="the DBO policy module is not in this tree yet")


class PolicyFSM(ReferenceFSM):
    def __init__(self, program: reference.Program, **options: object) -> None:
        super().__init__(program, **options)  # type: ignore[arg-type]
        # The admission's forecast: every SLOT at its instruction index, with its balanced-routing size.
        slots = [(i, self.slots[ins.a].base_us) for i, ins in enumerate(self.code) if ins.op == reference.Op.SLOT]
        forecast = dbo.SlotForecast(slots, self.min_slot_us) if self.admission else None
        self.policy = dbo.DboPolicy(self.budget, self.min_slot_us, forecast)
        self.entries: dict[int, _Pooled] = {}
        self.imbalance: dict[int, float] = {}

    def report_tokens(self, task: int, mb: int, expert_tokens) -> bool:  # noqa: ANN001
        instr = self.slot_of.get((task, mb))
        if instr is not None:
            self.imbalance[instr] = dbo.load_imbalance(expert_tokens, self.ep)
        return super().report_tokens(task, mb, expert_tokens)

    def _offer(self, action_id: int, task: int, mb: int, deadline: int, memory_bytes: int) -> None:
        entry = _Pooled(action_id, task, mb, deadline - 1, memory_bytes, self.tasks[task].duration_us)
        movable = dbo.MovableTask(action_id, self.tasks[task].name, entry.duration_us, deadline - 1, memory_bytes)
        if self.dbo and self.policy.offer(movable, self.pc - 1 if action_id < len(self.code) else self.pc):
            self.entries[action_id] = entry
            self.state[action_id] = reference.POOLED
            self.pool[action_id] = entry  # non-empty pool: advance() calls _due
        else:
            self.ready.append((entry, False, False))

    def _due(self) -> None:
        for t in self.policy.due(self.pc - 1):
            del self.pool[t.task_id]
            self.ready.append((self.entries[t.task_id], False, True))

    def _slot(self, ins) -> None:  # noqa: ANN001
        step = self.pc
        self.pc += 1
        if not self.dbo or self.state[ins.b] == reference.DONE:
            return
        spec = self.slots[ins.a]
        slot = dbo.SlotSpec(str(step), spec.base_us, spec.a2a_us, spec.gemm_us)
        predicted = dbo.DboPolicy.predict(slot, self.imbalance[step]) if step in self.imbalance else spec.base_us
        for t in self.policy.fill(step, predicted).tasks:
            del self.pool[t.task_id]
            self.ready.append((self.entries[t.task_id], True, False))

    @property
    def counters(self) -> dict[str, float]:
        c = self.policy.counters
        return {
            "tasks_run": self.c["tasks_run"], "offered": c.offered, "deferred": c.deferred,
            "refused_memory": c.refused_memory, "refused_deadline": c.refused_deadline, "placed": c.placed, "fallbacks": c.fallbacks, "slots": c.slots,
            "slots_filled": c.slots_filled, "predicted_us": c.predicted_us, "placed_us": c.placed_us,
            "fallback_us": c.fallback_us, "peak_pool_bytes": c.peak_pool_bytes,
        }


@settings(max_examples=100, deadline=None)
@given(
    plan_seed=st.integers(0, 10_000),
    drive_seed=st.integers(0, 10_000),
    budget=st.sampled_from([None, 0, 1 << 20, 1 << 26]),
    min_slot_us=st.sampled_from([0.0, 10.0, 60.0]),
    admission=st.booleans(),
)
def test_cpp_fsm_takes_the_dbo_policys_decisions(
    plan_seed: int, drive_seed: int, budget: int | None, min_slot_us: float, admission: bool
) -> None:
    data = generate_bytes(plan_seed, dbo=True)
    rank = drive_seed % runtime.bytecode.decode(data).plan.pp
    native = runtime.load_plan(data, rank=rank)
    ref = reference.load_plan(data, rank=rank)
    options: dict[str, Any] = {"memory_budget_bytes": budget, "min_slot_us": min_slot_us, "admission": admission}
    a, ca = drive(runtime.FSM(native, **options), native, drive_seed)
    b, cb = drive(PolicyFSM(ref, **options), ref, drive_seed)
    assert a == b
    assert {k: v for k, v in ca.items() if k not in CLOCK_COUNTERS and k in cb} == cb
