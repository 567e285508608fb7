"""Parallel settings of a training run, carried in the module header.

These are the knobs every part of Tessera reads: the frontend to size tasks,
the passes to plan stages and pairs and to bound memory, the runtime to build
process groups.

The ranks of one pipeline stage are ``dp · cp · tp`` (data-, context- and tensor-parallel)
for the dense layers. The experts fold into the same ranks (Megatron-Core's MoE parallel
folding, expert tensor parallelism 1, which is what the frontend sizes expert work for):
``ep`` of them form an expert-parallel group, and ``dp · cp · tp / ep`` such groups are the
expert-data-parallel replicas (``expert_dp``) over which the distributed optimizer shards
the experts' state. ``dp = 1`` (the default) plans one replica whatever ``ep`` is; a larger
``dp`` must make ``dp · cp · tp`` a multiple of ``ep``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from tessera_ir.errors import TesseraError
from tessera_ir.kinds import DTYPE_BYTES
from tessera_ir.model import Attrs
from tessera_ir.printer import spell_value

# Modules whose activations selective recomputation drops in the forward pass and recomputes in
# the backward pass: Megatron-Core's ``--recompute-modules`` names, with what each drops.
RECOMPUTE_MODULES: dict[str, str] = {
    "core_attn": "the attention core's saved inputs (softmax attention and MLA)",
    "mla_up_proj": "MLA's up-projected queries, keys and values (recomputed from the latents)",
    "layernorm": "the normalised inputs of the mixer and of the FFN (recomputed from the residual)",
    "moe_act": "the experts' activation output (recomputed from the first expert GEMM's output)",
    "moe": "everything inside the MoE block but its input (router, dispatch, experts, combine rerun)",
    "shared_experts": "the shared expert's intermediate activations",
    "mlp": "everything inside a dense MLP but its input",
}


# The largest value of an integer setting: the plan's bytecode stores each in 32 bits.
MAX_SETTING = 2**32 - 1
# The most (micro-batch, virtual stage) runs an iteration may hold: the per-rank programs list a
# forward and a backward of every one, the simulator replays them and planning memory grows by
# tens of kilobytes per run, so this keeps a plan within a few gigabytes. Real runs stay far
# below it (thousands of micro-batches over tens of virtual stages at the most).
MAX_CHUNK_RUNS = 2**17


# Settings that change only the header of a captured module, never its layers or tasks: how many
# pipeline devices and chunks the layers are placed on, how many micro-batches an iteration has,
# how the dense state is replicated and sharded. The compile cache keeps one capture for every
# value of these (``tessera/compile_cache.py``); a test captures a model under different values
# and checks that only the header moves.
PLACEMENT_SETTINGS = ("pp", "vpp", "microbatches", "dp", "distributed_optimizer")


class ParallelConfigError(TesseraError):
    """Parallel settings that cannot describe a real run."""


@dataclass(frozen=True)
class ParallelConfig:
    pp: int = 1  # pipeline-parallel size (devices in the pipeline)
    vpp: int = 1  # virtual stages (model chunks) per pipeline device
    ep: int = 1  # expert-parallel size
    tp: int = 1  # tensor-parallel size (sequence parallelism on)
    microbatches: int = 1  # micro-batches per iteration
    micro_batch_size: int = 1  # sequences per micro-batch
    seq_len: int = 4096
    dtype: str = "bf16"
    dp: int = 1  # data-parallel size (replicas of the dense layers)
    cp: int = 1  # context-parallel size (the sequence split over cp ranks)
    distributed_optimizer: bool = True  # shard optimizer state over the data-parallel replicas
    recompute: tuple[str, ...] = ()  # selective recomputation: names from RECOMPUTE_MODULES
    # The pipeline order variant, a run-wide setting (tessera_ir.run_settings): Megatron-Core's
    # combined 1F1B or not; None (not written in the header): combined whenever ep > 1.
    combined: bool | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            flag = f"--{f.name.replace('_', '-')}"
            if f.name == "dtype":
                if not isinstance(value, str) or value not in DTYPE_BYTES:
                    raise ParallelConfigError(
                        f"unknown dtype {spell_value(value)}; use one of {', '.join(sorted(DTYPE_BYTES))}"
                    )
            elif f.name == "distributed_optimizer":
                if not isinstance(value, bool):
                    raise ParallelConfigError(f"distributed_optimizer must be true or false, got {value!r}")
            elif f.name == "combined":
                if value is not None and not isinstance(value, bool):
                    raise ParallelConfigError(f"combined (the pipeline order) must be true or false, got {value!r}")
            elif f.name == "recompute":
                if isinstance(value, str) or not all(isinstance(m, str) for m in value):
                    raise ParallelConfigError(f"--recompute must be a list of module names, got {value!r}")
                unknown = [m for m in value if m not in RECOMPUTE_MODULES]
                if unknown:
                    raise ParallelConfigError(
                        f"--recompute: unknown module(s) {', '.join(unknown)}; use any of {', '.join(RECOMPUTE_MODULES)}"
                    )
                # One spelling per set: sorted, no repeats (the header prints it).
                object.__setattr__(self, "recompute", tuple(sorted(set(value))))
            elif not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ParallelConfigError(f"{flag} must be a positive integer, got {spell_value(value)}")
            elif value > MAX_SETTING:
                raise ParallelConfigError(
                    f"{flag} {value} is too large: a plan holds each setting in 32 bits (at most {MAX_SETTING})"
                )
        runs = self.microbatches * self.pp * self.vpp
        if runs > MAX_CHUNK_RUNS:
            raise ParallelConfigError(
                f"--microbatches {self.microbatches} x --pp {self.pp} x --vpp {self.vpp} = {runs} micro-batch runs of a "
                f"virtual stage per iteration, more than a plan can list (at most {MAX_CHUNK_RUNS}); "
                "lower --microbatches (raise --micro-batch-size or --dp for the same global batch)"
            )
        if self.vpp > 1 and self.microbatches % self.pp != 0:
            raise ParallelConfigError(
                f"interleaved 1F1B needs the micro-batch count ({self.microbatches}) to be a multiple of "
                f"--pp ({self.pp}) when --vpp > 1"
            )
        if self.seq_len % self.cp:
            raise ParallelConfigError(
                f"--cp {self.cp} must divide --seq-len {self.seq_len}: each context-parallel rank holds an equal share"
            )
        ranks = self.dp * self.cp * self.tp
        if self.dp > 1 and ranks % self.ep:
            raise ParallelConfigError(
                f"expert parallelism folds into the dp·cp·tp = {self.dp}·{self.cp}·{self.tp} = {ranks} ranks of a "
                f"stage, so --ep {self.ep} must divide {ranks}; choose --dp a multiple of "
                f"{self.ep // math.gcd(self.ep, self.cp * self.tp)}"
            )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp

    @property
    def tokens(self) -> int:
        """Tokens in one micro-batch (before tensor-parallel sequence sharding)."""
        return self.micro_batch_size * self.seq_len

    @property
    def world_size(self) -> int:
        """Devices of the whole run: ``pp · dp · cp · tp``."""
        return self.pp * self.dp * self.cp * self.tp

    @property
    def expert_dp(self) -> int:
        """Replicas of each expert (the experts' data-parallel size): ``dp · cp · tp / ep``, at least 1."""
        return max(1, self.dp * self.cp * self.tp // self.ep)

    @property
    def combined_1f1b(self) -> bool:
        """Whether the pipeline runs Megatron-Core's combined 1F1B (EP All-to-All overlapped across
        micro-batches, one more warm-up forward per rank; ``passes/pipelining/order.py``): on
        whenever there is expert-parallel communication to overlap, ``ep > 1``, unless the header's
        ``combined`` setting says otherwise."""
        return self.ep > 1 if self.combined is None else self.combined

    def stages_problem(self, decoder_layers: int) -> str | None:
        """Why this pipeline cannot hold a model of ``decoder_layers`` layers (every virtual stage
        needs one), or None."""
        if self.virtual_stages > decoder_layers:
            return (
                f"--pp {self.pp} x --vpp {self.vpp} = {self.virtual_stages} virtual stages but the model has only "
                f"{decoder_layers} decoder layers; lower --pp or --vpp so that pp*vpp <= {decoder_layers}"
            )
        return None

    def recomputes(self, module: str) -> bool:
        """Whether selective recomputation drops ``module``'s activations (a RECOMPUTE_MODULES name)."""
        return module in self.recompute

    def to_attrs(self) -> Attrs:
        out: Attrs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None:
                continue  # an unset setting (combined) is not written
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_attrs(cls, attrs: Attrs) -> ParallelConfig:
        kwargs: dict[str, object] = {}
        for f in fields(cls):
            if f.name in attrs:
                value = attrs[f.name]
                kwargs[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**kwargs)  # type: ignore[arg-type]

    def replace(self, **overrides: object) -> ParallelConfig:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in overrides.items():
            if value is None:
                continue
            data[key] = tuple(value) if isinstance(value, list) else value
        return ParallelConfig(**data)  # type: ignore[arg-type]

