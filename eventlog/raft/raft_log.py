"""The Raft core's view of its log: durable entries (`Storage`) followed by unstable ones.

Unstable entries were appended (proposed by this leader, or received from one) but are not yet
known to be on disk; every `Ready` hands them to the application, and `stable_to` drops them from
here once it has persisted them. A snapshot received from the leader is likewise pending until
installed.

Invariants: `committed` never decreases and never exceeds the last index; committed entries are
never truncated; entries handed out for applying are committed and durable. One exception, made by
the application and nothing else: entries it found damaged on its disk and dropped
(`RaftNode.drop_entries`). The log then ends below `committed` (a *hole*, `held_committed` is what it
still holds of it) until the leader has sent them again; the entries that fill the hole are not
applied again (they were, before the damage), and nothing else is ever appended below `committed`.

Not thread-safe: owned by one `RaftNode`.
"""

from __future__ import annotations

from bisect import bisect_right

from eventlog.raft.errors import CompactedError, UnavailableError
from eventlog.raft.storage import Storage
from eventlog.raft.types import Entry, SnapshotMeta


class RaftLog:
    def __init__(self, storage: Storage, committed: int, applied: int, *, dropped: bool = False) -> None:
        self.storage = storage
        self.unstable: list[Entry] = []
        self._unstable_starts: list[int] = []
        self.unstable_offset = storage.last_index() + 1
        self.pending_snapshot: SnapshotMeta | None = None
        snap = storage.snapshot()
        # The persisted commit index is a hint: it may run ahead of entries a crash cut from the log,
        # or lag behind what the state machine applied (a runtime persists it lazily). Only committed
        # entries are ever applied, so the applied index is a commit index too.
        # `dropped`: the node dropped damaged entries and may not have all of them back yet (a hole).
        self.applied = max(applied, snap.index)
        assert dropped or self.applied <= self.last_index(), (
            f"the state machine applied {applied} but the log ends at {self.last_index()}")
        self.committed = max(min(committed, self.last_index()), self.applied)
        # Applying stopped at an entry the storage cannot read now (damaged: the runtime is dropping it);
        # `RaftNode.tick` and a drop try again.
        self.apply_blocked = False

    # --- indexes and terms ---------------------------------------------------------------------

    def last_index(self) -> int:
        if self.unstable:
            return self.unstable[-1].last_index
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index
        return self.storage.last_index()

    def first_index(self) -> int:
        if self.pending_snapshot is not None:
            return self.pending_snapshot.index + 1
        return self.storage.first_index()

    def snapshot_index(self) -> int:
        """The index before the first entry held: the snapshot's, or below it when the storage still
        holds entries the snapshot covers."""
        return self.first_index() - 1

    def stable_last_index(self) -> int:
        """Last index known to be on disk."""
        return self.unstable_offset - 1

    def held_committed(self) -> int:
        """The committed index as far as the log holds it: `committed`, but the last index while the
        log has a hole (entries dropped as damaged and not sent again yet)."""
        return min(self.committed, self.last_index())

    def term(self, index: int) -> int | None:
        """Term at `index`, or None when it is compacted or beyond the end."""
        if self.pending_snapshot is not None and index == self.pending_snapshot.index:
            return self.pending_snapshot.term
        if index >= self.unstable_offset:
            if not self.unstable or index > self.unstable[-1].last_index:
                return None
            return self.unstable[bisect_right(self._unstable_starts, index) - 1].term
        if self.pending_snapshot is not None:
            return None  # below a pending snapshot: compacted
        try:
            return self.storage.term(index)
        except (CompactedError, UnavailableError):
            return None

    def last_term(self) -> int:
        term = self.term(self.last_index())
        assert term is not None
        return term

    def match_term(self, index: int, term: int) -> bool:
        return self.term(index) == term

    def entry_bounds(self, index: int) -> tuple[int, int]:
        """(first, last) index of the entry holding `index` (which must be in the log)."""
        if index >= self.unstable_offset:
            e = self.unstable[bisect_right(self._unstable_starts, index) - 1]
            return e.index, e.last_index
        if self.pending_snapshot is not None and index == self.pending_snapshot.index:
            return index, index
        return self.storage.entry_bounds(index)

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Is a log ending at (last_index, last_term) at least as up to date as ours (§5.4.1)?"""
        my_term = self.last_term()
        return last_term > my_term or (last_term == my_term and last_index >= self.last_index())

    def last_boundary_at_or_below(self, index: int, max_term: int) -> int:
        """Largest entry end <= `index` whose term is <= `max_term` (fast backtracking, §5.3).

        Walks back entry by entry over the (short) divergent suffix. Returns at most the snapshot
        index; below it, returns snapshot index - 1 to say "only a snapshot will do".
        """
        snap = self.snapshot_index()
        i = min(index, self.last_index())
        try:
            if i > snap:
                first, last = self.entry_bounds(i)
                if last != i:
                    i = first - 1
            while i > snap:
                term = self.term(i)
                assert term is not None
                if term <= max_term:
                    return i
                i = self.entry_bounds(i)[0] - 1
        except CompactedError:
            return snap - 1   # the storage cannot read an entry on the way (damaged): a snapshot will do
        if i == snap:
            term = self.term(snap)
            if term is not None and term <= max_term:
                return snap
        return snap - 1

    # --- reading -------------------------------------------------------------------------------

    def entries(self, lo: int, hi: int, max_bytes: int) -> list[Entry]:
        """Entries from the one starting at `lo` through index hi - 1, within max_bytes (>= 1 entry)."""
        if lo < self.first_index():
            raise CompactedError(f"index {lo} is compacted (log starts at {self.first_index()})")
        out: list[Entry] = []
        size = 0
        if lo < self.unstable_offset:
            stable = self.storage.entries(lo, min(hi, self.unstable_offset), max_bytes)
            out += stable
            size = sum(e.size for e in stable)
            lo = out[-1].last_index + 1 if out else lo
            if lo < self.unstable_offset:
                return out  # stopped by max_bytes inside the stable part
        if lo < hi and self.unstable:
            i = bisect_right(self._unstable_starts, lo) - 1
            if i < 0:
                i = 0
            assert self.unstable[i].index == lo or not out, (lo, self.unstable[i].index)
            while i < len(self.unstable) and self.unstable[i].index < hi:
                e = self.unstable[i]
                if out and size + e.size > max_bytes:
                    break
                out.append(e)
                size += e.size
                i += 1
        return out

    def next_committed(self, max_bytes: int) -> list[Entry]:
        """Committed, durable entries not yet handed out for applying (none while `apply_blocked`: the
        storage found the next one damaged, CompactedError, and the runtime drops it)."""
        hi = min(self.committed, self.stable_last_index())
        lo = self.applied + 1
        if lo > hi or self.pending_snapshot is not None or self.apply_blocked:
            return []
        try:
            return self.entries(lo, hi + 1, max_bytes)
        except CompactedError:
            self.apply_blocked = True
            return []

    def applicable(self) -> bool:
        """Whether committed, durable entries wait to be applied (and can be read)."""
        return (not self.apply_blocked and self.pending_snapshot is None
                and min(self.committed, self.stable_last_index()) > self.applied)

    # --- writing -------------------------------------------------------------------------------

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append entries starting at or before last_index + 1, replacing any suffix they overlap."""
        if not entries:
            return
        first = entries[0].index
        assert first > self.held_committed(), f"append at {first} would overwrite committed index {self.committed}"
        assert first <= self.last_index() + 1, f"gap: append at {first}, last index {self.last_index()}"
        if first <= self.unstable_offset:
            # overwrites (part of) the durable log: the application truncates when it persists these
            self.unstable_offset = first
            self.unstable = []
            self._unstable_starts = []
        else:
            i = bisect_right(self._unstable_starts, first - 1)
            assert i == len(self.unstable) or self.unstable[i].index >= first
            del self.unstable[i:]
            del self._unstable_starts[i:]
        for e in entries:
            assert e.index == self.last_index() + 1 or (not self.unstable and e.index == self.unstable_offset)
            self.unstable.append(e)
            self._unstable_starts.append(e.index)

    def find_conflict(self, entries: tuple[Entry, ...] | list[Entry]) -> int | None:
        """Position in `entries` of the first one we do not already hold (new, or a different term)."""
        for pos, e in enumerate(entries):
            if not self.match_term(e.index, e.term):
                return pos
            assert self.entry_bounds(e.index) == (e.index, e.last_index), "same term, different batch"
        return None

    def commit_to(self, index: int) -> None:
        if index > self.committed:
            assert index <= self.last_index(), f"commit {index} beyond last index {self.last_index()}"
            self.committed = index

    def stable_to(self, index: int, term: int) -> None:
        """Entries through `index` (with term `term`) are durable now."""
        if index < self.unstable_offset or self.term(index) != term:
            return  # already stable, or replaced since the Ready that carried it
        i = bisect_right(self._unstable_starts, index)
        assert self.unstable[i - 1].last_index == index
        del self.unstable[:i]
        del self._unstable_starts[:i]
        self.unstable_offset = index + 1

    def applied_to(self, index: int) -> None:
        assert self.applied <= index <= self.committed, (self.applied, index, self.committed)
        self.applied = index

    def dropped(self) -> None:
        """The application removed entries from its storage (damaged: `RaftNode.drop_entries`): the log
        now ends where the storage does; nothing unstable is left (damage is found in durable entries,
        and every unstable one follows them)."""
        assert self.pending_snapshot is None, "entries dropped while a snapshot is pending"
        self.unstable = []
        self._unstable_starts = []
        self.unstable_offset = self.storage.last_index() + 1
        self.apply_blocked = False

    def restore(self, meta: SnapshotMeta) -> None:
        """A snapshot replaces the log (the application installs it with the next Ready)."""
        self.pending_snapshot = meta
        self.unstable = []
        self._unstable_starts = []
        self.unstable_offset = meta.index + 1
        self.committed = max(self.committed, meta.index)

    def snapshot_installed(self, index: int) -> None:
        if self.pending_snapshot is not None and self.pending_snapshot.index == index:
            self.pending_snapshot = None
            self.applied = max(self.applied, index)
