"""Two-level torch.fx capture of a decoder stack, with shapes from meta tensors.

Level 1 traces the module that owns the decoder stack (the longest
``nn.ModuleList`` of weighted blocks) with every decoder layer, the embedding,
the rotary table and the final norm as leaves. Its graph gives the layer
order and which producer feeds each layer's hidden state.

Level 2 traces each decoder layer with its recognised blocks (mixers, MoE,
dense MLPs, norms) as leaves. Data-dependent routing and shape-dependent
recurrent loops live inside those leaves, so fx never sees them. Layers with
the same structure share one trace.

Helper functions of the model's own Python module (mask builders, cache
helpers, output classes' factories) are auto-wrapped: they appear as opaque
call nodes instead of being traced through, which removes their branches.

Shapes come from running each graph on meta tensors: glue ops (norms, adds,
reshapes, the embedding) really execute on the meta device; a recognised
block is a residual block whose output has its hidden input's shape (it is
never executed: routing on meta tensors has no data to route by).
"""

from __future__ import annotations

import inspect
import math
import operator
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import torch
import torch.fx as fx
from torch import nn

from frontend.errors import CaptureError, UnrecognisedLayerError
from frontend.recognizers import Block, RecognizeContext, recognize

# Optional arguments HF-style forwards accept; fixed so cache branches vanish from the trace.
_FIXED_KWARGS = {"use_cache": False, "output_attentions": False, "output_hidden_states": False, "return_dict": False}
_MAX_LAYER_INPUTS = 8


class _Tracer(fx.Tracer):
    """An fx tracer with a leaf predicate and the model's own helper functions auto-wrapped."""

    def __init__(self, is_leaf: Callable[[nn.Module, str], bool], wrap_modules: list[ModuleType]):
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

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return self._is_leaf(m, module_qualified_name)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        # Remember which non-leaf module fx is inside, to name it if tracing through it fails.
        qualname = self.path_of_module(m)
        if self.is_leaf_module(m, qualname):
            return super().call_module(m, forward, args, kwargs)
        self.inside.append((qualname, m))
        result = super().call_module(m, forward, args, kwargs)
        self.inside.pop()
        return result


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


def find_decoder_stack(model: nn.Module) -> tuple[str, nn.ModuleList]:
    """The decoder layers: the longest outermost ModuleList whose entries all own weights.

    Outermost, so that a ModuleList of experts inside a layer (which can be
    longer than the stack) never wins.
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
    return max(outermost, key=lambda item: len(item[1]))


def _owner_of(model: nn.Module, stack_path: str) -> tuple[str, nn.Module]:
    owner_path = stack_path.rsplit(".", 1)[0] if "." in stack_path else ""
    return owner_path, model.get_submodule(owner_path) if owner_path else model


def _first_tensor_node(node: fx.Node) -> fx.Node | None:
    for arg in list(node.args) + list(node.kwargs.values()):
        if isinstance(arg, fx.Node):
            return arg
    return None


def _producer_module(node: fx.Node) -> fx.Node | None:
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
    ``NotImplemented`` to execute the module itself on meta. Glue that cannot
    run on meta (mask builders given no real mask) yields None: nothing we
    count depends on it.
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
            try:
                if node.op == "get_attr":
                    value = root
                    for part in str(node.target).split("."):
                        value = getattr(value, part)
                    if isinstance(value, torch.Tensor):
                        value = torch.empty_like(value, device="meta")
                elif node.op == "call_module":
                    value = _call_on_meta(root.get_submodule(str(node.target)), args, kwargs)
                elif node.op == "call_function":
                    value = node.target(*args, **kwargs)
                else:
                    value = getattr(args[0], str(node.target))(*args[1:], **kwargs)
            except Exception:  # noqa: BLE001 - see docstring: glue that cannot run on meta carries no counted shape
                value = None
        env[node] = value
    return env


def _call_on_meta(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """Run a glue module on meta tensors, its weights swapped for meta stand-ins if they are real."""
    state: dict[str, torch.Tensor] = dict(module.named_parameters())
    state.update(module.named_buffers())
    if all(t.is_meta for t in state.values()):
        return module(*args, **kwargs)
    meta_state = {name: torch.empty_like(t, device="meta") for name, t in state.items()}
    return torch.func.functional_call(module, meta_state, tuple(args), dict(kwargs))


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


def capture_stack(model: nn.Module, batch: int, seq_len: int, config: Any = None, reuse: bool = True) -> StackTrace:
    """Trace ``model``'s decoder stack; ``reuse=False`` traces every layer afresh (for measuring)."""
    stack_path, stack = find_decoder_stack(model)
    owner_path, owner = _owner_of(model, stack_path)
    prefix = f"{owner_path}." if owner_path else ""
    local_stack = stack_path[len(prefix):]
    layer_targets = {f"{local_stack}.{i}": i for i in range(len(stack))}

    raw_forward = inspect.unwrap(type(owner).forward)
    params = inspect.signature(raw_forward).parameters
    fixed = {k: v for k, v in _FIXED_KWARGS.items() if k in params}
    first_arg = next(n for n in list(params)[1:])

    def stack_forward(self: nn.Module, input_ids: torch.Tensor) -> Any:
        return raw_forward(self, **{first_arg: input_ids}, **fixed)

    def level1_leaf(m: nn.Module, qualname: str) -> bool:
        # Everything is a leaf except containers on the way to the decoder layers.
        return not (local_stack == qualname or local_stack.startswith(qualname + "."))

    tracer = _Tracer(level1_leaf, _module_of(raw_forward))
    graph = tracer.trace(_view_with_forward(owner, stack_forward))

    layer_nodes = [n for n in graph.nodes if n.op == "call_module" and n.target in layer_targets]
    if not layer_nodes:
        raise CaptureError(f"{type(owner).__name__}.forward never calls the layers in '{stack_path}'")
    first_input = layer_nodes[0].args[0] if layer_nodes[0].args else _first_tensor_node(layer_nodes[0])
    first_hidden = _producer_module(first_input) if isinstance(first_input, fx.Node) else None
    if first_hidden is None or first_hidden.op != "call_module":
        raise CaptureError(f"the input of '{prefix}{layer_nodes[0].target}' does not come from an embedding module")
    embed_target = first_hidden.target
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

    cache: dict[tuple[Any, ...], fx.Graph] = {}
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
        out = _capture_layer(trace, layer, node, args, kwargs, cache if reuse else {}, config)
        layers[node] = trace
        return out

    ids = torch.zeros((batch, seq_len), dtype=torch.long, device="meta")
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
        level2_traces=len(cache) if reuse else len(ordered),
    )


def _capture_layer(trace: LayerTrace, layer: nn.Module, node: fx.Node, args: list[Any], kwargs: dict[str, Any],
                   cache: dict[tuple[Any, ...], fx.Graph], config: Any) -> Any:
    """Trace one decoder layer (or reuse the trace of a same-shaped layer) and propagate shapes."""
    spec: list[tuple[str, Any, Any]] = []  # (positional|keyword, index|name, value or a Node marker)
    inputs: list[Any] = []
    for i, (arg, value) in enumerate(zip(node.args, args)):
        spec.append(("pos", i, _NODE if isinstance(arg, fx.Node) else arg))
        if isinstance(arg, fx.Node):
            inputs.append(value)
    for key, arg in node.kwargs.items():
        spec.append(("kw", key, _NODE if isinstance(arg, fx.Node) else arg))
        if isinstance(arg, fx.Node):
            inputs.append(kwargs[key])
    if len(inputs) > _MAX_LAYER_INPUTS:
        raise CaptureError(f"'{trace.path}' takes {len(inputs)} tensor inputs; at most {_MAX_LAYER_INPUTS} are supported")
    hidden = _first_tensor(inputs)
    if hidden is None:
        raise CaptureError(f"'{trace.path}' receives no floating-point hidden state")
    trace.input_shape = list(hidden.shape)
    whole = recognize(layer, RecognizeContext(trace.path, config))
    if whole is not None and whole.role in ("mixer", "ffn"):
        # The layer is itself one block (say, a bare MoE): nothing inside it to trace.
        trace.blocks.append(BlockCall(whole, list(hidden.shape)))
        trace.output_shape = list(hidden.shape)
        return _leaf_output(node, hidden)

    frozen_spec = tuple((kind, key, value if value is _NODE or _hashable(value) else id(value))
                        for kind, key, value in spec)
    signature = _layer_signature(layer, frozen_spec)
    graph = cache.get(signature)
    if graph is None:
        graph = _trace_layer(layer, spec, len(inputs), trace.path, config)
        cache[signature] = graph

    def block_leaf(n: fx.Node, a: list[Any], kw: dict[str, Any]) -> Any:
        module = layer.get_submodule(str(n.target))
        block = recognize(module, RecognizeContext(f"{trace.path}.{n.target}", config))
        if block is None or block.role == "glue":
            return NotImplemented
        if block.role == "norm":
            return _norm_output(module, n, a, kw, config)
        x = _first_tensor(list(a) + list(kw.values()))
        if x is None:
            raise CaptureError(f"block '{block.path}' receives no floating-point input")
        trace.blocks.append(BlockCall(block, list(x.shape)))
        return _leaf_output(n, x)

    env = _run_meta(graph, layer, inputs + [None] * (_MAX_LAYER_INPUTS - len(inputs)), block_leaf)
    out = next(v for n, v in env.items() if n.op == "output")
    result = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(result, torch.Tensor):
        raise CaptureError(f"'{trace.path}' produced no tensor in meta propagation")
    trace.output_shape = list(result.shape)
    return out


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


def _trace_layer(layer: nn.Module, spec: list[tuple[str, Any, Any]], n_inputs: int, path: str, config: Any) -> fx.Graph:
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

    def level2_leaf(m: nn.Module, qualname: str) -> bool:
        if blocks.get(id(m)) is not None:
            return True
        if next(m.children(), None) is None and next(m.parameters(), None) is not None:
            cls = type(m)
            raise UnrecognisedLayerError(f"{path}.{qualname}", f"{cls.__module__}.{cls.__qualname__}",
                                         "it owns weights but matches no recogniser")
        return False

    tracer = _Tracer(level2_leaf, _module_of(raw_forward))
    unused = {f"t{i}": None for i in range(n_inputs, _MAX_LAYER_INPUTS)}
    try:
        return tracer.trace(_view_with_forward(layer, layer_forward), concrete_args=unused)
    except (fx.proxy.TraceError, TypeError, RuntimeError, ValueError, AttributeError) as exc:
        # A block no recogniser matched was traced through and hit data-dependent Python.
        qualname, module = tracer.inside[-1] if tracer.inside else ("", layer)
        cls = type(module)
        where = f"{path}.{qualname}" if qualname else path
        raise UnrecognisedLayerError(where, f"{cls.__module__}.{cls.__qualname__}",
                                     f"torch.fx could not trace through it: {exc}") from exc
