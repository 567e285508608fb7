"""Runtime speed: advance() per action (C++ natively, C++ through Python, the Python reference) and plan load time and size.

For each workload the bench captures the model at its parallel settings and
lowers it to per-rank programs itself: decoder layers split evenly over the
pp x vpp virtual stages, every micro-batch's forward and backward chunk of each
virtual stage (All-to-Alls as collectives with their cross-stream waits, a DBO
slot before each wait on an All-to-All, weight gradients deferred to the
stage's gradient reduction). The instruction count per rank is what interleaved
1F1B gives; only the order differs from the pipeline pass's (forwards, then
backwards), which does not change what load and advance() cost.

    python bench/bench_runtime.py                       # qwen3_235b_a22b PP8 VPP4, 1T synthetic PP16 VPP2
    python bench/bench_runtime.py --workload qwen3_235b_a22b --pp 4 --vpp 2 --microbatches 32

Prints per workload: plan bytes (total and per rank), load time of one rank's
program by the C++ loader and by the Python reference loader, and the cost of
one advance()+complete() pair. Marks: <= 200 ns natively, <= 2 us through Python.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runtime  # noqa: E402
from runtime import reference  # noqa: E402
from runtime.bytecode import (  # noqa: E402
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
from tessera.api import capture  # noqa: E402
from tessera_ir.kinds import Phase, Resource  # noqa: E402
from tessera_ir.model import Layer, Module  # noqa: E402
from tessera_ir.parallel import ParallelConfig  # noqa: E402

WORKLOADS = ROOT / "frontend" / "workloads"
DEFAULTS = {
    "qwen3_235b_a22b": {"pp": 8, "vpp": 4, "ep": 32, "tp": 2, "microbatches": 64},
    "qwen3_next_1t_synthetic": {"pp": 16, "vpp": 2, "ep": 64, "tp": 2, "microbatches": 256},
}
MARK_NATIVE_NS = 200
MARK_PYTHON_NS = 2000


def split_stages(module: Module, stages: int) -> list[list[Layer]]:
    decoders = module.decoder_layers()
    out: list[list[Layer]] = []
    for s in range(stages):
        out.append(decoders[s * len(decoders) // stages : (s + 1) * len(decoders) // stages])
    others = [layer for layer in module.layers if layer not in decoders]
    out[0] = [layer for layer in others if layer.role.value == "embedding"] + out[0]
    out[-1] = out[-1] + [layer for layer in others if layer.role.value == "head"]
    return out


def lower_rank(rank: int, par: ParallelConfig, stages: list[list[Layer]], index: dict[str, int], slot_of: dict[int, int]) -> list[Instr]:
    code: list[Instr] = []
    last_compute: int | None = None
    deferred: list[int] = []

    def emit(ins: Instr) -> int:
        code.append(ins)
        return len(code) - 1

    def chunk(s: int, mb: int, backward: bool) -> None:
        nonlocal last_compute
        src = s + 1 if backward else s - 1
        payload = Payload.GRADIENT if backward else Payload.ACTIVATION
        if par.pp > 1 and 0 <= src < par.virtual_stages:
            recv = emit(Instr(Op.RECV, Stream.COMM, payload, mb, src % par.pp, src))
            emit(Instr(Op.WAIT, Stream.COMPUTE, a=recv))
        layers = list(reversed(stages[s])) if backward else stages[s]
        for layer in layers:
            phase_tasks = [t for t in layer.tasks if (t.phase != Phase.FWD) == backward]
            for t in (reversed(phase_tasks) if backward else phase_tasks):
                i = index[t.name]
                if t.resource == Resource.COMM:
                    if last_compute is not None:
                        emit(Instr(Op.WAIT, Stream.COMM, a=last_compute))
                    coll = emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.ALL_TO_ALL, mb, i, Group.EP))
                    emit(Instr(Op.SLOT, Stream.COMPUTE, mb=mb, a=slot_of[i], b=coll))
                    emit(Instr(Op.WAIT, Stream.COMPUTE, a=coll))
                elif t.movable:
                    deferred.append(emit(Instr(Op.DEFER, Stream.COMPUTE, mb=mb, a=i, b=0)))
                else:
                    last_compute = emit(Instr(Op.RUN, Stream.COMPUTE, mb=mb, a=i))
        dst = s - 1 if backward else s + 1
        if par.pp > 1 and 0 <= dst < par.virtual_stages and last_compute is not None:
            emit(Instr(Op.WAIT, Stream.COMM, a=last_compute))
            emit(Instr(Op.SEND, Stream.COMM, payload, mb, dst % par.pp, s))

    mine = [s for s in range(par.virtual_stages) if s % par.pp == rank]
    for mb in range(par.microbatches):
        for s in mine:
            chunk(s, mb, backward=False)
    for s in reversed(mine):
        for mb in range(par.microbatches):
            chunk(s, mb, backward=True)
        at = len(code)
        for d in deferred:
            old = code[d]
            code[d] = Instr(old.op, old.stream, old.aux, old.mb, old.a, at)
        for d in deferred:
            emit(Instr(Op.WAIT, Stream.COMM, a=d))
        deferred.clear()
        emit(Instr(Op.COLLECTIVE, Stream.COMM, Collective.GRAD_REDUCE, 0, s, Group.DP))
    emit(Instr(Op.END))
    return code


def lower(module: Module) -> PlanImage:
    par = ParallelConfig.from_attrs(module.attrs)
    stages = split_stages(module, par.virtual_stages)
    tasks: list[TaskInfo] = []
    index: dict[str, int] = {}
    slots: list[SlotInfo] = []
    slot_of: dict[int, int] = {}
    for layer in module.layers:
        for t in layer.tasks:
            index[t.name] = len(tasks)
            stream = Stream.COMM if t.resource == Resource.COMM else Stream.COMPUTE
            given = t.attrs.get("duration_us")
            duration = float(given) if isinstance(given, (int, float)) else 1.0
            tasks.append(TaskInfo(t.name, t.kind, layer.name, stream, t.movable, duration, t.act_bytes if t.movable else 0))
            if stream == Stream.COMM:
                slot_of[index[t.name]] = len(slots)
                slots.append(SlotInfo(index[t.name], 5.0, 20.0, 10.0))
    programs = {rank: lower_rank(rank, par, stages, index, slot_of) for rank in range(par.pp)}
    plan = PlanInfo(par.pp, par.vpp, par.ep, par.tp, par.microbatches, par.micro_batch_size, par.seq_len, par.dtype,
                    module.name, "analytic", "h100", 8 << 30)
    return PlanImage(hashlib.sha256(module.name.encode()).digest(), plan, tasks, slots, programs)


def best_of(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def python_ns_per_action(make_fsm, repeats: int) -> float:  # noqa: ANN001
    per_run = []
    for _ in range(repeats):
        fsm = make_fsm()
        advance, complete = fsm.advance, fsm.complete
        n = 0
        start = time.perf_counter_ns()
        while (a := advance()).kind != 5:
            complete(a.id)
            n += 1
        per_run.append((time.perf_counter_ns() - start) / n)
    return statistics.median(per_run)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", choices=sorted(DEFAULTS), action="append", help="default: all")
    for flag in ("pp", "vpp", "ep", "microbatches"):
        ap.add_argument(f"--{flag}", type=int, help=f"override the workload's {flag}")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-dbo", dest="dbo", action="store_false", help="run the FSMs without DBO")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "runtime"))
    args = ap.parse_args(argv)
    rows = []
    for name in args.workload or sorted(DEFAULTS):
        settings = dict(DEFAULTS[name])
        settings.update({k: getattr(args, k) for k in ("pp", "vpp", "ep", "microbatches") if getattr(args, k)})
        module = capture(str(WORKLOADS / f"{name}.json"), **settings)
        image = lower(module)
        encode_s = best_of(lambda image=image: encode(image), 1)
        data = encode(image)
        sizes = [16 + 8 + 16 * len(image.programs[r]) for r in range(image.plan.pp)]
        load_cpp = best_of(lambda data=data: runtime.load_plan(data, rank=0), args.repeats)
        load_py = best_of(lambda data=data: reference.load_plan(data, rank=0), max(1, args.repeats // 2))
        native = runtime.load_plan(data, rank=0)
        ref = reference.load_plan(data, rank=0)
        native_ns = runtime._core.native_ns_per_action(native, args.dbo, args.repeats)
        cpp_py_ns = python_ns_per_action(lambda native=native: runtime.FSM(native, dbo=args.dbo), args.repeats)
        ref_ns = python_ns_per_action(lambda ref=ref: reference.ReferenceFSM(ref, dbo=args.dbo), max(1, args.repeats // 2))
        row = {
            "workload": name, **{k: settings[k] for k in ("pp", "vpp", "ep", "microbatches")},
            "tasks": len(image.tasks), "instructions_rank0": len(native), "plan_bytes": len(data),
            "program_bytes_per_rank_max": max(sizes), "program_bytes_per_rank_min": min(sizes),
            "encode_ms": round(encode_s * 1e3, 2), "load_rank0_cpp_ms": round(load_cpp * 1e3, 3),
            "load_rank0_python_ms": round(load_py * 1e3, 2), "load_speedup": round(load_py / load_cpp, 1),
            "advance_native_ns": round(native_ns, 1), "advance_cpp_via_python_ns": round(cpp_py_ns, 1),
            "advance_reference_python_ns": round(ref_ns, 1), "reference_over_cpp": round(ref_ns / cpp_py_ns, 1),
            "native_mark_met": native_ns <= MARK_NATIVE_NS, "python_mark_met": cpp_py_ns <= MARK_PYTHON_NS,
        }
        rows.append(row)
        print(f"{name} PP{row['pp']} VPP{row['vpp']} EP{row['ep']} m={row['microbatches']}: {row['tasks']} tasks, "
              f"{row['instructions_rank0']} instructions on rank 0")
        print(f"  plan {len(data) / 1e6:.2f} MB; per-rank program {min(sizes) / 1e3:.0f}-{max(sizes) / 1e3:.0f} kB")
        print(f"  load rank 0: C++ {row['load_rank0_cpp_ms']} ms, Python reference {row['load_rank0_python_ms']} ms "
              f"({row['load_speedup']}x)")
        print(f"  advance()+complete(): native {native_ns:.1f} ns (mark {MARK_NATIVE_NS}), C++ through Python "
              f"{cpp_py_ns:.0f} ns (mark {MARK_PYTHON_NS}), Python reference {ref_ns:.0f} ns "
              f"({row['reference_over_cpp']}x the C++ through Python)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=2) + "\n")
    with out.with_suffix(".csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
