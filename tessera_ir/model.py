"""The Tessera IR data model: module -> layers -> tasks, plus plan-level ops.

The IR is plain data. It knows nothing of torch, of the frontend or of any pass;
passes read and rewrite it, the printer and parser turn it into text and back.

Attribute values (``Value``) are the small set the text format can spell:
int, float, str, bool, a symbol reference (``@name``), and lists of values.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Union

from tessera_ir.kinds import FfnKind, LayerRole, MixerKind, Phase, Resource, TaskOp


@dataclass(frozen=True)
class SymbolRef:
    """A reference to a named entity (task, layer or plan op), printed as ``@name``."""

    name: str


Value = Union[bool, int, float, str, SymbolRef, list["Value"]]  # noqa: UP007 (recursive alias)
Attrs = dict[str, Value]

# How many lists deep an attribute value may nest. The parser, the printer and the
# verifier each enforce it, so no code that walks a value recursively (printing,
# ``==``, ``repr``) can run out of stack on user input; real values nest two or three deep.
MAX_VALUE_DEPTH = 64


def value_depth(value: object) -> int:
    """How many lists deep ``value`` nests (0 for a scalar), found without recursion.

    Stops counting past ``MAX_VALUE_DEPTH + 1``, so a list that contains itself has a depth too.
    """
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list):
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > MAX_VALUE_DEPTH:
                    return deepest
            stack.extend((child, depth) for child in item if isinstance(child, list))
    return deepest


# The typed fields every task has, in the order the printer writes them before its other attributes.
CORE_TASK_FIELDS = ("flops", "bytes", "param_bytes", "act_bytes", "shapes", "movable")


@dataclass
class Task:
    """One unit of work on one resource.

    Core attributes are typed fields; attributes added by later passes (cost,
    start, stream, deadline, ...) live in ``attrs``.

    - ``flops``: floating-point operations of this task for one micro-batch.
    - ``bytes``: bytes moved by the task; for comm tasks the bytes each rank
      sends over the network, for compute tasks the bytes read and written in
      device memory (the roofline's memory side).
    - ``param_bytes``: bytes of the weights the task owns (0 for comm tasks and
      for dgrad/wgrad mirrors, which refer to the forward task's weights).
    - ``act_bytes``: activation bytes the task keeps alive for the backward pass.
    - ``shapes``: the main tensor shapes, inputs first then outputs.
    - ``movable``: true for weight-gradient tasks, which may run later than
      their dgrad, up to a deadline.
    """

    name: str
    op: TaskOp
    phase: Phase
    resource: Resource
    deps: list[str] = field(default_factory=list)
    flops: int = 0
    bytes: int = 0
    param_bytes: int = 0
    act_bytes: int = 0
    shapes: list[list[int]] = field(default_factory=list)
    movable: bool = False
    attrs: Attrs = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return f"{self.op.value}.{self.phase.value}"


@dataclass
class Layer:
    """A layer of the model, in execution order, with its tasks.

    ``index`` numbers decoder layers from 0; embedding and head layers have none.
    ``path`` is the module path in the source model (``model.layers.3``).
    """

    name: str
    role: LayerRole
    path: str
    mixer: MixerKind = MixerKind.NONE
    ffn: FfnKind = FfnKind.NONE
    index: int | None = None
    attrs: Attrs = field(default_factory=dict)
    tasks: list[Task] = field(default_factory=list)

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass
class PlanEntry:
    """A per-task line inside a plan op (e.g. one task's slot in a pair schedule)."""

    ref: str
    attrs: Attrs = field(default_factory=dict)


@dataclass
class PlanOp:
    """A plan-level construct: a stage candidate, a pair schedule, the partition, ...

    ``op`` names the construct (``candidate``, ``pair_schedule``, ``partition``);
    passes own the meaning of their ops' attributes and entries.
    """

    op: str
    name: str
    attrs: Attrs = field(default_factory=dict)
    entries: list[PlanEntry] = field(default_factory=list)


@dataclass
class Module:
    """A whole model: header attributes, layers in order, plan ops."""

    name: str
    attrs: Attrs = field(default_factory=dict)
    layers: list[Layer] = field(default_factory=list)
    plan: list[PlanOp] = field(default_factory=list)
    # Where each entity was written, when the module came from text: keys are
    # "module", "layer:NAME", "task:NAME", "plan:NAME" and "entry:PLAN:REF" (a
    # plan op's entry); values are 1-based (line, column). A name defined again
    # keeps its first position under the plain key and the k-th under "KEY#k".
    # Not part of the IR's value: ignored by ==.
    locations: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False, repr=False)
    source: str | None = field(default=None, compare=False, repr=False)

    # How many times each location key was recorded, so that the k-th definition
    # of a name is numbered in constant time.
    _location_counts: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def locate(self, key: str, line: int, column: int) -> None:
        """Record where the entity ``key`` was written (see ``locations``)."""
        locations = self.locations
        if key not in locations:
            locations[key] = (line, column)
            return
        k = self._location_counts.get(key, 1) + 1
        self._location_counts[key] = k
        locations[f"{key}#{k}"] = (line, column)

    def tasks(self) -> Iterator[Task]:
        for layer in self.layers:
            yield from layer.tasks

    def task_map(self) -> dict[str, Task]:
        return {t.name: t for t in self.tasks()}

    def layer_of_task(self) -> dict[str, Layer]:
        return {t.name: layer for layer in self.layers for t in layer.tasks}

    def decoder_layers(self) -> list[Layer]:
        return [layer for layer in self.layers if layer.role is LayerRole.DECODER]

    def plan_ops(self, op: str) -> list[PlanOp]:
        return [p for p in self.plan if p.op == op]
