"""Errors raised by the IR: every one says what is wrong, where, and how to fix it."""

from __future__ import annotations


class TesseraError(Exception):
    """Base class of every error Tessera reports to a user (the CLIs print these without a traceback)."""


class IRError(TesseraError):
    """An error tied to a place in IR text (line and column, 1-based) or to an IR entity."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None, source: str | None = None):
        self.message = message
        self.line = line
        self.column = column
        self.source = source
        super().__init__(self.__str__())

    def __str__(self) -> str:
        where = ""
        if self.line is not None:
            where = f"{self.source or '<ir>'}:{self.line}:{self.column or 1}: "
        return f"{where}{self.message}"


class ParseError(IRError):
    """Malformed IR text."""


class VerifyError(IRError):
    """An IR that breaks an invariant. ``check`` names the verifier check that failed."""

    def __init__(self, check: str, message: str, line: int | None = None, column: int | None = None, source: str | None = None):
        self.check = check
        super().__init__(f"[{check}] {message}", line, column, source)
