"""The discrete-event simulator: textbook bubbles, conservation, transfers, reductions, deadlocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from passes.pipelining.order import rank_order
from passes.simulation.engine import LANES, DboSettings, simulate
from passes.simulation.program import COMPUTE, FWD, Action, Program, SimTask, SimulationInput, SimulationInputError
from runtime.dbo import DboPolicy, MovableTask, SlotDecision, load_imbalance

from sim_builders import moe_input, moe_program, textbook_input


@pytest.mark.parametrize("pp,m", [(2, 4), (4, 8), (4, 16), (8, 32), (8, 64), (16, 64)])
def test_1f1b_bubble_matches_textbook(pp: int, m: int) -> None:
    result = simulate(textbook_input(pp, 1, m))
    ideal = m * 3.0
    bubble = (result.iteration_us - ideal) / result.iteration_us
    assert bubble == pytest.approx((pp - 1) / (m + pp - 1), rel=0.01)


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 2, 8), (4, 2, 16), (4, 4, 16), (8, 2, 32), (8, 4, 64), (16, 2, 64)])
def test_interleaved_bubble_matches_textbook(pp: int, vpp: int, m: int) -> None:
    result = simulate(textbook_input(pp, vpp, m))
    ideal = m * 3.0
    assert (result.iteration_us - ideal) / ideal == pytest.approx((pp - 1) / (vpp * m), rel=0.01)


def test_bubble_is_idle_time_of_the_compute_lanes() -> None:
    result = simulate(textbook_input(4, 2, 8))
    idle = sum(r.lanes["compute"].idle_us for r in result.ranks)
    # Each rank runs 2 chunks × 8 micro-batches × (0.5 + 1.0) of work.
    assert idle == pytest.approx(4 * result.iteration_us - 4 * 24.0)
    # With no transfers or reductions every idle moment is a pipeline wait between actions.
    for r in result.ranks:
        assert r.pipeline_wait_us == pytest.approx(r.compute_idle_us)
        assert r.in_action_idle_us == pytest.approx(0.0, abs=1e-9)


def _imbalance(layers: int, microbatches: int, seed: int, spread: float) -> np.ndarray:
    return 1.0 + np.random.default_rng(seed).exponential(spread, size=(layers, microbatches))


@pytest.mark.parametrize("dbo", [None, DboSettings(10**9), DboSettings(3000)])
@pytest.mark.parametrize("pp,vpp,m", [(1, 1, 4), (2, 1, 4), (4, 2, 8), (3, 2, 6)])
def test_busy_plus_idle_is_iteration_time_on_every_rank_and_lane(pp: int, vpp: int, m: int, dbo: DboSettings | None) -> None:
    inp = moe_input(pp, vpp, m)
    result = simulate(inp, _imbalance(inp.decoder_layers, m, pp * 10 + vpp, 0.3), dbo=dbo)
    assert result.iteration_us > 0
    for rank in result.ranks:
        assert set(rank.lanes) == set(LANES)
        for name, lane in rank.lanes.items():
            assert lane.busy_us >= 0 and lane.idle_us >= 0
            assert lane.busy_us + lane.idle_us == pytest.approx(result.iteration_us, rel=1e-9), (rank.rank, name)
        assert 0 <= rank.pipeline_wait_us <= rank.compute_idle_us + 1e-6
    for kind, stats in result.comm.items():
        assert 0 <= stats.exposed_us <= stats.total_us + 1e-6, kind


def test_balanced_routing_equals_no_routing_and_skew_only_slows() -> None:
    inp = moe_input(4, 2, 8)
    base = simulate(inp)
    ones = simulate(inp, np.ones((inp.decoder_layers, 8)))
    skewed = simulate(inp, _imbalance(inp.decoder_layers, 8, 1, 0.5))
    assert ones.iteration_us == pytest.approx(base.iteration_us)
    assert skewed.iteration_us > base.iteration_us
    assert skewed.comm["dispatch"].total_us > base.comm["dispatch"].total_us


def test_lone_action_takes_its_program_makespan() -> None:
    fwd = moe_program("f", [0, 1], [])
    empty_bwd = Program("b", (SimTask("b", COMPUTE, 0.0, side=1),))
    result = simulate(SimulationInput(1, 1, 1, ((Action(fwd, fwd=(0, 0)), Action(empty_bwd, bwd=(0, 0))),), 2))
    # Per layer mixer 30, dispatch 25, expert GEMM 20, combine 25 depend on each other; the next mixer waits for combine.
    assert result.iteration_us == pytest.approx(2 * (30 + 25 + 20 + 25))
    assert result.ranks[0].action_us == pytest.approx(result.iteration_us)
    assert result.comm["dispatch"].exposed_fraction == pytest.approx(1.0)


def test_p2p_latency_and_bandwidth_delay_the_next_stage() -> None:
    fwd = Program("F", (SimTask("f", COMPUTE, 10.0, side=FWD),))
    bwd = Program("B", (SimTask("b", COMPUTE, 20.0, side=1),))
    ranks = tuple(
        tuple(Action(fwd, fwd=(r, a.microbatch)) if a.direction == "fwd" else Action(bwd, bwd=(r, a.microbatch)) for a in rank_order(2, 1, 1, r))
        for r in range(2)
    )
    plain = simulate(SimulationInput(2, 1, 1, ranks, 1))
    slow = simulate(SimulationInput(2, 1, 1, ranks, 1, p2p_latency_us=3.0, p2p_bytes_per_us=100.0, activation_bytes=500))
    # Two transfers (activation forward, gradient back), each 3 µs latency + 5 µs on the wire.
    assert plain.iteration_us == pytest.approx(60.0)
    assert slow.iteration_us == pytest.approx(60.0 + 2 * 8.0)
    assert slow.comm["p2p"].total_us == pytest.approx(16.0)
    assert slow.comm["p2p"].exposed_fraction == pytest.approx(1.0)


def test_gradient_reduction_overlaps_other_chunks_and_is_exposed_at_the_end() -> None:
    inp = moe_input(2, 2, 4, grad_reduce_us=0.0)
    base = simulate(inp)
    big = moe_input(2, 2, 4, grad_reduce_us=400.0)
    reduced = simulate(big)
    stats = reduced.comm["grad_reduce"]
    assert stats.total_us == pytest.approx(2 * 2 * 400.0)
    # Chunk 1's reduction runs beside chunk 0's last backwards; the last one is exposed.
    assert 400.0 <= stats.exposed_us / 2 < 800.0
    assert reduced.iteration_us > base.iteration_us


def test_deadlocking_programs_are_refused() -> None:
    fwd = Program("F", (SimTask("f", COMPUTE, 1.0, side=FWD),))
    bwd = Program("B", (SimTask("b", COMPUTE, 1.0, side=1),))
    # Rank 0 runs its backward before its forward: no one can feed it.
    ranks = ((Action(bwd, bwd=(0, 0)), Action(fwd, fwd=(0, 0))), (Action(fwd, fwd=(1, 0)), Action(bwd, bwd=(1, 0))))
    with pytest.raises(SimulationInputError, match="deadlock: rank 0 waits at step 0"):
        simulate(SimulationInput(2, 1, 1, ranks, 1))


def test_inputs_that_skip_or_repeat_work_are_refused() -> None:
    fwd = Program("F", (SimTask("f", COMPUTE, 1.0, side=FWD),))
    bwd = Program("B", (SimTask("b", COMPUTE, 1.0, side=1),))
    with pytest.raises(SimulationInputError, match="every stage's forward and backward once"):
        SimulationInput(1, 1, 2, ((Action(fwd, fwd=(0, 0)), Action(bwd, bwd=(0, 0))),), 1)
    with pytest.raises(SimulationInputError, match="runs twice"):
        SimulationInput(1, 1, 1, ((Action(fwd, fwd=(0, 0)), Action(fwd, fwd=(0, 0)), Action(bwd, bwd=(0, 0))),), 1)
    with pytest.raises(SimulationInputError, match="listed at or after"):
        Program("bad", (SimTask("a", COMPUTE, 1.0, deps=(0,)),))


def test_dbo_runs_every_deferred_task_once_and_never_exceeds_its_budget() -> None:
    inp = moe_input(4, 2, 8)
    budget = 5000
    result = simulate(inp, _imbalance(inp.decoder_layers, 8, 7, 0.4), dbo=DboSettings(budget), record=True)
    wgrads = sum(1 for acts in inp.ranks for a in acts for t in a.program.tasks if t.deferrable)
    ran = [e for e in result.events if e.category in ("wgrad", "dbo", "fallback") and ".wgrad" in e.name]
    assert len(ran) == wgrads
    counters = result.dbo
    assert counters is not None
    assert counters.offered == wgrads
    assert counters.deferred == counters.placed + counters.fallbacks
    assert counters.peak_pool_bytes <= budget
    for rank in result.ranks:
        assert rank.dbo is not None and rank.dbo.peak_pool_bytes <= budget


def test_mfu_and_tokens_per_second() -> None:
    inp = moe_input(2, 1, 4)
    result = simulate(inp)
    seconds = result.iteration_us * 1e-6
    assert result.tokens_per_s == pytest.approx(inp.tokens_per_iteration / seconds)
    assert result.mfu == pytest.approx(inp.flops_per_iteration / (2 * inp.peak_flops_per_rank * seconds))


class _RecordingPolicy(DboPolicy):
    """The DBO policy, noting the step at which every deferred task leaves the pool."""

    def __init__(self, budget: int) -> None:
        super().__init__(budget)
        self.ran: list[tuple[MovableTask, int]] = []

    def fill(self, step: int, predicted_us: float) -> SlotDecision:
        decision = super().fill(step, predicted_us)
        self.ran += [(t, step) for t in decision.tasks]
        return decision

    def due(self, step: int) -> list[MovableTask]:
        out = super().due(step)
        self.ran += [(t, step) for t in out]
        return out


EXPERTS, EP, LAYERS, MICROBATCHES = 8, 4, 8, 4


@settings(max_examples=25, deadline=None)
@given(
    counts=st.lists(st.integers(0, 300), min_size=LAYERS * MICROBATCHES * EXPERTS, max_size=LAYERS * MICROBATCHES * EXPERTS),
    budget=st.sampled_from([0, 2500, 6000, 10**9]),
)
def test_dbo_over_generated_token_counts(counts: list[int], budget: int) -> None:
    """Every deferred task runs once, by its deadline step; no pool exceeds its budget; no rank idles."""
    inp = moe_input(2, 2, MICROBATCHES, layers_per_chunk=2)
    imbalance = [
        [load_imbalance(counts[(layer * MICROBATCHES + mb) * EXPERTS : (layer * MICROBATCHES + mb + 1) * EXPERTS], EP)
         for mb in range(MICROBATCHES)]
        for layer in range(LAYERS)
    ]
    policies: dict[int, _RecordingPolicy] = {}

    def factory(rank: int) -> DboPolicy:
        policies[rank] = _RecordingPolicy(budget)
        return policies[rank]

    result = simulate(inp, imbalance, dbo=DboSettings(budget), record=True, policy_factory=factory)
    deferrable = sum(1 for actions in inp.ranks for a in actions for t in a.program.tasks if t.deferrable)
    ran = [e for e in result.events if ".wgrad" in e.name]
    assert len(ran) == deferrable  # each instance once: in place, in a slot or as a fallback
    for rank, policy in policies.items():
        c = policy.counters
        assert c.peak_pool_bytes <= budget
        assert c.deferred == len(policy.ran) == c.placed + c.fallbacks
        assert len({t.task_id for t, _ in policy.ran}) == len(policy.ran)
        assert all(step <= t.deadline_step for t, step in policy.ran), rank
    for stats in result.ranks:
        for lane in stats.lanes.values():
            assert lane.busy_us + lane.idle_us == pytest.approx(result.iteration_us, rel=1e-9)
