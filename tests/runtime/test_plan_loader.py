"""The .tsb loaders: round trips, and every refusal named identically by the C++ and Python loaders."""

from __future__ import annotations

import struct
from collections.abc import Callable

import pytest

import runtime
from runtime import PlanError, bytecode, reference
from runtime.bytecode import HEADER, SECTION_ENTRY, SectionKind, decode, encode, reseal
from runtime.errors import REASONS

from program_gen import generate_bytes, generate_plan


def sections(data: bytes) -> list[tuple[int, int, int, int, int]]:
    """(entry offset, kind, id, offset, size) of every section-table entry."""
    count = struct.unpack_from("<I", data, 52)[0]
    out = []
    for i in range(count):
        at = HEADER.size + SECTION_ENTRY.size * i
        kind, _, ident, offset, size = SECTION_ENTRY.unpack_from(data, at)
        out.append((at, kind, ident, offset, size))
    return out


def section(data: bytes, kind: SectionKind, ident: int = 0) -> tuple[int, int, int]:
    for at, k, i, offset, size in sections(data):
        if k == kind and (kind != SectionKind.PROGRAM or i == ident):
            return at, offset, size
    raise AssertionError(f"no {kind.name} section")


def put(data: bytes, fmt: str, offset: int, *values: int | float) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, *values)
    return bytes(out)


def refusal_both(data: bytes, rank: int = 0, signature: bytes | None = None) -> tuple[str, str]:
    """The reason each loader gives (or 'accepted')."""
    reasons = []
    for load in (runtime.load_plan, reference.load_plan):
        try:
            load(data, rank=rank, signature=signature)
            reasons.append("accepted")
        except PlanError as err:
            assert err.reason in REASONS
            assert str(err) and "\n" not in str(err)
            reasons.append(err.reason)
    return reasons[0], reasons[1]


def plan_with(pp_at_least: int = 1, dbo: bool = True) -> bytes:
    for seed in range(200):
        image = generate_plan(seed, dbo=dbo)
        if image.plan.pp >= pp_at_least:
            return encode(image)
    raise AssertionError("no generated plan has enough ranks")


GOOD = plan_with(pp_at_least=2)


def first_instruction(data: bytes, rank: int = 0) -> int:
    return section(data, SectionKind.PROGRAM, rank)[1] + bytecode.PROGRAM_HEAD.size


CORRUPTIONS: dict[str, Callable[[bytes], bytes]] = {
    "truncated": lambda d: d[:40],
    "trailing-data": lambda d: d + b"\0",
    "bad-magic": lambda d: b"PK\x03\x04" + d[4:],
    "version": lambda d: reseal(put(d, "<I", 8, 2)),
    "checksum": lambda d: put(d, "<B", len(d) - 20, d[-20] ^ 0x10),
    "flags": lambda d: reseal(put(d, "<I", 12, 0x6)),
    "section-table": lambda d: reseal(put(d, "<I", 52, 0xFFFFFF)),
    "section-kind": lambda d: reseal(put(d, "<H", section(d, SectionKind.TASKS)[0], 42)),
    "section-bounds": lambda d: reseal(put(d, "<I", section(d, SectionKind.TASKS)[0] + 8, len(d) - 8)),
    "section-duplicate": lambda d: reseal(put(d, "<H", section(d, SectionKind.TASKS)[0], SectionKind.PLAN)),
    "section-missing": lambda d: reseal(put(d, "<HHI", section(d, SectionKind.TASKS)[0], SectionKind.PROGRAM, 0, 77)),
    "section-size": lambda d: reseal(put(d, "<I", section(d, SectionKind.TASKS)[1], 10**6)),
    "plan": lambda d: reseal(put(d, "<I", section(d, SectionKind.PLAN)[1], 0)),
    "string": lambda d: reseal(put(d, "<I", section(d, SectionKind.TASKS)[1] + 4, 10**6)),
    "task": lambda d: reseal(put(d, "<B", section(d, SectionKind.TASKS)[1] + 4 + 12, 7)),
    "slot": lambda d: reseal(put(d, "<d", section(d, SectionKind.SLOTS)[1] + 4 + 8, -1.0)),
    "program": lambda d: reseal(put(d, "<I", section(d, SectionKind.PROGRAM, 1)[0] + 4, 9)),
    "instruction": lambda d: reseal(put(d, "<B", first_instruction(d), 99)),
}


@pytest.mark.parametrize("reason", sorted(CORRUPTIONS))
def test_each_corruption_is_refused_with_its_reason_by_both_loaders(reason: str) -> None:
    assert refusal_both(GOOD) == ("accepted", "accepted")
    assert refusal_both(CORRUPTIONS[reason](GOOD)) == (reason, reason)


def test_the_checksum_covers_every_byte_past_the_header_fields_the_size_checks_read() -> None:
    # The checksum is computed eight bytes at a time with a byte-wise tail: a change in any byte
    # of either part, or right after the checksum field, is caught alike by both loaders.
    positions = [*range(bytecode.CHECKSUM_OFFSET + 4, bytecode.CHECKSUM_OFFSET + 20), *range(len(GOOD) - 16, len(GOOD))]
    for at in positions:
        for bit in (0, 7):
            assert refusal_both(put(GOOD, "<B", at, GOOD[at] ^ (1 << bit))) == ("checksum", "checksum"), at
    for length in range(len(GOOD) - 15, len(GOOD) + 1):  # every tail length, resealed by zlib: accepted past the checksum
        cut = put(GOOD[:length], "<I", 48, length)
        native, python = refusal_both(reseal(cut))
        assert native == python != "checksum"


def test_every_reason_is_exercised() -> None:
    covered = set(CORRUPTIONS) | {"rank", "signature", "unreadable"}
    assert covered == set(REASONS)


def test_rank_and_signature_refusals_name_the_problem() -> None:
    pp = decode(GOOD).plan.pp
    assert refusal_both(GOOD, rank=pp) == ("rank", "rank")
    assert refusal_both(GOOD, rank=-1) == ("rank", "rank")
    wrong = bytes(32)
    assert refusal_both(GOOD, signature=wrong) == ("signature", "signature")
    with pytest.raises(PlanError, match="compiled for another model"):
        runtime.load_plan(GOOD, rank=0, signature=wrong)
    right = decode(GOOD).signature
    assert runtime.load_plan(GOOD, rank=0, signature=right).signature == right


def test_version_refusal_says_which_versions(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "future.tsb"
    path.write_bytes(CORRUPTIONS["version"](GOOD))
    with pytest.raises(PlanError, match="format version 2 is not known to this runtime, which reads version 1"):
        runtime.load_plan(path, rank=0)
    with pytest.raises(PlanError, match="cannot read plan") as err:
        runtime.load_plan(tmp_path / "missing.tsb", rank=0)
    assert err.value.reason == "unreadable"


@pytest.mark.parametrize("seed", range(12))
def test_encode_decode_round_trip_and_both_loaders_read_the_same_program(seed: int) -> None:
    data = generate_bytes(seed)
    image = decode(data)
    assert encode(image) == data  # deterministic writer, lossless reader
    for rank in range(image.plan.pp):
        native = runtime.load_plan(data, rank=rank)
        ref = reference.load_plan(data, rank=rank)
        assert native.rank == ref.rank == rank
        assert native.signature == ref.signature == image.signature
        assert len(native) == len(ref)
        assert [(i.op, i.stream, i.aux, i.mb, i.a, i.b) for i in native.instructions] == [
            (int(i.op), int(i.stream), i.aux, i.mb, i.a, i.b) for i in ref.instructions
        ]
        assert [(t.name, t.kind, t.layer, t.resource, t.movable, t.duration_us, t.memory_bytes) for t in native.tasks] == [
            (t.name, t.kind, t.layer, int(t.resource), t.movable, t.duration_us, t.memory_bytes) for t in ref.tasks
        ]
        for field in ("pp", "vpp", "ep", "tp", "microbatches", "dtype", "model", "cost_source", "memory_budget_bytes"):
            assert getattr(native.plan, field) == getattr(ref.plan, field)
        assert (native.slots is None) == (ref.slots is None)
        name = native.tasks[3].name
        assert native.task_index(name) == ref.task_index(name) == 3


def test_loader_reads_only_the_requested_rank() -> None:
    # A broken program of rank 1 does not stop rank 0 from loading; loading rank 1 names it.
    data = reseal(put(GOOD, "<B", first_instruction(GOOD, rank=1), 99))
    assert refusal_both(data, rank=0) == ("accepted", "accepted")
    assert refusal_both(data, rank=1) == ("instruction", "instruction")
    with pytest.raises(PlanError, match=r"rank 1 instruction 0 \(99\): unknown opcode"):
        runtime.load_plan(data, rank=1)
