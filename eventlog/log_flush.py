"""When the log's appends reach the disk: the flush policy, the durable offset and who waits for it.

Policies (`LogConfig.flush_policy`, whose docstring says what each guarantees): `fsync` syncs the
active segment in every append before it returns; `group` wakes a flusher thread after each append,
which syncs everything appended so far in one fdatasync while appends go on (group commit);
`interval` has the thread sync every `flush_interval_ms`. An append may also ask to be synced before
it returns, whatever the policy (`after_write(sync=True)`): a caller that would only wait for the
thread, with nothing else to do meanwhile, saves the thread's two wake-ups (see
eventlog/raft/runtime/ready_loop.py). A roll syncs the segment it seals,
so the active segment is the only one that can hold unsynced data: syncing it makes everything below
the end offset read at the start durable, unless a truncation rewrote part of it meanwhile (then the
sync proves nothing: the log's generation tells).

The durable offset only advances here, or when the log seals a segment, resets or truncates (which
may lower it). Waiters block on `durable` (a condition on the log's lock); durability listeners are
called without the lock, from the thread that synced.

Concurrency contract: the flusher is part of its `Log`: it shares the log's lock and reads the log's
state under it (`FlushedLog`). The thread holds the lock only to take a snapshot of what to sync,
never while syncing. Call everything else with the log's lock held, except `notify_listeners`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from eventlog.config import LogConfig
from eventlog.errors import LogError
from eventlog.fileutil import io_error
from eventlog.log_segments import LogSegments
from eventlog.segment import Segment

DurabilityListener = Callable[[int], None]


class FlushedLog(Protocol):
    """What the flusher reads of its log (with the log's lock held) and tells it."""

    directory: Path
    _end_offset: int
    _closed: bool
    _failure: LogError | None
    _generation: int   # bumped by truncations and resets
    _segments: LogSegments

    def _fail(self, error: LogError) -> None:
        """Record a fatal sync failure (lock held): the log refuses writes from then on."""
        ...

    def _synced(self, started: float) -> None:
        """Report one sync that started at `started` (perf_counter) to the log's observer."""
        ...


class LogFlusher:
    """The durability of one log (see the module docstring)."""

    def __init__(self, log: FlushedLog, lock: threading.RLock, config: LogConfig) -> None:
        self._log = log
        self._lock = lock
        self._policy = config.flush_policy
        self._interval_s = config.flush_interval_ms / 1000 if config.flush_policy == "interval" else None
        self._pending = threading.Condition(lock)   # the flusher thread waits: data to sync
        self._durable = threading.Condition(lock)   # callers wait: durability advanced
        self.durable_offset = 0                     # every offset below it is on disk
        self._listeners: list[DurabilityListener] = []
        self._thread: threading.Thread | None = None
        self.last_sync_seconds = 0.0                # how long the latest sync took (by any thread)

    def start(self) -> None:
        """Start the flusher thread, if the policy has one."""
        if self._policy in ("group", "interval"):
            self._thread = threading.Thread(target=self._run, name=f"log-flusher:{self._log.directory.name}",
                                            daemon=True)
            self._thread.start()

    def join(self) -> None:
        """Wait for the thread to end (after `wake_flusher` with the log closed: it syncs what is left first)."""
        if self._thread is not None:
            self._thread.join()

    # --- the durable offset (lock held) --------------------------------------------------------

    def after_write(self, *, sync: bool = False) -> bool:
        """Apply the flush policy after a write (or sync now, with `sync`); True if durability advanced."""
        policy = self._policy
        if policy == "fsync" or sync:
            self.sync_active()
            return True
        if policy == "group":
            self._pending.notify()
        return False

    def sync_active(self) -> None:
        """Sync the active segment now: everything up to the log end is then durable."""
        log = self._log
        target = log._end_offset
        started = time.perf_counter()
        try:
            log._segments.active.sync()
        except LogError as exc:
            log._fail(exc)
            raise
        self._synced(started)
        self.durable_offset = max(self.durable_offset, target)
        self._durable.notify_all()

    def _synced(self, started: float) -> None:
        self.last_sync_seconds = time.perf_counter() - started
        self._log._synced(started)

    def sealed(self, offset: int) -> None:
        """The segments below `offset` were synced (a roll sealed the last of them)."""
        self.durable_offset = max(self.durable_offset, offset)

    def truncated(self, offset: int) -> None:
        """The log was cut at `offset`: nothing at or past it is durable any more."""
        self.durable_offset = min(self.durable_offset, offset)

    def reset(self, offset: int) -> None:
        """The log now ends, durably, at `offset` (opened, or reset for a snapshot)."""
        self.durable_offset = offset
        self._durable.notify_all()

    def wait(self, timeout: float | None) -> None:
        """Wait until durability may have advanced (or the log failed or closed), at most `timeout`."""
        self._durable.wait(timeout)

    def wake_waiters(self) -> None:
        self._durable.notify_all()

    def wake_flusher(self) -> None:
        self._pending.notify_all()

    # --- listeners -----------------------------------------------------------------------------

    def add_listener(self, listener: DurabilityListener) -> None:
        self._listeners.append(listener)

    def notify_listeners(self) -> None:
        """Tell every listener the durable offset (without the lock: they must not block)."""
        offset = self.durable_offset
        for listener in list(self._listeners):
            listener(offset)

    # --- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        """The group-commit / interval flusher thread."""
        held: list[tuple[Segment, int]] = []   # the segment it syncs, with its own copy of the segment's fd
        try:
            self._flush_until_closed(held)
        finally:
            for _, fd in held:
                os.close(fd)

    def _flush_until_closed(self, held: list[tuple[Segment, int]]) -> None:
        log = self._log
        interval = self._interval_s
        while True:
            with self._lock:
                if interval is None:
                    while not log._closed and log._end_offset <= self.durable_offset:
                        self._pending.wait()
                else:
                    self._pending.wait(interval)
                if log._failure is not None or (log._closed and log._end_offset <= self.durable_offset):
                    return
                if log._end_offset <= self.durable_offset:
                    continue
                target = log._end_offset
                generation = log._generation
                seg = log._segments.active
                assert seg.fd is not None
                if not held or held[0][0] is not seg:
                    # Its own copy, duplicated once per segment (not per sync): the segment may be sealed
                    # or deleted while it syncs. Closed when the next segment is synced, or on exit.
                    if held:
                        os.close(held.pop()[1])
                    held.append((seg, os.dup(seg.fd)))
                fd = held[0][1]
            started = time.perf_counter()
            try:
                os.fdatasync(fd)
            except OSError as exc:
                with self._lock:
                    log._fail(io_error(f"fdatasync of {seg.path}", exc))
                self.notify_listeners()  # listeners check `failure`: nobody may wait on this log forever
                return
            self._synced(started)
            with self._lock:
                # Older segments were synced when they were sealed, so everything below `target`
                # is on disk, unless a truncation rewrote part of it meanwhile.
                if generation == log._generation:
                    self.durable_offset = max(self.durable_offset, target)
                self._durable.notify_all()
            self.notify_listeners()
