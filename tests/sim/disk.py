"""The fake disk of one simulated node: a durable layer and one write in progress.

`durable` is a MemoryStorage: what survives a crash, and what the Raft core reads as its Storage.
Persisting a Ready is one write that takes `latency` ticks; until it completes nothing of it is
durable (the pending layer), and the replica holds back whatever the Ready contract says must wait
for it. Writes in flight (several when the replica pipelines) complete in the order they began.

A write is a sequence of steps in the order a real log would issue them: stage each snapshot
chunk, install the snapshot, append each entry (the first append also cuts the stored suffix it
replaces), then the hard state. A crash while the write is in flight loses it; with probability
`torn` it is torn instead: a random prefix of the steps reached the disk, never the hard state
(the last step, written after what it describes), and later writes in flight are lost. What a torn write may break: a node that comes
back with part of its log, a staged but not installed snapshot, an old term and vote with some of
the new entries -- everything the Ready contract promises must still hold, because nothing that
depended on the write (acks, votes) was sent.

The durable end. A pipelined replica releases acknowledgements through the node runtime's own
`PersistQueue`, which needs what the runtime's log reports: a durable end, every index below it on
disk. The disk keeps one by the segmented log's rules (eventlog/log.py): a write that truncates
the log (entries replacing a stored suffix, a snapshot resetting the log) lowers it to the
truncation point at once, when the write *begins* (the runtime truncates in the page cache before
the next fsync); a completed write raises it to the log end as of its start, unless a truncation
began since (the log's generation check: the flusher's sync then covered a log that has changed).
A write in flight stays in flight while its node is paused (`delay`): the flusher is stopped too.

Not thread-safe; owned by one Replica.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable

from eventlog.raft.node import Ready
from eventlog.raft.storage import MemoryStorage


class FakeDisk:
    def __init__(self, durable: MemoryStorage, rng: random.Random, max_latency: int, torn: float) -> None:
        self.durable = durable
        self._rng = rng
        self.max_latency = max_latency
        self.torn = torn
        # writes in flight, oldest first: (Ready, done at, log end once written, generation)
        self.queue: deque[tuple[Ready, int, int, int]] = deque()
        self.writes = 0
        self.torn_writes = 0
        self._reset_ends()

    def _reset_ends(self) -> None:
        self.written_end = self.durable.last_index() + 1   # the log end, written or not
        self.durable_end = self.written_end                # every index below it is durable
        self._generation = 0                               # bumped by every truncation

    def begin(self, rd: Ready, now: int) -> int:
        """Start persisting `rd` (after the writes already in flight); returns when it completes."""
        done = now + (self._rng.randint(0, self.max_latency) if self.max_latency else 0)
        if self.queue:
            done = max(done, self.queue[-1][1])
        if rd.snapshot is not None:
            self._truncate(rd.snapshot.index + 1)
        if rd.entries:
            if rd.entries[0].index < self.written_end:
                self._truncate(rd.entries[0].index)
            self.written_end = rd.entries[-1].last_index + 1
        self.queue.append((rd, done, self.written_end, self._generation))
        return done

    def _truncate(self, end: int) -> None:
        self._generation += 1
        self.written_end = end
        self.durable_end = min(self.durable_end, end)

    def delay(self, ticks: int) -> None:
        """The node was paused for `ticks`: nothing in flight completed meanwhile."""
        self.queue = deque((rd, done + ticks, end, gen) for rd, done, end, gen in self.queue)

    def due(self, now: int) -> bool:
        """Has the oldest write in flight completed by tick `now`?"""
        return bool(self.queue) and self.queue[0][1] <= now

    def complete(self) -> Ready:
        """The oldest write in flight is durable now."""
        rd, _, end, generation = self.queue.popleft()
        for step in _steps(rd, self.durable):
            step()
        self.writes += 1
        if generation == self._generation:
            self.durable_end = max(self.durable_end, end)
        return rd

    def crash(self) -> int:
        """Power loss: the writes in flight are lost, or the oldest ones reach the disk up to a torn
        point. Returns how many of their steps survived."""
        steps = [step for rd, *_ in self.queue for step in _steps(rd, self.durable)]
        self.queue.clear()
        survived = 0
        if len(steps) > 1 and self.torn and self._rng.random() < self.torn:
            survived = self._rng.randrange(1, len(steps))  # never all of it
            for step in steps[:survived]:
                step()
            self.torn_writes += 1
        self._reset_ends()
        return survived


def _steps(rd: Ready, storage: MemoryStorage) -> list[Callable[[], None]]:
    steps: list[Callable[[], None]] = []
    for chunk in rd.snapshot_chunks:
        steps.append(lambda c=chunk: storage.stage_snapshot_chunk(c.meta, c.offset, c.data))
    if rd.snapshot is not None:
        steps.append(lambda meta=rd.snapshot: storage.install_snapshot(meta))
    for entry in rd.entries:
        steps.append(lambda e=entry: storage.append((e,)))
    if rd.hard_state is not None:
        steps.append(lambda hs=rd.hard_state: storage.set_hard_state(hs))
    return steps
