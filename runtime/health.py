"""When one rank fails, every other rank stops with an error naming it, instead of hanging.

A rank blocked in a collective whose peer died may wait for the whole gloo or
NCCL timeout (minutes), and under ``torchrun`` the survivors are killed by
SIGTERM a moment after the first death, silently. So each rank runs a watch
thread beside training, talking to the other ranks through the job's
rendezvous store (torchrun's agent keeps it alive when a worker dies):

- every ``interval_s`` it bumps its own heartbeat counter;
- a rank that raises records ``rank R: <error>`` (``HealthWatch.fail``); the
  first record wins, so later errors caused by the first do not hide it;
- a rank whose process has ended (on this host: each rank records its host and
  process id when its watch starts) without a record or a finish is dead at
  once; one on another host, whose heartbeat has not moved for ``stale_s``,
  likewise; one that never started its watch is named when the launcher stops
  the job (below): the first watch to see a death records it;
- when a record exists, the watch prints it and ends the process (exit 1),
  whatever the training thread is blocked in;
- SIGTERM (torchrun stopping the job because a worker exited) is received by
  the watch thread itself: it waits up to ``diagnose_s`` for the record or a
  stale heartbeat, then reports and exits. For that, SIGTERM must be blocked
  in every thread: call ``hold_termination_signals()`` first thing in the
  program, before torch starts threads (then threads inherit the mask).

Start the watch before anything that can fail (``start_job_watch``: it needs
only torchrun's environment, not the process group), and report every failure
through it (``HealthWatch.failure_of``), refusals of the plan included: then
every rank names the rank that failed and why, from the first second of the
job, instead of the transport's ``Connection closed by peer``.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

FAILED_KEY = "failed"
TERMINATION = (signal.SIGTERM,)


def write_line(text: str) -> None:
    """Write ``text`` and its newline to stderr in one system call.

    The ranks of a job share one pipe or terminal; a line written in pieces (as
    ``print`` does) can be cut by another rank's line. One write of up to
    PIPE_BUF bytes to a pipe is never interleaved.
    """
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # stderr replaced by an object without a descriptor
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    sys.stderr.flush()
    os.write(fd, (text + "\n").encode(errors="replace"))


def hold_termination_signals() -> None:
    """Block SIGTERM in this thread and every thread started after, so the watch thread receives it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, TERMINATION)


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` of this host has ended (a zombie, dead but not yet reaped, has)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The state follows the parenthesised command name, which may itself hold spaces.
            state = f.read().rpartition(b")")[2].split()[:1]
        return state in ([b"Z"], [b"X"])
    except FileNotFoundError:
        return True
    except OSError:  # no /proc: ask the kernel whether the id is in use
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def is_communication_failure(err: BaseException) -> bool:
    """An error a rank sees when a peer dies: a broken transport rather than a fault of its own."""
    import torch.distributed as dist

    kinds = tuple(k for k in (getattr(dist, "DistBackendError", None), getattr(dist, "DistNetworkError", None)) if k)
    if isinstance(err, kinds) or type(err).__name__ == "CommunicationError":
        return True
    text = str(err)
    return any(sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe"))


def job_store(prefix: str = "tessera/health", timeout_s: float = 30.0) -> Any:
    """A client of the job's rendezvous store (``MASTER_ADDR``/``MASTER_PORT``, as torchrun sets them)."""
    import torch.distributed as dist

    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port:
        raise RuntimeError("MASTER_ADDR and MASTER_PORT are not set: launch the job with torchrun")
    store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix, store)


class HealthWatch:
    """The watch thread of one rank (see the module docstring)."""

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        *,
        interval_s: float = 0.25,
        stale_s: float = 3.0,
        diagnose_s: float = 8.0,
        report: Callable[[str], None] | None = None,
        exit_process: Callable[[int], None] = os._exit,
    ):
        self.store = store
        self.rank, self.world_size = rank, world_size
        self.interval_s, self.stale_s, self.diagnose_s = interval_s, stale_s, diagnose_s
        self.report = report or write_line
        self.exit_process = exit_process
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (last counter, when it last moved)
        self._processes: dict[int, int] = {}  # rank -> process id, for the ranks on this host
        self._host = socket.gethostname()
        self._started = time.monotonic()

    # ------------------------------------------------------------ training thread

    def start(self) -> HealthWatch:
        self.store.set(f"proc/{self.rank}", f"{socket.gethostname()} {os.getpid()}")
        self._started = time.monotonic()
        self.store.add(f"hb/{self.rank}", 1)
        self._thread = threading.Thread(target=self._watch, name="tessera-health", daemon=True)
        self._thread.start()
        return self

    def fail(self, message: str) -> str:
        """Record that this rank failed (unless another rank's failure came first); returns the record that stands."""
        record = f"rank {self.rank}: {message}"
        return self._record(record)

    def failure_of(self, err: BaseException) -> str:
        """The failure record that stands once this rank failed with ``err``.

        A broken connection is usually another rank's death or refusal seen from here: the
        watch is given up to ``diagnose_s`` to name that rank before this one records itself.
        """
        if is_communication_failure(err):
            record = self.first_failure(wait_s=self.diagnose_s, look=True)
            if record is not None:
                return record
        return self.fail(f"{type(err).__name__}: {err}" if not _is_refusal(err) else str(err))

    def first_failure(self, wait_s: float = 0.0, look: bool = False) -> str | None:
        """The failure record, waiting up to ``wait_s`` for one; with ``look``, also looking for dead ranks."""
        deadline = time.monotonic() + wait_s
        while True:
            record = self._check() if look else self._read_record()
            if record is not None or time.monotonic() >= deadline:
                return record
            time.sleep(self.interval_s)

    def finish(self) -> None:
        """This rank ended normally: its silence from now on is not a death."""
        self.store.add(f"done/{self.rank}", 1)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * self.interval_s + 1)

    # ------------------------------------------------------------ watch thread

    def _record(self, record: str) -> str:
        stored = self.store.compare_set(FAILED_KEY, "", record)
        return stored.decode() if isinstance(stored, bytes) else str(stored)

    def _read_record(self) -> str | None:
        if not self.store.check([FAILED_KEY]):
            return None
        value = self.store.get(FAILED_KEY)
        return value.decode() if isinstance(value, bytes) else str(value)

    def _process_of(self, r: int) -> int | None:
        """Rank ``r``'s process id if it runs on this host (None: elsewhere, or its watch has not started)."""
        if r not in self._processes:
            if not self.store.check([f"proc/{r}"]):
                return None
            value = self.store.get(f"proc/{r}")
            host, _, digits = (value.decode() if isinstance(value, bytes) else str(value)).rpartition(" ")
            self._processes[r] = int(digits) if host == self._host and digits.isdigit() else -1
        pid = self._processes[r]
        return pid if pid >= 0 else None

    def _dead_rank(self, never_started: bool = False) -> str | None:
        """The failure record of a rank found dead, or None.

        ``never_started``: also name a rank whose watch never started (the launcher is stopping
        the job, so it ended before its start-up reached the watch).
        """
        now = time.monotonic()
        for r in range(self.world_size):
            if r == self.rank or int(self.store.add(f"done/{r}", 0)):
                continue
            pid = self._process_of(r)
            if pid is not None and process_ended(pid):
                if int(self.store.add(f"done/{r}", 0)):  # it finished between the two looks
                    continue
                return f"rank {r}: its process (pid {pid}) ended without reporting an error (killed or crashed)"
            count = int(self.store.add(f"hb/{r}", 0))
            last = self._seen.get(r)
            if last is None or last[0] != count:
                self._seen[r] = (count, now)
                continue
            if now - last[1] > self.stale_s and count > 0:
                return f"rank {r}: stopped responding (no heartbeat for {self.stale_s:.1f} s; killed or crashed)"
            if now - last[1] > self.stale_s and never_started:
                return f"rank {r}: ended before its health watch started (killed or crashed at start-up)"
        return None

    def _check(self, never_started: bool = False) -> str | None:
        record = self._read_record()
        if record is None:
            dead = self._dead_rank(never_started)
            if dead is not None:
                record = self._record(dead)
        return record

    def _stop_process(self, record: str, why: str) -> None:
        self.report(f"[rank {self.rank}] error: {why}: {record}")
        self.exit_process(1)

    def _watch(self) -> None:
        can_wait_signal = hasattr(signal, "sigtimedwait") and signal.SIGTERM in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        while not self._stop.is_set():
            try:
                self.store.add(f"hb/{self.rank}", 1)
                record = self._check()
            except Exception as err:  # noqa: BLE001 - the store itself went away
                self._stop_process(f"the job's rendezvous store is unreachable ({err})", "stopping")
                return
            if record is not None and not record.startswith(f"rank {self.rank}:"):
                self._stop_process(record, "stopping because another rank failed")
                return
            if can_wait_signal:
                if signal.sigtimedwait(TERMINATION, self.interval_s) is not None:
                    self._on_termination()
                    return
            else:
                self._stop.wait(self.interval_s)

    def _on_termination(self) -> None:
        deadline = time.monotonic() + self.diagnose_s
        while time.monotonic() < deadline:
            try:
                self.store.add(f"hb/{self.rank}", 1)
                record = self._check(never_started=True)
            except Exception:  # noqa: BLE001
                record = None
            if record is not None:
                if record.startswith(f"rank {self.rank}:"):
                    self.exit_process(1)
                    return
                self._stop_process(record, "stopped by the launcher because another rank failed")
                return
            time.sleep(self.interval_s)
        self._stop_process("no rank reported a failure", "stopped by the launcher (SIGTERM)")


def _is_refusal(err: BaseException) -> bool:
    """A refusal with a message of its own (a PlanError): recorded as is, without its class name."""
    from runtime.errors import PlanError

    return isinstance(err, PlanError)


def start_job_watch(**options: Any) -> HealthWatch:
    """This rank's watch, started from torchrun's environment (``RANK``, ``WORLD_SIZE``, ``MASTER_*``).

    It needs no process group, so a trainer starts it first, before anything that can fail;
    ``TrainingSession.start(..., health=watch)`` then uses it.
    """
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        raise RuntimeError("RANK and WORLD_SIZE are not set: launch the job with torchrun")
    return HealthWatch(job_store(), int(rank), int(world), **options).start()
