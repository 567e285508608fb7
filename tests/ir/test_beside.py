"""Work in a forked process beside the caller: its result comes back; a failure is redone here."""

from __future__ import annotations

import os

import pytest

from tessera_ir.beside import beside

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")


def test_the_result_comes_back_from_the_child() -> None:
    parent = os.getpid()
    assert beside(lambda: {"pid_differs": os.getpid() != parent, "list": [1.5, 2]})() == {"pid_differs": True, "list": [1.5, 2]}


def test_a_child_that_dies_is_replaced_by_doing_the_work_here() -> None:
    parent = os.getpid()

    def dies_in_the_child() -> str:
        if os.getpid() != parent:
            os._exit(3)
        return "done here"

    assert beside(dies_in_the_child)() == "done here"


def test_the_work_s_own_error_is_raised_by_the_wait() -> None:
    def always_fails() -> None:
        raise ValueError("the simulation's own error")

    wait = beside(always_fails)  # nothing raised yet: the child failed, the parent has not waited
    with pytest.raises(ValueError, match="own error"):
        wait()


def test_the_child_does_not_change_what_the_parent_sees() -> None:
    shared = [1]

    def grows() -> int:
        shared.append(2)
        return len(shared)

    assert beside(grows)() == 2 and shared == [1]


def test_the_child_keeps_what_it_inherited_out_of_the_collector_s_way() -> None:
    """Inherited objects are frozen in the child (a full collection there would copy every page it
    inherited); the parent's collector is left as it was."""
    import gc

    before = gc.get_freeze_count()
    inherited = [[k] for k in range(1000)]  # lists: objects the collector tracks
    assert all(gc.is_tracked(x) for x in inherited)
    assert beside(gc.get_freeze_count)() >= before + len(inherited)
    assert gc.get_freeze_count() == before
