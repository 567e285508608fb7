"""Builders of valid IR modules, shared by the property tests and the size tests.

``build_module`` lays out the tasks of each layer the way a training step runs
them: a forward chain through every layer, then the backward chain in reverse
(dgrad after dgrad), each wgrad right after its dgrad. Numbers and extra
attributes come from a caller-supplied function, so the hypothesis strategies
and the deterministic large-module builder share one layout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tessera_ir.kinds import MIXER_OPS, WEIGHTED_OPS, FfnKind, LayerRole, MixerKind, Phase, TaskOp, resource_of
from tessera_ir.model import Attrs, Layer, Module, PlanEntry, PlanOp, SymbolRef, Task

# (task name, op, phase) -> core fields (flops, bytes, param_bytes, act_bytes, shapes) and extra attrs.
FieldsFn = Callable[[str, TaskOp, Phase], tuple[dict[str, Any], Attrs]]


@dataclass
class DecoderSpec:
    mixer: MixerKind
    ffn: FfnKind
    shared_expert: bool = False
    name: str | None = None
    attrs: Attrs = field(default_factory=dict)


def layer_ops(mixer: MixerKind, ffn: FfnKind, shared_expert: bool) -> list[TaskOp]:
    """Forward ops of a decoder layer, in execution order."""
    ops: list[TaskOp] = []
    if mixer in MIXER_OPS:
        ops.append(MIXER_OPS[mixer])
    if ffn is FfnKind.MOE:
        ops += [TaskOp.ROUTER, TaskOp.DISPATCH, TaskOp.EXPERT_GEMM]
        if shared_expert:
            ops.append(TaskOp.SHARED_EXPERT)
        ops.append(TaskOp.COMBINE)
    elif ffn is FfnKind.DENSE:
        ops.append(TaskOp.DENSE_MLP)
    return ops


def default_fields(name: str, op: TaskOp, phase: Phase) -> tuple[dict[str, Any], Attrs]:
    comm = op in (TaskOp.DISPATCH, TaskOp.COMBINE)
    core = {
        "flops": 0 if comm else 1_234_567_890,
        "bytes": 8_388_608,
        "param_bytes": 4_194_304 if phase is Phase.FWD and op in WEIGHTED_OPS else 0,
        "act_bytes": 2_097_152 if phase is Phase.FWD else 0,
        "shapes": [[4, 4096, 2048], [4, 4096, 2048]],
    }
    return core, {}


def build_module(
    name: str,
    decoders: list[DecoderSpec],
    *,
    embedding: bool = True,
    head: bool = True,
    fields: FieldsFn = default_fields,
    module_attrs: Attrs | None = None,
) -> Module:
    """A module that passes every verifier check (given at least one decoder or a head)."""
    module = Module(name=name, attrs=dict(module_attrs or {}))
    # (layer, ordered forward ops) in model order
    plan: list[tuple[Layer, list[TaskOp]]] = []
    if embedding:
        plan.append((Layer("embed", LayerRole.EMBEDDING, "model.embed_tokens"), [TaskOp.EMBEDDING]))
    for i, spec in enumerate(decoders):
        layer = Layer(
            spec.name or f"l{i}",
            LayerRole.DECODER,
            f"model.layers.{i}",
            mixer=spec.mixer,
            ffn=spec.ffn,
            index=i,
            attrs=dict(spec.attrs),
        )
        plan.append((layer, layer_ops(spec.mixer, spec.ffn, spec.shared_expert)))
    if head:
        plan.append((Layer("head", LayerRole.HEAD, "lm_head"), [TaskOp.LM_HEAD]))

    def add(layer: Layer, op: TaskOp, phase: Phase, deps: list[str]) -> str:
        task_name = f"{layer.name}.{op.value}.{phase.value}"
        core, extra = fields(task_name, op, phase)
        layer.tasks.append(
            Task(
                name=task_name,
                op=op,
                phase=phase,
                resource=resource_of(op),
                deps=deps,
                movable=phase is Phase.WGRAD,
                attrs=extra,
                **core,
            )
        )
        return task_name

    last: str | None = None
    for layer, ops in plan:
        for op in ops:
            last = add(layer, op, Phase.FWD, [last] if last else [])
    for layer, ops in reversed(plan):
        for op in reversed(ops):
            if op is TaskOp.EMBEDDING:
                # No data gradient below the embedding; its wgrad waits for the last dgrad.
                add(layer, op, Phase.WGRAD, [last] if last else [])
                continue
            dgrad = add(layer, op, Phase.DGRAD, [last] if last else [])
            last = dgrad
            if op in WEIGHTED_OPS:
                add(layer, op, Phase.WGRAD, [dgrad])
        # Keep tasks of one layer grouped forward-first, as the printer shows them.
        layer.tasks.sort(key=lambda t: t.phase is not Phase.FWD)
    module.layers = [layer for layer, _ in plan]
    return module


def add_pair_schedule(module: Module, name: str, fwd: list[Layer], bwd: list[Layer]) -> PlanOp:
    """A ``pair`` op of ``fwd``'s forward tasks beside ``bwd``'s backward tasks, and a valid
    ``pair_schedule`` of it: list scheduling in dependency order, each task as early as its
    dependencies (inside its side) and its stream allow. A task lasts its ``duration_us``
    when it has one, else 1.5 us; a movable task's ``deadline`` is moved to its finish
    when the schedule needs more time. Returns the schedule op."""
    sides = [
        [t for layer in fwd for t in layer.tasks if t.phase is Phase.FWD],
        [t for layer in bwd for t in layer.tasks if t.phase is not Phase.FWD],
    ]
    stream_free = {"compute": 0.0, "comm": 0.0}
    entries: list[PlanEntry] = []
    for side in sides:
        names = {t.name for t in side}
        finish: dict[str, float] = {}
        pending = list(side)
        while pending:  # repeated sweeps: a task goes once its dependencies in the side are placed
            waiting = []
            for t in pending:
                deps = [d for d in t.deps if d in names]
                if any(d not in finish for d in deps):
                    waiting.append(t)
                    continue
                cost = t.attrs.get("duration_us")
                duration = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else 1.5
                stream = t.resource.value
                start = max([stream_free[stream], *(finish[d] for d in deps)])
                finish[t.name] = stream_free[stream] = start + duration
                deadline = t.attrs.get("deadline")
                if t.movable and isinstance(deadline, (int, float)) and deadline < finish[t.name]:
                    t.attrs["deadline"] = finish[t.name]
                entries.append(PlanEntry(t.name, {"duration": duration, "start": start, "stream": stream}))
            assert len(waiting) < len(pending), "dependency cycle inside a pair side"
            pending = waiting
    pair = PlanOp("pair", f"{name}.pair", {"fwd": [SymbolRef(x.name) for x in fwd], "bwd": [SymbolRef(x.name) for x in bwd]})
    makespan = max(stream_free.values())
    sched = PlanOp("pair_schedule", name, {"makespan": makespan, "pairs": [SymbolRef(pair.name)]}, entries)
    pair.attrs["schedule"] = SymbolRef(name)
    module.plan += [pair, sched]
    return sched


def qwen3_next_like(num_layers: int = 94) -> Module:
    """A Qwen3-Next-sized module: three linear-attention layers per softmax-attention layer, all MoE.

    With 94 decoder layers it holds about 1,500 tasks (16 per layer) and prints to
    about 0.6 MB, every task carrying pass attributes and sitting in a pair schedule
    (one pair per layer: its forward beside its backward);
    125 layers give about 2,000 tasks, 165 layers about 1 MB.
    """

    def fields(name: str, op: TaskOp, phase: Phase) -> tuple[dict[str, Any], Attrs]:
        core, _ = default_fields(name, op, phase)
        extra: Attrs = {
            "duration_us": 123.456789,
            "deadline": 4567.25,
            "note": "measured on h200",
            "profile": [1, 2.5, "bf16"],
        }
        return core, extra

    decoders = [
        DecoderSpec(
            MixerKind.ATTENTION if i % 4 == 3 else MixerKind.LINEAR_ATTENTION, FfnKind.MOE, shared_expert=True
        )
        for i in range(num_layers)
    ]
    module = build_module(
        "qwen3_next",
        decoders,
        fields=fields,
        module_attrs={"dtype": "bf16", "ep": 8, "pp": 8, "vpp": 2, "seq_len": 4096, "microbatches": 16},
    )
    # Every task sits in a pair schedule: each layer's forward beside its own backward.
    for layer in module.layers:
        add_pair_schedule(module, f"sched.{layer.name}", [layer], [layer])
    for i in range(0, num_layers, 6):
        module.plan.append(
            PlanOp("candidate", f"cand{i}", {
                "stage": i // 6, "first": i, "last": min(i + 5, num_layers - 1),
                "layers": [SymbolRef(layer.name) for layer in module.decoder_layers()[i : i + 6]],
            })
        )
    return module
