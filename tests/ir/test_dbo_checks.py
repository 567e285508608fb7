"""The dbo-ops-legal verifier check, case by case, on the DBO ops of a tiny MoE module."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_ir import collect_errors, parse_module

BASE = (Path(__file__).parent / "invalid" / "dbo-ops-legal_invalid.tir").read_text()
BAD_ENTRY = '    @l0.router.fwd {deadline_rule = "grad_reduce", duration_us = 1.0, memory_bytes = 0}\n'


def _errors(text: str) -> list[str]:
    # Types and required attributes are the ops' declarations' (plan-ops-declared), the rest dbo-ops-legal's.
    return [e.message for e in collect_errors(parse_module(text)) if e.check in ("dbo-ops-legal", "plan-ops-declared")]


def test_well_formed_ops_pass() -> None:
    assert _errors(BASE.replace(BAD_ENTRY, "")) == []


@pytest.mark.parametrize(
    "old,new,message",
    [
        ('kind = "a2a_wait"', 'kind = "idle"', "it must be one of 'a2a_wait', 'recv_wait'"),
        ("waits_on = @l0.dispatch.fwd", "waits_on = @l0.combine.fwd", "must name a comm task"),
        ("@l0.expert_gemm.fwd {a2a_us", "@l0.combine.fwd {a2a_us", "not a compute task"),
        ("base_us = 0.0", "base_us = -1.0", "base_us = -1.0"),
        ('deadline_rule = "grad_reduce", duration_us = 4.0', 'deadline_rule = "soon", duration_us = 4.0', 'deadline_rule = "soon"'),
        ("memory_bytes = 4096", "memory_bytes = 1.5", "memory_bytes = 1.5"),
        ("device = 0", "device = 3", "pipeline device 0..0"),
        ("predicted_us = [0.0, 1.5]", "predicted_us = [0.0, -1.5]", "a list of non-negative numbers of µs"),
        ("memory_budget_bytes = 1024", "memory_budget_bytes = -4", "memory_budget_bytes = -4"),
    ],
)
def test_each_rule_fires(old: str, new: str, message: str) -> None:
    text = BASE.replace(BAD_ENTRY, "")
    assert old in text
    errors = _errors(text.replace(old, new, 1))
    assert any(message in e for e in errors), errors
