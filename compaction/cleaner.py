"""Key compaction of sealed segments below a horizon: Kafka's log cleaner, for one segmented log.

Theory of operation (Kafka's `LogCleaner`, whose design this follows):

- The log below the horizon `clean_below` is cleaned in passes. Only whole SEALED segments wholly
  below it are touched, never the active segment. Segments below the log's *dirty offset* (where
  the previous pass stopped mapping) form the clean section; the rest up to the horizon is dirty.
  A pass runs only when the dirty bytes are at least `min_cleanable_dirty_ratio` of all the bytes
  below the horizon, because it rewrites all of them.
- **Offset map.** The pass reads the dirty section and maps each record's compaction key
  (`key_of(record key)`: by default the record key itself) to the offset of its latest record
  there, in a bounded map (`offset_map_max_keys`, Kafka's dedupe buffer: keys up to 48 bytes as
  they are, longer ones by a 128-bit BLAKE2b digest, as Kafka hashes with MD5). When it fills, the pass maps no further: records past the last mapped
  one are kept as they are and the next pass starts there.
- **Horizon semantics.** Only records below the horizon supersede: a record is dropped when a later
  record of the same key, also below the horizon (and mapped), exists. Records at or above the
  horizon are never considered, so reading the cleaned log up to the horizon gives every key's
  state at the horizon (the latest record of each key), and everything from the horizon on is the
  log as written. (Kafka's "first uncleanable offset" plays the same role.)
- **Tombstones** (`is_tombstone(record)`: by default a null value, Kafka's rule; asked only of a
  record that is its key's latest, in a batch past the delete horizon) are kept while
  they are the latest of their key, until `delete_retention_ms` after the newest data of the clean
  section (log time, from record timestamps: Kafka measures from the segment's modification time),
  then dropped, so a reader who starts at the log start has that long to see a delete.
- **Rewriting.** The segments from the log start up to the end of the mapped section are grouped
  (consecutive segments whose sizes add up to at most `segment_bytes`, offsets spanning less than
  2**31) and each group is rewritten as ONE cleaned segment holding the batches it keeps: a batch
  whose records are all kept is copied byte for byte; one that lost some is rebuilt with
  `records.retain_spans` (same base offset, last offset delta, epoch, timestamps, producer fields;
  the kept records' bytes copied as they are, so every kept record keeps its offset, and the
  batch's partitionLeaderEpoch stays the Raft term); one that lost all disappears. Every batch read is CRC-checked first, so damage is never
  laundered into a fresh CRC. The group is swapped in by `Log.swap_cleaned` (crash-safe, see
  `eventlog.cleaned`) before the next group is read.
- **Records the cleaner cannot judge** are kept: records whose key function returns None (null
  keys; for Epochlog's events, those whose record key does not name what they overwrite, such as
  a `txn/...` transaction), and batches compressed with a codec other than gzip.
- **Why the key is a function of the record key**: mapping must not decode values (it is the hot
  loop, and the log layer knows nothing of event types); Epochlog's record key is the entity key.

Costs and manners: the cleaner runs in its own thread (`LogCleaner`), never on a group's loop; it
reads the mapped segment files without the log's lock and takes it only to swap the segment list.
Its IO is throttled (`max_io_bytes_per_second`) and it gives the interpreter lock up every
`YIELD_INTERVAL_S` of work, so the appending loop is not starved (Python threads share one lock).

A Raft group's log must only be cleaned below min(commit offset, latest snapshot index + 1): the
storage serves no entry below `Log.clean_end_offset` (a follower that needs one gets the snapshot).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, replace

from compaction.config import CleanerConfig
from eventlog.cleaned import CleanedSegmentWriter
from eventlog.errors import EpochlogError, LogCorruptionError, UnsupportedCompressionError
from eventlog.log import Log, SealedSegment
from eventlog.records import (
    BatchHeader,
    Record,
    RecordSpan,
    check_batch,
    decode_record,
    read_header,
    record_spans,
    records_payload,
    retain_spans,
)

logger = logging.getLogger(__name__)

KeyOf = Callable[[bytes | None], bytes | None]   # record key -> compaction key (None: never compacted)
IsTombstone = Callable[[Record], bool]

YIELD_INTERVAL_S = 0.002   # give the GIL to other threads at least this often
YIELD_SLEEP_S = 0.0001
MAX_GROUP_SPAN = 2**31 - 1  # offsets relative to a segment's base are 32-bit in its index
_DIGEST_BYTES = 16
_RAW_KEY_BYTES = 48


def record_key(key: bytes | None) -> bytes | None:
    """The default key function: the record key itself (a null key is never compacted)."""
    return key


def null_value(record: Record) -> bool:
    """The default tombstone test: a null value (Kafka's rule)."""
    return record.value is None


class CleanerAbortedError(EpochlogError):
    """A cleaning pass was stopped (the cleaner is closing); what it swapped in stays, the rest is
    left for the next pass."""

    code = "cleaner_aborted"
    retriable = True


@dataclass(frozen=True, slots=True)
class CleanResult:
    """What one cleaning pass of one log did."""

    clean_below: int            # the horizon asked for
    cleaned_through: int        # end of the last segment rewritten (a segment boundary); the log start if none
    dirty_offset: int           # where the next pass starts mapping
    segments_before: int        # segments rewritten
    segments_after: int         # cleaned segments that replaced them
    bytes_before: int
    bytes_after: int
    records_read: int
    records_kept: int
    records_dropped: int        # superseded by a later record of their key, tombstones included
    tombstones_dropped: int     # of which: tombstones past their retention
    offset_map_keys: int
    offset_map_full: bool       # the map filled up: the next pass continues from `dirty_offset`
    seconds: float
    skipped: str | None = None  # why the pass did nothing
    aborted: str | None = None  # why it stopped before the end (what it swapped in stays)

    @property
    def bytes_per_second(self) -> float:
        return self.bytes_before / self.seconds if self.seconds > 0 else 0.0

    def summary(self) -> str:
        """One line for people."""
        if self.skipped:
            return f"nothing cleaned: {self.skipped}"
        text = (f"cleaned {self.segments_before} segments into {self.segments_after} below offset "
                f"{self.cleaned_through}: {self.bytes_before:,} -> {self.bytes_after:,} bytes, "
                f"{self.records_kept:,} records kept, {self.records_dropped:,} dropped "
                f"({self.tombstones_dropped:,} tombstones) in {self.seconds:.2f} s")
        if self.offset_map_full:
            text += f"; offset map full ({self.offset_map_keys:,} keys): the next pass continues at {self.dirty_offset}"
        if self.aborted:
            text += f"; stopped early: {self.aborted}"
        return text


class OffsetMap:
    """Key -> offset of its latest record, holding at most `max_keys` keys (Kafka's SkimpyOffsetMap).

    Keys up to 48 bytes are stored as they are (a Python bytes object of a short key costs about as
    much as one of a digest, and needs no hashing), longer ones as their 16-byte BLAKE2b digest (two
    keys share a slot with probability ~2**-128 per pair: a digest equal to another key). Not
    thread-safe.
    """

    __slots__ = ("_map", "max_keys")

    def __init__(self, max_keys: int) -> None:
        self.max_keys = max_keys
        self._map: dict[bytes, int] = {}

    @staticmethod
    def slot(key: bytes) -> bytes:
        return key if len(key) <= _RAW_KEY_BYTES else hashlib.blake2b(key, digest_size=_DIGEST_BYTES).digest()

    def put(self, key: bytes, offset: int) -> bool:
        """Record `offset` as the latest of `key`; False (nothing recorded) when the map is full."""
        slot = self.slot(key)
        if slot not in self._map and len(self._map) >= self.max_keys:
            return False
        self._map[slot] = offset
        return True

    def get(self, key: bytes) -> int | None:
        return self._map.get(self.slot(key))

    def __len__(self) -> int:
        return len(self._map)


class Pacer:
    """Throttles the cleaner's IO to `bytes_per_second` (0: no limit; Kafka's Throttler) and yields
    the interpreter lock every `YIELD_INTERVAL_S` of work. Not thread-safe (one cleaner thread)."""

    def __init__(self, bytes_per_second: int, *, window_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.bytes_per_second = bytes_per_second
        self.window_s = window_s
        self._clock = clock
        self._sleep = sleep
        self._window_start = clock()
        self._window_bytes = 0
        self._last_yield = clock()
        self.slept_s = 0.0

    def consumed(self, nbytes: int) -> None:
        now = self._clock()
        if self.bytes_per_second > 0:
            self._window_bytes += nbytes
            elapsed = now - self._window_start
            due = self._window_bytes / self.bytes_per_second
            if due > elapsed and (due - elapsed >= 0.001 or elapsed >= self.window_s):
                self._pause(due - elapsed)
                now = self._clock()
            if elapsed >= self.window_s:
                self._window_start, self._window_bytes = now, 0
        if now - self._last_yield >= YIELD_INTERVAL_S:
            self._pause(YIELD_SLEEP_S)

    def _pause(self, seconds: float) -> None:
        self._sleep(seconds)
        self.slept_s += seconds
        self._last_yield = self._clock()


@dataclass(slots=True)
class _Stats:
    segments_before: int = 0
    segments_after: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_read: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0
    cleaned_through: int = -1


def clean_log(log: Log, clean_below: int, config: CleanerConfig | None = None, *,
              key_of: KeyOf = record_key, is_tombstone: IsTombstone = null_value, force: bool = False,
              pacer: Pacer | None = None, should_stop: Callable[[], bool] | None = None) -> CleanResult:
    """One cleaning pass of `log` below `clean_below` (see the module docstring); runs in the caller's
    thread (use `LogCleaner` for a background thread). `force` ignores the dirty ratio.

    Never blocks appends; raises what the log raises (LogCorruptionError for a damaged batch,
    DiskFullError, LogFailedError), CleanerAbortedError when `should_stop()` became true.
    """
    config = config or CleanerConfig()
    config.validate()
    pacer = pacer or Pacer(config.max_io_bytes_per_second)
    started = time.perf_counter()
    state = log.cleanable_segments(clean_below)
    segments = state.segments
    dirty_from = state.dirty_offset

    def result(stats: _Stats, dirty: int, offset_map: OffsetMap | None, full: bool,
               skipped: str | None = None, aborted: str | None = None) -> CleanResult:
        through = stats.cleaned_through if stats.cleaned_through >= 0 else log.start_offset
        return CleanResult(clean_below, through, dirty, stats.segments_before, stats.segments_after,
                           stats.bytes_before, stats.bytes_after, stats.records_read, stats.records_kept,
                           stats.records_dropped, stats.tombstones_dropped,
                           len(offset_map) if offset_map is not None else 0, full,
                           time.perf_counter() - started, skipped, aborted)

    if not segments:
        return result(_Stats(), dirty_from, None, False,
                      skipped=f"no sealed segment is wholly below offset {clean_below}")
    dirty = [s for s in segments if s.next_offset > dirty_from]
    if not dirty:
        return result(_Stats(), dirty_from, None, False,
                      skipped=f"everything below offset {segments[-1].next_offset} is already cleaned")
    total_bytes = sum(s.size for s in segments)
    dirty_bytes = sum(s.size for s in dirty)
    ratio = dirty_bytes / total_bytes if total_bytes else 1.0
    if ratio < config.min_cleanable_dirty_ratio and not force:
        return result(_Stats(), dirty_from, None, False,
                      skipped=f"dirty ratio {ratio:.2f} is below min_cleanable_dirty_ratio "
                              f"{config.min_cleanable_dirty_ratio}")

    clean_section = [s for s in segments if s.next_offset <= dirty_from]
    clean_max_ts = max((_max_timestamp(s) for s in clean_section), default=None)
    delete_horizon_ms = None if clean_max_ts is None or clean_max_ts < 0 else clean_max_ts - config.delete_retention_ms

    offset_map = OffsetMap(config.offset_map_max_keys)
    mapped_end, full = _build_offset_map(dirty, dirty_from, offset_map, key_of, pacer, should_stop)
    to_clean = [s for s in segments if s.base_offset < mapped_end]
    stats = _Stats()
    for group in group_segments(to_clean, log.config.segment_bytes):
        if should_stop is not None and should_stop():
            raise CleanerAbortedError(f"stopped while cleaning {log.directory}")
        base, end = group[0].base_offset, group[-1].next_offset
        new_dirty = max(dirty_from, min(end, mapped_end))
        writer = log.cleaned_writer(base, end)
        try:
            group_stats = _clean_group(group, writer, offset_map, mapped_end, delete_horizon_ms, key_of,
                                       is_tombstone, pacer, should_stop)
            if len(group) == 1 and group[0].cleaned and end <= dirty_from and group_stats.records_dropped == 0:
                writer.discard()   # cleaned before, nothing to drop now: no swap
                continue
            cleaned = writer.finish()
        except BaseException:
            writer.discard()
            raise
        if not log.swap_cleaned(cleaned, generation=state.generation, dirty_offset=new_dirty):
            return result(stats, dirty_from, offset_map, full,
                          aborted=f"the log changed (truncated, reset or retention) before [{base}, {end}) "
                                  f"was swapped in")
        dirty_from = new_dirty
        stats.segments_before += len(group)
        stats.segments_after += 1
        stats.bytes_before += group_stats.bytes_before
        stats.bytes_after += cleaned.size
        stats.records_read += group_stats.records_read
        stats.records_kept += group_stats.records_kept
        stats.records_dropped += group_stats.records_dropped
        stats.tombstones_dropped += group_stats.tombstones_dropped
        stats.cleaned_through = end
    final = result(stats, dirty_from, offset_map, full)
    logger.info("log %s: %s", log.directory, final.summary())
    return final


def group_segments(segments: list[SealedSegment], max_bytes: int) -> list[list[SealedSegment]]:
    """Consecutive segments whose sizes add up to at most `max_bytes` (a lone larger one is a group
    of its own) and whose offsets span less than 2**31: each group becomes one cleaned segment, so
    repeated cleaning does not leave ever smaller segments (Kafka's groupSegmentsBySize)."""
    groups: list[list[SealedSegment]] = []
    for seg in segments:
        if groups:
            last = groups[-1]
            if (sum(s.size for s in last) + seg.size <= max_bytes
                    and seg.next_offset - last[0].base_offset <= MAX_GROUP_SPAN):
                last.append(seg)
                continue
        groups.append([seg])
    return groups


def _batches(seg: SealedSegment) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of a sealed segment, CRC-checked (a damaged one stops the pass)."""
    view = seg.data
    pos = 0
    while pos < seg.size:
        checked = check_batch(view, pos, seg.size)
        if isinstance(checked, str):
            raise LogCorruptionError(f"segment {seg.base_offset}", pos, f"while cleaning: {checked}")
        yield checked, view[pos:pos + checked.size]
        pos += checked.size


def _max_timestamp(seg: SealedSegment) -> int:
    view = seg.data
    pos, best = 0, -1
    while pos < seg.size:
        h = read_header(view, pos)
        best = max(best, h.max_timestamp)
        pos += h.size
    return best


def _spans(header: BatchHeader, raw: memoryview) -> tuple[bytes | memoryview, list[RecordSpan]] | None:
    """The batch's payload and record spans, or None when it cannot be decoded (an unsupported
    codec: the batch is kept whole)."""
    try:
        payload = records_payload(header, raw)
    except UnsupportedCompressionError:
        return None
    return payload, record_spans(header, payload)


def _build_offset_map(dirty: list[SealedSegment], dirty_from: int, offset_map: OffsetMap, key_of: KeyOf,
                      pacer: Pacer, should_stop: Callable[[], bool] | None) -> tuple[int, bool]:
    """Map the dirty section; returns (offset where mapping stopped, whether the map filled up).

    A segment is mapped only if its record count fits in what is left of the map (a conservative
    bound on its distinct keys), except the first, so each pass maps at least part of a segment.
    """
    mapped_end = dirty_from
    for n, seg in enumerate(dirty):
        if should_stop is not None and should_stop():
            raise CleanerAbortedError("stopped while building the offset map")
        if n > 0:
            count = sum(read_header(seg.data, pos).records_count for pos in _positions(seg))
            if len(offset_map) + count > offset_map.max_keys:
                return mapped_end, True
        for header, raw in _batches(seg):
            pacer.consumed(header.size)
            if header.last_offset < dirty_from:
                continue
            decoded = _spans(header, raw)
            if decoded is None:
                continue
            for span in decoded[1]:
                if span.offset < dirty_from:
                    continue
                key = key_of(span.key)
                if key is not None and not offset_map.put(key, span.offset):
                    return span.offset, True
        mapped_end = seg.next_offset
    return mapped_end, False


def _positions(seg: SealedSegment) -> Iterator[int]:
    pos = 0
    while pos < seg.size:
        yield pos
        pos += read_header(seg.data, pos).size


@dataclass(slots=True)
class _GroupStats:
    bytes_before: int = 0
    records_read: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0


def _clean_group(group: list[SealedSegment], writer: CleanedSegmentWriter, offset_map: OffsetMap, mapped_end: int,
                 delete_horizon_ms: int | None, key_of: KeyOf, is_tombstone: IsTombstone, pacer: Pacer,
                 should_stop: Callable[[], bool] | None) -> _GroupStats:
    stats = _GroupStats()
    for seg in group:
        stats.bytes_before += seg.size
        for header, raw in _batches(seg):
            if should_stop is not None and should_stop():
                raise CleanerAbortedError("stopped while cleaning")
            pacer.consumed(header.size)
            decoded = None if header.base_offset >= mapped_end else _spans(header, raw)
            if decoded is None:   # nothing below the mapped end, or undecodable: kept as it is
                writer.append(raw, header)
                stats.records_read += header.records_count
                stats.records_kept += header.records_count
                continue
            payload, spans = decoded
            if not spans:
                continue          # an empty batch below the mapped end holds nothing: dropped (Kafka)
            expired = delete_horizon_ms is not None and header.max_timestamp < delete_horizon_ms
            kept: list[RecordSpan] = []
            for span in spans:
                key = key_of(span.key) if span.offset < mapped_end else None
                if key is not None:
                    latest = offset_map.get(key)
                    if latest is not None and span.offset < latest:
                        stats.records_dropped += 1
                        continue
                    if expired and _is_tombstone(is_tombstone, header, payload, span):
                        stats.records_dropped += 1
                        stats.tombstones_dropped += 1
                        continue
                kept.append(span)
            stats.records_read += len(spans)
            stats.records_kept += len(kept)
            if len(kept) == len(spans):
                writer.append(raw, header)
            elif kept:
                rebuilt = retain_spans(header, payload, kept)
                writer.append(rebuilt, read_header(rebuilt))
                pacer.consumed(len(rebuilt))
    return stats


def _is_tombstone(is_tombstone: IsTombstone, header: BatchHeader, payload: bytes | memoryview,
                  span: RecordSpan) -> bool:
    if is_tombstone is null_value:
        return span.null_value       # no need to decode the record
    return is_tombstone(decode_record(header, payload, span))


class LogCleaner:
    """A background thread that cleans logs on request, one pass at a time (Kafka's cleaner thread).

    `submit(log, clean_below)` queues a pass and returns a Future of its `CleanResult` (a request for
    a log already queued raises that request's horizon and shares its Future). One throttle covers
    every log it cleans. `close()` stops it: a pass under way stops at its next batch (what it
    swapped in stays; its unfinished cleaned file is deleted) and queued requests are cancelled.

    Thread-safety: `submit`, `close` and the properties may be called from any thread.
    """

    def __init__(self, config: CleanerConfig | None = None, *, key_of: KeyOf = record_key,
                 is_tombstone: IsTombstone = null_value, name: str = "log-cleaner") -> None:
        self.config = config or CleanerConfig()
        self.config.validate()
        self._key_of = key_of
        self._is_tombstone = is_tombstone
        self._pacer = Pacer(self.config.max_io_bytes_per_second)
        self._cond = threading.Condition()
        self._queue: deque[_Request] = deque()
        self._closed = False
        self._last: CleanResult | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, log: Log, clean_below: int, *, force: bool = False) -> Future[CleanResult]:
        with self._cond:
            if self._closed:
                raise CleanerAbortedError("the log cleaner is closed")
            for i, queued in enumerate(self._queue):
                if queued.log is log:
                    self._queue[i] = replace(queued, clean_below=max(queued.clean_below, clean_below),
                                             force=queued.force or force)
                    return queued.future
            request = _Request(log, clean_below, force, Future())
            self._queue.append(request)
            self._cond.notify()
            return request.future

    @property
    def last_result(self) -> CleanResult | None:
        """The result of the last pass that finished."""
        return self._last

    def close(self, timeout: float | None = None) -> None:
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for request in pending:
            request.future.cancel()
        self._thread.join(timeout)

    def _stopping(self) -> bool:
        return self._closed

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                request = self._queue.popleft()
            if not request.future.set_running_or_notify_cancel():
                continue
            try:
                outcome = clean_log(request.log, request.clean_below, self.config, key_of=self._key_of,
                                    is_tombstone=self._is_tombstone, force=request.force, pacer=self._pacer,
                                    should_stop=self._stopping)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the Future
                if not isinstance(exc, CleanerAbortedError):
                    logger.error("cleaning %s below %d failed: %s", request.log.directory, request.clean_below, exc)
                request.future.set_exception(exc)
                continue
            self._last = outcome
            request.future.set_result(outcome)


@dataclass(frozen=True, slots=True)
class _Request:
    log: Log
    clean_below: int
    force: bool
    future: Future[CleanResult]
