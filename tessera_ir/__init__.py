"""Tessera IR: the data model, its text form (printer, parser) and the verifier."""

from tessera_ir.kinds import FfnKind, LayerRole, MixerKind, Phase, Resource, TaskOp
from tessera_ir.model import Attrs, Layer, Module, PlanEntry, PlanOp, SymbolRef, Task, Value
from tessera_ir.parser import parse_module
from tessera_ir.printer import print_module
from tessera_ir.verifier import collect_errors, verify

__all__ = [
    "Attrs",
    "FfnKind",
    "Layer",
    "LayerRole",
    "MixerKind",
    "Module",
    "Phase",
    "PlanEntry",
    "PlanOp",
    "Resource",
    "SymbolRef",
    "Task",
    "TaskOp",
    "Value",
    "collect_errors",
    "parse_module",
    "print_module",
    "verify",
]
