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
``x * norm_weight``, ``conv1d(x, w)``) or looks rows up in it (an embedding) is
a *weight operation*.

The commonest views of a parameter (``experts[e]``, ``w.t()``, ``w.transpose(a, b)``)
are taken outside autograd on a plain alias of its storage, once per leaf and
reused: the wgrad adds such a view's gradient straight into its slice of the
parameter's gradient, so an expert GEMM ``x @ experts[e].t()`` costs one node
and no weight-side graph. A view that reaches an operation without a rule is
put back on autograd's graph first.

The common weight operations (a linear layer with or without a bias, a matrix
product or batched GEMM with a weight, a norm's elementwise scale,
``layer_norm`` and ``rms_norm`` with a weight, a bias, an embedding lookup, a
convolution) have dedicated rules (``_RULES``): one autograd node each
(``_SplitNode``) whose backward computes the activation's gradient with the
formula autograd itself uses and keeps ``(activation, grad_output)``; the
wgrad computes the weight's gradient from them later, as delayed-wgrad
pipelines do. One engine call per task's dgrad, none per operation.

Any other weight operation takes the general path, and says so (a
``GeneralSplitWarning`` once per operation, ``general_ops`` per task): it runs
as one node of the task's graph (``_WeightOpNode``) that holds the operation's
own one-operation graph:

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
import warnings
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

    # A view of a parameter taken in the forward (``experts[e]``, ``w.t()``) is computed on a plain alias of
    # its storage, outside autograd: ``_root`` is the parameter's leaf, ``_steps`` the views from it, and the
    # wgrad writes the view's gradient straight into the leaf's (``_scatter_view_grad``). Leaves have
    # ``_plain`` (their storage as a plain tensor) and no ``_root``; a tensor computed from parameters by
    # anything else is on autograd's graph and has neither.
    _plain: torch.Tensor | None = None
    _root: WeightUse | None = None
    _steps: tuple[tuple[Any, ...], ...] = ()
    _views: dict[tuple[Any, ...], WeightUse] | None = None  # the fast views taken of this tensor, reused

    # ``experts[e]`` and ``w.t()`` as methods: no trip through ``__torch_function__`` for the commonest views.
    def __getitem__(self, index: Any) -> Any:
        if type(index) is int and self._plain is not None and getattr(_local, "stack", None) and torch.is_grad_enabled():
            return _cached_view(self, ("select", index))
        return super().__getitem__(index)

    def t(self) -> Any:
        if self._plain is not None and getattr(_local, "stack", None) and torch.is_grad_enabled():
            return _cached_view(self, ("t",))
        return super().t()

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None) -> Any:
        stack = getattr(_local, "stack", None)
        if not stack or not torch.is_grad_enabled():
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        view = _VIEWS.get(func)
        if view is not None and not kwargs:
            out = _fast_view(view, args)
            if out is not None:
                return out
        kwargs = kwargs or {}
        rule = _RULES.get(func)
        if rule is not None:
            # Checked with the subclass off: every w.dim() or w.dtype would come back here otherwise.
            with torch._C.DisableTorchFunctionSubclass():
                match = rule.match(args, kwargs)
                if match is not None:
                    stack[-1].ops.append(match)
                    func, args, kwargs, activation = match.rule.call(match, func, args, kwargs)
                    return _apply_split(_SplitNode, match, func, args, kwargs, activation, *match.weights)
        tensors, activation = _tensor_args(args, kwargs)
        if any(isinstance(t, WeightUse) and t._root is not None for t in tensors):
            # An operation no rule covers on a fast view: put the view on autograd's graph first.
            args, kwargs = _tracked_args(args, kwargs)
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


def _view_step(args: Sequence[Any], name: str) -> tuple[Any, ...] | None:
    """The view step ``args`` describe (``("select", i)``, ``("t",)``, ``("transpose", a, b)``), or None if it is not one."""
    if name == "select":
        if len(args) == 2 and type(args[1]) is int:
            return ("select", args[1])
    elif name == "t":
        if len(args) == 1:
            return ("t",)
    elif len(args) == 3 and type(args[1]) is int and type(args[2]) is int:
        return ("transpose", args[1], args[2])
    return None


def _apply_step(t: torch.Tensor, step: tuple[Any, ...]) -> torch.Tensor:
    # torch.Tensor's own methods: on a leaf, WeightUse's would make another fast view.
    if step[0] == "select":
        return torch.Tensor.__getitem__(t, step[1])
    if step[0] == "t":
        return torch.Tensor.t(t)
    return torch.Tensor.transpose(t, step[1], step[2])


_VIEWS: dict[Any, str] = {torch.Tensor.__getitem__: "select", torch.Tensor.t: "t", torch.Tensor.transpose: "transpose"}
"""The views of a parameter computed outside autograd (the weight's gradient is scattered back by hand)."""


def _fast_view(name: str, args: Sequence[Any]) -> WeightUse | None:
    """``experts[e]``, ``w.t()``, ``w.transpose(a, b)`` of a leaf or of such a view: one cheap view, no graph node."""
    base = args[0]
    if not isinstance(base, WeightUse) or base._plain is None:
        return None
    step = _view_step(args, name)
    if step is None:
        return None
    return _cached_view(base, step)


def _cached_view(base: WeightUse, step: tuple[Any, ...]) -> WeightUse:
    """The view ``step`` of ``base`` (a leaf or a fast view), made once and reused while the leaf lives.

    It shares the parameter's storage, so in-place optimizer steps are seen; the
    wgrad keys gradients per job, so one view object serving every micro-batch is fine.
    """
    views = base._views
    if views is None:
        views = base._views = {}
    out = views.get(step)
    if out is None:
        assert base._plain is not None
        viewed = _apply_step(base._plain, step)
        out = viewed.as_subclass(WeightUse)  # type: ignore[assignment]
        out._plain = viewed
        root = base._root
        out._root = base if root is None else root
        out._steps = (*base._steps, step)
        views[step] = out
    return out


def _tracked(view: WeightUse) -> torch.Tensor:
    """A fast view as the same view of its leaf on autograd's graph (for an operation without a rule)."""
    assert view._root is not None
    with torch._C.DisableTorchFunctionSubclass():
        t: torch.Tensor = view._root
        for step in view._steps:
            t = _apply_step(t, step)
    return t.as_subclass(WeightUse)


def _tracked_args(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    def swap(value: Any) -> Any:
        if isinstance(value, WeightUse) and value._root is not None:
            return _tracked(value)
        if isinstance(value, (list, tuple)):
            return type(value)(swap(v) for v in value)
        return value

    return tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}


def _scatter_view_grad(into: torch.Tensor, steps: Sequence[tuple[Any, ...]], grad: torch.Tensor) -> None:
    """Adds a view's gradient to its leaf's (``into``, the leaf's shape): what autograd's view backwards compute.

    ``select`` backward is zeros with the gradient in the selected slice and
    autograd sums those; adding into one zero tensor gives the same values.
    """
    region = into
    for step in steps:
        region = _apply_step(region, step)
    region.add_(grad)


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
    ops: list[WeightOp | SplitOp] = field(default_factory=list)
    general: list[str] = field(default_factory=list)  # the operations that took the general path, by name


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


def _op_name(func: Any) -> str:
    return str(getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or func)


_warned: set[str] = set()


def _weight_op(recording: _Recording, func: Any, args: Sequence[Any], kwargs: dict[str, Any], tensors: list[torch.Tensor]) -> Any:
    name = _op_name(func)
    recording.general.append(name)
    if name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"'{name}' with a parameter has no dedicated backward split: it takes the general path "
            "(a small graph and two autograd engine calls per use; counted as split_general_ops)",
            GeneralSplitWarning,
            stacklevel=3,
        )
    flags = tuple(isinstance(t, WeightUse) for t in tensors)
    op = WeightOp((), (), tuple(t for t, w in zip(tensors, flags) if w))
    recording.ops.append(op)
    with torch._C.DisableTorchFunctionSubclass():
        return _WeightOpNode.apply((func, args, kwargs, op, flags), *tensors)


# ------------------------------------------------------------ dedicated splits of the common weight operations
#
# A linear layer, a matrix product with a weight on the right, a batched GEMM,
# an elementwise multiply or add with a weight (a norm's scale, a bias), an
# embedding lookup and a convolution each have their own rule: the forward is
# the operation itself, the dgrad computes the activation's gradient with the
# formula autograd uses for it and keeps ``(activation, grad_output)``, and the
# wgrad computes the weight's gradient from them the same way. No small graph,
# no nested engine call: one engine call per task's dgrad, and at most one per
# task's wgrad (for weights reached through ``w.t()``, ``experts[e]``, ...).
# Each formula repeats the one in torch's derivatives (same operations, same
# operand layouts), so the values are bitwise those of ``loss.backward()``.


class GeneralSplitWarning(UserWarning):
    """A weight operation without a dedicated split took the general (slower) path; named once per operation."""


@dataclass(eq=False, slots=True)
class SplitOp:
    """One weight operation split by its rule: what its two halves need, and the gradient that reached it."""

    rule: _SplitRule
    x: torch.Tensor | None  # the activation as the operation saw it (detached), or the indices of a lookup
    weights: tuple[torch.Tensor, ...]  # the weight arguments (``WeightUse``), as the task's graph has them
    settings: tuple[Any, ...] = ()
    grad: torch.Tensor | None = None

    @property
    def weight_args(self) -> tuple[torch.Tensor, ...]:
        return self.weights

    def weight_grads(self) -> tuple[torch.Tensor | None, ...]:
        assert self.grad is not None
        grads = self.rule.weight_grads(self, self.grad)
        # A gradient that is the output's own (an unbroadcast add) is also on its way to the activation.
        return tuple(g.clone() if g is self.grad else g for g in grads)


class _SplitRule:
    """How one kind of weight operation is split; ``match`` says whether a call is of that kind."""

    name = ""

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        raise NotImplementedError

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        raise NotImplementedError

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        raise NotImplementedError

    def call(self, op: SplitOp, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Sequence[Any], dict[str, Any], Any]:
        """What the node's forward runs, ``(func, args, kwargs)``, and the activation its dgrad reaches."""
        return func, args, kwargs, (args[0] if not isinstance(args[0], WeightUse) else args[1])


def _bound(args: Sequence[Any], kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, Any] | None:
    """``args`` and ``kwargs`` by parameter name (``names`` in order), or None if they do not fit."""
    if len(args) > len(names) or not set(kwargs) <= set(names):
        return None
    bound = dict(zip(names, args))
    if set(bound) & set(kwargs):
        return None
    bound.update(kwargs)
    return bound


def _activation(t: Any, like: torch.Tensor) -> bool:
    """``t`` is an activation a dedicated rule can pair with weight ``like``: a plain floating tensor of its dtype and device."""
    return (
        isinstance(t, torch.Tensor) and not isinstance(t, WeightUse) and t.dtype == like.dtype
        and t.device == like.device and t.is_floating_point()
    )


def _column_major(t: torch.Tensor) -> bool:
    return t.stride(0) == 1 and t.stride(1) == t.size(0)


def _mm_mat1_grad(grad: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """The gradient of ``mat1`` in ``mat1.mm(mat2)``, laid out as autograd's ``mm`` backward lays it out."""
    if _column_major(mat1):
        return mat2.mm(grad.t()).t()
    return grad.mm(mat2.t())


def _mm_mat2_grad(grad: torch.Tensor, mat1: torch.Tensor, mat2: torch.Tensor) -> torch.Tensor:
    """The gradient of ``mat2`` in ``mat1.mm(mat2)``, laid out as autograd's ``mm`` backward lays it out."""
    if _column_major(mat2):
        return grad.t().mm(mat1).t()
    return mat1.t().mm(grad)


def _folded(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``matmul`` multiplies it by a matrix: its leading dimensions folded into the rows."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


class _MatmulRule(_SplitRule):
    """``x @ W`` with a weight matrix on the right (``matmul`` folds ``x``'s leading dimensions into one ``mm``)."""

    name = "matmul"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        if kwargs or len(args) != 2:
            return None
        x, w = args
        if not isinstance(w, WeightUse) or w.dim() != 2 or not _activation(x, w) or x.dim() < 2:
            return None
        return SplitOp(self, _folded(x.detach()), (w,), (x.shape,))

    def _right(self, op: SplitOp) -> torch.Tensor:
        return op.weights[0]

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        assert op.x is not None
        g = _mm_mat1_grad(_folded(grad), op.x, self._right(op))
        shape = op.settings[0]
        return g if len(shape) == 2 else g.reshape(shape)

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        assert op.x is not None
        return (_mm_mat2_grad(_folded(grad), op.x, self._right(op)),)


class _LinearRule(_MatmulRule):
    """``F.linear(x, w)`` without bias: ``matmul(x, w.t())``, and the weight's gradient transposed back."""

    name = "linear"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        if len(args) == 3 and args[2] is None and not kwargs:
            args = args[:2]
        elif kwargs and (len(args) != 2 or set(kwargs) != {"bias"} or kwargs["bias"] is not None):
            return None
        return super().match(args, {})

    def _right(self, op: SplitOp) -> torch.Tensor:
        return op.weights[0].t()

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (g,) = super().weight_grads(op, grad)
        assert g is not None
        return (g.t(),)


class _LinearBiasRule(_LinearRule):
    """``F.linear(x, w, b)`` with a weight and a bias: ``addmm`` (or a matmul and an add) and a bias gradient summed over rows."""

    name = "linear+bias"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        bound = _bound(args, kwargs, ("input", "weight", "bias"))
        if bound is None or len(bound) != 3:
            return None
        x, w, b = bound["input"], bound["weight"], bound["bias"]
        if not isinstance(b, WeightUse) or b.dim() != 1 or b.dtype != w.dtype or b.device != w.device:
            return None
        op = super().match((x, w), {})
        if op is None:
            return None
        # torch folds a 2-d or contiguous 3-d input into one addmm (the bias gradient a sum over the folded
        # rows); any other input is a matmul followed by an in-place add (a sum over all leading dimensions).
        op.weights = (w, b)
        op.settings = (*op.settings, x.dim() == 2 or (x.dim() == 3 and x.is_contiguous()))
        return op

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (gw,) = super().weight_grads(op, grad)
        bias = op.weights[1]
        folded_rows = op.settings[1]
        gb = _sum_to(_folded(grad) if folded_rows else grad, bias.shape)
        return (gw, gb)


class _BmmRule(_SplitRule):
    """``torch.bmm(x, W)`` with a batch of weight matrices (the experts' batched GEMM); ``matmul`` of two 3-d operands with the same batch is one."""

    name = "bmm"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        if kwargs or len(args) != 2:
            return None
        x, w = args
        if not isinstance(w, WeightUse) or w.dim() != 3 or not _activation(x, w) or x.dim() != 3:
            return None
        if x.shape[0] != w.shape[0]:
            return None  # a broadcast batch (matmul expands it): not a plain bmm
        return SplitOp(self, x.detach(), (w,))

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        return grad.bmm(op.weights[0].transpose(1, 2))

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        assert op.x is not None
        return (op.x.transpose(1, 2).bmm(grad),)


def _sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A gradient reduced to its input's shape, as the engine reduces a broadcast input's."""
    return t if t.shape == shape else t.sum_to_size(shape)


def _one_weight_one_activation(args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor] | None:
    if kwargs or len(args) != 2:
        return None
    a, b = args
    if isinstance(a, WeightUse) and _activation(b, a):
        return b, a
    if isinstance(b, WeightUse) and _activation(a, b):
        return a, b
    return None


class _MulRule(_SplitRule):
    """``x * w`` (either order, broadcasting): a norm's scale, a gate."""

    name = "mul"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        pair = _one_weight_one_activation(args, kwargs)
        if pair is None:
            return None
        x, w = pair
        return SplitOp(self, x.detach(), (w,))

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        assert op.x is not None
        return _sum_to(grad * op.weights[0], op.x.shape)

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        assert op.x is not None
        return (_sum_to(grad * op.x, op.weights[0].shape),)


class _AddRule(_SplitRule):
    """``x + w`` (either order, broadcasting, no ``alpha``): a bias."""

    name = "add"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        pair = _one_weight_one_activation(args, kwargs)
        if pair is None:
            return None
        x, w = pair
        return SplitOp(self, None, (w,), (x.shape,))

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        return _sum_to(grad, op.settings[0])

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (_sum_to(grad, op.weights[0].shape),)


class _RmsNormRule(_MulRule):
    """``F.rms_norm(x, shape, w, eps)``: torch normalises, then multiplies by the weight; the normalisation stays on
    autograd's graph (it has no weight), the multiply is the mul rule's."""

    name = "rms_norm"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        bound = _bound(args, kwargs, ("input", "normalized_shape", "weight", "eps"))
        if bound is None or "normalized_shape" not in bound:
            return None
        x, w = bound.get("input"), bound.get("weight")
        if not isinstance(w, WeightUse) or not isinstance(x, torch.Tensor) or not _activation(x, w) or x.dtype not in (torch.float32, torch.float64):
            return None  # a narrower dtype is upcast around the weight's multiply
        with torch.enable_grad():
            normed = torch.rms_norm(x, bound["normalized_shape"], None, bound.get("eps"))
        return SplitOp(self, normed.detach(), (w,), (normed,))

    def call(self, op: SplitOp, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Sequence[Any], dict[str, Any], Any]:
        normed = op.settings[0]
        op.settings = ()
        return torch.mul, (normed, op.weights[0]), {}, normed


class _LayerNormRule(_SplitRule):
    """``F.layer_norm(x, shape, w, b, eps)`` with a weight (and a bias or none): ``native_layer_norm_backward``, one half at a time."""

    name = "layer_norm"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        bound = _bound(args, kwargs, ("input", "normalized_shape", "weight", "bias", "eps", "cudnn_enable"))
        if bound is None or "normalized_shape" not in bound:
            return None
        x, w, b = bound.get("input"), bound.get("weight"), bound.get("bias")
        if not isinstance(w, WeightUse) or not isinstance(x, torch.Tensor) or not _activation(x, w) or not (b is None or isinstance(b, WeightUse)):
            return None
        shape = [int(n) for n in bound["normalized_shape"]] if isinstance(bound["normalized_shape"], (list, tuple, torch.Size)) else [int(bound["normalized_shape"])]
        eps = float(bound.get("eps", 1e-5))
        return SplitOp(self, x.detach(), (w,) if b is None else (w, b), (shape, eps))

    def call(self, op: SplitOp, func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> tuple[Any, Sequence[Any], dict[str, Any], Any]:
        shape, eps = op.settings
        weight, bias = op.weights[0], (op.weights[1] if len(op.weights) > 1 else None)

        def layer_norm(x: torch.Tensor, *weights: torch.Tensor) -> torch.Tensor:
            # What F.layer_norm runs, keeping the statistics its backward needs.
            out, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)
            op.settings = (shape, mean, rstd)
            return out

        x = args[0] if "input" not in kwargs else kwargs["input"]
        return layer_norm, (x, *op.weights), {}, x

    def _backward(self, op: SplitOp, grad: torch.Tensor, mask: list[bool]) -> tuple[torch.Tensor, ...]:
        shape, mean, rstd = op.settings
        weight, bias = op.weights[0], (op.weights[1] if len(op.weights) > 1 else None)
        result: tuple[torch.Tensor, ...] = torch.ops.aten.native_layer_norm_backward(
            grad, op.x, shape, mean, rstd, weight, bias, mask
        )
        return result

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        return self._backward(op, grad, [True, False, False])[0]

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        _, gw, gb = self._backward(op, grad, [False, True, len(op.weights) > 1])
        return (gw,) if len(op.weights) == 1 else (gw, gb)


class _EmbeddingRule(_SplitRule):
    """``F.embedding(ids, w)`` (dense, no ``max_norm``): all of its backward is the weight's."""

    name = "embedding"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        names = ("padding_idx", "max_norm", "norm_type", "scale_grad_by_freq", "sparse")
        if len(args) < 2 or len(args) > 2 + len(names):
            return None
        options = dict(zip(names, args[2:]))
        if set(options) & set(kwargs):
            return None
        options.update(kwargs)
        ids, w = args[0], args[1]
        if (
            not isinstance(w, WeightUse) or w.dim() != 2 or not isinstance(ids, torch.Tensor) or isinstance(ids, WeightUse)
            or ids.is_floating_point() or ids.is_complex() or options.get("max_norm") is not None
            or options.get("sparse", False) or not set(options) <= set(names)
        ):
            return None
        padding_idx = options.get("padding_idx")
        if padding_idx is None:
            padding_idx = -1
        elif padding_idx < 0:
            padding_idx += w.size(0)  # as F.embedding normalises it
        return SplitOp(self, ids, (w,), (int(padding_idx), bool(options.get("scale_grad_by_freq", False))))

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        return None

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        padding_idx, by_freq = op.settings
        w = op.weights[0]
        return (torch.ops.aten.embedding_dense_backward(grad, op.x, w.size(0), padding_idx, by_freq),)


class _ConvRule(_SplitRule):
    """``F.conv1d/conv2d(x, w)`` without bias and with numeric padding: ``convolution_backward``, one half at a time."""

    def __init__(self, dims: int):
        self.dims = dims
        self.name = f"conv{dims}d"

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        names = ("bias", "stride", "padding", "dilation", "groups")
        if len(args) < 2 or len(args) > 2 + len(names):
            return None
        options = dict(zip(names, args[2:]))
        if set(options) & set(kwargs) or not set(kwargs) <= set(names):
            return None
        options.update(kwargs)
        x, w = args[0], args[1]
        if (
            not isinstance(w, WeightUse) or not _activation(x, w) or x.dim() != self.dims + 2
            or options.get("bias") is not None or isinstance(options.get("padding", 0), str)
        ):
            return None

        def per_dim(value: Any) -> list[int]:
            values = [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)] * self.dims
            return values if len(values) == self.dims else [values[0]] * self.dims

        settings = (per_dim(options.get("stride", 1)), per_dim(options.get("padding", 0)),
                    per_dim(options.get("dilation", 1)), int(options.get("groups", 1)))
        return SplitOp(self, x.detach(), (w,), settings)

    def _backward(self, op: SplitOp, grad: torch.Tensor, mask: list[bool]) -> tuple[torch.Tensor, ...]:
        stride, padding, dilation, groups = op.settings
        result: tuple[torch.Tensor, ...] = torch.ops.aten.convolution_backward(
            grad, op.x, op.weights[0], None, stride, padding, dilation, False, [0] * self.dims, groups, mask
        )
        return result

    def input_grad(self, op: SplitOp, grad: torch.Tensor) -> torch.Tensor | None:
        return self._backward(op, grad, [True, False, False])[0]

    def weight_grads(self, op: SplitOp, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return (self._backward(op, grad, [False, True, False])[1],)


class _LinearAnyRule(_SplitRule):
    """``F.linear`` with or without a bias: the one rule or the other."""

    name = "linear"

    def __init__(self) -> None:
        self.plain, self.biased = _LinearRule(), _LinearBiasRule()

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        return (self.plain if bias is None else self.biased).match(args, kwargs)


class _MatmulAnyRule(_SplitRule):
    """``x @ W``: a weight matrix (one ``mm`` over the folded rows) or a batch of them (``bmm``)."""

    name = "matmul"

    def __init__(self) -> None:
        self.matrix, self.batched = _MatmulRule(), _BmmRule()

    def match(self, args: Sequence[Any], kwargs: dict[str, Any]) -> SplitOp | None:
        return self.matrix.match(args, kwargs) or self.batched.match(args, kwargs)


_MATMUL, _MUL, _ADD, _BMM = _MatmulAnyRule(), _MulRule(), _AddRule(), _BmmRule()
_LAYER_NORM, _RMS_NORM = _LayerNormRule(), _RmsNormRule()
_RULES: dict[Any, _SplitRule] = {
    torch._C._nn.linear: _LinearAnyRule(),
    torch.matmul: _MATMUL, torch.Tensor.matmul: _MATMUL, torch.Tensor.__matmul__: _MATMUL,
    torch.bmm: _BMM, torch.Tensor.bmm: _BMM,
    torch.nn.functional.layer_norm: _LAYER_NORM, torch.layer_norm: _LAYER_NORM,
    torch.nn.functional.rms_norm: _RMS_NORM, torch.rms_norm: _RMS_NORM,
    torch.mul: _MUL, torch.Tensor.mul: _MUL, torch.Tensor.__mul__: _MUL,
    torch.add: _ADD, torch.Tensor.add: _ADD, torch.Tensor.__add__: _ADD,
    torch.nn.functional.embedding: _EmbeddingRule(),
    torch.conv1d: _ConvRule(1), torch.conv2d: _ConvRule(2),
}
"""The operations with a dedicated split, by the function ``__torch_function__`` sees."""


class _SplitNode(torch.autograd.Function):
    """A weight operation with a dedicated split inside the task's graph: dgrad's half now, the rest kept."""

    @staticmethod
    def forward(ctx: Any, op: SplitOp, func: Any, args: Any, kwargs: Any, *tensors: torch.Tensor) -> Any:  # type: ignore[override]
        ctx.op = op
        return func(*args, **kwargs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        op: SplitOp = ctx.op
        if op.grad is not None:
            raise SplitError(f"the data gradient of a '{op.rule.name}' was computed twice")
        op.grad = grad
        gx = None
        if ctx.needs_input_grad[4]:
            with torch._C.DisableTorchFunctionSubclass():
                gx = op.rule.input_grad(op, grad)
        return (None, None, None, None, gx, *(None,) * len(op.weights))


def _function_apply() -> Callable[..., Any]:
    """``_SplitNode.apply`` without the Python wrapper's pass over its arguments (only functorch transforms need it)."""
    raw = super(torch.autograd.Function, _SplitNode).apply  # torch._C._FunctionBase.apply, bound to _SplitNode

    def apply(cls: Any, *args: Any) -> Any:
        if torch._C._are_functorch_transforms_active():
            return cls.apply(*args)
        return raw(*args)

    return apply


_apply_split = _function_apply()


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
            leaf._plain = param.detach()
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
    ops: list[WeightOp | SplitOp]
    weight_side: tuple[WeightOp, ...]  # task outputs computed from parameters alone
    dgrad_done: bool = False
    general_ops: tuple[str, ...] = ()  # the weight operations that took the general path (WeightOp), by name


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
        return TaskGraph(name, grad_inputs, tuple(handed_out), tuple(slots), leaves, recording.ops, tuple(weight_side),
                         general_ops=tuple(recording.general))


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
        with torch.no_grad(), torch._C.DisableTorchFunctionSubclass():
            for op in (*graph.ops, *graph.weight_side):
                grads: Sequence[torch.Tensor | None]
                if isinstance(op, SplitOp):
                    if op.grad is None:
                        continue  # its output received no gradient
                    grads = op.weight_grads()
                elif op.grads is None:
                    continue  # its output received no gradient
                else:
                    with torch.enable_grad():  # the small graph's own backward
                        grads = self._general_weight_grads(op, id(op) in weight_side)
                for arg, g in zip(op.weight_args, grads):
                    if g is None:
                        continue
                    key = id(arg)
                    per_arg[key] = (arg, g if key not in per_arg else per_arg[key][1] + g)
        leaf_ids = {id(leaf): i for i, leaf in enumerate(graph.leaves)}
        result: list[torch.Tensor | None] = [None] * len(graph.leaves)
        derived_args, derived_grads = [], []
        scattered: dict[int, torch.Tensor] = {}
        for key, (arg, g) in per_arg.items():
            if key in leaf_ids:
                result[leaf_ids[key]] = g
            elif isinstance(arg, WeightUse) and arg._root is not None:
                index = leaf_ids[id(arg._root)]
                into = scattered.get(index)
                if into is None:
                    into = scattered[index] = torch.zeros_like(graph.leaves[index].as_subclass(torch.Tensor),
                                                               memory_format=torch.contiguous_format)
                _scatter_view_grad(into, arg._steps, g)
            else:
                derived_args.append(arg)
                derived_grads.append(g)
        for index, g in scattered.items():
            previous = result[index]
            result[index] = g if previous is None else previous + g
        if derived_args:
            # Back from w.exp(), ... to the parameter leaves: no activation is involved.
            back = _small_grad(derived_args, graph.leaves, derived_grads, False)
            for i, g in enumerate(back):
                if g is not None:
                    previous = result[i]
                    result[i] = g if previous is None else previous + g
        # The small graphs (and the activations they hold) are released with this job.
        graph.ops, graph.weight_side = [], ()
        return {slot.key: g for slot, g in zip(graph.slots, result)}

    @staticmethod
    def _general_weight_grads(op: WeightOp, weight_side: bool) -> Sequence[torch.Tensor | None]:
        assert op.grads is not None
        pairs = [(o, g) for o, g in zip(op.outputs, op.grads) if g is not None and o.requires_grad]
        if not pairs:
            return ()
        if weight_side:
            return [pairs[0][1]]  # the output is the weight-side tensor itself
        return _small_grad([o for o, _ in pairs], op.inner_weights, [g for _, g in pairs], False)


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
                # Kept as is where autograd's accumulation would steal it too (w.t().t() of a GEMM's result);
                # copied when it is laid out otherwise or is a window on a bigger tensor.
                window = g._base is not None and g._base.numel() != g.numel()
                param.grad = g.detach().clone() if window or not g.is_contiguous() else g.detach()
            else:
                param.grad.add_(g)

    def complete(self, key: str) -> bool:
        """Whether every micro-batch's gradient of ``key`` has been folded in."""
        return self._next.get(key, 0) >= self.microbatches

    def missing(self) -> list[tuple[str, int]]:
        """(parameter, first micro-batch not yet folded) for every parameter not complete."""
        return [(k, n) for k, n in self._next.items() if n < self.microbatches]
