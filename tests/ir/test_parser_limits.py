"""Inputs that used to hang or crash the front end: long blank runs, deep nesting; and the
two parsers (line layout fast path, grammar) agreeing on every file they both read."""

from __future__ import annotations

import gc
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tessera_ir import Module, parse_module, print_module
from tessera_ir.errors import ParseError
from tessera_ir.line_parser import parse_lines
from tessera_ir.model import MAX_VALUE_DEPTH, value_depth
from tessera_ir.parser import parse_with_grammar
from tessera_ir.printer import PrintError, format_value
from tessera_ir.verifier import collect_errors

from .builders import qwen3_next_like

TESTS = Path(__file__).resolve().parents[1]
# Files the printer wrote (goldens, invalid cases); FileCheck inputs are hand-written, with
# comments and several modules per file, which the grammar parser reads.
IR_FILES = sorted(p for p in TESTS.glob("**/*.tir") if "filecheck" not in p.parts)
EMPTY = "module @m {\n}\n"


@contextmanager
def deadline(seconds: float) -> Iterator[None]:
    """Fail the test if the block runs longer than ``seconds`` (a hang, not a slow machine:
    every use allows a hundred times what the block needs)."""
    if not hasattr(signal, "setitimer"):
        yield
        return

    def expire(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# --- blank runs: the lexer's skipping is linear ---------------------------------------------------

# Each of these took longer than 20 s with 30 blanks before the lexer was fixed; here the
# runs are 100,000 characters long.
BLANK_RUNS = {
    "trailing newlines": EMPTY + "\n" * 100_000,
    "trailing spaces": EMPTY + " " * 100_000,
    "blanks before a stray character": EMPTY + " \n" * 50_000 + "x",
    "blanks inside attributes": "module @m {a = 1," + " " * 100_000 + "} {\n}\n",
    "blanks between a key and '='": "module @m {a" + " \t" * 50_000 + "} {\n}\n",
    "comments full of slashes": EMPTY + "/" * 100_001 + " x\n" + "// // //\n" * 20_000 + "@",
}


@pytest.mark.parametrize("text", BLANK_RUNS.values(), ids=BLANK_RUNS.keys())
def test_long_blank_runs_end_quickly(text: str) -> None:
    with deadline(10.0):
        for parse in (parse_module, parse_with_grammar):
            try:
                parse(text)
            except ParseError as err:
                assert err.line is not None and err.column is not None


def test_trailing_blank_lines_are_accepted() -> None:
    with deadline(10.0):
        assert parse_module(EMPTY + "\n" * 100_000) == parse_module(EMPTY)
        assert parse_with_grammar(EMPTY + "  \n\t\r\n" * 30_000).name == "m"


# --- depth ----------------------------------------------------------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_the_deepest_legal_value_round_trips() -> None:
    text = f"module @m {{a = {nested(MAX_VALUE_DEPTH)}}} {{\n}}\n"
    module = parse_module(text)
    assert print_module(module) == text
    assert value_depth(module.attrs["a"]) == MAX_VALUE_DEPTH
    assert collect_errors(module) == []


@pytest.mark.parametrize("depth", [MAX_VALUE_DEPTH + 1, 1_000, 200_000])
def test_too_deep_a_value_is_a_located_parse_error(depth: int) -> None:
    text = f'module @m {{\n  layer @l0 decoder 0 "x" mixer = none ffn = none {{a = {nested(depth)}}} {{\n  }}\n}}\n'
    column = text.splitlines()[1].index("[") + 1 + MAX_VALUE_DEPTH
    for parse in (parse_module, parse_with_grammar):
        with pytest.raises(ParseError, match=f"more than {MAX_VALUE_DEPTH} deep") as info:
            parse(text)
        assert (info.value.line, info.value.column) == (2, column)


def deep_list(depth: int) -> list:
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


def test_printer_and_verifier_refuse_too_deep_a_value_built_in_python() -> None:
    module = parse_module(EMPTY)
    module.attrs["deep"] = deep_list(5_000)
    with pytest.raises(PrintError, match="more than 64 deep"):
        print_module(module)
    errors = collect_errors(module)
    assert [e.check for e in errors] == ["attributes-legal"]
    assert "more than 64 deep" in errors[0].message


def test_a_list_that_contains_itself_is_refused_not_recursed() -> None:
    loop: list = [1]
    loop.append(loop)
    assert value_depth(loop) == MAX_VALUE_DEPTH + 1
    with pytest.raises(PrintError):
        format_value(loop)
    module = parse_module(EMPTY)
    module.attrs["loop"] = loop
    assert [e.check for e in collect_errors(module)] == ["attributes-legal"]


# --- the two parsers agree ------------------------------------------------------------------------


@pytest.mark.parametrize("path", IR_FILES, ids=lambda p: str(p.relative_to(TESTS)))
def test_the_line_parser_reads_every_printed_file_as_the_grammar_does(path: Path) -> None:
    text = path.read_text()
    fast = parse_lines(text)
    assert fast is not None, "a file the printer wrote must take the fast path"
    assert_same(fast, parse_with_grammar(text))


def assert_same(fast: Module, slow: Module) -> None:
    assert fast == slow
    assert fast.locations == slow.locations
    assert print_module(fast) == print_module(slow)


def test_the_line_parser_declines_other_layouts_and_the_grammar_reads_them() -> None:
    text = (TESTS / "ir" / "golden" / "tiny.tir").read_text()
    for other in (
        text.replace(", ", " ,\n\t"),  # attributes over several lines
        text.replace("{\n", "{ // a comment after code\n"),
        text.replace("module @tiny", "module @tiny\n"),
    ):
        assert parse_lines(other) is None
        assert parse_module(other) == parse_module(text)


def test_a_large_module_takes_the_fast_path() -> None:
    text = print_module(qwen3_next_like(40))
    fast = parse_lines(text)
    assert fast is not None
    assert_same(fast, parse_with_grammar(text))


def test_parsing_leaves_the_garbage_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("the parser must not switch the garbage collector")

    monkeypatch.setattr(gc, "disable", refuse)
    monkeypatch.setattr(gc, "enable", refuse)
    monkeypatch.setattr(gc, "freeze", refuse)
    monkeypatch.setattr(gc, "set_threshold", refuse)
    text = print_module(qwen3_next_like(4))
    assert parse_module(text) == parse_with_grammar(text)


TASK = (
    "    task @l0.router.fwd = router.fwd on compute after(@a, @b) "
    "{flops = 1, bytes = 2, param_bytes = 3, act_bytes = 4, shapes = [[1, 2], [3]], movable = false, x = 1.5}"
)
ENTRY = '    @l0.router.fwd {duration = 1.5, order = 0, start = 0.0, stream = "compute"}'
EDITS = [
    # (text to find, replacement): each variant parses or fails alike on both paths
    ("x = 1.5}", "x = 1.5,}"), ("movable = false, x = 1.5}", "movable = false,}"), ("x = 1.5}", "flops = 2}"),
    ("flops = 1", "flops = 007"), ("flops = 1", "flops = -0"), ("flops = 1", "flops = 1.0"),
    ("flops = 1", "flops = " + "9" * 5000), ("[[1, 2], [3]]", "[[1, 2], [3],]"), ("[[1, 2], [3]]", "[[1, 02]]"),
    ("[[1, 2], [3]]", "[[1, 2]], [[3]]"), ("[[1, 2], [3]]", "[]"), ("[[1, 2], [3]]", "[[-1]]"),
    ("movable = false", "movable = true"), ("movable = false", "movable = falsey"), ("x = 1.5", "x = [@a, \"s\"]"),
    ("start = 0.0", "start = 0"), ("start = 0.0", "start = 1e999"), ("start = 0.0", "start = 1e-999"),
    ("start = 0.0", "start = 007"), ("order = 0", "order = 0.5"), ("order = 0, ", ""), ('"compute"', '"comm"'),
    ('"compute"', '"gpu"'), ('"compute"', '"compute\\u0021"'), ("duration = 1.5", "duration = -1.5"),
    ("duration = 1.5", "duration = 1.5e+308"), ("start = 0.0", "start = 0.0, start = 1.0"),
    ("start = 0.0", "start = " + "9" * 400), ("start = 0.0", "start = " + "9" * 400 + ".0"),
    ("order = 0", "order = " + "9" * 5000), ("x = 1.5", "x = @a"), ("x = 1.5", "x = [[@a], {}]"),
]


@pytest.mark.parametrize("old, new", EDITS)
def test_edge_spellings_read_alike_on_both_paths(old: str, new: str) -> None:
    module = (
        "module @m {\n  layer @l0 decoder 0 \"p\" mixer = none ffn = moe {\n" + TASK + "\n  }\n"
        "  plan pair_schedule @s {} {\n" + ENTRY + "\n  }\n}\n"
    )
    assert old in module
    text = module.replace(old, new, 1)
    fast = parse_lines(text)
    try:
        slow = parse_with_grammar(text)
    except ParseError:
        assert fast is None, "the fast path accepted text the grammar refuses"
        return
    if fast is not None:  # declining is always allowed: the grammar then reads it
        assert_same(fast, slow)
