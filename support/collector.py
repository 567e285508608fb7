"""The garbage-collector policy: every place Tessera changes what the cyclic collector does.

Tessera's large structures (a parsed module, the pair DAGs and their schedules, the per-rank
programs) are trees of many small objects that live to the end of their run and hold no cycles,
so the collector's full passes over them find nothing to free while costing a large share of the
time that built them. Four rules follow, each used where it applies:

- :func:`paused`: no collection while an acyclic tree is built (parsing IR text);
- :func:`frozen_heap`: objects that exist when a pass starts are left out of the collector's
  walks while the pass runs;
- :func:`freeze_inherited`: a forked child leaves everything it inherited out of them, since
  walking an object writes to its header and so copies the page it sits on;
- :func:`use_executable_thresholds`: a one-run executable collects young objects only, rarely
  the whole heap.

A caller that goes on (a test, a trainer importing the API) keeps its own settings: only the
executables change the thresholds, and the context managers restore what they found.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

# The collector's thresholds in an executable. Python's defaults (700, 10, 10) start a young
# collection every 700 net allocations of container objects, an older one every tenth of those,
# and one of the whole heap every hundredth once the heap has grown by a quarter since the last.
# A compile allocates millions of objects that live to the end (torch's and transformers' modules
# in the capture's child, the pair DAGs, schedules and per-rank programs in the passes), so its
# heap keeps growing and the collector walks it again and again for garbage that is not there.
# Here a young collection comes every 100,000 allocations, so short-lived cycles are still freed,
# and one of the whole heap only after 500 million.
EXECUTABLE_GC_THRESHOLDS = (100_000, 50, 100)


def use_executable_thresholds() -> None:
    """Set :data:`EXECUTABLE_GC_THRESHOLDS`: for an executable's own process only."""
    gc.set_threshold(*EXECUTABLE_GC_THRESHOLDS)


@contextmanager
def paused() -> Iterator[None]:
    """No cyclic collection meanwhile (building an acyclic tree); the collector is left as found."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def frozen_heap() -> Iterator[None]:
    """Keep the objects that exist now out of the collector's walks meanwhile.

    They are live anyway; frozen objects (the permanent generation) are skipped, and unfrozen
    afterwards. Does nothing when the caller froze objects already, so as not to unfreeze theirs.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def freeze_inherited() -> None:
    """In a forked child: leave every object inherited from the parent out of the collector's
    walks for good (a walk writes to each object's header, which copies the page it is on)."""
    gc.freeze()
