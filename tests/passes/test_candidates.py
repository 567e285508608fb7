"""The candidates pass: contiguous ranges around the serially balanced partition, embed/head placement, pairs."""

from __future__ import annotations

import pytest

from passes.candidates import CandidatesPass
from passes.partitioning.ranges import balanced_partition
from passes.partitioning.stages import serially_balanced
from passes.pipelining.order import meeting_stages
from passes.plan_view import PlanView
from tessera_ir.errors import TesseraError
from tessera_ir.model import SymbolRef
from tessera_ir.parallel import ParallelConfig

from synthetic_ir import QWEN3_NEXT_PATTERN, synthetic_module


def run(kinds, pp, vpp, window=2, microbatches=None, **kwargs):
    parallel = ParallelConfig(pp=pp, vpp=vpp, ep=8, microbatches=microbatches or 4 * pp)
    m = synthetic_module(kinds, parallel=parallel, **kwargs)
    assert CandidatesPass(window=window).apply(m)
    return m


def ranges_by_stage(m):
    out = {}
    for op in m.plan_ops("candidate"):
        out.setdefault(op.attrs["stage"], []).append(op)
    return out


@pytest.mark.parametrize(
    "kinds,pp,vpp",
    [
        (QWEN3_NEXT_PATTERN * 4, 2, 2),  # 16 layers, 4 stages
        (QWEN3_NEXT_PATTERN * 3 + [("linear_attention", "moe")], 3, 1),  # 13 layers in 3 stages: uneven
        ([("mla", "dense")] * 3 + [("mla", "moe")] * 8, 2, 2),  # DeepSeek-like: dense first, odd MoE count
        ([("attention", "moe")] * 5, 5, 1),  # one layer per stage
    ],
)
def test_candidates_are_contiguous_cover_with_embed_and_head(kinds, pp, vpp):
    m = run(kinds, pp, vpp)
    n, stages = len(kinds), pp * vpp
    by_stage = ranges_by_stage(m)
    assert sorted(by_stage) == list(range(stages))
    for s, ops in by_stage.items():
        for op in ops:
            first, last = op.attrs["first"], op.attrs["last"]
            assert 0 <= first <= last < n
            names = [r.name for r in op.attrs["layers"]]
            decoder = [x for x in names if x not in ("embed", "head")]
            assert decoder == [f"l{i}" for i in range(first, last + 1)]
            assert (names[0] == "embed") == (s == 0)
            assert (names[-1] == "head") == (s == stages - 1)
            if s == 0:
                assert first == 0
            if s == stages - 1:
                assert last == n - 1
    # Every candidate continues a candidate of the previous stage (part of some cover), and every layer is covered.
    for s in range(1, stages):
        ends = {op.attrs["last"] + 1 for op in by_stage[s - 1]}
        assert all(op.attrs["first"] in ends for op in by_stage[s])
    covered = {i for ops in by_stage.values() for op in ops for i in range(op.attrs["first"], op.attrs["last"] + 1)}
    assert covered == set(range(n))


def test_window_zero_is_the_serially_balanced_partition():
    kinds = QWEN3_NEXT_PATTERN * 3 + [("linear_attention", "moe")]
    m = run(kinds, 2, 2, window=0)
    view = PlanView(m)
    balanced = serially_balanced(m, view.duration, 4)
    by_stage = ranges_by_stage(m)
    assert [[(o.attrs["first"], o.attrs["last"]) for o in by_stage[s]] for s in range(4)] == [[r] for r in balanced]
    # Serially balanced means: no other contiguous split has a lower maximum stage cost.
    costs = {layer.name: sum(view.duration(t) for t in layer.tasks) for layer in m.layers}
    per_layer = [costs[f"l{i}"] for i in range(len(kinds))]
    stage_cost = [sum(per_layer[a : b + 1]) for a, b in balanced]
    stage_cost[0] += costs["embed"]
    stage_cost[-1] += costs["head"]
    assert max(stage_cost) <= max(
        sum(per_layer[a : b + 1]) + (costs["embed"] if s == 0 else 0) + (costs["head"] if s == 3 else 0)
        for s, (a, b) in enumerate([(0, 2), (3, 6), (7, 9), (10, 12)])
    )


def test_balanced_partition_counts_embedding_and_head():
    # A heavy head pushes layers off the last stage.
    assert balanced_partition([1.0] * 8, 2, 0.0, 4.0) == [(0, 5), (6, 7)]
    assert balanced_partition([1.0] * 8, 2, 4.0, 0.0) == [(0, 1), (2, 7)]
    with pytest.raises(TesseraError, match="cannot fill"):
        balanced_partition([1.0] * 3, 4)


def test_window_grows_candidate_sets():
    kinds = QWEN3_NEXT_PATTERN * 4
    sizes = [len(run(kinds, 2, 2, window=w).plan_ops("candidate")) for w in (0, 1, 2)]
    assert sizes[0] == 4 and sizes[0] < sizes[1] < sizes[2]


def test_pairs_follow_meetings_and_are_deduplicated():
    m = run(QWEN3_NEXT_PATTERN * 4, 2, 2, window=1, microbatches=16)
    parallel = ParallelConfig.from_attrs(m.attrs)
    meets = meeting_stages(parallel.pp, parallel.vpp, parallel.microbatches, parallel.combined_1f1b)
    view = PlanView(m)
    keys = set()
    seen_combos = set()
    for pair in view.pairs:
        assert set(pair.op.attrs) == {"fwd_candidate", "bwd_candidate", "device"}, "a pair names its candidates"
        assert pair.chunks not in keys, "pairs with identical layer lists are emitted once"
        keys.add(pair.chunks)
        f, b = pair.fwd_candidate, pair.bwd_candidate
        assert f is not None and b is not None
        assert pair.fwd_layers == f.layers and pair.bwd_layers == b.layers
        combo = (f.stage, b.stage)
        assert combo in meets[pair.device]
        if combo[0] == combo[1]:
            assert f is b, "a stage meeting itself pairs a candidate only with itself"
        seen_combos.add((pair.device, combo))
    assert seen_combos == {(d, c) for d, combos in meets.items() for c in combos}
    # Every needed (forward candidate, backward candidate) combination has a pair with its layer lists.
    by_stage = ranges_by_stage(m)
    for combos in meets.values():
        for sf, sb in combos:
            for a in by_stage[sf]:
                for b in by_stage[sb] if sf != sb else [a]:
                    assert (tuple(r.name for r in a.attrs["layers"]), tuple(r.name for r in b.attrs["layers"])) in keys
                    assert view.pair_for(view.candidate(SymbolRef(a.name), "a"), view.candidate(SymbolRef(b.name), "b"))


def test_candidates_refuses_too_few_layers_and_reruns():
    parallel = ParallelConfig(pp=4, vpp=2, microbatches=8)
    m = synthetic_module(QWEN3_NEXT_PATTERN, parallel=parallel)
    with pytest.raises(TesseraError, match="cannot fill 8 virtual stages"):
        CandidatesPass().apply(m)
    m2 = run(QWEN3_NEXT_PATTERN, 2, 1)
    with pytest.raises(TesseraError, match="run the pass once"):
        CandidatesPass().apply(m2)


def test_global_candidates_include_window_and_flag_it():
    parallel = ParallelConfig(pp=2, vpp=1, ep=8, microbatches=8)
    m = synthetic_module(QWEN3_NEXT_PATTERN * 2, parallel=parallel)
    CandidatesPass(window=1, search="global", global_slack=2.0).apply(m)
    ops = m.plan_ops("candidate")
    flagged = [o for o in ops if o.attrs["in_window"]]
    assert 0 < len(flagged) < len(ops)
    assert all(isinstance(r, SymbolRef) for o in ops for r in o.attrs["layers"])


def test_head_weight_moves_the_balanced_boundary():
    kinds = [("attention", "moe")] * 12
    plain = run(kinds, 2, 1, window=0)
    parallel = ParallelConfig(pp=2, vpp=1, ep=8, microbatches=8)
    heavy = synthetic_module(kinds, parallel=parallel)
    CandidatesPass(window=0, head_weight=20.0).apply(heavy)

    def last_stage_first(m):
        return [o.attrs["first"] for o in m.plan_ops("candidate") if o.attrs["stage"] == 1][0]

    # Counting the head 20 times pushes decoder layers off the last stage.
    assert last_stage_first(heavy) > last_stage_first(plain)
