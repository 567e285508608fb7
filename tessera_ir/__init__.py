"""Tessera IR: the data model, its text form (printer, parser) and the verifier."""

from tessera_ir.kinds import FfnKind, LayerRole, MixerKind, Phase, Resource, TaskOp
from tessera_ir.model import Attrs, Layer, Module, PlanEntry, PlanOp, SymbolRef, Task, Value
from tessera_ir.printer import print_module

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
    "print_module",
]
