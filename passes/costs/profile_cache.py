"""On-disk cache of measured pair costs, with provenance.

A measurement is valid for one pair *signature* (the kinds, shapes, work and
stream order of its tasks, after scaling), one device, and one set of software
versions (torch, tessera, the executor). The key is a SHA-256 over all of
them, so changing any of them misses the cache instead of reusing a stale
figure.

Layout: ``<cache dir>/profiles/<key>.json``, one file per measurement, under the one cache
protocol (``support.disk_cache``). The cache directory is the ``cache-dir`` pass option, else
``$TESSERA_CACHE_DIR``, else ``~/.cache/tessera``.

Each entry is written to a temporary file in the same directory and renamed into place, so a
profiling run killed at any moment leaves only complete entries; a rerun finds them and
measures only what is missing. An entry that cannot be read, names another key or fails its
checksum (damaged by hand, say) is ignored with a :class:`ProfileCacheWarning` and measured
again. A folder that cannot be written is an error (:class:`ProfileCacheError`): measurements
are expensive, and a run that could not keep them should say so before it ends.
"""

from __future__ import annotations

import functools
import json
import socket
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from support.disk_cache import DiskCache, digest, resolve_cache_dir
from tessera_ir.errors import TesseraError

CACHE_FORMAT = 2  # 2: entries under the one cache protocol (support.disk_cache)


class ProfileCacheError(TesseraError):
    """A profile cache that cannot be written."""


class ProfileCacheWarning(UserWarning):
    """A profile cache entry that was ignored (damaged, foreign)."""


@functools.cache
def tessera_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("tessera")
    except metadata.PackageNotFoundError:
        # Running from a source tree that was not installed: read the version
        # the project declares, so the cache key still follows releases.
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        try:
            for line in pyproject.read_text().splitlines():
                if line.startswith("version"):
                    return line.split("=", 1)[1].strip().strip('"') + "+src"
        except OSError:
            pass
        return "unknown"


def software_versions() -> dict[str, str]:
    import torch

    from runtime.pair_executor import EXECUTOR_VERSION

    return {"torch": torch.__version__, "tessera": tessera_version(), "executor": str(EXECUTOR_VERSION)}


def cache_key(signature: object, device: str, versions: dict[str, str]) -> str:
    return digest({"format": CACHE_FORMAT, "signature": signature, "device": device, "versions": versions})


@dataclass
class CacheEntry:
    key: str
    measured_us: float  # median over repeats, at the executed (scaled) size
    samples_us: list[float]
    spread_us: float
    repeats: int
    device: str
    versions: dict[str, str]
    signature: object
    method: str  # how it was measured
    min_us: float = 0.0  # fastest repeat, at the executed size
    when: str = ""  # ISO 8601, UTC
    host: str = ""
    extra: dict[str, object] = field(default_factory=dict)


class ProfileCache:
    def __init__(self, root: Path | str | None = None):
        self.root = resolve_cache_dir(root)
        self.disk = DiskCache(
            self.root / "profiles", name="profile cache", format=CACHE_FORMAT, warning=ProfileCacheWarning,
            redo="measuring the pair again", unwritable="",
        )
        self.dir = self.disk.dir

    def path(self, key: str) -> Path:
        return self.disk.path(key)

    def get(self, key: str) -> CacheEntry | None:
        found = self.disk.read_json(key)
        if found is None:
            return None
        data, _ = found
        try:
            entry = CacheEntry(**data)
        except TypeError as err:  # not an object, or not a measurement's fields
            self.disk.ignore(key, f"is damaged ({err})")
            return None
        if entry.key != key:
            self.disk.ignore(key, "belongs to another key or cache format")
            return None
        return entry

    def put(self, entry: CacheEntry) -> Path:
        if not entry.when:
            entry.when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if not entry.host:
            entry.host = socket.gethostname()
        try:
            path = self.disk.write(entry.key, json.dumps(asdict(entry), indent=1, sort_keys=True))
        except OSError as err:
            raise ProfileCacheError(
                f"cannot write the profile cache entry in {self.dir}: {err}; pick a writable directory "
                "with the profile pass's cache-dir option or TESSERA_CACHE_DIR"
            ) from err
        return path

    def entries(self) -> list[CacheEntry]:
        return [e for e in (self.get(key) for key in self.disk.keys()) if e is not None]
