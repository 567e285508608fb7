"""The one registry that says what a module *is*, from its structure.

A recogniser looks at a module's children and parameters (not at its class
name) and returns a ``Block`` describing it, or ``None``. The tracer keeps every
recognised block as a leaf of the traced graph, and the cost model reads the
block's numbers. A mixer's kind is then confirmed by what the block does on
meta tensors (``frontend.mixers``): the built-in recognisers find blocks and
read their sizes, but a q/k/v/o block that runs a recurrence is linear
attention whatever its names say. A registered recogniser is trusted (with a
warning when the block's behaviour contradicts it). A new model family built
from known pieces needs nothing here; a genuinely new piece needs one
recogniser::

    from frontend.recognizers import Block, register_recognizer

    def my_mixer(module, ctx):
        if not hasattr(module, "my_special_state"):
            return None
        return Block("mixer", MixerKind.ATTENTION, ctx.path, module, params=..., ...)

    register_recognizer(my_mixer, first=True)

Recognisers run in registration order; the first that returns a block wins.
Mixers come first (MLA and the recurrent mixers before plain attention, whose
q/k/v test they would also pass), then MoE before dense (a MoE block contains
dense-looking shared experts), then norms and weightless glue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from tessera_ir.kinds import FfnKind, MixerKind


@dataclass
class RecognizeContext:
    path: str  # module path in the model, e.g. "model.layers.3.mlp"
    config: Any = None  # the model's HF config when there is one, for fallbacks


@dataclass
class Block:
    """A recognised piece of a decoder layer.

    ``role`` is ``mixer``, ``ffn``, ``norm`` (small per-layer weights folded into
    the layer's first task) or ``glue`` (no weights: activations, dropout,
    rotary tables). ``linears`` lists the block's own projections as
    (in_features, out_features) pairs; MoE experts are described separately.
    """

    role: str
    kind: MixerKind | FfnKind | None
    path: str
    module: nn.Module
    params: int = 0
    linears: list[tuple[int, int]] = field(default_factory=list)
    # attention / mla
    heads: int = 0
    kv_heads: int = 0
    head_dim_qk: int = 0
    head_dim_v: int = 0
    window: int | None = None
    attention_chunk: int | None = None  # chunked attention: queries see their own chunk only (window = chunk)
    # linear attention and ssm
    k_heads: int = 0
    v_heads: int = 0
    chunk: int = 64
    conv_channels: int = 0
    conv_kernel: int = 0
    d_inner: int = 0
    d_state: int = 0
    core: str = "delta_rule"  # linear attention's core: "delta_rule", "linear" (decayed kv state) or "conv" only
    # moe
    num_experts: int = 0
    top_k: int = 0
    hidden: int = 0
    router_params: int = 0
    router_linears: list[tuple[int, int]] = field(default_factory=list)  # (in, out) of each router matrix, when it has several
    expert_matrices: list[tuple[int, int]] = field(default_factory=list)  # per expert, (rows, cols) of each weight
    expert_params: int = 0  # all expert parameters (all experts, biases included)
    shared_linears: list[tuple[int, int]] = field(default_factory=list)
    shared_params: int = 0
    # how a mixer's kind was decided: "behaviour" (what it does on meta tensors), "structure" (its
    # recogniser alone, behaviour inconclusive), "recogniser" (a registered recogniser, trusted) or "override"
    source: str = "structure"
    evidence: str = ""  # what running it showed
    warning: str = ""  # set when the kind is a best guess or contradicts what the block does


Recognizer = Callable[[nn.Module, RecognizeContext], "Block | None"]
_REGISTRY: list[tuple[str, Recognizer]] = []
_BUILT_IN: set[Recognizer] = set()


def register_recognizer(fn: Recognizer, name: str | None = None, first: bool = False) -> Recognizer:
    """Add a recogniser; ``first=True`` lets it override the built-in ones."""
    entry = (name or fn.__name__, fn)
    if first:
        _REGISTRY.insert(0, entry)
    else:
        _REGISTRY.append(entry)
    return fn


def unregister_recognizer(fn: Recognizer) -> None:
    """Remove a recogniser added with register_recognizer."""
    _REGISTRY[:] = [(name, f) for name, f in _REGISTRY if f is not fn]


def recognizers() -> list[str]:
    return [name for name, _ in _REGISTRY]


def recognize(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    for _, fn in _REGISTRY:
        block = fn(module, ctx)
        if block is not None:
            if fn not in _BUILT_IN:
                block.source = "recogniser"  # the user said what this block is
            return block
    return None


# ---------------------------------------------------------------- helpers


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def linear_shapes(module: nn.Module) -> list[tuple[int, int]]:
    return [(m.in_features, m.out_features) for m in module.modules() if isinstance(m, nn.Linear)]


def matmul_shapes(module: nn.Module) -> list[tuple[int, int]]:
    """(in, out) of every matrix ``module`` multiplies a token by: its ``nn.Linear`` modules (and
    subclasses), and each slice of a fused 3-D weight ``[n, out, in]`` (shared experts kept as one
    tensor), n times."""
    shapes = linear_shapes(module)
    linears = {id(m.weight) for m in module.modules() if isinstance(m, nn.Linear)}
    for param in module.parameters():
        if param.dim() == 3 and id(param) not in linears and param.shape[1] > 1 and param.shape[2] > 1:
            shapes += [(int(param.shape[2]), int(param.shape[1]))] * int(param.shape[0])
    return shapes


def _nested_router(
    module: nn.Module, experts_name: str, num_experts: int, expert_dims: set[int]
) -> tuple[str, torch.Tensor, int] | None:
    """A router held a level down (``router.gate``, ``gate.down_proj`` then a small MLP, a Linear
    kept in fp32): a child, not the experts, holding a matrix that reads the experts' input
    (``[*, hidden]``) and one whose rows are the experts' scores (``[E + extra, *]``). A few extra
    rows are allowed: some routers score their shared experts or a "no expert" choice beside the
    routed ones (at most an eighth of E more, and at least 2). Returns (child name, the scoring
    matrix, hidden)."""
    extra = max(2, num_experts // 8)
    for name, child in module.named_children():
        if name == experts_name or isinstance(child, nn.modules.conv._ConvNd):
            continue
        matrices = [p for p in child.parameters() if p.dim() == 2]
        reads = [int(p.shape[1]) for p in matrices if int(p.shape[1]) in expert_dims]
        scores = [p for p in matrices if num_experts <= p.shape[0] <= num_experts + extra]
        if reads and scores:
            return name, scores[-1], reads[0]
    return None


def _child_linear(module: nn.Module, *names: str) -> nn.Linear | None:
    for name in names:
        child = getattr(module, name, None) if name in module._modules else None
        if isinstance(child, nn.Linear):
            return child
    return None


def first_attr(objs: list[Any], *names: str) -> Any:
    """The first of ``names`` set (not None) on any of ``objs``, in order.

    A config may refuse to answer (a per-layer attribute read globally raises its own error):
    that counts as not set, so the module's own attribute or another name is used.
    """
    for obj in objs:
        if obj is None:
            continue
        for name in names:
            try:
                value = getattr(obj, name, None)
            except Exception:  # noqa: BLE001 - any refusal means "not set here"
                value = None
            if value is not None and not isinstance(value, (nn.Module, torch.Tensor)):
                return value
    return None


def config_of(module: nn.Module, ctx: RecognizeContext) -> Any:
    return getattr(module, "config", None) or ctx.config


def _conv1d(module: nn.Module) -> nn.Conv1d | None:
    for child in module.children():
        if isinstance(child, nn.Conv1d):
            return child
    return None


_UP_NAMES = ("gate_proj", "up_proj", "gate_up_proj", "fc1", "w1", "w3", "c_fc", "wi", "dense_h_to_4h")
_DOWN_NAMES = ("down_proj", "fc2", "w2", "c_proj", "wo", "dense_4h_to_h")


def _is_mlp(module: nn.Module) -> bool:
    return _child_linear(module, *_UP_NAMES) is not None and _child_linear(module, *_DOWN_NAMES) is not None


# ---------------------------------------------------------------- built-in recognisers


def moe(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """A router of shape [num_experts, hidden] beside an experts container.

    The container holds either fused 3-D weights [num_experts, a, b] or a
    ModuleList of num_experts MLPs. Every other weighted child is part of the
    shared expert (including a sigmoid gate on it).
    """
    experts_name, experts, num_experts = None, None, 0
    for name, child in module.named_children():
        if isinstance(child, nn.modules.conv._ConvNd):
            continue  # a conv kernel is 3-D too, but holds no experts
        fused = [p for p in child.parameters(recurse=False) if p.dim() == 3 and p.shape[1] > 1 and p.shape[2] > 1]
        if fused and len({p.shape[0] for p in fused}) == 1:
            experts_name, experts, num_experts = name, child, int(fused[0].shape[0])
            break
        if isinstance(child, nn.ModuleList) and len(child) >= 2 and all(_is_mlp(e) for e in child):
            experts_name, experts, num_experts = name, child, len(child)
            break
    if experts is None:
        return None
    router_name, router_weight = None, None
    for name, child in module.named_children():
        weight = getattr(child, "weight", None)
        if name != experts_name and isinstance(weight, torch.Tensor) and weight.dim() == 2 and weight.shape[0] == num_experts:
            router_name, router_weight = name, weight
            break
    if router_weight is None:
        for name, param in module.named_parameters(recurse=False):
            if param.dim() == 2 and param.shape[0] == num_experts:
                router_name, router_weight = name, param
                break
    if isinstance(experts, nn.ModuleList):
        matrices = [(lin.out_features, lin.in_features) for lin in experts[0].modules() if isinstance(lin, nn.Linear)]
    else:
        matrices = [(int(p.shape[1]), int(p.shape[2])) for p in experts.parameters(recurse=False) if p.dim() == 3]
    router_linears: list[tuple[int, int]] = []
    if router_weight is not None:
        hidden = int(router_weight.shape[1])
    else:
        nested = _nested_router(module, experts_name or "", num_experts, {d for m in matrices for d in m})
        if nested is None:
            return None
        router_name, router_weight, hidden = nested
        router_linears = [(int(p.shape[1]), int(p.shape[0])) for p in module.get_submodule(router_name).parameters()
                          if p.dim() == 2]
    if not any(hidden in m for m in matrices):
        return None  # the "router" does not read the experts' input: not a router
    router = module._modules.get(router_name) if router_name in module._modules else None
    config = config_of(module, ctx)
    top_k = first_attr([module, router, experts, config], "top_k", "num_experts_per_tok", "topk", "moe_topk")
    # A block with a router and experts is MoE even when its top-k is unset (some default
    # configs leave it None); capture reports that with a fix instead of failing to recognise it.
    top_k = int(top_k or 0)
    shared = [c for n, c in module.named_children() if n not in (experts_name, router_name)]
    router_params = router_weight.numel() + (param_count(router) - router_weight.numel() if router is not None else 0)
    return Block(
        "ffn",
        FfnKind.MOE,
        ctx.path,
        module,
        params=param_count(module),
        num_experts=num_experts,
        top_k=top_k,
        hidden=hidden,
        router_params=router_params,
        router_linears=router_linears,
        expert_matrices=matrices,
        expert_params=param_count(experts),
        shared_linears=[lin for c in shared for lin in matmul_shapes(c)],
        shared_params=sum(param_count(c) for c in shared),
    )


def mla(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Multi-head latent attention: a low-rank KV down-projection (kv_a_proj*) and its up-projection."""
    names = list(module._modules)
    if not any(n.startswith("kv_a_proj") for n in names) or "kv_b_proj" not in names:
        return None
    config = config_of(module, ctx)
    heads = first_attr([module, config], "num_heads", "num_attention_heads")
    qk = first_attr([module, config], "qk_head_dim")
    if qk is None:
        qk = (first_attr([module, config], "qk_nope_head_dim") or 0) + (first_attr([module, config], "qk_rope_head_dim") or 0)
    v = first_attr([module, config], "v_head_dim")
    return Block("mixer", MixerKind.MLA, ctx.path, module, params=param_count(module), linears=linear_shapes(module),
                 heads=int(heads), kv_heads=int(heads), head_dim_qk=int(qk), head_dim_v=int(v))


def linear_attention(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Gated DeltaNet style: recurrent decay (A_log), short conv, fused q/k/v(/z) input projection."""
    conv = _conv1d(module)
    if conv is None or not hasattr(module, "A_log"):
        return None
    fused_qkv = [n for n in module._modules if n.startswith("in_proj_") and {"q", "k", "v"} <= set(n[len("in_proj_"):])]
    if not fused_qkv:
        return None
    config = config_of(module, ctx)
    v_heads = first_attr([module, config], "num_v_heads", "linear_num_value_heads")
    k_heads = first_attr([module, config], "num_k_heads", "linear_num_key_heads") or v_heads
    dk = first_attr([module, config], "head_k_dim", "linear_key_head_dim")
    dv = first_attr([module, config], "head_v_dim", "linear_value_head_dim")
    chunk = first_attr([module], "chunk_size") or 64
    return Block("mixer", MixerKind.LINEAR_ATTENTION, ctx.path, module, params=param_count(module), linears=linear_shapes(module),
                 heads=int(v_heads), k_heads=int(k_heads), v_heads=int(v_heads), head_dim_qk=int(dk),
                 head_dim_v=int(dv), chunk=int(chunk), conv_channels=conv.out_channels,
                 conv_kernel=int(conv.kernel_size[0]))


def ssm(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Mamba style selective scan: A_log, a short conv, an input projection and a time-step (dt) path."""
    conv = _conv1d(module)
    a_log = getattr(module, "A_log", None)
    if conv is None or not isinstance(a_log, torch.Tensor) or "in_proj" not in module._modules:
        return None
    if "dt_proj" not in module._modules and not hasattr(module, "dt_bias"):
        return None
    d_inner = first_attr([module], "intermediate_size", "d_inner") or int(a_log.shape[0])
    d_state = first_attr([module], "ssm_state_size", "d_state") or (int(a_log.shape[-1]) if a_log.dim() == 2 else 1)
    heads = first_attr([module], "num_heads") or 0  # Mamba-1 has no heads: TP splits channels instead
    return Block("mixer", MixerKind.SSM, ctx.path, module, params=param_count(module), linears=linear_shapes(module),
                 heads=int(heads), d_inner=int(d_inner), d_state=int(d_state), conv_channels=conv.out_channels,
                 conv_kernel=int(conv.kernel_size[0]))


def attention(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Softmax attention: q/k/v projections (separate or fused) and an output projection.

    A ``sliding_window`` set on the module (or, when the module has no such
    attribute, on the config) makes it sliding-window attention.
    """
    q = _child_linear(module, "q_proj", "query", "wq")
    kv = _child_linear(module, "k_proj", "key", "wk") and _child_linear(module, "v_proj", "value", "wv")
    fused = _child_linear(module, "qkv_proj", "c_attn", "Wqkv", "query_key_value")
    out = _child_linear(module, "o_proj", "out_proj", "dense", "wo", "c_proj")
    if out is None or not ((q is not None and kv) or fused is not None):
        return None
    config = config_of(module, ctx)
    head_dim = first_attr([module, config], "head_dim")
    heads = first_attr([module, config], "num_heads", "num_attention_heads", "n_head")
    if heads is None and head_dim:
        heads = out.in_features // head_dim
    if head_dim is None and heads:
        head_dim = out.in_features // heads
    heads, head_dim = heads or 0, head_dim or 0  # unknown: sized from what the block does
    kv_heads = first_attr([module, config], "num_key_value_heads", "num_kv_heads") or heads
    window = attention_window(module, config)
    kind = MixerKind.SLIDING_ATTENTION if window else MixerKind.ATTENTION
    return Block("mixer", kind, ctx.path, module, params=param_count(module), linears=linear_shapes(module), heads=int(heads),
                 kv_heads=int(kv_heads), head_dim_qk=int(head_dim), head_dim_v=int(head_dim), window=window,
                 attention_chunk=attention_chunk(module, config))


def attention_chunk(module: nn.Module, config: Any) -> int | None:
    """The chunk of chunked attention (Llama 4's local layers: the sequence cut into chunks of
    ``attention_chunk_size`` tokens, each query attending causally within its own chunk), or None.

    Read where transformers decides it: the config's ``layer_types`` entry of the module's
    ``layer_idx`` names chunked attention.
    """
    index = getattr(module, "layer_idx", None)
    types = getattr(config, "layer_types", None) if config is not None else None
    if not isinstance(index, int) or not isinstance(types, (list, tuple)) or not 0 <= index < len(types):
        return None
    if "chunk" not in str(types[index]).lower():
        return None
    size = first_attr([module, config], "attention_chunk_size")
    return int(size) if isinstance(size, int) and not isinstance(size, bool) and size > 0 else None


def attention_window(module: nn.Module, config: Any) -> int | None:
    """The sliding window of a softmax-attention block, or None for the full causal context.

    A module that says ``is_sliding = False`` has none; a ``sliding_window`` set on
    the module wins (it is set per layer: None on the full-attention layers of a
    mixed stack); a module without the attribute takes the config's (one window
    for every layer, Mistral style).
    """
    window: Any
    chunk = attention_chunk(module, config)
    if chunk is not None:
        return chunk  # local attention too: no query sees further back than its chunk
    if getattr(module, "is_sliding", None) is False:
        return None  # a full-attention layer of a mixed stack that keeps the config's window around
    if hasattr(module, "sliding_window"):
        window = module.sliding_window
    elif config is not None and getattr(config, "use_sliding_window", True) is not False:
        window = getattr(config, "sliding_window", None)
    else:
        window = None
    return int(window) if isinstance(window, int) and not isinstance(window, bool) and window > 0 else None


def dense(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """A gated or plain MLP: an up (and/or gate) projection and a down projection."""
    if not _is_mlp(module):
        return None
    return Block("ffn", FfnKind.DENSE, ctx.path, module, params=param_count(module), linears=linear_shapes(module))


def norm(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Normalisation: a childless module whose weights are all vectors."""
    params = list(module.parameters())
    if next(module.children(), None) is not None or not params or any(p.dim() > 1 for p in params):
        return None
    return Block("norm", None, ctx.path, module, params=param_count(module))


def glue(module: nn.Module, ctx: RecognizeContext) -> Block | None:
    """Weightless modules (activations, dropout, rotary tables): no task of their own."""
    if next(module.parameters(), None) is not None:
        return None
    return Block("glue", None, ctx.path, module)


for _fn in (mla, linear_attention, ssm, attention, moe, dense, norm, glue):
    register_recognizer(_fn)
    _BUILT_IN.add(_fn)
