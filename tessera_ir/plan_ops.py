"""Declared plan ops: one definition per plan op kind, read the same way by every reader.

Each kind the passes write (``candidate``, ``pair``, ``pair_schedule``, ``partition``,
``dbo_slot``, ``dbo_pool``, ``pipeline``, ``program``) has an :class:`OpDef`: its attributes
with their types, which are required (always, or for one value of another attribute), which
ones refer to other entities and of what kind, its entries' attributes, and a verifier of its
own for rules no single attribute states. :func:`op_problems` checks one op against its
definition; the verifier's ``plan-ops-declared`` check reports every problem of every op, and
the typed accessors (:class:`CandidateOp`, :class:`PairOp`, ...) refuse an op with the first
one, as a :class:`PlanOpError` whose text is the verifier's, line and column included. So a
malformed op is refused the same way whether a module is verified or a pass reads it with the
verifier off.

An op of a kind declared nowhere is kept and printed but not interpreted; attributes a
definition does not list are kept too (passes add figures of their own), and its declared
attributes are checked wherever they appear. ``docs/ir.md``'s op tables are generated from these
definitions (:func:`with_reference`; ``make plan-op-tables`` rewrites them in place).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Self

from tessera_ir.errors import VerifyError
from tessera_ir.model import Module, PlanEntry, PlanOp, SymbolRef, Value
from tessera_ir.printer import spell_value

# The verifier check that reports what the definitions refuse; accessors raise the same errors under it.
CHECK_NAME = "plan-ops-declared"


class PlanOpError(VerifyError):
    """A plan op its definition refuses, raised by an accessor: the text the verifier reports."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, source: str | None = None):
        self.detail = message
        super().__init__(CHECK_NAME, message, line, column, source)

    def __reduce__(self) -> tuple[type[PlanOpError], tuple[str, int | None, int | None, str | None]]:
        # Rebuilt from its parts (a worker process may raise it): Exception's default passes only the text.
        return PlanOpError, (self.detail, self.line, self.column, self.source)


# ---------------------------------------------------------------------------------- attribute types


def _is_int(v: object) -> bool:
    return type(v) is int


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0


def _is_number(v: object) -> bool:
    return (type(v) is int or type(v) is float) and math.isfinite(v)  # type: ignore[arg-type]


def _is_non_negative(v: object) -> bool:
    return _is_number(v) and v >= 0  # type: ignore[operator]


@dataclass(frozen=True)
class AttrType:
    """What values an attribute takes: ``spelled`` in the reference tables, ``rule`` in messages.

    ``refers_to`` (for references and lists of them): the kinds of entity a reference may name,
    ``layer``, ``task`` or a plan op kind; empty: any.
    """

    spelled: str
    rule: str
    accepts: Callable[[object], bool]
    refers_to: tuple[str, ...] = ()
    is_list: bool = False
    is_ref: bool = False


INT = AttrType("int", "an integer", _is_int)
COUNT = AttrType("int", "an integer >= 0", _is_count)
NUMBER = AttrType("number", "a finite number", _is_number)
TIME_US = AttrType("µs", "a non-negative number of µs", _is_non_negative)
BYTES = AttrType("bytes", "an integer number of bytes >= 0", _is_count)
STRING = AttrType("string", "a string", lambda v: type(v) is str)
BOOL = AttrType("bool", "true or false", lambda v: type(v) is bool)
TIMES_US = AttrType(
    "list of µs", "a list of non-negative numbers of µs", lambda v: isinstance(v, list) and all(_is_non_negative(x) for x in v)
)
COUNTS = AttrType("list of int", "a list of integers >= 0", lambda v: isinstance(v, list) and all(_is_count(x) for x in v))
STRINGS = AttrType("list of strings", "a list of strings", lambda v: isinstance(v, list) and all(type(x) is str for x in v))


def one_of(*words: str) -> AttrType:
    return AttrType(" / ".join(f"`{w}`" for w in words), f"one of {', '.join(repr(w) for w in words)}", lambda v: v in words)


def ref(*kinds: str) -> AttrType:
    """A reference to an entity of one of ``kinds``."""
    what = " or ".join(kinds)
    return AttrType(f"reference ({what})", f"a reference to a {what}, like @name", lambda v: isinstance(v, SymbolRef),
                    kinds, is_ref=True)


def refs(*kinds: str, non_empty: bool = False) -> AttrType:
    """A list of references to entities of one of ``kinds``."""
    what = " or ".join(kinds)
    rule = f"a {'non-empty ' if non_empty else ''}list of references to {what}s, like [@a, @b]"

    def accepts(v: object) -> bool:
        return isinstance(v, list) and (bool(v) or not non_empty) and all(isinstance(x, SymbolRef) for x in v)

    return AttrType(f"list of {what} references", rule, accepts, kinds, is_list=True, is_ref=True)


# ---------------------------------------------------------------------------------- definitions


@dataclass(frozen=True)
class Field:
    """One attribute of an op (or of its entries).

    ``required``: always present; ``required_when`` (attribute, value): present when that
    attribute of the op has that value.
    """

    name: str
    type: AttrType
    meaning: str
    required: bool = False
    required_when: tuple[str, str] | None = None
    written_by: str = ""

    def is_required(self, attrs: Mapping[str, Value]) -> bool:
        if self.required:
            return True
        return self.required_when is not None and attrs.get(self.required_when[0]) == self.required_when[1]


# An op's own rule: (op, kind of each entity name, or None) -> [(entry ref or None, message)].
OpVerifier = Callable[[PlanOp], list[tuple[str | None, str]]]


@dataclass(frozen=True)
class OpDef:
    """The definition of one plan op kind."""

    kind: str
    written_by: str
    summary: str
    attrs: tuple[Field, ...]
    entry: str = ""  # what an entry names (empty: the op has no entries)
    entry_attrs: tuple[Field, ...] = ()
    verify: OpVerifier | None = None
    # Entries are a sequence (a ref may repeat) rather than a table keyed by ref.
    sequence: bool = False

    def field(self, name: str) -> Field:
        for f in self.attrs:
            if f.name == name:
                return f
        raise KeyError(name)


def _pair_names_layers(op: PlanOp) -> list[tuple[str | None, str]]:
    if any(k in op.attrs for k in ("fwd", "bwd", "fwd_candidate", "bwd_candidate")):
        return []
    return [(None, "names no layers; a pair gives 'fwd_candidate' and 'bwd_candidate' (or hand-written 'fwd' and 'bwd' "
                   "layer lists)")]


def _program_instructions(op: PlanOp) -> list[tuple[str | None, str]]:
    return []  # instructions are read (and refused) by tessera_ir.programs, checked by program-instructions-legal


PROGRAM_SIDES = (
    Field("fwd", refs("layer"), "the program's forward layers (empty: a lone backward chunk)", written_by="dbo-slots"),
    Field("bwd", refs("layer"), "the program's backward layers (empty: a lone forward chunk)", written_by="dbo-slots"),
)
FACTOR = AttrType("factor", "a finite number", _is_number)
FRACTION = AttrType("fraction", "a finite number", _is_number)

CANDIDATE = OpDef(
    "candidate", "candidates",
    "a decoder layer range for one virtual stage, and the layers the stage would run",
    (
        Field("stage", COUNT, "virtual stage `s` (0 .. pp·vpp − 1); stage `s` runs on device `s mod pp` as its chunk "
              "`s // pp`", required=True, written_by="candidates"),
        Field("first", COUNT, "the first decoder layer of the range", required=True, written_by="candidates"),
        Field("last", COUNT, "the last decoder layer of the range (inclusive)", required=True, written_by="candidates"),
        Field("layers", refs("layer"), "the layers the stage runs: the range, plus the embedding on stage 0 and the head "
              "on the last stage", required=True, written_by="candidates"),
        Field("in_window", BOOL, "whether the range lies in the window around the serially balanced partition (the "
              "window search uses only these); absent: true", written_by="candidates"),
    ),
)

PAIR = OpDef(
    "pair", "candidates; costs from overlap-schedule and profile",
    "the forward of one chunk beside the backward of another, as a device runs them in the steady state",
    (
        Field("fwd_candidate", ref("candidate"), "the candidate whose layers run forward", written_by="candidates"),
        Field("bwd_candidate", ref("candidate"), "the candidate whose layers run backward", written_by="candidates"),
        Field("fwd", refs("layer"), "instead of `fwd_candidate` (hand-written pairs); when both are given they must agree",
              written_by="by hand"),
        Field("bwd", refs("layer"), "instead of `bwd_candidate` (hand-written pairs); when both are given they must agree",
              written_by="by hand"),
        Field("device", COUNT, "the first device where these chunks meet", written_by="candidates"),
        Field("schedule", ref("pair_schedule"), "the pair's schedule", written_by="overlap-schedule"),
        Field("makespan", TIME_US, "length of that schedule (isolated durations, no contention)",
              written_by="overlap-schedule"),
        Field("lower_bound", TIME_US, "no schedule of the pair is shorter: the busier stream, or the longest dependency "
              "chain", written_by="overlap-schedule"),
        Field("post_overlap_us", TIME_US, "**the pair's post-overlap cost**: what the two streams take together, overlap "
              "and contention included; what the partition minimises", written_by="profile"),
        Field("cost_source", STRING, "`analytic`, `measured` or `cache`", written_by="profile"),
        Field("serial_us", TIME_US, "sum of isolated durations (nothing overlaps)", written_by="profile"),
        Field("overlap_us", TIME_US, "the schedule re-timed without contention", written_by="profile"),
        Field("measured_us", TIME_US, "the measurement (= `post_overlap_us`)", written_by="profile (measured)"),
        Field("predicted_us", TIME_US, "the model's prediction for the executed work", written_by="profile (measured)"),
        Field("spread_us", TIME_US, "max − min over the repeats", written_by="profile (measured)"),
        Field("predicted_error", FRACTION, "signed relative error of the prediction", written_by="profile (measured)"),
        Field("profile_scale", FACTOR, "work scale of the executed pair", written_by="profile (measured)"),
        Field("profile_repeats", COUNT, "repeats measured", written_by="profile (measured)"),
        Field("raw_measured_us", TIME_US, "the repeats' statistic before scaling by the reference kernel",
              written_by="profile (measured on CPU, normalised)"),
        Field("speed_ratio", FACTOR, "the median of reference now / reference at calibration (above 1: the machine was "
              "slower than when calibrated)", written_by="profile (measured on CPU, normalised)"),
    ),
    verify=_pair_names_layers,
)

PAIR_SCHEDULE = OpDef(
    "pair_schedule", "overlap-schedule",
    "a schedule of a pair's DAG on the two streams, shared by the pairs with the same DAG",
    (
        Field("pairs", refs("pair", non_empty=True), "the pairs this schedule serves (identical DAGs up to names); "
              "entries name the first pair's tasks, the others match by position", required=True,
              written_by="overlap-schedule"),
        Field("method", STRING, "`gap-fit`, `serial`, `fixed-template` or `exact`; absent: `gap-fit`",
              written_by="overlap-schedule"),
        Field("status", STRING, "`exact` only: `optimal` (proven), `feasible` (a better schedule, not proven optimal "
              "within the limit) or `timeout` (nothing better than the heuristic's found)",
              written_by="overlap-schedule, refine-bottleneck"),
        Field("proven_bound", TIME_US, "`exact` only: the solver's proven lower bound (equal to the makespan, within the "
              "rounding of durations to nanoseconds, when `optimal`)",
              written_by="overlap-schedule, refine-bottleneck"),
        Field("makespan", TIME_US, "the schedule's length", written_by="overlap-schedule"),
        Field("lower_bound", TIME_US, "the DAG's lower bound", written_by="overlap-schedule"),
        Field("serial", TIME_US, "the sum of durations", written_by="overlap-schedule"),
        Field("bound_ratio", FACTOR, "makespan / lower bound (1.0: provably optimal)", written_by="overlap-schedule"),
        Field("tasks", COUNT, "tasks in the pair", written_by="overlap-schedule"),
        Field("verified", BOOL, "checked against dependencies, streams, durations and deadlines by overlap-schedule's "
              "`verify` (see \"What is proven when\" below); `false` only with `verify=false`. The same whether the "
              "schedule came from the cache or not, so plans are byte-identical with and without it",
              written_by="overlap-schedule"),
        Field("refined", STRING, "what CP-SAT proved for the schedule's DAG when it refined it: `optimal`, `feasible` "
              "or `timeout`", written_by="refine-bottleneck"),
    ),
    entry="task of the pair, in the pair DAG's order (forward side, then backward side)",
    entry_attrs=(
        Field("start", TIME_US, "start, from the start of the pair", required=True, written_by="overlap-schedule"),
        Field("duration", TIME_US, "the task's duration", required=True, written_by="overlap-schedule"),
        Field("stream", one_of("compute", "comm"), "the stream of the task's resource", required=True,
              written_by="overlap-schedule"),
        Field("order", COUNT, "position on its stream, from 0", written_by="overlap-schedule"),
    ),
)

PARTITION = OpDef(
    "partition", "partition; refine-bottleneck replaces it",
    "the chosen candidate of every virtual stage",
    (
        Field("stages", refs("candidate"), "the chosen candidate of every virtual stage", required=True,
              written_by="partition"),
        Field("layers_per_stage", COUNTS, "decoder layers per stage", written_by="partition"),
        Field("bottleneck_us", TIME_US, "the worst post-overlap cost of a pair that meets on a device under this "
              "partition", written_by="partition"),
        Field("total_us", TIME_US, "the sum over all devices' meeting pairs", written_by="partition"),
        Field("window_bottleneck_us", TIME_US, "the window optimum", written_by="partition"),
        Field("global_bottleneck_us", TIME_US, "the global optimum (`search=global`)", written_by="partition"),
        Field("balanced_bottleneck_us", TIME_US, "the serially balanced partition's bottleneck", written_by="partition"),
        Field("megatron_layout", STRING, "Megatron-LM `--pipeline-model-parallel-layout` of the chosen partition",
              written_by="partition"),
        Field("balanced_megatron_layout", STRING, "the same for the balanced partition", written_by="partition"),
        Field("search", one_of("window", "global"), "how the partition was searched", written_by="partition"),
        Field("solver", one_of("cbc", "highs"), "the MILP solver", written_by="partition"),
        Field("cost_sources", STRINGS, "where pair costs came from: `post_overlap_us`, `makespan`, `serial` (sum of "
              "durations, for pairs without either)", written_by="partition"),
        Field("milp_variables_before", COUNT, "MILP variables before pruning", written_by="partition"),
        Field("milp_variables_after", COUNT, "MILP variables after pruning", written_by="partition"),
        Field("milp_constraints_before", COUNT, "MILP constraints before pruning", written_by="partition"),
        Field("milp_constraints_after", COUNT, "MILP constraints after pruning", written_by="partition"),
        Field("memory_capacity_bytes", BYTES, "device capacity", written_by="partition"),
        Field("memory_peak_bytes", COUNTS, "each device's peak under the partition (bytes)", written_by="partition"),
        Field("refined_from_us", TIME_US, "the bottleneck before refinement; `refined_from_us − bottleneck_us` is how "
              "much it moved", written_by="refine-bottleneck"),
        Field("refined_pairs", COUNT, "schedules refined", written_by="refine-bottleneck"),
        Field("refined_proven", COUNT, "refined schedules CP-SAT proved optimal", written_by="refine-bottleneck"),
        Field("refined_rounds", COUNT, "refine-and-repartition rounds run", written_by="refine-bottleneck"),
    ),
)

DBO_SLOT = OpDef(
    "dbo_slot", "dbo-slots",
    "where a program's compute stream may wait for an All-to-All (`kind = a2a_wait`, one per program, with "
    "entries), or a device's predicted waits (`kind = recv_wait`, one per device, no entries)",
    (
        Field("kind", one_of("a2a_wait", "recv_wait"), "per program with entries, or per device without", required=True,
              written_by="dbo-slots"),
        *PROGRAM_SIDES,
        Field("schedule", ref("pair_schedule"), "the `pair_schedule` the program follows (absent: scheduled by the "
              "simulator with the plan's method)", written_by="dbo-slots"),
        Field("device", COUNT, "the pipeline device", required_when=("kind", "recv_wait"), written_by="dbo-slots"),
        Field("predicted_us", TIMES_US, "the device's compute wait before each of its steps in a simulated iteration of "
              "the static plan under balanced routing", required_when=("kind", "recv_wait"), written_by="dbo-slots"),
        Field("tail_us", TIME_US, "the device's idle after its last step and gradient reduction until the iteration "
              "ends (0 when absent): where weight gradients due at its last step can run (the DBO's admission counts it)",
              written_by="dbo-slots"),
        Field("memory_budget_bytes", BYTES, "what the device's pool of deferred work may hold: by default its headroom, "
              "device memory less the static plan's peak on it less the run-wide `dbo_memory_margin` (share of device "
              "memory, 0.05 by default); the run-wide `dbo_memory_budget` set to a share gives that share instead, within "
              "what the static plan leaves free", required_when=("kind", "recv_wait"), written_by="dbo-slots"),
    ),
    entry="compute task that depends on an All-to-All",
    entry_attrs=(
        Field("waits_on", ref("task"), "that All-to-All (a comm task the entry depends on)", required=True,
              written_by="dbo-slots"),
        Field("base_us", TIME_US, "the wait the static plan predicts under balanced routing (its post-overlap timeline)",
              required=True, written_by="dbo-slots"),
        Field("a2a_us", TIME_US, "the All-to-All's transfer time (duration less latency) the wait depends on",
              required=True, written_by="dbo-slots"),
        Field("gemm_us", TIME_US, "the expert GEMM whose output it carries; the policy predicts "
              "`base + (a2a + gemm)·(imbalance − 1)`", required=True, written_by="dbo-slots"),
    ),
)

DBO_POOL = OpDef(
    "dbo_pool", "dbo-slots",
    "the weight gradients of a program worth deferring",
    PROGRAM_SIDES,
    entry="movable task on the program's critical path (removing it shortens the step)",
    entry_attrs=(
        Field("duration_us", TIME_US, "its post-overlap duration in the program", required=True, written_by="dbo-slots"),
        Field("memory_bytes", BYTES, "what deferring it keeps alive: its forward task's saved inputs and its output "
              "gradient", required=True, written_by="dbo-slots"),
        Field("deadline_rule", one_of("grad_reduce"), "it must run by the end of its chunk's last backward step, before "
              "the chunk's gradients are reduced", required=True, written_by="dbo-slots"),
    ),
)

PIPELINE = OpDef(
    "pipeline", "pipeline",
    "what the runtime needs of every task, and the per-rank programs",
    (
        Field("programs", refs("program"), "the per-rank programs", required=True, written_by="pipeline"),
        Field("order", STRING, "`1f1b` at vpp = 1, else `interleaved-1f1b`", written_by="pipeline"),
        Field("combined", BOOL, "Megatron-Core's combined-1F1B variant (see below)", written_by="pipeline"),
        Field("dbo", BOOL, "the programs hold DBO slots", written_by="pipeline"),
        Field("memory_budget_bytes", BYTES, "bytes the DBO pool may keep alive: the smallest device's budget from "
              "`dbo-slots`, 0 without it", written_by="pipeline"),
    ),
    entry="task",
    entry_attrs=(
        Field("duration_us", TIME_US, "isolated duration on the target: what DBO fits into slots and what a trainer "
              "compares its timings with", required=True, written_by="pipeline"),
        Field("memory_bytes", BYTES, "for a weight gradient: what deferring it keeps alive (its forward's saved "
              "activations and its output gradient)", written_by="pipeline"),
    ),
)

PROGRAM = OpDef(
    "program", "pipeline",
    "the instructions one pipeline rank issues, in order",
    (
        Field("rank", COUNT, "the pipeline rank", required=True, written_by="pipeline"),
        Field("ep_rank", COUNT, "the EP rank, for a program of one EP rank, which hand-written IR may give and the "
              "verifier then checks against its group (absent: shared by the rank's EP ranks)", written_by="by hand"),
    ),
    entry="instruction (its operands by `op`: the table below, read by `tessera_ir/programs.py`)",
    verify=_program_instructions,
    sequence=True,
)

OP_DEFS: dict[str, OpDef] = {d.kind: d for d in (CANDIDATE, PAIR, PAIR_SCHEDULE, PARTITION, DBO_SLOT, DBO_POOL, PIPELINE, PROGRAM)}


# ---------------------------------------------------------------------------------- checking


# The kind of the entity a name refers to: "layer", "task" or a plan op kind; None: no entity.
EntityKind = Callable[[str], "str | None"]


def entity_kinds(module: Module) -> EntityKind:
    """What each name of ``module`` is (the first entity of a repeated name, as readers resolve it)."""
    kinds: dict[str, str] = {}
    for op in module.plan:
        kinds.setdefault(op.name, op.op)
    for layer in module.layers:
        kinds[layer.name] = "layer"
        for task in layer.tasks:
            kinds[task.name] = "task"
    return kinds.get


@dataclass(frozen=True)
class Problem:
    """What a definition refuses of ``op``: ``detail`` (what is wrong), ``entry`` (None: the op's header)."""

    op: PlanOp
    detail: str
    entry: str | None = None

    @property
    def message(self) -> str:
        """The whole message, naming the op (and the entry)."""
        return f"{_owner(self.op, self.entry)} {self.detail}"


def _owner(op: PlanOp, entry: str | None) -> str:
    head = f"plan {op.op} '@{op.name}'"
    return head if entry is None else f"entry '@{entry}' of {head}"


def _field_problems(
    fields: tuple[Field, ...], attrs: Mapping[str, Value], op: PlanOp, entry: str | None, kind_of: EntityKind | None,
    op_attrs: Mapping[str, Value],
) -> Iterable[Problem]:
    for f in fields:
        value = attrs.get(f.name)
        if value is None:
            if f.is_required(op_attrs):
                when = f" (when {f.required_when[0]} = {f.required_when[1]!r})" if f.required_when else ""
                yield Problem(op, f"has no '{f.name}'{when}; it needs {f.type.rule}: {f.meaning}", entry)
            continue
        if not f.type.accepts(value):
            yield Problem(op, f"has {f.name} = {spell_value(value)}; it must be {f.type.rule}", entry)
            continue
        if f.type.is_ref and f.type.refers_to and kind_of is not None:
            for r in value if isinstance(value, list) else [value]:
                assert isinstance(r, SymbolRef)
                found = kind_of(r.name)
                if found not in f.type.refers_to:
                    what = "names nothing" if found is None else f"is a {found}"
                    yield Problem(
                        op, f"has '{f.name}' naming '@{r.name}', which {what}; it must name a {' or '.join(f.type.refers_to)}",
                        entry,
                    )
                    break


def op_problems(op: PlanOp, kind_of: EntityKind | None = None, entries: bool = True) -> list[Problem]:
    """Everything ``op``'s definition refuses (nothing for an undeclared kind). ``kind_of`` resolves
    references (None: their targets are not checked); ``entries`` False: the header only."""
    definition = OP_DEFS.get(op.op)
    if definition is None:
        return []
    found = list(_field_problems(definition.attrs, op.attrs, op, None, kind_of, op.attrs))
    if definition.verify is not None:
        found.extend(Problem(op, m, e) for e, m in definition.verify(op))
    if entries and op.entries:
        if not definition.entry:
            found.append(Problem(op, "takes no entries"))
        elif definition.entry_attrs:
            for e in op.entries:
                found.extend(_field_problems(definition.entry_attrs, e.attrs, op, e.ref, kind_of, op.attrs))
    return found


def location_key(problem: Problem) -> str:
    """Where a problem points in the text: the op's line, or its entry's."""
    name = problem.op.name
    return f"plan:{name}" if problem.entry is None else f"entry:{name}:{problem.entry}"


def error_of(module: Module, problem: Problem) -> PlanOpError:
    """The error for ``problem``, placed at its line and column when ``module`` came from text."""
    where = module.locations.get(location_key(problem)) or module.locations.get(f"plan:{problem.op.name}")
    line, column = where if where is not None else (None, None)
    return PlanOpError(problem.message, line, column, module.source)


def require(module: Module, op: PlanOp, kind_of: EntityKind | None = None, entries: bool = False) -> None:
    """Raise the first problem of ``op`` (a :class:`PlanOpError`, as the verifier reports it)."""
    problems = op_problems(op, kind_of, entries)
    if problems:
        raise error_of(module, problems[0])


# ---------------------------------------------------------------------------------- accessors


class DeclaredOp:
    """A plan op read through its definition: ``read`` refuses an op its definition refuses, and the
    typed properties then return values of the declared types."""

    DEF: OpDef

    def __init__(self, op: PlanOp):
        self.op = op

    @classmethod
    def read(cls, module: Module, op: PlanOp, kind_of: EntityKind | None = None, entries: bool = False) -> Self:
        """``op`` as this kind; a :class:`PlanOpError` names the op, its line and what its declaration refuses
        (``entries``: its entries' attributes too)."""
        if op.op != cls.DEF.kind:
            raise PlanOpError(f"plan op '@{op.name}' is a '{op.op}', not a {cls.DEF.kind}")
        require(module, op, kind_of, entries)
        return cls(op)

    @property
    def name(self) -> str:
        return self.op.name

    def _int(self, key: str) -> int | None:
        value = self.op.attrs.get(key)
        return value if type(value) is int else None

    def _required_int(self, key: str) -> int:
        # A required attribute ``read`` has checked; 0 only for an op built without it.
        value = self.op.attrs.get(key)
        return value if type(value) is int else 0

    def _number(self, key: str) -> float | None:
        value = self.op.attrs.get(key)
        return float(value) if type(value) is int or type(value) is float else None

    def _ref(self, key: str) -> str | None:
        value = self.op.attrs.get(key)
        return value.name if isinstance(value, SymbolRef) else None

    def _refs(self, key: str) -> list[str] | None:
        value = self.op.attrs.get(key)
        if not isinstance(value, list):
            return None
        return [v.name for v in value if isinstance(v, SymbolRef)]

    def _str(self, key: str) -> str | None:
        value = self.op.attrs.get(key)
        return value if type(value) is str else None


class CandidateOp(DeclaredOp):
    DEF = CANDIDATE

    @property
    def stage(self) -> int:
        return self._required_int("stage")

    @property
    def first(self) -> int:
        return self._required_int("first")

    @property
    def last(self) -> int:
        return self._required_int("last")

    @property
    def layers(self) -> list[str]:
        return self._refs("layers") or []

    @property
    def in_window(self) -> bool:
        return self.op.attrs.get("in_window", True) is True


class PairOp(DeclaredOp):
    DEF = PAIR

    def candidate(self, side: str) -> str | None:
        """The candidate ``fwd_candidate`` / ``bwd_candidate`` names (``side``: ``fwd`` or ``bwd``)."""
        return self._ref(f"{side}_candidate")

    def layers(self, side: str) -> list[str] | None:
        """The hand-written ``fwd`` / ``bwd`` layer list, if given."""
        return self._refs(side)

    @property
    def schedule(self) -> str | None:
        return self._ref("schedule")

    @property
    def device(self) -> int | None:
        return self._int("device")

    @property
    def post_overlap_us(self) -> float | None:
        return self._number("post_overlap_us")

    @property
    def makespan(self) -> float | None:
        return self._number("makespan")


class PairScheduleOp(DeclaredOp):
    DEF = PAIR_SCHEDULE

    @property
    def pairs(self) -> list[str]:
        return self._refs("pairs") or []

    @property
    def method(self) -> str:
        return self._str("method") or "gap-fit"

    @property
    def status(self) -> str:
        return self._str("status") or ""


@dataclass(frozen=True)
class ScheduleEntry:
    """An entry of a ``pair_schedule``: its task's start and duration (µs), stream and position on it
    (the schedule check reads the same entries, built from a schedule, without a position)."""

    task: str
    start: float
    duration: float
    stream: str
    order: int | None = None


def schedule_entry(entry: PlanEntry) -> ScheduleEntry:
    """An entry of a ``pair_schedule`` op that ``read(..., entries=True)`` accepted."""
    a = entry.attrs
    stream, order = a.get("stream"), a.get("order")
    return ScheduleEntry(entry.ref, _float(a.get("start")), _float(a.get("duration")), stream if type(stream) is str else "",
                         order if type(order) is int else None)


class PartitionOp(DeclaredOp):
    DEF = PARTITION

    @property
    def stages(self) -> list[str]:
        return self._refs("stages") or []


class _ProgramLayersOp(DeclaredOp):
    """A DBO op named by its program's forward and backward layers."""

    @property
    def fwd(self) -> tuple[str, ...]:
        return tuple(self._refs("fwd") or ())

    @property
    def bwd(self) -> tuple[str, ...]:
        return tuple(self._refs("bwd") or ())


class DboSlotOp(_ProgramLayersOp):
    DEF = DBO_SLOT

    @property
    def kind(self) -> str:
        return self._str("kind") or ""

    @property
    def device(self) -> int | None:
        return self._int("device")

    @property
    def memory_budget_bytes(self) -> int | None:
        return self._int("memory_budget_bytes")

    @property
    def predicted_us(self) -> list[float]:
        value = self.op.attrs.get("predicted_us")
        return [float(v) for v in value if type(v) is int or type(v) is float] if isinstance(value, list) else []

    @property
    def tail_us(self) -> float:
        return self._number("tail_us") or 0.0


@dataclass(frozen=True)
class SlotEntry:
    """An ``a2a_wait`` entry of a ``dbo_slot``: the task, the All-to-All it waits on, its figures (µs)."""

    task: str
    waits_on: str
    base_us: float
    a2a_us: float
    gemm_us: float


def slot_entry(entry: PlanEntry) -> SlotEntry:
    """An entry of a ``dbo_slot`` op that ``read(..., entries=True)`` accepted."""
    a = entry.attrs
    waits_on = a.get("waits_on")
    return SlotEntry(entry.ref, waits_on.name if isinstance(waits_on, SymbolRef) else "", _float(a.get("base_us")),
                     _float(a.get("a2a_us")), _float(a.get("gemm_us")))


def _float(value: Value | None) -> float:
    return float(value) if type(value) is int or type(value) is float else 0.0


def pool_memory_bytes(entry: PlanEntry) -> int:
    """``memory_bytes`` of an entry of a ``dbo_pool`` op that ``read(..., entries=True)`` accepted."""
    value = entry.attrs.get("memory_bytes")
    return value if type(value) is int else 0


class DboPoolOp(_ProgramLayersOp):
    DEF = DBO_POOL


class PipelineOp(DeclaredOp):
    DEF = PIPELINE

    @property
    def programs(self) -> list[str]:
        return self._refs("programs") or []


class ProgramOp(DeclaredOp):
    DEF = PROGRAM

    @property
    def rank(self) -> int:
        return self._required_int("rank")

    @property
    def ep_rank(self) -> int | None:
        return self._int("ep_rank")


# ---------------------------------------------------------------------------------- reference tables


def _field_row(f: Field) -> str:
    if f.required:
        need = "yes"
    elif f.required_when is not None:
        need = f"when `{f.required_when[0]} = {f.required_when[1]}`"
    else:
        need = ""
    return "| " + " | ".join([f"`{f.name}`", f.type.spelled, need, f.written_by, f.meaning]) + " |"


def op_reference(definition: OpDef) -> str:
    """The Markdown reference table of one op kind: its attributes, then its entries' attributes."""
    head = ["| attribute | type | required | written by | meaning |", "|---|---|---|---|---|"]
    lines = [*head, *(_field_row(f) for f in definition.attrs)]
    if definition.entry:
        repeat = " (a sequence: one entity may have several)" if definition.sequence else ""
        lines += ["", f"Entries: one per {definition.entry}{repeat}."]
        if definition.entry_attrs:
            lines += ["", *head, *(_field_row(f) for f in definition.entry_attrs)]
    return "\n".join(lines)


def begin_mark(kind: str) -> str:
    return f"<!-- the table of plan {kind}: generated from tessera_ir/plan_ops.py (make plan-op-tables) -->"


END_MARK = "<!-- end of generated table -->"


def with_reference(doc: str) -> str:
    """``doc`` with each op kind's table, between its marks, regenerated by :func:`op_reference`."""
    for kind, definition in OP_DEFS.items():
        start = doc.find(begin_mark(kind))
        end = doc.find(END_MARK, start)
        if start < 0 or end < 0:
            raise ValueError(f"the document has no '{begin_mark(kind)}' ... '{END_MARK}' section for plan {kind}")
        doc = doc[: start] + begin_mark(kind) + "\n" + op_reference(definition) + "\n" + doc[end:]
    return doc


def regenerate(path: str = "docs/ir.md") -> None:
    """Rewrite the op tables of the document at ``path`` from the definitions (``make plan-op-tables``)."""
    with open(path, encoding="utf-8") as f:
        doc = f.read()
    with open(path, "w", encoding="utf-8") as f:
        f.write(with_reference(doc))
