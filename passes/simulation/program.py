"""What the simulator runs: per-rank action lists over compiled programs, transfers and reductions.

This is the simulator's whole input, independent of the IR: a builder (``passes.simulation.build``)
derives it from a planned module, tests write it by hand.

- A :class:`Program` is the work of one action on one rank: the forward of a chunk alone
  (warm-up), the backward of a chunk alone (cool-down), or a steady-state pair of both.
  Its tasks carry their stream (compute, or the expert-parallel All-to-All stream), their
  duration under balanced routing, their dependencies and the stream order the plan fixed
  (tasks are listed in an order that respects both). A task whose cost depends on routing
  (expert GEMMs, dispatch, combine) names the decoder layer and side whose routing scales it.
- An :class:`Action` runs a program for given (virtual stage, micro-batch) sides.
- :class:`SimulationInput` holds every rank's actions in order, the point-to-point link, the
  gradient reduction per rank and chunk, memory figures and what MFU needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tessera_ir.errors import TesseraError

COMPUTE = 0
COMM = 1  # the expert-parallel All-to-All stream
STREAM_NAMES = ("compute", "a2a")
FWD = 0
BWD = 1


class SimulationInputError(TesseraError):
    """A simulation input that cannot describe a run (bad indices, cycles, missing producers)."""


@dataclass(frozen=True)
class SimTask:
    """One task of a program."""

    name: str
    stream: int  # COMPUTE or COMM
    duration_us: float  # under balanced routing (post-overlap: contention already included)
    deps: tuple[int, ...] = ()  # indices of earlier tasks of the same program
    kind: str = "compute"  # dispatch | combine | expert_gemm | wgrad | compute
    side: int = FWD  # FWD or BWD
    routed: int = -1  # index into Program.routed_layers whose load imbalance scales this task, or -1
    fixed_us: float = 0.0  # the part routing does not scale (kernel launch, transfer latency)
    deferrable: bool = False  # movable work the DBO may take out of the program
    memory_bytes: int = 0  # bytes deferring it keeps alive


@dataclass(frozen=True)
class SlotAnnotation:
    """A compute task before which the stream may wait, and how the plan predicts the wait."""

    task: int  # index of the compute task that may wait
    slot_id: str
    base_us: float  # the wait the static plan predicts under balanced routing
    a2a_us: float = 0.0  # routing-scaled transfer time the wait depends on
    gemm_us: float = 0.0  # routing-scaled expert GEMM time the wait depends on
    routed: int = -1  # which routed layer's imbalance predicts it
    waits_on: int = -1  # index of the All-to-All task it waits for


@dataclass(frozen=True)
class Program:
    """The tasks of one action, in an order consistent with dependencies and with each stream's order."""

    name: str
    tasks: tuple[SimTask, ...]
    routed_layers: tuple[tuple[int, int], ...] = ()  # (side, decoder layer index) per routed index
    slots: tuple[SlotAnnotation, ...] = ()

    def __post_init__(self) -> None:
        for i, t in enumerate(self.tasks):
            if t.stream not in (COMPUTE, COMM):
                raise SimulationInputError(f"program {self.name}: task {t.name} has stream {t.stream}")
            if t.duration_us < 0 or t.fixed_us < 0 or t.fixed_us > t.duration_us + 1e-9:
                raise SimulationInputError(
                    f"program {self.name}: task {t.name} needs 0 <= fixed_us <= duration_us, "
                    f"got {t.fixed_us} and {t.duration_us}"
                )
            if any(not 0 <= d < i for d in t.deps):
                raise SimulationInputError(
                    f"program {self.name}: task {t.name} depends on a task listed at or after it; list tasks in "
                    "dependency order"
                )
            if not -1 <= t.routed < len(self.routed_layers):
                raise SimulationInputError(f"program {self.name}: task {t.name} names routed layer {t.routed}")
            if t.deferrable and t.stream != COMPUTE:
                raise SimulationInputError(f"program {self.name}: deferrable task {t.name} is not compute work")
        dependents = {d for t in self.tasks for d in t.deps}
        for i, t in enumerate(self.tasks):
            if t.deferrable and i in dependents:
                raise SimulationInputError(
                    f"program {self.name}: deferrable task {t.name} has dependents; only work nothing waits for "
                    "may be deferred"
                )
        for s in self.slots:
            if not 0 <= s.task < len(self.tasks) or self.tasks[s.task].stream != COMPUTE:
                raise SimulationInputError(f"program {self.name}: slot {s.slot_id} is not before a compute task")
            if s.waits_on >= 0 and (s.waits_on not in self.tasks[s.task].deps or self.tasks[s.waits_on].stream != COMM):
                raise SimulationInputError(f"program {self.name}: slot {s.slot_id} waits on a task that is no All-to-All it depends on")

    @property
    def sides(self) -> tuple[bool, bool]:
        """(has forward work, has backward work)."""
        return any(t.side == FWD for t in self.tasks), any(t.side == BWD for t in self.tasks)


@dataclass(frozen=True)
class Action:
    """One step of a rank: ``program`` run for the forward of ``fwd`` and/or the backward of ``bwd``.

    ``fwd`` and ``bwd`` are ``(virtual stage, micro-batch)``; a side is None when the program
    has no work on it.
    """

    program: Program
    fwd: tuple[int, int] | None = None
    bwd: tuple[int, int] | None = None


@dataclass(frozen=True)
class SimulationInput:
    """Everything one iteration's simulation needs (times in µs, sizes in bytes)."""

    pp: int
    vpp: int
    microbatches: int
    ranks: tuple[tuple[Action, ...], ...]  # per pipeline rank, in program order
    decoder_layers: int  # routing is drawn per decoder layer and micro-batch
    p2p_latency_us: float = 0.0
    p2p_bytes_per_us: float = float("inf")
    activation_bytes: int = 0  # bytes of one micro-batch's hidden state sent between stages (each direction)
    grad_reduce_us: tuple[tuple[float, ...], ...] = ()  # [rank][chunk]: the chunk's gradient reduction
    static_bytes: tuple[int, ...] = ()  # per rank: weights, gradients and optimizer state
    stage_activation_bytes: tuple[int, ...] = ()  # per virtual stage: what one micro-batch keeps alive
    flops_per_iteration: float = 0.0  # model FLOPs of one iteration on one pipeline (all ranks)
    peak_flops_per_rank: float = 0.0  # peak dense throughput of one device
    tokens_per_iteration: int = 0  # tokens one pipeline trains on per iteration
    recv_predicted_us: tuple[tuple[float, ...], ...] = ()  # [rank][step]: predicted wait before the step
    # [rank]: predicted idle after the rank's last step and its last gradient reduction, to the iteration's end
    tail_predicted_us: tuple[float, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # free-form description for reports

    def __post_init__(self) -> None:
        if len(self.ranks) != self.pp:
            raise SimulationInputError(f"{len(self.ranks)} rank programs for pp={self.pp}")
        stages = self.pp * self.vpp
        seen_f: set[tuple[int, int]] = set()
        seen_b: set[tuple[int, int]] = set()
        for r, actions in enumerate(self.ranks):
            for k, a in enumerate(actions):
                has_f, has_b = a.program.sides
                if (a.fwd is not None) != has_f or (a.bwd is not None) != has_b:
                    raise SimulationInputError(f"rank {r} step {k}: sides of {a.program.name} do not match the action")
                for side, seen in ((a.fwd, seen_f), (a.bwd, seen_b)):
                    if side is None:
                        continue
                    stage, mb = side
                    if not (0 <= stage < stages and stage % self.pp == r and 0 <= mb < self.microbatches):
                        raise SimulationInputError(f"rank {r} step {k}: (stage {stage}, micro-batch {mb}) is not this rank's")
                    if side in seen:
                        raise SimulationInputError(f"rank {r} step {k}: (stage {stage}, micro-batch {mb}) runs twice")
                    seen.add(side)
        expected = {(s, m) for s in range(stages) for m in range(self.microbatches)}
        if seen_f != expected or seen_b != expected:
            missing = sorted(expected - seen_f)[:1] or sorted(expected - seen_b)[:1]
            raise SimulationInputError(f"the rank programs do not run every stage's forward and backward once (e.g. {missing})")
        if self.grad_reduce_us and (len(self.grad_reduce_us) != self.pp or any(len(g) != self.vpp for g in self.grad_reduce_us)):
            raise SimulationInputError("grad_reduce_us needs one entry per rank and chunk")
        if self.recv_predicted_us and len(self.recv_predicted_us) != self.pp:
            raise SimulationInputError("recv_predicted_us needs one list per rank")
        if self.tail_predicted_us and len(self.tail_predicted_us) != self.pp:
            raise SimulationInputError("tail_predicted_us needs one value per rank")

    @property
    def stages(self) -> int:
        return self.pp * self.vpp

