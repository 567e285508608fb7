"""Where the local CPU's calibrated hardware description is cached, and whether it exists.

Kept apart from the calibration itself (``calibrate_cpu.py``) so that loading the ``cpu``
hardware (``hardware.load_hardware``) can find a cached description without importing the
code that measures one: loading never measures.

The file is ``<cache dir>/hardware/cpu-<key>.json``; the key hashes the CPU model, the
executor's process and thread counts, the statistic the readings use, the software versions
and ``CALIBRATION_VERSION``, so a changed machine or torch version misses the cache.
"""

from __future__ import annotations

from pathlib import Path

from passes.costs.profile_cache import cache_key, resolve_cache_dir, software_versions

WORLD_SIZE = 2
STATISTICS = ("median", "min")
# Bumped whenever the calibration measures differently, so older files are not reused.
CALIBRATION_VERSION = 14


def calibration_path(
    cache_dir: str | Path | None = None,
    world_size: int = WORLD_SIZE,
    threads_per_rank: int | None = None,
    statistic: str = "median",
) -> Path:
    """The cache file of the calibration for these executor settings."""
    from runtime.pair_executor import cpu_device_description

    root = resolve_cache_dir(str(cache_dir) if cache_dir else None)
    versions = dict(software_versions(), calibration=str(CALIBRATION_VERSION), statistic=statistic)
    key = cache_key("cpu-calibration", cpu_device_description(world_size, threads_per_rank), versions)
    return root / "hardware" / f"cpu-{key[:16]}.json"


def cached_cpu_calibration(cache_dir: str | Path | None = None, statistic: str = "median") -> Path | None:
    """The cached calibration of the default executor, or None when there is none yet."""
    path = calibration_path(cache_dir, statistic=statistic)
    return path if path.is_file() else None
