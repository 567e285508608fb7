"""Training under a plan, from a trainer's point of view: load, lay out the ranks, step.

    runtime.health.hold_termination_signals()        # first thing: see runtime.health
    dist.init_process_group("gloo")                  # torchrun sets the environment
    session = TrainingSession.start("plan.tsb", model, expect={"model": "qwen3_moe"})
    opt = torch.optim.AdamW(session.parameters(), lr=3e-3)
    for step in range(steps):
        ids = session.my_slice(batch)                # this rank's slice: [microbatches, batch, seq]
        result = session.step(ids, ids)              # transformers' labels: shifted inside, -100 ignored
        opt.step(); opt.zero_grad(set_to_none=True)
    state = session.full_state_dict()                # on rank 0, under the model's own parameter names
    session.close()

``start`` loads every pipeline rank's program (refusing a plan compiled for
another model or other settings with a message that names what differs),
checks the model against the plan (``runtime.model_check``), builds the process
groups of the plan's ``pp × ep × dp`` layout from the job's world size, keeps
this rank's experts in the model, and starts the health watch. ``step`` runs the
program once.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from runtime.bindings import BindingError, ModelBinding, binding_for
from runtime.bytecode import PlanInfo, decode
from runtime.errors import PlanError
from runtime.executor import IterationResult, StageExecutor, create_groups
from runtime.health import HealthWatch, job_store
from runtime.layout import RankGrid, StageLayout
from runtime.model_check import ModelCheck, UncheckedModelWarning, check_model_against_plan

IGNORE_INDEX = -100  # transformers' label for "no loss here" (torch.nn.functional.cross_entropy's default)
_EXPERT_KEY = re.compile(r"^(.*\.experts)\.(\d+)\.([A-Za-z_][A-Za-z0-9_]*)$")

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


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """transformers' causal-LM labels [..., seq] as per-position targets: ``labels[t + 1]``, ``-100`` at the end."""
    ignored = torch.full_like(labels[..., :1], IGNORE_INDEX)
    return torch.cat([labels[..., 1:], ignored], dim=-1)


def check_full_causal_batch(
    input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None,
) -> None:
    """Refuse a batch that needs a padding mask or packed positions, which the tasks do not apply yet."""
    if attention_mask is not None and not bool((attention_mask != 0).all()):
        raise ValueError(
            "the batch has padding (attention_mask has zeros): padded batches are not supported yet; "
            "train on full sequences of the plan's seq_len (no padding)"
        )
    if position_ids is not None:
        seq = int(position_ids.shape[-1])
        if not bool((position_ids == torch.arange(seq, device=position_ids.device)).all()):
            raise ValueError(
                "position_ids other than 0..seq-1 (packed sequences) are not supported yet: every sequence of the "
                "batch must be one full causal sequence"
            )
    if input_ids is not None and input_ids.is_floating_point():
        raise ValueError(f"input_ids must be integer token ids, got dtype {input_ids.dtype}")


def expert_key(fused: str, expert: int) -> str:
    """``model.layers.1.mlp.experts.gate_up_proj``, expert 5 -> ``model.layers.1.mlp.experts.5.gate_up_proj``."""
    prefix, _, attr = fused.rpartition(".")
    return f"{prefix}.{expert}.{attr}" if prefix else f"{expert}.{attr}"


def merge_shards(shards: list[Any]) -> dict[str, torch.Tensor]:
    """One state dict from every rank's ``state_dict()``: replicas once, per-expert rows stacked into fused tensors."""
    plain: dict[str, torch.Tensor] = {}
    experts: dict[str, dict[int, torch.Tensor]] = {}
    for shard in shards:
        for key, value in shard.items():
            m = _EXPERT_KEY.match(key)
            if m is not None:
                experts.setdefault(f"{m.group(1)}.{m.group(3)}", {})[int(m.group(2))] = value
            else:
                plain.setdefault(key, value)
    for fused, rows in experts.items():
        if sorted(rows) != list(range(len(rows))):
            raise RuntimeError(f"the shards hold experts {sorted(rows)} of '{fused}', not 0..{len(rows) - 1}")
        plain[fused] = torch.stack([rows[e] for e in range(len(rows))])
    return dict(sorted(plain.items()))


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
        self.model_check: ModelCheck | None = None  # what start compared between the model and the plan

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

        The model is always checked against what the plan records (``runtime.model_check``:
        model name, decoder layers, each layer's mixer and feed-forward), a mismatch refused
        naming the field. ``signature``: the plan signature the compiler computed for this model
        (``codegen.signature.plan_signature``) also checks what the plan does not record (expert
        count, top-k, hidden size, vocabulary, costs); without it ``session.model_check.unchecked``
        names those fields.
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
            model_check = check_model_against_plan(family, model, programs, signature_checked=signature is not None)
        except (PlanError, BindingError) as err:
            if watch is not None:
                watch.failure_of(err)
            raise
        note = model_check.unchecked_note()
        if note is not None and rank == 0:
            warnings.warn(note, UncheckedModelWarning, stacklevel=2)
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
        session = cls(executor, grid, rank, watch, bridge)
        session.model_check = model_check
        return session

    def parameters(self) -> list[torch.Tensor]:
        return self.executor.parameters()

    def my_slice(self, batch: torch.Tensor) -> torch.Tensor:
        """This rank's slice of a global batch laid out [shards, microbatches, batch, seq]."""
        return batch[self.shard]

    def step(
        self,
        input_ids: torch.Tensor | None,
        labels: torch.Tensor | None,
        *,
        labels_shifted: bool = False,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> StepResult:
        """Run the plan once on this rank's slice ``[microbatches, batch, seq]``; gather the losses on the reporting rank.

        ``labels`` follow transformers' causal-LM convention: ``labels = input_ids`` (or a copy
        with ``-100`` where no loss is wanted); position ``t`` is trained to predict
        ``labels[t + 1]``, the shift done here, and ``-100`` is ignored. Each micro-batch's
        loss is the mean over its non-ignored tokens (what ``model(ids, labels=labels).loss``
        reports for that micro-batch); ``StepResult.loss`` and the gradients are those of the
        mean of the micro-batch losses over every micro-batch and shard of the step.
        ``labels_shifted=True``: ``labels[t]`` is already the target of position ``t``
        (the tiny example's convention). Only the ranks of the first stage need
        ``input_ids`` and of the last stage ``labels``; others may pass None.

        Padded or packed batches are not supported yet: an ``attention_mask`` that masks
        a token, or ``position_ids`` other than ``0..seq-1``, is refused (every sequence
        is a full causal one).
        """
        check_full_causal_batch(input_ids, attention_mask, position_ids)
        if labels is not None and not labels_shifted:
            labels = shift_labels(labels)
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

    # ------------------------------------------------------------ parameters under the model's names

    def state_dict(self) -> dict[str, torch.Tensor]:
        """This rank's shard of the trained parameters, under the model's own names (detached, sharing storage).

        The parameters (and persistent buffers) of this rank's pipeline stages; of a fused expert tensor
        (``<prefix>.experts.gate_up_proj`` [experts, ...]) only this rank's experts, one entry
        each under ``<prefix>.experts.<global expert index>.gate_up_proj``. Ranks that
        replicate a parameter (EP and DP ranks of one stage) hold the same values.
        ``full_state_dict`` puts the shards back together.
        """
        out: dict[str, torch.Tensor] = {}
        for key, param in self.executor.params.items():
            if key in self.executor.expert_keys:
                first = self.ep_rank * int(param.shape[0])
                for i, rows in enumerate(param.detach().unbind(0)):
                    out[expert_key(key, first + i)] = rows
            else:
                out[key] = param.detach()
        out.update(self._persistent_buffers())
        return out

    def _persistent_buffers(self) -> dict[str, torch.Tensor]:
        """The persistent buffers of this rank's layers (a router's bias correction, say), under the model's names."""
        binding = self.executor.binding
        names = {id(m): name for name, m in binding.model.named_modules()}
        out: dict[str, torch.Tensor] = {}
        for layer in self.executor.my_layers:
            for module in binding.stage_modules(layer):
                for sub_name, sub in module.named_modules(prefix=names.get(id(module), "")):
                    for attr, buf in sub._buffers.items():
                        if buf is not None and attr not in sub._non_persistent_buffers_set:
                            out[f"{sub_name}.{attr}" if sub_name else attr] = buf.detach()
        return out

    def full_state_dict(self, dst: int = 0) -> dict[str, torch.Tensor] | None:
        """The whole model's trained parameters on rank ``dst`` (None on the others), under the model's names.

        A collective: every rank calls it. The result is what the model's own
        ``state_dict()`` holds for its parameters (fused experts stacked again in expert
        order), so ``load_state_dict`` into a fresh model of the same config, or
        ``save_pretrained(path, state_dict=...)`` then ``from_pretrained(path)``, gives the
        trained model. Every shard travels to ``dst`` (``torch.distributed.gather_object``):
        for models that fit in one process's memory.
        """
        mine = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}
        shards: list[Any] | None = [None] * dist.get_world_size() if self.rank == dst else None
        dist.gather_object(mine, shards, dst=dst)
        if shards is None:
            return None
        return merge_shards(shards)

    def fail(self, message: str) -> str:
        """Record this rank's failure for the others (the first failure recorded stands)."""
        return self.health.fail(message) if self.health is not None else f"rank {self.rank}: {message}"

    def close(self) -> None:
        if self.health is not None:
            self.health.finish()
