"""Errors the frontend reports: each says what is wrong, where, and how to fix it."""

from __future__ import annotations

from tessera_ir.errors import TesseraError


class FrontendError(TesseraError):
    """Base class of every capture error."""


class SourceError(FrontendError):
    """The model source (``hf:<type>``, a config.json or a model.py) cannot be loaded."""


class MissingBuildModelError(SourceError):
    def __init__(self, path: str):
        super().__init__(
            f"{path}: defines no build_model(); add `def build_model() -> torch.nn.Module:` returning the model "
            f"(build it under `with torch.device('meta'):` to avoid allocating weights)"
        )


class ConfigFileError(SourceError):
    def __init__(self, path: str, reason: str):
        super().__init__(f"{path}: cannot read the model config ({reason}); pass a readable HF config.json, "
                         f"a model.py defining build_model(), or hf:<model_type>")


class UnknownModelTypeError(SourceError):
    def __init__(self, model_type: str, known: list[str]):
        examples = ", ".join(f"hf:{k}" for k in known)
        super().__init__(f"unknown Hugging Face model type '{model_type}'; known types include {examples}")


class UnrecognisedLayerError(FrontendError):
    def __init__(self, path: str, class_name: str, detail: str = "", layer: int | None = None):
        self.path, self.class_name, self.detail = path, class_name, detail
        extra = f" ({detail})" if detail else ""
        override = (f", or, if it is a mixer, set its kind with --layer-kind {layer}=KIND (LAYER_KINDS in model.py)"
                    if layer is not None else "")
        super().__init__(
            f"unrecognised layer '{path}' of class {class_name}{extra}; teach the frontend its structure with "
            f"frontend.recognizers.register_recognizer(fn) where fn(module, ctx) returns a Block or None{override}"
        )


class LayerKindError(FrontendError):
    """A layer-kind override (--layer-kind, LAYER_KINDS) that cannot be applied."""


class CaptureError(FrontendError):
    """The model traced, but its graph does not have the shape of a decoder stack."""


class ParallelMismatchError(FrontendError):
    """Parallel settings that the captured model cannot honour."""


class CaptureWarning(UserWarning):
    """Capture went on with a best guess, or found the model's config contradicting what a block does.

    Each warning is one line naming the layer, the module and both answers, and how to override.
    """
