"""Accepted Readys waiting for their entries to become durable: the pipelined half of the Ready
contract (`RaftNode.accept` / `RaftNode.persisted`), shared by the node runtime and the simulator.

A runtime that pipelines persistence writes a Ready's entries, calls `accept()` at once and must
hold the Ready's `send_after` (append and heartbeat acknowledgements, votes) until those entries
are durable, releasing Readys in the order they were accepted. A log reports durability as one
number, its durable end: every index below it is on disk. `PersistQueue` holds each accepted Ready
with the index it waits for (its last entry's, -1 without entries) and hands Readys back, oldest
first, once the durable end passes that index.

The subtle part is a later Ready that replaces entries an earlier one wrote: a follower that was a
stale leader (or followed one) truncates the suffix a new leader does not have, or installs a
snapshot that resets the log. The replaced entries will never be durable, and the log's durable end
falls back to the truncation point (`Log.truncate_suffix`, `Log.reset`). Waiting for the old last
index then means waiting for the *new* log to grow past it, and since release is in order, every
later acknowledgement is held as well. The new leader hears nothing from the follower: its
progress stays in PROBE with one probe outstanding (`match` -1), so it never sends the entries
that would let the follower's log grow, while its heartbeats keep the follower from campaigning.
The follower is stuck until it restarts, and the group runs on the other replicas (issue 11: a
kv leader paused with SIGSTOP under write load; its writes were still waiting for their fsync
when it resumed, saw the new term and truncated them).

`discard_from(index)` must therefore be called before the storage drops indexes >= `index`: every
held wait above `index - 1` comes down to it. What remains of an earlier Ready's entries is the
prefix below the truncation point, durable once the durable end reaches that point again. Its
acknowledgements of entries that were replaced carry an older term (one leader per term, and only
a leader of a later term makes a follower replace entries), and `RaftNode.persisted` drops them.

Not thread-safe: owned by one group's loop task (or one simulated replica).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from eventlog.raft.node import Ready


class _Held:
    __slots__ = ("ready", "wait")

    def __init__(self, wait: int, ready: Ready) -> None:
        self.wait = wait      # the index that must be durable before `ready` is released
        self.ready = ready


class PersistQueue:
    """Accepted Readys, oldest first, each with the index that must be durable before it is released."""

    __slots__ = ("_held", "_max_wait")

    def __init__(self) -> None:
        self._held: deque[_Held] = deque()
        self._max_wait = -1                 # the highest index any held Ready waits for

    def __len__(self) -> int:
        return len(self._held)

    def push(self, rd: Ready) -> None:
        """`rd` was accepted: its entries are written (not necessarily durable)."""
        wait = rd.entries[-1].last_index if rd.entries else -1
        self._held.append(_Held(wait, rd))
        self._max_wait = max(self._max_wait, wait)

    def discard_from(self, index: int) -> None:
        """The storage is about to drop every index >= `index` (a suffix truncation, or a snapshot
        installed at `index - 1`): no held Ready waits for those any more (see the module docstring)."""
        if self._max_wait < index:
            return
        for item in self._held:
            if item.wait >= index:
                item.wait = index - 1
        self._max_wait = index - 1

    def pop_durable(self, durable_end: int) -> list[Ready]:
        """The Readys whose entries are durable now that every index below `durable_end` is, in order
        (stopping at the first one still waiting)."""
        out: list[Ready] = []
        held = self._held
        while held and held[0].wait < durable_end:
            out.append(held.popleft().ready)
        if not held:
            self._max_wait = -1
        return out

    def holds_messages(self) -> bool:
        """Whether a held Ready has messages to send once durable (acknowledgements, votes)."""
        return any(item.ready.send_after for item in self._held)

    def oldest_wait(self) -> int | None:
        """The index the oldest held Ready waits for (None when nothing is held)."""
        return self._held[0].wait if self._held else None

    def clear(self) -> None:
        self._held.clear()
        self._max_wait = -1
