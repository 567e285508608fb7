"""Hand-made simulation inputs: uniform textbook chunks and small MoE-like chunks and pairs."""

from __future__ import annotations

from collections.abc import Sequence

from passes.pipelining.order import rank_order
from passes.simulation.program import BWD, COMM, COMPUTE, FWD, Action, Program, SimTask, SimulationInput, SlotAnnotation


def textbook_input(pp: int, vpp: int, microbatches: int, tf: float = 1.0, tb: float = 2.0) -> SimulationInput:
    """Every chunk's forward one block of ``tf / vpp``, its backward ``tb / vpp``; no communication."""
    fwd = Program("F", (SimTask("f", COMPUTE, tf / vpp, side=FWD),))
    bwd = Program("B", (SimTask("b", COMPUTE, tb / vpp, side=BWD),))
    ranks = []
    for r in range(pp):
        ranks.append(tuple(
            Action(fwd, fwd=(a.stage(r, pp), a.microbatch)) if a.direction == "fwd" else Action(bwd, bwd=(a.stage(r, pp), a.microbatch))
            for a in rank_order(pp, vpp, microbatches, r)
        ))
    return SimulationInput(pp, vpp, microbatches, tuple(ranks), decoder_layers=1)


def _side(layers: Sequence[int], side: int, scale: float, routed_base: int) -> tuple[list[SimTask], list[tuple[int, int]]]:
    """Tasks of one side over ``layers`` (indices into the program's routed layers start at ``routed_base``)."""
    tasks: list[SimTask] = []
    routed: list[tuple[int, int]] = []

    def add(name: str, stream: int, dur: float, deps: list[int], **kw: object) -> int:
        tasks.append(SimTask(name, stream, dur * scale, tuple(deps), side=side, **kw))  # type: ignore[arg-type]
        return len(tasks) - 1

    prev: list[int] = []
    for layer in list(layers) if side == FWD else list(reversed(layers)):
        ri = routed_base + len(routed)
        routed.append((side, layer))
        a2a = {"routed": ri, "fixed_us": 2.0 * scale}
        gemm_kw = {"kind": "expert_gemm", "routed": ri, "fixed_us": 1.0 * scale}
        if side == FWD:
            mixer = add(f"l{layer}.mixer.fwd", COMPUTE, 30.0, prev)
            disp = add(f"l{layer}.dispatch.fwd", COMM, 25.0, [mixer], kind="dispatch", **a2a)
            gemm = add(f"l{layer}.expert_gemm.fwd", COMPUTE, 20.0, [disp], **gemm_kw)
            prev = [add(f"l{layer}.combine.fwd", COMM, 25.0, [gemm], kind="combine", **a2a)]
        else:
            comb = add(f"l{layer}.combine.dgrad", COMM, 25.0, prev, kind="combine", **a2a)
            gemm = add(f"l{layer}.expert_gemm.dgrad", COMPUTE, 40.0, [comb], **gemm_kw)
            add(f"l{layer}.expert_gemm.wgrad", COMPUTE, 20.0, [gemm], **{**gemm_kw, "kind": "wgrad"}, deferrable=True,
                memory_bytes=1000)
            disp = add(f"l{layer}.dispatch.dgrad", COMM, 25.0, [gemm], kind="dispatch", **a2a)
            mixer = add(f"l{layer}.mixer.dgrad", COMPUTE, 60.0, [disp])
            add(f"l{layer}.mixer.wgrad", COMPUTE, 30.0, [mixer], kind="wgrad", deferrable=True, memory_bytes=2000)
            prev = [mixer]
    return tasks, routed


def moe_program(name: str, fwd_layers: Sequence[int], bwd_layers: Sequence[int], scale: float = 1.0) -> Program:
    """A chunk (or pair of chunks) of MoE-like layers; the sides' tasks interleave in list order.

    Slots are annotated before every compute task that waits on an All-to-All.
    """
    fwd, routed_f = _side(fwd_layers, FWD, scale, 0)
    bwd_local, routed_b = _side(bwd_layers, BWD, scale, len(routed_f))
    # Interleave the two sides: each is in dependency order, so any merge is too.
    merged: list[SimTask] = []
    where: dict[tuple[int, int], int] = {}
    i = j = 0
    while i < len(fwd) or j < len(bwd_local):
        for side, lst, idx in ((FWD, fwd, i), (BWD, bwd_local, j)):
            if idx < len(lst):
                t = lst[idx]
                where[(side, idx)] = len(merged)
                merged.append(SimTask(t.name, t.stream, t.duration_us, tuple(where[(side, d)] for d in t.deps), t.kind,
                                      t.side, t.routed, t.fixed_us, t.deferrable, t.memory_bytes))
        i, j = i + 1, j + 1
    slots = []
    for k, t in enumerate(merged):
        if t.stream == COMPUTE and any(merged[d].stream == COMM for d in t.deps):
            comm_dep = next(merged[d] for d in t.deps if merged[d].stream == COMM)
            slots.append(SlotAnnotation(k, f"{name}.slot{k}", 0.0, comm_dep.duration_us - comm_dep.fixed_us, 0.0, comm_dep.routed))
    return Program(name, tuple(merged), tuple(routed_f + routed_b), tuple(slots))


def moe_input(
    pp: int, vpp: int, microbatches: int, layers_per_chunk: int = 2, combined: bool = True,
    p2p_latency_us: float = 5.0, grad_reduce_us: float = 50.0, recv_predicted: bool = True,
) -> SimulationInput:
    """A combined-1F1B pipeline of MoE-like chunks: warm-up forwards, steady pairs, cool-down backwards."""
    stages = pp * vpp

    def layers(stage: int) -> list[int]:
        return list(range(stage * layers_per_chunk, (stage + 1) * layers_per_chunk))

    cache: dict[tuple[int | None, int | None], Program] = {}

    def program(f: int | None, b: int | None) -> Program:
        if (f, b) not in cache:
            cache[(f, b)] = moe_program(f"p.{f}.{b}", layers(f) if f is not None else [], layers(b) if b is not None else [])
        return cache[(f, b)]

    ranks = []
    for r in range(pp):
        acts: list[Action] = []
        items = rank_order(pp, vpp, microbatches, r, combined)
        k = 0
        while k < len(items):
            a = items[k]
            s = a.stage(r, pp)
            if a.direction == "fwd" and a.paired_with is not None:
                b = items[k + 1]
                bs = b.stage(r, pp)
                if (s, a.microbatch) != (bs, b.microbatch):  # a backward cannot overlap its own forward
                    acts.append(Action(program(s, bs), fwd=(s, a.microbatch), bwd=(bs, b.microbatch)))
                    k += 2
                    continue
            if a.direction == "fwd":
                acts.append(Action(program(s, None), fwd=(s, a.microbatch)))
            else:
                acts.append(Action(program(None, s), bwd=(s, a.microbatch)))
            k += 1
        ranks.append(tuple(acts))
    recv = tuple(tuple(10.0 for _ in acts) for acts in ranks) if recv_predicted else ()
    return SimulationInput(
        pp, vpp, microbatches, tuple(ranks), decoder_layers=stages * layers_per_chunk,
        p2p_latency_us=p2p_latency_us, p2p_bytes_per_us=1e4, activation_bytes=10**5,
        grad_reduce_us=tuple(tuple(grad_reduce_us for _ in range(vpp)) for _ in range(pp)),
        static_bytes=tuple(10**6 for _ in range(pp)), stage_activation_bytes=tuple(10**4 for _ in range(stages)),
        flops_per_iteration=1e12, peak_flops_per_rank=1e15, tokens_per_iteration=4096 * microbatches,
        recv_predicted_us=recv,
    )
