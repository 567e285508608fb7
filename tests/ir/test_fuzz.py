"""Fuzzing the front end: thousands of mutated IR files, and only the IR's own errors come out.

For every mutant of the golden and invalid files (see ``mutations.py``):

- parsing either gives a module or raises ParseError with a position inside the text;
- the fast line parser and the grammar parser agree (the fast one may only decline);
- the verifier returns VerifyErrors, nothing else;
- a module that parsed prints, and the printed text parses back to the same module
  and prints to the same bytes;
- nothing runs longer than a per-input alarm.

``TESSERA_FUZZ_INPUTS`` (default 2000) and ``TESSERA_FUZZ_SEED`` change the run.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from tessera_ir import parse_module, print_module
from tessera_ir.errors import ParseError, VerifyError
from tessera_ir.line_parser import parse_lines
from tessera_ir.parser import parse_with_grammar
from tessera_ir.verifier import collect_errors

from .mutations import mutants
from .test_parser_limits import assert_same, deadline

TESTS = Path(__file__).resolve().parents[1]
# Small files, so that thousands of mutants take seconds: the golden modules, a planned
# module with a pair schedule, and the verifier's invalid cases.
SEEDS = [
    TESTS / "ir" / "golden" / "tiny.tir",
    TESTS / "passes" / "golden" / "overlap_schedule.tir",
    *sorted((TESTS / "ir" / "invalid").glob("*.tir")),
]
INPUTS = int(os.environ.get("TESSERA_FUZZ_INPUTS", "2000"))
SEED = int(os.environ.get("TESSERA_FUZZ_SEED", "10"))
ALARM_S = 5.0  # per input; each takes milliseconds


def check_one(text: str) -> str:
    """Run one input through parse, verify, print and parse again; returns what happened."""
    fast = parse_lines(text)
    try:
        module = parse_with_grammar(text, source="fuzz.tir")
    except ParseError as err:
        assert fast is None, "the fast path accepted text the grammar refuses"
        assert err.message and err.source == "fuzz.tir"
        if err.line is not None:
            assert 1 <= err.line <= text.count("\n") + 1
            assert err.column is not None and err.column >= 1
        return "parse error"
    if fast is not None:
        assert_same(fast, module)
    errors = collect_errors(module)
    assert all(isinstance(e, VerifyError) for e in errors)
    printed = print_module(module)
    again = parse_module(printed)
    assert again == module
    assert print_module(again) == printed
    return "verify error" if errors else "valid"


def test_mutants_raise_only_ir_errors_and_round_trip() -> None:
    texts = [path.read_text() for path in SEEDS]
    outcomes: dict[str, int] = {}
    slowest = 0.0
    for k, text in enumerate(mutants(texts, INPUTS, SEED)):
        start = time.perf_counter()
        try:
            with deadline(ALARM_S):
                outcome = check_one(text)
        except BaseException as err:
            raise AssertionError(f"mutant {k} (seed {SEED}) failed: {type(err).__name__}: {err}\n{text[:2000]!r}") from err
        elapsed = time.perf_counter() - start
        # The alarm cannot interrupt a regular expression running in C; this catches it late.
        assert elapsed < ALARM_S, f"mutant {k} (seed {SEED}) took {elapsed:.1f} s\n{text[:2000]!r}"
        slowest = max(slowest, elapsed)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    # The mutants exercise all three outcomes, or the mutator has gone blind.
    assert set(outcomes) == {"parse error", "verify error", "valid"}, outcomes
