"""The log's segments in offset order (as Kafka's LogSegments): lookup by offset, the active segment,
and what follows from the set: where the cleaned range ends and the lowest known damage.

It also puts a new segment file in place (`prepare_segment_file`, `install_segment`), which both
opening an empty log (eventlog.log_loader) and a roll (eventlog.log) do.

Concurrency contract: not thread-safe; `Log` calls it only with its lock held (see eventlog.log).
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import overload

from eventlog.damage import Damage
from eventlog.fileutil import fsync_dir, io_error
from eventlog.preallocate import PREALLOCATED_NAME, PreparedFile, SegmentPreallocator
from eventlog.segment import Segment, prepare_file, segment_name


class LogSegments:
    """The segments of one log, oldest first; the last is the active one (the only one appended to).

    Base offsets are kept in a parallel list so a lookup is one bisect. `clean_end` and `damage` are
    derived from the segments: call `changed` after any change of which segments are cleaned or
    damaged, and after adding or removing segments.
    """

    def __init__(self, segments: Sequence[Segment] = ()) -> None:
        self._segments: list[Segment] = list(segments)
        self._bases: list[int] = [s.base_offset for s in self._segments]
        self.clean_end = 0                  # end of the last cleaned segment (0: none is cleaned)
        self.damage: Damage | None = None   # the lowest damaged batch of any segment (eventlog.damage)

    def __len__(self) -> int:
        return len(self._segments)

    def __iter__(self) -> Iterator[Segment]:
        return iter(self._segments)

    @overload
    def __getitem__(self, i: int) -> Segment: ...
    @overload
    def __getitem__(self, i: slice) -> list[Segment]: ...
    def __getitem__(self, i: int | slice) -> Segment | list[Segment]:
        return self._segments[i]

    @property
    def active(self) -> Segment:
        return self._segments[-1]

    @property
    def bases(self) -> Sequence[int]:
        """The base offsets, oldest first (a live view: do not keep it across changes)."""
        return self._bases

    @property
    def first_base(self) -> int:
        return self._bases[0]

    def floor(self, offset: int) -> int:
        """Index of the segment whose base is the largest at or below `offset` (-1: none)."""
        return bisect_right(self._bases, offset) - 1

    def append(self, segment: Segment) -> None:
        self._segments.append(segment)
        self._bases.append(segment.base_offset)

    def truncate_from(self, i: int) -> None:
        """Forget the segments from index `i` on (their files are the caller's)."""
        del self._segments[i:]
        del self._bases[i:]

    def drop_first(self, count: int) -> None:
        """Forget the `count` oldest segments (their files are the caller's)."""
        del self._segments[:count]
        del self._bases[:count]

    def replace(self, i: int, j: int, segment: Segment) -> None:
        """Put `segment` in place of the segments at indexes [i, j) (a key-compaction swap)."""
        self._segments[i:j] = [segment]
        self._bases[i:j] = [segment.base_offset]

    def clear(self) -> None:
        self._segments, self._bases = [], []

    def changed(self) -> None:
        """Recompute what depends on which segments are cleaned or damaged."""
        self.clean_end = max((s.next_offset for s in self._segments if s.cleaned), default=0)
        self.refresh_damage()

    def refresh_damage(self) -> None:
        found = [s.damage for s in self._segments if s.damage is not None]
        self.damage = min(found, key=lambda d: d.offset) if found else None


def prepare_segment_file(directory: Path, segment_bytes: int,
                         preallocator: SegmentPreallocator | None) -> PreparedFile:
    """The next segment's file, prepared in the background or now (raises DiskFullError)."""
    prepared = preallocator.take() if preallocator else None
    if prepared is None:
        tmp = directory / PREALLOCATED_NAME
        fd, mm = prepare_file(tmp, segment_bytes)
        prepared = PreparedFile(tmp, fd, mm)
    return prepared


def install_segment(directory: Path, base: int, prepared: PreparedFile, index_interval_bytes: int) -> Segment:
    """Put a prepared file in place as the segment starting at `base` (discarded on failure)."""
    path = directory / segment_name(base)
    try:
        os.rename(prepared.path, path)
        fsync_dir(directory)
    except OSError as exc:
        prepared.discard()
        raise io_error(f"creating segment {path}", exc) from exc
    return Segment.from_prepared(directory, base, index_interval_bytes, prepared.fd, prepared.mm)
