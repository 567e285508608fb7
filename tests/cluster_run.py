"""Every pipeline rank's FSM driven together, as trainers on a cluster would, with random timing.

``run_cluster(data, seed)`` loads each rank's program from plan bytes, and plays the trainers
and their devices: a rank calls ``advance()`` and issues what it gets (RUN on its compute
stream, collectives on its comm stream, each stream finishing its work in order; SEND and
RECV posted and matched per pair of ranks in the order both issue them); work finishes at
random moments; a WAIT blocks the rank until its target finished. It records when each
(task, micro-batch) starts and checks, as the work starts, that every task it depends on has
finished (anywhere: a tensor from another rank arrives with its receive, which the receiver
waited for). Returns the ranks' counters; raises AssertionError on a deadlock (no rank can
move), a task started before its dependencies, or one run twice or never.

This is independent of the verifier's static checks (``tessera_ir.program_checks``): it runs
the runtime's own interpreters on the bytes codegen wrote.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import runtime
from runtime import reference
from tessera_ir.model import Module

RUN, SEND, RECV, COLLECTIVE, WAIT, DONE = 0, 1, 2, 3, 4, 5


@dataclass
class _Rank:
    fsm: Any
    program: Any
    streams: tuple[deque, deque] = field(default_factory=lambda: (deque(), deque()))  # (id, task, mb) per stream
    waiting_for: int | None = None
    done: bool = False
    finished_ids: set[int] = field(default_factory=set)


def run_cluster(
    data: bytes,
    module: Module,
    seed: int,
    *,
    interpreter: str = "cpp",
    report_tokens: bool = True,
    max_events: int = 5_000_000,
) -> list[dict[str, float]]:
    rng = random.Random(seed)
    load: Callable[..., Any] = runtime.load_plan if interpreter == "cpp" else reference.load_plan
    make: Callable[..., Any] = runtime.FSM if interpreter == "cpp" else reference.ReferenceFSM
    first = load(data, rank=0)
    pp, microbatches, ep = first.plan.pp, first.plan.microbatches, first.plan.ep
    ranks = []
    for r in range(pp):
        program = load(data, rank=r)
        ranks.append(_Rank(make(program), program))
    names = [t.name for t in first.tasks]
    deps = {t.name: list(t.deps) for t in module.tasks()}
    finished: set[tuple[str, int]] = set()
    started: set[tuple[str, int]] = set()
    sends: dict[tuple[int, int], deque] = {}
    recvs: dict[tuple[int, int], deque] = {}
    comm_tasks = [i for i, t in enumerate(first.tasks) if t.resource == 1]

    def start(rank: _Rank, task: int, mb: int) -> None:
        key = (names[task], mb)
        assert key not in started, f"{key} runs twice"
        missing = [d for d in deps[names[task]] if (d, mb) not in finished]
        assert not missing, f"{key} starts before {missing} finished"
        started.add(key)

    def finish(r: int, action_id: int, work: tuple[str, int] | None) -> None:
        rank = ranks[r]
        rank.fsm.complete(action_id)
        rank.finished_ids.add(action_id)
        if work is not None:
            finished.add(work)
        if rank.waiting_for == action_id:
            rank.waiting_for = None

    def match(channel: tuple[int, int]) -> None:
        s, q = sends.setdefault(channel, deque()), recvs.setdefault(channel, deque())
        while s and q:
            (sid, skey), (rid, rkey) = s.popleft(), q.popleft()
            assert skey == rkey, f"rank {channel[0]} sends {skey} but rank {channel[1]} receives {rkey}"
            finish(channel[0], sid, None)
            finish(channel[1], rid, None)

    for _ in range(max_events):
        movable = [r for r, rank in enumerate(ranks) if not rank.done and rank.waiting_for is None]
        busy = [(r, k) for r, rank in enumerate(ranks) for k in (0, 1) if rank.streams[k]]
        if not movable and not busy:
            if all(rank.done for rank in ranks):
                break
            stuck = [(r, rank.waiting_for) for r, rank in enumerate(ranks) if not rank.done]
            raise AssertionError(f"deadlock: ranks waiting (rank, action) {stuck}")
        if busy and (not movable or rng.random() < 0.5):
            r, k = rng.choice(busy)
            action_id, task, mb = ranks[r].streams[k].popleft()
            finish(r, action_id, (names[task], mb) if task >= 0 else None)
            if ranks[r].streams[k]:  # the next work on that stream starts now
                _, ntask, nmb = ranks[r].streams[k][0]
                if ntask >= 0:
                    start(ranks[r], ntask, nmb)
            continue
        r = rng.choice(movable)
        rank = ranks[r]
        if report_tokens and comm_tasks and rng.random() < 0.1:
            rank.fsm.report_tokens(rng.choice(comm_tasks), rng.randrange(microbatches),
                                   [rng.randrange(64) for _ in range(ep * 2)])
        a = rank.fsm.advance()
        kind = int(a.kind)
        if kind == DONE:
            rank.done = True
        elif kind == WAIT:
            if a.wait_for not in rank.finished_ids:
                rank.waiting_for = a.wait_for
        elif kind in (SEND, RECV):
            channel = (r, a.peer) if kind == SEND else (a.peer, r)
            (sends if kind == SEND else recvs).setdefault(channel, deque()).append((a.id, (a.payload, a.vstage, a.mb)))
            match(channel)
        else:
            stream = 0 if kind == RUN else 1
            task = a.task if kind == RUN or a.collective == 0 else -1
            queue = rank.streams[stream]
            queue.append((a.id, task, a.mb))
            if len(queue) == 1 and task >= 0:
                start(rank, task, a.mb)
    else:
        raise AssertionError("the cluster did not finish within the event budget")
    expected = {(t.name, mb) for t in module.tasks() for mb in range(microbatches)}
    assert finished >= expected, f"never ran: {sorted(expected - finished)[:5]}"
    return [dict(rank.fsm.counters) for rank in ranks]
