"""Loading a C++ extension module, or another build of it that an environment variable names.

``make test`` runs the tests of the runtime, the pair-schedule search and the contention model
once more against builds made with AddressSanitizer and UndefinedBehaviorSanitizer; a variable
(``TESSERA_RUNTIME_EXTENSION``, ``TESSERA_SEARCH_EXTENSION``, ``TESSERA_RETIME_EXTENSION``) names
such a build. Without it, the package's own build is imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType


def load_extension(module: str, variable: str) -> ModuleType:
    """The extension ``module`` (``runtime._core``), or the build the variable ``variable`` names."""
    override = os.environ.get(variable)
    if not override:
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(module, override)
    if spec is None or spec.loader is None:
        raise ImportError(f"{variable}={override} is not a loadable extension module")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
