"""Codegen: a planned module's per-rank programs as plan bytecode (``.tsb``).

The runtime owns the format (``runtime/bytecode.py``, ``docs/bytecode.md``); this module only
fills a ``PlanImage`` from the IR the ``pipeline`` pass wrote (``tessera_ir.programs``) and
calls ``encode``:

- the task table is every task of the model in IR order, with the isolated duration and the
  deferral bytes the ``pipeline`` op gives;
- the slot table holds each distinct DBO slot (All-to-All task and figures) once, in the
  order the programs first use them; the plan has the DBO flag when there is a slot;
- one program per pipeline rank, instruction for instruction: ``run`` → RUN, ``defer`` →
  DEFER, ``all_to_all`` → COLLECTIVE over EP, ``grad_reduce`` → COLLECTIVE over DP, ``send``
  / ``recv`` → SEND / RECV (operand b: the stage that produced the tensor), ``wait`` → WAIT,
  ``slot`` → SLOT, ``end`` → END;
- the header carries ``plan_signature(module)`` (``codegen.signature``).

The same module gives the same bytes.
"""

from __future__ import annotations

from codegen.signature import cost_source, plan_signature
from runtime.bytecode import (
    Collective,
    Group,
    Instr,
    Op,
    Payload,
    PlanImage,
    PlanInfo,
    SlotInfo,
    Stream,
    TaskInfo,
    encode,
)
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Resource
from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig
from tessera_ir.programs import (
    ACTIVATION,
    ALL_TO_ALL,
    DEFER,
    END,
    GRAD_REDUCE,
    RECV,
    RUN,
    SEND,
    SLOT,
    WAIT,
    Instruction,
    pipeline_op,
    read_programs,
    stage_of_candidates,
)


class CodegenError(TesseraError):
    """A module that cannot be written as bytecode (no programs, programs the format cannot hold)."""


def _stream(name: str) -> Stream:
    return Stream.COMM if name == "comm" else Stream.COMPUTE


def plan_image(module: Module) -> PlanImage:
    """The bytecode image of ``module``'s per-rank programs."""
    pipeline = pipeline_op(module)
    programs, problems = read_programs(module)
    if pipeline is None or not programs:
        raise CodegenError(
            f"module @{module.name} holds no per-rank programs; run the pipeline pass (tessera-compile runs it "
            "by default; with --passes, end the pipeline with 'pipeline')"
        )
    if problems:
        problem = problems[0]
        raise CodegenError(f"program @{problem.op.name}: {problem.message}; the verifier's program checks say more")
    shared = [p for p in programs if p.ep_rank is not None]
    if shared:
        raise CodegenError(
            f"program @{shared[0].name} is for one EP rank; the bytecode holds one program per pipeline rank, shared by "
            "its EP ranks"
        )
    figures = {e.ref: e.attrs for e in pipeline.entries}
    tasks: list[TaskInfo] = []
    index: dict[str, int] = {}
    for layer in module.layers:
        for t in layer.tasks:
            attrs = figures.get(t.name, {})
            duration, memory = attrs.get("duration_us", 0.0), attrs.get("memory_bytes", 0)
            if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not isinstance(memory, int):
                raise CodegenError(f"pipeline @{pipeline.name} gives @{t.name} duration_us = {duration!r}, "
                                   f"memory_bytes = {memory!r}; rerun the pipeline pass")
            index[t.name] = len(tasks)
            stream = Stream.COMM if t.resource is Resource.COMM else Stream.COMPUTE
            tasks.append(TaskInfo(t.name, t.kind, layer.name, stream, t.movable, float(duration), memory))
    stage_of = stage_of_candidates(module)
    slots: list[SlotInfo] = []
    slot_index: dict[tuple[int, float, float, float], int] = {}

    def lower(instr: Instruction) -> Instr:
        op = instr.op
        if op == RUN:
            return Instr(Op.RUN, Stream.COMPUTE, 0, instr.mb, index[instr.ref])
        if op == DEFER:
            return Instr(Op.DEFER, Stream.COMPUTE, 0, instr.mb, index[instr.ref], instr.deadline)
        if op == ALL_TO_ALL:
            return Instr(Op.COLLECTIVE, Stream.COMM, Collective.ALL_TO_ALL, instr.mb, index[instr.ref], Group.EP)
        if op == GRAD_REDUCE:
            return Instr(Op.COLLECTIVE, Stream.COMM, Collective.GRAD_REDUCE, 0, stage_of[instr.ref], Group.DP)
        if op in (SEND, RECV):
            payload = Payload.ACTIVATION if instr.payload == ACTIVATION else Payload.GRADIENT
            return Instr(Op.SEND if op == SEND else Op.RECV, Stream.COMM, payload, instr.mb, instr.peer, stage_of[instr.ref])
        if op == WAIT:
            return Instr(Op.WAIT, _stream(instr.wait_stream), a=instr.on)
        if op == SLOT:
            key = (index[instr.ref], instr.base_us, instr.a2a_us, instr.gemm_us)
            if key not in slot_index:
                slot_index[key] = len(slots)
                slots.append(SlotInfo(*key))
            return Instr(Op.SLOT, Stream.COMPUTE, 0, instr.mb, slot_index[key], instr.on)
        assert op == END
        return Instr(Op.END)

    code = {}
    try:
        for program in sorted(programs, key=lambda p: p.rank):
            code[program.rank] = [lower(i) for i in program.instructions]
    except KeyError as err:
        raise CodegenError(f"a program names {err}, which is no task or candidate of the module; run the verifier") from None
    p = ParallelConfig.from_attrs(module.attrs)
    mode, hardware = cost_source(module)
    budget = pipeline.attrs.get("memory_budget_bytes", 0)
    info = PlanInfo(
        p.pp, p.vpp, p.ep, p.tp, p.microbatches, p.micro_batch_size, p.seq_len, p.dtype,
        str(module.attrs.get("model", module.name)), mode, hardware, budget if isinstance(budget, int) else 0,
    )
    return PlanImage(plan_signature(module), info, tasks, slots if slots else None, code)


def plan_bytes(module: Module) -> bytes:
    """``module``'s plan as ``.tsb`` bytes."""
    return encode(plan_image(module))
