"""What the Raft core reads from stable storage, and an in-memory implementation of it.

The core never writes: the application persists what a `Ready` hands it (hard state, entries,
snapshot chunks) and the core reads the durable log back through this protocol. The node runtime
implements it over the segmented log; `MemoryStorage` serves the core's own tests and the
simulator's fake disk.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Protocol

from eventlog.raft.errors import CompactedError, UnavailableError
from eventlog.raft.types import ConfState, Entry, EntryKind, HardState, SnapshotMeta


class Storage(Protocol):
    """The durable state of one Raft node, read-only for the core.

    Entries are whole batches; `entries(lo, hi)` starts at the entry beginning at `lo` (callers only
    ask at entry boundaries). Indexes below `first_index` are compacted: the snapshot index + 1, or
    lower when the storage still holds entries the snapshot covers (a lagging follower is then sent
    those instead of the snapshot).
    """

    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        """The persisted hard state and the latest snapshot's metadata."""
        ...

    def first_index(self) -> int:
        """First index served: at most the snapshot index + 1, and the term of the index before it is
        known (`term(first_index() - 1)` answers)."""
        ...

    def last_index(self) -> int:
        """Last index held (the snapshot index when the log is empty)."""
        ...

    def term(self, index: int) -> int:
        """Term of the entry holding `index` (or the snapshot's term at the snapshot index).

        Raises CompactedError below first_index() - 1, UnavailableError beyond the last index.
        """
        ...

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries from the one starting at `lo` up to index `hi` (exclusive), within `max_bytes`
        (at least one entry)."""
        ...

    def entry_bounds(self, index: int) -> tuple[int, int]:
        """(first, last) index of the entry holding `index`; (i, i) for the snapshot index i when the
        log does not hold it."""
        ...

    def conf_entries(self) -> list[Entry]:
        """Every CONF_CHANGE entry in the log (after the snapshot), in order."""
        ...

    def snapshot(self) -> SnapshotMeta:
        """Metadata of the latest snapshot (index -1 when there is none)."""
        ...

    def snapshot_chunk(self, index: int, offset: int, max_bytes: int) -> bytes:
        """Bytes [offset, offset + max_bytes) of snapshot `index`; CompactedError if it is gone."""
        ...


class MemoryStorage:
    """Storage held in memory, plus the write operations an application performs on a Ready.

    `catch_up_entries`: how many indexes a snapshot leaves in the log below it (whole entries), as
    the runtime's segmented log keeps whatever whole segments the retention floor holds: a follower
    lagging by less is sent entries, not the snapshot (`first_index` below the snapshot index).

    Not thread-safe. Also used as the durable layer of the simulator's fake disk.
    """

    def __init__(self, conf: ConfState | None = None, catch_up_entries: int = 0) -> None:
        self.hard_state = HardState()
        self._snapshot = SnapshotMeta(index=-1, term=0, conf=conf or ConfState())
        self._snapshot_data = b""
        self._entries: list[Entry] = []
        self._starts: list[int] = []
        self.staged: dict[int, bytearray] = {}  # incoming snapshot chunks by snapshot index
        self.catch_up_entries = catch_up_entries
        self._before_first = (-1, 0)   # (index, term) just before the first stored entry: the anchor

    # --- Storage protocol ------------------------------------------------------------------------

    def initial_state(self) -> tuple[HardState, SnapshotMeta]:
        return self.hard_state, self._snapshot

    def first_index(self) -> int:
        if self._entries and self._starts[0] <= self._snapshot.index:
            return self._starts[0]   # entries the snapshot covers are still held
        return self._snapshot.index + 1

    def last_index(self) -> int:
        return self._entries[-1].last_index if self._entries else self._snapshot.index

    def term(self, index: int) -> int:
        if index == self._snapshot.index:
            return self._snapshot.term
        first = self.first_index()
        if index == first - 1 and first <= self._snapshot.index:
            return self._before_first[1]
        if index < first - 1:
            raise CompactedError(f"index {index} is compacted (log starts at {first})")
        if index > self.last_index():
            raise UnavailableError(f"index {index} is beyond the last index {self.last_index()}")
        return self._entries[bisect_right(self._starts, index) - 1].term

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        if lo < self.first_index():
            raise CompactedError(f"index {lo} is compacted (log starts at {self.first_index()})")
        if lo > self.last_index():
            raise UnavailableError(f"index {lo} is beyond the last index {self.last_index()}")
        i = bisect_right(self._starts, lo) - 1
        assert self._entries[i].index == lo, f"entries() asked at {lo}, inside an entry"
        out: list[Entry] = []
        size = 0
        while i < len(self._entries) and self._entries[i].index < hi:
            e = self._entries[i]
            if out and size + e.size > max_bytes:
                break
            out.append(e)
            size += e.size
            i += 1
        return out

    def entry_bounds(self, index: int) -> tuple[int, int]:
        if index == self._snapshot.index and not (self._entries and self._starts[0] <= index):
            return index, index
        self.term(index)  # raises for indexes out of range
        e = self._entries[bisect_right(self._starts, index) - 1]
        return e.index, e.last_index

    def conf_entries(self) -> list[Entry]:
        return [e for e in self._entries if e.kind == EntryKind.CONF_CHANGE and e.index > self._snapshot.index]

    def snapshot(self) -> SnapshotMeta:
        return self._snapshot

    def snapshot_chunk(self, index: int, offset: int, max_bytes: int) -> bytes:
        if index != self._snapshot.index:
            raise CompactedError(f"snapshot {index} was replaced by snapshot {self._snapshot.index}")
        return self._snapshot_data[offset:offset + max_bytes]

    # --- writes (what the application does with a Ready) -----------------------------------------

    def set_hard_state(self, hs: HardState) -> None:
        self.hard_state = hs

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries, first dropping any stored suffix from the first one's index."""
        if not entries:
            return
        first = entries[0].index
        if first <= self._snapshot.index:
            raise CompactedError(f"append at {first} below the snapshot at {self._snapshot.index}")
        assert first <= self.last_index() + 1, f"gap: append at {first}, last index {self.last_index()}"
        self.truncate_from(first)
        for e in entries:
            assert e.index == self.last_index() + 1, (e.index, self.last_index())
            self._entries.append(e)
            self._starts.append(e.index)

    def truncate_from(self, index: int) -> None:
        i = bisect_right(self._starts, index - 1)
        if i < len(self._entries):
            assert self._entries[i].index >= index
            if i > 0:
                assert self._entries[i - 1].last_index < index, f"truncation at {index} splits an entry"
            del self._entries[i:]
            del self._starts[i:]

    def stage_snapshot_chunk(self, meta: SnapshotMeta, offset: int, data: bytes) -> None:
        buf = self.staged.setdefault(meta.index, bytearray())
        del buf[offset:]
        buf += data

    def install_snapshot(self, meta: SnapshotMeta) -> None:
        """Replace the log and the snapshot with the staged snapshot `meta`."""
        data = bytes(self.staged.pop(meta.index, b""))
        assert len(data) == meta.size, (len(data), meta.size)
        # A newer snapshot may already be arriving (its first chunks can share a Ready with this
        # install): keep its staged bytes, drop only what this snapshot supersedes.
        self.staged = {i: buf for i, buf in self.staged.items() if i > meta.index}
        self._snapshot, self._snapshot_data = meta, data
        # The whole log goes. Figure 13's "retain the entries following a matching last entry" is
        # the core's job: it only asks for an install when its log does not hold (meta.index,
        # meta.term) (node._handle_snapshot_chunk), and from then on its view of the log is the
        # snapshot plus the entries of this and later Readys. Entries kept here would be a stale
        # suffix the core does not know about.
        self._entries.clear()
        self._starts.clear()
        self._before_first = (meta.index, meta.term)

    def create_snapshot(self, index: int, conf: ConfState, data: bytes) -> SnapshotMeta:
        """The application took a snapshot of its state at `index` (applied): store it, drop the log."""
        assert self._snapshot.index < index <= self.last_index()
        i = bisect_right(self._starts, index) - 1
        assert self._entries[i].last_index == index, "snapshots are taken at entry boundaries"
        meta = SnapshotMeta(index=index, term=self._entries[i].term, conf=conf, size=len(data))
        self._snapshot, self._snapshot_data = meta, data
        self._drop_through(index - self.catch_up_entries)
        return meta

    def _drop_through(self, index: int) -> None:
        """Drop the entries that end at or before `index` (whole entries only)."""
        i = bisect_right(self._starts, index)
        if i and self._entries[i - 1].last_index > index:
            i -= 1                                   # the entry holding `index` stays whole
        if i:
            last = self._entries[i - 1]
            self._before_first = (last.last_index, last.term)
        del self._entries[:i]
        del self._starts[:i]

    def snapshot_data(self) -> bytes:
        return self._snapshot_data
