"""The one on-disk cache protocol: the schedule, compile, profile and calibration caches all keep
their entries through :class:`DiskCache`.

The caches live in one folder (:func:`resolve_cache_dir`: an option the caller gives, else
``$TESSERA_CACHE_DIR``, else ``~/.cache/tessera``), each in a subfolder of its own, one file
per entry, named by its key. An entry file is one header line and the body::

    // tessera-cache {"format": 1, "key": "<key>", "sha256": "<of the body>", "bytes": ..., ...}
    <body>

- **Reading** (:meth:`DiskCache.read`) trusts nothing: an entry that cannot be read, has no
  header, belongs to another key or cache format, or whose body does not match its checksum is
  ignored with a warning of the cache's own category (:meth:`DiskCache.ignore`; the cache's user
  then does the work again and overwrites the entry), never used. A cache checks what its body
  means itself and ignores it the same way. A hit refreshes the file's modification time.
- **Writing** (:meth:`DiskCache.write`) goes to a temporary file in the same folder that is then
  renamed into place (atomic on POSIX), so a reader, or a run killed at any moment, only ever
  sees whole entries. :meth:`DiskCache.put` turns a folder that cannot be written into a
  warning (the run goes on uncached); :meth:`DiskCache.write` leaves the ``OSError`` to a
  cache whose user must know.
- **Trimming** (:meth:`DiskCache.trim`, after each :meth:`DiskCache.put` when the cache has a
  cap) removes the least recently used entries until the folder fits its cap.

A key is the SHA-256 of everything the entry's value depends on, the cache's format included,
so a changed input misses instead of reusing a stale value.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

CACHE_DIR_VARIABLE = "TESSERA_CACHE_DIR"
HEADER = b"// tessera-cache "


def default_cache_dir() -> Path:
    """``$TESSERA_CACHE_DIR``, else ``~/.cache/tessera``."""
    env = os.environ.get(CACHE_DIR_VARIABLE)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "tessera"


def resolve_cache_dir(option: str | os.PathLike[str] | None) -> Path:
    """The cache folder: ``option`` when given, else :func:`default_cache_dir`."""
    return Path(option).expanduser() if option else default_cache_dir()


def digest(blob: object) -> str:
    """SHA-256 of ``blob`` as canonical JSON (sorted keys; values JSON cannot spell by ``repr``)."""
    text = json.dumps(blob, sort_keys=True, separators=(",", ":"), default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


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


@dataclass
class Entry:
    """An entry read back: its body and its header (``format``, ``key``, ``sha256``, ``bytes``,
    ``when``, ``host`` and whatever the cache added)."""

    body: bytes
    meta: dict[str, Any]


class DiskCache:
    """One cache's folder of entries (see the module docstring).

    ``warning``: the category its ignored entries and unwritable folder are reported with;
    ``redo``: what its user does instead of using an ignored entry ("compiling again");
    ``unwritable``: how to fix a folder that cannot be written. ``max_bytes`` None: no cap.
    """

    def __init__(
        self, folder: Path, *, name: str, format: int, warning: type[Warning], redo: str, unwritable: str,
        suffix: str = ".json", prefix: str = "", max_bytes: int | None = None,
    ):
        self.dir = folder
        self.name = name
        self.format = format
        self.warning = warning
        self.redo = redo
        self.unwritable = unwritable
        self.suffix = suffix
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.hits = 0
        self.ignored = 0
        self.written = 0

    def path(self, key: str) -> Path:
        return self.dir / f"{self.prefix}{key}{self.suffix}"

    def keys(self) -> list[str]:
        """The keys of the entries in the folder, sorted (none when it cannot be listed)."""
        try:
            names = sorted(p.name for p in self.dir.glob(f"{self.prefix}*{self.suffix}"))
        except OSError:
            return []
        return [n[len(self.prefix): len(n) - len(self.suffix)] for n in names]

    def read(self, key: str) -> Entry | None:
        """The entry under ``key``; None when there is none, or it was ignored with a warning."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            self.ignore(key, f"cannot be read ({err.strerror})")
            return None
        head, _, body = data.partition(b"\n")
        try:
            if not head.startswith(HEADER):
                raise ValueError("no cache header")
            meta = json.loads(head[len(HEADER):])
            if not isinstance(meta, dict):
                raise ValueError("the header is not an object")
        except (ValueError, UnicodeDecodeError) as err:
            self.ignore(key, f"is damaged ({err})")
            return None
        if meta.get("format") != self.format or meta.get("key") != key:
            self.ignore(key, "belongs to another key or cache format")
            return None
        if meta.get("sha256") != hashlib.sha256(body).hexdigest():
            self.ignore(key, "does not match its checksum")
            return None
        self.hits += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: the size cap removes it last
        return Entry(body, meta)

    def read_json(self, key: str) -> tuple[Any, dict[str, Any]] | None:
        """The entry under ``key`` with its body parsed as JSON (a body that is not is ignored)."""
        entry = self.read(key)
        if entry is None:
            return None
        try:
            return json.loads(entry.body), entry.meta
        except (ValueError, UnicodeDecodeError) as err:
            self.hits -= 1
            self.ignore(key, f"is damaged ({err})")
            return None

    def ignore(self, key: str, why: str) -> None:
        """Warn that the entry under ``key`` is not used (``why``); the caller does the work again."""
        self.ignored += 1
        warnings.warn(
            f"{self.name} entry {self.path(key)} {why}; ignoring it and {self.redo}", self.warning, stacklevel=3
        )

    def write(self, key: str, body: str | bytes, meta: dict[str, Any] | None = None) -> Path:
        """Write the entry under ``key`` (to a temporary file renamed into place); ``meta`` adds
        fields to its header. Raises ``OSError`` when the folder cannot be written."""
        data = body.encode() if isinstance(body, str) else body
        header = {
            **(meta or {}),
            "format": self.format,
            "key": key,
            "sha256": hashlib.sha256(data).hexdigest(),
            "bytes": len(data),
            "when": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
        }
        self.dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.dir)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(HEADER + json.dumps(header, separators=(",", ":"), sort_keys=True).encode() + b"\n" + data)
            path = self.path(key)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.written += 1
        return path

    def put(self, key: str, body: str | bytes, meta: dict[str, Any] | None = None, trim: bool = True) -> bool:
        """:meth:`write`, then (``trim``) :meth:`trim`; a folder that cannot be written is a warning.
        Whether the entry was written. (A cache writing many entries at once trims once, after them.)"""
        try:
            self.write(key, body, meta)
        except OSError as err:
            self.warn_unwritable(err)
            return False
        if trim:
            self.trim()
        return True

    def warn_unwritable(self, error: OSError) -> None:
        """Warn that an entry could not be written (``error``); the run goes on without it."""
        warnings.warn(f"cannot write the {self.name} in {self.dir}: {error}; {self.unwritable}", self.warning, stacklevel=4)

    def trim(self) -> int:
        """Remove the least recently used entries until the folder fits ``max_bytes``; how many went."""
        if self.max_bytes is None:
            return 0
        return trim_least_recent(self.dir, f"{self.prefix}*{self.suffix}", self.max_bytes)
