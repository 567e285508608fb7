"""Training the tiny Qwen3-Next on this CPU under a Tessera plan, against what a user runs without Tessera.

    torchrun --standalone --nproc-per-node 4 bench/e2e_cpu.py [--plan plan.tsb] [--steps 8 --warmup 2 --seq-len 64]
    torchrun --standalone --nproc-per-node 2 bench/e2e_cpu.py --pp 1 --ep 2

Both run in the same processes (pp x ep of them), on the same model (same
seed), the same data, alternately step by step (so a change in the machine's
load hits both). With ``--pp 1`` the baseline is the plain loop a user writes
(each micro-batch's forward and backward, blocking All-to-All inside them) and
Tessera runs its combined pairs (micro-batch i+1's forward beside micro-batch
i's backward, its All-to-All in flight while the other side computes); the
default model there is wider and all softmax attention (``WIDE``), so that the
All-to-All is a realistic share of the baseline's iteration (its share is
printed). With ``--pp 2`` (default):

- baseline: ``torch.distributed.pipelining.ScheduleInterleaved1F1B`` over
  ``runtime.stage_module.StageModule`` stages with the decoder layers split
  evenly over the pp x vpp virtual stages (the embedding first, the head last),
  All-to-All blocking inside each stage's forward and backward, the backward
  one ``autograd.backward`` per stage; non-expert gradients summed over the EP
  ranks after the step, as the plan's gradient reduction does;
- Tessera: the plan (``--plan``, or compiled here for ``--hardware`` with
  ``--ledger`` folded in when the compiler can write bytecode), run by the C++
  FSM and the executor (``runtime.session``).

Prints iterations/s of each (a step's time is the slowest rank's, between two
barriers; median over the timed steps), their ratio (mark: Tessera >= 1.1x with
identical losses), whether every step's losses agree bitwise, the runtime's own
share of Tessera's iteration time (FSM and executor bookkeeping: wall time less
compute and blocked waits), the spread of the per-step ratios, where each rank's
training thread spends its CPU time (baseline: forward and backward chunks;
Tessera: forward, dgrad and wgrad tasks, and the runtime with its transfers: on
two cores shared by four processes, CPU time sets the pace), and the FSM's
counters. One intra-op thread per
process: four processes share the two cores. Results go to
``bench/results/e2e_cpu.json`` and ``.csv``.
"""

from __future__ import annotations

import signal  # noqa: I001

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the health watch takes SIGTERM (runtime.health)

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from tiny_qwen3_next import NAME, TinyConfig, TinyQwen3Next, build_model  # noqa: E402
from torch.distributed.pipelining import PipelineStage, ScheduleInterleaved1F1B  # noqa: E402
from train_tiny_qwen3_next import make_batch, optimizer  # noqa: E402

import runtime  # noqa: E402
from runtime.executor import create_groups  # noqa: E402
from runtime.layout import RankGrid, even_stage_layers  # noqa: E402
from runtime.local_reference import deterministic_cpu_mode  # noqa: E402
from runtime.moe_binding import MoEBinding, loss_fn, shard_experts  # noqa: E402
from runtime.session import TrainingSession, plan_bytes  # noqa: E402
from runtime.stage_module import StageModule  # noqa: E402

RESULTS = ROOT / "bench" / "results"
MARK_SPEEDUP = 1.1
# At PP=1 the model the bench trains: wide tokens and little compute per token, so that the blocking
# All-to-All (whose cost on gloo comes from the bytes it moves) is a sizeable share of the iteration.
WIDE = {"hidden_size": 1024, "num_layers": 4, "full_attention_interval": 1, "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32}
# Training-thread CPU per iteration, per phase: the baseline's pipelining chunks, then the executor's tasks.
PHASES = ("baseline_fwd", "baseline_bwd", "baseline_other", "baseline_total",
          "tessera_fwd", "tessera_dgrad", "tessera_wgrad", "tessera_other", "tessera_total", "tessera_comm")


class TimedStage(PipelineStage):
    """A ``PipelineStage`` that adds up the training thread's CPU time in its forward and backward chunks.

    Two clock readings per chunk; nothing else changes.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.cpu_ns = {"fwd": 0, "bwd": 0}

    def _timed(self, phase: str, chunk: Any, args: Any, kwargs: Any) -> Any:
        start = time.thread_time_ns()
        try:
            return chunk(*args, **kwargs)
        finally:
            self.cpu_ns[phase] += time.thread_time_ns() - start

    def forward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("fwd", super().forward_one_chunk, args, kwargs)

    def backward_one_chunk(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed("bwd", super().backward_one_chunk, args, kwargs)


class TimedExchange(StageModule):
    """A ``StageModule`` that adds up the wall time of its blocking All-to-Alls (forward and backward)."""

    a2a_ns = 0

    def _exchange(self, tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        if self.binding.ep == 1:
            return tensor
        return _TimedAllToAll.apply(self, tensor, send, recv)  # type: ignore[no-any-return]


class _TimedAllToAll(torch.autograd.Function):
    """Blocking ``all_to_all_single`` both ways, as ``torch.distributed.nn`` runs it, with each call timed."""

    @staticmethod
    def forward(ctx: Any, stage: TimedExchange, tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:  # type: ignore[override]
        ctx.stage, ctx.send, ctx.recv = stage, send, recv
        return _blocking_all_to_all(stage, tensor.contiguous(), send, recv)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        return None, _blocking_all_to_all(ctx.stage, grad.contiguous(), ctx.recv, ctx.send), None, None


def _blocking_all_to_all(stage: TimedExchange, tensor: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
    start = time.perf_counter_ns()
    out = tensor.new_empty((sum(recv), *tensor.shape[1:]))
    dist.all_to_all_single(out, tensor, recv, send, group=stage.ep_group)
    stage.a2a_ns += time.perf_counter_ns() - start
    return out


class LoopBaseline:
    """PP=1: the loop a user writes, each micro-batch's forward then backward, All-to-All blocking inside them."""

    name = "blocking All-to-All"

    def __init__(self, plan: Any, layers: list[str], grid: RankGrid, parallel: Any, build: Any):
        self.grid, self.parallel = grid, parallel
        _, ep_rank, _ = grid.coords(parallel.rank)
        model = build()
        shard_experts(model, ep_rank, grid.ep)
        self.stage = TimedExchange(MoEBinding(model, ep=grid.ep, ep_rank=ep_rank), layers, parallel.ep_group)
        self.loss = loss_fn(plan.microbatches * grid.shards)
        self.params: list[torch.Tensor] = list(self.stage.parameters())
        self.dense: list[torch.Tensor] = [p for n, p in self.stage.named_parameters() if ".experts." not in n]
        self.opt = optimizer(self.params)
        self.a2a_ns = 0

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        losses = []
        fwd = bwd = 0
        self.stage.a2a_ns = 0
        start_cpu = time.thread_time_ns()
        for mb in range(ids.shape[0]):
            t0 = time.thread_time_ns()
            value, unscaled = self.loss(self.stage(ids[mb]), labels[mb])
            t1 = time.thread_time_ns()
            value.backward()
            bwd += time.thread_time_ns() - t1
            fwd += t1 - t0
            losses.append(unscaled)
        reduce_dense(self.dense, self.grid, self.parallel)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        total = time.thread_time_ns() - start_cpu
        self.cpu_ns = {"fwd": fwd, "bwd": bwd, "other": total - fwd - bwd, "total": total}
        self.a2a_ns = self.stage.a2a_ns
        return losses


def reduce_dense(dense: list[torch.Tensor], grid: RankGrid, parallel: Any) -> None:
    """The non-expert gradients of the EP ranks, summed (what the plan's reduction does)."""
    if grid.shards == 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in dense]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=parallel.dense_group)
    offset = 0
    for p in dense:
        p.grad = flat[offset : offset + p.numel()].view_as(p).clone()
        offset += p.numel()


class Baseline:
    """ScheduleInterleaved1F1B over StageModules with an even layer split, on this rank's stages."""

    name = "ScheduleInterleaved1F1B"
    a2a_ns = 0  # not measured here: the schedule's own All-to-Alls are inside its stages

    def __init__(self, plan: Any, layers: list[str], grid: RankGrid, parallel: Any, build: Any):
        self.grid, self.parallel = grid, parallel
        pp_rank, ep_rank, _ = grid.coords(parallel.rank)
        model = build()
        shard_experts(model, ep_rank, grid.ep)
        binding = MoEBinding(model, ep=grid.ep, ep_rank=ep_rank)
        stages_total = plan.pp * plan.vpp
        split = even_stage_layers(layers, stages_total)
        shape = (plan.micro_batch_size, plan.seq_len, binding.hidden)
        vocab = int(next(binding.lm_head.parameters()).shape[0])
        self.stage_modules: list[StageModule] = []
        self.stages: list[Any] = []  # TimedStage; the schedule's parameter is typed with a private base class
        for s in range(pp_rank, stages_total, plan.pp):
            module = StageModule(binding, split[s], parallel.ep_group)
            self.stage_modules.append(module)
            example_in = torch.zeros(shape[:2], dtype=torch.long) if s == 0 else torch.zeros(shape, requires_grad=True)
            example_out = torch.zeros((*shape[:2], vocab) if s == stages_total - 1 else shape, requires_grad=True)
            self.stages.append(TimedStage(module, s, stages_total, torch.device("cpu"), input_args=(example_in,),
                                          output_args=(example_out,), group=parallel.pp_group))
        self.losses: list[torch.Tensor] = []
        scaled = loss_fn(plan.microbatches * grid.shards)

        def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            value, unscaled = scaled(logits, target)
            self.losses.append(unscaled)
            return value

        self.schedule = ScheduleInterleaved1F1B(self.stages, plan.microbatches, loss_fn=loss, scale_grads=False)
        self.has_first, self.has_last = 0 in range(pp_rank, stages_total, plan.pp), pp_rank == (stages_total - 1) % plan.pp
        params = {id(p): p for m in self.stage_modules for p in m.parameters()}
        self.params: list[torch.Tensor] = list(params.values())
        self.dense: list[torch.Tensor] = [p for m in self.stage_modules for n, p in m.named_parameters() if ".experts." not in n]
        self.opt = optimizer(self.params)

    def step(self, ids: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """One training step; ``self.cpu_ns`` says where its training thread's CPU time went."""
        self.losses = []
        for stage in self.stages:
            stage.cpu_ns = {"fwd": 0, "bwd": 0}
        start_cpu = time.thread_time_ns()
        flat_ids, flat_labels = ids.reshape(-1, ids.shape[-1]), labels.reshape(-1, labels.shape[-1])
        if self.has_first:
            self.schedule.step(flat_ids, target=flat_labels if self.has_last else None)
        else:
            self.schedule.step(target=flat_labels if self.has_last else None)
        reduce_dense(self.dense, self.grid, self.parallel)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        fwd, bwd = (sum(st.cpu_ns[k] for st in self.stages) for k in ("fwd", "bwd"))
        total = time.thread_time_ns() - start_cpu
        self.cpu_ns = {"fwd": fwd, "bwd": bwd, "other": total - fwd - bwd, "total": total}
        return list(self.losses)


def timed(fn: Any, cpu: list[float]) -> tuple[float, Any]:
    """(slowest rank's wall time, result); this process's CPU time is appended to ``cpu``."""
    dist.barrier()
    start, start_cpu = time.perf_counter(), time.process_time()
    out = fn()
    cpu.append(time.process_time() - start_cpu)
    dist.barrier()
    elapsed = torch.tensor([time.perf_counter() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed), out


def gather_losses(losses: list[torch.Tensor], group: Any, in_group: bool, shards: int) -> torch.Tensor | None:
    if not in_group:
        return None
    mine = torch.stack(losses).reshape(-1)
    out = [torch.empty_like(mine) for _ in range(shards)]
    dist.all_gather(out, mine, group=group)
    return torch.stack(out)


def model_config(args: argparse.Namespace) -> TinyConfig:
    """The tiny model at PP > 1; at PP = 1 the wider one (``WIDE``, ``--hidden`` and ``--layers`` override)."""
    if args.pp > 1 and args.hidden is None and args.layers is None:
        return TinyConfig()
    sizes = dict(WIDE) if args.pp == 1 else {}
    if args.hidden is not None:
        sizes["hidden_size"] = args.hidden
    if args.layers is not None:
        sizes["num_layers"] = args.layers
    return TinyConfig(**sizes)


def model_builder(cfg: TinyConfig) -> Any:
    def build() -> torch.nn.Module:
        if cfg == TinyConfig():
            return build_model()
        torch.manual_seed(0)
        return TinyQwen3Next(cfg)

    return build


def plan_for(args: argparse.Namespace, build: Any) -> bytes:
    if args.plan:
        return plan_bytes(args.plan)
    import tessera
    from codegen.emit import plan_bytes as emit

    source: Any = str(ROOT / "examples" / "tiny_qwen3_next.py") if model_config(args) == TinyConfig() else build()
    module = tessera.compile(source, hardware=args.hardware, ledger=args.ledger, microbatches=args.microbatches,
                             seq_len=args.seq_len, pp=args.pp, vpp=1 if args.pp == 1 else 2, ep=args.ep)
    return emit(module)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--plan", help="the Tessera plan (.tsb) to run")
    p.add_argument("--hardware", default="cpu", help="without --plan: compile for this target (default: this CPU)")
    p.add_argument("--ledger", help="without --plan: fold a previous run's ledger into the compiled plan")
    p.add_argument("--steps", type=int, default=8, help="timed steps of each")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each first")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pp", type=int, default=2, help="pipeline stages (without --plan); 1: against the plain loop")
    p.add_argument("--ep", type=int, default=2, help="expert-parallel ranks (without --plan)")
    p.add_argument("--hidden", type=int, help="the model's hidden size (default: the tiny model's; at --pp 1 WIDE's)")
    p.add_argument("--layers", type=int, help="the model's decoder layers")
    p.add_argument("--no-dbo", dest="dbo", action="store_false", help="Tessera without DBO (deferred work runs where offered)")
    p.add_argument("--no-save", action="store_true", help="do not write bench/results")
    args = p.parse_args()
    deterministic_cpu_mode()
    # Rank 0 compiles before joining the process group: the planner may start worker processes,
    # and forking once gloo's threads run can hang the child.
    cfg = model_config(args)
    build = model_builder(cfg)
    payload: list[Any] = [plan_for(args, build) if os.environ.get("RANK") == "0" else None]
    # The other ranks wait here while rank 0 compiles (minutes on a loaded machine).
    dist.init_process_group("gloo", timeout=timedelta(seconds=300 if args.plan else 1800))
    rank = dist.get_rank()
    dist.broadcast_object_list(payload, src=0)
    data: bytes = payload[0]
    info = runtime.load_plan(data, rank=0).plan
    if info.seq_len != args.seq_len or info.microbatches != args.microbatches:
        raise SystemExit(f"the plan is for seq_len {info.seq_len} and {info.microbatches} micro-batches; pass those")

    expect: dict[str, Any] = {"seq_len": args.seq_len}
    if cfg == TinyConfig():
        expect["model"] = NAME
    session = TrainingSession.start(data, build(), expect=expect, dbo=args.dbo)
    tessera_opt = optimizer(session.parameters())
    grid = session.grid
    parallel = create_groups(grid, rank)
    baseline_type = LoopBaseline if info.pp == 1 else Baseline
    baseline = baseline_type(info, list(session.executor.layout.layers), grid, parallel, build)
    last_ranks = grid.dense_group(grid.pp - 1)
    loss_group = dist.new_group(last_ranks)
    in_loss_group = rank in last_ranks

    base_s, tess_s, overhead, agree, counters = [], [], [], [], {}
    base_cpu: list[float] = []
    tess_cpu: list[float] = []
    parts = torch.zeros(3)  # this rank's compute, blocked, runtime seconds over the timed steps
    a2a_share: list[float] = []  # the baseline's blocking All-to-All time over its step time (this rank)
    # this rank's training-thread CPU seconds over the timed steps, per phase (PHASES)
    phases = torch.zeros(len(PHASES), dtype=torch.float64)
    for step in range(args.warmup + args.steps):
        ids, labels = make_batch(step, args.seed, grid.shards, args.microbatches, 1, args.seq_len, cfg.vocab_size, 0)
        mine_ids, mine_labels = ids[session.shard], labels[session.shard]
        b_time, b_losses = timed(lambda x=mine_ids, y=mine_labels: baseline.step(x, y), base_cpu)

        def tessera_step(x: torch.Tensor = mine_ids, y: torch.Tensor = mine_labels) -> Any:
            result = session.step(x, y, labels_shifted=True)
            tessera_opt.step()
            tessera_opt.zero_grad(set_to_none=True)
            return result

        t_time, result = timed(tessera_step, tess_cpu)
        share = torch.tensor([result.iteration.runtime_ns / max(1, result.iteration.wall_ns)])
        dist.all_reduce(share)
        b_all = gather_losses(b_losses, loss_group, in_loss_group, grid.shards)
        t_all = gather_losses(result.iteration.loss_tensors, loss_group, in_loss_group, grid.shards)
        if step >= args.warmup:
            a2a_share.append(baseline.a2a_ns / 1e9 / b_time)
            base_s.append(b_time)
            tess_s.append(t_time)
            overhead.append(float(share) / grid.world_size)
            it = result.iteration
            parts += torch.tensor([it.compute_ns, it.blocked_ns, it.runtime_ns], dtype=torch.float32) / 1e9
            phases += torch.tensor([baseline.cpu_ns[k] for k in ("fwd", "bwd", "other", "total")]
                                   + [it.cpu_ns[k] for k in ("fwd", "dgrad", "wgrad", "other", "total", "comm")], dtype=torch.float64) / 1e9
        if rank == session.reporting_rank:
            assert b_all is not None and t_all is not None
            agree.append(torch.equal(b_all.view(torch.int32), t_all.view(torch.int32)))
            counters = result.iteration.counters
            print(f"step {step}: baseline {b_time * 1e3:8.1f} ms  tessera {t_time * 1e3:8.1f} ms  "
                  f"loss {t_all.mean().item():.6f}  losses equal: {agree[-1]}", flush=True)
    cpu = torch.tensor([statistics.mean(base_cpu[args.warmup:]), statistics.mean(tess_cpu[args.warmup:])])
    cpu = torch.cat([cpu, torch.tensor([statistics.mean(a2a_share)])])
    per_rank = [torch.zeros(6) for _ in range(grid.world_size)]
    dist.all_gather(per_rank, torch.cat([parts / max(1, args.steps), cpu]))
    phases_per_rank = [torch.zeros(len(PHASES), dtype=torch.float64) for _ in range(grid.world_size)]
    dist.all_gather(phases_per_rank, phases / max(1, args.steps))
    if rank == session.reporting_rank:
        report(args, info, base_s, tess_s, overhead, all(agree), counters, session, per_rank, phases_per_rank, baseline)
    session.close()
    dist.barrier()
    dist.destroy_process_group()
    return 0


def report(args: argparse.Namespace, info: Any, base_s: list[float], tess_s: list[float], overhead: list[float],
           losses_equal: bool, counters: dict[str, float], session: TrainingSession, per_rank: list[torch.Tensor],
           phases_per_rank: list[torch.Tensor], baseline: Any) -> None:
    base_it, tess_it = 1 / statistics.median(base_s), 1 / statistics.median(tess_s)
    ratio = tess_it / base_it
    mark = "meets" if ratio >= MARK_SPEEDUP and losses_equal else "misses"
    layout = session.executor.layout.stage_layers
    cfg = model_config(args)
    print()
    print(f"tiny Qwen3-Next (hidden {cfg.hidden_size}, {cfg.num_layers} layers), PP={info.pp} VPP={info.vpp} EP={info.ep}, "
          f"{info.microbatches} micro-batches of {info.micro_batch_size}x{args.seq_len} tokens, "
          f"{len(per_rank)} gloo processes on this CPU, {args.steps} timed steps")
    print(f"  Tessera plan stages: {' | '.join('+'.join(s) for s in layout)}")
    if info.pp > 1:
        print(f"  baseline stages:     {' | '.join('+'.join(s) for s in even_stage_layers(list(session.executor.layout.layers), len(layout)))}")
        rows = [("ScheduleInterleaved1F1B (even split)", base_it), ("Tessera (plan, FSM + executor)", tess_it)]
    else:
        shares = [float(t[5]) for t in per_rank]
        print(f"  baseline's blocking All-to-All: {100 * min(shares):.0f}-{100 * max(shares):.0f}% of its iteration "
              "(per rank, mean over the timed steps)")
        rows = [("plain loop, blocking All-to-All", base_it), ("Tessera (combined pairs, async All-to-All)", tess_it)]
    for name, it in rows:
        print(f"  {name:<38} {it:7.3f} it/s  ({1e3 / it:8.1f} ms/iteration)")
    print(f"  speed-up: {ratio:.3f}x  (mark >= {MARK_SPEEDUP}x with identical losses: {mark})")
    step_ratios = sorted(b / t for b, t in zip(base_s, tess_s))
    print(f"  per-step speed-up (each step's baseline time over its Tessera time): median {statistics.median(step_ratios):.3f}x, "
          f"range {step_ratios[0]:.3f}x .. {step_ratios[-1]:.3f}x")
    print(f"  losses identical every step (bitwise): {losses_equal}")
    print(f"  Tessera runtime overhead (FSM + executor bookkeeping): {100 * statistics.mean(overhead):.1f}% of iteration time")
    print("  Tessera per rank, ms per iteration (compute / blocked on transfers / runtime): "
          + "; ".join(f"rank {r}: {c * 1e3:.0f} / {b * 1e3:.0f} / {o * 1e3:.0f}" for r, (c, b, o, *_) in enumerate(t.tolist() for t in per_rank)))
    print("  CPU time per rank, ms per iteration (baseline / Tessera): "
          + "; ".join(f"rank {r}: {bc * 1e3:.0f} / {tc * 1e3:.0f}" for r, (_, _, _, bc, tc, _) in enumerate(t.tolist() for t in per_rank)))
    print("  training-thread CPU per rank, ms per iteration:")
    print("    baseline: forward chunks / backward chunks / other = total;  "
          "Tessera: forward / dgrad / wgrad / comm / runtime = total")
    print("    (Tessera's comm: its transfer and collective calls, issue and wait; the baseline's are inside its chunks)")
    for r, values in enumerate(phases_per_rank):
        v = [x * 1e3 for x in values.tolist()]
        print(f"    rank {r}: baseline {v[0]:.0f} / {v[1]:.0f} / {v[2]:.0f} = {v[3]:.0f};  "
              f"Tessera {v[4]:.0f} / {v[5]:.0f} / {v[6]:.0f} / {v[9]:.0f} / {v[7]:.0f} = {v[8]:.0f}  ({v[8] / max(v[3], 1e-9):.2f}x)")
    keys = ("tasks_run", "deferred", "placed", "fallbacks", "slots_filled", "implicit_waits", "max_imbalance",
            "split_dedicated_ops", "split_general_ops")
    print("  FSM/executor counters (last step, reporting rank): " + ", ".join(f"{k}={counters.get(k)}" for k in keys))
    worst_cpu = max(float(v[8]) / max(float(v[3]), 1e-12) for v in phases_per_rank)
    if not args.no_save:
        save(args, info, base_it, tess_it, ratio, losses_equal, overhead, layout, base_s, tess_s, phases_per_rank,
             rows, per_rank, worst_cpu, cfg)
    print(f"speedup {ratio:.2f}x over {baseline.name} (per-step ratios {step_ratios[0]:.2f}-{step_ratios[-1]:.2f}), "
          f"losses identical: {'yes' if losses_equal else 'no'}")
    print(f"training-thread CPU {worst_cpu:.2f}x the baseline's (worst rank)")


def save(args: argparse.Namespace, info: Any, base_it: float, tess_it: float, ratio: float, losses_equal: bool,
         overhead: list[float], layout: Any, base_s: list[float], tess_s: list[float], phases_per_rank: list[torch.Tensor],
         rows: list[tuple[str, float]], per_rank: list[torch.Tensor], worst_cpu: float, cfg: TinyConfig) -> None:
    suffix = "" if info.pp > 1 else f"_pp{info.pp}_ep{info.ep}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    record = {
        "pp": info.pp, "vpp": info.vpp, "ep": info.ep, "microbatches": info.microbatches, "seq_len": args.seq_len,
        "steps": args.steps, "baseline_it_s": base_it, "tessera_it_s": tess_it, "speedup": ratio,
        "losses_identical": losses_equal, "runtime_overhead_share": statistics.mean(overhead),
        "tessera_stages": [list(s) for s in layout], "baseline_samples_s": base_s, "tessera_samples_s": tess_s,
        "thread_cpu_ms_per_rank": [dict(zip(PHASES, (round(x * 1e3, 1) for x in v.tolist()))) for v in phases_per_rank],
        "worst_rank_thread_cpu_ratio": worst_cpu, "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers,
        "baseline_a2a_share_per_rank": [float(t[5]) for t in per_rank] if info.pp == 1 else None,
        "cpus": os.cpu_count(), "load_average_at_end": list(os.getloadavg()),
    }
    (RESULTS / f"e2e_cpu{suffix}.json").write_text(json.dumps(record, indent=2) + "\n")
    with (RESULTS / f"e2e_cpu{suffix}.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "it_s", "ms_per_iteration"])
        for name, it in rows:
            w.writerow([name, f"{it:.4f}", f"{1e3 / it:.1f}"])


if __name__ == "__main__":
    sys.exit(main())
