"""The backward of a task split in two: data gradients now, weight gradients later, exactly once.

A plan runs each task of a layer (mixer, router, expert GEMMs, ...) as its own
piece of autograd graph: its inputs are fresh leaves, its outputs are handed to
the tasks that consume them. The task's ``dgrad`` computes the gradients of its
inputs, which the previous task is waiting for, and nothing else; its
``wgrad`` computes the gradients of its weights, which nobody waits for until
the gradient reduction, so the plan (and DBO) may run it later.

How the split works. While a task's forward runs, each of its parameters is
replaced by a ``WeightUse`` leaf that shares the parameter's storage. Its
``__torch_function__`` sees only the operations that touch a parameter (the
rest of the forward runs at full speed): an operation on parameters alone
(``w.t()``, ``experts[e]``, ``a_log.exp()``) gives another ``WeightUse``; an
operation that combines a parameter with an activation (``F.linear(x, w)``,
``x * norm_weight``) is a *weight operation*, and its output is recorded.

- dgrad: one ``torch.autograd.grad`` from the task's outputs to its input
  leaves *and* to the recorded weight-operation outputs. Autograd computes only
  what those need: through a weight operation it computes the gradient of the
  activation side, not the weight side. The gradients that arrive at the
  weight-operation outputs are kept.
- wgrad: for each weight operation, the weight side of that one operation
  (``autograd.grad(output, weight_args, kept_grad)``: for a linear layer the one
  GEMM ``grad^T @ x``), then the chain from the weight arguments back to the
  parameter leaves (transposes, indexing), which involves no activation. No
  part of the backward runs twice, and each node computes what it computes in
  an ordinary ``loss.backward()``, so the values are bitwise the same.

A weight-gradient job runs at most once; the executor folds its result into
``param.grad`` in micro-batch order (``OrderedGradients``), so the order in
which DBO runs deferred jobs does not change a bit of the sums.

Limit: a parameter applied again to an output of its own earlier use within one
task (a recurrent weight) would have its later uses counted twice in wgrad;
``run_forward`` refuses such a task instead of computing a wrong gradient.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class SplitError(RuntimeError):
    """A task whose backward cannot be split, or a split job used twice."""


class WeightUse(torch.Tensor):
    """A parameter (or a tensor computed from parameters alone) inside one task's forward."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        recording = _current_recording()
        if recording is None or not isinstance(out, (torch.Tensor, tuple, list)):
            return out
        weights: list[torch.Tensor] = []
        activations = False
        for arg in _flat(args, kwargs):
            if isinstance(arg, WeightUse):
                weights.append(arg)
            elif isinstance(arg, torch.Tensor) and (arg.is_floating_point() or arg.is_complex()):
                activations = True  # token ids and routing indices select from a weight; they are not activations
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        if not activations:
            # Parameters only: the result is still "weight side" (w.t(), experts[e], -a.exp()).
            wrapped = [o.as_subclass(WeightUse) if isinstance(o, torch.Tensor) else o for o in outputs]
            return wrapped[0] if not isinstance(out, (tuple, list)) else type(out)(wrapped)
        for o in outputs:
            if isinstance(o, torch.Tensor) and o.requires_grad:
                recording.add(o, tuple(weights))
        return out


def _flat(args: Sequence[Any], kwargs: dict[str, Any]) -> Iterator[Any]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from value
        else:
            yield value


@dataclass
class WeightOp:
    """An operation that combined parameters with activations, and its output.

    A task output computed from parameters alone (an embedding lookup) is
    handed out as a plain alias; the alias is then the "operation", so the
    gradient that arrives at it goes all to the weight side.
    """

    output: torch.Tensor
    weight_args: tuple[torch.Tensor, ...]


@dataclass
class _Recording:
    ops: list[WeightOp] = field(default_factory=list)
    seen: set[int] = field(default_factory=set)  # ids of recorded outputs (one op may return several)

    def add(self, output: torch.Tensor, weight_args: tuple[torch.Tensor, ...]) -> None:
        if id(output) not in self.seen:
            self.seen.add(id(output))
            self.ops.append(WeightOp(output, weight_args))


_local = threading.local()


def _current_recording() -> _Recording | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@dataclass(frozen=True)
class ParamSlot:
    """Where a task finds one of its parameters: ``module.<attr>``, named ``key`` in the model."""

    key: str
    module: nn.Module
    attr: str

    @property
    def param(self) -> torch.Tensor:
        value = self.module._parameters[self.attr]
        assert value is not None
        return value


class _WeightLeaves:
    """One ``WeightUse`` leaf per parameter, reused across micro-batches and iterations.

    A leaf shares its parameter's storage, so optimizer steps (in place) are seen;
    it is rebuilt if the parameter tensor itself was replaced.
    """

    def __init__(self) -> None:
        self._leaves: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def leaf(self, param: torch.Tensor) -> torch.Tensor:
        entry = self._leaves.get(id(param))
        if entry is None or entry[0] is not param:
            leaf = torch.Tensor._make_subclass(WeightUse, param.detach(), True)
            entry = (param, leaf)
            self._leaves[id(param)] = entry
        return entry[1]


@contextmanager
def _weights_swapped(slots: Sequence[ParamSlot], leaves: Sequence[torch.Tensor]) -> Iterator[None]:
    saved = [(s.module, s.attr, s.module._parameters[s.attr]) for s in slots]
    try:
        for s, leaf in zip(slots, leaves):
            s.module._parameters[s.attr] = leaf  # type: ignore[assignment]
        yield
    finally:
        for module, attr, param in saved:
            module._parameters[attr] = param


@dataclass
class TaskGraph:
    """The forward of one task for one micro-batch, kept until its backward has run."""

    name: str
    inputs: tuple[torch.Tensor | None, ...]  # leaves (None where an input carries no gradient)
    outputs: tuple[torch.Tensor, ...]
    slots: tuple[ParamSlot, ...]
    leaves: tuple[torch.Tensor, ...]
    ops: list[WeightOp]
    dgrad_done: bool = False


class ForwardRunner:
    """Runs task forwards with their parameters swapped for ``WeightUse`` leaves."""

    def __init__(self) -> None:
        self._leaves = _WeightLeaves()

    def run(
        self,
        name: str,
        fn: Callable[..., tuple[torch.Tensor, ...]],
        inputs: Sequence[torch.Tensor | None],
        slots: Sequence[ParamSlot],
        extra: Sequence[Any] = (),
    ) -> TaskGraph:
        """``fn(*leaf_inputs, *extra)`` for one micro-batch; ``inputs`` are cut from their producers here.

        Floating-point inputs become leaves that require grad; anything else
        (token ids, routing indices) passes through as is.
        """
        leaf_inputs = tuple(_as_leaf(t) for t in inputs)
        leaves = tuple(self._leaves.leaf(s.param) for s in slots)
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        recording = _Recording()
        stack.append(recording)
        try:
            with _weights_swapped(slots, leaves):
                outputs = fn(*(t if t is not None else None for t in leaf_inputs), *extra)
        finally:
            stack.pop()
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        handed_out = []
        for out in outputs:
            if isinstance(out, WeightUse):
                plain = out.as_subclass(torch.Tensor)  # all weight side (see WeightOp)
                recording.ops.append(WeightOp(plain, (out,)))
                out = plain
            handed_out.append(out)
        outputs = tuple(handed_out)
        grad_inputs = tuple(t if t is not None and t.requires_grad else None for t in leaf_inputs)
        graph = TaskGraph(name, grad_inputs, tuple(outputs), tuple(slots), leaves, recording.ops)
        _refuse_chained_weights(graph)
        return graph


def _as_leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.is_floating_point():
        return t.detach().requires_grad_()
    return t


def _refuse_chained_weights(graph: TaskGraph) -> None:
    """Refuse a task in which a parameter is applied to an output of its own earlier use.

    Checked on the autograd graph between the recorded operations: only tasks
    that record a parameter more than once pay for the walk.
    """
    uses: dict[int, list[int]] = {}
    for i, op in enumerate(graph.ops):
        for leaf_index in _leaf_sources(op.weight_args, graph.leaves):
            uses.setdefault(leaf_index, []).append(i)
    for leaf_index, op_indices in uses.items():
        if len(op_indices) < 2:
            continue
        nodes = {graph.ops[i].output.grad_fn for i in op_indices}
        for i in op_indices:
            node = graph.ops[i].output.grad_fn
            for earlier in _reachable(node, nodes - {node}):
                if earlier is not None:
                    raise SplitError(
                        f"task '{graph.name}': parameter '{graph.slots[leaf_index].key}' is applied to the output of "
                        "its own earlier use (a recurrent weight); its weight gradient cannot be split from the data "
                        "gradient, so run this model without deferred weight gradients"
                    )


def _upstream(starts: Iterable[Any]) -> Iterator[Any]:
    """Every autograd node reachable from ``starts`` towards the inputs, each once."""
    stack = list(starts)
    seen: set[Any] = set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        yield node
        stack.extend(n for n, _ in node.next_functions)


def _leaf_sources(weight_args: Sequence[torch.Tensor], leaves: Sequence[torch.Tensor]) -> set[int]:
    """Which parameter leaves the weight arguments of an operation come from."""
    ids = {id(leaf): i for i, leaf in enumerate(leaves)}
    found: set[int] = set()
    for arg in weight_args:
        if id(arg) in ids:
            found.add(ids[id(arg)])
            continue
        for node in _upstream([arg.grad_fn]):
            variable = getattr(node, "variable", None)
            if variable is not None and id(variable) in ids:
                found.add(ids[id(variable)])
    return found


def _reachable(start: Any, targets: set[Any]) -> Iterator[Any]:
    """The nodes of ``targets`` reachable from ``start`` going towards the inputs."""
    if not targets or start is None:
        return
    yield from (node for node in _upstream(n for n, _ in start.next_functions) if node in targets)


@dataclass
class WeightGradJob:
    """The deferred half of a task's backward: its weight gradients, computable exactly once."""

    graph: TaskGraph
    op_grads: list[torch.Tensor | None]
    done: bool = False

    def run(self) -> dict[str, torch.Tensor | None]:
        """Gradient of every parameter of the task (None for one the task did not use)."""
        if self.done:
            raise SplitError(f"the weight gradients of '{self.graph.name}' were already computed")
        self.done = True
        graph = self.graph
        per_arg: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        for op, grad in zip(graph.ops, self.op_grads):
            if grad is None:
                continue
            grads = torch.autograd.grad(op.output, op.weight_args, grad, retain_graph=True, allow_unused=True)
            for arg, g in zip(op.weight_args, grads):
                if g is None:
                    continue
                key = id(arg)
                per_arg[key] = (arg, g if key not in per_arg else per_arg[key][1] + g)
        leaf_ids = {id(leaf): i for i, leaf in enumerate(graph.leaves)}
        result: list[torch.Tensor | None] = [None] * len(graph.leaves)
        derived_args, derived_grads = [], []
        for key, (arg, g) in per_arg.items():
            if key in leaf_ids:
                result[leaf_ids[key]] = g
            else:
                derived_args.append(arg)
                derived_grads.append(g)
        if derived_args:
            # Back from w.t(), experts[e], ... to the parameter leaves: no activation is involved.
            grads = torch.autograd.grad(derived_args, graph.leaves, derived_grads, allow_unused=True)
            for i, g in enumerate(grads):
                if g is not None:
                    previous = result[i]
                    result[i] = g if previous is None else previous + g
        # The graph (and the activations it holds) is released with this job.
        self.op_grads = []
        graph.ops = []
        return {slot.key: g for slot, g in zip(graph.slots, result)}


def backward_data(graph: TaskGraph, grad_outputs: Sequence[torch.Tensor | None]) -> tuple[tuple[torch.Tensor | None, ...], WeightGradJob]:
    """The dgrad of a task: gradients of its inputs now, and the job that computes its weights' later.

    ``grad_outputs`` has one entry per output (None: no gradient flows into it;
    a scalar output such as a loss gets the implicit 1).
    """
    if graph.dgrad_done:
        raise SplitError(f"the data gradients of '{graph.name}' were already computed")
    graph.dgrad_done = True
    if len(grad_outputs) != len(graph.outputs):
        raise SplitError(f"'{graph.name}' has {len(graph.outputs)} outputs but got {len(grad_outputs)} gradients")
    outs, grads = [], []
    for out, g in zip(graph.outputs, grad_outputs):
        if out.requires_grad and (g is not None or out.dim() == 0):
            outs.append(out)
            grads.append(g if g is not None else torch.ones_like(out))
    inputs = [t for t in graph.inputs if t is not None]
    targets = inputs + [op.output for op in graph.ops]
    got: tuple[torch.Tensor | None, ...] = (None,) * len(targets)
    if outs and targets:
        got = torch.autograd.grad(outs, targets, grads, retain_graph=bool(graph.ops), allow_unused=True)
    it = iter(got[: len(inputs)])
    input_grads = tuple(next(it) if t is not None else None for t in graph.inputs)
    graph.outputs = ()
    return input_grads, WeightGradJob(graph, list(got[len(inputs) :]))


class OrderedGradients:
    """Weight gradients folded into ``param.grad`` in micro-batch order, whatever order they arrive in.

    ``loss.backward()`` per micro-batch accumulates ``g0``, then ``+ g1``, ...;
    float addition is not associative, so folding in any other order would
    change the last bits. A gradient that arrives early waits here.
    """

    def __init__(self, params: dict[str, torch.Tensor], microbatches: int):
        self.params = params
        self.microbatches = microbatches
        self._next: dict[str, int] = {}
        self._waiting: dict[str, dict[int, torch.Tensor | None]] = {}

    def begin_iteration(self) -> None:
        self._next = dict.fromkeys(self.params, 0)
        self._waiting = {k: {} for k in self.params}

    def add(self, key: str, mb: int, grad: torch.Tensor | None) -> None:
        if key not in self.params:
            raise SplitError(f"a weight gradient for '{key}', which is not a parameter this rank trains")
        waiting = self._waiting[key]
        if mb in waiting or mb < self._next[key]:
            raise SplitError(f"the weight gradient of '{key}' for micro-batch {mb} arrived twice")
        waiting[mb] = grad
        param = self.params[key]
        while self._next[key] in waiting:
            g = waiting.pop(self._next[key])
            self._next[key] += 1
            if g is None:
                continue
            if param.grad is None:
                param.grad = g.detach().clone() if g._base is not None or not g.is_contiguous() else g.detach()
            else:
                param.grad.add_(g)

    def complete(self, key: str) -> bool:
        """Whether every micro-batch's gradient of ``key`` has been folded in."""
        return self._next.get(key, 0) >= self.microbatches

    def missing(self) -> list[tuple[str, int]]:
        """(parameter, first micro-batch not yet folded) for every parameter not complete."""
        return [(k, n) for k, n in self._next.items() if n < self.microbatches]
