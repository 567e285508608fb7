"""Train a tiny transformers MoE model under a Tessera plan (PP=2 x EP=2 on four ranks), or with plain transformers.

    torchrun --standalone --nproc-per-node 4 examples/train_hf.py --model-type qwen3_moe --steps 5
    python examples/train_hf.py --model-type qwen3_moe --steps 5 --reference
    python examples/train_hf.py --model-type qwen3_moe --save-plan plan.tsb --steps 0

``--model-type`` is a transformers model type that a runtime binding trains
(``runtime.bindings.registered_bindings()``: qwen3_moe, mixtral, ...). Its
``AutoConfig.for_model(TYPE)`` is shrunk to ``--layers --hidden --experts
--top-k --vocab`` (4 attention heads, 2 KV heads), the weights are seeded
(``--seed``), and every step trains on ``--microbatches`` sequences of
``--seq-len`` seeded random tokens per EP rank, with transformers' labels
(``labels = input_ids``) and AdamW.

Under torchrun rank 0 compiles the plan for the model (``tessera.compile``,
PP=2 x EP=2, the analytic cost model of ``--hardware``) or reads ``--plan``;
every rank starts a ``runtime.session.TrainingSession`` with it, and the last
stage's first rank prints ``step k loss X``. ``--reference`` trains the same
model, data and seed in one process with plain transformers
(``model(ids, labels=ids)``, the micro-batches' gradients accumulated as the
session does: the mean of the micro-batch losses) and prints the same lines.
``--save-checkpoint DIR`` writes the trained model with ``save_pretrained``
(under torchrun, gathered from every rank with ``session.full_state_dict()``),
so ``AutoModelForCausalLM.from_pretrained(DIR)`` loads it.
"""

# SIGTERM is blocked before torch starts any thread, so that the health watch thread
# receives it when torchrun stops the job (runtime.health explains why).
import signal  # noqa: I001

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PARALLEL: dict[str, Any] = {"pp": 2, "vpp": 1, "ep": 2, "micro_batch_size": 1, "dtype": "fp32"}
# Config fields a family may name its expert count by.
EXPERT_COUNT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model-type", required=True, help="a transformers model type with a runtime binding (qwen3_moe, mixtral, ...)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--experts", type=int, default=4)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--vocab", type=int, default=128)
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--steps", type=int, default=5, help="0: stop once the plan is compiled (and saved)")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the data")
    p.add_argument("--plan", help="a compiled plan (.tsb) to train under; default: compile one for the model")
    p.add_argument("--save-plan", metavar="PATH", help="write the plan compiled for the model here")
    p.add_argument("--hardware", default="h100", help="the hardware whose analytic costs the compiled plan uses")
    p.add_argument("--reference", action="store_true", help="train in one process with plain transformers instead")
    p.add_argument("--save-checkpoint", metavar="DIR", help="save_pretrained the trained model here")
    return p.parse_args(argv)


# ---------------------------------------------------------------- the model, its data, its optimizer


def tiny_config(args: argparse.Namespace) -> Any:
    """``AutoConfig.for_model(TYPE)`` shrunk to the flags (only fields the family's config has are set)."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(args.model_type)
    if args.hidden % 4:
        raise SystemExit(f"error: --hidden {args.hidden} must be a multiple of the 4 attention heads")
    wanted: dict[str, Any] = {
        "num_hidden_layers": args.layers, "hidden_size": args.hidden, "vocab_size": args.vocab,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": args.hidden // 4,
        "num_experts_per_tok": args.top_k, "max_position_embeddings": max(args.seq_len, 128),
        "moe_intermediate_size": args.hidden // 2, "shared_expert_intermediate_size": args.hidden // 2,
        # The expert MLP's size where the family has no separate one (Mixtral), else the dense MLP's.
        "intermediate_size": args.hidden if hasattr(default, "moe_intermediate_size") else args.hidden // 2,
        "tie_word_embeddings": False, "output_router_logits": False,
    }
    counts = [name for name in EXPERT_COUNT_FIELDS if hasattr(default, name)]
    if not counts:
        raise SystemExit(f"error: the {args.model_type} config has none of {', '.join(EXPERT_COUNT_FIELDS)}: not an MoE model")
    wanted.update({name: args.experts for name in counts})
    return AutoConfig.for_model(args.model_type, **{k: v for k, v in wanted.items() if hasattr(default, k)})


def build(config: Any, seed: int) -> torch.nn.Module:
    """The model of ``config`` with seeded weights (the same in every process)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config)


def make_batch(step: int, seed: int, shards: int, microbatches: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Token ids [shards, microbatches, 1, seq_len], the same in every process."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab, (shards, microbatches, 1, seq_len), generator=g)


def optimizer(params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    # foreach=False: the per-tensor update is elementwise, the same on a rank's slice of the experts.
    return torch.optim.AdamW(params, lr=lr, foreach=False)


def print_step(step: int, loss: float) -> None:
    print(f"step {step} loss {loss:.8f}", flush=True)


def save_checkpoint(directory: str, config: Any, state: dict[str, torch.Tensor]) -> None:
    """``state`` (the model's own parameter names) loaded into a fresh model and written with ``save_pretrained``."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(state)
    model.save_pretrained(directory)


# ---------------------------------------------------------------- one process, plain transformers


def train_reference(args: argparse.Namespace) -> int:
    config = tiny_config(args)
    model: Any = build(config, args.seed)
    opt = optimizer(list(model.parameters()), args.lr)
    shards = int(PARALLEL["ep"])  # the data the PP=2 x EP=2 job trains on: one slice per EP rank
    for step in range(args.steps):
        ids = make_batch(step, args.seed, shards, args.microbatches, args.seq_len, args.vocab)
        losses = []
        for shard in range(shards):
            for mb in range(args.microbatches):
                loss = model(ids[shard, mb], labels=ids[shard, mb]).loss
                (loss / (shards * args.microbatches)).backward()
                losses.append(float(loss.detach()))
        print_step(step, sum(losses) / len(losses))
        opt.step()
        opt.zero_grad(set_to_none=True)
    if args.save_checkpoint:
        model.save_pretrained(args.save_checkpoint)
    return 0


# ---------------------------------------------------------------- under a plan


def compile_plan(args: argparse.Namespace, config: Any) -> tuple[bytes, bytes]:
    """(plan bytecode, plan signature) of the model of ``config``, captured on the meta device."""
    from transformers import AutoModelForCausalLM

    from codegen.emit import plan_bytes
    from codegen.signature import plan_signature
    from tessera.api import compile

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    module = compile(model, hardware=args.hardware, microbatches=args.microbatches, seq_len=args.seq_len, **PARALLEL)
    return plan_bytes(module), plan_signature(module)


def train_distributed(args: argparse.Namespace, config: Any, compiled: tuple[bytes, bytes] | None) -> int:
    import torch.distributed as dist

    from runtime.health import write_line
    from runtime.session import TrainingSession

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    rank = dist.get_rank()
    session = None
    try:
        # Rank 0's plan (and, when it compiled it, the signature) for every rank.
        payload: list[Any] = [None]
        if rank == 0:
            payload[0] = compiled if compiled is not None else (Path(args.plan).read_bytes(), None)
        dist.broadcast_object_list(payload, src=0)
        data, signature = payload[0]
        expect = {"model": args.model_type, "microbatches": args.microbatches, "seq_len": args.seq_len}
        session = TrainingSession.start(data, build(config, args.seed), signature=signature, expect=expect)
        opt = optimizer(session.parameters(), args.lr)
        for step in range(args.steps):
            ids = session.my_slice(make_batch(step, args.seed, session.grid.shards, args.microbatches, args.seq_len, args.vocab))
            result = session.step(ids, ids)  # transformers' labels: shifted inside
            if result.loss is not None:
                print_step(step, result.loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if args.save_checkpoint:
            state = session.full_state_dict()
            if state is not None:
                save_checkpoint(args.save_checkpoint, config, state)
        dist.barrier()
        session.close()
        dist.destroy_process_group()
        return 0
    except Exception as err:  # noqa: BLE001 - reported on this rank's line, the job fails
        record = session.fail(f"{type(err).__name__}: {err}") if session is not None else f"rank {rank}: {err}"
        write_line(f"[rank {rank}] error: {record}")
        return 1


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.reference:
        return train_reference(args)
    from runtime.bindings import BindingError, binding_for
    from runtime.local_reference import deterministic_cpu_mode

    deterministic_cpu_mode()
    config = tiny_config(args)
    try:
        binding_for(build(config, args.seed))
    except BindingError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    distributed = "RANK" in os.environ
    # Rank 0 compiles before joining the process group: the planner may start worker processes,
    # and forking once gloo's threads run can hang the child.
    compiled = None
    if not args.plan and (not distributed or os.environ["RANK"] == "0"):
        compiled = compile_plan(args, config)
        if args.save_plan:
            Path(args.save_plan).write_bytes(compiled[0])
            print(f"wrote {args.save_plan} ({len(compiled[0])} bytes)", flush=True)
    if args.steps == 0:
        return 0
    if not distributed:
        print("error: launch with torchrun --standalone --nproc-per-node 4 (see --help), or pass --reference",
              file=sys.stderr)
        return 1
    return train_distributed(args, config, compiled)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
