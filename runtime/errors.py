"""The one error a plan loader raises: ``PlanError``, with a stable reason code.

The C++ loader raises this same class (the extension looks it up here), so a
trainer catches one type whichever interpreter it uses, and the differential
tests compare the ``reason`` codes of both loaders on the same bytes.
"""

from __future__ import annotations

# Every reason a loader can give, in the order the checks run (docs/bytecode.md).
REASONS = (
    "unreadable",  # the file could not be read at all
    "truncated",  # shorter than the header, or than the size the header gives
    "trailing-data",  # longer than the size the header gives
    "bad-magic",  # not a Tessera plan
    "version",  # a format version this runtime does not read
    "checksum",  # the bytes changed after the plan was written
    "flags",  # flag bits this runtime does not know
    "section-table",  # the section table does not fit in the file
    "section-kind",  # an unknown section kind or a non-zero reserved field
    "section-bounds",  # a section outside the file, misaligned or overlapping another
    "section-duplicate",  # a section that must be unique appears twice
    "section-missing",  # a required section is absent
    "section-size",  # a section's size does not match the records it announces
    "plan",  # the parallel settings are not a plan (zero sizes, ...)
    "string",  # a string reference out of range, or bytes that are not UTF-8
    "task",  # a task record with an illegal field
    "slot",  # a DBO slot record with an illegal field
    "program",  # the PROGRAM sections do not match the pipeline ranks
    "rank",  # the requested rank has no program
    "instruction",  # an instruction with an unknown opcode or an operand out of range
    "signature",  # the plan was compiled for another model or other settings
)


class PlanError(ValueError):
    """A plan file the runtime refuses; ``reason`` is one of ``REASONS``."""

    def __init__(self, message: str, reason: str = "plan"):
        super().__init__(message)
        self.reason = reason
