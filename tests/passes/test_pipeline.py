"""The pipeline pass: per-rank programs that verify, run on the runtime's interpreters, and print back."""

from __future__ import annotations

import copy
import random

import pytest

from codegen.emit import CodegenError, plan_bytes, plan_image
from passes.manager import PassError, PassManager, parse_pipeline
from passes.pipelining.lowering import rank_steps
from passes.pipelining.order import rank_order
from runtime.bytecode import decode
from tessera_ir import parse_module, print_module
from tessera_ir.errors import VerifyError
from tessera_ir.model import Module, PlanEntry
from tessera_ir.parallel import ParallelConfig
from tessera_ir.programs import PROGRAM_OP, Instruction, read_programs
from tessera_ir.verifier import collect_errors, verify

from cluster_run import run_cluster
from compiled_plans import PLANNING, planned_module
from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


def planned(pp: int, vpp: int, microbatches: int, groups: int = 1, ep: int = 2, combined: bool = False) -> Module:
    return planned_module(pp, vpp, microbatches, groups, ep, combined)


CONFIGS = [  # (pp, vpp, microbatches, groups of four layers, combined)
    (1, 1, 2, 1, False),
    (2, 1, 3, 1, False),
    (2, 1, 4, 1, True),
    (2, 2, 4, 2, False),
    (2, 2, 4, 2, True),
    (4, 1, 5, 1, False),
    (3, 2, 6, 2, False),
]


@pytest.fixture(scope="module", params=CONFIGS, ids=lambda c: "pp{}-vpp{}-m{}-g{}{}".format(*c[:4], "-combined" if c[4] else ""))
def module(request: pytest.FixtureRequest) -> Module:
    pp, vpp, m, groups, combined = request.param
    return planned(pp, vpp, m, groups, combined=combined)


def test_programs_pass_every_check_and_follow_the_rank_order(module: Module) -> None:
    assert collect_errors(module) == []
    programs, problems = read_programs(module)
    assert problems == []
    p = ParallelConfig.from_attrs(module.attrs)
    assert sorted(prog.rank for prog in programs) == list(range(p.pp))
    combined = module.plan_ops("pipeline")[0].attrs["combined"] is True
    stage_of = {}
    candidates = {op.name: op for op in module.plan_ops("candidate")}
    for s, ref in enumerate(module.plan_ops("partition")[0].attrs["stages"]):  # type: ignore[arg-type]
        for layer in candidates[ref.name].attrs["layers"]:  # type: ignore[union-attr]
            stage_of[layer.name] = s  # type: ignore[union-attr]
    layer_of = module.layer_of_task()
    for prog in programs:
        # Forwards and backwards start in the rank's interleaved-1F1B order, each exactly once.
        order = [(a.direction, a.stage(prog.rank, p.pp), a.microbatch)
                 for a in rank_order(p.pp, p.vpp, p.microbatches, prog.rank, combined)]
        started = []
        for instr in prog.instructions:
            if instr.op in ("run", "defer", "all_to_all"):
                task = module.task_map()[instr.ref]
                key = ("fwd" if task.phase.value == "fwd" else "bwd", stage_of[layer_of[instr.ref].name], instr.mb)
                if key not in started:
                    started.append(key)
        for direction in ("fwd", "bwd"):
            assert [k for k in started if k[0] == direction] == [k for k in order if k[0] == direction]
        steps = rank_steps(p.pp, p.vpp, p.microbatches, prog.rank, combined)
        assert sum((st.fwd is not None) + (st.bwd is not None) for st in steps) == len(order)


@pytest.mark.parametrize("interpreter", ["cpp", "reference"])
def test_every_rank_runs_its_program_to_the_end_with_dependencies_met(module: Module, interpreter: str) -> None:
    data = plan_bytes(module)
    for seed in range(3):
        counters = run_cluster(data, module, seed, interpreter=interpreter)
        assert sum(c["tasks_run"] for c in counters) > 0


def test_text_round_trips_and_output_is_deterministic(module: Module) -> None:
    text = print_module(module)
    assert print_module(parse_module(text)) == text
    p = ParallelConfig.from_attrs(module.attrs)  # the pipeline order (combined) with the rest of the header
    groups = len(module.decoder_layers()) // len(QWEN3_NEXT_PATTERN)
    again = synthetic_module(QWEN3_NEXT_PATTERN * groups, gemm_flops=10**10, mixer_flops=10**10, a2a_bytes=10**6,
                             param_bytes=10**6, parallel=p)
    PassManager(parse_pipeline(PLANNING + ",pipeline")).run(again)
    assert print_module(again) == text
    assert plan_bytes(again) == plan_bytes(module)


def test_bytecode_holds_the_programs_instruction_for_instruction(module: Module) -> None:
    image = decode(plan_bytes(module))
    programs, _ = read_programs(module)
    assert image.plan.pp == len(programs)
    tasks = [t.name for t in image.tasks]
    assert tasks == [t.name for t in module.tasks()]
    for prog in programs:
        code = image.programs[prog.rank]
        assert len(code) == len(prog.instructions)
        for instr, ins in zip(prog.instructions, code):
            if instr.op in ("run", "defer", "all_to_all"):
                assert tasks[ins.a] == instr.ref and ins.mb == instr.mb
            if instr.op == "wait":
                assert ins.a == instr.on
            if instr.op == "defer":
                assert ins.b == instr.deadline


def test_a_verified_program_runs_correctly_after_random_reorderings() -> None:
    """Soundness of the checks against the runtime: move one instruction of a verified plan; when the
    checks still accept the result, every rank runs it to the end with every dependency met."""
    base = planned(2, 2, 4, 1)
    rng = random.Random(7)
    accepted = refused = 0
    for _ in range(30):
        module = copy.deepcopy(base)
        op = rng.choice(module.plan_ops(PROGRAM_OP))
        entries = op.entries
        k = rng.randrange(len(entries) - 2)
        j = min(len(entries) - 2, k + rng.randint(1, 6))
        moved = entries.pop(k)
        entries.insert(j, moved)
        _renumber(entries, k, j)
        if collect_errors(module):
            refused += 1
            continue
        accepted += 1
        run_cluster(plan_bytes(module), module, rng.randrange(1000))
    assert refused > 0 and accepted > 0


def _renumber(entries: list[PlanEntry], k: int, j: int) -> None:
    """Keep wait/slot targets and deadlines on the same instructions after moving entry k to j."""
    def moved(i: int) -> int:
        if i == k:
            return j
        return i - 1 if k < i <= j else i

    for e in entries:
        for key in ("on", "deadline"):
            value = e.attrs.get(key)
            if isinstance(value, int):
                e.attrs[key] = moved(value)


def test_pass_refuses_modules_without_partition_and_a_second_run() -> None:
    module = planned(2, 1, 2)
    with pytest.raises(PassError, match="already holds per-rank programs"):
        PassManager(parse_pipeline("pipeline")).run(module)
    bare = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(pp=2, microbatches=2))
    with pytest.raises(PassError, match="no partition"):
        PassManager(parse_pipeline("pipeline")).run(bare)


def test_codegen_refuses_modules_without_programs_and_per_ep_programs() -> None:
    bare = synthetic_module(QWEN3_NEXT_PATTERN, parallel=ParallelConfig(pp=2, microbatches=2))
    with pytest.raises(CodegenError, match="no per-rank programs"):
        plan_image(bare)
    module = planned(2, 1, 2)
    op = module.plan_ops(PROGRAM_OP)[0]
    op.attrs["ep_rank"] = 0
    with pytest.raises(CodegenError, match="one EP rank"):
        plan_image(module)


def test_an_unmatched_transfer_is_a_verifier_error_naming_both_ranks() -> None:
    module = planned(2, 1, 2)
    op = module.plan_ops(PROGRAM_OP)[0]
    sends = [k for k, e in enumerate(op.entries) if e.attrs["op"] == "send"]
    extra = Instruction.from_entry(op.entries[sends[0]])
    op.entries.insert(len(op.entries) - 1, extra.entry())
    with pytest.raises(VerifyError, match=r"rank 0 issues 3 send\(s\) to rank 1, which issues 2 receive\(s\)"):
        verify(module)


def test_dbo_slots_become_slot_instructions_before_the_waits_they_predict() -> None:
    module = planned_module(2, 2, 4, groups=2, dbo=True)
    assert collect_errors(module) == []
    pipeline = module.plan_ops("pipeline")[0]
    budgets = [op.attrs["memory_budget_bytes"] for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "recv_wait"]
    assert budgets and all(isinstance(b, int) and b > 0 for b in budgets)
    assert pipeline.attrs["dbo"] is True
    assert pipeline.attrs["memory_budget_bytes"] == min(b for b in budgets if isinstance(b, int))
    figures = {
        (e.attrs["waits_on"].name, e.attrs["base_us"], e.attrs["a2a_us"], e.attrs["gemm_us"])  # type: ignore[union-attr]
        for op in module.plan_ops("dbo_slot") if op.attrs["kind"] == "a2a_wait" for e in op.entries
    }
    programs, problems = read_programs(module)
    assert problems == []
    for prog in programs:
        code = prog.instructions
        slots = [k for k, ins in enumerate(code) if ins.op == "slot"]
        assert slots, f"rank {prog.rank} has no DBO slot"
        for k in slots:
            slot, waited = code[k], code[code[k].on]
            # the slot names the All-to-All its wait is for, and the wait follows at once on compute
            assert (waited.op, waited.ref, waited.mb) == ("all_to_all", slot.ref, slot.mb)
            assert (code[k + 1].op, code[k + 1].on, code[k + 1].stream) == ("wait", slot.on, "compute")
            assert (slot.ref, slot.base_us, slot.a2a_us, slot.gemm_us) in figures
    plain = planned_module(2, 2, 4, groups=2)
    assert not any(ins.op == "slot" for prog in read_programs(plain)[0] for ins in prog.instructions)
