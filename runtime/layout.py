"""What a plan says about the model's layout: layers, virtual stages, and who runs what.

The bytecode carries the task table (each task names its layer) and one
program per pipeline rank. From all the programs together this module derives
which layers form each virtual stage: virtual stage ``s`` runs on rank
``s mod pp`` and holds a contiguous range of layers, so walking the layers in
model order, a change of the rank that runs them starts the next stage.
The executor needs it to know what a SEND carries (the output of the stage's
last layer), which parameters a gradient reduction covers, and to name stages
in the prediction ledger.

It also sets up the process-group layout the plan asks for: ``pp × ep × dp``
ranks, EP fastest (the ranks of an expert-parallel group are neighbours), then
the pipeline, then data-parallel replicas.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.bytecode import Op
from runtime.errors import PlanError


@dataclass(frozen=True)
class StageLayout:
    """Layers of every virtual stage of a plan, in model order."""

    pp: int
    vpp: int
    layers: tuple[str, ...]
    stage_layers: tuple[tuple[str, ...], ...]

    def stage_of(self, layer: str) -> int:
        for s, names in enumerate(self.stage_layers):
            if layer in names:
                return s
        raise KeyError(f"layer '{layer}' is in no virtual stage of the plan")

    def rank_of_stage(self, stage: int) -> int:
        return stage % self.pp

    def stages_of_rank(self, rank: int) -> list[int]:
        return [s for s in range(len(self.stage_layers)) if s % self.pp == rank]

    def previous(self, layer: str) -> str | None:
        i = self.layers.index(layer)
        return self.layers[i - 1] if i else None

    def next(self, layer: str) -> str | None:
        i = self.layers.index(layer)
        return self.layers[i + 1] if i + 1 < len(self.layers) else None

    @classmethod
    def from_programs(cls, programs: Sequence[object]) -> StageLayout:
        """The layout from every pipeline rank's program of one plan (``runtime.load_plan`` for each rank)."""
        if not programs:
            raise PlanError("no programs to read a stage layout from", "program")
        first = programs[0]
        plan = first.plan  # type: ignore[attr-defined]
        pp, vpp = int(plan.pp), int(plan.vpp)
        if len(programs) != pp:
            raise PlanError(f"a stage layout needs all {pp} programs of the plan, got {len(programs)}", "program")
        tasks = first.tasks  # type: ignore[attr-defined]
        layers: list[str] = []
        for t in tasks:
            if t.layer not in layers:
                layers.append(t.layer)
        runs_on: dict[str, int] = {}
        for program in programs:
            rank = int(program.rank)  # type: ignore[attr-defined]
            for ins in program.instructions:  # type: ignore[attr-defined]
                if ins.op == Op.RUN and tasks[ins.a].kind.endswith(".fwd"):
                    layer = tasks[ins.a].layer
                    if runs_on.setdefault(layer, rank) != rank:
                        raise PlanError(f"layer '{layer}' runs forward on ranks {runs_on[layer]} and {rank}", "program")
        if pp == 1:
            # One rank runs everything: the chunks of interleaving cannot be told apart, and
            # nothing depends on them (no transfers); the rank is one stage.
            return cls(pp, vpp, tuple(layers), (tuple(layers),))
        missing = [name for name in layers if name not in runs_on]
        if missing:
            raise PlanError(f"no rank runs the forward of layer(s) {', '.join(missing)}", "program")
        stages: list[list[str]] = []
        for name in layers:
            if not stages or runs_on[name] != runs_on[stages[-1][0]]:
                stages.append([])
            stages[-1].append(name)
        virtual = pp * vpp
        if len(stages) != virtual:
            raise PlanError(
                f"the programs run the layers in {len(stages)} contiguous groups, but the plan has {virtual} "
                f"virtual stages (pp {pp} x vpp {vpp})", "program",
            )
        for s, names in enumerate(stages):
            if runs_on[names[0]] != s % pp:
                raise PlanError(f"virtual stage {s} runs on rank {runs_on[names[0]]}, not on rank {s % pp}", "program")
        return cls(pp, vpp, tuple(layers), tuple(tuple(s) for s in stages))


def even_stage_layers(layers: Sequence[str], stages: int) -> list[list[str]]:
    """Decoder layers split evenly by count over ``stages`` (earlier stages take one more),
    the embedding (``embed``) first and the head (``head``) last: the split a trainer gets
    without a plan, as Megatron-Core and torch pipelining make it."""
    decoders = [name for name in layers if name not in ("embed", "head")]
    per, extra = divmod(len(decoders), stages)
    out, start = [], 0
    for s in range(stages):
        n = per + (1 if s < extra else 0)
        out.append(decoders[start : start + n])
        start += n
    out[0].insert(0, "embed")
    out[-1].append("head")
    return out


@dataclass(frozen=True)
class RankGrid:
    """Global ranks laid out as ``pp × ep × dp``: ``rank = (dp_rank * pp + pp_rank) * ep + ep_rank``."""

    pp: int
    ep: int
    dp: int

    @classmethod
    def for_world(cls, world_size: int, pp: int, ep: int) -> RankGrid:
        if world_size % (pp * ep):
            raise PlanError(
                f"the plan needs pp {pp} x ep {ep} = {pp * ep} ranks per data-parallel replica, "
                f"but the job has {world_size} processes; launch a multiple of {pp * ep}", "plan",
            )
        return cls(pp, ep, world_size // (pp * ep))

    @property
    def world_size(self) -> int:
        return self.pp * self.ep * self.dp

    def rank(self, pp_rank: int, ep_rank: int, dp_rank: int) -> int:
        return (dp_rank * self.pp + pp_rank) * self.ep + ep_rank

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(pp_rank, ep_rank, dp_rank) of a global rank."""
        ep_rank = rank % self.ep
        pp_rank = (rank // self.ep) % self.pp
        return pp_rank, ep_rank, rank // (self.ep * self.pp)

    def ep_group(self, pp_rank: int, dp_rank: int) -> list[int]:
        """The ranks of one expert-parallel group (their All-to-Alls)."""
        return [self.rank(pp_rank, e, dp_rank) for e in range(self.ep)]

    def pp_group(self, ep_rank: int, dp_rank: int) -> list[int]:
        """The ranks of one pipeline: every stage at one EP and DP position (point-to-point transfers)."""
        return [self.rank(p, ep_rank, dp_rank) for p in range(self.pp)]

    def dense_group(self, pp_rank: int) -> list[int]:
        """Ranks holding the same non-expert parameters: one stage's EP and DP ranks (gradient reduction)."""
        return [self.rank(pp_rank, e, d) for d in range(self.dp) for e in range(self.ep)]

    def expert_group(self, pp_rank: int, ep_rank: int) -> list[int]:
        """Ranks holding the same experts: data-parallel replicas of one EP rank."""
        return [self.rank(pp_rank, ep_rank, d) for d in range(self.dp)]

    def shard(self, rank: int) -> int:
        """Which slice of the global batch a rank trains on: its (dp, ep) position."""
        _, ep_rank, dp_rank = self.coords(rank)
        return dp_rank * self.ep + ep_rank

    @property
    def shards(self) -> int:
        return self.ep * self.dp
