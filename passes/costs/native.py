"""Loading the compiler's C++ extensions, or another build of one named by an environment variable.

``make test`` runs the tests of the pair-schedule search and of the contention model once more
against builds made with AddressSanitizer and UndefinedBehaviorSanitizer; the variable names
such a build (``TESSERA_SEARCH_EXTENSION``, ``TESSERA_RETIME_EXTENSION``). Without it, the
package's own build is imported. It sits in ``passes.costs`` because the scheduling package,
which loads the pair search with it, already builds on the costs package, never the reverse.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType


def load_extension(module: str, variable: str) -> ModuleType:
    """The extension ``module`` (``passes.costs._retime``), or the build ``$variable`` names."""
    override = os.environ.get(variable)
    if not override:
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(module, override)
    if spec is None or spec.loader is None:
        raise ImportError(f"{variable}={override} is not a loadable extension module")
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded
