"""Per-rank programs in the IR: what the ``pipeline`` pass writes and codegen turns into bytecode.

Two plan ops hold them (``docs/ir.md``, "Per-rank programs")::

    plan pipeline @pipeline {combined = false, memory_budget_bytes = 0, order = "interleaved-1f1b",
                             programs = [@program.r0, @program.r1]} {
      @l0.attention.fwd {duration_us = 812.4}
      @l0.attention.wgrad {duration_us = 401.2, memory_bytes = 4194304}
      ...
    }
    plan program @program.r0 {rank = 0} {
      @l0.attention.fwd {mb = 0, op = "run"}
      @l0.router.fwd {mb = 0, op = "run"}
      @l0.router.fwd {on = 1, op = "wait", stream = "comm"}
      @l0.dispatch.fwd {mb = 0, op = "all_to_all"}
      ...
      @program.r0 {op = "end"}
    }

A program's entries are its instructions in issue order; an instruction's index is its
position. Each names the entity it is about (a task, the candidate op standing for a virtual
stage, or the program itself) and its operands:

| op | ref | operands | stream |
|---|---|---|---|
| ``run`` | a compute task | ``mb`` | compute |
| ``defer`` | a movable task | ``mb``, ``deadline`` (instruction index: it has run before that instruction) | compute |
| ``all_to_all`` | a comm task (dispatch, combine) | ``mb`` | comm, over the EP group |
| ``grad_reduce`` | a candidate: the virtual stage whose gradients are reduced | none | comm, over the DP group |
| ``send`` | a candidate: the stage that produced the tensor (on this rank) | ``mb``, ``peer``, ``payload`` | comm |
| ``recv`` | a candidate: the stage that produced the tensor (on ``peer``) | ``mb``, ``peer``, ``payload`` | comm |
| ``wait`` | what instruction ``on`` is about | ``on`` (an earlier instruction that completes), ``stream`` | either |
| ``slot`` | the All-to-All task waited for | ``mb``, ``on`` (its ``all_to_all``), ``base_us``, ``a2a_us``, ``gemm_us`` | compute |
| ``end`` | the program op itself | none | compute |

``payload`` is ``activation`` (forward, to the next stage) or ``gradient`` (backward, to the
previous stage). Virtual stage ``s`` lives on pipeline rank ``s mod pp``.

How programs execute (the runtime's FSM, docs/bytecode.md, and the verifier's simulation,
``tessera_ir.program_checks``, agree on it): instructions are issued in order; a ``wait``
holds everything after it until its target has finished; the compute stream runs its work in
issue order, and so do the collectives of the comm stream (``all_to_all``, ``grad_reduce``);
a ``send`` or ``recv`` is posted when issued and finishes once its match is posted, matched
per pair of ranks in the order each side issues them (no tags); ``defer`` offers a weight
gradient that runs at the latest just before its deadline; ``end`` waits for all issued work.

This module is the vocabulary both sides share: reading entries into typed instructions
(with a message naming what is wrong) and writing them back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

from tessera_ir.model import Attrs, Module, PlanEntry, PlanOp
from tessera_ir.plan_ops import CANDIDATE, PIPELINE, PROGRAM, CandidateOp, ProgramOp, op_problems

PIPELINE_OP = PIPELINE.kind
PROGRAM_OP = PROGRAM.kind

RUN, DEFER, ALL_TO_ALL, GRAD_REDUCE, SEND, RECV, WAIT, SLOT, END = (
    "run", "defer", "all_to_all", "grad_reduce", "send", "recv", "wait", "slot", "end",
)
OPS = (RUN, DEFER, ALL_TO_ALL, GRAD_REDUCE, SEND, RECV, WAIT, SLOT, END)
COMPUTE, COMM = "compute", "comm"
STREAMS = (COMPUTE, COMM)
ACTIVATION, GRADIENT = "activation", "gradient"
PAYLOADS = (ACTIVATION, GRADIENT)

# The stream every op but ``wait`` (which names the stream that waits) runs on.
OP_STREAM = {RUN: COMPUTE, DEFER: COMPUTE, SLOT: COMPUTE, END: COMPUTE,
             ALL_TO_ALL: COMM, GRAD_REDUCE: COMM, SEND: COMM, RECV: COMM}
# Instructions that do work which finishes, and so can be waited on.
COMPLETING = frozenset({RUN, DEFER, ALL_TO_ALL, GRAD_REDUCE, SEND, RECV})
COLLECTIVES = frozenset({ALL_TO_ALL, GRAD_REDUCE})
P2P = frozenset({SEND, RECV})

# Operands each op takes (besides ``op``); an entry with others is refused, so typos surface.
_OPERANDS: dict[str, tuple[str, ...]] = {
    RUN: ("mb",),
    DEFER: ("mb", "deadline"),
    ALL_TO_ALL: ("mb",),
    GRAD_REDUCE: (),
    SEND: ("mb", "peer", "payload"),
    RECV: ("mb", "peer", "payload"),
    WAIT: ("on", "stream"),
    SLOT: ("mb", "on", "base_us", "a2a_us", "gemm_us"),
    END: (),
}
_INT_OPERANDS = frozenset({"mb", "peer", "on", "deadline"})
_TIME_OPERANDS = frozenset({"base_us", "a2a_us", "gemm_us"})


class ProgramFormatError(ValueError):
    """An entry that is not an instruction (unknown op, missing or ill-typed operand)."""


class Instruction(NamedTuple):
    """One instruction of a program; operands that do not apply to ``op`` keep their defaults.

    A named tuple: programs hold many thousands, and a tuple is the cheapest to build."""

    op: str
    ref: str
    mb: int = 0
    peer: int = -1
    payload: str = ""
    on: int = -1  # wait, slot: the instruction waited for
    deadline: int = -1  # defer
    wait_stream: str = ""  # wait: the stream that waits
    base_us: float = 0.0  # slot: the idle the static plan predicts, and the routed work it depends on
    a2a_us: float = 0.0
    gemm_us: float = 0.0

    @property
    def stream(self) -> str:
        return self.wait_stream if self.op == WAIT else OP_STREAM[self.op]

    def entry(self) -> PlanEntry:
        """The plan entry that prints this instruction (spelled out per op: programs are long)."""
        op = self.op
        attrs: Attrs
        if op == RUN or op == ALL_TO_ALL:
            attrs = {"op": op, "mb": self.mb}
        elif op == WAIT:
            attrs = {"op": op, "on": self.on, "stream": self.wait_stream}
        elif op == DEFER:
            attrs = {"op": op, "mb": self.mb, "deadline": self.deadline}
        elif op == SEND or op == RECV:
            attrs = {"op": op, "mb": self.mb, "peer": self.peer, "payload": self.payload}
        elif op == SLOT:
            attrs = {"op": op, "mb": self.mb, "on": self.on, "base_us": self.base_us, "a2a_us": self.a2a_us,
                     "gemm_us": self.gemm_us}
        else:
            attrs = {"op": op}
        return PlanEntry(self.ref, attrs)

    @classmethod
    def from_entry(cls, entry: PlanEntry) -> Instruction:
        """The instruction an entry spells; ProgramFormatError says what is wrong with it."""
        # Spelled out per op: programs hold many thousands of entries, and this is their reader.
        a, ref = entry.attrs, entry.ref
        op, n = a.get("op"), len(a)
        try:
            if op == RUN or op == ALL_TO_ALL:
                mb = a["mb"]
                if n == 2 and type(mb) is int and mb >= 0:
                    return cls(op, ref, mb)
            elif op == WAIT:
                on, stream = a["on"], a["stream"]
                if n == 3 and type(on) is int and on >= 0 and stream in STREAMS:
                    return cls(WAIT, ref, on=on, wait_stream=stream)  # type: ignore[arg-type]
            elif op == DEFER:
                mb, deadline = a["mb"], a["deadline"]
                if n == 3 and type(mb) is int and mb >= 0 and type(deadline) is int and deadline >= 0:
                    return cls(DEFER, ref, mb, deadline=deadline)
            elif op == SEND or op == RECV:
                mb, peer, payload = a["mb"], a["peer"], a["payload"]
                if n == 4 and type(mb) is int and mb >= 0 and type(peer) is int and peer >= 0 and payload in PAYLOADS:
                    return cls(op, ref, mb, peer=peer, payload=payload)  # type: ignore[arg-type]
            elif op == SLOT:
                mb, on = a["mb"], a["on"]
                times = [a["base_us"], a["a2a_us"], a["gemm_us"]]
                if n == 6 and type(mb) is int and mb >= 0 and type(on) is int and on >= 0 and all(_is_time(t) for t in times):
                    base_us, a2a_us, gemm_us = (float(t) for t in times)  # type: ignore[arg-type]
                    return cls(SLOT, ref, mb, on=on, base_us=base_us, a2a_us=a2a_us, gemm_us=gemm_us)
            elif op == GRAD_REDUCE or op == END:
                if n == 1:
                    return cls(op, ref)
        except KeyError:
            pass
        raise ProgramFormatError(_format_problem(a))


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_time(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


_LEGAL: dict[str, Callable[[object], bool]] = {
    **dict.fromkeys(_INT_OPERANDS, _is_count),
    **dict.fromkeys(_TIME_OPERANDS, _is_time),
    "payload": lambda v: v in PAYLOADS,
    "stream": lambda v: v in STREAMS,
}
_RULES = {"payload": f"one of {', '.join(PAYLOADS)}", "stream": f"one of {', '.join(STREAMS)}",
          **dict.fromkeys(_INT_OPERANDS, "an integer >= 0"), **dict.fromkeys(_TIME_OPERANDS, "a number of µs >= 0")}


def _format_problem(attrs: Attrs) -> str:
    """What is wrong with an entry that is not an instruction."""
    op = attrs.get("op")
    if not isinstance(op, str) or op not in _OPERANDS:
        return f"op = {op!r} is not an instruction; use one of {', '.join(OPS)}"
    expected = _OPERANDS[op]
    an = f"{'an' if op[0] in 'aeiou' else 'a'} {op}"
    extra = sorted(set(attrs) - set(expected) - {"op"})
    if extra:
        return f"{an} takes {', '.join(expected) or 'no operands'}, not {', '.join(extra)}"
    for name in expected:
        if name not in attrs:
            return f"{an} needs '{name}'"
        if not _LEGAL[name](attrs[name]):
            return f"'{name}' of {an} is {attrs[name]!r}; it must be {_RULES[name]}"
    raise AssertionError("an entry the fast path refused is legal")


@dataclass
class Program:
    """A ``program`` op read into instructions. ``ep_rank`` None: shared by every EP rank of ``rank``."""

    op: PlanOp
    rank: int
    ep_rank: int | None
    instructions: list[Instruction] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def where(self) -> str:
        """How messages name the rank this program runs on."""
        return f"rank {self.rank}" if self.ep_rank is None else f"rank {self.rank} (EP rank {self.ep_rank})"


@dataclass(frozen=True)
class ProgramProblem:
    """Why a ``program`` op could not be read: the op, the instruction index (None: the op's header)."""

    op: PlanOp
    index: int | None
    message: str


def read_programs(module: Module) -> tuple[list[Program], list[ProgramProblem]]:
    """Every ``program`` op of ``module`` read into instructions, and what could not be read."""
    programs: list[Program] = []
    problems: list[ProgramProblem] = []
    for op in module.plan:
        if op.op != PROGRAM_OP:
            continue
        # The header through the program op's declaration; the instructions through Instruction.from_entry.
        header = op_problems(op, entries=False)
        if header:
            problems.append(ProgramProblem(op, None, header[0].detail))
            continue
        declared = ProgramOp(op)
        program = Program(op, declared.rank, declared.ep_rank)
        try:
            for k, entry in enumerate(op.entries):
                try:
                    program.instructions.append(Instruction.from_entry(entry))
                except ProgramFormatError as err:
                    problems.append(ProgramProblem(op, k, f"'@{entry.ref}': {err}"))
                    raise
        except ProgramFormatError:
            continue
        programs.append(program)
    return programs, problems


def pipeline_op(module: Module) -> PlanOp | None:
    return next((op for op in module.plan if op.op == PIPELINE_OP), None)


def program_op(rank: int, instructions: list[Instruction], ep_rank: int | None = None) -> PlanOp:
    """The ``program`` op of ``rank`` holding ``instructions``."""
    attrs: Attrs = {"rank": rank}
    name = f"program.r{rank}"
    if ep_rank is not None:
        attrs["ep_rank"] = ep_rank
        name += f".e{ep_rank}"
    return PlanOp(PROGRAM_OP, name, attrs, [i.entry() for i in instructions])


def stage_of_candidates(module: Module) -> dict[str, int]:
    """The virtual stage of every ``candidate`` op (the refs of send, recv and grad_reduce)."""
    out: dict[str, int] = {}
    for op in module.plan:
        if op.op == CANDIDATE.kind and not op_problems(op, entries=False):
            out.setdefault(op.name, CandidateOp(op).stage)
    return out


def describe(instr: Instruction, stage_of: dict[str, int], index: int | None = None) -> str:
    """An instruction in words, for messages: ``instruction 12 (recv of the activation of stage 1,
    micro-batch 3, from rank 0)``."""
    if instr.op in P2P:
        stage = stage_of.get(instr.ref, "?")
        direction = "to" if instr.op == SEND else "from"
        text = f"{instr.op} of the {instr.payload} of stage {stage}, micro-batch {instr.mb}, {direction} rank {instr.peer}"
    elif instr.op == GRAD_REDUCE:
        text = f"grad_reduce of stage {stage_of.get(instr.ref, '?')}"
    elif instr.op == WAIT:
        text = f"wait on instruction {instr.on} (@{instr.ref}) on the {instr.wait_stream} stream"
    elif instr.op == END:
        text = "end"
    else:
        text = f"{instr.op} @{instr.ref} micro-batch {instr.mb}"
    return text if index is None else f"instruction {index} ({text})"


def iter_instructions(programs: list[Program]) -> Iterator[tuple[Program, int, Instruction]]:
    for program in programs:
        for k, instr in enumerate(program.instructions):
            yield program, k, instr
