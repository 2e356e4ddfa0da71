"""One segment of the log: a preallocated, memory-mapped file of record batches (CommitLog style).

File `<20-digit base offset>.log`: batches laid end to end from byte 0; the rest of the file is
zeros. The active (last) segment is preallocated to `segment_bytes`, zero-filled and synced before
its first append, so appends never extend the file (no metadata to sync, no ENOSPC mid-log). When
a segment is sealed it is trimmed to its data, so a sealed segment's file size is its data size.
Its `.index` and `.timeindex` are written next to it (see `eventlog.index`); they are derived data,
validated on first use and rebuilt when wrong.

Appends are written with `pwritev` into the file; the read-only shared mapping of the same pages
serves zero-copy reads. (Writing through a writable mapping was measured to make every fdatasync
about three times slower and each 16 KB copy several times costlier, through page faults.)

A **cleaned** segment (`cleaned` true; written by key compaction, see `eventlog.cleaned`) covers
the offsets [base_offset, next_offset) like any other, but holds only the records the cleaner kept:
its batches' offsets increase with gaps, and `next_offset` (the base of the next segment) may lie
past its last batch. It is always sealed.

A segment found damaged (`damage`, see `eventlog.damage`) is readable only below its first damaged
batch: `locate` checks every batch it walks over and raises CorruptBatchError at or past the damage.

Concurrency contract: a segment is mutated only by its `Log`, under the log's lock. Views handed
out by `view()` alias the mapping: they stay readable after the segment is sealed or deleted (the
mapping lives as long as a view does) but show zeros after a truncation below them.
"""

from __future__ import annotations

import logging
import mmap
import os
from bisect import bisect_left, bisect_right
from pathlib import Path

from eventlog.damage import Damage
from eventlog.errors import LogCorruptionError, OffsetMismatchError
from eventlog.fileutil import io_error
from eventlog.index import IndexBuilder, OffsetIndex, TimeIndex
from eventlog.records import (
    HEADER,
    LOG_OVERHEAD,
    MAGIC_OFFSET,
    MIN_BATCH_LENGTH,
    BatchHeader,
    check_batch,
    read_header,
    stamp,
)
from eventlog.scan import ScanStatus, scan_segment

log = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"
_ZEROS = bytes(1 << 20)
_PAGE = mmap.PAGESIZE


def segment_name(base_offset: int, suffix: str = LOG_SUFFIX) -> str:
    return f"{base_offset:020d}{suffix}"


def parse_segment_name(name: str) -> int | None:
    """Base offset of a `<20 digits>.log` file name, or None for any other name."""
    stem, dot, suffix = name.partition(".")
    if dot and "." + suffix == LOG_SUFFIX and len(stem) == 20 and stem.isdigit():
        return int(stem)
    return None


_IOV_MAX = 1024  # Linux's limit on buffers per pwritev call
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)


def pwrite_all(fd: int, buffers: list[bytes | bytearray | memoryview], position: int) -> None:
    """Write `buffers` back to back at `position` with as few pwritev calls as possible.

    One call releases the GIL once; many small writes from a background thread were measured to
    wait up to the interpreter's switch interval each while appenders run.
    """
    views = [memoryview(b) for b in buffers if len(b)]
    while views:
        written = os.pwritev(fd, views[:_IOV_MAX], position)
        position += written
        while views and written >= len(views[0]):
            written -= len(views[0])
            views.pop(0)
        if written:
            views[0] = views[0][written:]


def write_zeros(fd: int, start: int, end: int) -> None:
    full, rest = divmod(end - start, len(_ZEROS))
    pwrite_all(fd, [_ZEROS] * full + [_ZEROS[:rest]], start)


def map_readonly(fd: int, size: int) -> mmap.mmap:
    """A read-only shared mapping of the first `size` bytes, its pages faulted in up front."""
    return mmap.mmap(fd, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)


def prepare_file(path: Path, size: int) -> tuple[int, mmap.mmap]:
    """Create `path` as `size` zero bytes that are really allocated and on disk, and map it.

    posix_fallocate reserves the blocks (a full disk fails here, not in the middle of an append);
    writing zeros turns them into written extents so a later fdatasync has no extent metadata to
    commit; the sync makes the file's size durable. Returns (read-write fd, read-only mapping).
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        os.posix_fallocate(fd, 0, size)
        write_zeros(fd, 0, size)
        os.fdatasync(fd)
        mm = map_readonly(fd, size)
    except OSError as exc:
        os.close(fd)
        path.unlink(missing_ok=True)
        raise io_error(f"preparing segment file {path}", exc) from exc
    return fd, mm


class Segment:
    """A segment file, its mapping and its indexes."""

    def __init__(self, directory: Path, base_offset: int, index_interval_bytes: int) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.size = 0                # bytes of batches (write position)
        self.capacity = 0            # bytes the file (and its mapping) can hold
        self.next_offset = base_offset
        self.sealed = False
        self.cleaned = False         # rewritten by key compaction: offsets have gaps
        self.fd: int | None = None   # open only while active
        self._mm: mmap.mmap | None = None
        self._view: memoryview | None = None
        self._indexes: IndexBuilder | None = None
        self._indexes_exact = False  # built by appends or a scan, not loaded from the index files
        self.damage: Damage | None = None   # the first damaged batch found (eventlog.damage)

    # --- paths ---------------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        return self.directory / segment_name(self.base_offset)

    @property
    def index_path(self) -> Path:
        return self.directory / segment_name(self.base_offset, INDEX_SUFFIX)

    @property
    def timeindex_path(self) -> Path:
        return self.directory / segment_name(self.base_offset, TIMEINDEX_SUFFIX)

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def from_prepared(cls, directory: Path, base_offset: int, index_interval_bytes: int,
                      fd: int, mm: mmap.mmap) -> Segment:
        """An empty active segment over a file made by `prepare_file` (already renamed in place)."""
        seg = cls(directory, base_offset, index_interval_bytes)
        seg.fd, seg._mm = fd, mm
        seg._view = memoryview(mm)
        seg.capacity = len(mm)
        seg._indexes = IndexBuilder(base_offset, index_interval_bytes)
        seg._indexes_exact = True
        return seg

    @classmethod
    def sealed_lazy(cls, directory: Path, base_offset: int, next_offset: int,
                    index_interval_bytes: int, *, cleaned: bool = False) -> Segment:
        """A sealed segment below the recovery point: mapped and indexed on first use."""
        seg = cls(directory, base_offset, index_interval_bytes)
        seg.sealed = True
        seg.cleaned = cleaned
        seg.next_offset = next_offset
        seg.size = seg.capacity = seg.path.stat().st_size
        return seg

    @classmethod
    def from_cleaned_file(cls, directory: Path, base_offset: int, end_offset: int, index_interval_bytes: int,
                          path: Path, size: int, indexes: IndexBuilder) -> Segment:
        """A cleaned segment over a complete file at `path` (its `.swap` name during the swap: the
        mapping stays valid across the rename to the final name), with its exact indexes."""
        seg = cls(directory, base_offset, index_interval_bytes)
        seg.sealed = seg.cleaned = True
        seg.next_offset = end_offset
        seg.size = seg.capacity = size
        if size:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                seg._mm = map_readonly(fd, size)
            finally:
                os.close(fd)
            seg._view = memoryview(seg._mm)
        else:
            seg._view = memoryview(b"")
        seg._indexes = indexes
        seg._indexes_exact = True
        return seg

    def open_for_scan(self) -> memoryview:
        """Map the whole file (to scan it); returns the view."""
        return self.view()

    def adopt_scan(self, valid_bytes: int, next_offset: int, builder: IndexBuilder) -> None:
        """Take the results of a recovery scan as this segment's state."""
        self.size = valid_bytes
        self.next_offset = next_offset
        self._indexes = builder
        self._indexes_exact = True

    def activate(self, capacity: int) -> None:
        """Make this segment the one appends go to: grow the file to `capacity` and map it."""
        file_size = self.path.stat().st_size
        if file_size < capacity:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.posix_fallocate(fd, 0, capacity)
                os.fsync(fd)
            except OSError as exc:
                raise io_error(f"growing {self.path}", exc) from exc
            finally:
                os.close(fd)
        self._unmap()
        self._map()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        self.sealed = False
        if not self._indexes_exact:
            # Appends continue the indexing rule where it stopped: that state is not in the files.
            self._indexes = self._rebuild_indexes(verify=False)
            self._indexes_exact = True

    def _map(self) -> None:
        if self._mm is not None:
            return
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            length = os.fstat(fd).st_size
            self.capacity = length
            if length == 0:
                self._view = memoryview(b"")
                return
            self._mm = map_readonly(fd, length)
        finally:
            os.close(fd)
        self._view = memoryview(self._mm)

    def _unmap(self) -> None:
        """Forget the mapping; it is really unmapped once no view of it is left."""
        self._view = None
        self._mm = None

    # --- reading -------------------------------------------------------------------------------

    def view(self) -> memoryview:
        """The mapped bytes (map a lazily opened sealed segment on first use)."""
        if self._view is None:
            self._map()
            assert self._view is not None
        return self._view

    def indexes(self) -> IndexBuilder:
        """The segment's indexes, loaded and validated (or rebuilt) on first use."""
        if self._indexes is None:
            self._indexes = self._load_indexes()
        return self._indexes

    @property
    def max_timestamp(self) -> int:
        return self.indexes().max_timestamp

    def header_at(self, position: int) -> BatchHeader:
        return read_header(self.view(), position)

    def find_batch(self, offset: int) -> tuple[int, BatchHeader]:
        """(position, header) of the batch holding `offset`, which must be in [base, next).

        In a cleaned segment: the first batch holding `offset` or a later one (see `locate`).
        """
        found = self.locate(offset)
        if found is None:
            raise LogCorruptionError(str(self.path), self.size, f"offset {offset} not found in the segment")
        return found

    def locate(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the first batch whose last offset is at or after `offset`, which
        must be in [base, next); None when there is none (only possible in a cleaned segment, for an
        offset past its last kept batch). Every batch walked over is checked (`check_at`); the first
        that fails is recorded as the segment's damage and CorruptBatchError raised, as it is for an
        offset at or past known damage."""
        assert self.base_offset <= offset < self.next_offset, (offset, self.base_offset, self.next_offset)
        if self.damage is not None and offset >= self.damage.offset:
            raise self.damage.error()
        expected, pos = self.indexes().index.floor(offset)
        view = self.view()
        limit = self.readable_end
        while pos < limit:
            h = self.check_at(view, pos, expected)
            if isinstance(h, str):
                raise self.mark_damaged(pos, expected, h).error()
            if h.base_offset + h.last_offset_delta >= offset:
                return pos, h
            expected = h.next_offset
            pos += h.batch_length + LOG_OVERHEAD
        return None

    def check_at(self, view: memoryview, pos: int, expected: int) -> BatchHeader | str:
        """The header of the batch at `pos` if it passes every check a read makes, else why not: layout
        and CRC (`check_batch`), starting at `expected` (the previous batch's end; at or after it in a
        cleaned segment) and ending inside the segment's offsets. (The epoch is checked by the log,
        which holds the leader epoch cache.)"""
        h = check_batch(view, pos, self.readable_end)
        if isinstance(h, str):
            return h
        if h.base_offset != expected and (not self.cleaned or h.base_offset < expected):
            return f"batch base offset {h.base_offset}, expected {expected}"
        if h.next_offset > self.next_offset:
            return f"batch [{h.base_offset}, {h.last_offset}] runs past the segment's end offset {self.next_offset}"
        return h

    @property
    def readable_end(self) -> int:
        """Bytes that may be read: the data, up to the first damaged batch."""
        return self.size if self.damage is None else min(self.size, self.damage.position)

    def mark_damaged(self, position: int, offset: int, reason: str) -> Damage:
        """Record the batch at `position` (offset `offset`) as damaged, unless damage was already found
        at or before it; returns the segment's damage."""
        if self.damage is None or position < self.damage.position:
            self.damage = Damage(offset, str(self.path), position, reason, self.base_offset, self.next_offset,
                                 self.cleaned)
        return self.damage

    # --- writing (active segment only) ---------------------------------------------------------

    def write(self, batch: bytes | bytearray | memoryview, header: BatchHeader,
              base_offset: int | None = None, epoch: int | None = None) -> int:
        """Copy a batch to the end of the segment, optionally stamping offset and epoch.

        Returns its position. The caller checked it fits (`size + len <= capacity`).
        """
        assert not self.sealed and self.fd is not None
        pos = self.size
        end = pos + len(batch)
        assert end <= self.capacity
        if base_offset is not None:
            # Stamped before writing: a crash mid-write must never leave a CRC-valid batch that still
            # carries the placeholder offset and epoch.
            assert epoch is not None
            prefix = bytearray(batch[:MAGIC_OFFSET])
            stamp(prefix, base_offset, epoch)
            buffers = [prefix, memoryview(batch)[MAGIC_OFFSET:]]
        else:
            buffers = [batch]
            base_offset = header.base_offset
        try:
            pwrite_all(self.fd, buffers, pos)
        except OSError as exc:
            raise io_error(f"writing {self.path}", exc) from exc
        assert self._indexes is not None
        self._indexes.add(base_offset, pos, len(batch), header.max_timestamp)
        self.size = end
        self.next_offset = base_offset + header.last_offset_delta + 1
        return pos

    def sync(self) -> None:
        """fdatasync the segment's data (the mapping shares the file's page cache)."""
        assert self.fd is not None
        try:
            os.fdatasync(self.fd)
        except OSError as exc:
            raise io_error(f"fdatasync of {self.path}", exc) from exc

    def seal(self) -> None:
        """Finish a full segment: trim the file to its data, write its indexes, close the fd.

        The caller has synced the data. Trimming while mapped is safe: nothing reads past `size`.
        """
        assert not self.sealed and self.fd is not None
        indexes = self.indexes()
        indexes.seal()
        try:
            os.ftruncate(self.fd, self.size)
            os.fsync(self.fd)
        except OSError as exc:
            raise io_error(f"trimming {self.path}", exc) from exc
        os.close(self.fd)
        self.fd = None
        self.sealed = True
        self.capacity = self.size
        self._write_indexes(indexes)

    def truncate_to(self, offset: int) -> None:
        """Remove the batches at and after `offset` (a batch boundary) and sync the zeroed bytes."""
        assert not self.sealed and self.fd is not None
        if offset >= self.next_offset:
            return
        if offset == self.base_offset:
            pos = 0
        elif self.damage is not None and offset == self.damage.offset:
            pos = self.damage.position   # cutting the damage away
        else:
            pos, h = self.find_batch(offset)
            if h.base_offset != offset:
                raise OffsetMismatchError(
                    f"offset {offset} falls inside the batch [{h.base_offset}, {h.last_offset}]")
        try:
            write_zeros(self.fd, pos, self.size)
        except OSError as exc:
            raise io_error(f"truncating {self.path}", exc) from exc
        self.size = pos
        self.next_offset = offset
        self.sync()
        if self.damage is not None and self.damage.position >= pos:
            self.damage = None
        self._indexes = self._rebuild_indexes(verify=False)

    def zero_range(self, start: int, end: int) -> None:
        """Zero bytes [start, end) (cutting a torn tail) and sync them."""
        fd = self.fd if self.fd is not None else os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        try:
            write_zeros(fd, start, end)
            os.fdatasync(fd)
        except OSError as exc:
            raise io_error(f"fdatasync of {self.path}", exc) from exc
        finally:
            if fd != self.fd:
                os.close(fd)

    def trim_file(self) -> None:
        """Make the file exactly `size` bytes (a sealed segment left untrimmed by a crash)."""
        if self.path.stat().st_size != self.size:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
            try:
                os.ftruncate(fd, self.size)
                os.fsync(fd)
            except OSError as exc:
                raise io_error(f"trimming {self.path}", exc) from exc
            finally:
                os.close(fd)
        self.capacity = self.size

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._unmap()

    def delete(self) -> None:
        """Close and unlink the segment and its indexes (views already handed out stay valid)."""
        self.close()
        for p in (self.path, self.index_path, self.timeindex_path):
            p.unlink(missing_ok=True)

    # --- indexes -------------------------------------------------------------------------------

    def _write_indexes(self, indexes: IndexBuilder) -> None:
        # Derived data: written without fsync; a torn or stale file fails validation and is rebuilt.
        try:
            self.index_path.write_bytes(indexes.index.to_bytes())
            self.timeindex_path.write_bytes(indexes.time_index.to_bytes())
        except OSError as exc:
            log.warning("could not write the indexes of %s (they will be rebuilt): %s", self.path, exc)

    def _load_indexes(self) -> IndexBuilder:
        try:
            index = OffsetIndex.from_bytes(self.base_offset, self.index_path.read_bytes())
            time_index = TimeIndex.from_bytes(self.base_offset, self.timeindex_path.read_bytes())
            self._validate(index, time_index)
        except (OSError, ValueError) as exc:
            log.warning("rebuilding the indexes of %s: %s", self.path, exc)
            builder = self._rebuild_indexes(verify=True)
            builder.seal()
            if self.damage is None:   # a damaged segment's indexes cover only its readable part
                self._write_indexes(builder)
            return builder
        builder = IndexBuilder(self.base_offset, self.index_interval_bytes)
        builder.index, builder.time_index = index, time_index
        builder.max_timestamp = time_index.last_timestamp
        builder.max_timestamp_offset = time_index.offsets[-1] if len(time_index) else self.base_offset
        return builder

    def _validate(self, index: OffsetIndex, time_index: TimeIndex) -> None:
        """Check every entry against the data, and that none is missing at the end.

        Raises ValueError at the first problem.
        """
        view = self.view()
        for offset, pos in zip(index.offsets, index.positions):
            if pos + HEADER.size > self.size or read_header(view, pos).base_offset != offset:
                raise ValueError(f".index entry ({offset}, {pos}) does not point at that batch")
        pos = 0
        for ts, offset in zip(time_index.timestamps, time_index.offsets):
            if not self.base_offset <= offset < self.next_offset:
                raise ValueError(f".timeindex offset {offset} is outside the segment")
            # Entries increase: resume from the previous one's batch (one pass, whatever the .index).
            pos = max(pos, index.floor(offset)[1])
            h = None
            while pos < self.size:
                h = read_header(view, pos)
                if h.base_offset >= offset or h.batch_length <= 0:
                    break
                pos += h.batch_length + LOG_OVERHEAD
            if h is None or h.base_offset != offset or h.max_timestamp != ts:
                raise ValueError(f".timeindex entry ({ts}, {offset}) does not match the batch there")
        self._check_index_tails(view, index, time_index)

    def _check_index_tails(self, view: memoryview, index: OffsetIndex, time_index: TimeIndex) -> None:
        """Replay `IndexBuilder` over the batches from the last time entry's batch to the end: the
        files must hold exactly the entries it adds there, `seal`'s final one included.

        Entry-by-entry checks cannot see a file cut short (indexes are written without fsync, so a
        crash can leave one empty or short): a prefix of good entries is all good entries. But a time
        index that lost its last entries understates the segment's largest timestamp, and
        `offset_for_timestamp` then skips the segment. No batch before the last time entry's batch
        has a larger timestamp, so time entries lost from the end were all due at or after it (offset
        entries lost before it only make lookups walk further). The replay is short when timestamps
        grow with offsets: the last time entry is then the last batch or close to it.
        """
        if len(time_index):
            start_offset, pos = index.floor(time_index.offsets[-1])
        else:
            start_offset, pos = self.base_offset, 0
        replay = IndexBuilder(self.base_offset, self.index_interval_bytes)
        before = bisect_left(time_index.offsets, start_offset)  # time entries added before `pos`
        if before:
            ts, offset = time_index.timestamps[before - 1], time_index.offsets[before - 1]
            replay.time_index.maybe_append(ts, offset)
            replay.max_timestamp, replay.max_timestamp_offset = ts, offset
        seeded = len(replay.time_index)
        while pos < self.size:
            h = read_header(view, pos) if pos + HEADER.size <= self.size else None
            if h is None or h.batch_length < MIN_BATCH_LENGTH or pos + h.size > self.size:
                raise ValueError(f"no batch at byte {pos} while checking the indexes")
            replay.add(h.base_offset, pos, h.size, h.max_timestamp)
            pos += h.size
        replay.seal()
        after = bisect_right(index.offsets, start_offset)
        if (index.offsets[after:], index.positions[after:]) != (replay.index.offsets, replay.index.positions):
            raise ValueError(f".index entries after offset {start_offset} are missing or stale")
        if (time_index.timestamps[before:], time_index.offsets[before:]) != (
                replay.time_index.timestamps[seeded:], replay.time_index.offsets[seeded:]):
            raise ValueError(f".timeindex entries from offset {start_offset} on are missing or stale")

    def _rebuild_indexes(self, *, verify: bool) -> IndexBuilder:
        """Indexes from a scan of the data; with `verify`, data that does not scan clean to the end is
        recorded as the segment's damage (the indexes then cover the batches before it)."""
        scan = scan_segment(self.view(), self.base_offset, limit=self.size,
                            index_interval_bytes=self.index_interval_bytes,
                            cleaned_end=self.next_offset if self.cleaned else None)
        if verify and (scan.status is not ScanStatus.CLEAN or scan.valid_bytes != self.size):
            self.mark_damaged(scan.valid_bytes, scan.next_offset, scan.problem or "data ends before the end of the file")
        assert scan.builder is not None
        return scan.builder

    def __repr__(self) -> str:
        state = ("cleaned, " if self.cleaned else "") + ("sealed" if self.sealed else "active")
        return f"Segment({self.base_offset}..{self.next_offset}, {self.size} bytes, {state})"
