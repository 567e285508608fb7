"""tessera_ir.summary on a captured module."""

from __future__ import annotations

import json

from capture_cache import TINY, captured

from tessera_ir.kinds import Phase
from tessera_ir.summary import summarize


def test_summary_shape_and_totals():
    module = captured(str(TINY))
    summary = summarize(module)
    assert list(summary) == ["model", "parameters", "layers", "tasks", "warnings"]
    assert summary["warnings"] == []
    assert summary["model"] == "tiny_qwen3_next"
    assert summary["parameters"] == module.attrs["parameters"]
    assert summary["tasks"] == sum(len(layer.tasks) for layer in module.layers)
    assert len(summary["layers"]) == 8
    first = summary["layers"][0]
    assert list(first) == ["index", "mixer", "ffn", "forward_flops", "backward_flops", "tasks"]
    assert (first["index"], first["mixer"], first["ffn"]) == (0, "linear_attention", "moe")
    assert first["tasks"]["dispatch.fwd"] == 1 and first["tasks"]["router.wgrad"] == 1
    assert "dispatch.wgrad" not in first["tasks"]
    layer = module.decoder_layers()[0]
    assert first["forward_flops"] == sum(t.flops for t in layer.tasks if t.phase is Phase.FWD)
    assert first["backward_flops"] == sum(t.flops for t in layer.tasks if t.phase is not Phase.FWD)
    assert first["backward_flops"] > first["forward_flops"]
    json.dumps(summary)  # JSON-ready
