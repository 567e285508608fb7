"""The text form of a plan: ``disassemble`` (bytes to text) and ``assemble`` (text to bytes).

The two are inverse: ``disassemble(assemble(text)) == text`` for any text
``disassemble`` printed, and ``assemble(disassemble(data)) == data`` for any
plan the writer produced (the writer lays sections out one way only). Floats
print with Python's shortest round-trip spelling; everything after ``//`` on a
line is a comment the assembler ignores (the disassembler names tasks there).

    tsb version 1 signature 5be1...
    plan pp=2 vpp=2 ep=2 tp=1 microbatches=4 micro_batch_size=1 seq_len=128 dtype="fp32" ...
    task 0 name="l0.mixer.fwd" kind="mixer.fwd" layer="l0" resource=compute duration_us=5.0 memory_bytes=0 movable=false
    slot 0 task=3 base_us=12.5 a2a_us=40.0 gemm_us=8.0
    program 0 {
      0 run 0 mb=0  // l0.mixer.fwd
      1 wait comm 0
      2 all_to_all 3 mb=0 group=ep  // l0.dispatch.fwd
      ...
    }
"""

from __future__ import annotations

import json
import re
from typing import Any

from runtime.bytecode import (
    FORMAT_VERSION,
    SIGNATURE_BYTES,
    Collective,
    Group,
    Instr,
    Op,
    Payload,
    PlanImage,
    PlanInfo,
    SlotInfo,
    Stream,
    TaskInfo,
    decode,
    encode,
)
from runtime.errors import PlanError

PAYLOADS = {Payload.ACTIVATION: "activation", Payload.GRADIENT: "gradient"}
GROUPS = {Group.EP: "ep", Group.DP: "dp"}
STREAMS = {Stream.COMPUTE: "compute", Stream.COMM: "comm"}
PLAN_INTS = ("pp", "vpp", "ep", "tp", "microbatches", "micro_batch_size", "seq_len")
PLAN_STRS = ("dtype", "model", "cost_source", "hardware")


def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _task_note(image: PlanImage, index: int) -> str:
    return f"  // {image.tasks[index].name}"


def _instruction(image: PlanImage, i: int, ins: Instr) -> str:
    op = ins.op
    if op == Op.END:
        return f"{i} end"
    if op == Op.RUN:
        return f"{i} run {ins.a} mb={ins.mb}{_task_note(image, ins.a)}"
    if op in (Op.SEND, Op.RECV):
        return f"{i} {op.name.lower()} peer={ins.a} vstage={ins.b} payload={PAYLOADS[Payload(ins.aux)]} mb={ins.mb}"
    if op == Op.COLLECTIVE and ins.aux == Collective.ALL_TO_ALL:
        return f"{i} all_to_all {ins.a} mb={ins.mb} group={GROUPS[Group(ins.b)]}{_task_note(image, ins.a)}"
    if op == Op.COLLECTIVE:
        return f"{i} grad_reduce vstage={ins.a} group={GROUPS[Group(ins.b)]}"
    if op == Op.WAIT:
        return f"{i} wait {STREAMS[ins.stream]} {ins.a}"
    if op == Op.SLOT:
        return f"{i} slot {ins.a} on={ins.b} mb={ins.mb}"
    return f"{i} defer {ins.a} mb={ins.mb} deadline={ins.b}{_task_note(image, ins.a)}"


def disassemble(data: bytes) -> str:
    """The text of a plan (every rank); refusals raise PlanError like the loader's."""
    image = decode(data)
    p = image.plan
    lines = [f"tsb version {FORMAT_VERSION} signature {image.signature.hex()}"]
    ints = " ".join(f"{k}={getattr(p, k)}" for k in PLAN_INTS)
    strs = " ".join(f"{k}={_q(getattr(p, k))}" for k in PLAN_STRS)
    lines.append(f"plan {ints} {strs} memory_budget_bytes={p.memory_budget_bytes}")
    for i, t in enumerate(image.tasks):
        lines.append(
            f"task {i} name={_q(t.name)} kind={_q(t.kind)} layer={_q(t.layer)} resource={STREAMS[t.resource]} "
            f"duration_us={t.duration_us!r} memory_bytes={t.memory_bytes} movable={'true' if t.movable else 'false'}"
        )
    if image.slots is not None:
        lines.append(f"slots {len(image.slots)}")
        for i, s in enumerate(image.slots):
            lines.append(f"slot {i} task={s.collective_task} base_us={s.base_us!r} a2a_us={s.a2a_us!r} gemm_us={s.gemm_us!r}")
    for rank in sorted(image.programs):
        lines.append(f"program {rank} {{")
        lines.extend(f"  {_instruction(image, i, ins)}" for i, ins in enumerate(image.programs[rank]))
        lines.append("}")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- assembler

_FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)')


def _strip_comment(line: str) -> str:
    out, quoted, i = [], False, 0
    while i < len(line):
        ch = line[i]
        if ch == '"' and (i == 0 or line[i - 1] != "\\"):
            quoted = not quoted
        if not quoted and line.startswith("//", i):
            break
        out.append(ch)
        i += 1
    return "".join(out).strip()


def _bad(line_no: int, message: str) -> PlanError:
    return PlanError(f"line {line_no}: {message}", "instruction")


def _fields(line_no: int, text: str, names: tuple[str, ...]) -> dict[str, str]:
    found = dict(_FIELD.findall(text))
    missing = [n for n in names if n not in found]
    if missing:
        raise _bad(line_no, f"missing {', '.join(missing)}")
    return found


def _int(line_no: int, value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise _bad(line_no, f"'{value}' is not an integer") from None
    if n < 0:
        raise _bad(line_no, f"'{value}' is negative")
    return n


def _str(line_no: int, value: str) -> str:
    try:
        s = json.loads(value)
    except json.JSONDecodeError:
        s = None
    if not isinstance(s, str):
        raise _bad(line_no, f"{value} is not a quoted string")
    return s


def _float(line_no: int, value: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise _bad(line_no, f"'{value}' is not a number") from None


def _choice(line_no: int, value: str, table: dict[Any, str], what: str) -> int:
    for key, name in table.items():
        if name == value:
            return int(key)
    raise _bad(line_no, f"'{value}' is not a {what} ({', '.join(table.values())})")


def _parse_instruction(line_no: int, text: str, expected_index: int) -> Instr:
    parts = text.split()
    if len(parts) < 2 or not parts[0].isdigit() or int(parts[0]) != expected_index:
        raise _bad(line_no, f"expected instruction {expected_index} ('{expected_index} <op> ...')")
    op, rest = parts[1], " ".join(parts[2:])
    words = rest.split()

    def f(*names: str) -> dict[str, str]:
        return _fields(line_no, rest, names)

    if op == "end":
        return Instr(Op.END)
    if op == "run":
        return Instr(Op.RUN, Stream.COMPUTE, 0, _int(line_no, f("mb")["mb"]), _int(line_no, words[0] if words else ""))
    if op in ("send", "recv"):
        v = f("peer", "vstage", "payload", "mb")
        return Instr(Op.SEND if op == "send" else Op.RECV, Stream.COMM, _choice(line_no, v["payload"], PAYLOADS, "payload"),
                     _int(line_no, v["mb"]), _int(line_no, v["peer"]), _int(line_no, v["vstage"]))
    if op == "all_to_all":
        v = f("mb", "group")
        return Instr(Op.COLLECTIVE, Stream.COMM, Collective.ALL_TO_ALL, _int(line_no, v["mb"]),
                     _int(line_no, words[0] if words else ""), _choice(line_no, v["group"], GROUPS, "group"))
    if op == "grad_reduce":
        v = f("vstage", "group")
        return Instr(Op.COLLECTIVE, Stream.COMM, Collective.GRAD_REDUCE, 0, _int(line_no, v["vstage"]),
                     _choice(line_no, v["group"], GROUPS, "group"))
    if op == "wait":
        if len(words) != 2:
            raise _bad(line_no, "wait takes a stream and an instruction index")
        return Instr(Op.WAIT, Stream(_choice(line_no, words[0], STREAMS, "stream")), 0, 0, _int(line_no, words[1]))
    if op == "slot":
        v = f("on", "mb")
        return Instr(Op.SLOT, Stream.COMPUTE, 0, _int(line_no, v["mb"]), _int(line_no, words[0] if words else ""),
                     _int(line_no, v["on"]))
    if op == "defer":
        v = f("mb", "deadline")
        return Instr(Op.DEFER, Stream.COMPUTE, 0, _int(line_no, v["mb"]), _int(line_no, words[0] if words else ""),
                     _int(line_no, v["deadline"]))
    raise _bad(line_no, f"unknown instruction '{op}'")


def assemble(text: str) -> bytes:
    """The bytes of a plan's text form; the result is checked by the loader before it is returned."""
    lines = [(n, _strip_comment(line)) for n, line in enumerate(text.splitlines(), 1)]
    lines = [(n, line) for n, line in lines if line]
    pos = 0

    def take(what: str) -> tuple[int, str]:
        nonlocal pos
        if pos >= len(lines):
            raise PlanError(f"plan text ends where {what} was expected", "truncated")
        pos += 1
        return lines[pos - 1]

    n, head = take("the 'tsb' line")
    m = re.fullmatch(r"tsb version (\d+) signature ([0-9a-f]+)", head)
    if not m:
        raise _bad(n, "expected 'tsb version N signature HEX'")
    if int(m.group(1)) != FORMAT_VERSION:
        raise PlanError(f"line {n}: format version {m.group(1)} is not known (this assembler writes {FORMAT_VERSION})", "version")
    signature = bytes.fromhex(m.group(2))
    if len(signature) != SIGNATURE_BYTES:
        raise _bad(n, f"the signature must be {SIGNATURE_BYTES} bytes ({2 * SIGNATURE_BYTES} hex digits)")
    n, plan_line = take("the 'plan' line")
    if not plan_line.startswith("plan "):
        raise _bad(n, "expected the 'plan' line")
    v = _fields(n, plan_line, (*PLAN_INTS, *PLAN_STRS, "memory_budget_bytes"))
    pp, vpp, ep, tp, mbs, mbsize, seq = (_int(n, v[k]) for k in PLAN_INTS)
    dtype, model, source, hardware = (_str(n, v[k]) for k in PLAN_STRS)
    plan = PlanInfo(pp, vpp, ep, tp, mbs, mbsize, seq, dtype, model, source, hardware, _int(n, v["memory_budget_bytes"]))
    tasks: list[TaskInfo] = []
    slots: list[SlotInfo] | None = None
    programs: dict[int, list[Instr]] = {}
    while pos < len(lines):
        n, line = take("a task, slot or program")
        word = line.split()[0]
        if word == "task":
            v = _fields(n, line, ("name", "kind", "layer", "resource", "duration_us", "memory_bytes", "movable"))
            if line.split()[1] != str(len(tasks)):
                raise _bad(n, f"expected task {len(tasks)}")
            tasks.append(TaskInfo(
                _str(n, v["name"]), _str(n, v["kind"]), _str(n, v["layer"]),
                Stream(_choice(n, v["resource"], STREAMS, "resource")), v["movable"] == "true",
                _float(n, v["duration_us"]), _int(n, v["memory_bytes"]),
            ))
        elif word == "slots":
            slots = []
        elif word == "slot":
            if slots is None:
                raise _bad(n, "a slot line before the 'slots' line")
            v = _fields(n, line, ("task", "base_us", "a2a_us", "gemm_us"))
            slots.append(SlotInfo(_int(n, v["task"]), _float(n, v["base_us"]), _float(n, v["a2a_us"]), _float(n, v["gemm_us"])))
        elif word == "program":
            m = re.fullmatch(r"program (\d+) \{", line)
            if not m:
                raise _bad(n, "expected 'program RANK {'")
            code: list[Instr] = []
            while True:
                n, body = take("an instruction or '}'")
                if body == "}":
                    break
                code.append(_parse_instruction(n, body, len(code)))
            programs[int(m.group(1))] = code
        else:
            raise _bad(n, f"unknown line '{word}'")
    data = encode(PlanImage(signature, plan, tasks, slots, programs))
    decode(data)  # the same checks as any loader: a text that assembles is a plan the runtime accepts
    return data
