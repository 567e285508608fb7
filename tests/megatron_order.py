"""An independent enumeration of Megatron-Core's pipeline order, for tests only.

It follows Megatron-Core's own construction step by step (a lookup table of virtual
micro-batches, a warm-up count per rank, then one forward and one backward per steady step),
written without reference to Tessera's schedule module so that the two can be compared.

Megatron-Core's construction (``megatron/core/pipeline_parallel/schedules.py``):

- Virtual micro-batch ``k`` of a rank maps to ``(micro-batch, chunk)`` by a table built group
  by group: micro-batches are taken in groups of ``group`` (``microbatch_group_size_per_vp_stage``,
  ``pp`` by default); for each group, every chunk runs the whole group before the next chunk
  does. The last group holds the micro-batches that remain. Megatron-Core accepts a group size
  in ``[pp, microbatches]`` whose remainder is 0 or at least ``pp`` (a shorter last group would
  stall the pipeline), so a micro-batch count ``pp`` does not divide needs a larger group
  (pp = 4, 10 micro-batches: groups of 5, or of 6 and 4).
- The ``k``-th forward runs table entry ``k``; the ``k``-th backward runs the same micro-batch
  on chunk ``vpp - 1 - chunk`` (backwards visit chunks last to first).
- Warm-up forwards on rank ``r``: ``pp - r - 1`` without interleaving; with it,
  ``2 (pp - r - 1) + (vpp - 1) * group``, plus one when expert-parallel communication overlap
  (combined 1F1B) is on; never more than ``microbatches * vpp``.
- Steady state: step ``k`` runs forward ``k + warm-up`` then backward ``k``; the cool-down runs
  the remaining backwards.
"""

from __future__ import annotations


def valid_group(pp: int, microbatches: int, group: int) -> bool:
    """Whether Megatron-Core runs the interleaved schedule with this micro-batch group size."""
    remainder = microbatches % group
    return pp <= group <= microbatches and (remainder == 0 or remainder >= pp)


def schedule_table(microbatches: int, vpp: int, group: int) -> list[tuple[int, int]]:
    table: list[tuple[int, int]] = []
    first = 0
    while first < microbatches:
        last = microbatches if first + group >= microbatches else first + group
        for chunk in range(vpp):
            for mb in range(first, last):
                table.append((mb, chunk))
        first = last
    return table


def warmup(pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None) -> int:
    total = microbatches * vpp
    if pp == 1:
        count = 0
    elif vpp == 1:
        count = pp - rank - 1
    else:
        count = 2 * (pp - rank - 1) + (vpp - 1) * (group or pp) + (1 if combined else 0)
    return min(count, total)


def rank_order(
    pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
) -> list[tuple[str, int, int]]:
    """The rank's items in order: ``("F" | "B", virtual stage, micro-batch)``."""
    table = schedule_table(microbatches, vpp, group or pp)
    total = microbatches * vpp
    warm = warmup(pp, vpp, microbatches, rank, combined, group)

    def fwd(k: int) -> tuple[str, int, int]:
        mb, chunk = table[k]
        return ("F", rank + chunk * pp, mb)

    def bwd(k: int) -> tuple[str, int, int]:
        mb, chunk = table[k]
        return ("B", rank + (vpp - 1 - chunk) * pp, mb)

    items = [fwd(k) for k in range(warm)]
    for k in range(total - warm):
        items.append(fwd(k + warm))
        items.append(bwd(k))
    items += [bwd(k) for k in range(total - warm, total)]
    return items


def steady_pairs(
    pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None
) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """The (forward (stage, mb), backward (stage, mb)) of each steady-state step of the rank."""
    items = rank_order(pp, vpp, microbatches, rank, combined, group)
    warm = warmup(pp, vpp, microbatches, rank, combined, group)
    steady = items[warm : warm + 2 * (microbatches * vpp - warm)]
    return [((f[1], f[2]), (b[1], b[2])) for f, b in zip(steady[0::2], steady[1::2])]
