"""The Tessera frontend: torch.fx capture of a model into the Tessera IR.

``capture(source, parallel=None, overrides=None, name=None)`` is the entry point;
``frontend.recognizers.register_recognizer`` teaches it new layer structures.
"""

from frontend.capture import capture
from frontend.errors import (
    CaptureError,
    ConfigFileError,
    FrontendError,
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
    "ConfigFileError",
    "FrontendError",
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
