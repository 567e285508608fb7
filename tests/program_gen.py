"""Plans written directly with the runtime's format, without the compiler.

``generate_plan(seed)`` builds a random but well-formed plan: per rank, the
forward and backward chunks of its virtual stages for every micro-batch, with
point-to-point transfers, All-to-All collectives over EP, cross-stream waits,
DBO slots before waits on All-to-Alls, weight gradients deferred with a
deadline at their stage's gradient reduction, and END. ``drive`` plays a
trainer against an FSM with seeded random completion order, token reports and
run-time registrations, and records what the FSM did.

Run as a script, it writes plans for the native sanitizer self-test:
``python tests/program_gen.py OUTDIR``.
"""

from __future__ import annotations

import hashlib
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.bytecode import (
    NONE,
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

FWD_OPS = [("mixer", Stream.COMPUTE), ("router", Stream.COMPUTE), ("dispatch", Stream.COMM),
           ("expert_gemm", Stream.COMPUTE), ("combine", Stream.COMM)]
WEIGHTED = {"mixer", "router", "expert_gemm"}


@dataclass
class _Tables:
    tasks: list[TaskInfo]
    index: dict[str, int]
    slots: list[SlotInfo]
    slot_of: dict[int, int]


def _tables(rng: random.Random, layers_per_stage: list[list[str]]) -> _Tables:
    tasks: list[TaskInfo] = []
    index: dict[str, int] = {}
    slots: list[SlotInfo] = []
    slot_of: dict[int, int] = {}

    def add(name: str, kind: str, layer: str, resource: Stream, movable: bool = False) -> None:
        index[name] = len(tasks)
        duration = round(rng.uniform(1.0, 50.0), 3)
        memory = rng.choice([0, 1 << 20, 4 << 20, 16 << 20]) if movable else 0
        tasks.append(TaskInfo(name, kind, layer, resource, movable, duration, memory))

    for layers in layers_per_stage:
        for layer in layers:
            for op, res in FWD_OPS:
                add(f"{layer}.{op}.fwd", f"{op}.fwd", layer, res)
            for op, res in reversed(FWD_OPS):
                add(f"{layer}.{op}.dgrad", f"{op}.dgrad", layer, res)
                if op in WEIGHTED:
                    add(f"{layer}.{op}.wgrad", f"{op}.wgrad", layer, Stream.COMPUTE, movable=True)
    for i in index.values():
        if tasks[i].resource == Stream.COMM and rng.random() < 0.7:
            slot_of[i] = len(slots)
            base, a2a, gemm = (round(rng.uniform(0.0, 80.0), 3) for _ in range(3))
            slots.append(SlotInfo(i, base, a2a, gemm))
    return _Tables(tasks, index, slots, slot_of)


class _Emitter:
    def __init__(self, rank: int, plan: PlanInfo, tables: _Tables, rng: random.Random, dbo: bool):
        self.rank, self.plan, self.t, self.rng, self.dbo = rank, plan, tables, rng, dbo
        self.code: list[Instr] = []
        self.last_compute: int | None = None
        self.deferred: dict[int, list[int]] = {}  # vstage -> DEFER instruction indices

    def emit(self, ins: Instr) -> int:
        self.code.append(ins)
        return len(self.code) - 1

    def wait(self, target: int | None, stream: Stream) -> None:
        if target is not None:
            self.emit(Instr(Op.WAIT, stream, a=target))

    def compute(self, task: str, mb: int) -> None:
        self.last_compute = self.emit(Instr(Op.RUN, Stream.COMPUTE, mb=mb, a=self.t.index[task]))

    def all_to_all(self, task: str, mb: int) -> None:
        self.wait(self.last_compute, Stream.COMM)
        i = self.t.index[task]
        coll = self.emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.ALL_TO_ALL, mb, i, Group.EP))
        if i in self.t.slot_of and self.dbo:
            self.emit(Instr(Op.SLOT, Stream.COMPUTE, mb=mb, a=self.t.slot_of[i], b=coll))
        self.wait(coll, Stream.COMPUTE)

    def chunk(self, vstage: int, mb: int, layers: list[str], backward: bool) -> None:
        pp, last = self.plan.pp, self.plan.virtual_stages - 1
        src = vstage + 1 if backward else vstage - 1
        if pp > 1 and 0 <= src <= last:
            payload = Payload.GRADIENT if backward else Payload.ACTIVATION
            recv = self.emit(Instr(Op.RECV, Stream.COMM, payload, mb, src % pp, src))
            self.wait(recv, Stream.COMPUTE)
        for layer in (reversed(layers) if backward else layers):
            for op, res in (reversed(FWD_OPS) if backward else FWD_OPS):
                name = f"{layer}.{op}.{'dgrad' if backward else 'fwd'}"
                if res == Stream.COMM:
                    self.all_to_all(name, mb)
                else:
                    self.compute(name, mb)
                if backward and op in WEIGHTED:
                    wgrad = f"{layer}.{op}.wgrad"
                    if self.rng.random() < 0.7:
                        d = self.emit(Instr(Op.DEFER, Stream.COMPUTE, mb=mb, a=self.t.index[wgrad], b=NONE))
                        self.deferred.setdefault(vstage, []).append(d)
                    else:
                        self.compute(wgrad, mb)
        dst = vstage - 1 if backward else vstage + 1
        if pp > 1 and 0 <= dst <= last:
            self.wait(self.last_compute, Stream.COMM)
            payload = Payload.GRADIENT if backward else Payload.ACTIVATION
            self.emit(Instr(Op.SEND, Stream.COMM, payload, mb, dst % pp, vstage))

    def grad_reduce(self, vstage: int) -> None:
        defers = self.deferred.pop(vstage, [])
        at = len(self.code)
        for d in defers:
            old = self.code[d]
            self.code[d] = Instr(old.op, old.stream, old.aux, old.mb, old.a, at)
        for d in defers:
            self.wait(d, Stream.COMM)
        self.wait(self.last_compute, Stream.COMM)
        self.emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.GRAD_REDUCE, 0, vstage, Group.DP))


def generate_plan(seed: int, *, max_pp: int = 3, max_vpp: int = 2, max_mb: int = 3, dbo: bool | None = None) -> PlanImage:
    rng = random.Random(seed)
    pp, vpp, mbs, ep = rng.randint(1, max_pp), rng.randint(1, max_vpp), rng.randint(1, max_mb), rng.randint(1, 4)
    use_dbo = rng.random() < 0.8 if dbo is None else dbo
    stages = pp * vpp
    layers = [[f"l{s}_{k}" for k in range(rng.randint(1, 2))] for s in range(stages)]
    tables = _tables(rng, layers)
    budget = rng.choice([0, 8 << 20, 64 << 20, (1 << 64) - 1])
    plan = PlanInfo(pp, vpp, ep, 1, mbs, 1, 128, "bf16", f"generated{seed}", "analytic", "h100", budget)
    programs = {}
    for rank in range(pp):
        e = _Emitter(rank, plan, tables, rng, use_dbo)
        mine = [s for s in range(stages) if s % pp == rank]
        for mb in range(mbs):
            for s in mine:
                e.chunk(s, mb, layers[s], backward=False)
        for s in reversed(mine):
            for mb in range(mbs):
                e.chunk(s, mb, layers[s], backward=True)
            e.grad_reduce(s)
        e.emit(Instr(Op.END))
        programs[rank] = e.code
    signature = hashlib.sha256(f"generated plan {seed}".encode()).digest()
    return PlanImage(signature, plan, tables.tasks, tables.slots if use_dbo else None, programs)


def generate_bytes(seed: int, **kwargs: Any) -> bytes:
    return encode(generate_plan(seed, **kwargs))


def action_key(a: Any) -> tuple:
    """The comparable content of an action from either interpreter."""
    return (int(a.kind), a.id, a.stream, a.task, a.mb, a.peer, a.vstage, a.payload, a.collective, a.group,
            bool(a.filled), bool(a.fallback), a.wait_for)


def drive(fsm: Any, program: Any, seed: int, *, register: bool = True, max_steps: int = 200_000) -> tuple[list[tuple], dict]:
    """Play a trainer: random completion order, token reports and registrations. Returns (actions, counters)."""
    rng = random.Random(seed)
    tasks = program.tasks
    movable = [i for i, t in enumerate(tasks) if t.movable]
    comm = [i for i, t in enumerate(tasks) if t.resource == Stream.COMM]
    code = program.instructions
    end = len(code) - 1
    mbs = program.plan.microbatches
    ep = program.plan.ep
    in_flight: list[int] = []
    log: list[tuple] = []
    for _ in range(max_steps):
        roll = rng.random()
        if in_flight and roll < 0.3:
            fsm.complete(in_flight.pop(rng.randrange(len(in_flight))))
            continue
        if comm and roll < 0.4:
            experts = ep * rng.randint(1, 3)
            fsm.report_tokens(rng.choice(comm), rng.randrange(mbs), [rng.randrange(256) for _ in range(experts)])
            continue
        if register and movable and roll < 0.43 and fsm.pc < end - 1:
            deadline = rng.randint(fsm.pc + 1, end)
            log.append(("registered", fsm.register_task(rng.choice(movable), rng.randrange(mbs), deadline)))
            continue
        a = fsm.advance()
        log.append(action_key(a))
        if a.kind == 5:  # DONE
            return log, dict(fsm.counters)
        if a.kind == 4:  # WAIT
            assert a.wait_for in in_flight, f"WAIT for {a.wait_for}, which is not in flight"
            in_flight.remove(a.wait_for)
            fsm.complete(a.wait_for)
        else:
            in_flight.append(a.id)
    raise AssertionError("the FSM did not reach DONE")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for seed in range(int(sys.argv[2]) if len(sys.argv) > 2 else 6):
        (out / f"generated{seed}.tsb").write_bytes(generate_bytes(seed, max_pp=4))
