"""The placement settings change only a captured module's header: the compile cache relies on it
(one capture serves every value of them, tessera/compile_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

import frontend
from tessera_ir import print_module
from tessera_ir.parallel import PLACEMENT_SETTINGS

# One changed value per placement setting; a new setting needs one here too.
CHANGED = {"pp": 2, "vpp": 2, "microbatches": 64, "dp": 4, "distributed_optimizer": False}


def test_each_placement_setting_moves_only_the_header(tmp_path: Path) -> None:
    assert set(CHANGED) == set(PLACEMENT_SETTINGS)
    config = tmp_path / "config.json"
    config.write_text(json.dumps({
        "model_type": "qwen3_next", "hidden_size": 256, "num_hidden_layers": 4, "full_attention_interval": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "linear_num_key_heads": 4,
        "linear_num_value_heads": 4, "linear_key_head_dim": 32, "linear_value_head_dim": 32,
        "intermediate_size": 512, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 128,
        "num_experts": 8, "num_experts_per_tok": 2, "vocab_size": 1024,
    }))
    base = frontend.capture(str(config), overrides={"ep": 2, "seq_len": 512})
    head, body = print_module(base).split("\n", 1)
    for name, value in CHANGED.items():
        changed = frontend.capture(str(config), overrides={"ep": 2, "seq_len": 512, name: value})
        other_head, other_body = print_module(changed).split("\n", 1)
        assert other_body == body, f"{name} = {value} changed the captured layers"
        assert other_head != head and changed.attrs[name] == value
        assert {k: v for k, v in changed.attrs.items() if k != name} == {k: v for k, v in base.attrs.items() if k != name}
