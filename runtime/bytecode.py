"""The plan bytecode (``.tsb``): the format the runtime defines, its writer and its reference loader.

docs/bytecode.md is the prose form of this module; the C++ loader in
``runtime/csrc/loader.cpp`` checks the same things in the same order and gives
the same ``PlanError.reason`` for the same bytes (the differential tests hold
both to that). The compiler's codegen fills a ``PlanImage`` and calls
``encode``; a trainer calls ``runtime.load_plan`` (C++) or ``decode`` (this
module, pure Python).

Everything is little-endian. A file is a 64-byte header, a table of 16-byte
section entries, then the sections, each starting at a multiple of 8 bytes.
"""

from __future__ import annotations

import math
import operator
import os
import struct
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import NamedTuple

from runtime.errors import PlanError

MAGIC = b"\x89TSB\r\n\x1a\n"  # the high byte and CR/LF/EOF catch text-mode transfers, like PNG's
FORMAT_VERSION = 1
SIGNATURE_BYTES = 32  # SHA-256 of the model IR, the parallel settings and the cost source
ALIGN = 8
NONE = 0xFFFFFFFF
MISSING_RANKS_NAMED = 8  # how many missing pipeline ranks a refusal names before "and N more" (as loader.cpp)

HEADER = struct.Struct("<8sII32sIIII")  # magic version flags signature file_size section_count checksum reserved
SECTION_ENTRY = struct.Struct("<HHIII")  # kind reserved id offset size
PLAN_RECORD = struct.Struct("<IIIIIIIIIIIIQ")  # see PlanInfo, then 4 string refs, then the DBO memory budget
TASK_RECORD = struct.Struct("<IIIBBHdQ")  # name kind layer resource flags reserved duration_us memory_bytes
SLOT_RECORD = struct.Struct("<IIddd")  # collective_task reserved base_us a2a_us gemm_us
PROGRAM_HEAD = struct.Struct("<II")  # instruction count, reserved
INSTRUCTION = struct.Struct("<BBHIII")  # op stream aux mb a b
COUNT = struct.Struct("<I")
STRING_REF = struct.Struct("<II")  # offset length, into the bytes after the reference table
CHECKSUM_OFFSET = 56

assert HEADER.size == 64 and SECTION_ENTRY.size == 16 and INSTRUCTION.size == 16
assert PLAN_RECORD.size == 56 and TASK_RECORD.size == 32 and SLOT_RECORD.size == 32


class Flag(IntEnum):
    DBO = 1  # the plan has a SLOTS section (dynamic bubble filling)


KNOWN_FLAGS = int(Flag.DBO)


class SectionKind(IntEnum):
    PLAN = 1
    STRINGS = 2
    TASKS = 3
    SLOTS = 4
    PROGRAM = 5


class Op(IntEnum):
    END = 0
    RUN = 1
    SEND = 2
    RECV = 3
    COLLECTIVE = 4
    WAIT = 5
    SLOT = 6
    DEFER = 7


class Stream(IntEnum):
    COMPUTE = 0
    COMM = 1


class Payload(IntEnum):  # what a SEND/RECV carries
    ACTIVATION = 0
    GRADIENT = 1


class Collective(IntEnum):
    ALL_TO_ALL = 0  # an expert-parallel dispatch or combine task
    GRAD_REDUCE = 1  # the data-parallel gradient reduction of one virtual stage


class Group(IntEnum):
    EP = 0
    DP = 1


TASK_FLAG_MOVABLE = 1
# Instructions that finish (and so can be waited on): every one that gives the trainer work.
COMPLETING_OPS = frozenset({Op.RUN, Op.SEND, Op.RECV, Op.COLLECTIVE, Op.DEFER})


@dataclass(frozen=True)
class PlanInfo:
    """The parallel settings a plan was compiled for, and where its costs came from."""

    pp: int
    vpp: int
    ep: int
    tp: int
    microbatches: int
    micro_batch_size: int
    seq_len: int
    dtype: str
    model: str
    cost_source: str
    hardware: str
    memory_budget_bytes: int  # the DBO pool's cap on memory kept alive by deferred tasks

    @property
    def virtual_stages(self) -> int:
        return self.pp * self.vpp


@dataclass(frozen=True)
class TaskInfo:
    """A task of the model as the runtime sees it: a name the executor binds to work."""

    name: str
    kind: str  # op.phase, e.g. "expert_gemm.wgrad"
    layer: str
    resource: Stream
    movable: bool
    duration_us: float  # predicted; DBO fits movable tasks into slots by it
    memory_bytes: int  # activation memory a deferred task keeps alive until it runs


@dataclass(frozen=True)
class SlotInfo:
    """A place where a rank may idle waiting for an All-to-All; DBO predicts and fills it."""

    collective_task: int  # index of the All-to-All task whose completion ends the slot
    base_us: float  # idle the static plan predicts with balanced routing
    a2a_us: float  # routing-dependent All-to-All time the slot waits on
    gemm_us: float  # routing-dependent expert GEMM time the slot waits on


class Instr(NamedTuple):
    """One instruction (a named tuple: plans hold hundreds of thousands, and tuples are cheap)."""

    op: Op
    stream: Stream = Stream.COMPUTE
    aux: int = 0
    mb: int = 0
    a: int = 0
    b: int = 0


@dataclass
class PlanImage:
    """A whole plan in memory: what ``encode`` writes and ``decode`` returns."""

    signature: bytes
    plan: PlanInfo
    tasks: list[TaskInfo]
    slots: list[SlotInfo] | None  # None: the plan has no DBO
    programs: dict[int, list[Instr]] = field(default_factory=dict)  # pipeline rank -> instructions


# ---------------------------------------------------------------- writer


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class _StringPool:
    def __init__(self) -> None:
        self.index: dict[str, int] = {}

    def ref(self, s: str) -> int:
        if s not in self.index:
            self.index[s] = len(self.index)
        return self.index[s]

    def encode(self) -> bytes:
        blobs = [s.encode() for s in self.index]
        table, offset = [], 0
        for b in blobs:
            table.append(STRING_REF.pack(offset, len(b)))
            offset += len(b)
        return COUNT.pack(len(blobs)) + b"".join(table) + b"".join(blobs)


def encode(image: PlanImage) -> bytes:
    """The bytes of ``image``. Deterministic: the same image gives the same bytes."""
    if len(image.signature) != SIGNATURE_BYTES:
        raise ValueError(f"a plan signature is {SIGNATURE_BYTES} bytes, got {len(image.signature)}")
    strings = _StringPool()
    p = image.plan
    plan_record = PLAN_RECORD.pack(
        p.pp, p.vpp, p.ep, p.tp, p.microbatches, p.micro_batch_size, p.seq_len,
        strings.ref(p.dtype), strings.ref(p.model), strings.ref(p.cost_source), strings.ref(p.hardware), 0,
        p.memory_budget_bytes,
    )
    task_records = [
        TASK_RECORD.pack(
            strings.ref(t.name), strings.ref(t.kind), strings.ref(t.layer), int(t.resource),
            TASK_FLAG_MOVABLE if t.movable else 0, 0, float(t.duration_us), t.memory_bytes,
        )
        for t in image.tasks
    ]
    sections: list[tuple[SectionKind, int, bytes]] = [
        (SectionKind.PLAN, 0, plan_record),
        (SectionKind.STRINGS, 0, strings.encode()),
        (SectionKind.TASKS, 0, COUNT.pack(len(task_records)) + b"".join(task_records)),
    ]
    if image.slots is not None:
        slot_records = [SLOT_RECORD.pack(s.collective_task, 0, s.base_us, s.a2a_us, s.gemm_us) for s in image.slots]
        sections.append((SectionKind.SLOTS, 0, COUNT.pack(len(slot_records)) + b"".join(slot_records)))
    for rank in sorted(image.programs):
        instrs = image.programs[rank]
        body = PROGRAM_HEAD.pack(len(instrs), 0) + b"".join(
            INSTRUCTION.pack(int(i.op), int(i.stream), i.aux, i.mb, i.a, i.b) for i in instrs
        )
        sections.append((SectionKind.PROGRAM, rank, body))

    table_end = HEADER.size + SECTION_ENTRY.size * len(sections)
    offset = _align(table_end)
    entries, chunks = [], []
    for kind, ident, body in sections:
        entries.append(SECTION_ENTRY.pack(int(kind), 0, ident, offset, len(body)))
        padded = body + b"\0" * (_align(len(body)) - len(body))
        chunks.append(padded)
        offset += len(padded)
    flags = int(Flag.DBO) if image.slots is not None else 0
    head = HEADER.pack(MAGIC, FORMAT_VERSION, flags, image.signature, offset, len(sections), 0, 0)
    data = bytearray(head + b"".join(entries) + b"\0" * (_align(table_end) - table_end) + b"".join(chunks))
    struct.pack_into("<I", data, CHECKSUM_OFFSET, checksum(data))
    return bytes(data)


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 (zlib's polynomial) of the file with the checksum field read as zero."""
    crc = zlib.crc32(memoryview(data)[:CHECKSUM_OFFSET])
    crc = zlib.crc32(b"\0\0\0\0", crc)
    return zlib.crc32(memoryview(data)[CHECKSUM_OFFSET + 4 :], crc)


def reseal(data: bytes | bytearray) -> bytes:
    """``data`` with its checksum recomputed: for tests that corrupt structure past the checksum."""
    out = bytearray(data)
    if len(out) >= HEADER.size:
        struct.pack_into("<I", out, CHECKSUM_OFFSET, checksum(out))
    return bytes(out)


# ---------------------------------------------------------------- loader


def _fail(reason: str, message: str) -> PlanError:
    return PlanError(message, reason)


# The loaders' arguments. runtime.load_plan (C++) and reference.load_plan (this module) take
# the same (source, rank, signature) and must answer the same for any of them: the source is
# read here for both; rank and signature are checked by check_rank / check_signature here and
# by their twins in runtime/csrc/bindings.cpp, with the same classes and messages. Misuse of
# the call is a TypeError or ValueError; only a problem of the plan itself (the file included)
# is a PlanError.


def plan_bytes(source: object) -> bytes:
    """The bytes of a plan given as a path (str or os.PathLike) or as its bytes.

    A path that cannot be read is refused as PlanError("unreadable") whatever the cause
    (missing, a directory, no permission, a name the OS rejects).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        return bytes(source)
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"a plan is a path or its bytes, got {type(source).__name__}")
    try:
        with open(source, "rb") as f:
            return f.read()
    except (OSError, ValueError) as err:  # ValueError: a NUL byte in the path
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        name = os.fsdecode(os.fspath(source))
        shown = name if len(name) <= 200 else f"{name[:200]}... ({len(name)} characters)"
        raise _fail("unreadable", f"cannot read plan '{shown}': {why}") from None


def check_rank(rank: object) -> int:
    """``rank`` as an int; anything but an integer (bool included) is a TypeError.

    Any integer passes, however large: one outside the plan's pipeline ranks is refused by
    the loader as PlanError("rank"), in the order of its checks.
    """
    if isinstance(rank, bool) or not hasattr(type(rank), "__index__"):
        raise TypeError(f"rank must be an integer pipeline rank, got {type(rank).__name__}")
    return operator.index(rank)  # type: ignore[arg-type]


def check_signature(signature: object) -> bytes | None:
    """``signature`` as bytes (None: do not check it); it must be SIGNATURE_BYTES bytes."""
    if signature is None:
        return None
    if not isinstance(signature, (bytes, bytearray, memoryview)):
        raise TypeError(f"a plan signature is {SIGNATURE_BYTES} bytes or None, got {type(signature).__name__}")
    value = bytes(signature)
    if len(value) != SIGNATURE_BYTES:
        raise ValueError(f"a plan signature is {SIGNATURE_BYTES} bytes (a SHA-256 digest), got {len(value)}")
    return value


@dataclass(frozen=True)
class _Section:
    kind: int
    ident: int
    offset: int
    size: int


_UNIQUE = (SectionKind.PLAN, SectionKind.STRINGS, SectionKind.TASKS, SectionKind.SLOTS)


def decode(data: bytes | bytearray | memoryview, rank: int | None = None, signature: bytes | None = None) -> PlanImage:
    """Check ``data`` and return the plan; with ``rank``, only that rank's program is checked and returned.

    Raises PlanError naming the first problem, in the order docs/bytecode.md lists the checks
    (TypeError or ValueError for a ``rank`` or ``signature`` that check_rank or
    check_signature refuses).
    """
    if rank is not None:
        rank = check_rank(rank)
    signature = check_signature(signature)
    buf = memoryview(bytes(data))
    n = len(buf)
    if n < HEADER.size:
        raise _fail("truncated", f"truncated: {n} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, flags, sig, file_size, section_count, stored_crc, _ = HEADER.unpack_from(buf, 0)
    if magic != MAGIC:
        raise _fail("bad-magic", "not a Tessera plan: the file does not start with the .tsb magic bytes")
    if version != FORMAT_VERSION:
        raise _fail(
            "version",
            f"format version {version} is not known to this runtime, which reads version {FORMAT_VERSION}; "
            "compile the plan with the Tessera that matches this runtime",
        )
    if file_size > n:
        raise _fail("truncated", f"truncated: the header announces {file_size} bytes but the file has {n}")
    if file_size < n:
        raise _fail("trailing-data", f"{n - file_size} bytes after the {file_size} bytes the header announces")
    if checksum(buf) != stored_crc:
        raise _fail("checksum", "checksum mismatch: the plan's bytes changed after it was written")
    if flags & ~KNOWN_FLAGS:
        raise _fail("flags", f"unknown flag bits 0x{flags & ~KNOWN_FLAGS:x} in the header")

    table_end = HEADER.size + SECTION_ENTRY.size * section_count
    if table_end > n:
        raise _fail("section-table", f"the section table of {section_count} entries runs past the end of the file")
    sections: list[_Section] = []
    for i in range(section_count):
        kind, reserved, ident, offset, size = SECTION_ENTRY.unpack_from(buf, HEADER.size + SECTION_ENTRY.size * i)
        if kind not in SectionKind._value2member_map_ or reserved != 0:
            raise _fail("section-kind", f"section {i} has unknown kind {kind} (or a non-zero reserved field)")
        if offset % ALIGN or offset < table_end or offset + size > n:
            raise _fail(
                "section-bounds",
                f"section {i} ({SectionKind(kind).name}) at offset {offset} size {size} lies outside the file's "
                f"{n} bytes after its section table, or is not {ALIGN}-byte aligned",
            )
        sections.append(_Section(kind, ident, offset, size))
    by_offset = sorted(sections, key=lambda s: (s.offset, s.size))
    for first, second in zip(by_offset, by_offset[1:]):
        if first.offset + first.size > second.offset:
            raise _fail("section-bounds", f"sections {SectionKind(first.kind).name} and {SectionKind(second.kind).name} overlap")
    found: dict[int, _Section] = {}
    programs: dict[int, _Section] = {}
    for s in sections:
        if s.kind == SectionKind.PROGRAM:
            if s.ident in programs:
                raise _fail("section-duplicate", f"two PROGRAM sections for rank {s.ident}")
            programs[s.ident] = s
        else:
            if s.kind in found:
                raise _fail("section-duplicate", f"two {SectionKind(s.kind).name} sections")
            found[s.kind] = s
    for kind in (SectionKind.PLAN, SectionKind.STRINGS, SectionKind.TASKS):
        if kind not in found:
            raise _fail("section-missing", f"no {kind.name} section")
    has_dbo = bool(flags & Flag.DBO)
    if has_dbo and SectionKind.SLOTS not in found:
        raise _fail("section-missing", "the DBO flag is set but there is no SLOTS section")
    if not has_dbo and SectionKind.SLOTS in found:
        raise _fail("flags", "a SLOTS section is present but the DBO flag is not set")

    strings = _decode_strings(buf, found[SectionKind.STRINGS])
    plan = _decode_plan(buf, found[SectionKind.PLAN], strings)
    tasks = _decode_tasks(buf, found[SectionKind.TASKS], strings)
    slots = _decode_slots(buf, found[SectionKind.SLOTS], tasks) if has_dbo else None

    for ident in programs:
        if ident >= plan.pp:
            raise _fail("program", f"a PROGRAM section for rank {ident}, but the plan has pipeline ranks 0..{plan.pp - 1}")
    if len(programs) != plan.pp:
        # The ids are distinct and below pp, so pp - len(programs) ranks lack one; the message
        # names the first few (a damaged pp can be 2**32 - 1, too many ranks to list).
        absent = plan.pp - len(programs)
        missing: list[int] = []
        rank_id = 0
        while len(missing) < min(absent, MISSING_RANKS_NAMED):
            if rank_id not in programs:
                missing.append(rank_id)
            rank_id += 1
        more = f" and {absent - len(missing)} more" if absent > len(missing) else ""
        raise _fail("program", f"no PROGRAM section for pipeline rank(s) {missing}{more}")
    if rank is not None and not (0 <= rank < plan.pp):
        raise _fail("rank", f"rank {rank} has no program: the plan has pipeline ranks 0..{plan.pp - 1}")
    wanted = range(plan.pp) if rank is None else [rank]
    decoded = {r: _decode_program(buf, programs[r], r, plan, tasks, slots) for r in wanted}
    if signature is not None and bytes(sig) != bytes(signature):
        raise _fail(
            "signature",
            f"plan signature {bytes(sig).hex()[:16]}... does not match the model being trained "
            f"({bytes(signature).hex()[:16]}...): the plan was compiled for another model, other parallel settings "
            "or another cost source; recompile it",
        )
    return PlanImage(bytes(sig), plan, tasks, slots, decoded)


def _records(buf: memoryview, s: _Section, record: struct.Struct, what: str) -> tuple[int, int]:
    """(count, offset of the first record) of a counted record section, checking its size."""
    if s.size < COUNT.size:
        raise _fail("section-size", f"the {what} section is {s.size} bytes, too small for its record count")
    (count,) = COUNT.unpack_from(buf, s.offset)
    if COUNT.size + count * record.size != s.size:
        raise _fail(
            "section-size",
            f"the {what} section announces {count} records ({COUNT.size + count * record.size} bytes) but is {s.size} bytes",
        )
    return count, s.offset + COUNT.size


def _decode_strings(buf: memoryview, s: _Section) -> list[str]:
    if s.size < COUNT.size:
        raise _fail("section-size", f"the STRINGS section is {s.size} bytes, too small for its count")
    (count,) = COUNT.unpack_from(buf, s.offset)
    table = COUNT.size + count * STRING_REF.size
    if table > s.size:
        raise _fail("section-size", f"the STRINGS section announces {count} strings, more than its {s.size} bytes hold")
    blob_start, blob_size = s.offset + table, s.size - table
    out = []
    for i in range(count):
        offset, length = STRING_REF.unpack_from(buf, s.offset + COUNT.size + i * STRING_REF.size)
        if offset + length > blob_size:
            raise _fail("string", f"string {i} (offset {offset}, length {length}) runs past the string bytes")
        try:
            out.append(bytes(buf[blob_start + offset : blob_start + offset + length]).decode("utf-8"))
        except UnicodeDecodeError:
            raise _fail("string", f"string {i} is not valid UTF-8") from None
    return out


def _string(strings: Sequence[str], ref: int, what: str) -> str:
    if ref >= len(strings):
        raise _fail("string", f"{what} refers to string {ref}, but there are {len(strings)}")
    return strings[ref]


def _decode_plan(buf: memoryview, s: _Section, strings: Sequence[str]) -> PlanInfo:
    if s.size != PLAN_RECORD.size:
        raise _fail("section-size", f"the PLAN section is {s.size} bytes; it must be {PLAN_RECORD.size}")
    pp, vpp, ep, tp, mbs, mbsize, seq, dtype, model, source, hw, reserved, budget = PLAN_RECORD.unpack_from(buf, s.offset)
    for name, value in (("pp", pp), ("vpp", vpp), ("ep", ep), ("tp", tp), ("microbatches", mbs),
                        ("micro_batch_size", mbsize), ("seq_len", seq)):
        if value < 1:
            raise _fail("plan", f"the plan's {name} is {value}; it must be at least 1")
    if reserved != 0:
        raise _fail("plan", "the PLAN section's reserved field is not zero")
    return PlanInfo(
        pp, vpp, ep, tp, mbs, mbsize, seq,
        _string(strings, dtype, "the plan's dtype"), _string(strings, model, "the plan's model"),
        _string(strings, source, "the plan's cost source"), _string(strings, hw, "the plan's hardware"), budget,
    )


def _finite_nonnegative(x: float) -> bool:
    return math.isfinite(x) and x >= 0


def _decode_tasks(buf: memoryview, s: _Section, strings: Sequence[str]) -> list[TaskInfo]:
    count, start = _records(buf, s, TASK_RECORD, "TASKS")
    tasks = []
    for i in range(count):
        name, kind, layer, resource, flags, reserved, duration, memory = TASK_RECORD.unpack_from(buf, start + i * TASK_RECORD.size)
        what = f"task {i}"
        name_s = _string(strings, name, f"{what}'s name")
        kind_s = _string(strings, kind, f"{what}'s kind")
        layer_s = _string(strings, layer, f"{what}'s layer")
        if resource > Stream.COMM:
            raise _fail("task", f"task {i} ('{name_s}') has resource {resource}; it must be 0 (compute) or 1 (comm)")
        if flags & ~TASK_FLAG_MOVABLE or reserved:
            raise _fail("task", f"task {i} ('{name_s}') has unknown flag bits or a non-zero reserved field")
        if not _finite_nonnegative(duration):
            raise _fail("task", f"task {i} ('{name_s}') has duration {duration}; it must be finite and >= 0")
        movable = bool(flags & TASK_FLAG_MOVABLE)
        if movable and resource != Stream.COMPUTE:
            raise _fail("task", f"task {i} ('{name_s}') is movable but runs on the comm stream")
        tasks.append(TaskInfo(name_s, kind_s, layer_s, Stream(resource), movable, duration, memory))
    return tasks


def _decode_slots(buf: memoryview, s: _Section, tasks: Sequence[TaskInfo]) -> list[SlotInfo]:
    count, start = _records(buf, s, SLOT_RECORD, "SLOTS")
    slots = []
    for i in range(count):
        task, reserved, base_us, a2a_us, gemm_us = SLOT_RECORD.unpack_from(buf, start + i * SLOT_RECORD.size)
        if task >= len(tasks) or tasks[task].resource != Stream.COMM:
            raise _fail("slot", f"slot {i} waits on task {task}, which is not a comm task of the plan")
        if reserved or not all(_finite_nonnegative(x) for x in (base_us, a2a_us, gemm_us)):
            raise _fail("slot", f"slot {i} has a non-zero reserved field or a negative or non-finite time")
        slots.append(SlotInfo(task, base_us, a2a_us, gemm_us))
    return slots


def _decode_program(
    buf: memoryview, s: _Section, rank: int, plan: PlanInfo, tasks: Sequence[TaskInfo], slots: Sequence[SlotInfo] | None
) -> list[Instr]:
    if s.size < PROGRAM_HEAD.size:
        raise _fail("section-size", f"the PROGRAM section of rank {rank} is {s.size} bytes, too small for its head")
    count, reserved = PROGRAM_HEAD.unpack_from(buf, s.offset)
    if PROGRAM_HEAD.size + count * INSTRUCTION.size != s.size:
        raise _fail(
            "section-size",
            f"the PROGRAM section of rank {rank} announces {count} instructions "
            f"({PROGRAM_HEAD.size + count * INSTRUCTION.size} bytes) but is {s.size} bytes",
        )
    if reserved:
        raise _fail("program", f"the PROGRAM section of rank {rank} has a non-zero reserved field")
    if count == 0:
        raise _fail("instruction", f"rank {rank}'s program is empty; a program ends with END")
    raw = list(INSTRUCTION.iter_unpack(buf[s.offset + PROGRAM_HEAD.size : s.offset + s.size]))
    checker = _InstructionChecker(rank, plan, tasks, slots, raw)
    return [checker.check(i, *fields) for i, fields in enumerate(raw)]


class _InstructionChecker:
    """Operand rules per opcode (docs/bytecode.md, "Instructions"); the C++ loader mirrors them."""

    def __init__(self, rank: int, plan: PlanInfo, tasks: Sequence[TaskInfo], slots: Sequence[SlotInfo] | None, raw: list[tuple[int, ...]]):
        self.rank, self.plan, self.tasks, self.slots, self.raw = rank, plan, tasks, slots, raw
        self.last = len(raw) - 1

    def bad(self, i: int, op: int, why: str) -> PlanError:
        name = Op(op).name if op in Op._value2member_map_ else str(op)
        return _fail("instruction", f"rank {self.rank} instruction {i} ({name}): {why}")

    def check(self, i: int, op: int, stream: int, aux: int, mb: int, a: int, b: int) -> Instr:
        if op not in Op._value2member_map_:
            raise self.bad(i, op, "unknown opcode")
        if stream > Stream.COMM:
            raise self.bad(i, op, f"stream {stream} is neither 0 (compute) nor 1 (comm)")
        if (op == Op.END) != (i == self.last):
            raise self.bad(i, op, "END must be the last instruction, and the last instruction must be END")
        plan, tasks = self.plan, self.tasks

        def need(cond: bool, why: str) -> None:
            if not cond:
                raise self.bad(i, op, why)

        def mb_ok() -> None:
            need(mb < plan.microbatches, f"micro-batch {mb} is not below the plan's {plan.microbatches}")

        if op == Op.END:
            need(stream == 0 and aux == 0 and mb == 0 and a == 0 and b == 0, "END takes no operands")
        elif op == Op.RUN:
            need(stream == Stream.COMPUTE and aux == 0 and b == 0, "RUN is on the compute stream with operands (task, mb)")
            need(a < len(tasks), f"task {a} is not in the task table ({len(tasks)} tasks)")
            need(tasks[a].resource == Stream.COMPUTE, f"task '{tasks[a].name}' is a comm task; comm tasks are COLLECTIVEs")
            mb_ok()
        elif op in (Op.SEND, Op.RECV):
            need(stream == Stream.COMM and aux <= Payload.GRADIENT, "SEND/RECV are on the comm stream with payload 0 or 1")
            need(a < plan.pp and a != self.rank, f"peer {a} is not another pipeline rank (0..{plan.pp - 1})")
            need(b < plan.virtual_stages, f"virtual stage {b} is not below {plan.virtual_stages}")
            owner = self.rank if op == Op.SEND else a
            need(b % plan.pp == owner, f"virtual stage {b} does not live on rank {owner} (stage s lives on rank s mod pp)")
            mb_ok()
        elif op == Op.COLLECTIVE:
            need(stream == Stream.COMM, "COLLECTIVE is on the comm stream")
            if aux == Collective.ALL_TO_ALL:
                need(a < len(tasks) and tasks[a].resource == Stream.COMM, f"task {a} is not a comm task of the plan")
                need(b == Group.EP, "an All-to-All runs over the EP group (0)")
                mb_ok()
            elif aux == Collective.GRAD_REDUCE:
                need(a < plan.virtual_stages and a % plan.pp == self.rank, f"virtual stage {a} does not live on rank {self.rank}")
                need(b == Group.DP and mb == 0, "a gradient reduction runs over the DP group with micro-batch 0")
            else:
                raise self.bad(i, op, f"unknown collective kind {aux}")
        elif op == Op.WAIT:
            need(aux == 0 and mb == 0 and b == 0, "WAIT takes one operand, the instruction waited on")
            need(a < i, f"waits on instruction {a}, which does not come before it")
            need(self.raw[a][0] in COMPLETING_OPS, f"waits on instruction {a}, which is not work that completes")
            need(self.raw[a][0] != Op.DEFER or self.raw[a][5] <= i, f"waits on DEFER {a}, whose deadline comes after the wait")
        elif op == Op.SLOT:
            need(stream == Stream.COMPUTE and aux == 0, "SLOT is on the compute stream")
            need(self.slots is not None and a < len(self.slots), f"slot {a} is not in the SLOTS table")
            need(
                b < i and self.raw[b][0] == Op.COLLECTIVE and self.raw[b][2] == Collective.ALL_TO_ALL,
                f"instruction {b} is not an earlier All-to-All",
            )
            mb_ok()
        elif op == Op.DEFER:
            need(stream == Stream.COMPUTE and aux == 0, "DEFER is on the compute stream")
            need(a < len(tasks) and tasks[a].movable, f"task {a} is not a movable task of the plan")
            need(i < b <= self.last, f"deadline {b} is not after it and at or before END ({self.last})")
            mb_ok()
        return Instr(Op(op), Stream(stream), aux, mb, a, b)


def read_header(data: bytes | bytearray | memoryview) -> tuple[int, int, bytes]:
    """(format version, flags, signature) without checking the rest: for tools that report on a file."""
    if len(data) < HEADER.size:
        raise _fail("truncated", f"truncated: {len(data)} bytes, shorter than the {HEADER.size}-byte header")
    magic, version, flags, sig, *_ = HEADER.unpack_from(data, 0)
    if magic != MAGIC:
        raise _fail("bad-magic", "not a Tessera plan: the file does not start with the .tsb magic bytes")
    return version, flags, bytes(sig)


def instructions_of(ops: Iterable[tuple[int, int, int, int, int, int]]) -> list[Instr]:
    """Instructions from raw (op, stream, aux, mb, a, b) tuples, for builders and tests."""
    return [Instr(Op(op), Stream(stream), aux, mb, a, b) for op, stream, aux, mb, a, b in ops]
