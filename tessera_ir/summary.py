"""A JSON-ready summary of a module: per decoder layer kinds, FLOPs and task counts."""

from __future__ import annotations

from collections import Counter
from typing import Any

from tessera_ir.kinds import Phase
from tessera_ir.model import Module


def summarize(module: Module) -> dict[str, Any]:
    """``{"model", "parameters", "layers": [...], "tasks", "warnings"}``.

    Each entry of ``layers`` is a decoder layer: its index, mixer and ffn
    kinds, forward FLOPs (fwd tasks), backward FLOPs (dgrad + wgrad tasks) and
    its task count per kind (``op.phase``); a layer whose mixer kind was set by
    an override or is a best guess also carries ``mixer_source`` (``override``,
    ``structure``), one that runs several mixers side by side lists them all in
    ``mixers`` (``mixer`` is the first), and one the frontend warned about carries
    its ``warnings``.
    ``tasks`` counts every task of the module, embedding and head included;
    ``warnings`` lists the warnings of all layers.
    """
    layers: list[dict[str, Any]] = []
    warnings: list[str] = []
    for layer in module.decoder_layers():
        forward = sum(t.flops for t in layer.tasks if t.phase is Phase.FWD)
        backward = sum(t.flops for t in layer.tasks if t.phase is not Phase.FWD)
        kinds = Counter(t.kind for t in layer.tasks)
        layers.append(
            {
                "index": layer.index,
                "mixer": layer.mixer.value,
                "ffn": layer.ffn.value,
                "forward_flops": forward,
                "backward_flops": backward,
                "tasks": dict(sorted(kinds.items())),
            }
        )
        parallel = layer.attrs.get("mixers")
        if isinstance(parallel, list) and len(parallel) > 1:
            # Mixers run side by side in one layer (Falcon-H1's attention beside its Mamba): one
            # mixer task carries them all and the header names the first, so name each here.
            layers[-1]["mixers"] = [str(kind) for kind in parallel]
        if "mixer_source" in layer.attrs:
            layers[-1]["mixer_source"] = str(layer.attrs["mixer_source"])
        attr = layer.attrs.get("mixer_warnings")
        notes = [str(note) for note in attr] if isinstance(attr, list) else []
        if notes:
            layers[-1]["warnings"] = notes
            warnings.extend(notes)
    return {
        "model": module.attrs.get("model", module.name),
        "parameters": int(module.attrs.get("parameters", 0)),  # type: ignore[arg-type]
        "layers": layers,
        "tasks": sum(1 for _ in module.tasks()),
        "warnings": warnings,
    }
