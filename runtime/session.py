"""Training under a plan, from a trainer's point of view: load, lay out the ranks, step.

    runtime.health.hold_termination_signals()        # first thing: see runtime.health
    dist.init_process_group("gloo")                  # torchrun sets the environment
    session = TrainingSession.start("plan.tsb", model, signature=sig, expect={"model": "tiny_qwen3_next"})
    opt = torch.optim.AdamW(session.parameters(), lr=3e-3)
    for step in range(steps):
        result = session.step(input_ids, labels)     # this rank's slice: [microbatches, batch, seq]
        opt.step(); opt.zero_grad(set_to_none=True)
    session.close()

``start`` loads every pipeline rank's program (refusing a plan compiled for
another model or other settings with a message that names what differs),
builds the process groups of the plan's ``pp × ep × dp`` layout from the job's
world size, keeps this rank's experts in the model, and starts the health
watch. ``step`` runs the program once.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime.bindings import BindingError, ModelBinding, binding_for, task_op
from runtime.bytecode import PlanInfo, decode
from runtime.errors import PlanError
from runtime.executor import IterationResult, StageExecutor, create_groups
from runtime.health import HealthWatch, job_store
from runtime.layout import RankGrid, StageLayout

SETTINGS = ("model", "pp", "vpp", "ep", "tp", "microbatches", "micro_batch_size", "seq_len", "dtype")


def plan_bytes(source: str | os.PathLike[str] | bytes) -> bytes:
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    try:
        return Path(source).read_bytes()
    except OSError as err:
        raise PlanError(f"cannot read plan '{source}': {err.strerror}", "unreadable") from None


def describe_mismatch(data: bytes, expect: Mapping[str, Any]) -> str | None:
    """What differs between the settings a plan was compiled for and those of this run, in words."""
    try:
        plan: PlanInfo = decode(data, rank=0).plan
    except PlanError:
        return None
    diffs = []
    for name in SETTINGS:
        if name in expect and str(getattr(plan, name)) != str(expect[name]):
            diffs.append(f"{name}={getattr(plan, name)} (this run: {expect[name]})")
    return ", ".join(diffs) if diffs else None


def load_programs(data: bytes, signature: bytes | None, expect: Mapping[str, Any]) -> list[Any]:
    """Every pipeline rank's program; a mismatch with this run is refused naming what differs."""
    import runtime

    mismatch = describe_mismatch(data, expect)
    if mismatch is not None:
        what = "another model" if mismatch.startswith("model=") else "other settings"
        raise PlanError(f"the plan was compiled for {what}: {mismatch}; recompile it for this run", "signature")
    try:
        first = runtime.load_plan(data, rank=0, signature=signature)
    except PlanError as err:
        if err.reason == "signature":
            raise PlanError(
                "the plan was compiled for another model: its parallel settings match this run, but the model's "
                "layers, tasks or shapes differ (or its cost source does) from those it was compiled for; recompile it",
                "signature",
            ) from None
        raise
    return [first] + [runtime.load_plan(data, rank=r, signature=signature) for r in range(1, int(first.plan.pp))]


def check_model_fits_plan(family: type[ModelBinding], model: nn.Module, programs: list[Any], layout: StageLayout) -> None:
    """Refuse a model whose decoder layers or shared expert differ from those the plan runs (BindingError)."""
    parts = family.locate(model)
    planned = [name for name in layout.layers if name not in ("embed", "head")]
    if len(planned) != len(parts.layers):
        raise BindingError(
            f"the plan runs {len(planned)} decoder layers but the {type(model).__name__} has {len(parts.layers)}; "
            "compile the plan for this model"
        )
    sparse = [i for i, block in enumerate(parts.layers) if family.dense_parts(model, i, block) is None]
    first = family.decoder_parts(model, sparse[0], parts.layers[sparse[0]]) if sparse else None
    shared = any(task_op(t.kind)[0] == "shared_expert" for p in programs for t in p.tasks)
    if shared != (first is not None and first.shared_expert is not None):
        raise BindingError(
            "the plan has shared-expert tasks but the model has no shared expert; compile the plan for this model"
            if shared else
            "the model has a shared expert but the plan has no shared-expert task; compile the plan for this model"
        )


@dataclass
class StepResult:
    """One iteration of this rank, plus the losses of every slice of the batch on the reporting rank."""

    iteration: IterationResult
    losses: list[list[float]] | None  # [shard][micro-batch], on the reporting rank only
    loss_tensors: list[list[torch.Tensor]] | None

    @property
    def loss(self) -> float | None:
        """Mean loss over the batch (micro-batches and slices), in the order the reference sums it."""
        if self.losses is None:
            return None
        return mean_loss(self.losses)


def mean_loss(losses: list[list[float]]) -> float:
    count = sum(len(row) for row in losses)
    return sum(sum(row) for row in losses) / count


class TrainingSession:
    """One rank of a job trained under a plan (see the module docstring)."""

    def __init__(self, executor: StageExecutor, grid: RankGrid, rank: int, health: HealthWatch | None, bridge: Any = None):
        self.executor = executor
        self.bridge = bridge
        self.grid = grid
        self.rank = rank
        self.health = health
        self.pp_rank, self.ep_rank, self.dp_rank = grid.coords(rank)
        self.shard = grid.shard(rank)
        last = grid.pp - 1
        self.reporting_rank = grid.rank(last, 0, 0)
        self._loss_group = None
        ranks = grid.dense_group(last)
        self._loss_group = dist.new_group(ranks)
        self._in_loss_group = rank in ranks

    @classmethod
    def start(
        cls,
        plan: str | os.PathLike[str] | bytes,
        model: nn.Module,
        *,
        signature: bytes | None = None,
        expect: Mapping[str, Any] | None = None,
        dbo: bool = True,
        health: bool | HealthWatch = True,
        fsm_factory: Any = None,
        driver: str = "fsm",
        binding: type[ModelBinding] | None = None,
    ) -> TrainingSession:
        """``driver``: ``fsm`` (the C++ FSM orders the work) or ``pipelining`` (torch.distributed.pipelining's
        runtime runs the exported schedule, each chunk and pair by Tessera's executor).

        ``binding``: what the plan's tasks compute on ``model`` (a ``runtime.bindings.ModelBinding``
        subclass); by default the registered family ``model`` matches. A model no binding
        trains, or one that does not fit the plan, is refused before any process group exists.
        """
        if driver not in ("fsm", "pipelining"):
            raise ValueError(f"driver must be 'fsm' or 'pipelining', got '{driver}'")
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialized: call dist.init_process_group first (torchrun sets it up)")
        rank, world = dist.get_rank(), dist.get_world_size()
        # The watch comes first and hears every refusal, so that every rank names this one.
        watch = health if isinstance(health, HealthWatch) else HealthWatch(job_store(), rank, world).start() if health else None
        try:
            programs = load_programs(plan_bytes(plan), signature, expect or {})
            family = binding or binding_for(model)
            family.check_model(model)
            layout = StageLayout.from_programs(programs)
            check_model_fits_plan(family, model, programs, layout)
        except (PlanError, BindingError) as err:
            if watch is not None:
                watch.failure_of(err)
            raise
        info = programs[0].plan
        grid = RankGrid.for_world(world, int(info.pp), int(info.ep))
        parallel = create_groups(grid, rank)
        pp_rank, ep_rank, _ = grid.coords(rank)
        family.shard_experts(model, ep_rank, grid.ep)
        bound = family(model, ep=grid.ep, ep_rank=ep_rank)
        executor = StageExecutor(programs[pp_rank], layout, bound, parallel, dbo=dbo, fsm_factory=fsm_factory,
                                 external_loss=driver == "pipelining")
        bridge = None
        if driver == "pipelining":
            from runtime.pipelining_bridge import build_bridge

            bridge = build_bridge(executor, programs)
        return cls(executor, grid, rank, watch, bridge)

    def parameters(self) -> list[torch.Tensor]:
        return self.executor.parameters()

    def my_slice(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a global batch laid out [shards, microbatches, batch, seq]."""
        return batch[self.shard]

    def step(self, input_ids: torch.Tensor | None, labels: torch.Tensor | None) -> StepResult:
        """Run the plan once on this rank's slice; gather the losses on the reporting rank."""
        if self.bridge is not None:
            result = self.bridge.step(input_ids, labels)
        else:
            result = self.executor.run_iteration(input_ids, labels)
        losses = loss_tensors = None
        if self._in_loss_group:
            mine = torch.stack(result.loss_tensors).reshape(-1).to(torch.float32)
            gathered = [torch.empty_like(mine) for _ in range(self.grid.shards)]
            dist.all_gather(gathered, mine, group=self._loss_group)
            # The group lists ranks by (dp, ep), which is shard order.
            if self.rank == self.reporting_rank:
                loss_tensors = [list(g.unbind(0)) for g in gathered]
                losses = [[float(v) for v in row] for row in loss_tensors]
        return StepResult(result, losses, loss_tensors)

    def fail(self, message: str) -> str:
        """Record this rank's failure for the others (the first failure recorded stands)."""
        return self.health.fail(message) if self.health is not None else f"rank {self.rank}: {message}"

    def close(self) -> None:
        if self.health is not None:
            self.health.finish()
