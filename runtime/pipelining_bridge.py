"""A Tessera plan as a ``torch.distributed.pipelining`` schedule, for trainers built on it (torchtitan-style).

Export. ``export_actions`` turns the plan's per-rank order into pipelining's
action lists: each chunk a forward (``F``) or full backward (``B``) of a stage
and micro-batch, each steady-state pair (a forward chunk met by a backward
chunk, their tasks interleaved: combined 1F1B) one ``OVERLAP_F_B`` action with
the two as sub-actions. ``write_csv`` writes them in pipelining's CSV form (``(0F4;1B0)OVERLAP_F_B``); its runtime
adds the sends, receives and gradient reductions itself.

Execution. ``PipeliningBridge`` builds ``_PipelineScheduleRuntime`` over one
``PipelineStage`` per virtual stage of this rank and registers custom
functions for ``F``, ``B``, ``OVERLAP_F_B`` and ``REDUCE_GRAD``: each runs the
tasks of its chunk(s) with the executor (``runtime.executor``), in the order
the plan issues them, so an ``OVERLAP_F_B`` is Tessera's pair schedule: the
forward's and the backward's tasks interleaved, their All-to-Alls in flight
while the other chunk computes, the backward split into dgrad and wgrad.
Pipelining keeps what it owns: the order of the actions, the point-to-point
transfers, the loss and its bookkeeping. DBO does not run here (no FSM):
deferred weight gradients run where the plan offers them.

A custom function must redo what the runtime does around a computation
(receive, forward, loss, backward, the caches the sends read), through
private parts of torch (``_PipelineScheduleRuntime``, ``_PipelineContext``, the
stages' ``fwd_cache``/``bwd_cache`` ...). ``check_pipelining_api`` refuses a
torch that lacks them, naming what is missing; tested with torch 2.13.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from runtime.bindings import loss_fn, task_op
from runtime.bytecode import Collective, Op
from runtime.ledger import program_pairs, program_units

MIN_TORCH = (2, 9)


class BridgeUnavailable(RuntimeError):
    """This torch lacks the private pipelining parts the bridge relies on."""


def _torch_version() -> tuple[int, int]:
    major, minor = torch.__version__.split("+")[0].split(".")[:2]
    return int(major), int(minor)


def check_pipelining_api() -> Any:
    """The ``torch.distributed.pipelining.schedules`` module, after checking the private parts used here."""
    if _torch_version() < MIN_TORCH:
        raise BridgeUnavailable(
            f"the pipelining bridge needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (OVERLAP_F_B actions with sub-actions); "
            f"this is torch {torch.__version__}"
        )
    from torch.distributed.pipelining import schedules

    missing = [name for name in ("_PipelineScheduleRuntime", "_Action", "_ComputationType", "_PipelineContext",
                                 "_wait_batch_p2p", "OVERLAP_F_B", "REDUCE_GRAD") if not hasattr(schedules, name)]
    runtime_cls = getattr(schedules, "_PipelineScheduleRuntime", None)
    for method in ("register_custom_function", "_prepare_schedule_with_comms", "_validate_and_set_stage_mapping",
                   "_maybe_compute_loss", "_maybe_get_loss"):
        if runtime_cls is not None and not hasattr(runtime_cls, method):
            missing.append(f"_PipelineScheduleRuntime.{method}")
    if missing:
        raise BridgeUnavailable(
            f"torch {torch.__version__}'s pipelining lacks {', '.join(missing)}, which the bridge's custom functions use"
        )
    return schedules


# ---------------------------------------------------------------- export


def export_actions(programs: Sequence[Any], stage_layers: Sequence[Sequence[str]]) -> dict[int, list[Any]]:
    """Per pipeline rank, its chunks as pipelining actions; steady-state pairs as ``OVERLAP_F_B``."""
    schedules = check_pipelining_api()
    action, ctype = schedules._Action, schedules._ComputationType
    stage_of = {layer: s for s, layers in enumerate(stage_layers) for layer in layers}
    out: dict[int, list[Any]] = {}
    for program in programs:
        units = program_units(program, stage_of)
        paired = {(id(f), id(b)) for f, b in program_pairs(units)}
        row: list[Any] = []
        i = 0
        while i < len(units):
            u = units[i]
            single = action(u.stage, ctype.FORWARD if u.direction == "fwd" else ctype.FULL_BACKWARD, u.mb)
            v = units[i + 1] if i + 1 < len(units) else None
            # One OVERLAP_F_B only where the plan interleaves the two chunks (a combined-1F1B pair):
            # pipelining receives both inputs before the action, so a forward the plan runs
            # wholly before a backward (plain 1F1B's steps) stays two actions, as does a chunk's
            # backward after its own forward.
            if (v is not None and (id(u), id(v)) in paired and (u.stage, u.mb) != (v.stage, v.mb)
                    and v.first < u.last):
                row.append(action(-1, ctype.OVERLAP_F_B, None, (single, action(v.stage, ctype.FULL_BACKWARD, v.mb))))
                i += 2
                continue
            row.append(single)
            i += 1
        out[int(program.rank)] = row
    return out


def write_csv(path: str | Path, actions: dict[int, list[Any]]) -> None:
    """Pipelining's compute-only CSV: one row per rank, one action per cell (what ``_load_csv`` reads)."""
    with Path(path).open("w", newline="") as f:
        writer = csv.writer(f)
        for rank in sorted(actions):
            writer.writerow([str(a) for a in actions[rank]])


# ---------------------------------------------------------------- execution


class PipeliningBridge:
    """Runs this rank's stages of a plan under ``torch.distributed.pipelining`` with Tessera's pair schedules.

    ``executor`` is this rank's ``StageExecutor`` built with ``external_loss=True``;
    ``stages`` are pipelining ``PipelineStage``s of this rank's virtual stages;
    ``actions`` the exported actions of every rank (``export_actions``).
    """

    def __init__(self, executor: Any, stages: Sequence[Any], actions: dict[int, list[Any]], microbatches: int):
        if not executor.external_loss:
            raise ValueError("the bridge's executor must be built with external_loss=True (pipelining computes the loss)")
        schedules = check_pipelining_api()
        self.schedules = schedules
        self.executor = executor
        self.stages = {int(s.stage_index): s for s in stages}
        self.unscaled_losses: list[torch.Tensor] = []
        loss_of = loss_fn(executor.loss_divisor)

        def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            scaled, value = loss_of(logits, target)
            self.unscaled_losses.append(value)
            return scaled

        runtime_cls = schedules._PipelineScheduleRuntime
        self.schedule = runtime_cls(list(stages), microbatches, loss_fn=loss, scale_grads=False)
        self.schedule.pipeline_order = dict(actions)
        self.schedule._validate_and_set_stage_mapping(self.schedule.pipeline_order)
        self.schedule._prepare_schedule_with_comms(self.schedule.pipeline_order)
        ct = schedules._ComputationType
        self.schedule.register_custom_function(ct.FORWARD, lambda a, ctx: self._run([a], ctx))
        self.schedule.register_custom_function(ct.FULL_BACKWARD, lambda a, ctx: self._run([a], ctx))
        self.schedule.register_custom_function(ct.OVERLAP_F_B, lambda a, ctx: self._run(list(a.sub_actions), ctx))
        self.schedule.register_custom_function(ct.REDUCE_GRAD, self._reduce)
        self._plan = self._index_program(executor)

    @staticmethod
    def _index_program(executor: Any) -> dict[tuple[str, int, int], list[int]]:
        """The instructions of each chunk (direction, stage, micro-batch), in program order: tasks,
        All-to-Alls, weight gradients (offered or run) and the waits on the chunk's All-to-Alls."""
        program, tasks, layout = executor.program, executor.tasks, executor.layout
        chunk_of: dict[int, tuple[str, int, int]] = {}
        plan: dict[tuple[str, int, int], list[int]] = {}
        for i, ins in enumerate(program.instructions):
            op = Op(ins.op)
            key = None
            if op in (Op.RUN, Op.DEFER) or (op == Op.COLLECTIVE and ins.aux == Collective.ALL_TO_ALL):
                t = tasks[ins.a]
                phase = task_op(t.kind)[1]
                key = ("fwd" if phase == "fwd" else "bwd", layout.stage_of(t.layer), int(ins.mb))
            elif op == Op.WAIT and ins.a in chunk_of:
                key = chunk_of[ins.a]
            if key is not None:
                chunk_of[i] = key
                plan.setdefault(key, []).append(i)
        return plan

    def step(self, input_ids: torch.Tensor, labels: torch.Tensor | None) -> Any:
        """One iteration: ``input_ids``/``labels`` [microbatches, batch, seq] (the same on every rank that needs them)."""
        ex = self.executor
        self.unscaled_losses = []
        ex.begin_iteration(input_ids, None)
        flat_ids = input_ids.reshape(-1, input_ids.shape[-1])
        flat_labels = labels.reshape(-1, labels.shape[-1]) if labels is not None else None
        has_first = 0 in self.stages
        args = (flat_ids,) if has_first else ()
        self.schedule.step(*args, target=flat_labels)
        result = ex.end_iteration()
        result.loss_tensors = list(self.unscaled_losses)
        result.losses = [float(v) for v in self.unscaled_losses]
        return result

    # ------------------------------------------------------------ custom functions

    def _run(self, actions: list[Any], ctx: Any) -> None:
        """Run the chunks of ``actions`` (one, or the two of a pair) in the plan's issue order."""
        ct = self.schedules._ComputationType
        ex = self.executor
        schedule = ctx.schedule_ref
        chunks = []
        inputs: dict[int, torch.Tensor | None] = {}
        for a in actions:
            stage, mb = int(a.stage_index), int(a.microbatch_index)
            pp_stage = self.stages[stage]
            if a.computation_type == ct.FORWARD:
                chunks.append(("fwd", stage, mb))
                inputs[stage] = None
                if not pp_stage.is_first:
                    self.schedules._wait_batch_p2p(schedule.fwd_recv_ops.pop((stage, mb)))
                    (x,) = pp_stage._retrieve_recv_activations(mb)
                    ex.stage_input(stage, mb, x)
                    inputs[stage] = x
            elif a.computation_type == ct.FULL_BACKWARD:
                chunks.append(("bwd", stage, mb))
                if pp_stage.is_last:
                    loss = schedule._maybe_get_loss(pp_stage, mb)
                    (logits,), _ = pp_stage.fwd_cache[mb]
                    (grad,) = torch.autograd.grad(loss, logits)
                else:
                    self.schedules._wait_batch_p2p(schedule.bwd_recv_ops.pop((stage, mb)))
                    (grad,) = pp_stage._retrieve_recv_grads(mb)
                ex.stage_output_grad(stage, mb, grad)
            else:
                raise ValueError(f"the bridge runs F and B actions, not {a}")
        order = sorted(i for key in chunks for i in self._plan.get(key, []))
        self._replay(order)
        for direction, stage, mb in chunks:
            pp_stage = self.stages[stage]
            if direction == "fwd":
                out = ex.stage_output(stage, mb).detach()
                if pp_stage.is_last:
                    out.requires_grad_()  # the loss is computed from it; its gradient comes back in B
                    pp_stage.output_chunks.append(out)
                pp_stage.fwd_cache[mb] = ((out,), [inputs[stage]] if inputs[stage] is not None else [])
                schedule._maybe_compute_loss(pp_stage, out, ctx.target_mbs, mb)
            else:
                ex.run_pending_wgrads(stage, mb)
                grad_in = ex.stage_input_grad(stage, mb)
                pp_stage.bwd_cache[mb] = (grad_in,) if grad_in is not None else ()
                pp_stage.fwd_cache.pop(mb, None)
                schedule.backward_counter[stage] += 1

    def _replay(self, order: list[int]) -> None:
        ex = self.executor
        program, tasks = ex.program, ex.tasks
        issued: set[int] = set()
        for i in order:
            ins = program.instructions[i]
            op = Op(ins.op)
            if op in (Op.RUN, Op.DEFER):
                phase = task_op(tasks[ins.a].kind)[1]
                ex.run_task(ins.a, ins.mb, i, filled=False, fallback=op == Op.DEFER and phase == "wgrad")
            elif op == Op.COLLECTIVE:
                ex.issue_all_to_all(ins.a, ins.mb, i)
                issued.add(i)
            elif op == Op.WAIT and ins.a in issued and ins.a in ex.inflight:
                ex.wait(ins.a)
        for handle in issued:
            if handle in ex.inflight:
                ex.wait(handle)

    def _reduce(self, action: Any, ctx: Any) -> None:
        handle = -1 - int(action.stage_index)  # not an instruction: the reduction is pipelining's action here
        self.executor.reduce_stage(int(action.stage_index), handle)
        self.executor.wait(handle)


def build_bridge(executor: Any, all_programs: Sequence[Any]) -> PipeliningBridge:
    """The bridge for this rank's stages: a ``PipelineStage`` over a ``StageModule`` per virtual stage."""
    from torch.distributed.pipelining import PipelineStage

    from runtime.stage_module import StageModule

    check_pipelining_api()
    layout, plan, binding = executor.layout, executor.plan, executor.binding
    stages_total = plan.pp * plan.vpp
    hidden_shape = (plan.micro_batch_size, plan.seq_len, binding.hidden)
    dtype = executor._dtype()

    def make_stage(s: int) -> Any:
        first, last = s == 0, s == stages_total - 1
        example_in = (torch.zeros(hidden_shape[:2], dtype=torch.long) if first
                      else torch.zeros(hidden_shape, dtype=dtype, requires_grad=True))
        vocab = binding.vocab_size if last else 0
        # requires_grad: pipelining sends gradients back only for outputs whose metadata says so.
        example_out = torch.zeros((*hidden_shape[:2], vocab) if last else hidden_shape, dtype=dtype, requires_grad=True)
        module = StageModule(binding, layout.stage_layers[s], executor.par.ep_group)
        return PipelineStage(module, s, stages_total, executor.device, input_args=(example_in,),
                             output_args=(example_out,), group=executor.par.pp_group)

    actions = export_actions(all_programs, layout.stage_layers)
    return PipeliningBridge(executor, [make_stage(s) for s in executor.my_stages], actions, executor.microbatches)
