"""The same training in one process, to check that the plan's execution changes no bit.

``LocalReference`` trains the model that ``StageExecutor`` trains across
``pp × ep × dp`` processes, with the same data and seed, in one process and
with nothing of the runtime: no FSM, no pipeline stages, no point-to-point
transfers, no split of the backward, no deferred or reordered weight
gradients, no threads. Each micro-batch is one forward over the whole model
and one ``torch.autograd.backward`` of its losses.

What makes bitwise agreement possible is that it computes the same arithmetic
in the same decomposition, because floating-point sums depend on their order:

- every (dp, ep) position holds its own replica of the model with its experts
  sharded to that EP rank, and trains on its own slice of the batch, as the
  ranks do; each expert runs once per micro-batch on the tokens routed to it
  from every EP rank, in the order of the sending rank (what
  ``all_to_all_single`` delivers; here a copy that autograd runs backwards);
- the gradient reduction sums the replicas' gradients in rank order (two
  replicas: ``a + b``, which is what a two-rank all-reduce computes);
- each task's inputs enter through an identity view, so that where a tensor
  feeds two tasks (the post-mixer norm feeds the router and the shared
  expert) the gradients of each task's uses are summed within the task
  first, then the two sums are added, as the executor adds them;
- gradients accumulate micro-batch after micro-batch, and the loss is divided
  by (micro-batches × replicas) before the backward.

Deterministic CPU mode: float32, ``torch.use_deterministic_algorithms(True)``,
one intra-op thread (``torch.set_num_threads(1)``) in every process.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from runtime.bindings import ModelBinding, Routing, binding_for
from runtime.bindings import task_boundary as _cut
from runtime.layout import RankGrid


def deterministic_cpu_mode() -> None:
    """The mode in which the executor and the reference agree bitwise (see the module docstring)."""
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)


class _Exchange(torch.autograd.Function):
    """``all_to_all_single`` among EP ranks in one process: rows ``[s -> r]`` of every sender to every receiver."""

    @staticmethod
    def forward(ctx: Any, splits: list[list[int]], *sources: torch.Tensor) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        ctx.splits = splits
        ranks = len(sources)
        offsets = [[sum(splits[s][:r]) for r in range(ranks)] for s in range(ranks)]
        ctx.offsets = offsets
        return tuple(
            torch.cat([sources[s][offsets[s][r] : offsets[s][r] + splits[s][r]] for s in range(ranks)])
            for r in range(ranks)
        )

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        splits, ranks = ctx.splits, len(grads)
        received = [[sum(splits[s2][r] for s2 in range(s)) for s in range(ranks)] for r in range(ranks)]
        back = tuple(
            torch.cat([grads[r][received[r][s] : received[r][s] + splits[s][r]] for r in range(ranks)])
            for s in range(ranks)
        )
        return (None, *back)


class LocalReference:
    """Every (dp, ep) replica of the model in this process, trained micro-batch by micro-batch."""

    def __init__(
        self,
        build_model: Callable[[], nn.Module],
        *,
        ep: int,
        dp: int = 1,
        microbatches: int,
        optimizer: Callable[[list[torch.Tensor]], torch.optim.Optimizer] | None = None,
        binding: type[ModelBinding] | None = None,
    ):
        """``binding``: the model's binding class (by default the registered family the model matches)."""
        self.grid = RankGrid(1, ep, dp)
        self.microbatches = microbatches
        self.replicas: list[nn.Module] = []
        self.bindings: list[ModelBinding] = []
        for shard in range(ep * dp):
            model = build_model()
            family = binding or binding_for(model)
            family.check_model(model)
            family.shard_experts(model, shard % ep, ep)
            self.replicas.append(model)
            self.bindings.append(family(model, ep=ep, ep_rank=shard % ep))
        self.optimizers = [optimizer(list(m.parameters())) for m in self.replicas] if optimizer else []
        self.last_routing: list[list[Routing]] = []

    @property
    def shards(self) -> int:
        return len(self.replicas)

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor) -> list[list[torch.Tensor]]:
        """Forward and backward of one iteration; ``input_ids``/``labels``: [shards, microbatches, batch, seq].

        Returns the unscaled loss of every (shard, micro-batch); the reduced
        gradients are in every replica's ``.grad``.
        """
        for m in self.replicas:
            m.zero_grad(set_to_none=True)
        divisor = self.microbatches * self.shards
        losses: list[list[torch.Tensor]] = [[] for _ in range(self.shards)]
        self.last_routing = []
        for mb in range(self.microbatches):
            scaled, values = self._forward(mb, input_ids, labels, divisor)
            for shard, v in enumerate(values):
                losses[shard].append(v)
            torch.autograd.backward(scaled)
        self._reduce()
        return losses

    def optimizer_step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def _forward(self, mb: int, input_ids: torch.Tensor, labels: torch.Tensor, divisor: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        b = self.bindings
        ep = self.grid.ep
        xs = [b[s].embedding_fn()(input_ids[s, mb])[0] for s in range(self.shards)]
        routings: list[Routing] = []
        for i in range(b[0].num_layers):
            layer = f"l{i}"
            if b[0].is_dense(layer):  # a dense MLP layer: no routing, each replica on its own
                for s in range(self.shards):
                    h, n = b[s].mixer_fn(layer)(_cut(xs[s]))
                    xs[s] = b[s].dense_fn(layer)(_cut(h), _cut(n))[0]
                continue
            hs, ns, perms, weights, orders, counts = [], [], [], [], [], []
            for s in range(self.shards):
                h, n = b[s].mixer_fn(layer)(_cut(xs[s]))
                p, w, o, c = b[s].router_fn(layer)(_cut(n))
                hs.append(h)
                ns.append(n)
                perms.append(p)
                weights.append(w)
                orders.append(o)
                counts.append(tuple(int(v) for v in c.tolist()))
            returned: list[torch.Tensor] = [torch.empty(0)] * self.shards
            for d in range(self.grid.dp):
                group = [d * ep + e for e in range(ep)]
                group_counts = tuple(counts[s] for s in group)
                rs = [Routing(group_counts, ep, e) for e in range(ep)]
                routings.extend(rs)
                splits = [rs[e].send_splits for e in range(ep)]
                received = _Exchange.apply(splits, *[perms[s] for s in group])
                outs = []
                for e, s in enumerate(group):
                    index, inverse, per_expert = rs[e].regroup()
                    outs.append(b[s].experts_fn(layer)(_cut(received[e]), index, inverse, per_expert)[0])
                back = [rs[e].recv_splits for e in range(ep)]
                for e, r in enumerate(_Exchange.apply(back, *outs)):
                    returned[group[e]] = r
            for s in range(self.shards):
                values = [hs[s], returned[s], weights[s]]
                if b[s].has_shared_expert:
                    values.append(b[s].shared_fn(layer)(_cut(ns[s]))[0])
                xs[s] = b[s].assemble_fn()(*(_cut(v) for v in values), orders[s])[0]
        self.last_routing.append(routings)
        scaled, values = [], []
        for s in range(self.shards):
            loss_scaled, loss = b[s].head_fn(divisor)(_cut(xs[s]), labels[s, mb])
            scaled.append(loss_scaled)
            values.append(loss)
        return scaled, values

    def _reduce(self) -> None:
        """What the gradient reduction computes: non-expert gradients summed over every replica in rank
        order, expert gradients over the data-parallel replicas of the same EP rank."""
        params = [dict(m.named_parameters()) for m in self.replicas]
        for name in params[0]:
            if not params[0][name].requires_grad:
                continue  # frozen: no gradient, as in the executor (ModelBinding.slots)
            expert = self.bindings[0].is_expert_param(name)
            groups: Sequence[list[int]]
            if expert:
                groups = [[d * self.grid.ep + e for d in range(self.grid.dp)] for e in range(self.grid.ep)]
            else:
                groups = [list(range(self.shards))]
            for group in groups:
                grads = [params[s][name].grad for s in group]
                total = None
                for g in grads:
                    g = g if g is not None else torch.zeros_like(params[group[0]][name])
                    total = g.clone() if total is None else total + g
                for s in group:
                    params[s][name].grad = total.clone() if total is not None else None
