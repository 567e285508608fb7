"""Syntax and vocabulary errors: each names the line and column and says what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_ir import parse_module
from tessera_ir.errors import ParseError

BASE = (Path(__file__).parent / "golden" / "tiny.tir").read_text()

ROUTER = "task @l0.router.fwd = router.fwd on compute after(@l0.linear_attention.fwd) {flops = 524288, bytes = 131072, param_bytes = 4096, act_bytes = 8192"

# (id, text replaced in the golden file, replacement, where the error points (a unique
#  substring of the new text, the error is at its start), words the message must contain)
CASES = [
    ("task-kind-not-a-word", "task @l0.router.fwd = router.fwd", "task @l0.router.fwd = 42", "42 on compute",
     "expected a task kind such as 'attention.fwd' after '=' but found '42'"),
    ("unknown-op", "= router.fwd", "= routr.fwd", "routr.fwd",
     "unknown task operation 'routr'; use one of 'embedding', 'attention'"),
    ("unknown-phase", "= router.fwd", "= router.bwd", "router.bwd",
     "unknown task phase 'bwd' in 'router.bwd'; use one of 'fwd', 'dgrad', 'wgrad'"),
    ("kind-without-phase", "= router.fwd", "= router", "router on",
     "task kind 'router' must be written operation.phase, such as 'attention.fwd'"),
    ("unknown-resource", "router.fwd on compute", "router.fwd on gpu", "gpu after",
     "unknown resource 'gpu'; use one of 'compute', 'comm'"),
    ("missing-on", "router.fwd on compute", "router.fwd compute", "compute after(@l0.linear_attention.fwd) {flops = 524288",
     "expected 'on' after 'router.fwd' but found 'compute'"),
    ("unknown-role", "@l0 decoder 0", "@l0 encoder 0", "encoder",
     "unknown layer role 'encoder'; use one of 'embedding', 'decoder', 'head'"),
    ("unknown-mixer", "mixer = linear_attention", "mixer = gdn", "gdn",
     "unknown mixer kind 'gdn'; use one of 'attention', 'sliding_attention', 'linear_attention', 'mla', 'ssm', 'none'"),
    ("unknown-ffn", "ffn = moe", "ffn = mlp", "mlp", "unknown ffn kind 'mlp'; use one of 'moe', 'dense', 'none'"),
    ("missing-ffn", "ffn = moe", "ffn = ", "{experts", "expected an ffn kind ('moe', 'dense', 'none') after '=' but found '{'"),
    ("negative-index", "@l0 decoder 0", "@l0 decoder -1", "-1", "layer index '-1' must be a non-negative integer"),
    ("duplicate-key", "ep = 2,", "ep = 2, ep = 3,", "ep = 3", "attribute 'ep' is given twice"),
    ("duplicate-core-key", "movable = false, peers", "movable = false, flops = 1, peers", "flops = 1,", "attribute 'flops' is given twice"),
    ("core-field-out-of-order", ROUTER, ROUTER.replace("param_bytes = 4096, act_bytes = 8192", "act_bytes = 8192, param_bytes = 4096"),
     "act_bytes = 8192, param", "expected the core attribute 'param_bytes' of task '@l0.router.fwd' but found 'act_bytes'"),
    ("core-field-missing", "{flops = 16777216, bytes = 524288, param_bytes = 131072, act_bytes = 65536, shapes = [[2, 128, 256], [2, 128, 1024]], movable = false}",
     "{flops = 16777216}", "task @head.lm_head.fwd", "task '@head.lm_head.fwd' lacks the core attribute 'bytes'"),
    ("flops-not-int", "{flops = 524288, bytes = 131072, param_bytes = 4096", "{flops = 1.5, bytes = 131072, param_bytes = 4096",
     "flops = 1.5", "'flops' of task '@l0.router.fwd' must be an integer, not 1.5"),
    ("shapes-not-nested", "shapes = [[256, 8]], movable = false}\n    task @l0.dispatch.fwd", "shapes = [256, 8], movable = false}\n    task @l0.dispatch.fwd",
     "shapes = [256, 8]", "'shapes' of task '@l0.router.fwd' must be a list of lists of integers"),
    ("movable-not-bool", "shapes = [[256, 8]], movable = false}\n    task @l0.dispatch.fwd", "shapes = [[256, 8]], movable = 0}\n    task @l0.dispatch.fwd",
     "movable = 0", "'movable' of task '@l0.router.fwd' must be true or false, not 0"),
    ("missing-comma", "ep = 2, lr", "ep = 2 lr", "lr = 1e-05", "expected ',' or '}' after '2' but found 'lr'"),
    ("missing-at", "task @l0.router.fwd", "task l0.router.fwd", "l0.router.fwd =", "expected the task's name, such as '@l0' after 'task' but found 'l0.router.fwd'"),
    ("stray-character", "ep = 2,", "ep = $2,", "$2", "expected an attribute value (a number, a quoted string, true, false, an @name or a [list]) after '=' but found '$'"),
    ("bare-word-value", 'dtype = "bf16"', "dtype = bf16", "bf16,", "expected an attribute value"),
    ("unterminated-string", '"model.layers.0"', '"model.layers.0', '"model.layers.0 mixer', "unterminated or malformed string literal after 'decoder 0'"[:40]),
    ("bad-escape", '"model.layers.0"', '"model\\qlayers.0"', '"model\\q', "invalid string literal"),
    ("float-overflow", "lr = 1e-05", "lr = 1e999", "1e999", "number 1e999 is too large for a 64-bit float"),
    # An integer past the largest float: no pass could compute with it (the verifier and the
    # profile pass turn times and FLOPs into floats). Each place the line parser reads numbers.
    ("int-overflow-attr", "lr = 1e-05", "lr = 10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", "10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000",
     "integer 10000000000000000000... (401 digits) is too large: past the largest 64-bit float"),
    ("int-overflow-flops", "{flops = 524288, bytes = 131072, param_bytes = 4096", "{flops = 10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000, bytes = 131072, param_bytes = 4096",
     "10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", "past the largest 64-bit float"),
    ("int-overflow-shape", "shapes = [[256, 8]], movable = false}\n    task @l0.dispatch.fwd",
     "shapes = [[256, 10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000]], movable = false}\n    task @l0.dispatch.fwd", "10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", "past the largest 64-bit float"),
    ("int-overflow-negative", "lr = 1e-05", "lr = -10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", "-10000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000000", "past the largest 64-bit float"),
    ("path-not-string", '@l0 decoder 0 "model.layers.0"', "@l0 decoder 0 model", "model mixer",
     "expected the layer's module path as a quoted string, such as \"model.layers.0\" after '0' but found 'model'"),
    # Only what can really follow: an LALR state also lists lookaheads of merged contexts.
    ("double-brace", "@pair.s0 {fwd", "@pair.s0 {{fwd", "{fwd", "expected '}' or an attribute name after '{' but found '{'"),
    ("body-or-attrs", 'ffn = moe {experts', 'ffn = moe { = {experts', "= {experts",
     "expected 'task', '}' or an attribute name after '{' but found '='"),
    ("plan-name", "plan candidate @s0.c0", "plan candidate s0.c0", "s0.c0 {", "expected the plan op's name, such as '@p0' after 'candidate'"),
]


def _position(text: str, anchor: str) -> tuple[int, int]:
    assert text.count(anchor) == 1, f"anchor {anchor!r} must be unique in the mutated text"
    offset = text.index(anchor)
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return line, column


@pytest.mark.parametrize(("case", "old", "new", "anchor", "words"), CASES, ids=[c[0] for c in CASES])
def test_parse_error_position_and_message(case: str, old: str, new: str, anchor: str, words: str) -> None:
    assert BASE.count(old) == 1, f"{case}: {old!r} must occur once in the golden file"
    text = BASE.replace(old, new)
    with pytest.raises(ParseError) as info:
        parse_module(text, source="bad.tir")
    err = info.value
    assert words in err.message
    assert (err.line, err.column) == _position(text, anchor)
    assert str(err).startswith(f"bad.tir:{err.line}:{err.column}: ")


def test_integers_up_to_the_largest_float_still_parse() -> None:
    import sys

    from tessera_ir.line_parser import parse_lines

    largest = int(sys.float_info.max)
    for value in (largest, -largest):
        text = BASE.replace("lr = 1e-05", f"lr = {value}")
        assert parse_module(text).attrs["lr"] == value
    past = BASE.replace("lr = 1e-05", f"lr = {largest + 1}")
    assert parse_lines(past) is None  # the fast path leaves it to the grammar parser, which says where
    with pytest.raises(ParseError, match="past the largest 64-bit float"):
        parse_module(past)


def test_truncated_text_reports_end_of_text() -> None:
    text = BASE[: BASE.index("plan partition")]
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert "but found the end of the text" in info.value.message
    assert info.value.line == text.count("\n") + 1


def test_comments_shift_positions_like_any_line() -> None:
    text = "// header comment\n// another\n" + BASE.replace("= router.fwd", "= routr.fwd")
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert (info.value.line, info.value.column) == _position(text, "routr.fwd")


def test_previous_token_skips_comments() -> None:
    text = BASE.replace("ffn = moe {experts", "ffn = // the feed-forward kind\n  {experts")
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert "after '='" in info.value.message


def test_empty_text() -> None:
    with pytest.raises(ParseError) as info:
        parse_module("")
    assert info.value.message == "expected 'module' but found the end of the text"
    assert (info.value.line, info.value.column) == (1, 1)


def test_huge_integer_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="too many digits"):
        parse_module("module @m {n = " + "9" * 5000 + "} {\n}\n")


def test_text_after_module_is_an_error() -> None:
    with pytest.raises(ParseError) as info:
        parse_module(BASE + "module @again {\n}\n")
    assert "expected the end of the text" in info.value.message
    assert info.value.line == BASE.count("\n") + 1


def test_huge_layer_index_is_a_parse_error() -> None:
    text = BASE.replace("@l0 decoder 0", "@l0 decoder " + "7" * 5000)
    with pytest.raises(ParseError, match="must be a non-negative integer"):
        parse_module(text)


def test_end_of_text_after_a_plan_op_lists_only_real_continuations() -> None:
    text = BASE[: BASE.index("  plan partition")]
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert info.value.message == "expected 'plan' or '}' after '}' but found the end of the text"


def test_line_breaks_between_a_name_and_its_equals_sign_keep_positions_right() -> None:
    text = BASE.replace("ep = 2,", "ep // the expert-parallel size\n  = 2,").replace("= router.fwd", "= routr.fwd")
    with pytest.raises(ParseError) as info:
        parse_module(text)
    assert (info.value.line, info.value.column) == _position(text, "routr.fwd")
    assert parse_module(text.replace("routr", "router")).attrs["ep"] == 2


def test_an_integer_past_the_largest_float_in_a_schedule_entry() -> None:
    """Entries as the printer writes them are read by their own path: it declines the integer
    and the grammar parser names its line and column (the verifier used to overflow on it)."""
    from tessera_ir.line_parser import parse_lines

    plan = (Path(__file__).parents[1] / "passes" / "golden" / "overlap_schedule.tir").read_text()
    big = "1" + "0" * 400
    entry = "@l0.dispatch.fwd {duration = 20.0, order = 1, start = 32.0"
    for new in (entry.replace("32.0", big), entry.replace("20.0", big)):
        old = entry
        assert plan.count(old) == 1
        text = plan.replace(old, new)
        assert parse_lines(text) is None
        with pytest.raises(ParseError, match="past the largest 64-bit float") as info:
            parse_module(text)
        assert (info.value.line, info.value.column) == _position(text, big)
