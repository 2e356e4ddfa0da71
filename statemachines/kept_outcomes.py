"""Which sequences of a client session have a kept outcome: an in-memory mirror of `session_outcomes`.

Admitting a request of a session asks whether its outcome is kept (a retry) and, when the client
says requests were answered, which kept outcomes to forget. Asked of RocksDB, that was a lookup of
an absent key per request and a scan per forget (about half of a session's bookkeeping, which was over
a quarter of applying a batched write: bench/RESULTS.md issue-20-apply2). The applier
keeps the answer in memory instead: per session, the sequences whose outcome row exists, as sorted
disjoint intervals (a session's requests are numbered consecutively, so a few intervals each). From views
format level 3 a row may hold a run of requests (statemachines/sessions.py `OkRun`), and which run a
request extends is decided from the rows: the mirror then holds the rows themselves (`RunSet`: each
row's sequences and a run's first offset), read from the views like the sequences.

The mirror decides no write on its own: every row it stands for is written or deleted by
statemachines/sessions.py in the same step as the mirror changes, so the views (and the digest) are
the bytes the lookups and scans gave. Its invariant: for a session it holds, its sequences (its rows,
at level 3) are exactly those of its outcome rows as the apply in progress sees the views (store and
pending writes). What
could break that is handled by forgetting, never by repairing: a session it does not hold is read
from the views again (sessions.py scans its rows into `hold`), a session dropped or evicted is let go,
and an apply that abandons pending writes (a halt mid-entry, a failed write) clears it all (`clear`);
a snapshot installed comes with a new applier, hence an empty mirror; a raise of the views format
level clears it too (what it holds is of the level before). Outcome rows are written by
sessions.py only.

Memory: at most `max_sessions` sessions (least recently used let go first; the applier gives it
[views] client_sessions_max, as many as a group keeps live, so no session is read again and again),
each at most its `max_outcomes` sequences as intervals (usually one: a few hundred bytes per session). Not thread-safe: the applier's, from
the group's loop.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterable, Iterator


class _Ranges:
    """Sequences as sorted disjoint half-open ranges [starts[i], ends[i]): membership, iteration, size."""

    __slots__ = ("starts", "ends")

    starts: list[int]
    ends: list[int]

    def __contains__(self, seq: int) -> bool:
        ends = self.ends
        if ends and ends[-1] <= seq:   # the common case: a new request above every kept one
            return False
        i = bisect_right(self.starts, seq) - 1
        return i >= 0 and seq < ends[i]

    def __iter__(self) -> Iterator[int]:
        for lo, hi in zip(self.starts, self.ends, strict=True):
            yield from range(lo, hi)

    def __len__(self) -> int:
        return sum(hi - lo for lo, hi in zip(self.starts, self.ends, strict=True))


class SeqSet(_Ranges):
    """A set of sequences as sorted disjoint half-open intervals [starts[i], ends[i]), none adjacent."""

    __slots__ = ()

    def __init__(self, seqs: Iterable[int] = ()) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []
        for s in sorted(seqs):
            self.add(s)

    def add(self, seq: int) -> None:
        starts, ends = self.starts, self.ends
        if ends and ends[-1] == seq:   # the common case: the next sequence
            ends[-1] = seq + 1
            return
        i = bisect_right(starts, seq) - 1
        assert i < 0 or seq >= ends[i], f"sequence {seq} is in the set already"
        joins_left = i >= 0 and ends[i] == seq
        joins_right = i + 1 < len(starts) and starts[i + 1] == seq + 1
        if joins_left and joins_right:
            ends[i] = ends[i + 1]
            del starts[i + 1], ends[i + 1]
        elif joins_left:
            ends[i] = seq + 1
        elif joins_right:
            starts[i + 1] = seq
        else:
            starts.insert(i + 1, seq)
            ends.insert(i + 1, seq + 1)

    def remove_range(self, lo: int, hi: int) -> list[int]:
        """Remove the sequences in [lo, hi); return those that were in the set, in order."""
        starts, ends = self.starts, self.ends
        if lo >= hi or not starts or hi <= starts[0] or lo >= ends[-1]:
            return []
        s0 = starts[0]
        if lo <= s0 and hi < ends[0]:   # the common case: the oldest kept requests were answered
            starts[0] = hi
            return list(range(s0, hi))
        removed: list[int] = []
        first = max(bisect_right(starts, lo) - 1, 0)
        i = first
        keep_starts: list[int] = []
        keep_ends: list[int] = []
        while i < len(starts) and starts[i] < hi:
            s, e = starts[i], ends[i]
            if e > lo:
                removed.extend(range(max(s, lo), min(e, hi)))
                if s < lo:
                    keep_starts.append(s)
                    keep_ends.append(lo)
                if e > hi:
                    keep_starts.append(hi)
                    keep_ends.append(e)
            else:
                keep_starts.append(s)
                keep_ends.append(e)
            i += 1
        starts[first:i] = keep_starts
        ends[first:i] = keep_ends
        return removed


class RunSet(_Ranges):
    """The outcome rows of a session at views format level 3 (statemachines/sessions.py): sorted disjoint
    sequence ranges [starts[i], ends[i]), each one row keyed by its start. `offsets[i]` >= 0: a run row,
    the requests starts[i].. ends[i] - 1 ok at offsets offsets[i].. in order; -1: a row holding the one
    `Outcome` of request starts[i] (a failed one, or any outcome written before level 3). Rows may touch
    (a run never absorbs the next row): the mirror holds rows, not merely sequences, because which row
    a request extends is decided from them and must be what every replica's views say."""

    __slots__ = ("offsets",)

    def __init__(self, rows: Iterable[tuple[int, int, int]] = ()) -> None:
        """`rows`: (start, count, offset or -1) in start order, as read from the views."""
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.offsets: list[int] = []
        for start, count, offset in rows:
            assert not self.ends or self.ends[-1] <= start, f"outcome rows overlap at sequence {start}"
            self.starts.append(start)
            self.ends.append(start + count)
            self.offsets.append(offset)

    def rows(self) -> list[tuple[int, int, int]]:
        """(start, count, offset or -1) of every row, in order (what `__init__` takes)."""
        return [(s, e - s, o) for s, e, o in zip(self.starts, self.ends, self.offsets, strict=True)]

    def row_start(self, seq: int) -> int:
        """The start (the row's key) of the row holding `seq`, which must be kept."""
        i = bisect_right(self.starts, seq) - 1
        assert i >= 0 and seq < self.ends[i], f"sequence {seq} has no outcome row"
        return self.starts[i]

    def add_ok(self, seq: int, offset: int) -> tuple[int, int, int]:
        """Keep request `seq`, ok at `offset`: it extends the run ending at seq - 1 when that run's
        next offset is `offset`, else starts a run. Returns the run row to write: (start, offset, count)."""
        starts, ends, offsets = self.starts, self.ends, self.offsets
        i = self._below(seq)
        if i >= 0 and ends[i] == seq and offsets[i] >= 0 and offsets[i] + (seq - starts[i]) == offset:
            ends[i] = seq + 1
            return starts[i], offsets[i], seq + 1 - starts[i]
        starts.insert(i + 1, seq)
        ends.insert(i + 1, seq + 1)
        offsets.insert(i + 1, offset)
        return seq, offset, 1

    def add_outcome(self, seq: int) -> None:
        """Keep request `seq` in a row of its own (its `Outcome`)."""
        i = self._below(seq)
        self.starts.insert(i + 1, seq)
        self.ends.insert(i + 1, seq + 1)
        self.offsets.insert(i + 1, -1)

    def _below(self, seq: int) -> int:
        """The index of the last row below `seq`, which must not be kept (-1: none)."""
        ends = self.ends
        if ends and ends[-1] <= seq:   # the common case: above every kept request
            return len(ends) - 1
        i = bisect_right(self.starts, seq) - 1
        assert i < 0 or seq >= ends[i], f"sequence {seq} is kept already"
        return i

    def remove_range(self, lo: int, hi: int) -> tuple[list[int], list[tuple[int, int, int]]]:
        """Forget the sequences in [lo, hi). Returns the rows to delete (their starts) and the run rows
        to write, (start, offset, count): what is left of a run the range cuts (its part from `hi` on,
        keyed at `hi`; its part below `lo`, keyed where it was)."""
        starts, ends, offsets = self.starts, self.ends, self.offsets
        if lo >= hi or not starts or hi <= starts[0] or lo >= ends[-1]:
            return [], []
        s0, e0 = starts[0], ends[0]
        if lo <= s0 and hi < e0:   # the common case: the oldest requests of the oldest run were answered
            o = offsets[0]
            assert o >= 0, "only a run row spans several sequences"
            starts[0] = hi
            offsets[0] = o + hi - s0
            return [s0], [(hi, o + hi - s0, e0 - hi)]
        if lo <= s0 and e0 <= hi and (len(starts) == 1 or hi <= starts[1]):   # the oldest row, whole (single puts)
            del starts[0], ends[0], offsets[0]
            return [s0], []
        first = max(bisect_right(starts, lo) - 1, 0)
        i = first
        deleted: list[int] = []
        written: list[tuple[int, int, int]] = []
        keep: list[tuple[int, int, int]] = []   # (start, end, offset)
        while i < len(starts) and starts[i] < hi:
            s, e, o = starts[i], ends[i], offsets[i]
            if e <= lo:
                keep.append((s, e, o))
            else:
                if s < lo:   # its part below the range stays, shorter
                    assert o >= 0, "only a run row spans several sequences"
                    keep.append((s, lo, o))
                    written.append((s, o, lo - s))
                else:
                    deleted.append(s)
                if e > hi:   # its part from hi on: a row keyed at hi
                    assert o >= 0, "only a run row spans several sequences"
                    keep.append((hi, e, o + hi - s))
                    written.append((hi, o + hi - s, e - hi))
            i += 1
        starts[first:i] = [s for s, _, _ in keep]
        ends[first:i] = [e for _, e, _ in keep]
        offsets[first:i] = [o for _, _, o in keep]
        return deleted, written


class KeptOutcomes:
    """The mirror of every session's kept outcome sequences (see the module docstring): a `SeqSet` per
    session at views format levels 1 and 2 (one row per sequence), a `RunSet` from level 3 on. Cleared
    when the level is raised, so what it holds is always of the level the views are at."""

    def __init__(self, max_sessions: int) -> None:
        self._sessions: OrderedDict[int, SeqSet | RunSet] = OrderedDict()
        self._max_sessions = max_sessions

    def held(self, sid: int) -> SeqSet | RunSet | None:
        """The session's kept sequences if this mirror holds them (else `hold` what the views say)."""
        got = self._sessions.get(sid)
        if got is not None and len(self._sessions) > 1:
            self._sessions.move_to_end(sid)
        return got

    def hold(self, sid: int, seqs: Iterable[int]) -> SeqSet:
        """Hold the session's kept sequences, as read from the views (levels 1 and 2)."""
        got = self._sessions[sid] = SeqSet(seqs)
        self._bound()
        return got

    def hold_rows(self, sid: int, rows: Iterable[tuple[int, int, int]]) -> RunSet:
        """Hold the session's outcome rows, as read from the views (level 3 on; see `RunSet`)."""
        got = self._sessions[sid] = RunSet(rows)
        self._bound()
        return got

    def _bound(self) -> None:
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)

    def let_go(self, sid: int) -> None:
        """Forget a session (dropped, evicted, or its rows changed some other way)."""
        self._sessions.pop(sid, None)

    def clear(self) -> None:
        """Forget everything: pending writes the mirror followed were abandoned."""
        self._sessions.clear()
