"""Sparse offset and time indexes of one segment (derived data: rebuilt when missing or wrong).

Both indexes are built by the same rule whether batches are appended or a segment is scanned, so a
rebuilt index is byte-identical to the one written at append time (`IndexBuilder`).

`.index` file: entries of 8 bytes, big-endian ``(relative_offset: uint32, position: uint32)``: the
batch whose base offset is ``base_offset + relative_offset`` starts at byte ``position``. An entry is
added before a batch once `index_interval_bytes` or more bytes were appended since the previous one.

`.timeindex` file: entries of 12 bytes, big-endian ``(timestamp: int64, relative_offset: uint32)``:
the batch starting at that offset has maxTimestamp ``timestamp``, and no batch before it has a larger
one. Entries are added at the same moments as offset entries when the running maximum grew, plus a
final entry when the segment is sealed. So for a target T, every batch up to the last entry with
timestamp < T has only records older than T.

Not thread-safe: owned by a `Segment`, which is mutated under its log's lock.
"""

from __future__ import annotations

import struct
from array import array
from bisect import bisect_left, bisect_right
from typing import Final

_OFFSET_ENTRY: Final = struct.Struct(">II")
_TIME_ENTRY: Final = struct.Struct(">qI")


class OffsetIndex:
    """Sparse map from batch base offsets to file positions."""

    __slots__ = ("base_offset", "offsets", "positions")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.offsets = array("q")
        self.positions = array("q")

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, offset: int, position: int) -> None:
        self.offsets.append(offset)
        self.positions.append(position)

    def floor(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry at or below `offset`; the segment start if none."""
        i = bisect_right(self.offsets, offset)
        if i == 0:
            return self.base_offset, 0
        return self.offsets[i - 1], self.positions[i - 1]

    def truncate_from(self, offset: int) -> None:
        """Drop entries for batches at or after `offset`."""
        i = bisect_left(self.offsets, offset)
        del self.offsets[i:]
        del self.positions[i:]

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(_OFFSET_ENTRY.pack(o - base, p) for o, p in zip(self.offsets, self.positions))

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes) -> OffsetIndex:
        """Parse an `.index` file; raises ValueError when it is not even well-formed."""
        if len(data) % _OFFSET_ENTRY.size:
            raise ValueError(f"size {len(data)} is not a multiple of {_OFFSET_ENTRY.size}")
        index = cls(base_offset)
        last_offset = last_position = -1
        for rel, pos in _OFFSET_ENTRY.iter_unpack(data):
            offset = base_offset + rel
            if offset <= last_offset or pos <= last_position:
                raise ValueError(f"entry ({rel}, {pos}) does not increase")
            index.append(offset, pos)
            last_offset, last_position = offset, pos
        return index

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, OffsetIndex) and self.base_offset == other.base_offset
                and self.offsets == other.offsets and self.positions == other.positions)


class TimeIndex:
    """Sparse map from growing max timestamps to the base offsets of the batches that reached them."""

    __slots__ = ("base_offset", "timestamps", "offsets")

    def __init__(self, base_offset: int) -> None:
        self.base_offset = base_offset
        self.timestamps = array("q")
        self.offsets = array("q")

    def __len__(self) -> int:
        return len(self.timestamps)

    @property
    def last_timestamp(self) -> int:
        return self.timestamps[-1] if self.timestamps else -1

    def maybe_append(self, timestamp: int, offset: int) -> None:
        if timestamp > self.last_timestamp:
            self.timestamps.append(timestamp)
            self.offsets.append(offset)

    def last_offset_before(self, timestamp: int) -> int | None:
        """Offset of the last entry whose timestamp is < `timestamp` (no earlier batch reaches it)."""
        i = bisect_left(self.timestamps, timestamp)
        return self.offsets[i - 1] if i else None

    def truncate_from(self, offset: int) -> None:
        i = bisect_left(self.offsets, offset)
        del self.timestamps[i:]
        del self.offsets[i:]

    def to_bytes(self) -> bytes:
        base = self.base_offset
        return b"".join(_TIME_ENTRY.pack(t, o - base) for t, o in zip(self.timestamps, self.offsets))

    @classmethod
    def from_bytes(cls, base_offset: int, data: bytes) -> TimeIndex:
        """Parse a `.timeindex` file; raises ValueError when it is not even well-formed."""
        if len(data) % _TIME_ENTRY.size:
            raise ValueError(f"size {len(data)} is not a multiple of {_TIME_ENTRY.size}")
        index = cls(base_offset)
        for ts, rel in _TIME_ENTRY.iter_unpack(data):
            offset = base_offset + rel
            if ts <= index.last_timestamp or (index.offsets and offset < index.offsets[-1]):
                raise ValueError(f"entry ({ts}, {rel}) does not increase")
            index.maybe_append(ts, offset)
        return index

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TimeIndex) and self.base_offset == other.base_offset
                and self.timestamps == other.timestamps and self.offsets == other.offsets)


class IndexBuilder:
    """Applies the indexing rule batch by batch; used by appends and by scans alike."""

    __slots__ = ("interval", "index", "time_index", "bytes_since_entry", "max_timestamp",
                 "max_timestamp_offset")

    def __init__(self, base_offset: int, interval_bytes: int) -> None:
        self.interval = interval_bytes
        self.index = OffsetIndex(base_offset)
        self.time_index = TimeIndex(base_offset)
        self.bytes_since_entry = 0
        self.max_timestamp = -1
        self.max_timestamp_offset = base_offset

    def add(self, base_offset: int, position: int, size: int, max_timestamp: int) -> None:
        """Account for the batch about to be stored at `position`."""
        if self.bytes_since_entry >= self.interval:
            self.index.append(base_offset, position)
            self.time_index.maybe_append(self.max_timestamp, self.max_timestamp_offset)
            self.bytes_since_entry = 0
        self.bytes_since_entry += size
        if max_timestamp > self.max_timestamp:
            self.max_timestamp = max_timestamp
            self.max_timestamp_offset = base_offset

    def seal(self) -> None:
        """Final time entry so the time index knows the segment's largest timestamp."""
        self.time_index.maybe_append(self.max_timestamp, self.max_timestamp_offset)
