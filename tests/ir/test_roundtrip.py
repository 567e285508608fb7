"""Print/parse round trips: the text is the truth, so print -> parse -> print changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tessera_ir import Module, parse_module, print_module
from tessera_ir.errors import ParseError
from tessera_ir.printer import PrintError
from tessera_ir.verifier import collect_errors

from .builders import qwen3_next_like
from .strategies import valid_modules

HERE = Path(__file__).parent
GOLDEN = HERE / "golden" / "tiny.tir"

_settings = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(valid_modules())
def test_print_parse_round_trip(module: Module) -> None:
    text = print_module(module)
    parsed = parse_module(text)
    # print -> parse -> print gives the identical bytes ...
    assert print_module(parsed) == text
    # ... and parse(print(m)) is m itself.
    assert parsed == module
    # == treats 1 and 1.0 (and True and 1) alike; the printed form does not.
    assert _typed(parsed) == _typed(module)


def _typed(module: Module) -> list[object]:
    """Every attribute value with its exact type, in order."""
    out: list[object] = []

    def walk(value: object) -> None:
        out.append(type(value).__name__)
        if isinstance(value, list):
            for v in value:
                walk(v)
        else:
            out.append(value)

    owners = [module.attrs]
    for layer in module.layers:
        owners.append(layer.attrs)
        for task in layer.tasks:
            owners.append(task.attrs)
            for core in (task.flops, task.bytes, task.param_bytes, task.act_bytes, task.shapes, task.movable):
                walk(core)
    for op in module.plan:
        owners.append(op.attrs)
        owners.extend(entry.attrs for entry in op.entries)
    for attrs in owners:
        for key in sorted(attrs):
            out.append(key)
            walk(attrs[key])
    return out


@_settings
@given(valid_modules())
def test_generated_modules_verify_clean(module: Module) -> None:
    assert collect_errors(module) == []


def test_int_and_float_spellings_survive() -> None:
    text = GOLDEN.read_text()
    module = parse_module(text)
    header = module.attrs
    assert header["ep"] == 2 and type(header["ep"]) is int
    assert type(header["lr"]) is float and header["lr"] == 1e-05
    assert type(header["scale"]) is float and header["scale"] == 1.0
    assert header["big"] == 1e20 and print_module(module).count("big = 1e+20") == 1


def test_golden_file_round_trips_byte_identically() -> None:
    text = GOLDEN.read_text()
    module = parse_module(text, source=str(GOLDEN))
    assert print_module(module) == text
    assert collect_errors(module) == []
    assert module.source == str(GOLDEN)


def test_golden_file_locations() -> None:
    text = GOLDEN.read_text()
    module = parse_module(text)
    lines = text.splitlines()
    assert module.locations["module"] == (1, 1)
    for key, (line, column) in module.locations.items():
        if key == "module":
            continue
        kind, _, name = key.partition(":")
        if kind == "entry":
            # An entry's position is the start of the @reference it begins with.
            op_name, _, ref = name.partition(":")
            assert lines[line - 1][column - 1 :].startswith(f"@{ref} "), key
            assert any(e.ref == ref for op in module.plan if op.name == op_name for e in op.entries), key
            continue
        # Each entity's position is the start of its keyword, and its name follows.
        assert lines[line - 1][column - 1 :].startswith(f"{kind} "), key
        assert f"@{name} " in lines[line - 1], key
    assert len([k for k in module.locations if k.startswith("task:")]) == sum(1 for _ in module.tasks())


def test_comments_and_free_whitespace_are_accepted_and_dropped() -> None:
    text = GOLDEN.read_text()
    noisy = "// leading comment\n" + text.replace("{\n", "{   // trailing comment\n\n").replace(", ", " ,\n\t")
    module = parse_module(noisy)
    assert print_module(module) == text


def test_keywords_are_legal_attribute_names() -> None:
    text = (
        'module @m {layer = 1, mixer = "x", on = true, plan = 2, task = 3, true = false} {\n'
        '  layer @l0 decoder 0 "p" mixer = none ffn = none {after = 1, task = [@l0]} {\n'
        "  }\n"
        "  plan task @p {module = 1} {\n"
        "    @l0 {layer = 2}\n"
        "  }\n"
        "}\n"
    )
    module = parse_module(text)
    assert module.attrs["task"] == 3 and module.attrs["true"] is False
    assert module.layers[0].attrs["after"] == 1
    assert module.plan[0].op == "task"
    assert print_module(module) == text


def test_empty_bodies_and_empty_attrs_are_told_apart() -> None:
    text = 'module @m {\n  layer @l0 decoder 0 "p" mixer = none ffn = none {\n  }\n  plan partition @p {}\n}\n'
    module = parse_module(text)
    assert module.attrs == {} and module.layers[0].tasks == [] and module.plan[0].entries == []
    assert print_module(module) == text
    explicit = parse_module('module @m {} {\n  layer @l0 decoder 0 "p" mixer = none ffn = none {} {}\n}\n')
    assert explicit.layers[0].attrs == {} and explicit.layers[0].tasks == []


def test_large_module_round_trips() -> None:
    module = qwen3_next_like(24)
    text = print_module(module)
    parsed = parse_module(text)
    assert parsed == module
    assert print_module(parsed) == text
    assert collect_errors(parsed) == []


# --- mutated text: the parser never raises anything but ParseError ----------------

_SIGNIFICANT = list('{}[]()@=,."\\/-e.0 \n') + ["task", "layer", "plan", "after", "on", "true", "//", "1e999", "9" * 5000]


@st.composite
def mutated_texts(draw: st.DrawFn) -> str:
    text = print_module(draw(valid_modules(max_decoders=1)))
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["delete", "insert", "replace", "truncate", "swap"]))
        i = draw(st.integers(0, len(text)))
        j = draw(st.integers(i, min(len(text), i + 12)))
        piece = draw(st.one_of(st.sampled_from(_SIGNIFICANT), st.text(max_size=3)))
        if kind == "delete":
            text = text[:i] + text[j:]
        elif kind == "insert":
            text = text[:i] + piece + text[i:]
        elif kind == "replace":
            text = text[:i] + piece + text[j:]
        elif kind == "truncate":
            text = text[:i]
        else:
            text = text[:i] + text[j:] + text[i:j]
    return text


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_texts())
def test_mutated_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        module = parse_module(text)
    except ParseError as err:
        assert err.message
        if err.line is not None:
            assert 1 <= err.line <= text.count("\n") + 1
            assert err.column is not None and err.column >= 1
        return
    # Whatever parses prints, and prints to a fixed point.
    again = print_module(module)
    assert print_module(parse_module(again)) == again


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=40))
def test_arbitrary_text_parses_or_raises_parse_error(text: str) -> None:
    try:
        parse_module(text)
    except ParseError:
        pass


def test_printer_refuses_what_the_parser_could_not_read_back() -> None:
    module = qwen3_next_like(1)
    with pytest.raises(PrintError, match="name 'has space'"):
        print_module(Module(name="has space"))
    module.layers[1].tasks[0].deps.append("bad/name")
    with pytest.raises(PrintError, match="bad/name"):
        print_module(module)
    module = qwen3_next_like(1)
    module.layers[1].tasks[0].attrs["flops"] = 3
    with pytest.raises(PrintError, match="core field"):
        print_module(module)
    module.layers[1].tasks[0].attrs = {"9lives": 1}
    with pytest.raises(PrintError, match="attribute name '9lives'"):
        print_module(module)
    module.layers[1].tasks[0].attrs = {"x": float("inf")}
    with pytest.raises(PrintError, match="not finite"):
        print_module(module)


def test_plan_entries_print_every_value_type_and_refuse_the_same_bad_input_every_time() -> None:
    from tessera_ir.model import Attrs, PlanEntry, PlanOp, SymbolRef

    module = qwen3_next_like(1)
    values: Attrs = {"b": True, "f": 0.1, "i": -3, "l": [1, [2.5, "x"]], "n": 1e-300, "r": SymbolRef("l0"), "s": "gap\"fit"}
    module.plan.append(PlanOp("pair_schedule", "sched.0", {}, [PlanEntry("l0.task", values)]))
    text = print_module(module)
    assert '@l0.task {b = true, f = 0.1, i = -3, l = [1, [2.5, "x"]], n = 1e-300, r = @l0, s = "gap\\"fit"}' in text
    assert print_module(parse_module(text)) == text
    for _ in range(2):  # names and keys are checked once each when good, but a bad one is never remembered as good
        module.plan[-1].entries[0] = PlanEntry("bad ref", {})
        with pytest.raises(PrintError, match="name 'bad ref'"):
            print_module(module)
        module.plan[-1].entries[0] = PlanEntry("l0.task", {"9lives": 1})
        with pytest.raises(PrintError, match="attribute name '9lives'"):
            print_module(module)
        module.plan[-1].entries[0] = PlanEntry("l0.task", {"x": float("nan")})
        with pytest.raises(PrintError, match="not finite"):
            print_module(module)
