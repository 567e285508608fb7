"""The simulator's C++ action loop against its Python reference: bitwise the same iterations.

``engine.simulate`` runs each action's tasks in C++ (``passes/simulation/csrc/action.cpp``),
stopping before every task the DBO policy decides on; with ``python_loop=True`` it runs them in
Python, the definition the C++ loop follows. Every figure of a simulated iteration (lanes, waits,
exposure, memory, the policy's counters) must be the same double, and the policy must be asked
the same questions in the same order."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from passes.plan_view import PlanView
from passes.simulation import _action
from passes.simulation.build import BuildOptions, SimulationBuilder
from passes.simulation.engine import DboSettings, SimulationResult, simulate
from passes.simulation.routing import RoutingSpec
from runtime.dbo import DboPolicy, MovableTask, SlotDecision

from planned_modules import planned
from sim_builders import moe_input


def figures(result: SimulationResult) -> tuple:
    """Every number a simulated iteration reports, in a fixed order (exact floats)."""
    ranks = tuple(
        (
            r.rank, r.pipeline_wait_us, r.action_us, r.end_us, r.peak_activation_bytes, r.static_bytes,
            tuple((name, lane.busy_us, lane.idle_us, lane.free_us) for name, lane in r.lanes.items()),
            dataclasses.astuple(r.dbo) if r.dbo is not None else None,
        )
        for r in result.ranks
    )
    comm = tuple((kind, c.total_us, c.exposed_us) for kind, c in result.comm.items())
    return result.iteration_us, ranks, comm, tuple(tuple(w) for w in result.recv_waits)


class _LoggingPolicy(DboPolicy):
    """The DBO policy, logging every question it is asked and its answer."""

    def __init__(self, budget: int, min_slot_us: float, log: list) -> None:
        super().__init__(budget, min_slot_us)
        self.log = log

    def offer(self, task: MovableTask, step: int) -> bool:
        taken = super().offer(task, step)
        self.log.append(("offer", task, step, taken))
        return taken

    def fill(self, step: int, predicted_us: float) -> SlotDecision:
        decision = super().fill(step, predicted_us)
        self.log.append(("fill", step, predicted_us, tuple(t.name for t in decision.tasks)))
        return decision

    def settle(self, decision: SlotDecision, observed_us: float) -> None:
        self.log.append(("settle", observed_us))
        super().settle(decision, observed_us)

    def due(self, step: int) -> list[MovableTask]:
        out = super().due(step)
        self.log.append(("due", step, tuple(t.name for t in out)))
        return out


def both(inp, imbalance, dbo: DboSettings | None) -> tuple[tuple, tuple]:  # noqa: ANN001
    """(native, reference) figures and policy logs of one iteration."""
    out = []
    for python_loop in (False, True):
        log: list = []
        factory = (lambda rank, log=log: _LoggingPolicy(dbo.budget(rank), dbo.min_slot_us, log)) if dbo else None
        out.append((figures(simulate(inp, imbalance, dbo=dbo, policy_factory=factory, python_loop=python_loop)), log))
    return out[0], out[1]


@pytest.mark.parametrize("dbo", [None, DboSettings(10**9), DboSettings(3000), DboSettings(0), DboSettings(6000, min_slot_us=20.0)])
@pytest.mark.parametrize("pp,vpp,m,layers", [(1, 1, 4, 1), (2, 1, 4, 2), (4, 2, 8, 1), (3, 2, 6, 2), (2, 2, 6, 3)])
def test_hand_made_inputs_simulate_bitwise_as_the_reference(pp: int, vpp: int, m: int, layers: int, dbo: DboSettings | None) -> None:
    inp = moe_input(pp, vpp, m, layers_per_chunk=layers)
    for seed, spread in ((0, 0.0), (pp * 7 + m, 0.4), (layers, 2.5)):
        imbalance = 1.0 + np.random.default_rng(seed).exponential(spread, size=(inp.decoder_layers, m)) if spread else None
        native, reference = both(inp, imbalance, dbo)
        assert native == reference, (seed, spread)


@pytest.mark.parametrize("pp,vpp,m", [(2, 2, 4), (4, 1, 8)])
def test_planned_modules_simulate_bitwise_as_the_reference(pp: int, vpp: int, m: int) -> None:
    view = PlanView(planned(groups=2, pp=pp, vpp=vpp, microbatches=m, dbo=True))
    static = SimulationBuilder(view, BuildOptions())
    static_inp = static.build()
    dynamic = SimulationBuilder(view, BuildOptions(dbo=True))
    dynamic_inp = dynamic.build()
    settings = dynamic.dbo_settings(dynamic_inp)
    for spec in (RoutingSpec(), RoutingSpec("zipf", seed=3, zipf_s=1.2)):
        model = static.routing(spec)
        for it in range(3):
            imbalance = model.imbalance(it)
            assert both(static_inp, imbalance, None)[0] == both(static_inp, imbalance, None)[1]
            native, reference = both(dynamic_inp, imbalance, settings)
            assert native == reference
            assert native[1], "the DBO policy was asked nothing: the test exercises no stop"


def test_a_recorded_iteration_gives_the_same_figures() -> None:
    # Recording runs the Python loop (it names every interval); the figures are the same.
    inp = moe_input(4, 2, 8)
    imbalance = 1.0 + np.random.default_rng(5).exponential(0.5, size=(inp.decoder_layers, 8))
    for dbo in (None, DboSettings(4000)):
        assert figures(simulate(inp, imbalance, dbo=dbo, record=True)) == figures(simulate(inp, imbalance, dbo=dbo))


def test_the_action_loop_refuses_what_it_cannot_run() -> None:
    def loop(**change: object) -> _action.ActionLoop:
        args: dict[str, object] = dict(stream=[0, 1], fixed=[1.0, 2.0], var=[3.0, 4.0], deps=[[], [0]], routed=[-1, 0],
                                       code=[-1, 0], side=[0, 0], deferrable=[False, False], slot=[False, False], routed_layers=1)
        args.update(change)
        return _action.ActionLoop(**args)  # type: ignore[arg-type]

    for change, message in (
        ({"fixed": [1.0]}, "one entry per task"),
        ({"stream": [0, 2]}, "a stream is 0"),
        ({"deps": [[1], []]}, "listed at or after"),
        ({"routed": [-1, 1]}, "routed index"),
        ({"code": [-1, 2]}, "kind code"),
    ):
        with pytest.raises(ValueError, match=message):
            loop(**change)
    ok = loop()
    with pytest.raises(RuntimeError, match="started action"):
        ok.advance(False, False)
    with pytest.raises(ValueError, match="one factor per routed layer"):
        ok.start(0.0, 0.0, 0.0, [])
    ok.start(0.0, 0.0, 0.0, [2.0])
    with pytest.raises(RuntimeError, match="no task is waiting"):
        ok.defer()
    assert ok.advance(False, False)[0] == -1
    got = ok.finish([], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    # Compute 0-4, then the dispatch (routed x2) 4-14 on the comm stream.
    assert got[:4] == (4.0, 14.0, 14.0, 0.0)
    assert got[10] == 10.0 and got[12] == 10.0  # dispatch total, and exposed: nothing computes beside it
    ok.start(0.0, 100.0, 0.0, [1.0])
    ok.advance(False, False)
    with pytest.raises(AssertionError, match="lane overlap"):
        ok.finish([], 200.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_a_slot_stop_sees_the_same_spec() -> None:
    # The stop before a slot task hands back the compute stream's free time the policy settles against.
    loop = _action.ActionLoop(stream=[1, 0], fixed=[0.0, 0.0], var=[10.0, 5.0], deps=[[], [0]], routed=[-1, -1],
                              code=[0, -1], side=[0, 0], deferrable=[False, False], slot=[False, True], routed_layers=0)
    loop.start(0.0, 0.0, 0.0, [])
    assert loop.advance(True, False)[0] == -1  # an empty pool: nothing to decide
    loop.finish([], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    loop.start(0.0, 0.0, 0.0, [])
    assert loop.advance(True, True) == (1, 10.0, 5.0, 0.0)
    loop.run_stopped([4.0])
    assert loop.advance(True, True)[0] == -1
    got = loop.finish([], 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    assert got[0] == 15.0  # the filled 4 µs at 0-4, the task at 10-15
    assert got[6] == 6.0  # compute idle 4-10
