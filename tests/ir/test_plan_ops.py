"""Declared plan ops (tessera_ir/plan_ops.py): each kind's required attributes, types and references,
reported by the verifier's plan-ops-declared check and raised the same way by the accessors."""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest

from tessera_ir import parse_module
from tessera_ir.plan_ops import (
    OP_DEFS,
    CandidateOp,
    DboPoolOp,
    DboSlotOp,
    PairOp,
    PairScheduleOp,
    PartitionOp,
    PipelineOp,
    PlanOpError,
    ProgramOp,
    op_reference,
    with_reference,
)
from tessera_ir.programs import read_programs
from tessera_ir.verifier import collect_errors

BASE = (Path(__file__).parent / "invalid" / "dbo-ops-legal_invalid.tir").read_text()
BAD_ENTRY = '    @l0.router.fwd {deadline_rule = "grad_reduce", duration_us = 1.0, memory_bytes = 0}\n'

# One op of every declared kind, each well formed, after the DBO ops of the dbo-ops-legal base.
PLAN = """\
  plan candidate @cand.s0.c0 {first = 0, in_window = true, last = 0, layers = [@embed, @l0, @head], stage = 0}
  plan pair @pair.0 {bwd_candidate = @cand.s0.c0, device = 0, fwd_candidate = @cand.s0.c0, schedule = @sched.0}
  plan pair_schedule @sched.0 {method = "gap-fit", pairs = [@pair.0]} {
    @l0.router.fwd {duration = 1.0, order = 0, start = 0.0, stream = "compute"}
  }
  plan partition @partition {stages = [@cand.s0.c0]}
  plan pipeline @pipeline {combined = false, programs = [@program.r0]} {
    @l0.router.fwd {duration_us = 1.0}
  }
  plan program @program.r0 {rank = 0} {
    @program.r0 {op = "end"}
  }
}
"""
TEXT = BASE.split("\n", 2)[2].replace(BAD_ENTRY, "").removesuffix("}\n") + PLAN

ACCESSORS = {
    "candidate": CandidateOp, "pair": PairOp, "pair_schedule": PairScheduleOp, "partition": PartitionOp,
    "dbo_slot": DboSlotOp, "dbo_pool": DboPoolOp, "pipeline": PipelineOp, "program": ProgramOp,
}

# (op, attribute or "entry.<attribute>") for every required attribute of every declared kind.
REQUIRED = [
    (kind, f.name) for kind, d in OP_DEFS.items() for f in d.attrs if f.required
] + [
    (kind, f"entry.{f.name}") for kind, d in OP_DEFS.items() for f in d.entry_attrs if f.required
] + [("dbo_slot", "device"), ("dbo_slot", "predicted_us"), ("dbo_slot", "memory_budget_bytes")]


def _declared_errors(text: str) -> list:
    return [e for e in collect_errors(parse_module(text, source="m.tir")) if e.check == "plan-ops-declared"]


def test_the_base_holds_every_declared_kind_and_is_clean() -> None:
    module = parse_module(TEXT)
    assert {op.op for op in module.plan} == set(OP_DEFS) == set(ACCESSORS)
    assert _declared_errors(TEXT) == []


def _drop(text: str, kind: str, attr: str) -> tuple[str, int]:
    """``text`` without ``attr`` on the first op of ``kind`` that has it, and the line that was changed."""
    in_entry = attr.startswith("entry.")
    name = attr.removeprefix("entry.")
    lines = text.split("\n")
    inside = False
    for k, line in enumerate(lines):
        if line.startswith("  plan "):
            inside = line.startswith(f"  plan {kind} ")
            if kind == "dbo_slot" and not in_entry and name in ("device", "predicted_us", "memory_budget_bytes"):
                inside = inside and "recv_wait" in line
            where = line
        elif inside and in_entry and line.startswith("    @"):
            where = line
        else:
            continue
        if not inside or (in_entry != where.startswith("    @")):
            continue
        dropped = re.sub(
            rf"(\{{|, ){name} = (\[[^\]]*\]|\"[^\"]*\"|@[\w.\-]+|[\w.\-]+)(, )?",
            lambda m: "{" if m.group(1) == "{" else (", " if m.group(3) else ""),
            line,
            count=1,
        )
        if dropped != line:
            lines[k] = dropped
            return "\n".join(lines), k + 1
    raise AssertionError(f"no {kind} op of the base has {attr}")


@pytest.mark.parametrize("kind,attr", REQUIRED, ids=lambda v: str(v))
def test_a_missing_required_attribute_is_refused_naming_op_line_and_field(kind: str, attr: str) -> None:
    text, line = _drop(TEXT, kind, attr)
    errors = _declared_errors(text)
    name = attr.removeprefix("entry.")
    assert len(errors) == 1, [str(e) for e in errors]
    err = errors[0]
    assert err.line == line and err.source == "m.tir"
    assert f"plan {kind} '@" in err.message and f"has no '{name}'" in err.message
    # The op's accessor refuses it with the same text, position included.
    module = parse_module(text, source="m.tir")
    op = next(
        o for o in module.plan
        if module.locations[f"plan:{o.name}"][0] == line
        or any(module.locations[f"entry:{o.name}:{e.ref}"][0] == line for e in o.entries)
    )
    with pytest.raises(PlanOpError) as info:
        ACCESSORS[kind].read(module, op, entries=True)
    assert str(info.value) == str(err)
    copy = pickle.loads(pickle.dumps(info.value))  # as a worker process would send it
    assert str(copy) == str(err) and (copy.check, copy.line) == ("plan-ops-declared", line)


def test_wrong_types_and_references_are_refused() -> None:
    cases = [
        ("stage = 0}", 'stage = "zero"}', "plan candidate '@cand.s0.c0' has stage = \"zero\"; it must be an integer >= 0"),
        ("schedule = @sched.0}", "schedule = @cand.s0.c0}",
         "plan pair '@pair.0' has 'schedule' naming '@cand.s0.c0', which is a candidate; it must name a pair_schedule"),
        ("pairs = [@pair.0]", "pairs = []", "plan pair_schedule '@sched.0' has pairs = []; it must be a non-empty list"),
        ('stream = "compute"', 'stream = "gpu"', "entry '@l0.router.fwd' of plan pair_schedule '@sched.0' has stream = \"gpu\""),
        ("stages = [@cand.s0.c0]", "stages = [@l0]", "which is a layer; it must name a candidate"),
        ("@program.r0 {rank = 0}", "@program.r0 {rank = -1}", "plan program '@program.r0' has rank = -1"),
        ("{bwd_candidate = @cand.s0.c0, device = 0, fwd_candidate = @cand.s0.c0, ", "{",
         "plan pair '@pair.0' names no layers"),
    ]
    for old, new, message in cases:
        assert old in TEXT, old
        errors = _declared_errors(TEXT.replace(old, new, 1))
        assert any(message in e.message for e in errors), (message, [e.message for e in errors])


def test_undeclared_kinds_and_extra_attributes_are_kept_unchecked() -> None:
    text = TEXT.replace("plan partition @partition {", "plan partition @partition {note = [1, \"x\"], ")
    text = text.replace("  plan pipeline", "  plan notes @n {anything = @l0} {\n    @l0 {x = 1}\n  }\n  plan pipeline")
    assert _declared_errors(text) == []


def test_program_header_problems_are_the_declarations() -> None:
    module = parse_module(TEXT.replace("{rank = 0}", "{}"))
    programs, problems = read_programs(module)
    assert programs == [] and problems[0].message.startswith("has no 'rank'")


def test_docs_ir_holds_the_generated_op_tables() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "ir.md").read_text()
    assert with_reference(doc) == doc, "docs/ir.md's plan op tables are stale: run `make plan-op-tables`"
    for kind, definition in OP_DEFS.items():
        table = op_reference(definition)
        assert table in doc, kind
        for f in (*definition.attrs, *definition.entry_attrs):
            assert f"| `{f.name}` | {f.type.spelled} |" in table, (kind, f.name)


def test_a_stale_table_is_regenerated() -> None:
    doc = (Path(__file__).parents[2] / "docs" / "ir.md").read_text()
    stale = doc.replace("| `layers` | list of layer references | yes |", "| `layers` | list | |", 1)
    assert stale != doc and with_reference(stale) == doc
