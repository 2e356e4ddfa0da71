"""The segmented log: an ordered sequence of segments holding Kafka RecordBatch v2 entries.

`Log` is the API and owns appends, rolls, reads, damage, truncation, deletion, resets, prefixes and
the key-compaction swap. It leans on three parts, as Kafka's UnifiedLog leans on LogSegments and
LogLoader: the set of segments (`eventlog.log_segments`), opening and recovery
(`eventlog.log_loader`) and durability (`eventlog.log_flush`).

Directory layout::

    00000000000000000000.log         segments, named by base offset (see eventlog.segment)
    00000000000000000000.index       sparse offset index      (derived)
    00000000000000000000.timeindex   sparse time index        (derived)
    leader-epoch-checkpoint          epoch -> start offset     (see eventlog.epoch_cache)
    log-offsets-checkpoint           "0\\n<log start offset> <recovery point>\\n"
    cleaner-checkpoint               the segments key compaction rewrote (see eventlog.cleaned)
    prefix-install                   only while a snapshot's log prefix is installed (see eventlog.prefix)
    preallocated.tmp                 the next segment, prepared in the background
    .lock                            flock held while a process has the log open

The log start offset is always the base offset of the first segment; the recovery point is an
offset below which every byte is known to be on disk (it advances when a segment is sealed and on
close). Opening (eventlog.log_loader) scans, with CRC checks, every segment from the one holding the
recovery point to the end; segments below it are trusted as flushed and only their indexes are
validated, lazily. Damage that appears in them later is found by the reads, which check every batch
they hand out, and by the scrub (`scrub_segment`): see `eventlog.damage` for what the log then does.

Durability: `append` copies the batch into the mapped active segment; when it is on disk depends on
the flush policy (see `LogConfig` and eventlog.log_flush). `durable_offset` is the end of the prefix
known to be on disk; `wait_durable` and durability listeners report its progress.

Key compaction (`compaction/cleaner.py`) reads sealed segment files without the lock and hands back a cleaned segment that `swap_cleaned` puts in place of the segments it
replaces, crash-safely (`eventlog.cleaned`); reads of a cleaned range skip the offsets it dropped.
A follower installing a snapshot can reset the log onto a prefix of the leader's (`reset` with a
`PrefixInstall`, crash-safe too: `eventlog.prefix`), whose segments then count as cleaned.

Thread-safety: all public methods may be called from any thread; state is guarded by one lock.
The group/interval flusher thread holds the lock only to take a snapshot, never while syncing.
Changes to sealed segment files (swap_cleaned, delete_segments_below, truncate_suffix, reset,
close) are serialized by a second lock, the files lock, always taken before the main one: the
renames and directory syncs of a swap run under it alone, so appends never wait for them.
"""

from __future__ import annotations

import fcntl
import logging
import mmap
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol, Self

from eventlog.cleaned import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    SEGMENT_SUFFIXES,
    SWAP_SUFFIX,
    CleanedSegment,
    CleanedSegmentWriter,
    CleanerCheckpoint,
    cleaned_path,
    rename_state,
)
from eventlog.config import LogConfig
from eventlog.damage import Damage
from eventlog.epoch_cache import CHECKPOINT_NAME as EPOCH_CHECKPOINT_NAME
from eventlog.epoch_cache import LeaderEpochCache
from eventlog.errors import (
    BatchTooLargeError,
    CorruptBatchError,
    EpochlogError,
    InvalidBatchError,
    LogClosedError,
    LogError,
    LogFailedError,
    OffsetMismatchError,
    OffsetOutOfRangeError,
    StaleEpochError,
)
from eventlog.fileutil import fsync_dir, io_error
from eventlog.log_flush import DurabilityListener, LogFlusher
from eventlog.log_loader import LogLoader, write_install_checkpoints
from eventlog.log_loader import RecoveryReport as RecoveryReport  # re-exported
from eventlog.log_segments import LogSegments, install_segment, prepare_segment_file
from eventlog.offsets_checkpoint import OFFSETS_CHECKPOINT_NAME as OFFSETS_CHECKPOINT_NAME  # re-exported
from eventlog.offsets_checkpoint import read_offsets_checkpoint as read_offsets_checkpoint  # re-exported
from eventlog.offsets_checkpoint import write_offsets_checkpoint
from eventlog.preallocate import PreparedFile, SegmentPreallocator
from eventlog.prefix import PrefixInstall, PrefixPart, link_parts, replace_segments
from eventlog.records import LOG_OVERHEAD, BatchHeader, RecordBatch, check_batch, read_header
from eventlog.scan import ScanStatus, scan_segment
from eventlog.segment import Segment, segment_name

logger = logging.getLogger(__name__)

LOCK_NAME = ".lock"

DamageListener = Callable[[Damage], None]


class LogObserver(Protocol):
    """Timings of the log's writes and syncs, for metrics (the log itself keeps no statistics).

    Called on the thread that did the work, sometimes with the log's lock held: record the figure
    and return; never block or call back into the log.
    """

    def appended(self, seconds: float, size: int) -> None:
        """One `append`/`append_replica` call of `size` bytes took `seconds` (lock wait included,
        and the sync under the `fsync` policy)."""
        ...

    def synced(self, seconds: float) -> None:
        """One fdatasync of a segment (group commit, `flush`, `fsync` policy or roll) took `seconds`."""
        ...


@dataclass(frozen=True, slots=True)
class AppendInfo:
    """Where an appended batch went."""

    base_offset: int
    last_offset: int
    position: int
    size: int

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class LogRead:
    """Whole batches read from one segment, as a zero-copy view of the mapped file.

    `start_offset` is the base offset of the first batch, which may be below the offset asked for
    (a read starts with the batch that holds it). The view is valid until the log is truncated
    below `next_offset`; copy it (`bytes(read.data)`) to keep it longer.
    """

    data: memoryview
    start_offset: int
    next_offset: int

    def batches(self) -> Iterator[RecordBatch]:
        pos = 0
        view = self.data
        while pos < len(view):
            h = read_header(view, pos)
            end = pos + h.batch_length + LOG_OVERHEAD
            yield RecordBatch(h, view[pos:end])
            pos = end


@dataclass(frozen=True, slots=True)
class SealedSegment:
    """A sealed segment as the cleaner sees it: the offsets it covers and its file's size."""

    base_offset: int
    next_offset: int
    size: int
    cleaned: bool


@dataclass(frozen=True, slots=True)
class CleanableSegments:
    """The sealed segments wholly below an offset, from the log start, and the state the cleaner
    started from: `generation` (changed by truncations and resets: a swap is then refused) and
    `dirty_offset` (the first offset not yet mapped by a cleaning pass)."""

    segments: list[SealedSegment]
    generation: int
    dirty_offset: int


class Log:
    """A segmented, memory-mapped, CRC-checked append-only log of record batches."""

    def __init__(self, directory: Path, config: LogConfig, lock_fd: int) -> None:
        # Use Log.open(): this only sets up empty state.
        self.directory = directory
        self.config = config
        self._lock_fd = lock_fd
        self._lock = threading.RLock()
        self._segments = LogSegments()
        self._end_offset = 0
        self._log_start = 0
        self._recovery_point = 0
        self._epochs = LeaderEpochCache(directory / EPOCH_CHECKPOINT_NAME)
        self._damage_listeners: list[DamageListener] = []
        self._damage_reported: set[tuple[str, int]] = set()   # (file, position) logged and told once
        self._failure: LogError | None = None
        self._closed = False
        self._generation = 0  # bumped by truncation: a sync that raced with one proves nothing
        self._files_generation = 0  # bumped whenever a segment file below the end changes (prefix_parts)
        self._files_lock = threading.Lock()  # sealed segment files: see the module docstring
        self._cleaner = CleanerCheckpoint()
        self._flusher = LogFlusher(self, self._lock, config)
        self._preallocator: SegmentPreallocator | None = None
        self.recovery: RecoveryReport | None = None
        self.observer: LogObserver | None = None   # set by the owner to collect timings

    # --- opening -------------------------------------------------------------------------------

    @classmethod
    def open(cls, directory: str | Path, config: LogConfig | None = None, *, repair: bool = False) -> Log:
        """Open (creating if needed) the log in `directory`, recovering from any crash.

        A torn tail (an append a crash interrupted) is cut and reported in `log.recovery`. Damage
        with valid data after it raises `LogCorruptionError` naming file and position, unless
        `repair` is true: then the log is cut at the damage and everything after it is dropped.
        """
        config = config or LogConfig()
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(path / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise LogError(f"{path} is in use by another process") from None
        log = cls(path, config, lock_fd)
        try:
            log._recover(repair)
        except BaseException:
            log._release()
            raise
        log._start_background()
        return log

    def _recover(self, repair: bool) -> None:
        loaded = LogLoader(self.directory, self.config, self._segments).load(repair)
        self._log_start, self._recovery_point = loaded.log_start, loaded.recovery_point
        self._cleaner, self._epochs = loaded.cleaner, loaded.epochs
        self._end_offset = self._flusher.durable_offset = loaded.end_offset   # not shared yet: nobody waits
        self.recovery = loaded.report

    def _write_offsets_checkpoint(self) -> None:
        write_offsets_checkpoint(self.directory, self._log_start, self._recovery_point)

    def _start_background(self) -> None:
        if self.config.preallocate_next_segment:
            self._next_segment().request()
        self._flusher.start()

    # --- properties ----------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        """The first offset held by the log."""
        with self._lock:
            return self._segments.first_base

    @property
    def end_offset(self) -> int:
        """The offset the next appended record will get."""
        return self._end_offset

    @property
    def last_sync_seconds(self) -> float:
        """How long the latest sync of the active segment took (0.0 before the first)."""
        return self._flusher.last_sync_seconds

    @property
    def durable_offset(self) -> int:
        """Every offset below this is on disk."""
        return self._flusher.durable_offset

    @property
    def latest_epoch(self) -> int | None:
        with self._lock:
            return self._epochs.latest_epoch

    @property
    def epoch_entries(self) -> list[tuple[int, int]]:
        with self._lock:
            return self._epochs.entries

    def segment_bases(self) -> list[int]:
        with self._lock:
            return list(self._segments.bases)

    @property
    def clean_end_offset(self) -> int:
        """Offsets below this may have been rewritten by key compaction (records dropped, batches
        rebuilt): the end of the last cleaned segment, or the log start when none is cleaned.
        Raft storage serves no entry below it (a follower that needs one gets a snapshot)."""
        with self._lock:
            return max(self._segments.clean_end, self._segments.first_base)

    @property
    def files_generation(self) -> int:
        """Changes whenever a segment file below the log end changes (a swap, a deletion, a truncation,
        a reset): what `prefix_parts` listed is still on disk as long as it has not moved."""
        return self._files_generation

    @property
    def cleaner_dirty_offset(self) -> int:
        """Where the cleaner's next pass starts mapping: every record below it was judged by a pass
        (the log start when nothing was cleaned)."""
        with self._lock:
            return max(self._cleaner.dirty_offset, self._segments.first_base)

    @property
    def cleaned_segments(self) -> list[tuple[int, int]]:
        """(base, end) of every cleaned segment."""
        with self._lock:
            return [(s.base_offset, s.next_offset) for s in self._segments if s.cleaned]

    def segment_spans(self) -> list[tuple[int, int, int]]:
        """(base offset, next offset, bytes of batches) of every segment, oldest first (retention)."""
        with self._lock:
            return [(s.base_offset, s.next_offset, s.size) for s in self._segments]

    # --- space ---------------------------------------------------------------------------------

    @property
    def space_error(self) -> LogError | None:
        """Why the next segment could not be prepared (e.g. DiskFullError), until a preparation succeeds."""
        return self._preallocator.error if self._preallocator is not None else None

    def prepare_next_segment(self) -> None:
        """Prepare the next segment in the background unless one is ready or under way (retries a failed
        preparation: a full disk that was cleaned up gets its segment back)."""
        self._next_segment().request()

    def _next_segment(self) -> SegmentPreallocator:
        """The preparer of the next segment's file, made on first use."""
        if self._preallocator is None:
            self._preallocator = SegmentPreallocator(self.directory, self.config.segment_bytes)
        return self._preallocator

    def room(self, size: int) -> bool | EpochlogError:
        """Without waiting: whether `size` more bytes of batches can be stored now. True when they fit in
        the active segment or the next segment's file is prepared; False while it is being prepared
        (a roll would wait for it); the error of its preparation when that failed (e.g. DiskFullError).

        A Raft group asks before it takes entries it must store (raft/runtime/group.py): `space_error`
        alone misses a preparation still under way that then fails, and a roll failing under the group
        stops it; and a roll waiting for a slow preparation would hold the loop every group shares.
        """
        with self._lock:
            seg = self._segments.active
            if seg.size + size <= seg.capacity:
                return True
        return self._next_segment().ready()

    # --- appending -----------------------------------------------------------------------------

    def append(self, batch: bytes | bytearray | memoryview, *, epoch: int) -> AppendInfo:
        """Append one encoded batch as the leader: the log assigns its offsets and stamps `epoch`.

        The batch is checked (CRC, layout) first; nothing is written if it is invalid. Under the
        `fsync` policy the batch is on disk when this returns; otherwise see `wait_durable`.
        """
        size = len(batch)
        if size > self.config.batch_limit_bytes:
            raise BatchTooLargeError(f"batch of {size} bytes exceeds the limit of {self.config.batch_limit_bytes}")
        header = check_batch(batch, 0, size)
        if isinstance(header, str):
            raise InvalidBatchError(header)
        if header.size != size:
            raise InvalidBatchError(f"{size - header.size} bytes after the batch (append one batch at a time)")
        if epoch < 0:
            raise StaleEpochError(epoch, 0)
        started = time.perf_counter()
        with self._lock:
            self._check_writable()
            base = self._end_offset
            seg = self._prepare_write(size, epoch, base)
            pos = self._write(seg, batch, header, base, epoch)
            self._end_offset = seg.next_offset
            info = AppendInfo(base, seg.next_offset - 1, pos, size)
            notify = self._flusher.after_write()
        self._appended(started, size)
        if notify:
            self._flusher.notify_listeners()
        return info

    def append_replica(self, data: bytes | bytearray | memoryview, *, sync: bool = False) -> AppendInfo | None:
        """Append batches copied from a leader, keeping their offsets and epochs.

        The first batch must start at `end_offset` and each next one where the previous ended; all
        batches are checked before any is written, so a bad one leaves the log unchanged.
        With `sync`, everything appended is on disk when this returns, whatever the policy (the
        flusher thread is not woken; a failed sync fails the log as the thread's would, and raises).
        Returns where the batches went (None for empty `data`).
        """
        view = memoryview(data)
        headers = []
        pos = 0
        expected = self._end_offset
        while pos < len(view):
            header = check_batch(view, pos, len(view))
            if isinstance(header, str):
                raise InvalidBatchError(f"batch at byte {pos}: {header}")
            if header.size > self.config.batch_limit_bytes:
                raise BatchTooLargeError(f"batch of {header.size} bytes exceeds the limit of "
                                         f"{self.config.batch_limit_bytes}")
            if header.base_offset != expected:
                raise OffsetMismatchError(f"batch at byte {pos} starts at offset {header.base_offset}, "
                                          f"expected {expected}")
            headers.append((pos, header))
            expected = header.next_offset
            pos += header.size
        if not headers:
            return None
        started = time.perf_counter()
        with self._lock:
            self._check_writable()
            if headers[0][1].base_offset != self._end_offset:
                raise OffsetMismatchError(f"batches start at {headers[0][1].base_offset}, "
                                          f"the log ends at {self._end_offset}")
            latest = self._epochs.latest_epoch
            for _, h in headers:
                if latest is not None and h.leader_epoch < latest:
                    raise StaleEpochError(h.leader_epoch, latest)
                latest = h.leader_epoch
            first_pos = None
            for pos, h in headers:
                seg = self._prepare_write(h.size, h.leader_epoch, h.base_offset)
                written = self._write(seg, view[pos:pos + h.size], h)
                first_pos = written if first_pos is None else first_pos
                self._end_offset = seg.next_offset
            notify = self._flusher.after_write(sync=sync)
            assert first_pos is not None
            info = AppendInfo(headers[0][1].base_offset, self._end_offset - 1, first_pos, len(view))
        self._appended(started, len(view))
        if notify:
            self._flusher.notify_listeners()
        return info

    def _appended(self, started: float, size: int) -> None:
        observer = self.observer
        if observer is not None:
            observer.appended(time.perf_counter() - started, size)

    def _synced(self, started: float) -> None:
        observer = self.observer
        if observer is not None:
            observer.synced(time.perf_counter() - started)

    def _check_writable(self) -> None:
        if self._closed:
            raise LogClosedError(f"log {self.directory} is closed")
        if self._failure is not None:
            raise LogFailedError(f"log {self.directory} failed earlier: {self._failure}")

    def _prepare_write(self, size: int, epoch: int, base_offset: int) -> Segment:
        """Roll if the batch does not fit; record a new epoch. Returns the segment to write to."""
        seg = self._segments.active
        if seg.size + size > seg.capacity:
            if seg.size == 0:
                raise BatchTooLargeError(f"batch of {size} bytes does not fit in a segment of {seg.capacity}")
            seg = self._roll()
        latest = self._epochs.latest_epoch
        if latest is None or epoch > latest:
            # Durable before the batch is written: recovery checks every batch's epoch against it.
            self._epochs.assign(epoch, base_offset)
            try:
                self._epochs.write()
            except LogError:
                self._epochs.truncate_from_end(base_offset)
                raise
        elif epoch < latest:
            raise StaleEpochError(epoch, latest)
        return seg

    def _write(self, seg: Segment, batch: bytes | bytearray | memoryview, header: BatchHeader,
               base_offset: int | None = None, epoch: int | None = None) -> int:
        try:
            return seg.write(batch, header, base_offset, epoch)
        except LogError as exc:
            self._fail(exc)  # a partial write: nothing after it can be trusted until reopened
            raise

    def _roll(self) -> Segment:
        """Seal the full active segment and start a new one at the log end (lock held).

        The order is what recovery relies on. The old segment is synced before anything in the new
        one can be: damage in a segment that has a successor is corruption, never a torn tail. And it
        is trimmed (sealed) before the new segment's file exists: the recovery point may already be
        at its end (a close or a truncation leaves it at the log end), and a segment whose successor
        starts at or below the recovery point is opened as sealed, neither scanned nor trimmed. A
        crash between the seal and the new file leaves the sealed segment last: scanned and reused.
        """
        old = self._segments.active
        new_base = self._end_offset
        started = time.perf_counter()
        try:
            old.sync()
        except LogError as exc:
            self._fail(exc)
            raise
        self._synced(started)
        self._flusher.sealed(new_base)
        prepared = self._take_prepared()   # a full disk fails here, with the log unchanged
        try:
            old.seal()
        except LogError as exc:
            prepared.discard()
            self._fail(exc)
            raise
        try:
            new = self._install_segment(new_base, prepared)
        except LogError as exc:
            self._fail(exc)   # the old segment is sealed and no new one exists: nowhere to append
            raise
        self._segments.append(new)
        self._recovery_point = new_base
        self._write_offsets_checkpoint()
        self._flusher.wake_waiters()
        return new

    def _take_prepared(self) -> PreparedFile:
        """The next segment's file, prepared in the background or now (raises DiskFullError)."""
        return prepare_segment_file(self.directory, self.config.segment_bytes, self._preallocator)

    def _install_segment(self, base: int, prepared: PreparedFile) -> Segment:
        """Put a prepared file in place as the segment starting at `base`, and have the next one prepared."""
        seg = install_segment(self.directory, base, prepared, self.config.index_interval_bytes)
        if self._preallocator and self.config.preallocate_next_segment:
            self._preallocator.request()
        return seg

    def _adopt_new_segment(self, base: int) -> None:
        self._segments.append(self._install_segment(base, self._take_prepared()))

    # --- durability ----------------------------------------------------------------------------

    def _fail(self, error: LogError) -> None:
        """Record a fatal write/sync failure (lock held): all later writes and waits raise it."""
        if self._failure is None:
            self._failure = error
            logger.error("log %s failed: %s", self.directory, error)
        self._flusher.wake_waiters()
        self._flusher.wake_flusher()

    @property
    def failure(self) -> LogError | None:
        """The write or sync failure that made this log refuse writes, if one happened."""
        return self._failure

    def add_durability_listener(self, listener: DurabilityListener) -> None:
        """Call `listener(durable_offset)` whenever durability advances (from the thread that synced),
        and once more when a background sync fails (then `failure` is set).

        It runs without the log's lock and must not block (hand the value over to your own loop).
        """
        with self._lock:
            self._flusher.add_listener(listener)

    def wait_durable(self, offset: int, timeout: float | None = None) -> bool:
        """Block until `offset` is on disk; False on timeout. Raises LogFailedError after a failed sync."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._flusher.durable_offset <= offset:
                if self._failure is not None:
                    raise LogFailedError(f"log {self.directory} failed: {self._failure}")
                if offset >= self._end_offset:
                    raise OffsetOutOfRangeError(offset, self._log_start, self._end_offset)
                if self._closed:
                    raise LogClosedError(f"log {self.directory} is closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._flusher.wait(remaining)
            return True

    def flush(self) -> None:
        """Force everything appended so far to disk now, whatever the policy."""
        with self._lock:
            self._check_writable()
            if self._flusher.durable_offset < self._end_offset:
                self._flusher.sync_active()
        self._flusher.notify_listeners()

    # --- reading -------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int = 1 << 20, *, max_offset: int | None = None) -> LogRead:
        """Whole batches from the one holding `offset`, up to `max_bytes` (at least one batch).

        Stops at a segment boundary and before any batch reaching `max_offset` or beyond (pass the
        commit offset to read only committed data). Reading at `end_offset` returns no data.

        Every batch is checked before it is handed out (CRC, layout, its offset after the previous
        batch's, its epoch against the leader epoch cache): a damaged batch is never returned. A read
        that reaches one stops before it; one that starts at it, or past it in its segment, raises
        CorruptBatchError (see `eventlog.damage`)."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self.directory} is closed")
            segments = self._segments
            if not segments.first_base <= offset <= self._end_offset:
                raise OffsetOutOfRangeError(offset, segments.first_base, self._end_offset)
            limit_offset = self._end_offset if max_offset is None else min(max_offset, self._end_offset)
            i = segments.floor(offset)
            while True:
                if offset >= limit_offset:
                    return LogRead(memoryview(b""), offset, offset)
                seg = segments[i]
                try:
                    found = seg.locate(offset)
                except CorruptBatchError:
                    assert seg.damage is not None
                    self._damage_found(seg.damage)
                    raise
                if seg.damage is not None:   # found while loading its indexes
                    self._damage_found(seg.damage)
                if found is not None:
                    break
                # Past the last batch a cleaned segment kept: the next segment holds what follows.
                i += 1
                offset = segments.bases[i]
            start, h = found
            view = seg.view()
            start_offset = next_offset = h.base_offset
            end = start
            limit = seg.readable_end
            checked: BatchHeader | str = self._check_epoch(h)
            while True:
                if isinstance(checked, str):
                    damage = seg.mark_damaged(end, next_offset, checked)
                    self._damage_found(damage)
                    if end == start:
                        raise damage.error()
                    break
                h = checked
                batch_end = end + h.batch_length + LOG_OVERHEAD
                if h.base_offset + h.last_offset_delta >= limit_offset:
                    break
                if batch_end - start > max_bytes and end > start:
                    break
                end = batch_end
                next_offset = h.base_offset + h.last_offset_delta + 1
                if end >= limit:
                    break
                checked = seg.check_at(view, end, next_offset)
                if not isinstance(checked, str):
                    checked = self._check_epoch(checked)
            return LogRead(view[start:end], start_offset, next_offset)

    def _check_epoch(self, h: BatchHeader) -> BatchHeader | str:
        """`h`, or why its epoch is not the one the leader epoch cache records for its offset (lock held)."""
        recorded = self._epochs.epoch_for_offset(h.base_offset)
        if recorded is not None and recorded != h.leader_epoch:
            return (f"batch epoch {h.leader_epoch} at offset {h.base_offset}, but the leader epoch checkpoint "
                    f"records epoch {recorded} there")
        return h

    # --- damage (eventlog.damage) --------------------------------------------------------------

    @property
    def damage(self) -> Damage | None:
        """The lowest damaged batch of the log (None: none is known)."""
        return self._segments.damage

    def add_damage_listener(self, listener: DamageListener) -> None:
        """Call `listener(damage)` when a damaged batch is found (once per segment and position), from the
        thread that found it, sometimes with the log's lock held: it must not block or call the log."""
        with self._lock:
            self._damage_listeners.append(listener)

    def _damage_found(self, damage: Damage) -> None:
        """A segment recorded `damage` (lock held): update `damage`; the first time, log it (CRITICAL) and
        tell the listeners."""
        self._segments.refresh_damage()
        key = (damage.path, damage.position)
        if key in self._damage_reported:
            return
        self._damage_reported.add(key)
        logger.critical("log %s: %s", self.directory, damage.describe())
        for listener in list(self._damage_listeners):
            listener(damage)

    def sealed_segments(self) -> list[SealedSegment]:
        """The sealed segments (all but the active one), oldest first, that are not known to be damaged:
        what a scrub checks."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self.directory} is closed")
            return [SealedSegment(s.base_offset, s.next_offset, s.size, s.cleaned)
                    for s in self._segments[:-1] if s.damage is None]

    def scrub_segment(self, segment: SealedSegment, consumed: Callable[[int], None] | None = None) -> Damage | None:
        """Check every batch of sealed segment `segment` (from `sealed_segments`) as recovery would, reading
        its file without the log's lock; `consumed(bytes)` is called after each batch (pacing). The damage
        found, recorded as if a read had found it (None: the segment is whole, or it left the log
        meanwhile). Any thread."""
        path = self.directory / segment_name(segment.base_offset)
        with self._lock:
            epochs = self._epochs.entries
        starts = [start for _, start in epochs]
        def epoch_of(offset: int) -> int | None:
            j = bisect_right(starts, offset)
            return epochs[j - 1][0] if j else None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None   # deleted or swapped meanwhile
        try:
            st = os.fstat(fd)
            if st.st_size != segment.size or not segment.size:
                return None
            mm = mmap.mmap(fd, segment.size, prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        try:
            on_batch = None if consumed is None else (lambda _pos, h: consumed(h.batch_length + LOG_OVERHEAD))
            with memoryview(mm) as view:
                scan = scan_segment(view, segment.base_offset, expected_epoch=epoch_of, on_batch=on_batch,
                                    cleaned_end=segment.next_offset if segment.cleaned else None)
        finally:
            mm.close()
        if scan.status is ScanStatus.CLEAN and scan.valid_bytes == segment.size and (
                segment.cleaned or scan.next_offset == segment.next_offset):
            return None
        problem = scan.problem or (f"the batches end at byte {scan.valid_bytes} of {segment.size}"
                                   if scan.valid_bytes != segment.size else
                                   f"the batches end at offset {scan.next_offset}, the segment at {segment.next_offset}")
        return self.report_damage(segment.base_offset, st.st_ino, scan.valid_bytes, scan.next_offset, problem)

    def report_damage(self, base_offset: int, inode: int, position: int, offset: int, reason: str) -> Damage | None:
        """Record damage that a reader of a segment's file found outside the log (the scrub, a snapshot
        image's check), if that file (`inode`) is still the log's segment at `base_offset`: the damage
        recorded (None: the segment left the log or was replaced meanwhile)."""
        with self._lock:
            i = self._segments.floor(base_offset)
            if self._closed or i < 0 or self._segments.bases[i] != base_offset:
                return None
            seg = self._segments[i]
            try:
                if os.stat(seg.path).st_ino != inode:
                    return None
            except FileNotFoundError:
                return None
            damage = seg.mark_damaged(position, offset, reason)
            self._damage_found(damage)
            return damage

    def batches(self, start_offset: int | None = None, end_offset: int | None = None) -> Iterator[RecordBatch]:
        """Iterate the batches holding offsets in [start_offset, end_offset) (default: all)."""
        offset = self.start_offset if start_offset is None else start_offset
        while True:
            limit = self._end_offset if end_offset is None else end_offset
            if offset >= limit:
                return
            chunk = self.read(offset, 1 << 20, max_offset=limit)
            if chunk.next_offset == chunk.start_offset:
                return
            yield from chunk.batches()
            offset = chunk.next_offset

    def offset_for_timestamp(self, timestamp_ms: int) -> int | None:
        """The first offset whose record timestamp is >= `timestamp_ms` (None if there is none)."""
        with self._lock:
            for seg in self._segments:
                if seg.size == 0 or seg.max_timestamp < timestamp_ms:
                    if seg.damage is not None:
                        self._damage_found(seg.damage)
                    continue
                start = seg.indexes().time_index.last_offset_before(timestamp_ms)
                pos = 0 if start is None else seg.find_batch(start)[0]
                view = seg.view()
                while pos < seg.readable_end:
                    h = read_header(view, pos)
                    size = h.batch_length + LOG_OVERHEAD
                    if h.max_timestamp >= timestamp_ms:
                        for record in RecordBatch(h, view[pos:pos + size]).records():
                            if record.timestamp >= timestamp_ms:
                                return record.offset
                    pos += size
            return None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch that wrote `offset` (None when it is not in the log)."""
        with self._lock:
            if not self._segments.first_base <= offset < self._end_offset:
                return None
            return self._epochs.epoch_for_offset(offset)

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int] | None:
        """(largest epoch <= `epoch`, offset where its successor starts or the log end): see epoch_cache."""
        with self._lock:
            return self._epochs.end_offset_for_epoch(epoch, self._end_offset)

    # --- truncation and retention --------------------------------------------------------------

    def truncate_suffix(self, offset: int) -> None:
        """Remove every batch at or after `offset`, which must be a batch boundary (Raft divergence).

        Durable on return: a truncated entry never reappears after a crash. Inside a cleaned segment
        only its base offset is a boundary (the segment then goes whole): Raft never truncates what
        it committed, and only committed offsets are cleaned.
        """
        with self._files_lock, self._lock:
            self._check_writable()
            segments = self._segments
            if not segments.first_base <= offset <= self._end_offset:
                raise OffsetOutOfRangeError(offset, segments.first_base, self._end_offset)
            if offset == self._end_offset:
                return
            keep = segments.floor(offset)
            if segments.bases[keep] == offset and keep > 0 and not segments[keep - 1].cleaned:
                keep -= 1  # keep the previous segment whole and make it active again
            target = self._segments[keep]
            if target.cleaned and offset != target.base_offset:
                raise OffsetMismatchError(f"offset {offset} is inside the cleaned segment "
                                          f"[{target.base_offset}, {target.next_offset})")
            at_damage = target.damage is not None and offset == target.damage.offset
            if target.base_offset < offset < target.next_offset and not at_damage:
                _, h = target.find_batch(offset)
                if h.base_offset != offset:
                    raise OffsetMismatchError(f"offset {offset} falls inside the batch "
                                              f"[{h.base_offset}, {h.last_offset}]")
            # Validated; from here on a failure leaves the log half-truncated, so it is fatal.
            self._generation += 1
            self._files_generation += 1
            try:
                if self._recovery_point > offset:
                    self._recovery_point = offset
                    self._write_offsets_checkpoint()
                first_deleted = keep if target.cleaned else keep + 1
                for seg in reversed(segments[first_deleted:]):
                    seg.delete()
                fsync_dir(self.directory)
                segments.truncate_from(first_deleted)
                self._forget_cleaned(dirty_limit=offset)
                segments.changed()
                if target.cleaned:
                    self._adopt_new_segment(offset)   # the cleaned segment went whole
                else:
                    if target.sealed:
                        target.activate(self.config.segment_bytes)
                    target.truncate_to(offset)
            except LogError as exc:
                self._fail(exc)
                raise
            self._end_offset = offset
            self._flusher.truncated(offset)
            segments.refresh_damage()   # damage at or after `offset` went with its bytes
            if self._epochs.truncate_from_end(offset):
                self._epochs.write()

    def _forget_cleaned(self, dirty_limit: int | None = None) -> None:
        """Drop the cleaner checkpoint's lines of segments no longer in the log (and lower its dirty
        offset to `dirty_limit`), durably, before any new segment can reuse their base offsets."""
        kept = self._cleaner.keeping(list(self._segments.bases))
        if dirty_limit is not None and kept.dirty_offset > dirty_limit:
            kept = CleanerCheckpoint(dirty_limit, kept.segments, kept.swap)
        if kept != self._cleaner:
            kept.write(self.directory)
            self._cleaner = kept

    def delete_segments_below(self, offset: int) -> int:
        """Delete whole segments whose offsets are all below `offset` (retention, snapshots).

        The active segment is never deleted. Returns the number of segments deleted; the log then
        starts at the first remaining segment's base offset.
        """
        doomed = self.detach_segments_below(offset)
        for path in doomed:
            path.unlink(missing_ok=True)
        return sum(1 for p in doomed if p.name.endswith(".log.deleted"))

    def detach_segments_below(self, offset: int) -> list[Path]:
        """`delete_segments_below` but for the unlinking: the segments leave the log (the log start moves,
        durably) and their files are renamed to `<name>.deleted`; returns those files, for the caller to
        unlink (unlinking a 64 MiB file takes ~20 ms: do it off the event loop and outside the log's
        lock). Leftover `.deleted` files are removed when the log is opened (a key-compaction swap's
        `.deleted` files are garbage too: eventlog/cleaned.py)."""
        with self._files_lock, self._lock:
            self._check_writable()
            count = 0
            while count < len(self._segments) - 1 and self._segments[count].next_offset <= offset:
                count += 1
            if not count:
                return []
            doomed = self._segments[:count]
            self._files_generation += 1
            self._segments.drop_first(count)
            self._log_start = self._segments.first_base
            self._recovery_point = max(self._recovery_point, self._log_start)
            self._write_offsets_checkpoint()  # first: an interrupted deletion is finished on open
            detached = []
            for seg in doomed:
                seg.close()
                for path in (seg.path, seg.index_path, seg.timeindex_path):
                    target = path.with_name(path.name + ".deleted")
                    try:
                        os.rename(path, target)
                    except FileNotFoundError:
                        continue   # an index never written
                    detached.append(target)
            fsync_dir(self.directory)
            self._forget_cleaned()
            self._segments.changed()
            changed = self._epochs.truncate_from_start(self._log_start)
            changed |= self._epochs.truncate_from_end(self._end_offset)  # nothing left of an empty tail epoch
            if changed:
                self._epochs.write()
            return detached

    def reset(self, offset: int, prefix: PrefixInstall | None = None, source: Path | None = None) -> None:
        """Drop everything and continue empty at `offset` (a follower installing a snapshot).

        With `prefix` (its part files `<base>.log` in directory `source`, hard-linked, so `source`
        keeps its copies): the log then holds those segments below `offset`, as cleaned segments
        (`clean_end_offset` = `offset`), crash-safely (`eventlog.prefix`)."""
        if prefix is not None:
            assert source is not None and prefix.end == offset, (prefix.end, offset, source)
            self._reset_onto(prefix, source)
            return
        with self._files_lock, self._lock:
            self._check_writable()
            self._generation += 1
            self._files_generation += 1
            self._log_start = self._recovery_point = offset
            self._write_offsets_checkpoint()
            for seg in self._segments:
                seg.delete()
            fsync_dir(self.directory)
            self._segments.clear()
            self._segments.changed()
            if self._cleaner != CleanerCheckpoint():
                self._cleaner = CleanerCheckpoint()
                self._cleaner.write(self.directory)
            self._epochs.clear()
            self._epochs.write()
            self._adopt_new_segment(offset)
            self._end_offset = offset
            self._flusher.reset(offset)

    def _reset_onto(self, install: PrefixInstall, source: Path) -> None:
        """`reset` with a prefix: the steps of `eventlog.prefix`."""
        with self._files_lock, self._lock:
            self._check_writable()
            self._generation += 1
            self._files_generation += 1
            link_parts(source, self.directory, install.parts)                    # 1 (a failure: the old log stands)
            install.write(self.directory)                                        # 2: the commit point
            try:
                for seg in self._segments:
                    seg.close()
                replace_segments(self.directory, install)                        # 3, 4
                self._segments.clear()
                self._cleaner, self._epochs = write_install_checkpoints(self.directory, install)   # 5
                self._log_start, self._recovery_point = install.start, install.end
                for p in install.parts:
                    self._segments.append(Segment.sealed_lazy(self.directory, p.base, p.end,
                                                              self.config.index_interval_bytes, cleaned=True))
                self._adopt_new_segment(install.end)                             # 6
                self._segments.changed()
                PrefixInstall.remove(self.directory)                             # 7
            except LogError as exc:
                self._fail(exc)   # open rolls the install forward
                raise
            self._end_offset = install.end
            self._flusher.reset(install.end)

    # --- a prefix for a follower (eventlog.prefix, eventlog/raft/runtime/snapshot_image.py) ----------

    def prefix_parts(self, end_offset: int) -> tuple[int, list[PrefixPart]]:
        """The segments holding offsets below `end_offset` (a batch boundary), from the log start, the
        one holding `end_offset` cut there, and the files generation they describe (`link_prefix`).
        A damaged batch is never part of a prefix: the parts then start after the last damaged segment
        below `end_offset` (none, when the damage is in the segment holding it)."""
        with self._lock:
            if self._closed:
                raise LogClosedError(f"log {self.directory} is closed")
            if not self._segments.first_base <= end_offset <= self._end_offset:
                raise OffsetOutOfRangeError(end_offset, self._segments.first_base, self._end_offset)
            parts: list[PrefixPart] = []
            for seg in self._segments:
                if seg.base_offset >= end_offset:
                    break
                if seg.damage is not None and seg.damage.offset < end_offset:
                    parts = []
                    continue
                if seg.next_offset <= end_offset:
                    parts.append(PrefixPart(seg.base_offset, seg.next_offset, seg.size))
                    continue
                try:
                    found = seg.locate(end_offset)
                except CorruptBatchError:
                    assert seg.damage is not None
                    self._damage_found(seg.damage)
                    parts = []
                    break
                if found is not None and found[1].base_offset < end_offset:
                    raise OffsetMismatchError(f"offset {end_offset} falls inside the batch "
                                              f"[{found[1].base_offset}, {found[1].last_offset}]")
                parts.append(PrefixPart(seg.base_offset, end_offset, seg.size if found is None else found[0]))
            return self._files_generation, parts

    def link_prefix(self, generation: int, parts: list[PrefixPart], target: Path) -> bool:
        """Hard-link the files of `parts` (from `prefix_parts`) into directory `target`, so they stay
        readable whatever the log does next (a swap renames a new file in place; a deletion unlinks).
        False, and nothing linked, when a segment file changed since `generation`. Under the files
        lock, which every change of a segment file below the end takes (appends and rolls do not
        change the bytes of a part)."""
        with self._files_lock:
            with self._lock:
                if self._closed:
                    raise LogClosedError(f"log {self.directory} is closed")
                if generation != self._files_generation:
                    return False
            try:
                for p in parts:
                    os.link(self.directory / segment_name(p.base), target / segment_name(p.base))
            except OSError as exc:
                raise io_error(f"linking the segments of {self.directory} into {target}", exc) from exc
            return True

    # --- key compaction (see eventlog.cleaned and compaction/cleaner.py) ------------------------

    def cleanable_segments(self, below: int) -> CleanableSegments:
        """The sealed segments whose offsets are all below `below`, from the log start: what a
        cleaning pass may rewrite (never the active segment). The cleaner reads their files itself,
        without any lock (a sealed segment file never changes; if retention deletes one meanwhile,
        the pass is abandoned)."""
        with self._files_lock, self._lock:   # never in the middle of a swap
            if self._closed:
                raise LogClosedError(f"log {self.directory} is closed")
            out = []
            for seg in self._segments[:-1]:
                if seg.next_offset > below:
                    break
                out.append(SealedSegment(seg.base_offset, seg.next_offset, seg.size, seg.cleaned))
            return CleanableSegments(out, self._generation,
                                     max(self._cleaner.dirty_offset, self._segments.first_base))

    def cleaned_writer(self, base_offset: int, end_offset: int) -> CleanedSegmentWriter:
        """A writer for the cleaned segment that will replace the segments covering [base, end)."""
        return CleanedSegmentWriter(self.directory, base_offset, end_offset, self.config.index_interval_bytes)

    def swap_cleaned(self, cleaned: CleanedSegment, *, generation: int, dirty_offset: int) -> bool:
        """Put `cleaned` in place of the sealed segments covering [cleaned.base, cleaned.end), crash-safely
        (steps 2-8 of `eventlog.cleaned`), and record `dirty_offset` as where the next pass starts.

        False (and the cleaned files deleted) when the log changed meanwhile: those segments are no
        longer exactly there, or a truncation or reset happened since `cleanable_segments` returned
        `generation`. The main lock is held only to check and to replace the segment list; the file
        renames and directory syncs run under the files lock alone.
        """
        base, end = cleaned.base_offset, cleaned.end_offset
        with self._files_lock:
            with self._lock:
                try:
                    self._check_writable()
                except LogError:
                    cleaned.discard()
                    raise
                bases = self._segments.bases
                i = self._segments.floor(base)
                j = self._segments.floor(end)
                valid = (generation == self._generation and i >= 0 and bases[i] == base
                         and 0 <= j < len(bases) and bases[j] == end and j > i)
            if not valid:
                cleaned.discard()
                return False
            pending = self._cleaner.with_swap(base, end, dirty_offset)
            try:
                pending.write(self.directory)                                     # step 2
            except LogError:
                cleaned.discard()
                raise
            try:
                rename_state(self.directory, base, CLEANED_SUFFIX, SWAP_SUFFIX)   # step 3: the commit point
                fsync_dir(self.directory)
                self._cleaner = pending
                swap_file = cleaned_path(self.directory, base, state=SWAP_SUFFIX)
                new = Segment.from_cleaned_file(self.directory, base, end, self.config.index_interval_bytes,
                                                swap_file, cleaned.size, cleaned.indexes)
            except (OSError, LogError) as exc:
                self._swap_failed(exc)
            with self._lock:                                                      # step 4
                # Only appends (at the end) could change the list meanwhile: the rest takes the files lock.
                bases = self._segments.bases
                assert bases[i] == base and bases[j] == end, (list(bases), base, end)
                old = self._segments[i:j]
                self._files_generation += 1
                self._segments.replace(i, j, new)
                self._segments.changed()
            try:
                for seg in old:                                                   # step 5
                    seg.close()
                    rename_state(self.directory, seg.base_offset, "", DELETED_SUFFIX)
                rename_state(self.directory, base, SWAP_SUFFIX, "")               # step 6
                fsync_dir(self.directory)
                done = pending.after_swap()
                done.write(self.directory)                                        # step 7
                self._cleaner = done
            except (OSError, LogError) as exc:
                self._swap_failed(exc)
            for seg in old:                                                       # step 8
                for suffix in SEGMENT_SUFFIXES:
                    (self.directory / (segment_name(seg.base_offset, suffix) + DELETED_SUFFIX)).unlink(missing_ok=True)
            return True

    def _swap_failed(self, exc: OSError | LogError) -> NoReturn:
        """A swap failed after its checkpoint line was written: the log refuses writes until reopened,
        and opening finishes or undoes the swap."""
        error = exc if isinstance(exc, LogError) else io_error("swapping a cleaned segment", exc)
        with self._lock:
            self._fail(error)
        raise error

    # --- closing -------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, record the recovery point, stop background threads and release the directory."""
        with self._files_lock, self._lock:   # waits for a swap under way to finish
            if self._closed:
                return
            self._closed = True
            self._flusher.wake_flusher()
        self._flusher.join()
        with self._lock:
            if self._failure is None:
                try:
                    if self._flusher.durable_offset < self._end_offset:
                        self._flusher.sync_active()
                    self._recovery_point = self._end_offset
                    self._write_offsets_checkpoint()
                except EpochlogError as exc:
                    logger.error("closing log %s: %s", self.directory, exc)
            self._flusher.wake_waiters()
        if self._preallocator is not None:
            self._preallocator.close()
        self._release()

    def _release(self) -> None:
        for seg in self._segments:
            seg.close()
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Log({str(self.directory)!r}, [{self.start_offset}, {self._end_offset}))"
