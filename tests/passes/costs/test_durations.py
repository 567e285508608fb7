"""Isolated task durations: the hierarchical All-to-All, GEMM and core parts, the expert-GEMM curve."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from passes.costs.durations import analytic_duration_us, task_utilisation
from passes.costs.hardware import (
    HARDWARE_DIR,
    AllToAll,
    HardwareError,
    a2a_link_bytes,
    load_hardware,
)
from tessera_ir.kinds import Phase, Resource, TaskOp
from tessera_ir.model import Task
from tessera_ir.parallel import ParallelConfig

H100 = load_hardware("h100")


def a2a(nbytes: int, top_k: int = 8) -> Task:
    return Task("l0.dispatch.fwd", TaskOp.DISPATCH, Phase.FWD, Resource.COMM, bytes=nbytes, attrs={"top_k": top_k})


def test_every_shipped_figure_names_its_source():
    for name in ("h100", "h200"):
        data = json.loads((HARDWARE_DIR / f"{name}.json").read_text())
        covered = " ".join(data["sources"])
        for key in ("gpus_per_node", "nvlink_gbps", "nic_gbps", "all_to_all.nvlink_efficiency",
                    "all_to_all.nic_efficiency", "all_to_all.dedup_per_node", "expert_gemm_efficiency",
                    "core_efficiency.attention", "core_efficiency.linear_attention"):
            assert key in covered, (name, key)


def test_all_to_all_inside_a_node_uses_nvlink_only():
    on, off = a2a_link_bytes(7e8, 8, H100)
    assert (on, off) == (7e8, 0.0)
    task = a2a(7 * 10**8)
    want = H100.a2a_latency_us + 7e8 / (450e9 * 0.75) * 1e6
    assert analytic_duration_us(task, H100, ParallelConfig(ep=8)) == pytest.approx(want)


def test_beyond_a_node_only_the_off_node_share_crosses_the_nic():
    # EP32 on 8-GPU nodes: of a rank's slots 1/32 stay, 7/32 go over NVLink, 24/32 over the NIC,
    # at the same time: the time is the slower of the two links.
    sent = 31 * 10**7  # (ep-1)/ep of 32e7 slot bytes
    on, off = a2a_link_bytes(sent, 32, H100)
    assert on == pytest.approx(7e7) and off == pytest.approx(24e7)
    want = H100.a2a_latency_us + max(7e7 / (450e9 * 0.75), 24e7 / (50e9 * 0.88)) * 1e6
    assert analytic_duration_us(a2a(sent), H100, ParallelConfig(ep=32)) == pytest.approx(want)
    # Every byte at NIC speed (the earlier model) would be 31/24 times slower on the NIC side.
    assert want < H100.a2a_latency_us + sent / (50e9 * 0.88) * 1e6


def test_per_node_dedup_sends_a_token_once_per_remote_node():
    dedup = replace(H100, all_to_all=AllToAll(0.75, 0.88, dedup_per_node=True))
    sent = 31 * 10**7
    slots, nodes, k = 32e7, 4, 8
    on, off = a2a_link_bytes(sent, 32, dedup, top_k=k)
    assert off == pytest.approx(slots / k * (nodes - 1) * (1 - (1 - 1 / nodes) ** k))
    assert on == pytest.approx(slots * 7 / 8)
    plain = a2a_link_bytes(sent, 32, H100, top_k=k)[1]
    assert off < plain  # 3 * (1 - 0.75^8) = 2.7 token copies per token cross the NIC instead of 6
    # Without a top-k there is nothing to deduplicate.
    assert a2a_link_bytes(sent, 32, dedup, top_k=1)[1] == pytest.approx(plain)


def compute_task(op: TaskOp, flops: int, nbytes: int, **attrs: int) -> Task:
    return Task(f"l0.{op.value}.fwd", op, Phase.FWD, Resource.COMPUTE, flops=flops, bytes=nbytes, attrs=dict(attrs))


def test_gemm_and_core_parts_are_priced_with_their_own_efficiency():
    p = ParallelConfig()
    peak, hbm = 989e12, 3350e9
    whole = compute_task(TaskOp.ATTENTION, 10**12, 10**8)
    assert analytic_duration_us(whole, H100, p) == pytest.approx(5 + max(1e12 / (peak * 0.70), 1e8 / hbm) * 1e6)
    split = compute_task(TaskOp.ATTENTION, 10**12, 10**8, core_flops=4 * 10**11, core_bytes=2 * 10**7)
    gemm = max(6e11 / (peak * 0.70), 8e7 / hbm)
    core = max(4e11 / (peak * 0.60), 2e7 / hbm)
    assert analytic_duration_us(split, H100, p) == pytest.approx(5 + (gemm + core) * 1e6)
    # Utilisation is the time-weighted mix of the parts (both compute-bound here).
    assert task_utilisation(split, H100, p) == pytest.approx((1.0, (8e7 / hbm + 2e7 / hbm) / (gemm + core)))


def test_a_data_gradient_core_runs_at_the_backward_efficiency():
    # The backward kernels of a core reach less of peak than the forward (measured on an H200:
    # SDPA's backward 0.36-0.40 on 2.5x the forward FLOPs, the chunked delta rule's 0.06); the
    # projection GEMMs of the same task keep the GEMM efficiency, and forward tasks the forward one.
    h200 = load_hardware("h200")
    p = ParallelConfig()
    peak, hbm = h200.peak_flops("bf16"), h200.hbm_gbps * 1e9
    attrs = {"core_flops": 4 * 10**11, "core_bytes": 2 * 10**7}
    fwd = Task("l0.attention.fwd", TaskOp.ATTENTION, Phase.FWD, Resource.COMPUTE, flops=10**12, bytes=10**8, attrs=dict(attrs))
    dgrad = replace(fwd, name="l0.attention.dgrad", phase=Phase.DGRAD, attrs=dict(attrs))
    gemm = max(6e11 / (peak * h200.efficiency["attention"]), 8e7 / hbm)
    core = {e: max(4e11 / (peak * e), 2e7 / hbm) for e in (h200.core_efficiency["attention"], h200.core_backward_efficiency["attention"])}
    launch = h200.kernel_launch_us
    assert analytic_duration_us(fwd, h200, p) == pytest.approx(launch + (gemm + core[h200.core_efficiency["attention"]]) * 1e6)
    assert analytic_duration_us(dgrad, h200, p) == pytest.approx(
        launch + (gemm + core[h200.core_backward_efficiency["attention"]]) * 1e6)
    # Without a backward figure (the h100 file), the dgrad's core runs at the forward efficiency.
    assert H100.core_backward_efficiency == {}
    assert analytic_duration_us(replace(dgrad, attrs=dict(attrs)), H100, p) == pytest.approx(
        analytic_duration_us(replace(fwd, attrs=dict(attrs)), H100, p))


def test_expert_gemm_efficiency_follows_the_rows_per_expert():
    curve = dict(H100.expert_gemm_curve)
    assert H100.expert_efficiency(1024) == pytest.approx(curve[1024])
    # Between points: linear in log2(rows); beyond the last: flat; below the first: in proportion to rows.
    mid = H100.expert_efficiency(2048)
    assert mid == pytest.approx((curve[1024] + curve[4096]) / 2)
    assert H100.expert_efficiency(10**6) == pytest.approx(curve[8192])
    assert H100.expert_efficiency(64) == pytest.approx(curve[128] / 2)
    p = ParallelConfig()
    small = compute_task(TaskOp.EXPERT_GEMM, 10**12, 10**6, rows_per_expert=128)
    large = compute_task(TaskOp.EXPERT_GEMM, 10**12, 10**6, rows_per_expert=8192)
    assert analytic_duration_us(small, H100, p) > 1.5 * analytic_duration_us(large, H100, p)


def test_a_cpu_gemm_adds_its_operand_packing_to_its_arithmetic(tmp_path):
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    data.update(name="packing", peak_tflops={"fp32": 0.1, "bf16": 0.1}, hbm_gbps=20.0, kernel_launch_us=5.0,
                efficiency={"attention": 1.0}, gemm_packing_gbps={"fp32": 8.0})
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    cpu = load_hardware(path)
    p = ParallelConfig(dtype="fp32")
    gemm = compute_task(TaskOp.ATTENTION, 2 * 10**8, 4 * 10**6)
    # 2 ms of arithmetic, then 0.5 ms packing 4 MB at 8 GB/s: added, not overlapped.
    assert analytic_duration_us(gemm, cpu, p) == pytest.approx(5 + 2000 + 500)
    assert task_utilisation(gemm, cpu, p) == pytest.approx((1.0, 200 / 2500))
    # A kernel with no arithmetic (a copy) moves its bytes at the memory bandwidth only.
    copy = compute_task(TaskOp.ATTENTION, 0, 4 * 10**6)
    assert analytic_duration_us(copy, cpu, p) == pytest.approx(5 + 200)
    # No rate for the dtype (and none in the GPU files): the plain roofline.
    assert analytic_duration_us(gemm, cpu, ParallelConfig(dtype="bf16")) == pytest.approx(5 + 2000)
    assert H100.gemm_packing_gbps == {}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"all_to_all": {"nvlink_efficiency": 1.5}}, "nvlink_efficiency must lie in"),
        ({"all_to_all": {"dedup_per_node": "yes"}}, "dedup_per_node must be true or false"),
        ({"expert_gemm_efficiency": {"rows_per_expert": [256, 128], "efficiency": [0.4, 0.5]}}, "strictly increasing"),
        ({"core_efficiency": {"attention": -1}}, "positive numbers"),
        ({"core_backward_efficiency": {"attention": 0}}, "'core_backward_efficiency' must map task ops to positive numbers"),
        ({"gemm_packing_gbps": {"fp32": 0}}, "'gemm_packing_gbps' must map dtypes to positive numbers"),
    ],
)
def test_malformed_descriptions_are_refused(tmp_path, change, message):
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    data.update(change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HardwareError, match=message):
        load_hardware(path)


def test_a_description_without_links_names_the_missing_fields(tmp_path):
    data = json.loads((HARDWARE_DIR / "h100.json").read_text())
    del data["nic_gbps"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    with pytest.raises(HardwareError, match="lacks nic_gbps"):
        load_hardware(path)
