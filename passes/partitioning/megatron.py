"""Megatron-LM's ``--pipeline-model-parallel-layout`` strings: written from a partition, and read back."""

from __future__ import annotations

import re
from collections.abc import Sequence

from passes.partitioning.ranges import PartitionError, Range


def megatron_layout(ranges: Sequence[Range]) -> str:
    """``--pipeline-model-parallel-layout`` for a partition (virtual stage order, embedding first, loss last).

    Megatron lists stages in forward order — all pp stages of chunk 0, then chunk 1, ... —
    which is our virtual-stage order (stage s on device s mod pp). A stage is spelled
    ``E`` (embedding), ``t`` per decoder layer (``t*k`` for k > 1), ``L`` (loss, with the head);
    stages are separated by ``|``; consecutive identical stages are grouped as ``(x|)*r``
    (the group carries its separator, so a run that ends the layout writes its last stage bare).
    """
    last = len(ranges) - 1
    words = []
    for s, (first, end) in enumerate(ranges):
        count = end - first + 1
        body = "t" if count == 1 else (f"t*{count}" if count > 1 else "")
        words.append(("E" if s == 0 else "") + body + ("L" if s == last else ""))
    out: list[str] = []
    i = 0
    while i < len(words):
        j = i
        while j + 1 < len(words) and words[j + 1] == words[i]:
            j += 1
        run = j - i + 1
        at_end = j == len(words) - 1
        if run == 1:
            out.append(words[i] + ("" if at_end else "|"))
        elif at_end:
            out.append(f"({words[i]}|)*{run - 1}" + words[i] if run > 2 else f"{words[i]}|{words[i]}")
        else:
            out.append(f"({words[i]}|)*{run}")
        i = j + 1
    return "".join(out)



def expand_megatron_layout(text: str) -> list[str]:
    """Expand a layout string into its stages, each a string over ``E t m L`` (commas ignored)."""
    source = text.replace(",", "")
    pos = 0

    def error(msg: str) -> PartitionError:
        return PartitionError(f"pipeline layout {text!r}: {msg} at character {pos + 1}")

    def sequence() -> str:
        nonlocal pos
        out = []
        while pos < len(source) and source[pos] != ")":
            if source[pos].isspace():
                pos += 1
                continue
            if source[pos] == "(":
                pos += 1
                inner = sequence()
                if pos >= len(source) or source[pos] != ")":
                    raise error("unclosed '('")
                pos += 1
                out.append(inner * repeat())
            elif source[pos] in "EtmL|":
                ch = source[pos]
                pos += 1
                out.append(ch * repeat())
            else:
                raise error(f"unexpected {source[pos]!r}")
        return "".join(out)

    def repeat() -> int:
        nonlocal pos
        m = re.match(r"\s*\*\s*(\d+)", source[pos:])
        if not m:
            return 1
        pos += m.end()
        return int(m.group(1))

    flat = sequence()
    if pos != len(source):
        raise error("unmatched ')'")
    return flat.split("|")


def parse_megatron_layout(text: str, num_layers: int | None = None) -> list[Range]:
    """Decoder ranges per stage of a layout string; embedding must open the first stage, loss close the last.

    Empty decoder stages are legal in Megatron but have no range in Tessera's partition; they are refused.
    """
    stages = expand_megatron_layout(text)
    ranges: list[Range] = []
    next_layer = 0
    for s, word in enumerate(stages):
        if "E" in word and (s != 0 or not word.startswith("E")):
            raise PartitionError(f"pipeline layout {text!r}: 'E' must open the first stage, found in stage {s}")
        if "L" in word and (s != len(stages) - 1 or not word.endswith("L")):
            raise PartitionError(f"pipeline layout {text!r}: 'L' must close the last stage, found in stage {s}")
        count = word.count("t")
        if count == 0:
            raise PartitionError(f"pipeline layout {text!r}: stage {s} holds no decoder layer")
        ranges.append((next_layer, next_layer + count - 1))
        next_layer += count
    if num_layers is not None and next_layer != num_layers:
        raise PartitionError(f"pipeline layout {text!r} holds {next_layer} decoder layers, the model {num_layers}")
    return ranges

