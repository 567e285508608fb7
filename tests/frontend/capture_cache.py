"""Captures cached per test session: building HF models costs seconds, so each is built once."""

from __future__ import annotations

from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_qwen3_next.py"


@cache
def captured(source: str, **overrides: object):
    from frontend import capture

    return capture(source, overrides=dict(overrides) or None)


@cache
def tiny_example():
    """``examples/tiny_qwen3_next.py`` imported by path (the examples folder is not a package)."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("tiny_qwen3_next_example", TINY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@cache
def hf_model(model_type: str):
    """The transformers model itself, built independently of the frontend, on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
