"""Captures cached per test session: building HF models costs seconds, so each is built once."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from tiny_plan import tiny_example  # noqa: F401 - re-exported for the frontend tests

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny_qwen3_next.py"


@cache
def captured(source: str, **overrides: object):
    from frontend import capture

    return capture(source, overrides=dict(overrides) or None)


@cache
def hf_model(model_type: str):
    """The transformers model itself, built independently of the frontend, on meta."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type)
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)
