"""Train the tiny Qwen3-Next model under a Tessera plan, or the same training in one process.

    torchrun --standalone --nproc-per-node 4 examples/train_tiny_qwen3_next.py --steps 5
    python examples/train_tiny_qwen3_next.py --reference --steps 5

Under torchrun every rank loads the plan (``--plan plan.tsb``, or one that rank
0 compiles for the tiny model with pp 2 x ep 2), checks it against the model it
trains, and runs its program with the C++ FSM and the torch executor
(``runtime.session``); the last stage's first rank prints ``step k loss X``
and the runtime's counters. ``--reference`` trains the same model, data and
seed in one process with plain autograd (``runtime.local_reference``) and
prints the same lines: in the deterministic CPU mode both agree bitwise.

``--dump DIR`` writes each step's losses and reduced gradients (``torch.save``)
for comparison; ``--ledger run.jsonl`` writes the prediction ledger. The
``--fail-*`` options make one rank fail on purpose (in training, or at start-up
before or after its health watch starts), to see every other rank name it.
"""

# SIGTERM is blocked before torch starts any thread, so that the health watch thread
# receives it when torchrun stops the job (runtime.health explains why).
import signal  # noqa: I001

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import traceback  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny_qwen3_next import NAME, PARALLEL, TinyConfig, build_model  # noqa: E402

import runtime  # noqa: E402
from runtime.health import start_job_watch, write_line  # noqa: E402
from runtime.local_reference import LocalReference, deterministic_cpu_mode  # noqa: E402
from runtime.session import TrainingSession, load_programs, mean_loss  # noqa: E402

LR = 3e-3


def make_batch(step: int, seed: int, shards: int, microbatches: int, batch: int, seq_len: int, vocab: int, skew: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [shards, microbatches, batch, seq_len] and their next-token labels, the same in every process.

    ``skew`` > 0 draws every token from the first ``skew`` ids only: the hidden states then
    cluster and the router sends most tokens to a few experts (skewed routing).
    """
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    high = skew if skew > 0 else vocab
    ids = torch.randint(0, high, (shards, microbatches, batch, seq_len + 1), generator=g)
    return ids[..., :-1].contiguous(), ids[..., 1:].contiguous()


def optimizer(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    # foreach=False: the per-tensor update is elementwise, so it gives the same bits on a
    # rank's slice of the experts as on the whole tensor.
    return torch.optim.AdamW(params, lr=LR, foreach=False)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--plan", help="a compiled plan (.tsb); default: rank 0 compiles one for this model")
    p.add_argument("--reference", action="store_true", help="train in one process with plain autograd instead")
    p.add_argument("--ep", type=int, default=PARALLEL["ep"], help="EP size (with --reference; a plan carries its own)")
    p.add_argument("--microbatches", type=int, default=PARALLEL["microbatches"])
    p.add_argument("--seq-len", type=int, default=PARALLEL["seq_len"])
    p.add_argument("--seed", type=int, default=0, help="data seed")
    p.add_argument("--skew", type=int, default=0, help="draw tokens from this many ids only (skewed routing)")
    p.add_argument("--no-dbo", dest="dbo", action="store_false", help="run deferred weight gradients in place")
    p.add_argument("--driver", choices=["fsm", "pipelining"], default="fsm",
                   help="who orders the work: the C++ FSM, or torch.distributed.pipelining running the exported "
                        "schedule (OVERLAP_F_B pairs by Tessera's executor)")
    p.add_argument("--dump", metavar="DIR", help="write each step's losses and gradients here")
    p.add_argument("--ledger", metavar="PATH", help="write the prediction ledger (JSON lines)")
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank fails on purpose ...")
    p.add_argument("--fail-at", choices=["action", "start", "launch"], default="action",
                   help="... during training (action), at start-up once its health watch runs (start), or at "
                        "start-up before it (launch) ...")
    p.add_argument("--fail-step", type=int, default=0, help="... in this step ...")
    p.add_argument("--fail-at-action", type=int, default=0, help="... after this many FSM actions ...")
    p.add_argument("--fail-mode", choices=["raise", "exit"], default="raise", help="... by raising, or dying at once")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    return p.parse_args(argv)


def dump(directory: str | None, name: str, value: Any) -> None:
    if directory:
        Path(directory).mkdir(parents=True, exist_ok=True)
        torch.save(value, Path(directory) / name)


def print_step(step: int, loss: float) -> None:
    print(f"step {step} loss {loss:.6f}", flush=True)


# ---------------------------------------------------------------- one process


def train_reference(args: argparse.Namespace) -> int:
    deterministic_cpu_mode()
    cfg = TinyConfig()
    ref = LocalReference(build_model, ep=args.ep, microbatches=args.microbatches, optimizer=optimizer)
    for step in range(args.steps):
        ids, labels = make_batch(step, args.seed, ref.shards, args.microbatches, 1, args.seq_len, cfg.vocab_size, args.skew)
        losses = ref.step(ids, labels)
        print_step(step, mean_loss([[float(v) for v in row] for row in losses]))
        dump(args.dump, f"losses{step}.pt", torch.stack([torch.stack(row) for row in losses]))
        for shard, model in enumerate(ref.replicas):
            dump(args.dump, f"grads{step}_shard{shard}.pt", {n: p.grad for n, p in model.named_parameters()})
        ref.optimizer_step()
    return 0


# ---------------------------------------------------------------- under a plan


class _FailingFSM:
    """An FSM that makes this rank fail after a number of actions (for the failure tests)."""

    def __init__(self, program: Any, *, at: int, mode: str, **kwargs: Any):
        self._fsm = runtime.FSM(program, **kwargs)
        self._left, self._mode = at, mode

    def advance(self) -> Any:
        self._left -= 1
        if self._left < 0:
            fail_on_purpose(self._mode)
        return self._fsm.advance()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fsm, name)


def fail_on_purpose(mode: str) -> None:
    if mode == "exit":
        os._exit(3)
    raise RuntimeError("injected failure (--fail-rank)")


def plan_and_signature(args: argparse.Namespace, rank: int, compiled: bytes | None, expect: dict[str, Any]) -> tuple[bytes, bytes]:
    """Rank 0 reads (or compiles) the plan and computes the signature of the model this job trains."""
    payload: list[Any] = [None]
    if rank == 0:
        from codegen.signature import plan_signature
        from runtime.bytecode import plan_bytes
        from tessera.api import capture

        data = plan_bytes(args.plan) if args.plan else compiled
        assert data is not None
        # The plan is checked against this run before the model is captured with its settings:
        # a plan for another model or other settings is refused as such, not by the capture.
        info = load_programs(data, None, expect)[0].plan
        module = capture(str(Path(__file__).with_name("tiny_qwen3_next.py")), microbatches=args.microbatches,
                         seq_len=args.seq_len, pp=info.pp, vpp=info.vpp, ep=info.ep)
        # The plan records where its costs came from; the signature covers the model and settings.
        module.attrs["profile_mode"], module.attrs["hardware"] = info.cost_source, info.hardware
        payload[0] = (data, plan_signature(module))
    dist.broadcast_object_list(payload, src=0)
    return payload[0]  # type: ignore[no-any-return]


def compile_plan(args: argparse.Namespace) -> bytes:
    """The tiny model's plan for this CPU (calibrated on first use), as bytecode."""
    import tessera
    from codegen.emit import plan_bytes

    module = tessera.compile(str(Path(__file__).with_name("tiny_qwen3_next.py")), hardware="cpu",
                             microbatches=args.microbatches, seq_len=args.seq_len)
    return plan_bytes(module)


def train_distributed(args: argparse.Namespace) -> int:
    deterministic_cpu_mode()
    rank = int(os.environ["RANK"])
    failing = rank == args.fail_rank
    if failing and args.fail_at == "launch":
        fail_on_purpose(args.fail_mode)
    # Rank 0 compiles before its watch and the process group start: the planner may start worker
    # processes (forking once other threads run can hang the child), and its solvers may hold the
    # interpreter longer than a heartbeat. Its watch, started next, sees any failure meanwhile.
    compiled = compile_plan(args) if not args.plan and rank == 0 else None
    # The watch comes before anything else can fail: every failure from here on, a refused plan
    # included, is named by every rank (runtime.health).
    watch = start_job_watch()
    session: TrainingSession | None = None
    try:
        if failing and args.fail_at == "start":
            fail_on_purpose(args.fail_mode)
        # Long enough for rank 0 to capture the model while the others wait in the broadcast; a
        # rank that dies is reported by the health watch, not by this timeout.
        dist.init_process_group("gloo", timeout=timedelta(seconds=600))
        expect = {"model": NAME, "microbatches": args.microbatches, "seq_len": args.seq_len}
        data, signature = plan_and_signature(args, rank, compiled, expect)
        steps_done = [0]
        fsm_factory = None
        if failing and args.fail_at == "action":
            def fsm_factory(program: Any, **kw: Any) -> Any:
                at = args.fail_at_action if steps_done[0] == args.fail_step else 1 << 60
                return _FailingFSM(program, at=at, mode=args.fail_mode, **kw)
        session = TrainingSession.start(data, build_model(), signature=signature, expect=expect, dbo=args.dbo,
                                        fsm_factory=fsm_factory, driver=args.driver, health=watch)
        opt = optimizer(session.parameters())
        cfg = TinyConfig()
        ledger = None
        if args.ledger:
            from runtime.ledger import PredictionLedger

            ledger = PredictionLedger.for_executor(session.executor)
        for step in range(args.steps):
            steps_done[0] = step
            ids, labels = make_batch(step, args.seed, session.grid.shards, args.microbatches, 1, args.seq_len,
                                     cfg.vocab_size, args.skew)
            result = session.step(session.my_slice(ids), session.my_slice(labels), labels_shifted=True)
            if ledger is not None:
                ledger.record(step, result.iteration)
            if result.losses is not None:
                print_step(step, mean_loss(result.losses))
                counters = {k: round(v, 3) if isinstance(v, float) else v for k, v in result.iteration.counters.items()}
                print(f"  counters {json.dumps(counters, sort_keys=True)}", flush=True)
                dump(args.dump, f"losses{step}.pt", torch.stack([torch.stack(row) for row in result.loss_tensors or []]))
            executor = session.executor
            dump(args.dump, f"grads{step}_rank{rank}_shard{session.shard}.pt",
                 {k: p.grad for k, p in executor.params.items()})
            dump(args.dump, f"wgrad_runs{step}_rank{rank}.pt", dict(executor.wgrad_ran))
            opt.step()
            opt.zero_grad(set_to_none=True)
        if ledger is not None:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, ledger.rows)
            if rank == 0:
                ledger.write(args.ledger, [row for rows in gathered for row in rows])
        dist.barrier()
        session.close()
        dist.destroy_process_group()
        return 0
    except Exception as err:
        if args.debug:
            traceback.print_exc()
        # A broken connection is usually another rank's failure: the watch names that rank.
        record = watch.failure_of(err)
        if record.startswith(f"rank {rank}:"):
            write_line(f"[rank {rank}] error: {record}")
        else:
            write_line(f"[rank {rank}] error: stopping because another rank failed: {record}")
        return 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reference:
        return train_reference(args)
    if "RANK" not in os.environ:
        print("error: launch with torchrun (see --help), or pass --reference to train in one process", file=sys.stderr)
        return 1
    return train_distributed(args)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
