"""A virtual stage of a plan as an ``nn.Module``: what ``torch.distributed.pipelining`` trains.

``StageModule`` runs a contiguous range of the model's layers (the embedding,
decoder layers, the head up to its logits) with the same task forwards the
executor runs (the model's binding, ``runtime.bindings``), joined by ordinary autograd, with
expert-parallel dispatch and combine as blocking, differentiable
``all_to_all_single`` over the EP group. Under a pipelining schedule its
backward is one ``autograd.backward`` of the whole stage, weight gradients
included, and its All-to-Alls wait: it is the baseline the executor is
measured against (``bench/e2e_cpu.py``) and the stage the pipelining bridge
hands to torch (``runtime.pipelining_bridge``).

Each task's inputs enter through ``task_boundary`` (an identity view), so its
gradients sum in the same order as in the executor and in
``runtime.local_reference``: the three agree bitwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from runtime.bindings import ModelBinding, Routing, task_boundary


class StageModule(nn.Module):
    """Layers ``layers`` of the model (plan layer names: ``embed``, ``l<i>``, ``head``) on one rank."""

    def __init__(self, binding: ModelBinding, layers: Sequence[str], ep_group: Any = None):
        super().__init__()
        self.binding = binding
        self.layer_names = list(layers)
        self.ep_group = ep_group
        parts: list[nn.Module] = []
        for name in self.layer_names:
            parts += binding.stage_modules(name)
        # Registered so that .parameters() are the stage's (optimizers, pipelining's gradient scaling).
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = self.binding
        for name in self.layer_names:
            if name == "embed":
                x = b.embedding_fn()(x)[0]
            elif name == "head":
                x = b.logits_fn()(task_boundary(x))[0]
            else:
                x = self._decoder(name, x)
        return x

    def _decoder(self, layer: str, x: torch.Tensor) -> torch.Tensor:
        b = self.binding
        h, n = b.mixer_fn(layer)(task_boundary(x))
        if b.is_dense(layer):
            return b.dense_fn(layer)(task_boundary(h), task_boundary(n))[0]
        permuted, weights, order, counts = b.router_fn(layer)(task_boundary(n))
        routing = self._routing(counts)
        send, recv = routing.send_splits, routing.recv_splits
        received = self._exchange(permuted, send, recv)
        index, inverse, per_expert = routing.regroup()
        expert_out = b.experts_fn(layer)(task_boundary(received), index, inverse, per_expert)[0]
        returned = self._exchange(expert_out, recv, send)
        values = [h, returned, weights]
        if b.has_shared_expert:
            values.append(b.shared_fn(layer)(task_boundary(n))[0])
        return b.assemble_fn()(*(task_boundary(v) for v in values), order)[0]

    def _routing(self, counts: torch.Tensor) -> Routing:
        b = self.binding
        mine = counts.to(torch.int64).cpu()
        if b.ep == 1:
            return Routing((tuple(int(c) for c in mine.tolist()),), 1, 0)
        gathered = [torch.empty_like(mine) for _ in range(b.ep)]
        dist.all_gather(gathered, mine, group=self.ep_group)
        return Routing(tuple(tuple(int(c) for c in g.tolist()) for g in gathered), b.ep, b.ep_rank)

    def _exchange(self, tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        if self.binding.ep == 1:
            return tensor
        out = tensor.new_empty((sum(recv), *tensor.shape[1:]))
        result: torch.Tensor = dist_fn.all_to_all_single(out, tensor.contiguous(), recv, send, group=self.ep_group)
        return result
