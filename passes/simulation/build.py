"""From a planned module to the simulator's input.

What each rank runs are the steps the ``pipeline`` pass lowers (``passes.pipelining.shipped``):
the steps of the module's per-rank programs when it holds them (checked against them), else
those the pass lowers by default. One action per step: warm-up forwards alone; in the combined
order (expert parallelism on) each steady-state step a forward/backward *pair* whose sides
overlap, in the plain order a forward step then a backward step; cool-down backwards alone.
Baselines (another partition, another scheduler) run the same steps.

Programs (one per distinct pair of forward and backward layer lists, or lone chunk):

- the pair DAG of the chunks' tasks (``pair_dag``), isolated durations on the target;
- the stream order: the plan's ``pair_schedule`` of that pair when ``method="plan"`` and the
  plan has one, else the named scheduler (``gap-fit``, ``fixed-template``, ``serial``); pairs
  the plan did not schedule (the combined-1F1B order can meet chunk combinations the plain
  order does not) and lone chunks are scheduled here with the plan's method;
- post-overlap durations: the stream order re-timed by the contention model
  (``passes.contention``), each task's duration its contended span, so the program run alone
  with balanced routing takes exactly the pair's post-overlap cost; when ``profile`` recorded
  another cost for the pair (measured), durations are scaled to it;
- routed tasks: expert GEMMs, dispatch and combine of MoE layers scale with the routing of
  their layer and micro-batch (beyond their launch or latency);
- the DBO's view (``dbo=True``): slots and the deferrable tail (``passes.simulation.slots``),
  each deferrable weight gradient costing the bytes it keeps alive (the saved inputs of its
  forward task plus its output gradient).

Point-to-point transfers carry one micro-batch's hidden state (``micro_batch_size · seq_len ·
hidden / tp`` elements, sequence-parallel under tensor parallelism) between pipeline stages at
the hardware file's ``p2p_gbps`` after ``p2p_latency_us`` (in every reference setting stages sit
on different nodes, so the NIC's figures). Gradient reduction: per chunk, a reduce-scatter of its
gradients in the training dtype over data parallelism (dense weights: ``dp`` ranks; expert
weights: expert-data-parallel ``dp·tp/ep`` ranks), ring time ``(n - 1)/n · bytes /
grad_reduce_gbps`` plus the All-to-All latency, as Megatron's distributed optimizer does. A
hardware file without these figures uses the inter-node All-to-All bandwidth and latency.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from passes.costs.contention import ContentionParams, retime
from passes.costs.hardware import Hardware
from passes.costs.pair_costs import ScheduledTask, contended_tasks
from passes.partitioning.memory import (
    MemoryAssumptions,
    layer_activation_bytes,
    layer_static_bytes,
    output_gradient_bytes,
)
from passes.partitioning.ranges import Range, balanced_partition
from passes.partitioning.stages import serially_balanced
from passes.pipelining.order import RankStep
from passes.pipelining.shipped import ShippedSteps, ShippedStepsError, shipped_steps
from passes.scheduling.methods import SCHEDULERS
from passes.scheduling.pair_dag import BWD, FWD, PairDAG, join_sides, side_tasks
from passes.scheduling.schedule import RESOURCES, priority_order
from passes.simulation import program as sim
from passes.simulation.engine import DboSettings, SimulationResult, simulate
from passes.simulation.routing import RoutingModel, RoutingSpec
from passes.simulation.slots import POOL_MARGIN, annotate, pool_budgets
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import FfnKind, Phase, Resource, TaskOp
from tessera_ir.model import Layer, Module, PlanOp, Task
from tessera_ir.parallel import ParallelConfig
from tessera_ir.plan_ops import (
    DBO_POOL,
    DBO_SLOT,
    PAIR_SCHEDULE,
    DboPoolOp,
    DboSlotOp,
    PairScheduleOp,
    entity_kinds,
    pool_memory_bytes,
    slot_entry,
)
from tessera_ir.run_settings import RunSettings

ROUTED_OPS = frozenset({TaskOp.EXPERT_GEMM, TaskOp.DISPATCH, TaskOp.COMBINE})
METHODS = ("plan", "gap-fit", "fixed-template", "serial")
ChunkKey = tuple[str, ...]


class BuildError(TesseraError):
    """A module the simulator cannot be built for (no partition, unknown method, ...)."""


@dataclass(frozen=True)
class BuildOptions:
    """What to simulate: which partition, which pair schedules, which extras."""

    ranges: tuple[Range, ...] | None = None  # decoder ranges per virtual stage; None: the plan's partition
    method: str = "plan"  # "plan" or a scheduler: gap-fit | fixed-template | serial
    dbo: bool = False  # find slots and the deferrable pool
    dp: int | None = None  # data-parallel replicas; None: the module's "dp" attribute, else 1
    distributed_optimizer: bool | None = None  # None: the module's setting (ParallelConfig, on by default)
    # The DBO pool's budget, as a share of device memory (see dbo_budgets); None: the module header's
    # setting (tessera_ir.run_settings: the stage's memory headroom unless a share is set).
    dbo_memory_fraction: float | None = None


class PlanReader(Protocol):
    """What the builder reads of a plan: ``passes.plan_view.PlanView`` provides it (the caller, a
    pass or the driver, builds the view; the simulator sits below it)."""

    module: Module
    parallel: ParallelConfig
    tasks: dict[str, Task]

    @property
    def hardware(self) -> Hardware: ...

    @property
    def partition(self) -> Any: ...  # noqa: ANN401 (the view's Partition, with ``ranges``)

    def duration(self, task: Task) -> float: ...

    def utilisation(self, task: Task) -> tuple[float, float]: ...

    def stage_layers(self, stage: int, rng: Range) -> list[Layer]: ...

    def pair_for(self, fwd: Sequence[Layer], bwd: Sequence[Layer]) -> Any: ...  # noqa: ANN401 (the view's Pair)

    def pair_dag(self, pair: Any) -> PairDAG: ...  # noqa: ANN401

    def scheduled_tasks(self, pair: Any) -> list[ScheduledTask]: ...  # noqa: ANN401


def partition_ranges(view: PlanReader) -> tuple[Range, ...]:
    """The decoder ranges of the plan's ``partition`` op."""
    try:
        part = view.partition
    except TesseraError as err:
        raise BuildError(str(err)) from None
    if part is None:
        raise BuildError("the module holds no partition; run the planning passes (… ,partition) before simulating")
    return tuple(part.ranges)


def even_ranges(module: Module, stages: int) -> tuple[Range, ...]:
    """Layers split evenly by count (what Megatron-Core does without a custom layout)."""
    return tuple(balanced_partition([1.0] * len(module.decoder_layers()), stages))


def balanced_ranges(view: PlanReader) -> tuple[Range, ...]:
    """The serially balanced partition (stage costs as sums of isolated task durations)."""
    return tuple(serially_balanced(view.module, view.duration, view.parallel.virtual_stages))


class SimulationBuilder:
    """Builds :class:`~passes.simulation.program.SimulationInput` for a planned module."""

    def __init__(self, view: PlanReader, options: BuildOptions = BuildOptions()):
        if options.method not in METHODS:
            raise BuildError(f"unknown schedule method '{options.method}'; use one of {', '.join(METHODS)}")
        module = view.module
        self.module = module
        self.options = options
        self.view = view
        self.parallel = self.view.parallel
        self.hw: Hardware = self.view.hardware
        self.tasks = self.view.tasks
        self.decoder_index = {layer.name: layer.index for layer in module.decoder_layers()}
        self.moe = {layer.name for layer in module.decoder_layers() if layer.ffn is FfnKind.MOE}
        self.contention = ContentionParams.from_hardware(self.hw, self.parallel.ep)
        self._programs: dict[tuple[ChunkKey, ChunkKey], sim.Program] = {}
        self.sources: dict[tuple[ChunkKey, ChunkKey], str | None] = {}  # program -> the plan schedule it follows
        # The plan's dbo ops describe the plan's pair schedules; another method's programs are annotated here.
        self.dbo_ops = DboOps(module if options.method == "plan" else Module(module.name))
        dp = options.dp if options.dp is not None else module.attrs.get("dp", 1)
        self.dp = dp if isinstance(dp, int) and not isinstance(dp, bool) and dp >= 1 else 1
        self._steps: ShippedSteps | None = None

    @property
    def steps(self) -> ShippedSteps:
        """Every rank's steps: those of the module's per-rank programs (checked against them), else
        those the ``pipeline`` pass lowers by default (``pipelining.shipped``)."""
        if self._steps is None:
            stage_of = None
            if any(op.op == "program" for op in self.module.plan):
                plan = partition_ranges(self.view)
                stage_of = {x.name: s for s in range(len(plan)) for x in self.view.stage_layers(s, plan[s])}
            try:
                self._steps = shipped_steps(self.module, stage_of)
            except ShippedStepsError as err:
                raise BuildError(str(err)) from None
        return self._steps

    # ------------------------------------------------------------------ programs

    @property
    def programs(self) -> dict[tuple[ChunkKey, ChunkKey], sim.Program]:
        """Every program built so far, by (forward layers, backward layers)."""
        return dict(self._programs)

    def program(self, fwd: Sequence[Layer], bwd: Sequence[Layer]) -> sim.Program:
        key = (tuple(x.name for x in fwd), tuple(x.name for x in bwd))
        got = self._programs.get(key)
        if got is None:
            got = self._programs[key] = self._compile(key, fwd, bwd)
        return got

    def _scheduled(self, key: tuple[ChunkKey, ChunkKey], fwd: Sequence[Layer], bwd: Sequence[Layer]) -> tuple[PairDAG, list[int], float | None]:
        """The program's DAG, each task's position on its stream, and the post-overlap cost the plan gives it."""
        method = self.options.method
        self.sources[key] = None
        if method == "plan":
            pair = self.view.pair_for(fwd, bwd)
            if pair is not None and pair.schedule is not None:
                self.sources[key] = pair.schedule.name
                return self.view.pair_dag(pair), [s.order for s in self.view.scheduled_tasks(pair)], pair.post_overlap_us
            # Pairs the plan never met (the combined order meets other chunks than the plain
            # one does) and lone chunks: scheduled as the plan schedules.
            method = next((PairScheduleOp(op).method for op in self.module.plan if op.op == PAIR_SCHEDULE.kind), "gap-fit")
            method = method if method in SCHEDULERS else "gap-fit"
        name = f"{'+'.join(key[0]) or '-'}|{'+'.join(key[1]) or '-'}"
        dag = join_sides(side_tasks(fwd, FWD, self.view.duration, name), side_tasks(bwd, BWD, self.view.duration, name), name)
        return dag, SCHEDULERS[method](dag).order_of(), None

    def _compile(self, key: tuple[ChunkKey, ChunkKey], fwd: Sequence[Layer], bwd: Sequence[Layer]) -> sim.Program:
        name = f"{'+'.join(key[0]) or '-'}|{'+'.join(key[1]) or '-'}"
        dag, order, cost = self._scheduled(key, fwd, bwd)
        items = [
            ScheduledTask(self.tasks[t.name], t.resource.value, order[i], tuple(dag.tasks[d].name for d in t.deps))
            for i, t in enumerate(dag.tasks)
        ]
        timed = retime(contended_tasks(items, self.view.duration, self.view.utilisation), self.contention)
        scale = cost / timed.makespan if cost is not None and timed.makespan > 0 else 1.0
        # Processing order: a topological order of dependencies and stream chains, earliest start first.
        preds: list[list[int]] = [list(t.deps) for t in dag.tasks]
        for resource in RESOURCES:
            chain = sorted((i for i, t in enumerate(dag.tasks) if t.resource is resource), key=lambda i: order[i])
            for a, b in zip(chain, chain[1:]):
                preds[b].append(a)
        processing = priority_order([t.name for t in dag.tasks], [-timed.start[t.name] for t in dag.tasks], preds)
        if len(processing) != len(items):
            raise BuildError(f"program {name}: its stream order contradicts its dependencies")
        index = {s.task.name: i for i, s in enumerate(items)}
        position = {i: k for k, i in enumerate(processing)}
        fwd_names = {x.name for x in fwd}
        routed_layers: list[tuple[int, int]] = []
        routed_index: dict[tuple[int, int], int] = {}
        tasks = []
        for i in processing:
            s = items[i]
            task = s.task
            layer = task.name.split(".", 1)[0]
            side = sim.FWD if task.phase is Phase.FWD and layer in fwd_names else sim.BWD
            effective = (timed.finish[task.name] - timed.start[task.name]) * scale
            routed = -1
            fixed = 0.0
            if task.op in ROUTED_OPS and layer in self.moe:
                layer_key = (side, int(self.decoder_index[layer]))  # type: ignore[arg-type]
                routed = routed_index.setdefault(layer_key, len(routed_layers))
                if routed == len(routed_layers):
                    routed_layers.append(layer_key)
                fixed = self.hw.a2a_latency_us if task.resource is Resource.COMM else self.hw.kernel_launch_us
                fixed = min(fixed * scale, effective)
            kind = task.op.value if task.op in ROUTED_OPS else ("wgrad" if task.phase is Phase.WGRAD else "compute")
            tasks.append(sim.SimTask(
                name=task.name,
                stream=sim.COMM if s.stream == Resource.COMM.value else sim.COMPUTE,
                duration_us=effective,
                deps=tuple(sorted(position[index[d]] for d in s.deps)),
                kind=kind,
                side=side,
                routed=routed,
                fixed_us=fixed,
                memory_bytes=self._deferral_bytes(task) if task.phase is Phase.WGRAD else 0,
            ))
        program = sim.Program(name, tuple(tasks), tuple(routed_layers))
        if not self.options.dbo:
            return program
        if self.dbo_ops.present:
            return self.dbo_ops.annotate(key, program)
        return annotate(program)

    def _deferral_bytes(self, wgrad: Task) -> int:
        """What deferring a weight gradient keeps alive: its forward's saved inputs and its output gradient."""
        fwd = self.tasks.get(wgrad.name.rsplit(".", 1)[0] + ".fwd")
        if fwd is None:
            return 0
        return fwd.act_bytes + output_gradient_bytes(self.tasks, wgrad.name, self.parallel.dtype_bytes)

    # ------------------------------------------------------------------ the whole input

    def build(self, ranges: Sequence[Range] | None = None) -> sim.SimulationInput:
        """The input for ``ranges`` (default: the options', else the plan's partition).

        With ``dbo``, the programs carry slots and the deferrable pool, and every step its
        predicted receive wait: the plan's (``dbo_slot`` ops) when the module has them, else
        computed here as the ``dbo-slots`` pass does (a balanced-routing run of the static plan).
        """
        inp = self._build(ranges)
        if not self.options.dbo:
            return inp
        if self.dbo_ops.present:
            predicted = self.dbo_ops.recv_predictions(inp)
            tails = self.dbo_ops.tails(inp.pp)
        else:
            static = simulate(inp)
            predicted, tails = static.recv_waits, static_tails(static)
        return replace(inp, recv_predicted_us=tuple(tuple(x) for x in predicted), tail_predicted_us=tails)

    def routing(self, spec: RoutingSpec) -> RoutingModel:
        """The routing model of this module's MoE layers under ``spec``."""
        p = self.parallel
        experts, top_k = self.module.attrs.get("num_experts", 0), self.module.attrs.get("top_k", 0)
        moe = sorted(int(self.decoder_index[name]) for name in self.moe)  # type: ignore[arg-type]
        if not moe or not isinstance(experts, int) or not isinstance(top_k, int) or experts < 1:
            moe, experts, top_k = [], p.ep, 1  # no experts: every layer balanced
        return RoutingModel(
            spec, num_experts=experts, top_k=top_k, ep=p.ep, tokens_per_rank=-(-p.micro_batch_size * p.seq_len // p.tp),
            moe_layers=moe, decoder_layers=len(self.decoder_index), microbatches=p.microbatches,
        )

    def dbo_settings(self, inp: sim.SimulationInput) -> DboSettings:
        """The DBO's per-rank memory budgets: the plan's, else ``dbo_budgets`` of a balanced static run."""
        if self.dbo_ops.present:
            return DboSettings(self.dbo_ops.budgets(inp.pp))
        settings = RunSettings.from_attrs(self.view.module.attrs)
        fraction = self.options.dbo_memory_fraction
        if fraction is None and settings.dbo_memory_budget != "headroom":
            fraction = float(settings.dbo_memory_budget)
        return DboSettings(dbo_budgets(simulate(inp), self.hw.memory_bytes, fraction, settings.dbo_memory_margin))

    def _build(self, ranges: Sequence[Range] | None) -> sim.SimulationInput:
        p = self.parallel
        ranges = tuple(ranges or self.options.ranges or partition_ranges(self.view))
        stages = p.virtual_stages
        if len(ranges) != stages:
            raise BuildError(f"{len(ranges)} stage ranges for pp × vpp = {stages} virtual stages")
        layers = [self.view.stage_layers(s, ranges[s]) for s in range(stages)]
        ranks = step_actions(self.steps.ranks, lambda f, b: self.program(layers[f] if f is not None else (),
                                                                           layers[b] if b is not None else ()))
        return sim.SimulationInput(
            pp=p.pp,
            vpp=p.vpp,
            microbatches=p.microbatches,
            ranks=tuple(ranks),
            decoder_layers=len(self.module.decoder_layers()),
            p2p_latency_us=self._link("p2p_latency_us", self.hw.a2a_latency_us),
            p2p_bytes_per_us=self._link("p2p_gbps", self.hw.nic_gbps) * 1e3,
            activation_bytes=self._hidden_bytes(),
            grad_reduce_us=self._grad_reduce(layers),
            static_bytes=self._static_bytes(layers),
            stage_activation_bytes=tuple(sum(layer_activation_bytes(x) for x in layers[s]) for s in range(stages)),
            flops_per_iteration=float(sum(t.flops for t in self.module.tasks()) * p.microbatches),
            peak_flops_per_rank=self.hw.peak_flops(p.dtype),
            tokens_per_iteration=p.microbatches * p.micro_batch_size * p.seq_len * self.dp,
            labels={"model": str(self.module.attrs.get("model", self.module.name)), "hardware": self.hw.name},
        )

    def _link(self, key: str, default: float) -> float:
        """A link figure of the hardware file (``p2p_gbps``, ``p2p_latency_us``, ``grad_reduce_gbps``)."""
        value = self.hw.extra.get(key, default)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
            raise BuildError(f"hardware '{self.hw.name}': {key} must be a non-negative number, got {value!r}")
        return float(value)

    def _hidden_bytes(self) -> int:
        p = self.parallel
        hidden = self.module.attrs.get("hidden_size")
        if not isinstance(hidden, int):
            return 0
        return p.micro_batch_size * p.seq_len * hidden * p.dtype_bytes // p.tp

    def _grad_reduce(self, layers: Sequence[Sequence[Layer]]) -> tuple[tuple[float, ...], ...]:
        p = self.parallel
        expert_dp = max(1, self.dp * p.tp // p.ep)
        bandwidth = self._link("grad_reduce_gbps", self.hw.nic_gbps) * 1e3  # bytes per µs

        def ring(nbytes: float, ranks: int) -> float:
            return 0.0 if ranks <= 1 or nbytes <= 0 else self.hw.a2a_latency_us + (ranks - 1) / ranks * nbytes / bandwidth

        out = []
        for r in range(p.pp):
            row = []
            for c in range(p.vpp):
                chunk = layers[r + c * p.pp]
                expert = sum(t.param_bytes for x in chunk for t in x.tasks if t.op is TaskOp.EXPERT_GEMM)
                dense = sum(t.param_bytes for x in chunk for t in x.tasks) - expert
                row.append(ring(dense, self.dp) + ring(expert, expert_dp))
            out.append(tuple(row))
        return tuple(out)

    def _static_bytes(self, layers: Sequence[Sequence[Layer]]) -> tuple[int, ...]:
        p = self.parallel
        try:
            sharding = p.replace(dp=self.dp, distributed_optimizer=self.options.distributed_optimizer)
        except TesseraError as err:
            raise BuildError(f"simulating with dp={self.dp}: {err}") from None
        assumptions = MemoryAssumptions()
        return tuple(
            sum(layer_static_bytes(x, sharding, assumptions) for c in range(p.vpp) for x in layers[r + c * p.pp])
            for r in range(p.pp)
        )


def step_actions(
    ranks: Sequence[Sequence[RankStep]], program: Callable[[int | None, int | None], sim.Program]
) -> tuple[tuple[sim.Action, ...], ...]:
    """Every rank's actions: one per step, running ``program(forward stage, backward stage)``."""
    return tuple(
        tuple(sim.Action(program(st.fwd[0] if st.fwd else None, st.bwd[0] if st.bwd else None), fwd=st.fwd, bwd=st.bwd)
              for st in steps)
        for steps in ranks
    )


def dbo_budgets(
    static: SimulationResult, capacity_bytes: int, fraction: float | None = None, margin: float = POOL_MARGIN
) -> tuple[int, ...]:
    """Per rank, what the DBO pool may hold: the headroom the static run leaves (less ``margin`` of
    device memory), or ``fraction`` of device memory within it (``passes.simulation.slots.pool_budgets``)."""
    return pool_budgets([r.peak_bytes for r in static.ranks], capacity_bytes, fraction, margin)


def static_tails(static: SimulationResult) -> tuple[float, ...]:
    """Per rank, the idle after its last step and gradient reduction until the iteration ends: where
    the weight gradients due at its last step can run without lengthening the iteration."""
    return tuple(max(0.0, static.iteration_us - max(r.end_us, r.lanes["grad_reduce"].free_us)) for r in static.ranks)


class DboOps:
    """The ``dbo_slot`` and ``dbo_pool`` ops of a module (written by the ``dbo-slots`` pass), by program."""

    def __init__(self, module: Module):
        self.slots: dict[tuple[ChunkKey, ChunkKey], PlanOp] = {}
        self.pools: dict[tuple[ChunkKey, ChunkKey], PlanOp] = {}
        self.devices: dict[int, PlanOp] = {}
        # Read through their declarations (tessera_ir.plan_ops), which refuse a malformed op as the verifier does.
        kind_of = None
        for op in module.plan:
            if op.op == DBO_SLOT.kind:
                kind_of = kind_of or entity_kinds(module)
                slot = DboSlotOp.read(module, op, kind_of, entries=True)
                if slot.kind == "recv_wait" and slot.device is not None:
                    self.devices[slot.device] = op
                elif slot.kind != "recv_wait":
                    self.slots[(slot.fwd, slot.bwd)] = op
            elif op.op == DBO_POOL.kind:
                kind_of = kind_of or entity_kinds(module)
                pool = DboPoolOp.read(module, op, kind_of, entries=True)
                self.pools[(pool.fwd, pool.bwd)] = op

    @property
    def present(self) -> bool:
        return bool(self.devices)

    def annotate(self, key: tuple[ChunkKey, ChunkKey], program: sim.Program) -> sim.Program:
        index = {t.name: i for i, t in enumerate(program.tasks)}
        slots = []
        op = self.slots.get(key)
        for e in op.entries if op is not None else []:
            figures = slot_entry(e)
            comm = index.get(figures.waits_on)
            if e.ref not in index or comm is None:
                raise BuildError(f"dbo_slot @{op.name} names @{e.ref}, which is not in its program; rerun dbo-slots")  # type: ignore[union-attr]
            slots.append(sim.SlotAnnotation(
                task=index[e.ref], slot_id=f"{op.name}.{e.ref}", base_us=figures.base_us,  # type: ignore[union-attr]
                a2a_us=figures.a2a_us, gemm_us=figures.gemm_us,
                routed=program.tasks[comm].routed,
                waits_on=comm,
            ))
        pool = {}
        op = self.pools.get(key)
        for e in op.entries if op is not None else []:
            if e.ref not in index:
                raise BuildError(f"dbo_pool @{op.name} names @{e.ref}, which is not in its program; rerun dbo-slots")  # type: ignore[union-attr]
            pool[index[e.ref]] = pool_memory_bytes(e)
        tasks = tuple(
            replace(t, deferrable=i in pool, memory_bytes=pool.get(i, t.memory_bytes)) for i, t in enumerate(program.tasks)
        )
        return sim.Program(program.name, tasks, program.routed_layers, tuple(slots))

    def recv_predictions(self, inp: sim.SimulationInput) -> list[list[float]]:
        out = []
        for r, actions in enumerate(inp.ranks):
            op = self.devices.get(r)
            values = DboSlotOp(op).predicted_us if op is not None else None  # read (and checked) by __init__
            if values is None or len(values) != len(actions):
                raise BuildError(
                    f"dbo_slot for device {r} predicts {len(values) if values is not None else 'no'} receive waits for "
                    f"{len(actions)} steps; rerun dbo-slots"
                )
            out.append(values)
        return out

    def tails(self, pp: int) -> tuple[float, ...]:
        """Per device, the predicted idle after its last step (``tail_us``; 0 when a plan lacks it)."""
        return tuple(DboSlotOp(self.devices[r]).tail_us if r in self.devices else 0.0 for r in range(pp))

    def budgets(self, pp: int) -> tuple[int, ...]:
        return tuple(DboSlotOp(self.devices[r]).memory_budget_bytes or 0 if r in self.devices else 0 for r in range(pp))


def program_key(op: PlanOp) -> tuple[ChunkKey, ChunkKey]:
    """The (forward layers, backward layers) a program-level op (``dbo_slot``, ``dbo_pool``) names in ``fwd`` / ``bwd``."""
    declared = DboPoolOp(op) if op.op == DBO_POOL.kind else DboSlotOp(op)
    return declared.fwd, declared.bwd
