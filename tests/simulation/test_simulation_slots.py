"""Slots and the deferrable pool read off a program's static timeline."""

from __future__ import annotations

import pytest

from passes.simulation.program import BWD, COMM, COMPUTE, FWD, Program, SimTask
from passes.simulation.slots import annotate, critical_movable, find_slots, static_timeline

from sim_builders import moe_program


def test_static_timeline_follows_streams_and_dependencies() -> None:
    tasks = (
        SimTask("a", COMPUTE, 10.0),
        SimTask("d", COMM, 5.0, (0,)),
        SimTask("b", COMPUTE, 3.0),
        SimTask("e", COMPUTE, 4.0, (1,)),
    )
    t = static_timeline(tasks)
    assert t.start == (0.0, 10.0, 10.0, 15.0)
    assert t.makespan == 19.0


def test_slots_sit_before_compute_that_waits_for_an_all_to_all() -> None:
    prog = moe_program("p", [0], [])  # mixer 30 -> dispatch 25 -> expert 20 -> combine 25
    slots = find_slots("p", prog.tasks)
    assert [prog.tasks[s.task].name for s in slots] == ["l0.expert_gemm.fwd"]
    slot = slots[0]
    assert slot.base_us == pytest.approx(25.0)  # the dispatch, fully exposed
    assert slot.a2a_us == pytest.approx(23.0)  # its routed part (latency 2 is fixed)
    assert slot.gemm_us == 0.0
    assert prog.routed_layers[slot.routed] == (FWD, 0)


def test_gemm_work_behind_an_all_to_all_counts_in_the_slot() -> None:
    prog = moe_program("b", [], [0, 1])
    slots = {prog.tasks[s.task].name: s for s in find_slots("b", prog.tasks)}
    # Layer 0's backward combine waits for layer 1's mixer dgrad, which waited for layer 1's dispatch,
    # which carries layer 1's expert dgrad output.
    assert slots["l1.mixer.dgrad"].gemm_us == pytest.approx(39.0)
    assert prog.routed_layers[slots["l1.mixer.dgrad"].routed] == (BWD, 1)


def test_only_weight_gradients_on_the_critical_path_are_deferrable() -> None:
    tasks = (
        SimTask("g", COMPUTE, 10.0, side=BWD),
        SimTask("a2a", COMM, 30.0, (0,), side=BWD),
        SimTask("w_gap", COMPUTE, 10.0, (0,), kind="wgrad", side=BWD),
        SimTask("h", COMPUTE, 10.0, (1,), side=BWD),
        SimTask("w_tail", COMPUTE, 10.0, (3,), kind="wgrad", side=BWD),
    )
    assert critical_movable(tasks, {2, 4}) == {4}
    annotated = annotate(Program("x", tasks))
    assert [t.name for t in annotated.tasks if t.deferrable] == ["w_tail"]
    # h waits for the All-to-All: 20 µs after the gap-filling weight gradient ends; routing does not scale it.
    [slot] = annotated.slots
    assert (annotated.tasks[slot.task].name, slot.base_us, slot.a2a_us, slot.routed) == ("h", 20.0, 0.0, -1)


def test_in_a_compute_bound_step_weight_gradients_are_deferred_until_the_all_to_all_binds() -> None:
    tasks = (
        SimTask("g", COMPUTE, 10.0, side=BWD),
        SimTask("a2a", COMM, 25.0, (0,), side=BWD),
        SimTask("w1", COMPUTE, 10.0, (0,), kind="wgrad", side=BWD),
        SimTask("w2", COMPUTE, 10.0, (0,), kind="wgrad", side=BWD),
        SimTask("w3", COMPUTE, 10.0, (0,), kind="wgrad", side=BWD),
        SimTask("h", COMPUTE, 5.0, (1,), side=BWD),
    )
    # Compute runs to 45 µs; the All-to-All ends at 35 and h needs it: without w3 the step takes 40,
    # without w2 too it takes 40 still (h waits for the All-to-All), so only w3 goes.
    assert static_timeline(tasks).makespan == 45.0
    assert critical_movable(tasks, {2, 3, 4}) == {4}
