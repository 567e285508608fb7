"""Every reader of the plan refuses a malformed plan op as the verifier does (tessera_ir/plan_ops.py):
the same message, line and column, whether or not the module was verified first."""

from __future__ import annotations

from pathlib import Path

import pytest

from passes.pipeline import dbo_slot_table, memory_budget
from passes.plan_view import PlanView
from passes.profile import ProfilePass
from passes.simulation.build import DboOps
from tessera_ir import parse_module, verify
from tessera_ir.errors import VerifyError
from tessera_ir.plan_ops import PlanOpError

INVALID = Path(__file__).parents[1] / "ir" / "invalid"


def _verify_error(text: str, source: str) -> VerifyError:
    with pytest.raises(VerifyError) as info:
        verify(parse_module(text, source=source))
    return info.value


def test_a_candidate_without_layers_is_refused_by_the_verifier_and_the_passes_alike() -> None:
    # The reproduction: verify refused it, while profile priced the pair as if the layers were there.
    path = INVALID / "plan-ops-declared_invalid.tir"
    text = path.read_text()
    expected = _verify_error(text, str(path))
    assert expected.check == "plan-ops-declared" and "has no 'layers'" in expected.message
    assert expected.line == next(k for k, line in enumerate(text.splitlines(), 1) if line.startswith("  plan candidate"))
    with pytest.raises(PlanOpError) as by_profile:
        ProfilePass().apply(parse_module(text, source=str(path)))
    assert str(by_profile.value) == str(expected)
    with pytest.raises(PlanOpError) as by_view:
        PlanView(parse_module(text, source=str(path))).candidates  # noqa: B018
    assert str(by_view.value) == str(expected)
    # With its layers the same module reads and verifies.
    fixed = text.replace("last = 0, stage = 0", "last = 0, layers = [@l0], stage = 0")
    verify(parse_module(fixed))
    assert [c.chunk for c in PlanView(parse_module(fixed)).candidates] == [("l0",)]


@pytest.mark.parametrize(
    "old,new,field",
    [
        ("a2a_us = 2.5, ", "", "a2a_us"),
        ('kind = "recv_wait", memory_budget_bytes = 1024, ', 'kind = "recv_wait", ', "memory_budget_bytes"),
        ("memory_bytes = 4096", "memory_bytes = -1", "memory_bytes"),
    ],
)
def test_dbo_readers_refuse_what_the_verifier_refuses(old: str, new: str, field: str) -> None:
    path = INVALID / "dbo-ops-legal_invalid.tir"
    base = path.read_text().replace('    @l0.router.fwd {deadline_rule = "grad_reduce", duration_us = 1.0, memory_bytes = 0}\n', "")
    assert old in base
    text = base.replace(old, new, 1)
    expected = _verify_error(text, str(path))
    assert expected.check == "plan-ops-declared" and field in expected.message
    for read in (DboOps, dbo_slot_table, memory_budget):
        if read is not DboOps and "dbo_pool" in expected.message:
            continue  # the pipeline pass reads only the dbo_slot ops
        if read is memory_budget and "] entry " in expected.message:
            continue  # and only their headers for the budget
        with pytest.raises(PlanOpError) as info:
            read(parse_module(text, source=str(path)))
        assert str(info.value) == str(expected), read


def test_a_schedule_entry_without_its_start_is_refused_by_the_view_as_by_the_verifier() -> None:
    path = INVALID / "plan-ops-declared_invalid.tir"
    text = path.read_text().replace("last = 0, stage = 0", "last = 0, layers = [@l0], stage = 0")
    old = '@l0.dense_mlp.fwd {duration = 1.5, start = 1.5, stream = "compute"}'
    assert old in text
    text = text.replace(old, '@l0.dense_mlp.fwd {duration = 1.5, stream = "compute"}')
    expected = _verify_error(text, str(path))
    assert expected.check == "plan-ops-declared" and "entry '@l0.dense_mlp.fwd'" in expected.message
    assert "has no 'start'" in expected.message
    view = PlanView(parse_module(text, source=str(path)))
    for read in (lambda: view.schedule("sched.0"), lambda: view.scheduled_tasks(view.pair("sched.0.pair"))):
        with pytest.raises(PlanOpError) as info:
            read()
        assert str(info.value) == str(expected)
