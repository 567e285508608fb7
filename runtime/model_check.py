"""The model a trainer hands to ``TrainingSession.start`` checked against the model its plan was compiled for.

The plan signature (``codegen.signature``) hashes the compiler's captured IR:
every task's FLOPs, bytes and shapes. The runtime cannot recompute it from an
``nn.Module`` without the compiler, so a trainer that passes no signature
still gets this check, which reads what the plan itself records and compares
it, field by field, with what the model's binding finds in the module:

- ``model``: the plan's model name against the model's (``config.model_type``
  of a transformers model; see ``ModelBinding.model_name``);
- ``layers``: the number of decoder layers the plan runs;
- ``layer <name> mixer``: each layer's mixer kind (``attention``,
  ``linear_attention``, ...) where both the plan and the binding name one;
- ``layer <name> ffn``: each layer's feed-forward: a routed MoE (router and
  expert tasks), with or without a shared expert, or a dense MLP.

What the plan does not record (the expert count, top-k, hidden size and
vocabulary are in the signature only, through the task shapes) is listed in
``ModelCheck.unchecked``; passing the signature the compiler gave checks them
too, as one hash. The check runs on every rank with the same inputs, before any
process group exists, so a mismatch stops every rank with the same message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torch import nn

from runtime.bindings.base import MIXER_KINDS, BindingError, ModelBinding

# What a plan's tasks cannot tell: these reach the runtime only through the signature.
UNRECORDED_FIELDS = ("experts", "top_k", "hidden_size", "vocab_size")


class UncheckedModelWarning(UserWarning):
    """A session started without the plan signature: what the plan does not record went unchecked."""


class ModelMismatch(BindingError):
    """The model given to ``start`` is not the one the plan was compiled for; ``field`` names what differs."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}; compile the plan for this model")
        self.field = field


@dataclass(frozen=True)
class LayerDescription:
    """One decoder layer as a plan records it, or as a model has it.

    ``mixer``: the mixer kind, or None where it is not named (a plan's generic
    ``mixer`` tasks, a binding that does not tell). ``ffn``: ``moe``,
    ``moe+shared`` or ``dense``.
    """

    name: str
    mixer: str | None
    ffn: str


@dataclass(frozen=True)
class ModelDescription:
    model: str | None
    layers: tuple[LayerDescription, ...]


@dataclass(frozen=True)
class ModelCheck:
    """What ``check_model_against_plan`` compared (all equal), and what the plan gave it no way to compare."""

    checked: tuple[str, ...]
    unchecked: tuple[str, ...]
    signature_checked: bool

    def unchecked_note(self) -> str | None:
        """One line naming what was not compared (None when the signature covered it)."""
        if not self.unchecked:
            return None
        return (f"no plan signature given: the model was checked against the plan's {', '.join(self.checked)}, "
                f"not its {', '.join(self.unchecked)}, which the plan does not record; pass signature= "
                "(codegen.signature.plan_signature of the model) to check them too")


def _ffn_of_ops(ops: set[str]) -> str:
    if "router" in ops or "expert_gemm" in ops:
        return "moe+shared" if "shared_expert" in ops else "moe"
    return "dense"


def describe_plan(programs: Sequence[Any]) -> ModelDescription:
    """The model a plan was compiled for, as far as its task table records it (decoder layers ``l<i>``)."""
    ops: dict[str, set[str]] = {}
    mixers: dict[str, str | None] = {}
    for program in programs:
        for t in program.tasks:
            if t.layer in ("embed", "head"):
                continue
            op = t.kind.rpartition(".")[0]
            ops.setdefault(t.layer, set()).add("mixer" if op in MIXER_KINDS else op)
            if op in MIXER_KINDS:
                mixers[t.layer] = op
            elif op == "mixer":
                mixers.setdefault(t.layer, None)
    names = sorted(ops, key=_layer_order)
    layers = tuple(LayerDescription(n, mixers.get(n), _ffn_of_ops(ops[n])) for n in names)
    return ModelDescription(str(programs[0].plan.model), layers)


def _layer_order(name: str) -> tuple[int, str]:
    digits = name[1:] if name.startswith("l") else ""
    return (int(digits), name) if digits.isdigit() else (1 << 30, name)


def describe_model(family: type[ModelBinding], model: nn.Module) -> ModelDescription:
    """The same description of ``model``, from what its binding finds in the module."""
    parts = family.locate(model)
    layers = []
    for i, block in enumerate(parts.layers):
        mixer, ffn = family.describe_layer(model, i, block)
        layers.append(LayerDescription(f"l{i}", mixer, ffn))
    return ModelDescription(family.model_name(model), tuple(layers))


def check_model_against_plan(
    family: type[ModelBinding], model: nn.Module, programs: Sequence[Any], *, signature_checked: bool = False,
) -> ModelCheck:
    """Refuse (``ModelMismatch``, naming the field) a model that is not the one the plan was compiled for."""
    planned, have = describe_plan(programs), describe_model(family, model)
    what = type(model).__name__
    checked = []
    if have.model is not None:
        if have.model != planned.model:
            raise ModelMismatch("model", f"the plan was compiled for a '{planned.model}' model, this {what} is '{have.model}'")
        checked.append("model")
    if len(planned.layers) != len(have.layers):
        raise ModelMismatch(
            "layers", f"the plan runs {len(planned.layers)} decoder layers but the {what} has {len(have.layers)}"
        )
    if [p.name for p in planned.layers] != [h.name for h in have.layers]:
        raise ModelMismatch(
            "layers", f"the plan's decoder layers are {[p.name for p in planned.layers]}, not l0..l{len(have.layers) - 1}"
        )
    checked.append("layers")
    for p, h in zip(planned.layers, have.layers):
        if p.mixer is not None and h.mixer is not None and p.mixer != h.mixer:
            raise ModelMismatch(f"layer {p.name} mixer", f"the plan runs {p.mixer} there, the {what} has {h.mixer}")
        if p.ffn != h.ffn:
            raise ModelMismatch(f"layer {p.name} ffn", f"the plan runs {_FFN_WORDS[p.ffn]} there, the {what} has {_FFN_WORDS[h.ffn]}")
    if any(p.mixer is not None and h.mixer is not None for p, h in zip(planned.layers, have.layers)):
        checked.append("mixer kinds")
    checked += ["ffn kinds", "shared expert"]
    unchecked = () if signature_checked else UNRECORDED_FIELDS
    return ModelCheck(tuple(checked), unchecked, signature_checked)


_FFN_WORDS = {
    "moe": "a routed MoE without a shared expert",
    "moe+shared": "a routed MoE with a shared expert",
    "dense": "a dense MLP",
}
