"""A seeded mutator of IR text, for fuzzing the front end as an outsider would.

``mutants(texts, count, seed)`` yields ``count`` texts, each one to three edits away
from one of ``texts``: character flips, inserted and deleted spans, unicode and
control characters, line edits, numbers set to edge values, names swapped for other
names (dangling references, cycles), truncation, deep nesting, long blank runs, and
schedule entries moved, stretched or stripped of a field. The same seed gives the
same texts.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence

PIECES = [
    "{", "}", "[", "]", "(", ")", "@", "=", ",", ".", '"', "\\", "//", "/", "-", "e", ":", "#", " ", "\n", "\t", "\r",
    "\x00", "\x0b", "\x7f", "\ufeff", "é", "✓", "𝔘", "\u2028", "\ud800",
    "task", "layer", "plan", "module", "after", "on", "true", "false", "null", "NaN", "Infinity", "mixer", "ffn",
    "pair_schedule", "pair", "fwd", "bwd", "start", "duration", "stream", "deadline", "duration_us", "pairs",
    "compute", "comm", "attention.fwd", "wgrad", "@l0", "@nowhere", '"compute"', '"comm"', "[]", "{}", "= 1,",
]
NUMBERS = [
    "0", "-0", "-1", "1", "0.0", "-0.0", "-1.5", "1e308", "1.7976931348623157e308", "1e309", "-1e309", "1e-400",
    "5e-324", "007", "1.", ".5", "1e", "99999999999999999999999", "9" * 5000, "4.9e-324", "2.5", "1e+20",
]
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NAME = re.compile(r"@[A-Za-z0-9_][A-Za-z0-9_.\-]*")
_ENTRY_FIELD = re.compile(r"(start|duration|stream|deadline|duration_us) = ([^,}]+)")

Mutation = Callable[[random.Random, str], str]


def _spot(rng: random.Random, text: str) -> int:
    return rng.randint(0, len(text))


def flip(rng: random.Random, text: str) -> str:
    i = rng.randrange(len(text)) if text else 0
    return text[:i] + rng.choice(PIECES)[:1] + text[i + 1 :]


def insert(rng: random.Random, text: str) -> str:
    i = _spot(rng, text)
    return text[:i] + rng.choice(PIECES) + text[i:]


def delete(rng: random.Random, text: str) -> str:
    i = _spot(rng, text)
    return text[:i] + text[i + rng.randint(1, 20) :]


def truncate(rng: random.Random, text: str) -> str:
    return text[: _spot(rng, text)]


def line_edit(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
    kind = rng.choice(["delete", "duplicate", "swap", "move"])
    if kind == "delete":
        del lines[i]
    elif kind == "duplicate":
        lines.insert(j, lines[i])
    elif kind == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    else:
        lines.insert(j, lines.pop(i))
    return "\n".join(lines)


def number(rng: random.Random, text: str) -> str:
    found = list(_NUMBER.finditer(text))
    if not found:
        return insert(rng, text)
    m = rng.choice(found)
    return text[: m.start()] + rng.choice(NUMBERS) + text[m.end() :]


def rename(rng: random.Random, text: str) -> str:
    found = list(_NAME.finditer(text))
    if not found:
        return insert(rng, text)
    m = rng.choice(found)
    other = rng.choice([rng.choice(found).group(), "@nowhere", "@" + "x" * rng.choice([1, 300]), "@.bad", "@l0"])
    return text[: m.start()] + other + text[m.end() :]


def nest(rng: random.Random, text: str) -> str:
    spots = [m.end() for m in re.finditer(r"= ", text)] or [_spot(rng, text)]
    i = rng.choice(spots)
    depth = rng.choice([2, 63, 64, 65, 200, 3000])
    inner = rng.choice(["", "1", "@l0", '"x"'])
    return text[:i] + "[" * depth + inner + "]" * depth + (", " if rng.random() < 0.5 else "") + text[i:]


def blanks(rng: random.Random, text: str) -> str:
    i = rng.choice([len(text), _spot(rng, text)])
    run = rng.choice([" ", "\n", "\t", " \n", "\r\n"]) * rng.choice([5, 30, 300, 3000])
    return text[:i] + run + text[i:]


def schedule_entry(rng: random.Random, text: str) -> str:
    """Move, stretch or strip a field of a plan entry (start, duration, stream, ...)."""
    found = list(_ENTRY_FIELD.finditer(text))
    if not found:
        return number(rng, text)
    m = rng.choice(found)
    field, value = m.group(1), m.group(2)
    others = [f.group(2) for f in found if f.group(1) == field]
    kind = rng.choice(["copy", "edge", "drop", "stream"])
    if kind == "drop":
        return text[: m.start()] + text[m.end() :].removeprefix(", ")
    if kind == "stream" or field == "stream":
        replacement = rng.choice(['"compute"', '"comm"', '"gpu"', "1.0"])
    elif kind == "copy":
        replacement = rng.choice(others)
    else:
        replacement = rng.choice(["0.0", "1e308", "-1.0", "0", "1e-07", str(float(value) * 2) if _is_float(value) else "2.0"])
    return text[: m.start(2)] + replacement + text[m.end(2) :]


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


MUTATIONS: list[Mutation] = [
    flip, insert, delete, truncate, line_edit, number, rename, nest, blanks, schedule_entry, schedule_entry,
]


def mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.choice([1, 1, 2, 3])):
        text = rng.choice(MUTATIONS)(rng, text)
    return text


def mutants(texts: Sequence[str], count: int, seed: int) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(count):
        yield mutate(rng, rng.choice(texts))
