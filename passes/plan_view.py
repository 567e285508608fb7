"""One view of the plan: how every pass, the report and viz read candidates, pairs, schedules and costs.

The IR holds the plan as ops that refer to each other (``docs/ir.md``)::

    plan candidate @cand.s1.c0 {first = 2, in_window = true, last = 3, layers = [@l2, @l3], stage = 1}
    plan pair @pair.4 {bwd_candidate = @cand.s1.c0, device = 1, fwd_candidate = @cand.s3.c2,
                       schedule = @sched.2, post_overlap_us = 812.5, ...}
    plan pair_schedule @sched.2 {pairs = [@pair.4, ...], ...} { @l6.attention.fwd {start = 0.0, ...} ... }
    plan partition @partition {stages = [@cand.s0.c1, @cand.s1.c0, ...], ...}

Each op is read through its declaration (``tessera_ir/plan_ops.py``), so an op the verifier's
``plan-ops-declared`` check refuses is refused here with the same error, line and column, whether
or not the module was verified. ``PlanView(module)`` follows the references: a pair's forward and backward layers come
from its ``fwd_candidate`` / ``bwd_candidate`` (a hand-written pair may list ``fwd`` / ``bwd``
layers instead), its schedule from ``schedule``, the chosen candidates from the partition's
``stages``. On top it gives what readers of a plan need: the target ``Hardware`` and
``ParallelConfig``, a task's isolated duration (``costs.durations.task_duration_us``, cached),
a pair's DAG and its stream order, and which pairs meet on each device under the chosen
partition (``pipelining.order``).

A pair stands for its layers: the candidates pass emits one pair per distinct (forward
layers, backward layers), naming the first candidates that hold them, so a candidate of
another stage holding the same layers (same *chunk*) shares that pair (``pair_for``).

A view reads the module as it is when built and caches what it derives (sides of pair
DAGs, durations); a pass may write attributes of the ops it reads through it, but builds a
new view to read plan ops it added or removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from passes.costs.durations import analytic_duration_us, task_duration_us, task_utilisation
from passes.costs.hardware import DEFAULT_HARDWARE, Hardware, load_hardware
from passes.costs.pair_costs import ScheduledTask
from passes.partitioning.candidate_table import CandidateTable
from passes.partitioning.ranges import Range
from passes.partitioning.stages import stage_layers
from passes.pipelining.order import meeting_stages
from passes.scheduling.pair_dag import BWD, FWD, PairDAG, PairTask, join_sides, side_tasks
from passes.scheduling.schedule import RESOURCES, PairSchedule
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Phase
from tessera_ir.model import Layer, Module, PlanEntry, PlanOp, SymbolRef, Task, Value
from tessera_ir.parallel import ParallelConfig
from tessera_ir.plan_ops import (
    CandidateOp,
    PairOp,
    PairScheduleOp,
    PartitionOp,
    ScheduleEntry,
    entity_kinds,
    schedule_entry,
)

ChunkKey = tuple[str, ...]  # the layer names a candidate (or a pair side) holds
# What a schedule depends on in a pair side, task by task: everything but the task names.
SideSignature = tuple[tuple[str, str, float, tuple[int, ...], bool, float | None, str], ...]


class PlanError(TesseraError):
    """A plan the view cannot read as a whole (a stage outside the pipeline, a schedule that does not fit
    its pair). An op its declaration refuses raises ``tessera_ir.plan_ops.PlanOpError`` instead, the
    verifier's error for it."""


@dataclass(frozen=True, eq=False)
class Candidate:
    """A ``candidate`` op: decoder range ``(first, last)`` for virtual stage ``stage``, and its layers."""

    op: PlanOp
    stage: int
    range: Range
    layers: tuple[Layer, ...]
    in_window: bool

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def chunk(self) -> ChunkKey:
        return tuple(layer.name for layer in self.layers)


@dataclass(frozen=True, eq=False)
class Pair:
    """A ``pair`` op: the forward of ``fwd_layers`` beside the backward of ``bwd_layers``."""

    op: PlanOp
    fwd_layers: tuple[Layer, ...]
    bwd_layers: tuple[Layer, ...]
    fwd_candidate: Candidate | None
    bwd_candidate: Candidate | None
    schedule: PlanOp | None  # the pair_schedule op its ``schedule`` attribute names

    @property
    def name(self) -> str:
        return self.op.name

    @property
    def chunks(self) -> tuple[ChunkKey, ChunkKey]:
        return tuple(x.name for x in self.fwd_layers), tuple(x.name for x in self.bwd_layers)

    @property
    def device(self) -> int | None:
        return PairOp(self.op).device

    @property
    def post_overlap_us(self) -> float | None:
        """The pair's post-overlap cost from ``profile`` (µs), if profiled."""
        return PairOp(self.op).post_overlap_us

    @property
    def makespan(self) -> float | None:
        """The makespan of the pair's schedule from ``overlap-schedule`` (µs), if scheduled."""
        return PairOp(self.op).makespan

    def cost(self) -> tuple[float, str] | None:
        """(µs, attribute it came from): the post-overlap cost, else the schedule's makespan."""
        for attr, value in (("post_overlap_us", self.post_overlap_us), ("makespan", self.makespan)):
            if value is not None:
                return value, attr
        return None


@dataclass(frozen=True)
class Partition:
    """The ``partition`` op: one chosen candidate per virtual stage."""

    op: PlanOp
    stages: tuple[Candidate, ...]

    @property
    def ranges(self) -> list[Range]:
        return [c.range for c in self.stages]


@dataclass(frozen=True)
class Meeting:
    """On ``device``, the forward of stage ``fwd_stage`` beside the backward of ``bwd_stage``
    under the chosen partition, and the pair op that schedules and costs it (None: none)."""

    device: int
    fwd_stage: int
    bwd_stage: int
    fwd: Candidate
    bwd: Candidate
    pair: Pair | None


@dataclass
class _SideCache:
    """Each distinct pair side (a direction and a list of layers) built once; equal signatures share an id."""

    sides: dict[tuple[str, ChunkKey], list[PairTask]] = field(default_factory=dict)
    ids: dict[int, int] = field(default_factory=dict)  # id(side list) -> signature id
    signatures: dict[SideSignature, int] = field(default_factory=dict)
    shifted: dict[tuple[ChunkKey, int], list[PairTask]] = field(default_factory=dict)


def side_signature(tasks: Sequence[PairTask]) -> SideSignature:
    """Everything about a side's tasks a schedule depends on, except their names."""
    return tuple((t.kind, t.resource.value, t.duration, t.deps, t.movable, t.deadline, t.side) for t in tasks)


class PlanView:
    """Read the plan of ``module`` (see the module docstring).

    ``device`` and ``parallel`` time the plan on other hardware than the module's target
    (measured profiling prices executed work on the measured device): durations are then
    analytic on ``device``, since a task's given ``duration_us`` is a target figure.
    """

    def __init__(self, module: Module, device: Hardware | None = None, parallel: ParallelConfig | None = None):
        self.module = module
        self.parallel = parallel or ParallelConfig.from_attrs(module.attrs)
        self._device = device
        self.layers = {layer.name: layer for layer in module.layers}
        self.tasks = module.task_map()
        self.ops: dict[str, PlanOp] = {}
        for op in module.plan:
            self.ops.setdefault(op.name, op)  # the first of a repeated name, as a scan would find
        # Plan ops are read through their declarations (tessera_ir/plan_ops.py), which resolve references by this.
        self._kind_of = entity_kinds(module)
        self._durations: dict[str, float] = {}
        self._utilisation: dict[str, tuple[float, float]] = {}
        self._sides = _SideCache()
        self._pairs: dict[str, Pair] = {}
        self._positions: dict[tuple[str, int, int], list[int]] = {}
        self._entries: dict[str, dict[str, PlanEntry]] = {}
        self._chunk_schedules: dict[tuple[ChunkKey, ChunkKey], tuple[list[ScheduledTask], str]] = {}

    # ------------------------------------------------------------------ target and durations

    @property
    def hardware_name(self) -> str:
        """The name (or path) of the hardware the plan's figures are for."""
        if self._device is not None:
            return self._device.name
        value = self.module.attrs.get("hardware", DEFAULT_HARDWARE)
        if not isinstance(value, str) or not value:
            raise PlanError(
                f"module @{self.module.name} has hardware = {value!r}; it must name a hardware description, "
                'e.g. hardware = "h100"'
            )
        return value

    @cached_property
    def hardware(self) -> Hardware:
        return self._device if self._device is not None else load_hardware(self.hardware_name)

    def duration(self, task: Task) -> float:
        """Isolated duration (µs) of ``task``: ``task_duration_us`` on the target, cached per task."""
        own = self.tasks.get(task.name) is task
        got = self._durations.get(task.name) if own else None
        if got is None:
            if self._device is not None:
                got = analytic_duration_us(task, self.hardware, self.parallel)
            else:
                got = task_duration_us(task, self.hardware, self.parallel)
            if own:
                self._durations[task.name] = got
        return got

    def utilisation(self, task: Task) -> tuple[float, float]:
        """(SM, memory) utilisation of ``task`` alone (``task_utilisation``), cached per task."""
        own = self.tasks.get(task.name) is task
        got = self._utilisation.get(task.name) if own else None
        if got is None:
            got = task_utilisation(task, self.hardware, self.parallel)
            if own:
                self._utilisation[task.name] = got
        return got

    def serial_us(self, fwd_layers: Sequence[Layer], bwd_layers: Sequence[Layer]) -> float:
        """What a pair costs when nothing overlaps: forward tasks of one side plus backward tasks of the other."""
        return sum(self.duration(t) for layer in fwd_layers for t in layer.tasks if t.phase is Phase.FWD) + sum(
            self.duration(t) for layer in bwd_layers for t in layer.tasks if t.phase is not Phase.FWD
        )

    def stage_layers(self, stage: int, rng: Range) -> list[Layer]:
        return stage_layers(self.module, stage, self.parallel.virtual_stages, rng)

    # ------------------------------------------------------------------ candidates

    @cached_property
    def candidates(self) -> list[Candidate]:
        """Every ``candidate`` op, in plan order."""
        return [self._candidate(op) for op in self.module.plan if op.op == "candidate"]

    @cached_property
    def _candidate_by_name(self) -> dict[str, Candidate]:
        return {c.name: c for c in reversed(self.candidates)}  # the first of a repeated name wins

    def candidate(self, ref: Value | None, where: str = "a candidate reference") -> Candidate:
        """The candidate an attribute refers to; ``where`` names the attribute for the error."""
        if not isinstance(ref, SymbolRef):
            raise PlanError(f"{where} must refer to a candidate op, like @cand.s0.c0; got {ref!r}")
        found = self._candidate_by_name.get(ref.name)
        if found is None:
            raise PlanError(f"{where} refers to @{ref.name}, which is no candidate op of module @{self.module.name}")
        return found

    def _candidate(self, op: PlanOp) -> Candidate:
        cand = CandidateOp.read(self.module, op, self._kind_of)
        stages, n = self.parallel.virtual_stages, len(self.module.decoder_layers())
        stage, first, last = cand.stage, cand.first, cand.last
        if not stage < stages:
            raise PlanError(f"candidate @{op.name} has stage {stage!r}; expected 0..{stages - 1} (pp x vpp stages)")
        if not first <= last < n:
            raise PlanError(f"candidate @{op.name} has range {first!r}..{last!r}, outside decoder layers 0..{n - 1}")
        return Candidate(op, stage, (first, last), self._layer_list(cand.layers), cand.in_window)

    def _layer_list(self, names: list[str]) -> tuple[Layer, ...]:
        # The declaration has checked that each name is a layer's.
        return tuple(self.layers[name] for name in names)

    # ------------------------------------------------------------------ pairs

    @cached_property
    def pairs(self) -> list[Pair]:
        """Every ``pair`` op, in plan order, with its sides and schedule resolved."""
        return [self.pair(op.name) for op in self.module.plan if op.op == "pair"]

    def pair(self, name: str) -> Pair:
        """The pair op ``name``, resolved on first use (so an error names the first bad pair read)."""
        got = self._pairs.get(name)
        if got is None:
            op = self.ops.get(name)
            if op is None or op.op != "pair":
                raise PlanError(f"module @{self.module.name} has no pair op @{name}")
            got = self._pairs[name] = self._pair(op)
        return got

    @cached_property
    def _pair_by_chunks(self) -> dict[tuple[ChunkKey, ChunkKey], Pair]:
        index: dict[tuple[ChunkKey, ChunkKey], Pair] = {}
        for p in self.pairs:
            index.setdefault(p.chunks, p)
        return index

    def pair_for(self, fwd: Sequence[Layer] | Candidate, bwd: Sequence[Layer] | Candidate) -> Pair | None:
        """The pair op that runs the forward of ``fwd`` beside the backward of ``bwd`` (None: none)."""

        def key(side: Sequence[Layer] | Candidate) -> ChunkKey:
            return side.chunk if isinstance(side, Candidate) else tuple(x.name for x in side)

        return self._pair_by_chunks.get((key(fwd), key(bwd)))

    def _pair(self, op: PlanOp) -> Pair:
        pair = PairOp.read(self.module, op, self._kind_of)
        sides: dict[str, tuple[tuple[Layer, ...], Candidate | None]] = {}
        for side in (FWD, BWD):
            ref_key = f"{side}_candidate"
            cand_name = pair.candidate(side)
            cand = self.candidate(SymbolRef(cand_name), f"pair @{op.name}: '{ref_key}'") if cand_name is not None else None
            names = pair.layers(side)
            listed = self._layer_list(names) if names is not None else None
            if cand is not None and listed is not None and listed != cand.layers:
                raise PlanError(
                    f"pair @{op.name}: '{side}' lists {[x.name for x in listed]} but '{ref_key}' @{cand.name} holds "
                    f"{list(cand.chunk)}; give one of them"
                )
            sides[side] = (cand.layers if cand is not None else listed or (), cand)
        schedule = self.ops[pair.schedule] if pair.schedule is not None else None  # declared: a pair_schedule's name
        return Pair(op, sides[FWD][0], sides[BWD][0], sides[FWD][1], sides[BWD][1], schedule)

    # ------------------------------------------------------------------ pair DAGs

    def _side(self, layers: Sequence[Layer], side: str, pair_name: str) -> list[PairTask]:
        key = (side, tuple(x.name for x in layers))
        tasks = self._sides.sides.get(key)
        if tasks is None:
            tasks = self._sides.sides[key] = side_tasks(layers, side, self.duration, pair_name)
        return tasks

    def side_id(self, tasks: list[PairTask]) -> int:
        """An id per distinct side signature (``side_signature``) among the sides this view built."""
        got = self._sides.ids.get(id(tasks))
        if got is None:
            signatures = self._sides.signatures
            got = self._sides.ids[id(tasks)] = signatures.setdefault(side_signature(tasks), len(signatures))
        return got

    def pair_sides(self, pair: Pair) -> tuple[list[PairTask], list[PairTask]]:
        """The forward and backward side of the pair's DAG, each in its own numbering (shared, do not edit)."""
        return self._side(pair.fwd_layers, FWD, pair.name), self._side(pair.bwd_layers, BWD, pair.name)

    def pair_dag(self, pair: Pair) -> PairDAG:
        """The pair's DAG with isolated durations (``scheduling.pair_dag``); sides are built once per view."""
        fwd, bwd = self.pair_sides(pair)
        # The backward side shifted past the forward one, kept per (side, shift): the
        # same backward chunk meets forward chunks of only a few lengths.
        key = (tuple(x.name for x in pair.bwd_layers), len(fwd))
        shifted = self._sides.shifted.get(key)
        if shifted is None:
            shifted = self._sides.shifted[key] = join_sides(fwd, bwd).tasks[len(fwd) :]
        return PairDAG(pair.name, fwd + shifted)

    # ------------------------------------------------------------------ schedules

    def _first_pair(self, sched: PlanOp) -> Pair:
        return self.pair(PairScheduleOp.read(self.module, sched, self._kind_of).pairs[0])

    def schedule_op(self, name: str) -> PlanOp:
        """The pair_schedule op ``name`` names: a pair_schedule itself, or a pair's schedule."""
        op = self.ops.get(name)
        if op is None:
            known = ", ".join(sorted(o.name for o in self.module.plan if o.op in ("pair", "pair_schedule"))) or "none"
            raise PlanError(f"module @{self.module.name} has no plan op @{name}; pairs and schedules: {known}")
        if op.op == "pair_schedule":
            return op
        if op.op != "pair":
            raise PlanError(f"plan op @{name} is a '{op.op}', not a pair or a pair_schedule")
        sched = self.pair(name).schedule
        if sched is None:
            raise PlanError(f"pair @{name} has no schedule; run the overlap-schedule pass first")
        return sched

    def schedule(self, name: str) -> PairSchedule:
        """The schedule of a pair or pair_schedule op as a :class:`PairSchedule`.

        The DAG is the schedule's first pair's (the pair its entries name); durations come
        from the entries themselves, so reading a schedule needs no hardware description.
        """
        sched = self.schedule_op(name)
        by_ref = self._schedule_entries(sched)

        def entry_of(task: Task) -> ScheduleEntry:
            entry = by_ref.get(task.name)
            if entry is None:
                raise PlanError(f"pair_schedule @{sched.name} has no entry for task @{task.name}; rerun overlap-schedule")
            return schedule_entry(entry)

        first = self._first_pair(sched)
        declared = PairScheduleOp(sched)  # read (and so checked) by _schedule_entries
        fwd = side_tasks(first.fwd_layers, FWD, lambda t: entry_of(t).duration, first.name)
        dag = join_sides(fwd, side_tasks(first.bwd_layers, BWD, lambda t: entry_of(t).duration, first.name), first.name)
        start = [entry_of(self.tasks[t.name]).start for t in dag.tasks]
        return PairSchedule(dag, start, declared.method, status=declared.status)

    def _schedule_entries(self, sched: PlanOp) -> dict[str, PlanEntry]:
        """A pair_schedule's entries by task, once its declaration has accepted it, entries included."""
        by_name = self._entries.get(sched.name)
        if by_name is None:
            PairScheduleOp.read(self.module, sched, self._kind_of, entries=True)
            by_name = self._entries[sched.name] = {e.ref: e for e in sched.entries}
        return by_name

    def scheduled_tasks(self, pair: Pair) -> list[ScheduledTask]:
        """The pair's tasks in its schedule's stream order, with their in-pair dependencies.

        The order comes from the pair's ``pair_schedule`` op; a schedule shared by pairs with
        the same DAG names the first pair's tasks and is matched position by position. A
        pair without a schedule is scheduled now with the gap-fit heuristic.
        """
        dag = self.pair_dag(pair)
        deps = [tuple(dag.tasks[d].name for d in t.deps) for t in dag.tasks]
        if pair.schedule is None:
            from passes.scheduling.gap_fit import gap_fit

            order = gap_fit(dag).order_of()
        else:
            order = self._stream_positions(pair, dag)
        tasks = self.tasks
        return [ScheduledTask(tasks[t.name], t.resource.value, order[i], deps[i]) for i, t in enumerate(dag.tasks)]

    def distinct_pair_dags(self) -> list[PairDAG]:
        """One DAG per distinct (forward side, backward side) of the module's pair ops, built
        for the first pair of each, in pair order: the DAGs overlap-schedule schedules."""
        groups: dict[tuple[int, int], PairDAG] = {}
        for op in self.module.plan_ops("pair"):
            fwd, bwd = self.pair_sides(self.pair(op.name))
            key = (self.side_id(fwd), self.side_id(bwd))
            if key not in groups:
                groups[key] = join_sides(fwd, bwd, op.name)
        return list(groups.values())

    def chunk_schedule(self, fwd_layers: Sequence[Layer], bwd_layers: Sequence[Layer]) -> tuple[list[ScheduledTask], str]:
        """The forward of ``fwd_layers`` beside the backward of ``bwd_layers`` in a stream order, and
        where the order came from (``@sched.N``, or ``gap-fit``). Either side may be empty: a chunk's
        forward alone (warm-up) or backward alone (cool-down).

        The plan's schedule when a pair op with one holds these chunks; otherwise (a lone chunk, or
        chunks the planned order never paired) the gap-fit heuristic schedules them now. Cached per
        view: a pipeline runs each combination many times.
        """
        key = (tuple(x.name for x in fwd_layers), tuple(x.name for x in bwd_layers))
        got = self._chunk_schedules.get(key)
        if got is not None:
            return got
        pair = self.pair_for(fwd_layers, bwd_layers) if fwd_layers and bwd_layers else None
        if pair is not None and pair.schedule is not None:
            got = self.scheduled_tasks(pair), f"@{pair.schedule.name}"
        else:
            from passes.scheduling.gap_fit import gap_fit

            name = f"{'+'.join(key[0]) or '-'}|{'+'.join(key[1]) or '-'}"
            fwd = self._side(fwd_layers, FWD, name) if fwd_layers else []
            bwd = self._side(bwd_layers, BWD, name) if bwd_layers else []
            dag = join_sides(fwd, bwd, name)
            order = gap_fit(dag).order_of()
            got = [
                ScheduledTask(self.tasks[t.name], t.resource.value, order[i], tuple(dag.tasks[d].name for d in t.deps))
                for i, t in enumerate(dag.tasks)
            ], "gap-fit"
        self._chunk_schedules[key] = got
        return got

    def _stream_positions(self, pair: Pair, dag: PairDAG) -> list[int]:
        """Each DAG task's position on its stream in the pair's schedule: by the entry's ``order``,
        then its ``start``, then the task's name. Pairs that share a schedule (same sides,
        matched by position) share the result."""
        sched = pair.schedule
        assert sched is not None
        by_name = self._schedule_entries(sched)
        named = not dag.tasks or dag.tasks[0].name in by_name  # else no match by name is possible
        if named and len(by_name) == len(dag.tasks) and all(t.name in by_name for t in dag.tasks):
            matched, cache_key = [by_name[t.name] for t in dag.tasks], None
        elif len(sched.entries) == len(dag.tasks):
            fwd, bwd = self.pair_sides(pair)
            cache_key = (sched.name, self.side_id(fwd), self.side_id(bwd))
            cached = self._positions.get(cache_key)
            if cached is not None:
                return cached
            matched = list(sched.entries)
            for t, e in zip(dag.tasks, matched):
                other = self.tasks.get(e.ref)
                if other is None or other.kind != t.kind:
                    raise PlanError(
                        f"pair_schedule @{sched.name} does not fit pair @{pair.name}: entry @{e.ref} is not a "
                        f"{t.kind} task; rerun overlap-schedule"
                    )
        else:
            missing = [t.name for t in dag.tasks if t.name not in by_name]
            raise PlanError(
                f"pair_schedule @{sched.name} does not fit pair @{pair.name}: it has {len(by_name)} entries for "
                f"{len(dag.tasks)} tasks (e.g. no entry for {missing[:1] or sorted(by_name)[:1]}); rerun overlap-schedule"
            )
        keys = []
        for t, e in zip(dag.tasks, matched):
            own = t.resource.value
            slot = schedule_entry(e)
            if slot.stream != own:
                raise PlanError(f"pair_schedule @{sched.name} puts {own} task @{t.name} on stream '{slot.stream}'")
            keys.append((own, math.inf if slot.order is None else float(slot.order), slot.start))
        order = [0] * len(dag.tasks)
        for r in RESOURCES:
            name = r.value
            on_stream = sorted((k for k in range(len(keys)) if keys[k][0] == name), key=lambda k: (*keys[k][1:], dag.tasks[k].name))
            for position, k in enumerate(on_stream):
                order[k] = position
        # Only a tie in (order, start) falls to the names, which differ between pairs sharing a schedule.
        if cache_key is not None and len(set(keys)) == len(keys):
            self._positions[cache_key] = order
        return order

    # ------------------------------------------------------------------ partition and meetings

    @cached_property
    def partition(self) -> Partition | None:
        """The chosen partition, or None before the partition pass."""
        op = next((p for p in self.module.plan if p.op == "partition"), None)
        if op is None:
            return None
        names = PartitionOp.read(self.module, op, self._kind_of).stages
        if len(names) != self.parallel.virtual_stages:
            raise PlanError(
                f"partition @{op.name}: 'stages' must list one candidate per virtual stage "
                f"({self.parallel.virtual_stages}); got {len(names)}"
            )
        stages = tuple(self.candidate(SymbolRef(name), f"partition @{op.name}: 'stages'") for name in names)
        return Partition(op, stages)

    def meeting_stages(self) -> dict[int, list[tuple[int, int]]]:
        """Per device, the (forward stage, backward stage) pairs of interleaved 1F1B's steady state:
        the combined-1F1B order when expert parallelism is on (``ParallelConfig.combined_1f1b``)."""
        p = self.parallel
        return meeting_stages(p.pp, p.vpp, p.microbatches, p.combined_1f1b)

    def candidate_table(self) -> CandidateTable:
        """The candidates and pair costs the partition search reads: a pair's ``post_overlap_us``, else
        its ``makespan``, else (and for meetings without a pair op) the serial sum of its tasks."""
        stages = self.parallel.virtual_stages
        ranges: list[list[Range]] = [[] for _ in range(stages)]
        window: list[list[Range]] = [[] for _ in range(stages)]
        by_range: dict[tuple[int, Range], Candidate] = {}
        for cand in self.candidates:
            key = (cand.stage, cand.range)
            if key not in by_range:
                by_range[key] = cand
                ranges[cand.stage].append(cand.range)
                if cand.in_window:
                    window[cand.stage].append(cand.range)
        sources: set[str] = set()
        serial_cache: dict[tuple[int, Range, int, Range], float] = {}

        def cost(sf: int, rf: Range, sb: int, rb: Range) -> float:
            fwd, bwd = by_range[(sf, rf)], by_range[(sb, rb)]
            pair = self.pair_for(fwd, bwd)
            found = pair.cost() if pair is not None else None
            if found is not None:
                sources.add(found[1])
                return found[0]
            sources.add("serial")
            key = (sf, rf, sb, rb)
            if key not in serial_cache:
                serial_cache[key] = self.serial_us(fwd.layers, bwd.layers)
            return serial_cache[key]

        names = {key: cand.name for key, cand in by_range.items()}
        return CandidateTable([sorted(r) for r in ranges], [sorted(w) for w in window], names, cost, sources)

    def meetings(self) -> dict[int, list[Meeting]]:
        """Per device, what meets in its steady state under the chosen partition (empty before partition)."""
        part = self.partition
        if part is None:
            return {}
        return {
            device: [
                Meeting(device, sf, sb, part.stages[sf], part.stages[sb], self.pair_for(part.stages[sf], part.stages[sb]))
                for sf, sb in combos
            ]
            for device, combos in self.meeting_stages().items()
        }
