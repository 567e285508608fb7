"""The ``candidates`` pass: contiguous layer ranges per virtual stage, and the pairs that meet.

Before (layers only)::

    module @m {hardware = "h100", pp = 2, vpp = 2, ...} { layer @embed ... layer @l0 ... layer @l7 ... layer @head ... }

After (``candidates{window=1}``)::

    plan candidate @cand.s0.c0 {first = 0, in_window = true, last = 1, layers = [@embed, @l0, @l1], stage = 0}
    ...
    plan pair @pair.0 {bwd_candidate = @cand.s2.c1, device = 0, fwd_candidate = @cand.s0.c0}

How candidates are chosen:

1. Serial cost of a layer = the sum of the isolated durations (``PlanView.duration``) of all
   its tasks, forward and backward, as if nothing overlapped. The embedding's cost
   counts on the first stage, the LM head's and loss's on the last, scaled by the options
   ``embed-weight`` and ``head-weight`` (default 1: their modelled cost as is).
2. The serially balanced partition minimises the largest serial stage cost over all
   contiguous partitions into ``pp·vpp`` non-empty stages (``partitioning.stages.serially_balanced``).
3. Every boundary between stages may move by up to ``window`` layers either way: stage
   ``s``'s candidates are the ranges whose start lies within ``window`` of its balanced start
   and whose end lies within ``window`` of its balanced end; ranges that cannot be part of
   any contiguous cover are dropped. Uneven layer counts (94 layers in 32 stages) and
   mixed layer kinds need no special case: the boundaries follow the serial costs.
4. ``search=global`` instead keeps every range any stage could hold, except those whose
   pair lower bound (``PairDAG.lower_bound`` of the range beside itself — every stage meets
   itself in the steady state) exceeds ``global-slack`` × the serially balanced plan's worst
   serial pair cost, an upper bound on that plan's post-overlap bottleneck (the slack covers
   measured costs above the analytic model). Window members are marked ``in_window = true``.

Pairs: for every device and every (forward stage, backward stage) combination that meets in
interleaved 1F1B's steady state (``pipelining.order.meeting_stages``), one pair per (forward
candidate, backward candidate). A stage meeting itself only needs the diagonal (a plan
picks one candidate per stage). A pair stands for its layers: pairs whose forward and
backward candidates hold the same layers as an earlier pair's are not emitted again (the
first occurrence's device and candidates are kept; ``PlanView.pair_for`` finds it for any
candidates holding those layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from passes.manager import ModulePass, PassError, option
from passes.partitioning.ranges import Range, all_candidates, reachable, window_candidates
from passes.partitioning.stages import check_decoder_order, serially_balanced
from passes.plan_view import PlanView
from passes.scheduling.pair_dag import build_pair_dag
from tessera_ir.kinds import Phase, Resource
from tessera_ir.model import Module, PlanOp, SymbolRef


@dataclass(frozen=True)
class CandidatesPass(ModulePass):
    name = "candidates"
    summary = "Emit contiguous layer-range candidates per virtual stage and the forward/backward pairs that meet."
    produces = ("candidate", "pair")

    window: int = option(2, "layers each stage boundary may move either way from the serially balanced partition")
    search: Literal["window", "global"] = option("window", "global: every range any stage could hold, pruned by a bound")
    global_slack: float = option(1.15, "search=global keeps ranges whose pair bound is within this factor of the balanced plan's")
    embed_weight: float = option(1.0, "scale of the embedding's serial cost when balancing (0: ignore it)")
    head_weight: float = option(1.0, "scale of the LM head's and loss's serial cost when balancing")

    def check(self) -> None:
        if self.window < 0:
            raise PassError(f"candidates: window must be >= 0, got {self.window}")
        if self.global_slack <= 0:
            raise PassError(f"candidates: global-slack must be positive, got {self.global_slack}")

    def apply(self, module: Module) -> bool:
        if module.plan_ops("candidate") or module.plan_ops("pair"):
            raise PassError("candidates: the module already holds candidate or pair ops; run the pass once")
        check_decoder_order(module)
        view = PlanView(module)
        parallel = view.parallel
        n = len(module.decoder_layers())
        stages = parallel.virtual_stages
        balanced = serially_balanced(module, view.duration, stages, self.embed_weight, self.head_weight)
        windowed = window_candidates([r[0] for r in balanced], n, self.window)
        meets = view.meeting_stages()
        pair_bound = float("inf")
        if self.search == "global":
            cands, pair_bound = self._global_candidates(view, balanced, meets)
            for s in range(stages):  # the window always stays searchable
                cands[s] = sorted(set(cands[s]) | set(windowed[s]))
        else:
            cands = windowed
        in_window = [set(w) for w in windowed]

        names: dict[tuple[int, Range], str] = {}
        chunks: dict[tuple[int, Range], tuple[str, ...]] = {}
        for s in range(stages):
            for k, rng in enumerate(cands[s]):
                name = f"cand.s{s}.c{k}"
                names[(s, rng)] = name
                layers = view.stage_layers(s, rng)
                chunks[(s, rng)] = tuple(layer.name for layer in layers)
                module.plan.append(
                    PlanOp(
                        "candidate",
                        name,
                        {
                            "stage": s,
                            "first": rng[0],
                            "last": rng[1],
                            "layers": [SymbolRef(layer.name) for layer in layers],
                            "in_window": rng in in_window[s],
                        },
                    )
                )
        # Global search: a pair's compute total (both sides) bounds its cost from below; pairs whose
        # compute alone exceeds the bound cannot beat the balanced plan. Window pairs always stay.
        compute_cache: dict[tuple[int, Range, str], float] = {}

        def side_compute(stage: int, rng: Range, side: str) -> float:
            key = (stage, rng, side)
            if key not in compute_cache:
                phases = {Phase.FWD} if side == "fwd" else {Phase.DGRAD, Phase.WGRAD}
                compute_cache[key] = sum(
                    view.duration(t)
                    for layer in view.stage_layers(stage, rng)
                    for t in layer.tasks
                    if t.phase in phases and t.resource is Resource.COMPUTE
                )
            return compute_cache[key]

        seen: set[tuple[tuple[str, ...], tuple[str, ...]]] = set()
        count = 0
        for device in range(parallel.pp):
            for sf, sb in meets[device]:
                combos = (
                    [(a, a) for a in cands[sf]]
                    if sf == sb
                    else [(a, b) for a in cands[sf] for b in cands[sb]]
                )
                for a, b in combos:
                    if (
                        pair_bound < float("inf")
                        and not (a in in_window[sf] and b in in_window[sb])
                        and side_compute(sf, a, "fwd") + side_compute(sb, b, "bwd") > pair_bound
                    ):
                        continue
                    key = (chunks[(sf, a)], chunks[(sb, b)])
                    if key in seen:
                        continue
                    seen.add(key)
                    module.plan.append(
                        PlanOp(
                            "pair",
                            f"pair.{count}",
                            {
                                "fwd_candidate": SymbolRef(names[(sf, a)]),
                                "bwd_candidate": SymbolRef(names[(sb, b)]),
                                "device": device,
                            },
                        )
                    )
                    count += 1
        return True

    def _global_candidates(
        self, view: PlanView, balanced: list[Range], meets: dict[int, list[tuple[int, int]]]
    ) -> tuple[list[list[Range]], float]:
        stages = view.parallel.virtual_stages
        n = len(view.module.decoder_layers())

        def serial_pair(sf: int, a: Range, sb: int, b: Range) -> float:
            return build_pair_dag(view.stage_layers(sf, a), view.stage_layers(sb, b), view.duration).serial_time()

        bound = self.global_slack * max(
            serial_pair(sf, balanced[sf], sb, balanced[sb]) for pairs in meets.values() for sf, sb in pairs
        )
        # A range's cost depends on the stage only through the embedding (first) and head (last).
        self_bound: dict[tuple[bool, bool, Range], float] = {}
        out: list[list[Range]] = []
        for s, ranges in enumerate(all_candidates(n, stages)):
            keep = []
            for rng in ranges:
                key = (s == 0, s == stages - 1, rng)
                if key not in self_bound:
                    layers = view.stage_layers(s, rng)
                    self_bound[key] = build_pair_dag(layers, layers, view.duration).lower_bound()
                if self_bound[key] <= bound:
                    keep.append(rng)
            out.append(keep)
        return reachable(out, n), bound
