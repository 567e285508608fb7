"""The backward split: data gradients now, weight gradients later, exactly once, bit for bit."""

from __future__ import annotations

import random

import pytest
import torch
from torch import nn

from runtime.backward_split import ForwardRunner, OrderedGradients, ParamSlot, SplitError, backward_data
from runtime.moe_binding import MoEBinding, Routing, shard_experts

from tiny_plan import tiny_example

TinyConfig, TinyQwen3Next = tiny_example().TinyConfig, tiny_example().TinyQwen3Next


@pytest.fixture(autouse=True)
def _deterministic():
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return TinyQwen3Next(TinyConfig(num_layers=4))


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int32)


def plain_grads(fn, inputs, slots, grad_outputs):
    """The reference: the same forward on ordinary parameters, one autograd.backward."""
    leaves = [x.detach().requires_grad_() if x.is_floating_point() else x for x in inputs]
    params = [s.param for s in slots]
    for p in params:
        p.grad = None
    outs = fn(*leaves)
    pairs = [(o, g) for o, g in zip(outs, grad_outputs) if o.requires_grad and (g is not None or o.dim() == 0)]
    torch.autograd.backward([o for o, _ in pairs], [g if g is not None else torch.ones_like(o) for o, g in pairs])
    return [x.grad if x.is_floating_point() else None for x in leaves], [p.grad for p in params]


def split_grads(fn, inputs, slots, grad_outputs, extra=()):
    graph = ForwardRunner().run("task", fn, inputs, slots, extra)
    input_grads, job = backward_data(graph, grad_outputs)
    weight_grads = job.run()
    return input_grads, [weight_grads[s.key] for s in slots]


def check_same(fn, inputs, slots, grad_outputs, extra=()):
    def full(*xs):
        return fn(*xs, *extra)

    ref_in, ref_w = plain_grads(full, inputs, slots, grad_outputs)
    got_in, got_w = split_grads(fn, inputs, slots, grad_outputs, extra)
    for a, b in zip(got_in, ref_in):
        assert (a is None) == (b is None)
        if a is not None:
            assert torch.equal(bits(a), bits(b))
    for s, a, b in zip(slots, got_w, ref_w):
        assert a is not None and b is not None, s.key
        assert torch.equal(bits(a), bits(b)), s.key


@pytest.mark.parametrize("layer", ["l0", "l3"])  # linear attention (Gated DeltaNet) and softmax attention
def test_mixer_split_matches_plain_backward(layer):
    b = MoEBinding(small_model())
    x = torch.randn(1, 12, 64)
    g_h, g_n = torch.randn(1, 12, 64), torch.randn(1, 12, 64)
    check_same(b.mixer_fn(layer), [x], b.slots(layer, "mixer"), [g_h, g_n])


def test_router_shared_and_head_split_match_plain_backward():
    b = MoEBinding(small_model())
    n = torch.randn(1, 12, 64)
    permuted_grad, weights_grad = torch.randn(24, 64), torch.randn(12, 2)
    check_same(b.router_fn("l1"), [n], b.slots("l1", "router"), [permuted_grad, weights_grad, None, None])
    check_same(b.shared_fn("l1"), [n], b.slots("l1", "shared_expert"), [torch.randn(12, 64)])
    labels = torch.randint(0, 256, (1, 12))
    check_same(b.head_fn(8), [torch.randn(1, 12, 64)], b.slots("head", "lm_head"), [None, None], extra=(labels,))


def test_expert_split_matches_plain_backward_on_a_shard():
    model = small_model()
    shard_experts(model, 1, 2)
    b = MoEBinding(model, ep=2, ep_rank=1)
    counts = ((3, 0, 5, 1, 4, 2, 0, 6), (1, 2, 0, 3, 7, 0, 2, 1))
    routing = Routing(counts, 2, 1)
    index, inverse, per_expert = routing.regroup()
    received = torch.randn(sum(routing.recv_splits), 64)
    grad = torch.randn_like(received)
    check_same(b.experts_fn("l2"), [received], b.slots("l2", "expert_gemm"), [grad], extra=(index, inverse, per_expert))


def test_embedding_weight_gradient_comes_from_the_output_gradient():
    b = MoEBinding(small_model())
    ids = torch.randint(0, 256, (1, 12))
    check_same(b.embedding_fn(), [ids], b.slots("embed", "embedding"), [torch.randn(1, 12, 64)])


def test_weight_gradients_are_computed_in_wgrad_not_in_dgrad():
    b = MoEBinding(small_model())
    slots = b.slots("l1", "shared_expert")
    graph = ForwardRunner().run("l1.shared_expert", b.shared_fn("l1"), [torch.randn(1, 12, 64)], slots)
    computed: list[int] = []
    weights = [w for op in graph.ops for w in op.inner_weights]
    assert len(weights) == len(slots)  # each parameter is used by one operation here
    for i, w in enumerate(weights):
        w.register_hook(lambda g, i=i: computed.append(i))
    input_grads, job = backward_data(graph, [torch.randn(12, 64)])
    assert input_grads[0] is not None and computed == []
    grads = job.run()
    assert sorted(computed) == list(range(len(weights)))
    assert all(g is not None for g in grads.values())


def test_each_half_runs_exactly_once():
    b = MoEBinding(small_model())
    graph = ForwardRunner().run("t", b.shared_fn("l0"), [torch.randn(1, 12, 64)], b.slots("l0", "shared_expert"))
    _, job = backward_data(graph, [torch.randn(12, 64)])
    with pytest.raises(SplitError, match="data gradients of 't' were already computed"):
        backward_data(graph, [torch.randn(12, 64)])
    job.run()
    with pytest.raises(SplitError, match="weight gradients of 't' were already computed"):
        job.run()


def test_a_weight_applied_twice_in_a_chain_gets_both_applications():
    torch.manual_seed(0)
    cell = nn.Linear(8, 8)
    slots = (ParamSlot("cell.weight", cell, "weight"), ParamSlot("cell.bias", cell, "bias"))

    def twice(x):
        return (cell(torch.tanh(cell(x))),)

    ref_in, ref_w = plain_grads(twice, [torch.ones(2, 8)], slots, [torch.full((2, 8), 0.5)])
    got_in, got_w = split_grads(twice, [torch.ones(2, 8)], slots, [torch.full((2, 8), 0.5)])
    torch.testing.assert_close(got_in[0], ref_in[0], rtol=0, atol=0)
    for a, b in zip(got_w, ref_w):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # a sum of two applications, in another order


def test_parameters_are_restored_after_a_task_even_when_it_fails():
    lin = nn.Linear(4, 4)
    original = lin.weight
    slots = (ParamSlot("w", lin, "weight"),)

    def broken(x):
        lin(x)
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        ForwardRunner().run("t", broken, [torch.randn(2, 4)], slots)
    assert lin.weight is original and isinstance(lin.weight, nn.Parameter)


def test_ordered_gradients_fold_in_microbatch_order_whatever_the_arrival_order():
    torch.manual_seed(1)
    grads = [torch.randn(1000) * 10 ** k for k in range(6)]
    in_order = nn.Parameter(torch.zeros(1000))
    acc = OrderedGradients({"p": in_order}, 6)
    acc.begin_iteration()
    for mb, g in enumerate(grads):
        acc.add("p", mb, g.clone())
    shuffled = nn.Parameter(torch.zeros(1000))
    acc2 = OrderedGradients({"p": shuffled}, 6)
    acc2.begin_iteration()
    order = list(range(6))
    random.Random(3).shuffle(order)
    for mb in order:
        acc2.add("p", mb, grads[mb].clone())
    assert acc.complete("p") and acc2.complete("p")
    assert torch.equal(bits(in_order.grad), bits(shuffled.grad))
    # ... which is what autograd accumulates, micro-batch after micro-batch
    expected = grads[0].clone()
    for g in grads[1:]:
        expected += g
    assert torch.equal(bits(in_order.grad), bits(expected))


def test_ordered_gradients_refuse_a_gradient_twice_and_report_missing_ones():
    p = nn.Parameter(torch.zeros(3))
    acc = OrderedGradients({"p": p}, 3)
    acc.begin_iteration()
    acc.add("p", 1, torch.ones(3))
    assert acc.missing() == [("p", 0)]
    with pytest.raises(SplitError, match="micro-batch 1 arrived twice"):
        acc.add("p", 1, torch.ones(3))
    with pytest.raises(SplitError, match="not a parameter this rank trains"):
        acc.add("q", 0, torch.ones(3))
