"""The backward split: data gradients now, weight gradients later, exactly once, bit for bit."""

from __future__ import annotations

import random
import warnings
from contextlib import contextmanager

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from runtime import backward_split
from runtime.backward_split import (
    ForwardRunner,
    GeneralSplitWarning,
    OrderedGradients,
    ParamSlot,
    SplitError,
    SplitOp,
    backward_data,
)
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


def test_weight_gradients_are_computed_in_wgrad_not_in_dgrad(monkeypatch):
    b = MoEBinding(small_model())
    slots = b.slots("l1", "shared_expert")
    graph = ForwardRunner().run("l1.shared_expert", b.shared_fn("l1"), [torch.randn(1, 12, 64)], slots)
    assert all(isinstance(op, SplitOp) for op in graph.ops) and len(graph.ops) == len(slots)
    computed: list[str] = []
    original = SplitOp.weight_grads

    def counting(op):
        computed.append(op.rule.name)
        return original(op)

    monkeypatch.setattr(SplitOp, "weight_grads", counting)
    input_grads, job = backward_data(graph, [torch.randn(12, 64)])
    assert input_grads[0] is not None and computed == []
    assert all(op.grad is not None for op in graph.ops)  # (input, grad_output) kept for later
    grads = job.run()
    assert computed == ["linear"] * len(slots)
    assert all(g is not None for g in grads.values())


def _one_op_grads(op, x, weights, grad, split):
    """Gradients of ``op(x, *weights)`` for x and the weights: ordinary autograd, or the split."""
    params = [nn.Parameter(w.clone()) for w in weights]
    holder = nn.Module()
    for i, p in enumerate(params):
        holder.register_parameter(f"w{i}", p)
    slots = tuple(ParamSlot(f"w{i}", holder, f"w{i}") for i in range(len(params)))

    def fn(x):
        return (op(x, *[getattr(holder, f"w{i}") for i in range(len(params))]),)

    if not split:
        return plain_grads(fn, [x], slots, [grad])
    graph = ForwardRunner().run("one", fn, [x], slots)
    assert graph.general_ops == () and [type(o) for o in graph.ops] == [SplitOp]
    return split_grads(fn, [x], slots, [grad])


DEDICATED = {
    "linear 3-d": (lambda x, w: F.linear(x, w), (2, 5, 8), [(6, 8)], (2, 5, 6)),
    "linear 2-d": (lambda x, w: F.linear(x, w, None), (5, 8), [(6, 8)], (5, 6)),
    "linear, x column-major": (lambda x, w: F.linear(x.t(), w), (8, 5), [(6, 8)], (5, 6)),
    "linear, x not contiguous": (lambda x, w: F.linear(x.transpose(0, 1), w), (5, 2, 8), [(6, 8)], (2, 5, 6)),
    "matmul, derived weight": (lambda x, w: x @ w[1].t(), (5, 8), [(3, 6, 8)], (5, 6)),
    "matmul 3-d": (lambda x, w: torch.matmul(x, w), (2, 5, 8), [(8, 6)], (2, 5, 6)),
    "bmm": (lambda x, w: torch.bmm(x, w), (3, 5, 8), [(3, 8, 6)], (3, 5, 6)),
    "mul, norm scale": (lambda x, w: x * w, (2, 5, 8), [(8,)], (2, 5, 8)),
    "mul, weight first": (lambda x, w: w * x, (2, 5, 8), [(5, 1)], (2, 5, 8)),
    "mul, derived weight": (lambda x, w: -w.exp() * x, (2, 5, 4), [(4,)], (2, 5, 4)),
    "add, bias": (lambda x, w: x + w, (2, 5, 8), [(8,)], (2, 5, 8)),
    "add, same shape": (lambda x, w: w + x, (5, 8), [(5, 8)], (5, 8)),
    "conv1d depthwise": (lambda x, w: F.conv1d(x, w, padding=3, groups=6), (2, 6, 9), [(6, 1, 4)], (2, 6, 12)),
    "conv2d": (lambda x, w: F.conv2d(x, w, None, 1, (1, 0)), (2, 3, 5, 5), [(4, 3, 3, 3)], (2, 4, 5, 3)),
    "linear with bias 2-d": (lambda x, w, b: F.linear(x, w, b), (5, 8), [(6, 8), (6,)], (5, 6)),
    "linear with bias 3-d": (lambda x, w, b: F.linear(x, w, bias=b), (2, 5, 8), [(6, 8), (6,)], (2, 5, 6)),
    "linear with bias, x not contiguous": (lambda x, w, b: F.linear(x.transpose(0, 1), w, b), (5, 2, 8), [(6, 8), (6,)], (2, 5, 6)),
    "linear with bias 4-d": (lambda x, w, b: F.linear(x, w, b), (2, 2, 3, 8), [(6, 8), (6,)], (2, 2, 3, 6)),
    "linear, transposed weight view": (lambda x, w: F.linear(x, w.transpose(0, 1)), (5, 8), [(8, 6)], (5, 6)),
    "matmul, batched weight": (lambda x, w: torch.matmul(x, w), (3, 5, 8), [(3, 8, 6)], (3, 5, 6)),
    "matmul, batched expert view": (lambda x, w: x @ w.transpose(1, 2), (3, 5, 8), [(3, 6, 8)], (3, 5, 6)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), (2, 5, 8), [(8,), (8,)], (2, 5, 8)),
    "layer_norm, no bias": (lambda x, w: F.layer_norm(x, (8,), w, eps=1e-6), (2, 5, 8), [(8,)], (2, 5, 8)),
    "layer_norm, two dimensions": (lambda x, w, b: F.layer_norm(x, (5, 8), w, b), (2, 5, 8), [(5, 8), (5, 8)], (2, 5, 8)),
    "rms_norm": (lambda x, w: F.rms_norm(x, (8,), w, 1e-6), (2, 5, 8), [(8,)], (2, 5, 8)),
    "rms_norm, no eps": (lambda x, w: F.rms_norm(x, [8], weight=w), (2, 5, 8), [(8,)], (2, 5, 8)),
}


@pytest.mark.parametrize("case", sorted(DEDICATED))
def test_each_dedicated_split_matches_plain_backward_bitwise(case):
    op, x_shape, w_shapes, out_shape = DEDICATED[case]
    torch.manual_seed(7)
    x = torch.randn(x_shape)
    weights = [torch.randn(s) for s in w_shapes]
    grad = torch.randn(out_shape)
    ref_in, ref_w = _one_op_grads(op, x, weights, grad, split=False)
    got_in, got_w = _one_op_grads(op, x, weights, grad, split=True)
    assert torch.equal(bits(got_in[0]), bits(ref_in[0]))
    for a, b in zip(got_w, ref_w):
        assert torch.equal(bits(a), bits(b))


def test_expert_views_scatter_their_gradients_into_the_one_weight():
    """``w[e].t()`` per expert is a view off autograd's graph; each expert's gradient lands in its slice."""
    torch.manual_seed(5)
    holder = nn.Module()
    holder.gate_up = nn.Parameter(torch.randn(4, 6, 8))
    holder.down = nn.Parameter(torch.randn(4, 8, 3))
    slots = (ParamSlot("gate_up", holder, "gate_up"), ParamSlot("down", holder, "down"))
    per_expert = (3, 0, 5, 2)  # expert 1 gets no token: a zero gradient, as autograd gives

    def fn(x):
        outputs, start = [], 0
        for e, count in enumerate(per_expert):
            chunk = x[start : start + count]
            gate, up = (chunk @ holder.gate_up[e].t()).chunk(2, dim=-1)
            outputs.append((F.silu(gate) * up) @ holder.down[e].transpose(0, 1).t().t())
            start += count
        return (torch.cat(outputs, dim=0),)

    x, grad = torch.randn(10, 8), torch.randn(10, 8)
    graph = ForwardRunner().run("experts", fn, [x], slots)
    assert graph.general_ops == () and len(graph.ops) == 8
    assert all(not w.requires_grad for op in graph.ops for w in op.weight_args)  # no graph node per view
    check_same(fn, [x], slots, [grad])


def test_a_view_used_by_an_operation_without_a_rule_goes_back_on_autograds_graph():
    torch.manual_seed(6)
    holder = nn.Module()
    holder.w = nn.Parameter(torch.randn(3, 8))
    slots = (ParamSlot("w", holder, "w"),)

    def fn(x):
        scaled = holder.w[1].exp()  # a weight-only operation on a fast view
        return (x * scaled + x @ holder.w.t()[:, 2:3],)

    with _no_warning():
        check_same(fn, [torch.randn(5, 8)], slots, [torch.randn(5, 8)])


@contextmanager
def _no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GeneralSplitWarning)
        yield


def test_embedding_split_matches_plain_backward_with_a_padding_index():
    torch.manual_seed(3)
    table = nn.Embedding(10, 4, padding_idx=-2)
    slots = (ParamSlot("embed.weight", table, "weight"),)
    ids = torch.tensor([[1, 8, 3, 8, 1]])
    grad = torch.randn(1, 5, 4)

    def fn(ids):
        return (table(ids),)

    graph = ForwardRunner().run("embed", fn, [ids], slots)
    assert [op.rule.name for op in graph.ops] == ["embedding"]
    _, ref_w = plain_grads(fn, [ids], slots, [grad])
    _, got_w = split_grads(fn, [ids], slots, [grad])
    assert torch.equal(bits(got_w[0]), bits(ref_w[0]))
    assert not got_w[0][8].any()  # the padding row gets no gradient


def test_an_operation_without_a_dedicated_split_takes_the_general_path_and_says_so():
    torch.manual_seed(0)
    act = nn.PReLU(8)  # F.prelu(x, w) has no dedicated split
    slots = (ParamSlot("act.weight", act, "weight"),)

    def fn(x):
        return (act(x),)

    backward_split._warned.discard("_VariableFunctionsClass.prelu")
    with pytest.warns(GeneralSplitWarning, match="prelu' with a parameter has no dedicated backward split"):
        graph = ForwardRunner().run("prelu", fn, [torch.randn(3, 8)], slots)
    assert graph.general_ops == ("_VariableFunctionsClass.prelu",)
    check_same(fn, [torch.randn(3, 8)], slots, [torch.randn(3, 8)])


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
