"""The candidates and pair costs a partition search reads off the plan (``PlanView.candidate_table``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from passes.partitioning.ranges import Range


@dataclass
class CandidateTable:
    """What the partition search reads off the plan: per virtual stage its candidate ranges (all, and
    those in the window), their op names, and the cost of the forward of one candidate beside the
    backward of another (``cost(fwd_stage, fwd_range, bwd_stage, bwd_range)``); ``sources`` collects
    which cost attributes the calls used."""

    ranges: list[list[Range]]
    window: list[list[Range]]
    names: dict[tuple[int, Range], str]
    cost: Callable[[int, Range, int, Range], float]
    sources: set[str] = field(default_factory=set)
