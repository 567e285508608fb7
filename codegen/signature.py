"""The plan signature: which model, parallel settings and cost source a plan was compiled for.

A trainer recomputes it from the model it is about to train (capture the
model, call ``plan_signature``) and passes it to ``runtime.load_plan``, which
refuses a plan whose signature differs. What goes in (docs/bytecode.md, "Plan
signature"), as canonical JSON hashed with SHA-256:

- the model IR without plan ops: the module name; per layer in order its name,
  role, source path, mixer, ffn and decoder index; per task its name, kind,
  resource, dependencies, flops, bytes, param_bytes, act_bytes, shapes and
  movable flag. Attributes that passes attach (costs, schedules) are left out,
  so planning a model does not change its signature;
- the parallel settings: pp, vpp, ep, tp, microbatches, micro_batch_size,
  seq_len, dtype;
- the cost source: the profile mode (analytic, measured, cache-only, or none)
  and the hardware the costs are for.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from tessera_ir.model import Module
from tessera_ir.parallel import ParallelConfig

SIGNATURE_VERSION = 1


def _enum(value: Any) -> Any:
    return getattr(value, "value", value)


def cost_source(module: Module) -> tuple[str, str]:
    """(profile mode, hardware) the plan's costs came from: the hardware the profile priced pairs
    on (``profile_hardware``: the calibrated ``cpu`` after a measured profile on CPU), else the
    target (``hardware``)."""
    mode = str(module.attrs.get("profile_mode", "none"))
    hardware = str(module.attrs.get("profile_hardware", module.attrs.get("hardware", "none")))
    return mode, hardware


def signature_payload(module: Module) -> dict[str, Any]:
    """Everything the signature covers, as plain data (what a mismatch report can compare)."""
    layers = [
        {
            "name": layer.name,
            "role": _enum(layer.role),
            "path": layer.path,
            "mixer": _enum(layer.mixer),
            "ffn": _enum(layer.ffn),
            "index": layer.index,
            "tasks": [
                [t.name, t.kind, _enum(t.resource), list(t.deps), t.flops, t.bytes, t.param_bytes, t.act_bytes,
                 t.shapes, t.movable]
                for t in layer.tasks
            ],
        }
        for layer in module.layers
    ]
    mode, hardware = cost_source(module)
    return {
        "version": SIGNATURE_VERSION,
        "module": module.name,
        "layers": layers,
        "parallel": ParallelConfig.from_attrs(module.attrs).to_attrs(),
        "cost_source": {"mode": mode, "hardware": hardware},
    }


def plan_signature(module: Module) -> bytes:
    """The 32-byte SHA-256 signature a plan of ``module`` carries."""
    text = json.dumps(signature_payload(module), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).digest()
