"""Verifier checks of per-rank programs (``plan program`` ops, ``tessera_ir.programs``).

A plan that fails one of these would hang or compute the wrong thing on the cluster, so the
compiler refuses it, naming the ranks and instructions involved:

- ``program-instructions-legal``: each instruction names the right kind of entity and legal
  operands: tasks on their stream, stages on the ranks that hold them, peers that hold the
  neighbouring stage, micro-batches in range, waits on earlier work, deadlines ahead, one
  program per rank;
- ``program-sends-match``: between every two ranks, the k-th send one issues to the other is
  the k-th receive the other issues from it, for the same tensor (payload, stage, micro-batch);
- ``program-collectives-ordered``: the ranks of an EP group (programs of one pipeline rank)
  issue the same collectives in the same order;
- ``program-deadlock-free``: all ranks' programs, simulated together to completion under the
  execution model of ``tessera_ir.programs``, finish; otherwise the ranks still blocked and what
  each waits for are named;
- ``program-dependencies-respected``: every task runs once per micro-batch, on one rank, and
  only after the tasks it depends on finished there (stream order or a wait) or, for a task on
  another rank, after a receive whose matching send waited for it; a stage's gradients are
  reduced after its weight gradients ran.

Checks of malformed programs stop at ``program-instructions-legal``: the others only look at
modules whose programs all read and are legal, so one mistake is reported once.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from tessera_ir.errors import VerifyError
from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Module, PlanOp, SymbolRef, Task
from tessera_ir.programs import (
    ACTIVATION,
    ALL_TO_ALL,
    COLLECTIVES,
    COMPLETING,
    COMPUTE,
    DEFER,
    END,
    GRAD_REDUCE,
    GRADIENT,
    P2P,
    PROGRAM_OP,
    RECV,
    RUN,
    SEND,
    SLOT,
    WAIT,
    Instruction,
    Program,
    describe,
    read_programs,
    stage_of_candidates,
)
from tessera_ir.verifier import _Reporter, check, shared_in_run

Instance = tuple[int, int]  # (pipeline rank, EP coordinate) a simulated program stands for
T = TypeVar("T")


def _setting(module: Module, key: str) -> int:
    value = module.attrs.get(key, 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


@dataclass
class _Plan:
    """The module's programs with what the checks share: stages, settings, matched transfers."""

    module: Module
    programs: list[Program]
    pp: int
    vpp: int
    ep: int
    microbatches: int
    stage_of: dict[str, int]
    tasks: dict[str, Task]
    instances: dict[Instance, Program] = field(default_factory=dict)

    def __post_init__(self) -> None:
        per_ep = sorted({p.ep_rank for p in self.programs if p.ep_rank is not None})
        coords = per_ep or [0]
        by_key = {(p.rank, p.ep_rank): p for p in self.programs}
        for rank in sorted({p.rank for p in self.programs}):
            for e in coords:
                program = by_key.get((rank, e), by_key.get((rank, None)))
                if program is not None:
                    self.instances[(rank, e)] = program

    def name(self, inst: Instance) -> str:
        """How messages name a simulated rank: with its EP rank only where EP ranks have their own programs."""
        per_ep = any(p.ep_rank is not None for p in self.programs)
        return f"rank {inst[0]} (EP rank {inst[1]})" if per_ep else f"rank {inst[0]}"


def _read(module: Module) -> tuple[list[Program], list[tuple[PlanOp, str]]]:
    """Programs, and the problems that make them unreadable or illegal (op, message); read once
    per verifier run, which every check of the programs shares."""

    def read() -> tuple[list[Program], list[tuple[PlanOp, str]]]:
        programs, problems = read_programs(module)
        out = [(p.op, (f"instruction {p.index}: " if p.index is not None else "") + p.message) for p in problems]
        return programs, out

    return shared_in_run(("programs", id(module)), read)


def _plan_of(module: Module, programs: list[Program]) -> _Plan:
    return _Plan(module, programs, _setting(module, "pp"), _setting(module, "vpp"), _setting(module, "ep"),
                 _setting(module, "microbatches"), stage_of_candidates(module), module.task_map())


def _checked_plan(module: Module) -> tuple[_Plan, list[tuple[PlanOp, str]]] | None:
    """The plan of readable programs and its illegal instructions (op, message), or None when
    some program does not read; built once per verifier run (the checks only read it)."""

    def build() -> tuple[_Plan, list[tuple[PlanOp, str]]] | None:
        programs, problems = _read(module)
        if problems:
            return None
        plan = _plan_of(module, programs)
        return plan, list(_illegal(plan))

    return shared_in_run(("checked plan", id(module)), build)


def _legal_plan(module: Module) -> _Plan | None:
    """The plan when every program reads and is legal, else None (the first check reports why)."""
    if not any(op.op == PROGRAM_OP for op in module.plan):
        return None
    checked = _checked_plan(module)
    return checked[0] if checked is not None and not checked[1] else None


# ---------------------------------------------------------------- program-instructions-legal


@check("program-instructions-legal", "program instructions name the right entities, legal operands and earlier targets")
def _instructions_legal(module: Module) -> Iterator[VerifyError]:
    if not any(op.op == PROGRAM_OP for op in module.plan):
        return
    r = _Reporter("program-instructions-legal", module)
    programs, problems = _read(module)
    for op, message in problems:
        yield r.plan(op, message)
    if problems:
        return
    checked = _checked_plan(module)
    assert checked is not None  # the programs read
    for op, message in checked[1]:
        yield r.plan(op, message)


def _illegal(plan: _Plan) -> Iterator[tuple[PlanOp, str]]:
    seen: dict[tuple[int, int | None], str] = {}
    for program in plan.programs:
        op = program.op
        key = (program.rank, program.ep_rank)
        if program.rank >= plan.pp:
            yield op, f"runs on rank {program.rank}, but the module has pipeline ranks 0..{plan.pp - 1} (pp = {plan.pp})"
            continue
        if program.ep_rank is not None and program.ep_rank >= plan.ep:
            yield op, f"is for EP rank {program.ep_rank}, but the module has EP ranks 0..{plan.ep - 1} (ep = {plan.ep})"
            continue
        if key in seen:
            yield op, f"is a second program for {program.where} (the first is @{seen[key]})"
        seen[key] = op.name
        if not program.instructions or program.instructions[-1].op != END:
            yield op, "does not end with an 'end' instruction"
        for k, instr in enumerate(program.instructions):
            why = _instruction_problem(plan, program, k, instr)
            if why is not None:
                yield op, f"{describe(instr, plan.stage_of, k)}: {why}"
    ranks = {p.rank for p in plan.programs}
    missing = sorted(set(range(plan.pp)) - ranks)
    if missing and plan.programs:
        yield plan.programs[0].op, f"the plan has programs for ranks {sorted(ranks)} but none for rank(s) {missing}"


def _instruction_problem(plan: _Plan, program: Program, k: int, instr: Instruction) -> str | None:
    code = program.instructions
    op = instr.op
    if op == END:
        if instr.ref != program.name:
            return f"an end names its program, @{program.name}"
        return None if k == len(code) - 1 else "an end must be the last instruction"
    if op in (RUN, DEFER, ALL_TO_ALL, SLOT):
        task = plan.tasks.get(instr.ref)
        if task is None:
            return f"@{instr.ref} is no task of the module"
        if op == ALL_TO_ALL or op == SLOT:
            if task.resource != Resource.COMM:
                return f"@{instr.ref} is a compute task; all_to_all and slot name a dispatch or combine task"
        elif task.resource != Resource.COMPUTE:
            return f"@{instr.ref} is a comm task; it runs as an all_to_all"
        if op == DEFER and task.movable is not True:
            return f"@{instr.ref} is not movable; only weight gradients can be deferred"
    if op in (RUN, DEFER, ALL_TO_ALL, SLOT, SEND, RECV) and instr.mb >= plan.microbatches:
        return f"micro-batch {instr.mb} is not below the plan's {plan.microbatches}"
    if op in (SEND, RECV, GRAD_REDUCE):
        stage = plan.stage_of.get(instr.ref)
        if stage is None:
            return f"@{instr.ref} is no candidate op; a {op} names the candidate standing for its virtual stage"
        stages = plan.pp * plan.vpp
        if stage >= stages:
            return f"stage {stage} is not below pp x vpp = {stages}"
        owner = stage % plan.pp
        if op == GRAD_REDUCE or op == SEND:
            if owner != program.rank:
                return f"stage {stage} lives on rank {owner}, not on rank {program.rank}"
        if op in P2P:
            if instr.peer >= plan.pp or instr.peer == program.rank:
                return f"peer {instr.peer} is not another pipeline rank (0..{plan.pp - 1})"
            if op == RECV and owner != instr.peer:
                return f"stage {stage} lives on rank {owner}, so it cannot come from rank {instr.peer}"
            next_stage = stage + 1 if instr.payload == ACTIVATION else stage - 1
            if not 0 <= next_stage < stages:
                return f"stage {stage} has no {'next' if instr.payload == ACTIVATION else 'previous'} stage to take its {instr.payload}"
            consumer = next_stage % plan.pp
            receiver = instr.peer if op == SEND else program.rank
            if consumer != receiver:
                return (f"the {instr.payload} of stage {stage} goes to stage {next_stage} on rank {consumer}, "
                        f"not to rank {receiver}")
    if op in (WAIT, SLOT):
        if instr.on >= k:
            return f"waits on instruction {instr.on}, which does not come before it"
        target = code[instr.on]
        if op == SLOT:
            if target.op != ALL_TO_ALL or target.ref != instr.ref or target.mb != instr.mb:
                return f"instruction {instr.on} is not the all_to_all of @{instr.ref} micro-batch {instr.mb}"
            return None
        if target.op not in COMPLETING:
            return f"instruction {instr.on} ({target.op}) is no work that finishes"
        if target.ref != instr.ref:
            return f"instruction {instr.on} is about @{target.ref}, not @{instr.ref}"
        if target.op == DEFER and target.deadline > k:
            return (f"waits on a deferred task before its deadline (instruction {target.deadline}); the runtime may "
                    "still hold it then")
    if op == DEFER and not k < instr.deadline <= len(code) - 1:
        return f"deadline {instr.deadline} is not after it and at or before the end ({len(code) - 1})"
    return None


# ---------------------------------------------------------------- program-sends-match


Channel = tuple[Instance, Instance]  # (sender, receiver)


def _transfers(plan: _Plan) -> tuple[dict[Channel, list[int]], dict[Channel, list[int]]]:
    """Per (sender, receiver): the sender's send indices, and the receiver's receive indices, in order."""
    sends: dict[Channel, list[int]] = defaultdict(list)
    recvs: dict[Channel, list[int]] = defaultdict(list)
    for inst, program in plan.instances.items():
        for k, instr in enumerate(program.instructions):
            if instr.op == SEND:
                sends[(inst, (instr.peer, inst[1]))].append(k)
            elif instr.op == RECV:
                recvs[((instr.peer, inst[1]), inst)].append(k)
    return sends, recvs


def _key(plan: _Plan, instr: Instruction) -> tuple[str, int, int]:
    return instr.payload, plan.stage_of[instr.ref], instr.mb


@check("program-sends-match", "each send has its matching receive, issued in the same order on both ranks")
def _sends_match(module: Module) -> Iterator[VerifyError]:
    plan = _legal_plan(module)
    if plan is None:
        return
    r = _Reporter("program-sends-match", module)
    sends, recvs = _transfers(plan)
    for channel in sorted(set(sends) | set(recvs)):
        src, dst = channel
        if src not in plan.instances or dst not in plan.instances:
            continue  # program-instructions-legal reports the missing rank
        sp, rp = plan.instances[src], plan.instances[dst]
        s_list = [(k, _key(plan, sp.instructions[k])) for k in sends.get(channel, [])]
        r_list = [(k, _key(plan, rp.instructions[k])) for k in recvs.get(channel, [])]
        found = _first_mismatch(s_list, r_list, lambda a, b: a[1] == b[1])
        if found is None:
            continue
        n, sent, received = found
        if sent is not None and received is not None:
            s, rv = sent[0], received[0]
            yield r.plan(sp.op, (
                f"transfer #{n} from {plan.name(src)} to {plan.name(dst)} does not match: {plan.name(src)} issues "
                f"{describe(sp.instructions[s], plan.stage_of, s)}, but {plan.name(dst)} issues "
                f"{describe(rp.instructions[rv], plan.stage_of, rv)} as its matching receive; both ranks must issue "
                "their transfers between them in the same order"
            ))
        else:
            longer, extra = (sp, sent[0]) if sent is not None else (rp, received[0])  # type: ignore[index]
            yield r.plan(longer.op, (
                f"{plan.name(src)} issues {len(s_list)} send(s) to {plan.name(dst)}, which issues {len(r_list)} "
                f"receive(s) from it: {describe(longer.instructions[extra], plan.stage_of, extra)} on "
                f"{longer.where} has no match"
            ))


def _first_mismatch(left: list[T], right: list[T], same: Callable[[T, T], bool]) -> tuple[int, T | None, T | None] | None:
    """The first position (from 1) where two sequences differ, with both items (None past an end), or None."""
    for n, (a, b) in enumerate(zip(left, right), start=1):
        if not same(a, b):
            return n, a, b
    if len(left) == len(right):
        return None
    n = min(len(left), len(right))
    return n + 1, left[n] if n < len(left) else None, right[n] if n < len(right) else None


# ---------------------------------------------------------------- program-collectives-ordered


def _collectives(program: Program) -> list[tuple[int, Instruction]]:
    return [(k, i) for k, i in enumerate(program.instructions) if i.op in COLLECTIVES]


@check("program-collectives-ordered", "every rank of an EP group issues the same collectives in the same order")
def _collectives_ordered(module: Module) -> Iterator[VerifyError]:
    plan = _legal_plan(module)
    if plan is None:
        return
    r = _Reporter("program-collectives-ordered", module)
    by_rank: dict[int, list[Program]] = defaultdict(list)
    for program in plan.programs:
        by_rank[program.rank].append(program)
    for rank in sorted(by_rank):
        group = sorted(by_rank[rank], key=lambda p: -1 if p.ep_rank is None else p.ep_rank)
        first = group[0]
        reference = _collectives(first)
        for other in group[1:]:
            mine = _collectives(other)
            found = _first_mismatch(reference, mine, lambda x, y: (x[1].op, x[1].ref, x[1].mb) == (y[1].op, y[1].ref, y[1].mb))
            if found is None:
                continue
            n, a, b = found
            if a is not None and b is not None:
                yield r.plan(other.op, (
                    f"collective #{n} of the EP group of rank {rank} differs: {first.where} issues "
                    f"{describe(a[1], plan.stage_of, a[0])}, {other.where} issues {describe(b[1], plan.stage_of, b[0])}; "
                    "every rank of a group must issue its collectives in the same order"
                ))
            else:
                yield r.plan(other.op, (
                    f"{first.where} issues {len(reference)} collectives, {other.where} issues {len(mine)}; every rank "
                    "of the EP group must issue the same ones"
                ))


# ---------------------------------------------------------------- program-deadlock-free


@dataclass
class _Running:
    """One simulated rank: where it is and what it has issued that has not finished."""

    program: Program
    pc: int = 0
    done: set[int] = field(default_factory=set)
    outstanding: int = 0  # issued work not finished yet
    collectives: deque[int] = field(default_factory=deque)  # issued, not finished, in order
    blocked_on: int | None = None  # the instruction a wait is waiting for
    finished: bool = False


def simulate(plan: _Plan) -> dict[Instance, _Running]:
    """Run every rank's program to completion (or until nothing can move); the final states."""
    state = {inst: _Running(program) for inst, program in plan.instances.items()}
    groups: dict[int, list[Instance]] = defaultdict(list)  # EP group: the instances of one pipeline rank
    for inst in state:
        groups[inst[0]].append(inst)
    posted_sends: dict[Channel, deque[int]] = defaultdict(deque)
    posted_recvs: dict[Channel, deque[int]] = defaultdict(deque)
    runnable = deque(sorted(state))

    def finish(inst: Instance, k: int) -> None:
        s = state[inst]
        s.done.add(k)
        s.outstanding -= 1
        if s.blocked_on == k:
            s.blocked_on = None
            runnable.append(inst)
        elif s.outstanding == 0 and s.blocked_on is None and not s.finished and s.program.instructions[s.pc].op == END:
            runnable.append(inst)

    def match(channel: Channel) -> None:
        sends, recvs = posted_sends[channel], posted_recvs[channel]
        while sends and recvs:
            finish(channel[0], sends.popleft())
            finish(channel[1], recvs.popleft())

    def collect(rank: int) -> None:
        members = groups[rank]
        while all(state[m].collectives for m in members):
            heads = [state[m].collectives[0] for m in members]
            first = state[members[0]].program.instructions[heads[0]]
            if any(state[m].program.instructions[h].ref != first.ref or state[m].program.instructions[h].mb != first.mb
                   for m, h in zip(members, heads)):
                return  # a mismatch at the head blocks the group (program-collectives-ordered names it)
            for m, h in zip(members, heads):
                state[m].collectives.popleft()
                finish(m, h)

    while runnable:
        inst = runnable.popleft()
        s = state[inst]
        code = s.program.instructions
        while not s.finished and s.blocked_on is None:
            instr = code[s.pc]
            op = instr.op
            if op == WAIT:
                if instr.on not in s.done:
                    s.blocked_on = instr.on
                    break
            elif op == END:
                if s.outstanding:
                    break  # woken by the last finish
                s.finished = True
                break
            elif op in (RUN, DEFER):
                # Compute never waits once issued (waits gate issuing), so it finishes; a deferred
                # task runs at the latest before its deadline.
                s.done.add(s.pc)
            elif op in COLLECTIVES:
                s.outstanding += 1
                s.collectives.append(s.pc)
                s.pc += 1
                collect(inst[0])
                continue
            elif op in P2P:
                s.outstanding += 1
                peer = (instr.peer, inst[1])
                channel = (inst, peer) if op == SEND else (peer, inst)
                (posted_sends if op == SEND else posted_recvs)[channel].append(s.pc)
                s.pc += 1
                match(channel)
                continue
            s.pc += 1
    return state


@check("program-deadlock-free", "all ranks' programs, simulated together, run to completion")
def _deadlock_free(module: Module) -> Iterator[VerifyError]:
    plan = _legal_plan(module)
    if plan is None:
        return
    state = simulate(plan)
    stuck = [inst for inst in sorted(state) if not state[inst].finished]
    if not stuck:
        return
    r = _Reporter("program-deadlock-free", module)
    parts = []
    for inst in stuck[:4]:
        s = state[inst]
        code = s.program.instructions
        if s.blocked_on is not None:
            parts.append(f"{plan.name(inst)} waits at {describe(code[s.pc], plan.stage_of, s.pc)} for "
                         f"{_pending(plan, inst, s, s.blocked_on)}")
        else:
            waiting = sorted(k for k, i in enumerate(code[: s.pc]) if i.op in COMPLETING and k not in s.done)
            parts.append(f"{plan.name(inst)} reached its end with {_pending(plan, inst, s, waiting[0])} unfinished")
    more = f"; {len(stuck) - 4} more rank(s) are stuck" if len(stuck) > 4 else ""
    yield r.plan(state[stuck[0]].program.op, "the programs deadlock: " + "; ".join(parts) + more)


def _pending(plan: _Plan, inst: Instance, s: _Running, k: int) -> str:
    instr = s.program.instructions[k]
    text = describe(instr, plan.stage_of, k)
    if instr.op in P2P:
        text += f", which rank {instr.peer} has not {'received' if instr.op == SEND else 'sent'}"
    elif instr.op in COLLECTIVES:
        text += ", which the rest of its group has not reached"
    return text


# ---------------------------------------------------------------- program-dependencies-respected


class _Coverage:
    """Per program position: which earlier work is known finished (stream order and waits)."""

    def __init__(self, program: Program):
        code = program.instructions
        n = len(code)
        self.fifo: list[int] = [-1] * n  # position of each FIFO instruction on its stream, -1: not FIFO
        self.stream: list[str] = [i.stream for i in code]
        counters = {"compute": 0, "comm": 0}
        for k, i in enumerate(code):
            if i.op == RUN or i.op in COLLECTIVES:
                self.fifo[k] = counters[i.stream]
                counters[i.stream] += 1
        # Per position, the known-finished frontier: the FIFO position reached on each stream,
        # and the non-FIFO instructions waited for (kept as the position they were waited at).
        self.frontier: list[tuple[int, int]] = []
        self.waited_at: dict[int, int] = {}
        compute_done = comm_done = -1
        for k, i in enumerate(code):
            self.frontier.append((compute_done, comm_done))
            if i.op == WAIT:
                t = i.on
                if self.fifo[t] >= 0:
                    if self.stream[t] == COMPUTE:
                        compute_done = max(compute_done, self.fifo[t])
                    else:
                        comm_done = max(comm_done, self.fifo[t])
                else:
                    self.waited_at.setdefault(t, k)

    def finished_before(self, j: int, k: int) -> bool:
        """Whether instruction ``j`` is known finished when instruction ``k`` is issued."""
        if self.fifo[j] >= 0:
            compute_done, comm_done = self.frontier[k]
            return self.fifo[j] <= (compute_done if self.stream[j] == COMPUTE else comm_done)
        at = self.waited_at.get(j)
        return at is not None and at < k

    def ordered_before(self, j: int, k: int, consumer: Instruction, producer: Instruction) -> bool:
        """Whether stream order alone runs ``j`` before the work of ``k`` (same FIFO stream)."""
        if producer.op == RUN and consumer.op in (RUN, DEFER):
            return True  # the compute stream runs in issue order; a deferred task runs later still
        return producer.op in COLLECTIVES and consumer.op in COLLECTIVES


def _phase_payload(task: Task) -> str:
    return ACTIVATION if task.phase == Phase.FWD else GRADIENT


@check("program-dependencies-respected",
       "every task runs once per micro-batch, after the tasks it depends on; gradients reduce after weight gradients")
def _dependencies_respected(module: Module) -> Iterator[VerifyError]:
    plan = _legal_plan(module)
    if plan is None:
        return
    r = _Reporter("program-dependencies-respected", module)
    sends, recvs = _transfers(plan)
    matched: dict[tuple[Instance, int], tuple[Instance, int]] = {}  # receive -> its send
    for channel, r_list in recvs.items():
        for s, rv in zip(sends.get(channel, []), r_list):
            matched[(channel[1], rv)] = (channel[0], s)
    coverage = {inst: _Coverage(p) for inst, p in plan.instances.items()}
    # Where each (task, micro-batch) runs, per EP coordinate.
    runs: dict[tuple[int, str, int], tuple[Instance, int]] = {}
    for inst, program in plan.instances.items():
        for k, i in enumerate(program.instructions):
            if i.op in (RUN, DEFER, ALL_TO_ALL):
                key = (inst[1], i.ref, i.mb)
                if key in runs:
                    other = runs[key]
                    yield r.plan(program.op, (
                        f"@{i.ref} micro-batch {i.mb} runs twice: at {describe(i, plan.stage_of, k)} on {plan.name(inst)} "
                        f"and at instruction {other[1]} on {plan.name(other[0])}"
                    ))
                    return
                runs[key] = (inst, k)
    coords = sorted({e for _, e in plan.instances})
    for e in coords:
        for task in plan.tasks.values():
            for mb in range(plan.microbatches):
                if (e, task.name, mb) not in runs:
                    yield r.error(f"@{task.name} micro-batch {mb} runs on no rank; every task runs once per micro-batch",
                                  f"task:{task.name}")
                    return
    recv_index: dict[Instance, dict[tuple[int, str, int], list[int]]] = {}
    for inst, program in plan.instances.items():
        index: dict[tuple[int, str, int], list[int]] = defaultdict(list)
        for k, i in enumerate(program.instructions):
            if i.op == RECV:
                index[(i.peer, i.payload, i.mb)].append(k)
        recv_index[inst] = index
    for inst, program in plan.instances.items():
        cov = coverage[inst]
        for k, i in enumerate(program.instructions):
            if i.op not in (RUN, DEFER, ALL_TO_ALL):
                continue
            task = plan.tasks[i.ref]
            for dep in task.deps:
                where = runs.get((inst[1], dep, i.mb))
                if where is None:
                    continue
                dep_inst, j = where
                problem = None
                if dep_inst == inst:
                    producer = program.instructions[j]
                    if j > k:
                        problem = f"it is issued before @{dep} (instruction {j}), which it depends on"
                    elif not (cov.ordered_before(j, k, i, producer) or cov.finished_before(j, k)):
                        problem = (f"nothing makes it wait for @{dep} ({describe(producer, plan.stage_of, j)}) on the "
                                   f"{producer.stream} stream; add a wait")
                else:
                    problem = _remote_problem(plan, coverage, recv_index, matched, inst, k, i, dep_inst, j, plan.tasks[dep])
                if problem is not None:
                    yield r.plan(program.op, f"{describe(i, plan.stage_of, k)} on {plan.name(inst)}: {problem}")
                    return
        yield from _grad_reduce_problems(r, plan, inst, program, runs)


def _remote_problem(
    plan: _Plan,
    coverage: dict[Instance, _Coverage],
    recv_index: dict[Instance, dict[tuple[int, str, int], list[int]]],
    matched: dict[tuple[Instance, int], tuple[Instance, int]],
    inst: Instance,
    k: int,
    instr: Instruction,
    dep_inst: Instance,
    j: int,
    dep: Task,
) -> str | None:
    """Why the dependency of ``instr`` on ``dep`` (instruction ``j`` of another rank) is not
    guaranteed, or None: a receive from that rank, waited for here, whose send waited for it."""
    candidates = recv_index[inst].get((dep_inst[0], _phase_payload(dep), instr.mb), [])
    for rv in candidates:
        if rv >= k or not coverage[inst].finished_before(rv, k):
            continue
        send = matched.get((inst, rv))
        if send is None or send[0] != dep_inst:
            continue
        if coverage[dep_inst].finished_before(j, send[1]):
            return None
    waited = [rv for rv in candidates if rv < k and coverage[inst].finished_before(rv, k)]
    if not waited:
        return (f"it depends on @{dep.name} micro-batch {instr.mb}, which runs on rank {dep_inst[0]}, but no receive of "
                f"that {_phase_payload(dep)} from rank {dep_inst[0]} is waited for before it")
    rv = waited[0]
    send = matched.get((inst, rv))
    where = f"the matching send (instruction {send[1]} of rank {send[0][0]})" if send else "its receive has no send, and"
    return (f"it depends on @{dep.name} micro-batch {instr.mb} on rank {dep_inst[0]}, but {where} does not wait for "
            f"that task (instruction {j})")


def _grad_reduce_problems(
    r: _Reporter, plan: _Plan, inst: Instance, program: Program, runs: dict[tuple[int, str, int], tuple[Instance, int]]
) -> Iterator[VerifyError]:
    """A grad_reduce of stage s runs after every weight gradient of s's layers (when the candidate lists them)."""
    cov = None
    candidates = {op.name: op for op in plan.module.plan if op.op == "candidate"}
    layers_of = {layer.name: layer for layer in plan.module.layers}
    for k, i in enumerate(program.instructions):
        if i.op != GRAD_REDUCE:
            continue
        layers = candidates[i.ref].attrs.get("layers") if i.ref in candidates else None
        if not isinstance(layers, list):
            continue
        cov = cov or _Coverage(program)
        for ref in layers:
            layer = layers_of.get(ref.name) if isinstance(ref, SymbolRef) else None
            for task in layer.tasks if layer is not None else []:
                if task.phase != Phase.WGRAD:
                    continue
                for mb in range(plan.microbatches):
                    where = runs.get((inst[1], task.name, mb))
                    if where is None or where[0] != inst:
                        continue
                    if not cov.finished_before(where[1], k):
                        yield r.plan(program.op, (
                            f"{describe(i, plan.stage_of, k)} on {plan.name(inst)} reduces gradients before "
                            f"@{task.name} micro-batch {mb} (instruction {where[1]}) is known to have run; wait for it"
                        ))
                        return
