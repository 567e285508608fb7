"""Vocabulary of the Tessera IR: task operations, phases, resources, layer kinds.

Every string that can appear in the textual IR as a kind lives here, so the
printer, parser, verifier and the passes agree on one spelling.
"""

from __future__ import annotations

from enum import Enum


class Phase(str, Enum):
    """When a task runs in a training step.

    ``dgrad`` is the data-gradient half of the backward pass (it propagates
    the loss gradient to the previous layer and lies on the critical path);
    ``wgrad`` is the weight-gradient half, which nothing downstream waits for
    until the optimizer step, so it may be deferred ("movable").
    """

    FWD = "fwd"
    DGRAD = "dgrad"
    WGRAD = "wgrad"


class Resource(str, Enum):
    """The execution resource a task occupies: a compute stream or a communication stream."""

    COMPUTE = "compute"
    COMM = "comm"


class TaskOp(str, Enum):
    """What a task computes or moves. Combined with a Phase it forms the task kind."""

    EMBEDDING = "embedding"
    ATTENTION = "attention"  # softmax attention over the full causal context
    SLIDING_ATTENTION = "sliding_attention"  # softmax attention over a sliding window
    LINEAR_ATTENTION = "linear_attention"  # Gated DeltaNet and other linear-attention mixers
    MLA = "mla"  # multi-head latent attention (DeepSeek)
    SSM = "ssm"  # state-space mixers (Mamba)
    ROUTER = "router"
    DISPATCH = "dispatch"  # expert-parallel All-to-All, tokens to experts
    EXPERT_GEMM = "expert_gemm"
    SHARED_EXPERT = "shared_expert"
    COMBINE = "combine"  # expert-parallel All-to-All, expert outputs back to tokens
    DENSE_MLP = "dense_mlp"
    LM_HEAD = "lm_head"  # output projection and loss


class MixerKind(str, Enum):
    ATTENTION = "attention"
    SLIDING_ATTENTION = "sliding_attention"
    LINEAR_ATTENTION = "linear_attention"
    MLA = "mla"
    SSM = "ssm"
    NONE = "none"


class FfnKind(str, Enum):
    MOE = "moe"
    DENSE = "dense"
    NONE = "none"


class LayerRole(str, Enum):
    EMBEDDING = "embedding"
    DECODER = "decoder"
    HEAD = "head"


# All-to-All operations run on the communication stream; everything else computes.
COMM_OPS = frozenset({TaskOp.DISPATCH, TaskOp.COMBINE})

# Operations that own weights and therefore have a wgrad task in the backward pass.
# The router owns its gating matrix; All-to-All owns nothing.
WEIGHTED_OPS = frozenset(
    {
        TaskOp.EMBEDDING,
        TaskOp.ATTENTION,
        TaskOp.SLIDING_ATTENTION,
        TaskOp.LINEAR_ATTENTION,
        TaskOp.MLA,
        TaskOp.SSM,
        TaskOp.ROUTER,
        TaskOp.EXPERT_GEMM,
        TaskOp.SHARED_EXPERT,
        TaskOp.DENSE_MLP,
        TaskOp.LM_HEAD,
    }
)

MIXER_OPS: dict[MixerKind, TaskOp] = {
    MixerKind.ATTENTION: TaskOp.ATTENTION,
    MixerKind.SLIDING_ATTENTION: TaskOp.SLIDING_ATTENTION,
    MixerKind.LINEAR_ATTENTION: TaskOp.LINEAR_ATTENTION,
    MixerKind.MLA: TaskOp.MLA,
    MixerKind.SSM: TaskOp.SSM,
}


def resource_of(op: TaskOp) -> Resource:
    """The only legal resource for an operation."""
    return Resource.COMM if op in COMM_OPS else Resource.COMPUTE


DTYPE_BYTES: dict[str, int] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
}
