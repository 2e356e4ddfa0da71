"""Cleaned segments: the checkpoint that names them, the writer of a cleaned file, the crash-safe swap.

Key compaction (`compaction/cleaner.py`) rewrites one or more consecutive sealed segments that cover
offsets [base, end) into ONE cleaned segment `<base>.log` holding only the records it keeps, each
at its original offset (see `records.retain_records`). Offsets then have gaps, which recovery's
contiguity rule (`eventlog.scan`) would call corruption, so the log keeps `cleaner-checkpoint`:
it names every cleaned segment and the range it covers, and recovery relaxes the rule for exactly
those segments (and only if the checkpoint agrees with the files: the next segment starts at `end`).

`cleaner-checkpoint` (ASCII, replaced atomically: temp file, fsync, rename, fsync of the directory)::

    0                            version
    dirty <offset>               first offset the cleaner has not mapped yet (its next pass starts there)
    segment <base> <end>         one line per cleaned segment, covering offsets [base, end)
    swap <base> <end> <dirty>    only while a swap is under way

The swap of a cleaned segment for the segments it replaces (Kafka's `.cleaned` / `.swap` /
`.deleted`, STYLE.md item 8); `Log.swap_cleaned` runs steps 2-8, `Log.open` finishes or undoes
whatever a crash interrupted (`finish_interrupted_swap`):

1. write `<base>.log.cleaned` (+ `.index.cleaned`, `.timeindex.cleaned`) and fsync the log file;
2. write the checkpoint with `swap <base> <end> <dirty>`;
3. rename the index files, then the log file, from `.cleaned` to `.swap`; fsync the directory.
   The rename of the LOG file is the commit point;
4. (in memory: the log serves reads from the new segment from here on);
5. rename every replaced segment's files (`<x>.log`, `.index`, `.timeindex`, base <= x < end) to
   `<name>.deleted`;
6. rename `<base>.log.swap` to `<base>.log`, then the index files; fsync the directory;
7. write the checkpoint: `segment <base> <end>` instead of the replaced segments' lines, the new
   `dirty` offset, no `swap` line;
8. delete the `.deleted` files.

What open does with a `swap <base> <end> <dirty>` line:

- `<base>.log.cleaned` exists (crash in steps 2-3, before the commit point): roll back. The
  checkpoint loses its `swap` line first, then the `.cleaned` and `.swap` files of `base` go (so a
  crash in the middle of a roll-back can never look like a finished swap).
- `<base>.log.swap` exists (steps 3-6): roll forward. Every segment file with a base in [base, end)
  still in place is an original: deleted; the swap files are renamed in place, the directory is
  fsynced, and the checkpoint of step 7 is written.
- neither (step 6 renamed the log file; every original was renamed to `.deleted` in step 5): any
  index file still `.swap` is renamed in place, and the checkpoint of step 7 is written.

Without a `swap` line, any `.cleaned` or `.swap` file is a leftover of step 1 and is deleted;
`.deleted` files are always garbage (originals are renamed only after the commit point).

Not thread-safe: the log calls these under its files lock.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from eventlog.errors import LogCorruptionError
from eventlog.fileutil import atomic_write, fsync_dir, io_error
from eventlog.index import IndexBuilder
from eventlog.records import BatchHeader
from eventlog.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIMEINDEX_SUFFIX,
    parse_segment_name,
    pwrite_all,
    segment_name,
)

logger = logging.getLogger(__name__)

CHECKPOINT_NAME = "cleaner-checkpoint"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
DELETED_SUFFIX = ".deleted"
# Index files first, log file last: renaming the log file is what commits (or completes) a step.
SEGMENT_SUFFIXES = (INDEX_SUFFIX, TIMEINDEX_SUFFIX, LOG_SUFFIX)


@dataclass(frozen=True, slots=True)
class CleanerCheckpoint:
    """The contents of `cleaner-checkpoint` (see the module docstring)."""

    dirty_offset: int = 0
    segments: tuple[tuple[int, int], ...] = ()
    swap: tuple[int, int, int] | None = None  # (base, end, dirty offset once done)

    @property
    def ends(self) -> dict[int, int]:
        """Base offset -> end offset of every segment the checkpoint names as cleaned."""
        return dict(self.segments)

    @classmethod
    def load(cls, directory: Path) -> CleanerCheckpoint:
        """The checkpoint in `directory` (empty when there is none).

        It is replaced atomically, so a malformed file is damage, not a torn write: refused with
        LogCorruptionError rather than guessed at (which segments have gaps, or whether a swap
        committed, is exactly what it says).
        """
        path = directory / CHECKPOINT_NAME
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return cls()
        try:
            lines = raw.decode("ascii").splitlines()
            if not lines or lines[0] != "0":
                raise ValueError(f"version line {lines[:1]}")
            dirty = 0
            segments: list[tuple[int, int]] = []
            swap = None
            for line in lines[1:]:
                kind, *values = line.split()
                numbers = [int(v) for v in values]
                if kind == "dirty" and len(numbers) == 1:
                    dirty = numbers[0]
                elif kind == "segment" and len(numbers) == 2 and numbers[0] < numbers[1]:
                    segments.append((numbers[0], numbers[1]))
                elif kind == "swap" and len(numbers) == 3 and numbers[0] < numbers[1]:
                    swap = (numbers[0], numbers[1], numbers[2])
                else:
                    raise ValueError(f"line {line!r}")
        except (ValueError, UnicodeDecodeError) as exc:
            raise LogCorruptionError(str(path), 0, f"malformed cleaner checkpoint: {exc}") from None
        return cls(dirty, tuple(sorted(segments)), swap)

    def encode(self) -> bytes:
        lines = ["0", f"dirty {self.dirty_offset}"]
        lines += [f"segment {b} {e}" for b, e in self.segments]
        if self.swap is not None:
            lines.append("swap {} {} {}".format(*self.swap))
        return ("\n".join(lines) + "\n").encode("ascii")

    def write(self, directory: Path) -> None:
        atomic_write(directory / CHECKPOINT_NAME, self.encode())

    def with_swap(self, base: int, end: int, dirty_offset: int) -> CleanerCheckpoint:
        return replace(self, swap=(base, end, dirty_offset))

    def without_swap(self) -> CleanerCheckpoint:
        return replace(self, swap=None)

    def after_swap(self) -> CleanerCheckpoint:
        """The checkpoint once the pending swap is done: its segment replaces those it covers."""
        assert self.swap is not None
        base, end, dirty = self.swap
        kept = [(b, e) for b, e in self.segments if not base <= b < end]
        return CleanerCheckpoint(max(self.dirty_offset, dirty), tuple(sorted(kept + [(base, end)])), None)

    def keeping(self, bases: list[int]) -> CleanerCheckpoint:
        """Only the lines that still describe a segment among `bases` (see `cleaned_ranges`)."""
        valid = cleaned_ranges(self, bases)
        return replace(self, segments=tuple((b, e) for b, e in self.segments if valid.get(b) == e))


def cleaned_ranges(checkpoint: CleanerCheckpoint, bases: list[int]) -> dict[int, int]:
    """Base -> end of the segments among `bases` (sorted) that are cleaned.

    A line applies to a segment only if the files agree with it: the segment exists and the next
    one starts exactly at `end` (a cleaned segment is never the active one; it can only become the
    last one when `Log.open(repair=True)` cut the log inside it, and then the line applies too).
    Any other line is stale (its segments were deleted or truncated away) and is ignored.
    """
    position = {b: i for i, b in enumerate(bases)}
    out = {}
    for base, end in checkpoint.segments:
        i = position.get(base)
        if i is None:
            continue
        if i == len(bases) - 1 or bases[i + 1] == end:
            out[base] = end
    return out


def cleaned_path(directory: Path, base: int, suffix: str = LOG_SUFFIX, state: str = CLEANED_SUFFIX) -> Path:
    return directory / (segment_name(base, suffix) + state)


@dataclass(slots=True)
class CleanedSegment:
    """A cleaned segment file written and synced (step 1), not yet swapped in."""

    directory: Path
    base_offset: int
    end_offset: int
    size: int
    indexes: IndexBuilder
    records: int = 0
    replaced: list[int] = field(default_factory=list)  # base offsets of the segments it replaces

    def discard(self) -> None:
        """Delete its files (whichever state they are in). Call only without a `swap` line naming it."""
        for state in (CLEANED_SUFFIX, SWAP_SUFFIX):
            for suffix in SEGMENT_SUFFIXES:
                cleaned_path(self.directory, self.base_offset, suffix, state).unlink(missing_ok=True)


class CleanedSegmentWriter:
    """Writes `<base>.log.cleaned` and its indexes: the batches a cleaner keeps of [base, end).

    Batches must come in offset order, each inside [base, end); they are buffered and written with
    pwritev. `finish` fsyncs the file (its indexes are derived data: written, not synced) and
    returns the `CleanedSegment` to hand to `Log.swap_cleaned`. Not thread-safe.
    """

    def __init__(self, directory: Path, base_offset: int, end_offset: int, index_interval_bytes: int,
                 buffer_bytes: int = 1 << 20) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.end_offset = end_offset
        self.path = cleaned_path(directory, base_offset)
        self.size = 0
        self.records = 0
        self._next_offset = base_offset
        self._builder = IndexBuilder(base_offset, index_interval_bytes)
        self._buffers: list[bytes | bytearray | memoryview] = []
        self._buffered = 0
        self._buffer_bytes = buffer_bytes
        self._written = 0
        for suffix in SEGMENT_SUFFIXES:   # a leftover of an earlier attempt
            cleaned_path(directory, base_offset, suffix).unlink(missing_ok=True)
        try:
            self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise io_error(f"creating {self.path}", exc) from exc

    def append(self, batch: bytes | bytearray | memoryview, header: BatchHeader) -> None:
        """Add one batch (`header` is its header; the bytes are copied or kept until written)."""
        assert self._fd is not None, "finished"
        if header.base_offset < self._next_offset or header.next_offset > self.end_offset:
            raise AssertionError(f"batch [{header.base_offset}, {header.last_offset}] out of order or outside "
                                 f"[{self._next_offset}, {self.end_offset})")
        self._builder.add(header.base_offset, self.size, len(batch), header.max_timestamp)
        self._buffers.append(batch)
        self._buffered += len(batch)
        self.size += len(batch)
        self.records += header.records_count
        self._next_offset = header.next_offset
        if self._buffered >= self._buffer_bytes:
            self._flush_buffers()

    def _flush_buffers(self) -> None:
        assert self._fd is not None
        try:
            pwrite_all(self._fd, self._buffers, self._written)
        except OSError as exc:
            raise io_error(f"writing {self.path}", exc) from exc
        self._written += self._buffered
        self._buffers, self._buffered = [], 0

    def finish(self) -> CleanedSegment:
        """Write what is buffered, fsync the file, write the index files; the file is complete."""
        assert self._fd is not None, "finished"
        try:
            self._flush_buffers()
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise io_error(f"fsync of {self.path}", exc) from exc
        finally:
            os.close(self._fd)
            self._fd = None
        self._builder.seal()
        try:
            cleaned_path(self.directory, self.base_offset, INDEX_SUFFIX).write_bytes(self._builder.index.to_bytes())
            cleaned_path(self.directory, self.base_offset, TIMEINDEX_SUFFIX).write_bytes(
                self._builder.time_index.to_bytes())
        except OSError as exc:
            # Derived data: a missing index is rebuilt from the segment when first used.
            logger.warning("could not write the indexes of %s (they will be rebuilt): %s", self.path, exc)
        return CleanedSegment(self.directory, self.base_offset, self.end_offset, self.size, self._builder,
                              self.records)

    def discard(self) -> None:
        """Abandon the file (an aborted cleaning)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        CleanedSegment(self.directory, self.base_offset, self.end_offset, 0, self._builder).discard()


def rename_state(directory: Path, base: int, old_state: str, new_state: str) -> None:
    """Rename a segment's files (indexes first, the log file last) from `old_state` to `new_state`
    (suffixes such as `.cleaned`, `.swap`, `.deleted`; "" is the plain name). Missing index files
    are skipped (derived data); a missing log file is an error."""
    for suffix in SEGMENT_SUFFIXES:
        name = segment_name(base, suffix)
        source, target = directory / (name + old_state), directory / (name + new_state)
        try:
            os.rename(source, target)
        except FileNotFoundError:
            if suffix == LOG_SUFFIX:
                raise
        except OSError as exc:
            raise io_error(f"renaming {source} to {target.name}", exc) from exc


def finish_interrupted_swap(directory: Path) -> CleanerCheckpoint:
    """Finish or undo a swap a crash interrupted, and delete leftovers of the cleaner (see the module
    docstring); returns the checkpoint as it now stands on disk."""
    checkpoint = CleanerCheckpoint.load(directory)
    if checkpoint.swap is not None:
        base, end, _ = checkpoint.swap
        if cleaned_path(directory, base).exists():
            logger.warning("%s: rolling back an interrupted swap of cleaned segment [%d, %d)", directory, base, end)
            checkpoint = checkpoint.without_swap()
            checkpoint.write(directory)
        else:
            swap_file = cleaned_path(directory, base, state=SWAP_SUFFIX)
            if swap_file.exists():
                logger.warning("%s: completing an interrupted swap of cleaned segment [%d, %d)", directory, base, end)
                for p in list(directory.iterdir()):
                    original = parse_segment_name(p.name)
                    if original is not None and base <= original < end:
                        for suffix in SEGMENT_SUFFIXES:
                            (directory / segment_name(original, suffix)).unlink(missing_ok=True)
                fsync_dir(directory)
                rename_state(directory, base, SWAP_SUFFIX, "")
            elif (directory / segment_name(base)).exists():
                logger.warning("%s: finishing the swap of cleaned segment [%d, %d)", directory, base, end)
                for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
                    source = cleaned_path(directory, base, suffix, SWAP_SUFFIX)
                    if source.exists():
                        os.rename(source, directory / segment_name(base, suffix))
            else:
                raise LogCorruptionError(str(directory / CHECKPOINT_NAME), 0,
                                         f"a swap of cleaned segment [{base}, {end}) is recorded but neither "
                                         f"its .cleaned, .swap nor final file exists")
            fsync_dir(directory)
            checkpoint = checkpoint.after_swap()
            checkpoint.write(directory)
    for p in list(directory.iterdir()):
        if p.name.endswith((CLEANED_SUFFIX, SWAP_SUFFIX)) and p.name != CHECKPOINT_NAME:
            p.unlink(missing_ok=True)
    return checkpoint
