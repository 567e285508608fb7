"""Loader fuzzing: mutated plans are refused cleanly, with the same reason by both loaders, or run to DONE.

The plans are generated ones (``program_gen``: every opcode, odd shapes) and one the compiler
wrote (``compiled_plans``: the real passes with DBO slots).

Mutations are bit flips, truncations, extensions and 32-bit fields set to
extreme values (counts, sizes, offsets, operands), each optionally followed by
a resealed checksum so that the checks past the checksum are reached.

Besides the hypothesis tests, a seeded differential campaign (``campaign``) holds the C++
loader (``runtime.load_plan``) and the Python one (``reference.load_plan``) to the same answer
on every mutant and on hostile arguments (paths that cannot be read, ranks that are not
integers or do not fit 64 bits, signatures of the wrong size or type): the same error class,
reason and message, or two programs equal field by field. The suite runs a short campaign;
the long one is run by hand:

    PYTHONPATH=tests:. .venv/bin/python tests/runtime/test_plan_fuzz.py --seed 0 --mutants 20000

(it prints each disagreement and exits 1 if there is one).
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime
from runtime import PlanError, reference
from runtime.bytecode import HEADER, PLAN_RECORD, SECTION_ENTRY, SIGNATURE_BYTES, SectionKind, reseal
from runtime.reference import CLOCK_COUNTERS

from compiled_plans import compiled_plan
from program_gen import drive, generate_bytes

PLANS = [generate_bytes(seed) for seed in range(8)]

mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 1 << 30), st.integers(0, 7)),
    st.tuples(st.just("truncate"), st.integers(0, 1 << 30), st.just(0)),
    st.tuples(st.just("extend"), st.integers(1, 64), st.integers(0, 255)),
    st.tuples(st.just("word"), st.integers(0, 1 << 30), st.sampled_from([0, 1, 2, 7, 255, 0xFFFF, 0x7FFFFFFF, 0xFFFFFFFF])),
)


def mutate(data: bytes, ops: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in ops:
        if not out:
            break
        if kind == "flip":
            out[where % len(out)] ^= 1 << value
        elif kind == "truncate":
            del out[where % len(out) :]
        elif kind == "extend":
            out += bytes([value]) * where
        elif len(out) >= 4:
            at = (where % (len(out) // 4)) * 4
            struct.pack_into("<I", out, at, value)
    return bytes(out)


def outcome(load, data: bytes, rank: int):  # noqa: ANN001, ANN201
    try:
        return "accepted", load(data, rank=rank)
    except PlanError as err:
        assert str(err) and "\n" not in str(err)
        return err.reason, None


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    plan=st.sampled_from(range(len(PLANS))),
    ops=st.lists(mutation, min_size=1, max_size=4),
    seal=st.booleans(),
    rank=st.integers(0, 3),
)
def test_mutated_plans_are_refused_alike_or_run(plan: int, ops: list, seal: bool, rank: int) -> None:
    refused_alike_or_run(PLANS[plan], ops, seal, rank, seed=plan)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(mutation, min_size=1, max_size=4), seal=st.booleans(), rank=st.integers(0, 2))
def test_mutated_compiled_plans_are_refused_alike_or_run(ops: list, seal: bool, rank: int) -> None:
    refused_alike_or_run(compiled_plan(2, 2, 4, dbo=True), ops, seal, rank, seed=rank)


def refused_alike_or_run(plan: bytes, ops: list, seal: bool, rank: int, seed: int) -> None:
    data = mutate(plan, ops)
    if seal:
        data = reseal(data)
    native_reason, native = outcome(runtime.load_plan, data, rank)
    ref_reason, ref = outcome(reference.load_plan, data, rank)
    assert native_reason == ref_reason
    if native is not None:
        # Still a well-formed program: both interpreters step it to DONE, identically.
        a, ca = drive(runtime.FSM(native), native, seed=seed, register=False)
        b, cb = drive(reference.ReferenceFSM(ref), ref, seed=seed, register=False)
        for key in CLOCK_COUNTERS:
            ca.pop(key)
            cb.pop(key)
        assert a == b and ca == cb


def _with_pp(data: bytes, pp: int) -> bytes:
    out = bytearray(data)
    count = HEADER.unpack_from(out)[5]
    for i in range(count):
        kind, _, _, offset, _ = SECTION_ENTRY.unpack_from(out, HEADER.size + i * SECTION_ENTRY.size)
        if kind == 1:  # PLAN: pp is its first field
            struct.pack_into("<I", out, offset, pp)
    return reseal(bytes(out))


def test_a_damaged_pipeline_size_is_refused_alike_naming_a_few_missing_ranks() -> None:
    # Found by the fuzzer above: pp = 2^31 - 1 made both loaders list every missing rank (the
    # native one ran out of memory building the message).
    for pp, named in ((0x7FFFFFFF, "[1, 2, 3, 4, 5, 6, 7, 8] and 2147483638 more"), (0xFFFFFFFF, "and 4294967286 more"),
                      (4, "rank(s) [1, 2, 3]")):
        data = _with_pp(PLANS[4], pp)
        messages = []
        for load in (runtime.load_plan, reference.load_plan):
            try:
                load(data, rank=0)
            except PlanError as err:
                assert err.reason == "program"
                messages.append(str(err))
        assert len(messages) == 2 and messages[0] == messages[1] and named in messages[0], messages


# ---------------------------------------------------------------- the seeded differential campaign

EXTREMES = (0, 1, 2, 3, 7, 255, 0xFFFF, 0x10000, 0x10001, 0x40000000, 0x55555556, 0x7FFFFFFF, 0x80000000,
            0xAAAAAAAB, 0xFFFFFFFE, 0xFFFFFFFF)


def _plan_record_offset(data: bytes) -> int | None:
    if len(data) < HEADER.size:
        return None
    count = HEADER.unpack_from(data)[5]
    for i in range(min(count, (len(data) - HEADER.size) // SECTION_ENTRY.size)):
        kind, _, _, offset, _ = SECTION_ENTRY.unpack_from(data, HEADER.size + i * SECTION_ENTRY.size)
        if kind == SectionKind.PLAN and offset + PLAN_RECORD.size <= len(data):
            return offset
    return None


def mutant(rng: random.Random, base: bytes) -> bytes:
    """One mutant of ``base``: one to four mutations, resealed half the time.

    Besides the byte-level mutations of ``mutate``, a fifth sets one of the PLAN record's
    sizes (pp, vpp, ep, tp, micro-batches, micro-batch size, sequence length) to an extreme:
    the products and comparisons a loader derives from them are where 32-bit arithmetic
    would part from Python's integers.
    """
    out = bytearray(base)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "truncate", "extend", "word", "word", "plan", "plan"))
        if kind == "plan":
            at = _plan_record_offset(bytes(out))
            if at is not None:
                struct.pack_into("<I", out, at + 4 * rng.randrange(7), rng.choice(EXTREMES))
            continue
        where = rng.randrange(1 << 30) if kind != "extend" else rng.randint(1, 64)
        value = {"flip": rng.randrange(8), "truncate": 0, "extend": rng.randrange(256), "word": rng.choice(EXTREMES)}[kind]
        out = bytearray(mutate(bytes(out), [(kind, where, value)]))
    return reseal(bytes(out)) if rng.random() < 0.5 else bytes(out)


def program_content(program: Any) -> tuple:
    """Everything a loaded program holds, comparable across the two loaders."""
    p = program.plan
    plan = (p.pp, p.vpp, p.ep, p.tp, p.microbatches, p.micro_batch_size, p.seq_len, p.dtype, p.model, p.cost_source,
            p.hardware, p.memory_budget_bytes, p.virtual_stages)
    tasks = [(t.name, t.kind, t.layer, int(t.resource), t.movable, t.duration_us, t.memory_bytes) for t in program.tasks]
    slots = None if program.slots is None else [(s.collective_task, s.base_us, s.a2a_us, s.gemm_us) for s in program.slots]
    code = [(int(i.op), int(i.stream), i.aux, i.mb, i.a, i.b) for i in program.instructions]
    return (program.rank, bytes(program.signature), plan, tasks, slots, code, len(program))


def answer(load: Callable[..., Any], source: Any, rank: Any, signature: Any) -> tuple:
    """What a loader says: ("accepted", content) or (error class, reason, message)."""
    try:
        program = load(source, rank=rank, signature=signature)
    except (PlanError, TypeError, ValueError) as err:
        return (type(err).__name__, getattr(err, "reason", None), str(err))
    return ("accepted", program_content(program))


def hostile_arguments(folder: Path, plan: bytes) -> list[tuple[str, Any, Any, Any]]:
    """(label, source, rank, signature) calls a careless or hostile caller could make."""
    good = folder / "plan.tsb"
    good.write_bytes(plan)
    unreadable = folder / "locked.tsb"
    unreadable.write_bytes(plan)
    unreadable.chmod(0)
    signature = plan[16 : 16 + SIGNATURE_BYTES]
    sources: list[tuple[str, Any]] = [
        ("bytes", plan), ("bytearray", bytearray(plan)), ("memoryview", memoryview(plan)), ("path", good),
        ("str path", str(good)), ("missing file", folder / "missing.tsb"), ("directory", folder),
        ("NUL in path", "plan\0.tsb"), ("overlong name", "p" * 100_000), ("overlong path", "/".join(["d"] * 5000)),
        ("empty path", ""), ("int", 3), ("None", None), ("list", [1, 2]),
    ]
    if os.geteuid() != 0:  # root reads a file whatever its mode
        sources.append(("no permission", unreadable))
    ranks: list[tuple[str, Any]] = [
        ("0", 0), ("1", 1), ("-1", -1), ("2^31", 2**31), ("2^32", 2**32), ("2^63 - 1", 2**63 - 1), ("2^63", 2**63),
        ("-2^63", -(2**63)), ("-2^63 - 1", -(2**63) - 1), ("2^100", 2**100), ("True", True), ("1.0", 1.0),
        ("None", None), ("'0'", "0"), ("b'0'", b"0"),
    ]
    signatures: list[tuple[str, Any]] = [
        ("none", None), ("right", signature), ("right bytearray", bytearray(signature)), ("other", bytes(32)),
        ("short", signature[:5]), ("empty", b""), ("long", signature + b"x"), ("str", "x" * 32), ("int", 7),
    ]
    calls = [(f"source {name}", source, 0, None) for name, source in sources]
    calls += [(f"rank {name}", plan, rank, None) for name, rank in ranks]
    calls += [(f"signature {name}", plan, 0, sig) for name, sig in signatures]
    # Argument problems and plan problems together: which comes first must agree too.
    calls += [(f"bad file, rank {name}", folder / "missing.tsb", rank, None) for name, rank in ranks[-4:]]
    calls += [(f"damaged plan, rank {name}", plan[:40], rank, None) for name, rank in ranks]
    calls += [(f"damaged plan, signature {name}", plan[:40], 0, sig) for name, sig in signatures]
    return calls


def campaign(seed: int, mutants: int, report: Callable[[str], None] = print) -> int:
    """Compare both loaders on ``mutants`` seeded mutants and on the hostile arguments; returns the disagreements."""
    rng = random.Random(seed)
    bases = [*PLANS, compiled_plan(2, 2, 4, dbo=True)]
    disagreements = 0
    for k in range(mutants):
        data = mutant(rng, rng.choice(bases))
        rank = rng.choice((0, 0, 1, 2, 3, -1, 2**32, 2**64))
        native, ref = answer(runtime.load_plan, data, rank, None), answer(reference.load_plan, data, rank, None)
        if native != ref:
            disagreements += 1
            report(f"mutant {k} (seed {seed}, rank {rank}): C++ {native[:3]} / Python {ref[:3]}")
    with tempfile.TemporaryDirectory() as folder:
        for label, source, rank, signature in hostile_arguments(Path(folder), bases[0]):
            native, ref = answer(runtime.load_plan, source, rank, signature), answer(reference.load_plan, source, rank, signature)
            if native != ref:
                disagreements += 1
                report(f"{label}: C++ {native[:3]} / Python {ref[:3]}")
    return disagreements


def test_a_seeded_campaign_finds_no_disagreement() -> None:
    found: list[str] = []
    assert campaign(seed=0, mutants=600, report=found.append) == 0, found[:10]


def test_hostile_arguments_get_one_answer_and_a_clear_one(tmp_path: Path) -> None:
    plan = PLANS[4]
    answers = {label: answer(reference.load_plan, source, rank, signature)
               for label, source, rank, signature in hostile_arguments(tmp_path, plan)}
    for label in ("source missing file", "source directory", "source NUL in path", "source overlong name",
                  "source empty path", "bad file, rank None"):
        assert answers[label][:2] == ("PlanError", "unreadable"), (label, answers[label])
    assert answers["source int"][:1] == ("TypeError",)  # never a read of file descriptor 3
    for label in ("rank 1.0", "rank None", "rank True", "rank '0'"):
        assert answers[label][0] == "TypeError" and "rank must be an integer" in answers[label][2], answers[label]
    for label in ("rank 2^63", "rank 2^100", "rank -2^63 - 1"):
        assert answers[label][:2] == ("PlanError", "rank"), answers[label]
    assert str(2**100) in answers["rank 2^100"][2]
    for label in ("signature short", "signature empty", "signature long"):
        assert answers[label][0] == "ValueError" and "32 bytes" in answers[label][2], answers[label]
    assert answers["signature other"][:2] == ("PlanError", "signature")
    assert answers["signature right"][0] == answers["source path"][0] == "accepted"
    # The source is read first, then the arguments are checked, then the plan's bytes.
    assert answers["bad file, rank None"][:2] == ("PlanError", "unreadable")
    assert answers["damaged plan, rank 0"][:2] == ("PlanError", "truncated")
    assert answers["damaged plan, rank 1.0"][0] == "TypeError"


def test_a_virtual_stage_count_beyond_32_bits_is_the_same_for_both_loaders() -> None:
    # Found by the campaign: pp * vpp wrapped in 32 bits in the C++ loader, so a plan with
    # pp = 2 and vpp = 2^31 had no virtual stage there (every SEND refused) and 2^32 here.
    plan = next(p for p in PLANS if reference.load_plan(p, rank=0).plan.pp == 2)
    at = _plan_record_offset(plan)
    assert at is not None
    out = bytearray(plan)
    struct.pack_into("<I", out, at + 4, 0x80000000)
    data = reseal(bytes(out))
    native, ref = answer(runtime.load_plan, data, 0, None), answer(reference.load_plan, data, 0, None)
    assert native == ref and native[0] == "accepted"
    assert runtime.load_plan(data, rank=0).plan.virtual_stages == 2**32


def _section_offset(data: bytes, wanted: SectionKind) -> int:
    for i in range(HEADER.unpack_from(data)[5]):
        kind, _, _, offset, _ = SECTION_ENTRY.unpack_from(data, HEADER.size + i * SECTION_ENTRY.size)
        if kind == wanted:
            return int(offset)
    raise AssertionError(f"no {wanted.name} section")


def test_a_refused_duration_is_quoted_alike_by_both_loaders() -> None:
    # Found by the long campaign: the C++ loader printed a bad duration with six digits
    # (-3.72066e-103) and a negative NaN as "-nan"; both now write it as Python's repr does.
    at = _section_offset(PLANS[0], SectionKind.TASKS) + 4 + 16  # task 0's duration_us
    for value in (-1.0, -0.1, -1e-4, -1e-5, -123456.789, -1e16, -1.2345678901234567e16, -1e17, -3.7206640510130747e-103,
                  -5e-324, -1.7976931348623157e308, float("nan"), -float("nan"), float("inf"), -float("inf")):
        out = bytearray(PLANS[0])
        struct.pack_into("<d", out, at, value)
        data = reseal(bytes(out))
        native, ref = answer(runtime.load_plan, data, 0, None), answer(reference.load_plan, data, 0, None)
        assert native == ref and native[1] == "task" and f"has duration {value!r};" in native[2], (native, ref)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The seeded differential campaign of the two plan loaders.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mutants", type=int, default=20_000)
    args = parser.parse_args(argv)
    found = campaign(args.seed, args.mutants)
    print(f"seed {args.seed}: {args.mutants} mutants and the hostile arguments, {found} disagreement(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
