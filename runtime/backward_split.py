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
(``w.t()``, ``experts[e]``, ``a_log.exp()``, an embedding lookup) gives another
``WeightUse``; an operation that combines a parameter with an activation
(``F.linear(x, w)``, ``x * norm_weight``, ``conv1d(x, w)``) is a *weight
operation*. A weight operation runs as one node of the task's graph
(``_WeightOpNode``) that holds the operation's own one-operation graph:

- dgrad: one ``torch.autograd.grad`` from the task's outputs to its input
  leaves. At each weight operation the node computes, on its own small graph,
  the gradient of the activation side only (for a linear layer the one GEMM
  ``grad @ w``), keeps the gradient that arrived at its output, and sends
  nothing towards the weight;
- wgrad: for each weight operation, the weight side of that operation on its
  small graph (``grad^T @ x``), then the chain from the weight arguments back
  to the parameter leaves (transposes, indexing), which involves no activation.

Nothing runs twice, no call walks the task's whole graph again, and every
operation computes what it computes in an ordinary ``loss.backward()``, so the
values are bitwise the same. After dgrad the task's graph is freed; only the
inputs of its weight operations stay alive for wgrad. A weight applied several
times (experts, a recurrent weight) gets the sum of each application's weight
gradient, each from the gradient that reached that application.

A weight-gradient job runs at most once; the executor folds its result into
``param.grad`` in micro-batch order (``OrderedGradients``), so the order in
which DBO runs deferred jobs does not change a bit of the sums.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn


class SplitError(RuntimeError):
    """A task whose backward cannot be split, or a split job used twice."""


def _tensor_args(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], bool]:
    """The tensors among an operation's arguments, in order (one level into lists and tuples), and whether one is an activation.

    One pass, as every operation that touches a parameter comes through here.
    Token ids and routing indices select from a weight; they are not activations.
    """
    tensors: list[torch.Tensor] = []
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            tensors.append(value)
        elif isinstance(value, (list, tuple)):
            tensors.extend(v for v in value if isinstance(v, torch.Tensor))
    for t in tensors:
        if not isinstance(t, WeightUse) and (t.is_floating_point() or t.is_complex()):
            return tensors, True
    return tensors, False


class WeightUse(torch.Tensor):
    """A parameter (or a tensor computed from parameters alone) inside one task's forward."""

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        stack = getattr(_local, "stack", None)
        if not stack or not torch.is_grad_enabled():
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **kwargs)
        tensors, activation = _tensor_args(args, kwargs)
        if not activation:
            # Parameters only: the result is still weight side (w.t(), experts[e], -a.exp(), an embedding lookup).
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor):
                return out.as_subclass(WeightUse)
            if isinstance(out, (tuple, list)):
                return type(out)(o.as_subclass(WeightUse) if isinstance(o, torch.Tensor) else o for o in out)
            return out
        return _weight_op(stack[-1], func, args, kwargs, tensors)


@dataclass
class WeightOp:
    """One weight operation of a task: its own small graph, and the gradient that reached its output.

    ``weight_args`` are the operation's weight arguments as the task's graph has
    them (``WeightUse`` leaves, or tensors computed from them); ``inner_weights``
    the same tensors as leaves of the small graph. A task output computed from
    parameters alone (an embedding lookup) is an operation too: its ``outputs``
    are the task output itself and ``inner_weights`` its weight-side tensor.
    """

    outputs: tuple[torch.Tensor, ...]
    inner_weights: tuple[torch.Tensor, ...]
    weight_args: tuple[torch.Tensor, ...]
    grads: tuple[torch.Tensor | None, ...] | None = None


@dataclass
class _Recording:
    ops: list[WeightOp] = field(default_factory=list)


_local = threading.local()


def _rebuild(value: Any, tensors: Iterator[torch.Tensor]) -> Any:
    """``value`` (an argument, possibly a list or tuple of them) with each tensor replaced by the next of ``tensors``."""
    if isinstance(value, torch.Tensor):
        return next(tensors)
    if isinstance(value, (list, tuple)):
        return type(value)(_rebuild(v, tensors) for v in value)
    return value


def _engine() -> Any:
    """torch's autograd engine, to run many tiny backwards without the Python wrapper's per-call checks."""
    return getattr(getattr(torch.autograd, "Variable", None), "_execution_engine", None)


_ENGINE = _engine()


def _small_grad(outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], retain: bool) -> tuple[torch.Tensor | None, ...]:
    """``torch.autograd.grad(outputs, inputs, grads, retain_graph=retain, allow_unused=True)`` straight on the engine.

    Called once per weight operation and micro-batch, twice (dgrad, wgrad), and
    once per task's dgrad: the public wrapper's argument conversions cost more
    than a small operation's own backward here. The gradients are shaped by
    construction (the engine still checks each one against its output's shape).
    """
    if _ENGINE is not None:
        got: tuple[torch.Tensor | None, ...] = _ENGINE.run_backward(
            tuple(outputs), tuple(grads), retain, False, tuple(inputs), True, False
        )
        return got
    return torch.autograd.grad(outputs, inputs, grads, retain_graph=retain, allow_unused=True)


class _WeightOpNode(torch.autograd.Function):
    """A weight operation inside the task's graph; its backward sends gradients to activations only."""

    @staticmethod
    def forward(ctx: Any, call: Any, *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        func, args, kwargs, op, weight_flags = call
        with torch.enable_grad(), torch._C.DisableTorchFunctionSubclass():
            inner = [t.detach().requires_grad_(t.requires_grad) for t in tensors]
            it = iter(inner)
            if not kwargs and not any(isinstance(a, (list, tuple)) for a in args):
                # The common case (F.linear(x, w, None), x * w): no keyword, no list of tensors.
                out = func(*[next(it) if isinstance(a, torch.Tensor) else a for a in args])
            else:
                out = func(*_rebuild(args, it), **{k: _rebuild(v, it) for k, v in kwargs.items()})
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        op.outputs = tuple(outputs)
        op.inner_weights = tuple(t for t, w in zip(inner, weight_flags) if w)
        ctx.op, ctx.inner, ctx.weight_flags = op, inner, weight_flags
        ctx.multiple = isinstance(out, (tuple, list))
        detached = tuple(o.detach() for o in outputs)
        return detached if ctx.multiple else detached[0]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> Any:
        op: WeightOp = ctx.op
        if op.grads is not None:
            raise SplitError("a weight operation's data gradient was computed twice")
        op.grads = tuple(grads)
        wanted = [i for i, (t, w) in enumerate(zip(ctx.inner, ctx.weight_flags)) if not w and t.requires_grad]
        pairs = [(o, g) for o, g in zip(op.outputs, grads) if o.requires_grad and g is not None]
        got: tuple[torch.Tensor | None, ...] = (None,) * len(wanted)
        if wanted and pairs:
            # The activation side only; the small graph is kept for the weight side (wgrad).
            got = _small_grad([o for o, _ in pairs], [ctx.inner[i] for i in wanted], [g for _, g in pairs], True)
        out: list[torch.Tensor | None] = [None] * len(ctx.inner)
        for i, g in zip(wanted, got):
            out[i] = g
        ctx.inner = None
        return (None, *out)


def _weight_op(recording: _Recording, func: Any, args: Sequence[Any], kwargs: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    flags = tuple(isinstance(t, WeightUse) for t in tensors)
    op = WeightOp((), (), tuple(t for t, w in zip(tensors, flags) if w))
    recording.ops.append(op)
    with torch._C.DisableTorchFunctionSubclass():
        return _WeightOpNode.apply((func, args, kwargs, op, flags), *tensors)


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
    weight_side: tuple[WeightOp, ...]  # task outputs computed from parameters alone
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
                outputs = fn(*leaf_inputs, *extra)
        finally:
            stack.pop()
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        handed_out, weight_side = [], []
        for out in outputs:
            if isinstance(out, WeightUse):
                plain = out.as_subclass(torch.Tensor)  # all weight side (see WeightOp)
                weight_side.append(WeightOp((plain,), (out,), (out,)))
                out = plain
            handed_out.append(out)
        grad_inputs = tuple(t if t is not None and t.requires_grad else None for t in leaf_inputs)
        return TaskGraph(name, grad_inputs, tuple(handed_out), tuple(slots), leaves, recording.ops, tuple(weight_side))


def _as_leaf(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    if t.is_floating_point():
        return t.detach().requires_grad_()
    return t


@dataclass
class WeightGradJob:
    """The deferred half of a task's backward: its weight gradients, computable exactly once."""

    graph: TaskGraph
    done: bool = False

    def run(self) -> dict[str, torch.Tensor | None]:
        """Gradient of every parameter of the task (None for one the task did not use)."""
        if self.done:
            raise SplitError(f"the weight gradients of '{self.graph.name}' were already computed")
        self.done = True
        graph = self.graph
        per_arg: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        weight_side = {id(op) for op in graph.weight_side}
        for op in (*graph.ops, *graph.weight_side):
            if op.grads is None:
                continue  # its output received no gradient
            pairs = [(o, g) for o, g in zip(op.outputs, op.grads) if g is not None and o.requires_grad]
            if not pairs:
                continue
            if id(op) in weight_side:
                grads: Sequence[torch.Tensor | None] = [pairs[0][1]]  # the output is the weight-side tensor itself
            else:
                grads = _small_grad([o for o, _ in pairs], op.inner_weights, [g for _, g in pairs], False)
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
            back = _small_grad(derived_args, graph.leaves, derived_grads, False)
            for i, g in enumerate(back):
                if g is not None:
                    previous = result[i]
                    result[i] = g if previous is None else previous + g
        # The small graphs (and the activations they hold) are released with this job.
        graph.ops, graph.weight_side = [], ()
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
    weight_side = {id(op.outputs[0]): op for op in graph.weight_side}
    outs, grads = [], []
    for out, g in zip(graph.outputs, grad_outputs):
        if not out.requires_grad or (g is None and out.dim() != 0):
            continue
        g = g if g is not None else torch.ones_like(out)
        if id(out) in weight_side:
            weight_side[id(out)].grads = (g,)  # all of it is weight gradient, for wgrad
            continue
        outs.append(out)
        grads.append(g)
    inputs = [t for t in graph.inputs if t is not None]
    got: tuple[torch.Tensor | None, ...] = (None,) * len(inputs)
    if outs:
        # Through every weight operation this computes the activation side only (_WeightOpNode).
        targets = inputs or [leaf for leaf in graph.leaves]  # no input to reach: still let the weight operations see their gradients
        result = _small_grad(outs, targets, grads, False)
        got = result[: len(inputs)] if inputs else got
    it = iter(got)
    input_grads = tuple(next(it) if t is not None else None for t in graph.inputs)
    graph.outputs = ()
    return input_grads, WeightGradJob(graph)


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
