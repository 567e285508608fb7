"""Tiny transformers MoE models trained under a plan: their configs, their plan, and the torchrun worker.

    python -m torch.distributed.run --standalone --nproc-per-node 4 tests/hf_training.py \
        --model-type qwen3_moe --plan plan.tsb --signature plan.sig --expect-model qwen3_moe \
        --steps 3 --out DIR

Every rank builds the same tiny model (seeded), starts a ``TrainingSession``
(the binding is picked from the model), trains ``--steps`` steps with AdamW on
the batches of ``make_batch`` and, on the reporting rank, saves each step's
losses [shard][micro-batch] to ``DIR/losses<step>.pt``. The tests compare them
with plain transformers training and with ``runtime.local_reference``.
"""

# As a torchrun worker, SIGTERM is blocked before torch starts any thread (runtime.health explains
# why); imported by the tests, the test process's signals are left alone.
import signal  # noqa: I001

if __name__ == "__main__":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYERS, HIDDEN, EXPERTS, TOP_K, VOCAB = 4, 64, 4, 2, 128
PARALLEL = {"pp": 2, "vpp": 1, "ep": 2, "microbatches": 2, "seq_len": 16, "micro_batch_size": 1, "dtype": "fp32"}
LR = 1e-2


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A 4-layer, hidden-64, 4-experts top-2 transformers config of ``model_type`` (a family with a binding)."""
    from transformers import AutoConfig

    common: dict[str, Any] = dict(num_hidden_layers=LAYERS, hidden_size=HIDDEN, vocab_size=VOCAB, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=16, num_experts_per_tok=TOP_K, tie_word_embeddings=False)
    if model_type == "qwen3_moe":
        common.update(num_experts=EXPERTS, moe_intermediate_size=32, intermediate_size=64)
    elif model_type == "mixtral":
        common.update(num_local_experts=EXPERTS, intermediate_size=32)
    elif model_type == "qwen2_moe":
        common.update(num_experts=EXPERTS, moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=64)
    elif model_type == "olmoe":
        common.update(num_experts=EXPERTS, intermediate_size=32, eos_token_id=None)
    elif model_type == "glm4_moe":
        common.update(n_routed_experts=EXPERTS, moe_intermediate_size=32, intermediate_size=64, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5)
    elif model_type == "minimax_m2":
        common.update(num_local_experts=EXPERTS, intermediate_size=32, bos_token_id=None, eos_token_id=None)
    elif model_type == "ernie4_5_moe":
        # Layer 0 dense (moe_layer_start_index=1), one shared expert.
        common.update(moe_num_experts=EXPERTS, moe_intermediate_size=32, intermediate_size=64, moe_num_shared_experts=1,
                      moe_k=TOP_K, moe_layer_start_index=1)
    elif model_type == "qwen3_next":
        common.update(num_experts=EXPERTS, moe_intermediate_size=32, shared_expert_intermediate_size=32, intermediate_size=64,
                      linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                      linear_conv_kernel_dim=4, layer_types=["linear_attention", "full_attention"] * (LAYERS // 2))
    elif model_type == "deepseek_v3":
        # MLA, layer 0 dense, sigmoid routing over 2 groups of 2 experts (1 group kept), one shared expert.
        del common["head_dim"]
        common["num_key_value_heads"] = common["num_attention_heads"]  # MLA: keys and values per head
        common.update(n_routed_experts=EXPERTS, moe_intermediate_size=32, intermediate_size=64, n_shared_experts=1,
                      first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, kv_lora_rank=16,
                      q_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)
    else:
        raise ValueError(f"no tiny config for model type '{model_type}'")
    common.update(overrides)
    return AutoConfig.for_model(model_type, **common)


def build(config: Any) -> torch.nn.Module:
    """The model of ``config`` with seeded weights (the same in every process)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def compile_plan(config: Any, **parallel: Any) -> tuple[bytes, bytes]:
    """(plan bytecode, signature) of ``config``'s model for PP=2 x EP=2, captured on the meta device."""
    from transformers import AutoModelForCausalLM

    from codegen.emit import plan_bytes
    from codegen.signature import plan_signature
    from tessera.api import compile

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    module = compile(model, hardware="h100", **{**PARALLEL, **parallel})
    return plan_bytes(module), plan_signature(module)


def make_batch(step: int, shards: int, microbatches: int, seq_len: int) -> torch.Tensor:
    """Token ids [shards, microbatches, 1, seq_len + 1], the same in every process."""
    g = torch.Generator().manual_seed(1_000_003 + step)
    return torch.randint(0, VOCAB, (shards, microbatches, 1, seq_len + 1), generator=g)


def optimizer(params: list[torch.Tensor]) -> torch.optim.Optimizer:
    # foreach=False: the per-tensor update is elementwise, the same bits on a slice of the experts.
    return torch.optim.AdamW(params, lr=LR, foreach=False)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--model-type", required=True)
    p.add_argument("--norm-topk-prob", choices=["true", "false"], help="Qwen3-MoE's norm_topk_prob")
    p.add_argument("--plan", required=True)
    p.add_argument("--signature", required=True, help="the plan signature of the model (raw bytes)")
    p.add_argument("--expect-model", help="the model name the plan must have been compiled for (the plan's 'model')")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {} if args.norm_topk_prob is None else {"norm_topk_prob": args.norm_topk_prob == "true"}


def main(argv: list[str] | None = None) -> int:
    import torch.distributed as dist

    from runtime.health import write_line
    from runtime.local_reference import deterministic_cpu_mode
    from runtime.session import TrainingSession

    args = parse(argv)
    deterministic_cpu_mode()
    config = tiny_config(args.model_type, **overrides(args))
    dist.init_process_group("gloo", timeout=timedelta(seconds=300))
    session = None
    try:
        expect: dict[str, Any] = {"microbatches": PARALLEL["microbatches"], "seq_len": PARALLEL["seq_len"]}
        if args.expect_model:
            expect["model"] = args.expect_model
        session = TrainingSession.start(args.plan, build(config), signature=Path(args.signature).read_bytes(),
                                        expect=expect)
        opt = optimizer(session.parameters())
        microbatches, seq_len = int(session.executor.plan.microbatches), int(session.executor.plan.seq_len)
        for step in range(args.steps):
            ids = make_batch(step, session.grid.shards, microbatches, seq_len)
            inputs, labels = ids[..., :-1].contiguous(), ids[..., 1:].contiguous()
            result = session.step(session.my_slice(inputs), session.my_slice(labels), labels_shifted=True)
            if result.loss_tensors is not None:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                torch.save(torch.stack([torch.stack(row) for row in result.loss_tensors]), Path(args.out) / f"losses{step}.pt")
                print(f"step {step} loss {result.loss:.8f}", flush=True)
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
        session.close()
        dist.destroy_process_group()
        return 0
    except Exception as err:  # noqa: BLE001 - reported on this rank's line, the job fails
        record = session.fail(f"{type(err).__name__}: {err}") if session is not None else f"rank {dist.get_rank()}: {err}"
        write_line(f"[rank {dist.get_rank()}] error: {record}")
        return 1


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
