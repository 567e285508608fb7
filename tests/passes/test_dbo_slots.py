"""The dbo-slots pass: slots and pools per program, receive waits per device, round trip, read back."""

from __future__ import annotations

import pytest

from passes.manager import PassError, PassManager, parse_pipeline
from passes.plan_view import PlanView
from passes.simulation.build import BuildOptions, SimulationBuilder
from passes.simulation.engine import simulate
from tessera_ir import parse_module, print_module, verify
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import SymbolRef

from planned_modules import planned


def test_ops_name_compute_waits_tail_weight_gradients_and_every_device() -> None:
    module = planned(dbo=True)
    verify(module)
    tasks = module.task_map()
    slots = [op for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "a2a_wait"]
    pools = module.plan_ops("dbo_pool")
    devices = [op for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "recv_wait"]
    assert slots and pools
    for op in slots:
        for e in op.entries:
            waits_on = e.attrs["waits_on"]
            assert isinstance(waits_on, SymbolRef)
            assert tasks[e.ref].resource is Resource.COMPUTE and tasks[waits_on.name].resource is Resource.COMM
            assert waits_on.name in tasks[e.ref].deps
    for op in pools:
        assert all(tasks[e.ref].movable and e.attrs["deadline_rule"] == "grad_reduce" for e in op.entries)
    assert sorted(op.attrs["device"] for op in devices) == [0, 1]  # type: ignore[type-var]
    inp = SimulationBuilder(PlanView(module)).build()
    static = simulate(inp)
    capacity = 80 * 2**30
    for op in devices:
        device = op.attrs["device"]
        assert len(op.attrs["predicted_us"]) == len(inp.ranks[device])  # type: ignore[arg-type, index]
        # The default budget is the headroom: device memory less the static peak less the 5% margin.
        headroom = capacity - static.ranks[device].peak_bytes - int(0.05 * capacity)  # type: ignore[index]
        assert op.attrs["memory_budget_bytes"] == max(0, headroom) > int(0.03 * capacity)


def test_a_share_of_device_memory_overrides_the_headroom_and_the_margin_moves_it() -> None:
    def budgets(**settings: float) -> list[int]:
        module = planned()
        module.attrs.update(settings)  # run-wide settings, in the module header
        PassManager(parse_pipeline("dbo-slots")).run(module)
        ops = sorted((op for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "recv_wait"), key=lambda op: op.attrs["device"])  # type: ignore[arg-type, return-value]
        return [int(op.attrs["memory_budget_bytes"]) for op in ops]  # type: ignore[arg-type]

    capacity = 80 * 2**30
    assert budgets(dbo_memory_budget=0.03) == [int(0.03 * capacity)] * 2
    wide, narrow = budgets(dbo_memory_margin=0.05), budgets(dbo_memory_margin=0.1)
    assert [w - n for w, n in zip(wide, narrow)] == [int(0.1 * capacity) - int(0.05 * capacity)] * 2


def test_ops_round_trip_through_text() -> None:
    text = print_module(planned(dbo=True))
    assert print_module(parse_module(text)) == text


def test_the_simulator_reads_what_the_pass_wrote() -> None:
    annotated = planned(dbo=True)
    plain = planned()
    from_ir = SimulationBuilder(PlanView(annotated), BuildOptions(dbo=True))
    computed = SimulationBuilder(PlanView(plain), BuildOptions(dbo=True))
    a, b = from_ir.build(), computed.build()
    ra = simulate(a, dbo=from_ir.dbo_settings(a))
    rb = simulate(b, dbo=computed.dbo_settings(b))
    assert ra.iteration_us == pytest.approx(rb.iteration_us, rel=1e-6)
    assert ra.dbo is not None and rb.dbo is not None
    assert (ra.dbo.offered, ra.dbo.placed, ra.dbo.fallbacks) == (rb.dbo.offered, rb.dbo.placed, rb.dbo.fallbacks)


def test_the_verifier_refuses_a_negative_tail() -> None:
    module = planned(dbo=True)
    device = next(op for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "recv_wait")
    device.attrs["tail_us"] = -1.0
    with pytest.raises(TesseraError, match="tail_us"):
        verify(module)


def test_refusals() -> None:
    module = planned(dbo=True)
    with pytest.raises(PassError, match="already holds dbo_slot"):
        PassManager(parse_pipeline("dbo-slots")).run(module)
    bare = planned()
    bare.plan = [op for op in bare.plan if op.op != "partition"]
    with pytest.raises(PassError, match="no partition"):
        PassManager(parse_pipeline("dbo-slots")).run(bare)
    too_large = planned()
    too_large.attrs["dbo_memory_budget"] = 2.0  # the budget is a run-wide setting in the header
    with pytest.raises(PassError, match=r"header attribute 'dbo_memory_budget': .*share of device memory in \[0, 1\], got 2.0"):
        PassManager(parse_pipeline("dbo-slots")).run(too_large)
    bad_margin = planned()
    bad_margin.attrs["dbo_memory_margin"] = 1.5
    with pytest.raises(PassError, match=r"header attribute 'dbo_memory_margin': .*\[0, 1\), got 1.5"):
        PassManager(parse_pipeline("dbo-slots")).run(bad_margin)
