"""Model sources and the precedence of parallel settings."""

from __future__ import annotations

import torch
from capture_cache import TINY, captured, tiny_example

from frontend import capture, suggested_parallel
from tessera_ir import print_module
from tessera_ir.parallel import ParallelConfig


def test_overrides_beat_model_py_parallel_and_none_is_ignored():
    module = captured(str(TINY), pp=4, ep=None)
    assert module.attrs["pp"] == 4
    assert module.attrs["ep"] == tiny_example().PARALLEL["ep"]


def test_explicit_parallel_config_replaces_model_py_settings():
    module = capture(str(TINY), parallel=ParallelConfig(seq_len=32), overrides={"ep": 4})
    assert (module.attrs["pp"], module.attrs["ep"], module.attrs["seq_len"]) == (1, 4, 32)


def test_meta_and_real_weights_capture_identically():
    tiny = tiny_example()
    real = tiny.build_model()
    with torch.device("meta"):
        meta = tiny.TinyQwen3Next(tiny.TinyConfig())
    overrides = dict(tiny.PARALLEL)
    assert print_module(capture(real, overrides=overrides, name="t")) == print_module(
        capture(meta, overrides=overrides, name="t"))


def test_config_folder_and_file_are_the_same_source(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "mixtral", "num_hidden_layers": 2, "hidden_size": 256, '
                                          '"intermediate_size": 512, "num_attention_heads": 4, '
                                          '"num_key_value_heads": 2, "vocab_size": 100}')
    from_dir = capture(str(tmp_path), overrides={"seq_len": 16})
    from_file = capture(str(tmp_path / "config.json"), overrides={"seq_len": 16})
    assert print_module(from_dir) == print_module(from_file)
    assert len(from_dir.decoder_layers()) == 2 and from_dir.attrs["hidden_size"] == 256


def test_only_matching_workloads_suggest_settings():
    class Config:
        model_type, num_hidden_layers, hidden_size = "qwen3_moe", 48, 2048

    assert suggested_parallel(Config())["ep"] == 4  # the Megatron-Bridge recipe's TP4 PP2 EP4
    Config.num_hidden_layers = 47
    assert suggested_parallel(Config()) == {}
