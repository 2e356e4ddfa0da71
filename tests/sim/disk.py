"""The fake disk of one simulated node: a durable layer and one write in progress.

`durable` is a MemoryStorage: what survives a crash, and what the Raft core reads as its Storage.
Persisting a Ready is one write that takes `latency` ticks; until it completes nothing of it is
durable (the pending layer), and the cluster holds back the Ready's `send_after` messages, its
applying and `advance()` until then (the Ready contract).

A write is a sequence of steps in the order a real log would issue them: stage each snapshot
chunk, install the snapshot, append each entry (the first append also cuts the stored suffix it
replaces), then the hard state. A crash while the write is in flight loses it; with probability
`torn` it is torn instead: a random prefix of the steps reached the disk, never the hard state
(the last step, written after what it describes). What a torn write may break: a node that comes
back with part of its log, a staged but not installed snapshot, an old term and vote with some of
the new entries -- everything the Ready contract promises must still hold, because nothing that
depended on the write (acks, votes) was sent.

Not thread-safe; owned by one Replica.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from eventlog.raft.node import Ready
from eventlog.raft.storage import MemoryStorage


class FakeDisk:
    def __init__(self, durable: MemoryStorage, rng: random.Random, max_latency: int, torn: float) -> None:
        self.durable = durable
        self._rng = rng
        self.max_latency = max_latency
        self.torn = torn
        self.pending: Ready | None = None
        self.done_at = 0
        self.writes = 0
        self.torn_writes = 0

    def begin(self, rd: Ready, now: int) -> int:
        """Start persisting `rd`; returns the tick at which it completes."""
        assert self.pending is None, "one write at a time"
        self.pending = rd
        self.done_at = now + (self._rng.randint(0, self.max_latency) if self.max_latency else 0)
        return self.done_at

    def complete(self) -> Ready:
        """The write in progress is durable now."""
        rd = self.pending
        assert rd is not None
        for step in _steps(rd, self.durable):
            step()
        self.pending = None
        self.writes += 1
        return rd

    def crash(self) -> int:
        """Power loss: the write in progress is lost or torn. Returns how many of its steps survived."""
        rd = self.pending
        self.pending = None
        if rd is None:
            return 0
        steps = _steps(rd, self.durable)
        if len(steps) <= 1 or not (self.torn and self._rng.random() < self.torn):
            return 0
        survived = self._rng.randrange(1, len(steps))  # never all of it: the hard state is last
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
