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
        self.queue: deque[tuple[Ready, int]] = deque()   # writes in flight, oldest first: (Ready, done at)
        self.writes = 0
        self.torn_writes = 0

    def begin(self, rd: Ready, now: int) -> int:
        """Start persisting `rd` (after the writes already in flight); returns when it completes."""
        done = now + (self._rng.randint(0, self.max_latency) if self.max_latency else 0)
        if self.queue:
            done = max(done, self.queue[-1][1])
        self.queue.append((rd, done))
        return done

    def due(self, now: int) -> bool:
        """Has the oldest write in flight completed by tick `now`?"""
        return bool(self.queue) and self.queue[0][1] <= now

    def complete(self) -> Ready:
        """The oldest write in flight is durable now."""
        rd, _ = self.queue.popleft()
        for step in _steps(rd, self.durable):
            step()
        self.writes += 1
        return rd

    def crash(self) -> int:
        """Power loss: the writes in flight are lost, or the oldest ones reach the disk up to a torn
        point. Returns how many of their steps survived."""
        steps = [step for rd, _ in self.queue for step in _steps(rd, self.durable)]
        self.queue.clear()
        if len(steps) <= 1 or not (self.torn and self._rng.random() < self.torn):
            return 0
        survived = self._rng.randrange(1, len(steps))  # never all of it
        for step in steps[:survived]:
            step()
        self.torn_writes += 1
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
