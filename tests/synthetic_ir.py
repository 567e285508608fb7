"""Small hand-built IR modules for pass tests that must not depend on the frontend.

``synthetic_module`` wires decoder layers exactly as the frontend does
(``{layer}.{op}.{phase}`` names, forward chain, mirrored backward, movable
wgrad), with FLOPs and bytes chosen by the caller, so scheduling and
partitioning tests control their inputs precisely.
"""

from __future__ import annotations

from collections.abc import Sequence

from tessera_ir.kinds import MIXER_OPS, WEIGHTED_OPS, FfnKind, LayerRole, MixerKind, Phase, TaskOp, resource_of
from tessera_ir.model import Layer, Module, Task
from tessera_ir.parallel import ParallelConfig


def _task(layer: str, op: TaskOp, phase: Phase, deps: list[str], flops: int, nbytes: int, param_bytes: int = 0) -> Task:
    return Task(
        name=f"{layer}.{op.value}.{phase.value}",
        op=op,
        phase=phase,
        resource=resource_of(op),
        deps=deps,
        flops=flops if resource_of(op).value == "compute" else 0,
        bytes=nbytes,
        param_bytes=param_bytes if phase is Phase.FWD else 0,
        movable=phase is Phase.WGRAD,
    )


def synthetic_module(
    kinds: Sequence[tuple[str, str]],
    gemm_flops: int = 10**12,
    mixer_flops: int = 10**12,
    a2a_bytes: int = 10**8,
    param_bytes: int = 10**8,
    shared_expert: bool = True,
    parallel: ParallelConfig | None = None,
    name: str = "synthetic",
) -> Module:
    """A module with embedding, one decoder layer per ``(mixer, ffn)`` pair, and a head."""
    parallel = parallel or ParallelConfig()
    module = Module(name, attrs={"model": name, "parameters": 0, **parallel.to_attrs()})
    embed = Layer("embed", LayerRole.EMBEDDING, "model.embed_tokens")
    embed.tasks.append(_task("embed", TaskOp.EMBEDDING, Phase.FWD, [], 0, a2a_bytes // 10, param_bytes))
    module.layers.append(embed)

    outputs = ["embed.embedding.fwd"]
    decoder: list[tuple[Layer, list[str], list[str]]] = []  # layer, fwd tasks in order, input-grad task names
    for i, (mixer_name, ffn_name) in enumerate(kinds):
        mixer, ffn = MixerKind(mixer_name), FfnKind(ffn_name)
        lname = f"l{i}"
        layer = Layer(lname, LayerRole.DECODER, f"model.layers.{i}", mixer=mixer, ffn=ffn, index=i)
        fwd: list[Task] = []
        head = outputs
        if mixer is not MixerKind.NONE:
            m = _task(lname, MIXER_OPS[mixer], Phase.FWD, list(head), mixer_flops, a2a_bytes // 4, param_bytes)
            fwd.append(m)
            head = [m.name]
        if ffn is FfnKind.MOE:
            router = _task(lname, TaskOp.ROUTER, Phase.FWD, list(head), gemm_flops // 100, a2a_bytes // 20, param_bytes // 100)
            dispatch = _task(lname, TaskOp.DISPATCH, Phase.FWD, [router.name], 0, a2a_bytes)
            experts = _task(lname, TaskOp.EXPERT_GEMM, Phase.FWD, [dispatch.name], gemm_flops, a2a_bytes, param_bytes * 4)
            combine = _task(lname, TaskOp.COMBINE, Phase.FWD, [experts.name], 0, a2a_bytes)
            fwd += [router, dispatch, experts, combine]
            outputs = [combine.name]
            if shared_expert:
                shared = _task(lname, TaskOp.SHARED_EXPERT, Phase.FWD, list(head), gemm_flops // 8, a2a_bytes // 8, param_bytes // 4)
                fwd.append(shared)
                outputs.append(shared.name)
        elif ffn is FfnKind.DENSE:
            dense = _task(lname, TaskOp.DENSE_MLP, Phase.FWD, list(head), gemm_flops, a2a_bytes // 4, param_bytes * 2)
            fwd.append(dense)
            outputs = [dense.name]
        else:
            outputs = list(head)
        layer.tasks.extend(fwd)
        decoder.append((layer, [t.name for t in fwd], []))
        module.layers.append(layer)

    head_layer = Layer("head", LayerRole.HEAD, "lm_head")
    lm_fwd = _task("head", TaskOp.LM_HEAD, Phase.FWD, list(outputs), gemm_flops // 2, a2a_bytes // 4, param_bytes)
    lm_dgrad = _task("head", TaskOp.LM_HEAD, Phase.DGRAD, [lm_fwd.name], gemm_flops // 2, a2a_bytes // 4)
    lm_wgrad = _task("head", TaskOp.LM_HEAD, Phase.WGRAD, [lm_dgrad.name], gemm_flops // 2, a2a_bytes // 4)
    head_layer.tasks += [lm_fwd, lm_dgrad, lm_wgrad]

    # Backward, last layer first: each layer's backward starts from the gradient its
    # successor produced for the layer's output.
    grad_in = [lm_dgrad.name]
    for layer, _, _ in reversed(decoder):
        by_op = {t.op: t for t in layer.tasks}
        bwd: list[Task] = []
        mixer_deps: list[str] = []
        if TaskOp.COMBINE in by_op:
            combine = _task(layer.name, TaskOp.COMBINE, Phase.DGRAD, list(grad_in), 0, by_op[TaskOp.COMBINE].bytes)
            experts = _task(layer.name, TaskOp.EXPERT_GEMM, Phase.DGRAD, [combine.name], by_op[TaskOp.EXPERT_GEMM].flops, by_op[TaskOp.EXPERT_GEMM].bytes)
            dispatch = _task(layer.name, TaskOp.DISPATCH, Phase.DGRAD, [experts.name], 0, by_op[TaskOp.DISPATCH].bytes)
            router = _task(layer.name, TaskOp.ROUTER, Phase.DGRAD, [dispatch.name], by_op[TaskOp.ROUTER].flops, by_op[TaskOp.ROUTER].bytes)
            bwd += [combine, experts, dispatch, router]
            mixer_deps.append(router.name)
            if TaskOp.SHARED_EXPERT in by_op:
                shared = _task(layer.name, TaskOp.SHARED_EXPERT, Phase.DGRAD, list(grad_in), by_op[TaskOp.SHARED_EXPERT].flops, by_op[TaskOp.SHARED_EXPERT].bytes)
                bwd.append(shared)
                mixer_deps.append(shared.name)
        elif TaskOp.DENSE_MLP in by_op:
            dense = _task(layer.name, TaskOp.DENSE_MLP, Phase.DGRAD, list(grad_in), by_op[TaskOp.DENSE_MLP].flops, by_op[TaskOp.DENSE_MLP].bytes)
            bwd.append(dense)
            mixer_deps.append(dense.name)
        else:
            mixer_deps = list(grad_in)
        if layer.mixer is not MixerKind.NONE:
            op = MIXER_OPS[layer.mixer]
            mixer_dgrad = _task(layer.name, op, Phase.DGRAD, mixer_deps, by_op[op].flops, by_op[op].bytes)
            bwd.append(mixer_dgrad)
            grad_in = [mixer_dgrad.name]
        else:
            grad_in = mixer_deps
        wgrads = [
            _task(layer.name, t.op, Phase.WGRAD, [f"{layer.name}.{t.op.value}.dgrad"], t.flops, t.bytes)
            for t in bwd
            if t.op in WEIGHTED_OPS
        ]
        layer.tasks.extend(bwd + wgrads)
    embed.tasks.append(_task("embed", TaskOp.EMBEDDING, Phase.WGRAD, list(grad_in), 0, a2a_bytes // 10))
    module.layers.append(head_layer)
    return module


QWEN3_NEXT_PATTERN = [("linear_attention", "moe")] * 3 + [("attention", "moe")]
