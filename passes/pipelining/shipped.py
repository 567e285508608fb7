"""The steps a module's per-rank programs run: what the simulator and the reports must run too.

The ``pipeline`` pass lowers ``order.rank_steps`` in the order its ``combined`` option picked
and records that choice on its ``pipeline`` op. Whatever simulates or reports on the plan reads
the steps here, never a second derivation of the order:

- a module that holds programs: the ``pipeline`` op's ``combined``, and the programs are checked
  to run exactly those steps (each step's chunks, in order, by the ``run`` and ``all_to_all``
  instructions that touch them, each step's after the step ahead of it), so a program changed
  by hand or lowered under another order is refused instead of simulated as something it is
  not. (Instructions do not mark where a step ends: a combined pair whose two sides the
  program happens to run one after the other reads like two plain steps; the ``combined``
  flag decides that.)
- a module not lowered yet: the order the ``pipeline`` pass lowers by default
  (``ParallelConfig.combined_1f1b``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from passes.pipelining.order import RankStep, rank_steps
from tessera_ir.errors import TesseraError
from tessera_ir.kinds import Phase
from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig
from tessera_ir.programs import ALL_TO_ALL, RUN, pipeline_op, read_programs

Unit = tuple[str, int, int]  # (direction, virtual stage, micro-batch)


class ShippedStepsError(TesseraError):
    """Per-rank programs that do not run the steps of the order their ``pipeline`` op names."""


@dataclass(frozen=True)
class ShippedSteps:
    """Every rank's steps, the order they follow, and whether lowered programs were checked against them."""

    combined: bool
    ranks: tuple[tuple[RankStep, ...], ...]
    from_programs: bool


def shipped_combined(module: Module) -> bool:
    """Whether the module's pipeline runs the combined order: its ``pipeline`` op's choice, else the default."""
    op = pipeline_op(module)
    if op is not None:
        value = op.attrs.get("combined")
        if not isinstance(value, bool):
            raise ShippedStepsError(f"the pipeline op @{op.name} has combined = {value!r}; it must be true or false "
                                    "(rerun the pipeline pass)")
        return value
    return ParallelConfig.from_attrs(module.attrs).combined_1f1b


def shipped_steps(module: Module, stage_of_layer: Mapping[str, int] | None = None) -> ShippedSteps:
    """The steps every rank runs (see the module docstring).

    ``stage_of_layer`` maps each layer to its virtual stage in the plan's partition; with it,
    a module holding programs has them checked against the steps.
    """
    p = ParallelConfig.from_attrs(module.attrs)
    combined = shipped_combined(module)
    ranks = tuple(tuple(rank_steps(p.pp, p.vpp, p.microbatches, r, combined)) for r in range(p.pp))
    checked = False
    if pipeline_op(module) is not None and stage_of_layer is not None:
        check_programs(module, ranks, stage_of_layer, combined)
        checked = True
    return ShippedSteps(combined, ranks, checked)


def check_programs(
    module: Module, ranks: tuple[tuple[RankStep, ...], ...], stage_of_layer: Mapping[str, int], combined: bool
) -> None:
    """Refuse programs whose chunks do not come step by step in the order of ``ranks``."""
    programs, problems = read_programs(module)
    if problems:
        raise ShippedStepsError(f"program @{problems[0].op.name}: {problems[0].message}")
    tasks = module.task_map()
    layer_of = module.layer_of_task()
    order = "combined" if combined else "plain"
    for program in programs:
        if not 0 <= program.rank < len(ranks):
            raise ShippedStepsError(f"program @{program.name} is for rank {program.rank}; the pipeline has {len(ranks)}")
        units: dict[Unit, list[int]] = {}  # first and last instruction of each chunk
        for index, ins in enumerate(program.instructions):
            if ins.op not in (RUN, ALL_TO_ALL):
                continue
            task = tasks.get(ins.ref)
            if task is None or task.phase is Phase.WGRAD:
                continue
            stage = stage_of_layer.get(layer_of[task.name].name)
            if stage is None:
                raise ShippedStepsError(f"program @{program.name} runs @{ins.ref}, whose layer is in no stage of the partition")
            span = units.setdefault(("fwd" if task.phase is Phase.FWD else "bwd", stage, ins.mb), [index, index])
            span[1] = index
        got = list(units)
        at = 0
        previous_end = -1
        for k, step in enumerate(ranks[program.rank]):
            want = {("fwd", *step.fwd)} if step.fwd is not None else set()
            if step.bwd is not None:
                want.add(("bwd", *step.bwd))
            have = set(got[at:at + len(want)])
            if have != want:
                raise ShippedStepsError(
                    f"program @{program.name} ({program.where}) does not run step {k} of the {order} order "
                    f"({_describe(want)}) there: it runs {_describe(have) or 'nothing'}; rerun the pipeline pass"
                )
            # The pass lowers one step after the other: a step's chunks start after the last one's end.
            if units[got[at]][0] < previous_end:
                raise ShippedStepsError(
                    f"program @{program.name} ({program.where}) starts step {k} of the {order} order ({_describe(want)}) "
                    "before the step ahead of it has ended; rerun the pipeline pass"
                )
            previous_end = max(units[u][1] for u in want)
            at += len(want)
        if at != len(got):
            raise ShippedStepsError(f"program @{program.name} runs more chunks than the {order} order's steps")


def _describe(units: set[Unit]) -> str:
    return " beside ".join(f"the {d} of stage {s}, micro-batch {mb}" for d, s, mb in sorted(units, key=lambda u: u[0] != "fwd"))
