"""The per-rank order of interleaved 1F1B: against a literal enumeration, run to completion, meetings."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.pipelining import order
from passes.pipelining.order import (
    Action,
    DependentPairError,
    backward_slot,
    forward_slot,
    meeting_chunks,
    meeting_stages,
    rank_order,
    steady_pairs,
    warmup_forwards,
)

GRID = [
    (pp, vpp, m)
    for pp, vpp, m in itertools.product([1, 2, 3, 4], [1, 2, 3], [1, 2, 3, 4, 5, 6, 8, 9, 12])
    if vpp == 1 or m % pp == 0  # interleaving needs whole groups of pp micro-batches
]


# Micro-batch counts pp does not divide, with group sizes Megatron-Core accepts for them
# (``microbatch_group_size_per_vp_stage``), and a whole-group case with groups larger than pp.
GROUP_GRID = [(4, 2, 10, 5), (4, 2, 10, 6), (4, 3, 9, 5), (4, 3, 9, 9), (8, 2, 20, 12), (3, 2, 7, 4), (3, 4, 11, 4), (4, 2, 16, 8)]


def enumerate_megatron(pp: int, vpp: int, m: int, rank: int, combined: bool = False, group: int | None = None) -> list[tuple]:
    """Megatron-Core's loop, written out literally: the schedule table of (micro-batch, chunk) in
    groups of ``group`` micro-batches (pp by default; the last group takes what is left), a
    warm-up of forwards, then one forward and one backward per step, then the remaining backwards."""
    size = group or pp
    table = []
    for start in range(0, m, size):
        stop = m if start + size >= m else start + size
        for chunk in range(vpp):
            for mb in range(start, stop):
                table.append((chunk, mb))
    forwards = table
    backwards = [(vpp - 1 - chunk, mb) for chunk, mb in table]
    total = m * vpp
    warm = pp - rank - 1 if vpp == 1 else (pp - rank - 1) * 2 + (vpp - 1) * size
    if combined:
        # Megatron-Core refuses combined 1F1B without virtual stages; Tessera's takes the
        # interleaved warm-up's 2 (pp - r - 1) there too, so that neighbours' pairs overlap.
        warm = (pp - rank - 1) * 2 + 1 if vpp == 1 else warm + 1
    warm = min(warm, total)
    out: list[tuple] = [("fwd", *forwards[k], "warmup", None) for k in range(warm)]
    for k in range(total - warm):
        out.append(("fwd", *forwards[warm + k], "steady", backwards[k]))
        out.append(("bwd", *backwards[k], "steady", forwards[warm + k]))
    out += [("bwd", *backwards[k], "cooldown", None) for k in range(total - warm, total)]
    return out


def as_tuples(actions: list[Action]) -> list[tuple]:
    return [(a.direction, a.chunk, a.microbatch, a.phase, a.paired_with) for a in actions]


@pytest.mark.parametrize("combined", [False, True])
def test_rank_order_is_megatrons_enumeration(combined: bool) -> None:
    for pp, vpp, m in GRID:
        for rank in range(pp):
            assert as_tuples(rank_order(pp, vpp, m, rank, combined)) == enumerate_megatron(pp, vpp, m, rank, combined), (
                pp, vpp, m, rank,
            )


def runs_to_completion(orders: dict[int, list[tuple]], pp: int, vpp: int, m: int) -> int | None:
    """Execute every rank's order (tuples as ``enumerate_megatron`` writes them) in lock-step
    rounds under the pipeline's data dependencies: the forward of stage s needs stage s-1's
    forward of the same micro-batch, the backward of stage s needs its own forward and stage
    s+1's backward. Returns the rounds taken, or None on a deadlock (a round where no rank
    can move)."""
    stages = pp * vpp
    done: set[tuple[str, int, int]] = set()
    position = dict.fromkeys(orders, 0)
    rounds = 0
    while any(position[r] < len(orders[r]) for r in orders):
        ready = []
        for r in orders:
            if position[r] == len(orders[r]):
                continue
            direction, chunk, mb = orders[r][position[r]][:3]
            s = r + chunk * pp
            if direction == "fwd":
                ok = s == 0 or ("fwd", s - 1, mb) in done
            else:
                ok = ("fwd", s, mb) in done and (s == stages - 1 or ("bwd", s + 1, mb) in done)
            if ok:
                ready.append((r, (direction, s, mb)))
        if not ready:
            return None
        for r, key in ready:
            done.add(key)
            position[r] += 1
        rounds += 1
    assert done == {(d, s, mb) for d in ("fwd", "bwd") for s in range(stages) for mb in range(m)}
    return rounds


def run_all_ranks(pp: int, vpp: int, m: int, combined: bool = False, group: int | None = None) -> int:
    rounds = runs_to_completion({r: as_tuples(rank_order(pp, vpp, m, r, combined, group)) for r in range(pp)}, pp, vpp, m)
    assert rounds is not None, f"the orders of pp={pp} vpp={vpp} m={m} deadlock"
    return rounds


@pytest.mark.parametrize("combined", [False, True])
def test_every_rank_order_runs_to_completion_and_covers_every_stage_and_microbatch(combined: bool) -> None:
    for pp, vpp, m in GRID:
        run_all_ranks(pp, vpp, m, combined)
        for rank in range(pp):
            actions = rank_order(pp, vpp, m, rank, combined)
            for direction in ("fwd", "bwd"):
                mine = sorted((a.chunk, a.microbatch) for a in actions if a.direction == direction)
                assert mine == sorted(itertools.product(range(vpp), range(m)))


def test_plain_1f1b_takes_the_textbook_time() -> None:
    # With unit-time forwards and backwards, vpp = 1, 1F1B finishes in 2 (m + pp - 1) rounds.
    for pp, m in [(2, 4), (4, 8), (4, 4), (3, 7)]:
        assert run_all_ranks(pp, 1, m) == 2 * (m + pp - 1)


def test_warmup_counts() -> None:
    # Plain 1F1B: rank r warms up with pp - r - 1 forwards; interleaved: 2 (pp - r - 1) + (vpp - 1) pp.
    assert [warmup_forwards(4, 1, 16, r) for r in range(4)] == [3, 2, 1, 0]
    assert [warmup_forwards(4, 2, 16, r) for r in range(4)] == [10, 8, 6, 4]
    assert [warmup_forwards(4, 2, 16, r, combined=True) for r in range(4)] == [11, 9, 7, 5]
    # Combined at vpp = 1: 2 (pp - r - 1) + 1, neighbours two apart (see order.py's docstring).
    assert [warmup_forwards(4, 1, 16, r, combined=True) for r in range(4)] == [7, 5, 3, 1]
    assert warmup_forwards(8, 2, 8, 0) == 16  # capped by the forwards that exist
    with pytest.raises(ValueError, match="rank must lie"):
        warmup_forwards(4, 1, 16, 4)


def test_slots_by_hand() -> None:
    # pp=2, vpp=2, 4 micro-batches: groups {0, 1}, {2, 3}; chunk 0 then chunk 1 in each.
    assert [forward_slot(k, 2, 2, 4) for k in range(8)] == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]
    assert [backward_slot(k, 2, 2, 4) for k in range(4)] == [(1, 0), (1, 1), (0, 0), (0, 1)]
    assert [forward_slot(k, 3, 1, 5) for k in range(5)] == [(0, k) for k in range(5)]
    with pytest.raises(ValueError, match="beyond"):
        forward_slot(8, 2, 2, 4)


def test_interleaving_refuses_partial_groups() -> None:
    # Plain 1F1B runs any micro-batch count; interleaving needs whole groups of pp.
    run_all_ranks(4, 1, 7)
    with pytest.raises(ValueError, match="multiple of pp"):
        rank_order(4, 2, 6, 0)
    # Why: with a shorter last group, in-order execution deadlocks (the literal table order).
    table_order = {r: enumerate_megatron(4, 3, 5, r) for r in range(4)}
    assert not runs_to_completion(table_order, 4, 3, 5)


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("pp,vpp,m,group", GROUP_GRID)
def test_micro_batch_counts_pp_does_not_divide_run_in_larger_groups(pp: int, vpp: int, m: int, group: int, combined: bool) -> None:
    for rank in range(pp):
        ours = as_tuples(rank_order(pp, vpp, m, rank, combined, group))
        assert ours == enumerate_megatron(pp, vpp, m, rank, combined, group), (pp, vpp, m, group, rank)
    run_all_ranks(pp, vpp, m, combined, group)
    if combined:
        for rank in range(pp):
            assert all(f != b for f, b in steady_pairs(pp, vpp, m, rank, combined=True, group=group))


@pytest.mark.parametrize("pp,vpp,m,group", [(4, 2, 10, 4), (4, 2, 10, 3), (4, 2, 10, 11), (4, 3, 9, 7)])
def test_group_sizes_megatron_core_refuses_are_refused(pp: int, vpp: int, m: int, group: int) -> None:
    # Outside [pp, m], or a last group of 1..pp-1 micro-batches, which stalls the pipeline
    # (dependency bubbles; with some counts for ever, see test_interleaving_refuses_partial_groups).
    with pytest.raises(ValueError, match="group size"):
        rank_order(pp, vpp, m, 0, group=group)


def test_meeting_chunks_interleaved_1f1b() -> None:
    # Device 0 of pp=4, vpp=2 has W=10 forwards of warm-up: its forward and backward groups are
    # half a group apart, so steps pair chunk 0 with 1, 1 with 1, 1 with 0, 0 with 0 in turn.
    assert meeting_chunks(4, 2, 64, 0) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # The last device (W = (vpp-1) pp) is in phase: each chunk only meets itself.
    assert meeting_chunks(4, 2, 64, 3) == [(0, 0), (1, 1)]
    assert meeting_chunks(4, 1, 64, 2) == [(0, 0)]
    # Stages: chunk c of device d is virtual stage d + c*pp.
    assert meeting_stages(4, 2, 64)[0] == [(0, 0), (0, 4), (4, 0), (4, 4)]
    # Device 1 warms up with W=8 forwards, a whole number of 2·pp groups: exactly out of phase.
    assert meeting_stages(4, 2, 64)[1] == [(1, 5), (5, 1)]
    # Without a steady state (all forwards in the warm-up) every chunk meets itself.
    assert meeting_chunks(4, 2, 4, 0) == [(0, 0), (1, 1)]


def test_plain_order_pairs_dependent_work_on_the_last_rank() -> None:
    # The reason for the combined variant: without the extra warm-up forward, the last rank's
    # steady pairs join a chunk's forward and backward of the same micro-batch.
    pp, vpp, m = 4, 2, 8
    same = [(f, b) for f, b in steady_pairs(pp, vpp, m, pp - 1) if f[1] == b[1]]
    assert same and all(f == b for f, b in same)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 24), st.data())
def test_combined_order_pairs_only_independent_work(pp: int, vpp: int, m: int, data: st.DataObject) -> None:
    # In combined 1F1B the forward and backward of a steady pair belong to different
    # micro-batches, so neither depends on the other and they can overlap.
    if vpp > 1:
        m = pp * (m // pp + 1)
    rank = data.draw(st.integers(0, pp - 1))
    for fwd, bwd in steady_pairs(pp, vpp, m, rank, combined=True):
        assert fwd[1] != bwd[1], (pp, vpp, m, rank, fwd, bwd)
    actions = rank_order(pp, vpp, m, rank, combined=True)
    assert as_tuples(actions) == enumerate_megatron(pp, vpp, m, rank, combined=True)


def megatron_virtual_slot(k: int, pp: int, vpp: int, forward: bool) -> tuple[int, int]:
    """Megatron-Core's own indexing of a rank's k-th virtual micro-batch (``get_model_chunk_id`` and
    ``get_microbatch_id_in_model_chunk`` of its interleaved schedule), written from their definitions:
    the chunk is the position within a group of pp*vpp divided by pp (reversed for backwards), the
    micro-batch is the group's first micro-batch plus the position modulo pp."""
    in_group = k % (pp * vpp)
    chunk = in_group // pp
    if not forward:
        chunk = vpp - 1 - chunk
    return chunk, (k // (pp * vpp)) * pp + k % pp


def independent_meetings(pp: int, vpp: int, m: int, rank: int) -> set[tuple[int, int]]:
    """Chunk combinations of a rank's combined-1F1B steady state, from Megatron-Core's indexing and its
    warm-up count with expert-parallel overlap on (one more than interleaved 1F1B's)."""
    total = m * vpp
    warm = min(total, (pp - rank - 1) * 2 + (vpp - 1) * pp + 1) if vpp > 1 else min(total, pp - rank)
    return {
        (megatron_virtual_slot(warm + j, pp, vpp, True)[0], megatron_virtual_slot(j, pp, vpp, False)[0])
        for j in range(total - warm)
    }


@pytest.mark.parametrize(("pp", "vpp", "m"), [(8, 2, 64), (4, 2, 16), (4, 3, 12), (6, 2, 24), (8, 4, 64), (2, 2, 8)])
def test_combined_meetings_match_an_independent_enumeration(pp: int, vpp: int, m: int) -> None:
    for rank in range(pp):
        got = set(meeting_chunks(pp, vpp, m, rank, combined=True))
        want = independent_meetings(pp, vpp, m, rank) or {(c, c) for c in range(vpp)}
        assert got == want, (pp, vpp, m, rank)


def test_combined_order_meets_every_chunk_combination_on_the_middle_and_last_devices() -> None:
    # PP8 VPP2, 64 micro-batches: in the plain order the last device meets only (0,0) and (1,1), pairing a
    # chunk's forward with the backward of the same micro-batch, and the middle device 3 (W = 16, a whole
    # number of groups) only (0,1) and (1,0); with the extra warm-up forward every device meets all four.
    assert meeting_chunks(8, 2, 64, 7) == [(0, 0), (1, 1)]
    assert meeting_chunks(8, 2, 64, 3) == [(0, 1), (1, 0)]
    for rank in range(8):
        assert meeting_chunks(8, 2, 64, rank, combined=True) == [(0, 0), (0, 1), (1, 0), (1, 1)], rank


def test_every_combined_pair_is_independent_in_the_executed_order() -> None:
    # Independence read off the order itself: the backward of a steady pair may only run beside a
    # forward if its own forward (same chunk, same micro-batch) ran on this rank at an earlier step.
    for pp, vpp, m in [(8, 2, 64), (4, 2, 16), (4, 1, 9), (3, 3, 9)]:
        for rank in range(pp):
            actions = rank_order(pp, vpp, m, rank, combined=True)
            done: set[tuple[int, int]] = set()
            for a in actions:
                if a.phase == "steady" and a.direction == "fwd":
                    assert a.paired_with in done, (pp, vpp, m, rank, a)
                if a.direction == "fwd":
                    done.add((a.chunk, a.microbatch))


def test_the_pair_builder_refuses_dependent_pairs(monkeypatch: pytest.MonkeyPatch) -> None:
    # A combined order that forgot its extra warm-up forward would pair one micro-batch's forward and
    # backward of one chunk on the last rank: steady_pairs says so instead of building the pair.
    plain_warmup = order.warmup_forwards

    def forgetful(
        pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
    ) -> int:
        return plain_warmup(pp, vpp, microbatches, rank, False, group)

    monkeypatch.setattr(order, "warmup_forwards", forgetful)
    with pytest.raises(DependentPairError, match="depends on that forward"):
        steady_pairs(4, 2, 8, 3, combined=True)
    # The plain order is a forward followed by a backward, not an overlap: its last rank is allowed.
    assert steady_pairs(4, 2, 8, 3)
