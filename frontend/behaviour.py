"""What a mixer block does, learnt by running it once on meta tensors.

Module and parameter names say what a block was *called*; the operations it
runs say what it *is*. ``observe(module, args, kwargs, seq_len)`` calls the
block's forward on meta tensors (no storage, no FLOPs) under a
``TorchFunctionMode`` that logs every torch call with the identities and shapes
of its tensors, then reads the log:

- **softmax attention**: a fused attention kernel (SDPA, flex, flash) on
  sequence-long operands, or a softmax over the key axis of query x key scores
  (a tensor with two sequence axes, or one derived from such a product);
- **linear attention / recurrence**: a *state* without a sequence axis that is
  updated from its previous value at least twice with data derived from the
  block's input (chunked or token-by-token recurrences, lightning blocks,
  selective scans); a prefix sum along the sequence axis (cumulative-sum
  linear attention); query x key scores applied to values *without* a
  softmax (the parallel form of retention and decayed linear attention); a
  depthwise causal convolution along the sequence (short-conv mixers);
- **delta rule**: a read of the state subtracted from input-derived values
  (``v - k S``), which Gated DeltaNet and its relatives add to linear attention;
- **latent (MLA) attention**: keys and values that come out of an
  up-projection whose input is narrower than the hidden size.

A block's forward may branch on anything, loop over chunks or tokens, and
call helper functions: nothing here traces it. The log is read as it grows,
and the run ends once a recurrence has folded in new data four times (the
rest of its loop repeats what was seen); it also stops after ``budget`` torch
calls, and a block that cannot run on meta tensors (``.item()``, a missing
mask) is read up to the point where it failed. Those two are reported in
``Behaviour.stopped``, so callers can tell an inconclusive observation from a
negative one. (A block that ran a recurrence and only afterwards a softmax
over the sequence would be read as linear attention; no such block is known.)
"""

from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

# Torch calls whose name says they are a fused softmax-attention kernel.
_FUSED_ATTENTION = ("scaled_dot_product", "flex_attention", "flash_attn", "flash_attention", "memory_efficient_attention")
_SOFTMAX = {"softmax", "log_softmax", "_softmax", "_log_softmax"}
_PREFIX_SUM = {"cumsum", "cumsum_", "cumprod", "cumprod_", "logcumsumexp"}
_CONTRACTIONS = {"matmul", "__matmul__", "__rmatmul__", "bmm", "mm", "einsum", "baddbmm", "tensordot"}
# Arithmetic that can produce the next value of a state from the previous one.
_UPDATES = {
    "add", "add_", "__add__", "__radd__", "__iadd__", "sub", "sub_", "__sub__", "__rsub__", "__isub__", "rsub",
    "mul", "mul_", "__mul__", "__rmul__", "__imul__", "div", "div_", "__truediv__", "__itruediv__", "addcmul",
    "addcmul_", "lerp", "lerp_",
}
_SUBTRACT = {"sub", "sub_", "__sub__", "__isub__", "subtract"}
_SLICES = {"__getitem__", "narrow", "select", "unbind", "split", "split_with_sizes", "tensor_split", "chunk",
           "index_select"}
# Metadata queries: no data flows through them, so they are neither logged nor counted.
_METADATA = {"__get__", "__set__", "size", "dim", "__len__", "numel", "is_floating_point", "stride", "data_ptr",
             "is_contiguous", "element_size", "__repr__", "__format__", "__bool__", "__index__", "__int__"}

DEFAULT_BUDGET = 1500
# Updates with new data after which a recurrence is taken as seen (two or more steps of any loop).
_SETTLED_AFTER = 4


@dataclass
class AttentionOperands:
    """Shapes of the query, key and value of a softmax (or score) computation."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...] | None
    latent_kv: bool  # keys (and values) come out of an up-projection of a narrow latent


@dataclass
class Behaviour:
    """What one run of a block on meta tensors showed."""

    batch: int
    seq_len: int
    calls: int = 0  # torch calls logged
    stopped: str = ""  # why the run ended early ("" when the forward returned)
    fused_attention: str = ""  # name of the fused softmax-attention kernel it called
    softmax_over_sequence: bool = False
    attention: AttentionOperands | None = None
    scores_without_softmax: bool = False
    prefix_sum_over_sequence: bool = False
    prefix_sum_shape: tuple[int, ...] | None = None  # the largest tensor summed along the sequence
    state_shape: tuple[int, ...] | None = None  # the recurrent state, batch first
    state_updates: int = 0  # the longest chain of updates of that state
    state_chunk: int = 1  # tokens folded into the state per update (1: token by token)
    delta_rule: bool = False
    conv_channels: int = 0
    conv_kernel: int = 0

    @property
    def softmax(self) -> bool:
        return bool(self.fused_attention) or self.softmax_over_sequence

    @property
    def linear(self) -> bool:
        """Sequence mixing without a softmax: a recurrence, a prefix sum, softmax-free scores or a short conv."""
        return (self.state_shape is not None or self.prefix_sum_over_sequence or self.scores_without_softmax
                or self.conv_kernel > 0)

    @property
    def mixes_tokens(self) -> bool:
        return self.softmax or self.linear

    def describe(self) -> str:
        """A short account of the evidence, for messages."""
        parts = []
        if self.fused_attention:
            parts.append(f"calls {self.fused_attention}")
        if self.softmax_over_sequence:
            parts.append("applies a softmax over the key axis of query-key scores")
        if self.state_shape is not None:
            every = f" every {self.state_chunk} tokens" if self.state_chunk > 1 else " token by token"
            parts.append(f"updates a {list(self.state_shape[1:])} state{every}")
        if self.delta_rule:
            parts.append("subtracts the state's prediction from the values (delta rule)")
        if self.prefix_sum_over_sequence:
            parts.append("takes a prefix sum along the sequence")
        if self.scores_without_softmax:
            parts.append("weights values by query-key products without a softmax")
        if self.conv_kernel:
            parts.append(f"runs a causal depthwise conv (kernel {self.conv_kernel}) along the sequence")
        if not parts:
            parts.append("mixes no positions of the sequence")
        text = ", ".join(parts)
        return f"{text} (its run on meta tensors stopped: {self.stopped})" if self.stopped else text


class _BudgetSpent(Exception):
    """Raised inside the block's forward to end a run that has gone on long enough."""


class _Settled(Exception):
    """Raised inside the block's forward once a recurrence has been seen over several steps."""


@dataclass
class _Tensor:
    shape: tuple[int, ...]
    origin: str  # "input" (the block's arguments), "made" (inside the block), "outside" (weights, buffers)
    tainted: bool = False  # derived from the block's inputs
    latent: bool = False  # an up-projection of a narrow latent, or derived from one
    probs: bool = False  # a softmax over scores, or derived from one
    scores: bool = False  # query x key products over the sequence, or derived from them
    depth: int = 0  # how many updates from a same-shaped predecessor made this value
    fresh: int = 0  # how many of those updates mixed in new input data (not derived from the state itself)
    parent: int | None = None  # the tensor this value updates
    root: int | None = None  # the first value of the chain of updates this value belongs to (None: itself)
    born: int = -1  # index of the call that made it (-1: from outside the block)
    slices: frozenset[tuple[int, int, int]] = frozenset()  # (source, call, output) slicings the chain took data from
    reads_state: bool = False  # computed from the recurrent state


@dataclass
class _Call:
    name: str
    inputs: list[int]
    outputs: list[int]
    shapes_in: list[tuple[int, ...]]
    dim: int | None
    weight: tuple[int, ...] | None  # the weight shape of linear and conv1d


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _dim_argument(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int | None:
    dim = kwargs.get("dim", args[1] if len(args) > 1 else None)
    return dim if isinstance(dim, int) and not isinstance(dim, bool) else None


class _Recorder(TorchFunctionMode):
    """Logs torch calls with the identities of their tensors; stops the run after ``budget`` calls.

    ``on_call(index, call)`` reads each call as it is logged and returns True once the run has
    shown enough (a settled recurrence), which ends it early.
    """

    def __init__(self, budget: int):
        super().__init__()
        self.budget = budget
        self.on_call: Callable[[int, _Call], bool] = lambda index, call: False
        self.calls: list[_Call] = []
        self.tensors: dict[int, _Tensor] = {}
        self._alive: list[torch.Tensor] = []  # every logged tensor stays alive, so ids stay unique

    def track(self, t: torch.Tensor, origin: str) -> int:
        key = id(t)
        if key not in self.tensors:
            self.tensors[key] = _Tensor(tuple(t.shape), origin)
            self._alive.append(t)
        return key

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = str(getattr(func, "__name__", func)).rsplit(".", 1)[-1]
        if name in _METADATA:
            return func(*args, **kwargs)
        if len(self.calls) >= self.budget:
            raise _BudgetSpent
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        input_ids = [self.track(t, "outside") for t in inputs]
        shapes_in = [tuple(t.shape) for t in inputs]
        out = func(*args, **kwargs)
        outputs = []
        for t in _tensors(out):
            key = id(t)
            if key in self.tensors:  # an in-place op returns its input
                self.tensors[key].shape = tuple(t.shape)
            else:
                self.track(t, "made")
                self.tensors[key].born = len(self.calls)
            outputs.append(key)
        weight = tuple(inputs[1].shape) if name in ("linear", "conv1d") and len(inputs) > 1 else None
        call = _Call(name, input_ids, outputs, shapes_in, _dim_argument(args, kwargs), weight)
        self.calls.append(call)
        if self.on_call(len(self.calls) - 1, call):
            raise _Settled
        return out


def _seq_axes(shape: tuple[int, ...], seq: int) -> int:
    return sum(1 for d in shape if d == seq)


def _query_key_axes(shape: tuple[int, ...], seq: int) -> bool:
    """A query axis (length S) and a different key axis (S, or longer with memory or compressed entries)."""
    queries = [i for i, d in enumerate(shape) if d == seq]
    return any(j != i and d >= seq for i in queries for j, d in enumerate(shape))


def _could_be_state(shape: tuple[int, ...], seq: int) -> bool:
    """A state has no sequence axis and at least two non-trivial axes besides the batch."""
    return not _seq_axes(shape, seq) and len(shape) >= 2 and sum(d > 1 for d in shape[1:]) >= 2


def _root(tensors: dict[int, _Tensor], key: int) -> int:
    root = tensors[key].root
    return key if root is None else root


def _sliced_twice(slices: set[tuple[int, int, int]]) -> bool:
    sources: dict[int, int] = {}
    for source, _, _ in slices:
        sources[source] = sources.get(source, 0) + 1
    return any(count >= 2 for count in sources.values())


class _Analysis:
    """Reads the call log into a Behaviour: per-tensor facts propagated call by call, then the state."""

    def __init__(self, rec: _Recorder, behaviour: Behaviour, hidden: int):
        self.rec = rec
        self.tensors = rec.tensors
        self.b = behaviour
        self.seq = behaviour.seq_len
        self.hidden = hidden
        self.state_members: set[int] = set()
        self.producer: dict[int, int] = {}  # tensor -> index of the latest call that wrote it
        self.roots: set[int] = set()  # first values of chains of updates
        self.settled = False

    def step(self, index: int, call: _Call) -> bool:
        """Read one call; True once a recurrence has folded in new data four times from repeated slices."""
        self._propagate(call)
        self._attention(call)
        self._linear(call)
        self._state_update(call)
        for key in call.outputs:
            self.producer[key] = index
        return self.settled

    def finish(self) -> None:
        self._choose_state()
        if self.b.state_shape is not None:
            self._delta_rule()

    def _ins(self, call: _Call) -> list[_Tensor]:
        return [self.tensors[i] for i in call.inputs]

    def _propagate(self, call: _Call) -> None:
        ins = self._ins(call)
        tainted = any(t.tainted for t in ins)
        contraction = call.name in _CONTRACTIONS
        for key in call.outputs:
            out = self.tensors[key]
            if out.origin != "made":
                continue
            out.tainted = out.tainted or tainted
            out.latent = out.latent or any(t.latent and t.tainted for t in ins)
            out.probs = out.probs or (any(t.probs for t in ins) and not contraction)
            scores_in = any(t.scores for t in ins) and not contraction and _seq_axes(out.shape, self.seq) > 0
            # query x key: a product of two input-derived operands (not a projection by a weight)
            made_scores = contraction and sum(t.tainted for t in ins) >= 2 and _query_key_axes(out.shape, self.seq)
            out.scores = out.scores or scores_in or made_scores
        if call.name == "linear" and call.weight is not None and len(call.weight) == 2 and tainted:
            fan_out, fan_in = call.weight
            if fan_in < fan_out and fan_in < self.hidden:  # up-projection out of a narrow latent
                for key in call.outputs:
                    self.tensors[key].latent = True

    def _attention(self, call: _Call) -> None:
        ins = self._ins(call)
        if not any(t.tainted for t in ins):
            return
        lower = call.name.lower()
        if any(k in lower for k in _FUSED_ATTENTION) and len(ins) >= 3 and _seq_axes(ins[0].shape, self.seq):
            k, v = ins[1], ins[2]
            self.b.fused_attention = self.b.fused_attention or call.name
            self.b.attention = AttentionOperands(call.shapes_in[0], call.shapes_in[1], call.shapes_in[2],
                                                 k.latent and v.latent)
            return
        if call.name in _SOFTMAX and call.dim is not None and ins:
            shape = call.shapes_in[0]
            source = ins[0]
            if shape and shape[call.dim % len(shape)] >= self.seq and (source.scores or _query_key_axes(shape, self.seq)):
                self.b.softmax_over_sequence = True
                for key in call.outputs:
                    self.tensors[key].probs = True
            return
        if call.name in _CONTRACTIONS and len(ins) >= 2 and call.outputs:
            out = self.tensors[call.outputs[0]]
            probs = [t for t in ins if t.probs]
            if out.scores and not probs and self.b.attention is None:
                self.b.attention = AttentionOperands(call.shapes_in[0], call.shapes_in[1], None, ins[1].latent)
            elif probs and self.b.attention is not None and self.b.attention.value is None:
                value = next((shape for shape, t in zip(call.shapes_in, ins) if not t.probs), None)
                latent = self.b.attention.latent_kv and any(t.latent for t in ins if not t.probs)
                self.b.attention = AttentionOperands(self.b.attention.query, self.b.attention.key, value, latent)
            if any(t.scores for t in ins) and not probs and _seq_axes(out.shape, self.seq) and not out.scores:
                self.b.scores_without_softmax = True  # scores @ values, no softmax in between

    def _linear(self, call: _Call) -> None:
        ins = self._ins(call)
        if not ins or not ins[0].tainted:
            return
        if call.name in _PREFIX_SUM and call.dim is not None:
            shape = call.shapes_in[0]
            if shape and shape[call.dim % len(shape)] == self.seq:
                self.b.prefix_sum_over_sequence = True
                largest = self.b.prefix_sum_shape
                if largest is None or math.prod(shape) > math.prod(largest):
                    self.b.prefix_sum_shape = shape
        if call.name == "conv1d" and call.weight is not None and len(call.weight) == 3:
            length, kernel = call.shapes_in[0][-1], call.weight[-1]
            # Depthwise (one input channel per group), short, along the (causally padded) sequence.
            if call.weight[1] == 1 and 1 < kernel <= 16 and self.seq <= length <= self.seq + 2 * kernel:
                self.b.conv_channels = max(self.b.conv_channels, call.weight[0])
                self.b.conv_kernel = max(self.b.conv_kernel, kernel)

    def _state_update(self, call: _Call) -> None:
        if call.name not in _UPDATES:
            return
        for key in call.outputs:
            out = self.tensors[key]
            if not _could_be_state(out.shape, self.seq):
                continue
            previous = [i for i in call.inputs
                        if self.tensors[i].origin == "made" and self.tensors[i].shape == out.shape]
            if not previous:
                continue
            # The longest chain, else the oldest value: a state made before the loop, not this step's slice.
            prev_key = max(previous, key=lambda i: (self.tensors[i].depth, -self.tensors[i].born))
            root = _root(self.tensors, prev_key)
            new = [found for i in call.inputs if i != prev_key
                   for found in (self._new_data(i, root),) if found is not None]
            prev = self.tensors[prev_key]
            self.roots.add(root)
            if prev_key != key:
                out.depth, out.fresh, out.parent, out.root = prev.depth, prev.fresh, prev_key, root
                out.slices = prev.slices
            out.depth += 1
            out.fresh += int(bool(new))
            out.slices = out.slices.union(*new)
            if out.fresh >= _SETTLED_AFTER and _sliced_twice(set(out.slices)):
                self.settled = True

    def _new_data(self, key: int, root: int) -> frozenset[tuple[int, int, int]] | None:
        """The slicings through which ``key`` carries input data that did not come through the chain of
        ``root``; None when it carries none.

        A recurrence folds new tokens into its state (``S + k^T v``, ``S * exp(g_t)``, and the delta
        rule's ``S + k^T (v - k S)``); rescaling a made tensor by itself and by constants (a rotary
        embedding of compressed keys: ``x * cos + rotate(x) * sin``) folds in nothing new.
        """
        stack: list[tuple[int, bool]] = [(key, True)]
        seen: set[tuple[int, bool]] = set()
        found = False
        slices: set[tuple[int, int, int]] = set()
        while stack:
            current, collect = item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            t = self.tensors[current]
            if not t.tainted or _root(self.tensors, current) == root:
                continue
            # Behind another chain lies that chain's history (earlier chunks): data, but not slices of ours.
            collect = collect and not (t.depth or current in self.roots)
            index = self.producer.get(current)
            producer = self.rec.calls[index] if index is not None else None
            if collect and producer is not None and producer.name in _SLICES and producer.inputs:
                slices.add((producer.inputs[0], index, producer.outputs.index(current)))  # type: ignore[arg-type]
            if t.origin == "input" or _seq_axes(t.shape, self.seq):
                found = True
                continue
            if producer is not None:
                stack.extend((i, collect) for i in producer.inputs)
        return frozenset(slices) if found else None

    def _choose_state(self) -> None:
        chains: dict[int, int] = {}
        slices: dict[int, set[tuple[int, int, int]]] = {}
        for key, t in self.tensors.items():
            if t.fresh and t.tainted:
                root = _root(self.tensors, key)
                chains[root] = max(chains.get(root, 0), t.fresh)
                slices.setdefault(root, set()).update(t.slices)
        # A recurrence folds new data in at least twice, from different slices of the same tensor (the
        # next chunk, the next token); temporaries of one loop step take each slice once.
        chains = {root: fresh for root, fresh in chains.items() if fresh >= 2 and _sliced_twice(slices[root])}
        if not chains:
            return
        root = max(chains, key=lambda r: (chains[r], self.tensors[r].shape))
        self.b.state_shape = self.tensors[root].shape
        self.b.state_updates = chains[root]
        self.state_members = {k for k in self.tensors if _root(self.tensors, k) == root}
        self.b.state_chunk = self._chunk(root)

    def _chunk(self, root: int) -> int:
        """Tokens folded in per update: the contracted length of a product added into the state."""
        members = self.state_members
        increments = {i for call in self.rec.calls if set(call.outputs) & members and call.name in _UPDATES
                      for i in call.inputs if i not in members}
        state = self.tensors[root].shape
        for call in self.rec.calls:
            if call.name in _CONTRACTIONS and set(call.outputs) & increments and len(call.shapes_in) >= 2:
                a, b = call.shapes_in[0], call.shapes_in[1]
                if len(a) >= 2 and len(b) >= 2 and a[-1] == b[-2] and a[-1] not in state[-2:]:
                    return int(a[-1])
        return 1

    def _delta_rule(self) -> None:
        """A read of the state (``k S``) subtracted from input-derived values: the delta rule's correction."""
        members = self.state_members
        for call in self.rec.calls:
            ins = self._ins(call)
            reads = any(i in members or t.reads_state for i, t in zip(call.inputs, ins))
            if reads:
                for key in call.outputs:
                    if key not in members:
                        self.tensors[key].reads_state = True
            if call.name in _SUBTRACT and len(ins) >= 2:
                minuend, subtrahend = ins[0], ins[1]
                if minuend.tainted and not minuend.reads_state and subtrahend.reads_state \
                        and call.inputs[0] not in members:
                    self.b.delta_rule = True


def call_on_meta(module: nn.Module, args: Any, kwargs: Any) -> Any:
    """Run ``module`` on meta tensors, its weights swapped for meta stand-ins if they are real
    (a model.py may build real weights: nothing is computed on them or written to them)."""
    weights: dict[str, torch.Tensor] = dict(module.named_parameters())
    weights.update(module.named_buffers())
    if all(t.is_meta for t in weights.values()):
        return module(*args, **kwargs)
    meta = {name: torch.empty_like(t, device="meta") for name, t in weights.items()}
    return torch.func.functional_call(module, meta, tuple(args), dict(kwargs))


def observe(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], batch: int, seq_len: int,
            budget: int = DEFAULT_BUDGET) -> Behaviour:
    """Run ``module(*args, **kwargs)`` once on meta tensors and report what it did along the sequence."""
    behaviour = Behaviour(batch, seq_len)
    rec = _Recorder(budget)
    floating = [t for t in _tensors((args, kwargs)) if t.is_floating_point()]
    hidden = int(floating[0].shape[-1]) if floating else 0
    analysis = _Analysis(rec, behaviour, hidden)
    rec.on_call = analysis.step
    for t in _tensors((args, kwargs)):
        key = rec.track(t, "input")
        rec.tensors[key].tainted = True
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)  # a library announcing its reference fallbacks says nothing about the block
    try:
        with warnings.catch_warnings(), torch.no_grad(), rec:
            warnings.simplefilter("ignore")
            call_on_meta(module, args, kwargs)
    except _Settled:
        pass  # the rest of the loop repeats what was seen
    except _BudgetSpent:
        behaviour.stopped = f"after {budget} torch calls"
    except Exception as exc:  # noqa: BLE001 - a failure on meta ends the run; what ran is still evidence
        lines = str(exc).strip().splitlines()
        behaviour.stopped = f"{type(exc).__name__}: {lines[0][:160] if lines else ''}"
    finally:
        logger.setLevel(level)
    behaviour.calls = len(rec.calls)
    analysis.finish()
    return behaviour
