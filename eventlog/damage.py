"""Damage: a batch of this node's log that fails its checks on disk (bit rot, a bad sector, a stray write).

Kafka's CRC32C covers a batch from its attributes on; baseOffset and partitionLeaderEpoch sit outside
it, so the log also checks that each batch starts where the previous one ended (at or after, in a
cleaned segment), ends inside its segment's offsets, and carries the epoch the leader epoch cache
records for it. Recovery checks all of this from the recovery point on (`Log.open`); the segments
below it were sealed, synced and trusted, and damage that appears there later is found by the reads
that check every batch they hand out (`Log.read`: replication, apply, Fetch, read_events, watch) and
by the background scrub (`eventlog.scrub`).

What the log does with it (eventlog/log.py): it records the first damaged batch of the segment
(`Segment.damage`): from that batch to the end of its segment nothing is read again (a read there
raises `CorruptBatchError`; a read before it stops at it). It logs one CRITICAL line naming the file,
the byte position and the offset, and tells its damage listeners. The bytes of the batches after the
damaged one in the same segment may well be intact, but where they start is known only through the
damaged batch's length, which may be the damaged field: the segment's tail is given up as a whole.

Damage goes away with its bytes only: a truncation at or below it (`Log.truncate_suffix` at
`drop_offset`), the deletion of its segment, a reset. Who decides that: the Raft runtime, which
drops the damaged suffix of a follower's log and fetches it again from the leader, and makes a leader
hand over first (eventlog/raft/runtime/repair.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from eventlog.errors import CorruptBatchError


@dataclass(frozen=True, slots=True)
class Damage:
    """The first damaged batch of one segment, and what it makes unreadable."""

    offset: int          # where the valid batches before it end: the damaged batch's offset (its lower
                         # bound in a cleaned segment, whose batches have gaps between them)
    path: str            # the segment file
    position: int        # byte position of the damaged batch in the file
    reason: str          # which check failed
    segment_base: int
    segment_end: int     # the segment's next offset: offsets [offset, segment_end) are unreadable
    cleaned: bool        # the segment is a cleaned one (key compaction, a snapshot's log prefix)

    @property
    def drop_offset(self) -> int:
        """Where the log can be cut to remove the damage (`Log.truncate_suffix`): the damaged batch's
        offset, a batch boundary; a cleaned segment can only be cut whole, at its base."""
        return self.segment_base if self.cleaned else self.offset

    def error(self) -> CorruptBatchError:
        return CorruptBatchError(self.path, self.position, self.offset, self.reason)

    def describe(self) -> str:
        return (f"damaged batch at offset {self.offset}, byte {self.position} of {self.path}: {self.reason}; "
                f"offsets {self.offset}..{self.segment_end - 1} of this segment are not served")
