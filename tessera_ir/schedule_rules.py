"""The conditions a pair schedule must meet, decided exactly: one implementation for every checker.

A pair schedule states, for every task of a pair, a start, a duration and a stream. It is
valid when (rule names as the z3 checker in ``passes/scheduling/check.py`` names them):

- ``stream``: each task runs on the stream of its resource;
- ``duration``: each task lasts its own duration (within the tolerance);
- ``non-negative``: no task starts before the pair (start >= -tolerance), and every time is a
  finite number;
- ``dependency``: a task starts once each predecessor inside the pair has finished
  (``start_j >= start_i + duration_i - tolerance``, with the durations the schedule states);
- ``exclusive``: a stream runs one task at a time; checked between neighbours in
  (start, finish, name) order on each stream, which is enough: if every task ends before the
  next one on its stream starts, no two tasks on the stream overlap;
- ``deadline``: a movable task with a deadline finishes by it (``start + duration <=
  deadline + tolerance``).

(``placed-once``, every task exactly one entry, is a matter of matching entries to tasks and
is decided by the caller before the slots exist.)

The tolerance is 1e-6 µs, or, for a schedule whose times reach past about 34 s (2^25 µs), 256 units
in the last place of its largest time (:func:`schedule_tolerance`): start times are sums of floats,
and there one rounding of a sum is coarser than a picosecond (a start 3.4e10 µs into a pair is
exact only to 4e-6 µs), so a fixed tolerance would refuse a schedule for its arithmetic alone.
Every comparison is decided as exact rational arithmetic on the
floats' binary values decides it (which is what z3 decides): floats answer unless the two
sides lie within rounding of each other, and then ``fractions.Fraction`` does. So this check
and the z3 proof accept exactly the same schedules, and this one runs in microseconds per task.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

TOLERANCE_US = 1e-6
_TOLERANCE = Fraction(1, 10**6)
# The tolerance of a schedule, in units in the last place of its largest time, once that is
# coarser than TOLERANCE_US: a relative 2^-44 (6e-14), far below any duration that matters.
_TOLERANCE_ULPS_LOG2 = 8


def schedule_tolerance(*times: Sequence[float | None]) -> Fraction:
    """The tolerance of a schedule whose times (starts, durations, deadlines; ``None`` and
    non-finite values ignored) are ``times``: 1e-6 µs, or 2^8 units in the last place of the
    largest magnitude among them when that is larger. A power of two then, so it is exact as a
    float too. ``passes/scheduling/csrc/proof.cpp`` computes the same (``schedule_tolerance``)."""
    largest = 0.0
    for values in times:
        for x in values:
            if x is not None and math.isfinite(x) and abs(x) > largest:
                largest = abs(x)
    if largest == 0.0:
        return _TOLERANCE
    _, exponent = math.frexp(largest)  # largest = m * 2**exponent, 0.5 <= m < 1
    scaled = math.ldexp(1.0, exponent - 1 - 52 + _TOLERANCE_ULPS_LOG2)
    return Fraction(scaled) if scaled > TOLERANCE_US else _TOLERANCE
# Outside this fraction of the operands' size the floats' answer is exact (see at_least).
_FLOAT_MARGIN = 1e-12


def at_least(later: float, *earlier: float, tolerance: Fraction = _TOLERANCE) -> bool:
    """``later >= sum(earlier) - tolerance``, decided exactly (every argument finite)."""
    tolerance_us = TOLERANCE_US if tolerance == _TOLERANCE else float(tolerance)
    total = 0.0
    size = abs(later) + 1.0
    for x in earlier:
        total += x
        size += abs(x)
    slack = later - total + tolerance_us
    # The float arithmetic above errs by at most (k + 2) * 2**-53 * size for k terms: far
    # below this margin (for any k < 4000), so outside it the floats' answer is exact.
    if abs(slack) > _FLOAT_MARGIN * size:
        return slack > 0
    return Fraction(later) >= sum((Fraction(x) for x in earlier), Fraction(0)) - tolerance


def _after(later: float, start: float, duration: float, tolerance: Fraction, tolerance_us: float) -> bool:
    """``at_least(later, start, duration, tolerance=tolerance)`` with its two terms spelled out
    (the hot case: a task's start against another's finish), decided the same way."""
    slack = later - (start + duration) + tolerance_us
    if abs(slack) > _FLOAT_MARGIN * (abs(later) + 1.0 + abs(start) + abs(duration)):
        return slack > 0
    return Fraction(later) >= Fraction(start) + Fraction(duration) - tolerance


@dataclass(frozen=True)
class Violation:
    """A broken condition: its rule name, the tasks involved and the numbers behind it."""

    rule: str
    tasks: tuple[str, ...]
    detail: str


def violations(
    names: Sequence[str],
    start: Sequence[float],
    duration: Sequence[float],
    stream: Sequence[str],
    resource: Sequence[str],
    required_duration: Sequence[float],
    deps: Sequence[Sequence[int]],
    deadline: Sequence[float | None],
    first_only: bool = False,
) -> list[Violation]:
    """The broken conditions of a schedule, task ``k`` being ``names[k]`` that the schedule
    starts at ``start[k]`` for ``duration[k]`` on ``stream[k]``, while the task needs stream
    ``resource[k]``, lasts ``required_duration[k]``, waits for the tasks ``deps[k]`` (indices)
    and, when movable with a deadline, must finish by ``deadline[k]``. In the order: per task
    stream, duration, non-negative, deadline; then dependencies; then exclusivity per stream.
    ``first_only`` stops at the first. The tolerance is :func:`schedule_tolerance` of these times."""
    out: list[Violation] = []
    tolerance = schedule_tolerance(start, duration, required_duration, deadline)
    tolerance_us = TOLERANCE_US if tolerance == _TOLERANCE else float(tolerance)

    def add(rule: str, tasks: tuple[str, ...], detail: str) -> bool:
        out.append(Violation(rule, tasks, detail))
        return first_only

    n = len(names)
    finite = [math.isfinite(start[k]) and math.isfinite(duration[k]) for k in range(n)]
    for k in range(n):
        if stream[k] != resource[k]:
            if add("stream", (names[k],), f"it runs on stream '{stream[k]}' but is a {resource[k]} task"):
                return out
        if not finite[k]:
            if add("non-negative", (names[k],), f"its start {start[k]} or duration {duration[k]} is not a finite number"):
                return out
            continue
        # Equal durations meet the rule both ways; only different ones need deciding.
        if duration[k] != required_duration[k] and not (
            at_least(duration[k], required_duration[k], tolerance=tolerance)
            and at_least(required_duration[k], duration[k], tolerance=tolerance)
        ):
            if add("duration", (names[k],), f"scheduled for {duration[k]} us but takes {required_duration[k]} us"):
                return out
        if start[k] < 0.0 and not at_least(start[k], 0.0, tolerance=tolerance):
            if add("non-negative", (names[k],), f"starts at {start[k]} us, before the pair starts"):
                return out
        due = deadline[k]
        if due is not None and not _after(due, start[k], duration[k], tolerance, tolerance_us):
            if add("deadline", (names[k],), f"finishes at {start[k] + duration[k]} us, after its deadline {due} us"):
                return out
    for k in range(n):
        if not finite[k]:
            continue
        for d in deps[k]:
            if finite[d] and not _after(start[k], start[d], duration[d], tolerance, tolerance_us):
                detail = f"'{names[k]}' starts at {start[k]} us before '{names[d]}' finishes at {start[d] + duration[d]} us"
                if add("dependency", (names[d], names[k]), detail):
                    return out
    streams: dict[str, list[int]] = {}
    for k in range(n):
        if finite[k]:
            streams.setdefault(stream[k], []).append(k)
    for name in sorted(streams):
        order = sorted(streams[name], key=lambda k: (start[k], start[k] + duration[k], names[k]))
        for a, b in zip(order, order[1:]):
            if not _after(start[b], start[a], duration[a], tolerance, tolerance_us):
                detail = (
                    f"both run on stream '{name}' at once: [{start[a]}, {start[a] + duration[a]}) "
                    f"and [{start[b]}, {start[b] + duration[b]}) us"
                )
                if add("exclusive", (names[a], names[b]), detail):
                    return out
    return out
