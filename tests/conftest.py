"""Test-wide settings: caches live in a fresh folder per test session, never in the user's home."""

from __future__ import annotations

import os
import tempfile

# Set at import, before any test (or a forked worker) reads it; a test that wants its own cache
# folder still sets TESSERA_CACHE_DIR or passes cache-dir.
os.environ.setdefault("TESSERA_CACHE_DIR", tempfile.mkdtemp(prefix="tessera-test-cache-"))
