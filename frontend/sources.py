"""Turn a model source into an nn.Module on the meta device, a name, and parallel defaults.

Sources: ``hf:<model_type>`` (transformers' default config for that type),
a path to an HF ``config.json`` (or a folder holding one), a path to a
``model.py`` defining ``build_model()`` (and optionally ``PARALLEL``,
``NAME`` and ``LAYER_KINDS``), or an ``nn.Module``.

The shipped reference workloads (``frontend/workloads``) carry suggested
parallel settings: an HF config with the same model type, layer count and
hidden size as one of them starts from those settings.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from frontend.errors import ConfigFileError, MissingBuildModelError, SourceError, UnknownModelTypeError
from frontend.layer_kinds import layer_kinds_table
from tessera_ir.kinds import MixerKind

WORKLOADS_DIR = Path(__file__).resolve().parent / "workloads"
# The deepest decoder stack a config may declare. The largest published stacks hold a few
# hundred layers; transformers builds (and for a config without ``layer_types``, lists the type
# of) every layer before capture sees one, so a count of 10^9 would fill memory first.
MAX_DECODER_LAYERS = 10_000
# Sizes every config must give as a positive integer when it gives them at all: a zero or a
# negative one builds a model without layers, heads or weights, which fails later and elsewhere.
# (Not every size: some configs give 0 on purpose, head_dim = 0 for "derive it", num_experts = 0
# for a dense model.)
_POSITIVE_SIZES = ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
_KNOWN_EXAMPLES = ["qwen3_next", "qwen3_moe", "deepseek_v3", "mixtral", "gpt_oss", "olmoe", "qwen2_moe", "jamba"]


@dataclass
class LoadedSource:
    model: nn.Module
    name: str
    config: Any = None  # the HF config, when the source had one
    parallel: dict[str, Any] = field(default_factory=dict)  # parallel settings from the source
    layer_kinds: dict[int, MixerKind] = field(default_factory=dict)  # LAYER_KINDS of a model.py


def workload_configs() -> dict[str, dict[str, Any]]:
    """The shipped reference configs by workload name (file stem)."""
    return {p.stem: json.loads(p.read_text()) for p in sorted(WORKLOADS_DIR.glob("*.json")) if p.stem != "parallel"}


def suggested_parallel(config: Any) -> dict[str, Any]:
    """Suggested parallel settings of the shipped workload this HF config matches, or {}."""
    table = json.loads((WORKLOADS_DIR / "parallel.json").read_text())
    key = (getattr(config, "model_type", None), getattr(config, "num_hidden_layers", None),
           getattr(config, "hidden_size", None))
    for name, ref in workload_configs().items():
        if (ref.get("model_type"), ref.get("num_hidden_layers"), ref.get("hidden_size")) == key and name in table:
            return dict(table[name]["parallel"])
    return {}


def _build_hf(config: Any) -> nn.Module:
    from transformers import AutoModel, AutoModelForCausalLM

    # The meta device: shapes without storage, so a 671B model builds in a second.
    with torch.device("meta"):
        try:
            try:
                return AutoModelForCausalLM.from_config(config)
            except ValueError:  # no causal-LM head registered for this type: the bare model
                return AutoModel.from_config(config)
        except Exception as exc:  # noqa: BLE001 - transformers raises many types for a config it cannot build
            # torch's messages can carry its C++ stack after the first line: the first says what failed.
            lines = str(exc).strip().splitlines()
            said = lines[0][:300] if lines else ""
            raise SourceError(
                f"transformers cannot build a '{config.model_type}' model from this config "
                f"({type(exc).__name__}: {said}); fix the config fields it names") from exc


def _hf_config(model_type: str, overrides: dict[str, Any]) -> Any:
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        known = [k for k in _KNOWN_EXAMPLES if k in CONFIG_MAPPING]
        raise UnknownModelTypeError(model_type, known)
    return AutoConfig.for_model(model_type, **overrides)


def _shown(path: object) -> str:
    text = str(path)
    return text if len(text) <= 200 else text[:120] + "..." + text[-60:]


def _check_sizes(values: dict[str, Any], where: str) -> None:
    """Refuse a size in ``values`` (a config's fields) that is not a positive integer, and a
    decoder stack deeper than :data:`MAX_DECODER_LAYERS`, naming the field."""
    for name in _POSITIVE_SIZES:
        value = values.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ConfigFileError(where, f"\"{name}\" must be a positive integer, got {_spell(value)}")
    layers = values.get("num_hidden_layers")
    if isinstance(layers, int) and layers > MAX_DECODER_LAYERS:
        raise ConfigFileError(
            where, f"\"num_hidden_layers\" is {layers}, more decoder layers than Tessera plans "
            f"(at most {MAX_DECODER_LAYERS}); give the model's real layer count"
        )


def _spell(value: object) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "..."


def _config_sizes(config: Any) -> dict[str, Any]:
    return {name: getattr(config, name) for name in _POSITIVE_SIZES if hasattr(config, name)}


def _check_config(config: Any, where: str) -> None:
    """:func:`_check_sizes` on a built HF config and on its language model's config."""
    _check_sizes(_config_sizes(config), where)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    if text is not config:
        _check_sizes(_config_sizes(text), where)


def _load_config_file(path: Path) -> LoadedSource:
    file = path / "config.json" if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise ConfigFileError(str(file), "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(str(file), str(exc)) from None
    except json.JSONDecodeError as exc:
        raise ConfigFileError(str(file), f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ConfigFileError(str(file), "it has no \"model_type\" field")
    data = dict(data)
    # Before transformers reads them: it lists a type for every layer of the stack up front.
    _check_sizes(data, _shown(file))
    nested = [value for value in data.values() if isinstance(value, dict)]  # text_config, thinker_config, ...
    for _ in range(3):
        for value in nested:
            if "num_hidden_layers" in value:
                _check_sizes(value, _shown(file))
        nested = [inner for value in nested for inner in value.values() if isinstance(inner, dict)]
    model_type = data.pop("model_type")
    try:
        config = _hf_config(str(model_type), data)
    except SourceError:
        raise
    except Exception as exc:  # noqa: BLE001 - transformers' validators raise their own types; each names the field
        raise ConfigFileError(_shown(file), f"transformers rejects it: {' '.join(str(exc).split())}") from exc
    _check_config(config, _shown(file))
    return LoadedSource(_build_hf(config), str(model_type), config, suggested_parallel(config))


def _load_model_py(path: Path) -> LoadedSource:
    if not path.is_file():
        raise ConfigFileError(str(path), "no such file")
    module_name = f"_tessera_model_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigFileError(str(path), "not a loadable Python file")
    module = importlib.util.module_from_spec(spec)
    # Registered so fx and pickling can find the module's functions by name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - any error in the user's file is reported as a source error
        del sys.modules[module_name]
        raise SourceError(f"{_user_line(path, exc)}: importing it failed ({_spelled(exc)}); fix the file") from exc
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise MissingBuildModelError(str(path))
    try:
        model = build()
    except Exception as exc:  # noqa: BLE001 - the user's code failed, not Tessera: say where
        raise SourceError(
            f"{_user_line(path, exc)}: build_model() raised {_spelled(exc)}; fix the model file "
            "(--debug shows the whole traceback)"
        ) from exc
    if not isinstance(model, nn.Module):
        raise SourceError(f"{path}: build_model() returned {type(model).__name__}, not a torch.nn.Module")
    name = getattr(module, "NAME", None) or path.stem
    declared = getattr(module, "PARALLEL", None)
    if declared is None:
        declared = {}
    if not isinstance(declared, dict) or not all(isinstance(key, str) for key in declared):
        raise SourceError(
            f"{path}: PARALLEL must be a dict of settings such as {{'pp': 2, 'ep': 4}}, not a {type(declared).__name__}"
        )
    kinds = layer_kinds_table(getattr(module, "LAYER_KINDS", None), str(path))
    return LoadedSource(model, str(name), getattr(model, "config", None), dict(declared), kinds)


def _user_line(path: Path, exc: BaseException) -> str:
    """``path:line`` of the innermost frame of the user's file that the exception passed through."""
    if isinstance(exc, SyntaxError) and exc.lineno is not None and exc.filename is not None:
        if Path(exc.filename).resolve() == path.resolve():
            return f"{path}:{exc.lineno}"
    target = path.resolve()
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if Path(frame.filename).resolve() == target]
    return f"{path}:{lines[-1]}" if lines else str(path)


def _spelled(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."


def load_source(source: str | nn.Module | os.PathLike[str]) -> LoadedSource:
    if isinstance(source, nn.Module):
        # A transformers model is named by its model type, as its config.json or hf:<type> is: the
        # plan's model name and signature are then the same whichever of the three was captured.
        config = getattr(source, "config", None)
        model_type = getattr(config, "model_type", None)
        name = model_type if isinstance(model_type, str) and model_type else type(source).__name__
        return LoadedSource(source, name, config)
    text = os.fspath(source)
    if not text.startswith("hf:"):
        try:
            Path(text).stat()
        except (FileNotFoundError, NotADirectoryError):
            pass  # said below, with what the source should be
        except (OSError, ValueError) as err:  # a name too long, a loop of links, a NUL byte
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ConfigFileError(_shown(text), reason.lower()) from None
    if text.startswith("hf:"):
        config = _hf_config(text[3:], {})
        return LoadedSource(_build_hf(config), text[3:], config, suggested_parallel(config))
    path = Path(text)
    if path.suffix == ".py":
        return _load_model_py(path)
    return _load_config_file(path)
