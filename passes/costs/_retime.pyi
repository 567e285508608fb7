# The contention model's event loop in C++ (passes/costs/csrc/retime.cpp), bound with pybind11;
# passes/costs/contention.py calls it.
from collections.abc import Sequence

def retime(
    duration: Sequence[float],
    stream: Sequence[int],
    order: Sequence[int],
    deps: Sequence[Sequence[int]],
    sm_util: Sequence[float],
    mem_util: Sequence[float],
    bandwidth_share: Sequence[float],
    gbps: Sequence[float],
    sm_share_lost: float,
    comm_hbm_share: float,
    comm_slowdown_per_compute: float,
    comm_slowdown_per_memory: float,
    cross_stream_sync_us: float,
    comm_wait_beside_compute_us: float,
    latency_bound_comm: bool,
    comm_latency_slowdown_per_compute: float,
    comm_gbps_beside_compute: float,
) -> tuple[list[float], list[float], list[int], list[int], list[int]]: ...
