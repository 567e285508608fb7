"""capture(): a model source in, a Tessera IR module (layers -> typed tasks) out.

Task decomposition of decoder layer ``lI`` (names ``lI.{op}.{phase}``):

- mixer M: ``M.fwd`` after the producing layer's output tasks (``embed.embedding.fwd`` for l0);
- MoE: ``router.fwd`` (after M.fwd), ``dispatch.fwd`` (comm), ``expert_gemm.fwd``,
  ``combine.fwd`` (comm) in a chain, and ``shared_expert.fwd`` after M.fwd;
  the layer's outputs are combine.fwd and shared_expert.fwd;
- dense: ``dense_mlp.fwd`` after M.fwd;
- backward mirrors forward in reverse: ``combine.dgrad`` and ``shared_expert.dgrad``
  after the next layer's input-gradient tasks (``head.lm_head.dgrad`` for the last
  layer), then ``expert_gemm.dgrad`` and ``dispatch.dgrad``; ``router.dgrad`` after
  combine.dgrad (the gate gradient is formed in the combine's backward, from the output
  gradient and the saved expert outputs: it does not wait for the tokens' gradient to come
  back); ``M.dgrad`` after router.dgrad, dispatch.dgrad and shared_expert.dgrad (or
  dense_mlp.dgrad), whose gradients it sums;
- ``X.wgrad`` for every weighted op, movable, after the gradient it needs: for a single
  GEMM or lookup (router, LM head, embedding;
  ``kinds.WGRAD_FROM_OUTPUT_GRADIENT``) the gradient of the op's output, i.e. the tasks
  its dgrad waits for, so it may run beside or before its dgrad; for a block of several
  GEMMs (mixers, expert and shared-expert MLPs, dense MLP) its dgrad, which forms the
  gradients at the block's inner GEMM outputs.

A layer without a mixer or an FFN omits those tasks; the chain stays connected.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from frontend import costs
from frontend.errors import CaptureError, CaptureWarning, LayerKindError, ParallelMismatchError
from frontend.layer_kinds import declared_layer_types, layer_kinds_table, parse_layer_kind_flags
from frontend.recognizers import Block
from frontend.sources import load_source
from frontend.trace import LayerTrace, StackTrace, capture_stack
from tessera_ir.kinds import (
    MIXER_OPS,
    WEIGHTED_OPS,
    WGRAD_FROM_OUTPUT_GRADIENT,
    FfnKind,
    LayerRole,
    MixerKind,
    Phase,
    TaskOp,
    resource_of,
)
from tessera_ir.model import Layer, Module, Task
from tessera_ir.parallel import ParallelConfig


@dataclass
class _LayerWork:
    mixer: MixerKind = MixerKind.NONE
    ffn: FfnKind = FfnKind.NONE
    ops: dict[TaskOp, costs.Work] = field(default_factory=dict)  # compute ops in forward order
    comm_bytes: int = 0
    recompute_comm_bytes: int = 0  # All-to-All bytes the backward reruns (``moe`` recomputation)
    comm_shapes: dict[TaskOp, list[list[int]]] = field(default_factory=dict)
    mixers: list[str] = field(default_factory=list)
    num_experts: int = 0
    top_k: int = 0
    params: int = 0


def _mixer_work(block: Block, shape: list[int], p: ParallelConfig) -> costs.Work:
    """A mixer's GEMMs and core (work per context-parallel rank) and what its forward keeps for
    backward besides its normed input (the layer's norm is counted in ``_layer_work``)."""
    batch, seq, hidden = shape[0], shape[1], shape[-1]
    tokens = batch * seq // p.cp
    work = costs.Work(gemms=costs.linear_gemms(tokens, block.linears, p.tp),
                      saved=costs.inner_inputs(tokens, block.linears, hidden, p.tp))
    if block.kind in (MixerKind.ATTENTION, MixerKind.SLIDING_ATTENTION, MixerKind.MLA):
        core = costs.attention_core(batch, seq, block.heads, block.head_dim_qk, block.head_dim_v, block.window, p.tp,
                                    block.kv_heads or block.heads, p.cp, block.attention_chunk)
        heads = -(-block.heads // p.tp)
        if block.kind is MixerKind.MLA and p.recomputes("mla_up_proj"):
            # Q, K, V come back from the latents: only the softmax statistics stay; the
            # backward reruns the up-projections (the GEMMs between latent and heads).
            core.saved = tokens * heads * costs.FP32_ELEMENTS
            ups = [g for g, (fan_in, out) in zip(work.gemms, block.linears) if hidden not in (fan_in, out)]
            work.recompute_flops += sum(g.flops for g in ups)
            work.recompute_elements += sum(g.elements for g in ups)
        if p.recomputes("core_attn"):
            # The attention output (the output projection's input) and statistics are recomputed.
            core.saved -= tokens * heads * costs.FP32_ELEMENTS
            work.saved -= min(work.saved, tokens * heads * block.head_dim_v)
            core.rerun_in_backward()
        work = work.merge(core)
    elif block.kind is MixerKind.LINEAR_ATTENTION:
        if block.core == "delta_rule":
            work = work.merge(costs.delta_rule_core(batch, seq, block.v_heads, block.head_dim_qk, block.head_dim_v,
                                                    block.chunk, p.tp, p.cp))
        elif block.core == "linear":
            work = work.merge(costs.linear_attention_core(batch, seq, block.v_heads, block.head_dim_qk,
                                                          block.head_dim_v, block.chunk, p.tp, p.cp))
        # core "conv": a short-conv mixer, whose only sequence mixing is the convolution below
        work = work.merge(costs.depthwise_conv_core(tokens, block.conv_channels, block.conv_kernel, p.tp))
    elif block.kind is MixerKind.SSM:
        work = work.merge(costs.selective_scan_core(tokens, block.d_inner, block.d_state, p.tp))
        work = work.merge(costs.depthwise_conv_core(tokens, block.conv_channels, block.conv_kernel, p.tp))
    work.weight_elements = -(-block.params // p.tp)
    work.shapes = [list(shape), list(shape)]
    return work


def _layer_work(trace: LayerTrace, p: ParallelConfig) -> _LayerWork:
    lw = _LayerWork(params=sum(q.numel() for q in trace.module.parameters()))
    counted = 0
    recompute_moe = p.recomputes("moe")
    for call in trace.blocks:
        block, shape = call.block, call.input_shape
        tokens = shape[0] * shape[1] // p.cp
        hidden = shape[-1]
        if block.role == "mixer":
            assert isinstance(block.kind, MixerKind)
            work = _mixer_work(block, shape, p)
            if lw.mixer is MixerKind.NONE:
                lw.mixer = block.kind
                lw.ops[MIXER_OPS[block.kind]] = work
            else:
                # A parallel hybrid (attention beside an SSM in one layer): one mixer task does both.
                op = MIXER_OPS[lw.mixer]
                lw.ops[op] = lw.ops[op].merge(work)
            lw.mixers.append(block.kind.value)
        elif block.role == "ffn" and lw.ffn is not FfnKind.NONE:
            raise CaptureError(f"'{trace.path}' has a second FFN block '{block.path}'; Tessera layers hold one FFN")
        elif block.kind is FfnKind.MOE:
            if block.top_k <= 0:
                raise CaptureError(
                    f"MoE block '{block.path}' routes to {block.num_experts} experts but sets no top-k (no top_k or "
                    f"num_experts_per_tok on the block, its router or the config); set num_experts_per_tok")
            lw.ffn = FfnKind.MOE
            lw.num_experts, lw.top_k = block.num_experts, block.top_k
            t_r = costs.moe_tokens_per_rank(tokens, p.tp)
            routed = t_r * block.top_k
            # A router of several matrices (a projection and a small MLP) multiplies by each of them.
            router_gemms = [costs.Gemm(t_r, n_out, n_in) for n_in, n_out in block.router_linears] or \
                [costs.Gemm(t_r, block.num_experts, block.hidden)]
            router = costs.Work(gemms=router_gemms,
                                weight_elements=block.router_params, saved=t_r * block.num_experts * costs.FP32_ELEMENTS,
                                shapes=[[t_r, hidden], [t_r, block.num_experts]])
            experts = costs.expert_work(t_r, block.top_k, block.expert_matrices, block.expert_params,
                                        block.num_experts, p.ep, hidden, p.recomputes("moe_act"))
            experts.shapes = [[routed, hidden], [routed, hidden]]
            lw.ops[TaskOp.ROUTER] = router
            lw.ops[TaskOp.EXPERT_GEMM] = experts
            moe_parts = [router, experts]
            if block.shared_params:
                shared = costs.Work(
                    gemms=costs.linear_gemms(tokens, block.shared_linears, p.tp),
                    weight_elements=-(-block.shared_params // p.tp), shapes=[list(shape), list(shape)],
                    saved=costs.mlp_saved(tokens, block.shared_linears, hidden, p.tp))
                lw.ops[TaskOp.SHARED_EXPERT] = shared
                if p.recomputes("shared_experts") and not recompute_moe:
                    shared.saved = 0
                    shared.rerun_in_backward()
                moe_parts.append(shared)
            lw.comm_bytes = costs.all_to_all_bytes(t_r, hidden, block.top_k, p.dtype_bytes, p.ep)
            lw.comm_shapes = {TaskOp.DISPATCH: [[t_r, hidden], [routed, hidden]],
                              TaskOp.COMBINE: [[routed, hidden], [t_r, hidden]]}
            if recompute_moe:
                # Only the block's input stays; the backward reruns the router, both All-to-Alls
                # and the experts before its own work (the rerun All-to-Alls ride on combine.dgrad).
                for part in moe_parts:
                    part.saved = 0
                    part.rerun_in_backward()
                lw.recompute_comm_bytes = 2 * lw.comm_bytes
        elif block.kind is FfnKind.DENSE:
            lw.ffn = FfnKind.DENSE
            dense = costs.Work(gemms=costs.linear_gemms(tokens, block.linears, p.tp),
                               weight_elements=-(-block.params // p.tp), shapes=[list(shape), list(shape)],
                               saved=costs.mlp_saved(tokens, block.linears, hidden, p.tp))
            if p.recomputes("mlp"):
                dense.saved = 0
                dense.rerun_in_backward()
            lw.ops[TaskOp.DENSE_MLP] = dense
        counted += block.params
    # Norms and other small per-layer weights ride with the layer's first task.
    rest = lw.params - counted
    if rest and lw.ops:
        first = next(iter(lw.ops.values()))
        first.weight_elements += rest
    # The two norms of a decoder layer keep their input (and output, unless recomputed): the
    # mixer's with the mixer task, the FFN's with its first task.
    tokens, hidden = trace.input_shape[0] * trace.input_shape[1] // p.cp, trace.input_shape[-1]
    norm = costs.norm_saved(tokens, hidden, p.tp, p.recomputes("layernorm"))
    firsts = [MIXER_OPS[lw.mixer]] if lw.mixer is not MixerKind.NONE else []
    firsts += [op for op in (TaskOp.ROUTER, TaskOp.DENSE_MLP) if op in lw.ops][:1]
    for op in firsts:
        lw.ops[op].saved += norm
    return lw


def _task(name: str, op: TaskOp, phase: Phase, deps: list[str], **kw: Any) -> Task:
    return Task(name=name, op=op, phase=phase, resource=resource_of(op), deps=list(deps),
                movable=phase is Phase.WGRAD, **kw)


def _compute(name: str, op: TaskOp, phase: Phase, deps: list[str], work: costs.Work, d: int) -> Task:
    """A compute task of ``work``: its core share (``core_flops``, ``core_bytes``) and, for grouped
    expert GEMMs, the rows each local expert receives (``rows_per_expert``) as attributes."""
    attrs: dict[str, Any] = {}
    if work.rows_per_expert:
        attrs["rows_per_expert"] = work.rows_per_expert
    if phase is Phase.FWD:
        if work.core_flops or work.core_elements:
            attrs.update(core_flops=work.core_flops, core_bytes=work.core_elements * d)
        return _task(name, op, phase, deps, flops=work.fwd_flops, bytes=work.fwd_bytes(d),
                     param_bytes=work.weight_elements * d, act_bytes=work.act_bytes(d), shapes=work.shapes, attrs=attrs)
    if phase is Phase.DGRAD:
        if work.dgrad_core_flops or work.core_elements:
            attrs.update(core_flops=work.dgrad_core_flops, core_bytes=2 * work.core_elements * d)
        return _task(name, op, phase, deps, flops=work.dgrad_flops, bytes=work.dgrad_bytes(d), shapes=work.shapes,
                     attrs=attrs)
    return _task(name, op, phase, deps, flops=work.wgrad_flops, bytes=work.wgrad_bytes(d), shapes=work.shapes,
                 attrs=attrs)


class _Emitter:
    def __init__(self, p: ParallelConfig):
        self.p = p
        self.d = p.dtype_bytes

    def forward(self, layer: Layer, lw: _LayerWork, inputs: list[str]) -> list[str]:
        """Append forward tasks; return the layer's output tasks."""
        n = layer.name
        after_mixer = inputs
        if lw.mixer is not MixerKind.NONE:
            op = MIXER_OPS[lw.mixer]
            layer.tasks.append(_compute(f"{n}.{op.value}.fwd", op, Phase.FWD, inputs, lw.ops[op], self.d))
            after_mixer = [f"{n}.{op.value}.fwd"]
        if lw.ffn is FfnKind.MOE:
            chain = [TaskOp.ROUTER, TaskOp.DISPATCH, TaskOp.EXPERT_GEMM, TaskOp.COMBINE]
            deps = after_mixer
            for op in chain:
                name = f"{n}.{op.value}.fwd"
                if op in lw.ops:
                    layer.tasks.append(_compute(name, op, Phase.FWD, deps, lw.ops[op], self.d))
                else:
                    layer.tasks.append(_task(name, op, Phase.FWD, deps, bytes=lw.comm_bytes,
                                             shapes=lw.comm_shapes[op], attrs={"top_k": lw.top_k}))
                deps = [name]
            outputs = [f"{n}.combine.fwd"]
            if TaskOp.SHARED_EXPERT in lw.ops:
                name = f"{n}.shared_expert.fwd"
                layer.tasks.append(_compute(name, TaskOp.SHARED_EXPERT, Phase.FWD, after_mixer,
                                            lw.ops[TaskOp.SHARED_EXPERT], self.d))
                outputs.append(name)
            return outputs
        if lw.ffn is FfnKind.DENSE:
            name = f"{n}.dense_mlp.fwd"
            layer.tasks.append(_compute(name, TaskOp.DENSE_MLP, Phase.FWD, after_mixer, lw.ops[TaskOp.DENSE_MLP],
                                        self.d))
            return [name]
        return after_mixer

    def _grad(self, layer: Layer, op: TaskOp, work: costs.Work, deps: list[str]) -> str:
        name = f"{layer.name}.{op.value}.dgrad"
        layer.tasks.append(_compute(name, op, Phase.DGRAD, deps, work, self.d))
        if op in WEIGHTED_OPS:
            needs = deps if op in WGRAD_FROM_OUTPUT_GRADIENT else [name]
            layer.tasks.append(_compute(f"{layer.name}.{op.value}.wgrad", op, Phase.WGRAD, needs, work, self.d))
        return name

    def backward(self, layer: Layer, lw: _LayerWork, grad_in: list[str]) -> list[str]:
        """Append backward tasks; return the tasks that produce the gradient of the layer's input."""
        n = layer.name
        before_mixer = grad_in
        if lw.ffn is FfnKind.MOE:
            combine = f"{n}.combine.dgrad"
            layer.tasks.append(_task(combine, TaskOp.COMBINE, Phase.DGRAD, grad_in,
                                     bytes=lw.comm_bytes + lw.recompute_comm_bytes,
                                     shapes=lw.comm_shapes[TaskOp.COMBINE], attrs={"top_k": lw.top_k}))
            shared = []
            if TaskOp.SHARED_EXPERT in lw.ops:
                shared = [self._grad(layer, TaskOp.SHARED_EXPERT, lw.ops[TaskOp.SHARED_EXPERT], grad_in)]
            experts = self._grad(layer, TaskOp.EXPERT_GEMM, lw.ops[TaskOp.EXPERT_GEMM], [combine])
            dispatch = f"{n}.dispatch.dgrad"
            layer.tasks.append(_task(dispatch, TaskOp.DISPATCH, Phase.DGRAD, [experts], bytes=lw.comm_bytes,
                                     shapes=lw.comm_shapes[TaskOp.DISPATCH], attrs={"top_k": lw.top_k}))
            router = self._grad(layer, TaskOp.ROUTER, lw.ops[TaskOp.ROUTER], [combine])
            before_mixer = [router, dispatch] + shared
        elif lw.ffn is FfnKind.DENSE:
            before_mixer = [self._grad(layer, TaskOp.DENSE_MLP, lw.ops[TaskOp.DENSE_MLP], grad_in)]
        if lw.mixer is not MixerKind.NONE:
            op = MIXER_OPS[lw.mixer]
            return [self._grad(layer, op, lw.ops[op], before_mixer)]
        return before_mixer


def _symbol(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]", "_", name) or "model"


def _validate(p: ParallelConfig, traces: list[LayerTrace]) -> None:
    problem = p.stages_problem(len(traces))
    if problem is not None:
        raise ParallelMismatchError(problem)
    for trace in traces:
        for call in trace.blocks:
            block = call.block
            if block.kind is FfnKind.MOE and block.num_experts % p.ep:
                raise ParallelMismatchError(
                    f"--ep {p.ep} does not divide the {block.num_experts} experts of '{block.path}'; choose an --ep "
                    f"that divides {block.num_experts}")
            for what, heads in (("attention heads", block.heads), ("key heads", block.k_heads),
                                ("key/value heads", block.kv_heads)):
                if block.role == "mixer" and heads and heads % p.tp:
                    raise ParallelMismatchError(
                        f"--tp {p.tp} does not divide the {heads} {what} of '{block.path}'; choose a --tp that "
                        f"divides {heads}")


def _parallel(settings: dict[str, Any], parallel: ParallelConfig | None, overrides: dict[str, Any] | None,
              where: str) -> ParallelConfig:
    known = set(ParallelConfig().to_attrs())
    unknown = sorted(set(settings) - known) + sorted(set(overrides or {}) - known)
    if unknown:
        raise ParallelMismatchError(f"{where}: unknown parallel setting(s) {', '.join(unknown)}; "
                                    f"use {', '.join(sorted(known))}")
    base = parallel if parallel is not None else ParallelConfig().replace(**settings)
    return base.replace(**(overrides or {}))


def _mixer_blocks(trace: LayerTrace) -> list[Block]:
    return [call.block for call in trace.blocks if call.block.role == "mixer"]


def _check_layer_kinds(kinds: dict[int, MixerKind], traces: list[LayerTrace]) -> None:
    for index in sorted(kinds):
        if index >= len(traces):
            raise LayerKindError(f"layer kind set for layer {index}, but the model has {len(traces)} decoder layers "
                                 f"(0-{len(traces) - 1})")
        mixers = _mixer_blocks(traces[index])
        if len(mixers) != 1:
            what = "no mixer block" if not mixers else f"{len(mixers)} mixer blocks ({', '.join(b.path for b in mixers)})"
            raise LayerKindError(f"layer kind set for layer {index} ('{traces[index].path}'), which has {what}; "
                                 f"a layer kind applies to a layer with exactly one mixer")


def _kind_warnings(traces: list[LayerTrace], config: Any, kinds: dict[int, MixerKind]) -> dict[int, list[str]]:
    """Per layer: the blocks' own warnings, and where the config's declared layer type disagrees with the kind."""
    declared = declared_layer_types(config, len(traces))
    notes: dict[int, list[str]] = {}
    for trace, stated in zip(traces, declared):
        mixers = _mixer_blocks(trace)
        found = [b.warning for b in mixers if b.warning]
        if stated is not None and trace.index not in kinds and len(mixers) <= 1:
            kind = mixers[0].kind if mixers and isinstance(mixers[0].kind, MixerKind) else MixerKind.NONE
            if kind not in stated.kinds:
                suggestion = stated.suggestion()
                if mixers:
                    block = mixers[0]
                    how = "what it does" if block.source == "behaviour" else f"its {block.source}"
                    window = f", with a {block.window}-token window from its settings" if block.window else ""
                    said = (f"'{block.path}' ({type(block.module).__name__}) {block.evidence}{window}, so it is "
                            f"{kind.value} (from {how})")
                else:
                    said = "the layer has no mixer block"
                fix = (f"; if the config is right, set --layer-kind {trace.index}={suggestion.value}"
                       if mixers and suggestion is not MixerKind.NONE else "")
                found.append(f"layer {trace.index}: the config declares {stated.field} = '{stated.text}', but {said}; "
                             f"counted as {kind.value}{fix}")
        if found:
            notes[trace.index] = found
    return notes


def _ranges(indexes: list[int]) -> str:
    parts: list[str] = []
    for i in indexes:
        if parts and parts[-1].split("-")[-1] == str(i - 1):
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ", ".join(parts)


def _grouped(notes: dict[int, list[str]]) -> list[str]:
    """The layers' warnings, those that differ only in the layer index said once for all their layers."""
    groups: dict[str, list[int]] = {}
    originals: dict[str, str] = {}
    for index in sorted(notes):
        for note in notes[index]:
            template = re.sub(rf"^layer {index}:", "layer N:", note)
            for pattern, repl in ((rf"\.{index}\.", ".N."), (rf"--layer-kind {index}=", "--layer-kind N="),
                                  (rf"\[{index}\]", "[N]")):
                template = re.sub(pattern, repl, template)
            groups.setdefault(template, []).append(index)
            originals.setdefault(template, note)
    return [originals[t] if len(layers) == 1 else f"layers {_ranges(layers)} ({len(layers)} layers): "
            + t.removeprefix("layer N: ") for t, layers in groups.items()]


def _layer_kind_overrides(loaded_kinds: dict[int, MixerKind],
                          layer_kinds: Mapping[int, MixerKind | str] | Iterable[str] | None) -> dict[int, MixerKind]:
    kinds = dict(loaded_kinds)
    if isinstance(layer_kinds, Mapping):
        kinds.update(layer_kinds_table(layer_kinds, "layer_kinds"))
    elif layer_kinds is not None:
        kinds.update(parse_layer_kind_flags(layer_kinds))
    return kinds


def capture(source: str | nn.Module, parallel: ParallelConfig | None = None, overrides: dict | None = None,
            name: str | None = None,
            layer_kinds: Mapping[int, MixerKind | str] | Iterable[str] | None = None,
            suggested: dict[str, Any] | None = None) -> Module:
    """Capture ``source`` into a Tessera IR module.

    Parallel settings, lowest precedence first: ParallelConfig defaults, the
    suggested settings of a matching shipped workload, ``PARALLEL`` in a
    model.py, then ``overrides`` (None values ignored). An explicit
    ``parallel`` replaces the first three.

    ``layer_kinds`` sets the mixer kind of layers, over what recognition finds and
    over ``LAYER_KINDS`` in a model.py: ``{3: "linear_attention"}`` or command-line
    style strings ``["3=linear_attention", "0-2=ssm"]``. ``suggested``, when given, receives the
    source's own parallel settings (a shipped workload's, a model.py's ``PARALLEL``), the layer
    below ``overrides``. Where a kind is a best guess,
    or the config's declared layer types disagree with what a block does, a
    ``CaptureWarning`` says so and the layer's IR attributes record it.
    """
    loaded = load_source(source)
    if suggested is not None:
        suggested.update(loaded.parallel)
    p = _parallel(loaded.parallel, parallel, overrides, loaded.name)
    kinds = _layer_kind_overrides(loaded.layer_kinds, layer_kinds)
    stack = capture_stack(loaded.model, p.micro_batch_size, p.seq_len, loaded.config, layer_kinds=kinds)
    _check_layer_kinds(kinds, stack.layers)
    notes = _kind_warnings(stack.layers, loaded.config, kinds)
    for note in _grouped(notes):
        warnings.warn(note, CaptureWarning, stacklevel=2)
    _validate(p, stack.layers)
    works = [_layer_work(t, p) for t in stack.layers]

    d = p.dtype_bytes
    tokens = p.tokens // p.cp  # of a micro-batch on one context-parallel rank
    hidden = stack.layers[0].input_shape[-1]
    embed_module = stack.embed
    vocab = int(getattr(embed_module, "num_embeddings", None) or embed_module.get_parameter("weight").shape[0])
    embed_params = sum(q.numel() for q in embed_module.parameters())

    module = Module(_symbol(name or loaded.name))
    model_params = sum(q.numel() for q in loaded.model.parameters())
    attrs: dict[str, Any] = {"model": name or loaded.name, "parameters": model_params, "hidden_size": hidden}
    attrs.update(p.to_attrs())
    moe = [w for w in works if w.ffn is FfnKind.MOE]
    if moe:
        attrs["num_experts"] = max(w.num_experts for w in moe)
        attrs["top_k"] = max(w.top_k for w in moe)
    module.attrs = attrs

    embed = Layer("embed", LayerRole.EMBEDDING, stack.embed_path)
    e_work = costs.embedding_work(tokens, hidden)
    embed.tasks.append(_task("embed.embedding.fwd", TaskOp.EMBEDDING, Phase.FWD, [], flops=0,
                             bytes=e_work.fwd_bytes(d), param_bytes=-(-embed_params // p.tp) * d,
                             shapes=[[p.micro_batch_size, p.seq_len], [p.micro_batch_size, p.seq_len, hidden]]))
    module.layers.append(embed)

    emitter = _Emitter(p)
    outputs: dict[str, list[str]] = {"embed": ["embed.embedding.fwd"]}
    decoder: list[Layer] = []
    for trace, lw in zip(stack.layers, works):
        layer = Layer(f"l{trace.index}", LayerRole.DECODER, trace.path, lw.mixer, lw.ffn, trace.index,
                      attrs={"parameters": lw.params})
        if len(lw.mixers) > 1:
            layer.attrs["mixers"] = list(lw.mixers)  # type: ignore[assignment]
        chunks = [b.attention_chunk for b in _mixer_blocks(trace) if b.attention_chunk]
        if chunks:
            layer.attrs["attention_chunk"] = max(chunks)  # chunked attention: its FLOPs are the chunks'
        sources = {b.source for b in _mixer_blocks(trace)} & {"override", "structure"}
        if sources:
            layer.attrs["mixer_source"] = sorted(sources)[0]
        if trace.index in notes:
            layer.attrs["mixer_warnings"] = list(notes[trace.index])  # type: ignore[assignment]
        outputs[layer.name] = emitter.forward(layer, lw, outputs[trace.producer])
        decoder.append(layer)
    module.layers.extend(decoder)

    head_path, head_params = _head(loaded.model, stack, vocab)
    head = Layer("head", LayerRole.HEAD, head_path)
    h_work = costs.head_work(tokens, hidden, vocab, p.tp, p.recomputes("layernorm"))
    h_work.weight_elements = -(-head_params // p.tp)
    h_work.shapes = [[p.micro_batch_size, p.seq_len, hidden], [p.micro_batch_size, p.seq_len, vocab]]
    last = decoder[-1].name if decoder else "embed"
    head.tasks.append(_compute("head.lm_head.fwd", TaskOp.LM_HEAD, Phase.FWD, outputs[last], h_work, d))
    head.tasks.append(_compute("head.lm_head.dgrad", TaskOp.LM_HEAD, Phase.DGRAD, ["head.lm_head.fwd"], h_work, d))
    head.tasks.append(_compute("head.lm_head.wgrad", TaskOp.LM_HEAD, Phase.WGRAD, ["head.lm_head.fwd"], h_work, d))

    # Backward, last layer first: each layer's output gradient comes from its consumer's input gradient.
    grad_of: dict[str, list[str]] = {last: ["head.lm_head.dgrad"]} if decoder else {}
    consumers = {t.producer: f"l{t.index}" for t in stack.layers}
    input_grads: dict[str, list[str]] = {}
    for layer, lw in reversed(list(zip(decoder, works))):
        grad_in = input_grads[consumers[layer.name]] if layer.name in consumers else grad_of[layer.name]
        input_grads[layer.name] = emitter.backward(layer, lw, grad_in)
    first_grad = input_grads[consumers["embed"]] if decoder else ["head.lm_head.dgrad"]
    embed.tasks.append(_task("embed.embedding.wgrad", TaskOp.EMBEDDING, Phase.WGRAD, first_grad,
                             flops=tokens * hidden, bytes=e_work.fwd_bytes(d),
                             shapes=embed.tasks[0].shapes))
    module.layers.append(head)
    return module


def _head(model: nn.Module, stack: StackTrace, vocab: int) -> tuple[str, int]:
    """The output projection's path and the head's weights: the final norm, every other weight of the
    stack's owner outside the embedding and the layers (a final hyper-connection mix, say), and the
    projection (also when it shares the embedding's weight: the last pipeline stage holds a copy)."""
    inside = {id(q) for q in stack.embed.parameters()}
    inside.update(id(q) for t in stack.layers for q in t.module.parameters())
    owner = stack.owner if stack.owner is not None else stack.norm
    rest = {id(q): q.numel() for q in (owner.parameters() if owner is not None else []) if id(q) not in inside}
    get_out = getattr(model, "get_output_embeddings", None)
    projection = get_out() if callable(get_out) else None
    if projection is None:  # a vocabulary-wide Linear beside the stack or at the top, never inside another tower
        near = list(model.children()) + (list(owner.children()) if owner is not None else [])
        candidates = [m for m in near if isinstance(m, nn.Linear) and m.out_features == vocab]
        projection = candidates[-1] if candidates else None
    if projection is None:
        # A bare language model (transformers builds some types only as ``*TextModel``): the plan
        # still trains it with a vocabulary projection, whose compute the head counts, so it holds
        # that projection's weights too, as the causal LM of the same config would.
        hidden = stack.layers[0].input_shape[-1] if stack.layers else 0
        warnings.warn(
            f"{type(model).__name__} has no output projection (transformers built the bare model); the head "
            f"is planned with the [{vocab}, {hidden}] vocabulary projection a causal LM of this config adds",
            CaptureWarning, stacklevel=3)
        return stack.norm_path or "", sum(rest.values()) + vocab * hidden
    path = next((n for n, m in model.named_modules() if m is projection), "")
    for q in projection.parameters():
        rest[id(q)] = q.numel()
    return path, sum(rest.values())
