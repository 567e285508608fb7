"""The Tessera frontend: torch.fx capture of a model into the Tessera IR.

``capture(source, parallel=None, overrides=None, name=None, layer_kinds=None)`` is the entry
point; ``frontend.recognizers.register_recognizer`` teaches it new layer structures, and
``layer_kinds`` (or ``--layer-kind``, ``LAYER_KINDS``) sets a layer's mixer kind outright.
"""

from frontend.capture import capture
from frontend.errors import (
    CaptureError,
    CaptureWarning,
    ConfigFileError,
    FrontendError,
    LayerKindError,
    MissingBuildModelError,
    ParallelMismatchError,
    SourceError,
    UnknownModelTypeError,
    UnrecognisedLayerError,
)
from frontend.recognizers import Block, RecognizeContext, register_recognizer
from frontend.sources import WORKLOADS_DIR, suggested_parallel, workload_configs

__all__ = [
    "Block",
    "CaptureError",
    "CaptureWarning",
    "ConfigFileError",
    "FrontendError",
    "LayerKindError",
    "MissingBuildModelError",
    "ParallelMismatchError",
    "RecognizeContext",
    "SourceError",
    "UnknownModelTypeError",
    "UnrecognisedLayerError",
    "WORKLOADS_DIR",
    "capture",
    "register_recognizer",
    "suggested_parallel",
    "workload_configs",
]
