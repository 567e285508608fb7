"""Test-wide settings: caches live in a fresh folder per test session, never in the user's home."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

# Set at import, before any test (or a forked worker) reads it; a test that wants its own cache
# folder still sets TESSERA_CACHE_DIR or passes cache-dir. Removed when the session ends
# (forked workers leave through os._exit, which skips this).
if "TESSERA_CACHE_DIR" not in os.environ:
    _folder = tempfile.mkdtemp(prefix="tessera-test-cache-")
    os.environ["TESSERA_CACHE_DIR"] = _folder
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
