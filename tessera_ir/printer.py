"""Canonical text form of the Tessera IR.

The printer defines the format; ``grammar.lark`` parses exactly what it prints.
Every module prints to one canonical text, and parsing that text and printing
again gives the identical bytes. Example::

    module @tiny {dtype = "bf16", ep = 2, seq_len = 128} {
      layer @embed embedding "model.embed_tokens" mixer = none ffn = none {
        task @embed.embedding.fwd = embedding.fwd on compute {flops = 0, bytes = 65536, ...}
      }
      layer @l0 decoder 0 "model.layers.0" mixer = linear_attention ffn = moe {
        task @l0.linear_attention.fwd = linear_attention.fwd on compute after(@embed.embedding.fwd) {...}
        ...
      }
      plan candidate @s0.c0 {first = 0, last = 3, stage = 0}
      plan pair_schedule @p0 {makespan = 12.5} {
        @l0.linear_attention.fwd {start = 0.0, stream = "compute"}
      }
    }

Core task fields print in a fixed order; extra attributes print sorted by key.
Names (after ``@``) use letters, digits, ``_``, ``.`` and ``-``; attribute keys and
plan op kinds start with a letter or ``_``. Anything else raises PrintError rather
than printing text that would not read back.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from io import StringIO

from tessera_ir.errors import IRError
from tessera_ir.model import CORE_TASK_FIELDS, MAX_VALUE_DEPTH, Attrs, Layer, Module, PlanOp, SymbolRef, Task, Value

INDENT = "  "


class PrintError(IRError, ValueError):
    """A value the text format cannot spell (NaN, infinity, an unknown type, a name with spaces, too deep a list)."""


# What the grammar's SYMBOL (after the '@') and WORD terminals accept.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_WORD_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
_CORE_TASK_FIELDS = frozenset(CORE_TASK_FIELDS)


# A planned module names the same tasks and keys hundreds of thousands of times (every pair
# schedule entry); each distinct spelling is checked once. Failures raise and are not cached.
@lru_cache(maxsize=1 << 16)
def _checked_name(name: str) -> str:
    if not _NAME_RE.fullmatch(name):
        raise _bad_name(name)
    return "@" + name


def _bad_name(name: object) -> PrintError:
    return PrintError(
        f"name {name!r} cannot be printed: names use only letters, digits, '_', '.' and '-' "
        "and do not start with '.' or '-'"
    )


def format_name(name: str) -> str:
    """``@name``; names are letters, digits, '_', '.' and '-' so that they read back as one token."""
    if not isinstance(name, str):
        raise _bad_name(name)
    return _checked_name(name)


def _word(text: str, what: str) -> str:
    if not isinstance(text, str) or not _WORD_RE.fullmatch(text):
        raise PrintError(
            f"{what} {text!r} cannot be printed: it must start with a letter or '_' and use only "
            "letters, digits, '_', '.' and '-'"
        )
    return text


def format_value(value: Value) -> str:
    return _format_value(value, 0)


def _format_value(value: Value, depth: int) -> str:
    # bool before int: bool is a subclass of int.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise PrintError(f"attribute value {value!r} is not finite; the IR only holds finite floats")
        text = repr(value)
        # repr gives '1.0', '1e-05', '1e+20': all contain '.' or 'e', so they re-parse as floats.
        return text
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, SymbolRef):
        return format_name(value.name)
    if isinstance(value, list):
        if depth >= MAX_VALUE_DEPTH:
            raise PrintError(
                f"attribute value nests lists more than {MAX_VALUE_DEPTH} deep, the IR's limit; flatten it"
            )
        return "[" + ", ".join(_format_value(v, depth + 1) for v in value) + "]"
    raise PrintError(f"attribute value of type {type(value).__name__} cannot be printed: {spell_value(value)}")


def spell_value(value: object, width: int = 40) -> str:
    """A short spelling of any value for a message; never raises, however deep or odd the value."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    try:
        text = format_value(value)  # type: ignore[arg-type]
    except PrintError:
        text = "[...]" if isinstance(value, list) else f"<{type(value).__name__}>"
    except Exception:  # noqa: BLE001 - a message must not fail on whatever a caller put in an attribute
        text = f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


@lru_cache(maxsize=1 << 12)
def _attr_key(key: str) -> str:
    return _word(key, "attribute name") + " = "


@lru_cache(maxsize=1 << 12)
def _quoted(text: str) -> str:
    return json.dumps(text)


def format_attrs(attrs: Attrs) -> str:
    # The common scalars by exact type first (a bool is not an int here, and a subclass of int or
    # str takes the general path); anything else, and every error, goes through _format_value.
    parts = []
    for key in sorted(attrs):
        value = attrs[key]
        kind = type(value)
        if kind is float and math.isfinite(value):  # type: ignore[arg-type]
            text = repr(value)
        elif kind is int:
            text = str(value)
        elif kind is str:
            text = _quoted(value)  # type: ignore[arg-type]
        else:
            text = _format_value(value, 0)
        parts.append(_attr_key(key) + text)
    return "{" + ", ".join(parts) + "}"


def format_task(task: Task) -> str:
    deps = ""
    if task.deps:
        deps = " after(" + ", ".join(format_name(d) for d in task.deps) + ")"
    core: list[tuple[str, Value]] = [
        ("flops", task.flops),
        ("bytes", task.bytes),
        ("param_bytes", task.param_bytes),
        ("act_bytes", task.act_bytes),
        ("shapes", [list(s) for s in task.shapes]),  # type: ignore[misc]
        ("movable", task.movable),
    ]
    fields = [f"{k} = {format_value(v)}" for k, v in core]
    for k in sorted(task.attrs):
        if k in _CORE_TASK_FIELDS:
            raise PrintError(f"task '{task.name}' has '{k}' in attrs; it is a core field, set Task.{k} instead")
        fields.append(f"{_word(k, 'attribute name')} = {format_value(task.attrs[k])}")
    return (
        f"task {format_name(task.name)} = {task.kind} on {task.resource.value}{deps} "
        + "{" + ", ".join(fields) + "}"
    )


def _layer_header(layer: Layer) -> str:
    index = f" {layer.index}" if layer.index is not None else ""
    attrs = f" {format_attrs(layer.attrs)}" if layer.attrs else ""
    return (
        f"layer {format_name(layer.name)} {layer.role.value}{index} {json.dumps(layer.path)} "
        f"mixer = {layer.mixer.value} ffn = {layer.ffn.value}{attrs} {{"
    )


def _print_plan_op(op: PlanOp, out: StringIO) -> None:
    out.write(f"{INDENT}plan {_word(op.op, 'plan op kind')} {format_name(op.name)} {format_attrs(op.attrs)}")
    if op.entries:
        out.write(" {\n")
        indent = INDENT * 2
        out.write("".join([f"{indent}{format_name(entry.ref)} {format_attrs(entry.attrs)}\n" for entry in op.entries]))
        out.write(f"{INDENT}}}")
    out.write("\n")


def print_module(module: Module) -> str:
    out = StringIO()
    attrs = f" {format_attrs(module.attrs)}" if module.attrs else ""
    out.write(f"module {format_name(module.name)}{attrs} {{\n")
    for layer in module.layers:
        out.write(f"{INDENT}{_layer_header(layer)}\n")
        for task in layer.tasks:
            out.write(f"{INDENT * 2}{format_task(task)}\n")
        out.write(f"{INDENT}}}\n")
    for op in module.plan:
        _print_plan_op(op, out)
    out.write("}\n")
    return out.getvalue()
