"""Memory model: static bytes per parameter, interleaved 1F1B in-flight counts, device peaks (hand-computed)."""

from __future__ import annotations

from passes.partitioning.memory import (
    MemoryAssumptions,
    device_peak_bytes,
    inflight_vectors,
    layer_activation_bytes,
    layer_param_bytes,
    layer_static_bytes,
)
from passes.pipelining.order import warmup_forwards
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import synthetic_module


def test_static_bytes_mixed_precision_adam():
    # One layer whose forward tasks own 2e9 bf16 bytes = 1e9 parameters:
    # 2 (bf16 weight) + 4 (fp32 grad) + 12 (fp32 master + 2 moments) = 18 bytes per parameter.
    m = synthetic_module([("attention", "dense")], param_bytes=10**9 // 2, shared_expert=False)
    layer = m.decoder_layers()[0]
    # attention owns param_bytes, the dense MLP 2x: 1.5e9 bytes in all -> 7.5e8 parameters
    params = (10**9 // 2) * 3 // 2
    assert sum(t.param_bytes for t in layer.tasks) == params * 2
    assert layer_static_bytes(layer, ParallelConfig(), MemoryAssumptions()) == params * 18
    # The distributed optimizer (on by default) shards the 12 optimizer bytes over dp=4: 2 + 4 + 3 = 9.
    assert layer_static_bytes(layer, ParallelConfig(dp=4), MemoryAssumptions()) == params * 9
    # Context parallelism adds replicas of the dense weights: dp * cp = 8 shards, 2 + 4 + 1.5 = 7.5.
    assert layer_static_bytes(layer, ParallelConfig(dp=4, cp=2), MemoryAssumptions()) == params * 15 // 2
    # Without the distributed optimizer, dp shards nothing.
    unsharded = ParallelConfig(dp=4, distributed_optimizer=False)
    assert layer_static_bytes(layer, unsharded, MemoryAssumptions()) == params * 18


def test_expert_state_shards_over_expert_data_parallel_ranks():
    # Dense weights shard over dp*cp, expert weights over expert_dp = dp*cp*tp/ep.
    m = synthetic_module([("attention", "moe")], param_bytes=600, shared_expert=False)
    layer = m.decoder_layers()[0]
    dense, expert = layer_param_bytes(layer)
    assert dense > 0 and expert > 0
    p = ParallelConfig(dp=8, tp=2, ep=4)
    assert (p.dp * p.cp, p.expert_dp) == (8, 4)
    want = dense // 2 * (2 + 4 + 12 / 8) + expert // 2 * (2 + 4 + 12 / 4)
    assert layer_static_bytes(layer, p, MemoryAssumptions()) == round(want)


def test_activation_bytes_sum_forward_tasks_only():
    m = synthetic_module([("linear_attention", "moe")])
    layer = m.decoder_layers()[0]
    for i, t in enumerate(layer.tasks):
        t.act_bytes = 1000 + i
    expected = sum(1000 + i for i, t in enumerate(layer.tasks) if t.phase.value == "fwd")
    assert layer_activation_bytes(layer) == expected


def inflight_total(pp: int, vpp: int, microbatches: int, device: int) -> int:
    """Micro-batch chunks a device holds at its peak."""
    return max(sum(v) for v in inflight_vectors(pp, vpp, microbatches, device))


def test_inflight_counts_follow_megatron_interleaving():
    # Non-interleaved 1F1B: device d warms up with pp - d - 1 forwards, so device 0 holds pp micro-batches.
    assert [inflight_total(4, 1, 16, d) for d in range(4)] == [4, 3, 2, 1]
    # Interleaved: 2 (pp - d - 1) + (vpp - 1) pp warm-up forwards; device 0 holds the most.
    assert [inflight_total(4, 2, 16, d) for d in range(4)] == [11, 9, 7, 5]
    # Capped by the number of forwards that exist (microbatches x vpp).
    assert inflight_total(8, 2, 8, 0) == 16
    # Combined 1F1B (expert parallelism on) warms up one more forward: one more micro-batch in flight.
    assert [max(sum(v) for v in inflight_vectors(4, 2, 16, d, combined=True)) for d in range(4)] == [12, 10, 8, 6]


def test_inflight_vectors_per_chunk_by_hand():
    # pp=4, vpp=2, 8 micro-batches, device 0: warm-up forwards 0..9 visit chunk 0 (0-3), 1 (4-7), 0 (8-9).
    # Step 0 issues forward 10 (chunk 0): chunk 0 holds 7, chunk 1 holds 4.
    # Step 1 issues forward 11 (chunk 0) after backward 0 (chunk 1) finished: (8, 3); steps 2-4 stay (8, 3);
    # step 5 issues forward 15 (chunk 1) after backwards 0-3 (chunk 1) and 4 (chunk 0): (7, 4) again.
    assert inflight_vectors(4, 2, 8, 0) == [(7, 4), (8, 3)]
    # Without interleaving there is one chunk and the vector is the in-flight total.
    assert inflight_vectors(4, 1, 8, 1) == [(3,)]
    # Every vector sums to the warm-up forwards plus the steady step's one.
    for d in range(4):
        assert {sum(v) for v in inflight_vectors(4, 2, 16, d)} == {warmup_forwards(4, 2, 16, d) + 1}


def test_device_peak_bytes_by_hand():
    static = [100, 200]
    act = [10, 30]
    vectors = [(7, 4), (8, 3)]
    # max(7*10 + 4*30, 8*10 + 3*30) = max(190, 170) = 190; headroom = max act = 30.
    assert device_peak_bytes(static, act, vectors, wgrad_headroom=True) == 300 + 190 + 30
    assert device_peak_bytes(static, act, vectors, wgrad_headroom=False) == 300 + 190
    # The reserve (CUDA context, communication buffers) is added once per device.
    assert device_peak_bytes(static, act, vectors, wgrad_headroom=False, reserved=1000) == 1000 + 300 + 190
