"""On-disk cache of measured pair costs, with provenance.

A measurement is valid for one pair *signature* (the kinds, shapes, work and
stream order of its tasks, after scaling), one device, and one set of software
versions (torch, tessera, the executor). The key is a SHA-256 over all of
them, so changing any of them misses the cache instead of reusing a stale
figure.

Layout: ``<cache dir>/profiles/<key>.json``, one file per measurement. The
cache directory is the ``cache-dir`` pass option, else ``$TESSERA_CACHE_DIR``,
else ``~/.cache/tessera``.

Each entry is written to a temporary file in the same directory and renamed
into place (``os.replace`` is atomic on POSIX), so a profiling run killed at
any moment leaves only complete entries; a rerun finds them and measures only
what is missing. Unreadable entries (e.g. damaged by hand) count as misses and
are overwritten.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import socket
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from tessera_ir.errors import TesseraError

CACHE_FORMAT = 1


class ProfileCacheError(TesseraError):
    """A profile cache that cannot be read or written."""


def default_cache_dir() -> Path:
    env = os.environ.get("TESSERA_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tessera"


def resolve_cache_dir(option: str | None) -> Path:
    return Path(option).expanduser() if option else default_cache_dir()


def trim_least_recent(folder: Path, pattern: str, max_bytes: int) -> int:
    """Remove the least recently used files of ``folder`` matching ``pattern`` (by modification
    time, which a cache hit refreshes) until they total at most ``max_bytes``; how many went."""
    try:
        files = [(p.stat(), p) for p in folder.glob(pattern)]
    except OSError:
        return 0
    total = sum(st.st_size for st, _ in files)
    removed = 0
    for st, p in sorted(files, key=lambda f: (f[0].st_mtime, f[1].name)):
        if total <= max_bytes:
            break
        try:
            p.unlink()
        except OSError:
            continue
        total -= st.st_size
        removed += 1
    return removed


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
    blob = json.dumps(
        {"format": CACHE_FORMAT, "signature": signature, "device": device, "versions": versions},
        sort_keys=True, separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


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
        self.root = Path(root).expanduser() if root is not None else default_cache_dir()
        self.dir = self.root / "profiles"

    def path(self, key: str) -> Path:
        return self.dir / f"{key}.json"

    def get(self, key: str) -> CacheEntry | None:
        path = self.path(key)
        try:
            data = json.loads(path.read_text())
            entry = CacheEntry(**data)
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError, TypeError):
            return None  # damaged entry: measure again and overwrite it
        return entry if entry.key == key else None

    def put(self, entry: CacheEntry) -> Path:
        if not entry.when:
            entry.when = datetime.now(timezone.utc).isoformat(timespec="seconds")
        if not entry.host:
            entry.host = socket.gethostname()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{entry.key[:16]}.", suffix=".tmp", dir=self.dir)
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(entry), f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path(entry.key))
        except OSError as err:
            raise ProfileCacheError(
                f"cannot write the profile cache entry in {self.dir}: {err}; pick a writable directory "
                "with the profile pass's cache-dir option or TESSERA_CACHE_DIR"
            ) from err
        return self.path(entry.key)

    def entries(self) -> list[CacheEntry]:
        out = []
        if self.dir.is_dir():
            for p in sorted(self.dir.glob("*.json")):
                e = self.get(p.stem)
                if e is not None:
                    out.append(e)
        return out
