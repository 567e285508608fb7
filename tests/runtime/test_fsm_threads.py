"""Stress: a training thread and a monitor thread share one FSM.

The training thread runs compute actions and hands communication to the
monitor, which completes it after a random delay and reports token counts for
All-to-Alls. Every action must run exactly once, after the work its WAITs
name, and deferred tasks before their deadline. An exception in the monitor is
caught there and re-raised on the training thread, never lost.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from typing import Any

import pytest

import runtime
from runtime import ActionKind, Op, Stream, reference

from program_gen import generate_bytes

WORK_OPS = (Op.RUN, Op.SEND, Op.RECV, Op.COLLECTIVE)


def run_threaded(fsm, program, seed: int) -> tuple[dict[int, int], dict[int, int]]:  # noqa: ANN001
    clock = itertools.count()  # next() is atomic under the GIL
    issued: dict[int, int] = {}
    completed: dict[int, int] = {}
    handoff: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    failure: list[BaseException] = []
    code = program.instructions
    ep = program.plan.ep

    def finish(action_id: int) -> None:
        completed[action_id] = next(clock)
        fsm.complete(action_id)

    def monitor() -> None:
        rng = random.Random(seed)
        try:
            while (action_id := handoff.get()) is not None:
                ins = code[action_id]
                if ins.op == Op.COLLECTIVE and ins.aux == 0:
                    fsm.report_tokens(ins.a, ins.mb, [rng.randrange(512) for _ in range(ep)])
                if rng.random() < 0.3:
                    time.sleep(rng.random() * 1e-4)
                finish(action_id)
        except BaseException as err:  # handed to the training thread, which re-raises it
            failure.append(err)

    thread = threading.Thread(target=monitor, name="tessera-monitor")
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the FSM did not finish"
            if failure:
                raise failure[0]
            a = fsm.advance()
            if a.kind == ActionKind.DONE:
                break
            if a.kind == ActionKind.WAIT:
                time.sleep(0)
                continue
            assert a.id not in issued, f"action {a.id} issued twice"
            issued[a.id] = next(clock)
            if a.stream == Stream.COMM:
                handoff.put(a.id)
            else:
                finish(a.id)
    finally:
        handoff.put(None)
        thread.join()
    if failure:
        raise failure[0]
    return issued, completed


def check_order(program, issued: dict[int, int], completed: dict[int, int]) -> None:  # noqa: ANN001
    code = program.instructions
    work = [i for i, ins in enumerate(code) if ins.op in WORK_OPS]
    assert set(issued) == set(completed) == {i for i, ins in enumerate(code) if ins.op in (*WORK_OPS, Op.DEFER)}
    assert [issued[i] for i in work] == sorted(issued[i] for i in work), "work issued out of program order"
    for i, ins in enumerate(code):
        later = next((j for j in work if j > i), None)
        if ins.op == Op.WAIT and later is not None:
            assert issued[later] > completed[ins.a], f"instruction {later} started before WAIT {i}'s target finished"
        if ins.op == Op.DEFER:
            due = next((j for j in work if j >= ins.b), None)
            before = max((j for j in work if j < i), default=None)
            if before is not None:
                assert issued[i] > issued[before], f"deferred task {i} ran before the work that precedes its DEFER"
            if due is not None:
                assert issued[i] < issued[due], f"deferred task {i} missed its deadline {ins.b}"


@pytest.mark.parametrize("interpreter", ["cpp", "python"])
def test_training_and_monitor_threads_run_every_task_once_in_order(interpreter: str) -> None:
    for seed in range(6):
        data = generate_bytes(seed, max_pp=2, max_mb=4)
        pp = runtime.bytecode.decode(data).plan.pp
        for rank in range(pp):
            program: Any
            fsm: Any
            if interpreter == "cpp":
                program = runtime.load_plan(data, rank=rank)
                fsm = runtime.FSM(program)
            else:
                program = reference.load_plan(data, rank=rank)
                fsm = reference.ReferenceFSM(program)
            issued, completed = run_threaded(fsm, program, seed)
            check_order(program, issued, completed)


def test_an_exception_in_the_monitor_reaches_the_training_thread() -> None:
    data = generate_bytes(1)
    program = runtime.load_plan(data, rank=0)
    fsm = runtime.FSM(program)
    # Completing every comm action twice makes the monitor's second complete() raise.
    original = fsm.complete

    class Twice:
        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(fsm, name)

        def complete(self, action_id: int) -> None:
            original(action_id)
            if program.instructions[action_id].stream == Stream.COMM:
                original(action_id)

    with pytest.raises(ValueError, match="not in flight"):
        run_threaded(Twice(), program, 0)
