"""What each task of a plan computes, on a model laid out like Qwen3-Next.

A plan names its tasks ``<layer>.<op>.<phase>`` (``l3.router.fwd``,
``embed.embedding.wgrad``, ``head.lm_head.dgrad``); this module says what the
forward of each op is on the model's own modules, so the executor can run it
as a separate piece of autograd graph (``runtime.backward_split``). The layout
it understands, by module structure:

- ``embed_tokens`` (layer ``embed``), ``norm`` + ``lm_head`` (layer ``head``,
  with the cross-entropy loss);
- decoder layers ``layers[i]`` (layer ``l<i>``), each with an input norm
  (``input_norm`` or ``input_layernorm``), a mixer (``mixer``, ``self_attn`` or
  ``linear_attn``: softmax or linear attention alike), a post-mixer norm
  (``post_mixer_norm`` or ``post_attention_layernorm``) and a sparse MoE block
  (``moe`` or ``mlp``) with a router ``gate``, fused experts
  (``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]), a
  ``shared_expert`` MLP and its sigmoid ``shared_expert_gate``.

The pieces of one decoder layer and what flows between them:

    x --mixer--> h, n          h = x + mixer(input_norm(x)), n = post_mixer_norm(h)
    n --router--> permuted, weights, order, counts   (top-k routing; slots sorted by expert;
                                                      the executor runs the permutation as part of the dispatch)
    permuted --dispatch (All-to-All)--> received     (on the ranks that own the experts)
    received --expert_gemm--> expert_out             (each local expert's SwiGLU on its tokens)
    expert_out --combine (All-to-All)--> returned    (back on the ranks that own the tokens)
    n --shared_expert--> shared
    h, returned, weights, shared --assemble--> out   (the layer output; no task of its own)

Expert parallelism: EP rank ``r`` owns experts ``r*E/ep .. (r+1)*E/ep - 1``;
``shard_experts`` keeps only those in the model (as new parameters). Tokens
reach their experts in the order of the sending rank, and each expert runs on
its tokens from every rank at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from runtime.backward_split import ParamSlot

MIXER_KINDS = frozenset({"attention", "linear_attention", "mla", "sliding_attention", "mamba", "ssm"})
DECODER_OPS = ("mixer", "router", "dispatch", "expert_gemm", "combine", "shared_expert")
WEIGHTED_OPS = frozenset({"embedding", "mixer", "router", "expert_gemm", "shared_expert", "lm_head"})
_DECODER_NAME = re.compile(r"^l(\d+)$")


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


def _child(module: nn.Module, names: Sequence[str], where: str) -> nn.Module:
    for name in names:
        child = getattr(module, name, None)
        if isinstance(child, nn.Module):
            return child
    raise BindingError(f"{where} has none of the submodules {', '.join(names)}")


def _slots(prefix: str, *modules: nn.Module) -> tuple[ParamSlot, ...]:
    out = []
    for module in modules:
        for mod_name, sub in module.named_modules():
            for attr, p in sub._parameters.items():
                if p is not None:
                    out.append(ParamSlot(f"{prefix}{mod_name}.{attr}".replace("..", ".").strip("."), sub, attr))
    return tuple(out)


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
class _Decoder:
    """The modules of one decoder layer that the tasks use, looked up once."""

    index: int
    block: nn.Module
    input_norm: nn.Module
    mixer: nn.Module
    post_norm: nn.Module
    moe: nn.Module
    gate: nn.Linear
    experts: nn.Module
    shared_expert: nn.Module
    shared_expert_gate: nn.Module
    top_k: int

    @property
    def prefix(self) -> str:
        return f"layers.{self.index}."

    def expert_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        gate_up, down = getattr(self.experts, "gate_up_proj", None), getattr(self.experts, "down_proj", None)
        if not isinstance(gate_up, torch.Tensor) or not isinstance(down, torch.Tensor):
            raise BindingError(f"decoder layer {self.index}'s experts have no fused 'gate_up_proj'/'down_proj' [E, ...]")
        return gate_up, down


def _decoder(model_layers: nn.ModuleList, i: int) -> _Decoder:
    where = f"decoder layer {i}"
    block = model_layers[i]
    moe = _child(block, ("moe", "mlp"), where)
    gate = getattr(moe, "gate", None)
    if not isinstance(gate, nn.Linear):
        raise BindingError(f"{where}'s MoE block has no Linear router 'gate'")
    top_k = getattr(moe, "top_k", None)
    if not isinstance(top_k, int):
        raise BindingError(f"{where}'s MoE block has no integer 'top_k'")
    decoder = _Decoder(
        i, block,
        _child(block, ("input_norm", "input_layernorm"), where),
        _child(block, ("mixer", "self_attn", "linear_attn"), where),
        _child(block, ("post_mixer_norm", "post_attention_layernorm"), where),
        moe, gate,
        _child(moe, ("experts",), where + "'s MoE block"),
        _child(moe, ("shared_expert",), where + "'s MoE block"),
        _child(moe, ("shared_expert_gate",), where + "'s MoE block"),
        top_k,
    )
    decoder.expert_weights()
    return decoder


class MoEBinding:
    """The forward of every task op on one rank's copy of the model (experts already sharded)."""

    def __init__(self, model: nn.Module, *, ep: int = 1, ep_rank: int = 0):
        self.model = model
        self.ep, self.ep_rank = ep, ep_rank
        self.embed = _child(model, ("embed_tokens",), "the model")
        self.final_norm = _child(model, ("norm",), "the model")
        self.lm_head = _child(model, ("lm_head",), "the model")
        layers = getattr(model, "layers", None)
        if not isinstance(layers, nn.ModuleList):
            raise BindingError("the model has no 'layers' ModuleList of decoder layers")
        self.layers = layers
        self.decoders = [_decoder(layers, i) for i in range(len(layers))]
        first = self.decoders[0]
        self.num_experts = int(first.gate.weight.shape[0])
        self.top_k = first.top_k
        self.hidden = int(first.gate.weight.shape[1])
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

    # ------------------------------------------------------------ structure

    def decoder(self, layer: str) -> _Decoder:
        m = _DECODER_NAME.match(layer)
        if not m or int(m.group(1)) >= len(self.decoders):
            raise BindingError(f"plan layer '{layer}' is not a decoder layer of the model ({len(self.decoders)} layers, named l0..)")
        return self.decoders[int(m.group(1))]

    def slots(self, layer: str, op: str) -> tuple[ParamSlot, ...]:
        """The parameters the forward of ``op`` in ``layer`` uses, named as in the model."""
        if op == "embedding":
            return _slots("embed_tokens.", self.embed)
        if op == "lm_head":
            return _slots("norm.", self.final_norm) + _slots("lm_head.", self.lm_head)
        d = self.decoder(layer)
        if op == "mixer":
            return tuple(
                s for part in (d.input_norm, d.mixer, d.post_norm) for s in _slots(d.prefix + _name_in(d.block, part) + ".", part)
            )
        moe_prefix = d.prefix + _name_in(d.block, d.moe) + "."
        if op == "router":
            return _slots(moe_prefix + "gate.", d.gate)
        if op == "expert_gemm":
            return _slots(moe_prefix + "experts.", d.experts)
        if op == "shared_expert":
            return _slots(moe_prefix + "shared_expert.", d.shared_expert) + _slots(
                moe_prefix + "shared_expert_gate.", d.shared_expert_gate
            )
        raise BindingError(f"op '{op}' has no parameters to bind")

    def layer_params(self, layer: str) -> dict[str, tuple[ParamSlot, ...]]:
        """Per weighted op of ``layer``: its parameters."""
        if layer == "embed":
            return {"embedding": self.slots(layer, "embedding")}
        if layer == "head":
            return {"lm_head": self.slots(layer, "lm_head")}
        return {op: self.slots(layer, op) for op in ("mixer", "router", "expert_gemm", "shared_expert")}

    # ------------------------------------------------------------ forwards

    def embedding_fn(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        embed = self.embed

        def embedding(input_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (embed(input_ids),)

        return embedding

    def mixer_fn(self, layer: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        d = self.decoder(layer)

        def mixer_forward(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            h = x + d.mixer(d.input_norm(x))
            return h, d.post_norm(h)

        return mixer_forward

    def router_fn(self, layer: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The routing and the permutation of the tokens in expert order, as one piece."""
        gate, permute = self.gate_fn(layer), self.permute_fn()

        def router(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            weights, order, counts = gate(n)
            (permuted,) = permute(n, order)
            return permuted, weights, order, counts

        return router

    def gate_fn(self, layer: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The router's own work: top-k weights, the slots' order by expert and the per-expert counts."""
        gate = self.decoder(layer).gate
        top_k, num_experts, hidden = self.top_k, self.num_experts, self.hidden

        def route(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            probs = F.softmax(gate(n.reshape(-1, hidden)), dim=-1)
            weights, expert_index = torch.topk(probs, top_k, dim=-1)
            weights = weights / weights.sum(dim=-1, keepdim=True)
            flat = expert_index.reshape(-1)
            order = torch.argsort(flat, stable=True)  # (token, choice) slots sorted by expert
            counts = torch.bincount(flat, minlength=num_experts)
            return weights, order, counts

        return route

    def permute_fn(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        """The tokens gathered in expert order for the dispatch (no weights).

        Its backward belongs to the dispatch's: the gradient of the permuted tokens
        exists only once the dispatch's backward All-to-All has returned it, while the
        router's gate gradient exists after the combine's backward.
        """
        top_k, hidden = self.top_k, self.hidden

        def permute(n: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (n.reshape(-1, hidden)[order // top_k],)

        return permute

    def experts_fn(self, layer: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        d = self.decoder(layer)

        def expert_gemm(received: torch.Tensor, index: torch.Tensor, inverse: torch.Tensor, per_expert: list[int]) -> tuple[torch.Tensor, ...]:
            grouped = received[index]
            gate_up, down = d.expert_weights()  # looked up per call: the task swaps in its own leaves
            outputs, start = [], 0
            for e, count in enumerate(per_expert):
                chunk = grouped[start : start + count]
                gate, up = (chunk @ gate_up[e].t()).chunk(2, dim=-1)
                outputs.append((F.silu(gate) * up) @ down[e].t())
                start += count
            return (torch.cat(outputs, dim=0)[inverse],)

        return expert_gemm

    def shared_fn(self, layer: str) -> Callable[..., tuple[torch.Tensor, ...]]:
        d = self.decoder(layer)
        hidden = self.hidden

        def shared_expert(n: torch.Tensor) -> tuple[torch.Tensor, ...]:
            tokens = n.reshape(-1, hidden)
            return (torch.sigmoid(d.shared_expert_gate(tokens)) * d.shared_expert(tokens),)

        return shared_expert

    def assemble_fn(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        top_k = self.top_k

        def assemble(h: torch.Tensor, returned: torch.Tensor, weights: torch.Tensor, shared: torch.Tensor, order: torch.Tensor) -> tuple[torch.Tensor, ...]:
            slots = torch.empty_like(returned)
            slots[order] = returned  # undo the sort by expert
            num_tokens = weights.shape[0]
            routed = (slots.view(num_tokens, top_k, -1) * weights.unsqueeze(-1)).sum(dim=1)
            return (h + (routed + shared).reshape(h.shape),)

        return assemble

    def logits_fn(self) -> Callable[..., tuple[torch.Tensor, ...]]:
        norm, lm_head = self.final_norm, self.lm_head

        def logits(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (lm_head(norm(x)),)

        return logits

    def head_fn(self, loss_divisor: int) -> Callable[..., tuple[torch.Tensor, ...]]:
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


def _name_in(parent: nn.Module, child: nn.Module) -> str:
    for name, module in parent.named_children():
        if module is child:
            return name
    raise BindingError("a submodule is not a direct child of its layer")


def shard_experts(model: nn.Module, ep_rank: int, ep: int) -> None:
    """Keep only EP rank ``ep_rank``'s experts in every MoE block, as new parameters (in place)."""
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise BindingError("the model has no 'layers' ModuleList of decoder layers")
    for i in range(len(layers)):
        experts = _decoder(layers, i).experts
        for attr in ("gate_up_proj", "down_proj"):
            full = getattr(experts, attr)
            total = int(full.shape[0])
            if total % ep:
                raise BindingError(f"{total} experts cannot be split evenly over EP size {ep}")
            k = total // ep
            setattr(experts, attr, nn.Parameter(full.detach()[ep_rank * k : (ep_rank + 1) * k].clone()))
