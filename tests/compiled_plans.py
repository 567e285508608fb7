"""Small modules planned by the real passes, down to per-rank programs and their bytecode.

``planned_module`` builds a synthetic Qwen3-Next-like module (``synthetic_ir``) at the given
parallel settings and runs candidates, overlap-schedule, partition (with ``dbo=True`` dbo-slots)
and pipeline on it;
``compiled_plan`` is its ``.tsb`` bytes. Both are cached per session (planning takes seconds).
"""

from __future__ import annotations

import copy
from functools import cache

from codegen.emit import plan_bytes
from passes.manager import PassManager, parse_pipeline
from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module

PLANNING = "candidates{window=1},overlap-schedule{jobs=1 verify=false},partition"


@cache
def _planned(pp: int, vpp: int, microbatches: int, groups: int, ep: int, combined: bool, dbo: bool) -> Module:
    parallel = ParallelConfig(pp=pp, vpp=vpp, ep=ep, microbatches=microbatches, seq_len=512)
    module = synthetic_module(QWEN3_NEXT_PATTERN * groups, gemm_flops=10**10, mixer_flops=10**10, a2a_bytes=10**6,
                              param_bytes=10**6, parallel=parallel)
    if combined:
        module.attrs["combined"] = True  # the pipeline order: a run-wide setting in the header
    passes = PLANNING + (",dbo-slots" if dbo else "") + ",pipeline"
    PassManager(parse_pipeline(passes)).run(module)
    return module


def planned_module(
    pp: int, vpp: int, microbatches: int, groups: int = 1, ep: int = 2, combined: bool = False, dbo: bool = False
) -> Module:
    """A fresh copy (callers may edit it) of the planned module."""
    return copy.deepcopy(_planned(pp, vpp, microbatches, groups, ep, combined, dbo))


@cache
def compiled_plan(
    pp: int, vpp: int, microbatches: int, groups: int = 1, ep: int = 2, combined: bool = False, dbo: bool = False
) -> bytes:
    return plan_bytes(_planned(pp, vpp, microbatches, groups, ep, combined, dbo))
