"""Where the local CPU's calibrated hardware description is cached, and reading it back.

Kept apart from the calibration itself (``calibrate_cpu.py``) so that loading the ``cpu``
hardware (``hardware.load_hardware``) can find a cached description without importing the
code that measures one: loading never measures.

The entry is ``<cache dir>/hardware/cpu-<key>.json`` under the one cache protocol
(``support.disk_cache``), its body the hardware description as JSON; the key hashes the CPU
model, the executor's process and thread counts, the statistic the readings use, the software
versions and ``CALIBRATION_VERSION``, so a changed machine or torch version misses the cache.
An entry that cannot be read, names another key or fails its checksum is ignored with a
:class:`CalibrationCacheWarning`: the CPU then counts as not calibrated.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from passes.costs.hardware import Hardware, hardware_from_data
from passes.costs.profile_cache import cache_key, software_versions
from support.disk_cache import DiskCache, resolve_cache_dir

WORLD_SIZE = 2
STATISTICS = ("median", "min")
# Bumped whenever the calibration measures differently, so older files are not reused.
CALIBRATION_VERSION = 15  # 15: entries under the one cache protocol


class CalibrationCacheWarning(UserWarning):
    """A cached CPU calibration that was ignored (damaged, foreign)."""


def _cache(cache_dir: str | Path | None) -> DiskCache:
    return DiskCache(
        resolve_cache_dir(cache_dir) / "hardware", name="CPU calibration cache", format=CALIBRATION_VERSION,
        warning=CalibrationCacheWarning, redo="treating the CPU as not calibrated", unwritable="", prefix="cpu-",
    )


def calibration_key(world_size: int = WORLD_SIZE, threads_per_rank: int | None = None, statistic: str = "median") -> str:
    """The key of the calibration for these executor settings on this machine."""
    from runtime.pair_executor import cpu_device_description

    versions = dict(software_versions(), calibration=str(CALIBRATION_VERSION), statistic=statistic)
    return cache_key("cpu-calibration", cpu_device_description(world_size, threads_per_rank), versions)


def calibration_path(
    cache_dir: str | Path | None = None,
    world_size: int = WORLD_SIZE,
    threads_per_rank: int | None = None,
    statistic: str = "median",
) -> Path:
    """The cache file of the calibration for these executor settings."""
    return _cache(cache_dir).path(calibration_key(world_size, threads_per_rank, statistic))


def read_calibration(
    cache_dir: str | Path | None = None,
    world_size: int = WORLD_SIZE,
    threads_per_rank: int | None = None,
    statistic: str = "median",
) -> Hardware | None:
    """The cached calibration for these executor settings; None when there is none (or it was
    ignored with a warning). A description that is not a valid one raises ``HardwareError``."""
    cache = _cache(cache_dir)
    key = calibration_key(world_size, threads_per_rank, statistic)
    found = cache.read_json(key)
    return None if found is None else hardware_from_data(found[0], cache.path(key))


def write_calibration(
    data: dict[str, Any],
    cache_dir: str | Path | None = None,
    world_size: int = WORLD_SIZE,
    threads_per_rank: int | None = None,
    statistic: str = "median",
) -> Path:
    """Cache the hardware description ``data`` (atomically); ``OSError`` when the folder cannot be written."""
    import json

    key = calibration_key(world_size, threads_per_rank, statistic)
    return _cache(cache_dir).write(key, json.dumps(data, indent=2, sort_keys=True))


def cached_cpu_calibration(cache_dir: str | Path | None = None, statistic: str = "median") -> Hardware | None:
    """The cached calibration of the default executor, or None when there is none yet."""
    return read_calibration(cache_dir, statistic=statistic)
