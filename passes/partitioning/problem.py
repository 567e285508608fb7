"""The partition problem as plain data: candidates per stage, the meetings, the pair-cost oracle, memory.

- A *meeting* ``(sf, sb)`` on device ``d``: in interleaved 1F1B's steady state the
  forward of stage ``sf`` runs beside the backward of stage ``sb`` (both on ``d``;
  ``pipelining.order.meeting_stages``). The post-overlap cost of that pair is what the
  device spends per steady-state step, so a plan's *bottleneck* is its worst meeting
  pair, and its *total* the sum over meetings.
- The solvers (``dp``, ``milp``) pick one candidate range per stage, forming a cover
  (``ranges``) that fits in memory (``memory``), minimising the bottleneck, then the total.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from passes.partitioning.memory import MemorySpec
from passes.partitioning.ranges import PartitionError, Range

CostFn = Callable[[int, Range, int, Range], float]  # (fwd stage, fwd range, bwd stage, bwd range) -> µs


class MemoryInfeasibleError(PartitionError):
    """No partition fits the devices' memory."""


@dataclass
class PartitionProblem:
    num_layers: int
    pp: int
    vpp: int
    candidates: list[list[Range]]  # per virtual stage
    meets: dict[int, list[tuple[int, int]]]  # per device: (fwd stage, bwd stage)
    cost: CostFn
    memory: MemorySpec | None = None
    # Optional decomposable lower bound: cost(f, a, g, b) >= side_bound(f, a, "fwd") + side_bound(g, b, "bwd")
    # for every pair (e.g. the two sides' compute totals: a pair cannot finish before its compute stream has
    # run everything). Pruning uses it to skip pairs without costing them; a global search needs it.
    side_bound: Callable[[int, Range, str], float] | None = None
    cost_cache: dict[tuple[int, Range, int, Range], float] = field(default_factory=dict, repr=False)

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

    def pair_cost(self, sf: int, rf: Range, sb: int, rb: Range) -> float:
        key = (sf, rf, sb, rb)
        if key not in self.cost_cache:
            self.cost_cache[key] = float(self.cost(sf, rf, sb, rb))
        return self.cost_cache[key]

    def device_cost(self, device: int, chosen: dict[int, Range]) -> tuple[float, float]:
        """(worst, sum) of the device's meeting pair costs for the chosen ranges."""
        costs = [self.pair_cost(sf, chosen[sf], sb, chosen[sb]) for sf, sb in self.meets[device]]
        return max(costs, default=0.0), sum(costs)

    def evaluate(self, ranges: Sequence[Range]) -> tuple[float, float]:
        """(bottleneck, total) of a full partition, one range per stage."""
        chosen = dict(enumerate(ranges))
        worst, total = 0.0, 0.0
        for d in range(self.pp):
            w, t = self.device_cost(d, chosen)
            worst, total = max(worst, w), total + t
        return worst, total

    def memory_ok(self, ranges: Sequence[Range]) -> bool:
        if self.memory is None:
            return True
        return all(
            self.memory.device_bytes(self.pp, self.vpp, d, [ranges[d + c * self.pp] for c in range(self.vpp)])
            <= self.memory.capacity
            for d in range(self.pp)
        )


@dataclass
class PartitionSolution:
    ranges: list[Range]
    bottleneck: float
    total: float
    method: str
    seconds: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)  # sizes, solves, optimality: for reports
