"""What a mixer block is: decided by what it does, sized by what it holds.

The built-in recognisers match names and parameter shapes; a q/k/v/o block
may just as well run a lightning or delta-rule recurrence as a softmax. So
every mixer (and every weighted block no recogniser knows) is also run once
on meta tensors (``frontend.behaviour``), and its kind follows from that run:

=================================================  ==========================================
what the run shows                                 kind
=================================================  ==========================================
softmax over the key axis, or an SDPA/flex/flash   ``mla`` when keys and values come out of a
call                                               latent up-projection (or the MLA recogniser
                                                   matched), ``sliding_attention`` with a
                                                   window, else ``attention``
recurrent state, prefix sum along the sequence,    ``ssm`` when the SSM recogniser matched,
softmax-free query-key scores, short causal conv   else ``linear_attention``
nothing conclusive (the run failed on meta early)  the recogniser's answer, with a warning;
                                                   an error when no recogniser matched
=================================================  ==========================================

A recogniser registered by the user is trusted (a warning says when the run
contradicts it), and an explicit override (``--layer-kind``, ``LAYER_KINDS``)
wins over everything. Sizes (heads, head dims, state, chunk, conv) come from
the recogniser when it agrees with the kind, else from the shapes the run
observed, else from the module's and config's attributes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from torch import nn

from frontend.behaviour import Behaviour
from frontend.errors import LayerKindError, UnrecognisedLayerError
from frontend.recognizers import Block, attention_chunk, attention_window, first_attr, linear_shapes, param_count
from tessera_ir.kinds import MixerKind

SOFTMAX_KINDS = frozenset({MixerKind.ATTENTION, MixerKind.SLIDING_ATTENTION, MixerKind.MLA})
RECURRENT_KINDS = frozenset({MixerKind.LINEAR_ATTENTION, MixerKind.SSM})


def same_family(a: MixerKind, b: MixerKind) -> bool:
    """Softmax kinds cost O(S^2) in the sequence, recurrent kinds O(S): the difference that changes a plan."""
    return (a in SOFTMAX_KINDS) == (b in SOFTMAX_KINDS)


def _class_name(module: nn.Module) -> str:
    return type(module).__name__


def observed_kind(module: nn.Module, behaviour: Behaviour, structural: Block | None, config: Any) -> MixerKind | None:
    """The kind the block's run shows, refined by its structure; None when the run shows no sequence mixing."""
    said = structural.kind if structural is not None and structural.role == "mixer" else None
    if behaviour.softmax:
        latent = behaviour.attention is not None and behaviour.attention.latent_kv
        if said is MixerKind.MLA or latent:
            return MixerKind.MLA
        if said in SOFTMAX_KINDS:
            return said  # type: ignore[return-value]
        return MixerKind.SLIDING_ATTENTION if attention_window(module, config) else MixerKind.ATTENTION
    if behaviour.linear:
        return MixerKind.SSM if said is MixerKind.SSM else MixerKind.LINEAR_ATTENTION
    return None


def identify_mixer(module: nn.Module, path: str, structural: Block | None, behaviour: Behaviour, layer: int,
                   override: MixerKind | None, config: Any,
                   unrecognised: UnrecognisedLayerError | None = None) -> Block:
    """The mixer Block of ``module``, its kind decided as the module docstring says.

    ``structural`` is the recogniser's Block (None for a weighted block no recogniser matched, whose
    trace error is ``unrecognised``); ``layer`` is the decoder layer's index, for messages.
    """
    name = _class_name(module)
    evidence = behaviour.describe()
    if override is not None:
        block = sized_as(module, path, override, structural, behaviour, config, layer)
        return dataclasses.replace(block, source="override", evidence=evidence, warning="")
    seen = observed_kind(module, behaviour, structural, config)
    if structural is not None and structural.source == "recogniser":
        warning = ""
        if seen is not None and isinstance(structural.kind, MixerKind) and not same_family(seen, structural.kind):
            warning = (f"layer {layer}: the registered recogniser says '{path}' ({name}) is "
                       f"{structural.kind.value}, but on meta tensors it {evidence} ({seen.value}); keeping the "
                       f"recogniser's answer; set --layer-kind {layer}={seen.value} to use the other")
        return dataclasses.replace(structural, evidence=evidence, warning=warning)
    if seen is not None:
        block = sized_as(module, path, seen, structural, behaviour, config, layer)
        warning = ""
        if behaviour.softmax and behaviour.state_shape is not None:
            warning = (f"layer {layer}: '{path}' ({name}) {evidence}: both softmax attention and a recurrent "
                       f"state; counted as {seen.value}; set --layer-kind {layer}=KIND to count it otherwise")
        return dataclasses.replace(block, source="behaviour", evidence=evidence, warning=warning)
    if structural is not None and structural.role == "mixer" and isinstance(structural.kind, MixerKind):
        kind = structural.kind.value
        return dataclasses.replace(structural, source="structure", evidence=evidence, warning=(
            f"layer {layer}: cannot confirm what '{path}' ({name}) does: on meta tensors it {evidence}; counted "
            f"as {kind} from its structure alone; if that is wrong, set --layer-kind {layer}=KIND "
            f"(or LAYER_KINDS in model.py)"))
    cls = type(module)
    if unrecognised is None or unrecognised.path == path:
        detail = unrecognised.detail if unrecognised is not None else "it owns weights but matches no recogniser"
    else:
        detail = f"no recogniser matches it, and inside it '{unrecognised.path}': {unrecognised.detail}"
    raise UnrecognisedLayerError(path, f"{cls.__module__}.{cls.__qualname__}",
                                 f"{detail}; on meta tensors it {evidence}", layer)


def _heads_and_dim(shape: tuple[int, ...], batch: int, seq: int) -> tuple[int, int]:
    """(heads, head dim) of a per-head tensor laid out [B, H, S, d], [B, S, H, d] or transposed [B, H, d, S]."""
    d = shape[-2] if shape[-1] == seq and len(shape) >= 2 and shape[-2] != seq else shape[-1]
    total = math.prod(shape)
    heads = total // (batch * seq * d) if d and total % (batch * seq * d) == 0 else 1
    return max(heads, 1), d


def _softmax_sizes(module: nn.Module, behaviour: Behaviour, config: Any) -> dict[str, int]:
    objs = [module, config]
    operands = behaviour.attention
    if operands is not None:
        heads, d_qk = _heads_and_dim(operands.query, behaviour.batch, behaviour.seq_len)
        kv_heads, _ = _heads_and_dim(operands.key, behaviour.batch, behaviour.seq_len)
        d_v = operands.value[-1] if operands.value else d_qk
    else:
        heads = first_attr(objs, "num_heads", "num_attention_heads", "n_head") or 0
        d_qk = d_v = first_attr(objs, "head_dim") or 0
        kv_heads = heads
    kv_heads = first_attr(objs, "num_key_value_heads", "num_kv_heads") or kv_heads
    if not (heads and d_qk):
        return {}
    return {"heads": int(heads), "kv_heads": int(kv_heads), "head_dim_qk": int(d_qk), "head_dim_v": int(d_v)}


def _linear_sizes(module: nn.Module, behaviour: Behaviour, config: Any) -> dict[str, Any]:
    b = behaviour
    sizes: dict[str, Any] = {"conv_channels": b.conv_channels, "conv_kernel": b.conv_kernel, "chunk": b.state_chunk}
    if b.state_shape is not None and len(b.state_shape) >= 3:
        *heads, d_k, d_v = b.state_shape[1:]
        sizes.update(v_heads=math.prod(heads), head_dim_qk=d_k, head_dim_v=d_v)
    elif b.prefix_sum_shape is not None and len(b.prefix_sum_shape) >= 4:
        rest = [d for i, d in enumerate(b.prefix_sum_shape) if i != 0 and d != b.seq_len]
        *heads, d_k, d_v = rest if len(rest) >= 2 else [1, *rest]
        sizes.update(v_heads=math.prod(heads), head_dim_qk=d_k, head_dim_v=d_v, chunk=1)
    elif b.attention is not None:
        query_heads, d_qk = _heads_and_dim(b.attention.query, b.batch, b.seq_len)
        d_out = b.attention.value[-1] if b.attention.value else d_qk
        sizes.update(v_heads=query_heads, head_dim_qk=d_qk, head_dim_v=d_out, chunk=b.seq_len)
    if sizes.get("v_heads"):
        sizes["heads"] = sizes["v_heads"]
        sizes["k_heads"] = first_attr([module, config], "num_k_heads", "linear_num_key_heads") or sizes["v_heads"]
        sizes["core"] = "delta_rule" if b.delta_rule else "linear"
    elif b.conv_kernel:
        sizes["core"] = "conv"
    else:
        return {}
    return sizes


def _ssm_sizes(module: nn.Module, behaviour: Behaviour, config: Any) -> dict[str, Any]:
    d_inner = first_attr([module], "intermediate_size", "d_inner")
    d_state = first_attr([module], "ssm_state_size", "d_state")
    if (d_inner is None or d_state is None) and behaviour.state_shape is not None:
        *channels, d_state = behaviour.state_shape[1:]
        d_inner = math.prod(channels)
    if not (d_inner and d_state):
        return {}
    return {"d_inner": int(d_inner), "d_state": int(d_state), "conv_channels": behaviour.conv_channels,
            "conv_kernel": behaviour.conv_kernel, "heads": int(first_attr([module], "num_heads") or 0)}


def sized_as(module: nn.Module, path: str, kind: MixerKind, structural: Block | None, behaviour: Behaviour,
             config: Any, layer: int) -> Block:
    """A Block of ``kind`` for ``module``: the recogniser's sizes when it saw the same kind, else measured ones."""
    if structural is not None and structural.role == "mixer" and isinstance(structural.kind, MixerKind) \
            and (structural.kind is kind or (kind in SOFTMAX_KINDS and structural.kind in SOFTMAX_KINDS)):
        block = dataclasses.replace(structural, kind=kind)
        if kind is MixerKind.LINEAR_ATTENTION and behaviour.linear:
            block.core = "delta_rule" if behaviour.delta_rule or behaviour.state_shape is None else "linear"
        return block
    if kind in SOFTMAX_KINDS:
        sizes: dict[str, Any] = _softmax_sizes(module, behaviour, config)
        if sizes and kind is not MixerKind.MLA:
            window = attention_window(module, config)
            if kind is MixerKind.SLIDING_ATTENTION and window is None:
                raise LayerKindError(f"layer {layer}: '{path}' ({_class_name(module)}) has no sliding_window (on "
                                     f"the module or its config) to count it as sliding_attention; use attention")
            sizes["window"] = window if kind is MixerKind.SLIDING_ATTENTION else None
            sizes["attention_chunk"] = attention_chunk(module, config) if kind is MixerKind.SLIDING_ATTENTION else None
    elif kind is MixerKind.SSM:
        sizes = _ssm_sizes(module, behaviour, config)
    else:
        sizes = _linear_sizes(module, behaviour, config)
    if not sizes:
        raise LayerKindError(
            f"layer {layer}: cannot size '{path}' ({_class_name(module)}) as {kind.value}: on meta tensors it "
            f"{behaviour.describe()}, and neither it nor the config names its heads and head size; set another "
            f"kind with --layer-kind {layer}=KIND or register a recogniser for it")
    return Block("mixer", kind, path, module, params=param_count(module), linears=linear_shapes(module), **sizes)
