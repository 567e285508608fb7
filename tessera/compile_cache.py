"""On-disk caches of whole compiles: the captured IR of a model, and the planned IR of a pipeline.

Three layers, beside the schedule and profile caches (same folder, the one cache protocol of
``support.disk_cache``: an entry names its key and checksum, is written to a temporary file and
renamed into place, and one that cannot be read, names another key or fails its checksum is
ignored with a :class:`CompileCacheWarning`):

- ``captures/<key>.tir``: the IR ``capture`` makes of a model source, keyed by what capture
  reads: for ``hf:<model_type>`` the type (its default config comes from the installed
  transformers); for a config file its bytes; the parallel settings and layer kinds given
  (but not the placement settings, ``tessera_ir.parallel.PLACEMENT_SETTINGS``, which change
  only the module header: the entry's header holds the values the source itself suggests, and
  a hit gets the values asked for set on it and checked as capture checks them, so one entry
  serves no ``--pp``, ``--pp 4`` and ``--pp 8``);
  the versions of torch and transformers (read from the installed packages' metadata, so
  neither is imported to make the key); and the digest of Tessera's own sources
  (:func:`source_digest`, the shipped workload settings included). A ``model.py`` is never
  cached: it may import other files, read data or depend on anything in its environment,
  so its own bytes are not a complete key. The warnings capture gave are kept with the IR
  and given again on a hit.
- ``plans/<key>.tir``: the IR after the whole pass pipeline, keyed by the capture key, the
  target hardware (its name and every field of its description, so an edited hardware file
  or a new CPU calibration misses), the run-wide settings given (``tessera_ir.run_settings``),
  every pass with every option (its spelling), whether the
  verifier ran between passes, the versions of the solvers the passes use, the source digest
  and the pair search's version as built. Only pipelines whose passes are pure functions of the IR and those inputs are
  cached (:func:`pipeline_cacheable`): a pass that reads a training run's ledger, pairs
  measured on this machine, or a wall-clock limited MILP schedule is always run.

- ``outputs/<key>.bin``: what a compile renders from a cached plan (the bytecode, the summary
  and partition JSON, the report, the capacity report with its simulated iterations), each
  keyed by the plan's key, the artefact's name and every option it depends on (the routing
  model and its trace file's bytes, the iterations, which files were asked for). These are
  pure functions of the planned text and those options, so a hit is byte for byte what
  rendering it again would give; entries are written only once the planned module verified.

A hit replaces capture and the passes: the output is the cached text, byte for byte what the
passes printed when the entry was made (they verified it then), and the module is parsed from
it only when something else needs it (an artefact not in ``outputs/``). The checksum makes a
damaged entry a miss, never a wrong plan. Every folder is capped (``max_bytes``): after a
write, least recently used entries go first (a hit refreshes an entry's modification time).
``tessera-compile --no-cache`` reads and writes none of them.
"""

from __future__ import annotations

import functools
import hashlib
import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from passes.costs.profile_cache import tessera_version
from passes.manager import ModulePass
from support.disk_cache import DiskCache, digest, resolve_cache_dir
from tessera_ir.parallel import PLACEMENT_SETTINGS

CACHE_FORMAT = 2  # 2: entries under the one cache protocol (support.disk_cache)
DEFAULT_MAX_BYTES = 1024 * 2**20

# Tessera's packages: every file that can change what a compile produces.
_PACKAGES = ("support", "frontend", "tessera_ir", "passes", "codegen", "runtime", "tessera")
_SOURCE_SUFFIXES = (".py", ".pyi", ".lark", ".json", ".cpp", ".h")
# Third-party packages whose answers enter the IR (the model's config and modules, the
# solvers); missing ones are recorded as absent.
_CAPTURE_PACKAGES = ("torch", "transformers")
_PASS_PACKAGES = ("z3-solver", "pulp", "highspy", "ortools", "numpy")


class CompileCacheWarning(UserWarning):
    """A compile cache entry that was ignored (damaged, foreign) or a cache that cannot be written."""


@functools.cache
def source_digest() -> str:
    """SHA-256 of every source file of Tessera's packages (path and bytes, in path order)."""
    root = Path(__file__).resolve().parents[1]
    hasher = hashlib.sha256()
    for package in _PACKAGES:
        for folder, dirs, files in os.walk(root / package):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for name in sorted(files):
                if name.endswith(_SOURCE_SUFFIXES):
                    path = Path(folder) / name
                    hasher.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return hasher.hexdigest()


def package_versions(names: Iterable[str]) -> dict[str, str | None]:
    """Installed versions from the packages' metadata (nothing is imported)."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def capture_key(
    source: object, overrides: dict[str, Any], layer_kinds: Sequence[str], placement_blind: bool = False
) -> str | None:
    """The key of capturing ``source`` with these settings, or None when it is not cacheable
    (a model.py, an ``nn.Module``, a config file that cannot be read: capture reports that).

    ``placement_blind``: the key of the ``captures/`` entry, without the placement settings
    (``PLACEMENT_SETTINGS``: they change only the module header), so that one capture serves
    every value of them; the entry holds the header the source itself suggests and the compile
    sets the values given on it. Without it, the key of exactly this capture, which the planned
    IR's key builds on."""
    if not isinstance(source, (str, os.PathLike)):
        return None
    text = os.fspath(source)
    what: dict[str, Any]
    if text.startswith("hf:"):
        what = {"hf": text[3:]}
    else:
        path = Path(text)
        if path.suffix == ".py":
            return None
        file = path / "config.json" if path.is_dir() else path
        try:
            what = {"config": hashlib.sha256(file.read_bytes()).hexdigest()}
        except OSError:
            return None
    return digest(
        {
            "format": CACHE_FORMAT,
            "tessera": tessera_version(),
            "sources": source_digest(),
            "versions": package_versions(_CAPTURE_PACKAGES),
            "source": what,
            "parallel": {
                k: v for k, v in sorted(overrides.items())
                if v is not None and not (placement_blind and k in PLACEMENT_SETTINGS)
            },
            "layer_kinds": list(layer_kinds),
        }
    )


def pipeline_cacheable(passes: Sequence[ModulePass]) -> bool:
    """Whether the pipeline's result is a pure function of its input IR, the options, the
    hardware and the sources (see the module docstring)."""
    for p in passes:
        options = {name: getattr(p, name, None) for name in ("mode", "method", "solver", "ledger")}
        if p.name in ("measured-durations", "measured-pairs") or options["ledger"] is not None:
            return False  # a training run's measurements
        if p.name == "profile" and options["mode"] != "analytic":
            return False  # pairs measured on this machine, or whatever its measurement cache holds
        if p.name == "overlap-schedule" and options["method"] == "exact" and options["solver"] != "cpsat":
            return False  # a wall-clock limited MILP
    return True


def plan_key(
    capture: str, hardware: str, hardware_fields: object, passes: Sequence[ModulePass], verify: bool,
    settings: dict[str, Any] | None = None,
) -> str:
    # The search extension as built (its sources' hash compiled in), should the build lag its sources.
    from passes.scheduling.gap_fit import SCHEDULER_VERSION

    return digest(
        {
            "format": CACHE_FORMAT,
            "capture": capture,
            "sources": source_digest(),
            "scheduler": SCHEDULER_VERSION,
            "versions": package_versions(_PASS_PACKAGES),
            "hardware": [hardware, repr(hardware_fields)],
            "passes": [p.spelling() for p in passes],
            "settings": {k: v for k, v in sorted((settings or {}).items()) if v is not None},
            "verify": verify,
        }
    )


def output_key(plan: str, artefact: str, options: dict[str, Any]) -> str:
    """The key of one artefact rendered from the plan under ``plan`` with these options."""
    return digest({"format": CACHE_FORMAT, "plan": plan, "artefact": artefact, "options": options})


def file_digest(path: str | os.PathLike[str] | None) -> str | None:
    """SHA-256 of a file an artefact reads (None: no file, or one that cannot be read: the
    renderer reports that, and an error is never cached)."""
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


@dataclass
class CachedIR:
    """A cached module's text and the warnings that making it gave."""

    text: str
    warnings: list[str]


@dataclass
class CachedBytes:
    """A cached entry's bytes and the warnings that making it gave."""

    data: bytes
    warnings: list[str]


class CompileCache:
    """One layer (``kind``: ``captures``, ``plans`` or ``outputs``) in the cache folder.

    ``captures`` and ``plans`` hold IR text (``.tir``); ``outputs`` holds bytes (``.bin``).
    An entry's header keeps the warnings that making it gave.
    """

    def __init__(self, kind: str, root: Path | str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.disk = DiskCache(
            resolve_cache_dir(root) / kind, name="compile cache", format=CACHE_FORMAT, warning=CompileCacheWarning,
            redo="compiling again",
            unwritable="compiles are not cached (pick a writable folder with TESSERA_CACHE_DIR, or turn the cache off "
            "with --no-cache)",
            suffix=".bin" if kind == "outputs" else ".tir", max_bytes=max_bytes,
        )
        self.dir = self.disk.dir
        self.max_bytes = max_bytes
        self.suffix = self.disk.suffix

    def path(self, key: str) -> Path:
        return self.disk.path(key)

    def get(self, key: str) -> CachedIR | None:
        """The IR text under ``key``, or None (missing, or ignored with a warning)."""
        entry = self.get_bytes(key)
        if entry is None:
            return None
        try:
            return CachedIR(entry.data.decode(), entry.warnings)
        except UnicodeDecodeError as err:
            self.disk.ignore(key, f"is damaged ({err})")
            return None

    def get_bytes(self, key: str) -> CachedBytes | None:
        """The bytes under ``key``, or None (missing, or ignored with a warning)."""
        entry = self.disk.read(key)
        if entry is None:
            return None
        notes = entry.meta.get("warnings", [])
        if not (isinstance(notes, list) and all(isinstance(n, str) for n in notes)):
            self.disk.ignore(key, "is damaged ('warnings' is not a list of strings)")
            return None
        return CachedBytes(entry.body, notes)

    def put(self, key: str, data: str | bytes, notes: Sequence[str] = ()) -> None:
        self.disk.put(key, data, {"warnings": list(notes)})

    def trim(self) -> int:
        """Remove the least recently used entries until the folder fits ``max_bytes``; how many went."""
        return self.disk.trim()


class RenderedOutputs:
    """The artefacts of one compile, each served from the ``outputs`` layer or rendered.

    ``cache`` None renders everything (no cache, or a plan that is not cacheable). New
    entries wait in memory until :meth:`flush`, which the compile calls only once the planned
    module verified, so an artefact of a plan that failed is never kept.
    """

    def __init__(self, cache: CompileCache | None, plan: str):
        self.cache = cache
        self.plan = plan
        self.served: list[str] = []  # artefacts read from the cache, and the seconds that took
        self.served_seconds = 0.0
        self.rendered: list[tuple[str, float]] = []  # artefacts rendered here, and the seconds each took
        self._pending: list[tuple[str, bytes]] = []

    def _render(self, artefact: str, render: Callable[[], bytes]) -> bytes:
        start = time.perf_counter()
        data = render()
        self.rendered.append((artefact, time.perf_counter() - start))
        return data

    def get(self, artefact: str, options: dict[str, Any], render: Callable[[], bytes]) -> bytes:
        if self.cache is None:
            return self._render(artefact, render)
        start = time.perf_counter()
        key = output_key(self.plan, artefact, options)
        hit = self.cache.get_bytes(key)
        if hit is not None:
            self.served.append(artefact)
            self.served_seconds += time.perf_counter() - start
            return hit.data
        data = self._render(artefact, render)
        self._pending.append((key, data))
        return data

    def text(self, artefact: str, options: dict[str, Any], render: Callable[[], str]) -> str:
        return self.get(artefact, options, lambda: render().encode()).decode()

    def flush(self) -> None:
        if self.cache is not None:
            for key, data in self._pending:
                self.cache.put(key, data)
        self._pending.clear()
