"""Layer kinds stated outside the blocks: the user's overrides and the config's declared layer types.

Overrides (``--layer-kind 3=linear_attention``, ``LAYER_KINDS = {3: "linear_attention"}`` in a
model.py) set the mixer kind of a layer, whatever recognition says. Configs of hybrid families
declare what each layer is, under several spellings (``layer_types``, ``layers_block_type``,
``attn_type_list``, ``hybrid_override_pattern``, ``block_types``); capture never trusts them
blindly, it compares them with what each block does and warns when the two disagree.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from frontend.errors import LayerKindError
from frontend.mixers import RECURRENT_KINDS, SOFTMAX_KINDS
from tessera_ir.kinds import MixerKind

_KINDS = {k.value: k for k in MixerKind if k is not MixerKind.NONE}
_FULL = frozenset({MixerKind.ATTENTION, MixerKind.MLA})
_NO_MIXER = frozenset({MixerKind.NONE})
_RECURRENT_TERMS = {"conv", "short_conv", "recurrent", "mamba", "mamba2", "ssm", "rwkv", "retention", "deltanet",
                    "gated_deltanet", "gdn", "kda", "lightning", "lightning_attention", "m"}
_NO_MIXER_TERMS = {"mlp", "moe", "dense", "sparse", "ffn", "-", "e"}
_FULL_TERMS = {"attention", "full_attention", "full", "global", "global_attention", "attn", "mla", "*"}


def _kind(text: str, where: str) -> MixerKind:
    kind = _KINDS.get(text.strip().lower())
    if kind is None:
        raise LayerKindError(f"{where}: unknown layer kind '{text.strip()}'; use one of {', '.join(_KINDS)}")
    return kind


def parse_layer_kind_flags(specs: Iterable[str]) -> dict[int, MixerKind]:
    """``--layer-kind`` values ``INDEXES=KIND``; INDEXES is a comma list of layer indexes and ranges ``N-M``."""
    kinds: dict[int, MixerKind] = {}
    for spec in specs:
        where = f"--layer-kind {spec}"
        indexes, sep, kind_text = spec.partition("=")
        if not sep or not indexes.strip():
            raise LayerKindError(f"{where}: expected INDEX=KIND, e.g. --layer-kind 3=linear_attention or 0-2,5=ssm")
        kind = _kind(kind_text, where)
        for part in indexes.split(","):
            first, dash, last = part.strip().partition("-")
            if not first.isdigit() or (dash and not last.isdigit()):
                raise LayerKindError(f"{where}: '{part.strip()}' is not a layer index or a range N-M of them")
            low, high = int(first), int(last) if dash else int(first)
            if high < low:
                raise LayerKindError(f"{where}: the range {low}-{high} is empty; write it low-high")
            for index in range(low, high + 1):
                kinds[index] = kind
    return kinds


def layer_kinds_table(table: Any, where: str) -> dict[int, MixerKind]:
    """``LAYER_KINDS`` of a model.py: ``{index: kind}``, or a list with a kind (or None) per layer."""
    if table is None:
        return {}
    if isinstance(table, Mapping):
        items: Iterable[tuple[Any, Any]] = table.items()
    elif isinstance(table, Sequence) and not isinstance(table, str):
        items = enumerate(table)
    else:
        raise LayerKindError(f"{where}: LAYER_KINDS must be a dict {{layer index: kind}} or a list of kinds, "
                             f"not {type(table).__name__}")
    kinds: dict[int, MixerKind] = {}
    for index, kind in items:
        if kind is None:
            continue
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise LayerKindError(f"{where}: LAYER_KINDS key {index!r} is not a layer index (an int >= 0)")
        kinds[index] = kind if isinstance(kind, MixerKind) else _kind(str(kind), f"{where}: LAYER_KINDS[{index}]")
    return kinds


@dataclass(frozen=True)
class Declared:
    """What a model's config says one layer is."""

    text: str  # the config's own term, e.g. "full_attention"
    field: str  # where it said so, e.g. "layer_types[3]"
    kinds: frozenset[MixerKind]  # the mixer kinds that term allows (MixerKind.NONE: no mixer)

    def suggestion(self) -> MixerKind:
        """The kind to pass to --layer-kind to follow the config."""
        order = [MixerKind.ATTENTION, MixerKind.SLIDING_ATTENTION, MixerKind.LINEAR_ATTENTION, MixerKind.SSM,
                 MixerKind.MLA, MixerKind.NONE]
        return next(k for k in order if k in self.kinds)


def _term_kinds(term: str) -> frozenset[MixerKind] | None:
    """The mixer kinds a config term allows, or None for terms that do not say (``hybrid``: two mixers)."""
    t = term.strip().lower()
    if t.startswith("hybrid"):
        return None
    if "linear" in t or t in _RECURRENT_TERMS:
        return RECURRENT_KINDS
    if t in _NO_MIXER_TERMS:
        return _NO_MIXER
    if "sliding" in t or "window" in t or "local" in t:
        return frozenset({MixerKind.SLIDING_ATTENTION})
    if t in _FULL_TERMS:
        return _FULL
    if "attention" in t:  # chunked, indexed, compressed ... attention: softmax of some extent
        return SOFTMAX_KINDS
    return None


def _terms(config: Any, n_layers: int) -> tuple[str, list[str]] | None:
    """(field name, one term per layer) from the first layer-type field of the config that covers the stack."""
    for cfg in (config, getattr(config, "text_config", None)):
        if cfg is None:
            continue
        for name in ("layer_types", "layers_block_type"):
            value = getattr(cfg, name, None)
            if isinstance(value, (list, tuple)) and len(value) == n_layers and all(isinstance(v, str) for v in value):
                return name, list(value)
        value = getattr(cfg, "attn_type_list", None)  # MiniMax: 0 = lightning (linear), 1 = softmax
        if isinstance(value, (list, tuple)) and len(value) == n_layers:
            return "attn_type_list", ["linear_attention" if int(v) == 0 else "full_attention" for v in value]
        value = getattr(cfg, "hybrid_override_pattern", None)  # Nemotron-H: M mamba, * attention, -/E mlp/moe
        if isinstance(value, str) and len(value) == n_layers:
            return "hybrid_override_pattern", list(value)
        value = getattr(cfg, "block_types", None)  # a pattern repeated over the stack
        if isinstance(value, (list, tuple)) and value and all(isinstance(v, str) for v in value):
            return "block_types", [value[i % len(value)] for i in range(n_layers)]
    return None


def declared_layer_types(config: Any, n_layers: int) -> list[Declared | None]:
    """Per decoder layer, what the config declares it to be (None where it declares nothing usable)."""
    found = _terms(config, n_layers) if config is not None else None
    if found is None:
        return [None] * n_layers
    field_name, terms = found
    declared: list[Declared | None] = []
    for i, term in enumerate(terms):
        kinds = _term_kinds(term)
        declared.append(Declared(term, f"{field_name}[{i}]", kinds) if kinds is not None else None)
    return declared
