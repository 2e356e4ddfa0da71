"""What a snapshot is sent as: the state machine's data and, for a key-compacted group, the log below it.

Raft's InstallSnapshot moves an opaque byte string of `SnapshotMeta.size` bytes in chunks; the core
never looks inside. This module defines that string, the *image* of a snapshot at index N::

    0        magic b"EPLSNAP1"
    8        u32 big-endian H: length of the header
    12       header (JSON, `ImageHeader`): data_bytes, parts [[base, end, size]...], dirty_offset, epochs
    12 + H   the state machine's data (`data`: data_bytes bytes)
    ...      each part's bytes in order: the leader's segment file `base`, its first `size` bytes,
             covering offsets [base, end); the parts are contiguous and the last one ends at N + 1

A group whose log is key-compacted (`LogStorage.ships_log_prefix`) sends its log below N + 1: the
cleaned segments and the as-written ones, the last cut at N + 1 (`Log.prefix_parts`), with the
leader epoch cache over them and the cleaner's dirty offset; other groups send no part. A follower
that installs the image adopts the parts as its log's prefix (`Log.reset` with an
`eventlog.prefix.PrefixInstall`), so a Kafka reader of the group's topic from offset 0 sees every
key's latest record whichever member leads.

Serving (`SnapshotImage`). The leader cannot change an image once a transfer has read from it: a
chunk is asked for by snapshot index and byte offset only. So an image is built from a listing of the
log (cheap: `LogStorage.snapshot()` builds it whenever the core asks for the snapshot), and the first
time a chunk is read its files (the snapshot's `data` and the listed segments) are hard-linked into a
directory of its own (`Log.link_prefix`, refused if a segment file changed since the listing: then
the image is listed and linked again and the transfer starts over). From then on the image's bytes
are fixed and its own: the log's cleaner may swap segments, newer snapshots may replace its
snapshot, and a transfer still reading it goes on (`LogStorage` drops an image once its snapshot is
gone and no chunk was read from it for a while). Sealed files never change in place, so reads need
no lock and run in any thread (`read`). Disk cost: nothing while the log keeps the same files; a
segment the cleaner replaces while an image links it keeps its blocks until the image is dropped.
No damaged batch is ever shipped: the listing leaves out what the log knows to be damaged
(`Log.prefix_parts`), and `read` checks every batch of a part (CRC, order, epoch) before it hands out
bytes of it, raising CorruptBatchError at a damaged one (`LogStorage` then reports it to the log and
builds the image again, without it).

Receiving (`ImageStaging`). Chunks arrive in order; each is written, durably, to `data` or to
`prefix/<segment name>` in the incoming snapshot directory, and every batch of a part is checked as
it completes (CRC, offsets inside its part and ascending, epoch as the shipped epoch cache says), so
a damaged image is refused before anything of the follower's log changes. `finish` writes the
`PrefixInstall` manifest (`prefix/prefix-install`) that `LogStorage.install_snapshot` hands to the log.
"""

from __future__ import annotations

import os
import struct
import threading
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, NoReturn

import msgspec
from msgspec.structs import replace

from eventlog.errors import CorruptBatchError, LogCorruptionError
from eventlog.fileutil import atomic_write, fsync_dir, io_error
from eventlog.index import IndexBuilder
from eventlog.log import Log
from eventlog.prefix import PrefixInstall, PrefixPart
from eventlog.raft.types import MAX_TERM, SnapshotMeta
from eventlog.records import LOG_OVERHEAD, MIN_BATCH_LENGTH, check_batch
from eventlog.segment import INDEX_SUFFIX, TIMEINDEX_SUFFIX, segment_name

MAGIC = b"EPLSNAP1"
_FRAME = struct.Struct(">8sI")
MAX_HEADER_BYTES = 64 << 20
PREFIX_DIR = "prefix"
"""The directory of a staged or installed snapshot that holds its prefix until the log adopts it."""


class ImageHeader(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What follows the header in an image (see the module docstring)."""

    data_bytes: int
    parts: tuple[tuple[int, int, int], ...] = ()      # (base, end, size) of each prefix segment
    dirty_offset: int = 0                              # the leader's cleaner dirty offset, within the prefix
    epochs: tuple[tuple[int, int], ...] = ()           # (epoch, start offset) below the end of the prefix

    @property
    def prefix(self) -> tuple[PrefixPart, ...]:
        return tuple(PrefixPart(*p) for p in self.parts)

    def encode(self) -> bytes:
        body = msgspec.json.encode(self)
        return _FRAME.pack(MAGIC, len(body)) + body

    @property
    def body_bytes(self) -> int:
        return self.data_bytes + sum(p[2] for p in self.parts)


@dataclass(slots=True)
class SnapshotImage:
    """The image of one snapshot as this node serves it. `meta.size` is the image's size.

    `read` is thread-safe once `linked` (nothing it reads changes any more); linking and dropping are
    the owner's (`LogStorage`), on its loop."""

    meta: SnapshotMeta
    head: bytes
    data: Path                          # the snapshot's `data` file (its link, once linked)
    parts: list[PrefixPart]
    generation: int                     # the log's files generation the parts were listed at
    links: Path | None = None           # the directory of hard links to its files, once linked
    last_read: float = 0.0              # time.monotonic() of the last chunk read (the owner's)
    epochs: tuple[tuple[int, int], ...] = ()   # the header's (epoch, start offset): what each part's batches carry
    _pieces: list[tuple[int, int, int]] = field(default_factory=list)   # (start, length, source: -1 head, -2 data, i part)
    _checks: dict[int, _PartCheck] = field(default_factory=dict)       # part -> how far its batches were checked
    _check_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        data_bytes = os.stat(self.data).st_size
        start = 0
        for source, length in [(-1, len(self.head)), (-2, data_bytes)] + [(i, p.size) for i, p in enumerate(self.parts)]:
            self._pieces.append((start, length, source))
            start += length
        assert start == self.meta.size, (start, self.meta)

    @property
    def linked(self) -> bool:
        return self.links is not None

    def read(self, offset: int, max_bytes: int) -> bytes:
        """Bytes [offset, offset + max_bytes) of the image (fewer at its end)."""
        assert self.linked, "read before its files were linked"
        out = []
        end = min(self.meta.size, offset + max_bytes)
        for start, length, source in self._pieces:
            lo, hi = max(offset, start), min(end, start + length)
            if lo >= hi:
                continue
            if source == -1:
                out.append(self.head[lo - start:hi - start])
                continue
            if source == -2:
                path = self.data
            else:
                assert self.links is not None
                path = self.links / segment_name(self.parts[source].base)
                self._check_part(source, path, hi - start)
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                got = os.pread(fd, hi - lo, lo - start)
            finally:
                os.close(fd)
            if len(got) != hi - lo:
                raise LogCorruptionError(str(path), lo - start, f"{len(got)} bytes where the image has {hi - lo}")
            out.append(got)
        return b"".join(out)


    def _check_part(self, i: int, path: Path, through: int) -> None:
        """Check the batches of part `i` at least through byte `through` of it (whole batches, in order;
        each byte is checked once whatever the transfers read). CorruptBatchError at a damaged one."""
        part = self.parts[i]
        with self._check_lock:
            check = self._checks.get(i)
            if check is None:
                check = self._checks[i] = _PartCheck(part, path, _Epochs(self.epochs))
            done = check.checked + len(check.carried)
            if done >= min(through, part.size):
                return
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                while done < min(through, part.size):
                    piece = os.pread(fd, min(1 << 20, part.size - done), done)
                    if not piece:
                        raise LogCorruptionError(str(path), done, f"ends at byte {done}, the image has {part.size}")
                    try:
                        check.feed(piece)
                    except LogCorruptionError as exc:
                        raise CorruptBatchError(str(path), check.checked, check.next_offset, exc.reason) from None
                    done += len(piece)
            finally:
                os.close(fd)


def build_image(meta: SnapshotMeta, data: Path, log: Log | None) -> SnapshotImage:
    """The image of the snapshot `meta` (its data in file `data`), with the prefix of `log` below
    `meta.index + 1` when `log` is given and holds it (not linked yet: `SnapshotImage.links`)."""
    end = meta.index + 1
    generation, parts = 0, list[PrefixPart]()
    epochs: list[tuple[int, int]] = []
    dirty = 0
    if log is not None and log.start_offset < end <= log.end_offset:
        generation, parts = log.prefix_parts(end)
        if parts:   # none when the segment holding `end` is damaged below it: then the image has no prefix
            base = parts[0].base
            entries = [(e, s) for e, s in log.epoch_entries if s < end]
            first = max([i for i, (_, s) in enumerate(entries) if s <= base], default=0)
            epochs = [(e, max(s, base)) for e, s in entries[first:]]
            dirty = min(max(log.cleaner_dirty_offset, base), end)
    header = ImageHeader(os.stat(data).st_size, tuple((p.base, p.end, p.size) for p in parts), dirty, tuple(epochs))
    head = header.encode()
    return SnapshotImage(replace(meta, size=len(head) + header.body_bytes), head, data, parts, generation,
                         epochs=header.epochs)


class _PartCheck:
    """Checks the batches of one prefix part as its bytes arrive (a batch may span chunks). `path`
    names the part's file in errors only."""

    __slots__ = ("part", "path", "epoch_of", "checked", "next_offset", "_carry")

    def __init__(self, part: PrefixPart, path: Path, epoch_of: _Epochs) -> None:
        self.part = part
        self.path = path
        self.epoch_of = epoch_of
        self.checked = 0                 # bytes of whole, checked batches
        self.next_offset = part.base     # the next batch starts at or after it
        self._carry = b""                # the start of a batch not complete yet

    @property
    def carried(self) -> bytes:
        """Bytes fed that start a batch not complete yet."""
        return self._carry

    def copy(self) -> _PartCheck:
        other = _PartCheck(self.part, self.path, self.epoch_of)
        other.checked, other.next_offset, other._carry = self.checked, self.next_offset, self._carry
        return other

    def feed(self, data: bytes | memoryview) -> list[_Batch]:
        """Check the batches `data` completes; returns them (for the part's indexes)."""
        buf = self._carry + bytes(data) if self._carry else data
        found: list[_Batch] = []
        pos = 0
        while len(buf) - pos >= LOG_OVERHEAD:
            length = int.from_bytes(buf[pos + 8:pos + 12], "big", signed=True)
            total = LOG_OVERHEAD + length
            if length < MIN_BATCH_LENGTH or self.checked + total > self.part.size:
                self.fail(f"batch length {length} does not fit the part")
            if len(buf) - pos < total:
                break
            header = check_batch(buf, pos, pos + total)
            if isinstance(header, str):
                self.fail(header)
            if header.base_offset < self.next_offset or header.next_offset > self.part.end:
                self.fail(f"batch [{header.base_offset}, {header.last_offset}] is out of order or outside "
                          f"[{self.next_offset}, {self.part.end})")
            expected = self.epoch_of(header.base_offset)
            if header.leader_epoch != expected:
                self.fail(f"batch epoch {header.leader_epoch} at offset {header.base_offset}, the image's epoch "
                          f"cache says {expected}")
            found.append(_Batch(header.base_offset, self.checked, total, header.max_timestamp))
            self.next_offset = header.next_offset
            self.checked += total
            pos += total
        self._carry = bytes(buf[pos:])
        return found

    @property
    def complete(self) -> bool:
        return self.checked == self.part.size and not self._carry

    def fail(self, problem: str) -> NoReturn:
        raise LogCorruptionError(str(self.path), self.checked, f"snapshot image, prefix part {self.part}: {problem}")


class _Batch(NamedTuple):
    """A checked batch of a part: what the part's indexes need of it."""

    base_offset: int
    position: int
    size: int
    max_timestamp: int


class _Epochs:
    def __init__(self, entries: tuple[tuple[int, int], ...]) -> None:
        self.epochs = [e for e, _ in entries]
        self.starts = [s for _, s in entries]

    def __call__(self, offset: int) -> int | None:
        i = bisect_right(self.starts, offset)
        return self.epochs[i - 1] if i else None


class ImageCheck:
    """What the bytes of an image received so far say, checked without any IO: the header once whole,
    then every batch of a prefix part as it completes (CRC, offsets inside its part and ascending,
    epoch as the shipped epoch cache says). `feed` refuses (LogCorruptionError naming `directory`,
    where the image is staged) bytes that no valid image of `meta` holds there.

    Checking a chunk on a `copy` leaves this one as it was: so a chunk can be checked before a node
    accepts it (`LogStorage.snapshot_chunk_refusal`), and a refused one changes nothing. Not thread-safe."""

    def __init__(self, directory: Path, meta: SnapshotMeta) -> None:
        self.directory = directory
        self.meta = meta
        self.received = 0
        self.header: ImageHeader | None = None
        self.pieces: list[tuple[int, int, int]] = []   # (start, end, part index or -1: the data), once the header is
        self.parts: list[_PartCheck] = []
        self._head = b""

    def copy(self) -> ImageCheck:
        other = ImageCheck(self.directory, self.meta)
        other.received, other.header, other._head = self.received, self.header, self._head
        other.pieces = self.pieces                       # never changed once set
        other.parts = [p.copy() for p in self.parts]
        return other

    def feed(self, offset: int, chunk: bytes | memoryview) -> list[tuple[int, _Batch]]:
        """Take the chunk at image offset `offset` (the bytes received so far); returns the batches it
        completes, with the index of their part."""
        if offset != self.received:
            self._bad(f"chunk at byte {offset}, {self.received} bytes were received")
        if self.received + len(chunk) > self.meta.size:
            self._bad(f"chunk of {len(chunk)} bytes at byte {offset} runs past the image's {self.meta.size} bytes")
        view = memoryview(chunk)
        found: list[tuple[int, _Batch]] = []
        while view:
            if self.header is None:
                taken = self._take_head(view)
            else:
                start, end, part = self.piece_at(self.received)
                taken = min(end - self.received, len(view))
                if part >= 0:
                    found += [(part, b) for b in self.parts[part].feed(view[:taken])]
            view = view[taken:]
            self.received += taken
        return found

    def piece_at(self, position: int) -> tuple[int, int, int]:
        for piece in self.pieces:
            if piece[0] <= position < piece[1]:
                return piece
        raise AssertionError(f"no piece holds byte {position} of {self.pieces}")

    def check_whole(self) -> ImageHeader:
        """The header of the image, once every byte of it was received and every part ends with a
        whole batch (else LogCorruptionError)."""
        if self.header is None or self.received != self.meta.size:
            self._bad(f"{self.received} of {self.meta.size} bytes received")
        for check in self.parts:
            if not check.complete:
                check.fail("ends inside a batch")
        return self.header

    def _take_head(self, view: memoryview) -> int:
        if len(self._head) < _FRAME.size:
            taken = min(_FRAME.size - len(self._head), len(view))
            self._head += bytes(view[:taken])
            if len(self._head) == _FRAME.size:
                magic, length = _FRAME.unpack(self._head)
                if magic != MAGIC or not 2 <= length <= MAX_HEADER_BYTES:
                    self._bad(f"not a snapshot image (magic {magic!r}, header of {length} bytes)")
            return taken
        need: int = _FRAME.size + _FRAME.unpack(self._head[:_FRAME.size])[1]
        taken = min(need - len(self._head), len(view))
        self._head += bytes(view[:taken])
        if len(self._head) == need:
            self._parse_head()
        return taken

    def _parse_head(self) -> None:
        try:
            header = msgspec.json.decode(self._head[_FRAME.size:], type=ImageHeader)
            why = _header_problem(header, self.meta)
            if header.parts:   # what the log will be told to install: checked now
                PrefixInstall(self.meta.index + 1, header.dirty_offset, header.prefix, header.epochs)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, AssertionError) as exc:
            self._bad(f"bad image header: {exc}")
        if why is not None:
            self._bad(f"bad image header: {why}")
        if len(self._head) + header.body_bytes != self.meta.size:
            self._bad(f"the header describes {len(self._head) + header.body_bytes} bytes, the snapshot has "
                      f"{self.meta.size}")
        self.header = header
        start = len(self._head)
        pieces = [(start, start + header.data_bytes, -1)]
        start += header.data_bytes
        epochs = _Epochs(header.epochs)
        for i, part in enumerate(header.prefix):
            self.parts.append(_PartCheck(part, self.directory / PREFIX_DIR / segment_name(part.base), epochs))
            pieces.append((start, start + part.size, i))
            start += part.size
        self.pieces = pieces

    def _bad(self, problem: str) -> NoReturn:
        raise LogCorruptionError(str(self.directory), self.received, f"snapshot image {self.meta.index}: {problem}")


def _header_problem(header: ImageHeader, meta: SnapshotMeta) -> str | None:
    """What the log could not adopt as it is (beyond `PrefixInstall`'s own checks): the leader builds
    its epochs from its epoch cache, ascending in both, from the prefix's first offset."""
    if header.data_bytes < 0:
        return f"data of {header.data_bytes} bytes"
    if not header.parts:
        return "epochs without a prefix" if header.epochs or header.dirty_offset else None
    if header.parts[0][0] < 0:
        return f"a prefix from offset {header.parts[0][0]}"
    previous = (-1, header.parts[0][0] - 1)
    for epoch, start in header.epochs:
        if not (previous[0] < epoch <= MAX_TERM and previous[1] < start <= meta.index):
            return f"epoch {epoch} from offset {start} after epoch {previous[0]} from {previous[1]}"
        previous = (epoch, start)
    return None


class ImageStaging:
    """An image being received into `directory` (see the module docstring); the prefix's segments get
    indexes every `index_interval_bytes` (the log's). Every chunk is checked whole (`ImageCheck`)
    before any of it is written. Not thread-safe."""

    def __init__(self, directory: Path, meta: SnapshotMeta, index_interval_bytes: int) -> None:
        self.directory = directory
        self.meta = meta
        self.index_interval_bytes = index_interval_bytes
        self.check = ImageCheck(directory, meta)
        self._indexes: list[IndexBuilder] = []   # each part's, written by `finish`

    @property
    def received(self) -> int:
        return self.check.received

    def write(self, offset: int, chunk: bytes) -> None:
        """Write the chunk at image offset `offset` (the bytes received so far); durable on return.
        A chunk refused (LogCorruptionError) leaves the staged image as it was."""
        check = self.check.copy()
        found = check.feed(offset, chunk)
        if check.received == self.meta.size:   # the last chunk: the image must be whole (as install checks)
            check.check_whole()
        view = memoryview(chunk)
        touched: dict[Path, int] = {}
        try:
            if check.header is not None and self.check.header is None:
                self._create_files(check)
            for start, end, part in check.pieces:
                lo, hi = max(offset, start), min(offset + len(chunk), end)
                if lo >= hi:
                    continue
                path = self._path(check, part)
                fd = touched.get(path)
                if fd is None:
                    fd = touched[path] = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
                os.ftruncate(fd, lo - start)
                os.pwrite(fd, view[lo - offset:hi - offset], lo - start)
            for fd in touched.values():
                os.fsync(fd)
        except OSError as exc:
            raise io_error(f"staging snapshot chunk in {self.directory}", exc) from exc
        finally:
            for fd in touched.values():
                os.close(fd)
        for part, batch in found:
            self._indexes[part].add(batch.base_offset, batch.position, batch.size, batch.max_timestamp)
        self.check = check

    def _path(self, check: ImageCheck, part: int) -> Path:
        return self.directory / "data" if part < 0 else check.parts[part].path

    def _create_files(self, check: ImageCheck) -> None:
        """Every file of the image, empty (empty parts included), once its header is known."""
        header = check.header
        assert header is not None
        if header.parts:
            (self.directory / PREFIX_DIR).mkdir(exist_ok=True)
        self._indexes = [IndexBuilder(p.base, self.index_interval_bytes) for p in header.prefix]
        for _, _, part in check.pieces:
            os.close(os.open(self._path(check, part), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644))

    def finish(self) -> PrefixInstall | None:
        """Check the image is whole, record it as a snapshot of `data_bytes` (`meta`) and write the
        prefix's manifest; returns the prefix to install (None: the image has none). Durable on return."""
        header = self.check.check_whole()
        for check, indexes in zip(self.check.parts, self._indexes, strict=True):
            indexes.seal()   # derived data: written, not synced (a bad one is rebuilt)
            path = check.path
            path.with_name(segment_name(check.part.base, INDEX_SUFFIX)).write_bytes(indexes.index.to_bytes())
            path.with_name(segment_name(check.part.base, TIMEINDEX_SUFFIX)).write_bytes(indexes.time_index.to_bytes())
        atomic_write(self.directory / "meta", msgspec.json.encode(replace(self.meta, size=header.data_bytes)))
        install = None
        if header.parts:
            install = PrefixInstall(self.meta.index + 1, header.dirty_offset, header.prefix, header.epochs)
            install.write(self.directory / PREFIX_DIR)   # fsyncs the directory, its part files included
        fsync_dir(self.directory)
        return install
