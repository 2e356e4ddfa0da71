"""One cleaning pass over segment files: offset map, groups, cleaned files (no Log object needed).

`run_pass(job)` reads the sealed segments a `CleaningJob` names (by path, mapped read-only), decides
whether the pass is worth running (dirty ratio), maps the dirty section, groups the segments and
writes one `<base>.log.cleaned` file per group (fsynced, with its indexes). It swaps nothing: the
caller hands each `CleanedGroup` to `Log.swap_cleaned`, in order. Everything a job and its output
hold is picklable, so the pass can run in a worker process (`compaction.worker`): the node's
interpreter lock is then never held by the cleaner's CPU work.

See `compaction.cleaner` for the semantics (horizon, offset map, tombstones, grouping).
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from compaction.config import CleanerConfig
from eventlog.cleaned import CleanedSegmentWriter
from eventlog import kafka_codes as kc
from eventlog.errors import EpochlogError, LogCorruptionError, UnsupportedCompressionError
from eventlog.index import IndexBuilder
from eventlog.log import SealedSegment
from eventlog.pacing import Pacer
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
    span_value,
)
from eventlog.segment import segment_name

KeyOf = Callable[[bytes | None], bytes | None]   # record key -> compaction key (None: never compacted)
IsTombstone = Callable[[Record], bool]


class CompactionKey(NamedTuple):
    """What a record sets, for a key function that looks at whole records (`RecordKeyOf`).

    `entity`: whose state the record writes. `aspect`: None when the record sets the entity's whole
    state (it supersedes every earlier record of the entity, whatever its aspect); otherwise the part
    of the state it sets wholly (it supersedes earlier records of that aspect only, and is superseded
    by a later record of the same aspect or of the whole entity); b"" for a record that changes a part
    no record sets wholly (only a later whole-state record of the entity supersedes it).
    """

    entity: bytes
    aspect: bytes | None = None


RecordKeyOf = Callable[[bytes | None, "bytes | memoryview | None"], CompactionKey | None]
"""(record key, record value) -> what the record sets, or None: never compacted (kept, supersedes nothing)."""

MAX_GROUP_SPAN = 2**31 - 1  # offsets relative to a segment's base are 32-bit in its index
_DIGEST_BYTES = 16
CLEANER_LOCK_NAME = ".cleaner.lock"
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
    grpc_status = "UNAVAILABLE"
    kafka_error = kc.UNKNOWN_SERVER_ERROR


class PassAbandonedError(CleanerAbortedError):
    """The pass cannot go on and is abandoned (the next one starts from what is there): a segment it
    was to read is gone (retention or a truncation deleted it), or another pass holds the log's
    cleaner lock."""


@dataclass(frozen=True, slots=True)
class CleaningJob:
    """What one pass works on (picklable: it may travel to a worker process)."""

    directory: str
    segments: tuple[SealedSegment, ...]   # the sealed segments wholly below the horizon, from the log start
    dirty_offset: int                     # where the previous pass stopped mapping
    config: CleanerConfig
    segment_bytes: int                    # the log's segment size: the most a cleaned group holds
    index_interval_bytes: int
    force: bool = False
    key_of: KeyOf = record_key
    is_tombstone: IsTombstone = null_value
    record_key_of: RecordKeyOf | None = None   # when set, used instead of `key_of` (it sees the value too)
    drop_offsets: frozenset[int] = frozenset()  # records that changed nothing: dropped, supersede nothing


@dataclass(frozen=True, slots=True)
class CleanedGroup:
    """One cleaned file written (`<base>.log.cleaned`), to replace the segments covering [base, end)."""

    base_offset: int
    end_offset: int
    size: int
    indexes: IndexBuilder
    dirty_offset: int          # the cleaner's dirty offset once this group is swapped in
    segments: int              # how many segments it replaces
    bytes_before: int
    records_read: int
    records_kept: int
    records_dropped: int
    tombstones_dropped: int
    noops_dropped: int = 0


@dataclass(frozen=True, slots=True)
class PassOutput:
    """What `run_pass` wrote: the groups in offset order (each to be swapped in), or why nothing."""

    groups: tuple[CleanedGroup, ...] = ()
    skipped: str | None = None
    mapped_end: int = 0
    offset_map_keys: int = 0
    offset_map_full: bool = False
    rss_anon_kib: int = 0      # the process's anonymous memory with the offset map built (Linux)
    seconds: float = 0.0


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


@dataclass(slots=True)
class _Mapped:
    """A segment and a read-only view of its file."""

    meta: SealedSegment
    data: memoryview

    @property
    def size(self) -> int:
        return self.meta.size


def run_pass(job: CleaningJob, pacer: Pacer | None = None,
             should_stop: Callable[[], bool] | None = None) -> PassOutput:
    """Run the pass `job` describes and write its cleaned files (see the module docstring).

    PassAbandonedError when a segment file disappeared (the log changed); LogCorruptionError for a
    batch that fails its CRC; CleanerAbortedError when `should_stop()` became true. On any error the
    cleaned files written so far are deleted.
    """
    started = time.perf_counter()
    config = job.config
    pacer = pacer or Pacer(config.max_io_bytes_per_second)
    segments = list(job.segments)
    dirty_from = job.dirty_offset
    skipped = skip_reason(segments, dirty_from, config, force=job.force)
    if skipped is not None:
        return PassOutput(skipped=skipped, mapped_end=dirty_from)
    directory = Path(job.directory)
    written: list[CleanedGroup] = []
    lock_fd = _lock_cleaner(directory)
    try:
        return _run_locked(job, segments, dirty_from, directory, written, pacer, should_stop, started)
    finally:
        os.close(lock_fd)   # releases the flock


def skip_reason(segments: list[SealedSegment], dirty_offset: int, config: CleanerConfig, *,
                force: bool = False) -> str | None:
    """Why a pass over `segments` (the sealed segments wholly below the horizon) would do nothing, or
    None when it is worth running: the dirty section (from `dirty_offset`) must hold at least
    `min_cleanable_dirty_ratio` of their bytes, unless `force`. Cheap: the node asks before it
    starts a worker process."""
    if not segments:
        return "no sealed segment is wholly below the horizon"
    dirty = [s for s in segments if s.next_offset > dirty_offset]
    if not dirty:
        return f"everything below offset {segments[-1].next_offset} is already cleaned"
    total_bytes = sum(s.size for s in segments)
    dirty_bytes = sum(s.size for s in dirty)
    ratio = dirty_bytes / total_bytes if total_bytes else 1.0
    if ratio < config.min_cleanable_dirty_ratio and not force:
        return f"dirty ratio {ratio:.2f} is below min_cleanable_dirty_ratio {config.min_cleanable_dirty_ratio}"
    return None


def _lock_cleaner(directory: Path) -> int:
    """Hold `.cleaner.lock` (flock) for the pass: two passes on one log (a worker left running by a
    node that died, and the restarted node's) never write the same `.cleaned` file."""
    fd = os.open(directory / CLEANER_LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise PassAbandonedError(f"another cleaning pass holds {directory / CLEANER_LOCK_NAME}") from None
    return fd


def _run_locked(job: CleaningJob, segments: list[SealedSegment], dirty_from: int, directory: Path,
                written: list[CleanedGroup], pacer: Pacer, should_stop: Callable[[], bool] | None,
                started: float) -> PassOutput:
    config = job.config
    # The mappings are closed when the last view of them goes (with this pass).
    mapped = [_Mapped(s, _map_file(directory, s)) for s in segments]
    try:
        clean_section = [m for m in mapped if m.meta.next_offset <= dirty_from]
        clean_max_ts = max((_max_timestamp(m) for m in clean_section), default=None)
        delete_horizon_ms = (None if clean_max_ts is None or clean_max_ts < 0
                             else clean_max_ts - config.delete_retention_ms)
        offset_map = OffsetMap(config.offset_map_max_keys)
        slots = _slot_function(job)
        mapped_end, full = _build_offset_map([m for m in mapped if m.meta.next_offset > dirty_from],
                                             dirty_from, offset_map, slots, job.drop_offsets, pacer, should_stop)
        rss_anon = _rss_anon_kib()
        to_clean = [m for m in mapped if m.meta.base_offset < mapped_end]
        by_base = {m.meta.base_offset: m for m in to_clean}
        new_dirty = dirty_from
        for group in group_segments([m.meta for m in to_clean], job.segment_bytes):
            if should_stop is not None and should_stop():
                raise CleanerAbortedError("stopped while cleaning")
            base, end = group[0].base_offset, group[-1].next_offset
            members = [by_base[s.base_offset] for s in group]
            writer = CleanedSegmentWriter(directory, base, end, job.index_interval_bytes)
            try:
                stats = _clean_group(members, writer, offset_map, mapped_end, delete_horizon_ms, slots,
                                     job.drop_offsets, job.is_tombstone, pacer, should_stop)
                if len(group) == 1 and group[0].cleaned and end <= new_dirty and stats.records_dropped == 0:
                    writer.discard()   # cleaned before, nothing to drop now: no swap
                    continue
                cleaned = writer.finish()
            except BaseException:
                writer.discard()
                raise
            new_dirty = max(new_dirty, min(end, mapped_end))
            written.append(CleanedGroup(base, end, cleaned.size, cleaned.indexes, new_dirty, len(group),
                                        stats.bytes_before, stats.records_read, stats.records_kept,
                                        stats.records_dropped, stats.tombstones_dropped, stats.noops_dropped))
    except BaseException:
        for g in written:
            discard_cleaned(directory, g)
        raise
    return PassOutput(tuple(written), None, mapped_end, len(offset_map), full, rss_anon,
                      time.perf_counter() - started)


def discard_cleaned(directory: Path, group: CleanedGroup) -> None:
    """Delete the cleaned files of a group that will not be swapped in."""
    from eventlog.cleaned import CleanedSegment

    CleanedSegment(directory, group.base_offset, group.end_offset, group.size, group.indexes).discard()


def _map_file(directory: Path, seg: SealedSegment) -> memoryview:
    path = directory / segment_name(seg.base_offset)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise PassAbandonedError(f"{path} is gone (retention or a truncation deleted it)") from None
    try:
        if os.fstat(fd).st_size != seg.size:
            raise PassAbandonedError(f"{path} is {os.fstat(fd).st_size} bytes, not {seg.size}: the log changed")
        if not seg.size:
            return memoryview(b"")
        mm = mmap.mmap(fd, seg.size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    return memoryview(mm)


def _rss_anon_kib() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _batches(seg: _Mapped) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Every batch of a sealed segment, CRC-checked (a damaged one stops the pass)."""
    view = seg.data
    pos = 0
    while pos < seg.size:
        checked = check_batch(view, pos, seg.size)
        if isinstance(checked, str):
            raise LogCorruptionError(segment_name(seg.meta.base_offset), pos, f"while cleaning: {checked}")
        yield checked, view[pos:pos + checked.size]
        pos += checked.size


def _positions(seg: _Mapped) -> Iterator[int]:
    pos = 0
    while pos < seg.size:
        yield pos
        pos += read_header(seg.data, pos).size


def _max_timestamp(seg: _Mapped) -> int:
    return max((read_header(seg.data, pos).max_timestamp for pos in _positions(seg)), default=-1)


def _spans(header: BatchHeader, raw: memoryview) -> tuple[bytes | memoryview, list[RecordSpan]] | None:
    """The batch's payload and record spans, or None when it cannot be decoded (an unsupported
    codec: the batch is kept whole)."""
    try:
        payload = records_payload(header, raw)
    except UnsupportedCompressionError:
        return None
    return payload, record_spans(header, payload)


_ASPECT_SEPARATOR = b"\x00"
_PARTIAL = b""   # the aspect slot of a partial record (an aspect slot is never empty: entity + NUL + aspect)

Slots = Callable[[bytes | None, "bytes | memoryview", RecordSpan], "tuple[bytes, bytes | None] | None"]
"""(record key, batch payload, span) -> the record's offset-map slots (entity slot, aspect slot), or None:
never compacted. Aspect slot None: the record sets the whole entity (mapped at, and superseded by, the
entity slot); `_PARTIAL`: superseded by the entity slot, mapped nowhere; else mapped at the aspect
slot, superseded by either."""


def _slot_function(job: CleaningJob) -> Slots:
    """The offset-map slots of a record, from the job's key function."""
    record_key_of = job.record_key_of
    if record_key_of is None:
        key_of = job.key_of

        def by_key(key: bytes | None, payload: bytes | memoryview, span: RecordSpan) -> tuple[bytes, None] | None:
            found = key_of(key)
            return None if found is None else (found, None)
        return by_key

    def by_record(key: bytes | None, payload: bytes | memoryview,
                  span: RecordSpan) -> tuple[bytes, bytes | None] | None:
        found = record_key_of(key, None if span.null_value else span_value(payload, span))
        if found is None:
            return None
        if found.aspect is None:
            return found.entity, None
        if not found.aspect:
            return found.entity, _PARTIAL   # superseded by a whole-state record of the entity only
        return found.entity, found.entity + _ASPECT_SEPARATOR + found.aspect
    return by_record


def _build_offset_map(dirty: list[_Mapped], dirty_from: int, offset_map: OffsetMap, slots: Slots,
                      drop: frozenset[int], pacer: Pacer, should_stop: Callable[[], bool] | None) -> tuple[int, bool]:
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
            payload = decoded[0]
            for span in decoded[1]:
                if span.offset < dirty_from or span.offset in drop:
                    continue                  # a record that changed nothing supersedes nothing
                found = slots(span.key, payload, span)
                if found is None:
                    continue
                entity, aspect = found
                if aspect == _PARTIAL:
                    continue                  # a partial record is the latest of nothing
                if not offset_map.put(entity if aspect is None else aspect, span.offset):
                    return span.offset, True
        mapped_end = seg.meta.next_offset
    return mapped_end, False


@dataclass(slots=True)
class _GroupStats:
    bytes_before: int = 0
    records_read: int = 0
    records_kept: int = 0
    records_dropped: int = 0
    tombstones_dropped: int = 0
    noops_dropped: int = 0


def _clean_group(group: list[_Mapped], writer: CleanedSegmentWriter, offset_map: OffsetMap, mapped_end: int,
                 delete_horizon_ms: int | None, slots: Slots, drop: frozenset[int], is_tombstone: IsTombstone,
                 pacer: Pacer, should_stop: Callable[[], bool] | None) -> _GroupStats:
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
                if span.offset >= mapped_end:
                    kept.append(span)
                    continue
                if span.offset in drop:
                    stats.records_dropped += 1
                    stats.noops_dropped += 1
                    continue
                found = slots(span.key, payload, span)
                if found is not None:
                    entity, aspect = found
                    latest = offset_map.get(entity)
                    if aspect is not None and aspect != _PARTIAL:
                        by_aspect = offset_map.get(aspect)
                        if by_aspect is not None and (latest is None or by_aspect > latest):
                            latest = by_aspect
                    if latest is not None and span.offset < latest:
                        stats.records_dropped += 1
                        continue
                    if aspect is None and expired and _is_tombstone(is_tombstone, header, payload, span):
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
