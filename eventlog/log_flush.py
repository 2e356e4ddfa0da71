"""When the log's appends reach the disk: the flush policy, the durable offset and who waits for it.

Policies (`LogConfig.flush_policy`, whose docstring says what each guarantees): `fsync` syncs the
active segment in every append before it returns; `group` wakes a flusher thread after each append,
which syncs everything appended so far in one fdatasync while appends go on (group commit);
`interval` has the thread sync every `flush_interval_ms`. A roll syncs the segment it seals,
so the active segment is the only one that can hold unsynced data: syncing it makes everything below
the end offset read at the start durable, unless a truncation rewrote part of it meanwhile (then the
sync proves nothing: the log's generation tells).

The durable offset only advances here, or when the log seals a segment, resets or truncates (which
may lower it). Waiters block on `durable` (a condition on the log's lock); durability listeners are
called without the lock, from the thread that synced.

Syncs once per turn (`defer_to_turns`, the Raft groups' logs): under `group` an append then wakes
nobody; the log's owner calls `sync_turn` once per turn of its loop, after its appends (and after the
messages of the turn went out), which either wakes the thread (once, not per append; not at all while
it is syncing: it goes on to what was appended meanwhile), or syncs on the caller's thread. The hand-off
to the thread costs futex wake-ups, a GIL hand-over both ways and a wake-up of the caller's loop when
it is done; it buys group commit only when appends arrive while a sync runs. So the flusher watches
the thread's syncs: after INLINE_AFTER in a row during which nothing was appended (one client writing
at a time), `sync_turn` syncs inline, and hands every PROBE_EVERY-th sync to the thread again, to see
whether appends now overlap a sync; the first that does goes back to the thread. The caller may rule
the inline sync out (`inline=False`): a Raft leader does, since its own copy is not needed to commit
(two followers make a quorum of three) and a slow fdatasync on its loop would hold up the commit that
its followers' acknowledgements make. Either way an offset counts as durable only once an fdatasync
that started after it was written returned.

Concurrency contract: the flusher is part of its `Log`: it shares the log's lock and reads the log's
state under it (`FlushedLog`). The thread holds the lock only to take a snapshot of what to sync,
never while syncing, and so does `sync_turn`. Call everything else with the log's lock held, except
`notify_listeners` and `sync_turn`.
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

INLINE_AFTER = 8
"""Thread syncs in a row with no append during them, before `sync_turn` syncs on the caller's thread."""
PROBE_EVERY = 32
"""While syncing inline, every this many syncs go to the thread, to notice appends overlapping a sync."""


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
        self._deferred = False       # appends wake nobody: the owner calls sync_turn once per turn
        self._syncing = False        # the thread is syncing (from its snapshot to its update)
        self._lone_syncs = 0         # the thread's syncs in a row with no append during them
        self._inline_syncs = 0       # inline syncs since the last one handed to the thread

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

    def after_write(self) -> bool:
        """Apply the flush policy after a write; True if durability advanced."""
        policy = self._policy
        if policy == "fsync":
            self.sync_active()
            return True
        if policy == "group" and not self._deferred:
            self._pending.notify()
        return False

    def defer_to_turns(self) -> None:
        """From now on the owner calls `sync_turn` once per turn after appending (see the module
        docstring); appends alone no longer wake the thread."""
        self._deferred = True

    def sync_turn(self, *, inline: bool = True) -> bool:
        """Make what was appended durable (lock NOT held): wake the thread, or sync here (see the module
        docstring; never here unless `inline`). True when it synced here, or failed trying (then the log
        has its `failure`): durability listeners are not called for it, the caller reads
        `durable_offset` itself."""
        log = self._log
        with self._lock:
            if (self._policy != "group" or log._failure is not None or log._closed
                    or log._end_offset <= self.durable_offset or self._syncing):
                return False   # nothing to do, or the thread syncs and goes on to what was appended
            if not inline or self._lone_syncs < INLINE_AFTER or self._inline_syncs >= PROBE_EVERY:
                self._inline_syncs = 0
                self._pending.notify()
                return False
            self._inline_syncs += 1
            target = log._end_offset
            generation = log._generation
            seg = log._segments.active
            fd = seg.fd
            assert fd is not None
        # The active segment is only rolled, sealed or closed by the thread that appends, i.e. this one.
        started = time.perf_counter()
        try:
            os.fdatasync(fd)
        except OSError as exc:
            with self._lock:
                log._fail(io_error(f"fdatasync of {seg.path}", exc))
                self._durable.notify_all()
            return True
        log._synced(started)
        with self._lock:
            if generation == log._generation:
                self.durable_offset = max(self.durable_offset, target)
            self._durable.notify_all()
        return True

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
        log._synced(started)
        self.durable_offset = max(self.durable_offset, target)
        self._durable.notify_all()

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
                self._syncing = True
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
                    self._syncing = False
                    log._fail(io_error(f"fdatasync of {seg.path}", exc))
                self.notify_listeners()  # listeners check `failure`: nobody may wait on this log forever
                return
            log._synced(started)
            with self._lock:
                self._syncing = False
                # Older segments were synced when they were sealed, so everything below `target`
                # is on disk, unless a truncation rewrote part of it meanwhile.
                if generation == log._generation:
                    self.durable_offset = max(self.durable_offset, target)
                # Group commit paid off only if something was appended while this sync ran.
                self._lone_syncs = 0 if log._end_offset > target else self._lone_syncs + 1
                self._durable.notify_all()
            self.notify_listeners()
