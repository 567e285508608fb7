"""Checking a pair schedule: the exact Python check on every schedule, and an independent z3 proof.

Whatever produced a schedule (heuristic, baseline, exact solver, a cache on disk, or IR text
someone edited), it must satisfy, for the pair DAG it claims to schedule:

- ``placed-once``: every task of the DAG has exactly one entry, and no entry names a task outside it;
- ``stream``: each entry runs on the stream of its task's resource;
- ``duration``: each entry's duration is the task's duration;
- ``dependency``: a task starts after each predecessor finished (``start_j >= start_i + dur_i``);
- ``exclusive``: a stream runs one task at a time;
- ``deadline``: a movable task finishes by its deadline (the pair's end when it has none; that
  case holds by definition of the makespan and is not asserted);
- ``non-negative``: no task starts before the pair (and every time is finite).

:func:`check_schedule` decides these in Python first (``tessera_ir.schedule_rules``: exact
rational comparisons where floats are too close to call, so it accepts exactly what z3
accepts) and, with ``prove``, then has z3 prove them independently. :func:`prove_all` decides
the proofs of many schedules as one z3 problem, with the same answer for each.

The z3 proof: the facts are asserted and z3 decides them; when it answers unsat (the
schedule is wrong), the same facts are asserted again, each as a named assertion
(``(assert (! formula :named c_k))``) tied to the constraint and its tasks, so that the
unsat core names exactly what broke. Start times and durations are named real constants
(``define-fun``) with the schedule's values, so only constraints appear in the
core. Values are exact: every time is a float, a rational whose denominator is a power of
two, so the schedule's values and the tolerance are all written as integers over one common
denominator (the least multiple of the floats' largest denominator and the tolerance's) --
every constraint multiplied by that one positive number, which changes no answer, and a
script a sixth shorter and a quarter faster to decide than one spelling each value as its
own fraction. The three
facts that are plain booleans before z3 sees them (a task's entry count is 1,
an entry's stream is its task's, an entry's duration is exactly its task's) are
written out only when they fail -- the first two as ``false``, a duration that
differs as its tolerance inequality -- so the core still names them and valid
schedules stay short (the durations were over a quarter of z3's parsing).

Two ways to z3, the same facts: a well-formed schedule (every task placed once, on its
stream, for its duration -- every schedule the passes make) goes to z3 as terms built through
its C API by :mod:`passes.scheduling._proof` (``passes/scheduling/csrc/proof.cpp``, libz3 opened
from the z3 package), each value the float's exact ratio; z3's solver decides their conjunction.
Parsing the text was two thirds of a proof: on make demo's pair DAGs, sixteen at a time,
the C API takes 0.36 of the text's time per schedule (1.33 against 3.69 ms, facts and script
included; ``bench/bench_schedule_proof.py --sample 400``). Every other schedule, one the C API
does not prove, and every schedule where the extension or libz3 cannot be loaded goes to the
script below, which decides it again and, when it fails, names what broke.

Scaling: the script is written as SMT-LIB2 text with plain string
formatting and parsed by z3 in C++ (``Solver.from_string``); building the same
terms through z3's Python API costs tens of microseconds each, several times
the whole text. The encoding is linear in the number of tasks: exclusivity is
asserted only between neighbours in start-time order on each stream. If every
task ends before the next one on its stream starts, the chain implies that no
two tasks on the stream overlap, and a pair that does overlap always shows up
as an overlapping neighbour pair.

Times are compared with a tolerance of 1e-6 µs (a picosecond) because start
times are floats computed as sums of floats; in a schedule whose times pass about 34 s, where one
rounding of a sum is coarser than that, with 256 units in the last place of its largest time
(``tessera_ir.schedule_rules.schedule_tolerance``; the C API path computes the same).
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import ModuleType

from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import RESOURCES, PairSchedule
from support.extensions import load_extension
from tessera_ir.errors import TesseraError
from tessera_ir.plan_ops import ScheduleEntry  # one entry type for the IR's schedules and the check
from tessera_ir.schedule_rules import schedule_tolerance, violations

TOLERANCE_US = Fraction(1, 10**6)  # the least tolerance; a schedule's own is schedule_tolerance


class ScheduleError(TesseraError):
    """A pair schedule that breaks a constraint. ``constraint`` names it; ``tasks`` are the tasks involved."""

    def __init__(self, message: str, constraint: str = "", tasks: Sequence[str] = ()):
        self.constraint = constraint
        self.tasks = list(tasks)
        super().__init__(message)


def entries_of(schedule: PairSchedule) -> list[ScheduleEntry]:
    """Entries of a :class:`passes.scheduling.schedule.PairSchedule`."""
    dag, start = schedule.dag, schedule.start
    return [ScheduleEntry(t.name, start[i], t.duration, t.resource.value) for i, t in enumerate(dag.tasks)]


def _real(x: int | Fraction) -> str:
    """An exact SMT-LIB2 real literal: ``n.0``, ``(/ n.0 d.0)``, negated with ``(- ...)``."""
    num, den = x.as_integer_ratio()
    text = f"{abs(num)}.0" if den == 1 else f"(/ {abs(num)}.0 {den}.0)"
    return f"(- {text})" if num < 0 else text


def _scaled(values: list[float], tolerance: Fraction) -> Callable[[float | Fraction], str]:
    """The literal of a value times the least number that makes each of ``values`` and the
    tolerance an integer (see the module docstring)."""
    scale = tolerance.denominator
    for v in values:
        scale = math.lcm(scale, v.as_integer_ratio()[1])

    def literal(x: float | Fraction) -> str:
        # Integer arithmetic on the exact ratio: a Fraction per value cost a third of the
        # script's time, for the same numbers.
        num, den = x.as_integer_ratio()
        times, rest = divmod(scale, den)
        assert rest == 0, "a value outside the common denominator"
        return _real(num * times)

    return literal


def check_schedule(dag: PairDAG, entries: Sequence[ScheduleEntry], where: str = "", prove: bool = True) -> None:
    """Raise :class:`ScheduleError` unless ``entries`` is a valid schedule of ``dag``.

    The exact Python check always runs; ``prove`` adds the z3 proof. ``where`` (e.g.
    ``"pair_schedule @sched.0"``) prefixes the message.
    """
    prefix = f"{where}: " if where else ""
    fix = "re-run the overlap-schedule pass to rebuild the schedule"

    index = {t.name: i for i, t in enumerate(dag.tasks)}
    count = [0] * len(dag.tasks)
    extra = [e.task for e in entries if e.task not in index]
    if extra:
        raise ScheduleError(
            f"{prefix}violates placed-once: entries {extra} name tasks that are not in pair '{dag.name}'; {fix}",
            "placed-once",
            extra,
        )
    for e in entries:
        count[index[e.task]] += 1
        if not (math.isfinite(e.start) and math.isfinite(e.duration)):
            raise ScheduleError(
                f"{prefix}schedule of pair '{dag.name}' violates non-negative for {e.task}: its start {e.start} or "
                f"duration {e.duration} is not a finite number; {fix}",
                "non-negative",
                [e.task],
            )
    entry_of: dict[int, ScheduleEntry] = {}
    for e in entries:
        entry_of.setdefault(index[e.task], e)
    if all(c == 1 for c in count):
        found = violations(
            [t.name for t in dag.tasks],
            [entry_of[i].start for i in range(len(dag.tasks))],
            [entry_of[i].duration for i in range(len(dag.tasks))],
            [entry_of[i].stream for i in range(len(dag.tasks))],
            [t.resource.value for t in dag.tasks],
            [t.duration for t in dag.tasks],
            [t.deps for t in dag.tasks],
            [t.deadline if t.movable else None for t in dag.tasks],
            first_only=True,
        )
        if found:
            v = found[0]
            raise ScheduleError(
                f"{prefix}schedule of pair '{dag.name}' violates {v.rule} for {', '.join(v.tasks)}: {v.detail}; {fix}",
                v.rule,
                v.tasks,
            )
        if not prove:
            return
    _prove(dag, entry_of, count, prefix, fix)


@dataclass
class ProofScript:
    """The z3 proof of one schedule as SMT-LIB2 text: definitions (the tolerance, each task's
    start and duration as named real constants) and the constraints, each under a label that
    ``labels`` maps back to the constraint's name and its tasks."""

    definitions: list[str]
    asserted: list[tuple[str, str]]  # (label, formula)
    labels: dict[str, tuple[str, list[str]]]

    def plain(self) -> str:
        """Every constraint asserted as it is: what decides sat or unsat."""
        return "\n".join(self.definitions + [f"(assert {formula})" for _, formula in self.asserted])

    def named(self) -> str:
        """The same constraints, each a named assertion, so that an unsat core names them."""
        named = [f"(assert (! {formula} :named {label}))" for label, formula in self.asserted]
        return "\n".join(["(set-option :produce-unsat-cores true)"] + self.definitions + named)


def proof_script(dag: PairDAG, entry_of: dict[int, ScheduleEntry], count: list[int], tag: str = "") -> ProofScript:
    """The conditions of the module docstring for the entries ``entry_of`` (by task index; ``count``:
    how many entries each task has) as one SMT-LIB2 script.

    Written as text with plain string formatting and parsed by z3 in C++: building each term
    through z3's Python API costs tens of microseconds, the text a fraction of that. ``tag``
    prefixes every constant's name, so that the scripts of several schedules can be decided as
    one (:func:`prove_all`).
    """
    script = ProofScript([], [], {})

    def track(constraint: str, tasks: list[str], formula: str) -> None:
        if formula == "true":
            return  # holds by itself (a count of 1, a matching stream): nothing to prove
        label = f"c_{len(script.labels)}"
        script.labels[label] = (constraint, tasks)
        script.asserted.append((label, formula))

    lines = script.definitions
    values = [x for e in entry_of.values() for x in (e.start, e.duration)]
    values += [t.duration for t in dag.tasks] + [t.deadline for t in dag.tasks if t.movable and t.deadline is not None]
    tolerance = schedule_tolerance(values)
    lit = _scaled(values, tolerance)
    tol = f"{tag}tol"
    lines.append(f"(define-fun {tol} () Real {lit(tolerance)})")
    present = [False] * len(dag.tasks)
    for i, t in enumerate(dag.tasks):
        track("placed-once", [t.name], "true" if count[i] == 1 else f"(= {count[i]} 1)")
        if i not in entry_of:
            continue
        e = entry_of[i]
        present[i] = True
        # Start and duration are named constants (``define-fun``), not assertions, so
        # only constraints appear in the core; z3 substitutes them while parsing,
        # which makes the check several times faster than pinning variables.
        lines.append(f"(define-fun {tag}s{i} () Real {lit(e.start)}) (define-fun {tag}d{i} () Real {lit(e.duration)})")
        track("stream", [t.name], "true" if e.stream == t.resource.value else "false")
        # |d - duration| <= tolerance; an entry that states its task's duration exactly (every
        # schedule the passes make) holds it by equality, decided here like the stream.
        if e.duration == t.duration:
            track("duration", [t.name], "true")
        else:
            want = lit(t.duration)
            track("duration", [t.name], f"(and (<= (- {tag}d{i} {want}) {tol}) (<= (- {want} {tag}d{i}) {tol}))")
        track("non-negative", [t.name], f"(>= {tag}s{i} (- {tol}))")
        if t.movable and t.deadline is not None:
            track("deadline", [t.name], f"(<= (+ {tag}s{i} {tag}d{i}) (+ {lit(t.deadline)} {tol}))")
    for j, t in enumerate(dag.tasks):
        if not present[j]:
            continue
        for i in t.deps:
            if present[i]:
                track("dependency", [dag.tasks[i].name, t.name], f"(>= {tag}s{j} (- (+ {tag}s{i} {tag}d{i}) {tol}))")
    by_stream: dict[str, list[int]] = {}
    for i, e in entry_of.items():
        by_stream.setdefault(e.stream, []).append(i)
    for stream in sorted(by_stream):
        order = sorted(
            by_stream[stream],
            key=lambda i: (entry_of[i].start, entry_of[i].start + entry_of[i].duration, dag.tasks[i].name),
        )
        for a, b in zip(order, order[1:]):
            track("exclusive", [dag.tasks[a].name, dag.tasks[b].name], f"(>= {tag}s{b} (- (+ {tag}s{a} {tag}d{a}) {tol}))")

    return script


def _z3_library() -> str | None:
    """The libz3 file the z3 package loads, found without importing the package (a tenth of a
    second), or from the package itself where its folder holds none."""
    spec = importlib.util.find_spec("z3")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
    for pattern in ("libz3.so.*", "libz3.so", "libz3.dylib"):
        found = sorted(folder.glob(pattern))
        if found:
            return str(found[0])
    try:
        import z3.z3core

        return str(z3.z3core._lib._name)
    except Exception:  # noqa: BLE001 - no library to open: the text scripts decide
        return None


@functools.cache
def native_prover() -> ModuleType | None:
    """The extension that hands a schedule's facts to z3 as terms through its C API
    (``passes.scheduling._proof``) with libz3 opened, or None where it cannot be (no build of it,
    no libz3 file, a libz3 without a function it uses): the SMT-LIB scripts decide then."""
    try:
        extension = load_extension("passes.scheduling._proof", "TESSERA_PROOF_EXTENSION")
    except (ImportError, OSError):  # not built, or $TESSERA_PROOF_EXTENSION names no build
        return None
    path = _z3_library()
    return extension if path is not None and extension.load(path) else None


def native_facts(
    dag: PairDAG, start: Sequence[float]
) -> tuple[Sequence[float], list[float], list[int], list[tuple[int, ...]], list[float | None], list[str]]:
    """A well-formed schedule's facts as :mod:`passes.scheduling._proof` reads them: per task of
    ``dag``, its start, duration, stream (numbered as the pair search numbers them), predecessors,
    deadline (movable tasks with one) and name (the tie-break of a stream's start order, as
    :func:`proof_script` breaks it)."""
    tasks = dag.tasks
    return (
        start,
        [t.duration for t in tasks],
        [RESOURCES.index(t.resource) for t in tasks],
        [t.deps for t in tasks],
        [t.deadline if t.movable else None for t in tasks],
        [t.name for t in tasks],
    )


def _well_formed(dag: PairDAG, entry_of: dict[int, ScheduleEntry], count: list[int]) -> bool:
    """Every task placed once, on its own stream, for exactly its own duration: the facts the
    proof script writes out as ``true``, so that only the ones :mod:`passes.scheduling._proof`
    states are left."""
    return all(c == 1 for c in count) and all(
        i in entry_of and entry_of[i].stream == t.resource.value and entry_of[i].duration == t.duration
        for i, t in enumerate(dag.tasks)
    )


def _prove(dag: PairDAG, entry_of: dict[int, ScheduleEntry], count: list[int], prefix: str, fix: str) -> None:
    """The z3 proof of the conditions (see the module docstring); raises on the first unsat core."""
    native = native_prover()
    if native is not None and _well_formed(dag, entry_of, count):
        start = [entry_of[i].start for i in range(len(dag.tasks))]
        if native.prove([native_facts(dag, start)]):
            return
    # Not proven through the C API (or no C API): the script decides, and names what broke.
    import z3

    script = proof_script(dag, entry_of, count)
    # A valid schedule (the usual case) is decided without unsat-core tracking, which
    # costs z3 time; only an unsat answer is decided again with every assertion named,
    # to find the constraints in the core. Both runs assert the same formulas. The plain
    # incremental solver (``SimpleSolver``) skips the tactic front end of ``z3.Solver``,
    # which does nothing for a ground linear problem but costs time
    # (bench/bench_schedule_proof.py measures both).
    solver = z3.SimpleSolver()
    solver.from_string(script.plain())
    result = solver.check()
    if result == z3.sat:
        return
    solver = z3.SimpleSolver()
    solver.set(unsat_core=True)
    solver.from_string(script.named())
    result = solver.check()
    core = [str(c) for c in solver.unsat_core()] if result == z3.unsat else []
    if not core:  # cannot happen with tracked assertions, but never report an empty reason
        raise ScheduleError(f"{prefix}z3 found the schedule of pair '{dag.name}' inconsistent ({result}); {fix}")
    labels = script.labels
    violated = sorted((labels[c] for c in core), key=lambda x: (x[0], x[1]))
    constraint, tasks = violated[0]
    detail = _explain(dag, entry_of, count, constraint, tasks)
    others = ""
    if len(violated) > 1:
        others = " (also: " + "; ".join(f"{c} {', '.join(ts)}" for c, ts in violated[1:4]) + ")"
    raise ScheduleError(
        f"{prefix}schedule of pair '{dag.name}' violates {constraint} for {', '.join(tasks)}: {detail}{others}; {fix}",
        constraint,
        tasks,
    )


def prove_all(schedules: Sequence[PairSchedule], through_text: bool = False) -> bool:
    """Whether z3 proves every one of ``schedules`` valid, deciding their scripts as one.

    Each schedule's facts are ground (every constant is defined by a value), so their
    conjunction is satisfiable exactly when each schedule's facts are: one sat answer proves
    them all, as many separate proofs would. It costs less: z3's fixed cost per solver and per
    check, about a third of a lone proof of a pair DAG of make demo's model, is paid once per
    batch (bench/bench_schedule_proof.py measures both). Any other answer says only that some
    schedule failed; the caller proves each on its own to find which and why.

    The facts go to z3 as terms through its C API where :func:`native_prover` loads, as
    SMT-LIB text otherwise (and with ``through_text``): the same facts, decided by z3 both ways.
    """
    native = None if through_text else native_prover()
    if native is not None:
        return bool(native.prove([native_facts(s.dag, s.start) for s in schedules]))
    import z3

    try:
        texts = []
        for k, sched in enumerate(schedules):
            entries = entries_of(sched)
            texts.append(proof_script(sched.dag, dict(enumerate(entries)), [1] * len(entries), tag=f"k{k}_").plain())
        solver = z3.SimpleSolver()
        solver.from_string("\n".join(texts))
        return bool(solver.check() == z3.sat)
    except Exception:  # noqa: BLE001 - a time with no script (not finite), a malformed schedule: proven one by one
        return False


def _explain(dag: PairDAG, entry_of: dict[int, ScheduleEntry], count: list[int], constraint: str, tasks: list[str]) -> str:
    """Spell out the numbers behind one violated constraint."""
    idx = {t.name: i for i, t in enumerate(dag.tasks)}
    ts = [idx[n] for n in tasks]
    if constraint == "placed-once":
        return f"it has {count[ts[0]]} entries, expected exactly 1"
    e = [entry_of.get(i) for i in ts]
    if constraint == "stream" and e[0]:
        return f"it runs on stream '{e[0].stream}' but is a {dag.tasks[ts[0]].resource.value} task"
    if constraint == "duration" and e[0]:
        return f"scheduled for {e[0].duration} us but takes {dag.tasks[ts[0]].duration} us"
    if constraint == "non-negative" and e[0]:
        return f"starts at {e[0].start} us, before the pair starts"
    if constraint == "deadline" and e[0]:
        return f"finishes at {e[0].start + e[0].duration} us, after its deadline {dag.tasks[ts[0]].deadline} us"
    if constraint == "dependency" and e[0] and e[1]:
        return f"'{tasks[1]}' starts at {e[1].start} us before '{tasks[0]}' finishes at {e[0].start + e[0].duration} us"
    if constraint == "exclusive" and e[0] and e[1]:
        return (
            f"both run on stream '{e[0].stream}' at once: [{e[0].start}, {e[0].start + e[0].duration}) "
            f"and [{e[1].start}, {e[1].start + e[1].duration}) us"
        )
    return "see the pair's schedule entries"


def check_pair_schedule(schedule: PairSchedule, where: str = "", prove: bool = True) -> None:
    """Check a :class:`passes.scheduling.schedule.PairSchedule` against its own DAG."""
    check_schedule(schedule.dag, entries_of(schedule), where, prove)
