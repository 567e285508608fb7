"""The task binding computes the model's own function; routing and expert sharding."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from runtime.local_reference import LocalReference
from runtime.moe_binding import BindingError, MoEBinding, Routing, shard_experts, task_op

from tiny_plan import tiny_example

TinyConfig, TinyQwen3Next = tiny_example().TinyConfig, tiny_example().TinyQwen3Next


def build(layers: int = 4) -> nn.Module:
    torch.manual_seed(0)
    return TinyQwen3Next(TinyConfig(num_layers=layers))


def test_task_ops_name_mixers_as_one_op():
    assert task_op("linear_attention.dgrad") == ("mixer", "dgrad")
    assert task_op("attention.fwd") == ("mixer", "fwd")
    assert task_op("expert_gemm.wgrad") == ("expert_gemm", "wgrad")
    with pytest.raises(BindingError, match="is not '<op>.<fwd|dgrad|wgrad>'"):
        task_op("router")


def test_routing_splits_and_regroup():
    # EP rank 1 of 2 owns experts 2 and 3; counts[s][e] = slots rank s sends to expert e
    counts = ((1, 2, 3, 4), (5, 6, 7, 8))
    r = Routing(counts, 2, 1)
    assert r.send_splits == [5 + 6, 7 + 8]  # rank 1's own slots: to rank 0 (experts 0, 1), to rank 1 (2, 3)
    assert r.recv_splits == [3 + 4, 7 + 8]  # what ranks 0 and 1 send to experts 2 and 3
    assert r.expert_tokens == [6, 8, 10, 12]
    index, inverse, per_expert = r.regroup()
    # received rows: [from rank 0: e2 x3, e3 x4][from rank 1: e2 x7, e3 x8]; grouped by expert, senders in order
    assert per_expert == [3 + 7, 4 + 8]
    assert index.tolist() == [0, 1, 2, 7, 8, 9, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 18, 19, 20, 21]
    assert torch.equal(index[inverse], torch.arange(22))


def test_sharded_binding_refuses_an_unsharded_model():
    with pytest.raises(BindingError, match="call shard_experts"):
        MoEBinding(build(), ep=2, ep_rank=0)
    model = build()
    full = model.layers[0].moe.experts.gate_up_proj.detach().clone()
    shard_experts(model, 1, 2)
    assert torch.equal(model.layers[0].moe.experts.gate_up_proj, full[4:])
    MoEBinding(model, ep=2, ep_rank=1)


def test_binding_composes_to_the_models_own_loss():
    """The reference (tasks joined by autograd, experts sharded over two EP replicas) is the model's function."""
    torch.use_deterministic_algorithms(True)
    try:
        ids = torch.randint(0, 256, (2, 2, 1, 17), generator=torch.Generator().manual_seed(5))
        inputs, labels = ids[..., :-1], ids[..., 1:]
        ref = LocalReference(build, ep=2, microbatches=2)
        losses = ref.step(inputs, labels)
        model = build()
        with torch.no_grad():
            for shard in range(2):
                for mb in range(2):
                    expected = model(inputs[shard, mb], labels=labels[shard, mb])
                    torch.testing.assert_close(losses[shard][mb], expected, rtol=1e-5, atol=1e-6)
        # Replicas end the step with the same (reduced) gradients of the non-expert parameters.
        a, b = (dict(m.named_parameters()) for m in ref.replicas)
        assert torch.equal(a["layers.0.mixer.out_proj.weight"].grad, b["layers.0.mixer.out_proj.weight"].grad)
        assert not torch.equal(a["layers.0.moe.experts.down_proj"].grad, b["layers.0.moe.experts.down_proj"].grad)
    finally:
        torch.use_deterministic_algorithms(False)
