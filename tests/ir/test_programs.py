"""Program instructions in the IR: each entry reads into one instruction and prints back, or is refused
naming what is wrong."""

from __future__ import annotations

import pytest

from tessera_ir.model import PlanEntry
from tessera_ir.programs import OPS, Instruction, ProgramFormatError

GOOD = [
    PlanEntry("l0.router.fwd", {"op": "run", "mb": 3}),
    PlanEntry("l0.router.wgrad", {"op": "defer", "mb": 0, "deadline": 12}),
    PlanEntry("l0.dispatch.fwd", {"op": "all_to_all", "mb": 1}),
    PlanEntry("cand.s0", {"op": "grad_reduce"}),
    PlanEntry("cand.s0", {"op": "send", "mb": 0, "peer": 1, "payload": "activation"}),
    PlanEntry("cand.s1", {"op": "recv", "mb": 0, "peer": 1, "payload": "gradient"}),
    PlanEntry("l0.dispatch.fwd", {"op": "wait", "on": 2, "stream": "compute"}),
    PlanEntry("l0.dispatch.fwd", {"op": "slot", "mb": 1, "on": 2, "base_us": 1, "a2a_us": 2.5, "gemm_us": 0.0}),
    PlanEntry("program.r0", {"op": "end"}),
]


def test_every_op_reads_and_prints_back() -> None:
    assert sorted(e.attrs["op"] for e in GOOD) == sorted(OPS)  # type: ignore[type-var]
    for entry in GOOD:
        instr = Instruction.from_entry(entry)
        back = instr.entry()
        assert back.ref == entry.ref
        assert {k: float(v) if k.endswith("_us") else v for k, v in entry.attrs.items()} == back.attrs  # type: ignore[arg-type]
    assert Instruction.from_entry(GOOD[6]).stream == "compute" and Instruction.from_entry(GOOD[4]).stream == "comm"


@pytest.mark.parametrize(("attrs", "message"), [
    ({"op": "jump", "mb": 0}, "op = 'jump' is not an instruction; use one of run, defer"),
    ({"mb": 0}, "op = None is not an instruction"),
    ({"op": "run"}, "a run needs 'mb'"),
    ({"op": "run", "mb": 0, "peer": 1}, "a run takes mb, not peer"),
    ({"op": "run", "mb": -1}, "'mb' of a run is -1; it must be an integer >= 0"),
    ({"op": "run", "mb": True}, "'mb' of a run is True; it must be an integer >= 0"),
    ({"op": "send", "mb": 0, "peer": 1, "payload": "weights"}, "'payload' of a send is 'weights'; it must be one of activation, gradient"),
    ({"op": "wait", "on": 0, "stream": "gpu"}, "'stream' of a wait is 'gpu'; it must be one of compute, comm"),
    ({"op": "all_to_all", "mb": 0.5}, "'mb' of an all_to_all is 0.5"),
    ({"op": "slot", "mb": 0, "on": 0, "base_us": -1.0, "a2a_us": 0.0, "gemm_us": 0.0}, "'base_us' of a slot is -1.0"),
    ({"op": "end", "mb": 0}, "an end takes no operands, not mb"),
])
def test_entries_that_are_not_instructions_are_refused_naming_the_problem(attrs: dict, message: str) -> None:
    with pytest.raises(ProgramFormatError) as info:
        Instruction.from_entry(PlanEntry("x", attrs))
    assert message in str(info.value)
