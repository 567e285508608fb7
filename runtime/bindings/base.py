"""The binding interface: what each task of a plan computes on a model, and the registry of families.

A plan names its tasks ``<layer>.<op>.<phase>`` (``l3.router.fwd``,
``embed.embedding.wgrad``, ``head.lm_head.dgrad``). A binding says what the
forward of each op is on one rank's copy of the model, by calling the model's
own modules, so the executor can run it as a separate piece of autograd graph
(``runtime.backward_split``). Which modules those are, and where the decoder
stack lives, is the business of one binding class per model family:

    @register_binding
    class MyFamilyBinding(ModelBinding):
        family = "my_family"

        @classmethod
        def matches(cls, model): ...            # is this model laid out as this family?
        def _locate(self): ...                  # embedding, decoder layers, final norm, head
        def _decoder_parts(self, i, block): ... # the modules of decoder layer i
        def dense_parts(cls, model, i, block): ...  # families with dense MLP layers: their modules

and may override the forwards (``mixer_fn``, ``gate_fn``, ``experts_fn``,
``shared_fn``) where the family computes them differently.

The pieces of one decoder layer and what flows between them:

    x --mixer--> h, n          h = x + mixer(input_norm(x)), n = post_mixer_norm(h)
    n --router--> weights, order, counts   (the model's top-k routing; slots sorted by expert)
    n, order --permute--> permuted         (run with the router; its backward is the dispatch's)
    permuted --dispatch (All-to-All)--> received     (on the ranks that own the experts)
    received --expert_gemm--> expert_out             (each local expert's MLP on its tokens)
    expert_out --combine (All-to-All)--> returned    (back on the ranks that own the tokens)
    n --shared_expert--> shared                      (families that have one)
    h, returned, weights[, shared] --assemble--> out (the layer output; no task of its own)

A dense layer (DeepSeek-V3's first ``first_k_dense_replace`` layers; the plan
names its feed-forward task ``dense_mlp``) has the same mixer and one more task:

    h, n --dense_mlp--> out                   out = h + mlp(n)

Expert parallelism: EP rank ``r`` owns experts ``r*E/ep .. (r+1)*E/ep - 1``; a
family's ``shard_experts`` keeps only those in the model (as new parameters).
Tokens reach their experts in the order of the sending rank, and each expert
runs on its tokens from every rank at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from runtime.backward_split import ParamSlot

MIXER_KINDS = frozenset({"attention", "linear_attention", "mla", "sliding_attention", "mamba", "ssm"})
DECODER_OPS = ("mixer", "router", "dispatch", "expert_gemm", "combine", "shared_expert", "dense_mlp")
MOE_OPS = frozenset({"router", "dispatch", "expert_gemm", "combine", "shared_expert"})
WEIGHTED_OPS = frozenset({"embedding", "mixer", "router", "expert_gemm", "shared_expert", "dense_mlp", "lm_head"})
_DECODER_NAME = re.compile(r"^l(\d+)$")

TaskFn = Callable[..., tuple[torch.Tensor, ...]]


def task_boundary(t: torch.Tensor) -> torch.Tensor:
    """Where a task's input enters it when tasks are joined by ordinary autograd: an identity view.

    The gradients of the task's uses of ``t`` are summed at this view before they
    leave the task, as they are when the task runs as its own piece of graph
    (``runtime.backward_split``); where a tensor feeds two tasks, the two sums are
    then added. Without it, autograd would add all uses in one interleaved order,
    and float sums in another order differ in their last bits.
    """
    return t.view_as(t) if t.requires_grad else t


class BindingError(ValueError):
    """A model or a plan task this binding cannot map to work."""


def task_op(kind: str) -> tuple[str, str]:
    """(op, phase) of a task kind: ``linear_attention.dgrad`` -> (``mixer``, ``dgrad``)."""
    op, _, phase = kind.rpartition(".")
    if not op or phase not in ("fwd", "dgrad", "wgrad"):
        raise BindingError(f"task kind '{kind}' is not '<op>.<fwd|dgrad|wgrad>'")
    return ("mixer" if op in MIXER_KINDS else op), phase


def child(module: nn.Module, names: Sequence[str], where: str) -> nn.Module:
    """The first of ``names`` that is a submodule of ``module``; a BindingError naming ``where`` otherwise."""
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, nn.Module):
            return found
    raise BindingError(f"{where} has none of the submodules {', '.join(names)}")


@dataclass(frozen=True)
class Routing:
    """Where the tokens of one layer and micro-batch go, from every EP rank's per-expert counts.

    ``counts[s][e]`` is how many (token, choice) slots EP rank ``s`` routes to expert ``e``.
    """

    counts: tuple[tuple[int, ...], ...]
    ep: int
    ep_rank: int

    @property
    def experts_per_rank(self) -> int:
        return len(self.counts[0]) // self.ep

    def _local(self, rank: int) -> range:
        k = self.experts_per_rank
        return range(rank * k, (rank + 1) * k)

    @property
    def send_splits(self) -> list[int]:
        """Rows this rank sends to each EP rank (its slots are sorted by expert)."""
        mine = self.counts[self.ep_rank]
        return [sum(mine[e] for e in self._local(r)) for r in range(self.ep)]

    @property
    def recv_splits(self) -> list[int]:
        """Rows this rank receives from each EP rank, for its own experts."""
        return [sum(self.counts[s][e] for e in self._local(self.ep_rank)) for s in range(self.ep)]

    @property
    def expert_tokens(self) -> list[int]:
        """Tokens each expert of the model receives, summed over the EP ranks (what DBO predicts from)."""
        return [sum(row[e] for row in self.counts) for e in range(len(self.counts[0]))]

    def regroup(self) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """(index putting received rows in local-expert order, its inverse, rows per local expert)."""
        local = self._local(self.ep_rank)
        offsets, start = [], 0
        for s in range(self.ep):
            offsets.append(start)
            start += sum(self.counts[s][e] for e in local)
        pieces: list[torch.Tensor] = []
        per_expert: list[int] = []
        cursor = list(offsets)
        for e in local:
            n = 0
            for s in range(self.ep):
                c = self.counts[s][e]
                pieces.append(torch.arange(cursor[s], cursor[s] + c))
                cursor[s] += c
                n += c
            per_expert.append(n)
        index = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
        inverse = torch.empty_like(index)
        inverse[index] = torch.arange(index.numel())
        return index, inverse, per_expert


@dataclass(frozen=True)
class DecoderParts:
    """The modules of one decoder layer that the tasks use, looked up once by the family's binding.

    ``router`` is the model's own routing module (a Linear gate, or a router module
    that returns its weights and expert indices); ``experts`` holds fused expert
    weights ``gate_up_proj`` [E, 2I, H] and ``down_proj`` [E, H, I].
    ``shared_expert``/``shared_expert_gate`` are None in families without one; a
    shared expert without a gate (DeepSeek-V3) is added to the routed sum as it is.
    """

    index: int
    block: nn.Module
    input_norm: nn.Module
    mixer: nn.Module
    post_norm: nn.Module
    moe: nn.Module
    router: nn.Module
    experts: nn.Module
    top_k: int
    shared_expert: nn.Module | None = None
    shared_expert_gate: nn.Module | None = None

    def expert_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up, down = getattr(self.experts, "gate_up_proj", None), getattr(self.experts, "down_proj", None)
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
            raise BindingError(f"decoder layer {self.index}'s experts have no fused 'gate_up_proj'/'down_proj' [E, ...]")
        return gate_up, down


@dataclass(frozen=True)
class DenseParts:
    """The modules of a dense decoder layer: the mixer's, as in ``DecoderParts``, and one MLP ``mlp(n)``."""

    index: int
    block: nn.Module
    input_norm: nn.Module
    mixer: nn.Module
    post_norm: nn.Module
    mlp: nn.Module


@dataclass(frozen=True)
class ModelParts:
    """Where a family keeps the model's embedding, decoder stack, final norm and head."""

    embed: nn.Module
    layers: nn.ModuleList
    final_norm: nn.Module
    lm_head: nn.Module


class ModelBinding:
    """The forward of every task op on one rank's copy of the model (experts already sharded).

    Subclasses (one per model family, registered with ``register_binding``) say
    where the modules are (``_locate``, ``_decoder_parts``) and override the
    forwards their family computes differently. The executor
    (``runtime.executor``), the pipelining stage (``runtime.stage_module``) and the
    one-process reference (``runtime.local_reference``) call only the methods
    below, never the model's modules directly.
    """

    family: ClassVar[str] = ""

    # ------------------------------------------------------------ family hooks

    @classmethod
    def matches(cls, model: nn.Module) -> bool:
        """Whether ``model`` is laid out as this family (by class, config or structure)."""
        raise NotImplementedError

    @classmethod
    def locate(cls, model: nn.Module) -> ModelParts:
        """The model's embedding, decoder layers, final norm and head (a BindingError if one is missing)."""
        raise NotImplementedError

    @classmethod
    def decoder_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DecoderParts:
        """The modules of decoder layer ``index`` (a BindingError naming what is missing)."""
        raise NotImplementedError

    @classmethod
    def dense_parts(cls, model: nn.Module, index: int, block: nn.Module) -> DenseParts | None:
        """The modules of decoder layer ``index`` if it is a dense MLP layer, else None (every layer sparse by default)."""
        return None

    @classmethod
    def check_model(cls, model: nn.Module) -> None:
        """Refuse (BindingError) what this family's forwards would compute differently from the model."""
        parts = cls.locate(model)
        for i, block in enumerate(parts.layers):
            if cls.dense_parts(model, i, block) is None:
                cls.decoder_parts(model, i, block).expert_weights()

    @classmethod
    def model_name(cls, model: nn.Module) -> str | None:
        """The model name a plan compiled for ``model`` carries (``PlanInfo.model``); None where the family cannot tell.

        transformers models: ``config.model_type`` (what ``tessera-compile`` names their plans).
        """
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return model_type if isinstance(model_type, str) and model_type else None

    @classmethod
    def describe_layer(cls, model: nn.Module, index: int, block: nn.Module) -> tuple[str | None, str]:
        """(mixer kind, feed-forward) of decoder layer ``index`` in a plan's words (``runtime.model_check``).

        The mixer kind is a plan task's op (``attention``, ``linear_attention``, ...) or None where
        the family cannot tell; the feed-forward is ``moe``, ``moe+shared`` or ``dense``. By default
        every layer is a routed MoE, with a shared expert where ``decoder_parts`` finds one.
        """
        parts = cls.decoder_parts(model, index, block)
        return None, ("moe+shared" if parts.shared_expert is not None else "moe")

    @classmethod
    def shard_experts(cls, model: nn.Module, ep_rank: int, ep: int) -> None:
        """Keep only EP rank ``ep_rank``'s experts in every MoE block, as new parameters (in place)."""
        parts = cls.locate(model)
        for i, block in enumerate(parts.layers):
            if cls.dense_parts(model, i, block) is not None:
                continue
            experts = cls.decoder_parts(model, i, block).experts
            for attr in ("gate_up_proj", "down_proj"):
                full = getattr(experts, attr)
                total = int(full.shape[0])
                if total % ep:
                    raise BindingError(f"{total} experts cannot be split evenly over EP size {ep}")
                k = total // ep
                setattr(experts, attr, nn.Parameter(full.detach()[ep_rank * k : (ep_rank + 1) * k].clone()))

    # ------------------------------------------------------------ construction

    def __init__(self, model: nn.Module, *, ep: int = 1, ep_rank: int = 0):
        self.model = model
        self.ep, self.ep_rank = ep, ep_rank
        parts = type(self).locate(model)
        self.embed, self.layers, self.final_norm, self.lm_head = parts.embed, parts.layers, parts.final_norm, parts.lm_head
        family = type(self)
        self.dense_layers: dict[int, DenseParts] = {}
        self._sparse: dict[int, DecoderParts] = {}
        for i, block in enumerate(self.layers):
            dense = family.dense_parts(model, i, block)
            if dense is not None:
                self.dense_layers[i] = dense
            else:
                self._sparse[i] = family.decoder_parts(model, i, block)
        self.decoders = list(self._sparse.values())  # the sparse (MoE) layers, in order
        if not self.decoders:
            raise BindingError("the model has no sparse MoE decoder layers" if len(self.layers) else "the model has no decoder layers")
        self._names = {id(m): name for name, m in model.named_modules()}
        first = self.decoders[0]
        self.top_k = first.top_k
        self.num_experts = self._num_experts(first)
        self.hidden = int(self.embed.weight.shape[1]) if isinstance(self.embed, nn.Embedding) else self._hidden(first)
        self.has_shared_expert = first.shared_expert is not None
        if any((d.shared_expert is not None) != self.has_shared_expert for d in self.decoders):
            raise BindingError("some decoder layers have a shared expert and others not; this binding needs all or none")
        if self.num_experts % ep:
            raise BindingError(f"{self.num_experts} experts cannot be split evenly over EP size {ep}")
        self.local_experts = self.num_experts // ep
        for d in self.decoders:
            held = int(d.expert_weights()[0].shape[0])
            if held != self.local_experts:
                raise BindingError(
                    f"decoder layer {d.index} holds {held} experts but EP rank {ep_rank} of {ep} owns {self.local_experts}; "
                    "call shard_experts(model, ep_rank, ep) first"
                )

    def _num_experts(self, first: DecoderParts) -> int:
        weight = getattr(first.router, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise BindingError(f"decoder layer {first.index}'s router has no 'weight' [experts, hidden]")
        return int(weight.shape[0])

    def _hidden(self, first: DecoderParts) -> int:
        weight = getattr(first.router, "weight", None)
        assert isinstance(weight, torch.Tensor)
        return int(weight.shape[1])

    # ------------------------------------------------------------ structure

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def vocab_size(self) -> int:
        weight = getattr(self.lm_head, "weight", None)
        if not isinstance(weight, torch.Tensor):
            raise BindingError("the model's head has no 'weight' [vocab, hidden]")
        return int(weight.shape[0])

    def weighted_ops(self) -> tuple[str, ...]:
        """The weighted ops of a decoder layer of this model, in the order the executor keeps them."""
        return ("mixer", "router", "expert_gemm") + (("shared_expert",) if self.has_shared_expert else ())

    def _layer_index(self, layer: str) -> int:
        m = _DECODER_NAME.match(layer)
        if not m or int(m.group(1)) >= len(self.layers):
            raise BindingError(f"plan layer '{layer}' is not a decoder layer of the model ({len(self.layers)} layers, named l0..)")
        return int(m.group(1))

    def is_dense(self, layer: str) -> bool:
        """Whether decoder layer ``layer`` has a dense MLP (a ``dense_mlp`` task) rather than routed experts."""
        return self._layer_index(layer) in self.dense_layers

    def decoder(self, layer: str) -> DecoderParts:
        """The modules of sparse decoder layer ``layer`` (a BindingError for a dense one)."""
        i = self._layer_index(layer)
        if i in self.dense_layers:
            raise BindingError(f"layer {layer} of the model is a dense MLP layer; it has no router, experts or shared expert")
        return self._sparse[i]

    def dense(self, layer: str) -> DenseParts:
        """The modules of dense decoder layer ``layer`` (a BindingError for a sparse one)."""
        i = self._layer_index(layer)
        if i not in self.dense_layers:
            raise BindingError(f"layer {layer} of the model is a sparse MoE layer; it has no dense MLP")
        return self.dense_layers[i]

    def layer_parts(self, layer: str) -> DecoderParts | DenseParts:
        """The modules of decoder layer ``layer``, dense or sparse (its mixer's are in both)."""
        return self.dense(layer) if self.is_dense(layer) else self.decoder(layer)

    def stage_modules(self, layer: str) -> list[nn.Module]:
        """The modules plan layer ``layer`` trains (for an ``nn.Module`` of a stage)."""
        if layer == "embed":
            return [self.embed]
        if layer == "head":
            return [self.final_norm, self.lm_head]
        return [self.layer_parts(layer).block]

    def _slots(self, *modules: nn.Module | None) -> tuple[ParamSlot, ...]:
        out = []
        for module in modules:
            if module is None:
                continue
            prefix = self._names.get(id(module))
            if prefix is None:
                raise BindingError(f"a {type(module).__name__} the binding uses is not a submodule of the model")
            for mod_name, sub in module.named_modules():
                for attr, p in sub._parameters.items():
                    # A frozen parameter (ERNIE-4.5's moe_statics bias) is a constant of the task, never trained:
                    # no gradient, so an optimizer leaves it as transformers' training does.
                    if p is not None and p.requires_grad:
                        out.append(ParamSlot(".".join(x for x in (prefix, mod_name, attr) if x), sub, attr))
        return tuple(out)

    def slots(self, layer: str, op: str) -> tuple[ParamSlot, ...]:
        """The trained parameters the forward of ``op`` in ``layer`` uses, under their names in the model."""
        if op == "embedding":
            return self._slots(self.embed)
        if op == "lm_head":
            return self._slots(self.final_norm, self.lm_head)
        if op == "mixer":
            m = self.layer_parts(layer)
            return self._slots(m.input_norm, m.mixer, m.post_norm)
        if op == "dense_mlp":
            return self._slots(self.dense(layer).mlp)
        d = self.decoder(layer)
        if op == "router":
            return self._slots(d.router)
        if op == "expert_gemm":
            return self._slots(d.experts)
        if op == "shared_expert" and self.has_shared_expert:
            return self._slots(d.shared_expert, d.shared_expert_gate)
        raise BindingError(f"op '{op}' has no parameters to bind in this {self.family or type(self).__name__} model")

    def layer_params(self, layer: str) -> dict[str, tuple[ParamSlot, ...]]:
        """Per weighted op of ``layer``: its parameters."""
        if layer == "embed":
            return {"embedding": self.slots(layer, "embedding")}
        if layer == "head":
            return {"lm_head": self.slots(layer, "lm_head")}
        if self.is_dense(layer):
            return {op: self.slots(layer, op) for op in ("mixer", "dense_mlp")}
        return {op: self.slots(layer, op) for op in self.weighted_ops()}

    def is_expert_param(self, key: str) -> bool:
        """Whether the parameter named ``key`` is an expert's (reduced over DP replicas only)."""
        return ".experts." in key

    # ------------------------------------------------------------ forwards

    def embedding_fn(self) -> TaskFn:
        embed = self.embed

        def embedding(input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (embed(input_ids),)

        return embedding

    def mixer_fn(self, layer: str) -> TaskFn:
        d = self.layer_parts(layer)

        def mixer_forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            h = x + d.mixer(d.input_norm(x))
            return h, d.post_norm(h)

        return mixer_forward

    def router_fn(self, layer: str) -> TaskFn:
        """The routing and the permutation of the tokens in expert order, as one piece."""
        gate, permute = self.gate_fn(layer), self.permute_fn()

        def router(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            weights, order, counts = gate(n)
            (permuted,) = permute(n, order)
            return permuted, weights, order, counts

        return router

    def gate_fn(self, layer: str) -> TaskFn:
        """The router's own work: (top-k weights [tokens, k], the slots' order by expert, per-expert counts)."""
        raise NotImplementedError

    def sort_slots(self, expert_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the (token, choice) slots sorted by expert, stably; tokens per expert) of top-k indices."""
        flat = expert_index.reshape(-1)
        return torch.argsort(flat, stable=True), torch.bincount(flat, minlength=self.num_experts)

    def permute_fn(self) -> TaskFn:
        """The tokens gathered in expert order for the dispatch (no weights).

        Its backward belongs to the dispatch's: the gradient of the permuted tokens
        exists only once the dispatch's backward All-to-All has returned it, while the
        router's gate gradient exists after the combine's backward.
        """
        top_k, hidden = self.top_k, self.hidden

        def permute(n: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (n.reshape(-1, hidden)[order // top_k],)

        return permute

    def expert_activation(self, layer: str) -> Callable[[torch.Tensor], torch.Tensor]:
        """The experts' activation on the gate half (SiLU unless the family's experts say otherwise)."""
        return F.silu

    def experts_fn(self, layer: str) -> TaskFn:
        d = self.decoder(layer)
        act = self.expert_activation(layer)

        def expert_gemm(received: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor, per_expert: list[int]) -> tuple[torch.Tensor, ...]:
            grouped = received[index]
            gate_up, down = d.expert_weights()  # looked up per call: the task swaps in its own leaves
            outputs, start = [], 0
            for e, count in enumerate(per_expert):
                chunk = grouped[start : start + count]
                gate, up = (chunk @ gate_up[e].t()).chunk(2, dim=-1)
                outputs.append((act(gate) * up) @ down[e].t())
                start += count
            return (torch.cat(outputs, dim=0)[inverse],)

        return expert_gemm

    def shared_fn(self, layer: str) -> TaskFn:
        d = self.decoder(layer)
        if d.shared_expert is None:
            raise BindingError(f"the plan has a shared-expert task in {layer}, but this model has no shared expert")
        shared_expert, shared_gate = d.shared_expert, d.shared_expert_gate
        hidden = self.hidden

        def shared_expert_forward(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            tokens = n.reshape(-1, hidden)
            if shared_gate is None:
                return (shared_expert(tokens),)
            return (torch.sigmoid(shared_gate(tokens)) * shared_expert(tokens),)

        return shared_expert_forward

    def dense_fn(self, layer: str) -> TaskFn:
        """A dense layer's feed-forward and residual: ``(h, n) -> h + mlp(n)`` (the layer output)."""
        mlp = self.dense(layer).mlp

        def dense_mlp(h: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (h + mlp(n),)

        return dense_mlp

    def assemble_fn(self) -> TaskFn:
        """The layer output: ``assemble(h, returned, weights[, shared], order)`` (``shared`` with a shared expert)."""
        top_k = self.top_k
        with_shared = self.has_shared_expert

        def assemble(h: torch.Tensor, returned: torch.Tensor, weights: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
            shared, order = rest if with_shared else (None, rest[0])
            slots = torch.empty_like(returned)
            slots[order] = returned  # undo the sort by expert
            num_tokens = weights.shape[0]
            routed = (slots.view(num_tokens, top_k, -1) * weights.unsqueeze(-1).to(slots.dtype)).sum(dim=1)
            if shared is not None:
                routed = routed + shared
            return (h + routed.reshape(h.shape),)

        return assemble

    def assemble_inputs(self) -> tuple[str, ...]:
        """The names of the values ``assemble_fn`` takes before ``order``."""
        return ("h", "returned", "weights") + (("shared",) if self.has_shared_expert else ())

    def logits_fn(self) -> TaskFn:
        norm, lm_head = self.final_norm, self.lm_head

        def logits(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (lm_head(norm(x)),)

        return logits

    def head_fn(self, loss_divisor: int) -> TaskFn:
        """The head with its loss: (loss / ``loss_divisor`` for the backward, the loss itself for reporting)."""
        logits_of = self.logits_fn()
        loss_of = loss_fn(loss_divisor)

        def head(x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return loss_of(logits_of(x)[0], labels)

        return head


def loss_fn(loss_divisor: int) -> Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """Next-token cross-entropy of one micro-batch: (loss / ``loss_divisor``, loss).

    Dividing by (micro-batches x replicas) before the backward makes the summed
    gradients those of the mean loss over the whole batch.
    """

    def loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        return value / loss_divisor, value.detach()

    return loss


# ---------------------------------------------------------------- the registry

_REGISTRY: list[type[ModelBinding]] = []


def register_binding(cls: type[ModelBinding], first: bool = False) -> type[ModelBinding]:
    """Add a family's binding class (usable as a decorator); ``first=True`` lets it override the built-in ones."""
    if not cls.family:
        raise BindingError(f"binding class {cls.__name__} has no 'family' name")
    unregister_binding(cls)
    if first:
        _REGISTRY.insert(0, cls)
    else:
        _REGISTRY.append(cls)
    return cls


def unregister_binding(cls: type[ModelBinding]) -> None:
    """Remove a binding class added with ``register_binding``."""
    _REGISTRY[:] = [c for c in _REGISTRY if c is not cls]


def registered_bindings() -> list[str]:
    """The registered families, in the order they are tried."""
    return [c.family for c in _REGISTRY]


def binding_for(model: nn.Module) -> type[ModelBinding]:
    """The binding class of the first registered family that ``model`` matches; a clear error if none does."""
    for cls in _REGISTRY:
        if cls.matches(model):
            return cls
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    what = type(model).__name__
    if isinstance(model_type, str) and model_type:
        what += f" (model type '{model_type}', which the compiler may plan but no binding trains yet)"
    raise BindingError(
        f"no registered binding trains a {what} (families: {', '.join(registered_bindings()) or 'none'}); "
        "pass binding= a ModelBinding subclass for it, or register one with runtime.bindings.register_binding"
    )
