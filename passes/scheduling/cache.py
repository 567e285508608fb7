"""On-disk cache of pair schedules, beside the profile cache and under the same rules.

A schedule is a pure function of its pair DAG and the scheduler (its version and options),
so it is cached under a key that is the SHA-256 of exactly those:

- the DAG's canonical signature (:func:`dag_signature`): per task its kind, resource,
  duration, dependencies, side, movability and deadline, in DAG order; task and layer names
  are left out, so pairs that differ only in names share an entry;
- the method and the options that change its answer (``exact``: solver and time limit);
- the scheduler's version (:data:`passes.scheduling.gap_fit.SCHEDULER_VERSION`: a hash of
  the search's C++ sources, its Python driver and its effort, so it changes whenever the
  heuristic's output can), the cache format and tessera's version.

Changing one layer's cost changes the signature of exactly the DAGs that contain it, so only
those are scheduled again. Wall-clock limited solvers (the MILP cross-check) are not cached:
their answer depends on the machine.

Layout: ``<cache dir>/schedules/<key>.json``, the cache dir being the other caches'
(``cache-dir`` option, else ``$TESSERA_CACHE_DIR``, else ``~/.cache/tessera``), under the one
cache protocol (``support.disk_cache``): an entry names its key and its body's checksum, is
written to a temporary file and renamed into place, and one that cannot be read, names another
key or format, or fails its checksum is ignored with a :class:`ScheduleCacheWarning` (and
overwritten). An entry records whether its schedule was proven valid by z3 when it was made.

Nothing read from the cache is trusted: an entry that does not fit the DAG is ignored the same
way, and every schedule taken from it passes the same exact validity check as a fresh one (the
overlap-schedule pass runs it). The cache is capped (``max_bytes``): after a run's writes, the
least recently used entries (by modification time; a hit refreshes it) are removed until it
fits.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from passes.costs.profile_cache import tessera_version
from passes.scheduling.pair_dag import PairDAG
from passes.scheduling.schedule import PairSchedule
from support.disk_cache import DiskCache, resolve_cache_dir

CACHE_FORMAT = 2  # 2: entries under the one cache protocol (support.disk_cache)
DEFAULT_MAX_BYTES = 256 * 2**20


class ScheduleCacheWarning(UserWarning):
    """A schedule cache entry that was ignored (damaged, foreign) or a cache that cannot be written."""


def dag_signature(dag: PairDAG) -> list[list[object]]:
    """What a schedule depends on, task by task (floats spelled exactly, in hex)."""
    return [
        [
            t.kind,
            t.resource.value,
            float(t.duration).hex(),
            list(t.deps),
            t.side,
            t.movable,
            None if t.deadline is None else float(t.deadline).hex(),
        ]
        for t in dag.tasks
    ]


SAMPLE_ONE_IN = 8


def sampled(key: str) -> bool:
    """Whether ``verify=sample`` proves the schedule under ``key``: one in ``SAMPLE_ONE_IN``,
    chosen by the key, so the same DAG is always in or out of the sample."""
    return int(key[:8], 16) % SAMPLE_ONE_IN == 0


def schedule_key(dag: PairDAG, scheduler: str, options: dict[str, object]) -> str:
    blob = json.dumps(
        {
            "format": CACHE_FORMAT,
            "tessera": tessera_version(),
            "scheduler": scheduler,
            "options": options,
            "dag": dag_signature(dag),
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class CachedSchedule:
    schedule: PairSchedule
    proven: bool  # z3 proved it valid when it was made


class ScheduleCache:
    def __init__(self, root: Path | str | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.disk = DiskCache(
            resolve_cache_dir(root) / "schedules", name="schedule cache", format=CACHE_FORMAT,
            warning=ScheduleCacheWarning, redo="scheduling the pair again",
            unwritable="schedules are not cached (pick a writable folder with the cache-dir option or TESSERA_CACHE_DIR, "
            "or turn the cache off with cache=false)",
            max_bytes=max_bytes,
        )
        self.dir = self.disk.dir
        self.max_bytes = max_bytes

    @property
    def hits(self) -> int:
        return self.disk.hits

    @property
    def written(self) -> int:
        return self.disk.written

    @property
    def ignored(self) -> int:
        return self.disk.ignored

    def path(self, key: str) -> Path:
        return self.disk.path(key)

    def get(self, key: str, dag: PairDAG) -> CachedSchedule | None:
        """The cached schedule of ``dag`` under ``key``, or None (missing, or ignored with a warning)."""
        found = self.disk.read_json(key)
        if found is None:
            return None
        data, _ = found
        try:
            if not isinstance(data, dict):
                raise ValueError("not an object")
            start = data["start"]
            if not (
                isinstance(start, list)
                and len(start) == len(dag.tasks)
                and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in start)
            ):
                self._ignore_hit(key, f"does not hold {len(dag.tasks)} finite start times")
                return None
            bound = data.get("bound")
            sched = PairSchedule(
                dag,
                [float(x) for x in start],
                str(data["method"]),
                status=str(data["status"]),
                bound=None if bound is None else float(bound),
                stats={"cache": "hit"},
            )
            proven = data.get("proven") is True
        except (ValueError, KeyError, TypeError) as err:
            self._ignore_hit(key, f"is damaged ({err})")
            return None
        return CachedSchedule(sched, proven)

    def _ignore_hit(self, key: str, why: str) -> None:
        self.disk.hits -= 1
        self.disk.ignore(key, why)

    def ignore_invalid(self, key: str, error: Exception) -> None:
        """Warn that the entry under ``key`` failed the validity check; it is overwritten later."""
        self._ignore_hit(key, f"holds an invalid schedule ({error})")

    def put(self, key: str, schedule: PairSchedule, proven: bool) -> None:
        """Write ``schedule`` under ``key``; a folder that cannot be written is a warning. (The
        pass trims the cache once, after all its writes.)"""
        try:
            self.write(key, schedule, proven)
        except OSError as err:
            self.disk.warn_unwritable(err)

    def write(self, key: str, schedule: PairSchedule, proven: bool) -> None:
        """Write ``schedule`` under ``key`` (a reader never sees half an entry); OSError when the
        folder cannot be written."""
        self.disk.write(key, self._body(schedule, proven))

    @staticmethod
    def _body(schedule: PairSchedule, proven: bool) -> str:
        entry = {
            "method": schedule.method,
            "status": schedule.status,
            "bound": schedule.bound,
            "start": schedule.start,
            "proven": proven,
            "tasks": len(schedule.dag.tasks),
        }
        return json.dumps(entry, separators=(",", ":"))

    def trim(self) -> int:
        """Remove the least recently used entries until the cache fits ``max_bytes``; how many went."""
        return self.disk.trim()
