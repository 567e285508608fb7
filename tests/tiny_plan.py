"""Programs for the tiny Qwen3-Next model written directly with the runtime's format, for executor tests.

Like ``program_gen``, this writes bytecode without the compiler's lowering: the
executor is tested on programs whose shape is known. Each rank runs its
forwards and backwards in interleaved-1F1B order (``passes.pipelining.order``),
each chunk's tasks one after the other in the model's dependency order, with
the shared expert between a dispatch and the wait for it (the one overlap a
chunk has on its own), every weight gradient deferred to its stage's gradient
reduction when ``defer`` is set, and a DBO slot before every wait on an
All-to-All when ``dbo`` is set.

``python tests/tiny_plan.py OUT.tsb [--seq-len N] ...`` writes one.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

from codegen.signature import plan_signature
from passes.pipelining.order import rank_order
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
from runtime.layout import even_stage_layers
from tessera_ir.model import Module

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "tiny_qwen3_next.py"
FWD = ("embedding", "mixer", "router", "dispatch", "shared_expert", "expert_gemm", "combine", "lm_head")
MIXERS = ("attention", "linear_attention")


@functools.cache
def tiny_example() -> Any:
    """``examples/tiny_qwen3_next.py`` imported by path (the examples folder is not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tiny_qwen3_next_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@functools.lru_cache(maxsize=8)
def captured(pp: int, vpp: int, ep: int, microbatches: int, seq_len: int) -> Module:
    from tessera.api import capture

    return capture(str(EXAMPLE), pp=pp, vpp=vpp, ep=ep, microbatches=microbatches, seq_len=seq_len)


class _Emitter:
    def __init__(self, rank: int, plan: PlanInfo, index: dict[str, int], slot_of: dict[int, int], dbo: bool, defer: bool):
        self.rank, self.plan, self.index, self.slot_of, self.dbo, self.defer = rank, plan, index, slot_of, dbo, defer
        self.code: list[Instr] = []
        self.deferred: dict[int, list[int]] = {}

    def emit(self, ins: Instr) -> int:
        self.code.append(ins)
        return len(self.code) - 1

    def run(self, name: str, mb: int) -> None:
        self.emit(Instr(Op.RUN, Stream.COMPUTE, mb=mb, a=self.index[name]))

    def wgrad(self, name: str, mb: int, stage: int) -> None:
        if name not in self.index:
            return
        if self.defer:
            d = self.emit(Instr(Op.DEFER, Stream.COMPUTE, mb=mb, a=self.index[name], b=NONE))
            self.deferred.setdefault(stage, []).append(d)
        else:
            self.run(name, mb)

    def all_to_all(self, name: str, mb: int) -> int:
        task = self.index[name]
        i = self.emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.ALL_TO_ALL, mb, task, Group.EP))
        return i

    def wait_a2a(self, coll: int, mb: int) -> None:
        task = self.code[coll].a
        if self.dbo and task in self.slot_of:
            self.emit(Instr(Op.SLOT, Stream.COMPUTE, mb=mb, a=self.slot_of[task], b=coll))
        self.emit(Instr(Op.WAIT, Stream.COMPUTE, a=coll))

    def layer_fwd(self, layer: str, mixer: str, mb: int) -> None:
        if layer == "embed":
            self.run("embed.embedding.fwd", mb)
            return
        if layer == "head":
            self.run("head.lm_head.fwd", mb)
            return
        self.run(f"{layer}.{mixer}.fwd", mb)
        self.run(f"{layer}.router.fwd", mb)
        dispatch = self.all_to_all(f"{layer}.dispatch.fwd", mb)
        self.run(f"{layer}.shared_expert.fwd", mb)
        self.wait_a2a(dispatch, mb)
        self.run(f"{layer}.expert_gemm.fwd", mb)
        combine = self.all_to_all(f"{layer}.combine.fwd", mb)
        self.wait_a2a(combine, mb)

    def layer_bwd(self, layer: str, mixer: str, mb: int, stage: int) -> None:
        if layer == "embed":
            self.wgrad("embed.embedding.wgrad", mb, stage)
            return
        if layer == "head":
            self.run("head.lm_head.dgrad", mb)
            self.wgrad("head.lm_head.wgrad", mb, stage)
            return
        combine = self.all_to_all(f"{layer}.combine.dgrad", mb)
        self.run(f"{layer}.shared_expert.dgrad", mb)
        self.wgrad(f"{layer}.shared_expert.wgrad", mb, stage)
        self.wait_a2a(combine, mb)
        self.run(f"{layer}.expert_gemm.dgrad", mb)
        dispatch = self.all_to_all(f"{layer}.dispatch.dgrad", mb)
        self.wgrad(f"{layer}.expert_gemm.wgrad", mb, stage)
        self.wait_a2a(dispatch, mb)
        self.run(f"{layer}.router.dgrad", mb)
        self.wgrad(f"{layer}.router.wgrad", mb, stage)
        self.run(f"{layer}.{mixer}.dgrad", mb)
        self.wgrad(f"{layer}.{mixer}.wgrad", mb, stage)

    def chunk(self, stage: int, mb: int, layers: list[str], mixers: dict[str, str], backward: bool) -> None:
        pp, last = self.plan.pp, self.plan.pp * self.plan.vpp - 1
        src = stage + 1 if backward else stage - 1
        if 0 <= src <= last:
            payload = Payload.GRADIENT if backward else Payload.ACTIVATION
            recv = self.emit(Instr(Op.RECV, Stream.COMM, payload, mb, src % pp, src))
            self.emit(Instr(Op.WAIT, Stream.COMPUTE, a=recv))
        for layer in (reversed(layers) if backward else layers):
            if backward:
                self.layer_bwd(layer, mixers.get(layer, ""), mb, stage)
            else:
                self.layer_fwd(layer, mixers.get(layer, ""), mb)
        dst = stage - 1 if backward else stage + 1
        if 0 <= dst <= last:
            payload = Payload.GRADIENT if backward else Payload.ACTIVATION
            self.emit(Instr(Op.SEND, Stream.COMM, payload, mb, dst % pp, stage))

    def grad_reduce(self, stage: int) -> None:
        defers = self.deferred.pop(stage, [])
        at = len(self.code)
        for d in defers:
            old = self.code[d]
            self.code[d] = Instr(old.op, old.stream, old.aux, old.mb, old.a, at)
        for d in defers:
            self.emit(Instr(Op.WAIT, Stream.COMM, a=d))
        self.emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.GRAD_REDUCE, 0, stage, Group.DP))


def tiny_plan_image(
    *, pp: int = 2, vpp: int = 2, ep: int = 2, microbatches: int = 4, seq_len: int = 32, dbo: bool = True,
    defer: bool = True, stages: list[list[str]] | None = None, model: str | None = None,
) -> PlanImage:
    module = captured(pp, vpp, ep, microbatches, seq_len)
    tasks: list[TaskInfo] = []
    index: dict[str, int] = {}
    mixers: dict[str, str] = {}
    for layer in module.layers:
        for task in layer.tasks:
            op = task.kind.rpartition(".")[0]
            if op in MIXERS:
                mixers[layer.name] = op
            index[task.name] = len(tasks)
            resource = Stream.COMM if str(getattr(task.resource, "value", task.resource)) == "comm" else Stream.COMPUTE
            duration = max(1.0, (task.flops or 0) / 2e4 + (task.bytes or 0) / 2e4)
            memory = int(task.act_bytes or 0) + (1 << 16) if task.movable else 0
            tasks.append(TaskInfo(task.name, task.kind, layer.name, resource, bool(task.movable), round(duration, 3), memory))
    slots: list[SlotInfo] = []
    slot_of: dict[int, int] = {}
    for i, info in enumerate(tasks):
        if info.resource == Stream.COMM:
            slot_of[i] = len(slots)
            slots.append(SlotInfo(i, 20.0, info.duration_us, 30.0))
    layer_names = [layer.name for layer in module.layers]
    stage_layers = stages or even_stage_layers(layer_names, pp * vpp)
    plan = PlanInfo(pp, vpp, ep, 1, microbatches, 1, seq_len, "fp32", model or "tiny_qwen3_next", "analytic", "cpu", 1 << 40)
    programs = {}
    for rank in range(pp):
        e = _Emitter(rank, plan, index, slot_of, dbo, defer)
        remaining = {s: microbatches for s in range(rank, pp * vpp, pp)}
        for action in rank_order(pp, vpp, microbatches, rank):
            stage = action.stage(rank, pp)
            backward = action.direction == "bwd"
            e.chunk(stage, action.microbatch, stage_layers[stage], mixers, backward)
            if backward:
                remaining[stage] -= 1
                if remaining[stage] == 0:
                    e.grad_reduce(stage)
        e.emit(Instr(Op.END))
        programs[rank] = e.code
    signature_module = module
    signature_module.attrs["profile_mode"] = "analytic"
    signature_module.attrs["hardware"] = "cpu"
    return PlanImage(plan_signature(signature_module), plan, tasks, slots if dbo else None, programs)


def tiny_plan_bytes(**kwargs: object) -> bytes:
    return encode(tiny_plan_image(**kwargs))  # type: ignore[arg-type]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("--pp", type=int, default=2)
    parser.add_argument("--vpp", type=int, default=2)
    parser.add_argument("--ep", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--no-dbo", dest="dbo", action="store_false")
    parser.add_argument("--no-defer", dest="defer", action="store_false")
    parser.add_argument("--model", default=None, help="model name recorded in the plan (default: the tiny model's)")
    args = parser.parse_args()
    Path(args.output).write_bytes(tiny_plan_bytes(
        pp=args.pp, vpp=args.vpp, ep=args.ep, microbatches=args.microbatches, seq_len=args.seq_len,
        dbo=args.dbo, defer=args.defer, model=args.model,
    ))
