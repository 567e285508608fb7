"""The simulator runs the steps the ``pipeline`` pass lowers: on uniform costs, the closed forms.

Every rank's actions come from ``build.step_actions`` over ``order.rank_steps`` (what the builder
does for a planned module), each step running a uniform program: a chunk's forward ``f``, its
backward ``b``, a combined pair either in series (``f + b``) or overlapped (``max(f, b)``: the
forward on the compute stream, the backward on the other). The iteration must take the closed
form of each order; with point-to-point latency, what an independent step-by-step replay of the
same steps gives.
"""

from __future__ import annotations

import itertools

import pytest

from passes.manager import PassManager, parse_pipeline
from passes.pipelining import order as order_module
from passes.pipelining.order import DependentPairError, RankStep, rank_steps, warmup_forwards
from passes.plan_view import PlanView
from passes.simulation.build import BuildError, SimulationBuilder, step_actions
from passes.simulation.engine import simulate
from passes.simulation.program import BWD, COMM, COMPUTE, FWD, Program, SimTask, SimulationInput

from planned_modules import planned

F_US, B_US = 1.0, 2.0
CASES = [(pp, vpp, pp * k) for pp, vpp, k in itertools.product(range(2, 9), (1, 2, 4), (1, 2, 3))]


def uniform_input(pp: int, vpp: int, m: int, combined: bool, overlap: bool, latency_us: float = 0.0) -> SimulationInput:
    fc, bc = F_US / vpp, B_US / vpp
    fwd = Program("F", (SimTask("f", COMPUTE, fc, side=FWD),))
    bwd = Program("B", (SimTask("b", COMPUTE, bc, side=BWD),))
    pair = Program("FB", (SimTask("f", COMPUTE, fc, side=FWD), SimTask("b", COMM if overlap else COMPUTE, bc, side=BWD)))

    def program(f: int | None, b: int | None) -> Program:
        return pair if f is not None and b is not None else fwd if f is not None else bwd

    ranks = step_actions([rank_steps(pp, vpp, m, r, combined) for r in range(pp)], program)
    return SimulationInput(pp, vpp, m, ranks, decoder_layers=1, p2p_latency_us=latency_us)


def closed_form(pp: int, vpp: int, m: int, combined: bool, overlap: bool) -> float:
    fc, bc = F_US / vpp, B_US / vpp
    if not combined:  # 1F1B and interleaved 1F1B: (m·vpp + pp − 1) chunk steps of f + b
        return (m * vpp + pp - 1) * (fc + bc)
    # Combined: the last rank never waits once its first forward has come (order.py's docstring).
    pair = max(fc, bc) if overlap else fc + bc
    warm = warmup_forwards(pp, vpp, m, pp - 1, combined=True)
    assert warm == (vpp - 1) * pp + 1
    return (pp - 1) * (fc + bc) + warm * (fc + bc) + (m * vpp - warm) * pair


def replay(steps: list[list[RankStep]], pp: int, vpp: int, latency_us: float, overlap: bool) -> float:
    """An independent replay: a step starts when its rank's previous step has ended and its inputs
    have arrived (a side's output leaves when that side is done, ``latency_us`` later it is there)."""
    fc, bc = F_US / vpp, B_US / vpp
    last = pp * vpp - 1
    done: dict[tuple[str, int, int], float] = {}
    position = [0] * pp
    clock = [0.0] * pp
    while any(position[r] < len(steps[r]) for r in range(pp)):
        moved = False
        for r in range(pp):
            while position[r] < len(steps[r]):
                st = steps[r][position[r]]
                needs = []
                if st.fwd is not None and st.fwd[0] > 0:
                    needs.append((("fwd", st.fwd[0] - 1, st.fwd[1]), latency_us))
                if st.bwd is not None:
                    s, mb = st.bwd
                    needs.append((("fwd", s, mb), 0.0) if s == last else (("bwd", s + 1, mb), latency_us))
                if any(key not in done for key, _ in needs):
                    break
                start = max([clock[r]] + [done[key] + lag for key, lag in needs])
                f_end = start + fc if st.fwd is not None else start
                if st.bwd is not None:
                    b_end = (start if overlap and st.fwd is not None else f_end) + bc
                    done[("bwd", *st.bwd)] = b_end
                if st.fwd is not None:
                    done[("fwd", *st.fwd)] = f_end
                clock[r] = max(f_end, b_end if st.bwd is not None else f_end)
                position[r] += 1
                moved = True
        assert moved, "the steps deadlock"
    return max(clock)


@pytest.mark.parametrize(("pp", "vpp", "m"), CASES)
def test_plain_and_interleaved_1f1b_take_the_closed_form(pp: int, vpp: int, m: int) -> None:
    got = simulate(uniform_input(pp, vpp, m, combined=False, overlap=False)).iteration_us
    assert got == pytest.approx(closed_form(pp, vpp, m, False, False), rel=1e-12)


@pytest.mark.parametrize("overlap", [False, True], ids=["serial-pairs", "overlapped-pairs"])
@pytest.mark.parametrize(("pp", "vpp", "m"), CASES)
def test_combined_1f1b_takes_the_closed_form_at_every_vpp(pp: int, vpp: int, m: int, overlap: bool) -> None:
    got = simulate(uniform_input(pp, vpp, m, combined=True, overlap=overlap)).iteration_us
    assert got == pytest.approx(closed_form(pp, vpp, m, True, overlap), rel=1e-12)


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize(("pp", "vpp", "m"), [c for c in CASES if c[0] in (2, 3, 4, 8)])
def test_with_p2p_latency_the_engine_matches_an_independent_replay(pp: int, vpp: int, m: int, combined: bool) -> None:
    latency = 0.3
    steps = [rank_steps(pp, vpp, m, r, combined) for r in range(pp)]
    got = simulate(uniform_input(pp, vpp, m, combined, overlap=combined, latency_us=latency)).iteration_us
    assert got == pytest.approx(replay(steps, pp, vpp, latency, overlap=combined), rel=1e-12)
    assert got > closed_form(pp, vpp, m, combined, overlap=combined)  # latency is never free


def test_the_warmup_that_differs_by_one_makes_the_last_two_ranks_take_turns(monkeypatch: pytest.MonkeyPatch) -> None:
    # The warm-up combined 1F1B at vpp = 1 had before, (pp - r - 1) + 1: neighbours' pairs wait for
    # each other in turn, and the same overlapped pairs take far longer than the closed form.
    fixed = simulate(uniform_input(4, 1, 16, combined=True, overlap=True)).iteration_us
    real = order_module.warmup_forwards

    def one_apart(pp: int, vpp: int, microbatches: int, rank: int, combined: bool = False, group: int | None = None) -> int:
        return real(pp, vpp, microbatches, rank, False, group) + 1 if combined and vpp == 1 else real(pp, vpp, microbatches, rank, combined, group)

    monkeypatch.setattr(order_module, "warmup_forwards", one_apart)
    taking_turns = simulate(uniform_input(4, 1, 16, combined=True, overlap=True)).iteration_us
    assert fixed == pytest.approx(closed_form(4, 1, 16, True, True))
    assert taking_turns > 1.2 * fixed


@pytest.mark.parametrize(("pp", "vpp", "m"), CASES)
def test_combined_steps_never_pair_a_chunks_forward_and_backward_of_one_microbatch(pp: int, vpp: int, m: int) -> None:
    for r in range(pp):
        steps = rank_steps(pp, vpp, m, r, combined=True)
        pairs = [st for st in steps if st.fwd is not None and st.bwd is not None]
        assert pairs or m * vpp <= warmup_forwards(pp, vpp, m, r, combined=True)
        assert all(st.fwd != st.bwd for st in pairs)
        # Plain steps are single: a forward or a backward, never both.
        assert all((st.fwd is None) != (st.bwd is None) for st in rank_steps(pp, vpp, m, r, combined=False))


def test_a_dependent_pair_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(order_module, "warmup_forwards", lambda pp, vpp, m, rank, combined=False, group=None: 0)
    with pytest.raises(DependentPairError, match="the backward depends on that forward"):
        rank_steps(2, 1, 4, 1, combined=True)


def test_the_builder_simulates_the_order_the_pipeline_pass_shipped() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8)
    unlowered = SimulationBuilder(PlanView(module)).build()
    assert any(a.fwd is not None and a.bwd is not None for a in unlowered.ranks[0])  # ep > 1: combined pairs
    module.attrs["combined"] = False  # the order variant is a run-wide setting in the header
    PassManager(parse_pipeline("pipeline")).run(module)
    builder = SimulationBuilder(PlanView(module))
    inp = builder.build()
    assert builder.steps.from_programs and not builder.steps.combined
    p = builder.parallel
    for r, actions in enumerate(inp.ranks):
        assert [(a.fwd, a.bwd) for a in actions] == [(st.fwd, st.bwd) for st in rank_steps(p.pp, p.vpp, p.microbatches, r)]
        assert all((a.fwd is None) != (a.bwd is None) for a in actions)


def test_programs_that_do_not_run_the_named_order_are_refused() -> None:
    module = planned(pp=2, vpp=2, microbatches=4, ep=8)
    module.attrs["combined"] = True
    PassManager(parse_pipeline("pipeline")).run(module)
    op = next(op for op in module.plan if op.op == "pipeline")
    op.attrs["combined"] = False  # the programs were lowered in the combined order: pairs interleave
    with pytest.raises(BuildError, match="of the plain order"):
        SimulationBuilder(PlanView(module)).build()
    op.attrs["combined"] = True
    program = next(op for op in module.plan if op.op == "program")
    program.entries.reverse()  # the backwards first: no order runs that
    with pytest.raises(BuildError, match="step 0 of the combined order"):
        SimulationBuilder(PlanView(module)).build()
