"""Loader fuzzing: mutated plans are refused cleanly, with the same reason by both loaders, or run to DONE.

The plans are generated ones (``program_gen``: every opcode, odd shapes) and one the compiler
wrote (``compiled_plans``: the real passes with DBO slots).

Mutations are bit flips, truncations, extensions and 32-bit fields set to
extreme values (counts, sizes, offsets, operands), each optionally followed by
a resealed checksum so that the checks past the checksum are reached.
"""

from __future__ import annotations

import struct

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import runtime
from runtime import PlanError, reference
from runtime.bytecode import reseal
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
    from runtime.bytecode import HEADER, SECTION_ENTRY

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
