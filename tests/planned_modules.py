"""Small planned modules (synthetic Qwen3-Next-like layers through the planning passes), built once per session."""

from __future__ import annotations

import copy
from functools import cache

from passes.manager import PassManager, parse_pipeline
from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

PLANNING = "candidates{window=1},overlap-schedule{jobs=1},profile,partition"


@cache
def _planned(groups: int, pp: int, vpp: int, microbatches: int, ep: int, dbo: bool, combined: bool | None) -> Module:
    module = synthetic_module(
        QWEN3_NEXT_PATTERN * groups, gemm_flops=4 * 10**11, mixer_flops=6 * 10**11, a2a_bytes=4 * 10**7,
        parallel=ParallelConfig(pp=pp, vpp=vpp, ep=ep, microbatches=microbatches, combined=combined),
    )
    module.attrs.update(num_experts=4 * ep, top_k=2, hidden_size=1024)
    PassManager(parse_pipeline(PLANNING + (",dbo-slots" if dbo else ""))).run(module)
    return module


def planned(
    groups: int = 2, pp: int = 2, vpp: int = 2, microbatches: int = 4, ep: int = 8, dbo: bool = False,
    combined: bool | None = None,
) -> Module:
    """A fresh copy of a planned synthetic module (the copy may be changed freely); ``combined``: the
    pipeline order variant in its header (None: the default, combined whenever ep > 1)."""
    return copy.deepcopy(_planned(groups, pp, vpp, microbatches, ep, dbo, combined))
