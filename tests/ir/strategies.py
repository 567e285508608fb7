"""Hypothesis strategies that generate valid Tessera IR modules.

A generated module has random layer kinds (embedding and head optional, any
mixer and ffn per decoder layer), tasks laid out by ``builders.build_module``
with random sizes and shapes, random extra attributes of every value type
(nested lists, @references to real entities, awkward floats and strings), and
plan ops with entries. Every module it yields passes every verifier check.
"""

from __future__ import annotations

import string
from typing import Any

from hypothesis import strategies as st

from tessera_ir.kinds import FfnKind, MixerKind, Phase, TaskOp
from tessera_ir.model import Attrs, Module, PlanEntry, PlanOp, SymbolRef, Value

from .builders import DecoderSpec, add_pair_schedule, build_module, layer_ops

CORE_FIELDS = {"flops", "bytes", "param_bytes", "act_bytes", "shapes", "movable"}
# Pass attributes with value rules (attributes-legal); random keys avoid them and
# ``pass_attrs`` adds them with legal values.
PASS_ATTR_KEYS = {"duration_us", "start", "stream", "deadline"}

_NAME_START = string.ascii_letters + string.digits + "_"
_NAME_REST = _NAME_START + ".-"

# Names of layers: no '.', so they never collide with task names ("<layer>.<op>.<phase>").
layer_names = st.text(alphabet=string.ascii_letters + string.digits + "_-", min_size=1, max_size=8).filter(
    lambda s: s[0] in _NAME_START
)
entity_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(_NAME_START),
    st.text(alphabet=_NAME_REST, max_size=10),
)
attr_keys = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from(string.ascii_letters + "_"),
    st.text(alphabet=string.ascii_letters + string.digits + "_.-", max_size=10),
).filter(lambda k: k not in CORE_FIELDS and k not in PASS_ATTR_KEYS)

# Floats whose shortest repr takes every form the printer writes.
awkward_floats = st.sampled_from([1e-05, 1e20, -0.5, 0.0, -0.0, 1.0, 123456789.125, 5e-324, 1.7976931348623157e308])
floats = st.one_of(awkward_floats, st.floats(allow_nan=False, allow_infinity=False))
awkward_strings = st.sampled_from(['say "hi"', "back\\slash", "tab\tnew\nline", "ünïcödé ✓ 𝔘", "", "// not a comment", "\x00"])
strings = st.one_of(awkward_strings, st.text(max_size=20))


def values(refs: list[str]) -> st.SearchStrategy[Value]:
    """Attribute values; ``refs`` are the names an @reference may point to."""
    scalars: list[st.SearchStrategy[Any]] = [
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        floats,
        strings,
    ]
    if refs:
        scalars.append(st.sampled_from(refs).map(SymbolRef))
    return st.recursive(st.one_of(*scalars), lambda inner: st.lists(inner, max_size=4), max_leaves=8)


def attr_dicts(refs: list[str], max_size: int = 3) -> st.SearchStrategy[Attrs]:
    return st.dictionaries(attr_keys, values(refs), max_size=max_size)


@st.composite
def pass_attrs(draw: st.DrawFn, stream: str) -> Attrs:
    """Some of the well-known pass attributes, each with a legal value."""
    attrs: Attrs = {}
    non_negative = st.one_of(st.integers(0, 10**6), st.floats(0, 1e9, allow_nan=False, allow_infinity=False))
    if draw(st.booleans()):
        attrs["duration_us"] = draw(non_negative)
    if draw(st.booleans()):
        attrs["start"] = draw(non_negative)
    if draw(st.booleans()):
        attrs["deadline"] = draw(non_negative)
    if draw(st.booleans()):
        attrs["stream"] = stream
    return attrs


@st.composite
def decoder_specs(draw: st.DrawFn) -> DecoderSpec:
    return DecoderSpec(
        mixer=draw(st.sampled_from(list(MixerKind))),
        ffn=draw(st.sampled_from(list(FfnKind))),
        shared_expert=draw(st.booleans()),
    )


@st.composite
def valid_modules(draw: st.DrawFn, max_decoders: int = 4) -> Module:
    decoders = draw(st.lists(decoder_specs(), max_size=max_decoders))
    embedding = draw(st.booleans())
    head = draw(st.booleans())
    if embedding and not head and not any(layer_ops(s.mixer, s.ffn, s.shared_expert) for s in decoders):
        head = True  # the embedding's wgrad needs some dgrad task to wait for
    names = draw(st.lists(layer_names, min_size=len(decoders), max_size=len(decoders), unique=True))
    for spec, name in zip(decoders, names):
        # "embed" and "head" are the builder's names for the other two layers.
        spec.name = f"d{name}" if name in ("embed", "head") else name

    # Extra attributes may refer to any entity; refs are drawn from names that will exist.
    layer_refs = (["embed"] if embedding else []) + [s.name or "" for s in decoders] + (["head"] if head else [])

    # Core sizes come from one seeded generator: they are plain ints, and drawing
    # each through hypothesis would make generation several times slower. The
    # value types under test (extra attributes) are drawn for a few tasks.
    rng = draw(st.randoms(use_true_random=False))
    attributed_tasks = draw(st.integers(0, 4))

    def fields(task_name: str, op: TaskOp, phase: Phase) -> tuple[dict[str, Any], Attrs]:
        nonlocal attributed_tasks
        comm = op in (TaskOp.DISPATCH, TaskOp.COMBINE)
        core = {
            "flops": 0 if comm else rng.randrange(2**50),
            "bytes": rng.randrange(2**40),
            "param_bytes": rng.randrange(2**34),
            "act_bytes": rng.randrange(2**34),
            "shapes": [[rng.randint(1, 2**20) for _ in range(rng.randint(0, 4))] for _ in range(rng.randint(0, 3))],
        }
        extra: Attrs = {}
        if attributed_tasks and rng.random() < 0.3:
            attributed_tasks -= 1
            extra = draw(attr_dicts(layer_refs, max_size=2))
            extra.update(draw(pass_attrs("comm" if comm else "compute")))
        return core, extra

    for spec in decoders:
        spec.attrs = draw(attr_dicts(layer_refs, max_size=2))
    module_name = draw(entity_names)
    module = build_module(
        module_name,
        decoders,
        embedding=embedding,
        head=head,
        fields=fields,
        module_attrs=draw(attr_dicts(layer_refs)),
    )
    task_names = [t.name for t in module.tasks()]
    all_refs = layer_refs + task_names

    taken = set(all_refs)
    for i in range(draw(st.integers(0, 3))):
        op_name = draw(entity_names)
        while op_name in taken:
            op_name = f"{op_name}.plan{i}"
        taken.add(op_name)
        entry_refs = draw(st.lists(st.sampled_from(all_refs), unique=True, max_size=5)) if all_refs else []
        entries = [
            PlanEntry(ref, {**draw(attr_dicts(all_refs, max_size=2)), **draw(pass_attrs("compute"))})
            for ref in entry_refs
        ]
        # Kinds tessera_ir/plan_ops.py declares nothing for: their attributes and entries are free.
        kind = draw(st.sampled_from(["candidates", "partitions", "dbo_slots", "task", "layer"]))
        module.plan.append(PlanOp(kind, op_name, draw(attr_dicts(all_refs)), entries))
    add_pair = draw(st.booleans())
    if module.layers and add_pair:
        # A pair and a valid schedule of it (the verifier checks schedules).
        fwd = draw(st.lists(st.sampled_from(module.layers), unique_by=lambda layer: layer.name, max_size=2))
        bwd = draw(st.lists(st.sampled_from(module.layers), unique_by=lambda layer: layer.name, max_size=2))
        name = "sched"
        while name in taken or f"{name}.pair" in taken:
            name += "_"
        if fwd or bwd:
            add_pair_schedule(module, name, fwd, bwd)
    return module
