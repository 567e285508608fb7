"""The DBO's deadline-aware admission in the simulator.

The simulated plan is a small planned MoE module (``planned_modules``), its slots and pool found
as the ``dbo-slots`` pass finds them. Token traces are generated: per MoE layer and micro-batch,
the tokens each expert receives, from which the load imbalance follows as the runtime computes
it before dispatch.

What holds: the admission, not the memory budget, bounds the pool, so a budget past what it
lets the pool hold changes nothing. What does not hold strictly: that every larger budget is at
least as fast — on this module, balanced routing, a pool of two tasks' memory is 47 µs slower
than one task's (of 96 ms; docs/records/2026-12-05-dbo.md), because deferrals the static
forecast admits can still fall back where the run's own waits differ from the forecast.
"""

from __future__ import annotations

import functools
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from passes.plan_view import PlanView
from passes.simulation.build import BuildOptions, SimulationBuilder
from passes.simulation.engine import DboSettings, simulate, slot_forecast
from passes.simulation.program import Program, SimulationInput
from runtime.dbo import load_imbalance

from planned_modules import planned

EP, EXPERTS = 8, 16
UNBOUNDED = 2**62


def _with_memory(inp: SimulationInput) -> SimulationInput:
    """``inp`` with every deferrable task keeping 1 kB per microsecond alive (the synthetic module
    records no activation sizes, and a budget must bind for the property to say anything)."""
    programs: dict[int, Program] = {}

    def sized(program: Program) -> Program:
        if id(program) not in programs:
            tasks = tuple(replace(t, memory_bytes=int(1000 * t.duration_us)) if t.deferrable else t for t in program.tasks)
            programs[id(program)] = replace(program, tasks=tasks)
        return programs[id(program)]

    return replace(inp, ranks=tuple(tuple(replace(a, program=sized(a.program)) for a in actions) for actions in inp.ranks))


@functools.cache
def _inputs() -> tuple[SimulationInput, SimulationInput, int]:
    """(static input, DBO input, the largest memory a single deferrable task keeps alive)."""
    view = PlanView(planned())
    static = SimulationBuilder(view).build()
    dbo = _with_memory(SimulationBuilder(view, BuildOptions(dbo=True)).build())
    largest = max(t.memory_bytes for actions in dbo.ranks for a in actions for t in a.program.tasks if t.deferrable)
    return static, dbo, largest


def _imbalance(inp: SimulationInput, tokens: list[list[int]]) -> list[list[float]]:
    rows = []
    for layer in range(inp.decoder_layers):
        rows.append([load_imbalance(tokens[(layer * inp.microbatches + mb) % len(tokens)], EP) for mb in range(inp.microbatches)])
    return rows


traces = st.lists(st.lists(st.integers(0, 400), min_size=EXPERTS, max_size=EXPERTS), min_size=1, max_size=12)


@settings(max_examples=15, deadline=None)
@given(tokens=traces, spare=st.integers(0, 4))
def test_budget_past_what_admission_lets_the_pool_hold_changes_nothing(tokens: list[list[int]], spare: int) -> None:
    """Admission, not memory, bounds the pool: any budget at or above the unbounded run's peak pool
    gives the unbounded run's iteration, whatever the routing (without admission the pool takes
    every task and only the budget stops it)."""
    _, dbo, largest = _inputs()
    imbalance = _imbalance(dbo, tokens)
    unbounded = simulate(dbo, imbalance, dbo=DboSettings(UNBOUNDED))
    assert unbounded.dbo is not None
    peak = max(r.dbo.peak_pool_bytes for r in unbounded.ranks if r.dbo is not None)
    total = sum(t.memory_bytes for actions in dbo.ranks for a in actions for t in a.program.tasks if t.deferrable)
    assert peak < total  # admission refused part of the pool
    bounded = simulate(dbo, imbalance, dbo=DboSettings(peak + spare * largest))
    assert bounded.iteration_us == unbounded.iteration_us
    # The same tasks run in place; one the admission would refuse may meet the budget first.
    assert bounded.dbo is not None
    assert bounded.dbo.refused_memory + bounded.dbo.refused_deadline == unbounded.dbo.refused_deadline
    assert (bounded.dbo.placed, bounded.dbo.fallbacks) == (unbounded.dbo.placed, unbounded.dbo.fallbacks)


def test_admission_refuses_work_no_slot_takes_and_the_pool_by_memory_alone_falls_back_more() -> None:
    _, dbo, _ = _inputs()
    admitted = simulate(dbo, dbo=DboSettings(UNBOUNDED))
    by_memory = simulate(dbo, dbo=DboSettings(UNBOUNDED, admission=False))
    assert admitted.dbo is not None and by_memory.dbo is not None
    assert admitted.dbo.refused_deadline > 0 and by_memory.dbo.refused_deadline == 0
    assert by_memory.dbo.fallbacks > admitted.dbo.fallbacks
    assert admitted.dbo.offered == by_memory.dbo.offered


def test_the_forecast_holds_every_slot_the_wait_before_each_step_and_the_tail() -> None:
    _, dbo, _ = _inputs()
    for rank, actions in enumerate(dbo.ranks):
        forecast = slot_forecast(dbo, rank)
        annotated = sum(len(a.program.slots) for a in actions)
        assert len(forecast) == annotated + len(actions) + 1
        # The tail sits after the last step: only tasks due at the last step may count on it.
        last = len(actions) - 1
        assert forecast.capacity(last, last + 0.5) == dbo.tail_predicted_us[rank]
    assert max(dbo.tail_predicted_us) > 0  # the rank whose backward chain ends first idles to the end
