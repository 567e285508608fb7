"""The ``candidates`` pass: contiguous layer ranges per virtual stage, and the pairs that meet.

Before (layers only)::

    module @m {pp = 2, vpp = 2, ...} { layer @embed ... layer @l0 ... layer @l7 ... layer @head ... }

After (``candidates{window=1}``)::

    plan candidate @cand.s0.c0 {first = 0, in_window = true, last = 1, layers = [@embed, @l0, @l1], stage = 0}
    ...
    plan pair @pair.0 {bwd = [@l4, @l5], bwd_candidate = @cand.s2.c1, device = 0, fwd = [@embed, @l0, @l1],
                       fwd_candidate = @cand.s0.c0}

How candidates are chosen:

1. Serial cost of a layer = the sum of the isolated durations (``cost_model.task_duration_us``)
   of all its tasks, forward and backward, as if nothing overlapped. The embedding's cost
   counts on the first stage, the LM head's and loss's on the last, scaled by the options
   ``embed-weight`` and ``head-weight`` (default 1: their modelled cost as is).
2. The serially balanced partition minimises the largest serial stage cost over all
   contiguous partitions into ``pp·vpp`` non-empty stages (``partition_dp.balanced_partition``).
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
interleaved 1F1B's steady state (``partition_dp.meeting_stages``), one pair per (forward
candidate, backward candidate). A stage meeting itself only needs the diagonal (a plan
picks one candidate per stage). Pairs with identical forward and backward layer lists are
emitted once (the first occurrence's device and candidates are kept; the partition pass looks
costs up by layer lists).
"""

from __future__ import annotations

from dataclasses import dataclass

from passes.cost_model import Hardware, load_hardware, task_duration_us
from passes.manager import ModulePass, PassError
from passes.pair_dag import build_pair_dag
from passes.partition_dp import Range, all_candidates, balanced_partition, meeting_stages, reachable, window_candidates
from tessera_ir.kinds import LayerRole, Phase, Resource
from tessera_ir.model import Layer, Module, PlanOp, SymbolRef
from tessera_ir.parallel import ParallelConfig


def layer_serial_costs(module: Module, hw: Hardware, parallel: ParallelConfig) -> dict[str, float]:
    """Serial cost (µs) of every layer: its tasks' isolated durations summed, forward and backward."""
    return {layer.name: sum(task_duration_us(t, hw, parallel) for t in layer.tasks) for layer in module.layers}


def stage_layers(module: Module, stage: int, stages: int, rng: Range) -> list[Layer]:
    """The layers a stage holding decoder range ``rng`` runs: + embedding on stage 0, + head on the last."""
    decoder = module.decoder_layers()
    layers: list[Layer] = []
    if stage == 0:
        layers += [layer for layer in module.layers if layer.role is LayerRole.EMBEDDING]
    layers += decoder[rng[0] : rng[1] + 1]
    if stage == stages - 1:
        layers += [layer for layer in module.layers if layer.role is LayerRole.HEAD]
    return layers


def serially_balanced(
    module: Module, hw: Hardware, parallel: ParallelConfig, embed_weight: float = 1.0, head_weight: float = 1.0
) -> list[Range]:
    """The serially balanced partition; ``embed_weight``/``head_weight`` scale the embedding's and head's cost."""
    costs = layer_serial_costs(module, hw, parallel)
    decoder = module.decoder_layers()
    embed = embed_weight * sum(costs[layer.name] for layer in module.layers if layer.role is LayerRole.EMBEDDING)
    head = head_weight * sum(costs[layer.name] for layer in module.layers if layer.role is LayerRole.HEAD)
    return balanced_partition([costs[layer.name] for layer in decoder], parallel.virtual_stages, embed, head)


def check_decoder_order(module: Module) -> None:
    for i, layer in enumerate(module.decoder_layers()):
        if layer.index != i:
            raise PassError(
                f"decoder layer '{layer.name}' has index {layer.index} but is decoder layer number {i} in module "
                f"order; the partition passes need decoder layers numbered 0..N-1 in execution order"
            )


@dataclass(frozen=True)
class CandidatesPass(ModulePass):
    name = "candidates"
    summary = "Emit contiguous layer-range candidates per virtual stage and the forward/backward pairs that meet."

    window: int = 2
    search: str = "window"
    hardware: str = "h100"
    global_slack: float = 1.15
    embed_weight: float = 1.0  # scale of the embedding's serial cost when balancing (e.g. 0: ignore it)
    head_weight: float = 1.0  # scale of the LM head's and loss's serial cost when balancing

    def apply(self, module: Module) -> bool:
        if self.window < 0:
            raise PassError(f"candidates: window must be >= 0, got {self.window}")
        if self.search not in ("window", "global"):
            raise PassError(f"candidates: search must be 'window' or 'global', got '{self.search}'")
        if module.plan_ops("candidate") or module.plan_ops("pair"):
            raise PassError("candidates: the module already holds candidate or pair ops; run the pass once")
        check_decoder_order(module)
        parallel = ParallelConfig.from_attrs(module.attrs)
        hw = load_hardware(self.hardware)
        n = len(module.decoder_layers())
        stages = parallel.virtual_stages
        balanced = serially_balanced(module, hw, parallel, self.embed_weight, self.head_weight)
        windowed = window_candidates([r[0] for r in balanced], n, self.window)
        meets = meeting_stages(parallel.pp, parallel.vpp, parallel.microbatches)
        pair_bound = float("inf")
        if self.search == "global":
            cands, pair_bound = self._global_candidates(module, hw, parallel, balanced, meets)
            for s in range(stages):  # the window always stays searchable
                cands[s] = sorted(set(cands[s]) | set(windowed[s]))
        else:
            cands = windowed
        in_window = [set(w) for w in windowed]

        names: dict[tuple[int, Range], str] = {}
        layer_lists: dict[tuple[int, Range], list[SymbolRef]] = {}
        for s in range(stages):
            for k, rng in enumerate(cands[s]):
                name = f"cand.s{s}.c{k}"
                names[(s, rng)] = name
                refs = [SymbolRef(layer.name) for layer in stage_layers(module, s, stages, rng)]
                layer_lists[(s, rng)] = refs
                module.plan.append(
                    PlanOp(
                        "candidate",
                        name,
                        {
                            "stage": s,
                            "first": rng[0],
                            "last": rng[1],
                            "layers": list(refs),
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
                    task_duration_us(t, hw, parallel)
                    for layer in stage_layers(module, stage, stages, rng)
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
                    fwd, bwd = layer_lists[(sf, a)], layer_lists[(sb, b)]
                    key = (tuple(r.name for r in fwd), tuple(r.name for r in bwd))
                    if key in seen:
                        continue
                    seen.add(key)
                    module.plan.append(
                        PlanOp(
                            "pair",
                            f"pair.{count}",
                            {
                                "fwd": list(fwd),
                                "bwd": list(bwd),
                                "fwd_candidate": SymbolRef(names[(sf, a)]),
                                "bwd_candidate": SymbolRef(names[(sb, b)]),
                                "device": device,
                            },
                        )
                    )
                    count += 1
        return True

    def _global_candidates(
        self,
        module: Module,
        hw: Hardware,
        parallel: ParallelConfig,
        balanced: list[Range],
        meets: dict[int, list[tuple[int, int]]],
    ) -> tuple[list[list[Range]], float]:
        stages = parallel.virtual_stages
        n = len(module.decoder_layers())

        def duration(t):  # noqa: ANN001, ANN202 (a Task)
            return task_duration_us(t, hw, parallel)

        def serial_pair(sf: int, a: Range, sb: int, b: Range) -> float:
            return build_pair_dag(stage_layers(module, sf, stages, a), stage_layers(module, sb, stages, b), duration).serial_time()

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
                    layers = stage_layers(module, s, stages, rng)
                    self_bound[key] = build_pair_dag(layers, layers, duration).lower_bound()
                if self_bound[key] <= bound:
                    keep.append(rng)
            out.append(keep)
        return reachable(out, n), bound
