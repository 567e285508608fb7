"""join_sides: the backward side's tasks keep every field but their dependencies, which move past
the forward tasks."""

from __future__ import annotations

from dataclasses import MISSING, fields

from passes.scheduling.pair_dag import BWD, FWD, PairTask, join_sides
from tessera_ir.kinds import Resource


def _task(name: str, deps: tuple[int, ...], side: str, **kw) -> PairTask:
    return PairTask(name, f"{name}.kind", Resource.COMPUTE, 3.5, deps, side, f"layer_{name}", **kw)


def test_backward_tasks_keep_every_field_and_shift_their_dependencies() -> None:
    fwd = [_task("f0", (), FWD), _task("f1", (0,), FWD)]
    bwd = [
        _task("b0", (), BWD),
        _task("b1", (0,), BWD, movable=True, deadline=42.0),
        PairTask("b2", "dispatch.dgrad", Resource.COMM, 7.25, (0, 1), BWD, "layer_b", False, None),
    ]
    # Every field with a default is set to something else in some task: a field join_sides forgot
    # would come back at its default and fail the comparison below.
    for f in fields(PairTask):
        if f.default is not MISSING:
            assert any(getattr(t, f.name) != f.default for t in bwd), f"set {f.name} in some task of this test"
    dag = join_sides(fwd, bwd, "p")
    assert dag.name == "p"
    assert dag.tasks[:2] == fwd
    for before, after in zip(bwd, dag.tasks[2:]):
        for f in fields(PairTask):
            want = tuple(d + 2 for d in before.deps) if f.name == "deps" else getattr(before, f.name)
            assert getattr(after, f.name) == want, f.name
    assert [t.deps for t in dag.tasks] == [(), (0,), (), (2,), (2, 3)]


def test_without_forward_tasks_the_backward_side_is_unchanged() -> None:
    bwd = [_task("b0", (), BWD), _task("b1", (0,), BWD)]
    assert join_sides([], bwd).tasks == bwd
