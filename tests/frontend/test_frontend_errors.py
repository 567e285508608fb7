"""Every bad input gives one clear TesseraError that says what to do."""

from __future__ import annotations

import pytest
import torch
from capture_cache import TINY
from torch import nn

from frontend import (
    ConfigFileError,
    MissingBuildModelError,
    ParallelMismatchError,
    SourceError,
    UnknownModelTypeError,
    UnrecognisedLayerError,
    capture,
)
from tessera_ir.errors import TesseraError


def test_model_py_without_build_model(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("import torch\nPARALLEL = {'pp': 2}\n")
    with pytest.raises(MissingBuildModelError, match=r"defines no build_model\(\); add `def build_model"):
        capture(str(path))


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigFileError, match="no such file"):
        capture(str(tmp_path / "nope" / "config.json"))


def test_unreadable_config_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{not json")
    with pytest.raises(ConfigFileError, match="invalid JSON at line 1"):
        capture(str(path))


def test_config_without_model_type(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 8}')
    with pytest.raises(ConfigFileError, match='no "model_type"'):
        capture(str(path))


def test_unknown_hf_model_type():
    with pytest.raises(UnknownModelTypeError, match=r"unknown Hugging Face model type 'qwen9'.*hf:qwen3_next"):
        capture("hf:qwen9")


class Odd(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = nn.Bilinear(8, 8, 8)

    def forward(self, x):
        return x + self.mix(x, x)


class OddModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.layers = nn.ModuleList(Odd() for _ in range(2))

    def forward(self, input_ids):
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x)
        return x


def test_unrecognised_layer_names_path_class_and_fix():
    with torch.device("meta"):
        model = OddModel()
    with pytest.raises(UnrecognisedLayerError) as info:
        capture(model, overrides={"seq_len": 4})
    message = str(info.value)
    assert "'layers.0.mix'" in message and "torch.nn.modules.linear.Bilinear" in message
    assert "register_recognizer" in message


@pytest.mark.parametrize(
    ("overrides", "pattern"),
    [
        ({"ep": 3}, r"--ep 3 does not divide the 8 experts of 'layers.0.moe'"),
        ({"pp": 4, "vpp": 4, "microbatches": 4}, r"--pp 4 x --vpp 4 = 16 virtual stages but the model has only 8"),
        ({"tp": 3}, r"--tp 3 does not divide the 4 attention heads of 'layers.0.mixer'"),
    ],
)
def test_parallel_settings_the_model_cannot_honour(overrides, pattern):
    with pytest.raises(ParallelMismatchError, match=pattern):
        capture(str(TINY), overrides=overrides)


def test_unknown_parallel_key_in_model_py(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(TINY.read_text().replace('PARALLEL = {"pp": 2', 'PARALLEL = {"pipeline": 2, "pp": 2'))
    with pytest.raises(ParallelMismatchError, match="unknown parallel setting"):
        capture(str(path))


def test_all_frontend_errors_are_tessera_errors():
    for cls in (ConfigFileError, MissingBuildModelError, ParallelMismatchError, UnknownModelTypeError,
                UnrecognisedLayerError):
        assert issubclass(cls, TesseraError)


def test_model_py_that_fails_to_import(tmp_path):
    path = tmp_path / "model.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(SourceError, match=r"importing it failed \(RuntimeError: boom\)"):
        capture(str(path))


def test_registering_a_recogniser_makes_the_layer_known():
    from frontend.recognizers import Block, register_recognizer, unregister_recognizer
    from tessera_ir import FfnKind

    def bilinear_mlp(module, ctx):
        if not isinstance(module, nn.Bilinear):
            return None
        fan_in = module.in1_features * module.in2_features
        return Block("ffn", FfnKind.DENSE, ctx.path, module, params=sum(p.numel() for p in module.parameters()),
                     linears=[(fan_in, module.out_features)])

    register_recognizer(bilinear_mlp, first=True)
    try:
        with torch.device("meta"):
            model = OddModel()
        module = capture(model, overrides={"seq_len": 4})
    finally:
        unregister_recognizer(bilinear_mlp)
    assert [layer.ffn for layer in module.decoder_layers()] == [FfnKind.DENSE, FfnKind.DENSE]
    assert module.task_map()["l0.dense_mlp.fwd"].flops == 2 * 4 * 8 * 64
