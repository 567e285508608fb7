"""The one interleaved-1F1B order module against an independent enumeration of Megatron-Core's order.

``megatron_order`` (tests/) rebuilds Megatron-Core's schedule table, warm-up counts and steady
1F1B steps on its own; ``passes.pipelining.order`` must give every rank the same sequence of
forwards and backwards, for plain 1F1B (vpp = 1), interleaved 1F1B, the combined-1F1B variant
with its extra warm-up micro-batch, and micro-batch counts that pp does not divide.
"""

from __future__ import annotations

import pytest

from passes.pipelining.order import rank_order, steady_pairs

from megatron_order import rank_order as megatron_rank_order
from megatron_order import steady_pairs as megatron_steady_pairs
from megatron_order import valid_group

# (pp, vpp, micro-batches, micro-batch group size; None: pp)
SETTINGS = [
    (1, 1, 4, None), (2, 1, 4, None), (4, 1, 8, None), (4, 1, 3, None), (8, 1, 64, None),
    (2, 2, 4, None), (4, 2, 8, None), (4, 2, 16, None), (4, 4, 16, None), (8, 2, 64, None), (8, 4, 64, None),
    (16, 2, 64, None), (4, 2, 16, 8),
    # micro-batch counts pp does not divide, with the group sizes Megatron-Core accepts for them
    (4, 2, 10, 5), (4, 2, 10, 6), (4, 3, 9, 5), (4, 3, 9, 9), (8, 2, 20, 12), (3, 2, 7, 4), (3, 4, 11, 4),
]


@pytest.mark.parametrize("combined", [False, True], ids=["1f1b", "combined"])
@pytest.mark.parametrize("pp,vpp,m,group", SETTINGS)
def test_every_rank_runs_megatron_cores_order(pp: int, vpp: int, m: int, group: int | None, combined: bool) -> None:
    if combined and vpp == 1:
        pytest.skip("combined 1F1B is defined for the interleaved schedule")
    assert vpp == 1 or valid_group(pp, m, group or pp)
    for r in range(pp):
        ours = [(a.direction, a.stage(r, pp), a.microbatch) for a in rank_order(pp, vpp, m, r, combined=combined, group=group)]
        theirs = [
            ("fwd" if kind == "F" else "bwd", s, mb) for kind, s, mb in megatron_rank_order(pp, vpp, m, r, combined, group)
        ]
        assert ours == theirs, f"rank {r}"
        pairs = [
            ((r + f[0] * pp, f[1]), (r + b[0] * pp, b[1]))
            for f, b in steady_pairs(pp, vpp, m, r, combined=combined, group=group)
        ]
        assert pairs == megatron_steady_pairs(pp, vpp, m, r, combined, group)


@pytest.mark.parametrize("pp,vpp,m,group", [(4, 2, 10, 4), (4, 2, 10, 3), (4, 2, 6, 4), (4, 2, 10, 11)])
def test_group_sizes_megatron_core_refuses_are_refused(pp: int, vpp: int, m: int, group: int) -> None:
    assert not valid_group(pp, m, group)
    with pytest.raises(ValueError, match="group"):
        rank_order(pp, vpp, m, 0, group=group)


@pytest.mark.parametrize("pp,vpp,m,group", [s for s in SETTINGS if s[1] > 1])
def test_combined_steady_pairs_never_join_a_chunks_forward_and_backward_of_one_micro_batch(
    pp: int, vpp: int, m: int, group: int | None
) -> None:
    for r in range(pp):
        for fwd, bwd in steady_pairs(pp, vpp, m, r, combined=True, group=group):
            assert fwd != bwd
