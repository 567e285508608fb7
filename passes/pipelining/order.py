"""The per-rank order of interleaved 1F1B: which forward and backward each pipeline rank runs, when.

Everything in Tessera that depends on the pipeline schedule reads it here: which chunk pairs
meet on a device (the candidates and partition passes, the report), how many micro-batches a
device holds in flight (the memory model), and what each rank executes, step by step
(``rank_steps``: the ``pipeline`` pass lowers these steps into per-rank programs, and the
simulator runs the steps of those programs).

Vocabulary. ``pp`` ranks each hold ``vpp`` model chunks; chunk ``c`` of rank ``r`` is
virtual stage ``r + c·pp``. ``microbatches`` (``m``) micro-batches go through every stage
forward, then backward. An ``Action`` is one forward or backward of one chunk for one
micro-batch on one rank.

The order is Megatron-Core's (``forward_backward_pipelining_with_interleaving``; with
``vpp = 1`` its plain 1F1B):

1. Forwards on a rank visit micro-batches in groups of ``group`` (Megatron-Core's
   ``microbatch_group_size_per_vp_stage``, ``pp`` unless given): for each group, chunk 0
   runs the group's micro-batches, then chunk 1, ...; the last group holds the micro-batches
   that remain. Backwards visit the same sequence with the chunks reversed (the last chunk
   first). ``forward_slot(k)`` / ``backward_slot(k)`` give the (chunk, micro-batch) of a
   rank's k-th forward / backward. Interleaving (``vpp > 1``) takes a group size in
   ``[pp, m]`` whose remainder ``m mod group`` is 0 or at least ``pp``, as Megatron-Core
   does: a last group shorter than ``pp`` stalls ranks running their orders in sequence
   (dependency bubbles; for some counts they wait on each other for ever, the tests show such
   a deadlock). So a micro-batch count ``pp``
   does not divide needs a larger group (pp = 4, m = 10: groups of 5, or 6 then 4). Plain
   1F1B takes any ``m``.
2. Warm-up: rank ``r`` first runs ``W(r)`` forwards, ``W = 2·(pp − r − 1) + (vpp − 1)·group``
   (``pp − r − 1`` when ``vpp = 1``), at most all ``m·vpp`` of them.
3. Steady state: step ``k`` runs forward ``W + k`` and backward ``k``. In the combined
   order (below) these two form the forward/backward *pair* whose overlap Tessera schedules
   and costs (``paired_with``); in the plain order they are two steps, the forward then the
   backward, as a plain 1F1B runtime issues them (``rank_steps``).
4. Cool-down: the remaining backwards.

Which chunks meet depends on ``W mod pp``: rank 0 with pp=4, vpp=2 has W=10, so steps 0-1
pair chunk 0's forward with chunk 1's backward, steps 2-3 chunk 1 with 1, 4-5 chunk 1 with 0,
6-7 chunk 0 with 0 — every combination; rank 1 has W=8, a whole number of groups, so its
forward and backward groups are exactly out of phase and chunk 0 only meets chunk 1 and back;
the last rank has W=(vpp−1)·pp, in phase, so each chunk only meets itself.

``combined=True`` is the variant Megatron-Core runs when it overlaps expert-parallel
All-to-All across micro-batches (combined 1F1B, ``--overlap-moe-expert-parallel-comm``): one
more warm-up forward per rank, so that the forward and backward of every steady-state pair
are independent, and each pair runs as one step whose two sides overlap. Without it the last
rank's steady pairs would join a chunk's forward and backward of the *same* micro-batch,
which cannot overlap (the backward needs that forward's output), and the last rank meets only
chunk (0, 0) and (1, 1); with it, with pp=8, vpp=2, the middle and last ranks meet all four
chunk combinations. The planning passes use it whenever expert parallelism is on
(``ParallelConfig.combined_1f1b``: ``ep > 1``), since overlapping the EP All-to-All of one
micro-batch with another's computation is what a Tessera pair is. The pair builder
(``steady_pairs``) refuses a combined order whose pair would join one micro-batch's forward
and backward of one chunk. The plain order stays for runs without EP communication.

Combined at ``vpp = 1`` (Megatron-Core refuses EP overlap there without virtual stages; Tessera
runs it) warms up with ``2·(pp − r − 1) + 1`` forwards, not the plain ``(pp − r − 1) + 1``.
A pair step ends when both its sides have, so a step of rank ``r`` that needs rank ``r + 1``'s
gradient of micro-batch ``k`` waits for the whole pair step of ``r + 1`` that produces it, and
that step also runs a forward whose input ``r`` sends. With warm-ups that differ by one
between neighbours, rank ``r + 1``'s pair ``k`` needs the forward rank ``r`` produces in its
pair ``k − 1``, and rank ``r``'s pair ``k`` needs rank ``r + 1``'s pair ``k``: the two ranks
take turns, every step of each waiting for the other's, and nothing overlaps across them. With a difference of two, rank ``r + 1``'s pair
``k`` needs rank ``r``'s pair ``k − 2``, so neighbours' pairs ``k − 1`` and ``k`` run at the same
time: the activation travels down one step while the gradient travels up one step, the same
round trip of two steps that interleaving's ``2·(pp − r − 1)`` term leaves. The last rank
keeps one forward ahead (``+ 1``) so its own pair never joins a chunk's forward and backward of
one micro-batch. Then on uniform costs (a chunk's forward ``f``, backward ``b``, a pair ``p``
with ``max(f, b) ≤ p ≤ f + b``) the last rank never waits once its first forward has come, and
an iteration takes ``(pp − 1)·(f + b) + W·(f + b) + (m·vpp − W)·p`` with ``W = (vpp − 1)·pp + 1``
the last rank's warm-up (for every ``vpp``); with ``p = f + b`` that is plain 1F1B's
``(m·vpp + pp − 1)·(f + b)``. The price is memory: the first rank holds up to ``2·pp − 1``
micro-batches in flight instead of ``pp`` (the memory model reads the same order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Direction = Literal["fwd", "bwd"]
Phase = Literal["warmup", "steady", "cooldown"]
Slot = tuple[int, int]  # (chunk, micro-batch)


@dataclass(frozen=True)
class Action:
    """One forward or backward of one chunk for one micro-batch on a rank.

    ``phase`` is the part of the rank's schedule it belongs to: ``warmup`` (forwards only),
    ``steady`` (one forward and one backward per step) or ``cooldown`` (backwards only).
    ``paired_with`` is the (chunk, micro-batch) of the opposite direction's action that runs
    beside this one in a steady-state pair; None in warm-up and cool-down.
    """

    direction: Direction
    chunk: int
    microbatch: int
    phase: Phase
    paired_with: Slot | None = None

    def stage(self, rank: int, pp: int) -> int:
        """The virtual stage this action runs on rank ``rank``."""
        return rank + self.chunk * pp


def _check(pp: int, vpp: int, microbatches: int, rank: int | None = None, group: int | None = None) -> int:
    """Check the settings; return the micro-batch group size (``pp`` unless ``group`` is given)."""
    for name, value in (("pp", pp), ("vpp", vpp), ("microbatches", microbatches)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    size = pp if group is None else group
    if vpp > 1:
        remainder = microbatches % size if size >= 1 else 0
        if not pp <= size <= microbatches or 0 < remainder < pp:
            given = f"the micro-batch group size {size}" if group is not None else "groups of pp"
            raise ValueError(
                f"interleaved 1F1B (vpp = {vpp}) cannot run {microbatches} micro-batches in {given}: a group size lies "
                f"in [pp = {pp}, {microbatches}] and leaves a last group of 0 or at least pp micro-batches "
                f"(with {microbatches} micro-batches not a multiple of pp, give a larger group)"
            )
    if rank is not None and not 0 <= rank < pp:
        raise ValueError(f"rank must lie in 0..{pp - 1}, got {rank}")
    return size


def warmup_forwards(pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None) -> int:
    """Forwards rank ``rank`` runs before its first backward."""
    size = _check(pp, vpp, microbatches, rank, group)
    if vpp > 1:
        warm = 2 * (pp - rank - 1) + (vpp - 1) * size
    else:
        # Combined at vpp = 1: neighbours' warm-ups differ by two, or their pair steps take turns
        # (the module docstring says why).
        warm = 2 * (pp - rank - 1) if combined else pp - rank - 1
    if combined:
        warm += 1
    return min(warm, microbatches * vpp)


def forward_slot(k: int, pp: int, vpp: int, microbatches: int, group: int | None = None) -> Slot:
    """(chunk, micro-batch) of a rank's k-th forward (the same on every rank)."""
    size = _check(pp, vpp, microbatches, group=group)
    if not 0 <= k < microbatches * vpp:
        raise ValueError(f"forward {k} is beyond the {microbatches * vpp} forwards of a rank")
    if vpp == 1:
        return 0, k
    # Groups start every ``size`` micro-batches; the last one (which may differ) takes the rest.
    full = (microbatches - 1) // size  # groups before the last one
    if k < full * size * vpp:
        index, offset = divmod(k, size * vpp)
        chunk, position = divmod(offset, size)
        return chunk, index * size + position
    first = full * size
    chunk, position = divmod(k - full * size * vpp, microbatches - first)
    return chunk, first + position


def backward_slot(k: int, pp: int, vpp: int, microbatches: int, group: int | None = None) -> Slot:
    """(chunk, micro-batch) of a rank's k-th backward: the forward sequence, chunks reversed."""
    chunk, microbatch = forward_slot(k, pp, vpp, microbatches, group)
    return vpp - 1 - chunk, microbatch


def rank_order(
    pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
) -> list[Action]:
    """Every action of rank ``rank`` in execution order (a steady pair: its forward, then its backward)."""
    total = microbatches * vpp
    warm = warmup_forwards(pp, vpp, microbatches, rank, combined, group)

    def fwd(k: int) -> Slot:
        return forward_slot(k, pp, vpp, microbatches, group)

    def bwd(k: int) -> Slot:
        return backward_slot(k, pp, vpp, microbatches, group)

    actions = [Action("fwd", *fwd(k), "warmup") for k in range(warm)]
    for k in range(total - warm):
        f, b = fwd(warm + k), bwd(k)
        actions.append(Action("fwd", *f, "steady", paired_with=b))
        actions.append(Action("bwd", *b, "steady", paired_with=f))
    actions += [Action("bwd", *bwd(k), "cooldown") for k in range(total - warm, total)]
    return actions


StageMb = tuple[int, int]  # (virtual stage, micro-batch)


@dataclass(frozen=True)
class RankStep:
    """One step of a rank's program: the forward of ``fwd`` and/or the backward of ``bwd``
    (virtual stage, micro-batch). Both sides: a combined-1F1B pair, whose two sides overlap."""

    fwd: StageMb | None
    bwd: StageMb | None


def rank_steps(
    pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
) -> list[RankStep]:
    """The steps of ``rank`` in order: what the ``pipeline`` pass lowers and the simulator runs.

    Combined: each steady-state pair is one step (its sides checked independent, as
    ``steady_pairs`` does). Plain: every action is its own step, a steady forward then its
    backward, as a plain 1F1B runtime issues them; one step joining both would hold the forward
    until the backward's gradient arrived.
    """
    steps: list[RankStep] = []
    for a in rank_order(pp, vpp, microbatches, rank, combined, group):
        here = (a.stage(rank, pp), a.microbatch)
        if a.direction == "fwd":
            steps.append(RankStep(here, None))
        elif combined and a.paired_with is not None:
            if a.paired_with == (a.chunk, a.microbatch):
                raise DependentPairError(
                    f"combined 1F1B (pp={pp}, vpp={vpp}, microbatches={microbatches}) pairs chunk {a.chunk}'s forward "
                    f"and backward of micro-batch {a.microbatch} on rank {rank}; the backward depends on that forward"
                )
            steps[-1] = RankStep(steps[-1].fwd, here)
        else:
            steps.append(RankStep(None, here))
    return steps


class DependentPairError(AssertionError):
    """A combined-1F1B pair whose two sides are one micro-batch's forward and backward of one chunk."""


def steady_pairs(
    pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
) -> list[tuple[Slot, Slot]]:
    """(forward slot, backward slot) of every steady-state pair of ``rank``, in order.

    In the combined order the two sides of a pair run at the same time, so they must be
    independent: a pair joining the forward and the backward of the same micro-batch of the
    same chunk (the backward needs that very forward) is an error in the order itself.
    """
    pairs = []
    for a in rank_order(pp, vpp, microbatches, rank, combined, group):
        if a.direction != "fwd" or a.paired_with is None:
            continue
        fwd = (a.chunk, a.microbatch)
        if combined and fwd == a.paired_with:
            raise DependentPairError(
                f"combined 1F1B (pp={pp}, vpp={vpp}, microbatches={microbatches}) pairs chunk {fwd[0]}'s forward and "
                f"backward of micro-batch {fwd[1]} on rank {rank}; the backward depends on that forward"
            )
        pairs.append((fwd, a.paired_with))
    return pairs


def meeting_chunks(pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False) -> list[tuple[int, int]]:
    """(forward chunk, backward chunk) combinations that meet in ``rank``'s steady state, sorted.

    A rank without a steady state (fewer forwards than warm-up slots) still runs every
    chunk's forward and backward back to back at the turn of its schedule; each chunk then
    meets itself, so that every chunk has a cost.
    """
    seen = {(fwd[0], bwd[0]) for fwd, bwd in steady_pairs(pp, vpp, microbatches, rank, combined)}
    return sorted(seen or {(c, c) for c in range(vpp)})


def meeting_stages(pp: int, vpp: int, microbatches: int, combined: bool = False) -> dict[int, list[tuple[int, int]]]:
    """Per rank, the (forward stage, backward stage) pairs that meet in its steady state."""
    return {
        r: [(r + cf * pp, r + cb * pp) for cf, cb in meeting_chunks(pp, vpp, microbatches, r, combined)]
        for r in range(pp)
    }
