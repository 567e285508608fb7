"""The ``verify`` pass: run every verifier check and change nothing."""

from __future__ import annotations

from dataclasses import dataclass

from passes.manager import ModulePass
from tessera_ir.model import Module


@dataclass(frozen=True)
class VerifyPass(ModulePass):
    name = "verify"
    summary = "Check every IR invariant; the module is left unchanged."

    def apply(self, module: Module) -> bool:
        from tessera_ir.verifier import verify

        verify(module)
        return False
