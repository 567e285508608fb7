"""Two-level torch.fx capture of a decoder stack, with shapes from meta tensors.

Level 1 traces the module that owns the decoder stack (the longest
``nn.ModuleList`` of weighted blocks beside the largest token embedding) with
every decoder layer, the embedding, the rotary table and the final norm as
leaves. Its graph gives the layer order and which producer feeds each layer's
hidden state.

Level 2 traces each decoder layer with its recognised blocks (mixers, MoE,
dense MLPs, norms) as leaves. Data-dependent routing and shape-dependent
recurrent loops live inside those leaves, so fx never sees them. Layers with
the same structure share one trace. A weighted child that no recogniser knows
and that fx cannot trace through becomes an opaque leaf as well; running it on
meta tensors (``frontend.behaviour``) then says whether it is a mixer.

Both levels may branch on shapes, ranks, dtypes and config values (multimodal
position ids tested with ``position_ids.ndim == 3``, ``*x.shape[:-1]``
unpacked into a view, a loop over ``range(x.shape[1] // chunk)``): the tracer
evaluates the tested value on the meta sample inputs and follows the branch
the real run takes at these shapes. A branch on tensor data stays an error.

Helper functions of the model's own Python module (mask builders, cache
helpers, output classes' factories) are auto-wrapped: they appear as opaque
call nodes instead of being traced through, which removes their branches.

Shapes come from running each graph on meta tensors: glue ops (norms, adds,
reshapes, the embedding) really execute on the meta device; a recognised
block is a residual block whose output has its hidden input's shape (it is
never executed: routing on meta tensors has no data to route by).
"""

from __future__ import annotations

import contextlib
import inspect
import math
import operator
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from frontend.behaviour import Behaviour, call_on_meta, observe
from frontend.errors import CaptureError, UnrecognisedLayerError
from frontend.mixers import identify_mixer
from frontend.recognizers import Block, RecognizeContext, recognize
from tessera_ir.kinds import MixerKind

# Optional arguments HF-style forwards accept; fixed so cache branches vanish from the trace.
_FIXED_KWARGS = {"use_cache": False, "output_attentions": False, "output_hidden_states": False, "return_dict": False}
_MAX_LAYER_INPUTS = 8


# fx patches nn.Module.__call__ and wrapped functions while it traces; evaluating a node for real
# must step outside those patches (a private helper of fx, present since torch 2.1).
_patches_reverted: Callable[[], contextlib.AbstractContextManager[None]] = getattr(
    fx._symbolic_trace, "_maybe_revert_all_patches", contextlib.nullcontext)


class _Residual:
    """A leaf block's output while tracing: shaped like its hidden input, which is also element 0 of a tuple."""

    def __init__(self, hidden: torch.Tensor):
        self.hidden = hidden


def _unwrap_residuals(value: Any) -> Any:
    return fx.node.map_aggregate(value, lambda v: v.hidden if isinstance(v, _Residual) else v)


LeafValue = Callable[[fx.Node, tuple[Any, ...], dict[str, Any]], Any]


# Tensor attributes that are constants of a trace at given shapes: read from the meta value, so that
# ``x.type(h.dtype)`` or ``torch.zeros(..., device=h.device)`` see real dtypes and devices.
_CONCRETE_ATTRIBUTES = frozenset({"dtype", "device", "is_cuda", "is_meta", "is_floating_point"})


class _Concrete:
    """Answers ``len()``, integer conversion, dtype and device from the meta value of the proxy's node."""

    node: fx.Node
    tracer: Any

    def __getattr__(self, k: str) -> Any:
        tracer = self.tracer
        if k in _CONCRETE_ATTRIBUTES and isinstance(tracer, _Tracer):
            value = tracer.meta_value(self.node)
            if isinstance(value, torch.Tensor):
                return getattr(value, k)
        return _MetaAttribute(self, k)  # type: ignore[arg-type]

    def __len__(self) -> int:
        if not isinstance(self.tracer, _Tracer):
            raise RuntimeError("'len' is not supported in symbolic tracing by default")
        return len(self.tracer.concrete(self.node, "len()"))

    def __index__(self) -> int:
        value = self.tracer.concrete(self.node, "an integer") if isinstance(self.tracer, _Tracer) else None
        if isinstance(value, bool) or not isinstance(value, int):
            raise fx.proxy.TraceError("symbolically traced variables cannot be used as integers")
        return value


class _MetaProxy(_Concrete, fx.Proxy):
    """The proxies of a ``_Tracer``."""


class _MetaAttribute(_Concrete, fx.proxy.Attribute):
    """An attribute of a proxy (``x.shape``), which answers ``len(x.shape)`` as well."""


class _Tracer(fx.Tracer):
    """An fx tracer with a leaf predicate, the model's own helper functions auto-wrapped, and concrete control flow.

    Control flow that depends only on shapes, dtypes or ranks (``if position_ids.ndim == 3``,
    ``for chunk in range(x.shape[1] // 64)``, ``(*x.shape[:-1], -1)``) is decided during tracing:
    the node it tests is evaluated on the meta sample inputs (leaf blocks produce their hidden
    input's shape, as in ``_run_meta``) and the branch taken is the one the real run takes at these
    shapes. A test of tensor *data* has no meta value and stays a trace error.
    """

    def __init__(self, is_leaf: Callable[[nn.Module, str], bool], wrap_modules: list[ModuleType],
                 samples: list[Any] | None = None, leaf_value: LeafValue | None = None):
        functions = [
            value
            for module in wrap_modules
            for name, value in vars(module).items()
            if inspect.isfunction(value) and not name.startswith("_") and not value.__module__.startswith("torch")
        ]
        super().__init__(autowrap_modules=(math,), autowrap_functions=tuple(functions))
        # fx searches only the traced function's globals for auto-wrapped functions; our root
        # function is a wrapper defined here, so point the search at the model's module as well.
        self._autowrap_search.extend(wrap_modules)
        self._is_leaf = is_leaf
        self.inside: list[tuple[str, nn.Module]] = []
        self._samples = list(samples or [])
        self._leaf_value = leaf_value
        self._values: dict[fx.Node, Any] = {}

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Remember which non-leaf module fx is inside, to name it if tracing through it fails.
        try:
            qualname = self.path_of_module(m)
        except NameError:
            # A module reached other than as a submodule of the traced root (a helper given
            # `self.conv1d` by a wrapper that swapped the forward, a module held in a plain list):
            # fx cannot name it as a call, so its operations are recorded inline, as a function's.
            return forward(*args, **kwargs)
        if self.is_leaf_module(m, qualname):
            return super().call_module(m, forward, args, kwargs)
        self.inside.append((qualname, m))
        result = super().call_module(m, forward, args, kwargs)
        self.inside.pop()
        return result

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _MetaProxy(node, self)

    def meta_value(self, node: fx.Node) -> Any:
        """The value ``node`` has at the sample shapes (None when it cannot be computed on meta)."""
        with _patches_reverted():  # modules run for real here, not through fx's tracing hooks
            self._evaluate_up_to(node)
        value = self._values.get(node)
        return value.hidden if isinstance(value, _Residual) else value

    def concrete(self, node: fx.Node, use: str) -> Any:
        """The value ``node`` has at the sample shapes, for control flow; a TraceError when it depends on data."""
        value = self.meta_value(node)
        reads_shape_only = use in ("len()", "iteration")
        if value is None or (isinstance(value, torch.Tensor) and not reads_shape_only):
            why = "depends on tensor data, not only on shapes" if value is not None else \
                "could not be computed from the shapes on meta tensors"
            raise fx.proxy.TraceError(
                f"symbolically traced variables cannot be used as inputs to control flow ({use} of "
                f"'{node.format_node()}' {why})")
        return value

    def _evaluate_up_to(self, node: fx.Node) -> None:
        position = 0
        for n in node.graph.nodes:
            if n.op == "placeholder":
                if n not in self._values:
                    self._values[n] = self._samples[position] if position < len(self._samples) else None
                position += 1
            elif n not in self._values:
                args = fx.node.map_arg(n.args, lambda a: self._values.get(a))
                kwargs = fx.node.map_arg(n.kwargs, lambda a: self._values.get(a))
                value: Any = NotImplemented
                if n.op == "call_module" and self._leaf_value is not None:
                    value = self._leaf_value(n, _unwrap_residuals(args), _unwrap_residuals(kwargs))
                if value is NotImplemented:
                    value = _evaluate(n, args, kwargs, self.root)
                self._values[n] = value
            if n is node:
                break

    def to_bool(self, obj: fx.Proxy) -> bool:
        return bool(self.concrete(obj.node, "the truth value"))

    def iter(self, obj: fx.Proxy) -> Iterator[Any]:
        value = self.concrete(obj.node, "iteration")
        return iter([obj[i] for i in range(len(value))])  # type: ignore[index]  # Proxy.__getitem__ is generated

    def keys(self, obj: fx.Proxy) -> Any:
        value = self.concrete(obj.node, "the keys")
        if isinstance(value, dict):
            return list(value.keys())
        return super().keys(obj)


def _view_with_forward(module: nn.Module, forward: Callable[..., Any]) -> nn.Module:
    """The same module (shared state) seen through a subclass whose forward is ``forward``.

    HF forwards are wrapped by decorators that inspect their arguments; we trace
    the undecorated function without touching the user's module object.
    """
    cls = type(module)
    view_cls = type(f"{cls.__name__}Traced", (cls,), {"forward": forward, "__module__": cls.__module__})
    view: nn.Module = object.__new__(view_cls)
    view.__dict__ = module.__dict__
    return view


def _module_of(fn: Callable[..., Any]) -> list[ModuleType]:
    mod = sys.modules.get(getattr(fn, "__module__", "") or "")
    return [mod] if mod is not None else []


@dataclass
class BlockCall:
    block: Block
    input_shape: list[int]


@dataclass
class LayerTrace:
    index: int
    path: str
    module: nn.Module
    producer: str  # "embed" or "l{j}": whose output feeds this layer's hidden state
    blocks: list[BlockCall] = field(default_factory=list)  # in graph (execution) order
    input_shape: list[int] = field(default_factory=list)
    output_shape: list[int] = field(default_factory=list)


@dataclass
class StackTrace:
    embed_path: str
    embed: nn.Module
    layers: list[LayerTrace]
    norm: nn.Module | None
    norm_path: str | None
    level1_nodes: int
    level2_traces: int
    owner: nn.Module | None = None  # the module whose forward runs the stack


def find_decoder_stack(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder layers: the longest outermost ModuleList whose entries all own weights.

    Outermost, so that a ModuleList of experts inside a layer (which can be
    longer than the stack) never wins. Stacks whose owner embeds the largest
    vocabulary (an ``nn.Embedding`` beside the list) come first, so that the
    language model of a multimodal model wins over a deeper vision tower (whose
    embedding, if any, is a small position table).
    """
    lists = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.ModuleList) and len(module) > 0
        and all(next(m.parameters(), None) is not None for m in module)
    ]
    outermost = [(name, module) for name, module in lists
                 if not any(other != name and (other == "" or name.startswith(other + ".")) for other, _ in lists)]
    if not outermost:
        raise CaptureError(
            f"{type(model).__name__}: found no decoder stack (an nn.ModuleList of layers); keep the layers in an "
            f"nn.ModuleList attribute such as self.layers"
        )

    def vocabulary(path: str) -> int:
        owner = _owner_of(model, path)[1]
        return max((c.num_embeddings for c in owner.children() if isinstance(c, nn.Embedding)), default=0)

    return max(outermost, key=lambda item: (vocabulary(item[0]), len(item[1])))


def _type_named_in(exc: Exception) -> str:
    """``x.y.Z`` out of fx's "argument of type: <class 'x.y.Z'>"."""
    text = str(exc)
    return text.split("'")[1] if text.count("'") >= 2 else text


def _owner_of(model: nn.Module, stack_path: str) -> tuple[str, nn.Module]:
    owner_path = stack_path.rsplit(".", 1)[0] if "." in stack_path else ""
    return owner_path, model.get_submodule(owner_path) if owner_path else model


def _first_tensor_node(node: fx.Node) -> fx.Node | None:
    for arg in list(node.args) + list(node.kwargs.values()):
        if isinstance(arg, fx.Node):
            return arg
    return None


def _is_embedding(module: nn.Module) -> bool:
    """A token embedding: an ``nn.Embedding``, or a module holding a 2-D weight (a vocabulary table)."""
    if isinstance(module, nn.Embedding) or hasattr(module, "num_embeddings"):
        return True
    weight = getattr(module, "weight", None)
    return isinstance(weight, torch.Tensor) and weight.dim() == 2


def _producer_module(node: fx.Node | None) -> fx.Node | None:
    """Walk back through glue (getitem, views, adds of one stream) to the call_module that made a value."""
    seen: fx.Node | None = node
    while seen is not None and seen.op != "call_module":
        if seen.op == "placeholder":
            return seen
        seen = _first_tensor_node(seen)
    return seen


def _latest_source(node: fx.Node, named: dict[fx.Node, str], order: dict[fx.Node, int]) -> fx.Node | None:
    """The latest of ``named`` nodes this value derives from through glue (not through other modules).

    A residual add outside the layer (``x = x + layer(x)``) mixes the stream
    with the previous layer's output; the previous layer is the latest source.
    """
    found: list[fx.Node] = []
    stack, visited = [node], set()
    while stack:
        current = stack.pop()
        if current in visited:
            continue
        visited.add(current)
        if current in named:
            found.append(current)
            continue
        if current.op in ("call_module", "placeholder"):
            continue
        stack.extend(a for a in current.all_input_nodes if a not in visited)
    return max(found, key=order.__getitem__) if found else None


def _run_meta(graph: fx.Graph, root: nn.Module, inputs: list[Any],
              leaf: Callable[[fx.Node, list[Any], dict[str, Any]], Any]) -> dict[fx.Node, Any]:
    """Propagate meta tensors through ``graph``.

    ``leaf(node, args, kwargs)`` returns the value of a call_module node, or
    ``NotImplemented`` to execute the module itself on meta.
    """
    env: dict[fx.Node, Any] = {}
    placeholders = iter(inputs)
    for node in graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders, None)
            continue
        if node.op == "output":
            env[node] = fx.node.map_arg(node.args[0], lambda n: env[n])
            continue
        args = fx.node.map_arg(node.args, lambda n: env[n])
        kwargs = fx.node.map_arg(node.kwargs, lambda n: env[n])
        value: Any = NotImplemented
        if node.op == "call_module":
            value = leaf(node, args, kwargs)  # errors from recognition propagate
        if value is NotImplemented:
            value = _evaluate(node, args, kwargs, root)
        env[node] = value
    return env


def _evaluate(node: fx.Node, args: Any, kwargs: Any, root: nn.Module) -> Any:
    """One glue node on meta values. Glue that cannot run on meta (mask builders given no real mask)
    yields None: nothing we count depends on it."""
    if node.op == "call_function" and node.target is operator.getitem and isinstance(args[0], _Residual):
        return args[0].hidden if args[1] == 0 else None
    args, kwargs = _unwrap_residuals(args), _unwrap_residuals(kwargs)
    try:
        if node.op == "get_attr":
            value: Any = root
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if isinstance(value, torch.Tensor):
                value = torch.empty_like(value, device="meta")
            return value
        if node.op == "call_module":
            return call_on_meta(root.get_submodule(str(node.target)), args, kwargs)
        if node.op == "call_function":
            return node.target(*args, **kwargs)  # type: ignore[operator]
        if node.op == "call_method":
            return getattr(args[0], str(node.target))(*args[1:], **kwargs)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    return None


def _norm_output(module: nn.Module, node: fx.Node, args: Any, kwargs: Any, config: Any) -> Any:
    """A normalisation keeps its input's shape; everything else runs on meta (NotImplemented).

    Not executing norms keeps meta propagation to a handful of cheap ops (a
    norm's pow/rsqrt on meta would pull in the whole compiler stack on first use).
    """
    block = recognize(module, RecognizeContext(str(node.target), config))
    x = _first_tensor(list(args) + list(kwargs.values()))
    if block is None or block.role != "norm" or x is None:
        return NotImplemented
    return _leaf_output(node, x)


def _leaf_output(node: fx.Node, hidden: torch.Tensor) -> Any:
    """A residual block's output: hidden-shaped; a tuple when the graph indexes it."""
    if node.users and all(u.op == "call_function" and u.target is operator.getitem for u in node.users):
        width = max(int(u.args[1]) for u in node.users) + 1  # type: ignore[arg-type]  # getitem's index
        return tuple([torch.empty_like(hidden)] + [None] * (width - 1))
    return torch.empty_like(hidden)


def _first_tensor(values: list[Any]) -> torch.Tensor | None:
    for value in values:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def _layer_signature(layer: nn.Module, arg_spec: tuple[Any, ...]) -> tuple[Any, ...]:
    """Layers with equal signatures trace to the same graph (modulo parameter values)."""
    children = tuple(
        (name, type(m).__name__, tuple(tuple(p.shape) for p in m.parameters()))
        for name, m in layer.named_children()
    )
    flags = tuple(sorted((k, v) for k, v in vars(layer).items()
                         if not k.startswith("_") and isinstance(v, (str, bool, type(None)))))
    return (type(layer), children, flags, arg_spec)


def _value_spec(value: Any) -> Any:
    """A hashable stand-in for an argument: tensors by shape and dtype, other values as themselves."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), str(value.dtype))
    if isinstance(value, (list, tuple)):
        return tuple(_value_spec(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), _value_spec(v)) for k, v in value.items()))
    return value if _hashable(value) else type(value).__name__


def _block_signature(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, ...]:
    """Blocks with equal signatures do the same thing on the same shapes: one observation serves them all."""
    tensors = [(name, tuple(t.shape)) for name, t in module.named_parameters()]
    tensors += [(name, tuple(t.shape)) for name, t in module.named_buffers()]
    flags = tuple(sorted((k, v) for k, v in vars(module).items()
                         if not k.startswith("_") and isinstance(v, (str, bool, type(None)))))
    return (type(module), tuple(tensors), flags, _value_spec(args), _value_spec(kwargs))


@dataclass
class _LayerGraph:
    graph: fx.Graph
    # Weighted children no recogniser matched, kept opaque; mixers if running them shows sequence mixing.
    candidates: dict[str, UnrecognisedLayerError]


@dataclass
class _Capture:
    """Settings and caches shared by the layers of one capture."""

    config: Any
    batch: int
    seq_len: int
    reuse: bool
    layer_kinds: dict[int, MixerKind]
    graphs: dict[tuple[Any, ...], _LayerGraph] = field(default_factory=dict)
    behaviours: dict[tuple[Any, ...], Behaviour] = field(default_factory=dict)

    def observe(self, module: nn.Module, args: Any, kwargs: Any) -> Behaviour:
        key = _block_signature(module, args, kwargs)
        if key not in self.behaviours:
            self.behaviours[key] = observe(module, tuple(args), dict(kwargs), self.batch, self.seq_len)
        return self.behaviours[key]


def capture_stack(model: nn.Module, batch: int, seq_len: int, config: Any = None, reuse: bool = True,
                  layer_kinds: dict[int, MixerKind] | None = None) -> StackTrace:
    """Trace ``model``'s decoder stack; ``reuse=False`` traces every layer afresh (for measuring).

    ``layer_kinds`` sets the mixer kind of layers by index (the user's override of recognition).
    """
    stack_path, stack = find_decoder_stack(model)
    owner_path, owner = _owner_of(model, stack_path)
    prefix = f"{owner_path}." if owner_path else ""
    local_stack = stack_path[len(prefix):]
    layer_targets = {f"{local_stack}.{i}": i for i in range(len(stack))}
    cap = _Capture(config, batch, seq_len, reuse, dict(layer_kinds or {}))

    raw_forward = inspect.unwrap(type(owner).forward)
    params = inspect.signature(raw_forward).parameters
    fixed = {k: v for k, v in _FIXED_KWARGS.items() if k in params}
    first_arg = next(n for n in list(params)[1:])

    def stack_forward(self: nn.Module, input_ids: torch.Tensor) -> Any:
        return raw_forward(self, **{first_arg: input_ids}, **fixed)

    def level1_leaf(m: nn.Module, qualname: str) -> bool:
        # Everything is a leaf except containers on the way to the decoder layers.
        return not (local_stack == qualname or local_stack.startswith(qualname + "."))

    def level1_value(node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # While tracing: decoder layers and norms keep their hidden input's shape; the rest runs on meta.
        x = _first_tensor(list(args) + list(kwargs.values()))
        if x is None:
            return NotImplemented
        if node.target in layer_targets:
            return _Residual(x)
        block = recognize(owner.get_submodule(str(node.target)), RecognizeContext(str(node.target), config))
        return _Residual(x) if block is not None and block.role == "norm" else NotImplemented

    ids = torch.zeros((batch, seq_len), dtype=torch.long, device="meta")
    tracer = _Tracer(level1_leaf, _module_of(raw_forward), samples=[ids], leaf_value=level1_value)
    try:
        graph = tracer.trace(_view_with_forward(owner, stack_forward))
    except fx.proxy.TraceError as exc:
        cls = type(owner)
        raise CaptureError(
            f"cannot trace the decoder stack in {cls.__module__}.{cls.__qualname__}.forward: {exc}; the stack may "
            f"branch on shapes, dtypes and config values, but a branch on tensor data belongs inside a layer "
            f"or block") from exc
    except NotImplementedError as exc:  # fx refusing to record an argument it has no form for
        cls = type(owner)
        raise CaptureError(
            f"cannot trace the decoder stack in {cls.__module__}.{cls.__qualname__}.forward: torch.fx cannot record "
            f"its layers' argument of type {_type_named_in(exc)} "
            f"(state shared across layers); Tessera plans stacks whose layers exchange tensors only") from exc
    except (TypeError, AttributeError, ValueError, RuntimeError, KeyError, IndexError) as exc:
        # The stack's own Python failed under tracing (or a library refused a traced argument).
        cls = type(owner)
        per_layer = re.search(r"'(\w+)' is a per-layer attribute", str(exc))
        if per_layer is not None:
            # transformers' configs with per_layer_config refuse a global read of a value that varies.
            raise CaptureError(
                f"cannot trace the decoder stack in {cls.__module__}.{cls.__qualname__}.forward: it reads the config's "
                f"'{per_layer.group(1)}' once for the whole stack, but this config sets it per layer "
                f"(per_layer_config), so no one value holds; Tessera captures stacks whose forward reads only "
                f"values every layer shares: capture this family from a model.py whose build_model() keeps "
                f"per-layer values inside the layers") from exc
        lines = str(exc).strip().splitlines()
        raise CaptureError(
            f"cannot trace the decoder stack in {cls.__module__}.{cls.__qualname__}.forward: "
            f"{type(exc).__name__}: {lines[0][:200] if lines else ''}; rerun with --debug for where it failed") from exc

    layer_nodes = [n for n in graph.nodes if n.op == "call_module" and n.target in layer_targets]
    if not layer_nodes:
        raise CaptureError(f"{type(owner).__name__}.forward never calls the layers in '{stack_path}'")
    first_input = layer_nodes[0].args[0] if layer_nodes[0].args else _first_tensor_node(layer_nodes[0])
    first_hidden = _producer_module(first_input) if isinstance(first_input, fx.Node) else None
    if first_hidden is None or first_hidden.op != "call_module":
        raise CaptureError(f"the input of '{prefix}{layer_nodes[0].target}' does not come from an embedding module")
    embed_target = str(first_hidden.target)
    # A norm (or other weightless step) between the embedding and the first layer (NanoChat normalises
    # the embedded tokens): the embedding is further back; the norm still marks where layer 0's input
    # comes from.
    source: fx.Node | None = first_hidden
    while source is not None and source.op == "call_module" and not _is_embedding(owner.get_submodule(str(source.target))):
        source = _producer_module(_first_tensor_node(source))
    if source is None or source.op != "call_module":
        raise CaptureError(
            f"the input of '{prefix}{layer_nodes[0].target}' comes from '{prefix}{embed_target}', not from an embedding "
            "module (nn.Embedding, or a module holding a [vocab, hidden] weight)")
    embed_target = str(source.target)
    # The final norm: the first module applied to the last layer's output.
    norm_target = None
    last = layer_nodes[-1]
    frontier = list(last.users)
    while frontier:
        user = frontier.pop(0)
        if user.op == "call_module":
            norm_target = user.target
            break
        frontier.extend(user.users)

    layers: dict[fx.Node, LayerTrace] = {}
    node_names = {n: f"l{layer_targets[n.target]}" for n in layer_nodes}
    node_names[first_hidden] = "embed"
    order = {n: i for i, n in enumerate(graph.nodes)}

    def layer_leaf(node: fx.Node, args: list[Any], kwargs: dict[str, Any]) -> Any:
        if node.target not in layer_targets:
            return _norm_output(owner.get_submodule(str(node.target)), node, args, kwargs, config)
        index = layer_targets[node.target]
        layer = stack[index]
        hidden_node = node.args[0] if node.args else _first_tensor_node(node)
        producer = _latest_source(hidden_node, node_names, order) if isinstance(hidden_node, fx.Node) else None
        producer_name = node_names.get(producer) if producer is not None else None
        if producer_name is None:
            raise CaptureError(f"cannot tell which layer feeds '{prefix}{node.target}' in the traced graph")
        trace = LayerTrace(index, f"{prefix}{node.target}", layer, producer_name)
        out = _capture_layer(trace, layer, node, args, kwargs, cap)
        layers[node] = trace
        return out

    _run_meta(graph, owner, [ids], layer_leaf)
    ordered = [layers[n] for n in layer_nodes]
    for position, trace in enumerate(ordered):
        if trace.index != position:
            raise CaptureError(f"layer '{trace.path}' runs at position {position}; Tessera numbers layers in "
                               f"execution order, so the stack must run in index order")
        expected = f"l{position - 1}" if position else "embed"
        if trace.producer != expected:
            raise CaptureError(f"layer '{trace.path}' reads the output of {trace.producer}, not of {expected}; "
                               f"Tessera plans sequential decoder stacks only")
    return StackTrace(
        embed_path=f"{prefix}{embed_target}",
        embed=owner.get_submodule(str(embed_target)),
        layers=ordered,
        norm=owner.get_submodule(norm_target) if norm_target else None,
        norm_path=f"{prefix}{norm_target}" if norm_target else None,
        level1_nodes=len(graph.nodes),
        level2_traces=len(cap.graphs) if reuse else len(ordered),
        owner=owner,
    )


def _mixer(cap: _Capture, trace: LayerTrace, module: nn.Module, path: str, structural: Block | None,
           args: Any, kwargs: Any, unrecognised: UnrecognisedLayerError | None = None) -> Block:
    """What a mixer block (or an unrecognised weighted block) is, from what it does on meta tensors."""
    behaviour = cap.observe(module, args, kwargs)
    return identify_mixer(module, path, structural, behaviour, trace.index, cap.layer_kinds.get(trace.index),
                          cap.config, unrecognised)


def _capture_layer(trace: LayerTrace, layer: nn.Module, node: fx.Node, args: list[Any], kwargs: dict[str, Any],
                   cap: _Capture) -> Any:
    """Trace one decoder layer (or reuse the trace of a same-shaped layer) and propagate shapes."""
    spec: list[tuple[str, Any, Any]] = []  # (positional|keyword, index|name, value or a Node marker)
    inputs: list[Any] = []
    # Arguments computed in the stack (tensors, or containers of them such as a dict of masks) become
    # inputs of the layer's trace; constants are baked in.
    for i, (arg, value) in enumerate(zip(node.args, args)):
        spec.append(("pos", i, _NODE if _computed(arg) else arg))
        if _computed(arg):
            inputs.append(value)
    for key, arg in node.kwargs.items():
        spec.append(("kw", key, _NODE if _computed(arg) else arg))
        if _computed(arg):
            inputs.append(kwargs[key])
    if len(inputs) > _MAX_LAYER_INPUTS:
        raise CaptureError(f"'{trace.path}' takes {len(inputs)} tensor inputs; at most {_MAX_LAYER_INPUTS} are supported")
    hidden = _first_tensor(inputs)
    if hidden is None:
        raise CaptureError(f"'{trace.path}' receives no floating-point hidden state")
    trace.input_shape = list(hidden.shape)
    whole = recognize(layer, RecognizeContext(trace.path, cap.config))
    if whole is not None and whole.role in ("mixer", "ffn"):
        # The layer is itself one block (say, a bare MoE): nothing inside it to trace.
        if whole.role == "mixer":
            whole = _mixer(cap, trace, layer, trace.path, whole, args, kwargs)
        trace.blocks.append(BlockCall(whole, list(hidden.shape)))
        trace.output_shape = list(hidden.shape)
        return _leaf_output(node, hidden)

    frozen_spec = tuple((kind, key, value if value is _NODE or _hashable(value) else id(value))
                        for kind, key, value in spec)
    signature = _layer_signature(layer, frozen_spec + (_value_spec(inputs),))
    layer_graph = cap.graphs.get(signature) if cap.reuse else None
    if layer_graph is None:
        layer_graph = _trace_layer(layer, spec, inputs, trace.path, cap.config)
        cap.graphs[signature] = layer_graph

    def block_leaf(n: fx.Node, a: list[Any], kw: dict[str, Any]) -> Any:
        target = str(n.target)
        module = layer.get_submodule(target)
        path = f"{trace.path}.{target}"
        unrecognised = layer_graph.candidates.get(target)
        block = recognize(module, RecognizeContext(path, cap.config))
        if unrecognised is None and (block is None or block.role == "glue"):
            return NotImplemented
        if block is not None and block.role == "norm":
            return _norm_output(module, n, a, kw, cap.config)
        x = _first_tensor(list(a) + list(kw.values()))
        if x is None:
            raise CaptureError(f"block '{path}' receives no floating-point input")
        if unrecognised is not None or (block is not None and block.role == "mixer"):
            block = _mixer(cap, trace, module, path, block, a, kw, unrecognised)
        assert block is not None
        trace.blocks.append(BlockCall(block, list(x.shape)))
        return _leaf_output(n, x)

    env = _run_meta(layer_graph.graph, layer, inputs + [None] * (_MAX_LAYER_INPUTS - len(inputs)), block_leaf)
    out = next(v for n, v in env.items() if n.op == "output")
    result = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(result, torch.Tensor):
        raise CaptureError(f"'{trace.path}' produced no tensor in meta propagation")
    trace.output_shape = list(result.shape)
    return out


def _computed(arg: Any) -> bool:
    """Whether a graph argument holds a value computed in the graph (a Node, or a container of Nodes)."""
    found: list[fx.Node] = []
    fx.node.map_arg(arg, found.append)
    return bool(found)


class _NodeMarker:
    def __repr__(self) -> str:
        return "<tensor>"


_NODE = _NodeMarker()


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


_TRACE_FAILURES = (fx.proxy.TraceError, TypeError, RuntimeError, ValueError, AttributeError, IndexError, KeyError)


def _trace_layer(layer: nn.Module, spec: list[tuple[str, Any, Any]], inputs: list[Any], path: str,
                 config: Any) -> _LayerGraph:
    """Trace a decoder layer with its recognised blocks as leaves.

    A weighted child that no recogniser matches and that fx cannot trace through
    becomes an opaque candidate leaf and the layer is traced again; the
    candidate is later run on meta tensors to learn whether it is a mixer.
    """
    raw_forward = inspect.unwrap(type(layer).forward)

    def layer_forward(self: nn.Module, t0: Any = None, t1: Any = None, t2: Any = None, t3: Any = None,
                      t4: Any = None, t5: Any = None, t6: Any = None, t7: Any = None) -> Any:
        tensors = iter([t0, t1, t2, t3, t4, t5, t6, t7])
        pos: list[Any] = []
        kw: dict[str, Any] = {}
        for kind, key, value in spec:
            actual = next(tensors) if value is _NODE else value
            if kind == "pos":
                pos.append(actual)
            else:
                kw[key] = actual
        return raw_forward(self, *pos, **kw)

    # Recognise before tracing: while fx traces, module attribute access yields proxies.
    blocks = {id(m): recognize(m, RecognizeContext(f"{path}.{q}", config)) for q, m in layer.named_modules()}
    candidates: dict[str, UnrecognisedLayerError] = {}
    unused = {f"t{i}": None for i in range(len(inputs), _MAX_LAYER_INPUTS)}
    samples = inputs + [None] * (_MAX_LAYER_INPUTS - len(inputs))
    failed_leaf: list[str] = []  # the weighted leaf that stopped the last attempt

    def level2_leaf(m: nn.Module, qualname: str) -> bool:
        if blocks.get(id(m)) is not None or qualname in candidates:
            return True
        if next(m.children(), None) is None and next(m.parameters(), None) is not None:
            cls = type(m)
            failed_leaf.append(qualname)
            raise UnrecognisedLayerError(f"{path}.{qualname}", f"{cls.__module__}.{cls.__qualname__}",
                                         "it owns weights but matches no recogniser")
        return False

    def level2_value(n: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        block = blocks.get(id(layer.get_submodule(str(n.target))))
        if str(n.target) not in candidates and (block is None or block.role == "glue"):
            return NotImplemented
        x = _first_tensor(list(args) + list(kwargs.values()))
        return _Residual(x) if x is not None else NotImplemented

    while True:
        failed_leaf.clear()
        tracer = _Tracer(level2_leaf, _module_of(raw_forward), samples=samples, leaf_value=level2_value)
        try:
            graph = tracer.trace(_view_with_forward(layer, layer_forward), concrete_args=unused)
            return _LayerGraph(graph, candidates)
        except UnrecognisedLayerError as exc:
            error = exc
        except _TRACE_FAILURES as exc:
            # A block no recogniser matched was traced through and hit data-dependent Python.
            qualname, module = tracer.inside[-1] if tracer.inside else ("", layer)
            cls = type(module)
            where = f"{path}.{qualname}" if qualname else path
            error = UnrecognisedLayerError(where, f"{cls.__module__}.{cls.__qualname__}",
                                           f"torch.fx could not trace through it: {exc}")
            error.__cause__ = exc
        # The outermost unrecognised child on the failing path becomes an opaque candidate.
        top = tracer.inside[0][0] if tracer.inside else (failed_leaf[0] if failed_leaf else None)
        if top is None or top in candidates:
            raise error
        candidates[top] = error
